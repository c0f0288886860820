//! What the Table service accepts on a write, checked before anything is sent: keys, property
//! names, and every value a valid literal of its type (an import refuses a row before writing
//! any). The sizes the service counts are [`Entity::check_limits`] in `entity.rs`.

use serde_json::value::RawValue;

use super::entity::{is_fractional_number, EdmType, Entity};
use super::StorageError;

impl Entity {
    /// Everything the service checks on a write that can be checked before sending it, so an
    /// import refuses a row before writing any: both keys (at most [`MAX_KEY_UTF16`] UTF-16
    /// units, none of `/`, `\\`, `#`, `?` nor a control character), every property name (1 to
    /// [`MAX_PROPERTY_NAME_CHARS`] characters, no control character; `@` only in a type
    /// annotation of a property present), every value a valid literal of its type
    /// ([`check_literal`]), and [`Entity::check_limits`].
    pub fn check_writable(&self) -> Result<(), StorageError> {
        let row = || format!("row ({:?}, {:?})", self.partition_key, self.row_key);
        let refuse = |m: String| Err(StorageError::invalid_input(format!("{}: {m}", row())));
        for (what, key) in [
            ("PartitionKey", &self.partition_key),
            ("RowKey", &self.row_key),
        ] {
            if let Err(m) = check_key(key) {
                return refuse(format!("its {what} {m}"));
            }
        }
        for (name, raw) in self.properties.iter() {
            if let Some(subject) = name.strip_suffix(TYPE_ANNOTATION) {
                if !self.properties.contains_key(subject) {
                    return refuse(format!("{name} annotates no property"));
                }
                continue;
            }
            if name.contains('@') {
                return refuse(format!(
                    "{name:?} is not a property name nor a type annotation"
                ));
            }
            if let Err(m) = check_property_name(name) {
                return refuse(format!("property name {name:?} {m}"));
            }
            let annotation = self.properties.get(&format!("{name}{TYPE_ANNOTATION}"));
            if let Err(m) = check_literal(raw, annotation) {
                return refuse(format!("property {name} {m}"));
            }
        }
        self.check_limits()
    }
}

/// Longest PartitionKey or RowKey, in UTF-16 code units (the service's 1 KiB).
pub const MAX_KEY_UTF16: usize = 512;
/// Longest property name, in characters.
pub const MAX_PROPERTY_NAME_CHARS: usize = 255;
/// How a property's type annotation is named: `<name>@odata.type`.
const TYPE_ANNOTATION: &str = "@odata.type";

/// A key the service accepts: see [`Entity::check_writable`].
fn check_key(key: &str) -> Result<(), String> {
    let units = key.encode_utf16().count();
    if units > MAX_KEY_UTF16 {
        return Err(format!(
            "is {units} UTF-16 units, over the {MAX_KEY_UTF16} (1 KiB) the service allows"
        ));
    }
    match key
        .chars()
        .find(|&c| matches!(c, '/' | '\\' | '#' | '?') || c.is_control())
    {
        Some(c) => Err(format!("holds {c:?}, which the service refuses in keys")),
        None => Ok(()),
    }
}

/// A property name the service accepts: see [`Entity::check_writable`].
fn check_property_name(name: &str) -> Result<(), String> {
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_PROPERTY_NAME_CHARS {
        return Err(format!(
            "is {chars} characters, not 1 to {MAX_PROPERTY_NAME_CHARS}"
        ));
    }
    match name.chars().find(|c| c.is_control()) {
        Some(c) => Err(format!("holds the control character {c:?}")),
        None => Ok(()),
    }
}

/// Checks that `raw` (a value's JSON text) is a valid literal of the type `annotation` names
/// (`None`: the type the service infers from the token). `null` is valid for every type. The
/// forms are the service's JSON: Int64 as a string of a 64-bit integer (a number is accepted
/// too), Int32 a number in range, Double a number or `"NaN"`, `"Infinity"`, `"-Infinity"`,
/// DateTime an RFC 3339 string (or one without an offset, read as UTC), Guid the hyphenated
/// 36-character form, Binary standard padded base64, Boolean `true` or `false`.
pub fn check_literal(raw: &RawValue, annotation: Option<&RawValue>) -> Result<(), String> {
    let text = raw.get();
    if text == "null" {
        return Ok(());
    }
    let edm = EdmType::of(raw, annotation);
    let invalid = || {
        let shown: String = text.chars().take(64).collect();
        Err(format!("is {shown}, not a valid {} value", edm.name()))
    };
    let string = || serde_json::from_str::<String>(text).ok();
    let integer = |text: &str| !text.is_empty() && !is_fractional_number(text);
    let valid = match edm {
        EdmType::Other if annotation.is_some() => {
            return Err(format!(
                "has the type annotation {}, not an Edm type the service knows",
                annotation.map_or("", |a| a.get())
            ))
        }
        EdmType::Other => return Err(format!("is {}, which no Edm type holds", token_kind(text))),
        EdmType::String => text.starts_with('"'),
        EdmType::Boolean => text == "true" || text == "false",
        EdmType::Int32 => integer(text) && text.parse::<i32>().is_ok(),
        EdmType::Int64 => match string() {
            Some(s) => integer(&s) && s.parse::<i64>().is_ok(),
            None => integer(text) && text.parse::<i64>().is_ok(),
        },
        EdmType::Double => match string() {
            Some(s) => matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity"),
            None => text.parse::<f64>().is_ok(),
        },
        EdmType::DateTime => string().is_some_and(|s| is_date_time(&s)),
        EdmType::Guid => {
            string().is_some_and(|s| s.len() == 36 && uuid::Uuid::try_parse(&s).is_ok())
        }
        EdmType::Binary => string().is_some_and(|s| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.decode(s).is_ok()
        }),
    };
    if valid {
        Ok(())
    } else {
        invalid()
    }
}

