//! The one reader every configuration file goes through: a JSON object deserialized into a serde
//! struct the way the Functions host binds configuration, with errors naming file and field.
//!
//! Invariants of [`read_section`]: a key matches a field of `T` case-insensitively (the exact
//! spelling wins over another one, else the first in the object) and is renamed to the field's
//! canonical name before serde sees it; `null` counts as absent; fields are deserialized in
//! declaration order, so the first type error of a section is always the same; every error names
//! the canonical dotted path (`extensions.queues.batchSize`, `bindings[0].methods[0]`).

use std::path::Path;

use serde::de::{self, value::MapDeserializer, DeserializeOwned, Deserializer, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::ConfigError;

/// What [`read_section`] does with a key that names no field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unknown {
    Ignore,
    /// An error naming the key as written (`extensions.queues.prefetch`).
    Refuse,
}

/// Reads `file`, which must hold a JSON object, into `T` (see [`read_section`]).
pub(super) fn read_file<T: DeserializeOwned>(
    file: &Path,
    unknown: Unknown,
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| ConfigError::new(file, "", format!("cannot read: {e}")))?;
    // The host tolerates a UTF-8 BOM and comments are not JSON; a BOM is common from Windows editors.
    let text = text.trim_start_matches('\u{feff}');
    match serde_json::from_str::<Value>(text) {
        Ok(value @ Value::Object(_)) => read_section(value, file, "", unknown),
        Ok(_) => Err(ConfigError::new(file, "", "must contain a JSON object")),
        Err(e) => Err(ConfigError::new(file, "", format!("invalid JSON: {e}"))),
    }
}

/// Deserializes the object `value` found at `path` of `file` into the struct `T`, matching keys
/// case-insensitively and dropping nulls. Nested objects are typed `Option<Value>` in `T` and
/// read by another call, with the longer path.
pub(super) fn read_section<T: DeserializeOwned>(
    value: Value,
    file: &Path,
    path: &str,
    unknown: Unknown,
) -> Result<T, ConfigError> {
    let Value::Object(map) = value else {
        return Err(ConfigError::new(file, path, "must be an object"));
    };
    let fields = field_names::<T>();
    let mut found: Vec<(usize, String, Value)> = Vec::with_capacity(fields.len());
    for (key, value) in map {
        let Some(i) = fields.iter().position(|f| f.eq_ignore_ascii_case(&key)) else {
            if unknown == Unknown::Refuse {
                return Err(ConfigError::new(file, join(path, &key), "unknown setting"));
            }
            continue;
        };
        match found.iter_mut().find(|(j, ..)| *j == i) {
            Some(slot) if key == fields[i] => *slot = (i, key, value),
            Some(_) => {}
            None => found.push((i, key, value)),
        }
    }
    found.sort_by_key(|(i, ..)| *i);
    let entries = found
        .into_iter()
        .filter(|(.., value)| !value.is_null())
        .map(|(i, _, value)| (fields[i], value));
    read_value(MapDeserializer::new(entries), file, path)
}

/// Deserializes `de`, a value found at `path` of `file` (as is: no key matching); a type error
/// names `path` and the path inside the value.
pub(super) fn read_value<'de, T, D>(de: D, file: &Path, path: &str) -> Result<T, ConfigError>
where
    T: Deserialize<'de>,
    D: Deserializer<'de, Error = serde_json::Error>,
{
    serde_path_to_error::deserialize(de).map_err(|e| {
        let inner = e.path().to_string();
        let field = if inner == "." {
            path.to_string()
        } else {
            join(path, &inner)
        };
        ConfigError::new(file, field, e.into_inner().to_string())
    })
}

/// `path.key`, or `path[0]` for an index; `key` alone at the top.
pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else if key.starts_with('[') {
        format!("{path}{key}")
    } else {
        format!("{path}.{key}")
    }
}

/// The names serde gives the fields of struct `T`, in declaration order: a deserializer that
/// records what `deserialize_struct` is told. Hand-written because serde-aux's `serde_introspect`
/// (the same 30 lines) would also bring serde-value and ordered-float into the build.
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Recorder<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Recorder<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("fields recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Recorder(&mut fields));
    fields
}

