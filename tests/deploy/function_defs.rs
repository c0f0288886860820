//! The function app's definitions: function.json / host.json / local.settings.sample.json against
//! the SchemaStore schemas, against the function catalog (both ways), against each other, and the
//! folder `tablescan stage` assembles from them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tablescan::app::catalog::{Trigger, FUNCTIONS};
use tablescan::deploy::stage::{self, StageError, FUNCTION_DEFINITIONS, HOST_JSON};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read_json(path: &Path) -> Value {
    let text =
        fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn host_json() -> Value {
    read_json(&repo().join("host.json"))
}

fn sample_values() -> BTreeMap<String, String> {
    let sample = read_json(&repo().join("local.settings.sample.json"));
    sample["Values"]
        .as_object()
        .expect("Values object")
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str()
                    .unwrap_or_else(|| panic!("{k} must be a string"))
                    .to_owned(),
            )
        })
        .collect()
}

/// `function-defs/<Name>/function.json` for every folder there.
fn function_defs() -> BTreeMap<String, Value> {
    let dir = repo().join("function-defs");
    let mut defs = BTreeMap::new();
    for entry in fs::read_dir(&dir).expect("function-defs/") {
        let entry = entry.unwrap();
        assert!(
            entry.file_type().unwrap().is_dir(),
            "unexpected file {}",
            entry.path().display()
        );
        let name = entry.file_name().into_string().expect("UTF-8 folder name");
        defs.insert(name, read_json(&entry.path().join("function.json")));
    }
    defs
}

// ---------------------------------------------------------------------------------------------
// Schemas

/// Remote `$ref`s cannot resolve offline; say so instead of failing obscurely (or fetching).
struct OfflineRetriever;

impl jsonschema::Retrieve for OfflineRetriever {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(
            format!("schema references {uri}; vendor it under tests/schemas and register it")
                .into(),
        )
    }
}

/// The vendored schema (required, so the test never silently skips; see `tests/schemas/README.md`
/// for where it comes from).
fn schema(file: &str) -> (PathBuf, Value) {
    let vendored = repo().join("tests/schemas").join(file);
    assert!(
        vendored.is_file(),
        "vendored schema {} is missing",
        vendored.display()
    );
    let value = read_json(&vendored);
    (vendored, value)
}

fn remote_refs(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) if !r.starts_with('#') => found.push(r.clone()),
                    _ => remote_refs(v, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| remote_refs(v, found)),
        _ => {}
    }
}

fn uses_keyword(value: &Value, keyword: &str) -> bool {
    match value {
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k == keyword || uses_keyword(v, keyword)),
        Value::Array(items) => items.iter().any(|v| uses_keyword(v, keyword)),
        _ => false,
    }
}

/// The draft to validate `schema` under.
///
/// SchemaStore's function.json schema declares draft-04 but its sql/mysql output alternatives
/// use `const`, a draft-06 keyword. Draft-04 ignores unknown keywords, so those alternatives
/// match every binding and each binding then matches two branches of a `oneOf`: under its
/// declared draft the schema rejects every function.json (pinned by
/// `function_schema_rejects_everything_under_its_declared_draft`). Draft-06 is the first draft
/// with `const` and otherwise keeps draft-04's semantics for the keywords this schema uses.
fn draft_for(schema: &Value) -> Option<jsonschema::Draft> {
    let declared = schema
        .get("$schema")
        .and_then(Value::as_str)
        .unwrap_or_default();
    (declared.contains("draft-04") && uses_keyword(schema, "const"))
        .then_some(jsonschema::Draft::Draft6)
}

fn validator(path: &Path, schema: &Value) -> jsonschema::Validator {
    let mut refs = Vec::new();
    remote_refs(schema, &mut refs);
    assert!(
        refs.is_empty(),
        "{} has remote $refs {refs:?}; vendor them",
        path.display()
    );
    let mut options = jsonschema::options().with_retriever(OfflineRetriever);
    if let Some(draft) = draft_for(schema) {
        options = options.with_draft(draft);
    }
    options
        .build(schema)
        .unwrap_or_else(|e| panic!("compiling {}: {e}", path.display()))
}

