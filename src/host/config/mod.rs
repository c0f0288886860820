//! Reading and validating a function app folder (host.json, `<Function>/function.json`,
//! local.settings.json) the way the Functions host v4 does, with errors that name file and field.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use super::timespan::parse_timespan;
use crate::storage::MessageEncoding;

/// A configuration problem: which file, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(file: &Path, field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(
                f,
                "{}: `{}`: {}",
                self.file.display(),
                self.field,
                self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// The whole app as the host sees it.
#[derive(Debug, Clone)]
pub struct AppConfig {
    pub root: PathBuf,
    pub handler: HandlerConfig,
    /// `customHandler.enableForwardingHttpRequest`.
    pub forwarding: bool,
    /// `extensions.http.routePrefix` (default `api`), without surrounding slashes.
    pub route_prefix: String,
    /// `functionTimeout` (Consumption semantics: default 5 min, 1 s ..= 10 min).
    pub function_timeout: Duration,
    pub queues: QueuesOptions,
    pub functions: Vec<FunctionConfig>,
}

/// `customHandler.description`.
#[derive(Debug, Clone)]
pub struct HandlerConfig {
    /// Absolute path if the file exists under the app root, else a command looked up on PATH.
    pub executable: PathBuf,
    /// Raw arguments; `%VAR%` is expanded at launch, when the worker variables are known.
    pub arguments: Vec<String>,
    pub working_directory: PathBuf,
}

/// `extensions.queues`, with the runtime's defaults except where noted.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuesOptions {
    pub batch_size: u32,
    /// `None` = not set; see [`QueuesOptions::effective_new_batch_threshold`].
    pub new_batch_threshold: Option<u32>,
    /// Default 2 s: what Core Tools uses in development (the Azure runtime default is 1 min).
    pub max_polling_interval: Duration,
    pub visibility_timeout: Duration,
    pub max_dequeue_count: u64,
    pub message_encoding: MessageEncoding,
}

impl Default for QueuesOptions {
    fn default() -> Self {
        QueuesOptions {
            batch_size: 16,
            new_batch_threshold: None,
            max_polling_interval: Duration::from_secs(2),
            visibility_timeout: Duration::ZERO,
            max_dequeue_count: 5,
            message_encoding: MessageEncoding::Base64,
        }
    }
}

impl QueuesOptions {
    /// The runtime computes `(batchSize / 2) * processorCount`, with processorCount = 1 on
    /// Consumption (`WEBSITE_SKU=Dynamic`). tablescan targets Consumption, so an unset
    /// `WEBSITE_SKU` counts as Consumption here; any other SKU uses this machine's core count.
    pub fn effective_new_batch_threshold(&self, website_sku: Option<&str>) -> u32 {
        if let Some(n) = self.new_batch_threshold {
            return n;
        }
        let processors = match website_sku {
            None => 1,
            Some(sku) if sku.eq_ignore_ascii_case("Dynamic") => 1,
            Some(_) => std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
        };
        (self.batch_size / 2) * processors
    }
}

#[derive(Debug, Clone)]
pub struct FunctionConfig {
    /// Folder name, exact case (the handler route is `/{name}`).
    pub name: String,
    pub file: PathBuf,
    pub trigger: TriggerConfig,
    pub outputs: Vec<OutputBinding>,
    /// Exactly one `httpTrigger` in and one `http` out: eligible for forwarding mode.
    pub http_in_out_only: bool,
}

#[derive(Debug, Clone)]
pub enum TriggerConfig {
    Http(HttpTriggerConfig),
    Queue(QueueTriggerConfig),
}

impl TriggerConfig {
    pub fn binding_name(&self) -> &str {
        match self {
            TriggerConfig::Http(h) => &h.name,
            TriggerConfig::Queue(q) => &q.name,
        }
    }
}

#[derive(Debug, Clone)]
pub struct HttpTriggerConfig {
    pub name: String,
    /// Route template without prefix; `None` = the function name.
    pub route: Option<String>,
    /// Upper-case methods; `None` = every method.
    pub methods: Option<Vec<String>>,
    pub auth_level: String,
}

#[derive(Debug, Clone)]
pub struct QueueTriggerConfig {
    pub name: String,
    /// As written; may be `%AppSetting%`. Resolved by [`resolve_queue_name`].
    pub queue_name: String,
    /// App setting holding the connection string.
    pub connection: String,
    /// `dataType: binary`: the handler gets plain base64 of the message bytes.
    pub binary: bool,
}

#[derive(Debug, Clone)]
pub struct OutputBinding {
    pub name: String,
    pub kind: OutputKind,
    pub binary: bool,
}

#[derive(Debug, Clone)]
pub enum OutputKind {
    Http,
    Queue {
        queue_name: String,
        connection: String,
    },
}

/// Storage connection app setting used when a binding names none.
pub const DEFAULT_CONNECTION: &str = "AzureWebJobsStorage";