/// A scalar as JSON gave it; [`Flag`], [`Int`] and [`TimeSpanText`] take what they accept and
/// name what they expect otherwise.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Bool(bool),
    Int(i64),
    Str(String),
    Other(de::IgnoredAny),
}

/// A boolean as configuration binding reads one: `true`/`false`, or those words as a string in
/// any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Scalar")]
pub(super) struct Flag(pub bool);

impl TryFrom<Scalar> for Flag {
    type Error = &'static str;
    fn try_from(s: Scalar) -> Result<Self, Self::Error> {
        match s {
            Scalar::Bool(b) => Ok(Flag(b)),
            Scalar::Str(s) if s.eq_ignore_ascii_case("true") => Ok(Flag(true)),
            Scalar::Str(s) if s.eq_ignore_ascii_case("false") => Ok(Flag(false)),
            _ => Err("must be true or false"),
        }
    }
}

/// An integer as configuration binding reads one: a JSON integer, or a string holding one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Scalar")]
pub(super) struct Int(pub i64);

impl TryFrom<Scalar> for Int {
    type Error = &'static str;
    fn try_from(s: Scalar) -> Result<Self, Self::Error> {
        match s {
            Scalar::Int(n) => Ok(Int(n)),
            Scalar::Str(s) => s.trim().parse().map(Int).map_err(|_| "must be an integer"),
            _ => Err("must be an integer"),
        }
    }
}

/// A .NET time span string (`00:05:00`), as written; parsed by the section that reads it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Scalar")]
pub(super) struct TimeSpanText(pub String);

impl TryFrom<Scalar> for TimeSpanText {
    type Error = &'static str;
    fn try_from(s: Scalar) -> Result<Self, Self::Error> {
        match s {
            Scalar::Str(s) => Ok(TimeSpanText(s)),
            _ => Err("must be a time span string like \"00:05:00\""),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Section {
        batch_size: Option<Int>,
        enabled: Option<Flag>,
        names: Option<Vec<String>>,
        nested: Option<Value>,
    }

    fn read(v: Value, unknown: Unknown) -> Result<Section, ConfigError> {
        read_section(v, Path::new("host.json"), "a.b", unknown)
    }

    #[test]
    fn keys_match_case_insensitively_and_the_exact_spelling_wins() {
        let s = read(
            serde_json::json!({"BATCHSIZE": "4", "Enabled": "TRUE", "NaMeS": ["x"], "other": 1}),
            Unknown::Ignore,
        )
        .unwrap();
        assert_eq!(
            (s.batch_size, s.enabled, s.names),
            (Some(Int(4)), Some(Flag(true)), Some(vec!["x".to_string()]))
        );
        let s = read(
            serde_json::json!({"BatchSize": 1, "batchSize": 2, "BATCHSIZE": 3}),
            Unknown::Ignore,
        )
        .unwrap();
        assert_eq!(s.batch_size, Some(Int(2)));
        let e = read(serde_json::json!({"Other": 1}), Unknown::Refuse).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("a.b.Other", "unknown setting")
        );
    }

    #[test]
    fn null_counts_as_absent() {
        let s = read(
            serde_json::json!({"batchSize": null, "ENABLED": null, "names": null, "nested": null}),
            Unknown::Refuse,
        )
        .unwrap();
        assert_eq!(
            s,
            Section {
                batch_size: None,
                enabled: None,
                names: None,
                nested: None
            }
        );
    }

    #[test]
    fn type_errors_name_the_canonical_path() {
        let field = |v: Value| read(v, Unknown::Ignore).unwrap_err().field;
        assert_eq!(
            field(serde_json::json!({"BATCHSIZE": 1.5})),
            "a.b.batchSize"
        );
        assert_eq!(field(serde_json::json!({"enabled": "yes"})), "a.b.enabled");
        assert_eq!(
            field(serde_json::json!({"Names": ["a", 1]})),
            "a.b.names[1]"
        );
        assert_eq!(field(serde_json::json!([])), "a.b");
        let e = read_value::<Vec<String>, _>(
            serde_json::json!(["a", {}]),
            Path::new("f.json"),
            "functions",
        )
        .unwrap_err();
        assert_eq!(e.field, "functions[1]");
        assert!(e.message.contains("expected a string"), "{e}");
    }
}