/// Validation errors of `instance` against the vendored schema `file`.
fn schema_errors(file: &str, instance: &Value) -> Vec<String> {
    let (path, schema) = schema(file);
    validator(&path, &schema)
        .iter_errors(instance)
        .map(|e| format!("{}: {} at {}", path.display(), e, e.instance_path))
        .collect()
}

#[test]
fn vendored_schemas_compile() {
    for file in [
        "function.json.schema.json",
        "host.json.schema.json",
        "local.settings.json.schema.json",
    ] {
        let (path, schema) = schema(file);
        validator(&path, &schema);
    }
}

/// Why `draft_for` exists: if SchemaStore fixes the schema, this fails and the override can go.
#[test]
fn function_schema_rejects_everything_under_its_declared_draft() {
    let path = repo().join("tests/schemas/function.json.schema.json");
    let schema = read_json(&path);
    assert_eq!(draft_for(&schema), Some(jsonschema::Draft::Draft6));
    let strict = jsonschema::options()
        .with_retriever(OfflineRetriever)
        .with_draft(jsonschema::Draft::Draft4)
        .build(&schema)
        .unwrap();
    for (name, def) in function_defs() {
        assert!(
            !strict.is_valid(&def),
            "{name} now passes draft-04; drop the draft-06 override"
        );
    }
}

#[test]
fn every_function_json_is_schema_valid() {
    let defs = function_defs();
    assert!(!defs.is_empty());
    for (name, def) in &defs {
        let errors = schema_errors("function.json.schema.json", def);
        assert!(
            errors.is_empty(),
            "{name}/function.json:\n{}",
            errors.join("\n")
        );
    }
}

#[test]
fn host_json_is_schema_valid() {
    let errors = schema_errors("host.json.schema.json", &host_json());
    assert!(errors.is_empty(), "host.json:\n{}", errors.join("\n"));
}

#[test]
fn local_settings_sample_is_schema_valid() {
    let sample = read_json(&repo().join("local.settings.sample.json"));
    let errors = schema_errors("local.settings.json.schema.json", &sample);
    assert!(
        errors.is_empty(),
        "local.settings.sample.json:\n{}",
        errors.join("\n")
    );
}

/// The handler answers a request that runs too long (a retry) before the host's own
/// `functionTimeout` gives up on the invocation (src/app/layers.rs).
#[test]
fn the_handler_times_out_below_the_function_timeout() {
    let timeout = host_json()["functionTimeout"].as_str().unwrap().to_string();
    let parts: Vec<u64> = timeout.split(':').map(|p| p.parse().unwrap()).collect();
    let host_seconds = parts[0] * 3600 + parts[1] * 60 + parts[2];
    let ours = tablescan::app::layers::INVOCATION_TIMEOUT.as_secs();
    assert!(
        ours + 15 <= host_seconds,
        "handler timeout {ours}s must stay well below functionTimeout {timeout}"
    );
}

/// The schema checks above mean something only if the validator rejects bad documents.
#[test]
fn schema_validation_rejects_broken_documents() {
    let mut host = host_json();
    host["extensions"]["queues"]["batchSize"] = json!(64); // max 32
    assert!(
        !schema_errors("host.json.schema.json", &host).is_empty(),
        "batchSize 64 accepted"
    );

    let mut host = host_json();
    host["customHandler"]["description"]["arguments"] = json!("handler"); // must be an array
    assert!(
        !schema_errors("host.json.schema.json", &host).is_empty(),
        "string arguments accepted"
    );

    let mut host = host_json();
    host["functionTimeout"] = json!("10 minutes");
    assert!(
        !schema_errors("host.json.schema.json", &host).is_empty(),
        "bad functionTimeout accepted"
    );

    let mut def = function_defs()["StartScan"].clone();
    def["bindings"][0]["authLevel"] = json!("everyone");
    assert!(
        !schema_errors("function.json.schema.json", &def).is_empty(),
        "bad authLevel accepted"
    );

    let mut def = function_defs()["PrefixScan"].clone();
    def["bindings"][0]["direction"] = json!("out"); // a queueTrigger is an in-binding
    assert!(
        !schema_errors("function.json.schema.json", &def).is_empty(),
        "out queueTrigger accepted"
    );

    let mut sample = read_json(&repo().join("local.settings.sample.json"));
    sample["Values"]["FUNCTIONS_WORKER_RUNTIME"] = json!("rust");
    assert!(
        !schema_errors("local.settings.json.schema.json", &sample).is_empty(),
        "runtime rust accepted"
    );
}

