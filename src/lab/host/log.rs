//! Host log lines: emitted through `tracing` and, when asked (tests), kept in memory.
//!
//! Two kinds of lines (`docs/custom-handler-protocol.md` §11):
//! - the local host's own diagnostics ([`HostLog::info`] and friends), always shown;
//! - what the real host logs on the handler's behalf ([`HostLog::category`]): an invocation's
//!   `Logs`, the handler's stdout and stderr. They carry the real host's category and level and
//!   are kept only if host.json `logging.logLevel` keeps them, as they would be on their way to
//!   Application Insights.

use std::sync::{Arc, Mutex};

use super::config::{LogFilter, LogLevel};

/// The category of what an invocation's `Logs` say: the function's user category.
pub fn user_category(function: &str) -> String {
    format!("Function.{function}.User")
}

/// The category of the handler's console output (stdout and stderr).
pub const CONSOLE_CATEGORY: &str = "Host.Function.Console";
/// The category of console lines that start with [`TOOLING_PREFIX`].
pub const TOOLING_CATEGORY: &str = "Host.Function.ToolingConsoleLog";
/// Console lines starting with this (any case) go to the worker process's logger instead.
pub const WORKER_PREFIX: &str = "LanguageWorkerConsoleLog";
/// Console lines starting with this (any case) are tooling entries for IDEs.
pub const TOOLING_PREFIX: &str = "azfuncjsonlog:";

/// How the host logs one line of the handler's stdout (`stderr == false`) or stderr:
/// `(level, category, message)`. `worker_id` names the worker process's own logger.
pub fn console_line(stderr: bool, line: &str, worker_id: &str) -> (LogLevel, String, String) {
    let lower = line.to_ascii_lowercase();
    let level = if !stderr {
        LogLevel::Information
    } else if lower.contains("address already in use") || lower.contains("eaddrinuse") {
        return (
            LogLevel::Error,
            worker_category(worker_id),
            "Port is already in use. Process cannot start.".to_string(),
        );
    } else if lower.contains("warn") {
        LogLevel::Warning
    } else {
        // A custom handler's stderr holds errors only (`UseStdErrorStreamForErrorsOnly`).
        LogLevel::Error
    };
    let worker_prefix = WORKER_PREFIX.to_ascii_lowercase();
    if lower.starts_with(&worker_prefix) {
        // The host removes every occurrence of the prefix, in any case.
        let mut message = String::with_capacity(line.len());
        let mut rest = line;
        while let Some(at) = rest.to_ascii_lowercase().find(&worker_prefix) {
            message.push_str(&rest[..at]);
            rest = &rest[at + WORKER_PREFIX.len()..];
        }
        message.push_str(rest);
        (level, worker_category(worker_id), message)
    } else if lower.starts_with(TOOLING_PREFIX) {
        (level, TOOLING_CATEGORY.to_string(), line.to_string())
    } else {
        (level, CONSOLE_CATEGORY.to_string(), line.to_string())
    }
}

