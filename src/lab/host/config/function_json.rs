//! `<Function>/function.json`: one function's trigger and output bindings.
//!
//! Invariants of a parsed [`FunctionConfig`]: exactly one trigger, with direction `in`; outputs
//! have direction `out`; binding names are valid and unique case-insensitively; an `http` output
//! only appears with an `httpTrigger`; only the binding types this host implements (httpTrigger,
//! http, queueTrigger, queue, timerTrigger) are accepted. Queue names and timer schedules stay as
//! written (`%AppSetting%` tokens are resolved at start, against the app settings).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::json::{join, read_file, read_section, read_value, Flag, Unknown};
use super::names::{is_valid_binding_name, is_valid_function_name};
use super::ConfigError;
use crate::lab::host::route::RouteTemplate;

/// Storage connection app setting used when a binding names none.
pub const DEFAULT_CONNECTION: &str = "AzureWebJobsStorage";

const HTTP_METHODS: [&str; 8] = [
    "get", "post", "delete", "head", "patch", "put", "options", "trace",
];

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

impl FunctionConfig {
    /// The HTTP route template without prefix (the function name when none is set); empty for
    /// queue-triggered functions.
    pub(crate) fn trigger_route(&self) -> String {
        match &self.trigger {
            TriggerConfig::Http(h) => h.route.clone().unwrap_or_else(|| self.name.clone()),
            TriggerConfig::Queue(_) | TriggerConfig::Timer(_) => String::new(),
        }
    }
}

#[derive(Debug, Clone)]
pub enum TriggerConfig {
    Http(HttpTriggerConfig),
    Queue(QueueTriggerConfig),
    Timer(TimerTriggerConfig),
}

/// A `timerTrigger` binding (the timer extension's `TimerTriggerAttribute`).
#[derive(Debug, Clone)]
pub struct TimerTriggerConfig {
    pub name: String,
    /// As written; may be `%AppSetting%`. Resolved and parsed at start (`lab::host::timer`).
    pub schedule: String,
    pub run_on_startup: bool,
    pub use_monitor: bool,
}

/// A `timerTrigger` binding's own fields.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TimerJson {
    schedule: Option<String>,
    run_on_startup: Option<Flag>,
    use_monitor: Option<Flag>,
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
    /// As written; may be `%AppSetting%`. Resolved by [`super::resolve_queue_name`].
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

/// function.json as written; other keys (`scriptFile`, `entryPoint`, ...) are ignored.
#[derive(Deserialize)]
struct FunctionJson {
    disabled: Option<Flag>,
    excluded: Option<Flag>,
    retry: Option<Value>,
    /// Typed once the function is known to be enabled.
    bindings: Option<Value>,
}

/// What every binding has; the fields of its type are read by [`Binding::fields`].
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BindingJson {
    name: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    direction: Option<String>,
    data_type: Option<String>,
}

/// A `queueTrigger` or `queue` binding's own fields.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct QueueJson {
    queue_name: Option<String>,
    connection: Option<String>,
}

/// An `httpTrigger` binding's own fields.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HttpTriggerJson {
    route: Option<String>,
    methods: Option<Vec<String>>,
    auth_level: Option<String>,
}

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
    let root: FunctionJson = read_file(file, Unknown::Ignore)?;
    if root.disabled == Some(Flag(true)) || root.excluded == Some(Flag(true)) {
        return Ok(None);
    }
    if root.retry.is_some() {
        return Err(ConfigError::new(
            file,
            "retry",
            "retry policies are not implemented by this host",
        ));
    }
    let bindings = root
        .bindings
        .ok_or_else(|| ConfigError::new(file, "bindings", "missing"))?;
    let bindings: Vec<Value> = read_value(bindings, file, "bindings")?;
    let mut set = BindingSet::default();
    for (index, value) in bindings.into_iter().enumerate() {
        set.add(&Binding::read(value, file, index)?)?;
    }
    set.finish(name, file).map(Some)
}

/// One entry of `bindings`; errors name its field as `bindings[i].key`.
struct Binding<'a> {
    common: BindingJson,
    /// The whole entry, for the fields of its type.
    value: Value,
    file: &'a Path,
    path: String,
}