/// An RFC 3339 date and time, or one without an offset (read as UTC).
fn is_date_time(s: &str) -> bool {
    use time::format_description::well_known::Rfc3339;
    let parses = |s: &str| time::OffsetDateTime::parse(s, &Rfc3339).is_ok();
    parses(s) || (s.len() >= 19 && s.as_bytes()[10] == b'T' && parses(&format!("{s}Z")))
}

/// What kind of JSON token `text` starts.
fn token_kind(text: &str) -> &'static str {
    match text.as_bytes().first() {
        Some(b'[') => "a JSON array",
        Some(b'{') => "a JSON object",
        _ => "not a JSON value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literals_are_checked_against_their_types() {
        let raw = |t: &str| RawValue::from_string(t.to_string()).unwrap();
        let check = |value: &str, edm: Option<&str>| {
            let annotation = edm.map(|e| raw(&format!("\"{e}\"")));
            check_literal(&raw(value), annotation.as_deref())
        };
        for (value, edm) in [
            (r#""9223372036854775807""#, Some("Edm.Int64")),
            (r#""-5""#, Some("Edm.Int64")),
            ("2147483647", Some("Edm.Int32")),
            ("7", None),
            ("1.5", None),
            (r#""NaN""#, Some("Edm.Double")),
            (r#""-Infinity""#, Some("Edm.Double")),
            ("1e300", Some("Edm.Double")),
            (r#""2020-01-01T00:00:00.1234567Z""#, Some("Edm.DateTime")),
            (r#""2020-01-01T00:00:00""#, Some("Edm.DateTime")),
            (
                r#""c56a4180-65aa-42ec-a945-5fd21dec0538""#,
                Some("Edm.Guid"),
            ),
            (r#""AAEC""#, Some("Edm.Binary")),
            ("true", Some("Edm.Boolean")),
            (r#""x\ud800""#, None),
            ("null", Some("Edm.Int64")),
        ] {
            assert_eq!(check(value, edm), Ok(()), "{value} {edm:?}");
        }
        for (value, edm, says) in [
            (r#""abc""#, Some("Edm.Int64"), "not a valid Edm.Int64"),
            (r#""9223372036854775808""#, Some("Edm.Int64"), "Edm.Int64"),
            ("2147483648", None, "not a valid Edm.Int32"),
            (r#""nan""#, Some("Edm.Double"), "Edm.Double"),
            (r#""yesterday""#, Some("Edm.DateTime"), "Edm.DateTime"),
            (r#""nope""#, Some("Edm.Guid"), "Edm.Guid"),
            (
                r#""c56a418065aa42eca9455fd21dec0538""#,
                Some("Edm.Guid"),
                "Edm.Guid",
            ),
            (r#""A""#, Some("Edm.Binary"), "Edm.Binary"),
            ("1", Some("Edm.Boolean"), "Edm.Boolean"),
            ("1", Some("Edm.Decimal"), "not an Edm type"),
            ("[1]", None, "a JSON array"),
        ] {
            let e = check(value, edm).unwrap_err();
            assert!(e.contains(says), "{value} {edm:?}: {e}");
        }
    }

    #[test]
    fn writable_rows_have_service_keys_and_names() {
        let mut e = Entity::new("p", "r");
        e.properties.insert("V", json!(1));
        e.check_writable().unwrap();
        for (pk, says) in [
            ("a/b", "'/'"),
            ("a\u{1}", "'\\u{1}'"),
            (&"k".repeat(513)[..], "513"),
        ] {
            let err = Entity::new(pk, "r")
                .check_writable()
                .unwrap_err()
                .to_string();
            assert!(err.contains("PartitionKey") && err.contains(says), "{err}");
        }
        e.properties.insert("W@odata.type", json!("Edm.Int64"));
        assert!(e
            .check_writable()
            .unwrap_err()
            .to_string()
            .contains("annotates no property"));
        let mut names = Entity::new("p", "r");
        names.properties.insert("x".repeat(256), json!(1));
        assert!(names
            .check_writable()
            .unwrap_err()
            .to_string()
            .contains("256 characters"));
    }
}