/// `^[a-z][a-z0-9_\-]{0,127}$` case-insensitive, and not `host` (host `Utility.IsValidFunctionName`).
pub fn is_valid_function_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphabetic()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
        && !name.eq_ignore_ascii_case("host")
}

/// `^([a-zA-Z][a-zA-Z0-9]{0,127}|\$return)$` (host `Utility.BindingNameValidationRegex`).
pub fn is_valid_binding_name(name: &str) -> bool {
    if name == "$return" {
        return true;
    }
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphabetic()
        && b[1..].iter().all(|c| c.is_ascii_alphanumeric())
}

/// Storage queue name rules: 3-63 chars of `a-z0-9-`, starting and ending alphanumeric,
/// no consecutive hyphens.
pub fn validate_queue_name(name: &str) -> Result<(), String> {
    let b = name.as_bytes();
    let ok = (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid queue name (3-63 characters of a-z, 0-9 and single hyphens, \
             starting and ending with a letter or digit)"
        ))
    }
}

/// The app settings: the process environment plus local.settings.json `Values` for keys the
/// environment does not set (a real environment variable wins, as in Core Tools v4).
#[derive(Debug, Clone, Default)]
pub struct AppSettings {
    values: BTreeMap<String, String>,
}

impl AppSettings {
    pub fn new(
        env: impl IntoIterator<Item = (String, String)>,
        local_values: BTreeMap<String, String>,
    ) -> Self {
        let mut values: BTreeMap<String, String> = env.into_iter().collect();
        for (k, v) in local_values {
            values.entry(k).or_insert(v);
        }
        AppSettings { values }
    }

    pub fn from_map(values: BTreeMap<String, String>) -> Self {
        AppSettings { values }
    }

    /// Exact key first, then case-insensitive (.NET configuration keys are case-insensitive).
    pub fn get(&self, key: &str) -> Option<&str> {
        if let Some(v) = self.values.get(key) {
            return Some(v);
        }
        self.values
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.values.insert(key.into(), value.into());
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.values.iter()
    }

    /// The connection string for a binding's `connection` (the host also tries `AzureWebJobs<name>`).
    pub fn connection_string(&self, connection: &str) -> Option<&str> {
        self.get(connection)
            .or_else(|| self.get(&format!("AzureWebJobs{connection}")))
            .filter(|v| !v.trim().is_empty())
    }
}

/// Reads local.settings.json `Values`. `IsEncrypted: true` is refused (we cannot decrypt).
pub fn read_local_settings(file: &Path) -> Result<BTreeMap<String, String>, ConfigError> {
    let root = read_json_object(file)?;
    if get_ci(&root, "IsEncrypted").and_then(Value::as_bool) == Some(true) {
        return Err(ConfigError::new(
            file,
            "IsEncrypted",
            "encrypted settings are not supported; run `func settings decrypt` first",
        ));
    }
    let mut out = BTreeMap::new();
    match get_ci(&root, "Values") {
        None | Some(Value::Null) => {}
        Some(Value::Object(values)) => {
            for (k, v) in values {
                match v {
                    Value::String(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    // Core Tools accepts scalars and stringifies them.
                    Value::Bool(_) | Value::Number(_) => {
                        out.insert(k.clone(), v.to_string());
                    }
                    Value::Null => {}
                    _ => {
                        return Err(ConfigError::new(
                            file,
                            format!("Values.{k}"),
                            "values must be strings",
                        ));
                    }
                }
            }
        }
        Some(_) => return Err(ConfigError::new(file, "Values", "must be an object")),
    }
    Ok(out)
}

fn read_json_object(file: &Path) -> Result<Map<String, Value>, ConfigError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| ConfigError::new(file, "", format!("cannot read: {e}")))?;
    // The host tolerates a UTF-8 BOM and comments are not JSON; a BOM is common from Windows editors.
    let text = text.trim_start_matches('\u{feff}');
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ConfigError::new(file, "", "must contain a JSON object")),
        Err(e) => Err(ConfigError::new(file, "", format!("invalid JSON: {e}"))),
    }
}

/// Case-insensitive property lookup (the host binds configuration case-insensitively).
fn get_ci<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).or_else(|| {
        map.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

fn get_obj<'a>(
    map: &'a Map<String, Value>,
    key: &str,
    file: &Path,
    path: &str,
) -> Result<Option<&'a Map<String, Value>>, ConfigError> {
    match get_ci(map, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(_) => Err(ConfigError::new(file, path, "must be an object")),
    }
}

fn get_str<'a>(
    map: &'a Map<String, Value>,
    key: &str,
    file: &Path,
    path: &str,
) -> Result<Option<&'a str>, ConfigError> {
    match get_ci(map, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ConfigError::new(file, path, "must be a string")),
    }
}

