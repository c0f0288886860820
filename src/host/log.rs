//! Host log lines: emitted through `tracing` and, when asked (tests), kept in memory.

use std::sync::{Arc, Mutex};

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
}

impl HostLog {
    pub fn new(capture: bool) -> Self {
        HostLog {
            captured: capture.then(Default::default),
        }
    }

    pub fn emit(&self, level: Level, text: impl Into<String>) {
        let text = text.into();
        match level {
            Level::Debug => tracing::debug!(target: "tablescan::host", "{text}"),
            Level::Info => tracing::info!(target: "tablescan::host", "{text}"),
            Level::Warn => tracing::warn!(target: "tablescan::host", "{text}"),
            Level::Error => tracing::error!(target: "tablescan::host", "{text}"),
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
