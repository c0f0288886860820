//! The one reader of JSON request bodies: every HTTP function that takes a body reads it with
//! [`json_object`].
//!
//! Invariants:
//! - A body is JSON only with `Content-Type: application/json` (415 otherwise), at most the
//!   caller's byte limit (413 otherwise), and a JSON object (400 otherwise).
//! - No object, at any nesting level, names a key twice (after unescaping: `"a"` and `"\u0061"`
//!   are one key). serde_json keeps the last of duplicate keys, so `{"driver":"count",
//!   "driver":"delete"}` would run a delete; the duplicate is refused with a 400 naming its path.
//! - The check is one pass over a body already bounded by the byte limit, and serde_json's
//!   recursion limit (128 levels) bounds its depth.
//!
//! Hand-written because serde_json has no duplicate-key option and no maintained crate adds one
//! to it; this is a `DeserializeSeed` that builds the same `Value` serde_json would.

use std::cell::RefCell;
use std::fmt;

use axum::body::{to_bytes, Body};
use axum::http::{header, HeaderMap};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::error::ApiError;

/// Reads `body` as a JSON object of at most `max` bytes (see the module invariants).
pub async fn json_object(headers: &HeaderMap, body: Body, max: usize) -> Result<Value, ApiError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/json")
        });
    if !is_json {
        return Err(ApiError::UnsupportedMediaType);
    }
    let bytes = to_bytes(body, max)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(max))?;
    parse_object(&bytes)
}

/// Parses `bytes` as a JSON object whose objects name each key once.
pub fn parse_object(bytes: &[u8]) -> Result<Value, ApiError> {
    let value = parse_strict(bytes)?;
    if !value.is_object() {
        return Err(ApiError::InvalidJson("expected a JSON object".into()));
    }
    Ok(value)
}

/// Parses `bytes` as JSON, refusing a key given twice in one object with a 400 naming it by its
/// path (`driver`, `options.mode`, `items[2].name`).
pub fn parse_strict(bytes: &[u8]) -> Result<Value, ApiError> {
    let duplicate = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed = Strict {
        path: "",
        duplicate: &duplicate,
    }
    .deserialize(&mut deserializer)
    .and_then(|value| deserializer.end().map(|()| value));
    match (parsed, duplicate.into_inner()) {
        (_, Some(path)) => Err(ApiError::field(
            path,
            "is given more than once in its object; name each key once",
        )),
        (Ok(value), None) => Ok(value),
        (Err(e), None) => Err(ApiError::InvalidJson(e.to_string())),
    }
}

/// One JSON value at `path`; records the path of the first duplicate key in `duplicate`.
#[derive(Clone, Copy)]
struct Strict<'a> {
    path: &'a str,
    duplicate: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON has no NaN or infinity, so every parsed float is a number.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let path = format!("{}[{}]", self.path, items.len());
            let seed = Strict {
                path: &path,
                ..self
            };
            match seq.next_element_seed(seed)? {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = match self.path {
                "" => key.clone(),
                parent => format!("{parent}.{key}"),
            };
            if object.contains_key(&key) {
                *self.duplicate.borrow_mut() = Some(path);
                return Err(de::Error::custom(format!("duplicate key {key:?}")));
            }
            let value = map.next_value_seed(Strict {
                path: &path,
                ..self
            })?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(body: &str) -> Option<String> {
        match parse_strict(body.as_bytes()) {
            Err(ApiError::InvalidField { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn duplicate_keys_are_refused_at_every_level_by_path() {
        assert_eq!(
            field(r#"{"driver":"count","sourceTable":"T","driver":"delete","confirm":"T"}"#)
                .as_deref(),
            Some("driver")
        );
        assert_eq!(
            field(r#"{"driver":"count","\u0064river":"delete"}"#).as_deref(),
            Some("driver")
        );
        assert_eq!(
            field(r#"{"a":{"b":1,"c":{"d":1,"d":2}}}"#).as_deref(),
            Some("a.c.d")
        );
        assert_eq!(
            field(r#"{"a":[1,{"x":1},{"x":1,"x":2}]}"#).as_deref(),
            Some("a[2].x")
        );
        assert_eq!(field(r#"[{"k":1,"k":1}]"#).as_deref(), Some("[0].k"));
    }

    #[test]
    fn strict_parsing_builds_what_serde_json_builds() {
        for body in [
            r#"{"a":1,"b":-2,"c":1.5e3,"d":"\u00e9\"","e":[true,false,null],"f":{"a":{}},"g":18446744073709551615}"#,
            r#"{"A":1,"a":2}"#,
            "[]",
            "  {}  ",
        ] {
            let strict = parse_strict(body.as_bytes()).unwrap();
            let plain: Value = serde_json::from_str(body).unwrap();
            assert_eq!(strict, plain, "{body}");
        }
        for bad in ["{", "{} x", r#"{"a":1,}"#, "", "{\"a\":01}"] {
            assert!(
                matches!(parse_strict(bad.as_bytes()), Err(ApiError::InvalidJson(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_object(b"[1]"),
            Err(ApiError::InvalidJson(_))
        ));
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(matches!(
            parse_strict(deep.as_bytes()),
            Err(ApiError::InvalidJson(_))
        ));
    }
}