fn get_bool(
    map: &Map<String, Value>,
    key: &str,
    file: &Path,
    path: &str,
) -> Result<Option<bool>, ConfigError> {
    match get_ci(map, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        // Configuration binding accepts "true"/"false" strings too.
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(Some(true)),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(Some(false)),
        Some(_) => Err(ConfigError::new(file, path, "must be true or false")),
    }
}

fn get_int(
    map: &Map<String, Value>,
    key: &str,
    file: &Path,
    path: &str,
) -> Result<Option<i64>, ConfigError> {
    match get_ci(map, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.is_i64() => Ok(n.as_i64()),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| ConfigError::new(file, path, "must be an integer")),
        Some(_) => Err(ConfigError::new(file, path, "must be an integer")),
    }
}

fn get_timespan(
    map: &Map<String, Value>,
    key: &str,
    file: &Path,
    path: &str,
) -> Result<Option<Duration>, ConfigError> {
    match get_str(map, key, file, path)? {
        None => Ok(None),
        Some(s) => parse_timespan(s)
            .map(Some)
            .map_err(|e| ConfigError::new(file, path, e)),
    }
}

/// Loads and validates the app folder.
pub fn load_app(root: &Path) -> Result<AppConfig, ConfigError> {
    let root = std::fs::canonicalize(root)
        .map_err(|e| ConfigError::new(root, "", format!("app folder not found: {e}")))?;
    let host_file = root.join("host.json");
    if !host_file.is_file() {
        return Err(ConfigError::new(
            &host_file,
            "",
            "missing: the app folder must contain host.json",
        ));
    }
    let host = read_json_object(&host_file)?;
    let f = host_file.as_path();

    match get_ci(&host, "version") {
        Some(Value::String(v)) if v == "2.0" => {}
        Some(v) => {
            return Err(ConfigError::new(
                f,
                "version",
                format!("{v} is an invalid value; it must be \"2.0\""),
            ));
        }
        None => {
            return Err(ConfigError::new(
                f,
                "version",
                "the required property is missing (use \"2.0\")",
            ))
        }
    }

    // `customHandler` wins over the legacy `httpWorker` section.
    let (section, section_name) = match get_obj(&host, "customHandler", f, "customHandler")? {
        Some(s) => (s, "customHandler"),
        None => match get_obj(&host, "httpWorker", f, "httpWorker")? {
            Some(_) => {
                return Err(ConfigError::new(
                    f,
                    "httpWorker",
                    "the legacy httpWorker section is not supported by this host; use customHandler",
                ));
            }
            None => {
                return Err(ConfigError::new(
                    f,
                    "customHandler",
                    "missing: this host only runs custom handlers",
                ))
            }
        },
    };
    let description = get_obj(
        section,
        "description",
        f,
        &format!("{section_name}.description"),
    )?
    .ok_or_else(|| ConfigError::new(f, format!("{section_name}.description"), "missing"))?;
    let exe_field = format!("{section_name}.description.defaultExecutablePath");
    let exe = get_str(description, "defaultExecutablePath", f, &exe_field)?.unwrap_or("");
    if exe.trim().is_empty() {
        return Err(ConfigError::new(
            f,
            exe_field,
            "must name the handler executable",
        ));
    }
    let executable = {
        let candidate = root.join(exe);
        // Relative paths that exist under the app root are made absolute; otherwise PATH lookup.
        if candidate.is_file() {
            candidate
        } else {
            PathBuf::from(exe)
        }
    };
    let args_field = format!("{section_name}.description.arguments");
    let arguments = match get_ci(description, "arguments") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(ConfigError::new(
                    f,
                    format!("{args_field}[{i}]"),
                    "must be a string",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ConfigError::new(
                f,
                args_field,
                "must be an array of strings",
            ))
        }
    };
    let wd_field = format!("{section_name}.description.workingDirectory");
    let working_directory = match get_str(description, "workingDirectory", f, &wd_field)? {
        None | Some("") => root.clone(),
        Some(wd) => root.join(wd),
    };
    if !working_directory.is_dir() {
        return Err(ConfigError::new(
            f,
            wd_field,
            format!("{} is not a directory", working_directory.display()),
        ));
    }
    let forwarding = get_bool(
        section,
        "enableForwardingHttpRequest",
        f,
        &format!("{section_name}.enableForwardingHttpRequest"),
    )?
    .unwrap_or(false);
    if get_bool(
        section,
        "enableProxyingHttpRequest",
        f,
        &format!("{section_name}.enableProxyingHttpRequest"),
    )? == Some(true)
    {
        return Err(ConfigError::new(
            f,
            format!("{section_name}.enableProxyingHttpRequest"),
            "proxying mode (2025 hosts) is not implemented by this host; use enableForwardingHttpRequest",
        ));
    }
    if get_ci(section, "port").is_some_and(|v| !v.is_null()) {
        return Err(ConfigError::new(
            f,
            format!("{section_name}.port"),
            "a fixed handler port is not supported: instances need one port each",
        ));
    }

    let function_timeout = match get_ci(&host, "functionTimeout") {
        None | Some(Value::Null) => Duration::from_secs(300),
        Some(Value::String(s)) if s.trim() == "-1" => {
            return Err(ConfigError::new(
                f,
                "functionTimeout",
                "-1 (unbounded) is not allowed on the Consumption plan this host imitates; use at most 00:10:00",
            ));
        }
        Some(Value::String(s)) => {
            let d = parse_timespan(s).map_err(|e| ConfigError::new(f, "functionTimeout", e))?;
            if d < Duration::from_secs(1) || d > Duration::from_secs(600) {
                return Err(ConfigError::new(
                    f,
                    "functionTimeout",
                    format!("{s} is outside the Consumption plan range 00:00:01 to 00:10:00"),
                ));
            }
            d
        }
        Some(_) => {
            return Err(ConfigError::new(
                f,
                "functionTimeout",
                "must be a time span string like \"00:05:00\"",
            ))
        }
    };

    let extensions = get_obj(&host, "extensions", f, "extensions")?;
    let mut route_prefix = "api".to_string();
    let mut queues = QueuesOptions::default();
    if let Some(ext) = extensions {
        if let Some(http) = get_obj(ext, "http", f, "extensions.http")? {
            if let Some(p) = get_str(http, "routePrefix", f, "extensions.http.routePrefix")? {
                route_prefix = p.trim_matches('/').to_string();
            }
        }
        if let Some(q) = get_obj(ext, "queues", f, "extensions.queues")? {
            queues = parse_queues(q, f)?;
        }
    }

    // host.json `functions`: an explicit list of functions to load.
    let only: Option<Vec<String>> = match get_ci(&host, "functions") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        ConfigError::new(f, format!("functions[{i}]"), "must be a string")
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => {
            return Err(ConfigError::new(
                f,
                "functions",
                "must be an array of function names",
            ))
        }
    };

    let mut functions = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&root)
        .map_err(|e| ConfigError::new(&root, "", format!("cannot list: {e}")))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.join("function.json").is_file())
        .collect();
    entries.sort();
    for dir in entries {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if let Some(only) = &only {
            if !only.iter().any(|o| o.eq_ignore_ascii_case(&name)) {
                continue;
            }
        }
        if let Some(func) = parse_function(&name, &dir.join("function.json"))? {
            if functions
                .iter()
                .any(|g: &FunctionConfig| g.name.eq_ignore_ascii_case(&func.name))
            {
                return Err(ConfigError::new(
                    &func.file,
                    "",
                    format!("duplicate function name {:?}", func.name),
                ));
            }
            functions.push(func);
        }
    }
    if functions.is_empty() {
        return Err(ConfigError::new(
            &root,
            "",
            "no functions found (expected <Function>/function.json folders)",
        ));
    }

    Ok(AppConfig {
        handler: HandlerConfig {
            executable,
            arguments,
            working_directory,
        },
        root,
        forwarding,
        route_prefix,
        function_timeout,
        queues,
        functions,
    })
}

