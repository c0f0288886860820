//! Typed property values as the index keys them: by EDM type and exact value, as the Table
//! service compares them (a Double `3.0` is not the Int32 `3`).
//!
//! Invariants this module keeps:
//! 1. **Canonicalisation may merge values, never split them.** Two values the service finds
//!    equal (`eq`) always have the same canonical bytes (a split would be a false negative); two
//!    values it finds different may share them (a merge costs a wasted read, never a wrong
//!    answer, because a lookup asks the service `<property> eq <literal>`). Merged: Double
//!    `-0.0` with `0.0`, every NaN with every NaN, a stored string's lone UTF-16 surrogate with
//!    U+FFFD, and a stored DateTime's digits below 100 ns (the service keeps none).
//! 2. **An [`IndexValue`] keeps the value as given**, canonicalised only in
//!    [`IndexValue::canonical_bytes`], so a lookup renders the caller's own value back
//!    ([`IndexValue::to_literal`]): `-0.0` stays `-0.0` in the query.
//! 3. The canonical bytes (type tag + value bytes) are a file format: docs/index-format.md,
//!    "Values". Never change them; a new form needs a new hash id.

use std::fmt;
use std::hash::{Hash, Hasher};

use base64::Engine as _;
use serde_json::value::RawValue;

use crate::storage::entity::EdmType;
use crate::storage::odata::{self, Literal};
use crate::storage::Properties;

/// A property value of one of the eight EDM types the Table service stores.
#[derive(Debug, Clone)]
pub enum IndexValue {
    String(String),
    Int32(i32),
    Int64(i64),
    /// Any f64, NaN and infinities included (a stored Double may be one; no literal can).
    Double(f64),
    Boolean(bool),
    /// 100 ns ticks since 1970-01-01T00:00:00Z (negative before), UTC: the service's precision.
    DateTime(i64),
    /// The 16 bytes in the order the hyphenated text writes them (RFC 4122 order, not .NET's
    /// mixed-endian `ToByteArray`).
    Guid([u8; 16]),
    Binary(Vec<u8>),
}

/// Why a value cannot be indexed or looked up; the text names the problem, for a 4xx naming
/// the field that carried the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ValueError(pub String);

/// Type tags of the canonical bytes (docs/index-format.md, "Values").
pub(crate) mod tag {
    pub const STRING: u8 = 1;
    pub const INT32: u8 = 2;
    pub const INT64: u8 = 3;
    pub const DOUBLE: u8 = 4;
    pub const BOOLEAN: u8 = 5;
    pub const DATETIME: u8 = 6;
    pub const GUID: u8 = 7;
    pub const BINARY: u8 = 8;
}

/// The one NaN bit pattern every NaN is canonicalised to (the quiet NaN).
const CANONICAL_NAN: u64 = 0x7FF8_0000_0000_0000;
/// Nanoseconds per tick.
const TICK_NANOS: i128 = 100;

impl IndexValue {
    /// The value of property `name` as stored (`properties` as the service's JSON carries it:
    /// see `crate::storage::entity`). `Ok(None)`: the row has no such property, or it is `null`
    /// (such rows are not in the index). An error for a value that is not a valid literal of its
    /// type, or an annotation naming no EDM type.
    pub fn from_property(properties: &Properties, name: &str) -> Result<Option<Self>, ValueError> {
        let Some(raw) = properties.get(name) else {
            return Ok(None);
        };
        if raw.get() == "null" {
            return Ok(None);
        }
        let edm = properties.edm_type(name).unwrap_or(EdmType::Other);
        from_json(raw, edm)
            .map(Some)
            .ok_or_else(|| invalid_property(name, raw, edm))
    }

    /// A filter literal as a caller writes it (`'alice'` with `''` for a quote, `42`, `42L`,
    /// `1.5`, `true`, `datetime'2024-01-01T00:00:00Z'`, `guid'…'`, `X'0a'`/`binary'0a'`),
    /// parsed by the scan filters' own parser (`crate::storage::odata`), so both accept the same
    /// texts. Spaces around it are allowed.
    pub fn from_literal(text: &str) -> Result<Self, ValueError> {
        parse_literal(text).map(Self::from)
    }