// ---------------------------------------------------------------------------------------------
// Catalog <-> function-defs

/// Function names the host accepts (`Utility.IsValidFunctionName`): `^[a-z][a-z0-9_\-]{0,127}$`
/// case-insensitively, and not `host`.
fn valid_function_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && name.len() <= 128
        && !name.eq_ignore_ascii_case("host")
}

#[test]
fn function_folders_and_catalog_agree_both_ways() {
    let defs = function_defs();
    let folders: BTreeSet<&str> = defs.keys().map(String::as_str).collect();
    let catalog: BTreeSet<&str> = FUNCTIONS.iter().map(|f| f.name).collect();
    assert_eq!(
        catalog.len(),
        FUNCTIONS.len(),
        "duplicate names in the catalog"
    );
    assert_eq!(folders, catalog, "function-defs folders vs catalog");

    for spec in FUNCTIONS {
        assert!(
            valid_function_name(spec.name),
            "{} is not a valid function name",
            spec.name
        );
        let def = &defs[spec.name];
        let bindings = def["bindings"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: bindings array", spec.name));
        match spec.trigger {
            Trigger::Http { method, route } => {
                // Exactly httpTrigger in + http out, or the host will not forward the raw request.
                assert_eq!(
                    bindings.len(),
                    2,
                    "{}: HTTP-only functions have exactly two bindings",
                    spec.name
                );
                let expected_in = json!({
                    "type": "httpTrigger", "direction": "in", "name": "req", "authLevel": "function",
                    "methods": [method.to_ascii_lowercase()], "route": route,
                });
                assert_eq!(bindings[0], expected_in, "{}: trigger binding", spec.name);
                assert_eq!(
                    bindings[1],
                    json!({"type": "http", "direction": "out", "name": "res"}),
                    "{}",
                    spec.name
                );
            }
            Trigger::Queue {
                queue_setting,
                suffix,
            } => {
                // No output bindings: the handler enqueues itself, so a queue function must not
                // grow a binding that would change the invocation payload.
                let expected = json!([{
                    "type": "queueTrigger", "direction": "in", "name": "message",
                    "queueName": format!("%{queue_setting}%{suffix}"), "connection": "AzureWebJobsStorage",
                }]);
                assert_eq!(def["bindings"], expected, "{}: bindings", spec.name);
            }
            Trigger::Timer { schedule_setting } => {
                // The schedule comes from an app setting, so tests (and operators) change it
                // without a new package; the handler reads the timer as `Data.timer`.
                let expected = json!([{
                    "type": "timerTrigger", "direction": "in", "name": "timer",
                    "schedule": format!("%{schedule_setting}%"),
                }]);
                assert_eq!(def["bindings"], expected, "{}: bindings", spec.name);
            }
        }
    }

    // Two functions may share a route only with different methods.
    let mut routes = BTreeSet::new();
    for spec in FUNCTIONS {
        if let Trigger::Http { method, route } = spec.trigger {
            assert!(
                routes.insert((route, method)),
                "{method} {route} is served twice"
            );
        }
    }
}

#[test]
fn embedded_definitions_are_the_files_on_disk() {
    let embedded: BTreeSet<&str> = FUNCTION_DEFINITIONS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        embedded.len(),
        FUNCTION_DEFINITIONS.len(),
        "duplicate embedded definitions"
    );
    let catalog: BTreeSet<&str> = FUNCTIONS.iter().map(|f| f.name).collect();
    assert_eq!(embedded, catalog, "embedded definitions vs catalog");
    for (name, json) in FUNCTION_DEFINITIONS {
        let on_disk = fs::read_to_string(
            repo()
                .join("function-defs")
                .join(name)
                .join("function.json"),
        )
        .unwrap();
        assert_eq!(
            *json, on_disk,
            "embedded {name}/function.json differs from the file"
        );
        assert_eq!(stage::function_json(name), Some(*json));
    }
    assert_eq!(
        HOST_JSON,
        fs::read_to_string(repo().join("host.json")).unwrap()
    );
    assert_eq!(
        stage::LOCAL_SETTINGS_SAMPLE,
        fs::read_to_string(repo().join("local.settings.sample.json")).unwrap()
    );
    assert_eq!(
        stage::FUNCIGNORE,
        fs::read_to_string(repo().join(".funcignore")).unwrap()
    );
}