fn parse_queues(q: &Map<String, Value>, f: &Path) -> Result<QueuesOptions, ConfigError> {
    let mut o = QueuesOptions::default();
    for key in q.keys() {
        const KNOWN: [&str; 6] = [
            "batchSize",
            "newBatchThreshold",
            "maxPollingInterval",
            "visibilityTimeout",
            "maxDequeueCount",
            "messageEncoding",
        ];
        if !KNOWN.iter().any(|k| k.eq_ignore_ascii_case(key)) {
            return Err(ConfigError::new(
                f,
                format!("extensions.queues.{key}"),
                "unknown setting",
            ));
        }
    }
    if let Some(n) = get_int(q, "batchSize", f, "extensions.queues.batchSize")? {
        if !(1..=32).contains(&n) {
            return Err(ConfigError::new(
                f,
                "extensions.queues.batchSize",
                format!("{n} is outside 1..=32"),
            ));
        }
        o.batch_size = n as u32;
    }
    if let Some(n) = get_int(
        q,
        "newBatchThreshold",
        f,
        "extensions.queues.newBatchThreshold",
    )? {
        if !(0..=10_000).contains(&n) {
            return Err(ConfigError::new(
                f,
                "extensions.queues.newBatchThreshold",
                format!("{n} must be >= 0"),
            ));
        }
        o.new_batch_threshold = Some(n as u32);
    }
    if let Some(d) = get_timespan(
        q,
        "maxPollingInterval",
        f,
        "extensions.queues.maxPollingInterval",
    )? {
        if d < Duration::from_millis(100) {
            return Err(ConfigError::new(
                f,
                "extensions.queues.maxPollingInterval",
                "must be at least 00:00:00.100",
            ));
        }
        o.max_polling_interval = d;
    }
    if let Some(d) = get_timespan(
        q,
        "visibilityTimeout",
        f,
        "extensions.queues.visibilityTimeout",
    )? {
        if d > Duration::from_secs(7 * 86_400) {
            return Err(ConfigError::new(
                f,
                "extensions.queues.visibilityTimeout",
                "must be at most 7 days",
            ));
        }
        o.visibility_timeout = d;
    }
    if let Some(n) = get_int(q, "maxDequeueCount", f, "extensions.queues.maxDequeueCount")? {
        if n < 1 {
            return Err(ConfigError::new(
                f,
                "extensions.queues.maxDequeueCount",
                "must be at least 1",
            ));
        }
        o.max_dequeue_count = n as u64;
    }
    if let Some(e) = get_str(q, "messageEncoding", f, "extensions.queues.messageEncoding")? {
        o.message_encoding = if e.eq_ignore_ascii_case("base64") {
            MessageEncoding::Base64
        } else if e.eq_ignore_ascii_case("none") {
            MessageEncoding::None
        } else {
            return Err(ConfigError::new(
                f,
                "extensions.queues.messageEncoding",
                format!("{e:?}: use base64 or none"),
            ));
        };
    }
    Ok(o)
}