    /// The value as a filter literal the service reads back as this exact value (through
    /// `crate::storage::odata`'s canonical rendering). An error for a NaN or infinite Double,
    /// which no literal can write.
    pub fn to_literal(&self) -> Result<String, ValueError> {
        Ok(self.to_odata()?.render())
    }

    /// The value as the filter parser's literal (see [`IndexValue::to_literal`]).
    pub fn to_odata(&self) -> Result<Literal, ValueError> {
        Ok(match self {
            IndexValue::String(s) => Literal::String(s.clone()),
            IndexValue::Int32(n) => Literal::Int32(*n),
            IndexValue::Int64(n) => Literal::Int64(*n),
            IndexValue::Double(x) if x.is_finite() => Literal::Double(*x),
            IndexValue::Double(x) => {
                return Err(ValueError(format!(
                    "the Double {x} has no filter literal (the service's filters write finite numbers only)"
                )))
            }
            IndexValue::Boolean(b) => Literal::Boolean(*b),
            IndexValue::DateTime(ticks) => Literal::DateTime(render_ticks(*ticks)?),
            IndexValue::Guid(bytes) => {
                Literal::Guid(uuid::Uuid::from_bytes(*bytes).hyphenated().to_string())
            }
            IndexValue::Binary(bytes) => Literal::Binary(bytes.clone()),
        })
    }

    /// The EDM type's name (`Edm.String`, …).
    pub fn edm_name(&self) -> &'static str {
        match self {
            IndexValue::String(_) => "Edm.String",
            IndexValue::Int32(_) => "Edm.Int32",
            IndexValue::Int64(_) => "Edm.Int64",
            IndexValue::Double(_) => "Edm.Double",
            IndexValue::Boolean(_) => "Edm.Boolean",
            IndexValue::DateTime(_) => "Edm.DateTime",
            IndexValue::Guid(_) => "Edm.Guid",
            IndexValue::Binary(_) => "Edm.Binary",
        }
    }

    /// The canonical bytes: one type tag byte, then the value (little-endian fixed-size
    /// numbers; UTF-8 for strings; the bytes themselves for binaries). See the module's
    /// invariants and docs/index-format.md.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(17);
        match self {
            IndexValue::String(s) => {
                out.push(tag::STRING);
                out.extend_from_slice(s.as_bytes());
            }
            IndexValue::Int32(n) => {
                out.push(tag::INT32);
                out.extend_from_slice(&n.to_le_bytes());
            }
            IndexValue::Int64(n) => {
                out.push(tag::INT64);
                out.extend_from_slice(&n.to_le_bytes());
            }
            IndexValue::Double(x) => {
                out.push(tag::DOUBLE);
                out.extend_from_slice(&canonical_double_bits(*x).to_le_bytes());
            }
            IndexValue::Boolean(b) => out.extend_from_slice(&[tag::BOOLEAN, u8::from(*b)]),
            IndexValue::DateTime(ticks) => {
                out.push(tag::DATETIME);
                out.extend_from_slice(&ticks.to_le_bytes());
            }
            IndexValue::Guid(bytes) => {
                out.push(tag::GUID);
                out.extend_from_slice(bytes);
            }
            IndexValue::Binary(bytes) => {
                out.push(tag::BINARY);
                out.extend_from_slice(bytes);
            }
        }
        out
    }

    /// The value's 64-bit index hash ([`super::hash::value_hash`] of the canonical bytes).
    pub fn index_hash(&self) -> u64 {
        super::hash::value_hash(&self.canonical_bytes())
    }
}

/// Equal when the canonical bytes are (so `-0.0 == 0.0` and NaN equals NaN here).
impl PartialEq for IndexValue {
    fn eq(&self, other: &Self) -> bool {
        self.canonical_bytes() == other.canonical_bytes()
    }
}

impl Eq for IndexValue {}

impl Hash for IndexValue {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.canonical_bytes().hash(state);
    }
}

impl fmt::Display for IndexValue {
    /// The filter literal, or a description for a value without one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_literal() {
            Ok(text) => f.write_str(&text),
            Err(_) => write!(f, "{} {:?}", self.edm_name(), self),
        }
    }
}