// ---------------------------------------------------------------------------------------------
// host.json and settings

/// `hh:mm:ss` to seconds.
fn seconds(timespan: &str) -> u64 {
    let parts: Vec<u64> = timespan
        .split(':')
        .map(|p| p.parse().expect("hh:mm:ss"))
        .collect();
    assert_eq!(parts.len(), 3, "{timespan} is not hh:mm:ss");
    parts[0] * 3600 + parts[1] * 60 + parts[2]
}

#[test]
fn host_json_runs_the_handler_as_the_catalog_expects() {
    let host = host_json();
    assert_eq!(host["version"], "2.0");
    assert_eq!(
        host["extensionBundle"],
        json!({"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.*, 5.0.0)"})
    );
    let handler = &host["customHandler"];
    assert_eq!(
        handler["description"],
        json!({"defaultExecutablePath": "tablescan", "workingDirectory": "", "arguments": ["handler"]})
    );
    assert_eq!(handler["enableForwardingHttpRequest"], true);
    // The handler serves forwarded HTTP functions under /api/{route}.
    assert_eq!(host["extensions"]["http"]["routePrefix"], "api");
    // Consumption rejects anything above 10 minutes.
    assert!(seconds(host["functionTimeout"].as_str().unwrap()) <= 600);

    let queues = &host["extensions"]["queues"];
    assert_eq!(
        queues["messageEncoding"], "base64",
        "the handler enqueues base64"
    );
    let batch = queues["batchSize"].as_u64().unwrap();
    let threshold = queues["newBatchThreshold"].as_u64().unwrap();
    assert!((1..=32).contains(&batch) && threshold < batch);
    assert!(
        seconds(&queues["maxPollingInterval"].as_str().unwrap()[..8]) >= 1,
        "poll interval floor"
    );
    // A failed message must come back well before its 10-minute receive lease would lapse.
    assert!(seconds(queues["visibilityTimeout"].as_str().unwrap()) < 600);
}

#[test]
fn max_dequeue_count_matches_the_handler_setting() {
    let host_count = host_json()["extensions"]["queues"]["maxDequeueCount"]
        .as_u64()
        .expect("maxDequeueCount");
    let sample: u64 = sample_values()["TABLESCAN_MAX_DEQUEUE_COUNT"]
        .parse()
        .expect("a number");
    assert_eq!(
        host_count, sample,
        "host.json maxDequeueCount vs TABLESCAN_MAX_DEQUEUE_COUNT"
    );
}