const HTTP_METHODS: [&str; 8] = [
    "get", "post", "delete", "head", "patch", "put", "options", "trace",
];

/// Parses one function.json; `Ok(None)` for disabled/excluded functions.
pub fn parse_function(name: &str, file: &Path) -> Result<Option<FunctionConfig>, ConfigError> {
    if !is_valid_function_name(name) {
        return Err(ConfigError::new(
            file,
            "",
            format!(
                "{name:?} is not a valid function name (folder name must match ^[a-z][a-z0-9_\\-]{{0,127}}$ \
                 case-insensitively and not be 'host')"
            ),
        ));
    }
    let root = read_json_object(file)?;
    if get_bool(&root, "disabled", file, "disabled")? == Some(true)
        || get_bool(&root, "excluded", file, "excluded")? == Some(true)
    {
        return Ok(None);
    }
    if get_ci(&root, "retry").is_some_and(|v| !v.is_null()) {
        return Err(ConfigError::new(
            file,
            "retry",
            "retry policies are not implemented by this host",
        ));
    }
    let bindings = match get_ci(&root, "bindings") {
        Some(Value::Array(b)) => b,
        Some(_) => return Err(ConfigError::new(file, "bindings", "must be an array")),
        None => return Err(ConfigError::new(file, "bindings", "missing")),
    };
    let mut trigger: Option<TriggerConfig> = None;
    let mut outputs = Vec::new();
    let mut seen_names: Vec<String> = Vec::new();
    let (mut ins, mut outs, mut http_in, mut http_out) = (0, 0, 0, 0);
    for (i, b) in bindings.iter().enumerate() {
        let field = |k: &str| format!("bindings[{i}].{k}");
        let Value::Object(b) = b else {
            return Err(ConfigError::new(
                file,
                format!("bindings[{i}]"),
                "must be an object",
            ));
        };
        let bname = get_str(b, "name", file, &field("name"))?
            .ok_or_else(|| ConfigError::new(file, field("name"), "missing"))?;
        if !is_valid_binding_name(bname) {
            return Err(ConfigError::new(
                file,
                field("name"),
                format!(
                    "{bname:?} is invalid (must match ^([a-zA-Z][a-zA-Z0-9]{{0,127}}|\\$return)$)"
                ),
            ));
        }
        if seen_names.iter().any(|n| n.eq_ignore_ascii_case(bname)) {
            return Err(ConfigError::new(
                file,
                field("name"),
                format!("multiple bindings named {bname:?}"),
            ));
        }
        seen_names.push(bname.to_string());
        let btype = get_str(b, "type", file, &field("type"))?
            .ok_or_else(|| ConfigError::new(file, field("type"), "missing"))?;
        let direction = get_str(b, "direction", file, &field("direction"))?
            .ok_or_else(|| ConfigError::new(file, field("direction"), "missing"))?
            .to_ascii_lowercase();
        let binary = match get_str(b, "dataType", file, &field("dataType"))? {
            None => false,
            Some(d) if d.eq_ignore_ascii_case("binary") => true,
            Some(d) if d.eq_ignore_ascii_case("string") => false,
            Some(d) => {
                return Err(ConfigError::new(
                    file,
                    field("dataType"),
                    format!("{d:?} is not supported (string or binary)"),
                ))
            }
        };
        match direction.as_str() {
            "in" => ins += 1,
            "out" => outs += 1,
            "inout" => {
                return Err(ConfigError::new(
                    file,
                    field("direction"),
                    "inout bindings are not supported by this host",
                ));
            }
            other => {
                return Err(ConfigError::new(
                    file,
                    field("direction"),
                    format!("{other:?}: use in or out"),
                ))
            }
        }
        let is_trigger = btype.to_ascii_lowercase().ends_with("trigger");
        if is_trigger && direction != "in" {
            return Err(ConfigError::new(
                file,
                field("direction"),
                "a trigger binding must have direction \"in\"",
            ));
        }
        if is_trigger && trigger.is_some() {
            return Err(ConfigError::new(
                file,
                field("type"),
                "multiple trigger bindings; a function has exactly one",
            ));
        }
        let connection = || -> Result<String, ConfigError> {
            Ok(
                match get_str(b, "connection", file, &field("connection"))? {
                    None | Some("") => DEFAULT_CONNECTION.to_string(),
                    Some(c) => c.to_string(),
                },
            )
        };
        match btype.to_ascii_lowercase().as_str() {
            "httptrigger" => {
                http_in += 1;
                let route = get_str(b, "route", file, &field("route"))?
                    .map(|r| r.trim_matches('/').to_string());
                if let Some(r) = &route {
                    super::route::RouteTemplate::parse(r)
                        .map_err(|e| ConfigError::new(file, field("route"), e))?;
                }
                let methods = match get_ci(b, "methods") {
                    None | Some(Value::Null) => None,
                    Some(Value::Array(ms)) => {
                        let mut out = Vec::new();
                        for (j, m) in ms.iter().enumerate() {
                            let m = m.as_str().unwrap_or_default();
                            if !HTTP_METHODS.iter().any(|k| k.eq_ignore_ascii_case(m)) {
                                return Err(ConfigError::new(
                                    file,
                                    format!("bindings[{i}].methods[{j}]"),
                                    format!(
                                        "{m:?} is not an HTTP method ({})",
                                        HTTP_METHODS.join(", ")
                                    ),
                                ));
                            }
                            out.push(m.to_ascii_uppercase());
                        }
                        // An empty list means every method, like no list at all.
                        (!out.is_empty()).then_some(out)
                    }
                    Some(_) => {
                        return Err(ConfigError::new(
                            file,
                            field("methods"),
                            "must be an array of methods",
                        ))
                    }
                };
                let auth_level = get_str(b, "authLevel", file, &field("authLevel"))?
                    .unwrap_or("function")
                    .to_ascii_lowercase();
                if !["anonymous", "function", "admin", "system", "user"]
                    .contains(&auth_level.as_str())
                {
                    return Err(ConfigError::new(
                        file,
                        field("authLevel"),
                        format!("{auth_level:?}: use anonymous, function or admin"),
                    ));
                }
                trigger = Some(TriggerConfig::Http(HttpTriggerConfig {
                    name: bname.to_string(),
                    route,
                    methods,
                    auth_level,
                }));
            }
            "queuetrigger" => {
                let queue_name = get_str(b, "queueName", file, &field("queueName"))?
                    .filter(|q| !q.is_empty())
                    .ok_or_else(|| ConfigError::new(file, field("queueName"), "missing"))?;
                trigger = Some(TriggerConfig::Queue(QueueTriggerConfig {
                    name: bname.to_string(),
                    queue_name: queue_name.to_string(),
                    connection: connection()?,
                    binary,
                }));
            }
            "http" => {
                if direction != "out" {
                    return Err(ConfigError::new(
                        file,
                        field("direction"),
                        "an http binding must have direction \"out\"",
                    ));
                }
                http_out += 1;
                outputs.push(OutputBinding {
                    name: bname.to_string(),
                    kind: OutputKind::Http,
                    binary,
                });
            }
            "queue" => {
                if direction != "out" {
                    return Err(ConfigError::new(
                        file,
                        field("direction"),
                        "a queue binding must have direction \"out\"",
                    ));
                }
                let queue_name = get_str(b, "queueName", file, &field("queueName"))?
                    .filter(|q| !q.is_empty())
                    .ok_or_else(|| ConfigError::new(file, field("queueName"), "missing"))?;
                outputs.push(OutputBinding {
                    name: bname.to_string(),
                    kind: OutputKind::Queue {
                        queue_name: queue_name.to_string(),
                        connection: connection()?,
                    },
                    binary,
                });
            }
            _ => {
                return Err(ConfigError::new(
                    file,
                    field("type"),
                    format!("binding type {btype:?} is not supported by this host (httpTrigger, http, queueTrigger, queue)"),
                ));
            }
        }
    }
    let trigger = trigger.ok_or_else(|| {
        ConfigError::new(
            file,
            "bindings",
            "no trigger binding; a function needs exactly one",
        )
    })?;
    if http_out > 0 && !matches!(trigger, TriggerConfig::Http(_)) {
        return Err(ConfigError::new(
            file,
            "bindings",
            "an http output binding needs an httpTrigger",
        ));
    }
    Ok(Some(FunctionConfig {
        name: name.to_string(),
        file: file.to_path_buf(),
        http_in_out_only: ins == 1 && outs == 1 && http_in == 1 && http_out == 1,
        trigger,
        outputs,
    }))
}

