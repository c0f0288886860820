//! host.json, read once into [`HostJson`]: version, `customHandler`, `functionTimeout`,
//! `extensions`, `logging.logLevel` and the `functions` filter.
//!
//! Invariant: sections are checked in a fixed order (version, customHandler, functionTimeout,
//! extensions, logging, functions), so a file with several problems always reports the same
//! first one.

use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};

use super::handler::{parse_custom_handler, HandlerConfig, HttpMode};
use super::json::{get_ci, get_obj, get_str, get_str_array, read_json_object};
use super::logging::{parse_logging, LogFilter};
use super::queues::{parse_queues, QueuesOptions};
use super::ConfigError;
use crate::lab::host::timespan::parse_timespan;

/// What host.json says, validated.
#[derive(Debug, Clone)]
pub(super) struct HostJson {
    pub handler: HandlerConfig,
    pub http_mode: HttpMode,
    pub route_prefix: String,
    pub function_timeout: Duration,
    pub queues: QueuesOptions,
    pub logging: LogFilter,
    /// host.json `functions`: the only functions to load (`None` = all).
    pub only: Option<Vec<String>>,
}

/// Reads the app's host.json at `f`; `root` is the (canonical) app folder.
pub(super) fn parse_host_json(root: &Path, f: &Path) -> Result<HostJson, ConfigError> {
    if !f.is_file() {
        return Err(ConfigError::new(
            f,
            "",
            "missing: the app folder must contain host.json",
        ));
    }
    let host = read_json_object(f)?;
    check_version(&host, f)?;
    let (handler, http_mode) = parse_custom_handler(&host, root, f)?;
    let function_timeout = parse_function_timeout(&host, f)?;
    let (route_prefix, queues) = parse_extensions(&host, f)?;
    let logging = parse_logging(&host, f)?;
    let only = get_str_array(
        &host,
        "functions",
        f,
        "functions",
        "must be an array of function names",
    )?;
    Ok(HostJson {
        handler,
        http_mode,
        route_prefix,
        function_timeout,
        queues,
        logging,
        only,
    })
}

/// `version` must be `"2.0"`.
fn check_version(host: &Map<String, Value>, f: &Path) -> Result<(), ConfigError> {
    match get_ci(host, "version") {
        Some(Value::String(v)) if v == "2.0" => Ok(()),
        Some(v) => Err(ConfigError::new(
            f,
            "version",
            format!("{v} is an invalid value; it must be \"2.0\""),
        )),
        None => Err(ConfigError::new(
            f,
            "version",
            "the required property is missing (use \"2.0\")",
        )),
    }
}

/// `functionTimeout` with Consumption semantics: default 5 min, 1 s ..= 10 min, no `-1`.
fn parse_function_timeout(host: &Map<String, Value>, f: &Path) -> Result<Duration, ConfigError> {
    match get_ci(host, "functionTimeout") {
        None | Some(Value::Null) => Ok(Duration::from_secs(300)),
        Some(Value::String(s)) if s.trim() == "-1" => Err(ConfigError::new(
            f,
            "functionTimeout",
            "-1 (unbounded) is not allowed on the Consumption plan this host imitates; use at most 00:10:00",
        )),
        Some(Value::String(s)) => {
            let d = parse_timespan(s).map_err(|e| ConfigError::new(f, "functionTimeout", e))?;
            if d < Duration::from_secs(1) || d > Duration::from_secs(600) {
                return Err(ConfigError::new(
                    f,
                    "functionTimeout",
                    format!("{s} is outside the Consumption plan range 00:00:01 to 00:10:00"),
                ));
            }
            Ok(d)
        }
        Some(_) => Err(ConfigError::new(
            f,
            "functionTimeout",
            "must be a time span string like \"00:05:00\"",
        )),
    }
}

/// `extensions.http.routePrefix` (default `api`, surrounding slashes removed) and
/// `extensions.queues`.
fn parse_extensions(
    host: &Map<String, Value>,
    f: &Path,
) -> Result<(String, QueuesOptions), ConfigError> {
    let mut route_prefix = "api".to_string();
    let mut queues = QueuesOptions::default();
    if let Some(ext) = get_obj(host, "extensions", f, "extensions")? {
        if let Some(http) = get_obj(ext, "http", f, "extensions.http")? {
            if let Some(p) = get_str(http, "routePrefix", f, "extensions.http.routePrefix")? {
                route_prefix = p.trim_matches('/').to_string();
            }
        }
        if let Some(q) = get_obj(ext, "queues", f, "extensions.queues")? {
            queues = parse_queues(q, f)?;
        }
    }
    Ok((route_prefix, queues))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn function_timeout_follows_the_consumption_plan() {
        let f = Path::new("host.json");
        let t =
            |v: Value| parse_function_timeout(&host(serde_json::json!({"functionTimeout": v})), f);
        assert_eq!(t(Value::Null).unwrap(), Duration::from_secs(300));
        assert_eq!(t("00:10:00".into()).unwrap(), Duration::from_secs(600));
        assert_eq!(t("00:00:01".into()).unwrap(), Duration::from_secs(1));
        for bad in ["-1", " -1 ", "00:10:01", "00:00:00.5", "soon"] {
            assert_eq!(t(bad.into()).unwrap_err().field, "functionTimeout", "{bad}");
        }
        assert!(t(300.into())
            .unwrap_err()
            .message
            .contains("time span string"));
    }

    #[test]
    fn extensions_and_version() {
        let f = Path::new("host.json");
        let (prefix, queues) = parse_extensions(
            &host(serde_json::json!({"Extensions": {"HTTP": {"routePrefix": "/v1/"}}})),
            f,
        )
        .unwrap();
        assert_eq!((prefix.as_str(), queues), ("v1", QueuesOptions::default()));
        let (prefix, _) = parse_extensions(&host(serde_json::json!({})), f).unwrap();
        assert_eq!(prefix, "api");
        let e = parse_extensions(&host(serde_json::json!({"extensions": []})), f).unwrap_err();
        assert_eq!(e.field, "extensions");
        assert!(check_version(&host(serde_json::json!({"version": "2.0"})), f).is_ok());
        let e = check_version(&host(serde_json::json!({"version": 2})), f).unwrap_err();
        assert_eq!(e.field, "version");
    }
}