/// `TABLESCAN_*` names mentioned anywhere in the sources: settings the app reads.
fn settings_named_in_sources() -> BTreeSet<String> {
    fn walk(dir: &Path, found: &mut BTreeSet<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).unwrap();
                for (i, _) in text.match_indices("TABLESCAN_") {
                    let name: String = text[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if name.len() > "TABLESCAN_".len() {
                        found.insert(name);
                    }
                }
            }
        }
    }
    // The handler's settings: what `src/app` reads. Developer commands (demo, host, list) read
    // their own variables, which are not app settings.
    let mut found = BTreeSet::new();
    walk(&repo().join("src/app"), &mut found);
    // A fault switch for the test suite only; documented, deliberately absent from the sample.
    found.remove("TABLESCAN_TEST_FAIL_PREFIX");
    found
}

#[test]
fn every_setting_used_is_in_the_sample() {
    let values = sample_values();
    assert_eq!(values["FUNCTIONS_WORKER_RUNTIME"], "custom");
    assert_eq!(values["AzureWebJobsStorage"], "UseDevelopmentStorage=true");

    let mut used = BTreeSet::new();
    for (name, def) in function_defs() {
        for binding in def["bindings"].as_array().unwrap() {
            if let Some(conn) = binding.get("connection") {
                used.insert((name.clone(), conn.as_str().unwrap().to_owned()));
            }
            for value in binding
                .as_object()
                .unwrap()
                .values()
                .filter_map(Value::as_str)
            {
                let mut parts = value.split('%');
                parts.next();
                while let (Some(setting), Some(_)) = (parts.next(), parts.next()) {
                    used.insert((name.clone(), setting.to_owned()));
                }
            }
        }
    }
    assert!(!used.is_empty());
    for (function, setting) in &used {
        assert!(
            values.contains_key(setting),
            "{function} uses %{setting}%, missing from the sample"
        );
    }

    let from_sources = settings_named_in_sources();
    assert!(
        from_sources.contains("TABLESCAN_PREFIXSCAN_QUEUE"),
        "source scan found nothing"
    );
    for setting in from_sources.iter().map(String::as_str).chain([
        "TABLESCAN_PREFIXSCAN_QUEUE",
        "TABLESCAN_TABLECOPY_QUEUE",
        "TABLESCAN_SCANS_TABLE",
        "TABLESCAN_WORK_TABLE",
        "TABLESCAN_CONNECTIONS",
        "TABLESCAN_MAX_DEQUEUE_COUNT",
        "TABLESCAN_COUNTER_SHARDS",
        "TABLESCAN_COPY_CONCURRENCY",
        "TABLESCAN_WORK_RETENTION",
        "TABLESCAN_SCAN_RETENTION",
        // Read by `src/cli.rs` before the handler's runtime starts.
        "TABLESCAN_HANDLER_THREADS",
        "RUST_LOG",
    ]) {
        assert!(
            values.contains_key(setting),
            "the app reads {setting}; add it to local.settings.sample.json"
        );
    }
}