impl From<Literal> for IndexValue {
    fn from(literal: Literal) -> Self {
        match literal {
            Literal::String(s) => IndexValue::String(s),
            Literal::Int32(n) => IndexValue::Int32(n),
            Literal::Int64(n) => IndexValue::Int64(n),
            Literal::Double(x) => IndexValue::Double(x),
            Literal::Boolean(b) => IndexValue::Boolean(b),
            Literal::DateTime(text) => IndexValue::DateTime(
                parse_ticks(&text).expect("the filter parser gives canonical, valid datetimes"),
            ),
            Literal::Guid(text) => IndexValue::Guid(
                *uuid::Uuid::try_parse(&text)
                    .expect("the filter parser gives valid GUIDs")
                    .as_bytes(),
            ),
            Literal::Binary(bytes) => IndexValue::Binary(bytes),
        }
    }
}

/// One filter literal, through the filter parser (as the right side of `V eq …`; anything
/// more than one literal is refused). A literal too long for a filter can only be a string or
/// a binary: [`parse_long_literal`].
fn parse_literal(text: &str) -> Result<Literal, ValueError> {
    const PREFIX: &str = "V eq ";
    let word = text.trim();
    if word.chars().count() + PREFIX.len() > odata::MAX_FILTER_CHARS {
        return parse_long_literal(word);
    }
    if word.starts_with(|c: char| c.is_alphabetic() || c == '_')
        && word.chars().all(|c| c.is_alphanumeric() || c == '_')
        && word != "true"
        && word != "false"
    {
        return Err(ValueError(format!(
            "{text:?} is not a filter literal (a string is quoted: '{word}')"
        )));
    }
    let expr = odata::parse(&format!("{PREFIX}{text}")).map_err(|e| {
        let at = e.position.saturating_sub(PREFIX.len()).max(1);
        ValueError(format!(
            "{text:?} is not a filter literal: at character {at}: {}",
            e.message
        ))
    })?;
    match expr {
        odata::Expr::Compare {
            literal,
            op: odata::Cmp::Eq,
            property,
        } if property == "V" => Ok(literal),
        _ => Err(ValueError(format!(
            "{text:?} is not one filter literal ('text', 42, 42L, 1.5, true, \
             datetime'…', guid'…', X'0a')"
        ))),
    }
}

fn canonical_double_bits(x: f64) -> u64 {
    if x == 0.0 {
        0
    } else if x.is_nan() {
        CANONICAL_NAN
    } else {
        x.to_bits()
    }
}

fn invalid_property(name: &str, raw: &RawValue, edm: EdmType) -> ValueError {
    let shown: String = raw.get().chars().take(64).collect();
    ValueError(format!(
        "property {name} is {shown}, not a value the index can key as {edm:?}"
    ))
}

/// A stored value's JSON text as its type (`None`: not a valid literal of the type).
fn from_json(raw: &RawValue, edm: EdmType) -> Option<IndexValue> {
    let text = raw.get();
    let string = || json_string(text);
    // Numbers may come as JSON numbers or (Int64 always, others sometimes) as strings.
    let number_text = || string().unwrap_or_else(|| text.to_string());
    Some(match edm {
        EdmType::String => IndexValue::String(string()?),
        EdmType::Int32 => IndexValue::Int32(number_text().parse().ok()?),
        EdmType::Int64 => IndexValue::Int64(number_text().parse().ok()?),
        EdmType::Double => IndexValue::Double(parse_double(&number_text())?),
        EdmType::Boolean => IndexValue::Boolean(match text {
            "true" => true,
            "false" => false,
            _ => return None,
        }),
        EdmType::DateTime => IndexValue::DateTime(parse_stored_datetime(&string()?)?),
        EdmType::Guid => {
            let s = string()?;
            let guid = uuid::Uuid::try_parse(&s).ok().filter(|_| s.len() == 36)?;
            IndexValue::Guid(*guid.as_bytes())
        }
        EdmType::Binary => IndexValue::Binary(
            base64::engine::general_purpose::STANDARD
                .decode(string()?)
                .ok()?,
        ),
        EdmType::Other => return None,
    })
}

/// A Double's text as the service writes it: a number, `NaN`, `Infinity`, `-Infinity`.
fn parse_double(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ if text
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            text.parse().ok()
        }
        _ => None,
    }
}

