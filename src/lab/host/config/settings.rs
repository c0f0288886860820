//! App settings: the process environment, local.settings.json `Values`, and `%AppSetting%`
//! tokens in queue names resolved against them.
//!
//! Invariant: a real environment variable wins over local.settings.json (Core Tools v4); keys are
//! looked up exactly first, then case-insensitively (.NET configuration keys are).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::json::{read_file, Unknown};
use super::names::validate_queue_name;
use super::ConfigError;

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

    #[cfg(test)]
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

/// local.settings.json as written; other keys (`Host`, `ConnectionStrings`) are ignored.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct LocalSettingsJson {
    /// Only `true` means encrypted.
    is_encrypted: Option<Value>,
    values: Option<Map<String, Value>>,
}

/// Reads local.settings.json `Values`. `IsEncrypted: true` is refused (we cannot decrypt).
pub fn read_local_settings(file: &Path) -> Result<BTreeMap<String, String>, ConfigError> {
    let root: LocalSettingsJson = read_file(file, Unknown::Ignore)?;
    if root.is_encrypted == Some(Value::Bool(true)) {
        return Err(ConfigError::new(
            file,
            "IsEncrypted",
            "encrypted settings are not supported; run `func settings decrypt` first",
        ));
    }
    let mut out = BTreeMap::new();
    for (k, v) in root.values.unwrap_or_default() {
        match v {
            Value::String(s) => {
                out.insert(k, s);
            }
            // Core Tools accepts scalars and stringifies them.
            Value::Bool(_) | Value::Number(_) => {
                out.insert(k, v.to_string());
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
    Ok(out)
}

/// Resolves every `%AppSetting%` token in a queue name (`%Q%`, `%Q%-poison`, `jobs-%Env%`), as the
/// host's `ResolveWholeString` does, then lower-cases and validates it. A token naming a missing
/// setting, or a `%` without its closing `%`, is an error.
pub fn resolve_queue_name(raw: &str, settings: &AppSettings) -> Result<String, String> {
    let lower = resolve_tokens(raw, "queueName", settings)?.to_ascii_lowercase();
    validate_queue_name(&lower)?;
    Ok(lower)
}

/// Resolves every `%AppSetting%` token in the value of binding field `field`, as the host's
/// `ResolveWholeString` does (a timer's `schedule`, a queue's `queueName`).
pub fn resolve_tokens(raw: &str, field: &str, settings: &AppSettings) -> Result<String, String> {
    let mut resolved = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(start) = rest.find('%') {
        resolved.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after
            .find('%')
            .ok_or_else(|| format!("{field} {raw:?}: a %AppSetting% token is not closed"))?;
        let key = &after[..end];
        let value = settings
            .get(key)
            .ok_or_else(|| format!("app setting {key:?} (named by {field} {raw:?}) is not set"))?;
        resolved.push_str(value);
        rest = &after[end + 1..];
    }
    resolved.push_str(rest);
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
        let file =
            std::env::temp_dir().join(format!("tablescan-settings-{}.json", uuid::Uuid::new_v4()));
        std::fs::write(&file, text).unwrap();
        let result = read_local_settings(&file);
        std::fs::remove_file(&file).unwrap();
        result
    }

    #[test]
    fn local_settings_values() {
        let values = read(
            "\u{feff}{\"isEncrypted\":false,\"values\":{\"A\":\"x\",\"N\":5,\"B\":true,\"Z\":null}}",
        )
        .unwrap();
        assert_eq!(
            values,
            BTreeMap::from([
                ("A".to_string(), "x".to_string()),
                ("B".to_string(), "true".to_string()),
                ("N".to_string(), "5".to_string()),
            ])
        );
        assert!(read("{}").unwrap().is_empty());
        assert_eq!(
            read(r#"{"IsEncrypted":true}"#).unwrap_err().field,
            "IsEncrypted"
        );
        assert_eq!(
            read(r#"{"Values":{"A":[1]}}"#).unwrap_err().field,
            "Values.A"
        );
        assert_eq!(read(r#"{"Values":[]}"#).unwrap_err().field, "Values");
        assert!(read("[]").unwrap_err().message.contains("JSON object"));
    }
}