impl<'a> Binding<'a> {
    fn read(value: Value, file: &'a Path, index: usize) -> Result<Self, ConfigError> {
        let path = format!("bindings[{index}]");
        Ok(Binding {
            common: read_section(value.clone(), file, &path, Unknown::Ignore)?,
            value,
            file,
            path,
        })
    }

    /// The fields of this binding's type.
    fn fields<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        read_section(self.value.clone(), self.file, &self.path, Unknown::Ignore)
    }

    fn error(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.file, join(&self.path, key), message)
    }

    fn required<'v>(&self, value: &'v Option<String>, key: &str) -> Result<&'v str, ConfigError> {
        value.as_deref().ok_or_else(|| self.error(key, "missing"))
    }

    /// `dataType`: `binary` or `string` (the default).
    fn binary(&self) -> Result<bool, ConfigError> {
        match self.common.data_type.as_deref() {
            None => Ok(false),
            Some(d) if d.eq_ignore_ascii_case("binary") => Ok(true),
            Some(d) if d.eq_ignore_ascii_case("string") => Ok(false),
            Some(d) => Err(self.error(
                "dataType",
                format!("{d:?} is not supported (string or binary)"),
            )),
        }
    }

    /// A non-empty `queueName` as written, and `connection` (default [`DEFAULT_CONNECTION`]).
    fn queue(&self) -> Result<(String, String), ConfigError> {
        let q: QueueJson = self.fields()?;
        let queue_name = q
            .queue_name
            .filter(|q| !q.is_empty())
            .ok_or_else(|| self.error("queueName", "missing"))?;
        let connection = q
            .connection
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| DEFAULT_CONNECTION.to_string());
        Ok((queue_name, connection))
    }

    fn require_out(&self, direction: &str, message: &str) -> Result<(), ConfigError> {
        if direction == "out" {
            Ok(())
        } else {
            Err(self.error("direction", message))
        }
    }
}

/// The bindings read so far, with the counts the function-level checks need.
#[derive(Default)]
struct BindingSet {
    trigger: Option<TriggerConfig>,
    outputs: Vec<OutputBinding>,
    names: Vec<String>,
    ins: usize,
    outs: usize,
    http_in: usize,
    http_out: usize,
}

impl BindingSet {
    fn add(&mut self, b: &Binding<'_>) -> Result<(), ConfigError> {
        let name = self.claim_name(b)?;
        let btype = b.required(&b.common.kind, "type")?;
        let direction = b
            .required(&b.common.direction, "direction")?
            .to_ascii_lowercase();
        let binary = b.binary()?;
        self.count_direction(b, &direction)?;
        let kind = btype.to_ascii_lowercase();
        if kind.ends_with("trigger") {
            self.check_trigger_slot(b, &direction)?;
        }
        match kind.as_str() {
            "httptrigger" => {
                self.http_in += 1;
                self.trigger = Some(TriggerConfig::Http(parse_http_trigger(b, name)?));
            }
            "queuetrigger" => {
                let (queue_name, connection) = b.queue()?;
                self.trigger = Some(TriggerConfig::Queue(QueueTriggerConfig {
                    name,
                    queue_name,
                    connection,
                    binary,
                }));
            }
            "timertrigger" => {
                let t: TimerJson = b.fields()?;
                self.trigger = Some(TriggerConfig::Timer(TimerTriggerConfig {
                    name,
                    schedule: b
                        .required(&t.schedule.filter(|s| !s.is_empty()), "schedule")?
                        .to_string(),
                    run_on_startup: t.run_on_startup == Some(Flag(true)),
                    use_monitor: t.use_monitor != Some(Flag(false)),
                }));
            }
            "http" => {
                b.require_out(&direction, "an http binding must have direction \"out\"")?;
                self.http_out += 1;
                self.outputs.push(OutputBinding {
                    name,
                    kind: OutputKind::Http,
                    binary,
                });
            }
            "queue" => {
                b.require_out(&direction, "a queue binding must have direction \"out\"")?;
                let (queue_name, connection) = b.queue()?;
                self.outputs.push(OutputBinding {
                    name,
                    kind: OutputKind::Queue {
                        queue_name,
                        connection,
                    },
                    binary,
                });
            }
            _ => {
                return Err(b.error(
                    "type",
                    format!("binding type {btype:?} is not supported by this host (httpTrigger, http, queueTrigger, queue, timerTrigger)"),
                ));
            }
        }
        Ok(())
    }

