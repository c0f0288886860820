//! host.json `customHandler`: how to launch the handler and how HTTP-only functions reach it
//! (forwarded §5.1, proxied §5.2, or wrapped in a payload §3.4).
//!
//! Invariant: only the parts of `customHandler` this host implements are accepted; the legacy
//! `httpWorker` section and a fixed `port` are refused with an error naming them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::json::{join, read_section, Flag, Unknown};
use super::ConfigError;

/// `customHandler.description`.
#[derive(Debug, Clone)]
pub struct HandlerConfig {
    /// Absolute path if the file exists under the app root, else a command looked up on PATH.
    pub executable: PathBuf,
    /// Raw arguments; `%VAR%` is expanded at launch, when the worker variables are known.
    pub arguments: Vec<String>,
    pub working_directory: PathBuf,
}

/// How an HTTP-only function (one `httpTrigger` in, one `http` out) reaches the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpMode {
    /// Wrapped in an invocation payload, like any other function (§3.4).
    #[default]
    Payload,
    /// `enableForwardingHttpRequest`: the request rebuilt and sent to its own path (§5.1).
    Forward,
    /// `enableProxyingHttpRequest`: the request streamed to its own path by a reverse proxy
    /// (§5.2); it wins over forwarding when both are on.
    Proxy,
}

/// host.json `customHandler` as written; what this host does not use is ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CustomHandlerJson {
    description: Option<Value>,
    enable_proxying_http_request: Option<Flag>,
    enable_forwarding_http_request: Option<Flag>,
    port: Option<Value>,
}

/// `customHandler.description` as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescriptionJson {
    default_executable_path: Option<String>,
    arguments: Option<Vec<String>>,
    working_directory: Option<String>,
}

const SECTION: &str = "customHandler";

/// The `customHandler` section of host.json `f` (the legacy `httpWorker` is refused), for the app
/// at `root`: the handler to launch and the mode of HTTP-only functions.
pub(super) fn parse_custom_handler(
    custom_handler: Option<Value>,
    http_worker: Option<Value>,
    root: &Path,
    f: &Path,
) -> Result<(HandlerConfig, HttpMode), ConfigError> {
    let section =
        match (custom_handler, http_worker) {
            (Some(section), _) => section,
            (None, Some(_)) => return Err(ConfigError::new(
                f,
                "httpWorker",
                "the legacy httpWorker section is not supported by this host; use customHandler",
            )),
            (None, None) => {
                return Err(ConfigError::new(
                    f,
                    SECTION,
                    "missing: this host only runs custom handlers",
                ))
            }
        };
    let section: CustomHandlerJson = read_section(section, f, SECTION, Unknown::Ignore)?;
    let handler = parse_description(section.description, root, f)?;
    let mode = if section.enable_proxying_http_request == Some(Flag(true)) {
        HttpMode::Proxy
    } else if section.enable_forwarding_http_request == Some(Flag(true)) {
        HttpMode::Forward
    } else {
        HttpMode::Payload
    };
    if section.port.is_some() {
        return Err(ConfigError::new(
            f,
            join(SECTION, "port"),
            "a fixed handler port is not supported: instances need one port each",
        ));
    }
    Ok((handler, mode))
}

/// `customHandler.description`: executable, arguments and working directory.
fn parse_description(
    description: Option<Value>,
    root: &Path,
    f: &Path,
) -> Result<HandlerConfig, ConfigError> {
    let path = join(SECTION, "description");
    let description = description.ok_or_else(|| ConfigError::new(f, path.as_str(), "missing"))?;
    let description: DescriptionJson = read_section(description, f, &path, Unknown::Ignore)?;
    let exe = description.default_executable_path.unwrap_or_default();
    if exe.trim().is_empty() {
        return Err(ConfigError::new(
            f,
            join(&path, "defaultExecutablePath"),
            "must name the handler executable",
        ));
    }
    let candidate = root.join(&exe);
    // Relative paths that exist under the app root are made absolute; otherwise PATH lookup.
    let executable = if candidate.is_file() {
        candidate
    } else {
        PathBuf::from(exe)
    };
    let working_directory = match description.working_directory.as_deref() {
        None | Some("") => root.to_path_buf(),
        Some(wd) => root.join(wd),
    };
    if !working_directory.is_dir() {
        return Err(ConfigError::new(
            f,
            join(&path, "workingDirectory"),
            format!("{} is not a directory", working_directory.display()),
        ));
    }
    Ok(HandlerConfig {
        executable,
        arguments: description.arguments.unwrap_or_default(),
        working_directory,
    })
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
    use super::super::host_json::HostFile;
    use super::*;

    #[test]
    fn argument_expansion() {
        let vars = HashMap::from([("PORT".to_string(), "1234".to_string())]);
        assert_eq!(expand_argument("--port=%PORT%", &vars), "--port=1234");
        assert_eq!(expand_argument("%UNSET%x%PORT%", &vars), "x1234");
        assert_eq!(expand_argument("100%", &vars), "100%");
        assert_eq!(expand_argument("%port%", &vars), "1234");
    }

    fn parse(host: Value) -> Result<(HandlerConfig, HttpMode), ConfigError> {
        let root = std::env::temp_dir();
        let f = Path::new("host.json");
        let host: HostFile = read_section(host, f, "", Unknown::Ignore)?;
        parse_custom_handler(host.custom_handler, host.http_worker, &root, f)
    }

    #[test]
    fn refuses_what_this_host_does_not_implement() {
        let field = |v| parse(v).unwrap_err().field;
        assert_eq!(field(serde_json::json!({})), "customHandler");
        assert_eq!(
            field(serde_json::json!({"httpWorker": {"description": {}}})),
            "httpWorker"
        );
        let desc = serde_json::json!({"defaultExecutablePath": "h"});
        assert_eq!(
            field(
                serde_json::json!({"customHandler": {"description": desc, "enableProxyingHttpRequest": 1}})
            ),
            "customHandler.enableProxyingHttpRequest"
        );
        assert_eq!(
            field(serde_json::json!({"customHandler": {"description": desc, "port": 8080}})),
            "customHandler.port"
        );
        assert_eq!(
            field(
                serde_json::json!({"customHandler": {"description": {"defaultExecutablePath": "h", "arguments": ["a", 2]}}})
            ),
            "customHandler.description.arguments[1]"
        );
        assert_eq!(
            field(
                serde_json::json!({"customHandler": {"description": {"defaultExecutablePath": "h", "workingDirectory": "no-such-dir-xyz"}}})
            ),
            "customHandler.description.workingDirectory"
        );
        let (handler, mode) = parse(serde_json::json!({"CustomHandler": {"description":
            {"defaultExecutablePath": "h", "arguments": ["--x", "%PORT%"]}, "port": null}}))
        .unwrap();
        assert_eq!(handler.arguments, ["--x", "%PORT%"]);
        assert_eq!(mode, HttpMode::Payload);
    }

    #[test]
    fn proxying_wins_over_forwarding() {
        let mode = |forward: bool, proxy: bool| {
            parse(
                serde_json::json!({"customHandler": {"description": {"defaultExecutablePath": "h"},
                "enableForwardingHttpRequest": forward, "EnableProxyingHttpRequest": proxy}}),
            )
            .unwrap()
            .1
        };
        assert_eq!(mode(false, false), HttpMode::Payload);
        assert_eq!(mode(true, false), HttpMode::Forward);
        assert_eq!(mode(false, true), HttpMode::Proxy);
        assert_eq!(mode(true, true), HttpMode::Proxy);
    }
}