/// Azure queue names: 3-63 of `a-z0-9-`, starting and ending alphanumeric, no `--`.
fn valid_queue_name(name: &str) -> bool {
    (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

#[test]
fn sample_values_are_usable() {
    let values = sample_values();
    for setting in ["TABLESCAN_PREFIXSCAN_QUEUE", "TABLESCAN_TABLECOPY_QUEUE"] {
        let queue = &values[setting];
        assert!(
            valid_queue_name(queue),
            "{setting}={queue} is not a valid queue name"
        );
        // The host poisons into `<queue>-poison`; if that name is invalid it never poisons and a
        // failing message just reappears every 10 minutes, so the scan never fails.
        assert!(
            valid_queue_name(&format!("{queue}-poison")),
            "{setting}: {queue}-poison is invalid"
        );
    }
    assert_ne!(
        values["TABLESCAN_PREFIXSCAN_QUEUE"],
        values["TABLESCAN_TABLECOPY_QUEUE"]
    );
    for setting in ["TABLESCAN_SCANS_TABLE", "TABLESCAN_WORK_TABLE"] {
        let table = &values[setting];
        let ok = (3..=63).contains(&table.len())
            && table.starts_with(|c: char| c.is_ascii_alphabetic())
            && table.chars().all(|c| c.is_ascii_alphanumeric());
        assert!(ok, "{setting}={table} is not a valid table name");
    }
    for setting in [
        "TABLESCAN_MAX_DEQUEUE_COUNT",
        "TABLESCAN_COUNTER_SHARDS",
        "TABLESCAN_COPY_CONCURRENCY",
    ] {
        let n: u32 = values[setting]
            .parse()
            .unwrap_or_else(|_| panic!("{setting} must be a number"));
        assert!(n >= 1, "{setting} must be at least 1");
    }
}

#[test]
fn readme_documents_every_setting() {
    let readme = fs::read_to_string(repo().join("README.md")).expect("README.md");
    for setting in sample_values().keys() {
        assert!(
            readme.contains(&format!("`{setting}`")),
            "README does not document `{setting}`"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Staging

/// A fresh folder under cargo's per-target temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("function_defs-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn fake_binary(dir: &Path, name: &str, content: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, content).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    }
    path
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).unwrap().permissions().mode() & 0o111 == 0o111
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}

fn entries(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

#[test]
fn stage_assembles_the_app_layout() {
    let tmp = TempDir::new("layout");
    let binary = fake_binary(&tmp.0, "built-handler", b"#!/bin/sh\necho handler\n");
    let out = tmp.0.join("app");

    let staged = stage::stage(&out, &binary).expect("stage");

    // Exactly host.json, the handler, settings, .funcignore and one folder per function.
    let mut expected: BTreeSet<String> = [
        "host.json",
        "tablescan",
        "local.settings.json",
        ".funcignore",
    ]
    .map(String::from)
    .into();
    expected.extend(FUNCTIONS.iter().map(|f| f.name.to_owned()));
    assert_eq!(entries(&out), expected);

    assert_eq!(staged.root, out);
    assert_eq!(fs::read_to_string(&staged.host_json).unwrap(), HOST_JSON);
    assert_eq!(staged.function_jsons.len(), FUNCTIONS.len());
    for spec in FUNCTIONS {
        let path = out.join(spec.name).join("function.json");
        assert!(staged.function_jsons.contains(&path));
        assert_eq!(
            entries(&out.join(spec.name)),
            BTreeSet::from(["function.json".to_owned()])
        );
        let on_disk = fs::read_to_string(
            repo()
                .join("function-defs")
                .join(spec.name)
                .join("function.json"),
        )
        .unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), on_disk);
    }

    // The handler sits where host.json says, byte-identical and executable.
    let host: Value = serde_json::from_str(HOST_JSON).unwrap();
    let named = host["customHandler"]["description"]["defaultExecutablePath"]
        .as_str()
        .unwrap();
    assert_eq!(staged.executable, out.join(named));
    assert_eq!(
        fs::read(&staged.executable).unwrap(),
        fs::read(&binary).unwrap()
    );
    assert!(
        is_executable(&staged.executable),
        "staged handler is not executable"
    );

    assert!(staged.local_settings_written);
    assert_eq!(
        fs::read_to_string(out.join("local.settings.json")).unwrap(),
        stage::LOCAL_SETTINGS_SAMPLE
    );
    assert_eq!(
        fs::read_to_string(out.join(".funcignore")).unwrap(),
        stage::FUNCIGNORE
    );
    assert!(staged.removed_stale.is_empty());
}

#[test]
fn restaging_keeps_settings_and_drops_stale_functions() {
    let tmp = TempDir::new("restage");
    let out = tmp.0.join("app");
    let first = fake_binary(&tmp.0, "v1", b"v1");
    stage::stage(&out, &first).unwrap();

    let mine = "{\"IsEncrypted\": false, \"Values\": {\"RUST_LOG\": \"debug\"}}";
    fs::write(out.join("local.settings.json"), mine).unwrap();
    // A function from an older build, and one whose folder also holds a user's file.
    fs::create_dir_all(out.join("OldFunction")).unwrap();
    fs::write(out.join("OldFunction/function.json"), "{}").unwrap();
    fs::create_dir_all(out.join("Gone")).unwrap();
    fs::write(out.join("Gone/function.json"), "{}").unwrap();
    fs::write(out.join("Gone/notes.txt"), "keep").unwrap();
    fs::create_dir_all(out.join("assets")).unwrap(); // not a function: untouched

    let second = fake_binary(&tmp.0, "v2", b"v2");
    let staged = stage::stage(&out, &second).unwrap();

    assert!(!staged.local_settings_written);
    assert_eq!(
        fs::read_to_string(out.join("local.settings.json")).unwrap(),
        mine
    );
    assert_eq!(
        staged.removed_stale,
        vec![
            out.join("Gone/function.json"),
            out.join("OldFunction/function.json")
        ]
    );
    assert!(!out.join("OldFunction").exists());
    assert_eq!(
        entries(&out.join("Gone")),
        BTreeSet::from(["notes.txt".to_owned()])
    );
    assert!(out.join("assets").is_dir());
    assert_eq!(fs::read(&staged.executable).unwrap(), b"v2");

    // Staging the staged handler onto itself must not truncate it.
    let again = stage::stage(&out, &staged.executable).unwrap();
    assert_eq!(fs::read(&again.executable).unwrap(), b"v2");
    assert!(is_executable(&again.executable));
    // No temporary files left behind.
    assert!(
        entries(&out).iter().all(|n| !n.contains(".staging-")),
        "{:?}",
        entries(&out)
    );
}

#[test]
fn staged_real_handler_runs() {
    let tmp = TempDir::new("real");
    let out = tmp.0.join("app");
    let staged = stage::stage(&out, Path::new(env!("CARGO_BIN_EXE_tablescan"))).unwrap();
    let output = std::process::Command::new(&staged.executable)
        .arg("--version")
        .output()
        .expect("run staged handler");
    assert!(output.status.success(), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout).starts_with("tablescan "),
        "{output:?}"
    );
}

#[test]
fn stage_names_a_windows_build_with_exe() {
    let tmp = TempDir::new("windows");
    let binary = fake_binary(&tmp.0, "tablescan.exe", b"MZ");
    let out = tmp.0.join("app");
    let staged = stage::stage(&out, &binary).unwrap();

    assert_eq!(staged.executable, out.join("tablescan.exe"));
    assert!(!out.join("tablescan").exists());
    let host = read_json(&staged.host_json);
    assert_eq!(
        host["customHandler"]["description"]["defaultExecutablePath"],
        "tablescan.exe"
    );
    // Only that value changed.
    let mut expected: Value = serde_json::from_str(HOST_JSON).unwrap();
    expected["customHandler"]["description"]["defaultExecutablePath"] = json!("tablescan.exe");
    assert_eq!(host, expected);
    let errors = schema_errors("host.json.schema.json", &host);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn stage_without_a_binary_writes_nothing() {
    let tmp = TempDir::new("missing");
    let out = tmp.0.join("app");
    let err = stage::stage(&out, &tmp.0.join("no-such-binary")).unwrap_err();
    assert!(matches!(err, StageError::Io { .. }), "{err:?}");
    assert!(
        !out.exists(),
        "stage created {} despite failing",
        out.display()
    );

    let err = stage::stage(&out, &tmp.0).unwrap_err();
    assert!(matches!(err, StageError::BinaryNotAFile(_)), "{err:?}");
    assert!(!out.exists());
}

#[test]
fn run_stage_defaults_to_the_given_binary_and_out() {
    let tmp = TempDir::new("run");
    let binary = fake_binary(&tmp.0, "h", b"h");
    let out = tmp.0.join("app");
    let staged = stage::run_stage(stage::StageArgs {
        out: out.clone(),
        binary: Some(binary),
    })
    .unwrap();
    assert_eq!(staged.root, out);
    assert_eq!(fs::read(out.join("tablescan")).unwrap(), b"h");
}