fn worker_category(worker_id: &str) -> String {
    format!("Worker.HttpWorkerProcess.{worker_id}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Clone, Default)]
pub struct HostLog {
    captured: Option<Arc<Mutex<Vec<String>>>>,
    /// host.json `logging.logLevel`, applied to [`HostLog::category`] lines.
    filter: Arc<LogFilter>,
}

impl HostLog {
    pub fn new(capture: bool, filter: LogFilter) -> Self {
        HostLog {
            captured: capture.then(Default::default),
            filter: Arc::new(filter),
        }
    }

    pub fn emit(&self, level: Level, text: impl Into<String>) {
        let text = text.into();
        match level {
            Level::Debug => tracing::debug!(target: "tablescan::lab::host", "{text}"),
            Level::Info => tracing::info!(target: "tablescan::lab::host", "{text}"),
            Level::Warn => tracing::warn!(target: "tablescan::lab::host", "{text}"),
            Level::Error => tracing::error!(target: "tablescan::lab::host", "{text}"),
        }
        if let Some(c) = &self.captured {
            if level != Level::Debug {
                let tag = match level {
                    Level::Info => "INFO",
                    Level::Warn => "WARN",
                    _ => "ERROR",
                };
                c.lock().unwrap().push(format!("{tag} {text}"));
            }
        }
    }

    /// A line the real host logs under `category` at `level` on the handler's behalf, kept only
    /// if host.json's `logging.logLevel` keeps it. Shown as `LEVEL {prefix} [{category}] {text}`.
    pub fn category(&self, level: LogLevel, category: &str, prefix: &str, text: &str) {
        if !self.filter.enabled(category, level) {
            return;
        }
        let line = format!("{prefix} [{category}] {text}");
        let tag = match level {
            LogLevel::Trace | LogLevel::Debug => {
                tracing::debug!(target: "tablescan::lab::host", "{line}");
                "DEBUG"
            }
            LogLevel::Information => {
                tracing::info!(target: "tablescan::lab::host", "{line}");
                "INFO"
            }
            LogLevel::Warning => {
                tracing::warn!(target: "tablescan::lab::host", "{line}");
                "WARN"
            }
            LogLevel::Error | LogLevel::Critical | LogLevel::None => {
                tracing::error!(target: "tablescan::lab::host", "{line}");
                "ERROR"
            }
        };
        if let Some(c) = &self.captured {
            c.lock().unwrap().push(format!("{tag} {line}"));
        }
    }

    pub fn info(&self, text: impl Into<String>) {
        self.emit(Level::Info, text)
    }

    pub fn warn(&self, text: impl Into<String>) {
        self.emit(Level::Warn, text)
    }

    pub fn error(&self, text: impl Into<String>) {
        self.emit(Level::Error, text)
    }

    pub fn debug(&self, text: impl Into<String>) {
        self.emit(Level::Debug, text)
    }

    /// Captured lines (empty unless capture was enabled).
    pub fn lines(&self) -> Vec<String> {
        self.captured
            .as_ref()
            .map(|c| c.lock().unwrap().clone())
            .unwrap_or_default()
    }
}

/// Hides secrets in a storage connection string (`AccountKey`, `SharedAccessSignature`) so it
/// can appear in a message. Only the keys that are not secret are kept verbatim.
pub fn redact_connection_string(s: &str) -> String {
    s.split(';')
        .filter(|p| !p.trim().is_empty())
        .map(|part| match part.split_once('=') {
            Some((k, _))
                if ["accountkey", "sharedaccesssignature"]
                    .contains(&k.trim().to_ascii_lowercase().as_str()) =>
            {
                format!("{k}=***")
            }
            Some((k, v)) => format!("{k}={v}"),
            None => "***".to_string(),
        })
        .collect::<Vec<_>>()
        .join(";")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_get_the_hosts_level_and_category() {
        let line = |stderr, text| console_line(stderr, text, "w1");
        let console = CONSOLE_CATEGORY.to_string();
        assert_eq!(
            line(false, "error: all fine"),
            (
                LogLevel::Information,
                console.clone(),
                "error: all fine".into()
            )
        );
        assert_eq!(
            line(true, "something broke"),
            (LogLevel::Error, console.clone(), "something broke".into())
        );
        assert_eq!(line(true, "a WARNing").0, LogLevel::Warning);
        assert_eq!(
            line(true, "listen: EADDRINUSE"),
            (
                LogLevel::Error,
                "Worker.HttpWorkerProcess.w1".into(),
                "Port is already in use. Process cannot start.".into()
            )
        );
        assert_eq!(
            line(
                false,
                "languageworkerconsolelog[x] LanguageWorkerConsoleLog y"
            ),
            (
                LogLevel::Information,
                "Worker.HttpWorkerProcess.w1".into(),
                "[x]  y".into()
            )
        );
        assert_eq!(line(true, "azfuncjsonlog:{}").1, TOOLING_CATEGORY);
        assert_eq!(user_category("TableCopy"), "Function.TableCopy.User");
    }

    #[test]
    fn category_lines_are_filtered_by_host_json() {
        let log = HostLog::new(
            true,
            LogFilter::new([
                ("default", LogLevel::Warning),
                ("Function.A.User", LogLevel::Information),
            ]),
        );
        log.category(LogLevel::Information, "Function.A.User", "[i0]", "kept");
        log.category(LogLevel::Information, "Function.B.User", "[i0]", "dropped");
        log.category(LogLevel::Error, CONSOLE_CATEGORY, "[i0]", "an error");
        log.info("own line, never filtered");
        assert_eq!(
            log.lines(),
            [
                "INFO [i0] [Function.A.User] kept",
                "ERROR [i0] [Host.Function.Console] an error",
                "INFO own line, never filtered"
            ]
        );
    }

    #[test]
    fn redacts_keys() {
        let s = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02x==;QueueEndpoint=http://127.0.0.1:1/x;";
        let r = redact_connection_string(s);
        assert!(!r.contains("Eby8"), "{r}");
        assert!(
            r.contains("AccountKey=***") && r.contains("AccountName=devstoreaccount1"),
            "{r}"
        );
        assert_eq!(
            redact_connection_string("SharedAccessSignature=sv=1&sig=abc"),
            "SharedAccessSignature=***"
        );
    }
}
