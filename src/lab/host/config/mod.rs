//! Reading and validating a function app folder (host.json, `<Function>/function.json`,
//! local.settings.json) the way the Functions host v4 does, with errors that name file and field.
//!
//! One module per file or section it parses: [`host_json`] (with [`handler`] for
//! `customHandler`, [`queues`] for `extensions.queues` and [`logging`] for
//! `logging.logLevel`), [`function_json`], [`settings`]
//! (local.settings.json and `%AppSetting%` resolution); [`names`] holds the naming rules. Each
//! declares the file or section as a serde struct and reads it with `json::read_section`; range
//! checks and time spans are checked by hand afterwards, on the typed fields.
//!
//! Invariants:
//! - every error is a [`ConfigError`] naming the file and the dotted field path in its canonical
//!   spelling (`extensions.queues.batchSize`, `bindings[0].name`), whatever case the file used;
//! - property names are matched case-insensitively and `null` counts as absent, as the host's
//!   configuration binding does;
//! - unknown keys are ignored, except in `extensions.queues` (refused, see [`queues`]);
//! - the app folder is parsed once, into an [`AppConfig`]: it holds at least one function, only
//!   enabled ones (and only those host.json `functions` lists, when it does), with names unique
//!   case-insensitively, in folder-name order.

mod function_json;
mod handler;
mod host_json;
mod json;
mod logging;
mod names;
mod queues;
mod settings;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use self::function_json::{
    parse_function, FunctionConfig, HttpTriggerConfig, OutputBinding, OutputKind,
    QueueTriggerConfig, TimerTriggerConfig, TriggerConfig, DEFAULT_CONNECTION,
};
pub use self::handler::{expand_argument, HandlerConfig, HttpMode};
pub use self::logging::{LogFilter, LogLevel};
pub use self::names::{is_valid_binding_name, is_valid_function_name, validate_queue_name};
pub use self::queues::QueuesOptions;
pub use self::settings::{read_local_settings, resolve_queue_name, resolve_tokens, AppSettings};

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
    /// `customHandler.enableProxyingHttpRequest` / `enableForwardingHttpRequest`: the mode of
    /// HTTP-only functions.
    pub http_mode: HttpMode,
    /// `extensions.http.routePrefix` (default `api`), without surrounding slashes.
    pub route_prefix: String,
    /// `functionTimeout` (Consumption semantics: default 5 min, 1 s ..= 10 min).
    pub function_timeout: Duration,
    pub queues: QueuesOptions,
    /// `logging.logLevel`.
    pub logging: LogFilter,
    pub functions: Vec<FunctionConfig>,
}

/// Loads and validates the app folder.
pub fn load_app(root: &Path) -> Result<AppConfig, ConfigError> {
    let root = std::fs::canonicalize(root)
        .map_err(|e| ConfigError::new(root, "", format!("app folder not found: {e}")))?;
    let host = host_json::parse_host_json(&root, &root.join("host.json"))?;
    let functions = load_functions(&root, host.only.as_deref())?;
    Ok(AppConfig {
        root,
        handler: host.handler,
        http_mode: host.http_mode,
        route_prefix: host.route_prefix,
        function_timeout: host.function_timeout,
        queues: host.queues,
        logging: host.logging,
        functions,
    })
}

/// Every `<Function>/function.json` under `root` (sorted by folder), restricted to `only` when
/// host.json lists functions; disabled functions are left out.
fn load_functions(
    root: &Path,
    only: Option<&[String]>,
) -> Result<Vec<FunctionConfig>, ConfigError> {
    let mut functions: Vec<FunctionConfig> = Vec::new();
    for dir in function_dirs(root)? {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if only.is_some_and(|only| !only.iter().any(|o| o.eq_ignore_ascii_case(&name))) {
            continue;
        }
        if let Some(func) = parse_function(&name, &dir.join("function.json"))? {
            if functions
                .iter()
                .any(|g| g.name.eq_ignore_ascii_case(&func.name))
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
            root,
            "",
            "no functions found (expected <Function>/function.json folders)",
        ));
    }
    Ok(functions)
}