/// Resolves every `%AppSetting%` token in a queue name (`%Q%`, `%Q%-poison`, `jobs-%Env%`), as the
/// host's `ResolveWholeString` does, then lower-cases and validates it. A token naming a missing
/// setting, or a `%` without its closing `%`, is an error.
pub fn resolve_queue_name(raw: &str, settings: &AppSettings) -> Result<String, String> {
    let mut resolved = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(start) = rest.find('%') {
        resolved.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after
            .find('%')
            .ok_or_else(|| format!("queueName {raw:?}: a %AppSetting% token is not closed"))?;
        let key = &after[..end];
        let value = settings.get(key).ok_or_else(|| {
            format!("app setting {key:?} (named by queueName {raw:?}) is not set")
        })?;
        resolved.push_str(value);
        rest = &after[end + 1..];
    }
    resolved.push_str(rest);
    let lower = resolved.to_ascii_lowercase();
    validate_queue_name(&lower)?;
    Ok(lower)
}

/// Expands `%VAR%` tokens in a handler argument from `vars`; unresolved tokens are removed,
/// as the host's `DefaultWorkerProcessFactory` does.
pub fn expand_argument(arg: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(start) = rest.find('%') {
        let after = &rest[start + 1..];
        match after.find('%') {
            Some(end) => {
                let token = &after[..end];
                out.push_str(&rest[..start]);
                let valid_name = !token.is_empty() && !token.contains(char::is_whitespace);
                if valid_name {
                    if let Some(v) = vars.get(token).or_else(|| {
                        vars.iter()
                            .find(|(k, _)| k.eq_ignore_ascii_case(token))
                            .map(|(_, v)| v)
                    }) {
                        out.push_str(v);
                    }
                    rest = &after[end + 1..];
                } else {
                    // `%%` or `% x %` is not a token: keep the first '%' literally.
                    out.push('%');
                    rest = after;
                }
            }
            None => break,
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_app(host: &str, functions: &[(&str, &str)]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tablescan-host-config-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("host.json"), host).unwrap();
        for (name, json) in functions {
            std::fs::create_dir_all(dir.join(name)).unwrap();
            std::fs::write(dir.join(name).join("function.json"), json).unwrap();
        }
        dir
    }

    const HOST: &str =
        r#"{"version":"2.0","customHandler":{"description":{"defaultExecutablePath":"handler"}}}"#;
    const QUEUE_FN: &str =
        r#"{"bindings":[{"name":"msg","type":"queueTrigger","direction":"in","queueName":"%Q%"}]}"#;

    #[test]
    fn names() {
        assert!(is_valid_function_name("PrefixScan"));
        assert!(is_valid_function_name("a_b-c9"));
        assert!(!is_valid_function_name("Host"));
        assert!(!is_valid_function_name("9abc"));
        assert!(!is_valid_function_name("a.b"));
        assert!(!is_valid_function_name(&"a".repeat(129)));
        assert!(is_valid_binding_name("$return"));
        assert!(is_valid_binding_name("myQueueItem"));
        assert!(!is_valid_binding_name("my_item"));
        assert!(!is_valid_binding_name("$ret"));
        assert!(validate_queue_name("orders-in").is_ok());
        assert!(validate_queue_name("Orders").is_err());
        assert!(validate_queue_name("a--b").is_err());
        assert!(validate_queue_name("ab").is_err());
    }

    #[test]
    fn loads_defaults() {
        let dir = temp_app(HOST, &[("Work", QUEUE_FN)]);
        let app = load_app(&dir).unwrap();
        assert_eq!(app.route_prefix, "api");
        assert_eq!(app.function_timeout, Duration::from_secs(300));
        assert_eq!(app.queues, QueuesOptions::default());
        assert_eq!(app.queues.effective_new_batch_threshold(None), 8);
        assert_eq!(app.handler.executable, PathBuf::from("handler"));
        assert_eq!(
            app.handler.working_directory,
            std::fs::canonicalize(&dir).unwrap()
        );
        let TriggerConfig::Queue(q) = &app.functions[0].trigger else {
            panic!()
        };
        assert_eq!(q.connection, DEFAULT_CONNECTION);
        assert!(!app.functions[0].http_in_out_only);
    }

    #[test]
    fn errors_name_file_and_field() {
        // (host.json, functions, file in the error, field in the error)
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: &[Case] = &[
            (
                r#"{"customHandler":{}}"#,
                &[("Work", QUEUE_FN)],
                "host.json",
                "version",
            ),
            (
                r#"{"version":"2.0","customHandler":{"description":{"defaultExecutablePath":""}}}"#,
                &[("Work", QUEUE_FN)],
                "host.json",
                "customHandler.description.defaultExecutablePath",
            ),
            (
                r#"{"version":"2.0","functionTimeout":"00:20:00","customHandler":{"description":{"defaultExecutablePath":"h"}}}"#,
                &[("Work", QUEUE_FN)],
                "host.json",
                "functionTimeout",
            ),
            (
                r#"{"version":"2.0","extensions":{"queues":{"batchSize":64}},"customHandler":{"description":{"defaultExecutablePath":"h"}}}"#,
                &[("Work", QUEUE_FN)],
                "host.json",
                "extensions.queues.batchSize",
            ),
            (
                r#"{"version":"2.0","extensions":{"queues":{"maxPollingInterval":"00:00:00.050"}},"customHandler":{"description":{"defaultExecutablePath":"h"}}}"#,
                &[("Work", QUEUE_FN)],
                "host.json",
                "extensions.queues.maxPollingInterval",
            ),
            (
                HOST,
                &[(
                    "Work",
                    r#"{"bindings":[{"name":"my_msg","type":"queueTrigger","direction":"in","queueName":"q1q"}]}"#,
                )],
                "function.json",
                "bindings[0].name",
            ),
            (
                HOST,
                &[(
                    "Work",
                    r#"{"bindings":[{"name":"m","type":"blobTrigger","direction":"in"}]}"#,
                )],
                "function.json",
                "bindings[0].type",
            ),
            (
                HOST,
                &[(
                    "Work",
                    r#"{"bindings":[{"name":"m","type":"queueTrigger","direction":"in"}]}"#,
                )],
                "function.json",
                "bindings[0].queueName",
            ),
            (
                HOST,
                &[(
                    "Work",
                    r#"{"bindings":[{"name":"req","type":"httpTrigger","direction":"in","methods":["fetch"]}]}"#,
                )],
                "function.json",
                "bindings[0].methods[0]",
            ),
            (
                HOST,
                &[(
                    "Work",
                    r#"{"bindings":[{"name":"res","type":"http","direction":"out"}]}"#,
                )],
                "function.json",
                "bindings",
            ),
        ];
        for (host, functions, file, field) in cases {
            let dir = temp_app(host, functions);
            let err = load_app(&dir).unwrap_err();
            assert!(err.file.ends_with(file), "{err}");
            assert_eq!(err.field, *field, "{err}");
        }
        let dir = temp_app(HOST, &[("host", QUEUE_FN)]);
        let err = load_app(&dir).unwrap_err();
        assert!(
            err.to_string().contains("not a valid function name"),
            "{err}"
        );
    }

    #[test]
    fn http_in_out_and_settings() {
        let dir = temp_app(
            r#"{"version":"2.0","customHandler":{"description":{"defaultExecutablePath":"h"},"enableForwardingHttpRequest":true},
               "extensions":{"http":{"routePrefix":""},"queues":{"batchSize":4,"newBatchThreshold":1,"messageEncoding":"none"}}}"#,
            &[
                (
                    "Get",
                    r#"{"bindings":[{"name":"req","type":"httpTrigger","direction":"in","route":"scans/{id}","methods":["get"]},{"name":"res","type":"http","direction":"out"}]}"#,
                ),
                ("Off", r#"{"disabled":true,"bindings":[]}"#),
            ],
        );
        let app = load_app(&dir).unwrap();
        assert!(app.forwarding);
        assert_eq!(app.route_prefix, "");
        assert_eq!(app.functions.len(), 1);
        assert!(app.functions[0].http_in_out_only);
        assert_eq!(app.queues.batch_size, 4);
        assert_eq!(app.queues.effective_new_batch_threshold(None), 1);
        assert_eq!(app.queues.message_encoding, MessageEncoding::None);

        let mut settings = AppSettings::new(
            [("Q".to_string(), "Work-Items".to_string())],
            BTreeMap::from([
                ("Q".to_string(), "ignored".to_string()),
                ("Other".to_string(), "x".to_string()),
            ]),
        );
        assert_eq!(resolve_queue_name("%Q%", &settings).unwrap(), "work-items");
        assert_eq!(settings.get("other"), Some("x"));
        assert!(resolve_queue_name("%Missing%", &settings).is_err());
        assert_eq!(
            resolve_queue_name("%Q%-poison", &settings).unwrap(),
            "work-items-poison"
        );
        assert_eq!(
            resolve_queue_name("x-%Q%-%Q%", &settings).unwrap(),
            "x-work-items-work-items"
        );
        assert!(resolve_queue_name("%Q%-%Missing%", &settings).is_err());
        assert!(resolve_queue_name("%Q", &settings).is_err());
        settings.set("AzureWebJobsMine", "UseDevelopmentStorage=true");
        assert_eq!(
            settings.connection_string("Mine"),
            Some("UseDevelopmentStorage=true")
        );
    }

    #[test]
    fn argument_expansion() {
        let vars = HashMap::from([("PORT".to_string(), "1234".to_string())]);
        assert_eq!(expand_argument("--port=%PORT%", &vars), "--port=1234");
        assert_eq!(expand_argument("%UNSET%x%PORT%", &vars), "x1234");
        assert_eq!(expand_argument("100%", &vars), "100%");
        assert_eq!(expand_argument("%port%", &vars), "1234");
    }
}