/// A JSON string literal's text; a lone UTF-16 surrogate (which Rust's `String` cannot hold
/// and the service can store) becomes U+FFFD (invariant 1: a merge).
fn json_string(text: &str) -> Option<String> {
    if !text.starts_with('"') {
        return None;
    }
    serde_json::from_str::<String>(text)
        .ok()
        .or_else(|| json_string_lossy(text))
}

/// Decodes a JSON string literal to UTF-16 units, then lossily to UTF-8. Hand-written because
/// serde_json refuses lone surrogates outright.
fn json_string_lossy(text: &str) -> Option<String> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    let mut units: Vec<u16> = Vec::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u16; 2];
            units.extend_from_slice(c.encode_utf16(&mut buf));
            continue;
        }
        let unit = match chars.next()? {
            '"' => b'"'.into(),
            '\\' => b'\\'.into(),
            '/' => b'/'.into(),
            'b' => 0x08,
            'f' => 0x0C,
            'n' => b'\n'.into(),
            'r' => b'\r'.into(),
            't' => b'\t'.into(),
            'u' => {
                let hex: String = chars.by_ref().take(4).collect();
                if hex.len() != 4 {
                    return None;
                }
                u16::from_str_radix(&hex, 16).ok()?
            }
            _ => return None,
        };
        units.push(unit);
    }
    Some(String::from_utf16_lossy(&units))
}

/// A stored DateTime: RFC 3339 with a zone, or without one (read as UTC, as the service does);
/// digits below 100 ns dropped (invariant 1).
fn parse_stored_datetime(text: &str) -> Option<i64> {
    use time::format_description::well_known::Rfc3339;
    let parsed = time::OffsetDateTime::parse(text, &Rfc3339)
        .or_else(|_| time::OffsetDateTime::parse(&format!("{text}Z"), &Rfc3339))
        .ok()?;
    i64::try_from(parsed.unix_timestamp_nanos().div_euclid(TICK_NANOS)).ok()
}

/// A canonical datetime literal's content (checked by the filter parser) as ticks.
fn parse_ticks(text: &str) -> Option<i64> {
    parse_stored_datetime(text)
}

/// Ticks as the filter parser's canonical datetime text (`yyyy-mm-ddThh:mm:ss[.fffffff]Z`),
/// through the parser itself so there is one canonical form.
fn render_ticks(ticks: i64) -> Result<String, ValueError> {
    use time::format_description::well_known::Rfc3339;
    let outside = || {
        ValueError(format!(
            "{ticks} ticks is outside the service's DateTime years 1601 to 9999"
        ))
    };
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ticks) * TICK_NANOS)
        .map_err(|_| outside())?;
    let text = t.format(&Rfc3339).map_err(|_| outside())?;
    match parse_literal(&format!("datetime'{text}'")) {
        Ok(Literal::DateTime(canonical)) => Ok(canonical),
        _ => Err(outside()),
    }
}

/// A string (`'…'`, `''` for a quote) or binary (`X'…'`, `binary'…'`) literal too long for the
/// filter parser, read by the parser's rules: a value the index holds can be as long as the
/// service stores (64 KiB), and a lookup finds it (the rows are read without a filter on it).
fn parse_long_literal(word: &str) -> Result<Literal, ValueError> {
    let quoted = |prefix: &str| {
        word.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('\''))
            .and_then(|rest| rest.strip_suffix('\''))
    };
    if let Some(inner) = quoted("") {
        let mut content = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c == '\'' && chars.next() != Some('\'') {
                return Err(ValueError(
                    "a long string literal has a lone quote inside (a quote is written '')".into(),
                ));
            }
            content.push(c);
        }
        return Ok(Literal::String(content));
    }
    if let Some(hex) = quoted("X").or_else(|| quoted("binary")) {
        let bytes = (hex.len() % 2 == 0 && hex.is_ascii())
            .then(|| {
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
                    .collect::<Option<Vec<u8>>>()
            })
            .flatten();
        return bytes.map(Literal::Binary).ok_or_else(|| {
            ValueError("a long binary literal is not an even number of hex digits".into())
        });
    }
    Err(ValueError(format!(
        "a literal of {} characters can only be a string ('…') or a binary (X'…')",
        word.chars().count()
    )))
}