    /// The binding's `name`: present, valid, and not used by an earlier binding.
    fn claim_name(&mut self, b: &Binding<'_>) -> Result<String, ConfigError> {
        let name = b.required(&b.common.name, "name")?;
        if !is_valid_binding_name(name) {
            return Err(b.error(
                "name",
                format!(
                    "{name:?} is invalid (must match ^([a-zA-Z][a-zA-Z0-9]{{0,127}}|\\$return)$)"
                ),
            ));
        }
        if self.names.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            return Err(b.error("name", format!("multiple bindings named {name:?}")));
        }
        self.names.push(name.to_string());
        Ok(name.to_string())
    }

    fn count_direction(&mut self, b: &Binding<'_>, direction: &str) -> Result<(), ConfigError> {
        match direction {
            "in" => self.ins += 1,
            "out" => self.outs += 1,
            "inout" => {
                return Err(b.error("direction", "inout bindings are not supported by this host"));
            }
            other => return Err(b.error("direction", format!("{other:?}: use in or out"))),
        }
        Ok(())
    }

    /// A trigger binding must be `in`, and the function's only one.
    fn check_trigger_slot(&self, b: &Binding<'_>, direction: &str) -> Result<(), ConfigError> {
        if direction != "in" {
            return Err(b.error("direction", "a trigger binding must have direction \"in\""));
        }
        if self.trigger.is_some() {
            return Err(b.error(
                "type",
                "multiple trigger bindings; a function has exactly one",
            ));
        }
        Ok(())
    }

    fn finish(self, name: &str, file: &Path) -> Result<FunctionConfig, ConfigError> {
        let trigger = self.trigger.ok_or_else(|| {
            ConfigError::new(
                file,
                "bindings",
                "no trigger binding; a function needs exactly one",
            )
        })?;
        if self.http_out > 0 && !matches!(trigger, TriggerConfig::Http(_)) {
            return Err(ConfigError::new(
                file,
                "bindings",
                "an http output binding needs an httpTrigger",
            ));
        }
        Ok(FunctionConfig {
            name: name.to_string(),
            file: file.to_path_buf(),
            http_in_out_only: self.ins == 1
                && self.outs == 1
                && self.http_in == 1
                && self.http_out == 1,
            trigger,
            outputs: self.outputs,
        })
    }
}

/// An `httpTrigger`: route (checked as a template), methods and auth level.
fn parse_http_trigger(b: &Binding<'_>, name: String) -> Result<HttpTriggerConfig, ConfigError> {
    let http: HttpTriggerJson = b.fields()?;
    let route = http.route.map(|r| r.trim_matches('/').to_string());
    if let Some(r) = &route {
        RouteTemplate::parse(r).map_err(|e| b.error("route", e))?;
    }
    let methods = parse_methods(b, http.methods.unwrap_or_default())?;
    let auth_level = http
        .auth_level
        .as_deref()
        .unwrap_or("function")
        .to_ascii_lowercase();
    if !["anonymous", "function", "admin", "system", "user"].contains(&auth_level.as_str()) {
        return Err(b.error(
            "authLevel",
            format!("{auth_level:?}: use anonymous, function or admin"),
        ));
    }
    Ok(HttpTriggerConfig {
        name,
        route,
        methods,
        auth_level,
    })
}

