//! host.json, read once into [`HostJson`]: version, `customHandler`, `functionTimeout`,
//! `extensions`, `logging.logLevel` and the `functions` filter.
//!
//! Invariant: a file with several problems always reports the same first one. The top level's
//! JSON types come first (`functionTimeout` and `functions`, the only typed keys there), then the
//! sections in a fixed order (version, customHandler, functionTimeout, extensions, logging), each
//! section's own types before its values.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::handler::{parse_custom_handler, HandlerConfig, HttpMode};
use super::json::{read_file, read_section, TimeSpanText, Unknown};
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

/// host.json as written; nested sections are read by their own modules, other keys ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct HostFile {
    pub version: Option<Value>,
    pub custom_handler: Option<Value>,
    pub http_worker: Option<Value>,
    pub function_timeout: Option<TimeSpanText>,
    pub extensions: Option<Value>,
    pub logging: Option<Value>,
    pub functions: Option<Vec<String>>,
}

/// host.json `extensions`: only `http.routePrefix` and `queues` are used.
#[derive(Deserialize)]
struct ExtensionsJson {
    http: Option<Value>,
    queues: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HttpJson {
    route_prefix: Option<String>,
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
    let host: HostFile = read_file(f, Unknown::Ignore)?;
    check_version(host.version, f)?;
    let (handler, http_mode) =
        parse_custom_handler(host.custom_handler, host.http_worker, root, f)?;
    let function_timeout = parse_function_timeout(host.function_timeout, f)?;
    let (route_prefix, queues) = parse_extensions(host.extensions, f)?;
    let logging = parse_logging(host.logging, f)?;
    Ok(HostJson {
        handler,
        http_mode,
        route_prefix,
        function_timeout,
        queues,
        logging,
        only: host.functions,
    })
}

/// `version` must be `"2.0"`.
fn check_version(version: Option<Value>, f: &Path) -> Result<(), ConfigError> {
    match version {
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
fn parse_function_timeout(
    timeout: Option<TimeSpanText>,
    f: &Path,
) -> Result<Duration, ConfigError> {
    let Some(TimeSpanText(s)) = timeout else {
        return Ok(Duration::from_secs(300));
    };
    if s.trim() == "-1" {
        return Err(ConfigError::new(
            f,
            "functionTimeout",
            "-1 (unbounded) is not allowed on the Consumption plan this host imitates; use at most 00:10:00",
        ));
    }
    let d = parse_timespan(&s).map_err(|e| ConfigError::new(f, "functionTimeout", e))?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(600) {
        return Err(ConfigError::new(
            f,
            "functionTimeout",
            format!("{s} is outside the Consumption plan range 00:00:01 to 00:10:00"),
        ));
    }
    Ok(d)
}

/// `extensions.http.routePrefix` (default `api`, surrounding slashes removed) and
/// `extensions.queues`.
fn parse_extensions(
    extensions: Option<Value>,
    f: &Path,
) -> Result<(String, QueuesOptions), ConfigError> {
    let mut route_prefix = "api".to_string();
    let mut queues = QueuesOptions::default();
    if let Some(ext) = extensions {
        let ext: ExtensionsJson = read_section(ext, f, "extensions", Unknown::Ignore)?;
        if let Some(http) = ext.http {
            let http: HttpJson = read_section(http, f, "extensions.http", Unknown::Ignore)?;
            if let Some(p) = http.route_prefix {
                route_prefix = p.trim_matches('/').to_string();
            }
        }
        if let Some(q) = ext.queues {
            queues = parse_queues(q, f)?;
        }
    }
    Ok((route_prefix, queues))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(v: Value) -> Result<HostFile, ConfigError> {
        read_section(v, Path::new("host.json"), "", Unknown::Ignore)
    }

    #[test]
    fn function_timeout_follows_the_consumption_plan() {
        let f = Path::new("host.json");
        let t = |v: Value| {
            parse_function_timeout(
                host(serde_json::json!({"functionTimeout": v}))?.function_timeout,
                f,
            )
        };
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
        let ext = |v: Value| parse_extensions(host(v)?.extensions, f);
        let (prefix, queues) =
            ext(serde_json::json!({"Extensions": {"HTTP": {"routePrefix": "/v1/"}}})).unwrap();
        assert_eq!((prefix.as_str(), queues), ("v1", QueuesOptions::default()));
        let (prefix, _) = ext(serde_json::json!({})).unwrap();
        assert_eq!(prefix, "api");
        let e = ext(serde_json::json!({"extensions": []})).unwrap_err();
        assert_eq!(e.field, "extensions");
        let version = |v: Value| check_version(host(v)?.version, f);
        assert!(version(serde_json::json!({"version": "2.0"})).is_ok());
        let e = version(serde_json::json!({"version": 2})).unwrap_err();
        assert_eq!(e.field, "version");
    }
}