/// The folders of `root` holding a function.json, sorted.
fn function_dirs(root: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let mut entries: Vec<_> = std::fs::read_dir(root)
        .map_err(|e| ConfigError::new(root, "", format!("cannot list: {e}")))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.join("function.json").is_file())
        .collect();
    entries.sort();
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::storage::MessageEncoding;

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
    fn timer_triggers_keep_their_schedule_as_written() {
        let tick = r#"{"bindings":[{"name":"t","type":"timerTrigger","direction":"in","schedule":"%S%","runOnStartup":"true","useMonitor":false}]}"#;
        let app = load_app(&temp_app(HOST, &[("Tick", tick)])).unwrap();
        let TriggerConfig::Timer(t) = &app.functions[0].trigger else {
            panic!()
        };
        assert_eq!((t.name.as_str(), t.schedule.as_str()), ("t", "%S%"));
        assert!(t.run_on_startup && !t.use_monitor);
        assert_eq!(app.functions[0].trigger_route(), "");
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
                    "Tick",
                    r#"{"bindings":[{"name":"t","type":"timerTrigger","direction":"in"}]}"#,
                )],
                "function.json",
                "bindings[0].schedule",
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
    fn mixed_case_keys_and_nulls_as_the_host_binds_them() {
        let dir = temp_app(
            r#"{"VERSION":"2.0","FunctionTimeout":null,"Logging":null,"extensions":{"HTTP":null,"Queues":{"BATCHSIZE":"4","messageencoding":null}},
               "customhandler":{"Description":{"DEFAULTEXECUTABLEPATH":"h","Arguments":null},"PORT":null}}"#,
            &[(
                "Work",
                r#"{"Disabled":null,"BINDINGS":[{"Name":"msg","TYPE":"queueTrigger","Direction":"in","QUEUENAME":"q1q","connection":null}]}"#,
            )],
        );
        let app = load_app(&dir).unwrap();
        assert_eq!(app.function_timeout, Duration::from_secs(300));
        assert_eq!(app.route_prefix, "api");
        assert_eq!(app.queues.batch_size, 4);
        assert_eq!(app.queues.message_encoding, MessageEncoding::Base64);
        let TriggerConfig::Queue(q) = &app.functions[0].trigger else {
            panic!()
        };
        assert_eq!(
            (q.queue_name.as_str(), q.connection.as_str()),
            ("q1q", DEFAULT_CONNECTION)
        );
    }

    #[test]
    fn type_errors_name_the_canonical_path_of_nested_fields() {
        let handler = r#""customHandler":{"description":{"defaultExecutablePath":"h"}}"#;
        let host = format!(
            r#"{{"version":"2.0",{handler},"EXTENSIONS":{{"QUEUES":{{"MAXDEQUEUECOUNT":true}}}}}}"#
        );
        let err = load_app(&temp_app(&host, &[("Work", QUEUE_FN)])).unwrap_err();
        assert_eq!(err.field, "extensions.queues.maxDequeueCount", "{err}");
        assert_eq!(err.message, "must be an integer", "{err}");
        let host = r#"{"version":"2.0","CUSTOMHANDLER":{"DESCRIPTION":{"defaultExecutablePath":"h","ARGUMENTS":["a",{}]}}}"#;
        let err = load_app(&temp_app(host, &[("Work", QUEUE_FN)])).unwrap_err();
        assert_eq!(err.field, "customHandler.description.arguments[1]", "{err}");
        let function = r#"{"Bindings":[{"NAME":"req","type":"httpTrigger","direction":"in","METHODS":["get",7]}]}"#;
        let err = load_app(&temp_app(HOST, &[("Work", function)])).unwrap_err();
        assert_eq!(err.field, "bindings[0].methods[1]", "{err}");
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
        assert_eq!(app.http_mode, HttpMode::Forward);
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
    fn functions_filter_disabled_and_duplicates() {
        let host = r#"{"version":"2.0","functions":["work","Other"],"customHandler":{"description":{"defaultExecutablePath":"h"}}}"#;
        let dir = temp_app(
            host,
            &[
                ("Work", QUEUE_FN),
                ("Skipped", QUEUE_FN),
                ("Other", r#"{"excluded":"true","bindings":[]}"#),
            ],
        );
        let app = load_app(&dir).unwrap();
        let names: Vec<_> = app.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["Work"]);

        let dir = temp_app(HOST, &[("Work", QUEUE_FN), ("work", QUEUE_FN)]);
        let err = load_app(&dir).unwrap_err();
        assert!(err.message.contains("duplicate function name"), "{err}");

        let dir = temp_app(HOST, &[("Off", r#"{"disabled":true}"#)]);
        let err = load_app(&dir).unwrap_err();
        assert!(err.message.contains("no functions found"), "{err}");
        assert_eq!(err.file, std::fs::canonicalize(&dir).unwrap());

        let host = r#"{"version":"2.0","functions":"Work","customHandler":{"description":{"defaultExecutablePath":"h"}}}"#;
        let err = load_app(&temp_app(host, &[("Work", QUEUE_FN)])).unwrap_err();
        assert_eq!(err.field, "functions");
        let err = load_app(&dir.join("missing")).unwrap_err();
        assert!(err.message.contains("app folder not found"), "{err}");
        std::fs::remove_file(dir.join("host.json")).unwrap();
        let err = load_app(&dir).unwrap_err();
        assert!(
            err.file.ends_with("host.json") && err.field.is_empty(),
            "{err}"
        );
    }
}