/// `methods`, upper-cased; `None` (every method) when absent or empty.
fn parse_methods(
    b: &Binding<'_>,
    methods: Vec<String>,
) -> Result<Option<Vec<String>>, ConfigError> {
    for (j, m) in methods.iter().enumerate() {
        if !HTTP_METHODS.iter().any(|k| k.eq_ignore_ascii_case(m)) {
            return Err(b.error(
                &format!("methods[{j}]"),
                format!("{m:?} is not an HTTP method ({})", HTTP_METHODS.join(", ")),
            ));
        }
    }
    // An empty list means every method, like no list at all.
    let upper: Vec<String> = methods.iter().map(|m| m.to_ascii_uppercase()).collect();
    Ok((!upper.is_empty()).then_some(upper))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `bindings` as a function.json of function `Work`.
    fn parse(bindings: Value) -> Result<Option<FunctionConfig>, ConfigError> {
        let dir = std::env::temp_dir().join(format!("tablescan-fn-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("function.json");
        std::fs::write(
            &file,
            serde_json::json!({ "bindings": bindings }).to_string(),
        )
        .unwrap();
        let result = parse_function("Work", &file);
        std::fs::remove_dir_all(&dir).unwrap();
        result
    }

    fn field(bindings: Value) -> String {
        parse(bindings).unwrap_err().field
    }

    #[test]
    fn binding_directions_and_trigger_count() {
        use serde_json::json;
        let q = json!({"name": "m", "type": "queueTrigger", "direction": "in", "queueName": "q1q"});
        assert_eq!(
            field(
                json!([{"name": "m", "type": "queueTrigger", "direction": "out", "queueName": "q"}])
            ),
            "bindings[0].direction"
        );
        assert_eq!(
            field(
                json!([q, {"name": "n", "type": "queueTrigger", "direction": "in", "queueName": "q"}])
            ),
            "bindings[1].type"
        );
        assert_eq!(
            field(json!([q, {"name": "o", "type": "queue", "direction": "in", "queueName": "q"}])),
            "bindings[1].direction"
        );
        assert_eq!(
            field(json!([q, {"name": "o", "type": "queue", "direction": "inout"}])),
            "bindings[1].direction"
        );
        assert_eq!(
            field(json!([q, {"name": "M", "type": "queue", "direction": "out", "queueName": "q"}])),
            "bindings[1].name"
        );
        assert_eq!(
            field(
                json!([{"name": "m", "type": "queueTrigger", "direction": "in", "queueName": "q", "dataType": "stream"}])
            ),
            "bindings[0].dataType"
        );
        assert_eq!(field(json!([q, 3])), "bindings[1]");
        assert_eq!(field(json!([])), "bindings");
    }

    #[test]
    fn bindings_are_read_into_typed_configs() {
        use serde_json::json;
        let f = parse(json!([
            {"name": "m", "type": "QueueTrigger", "direction": "In", "queueName": "%Q%", "dataType": "binary"},
            {"name": "out", "type": "queue", "direction": "out", "queueName": "next", "connection": "Other"},
            {"name": "$return", "type": "queue", "direction": "out", "queueName": "ret"}
        ]))
        .unwrap()
        .unwrap();
        let TriggerConfig::Queue(t) = &f.trigger else {
            panic!()
        };
        assert_eq!(
            (
                t.name.as_str(),
                t.queue_name.as_str(),
                t.connection.as_str(),
                t.binary
            ),
            ("m", "%Q%", DEFAULT_CONNECTION, true)
        );
        assert_eq!(f.trigger_route(), "");
        let OutputKind::Queue {
            queue_name,
            connection,
        } = &f.outputs[0].kind
        else {
            panic!()
        };
        assert_eq!(
            (queue_name.as_str(), connection.as_str()),
            ("next", "Other")
        );
        assert_eq!(f.outputs.len(), 2);

        let f = parse(json!([
            {"name": "req", "type": "httpTrigger", "direction": "in", "methods": [], "authLevel": "Anonymous"},
            {"name": "res", "type": "http", "direction": "out"}
        ]))
        .unwrap()
        .unwrap();
        let TriggerConfig::Http(h) = &f.trigger else {
            panic!()
        };
        assert_eq!(
            (h.methods.clone(), h.auth_level.as_str()),
            (None, "anonymous")
        );
        assert_eq!(f.trigger_route(), "Work");
        assert!(f.http_in_out_only);
        assert_eq!(
            field(
                json!([{"name": "req", "type": "httpTrigger", "direction": "in", "authLevel": "root"}])
            ),
            "bindings[0].authLevel"
        );
    }
}
