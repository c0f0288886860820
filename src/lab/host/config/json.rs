//! Typed, case-insensitive reads of JSON configuration objects. Every accessor takes the file and
//! the dotted field path it reads, so every error names both; `null` counts as absent.

use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};

use super::ConfigError;
use crate::lab::host::timespan::parse_timespan;

pub(super) fn read_json_object(file: &Path) -> Result<Map<String, Value>, ConfigError> {
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
pub(super) fn get_ci<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).or_else(|| {
        map.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

/// Whether `key` is present with a non-null value.
pub(super) fn is_set(map: &Map<String, Value>, key: &str) -> bool {
    get_ci(map, key).is_some_and(|v| !v.is_null())
}

pub(super) fn get_obj<'a>(
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

pub(super) fn get_str<'a>(
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

/// An array of strings; `not_array` is the message when the value is not an array. An element
/// that is not a string is reported at `path[i]`.
pub(super) fn get_str_array(
    map: &Map<String, Value>,
    key: &str,
    file: &Path,
    path: &str,
    not_array: &str,
) -> Result<Option<Vec<String>>, ConfigError> {
    match get_ci(map, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    ConfigError::new(file, format!("{path}[{i}]"), "must be a string")
                })
            })
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(ConfigError::new(file, path, not_array)),
    }
}

pub(super) fn get_bool(
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

pub(super) fn get_int(
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

pub(super) fn get_timespan(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_arrays_name_the_bad_element() {
        let f = Path::new("host.json");
        let map =
            serde_json::json!({"Functions": ["a", "b"], "bad": ["a", 1], "obj": {}, "n": null});
        let map = map.as_object().unwrap();
        assert_eq!(
            get_str_array(map, "functions", f, "functions", "not array").unwrap(),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(get_str_array(map, "n", f, "n", "x").unwrap(), None);
        assert_eq!(get_str_array(map, "missing", f, "m", "x").unwrap(), None);
        let e = get_str_array(map, "bad", f, "bad", "x").unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("bad[1]", "must be a string")
        );
        let e = get_str_array(map, "obj", f, "obj", "not array").unwrap_err();
        assert_eq!((e.field.as_str(), e.message.as_str()), ("obj", "not array"));
    }
}
