//! Table entities as the Table service's JSON carries them.
//!
//! Invariants this module keeps:
//! 1. **A property value is never re-encoded.** Every property's JSON text is kept byte for byte
//!    as the service sent it ([`RawValue`]) and written back unchanged, so a copy cannot alter a
//!    number's last bit, a date's seventh fractional digit, or a string the service accepted that
//!    Rust's `String` cannot hold (a lone UTF-16 surrogate, sent as `"\ud800"`). Only the two
//!    keys are decoded, because they address rows in URLs and filters.
//! 2. **A property's type survives.** The service's JSON annotates some types
//!    (`Name@odata.type`); the annotations are properties here like any other and travel with
//!    their values. The one type the service leaves unannotated in responses although JSON cannot
//!    tell it from Int32 is a whole Double (`3.0`): [`parse_service_entity`] annotates every
//!    fractional or exponent number as `Edm.Double`, which is the only type such a token can be.
//! 3. **A record is sized the way the service counts it** ([`Entity::service_size`]) before it
//!    is sent: UTF-16 for strings and names, decoded bytes for binaries, fixed sizes for the rest.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::{names, StorageError};

/// Most custom properties an entity may have (255 minus PartitionKey, RowKey and Timestamp).
pub const MAX_CUSTOM_PROPERTIES: usize = 252;
/// Largest entity, as the service counts it ([`Entity::service_size`]).
pub const MAX_ENTITY_BYTES: usize = 1024 * 1024;
/// Largest String (as UTF-16) or Binary property value.
pub const MAX_PROPERTY_BYTES: usize = 64 * 1024;

/// One table entity: the two keys plus the other properties exactly as the service's JSON
/// carries them (see the module's invariants). Read-only metadata (`odata.*`, `Timestamp`) is
/// never kept among the properties: only the ETag the row was read with, apart ([`Entity::etag`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entity {
    pub partition_key: String,
    pub row_key: String,
    pub properties: Properties,
    /// The row's ETag as the read that returned it saw it (`odata.etag`): a delete sends it as
    /// `If-Match`, so a row changed since it was read is kept. `None` on rows made here and from
    /// stores that report none. Never written: not a property, not part of the row's equality.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

/// Rows are equal when their keys and properties are: the ETag says when a row was read, not
/// what it holds.
impl PartialEq for Entity {
    fn eq(&self, other: &Self) -> bool {
        self.partition_key == other.partition_key
            && self.row_key == other.row_key
            && self.properties == other.properties
    }
}

/// Property name → the value's JSON text, in name order. Annotations (`Name@odata.type`) are
/// entries like any other.
///
/// A sorted vector, not a map, and names shared between rows (`names::shared`): a step holds up
/// to `MAX_STEP_ROWS` rows, and a B-tree's nodes and a `String` per name cost a row of 15
/// properties about 1.9 KB where this costs about 0.7 KB (measured with a counting allocator on
/// the bench's rows; docs/bench.md). Lookups are binary searches over a few dozen names; inserts
/// keep the order.
#[derive(Clone, Default)]
pub struct Properties(Vec<(Arc<str>, Box<RawValue>)>);

impl Properties {
    /// Sets a property from a JSON value (our own records and test data).
    pub fn insert(&mut self, name: impl Into<String>, value: Value) {
        let raw = serde_json::value::to_raw_value(&value).expect("a JSON value serializes");
        self.insert_raw(name, raw);
    }

    /// Sets a property from JSON text kept as it is (replacing a value of the same name).
    pub fn insert_raw(&mut self, name: impl Into<String>, value: Box<RawValue>) {
        let name: String = name.into();
        match self.find(&name) {
            Ok(at) => self.0[at].1 = value,
            Err(at) => self.0.insert(at, (Arc::from(name), value)),
        }
    }

    /// Where `name` is (`Ok`), or where it would go (`Err`).
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(given, _)| (**given).cmp(name))
    }

    /// Frees the capacity beyond the properties (a parsed row is kept, not grown).
    fn shrink(&mut self) {
        self.0.shrink_to_fit();
    }

    /// The value's JSON text.
    pub fn get(&self, name: &str) -> Option<&RawValue> {
        self.find(name).ok().map(|at| &*self.0[at].1)
    }

    /// The value parsed as JSON (for our own records; never used on copied data).
    pub fn get_value(&self, name: &str) -> Option<Value> {
        self.get(name)
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
    }

    /// The value if it is a JSON string Rust can hold.
    pub fn get_str(&self, name: &str) -> Option<String> {
        self.get(name)
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    pub fn remove(&mut self, name: &str) -> Option<Box<RawValue>> {
        let at = self.find(name).ok()?;
        Some(self.0.remove(at).1)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Property names, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(name, _)| &**name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &RawValue)> {
        self.0.iter().map(|(name, raw)| (&**name, &**raw))
    }

    /// The declared or inferred EDM type of property `name` (see [`EdmType`]).
    pub fn edm_type(&self, name: &str) -> Option<EdmType> {
        let raw = self.get(name)?;
        let annotation = self.get(&format!("{name}@odata.type"));
        Some(EdmType::of(raw, annotation))
    }
}

impl From<serde_json::Map<String, Value>> for Properties {
    fn from(map: serde_json::Map<String, Value>) -> Self {
        let mut properties = Properties::default();
        for (name, value) in map {
            properties.insert(name, value);
        }
        properties
    }
}

/// As a JSON object of name → value text, in name order.
impl Serialize for Properties {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Properties {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, Box<RawValue>>::deserialize(deserializer)?;
        let mut properties = Properties(Vec::with_capacity(map.len()));
        properties
            .0
            .extend(map.into_iter().map(|(n, v)| (Arc::from(n), v)));
        Ok(properties)
    }
}

impl<'a> IntoIterator for &'a Properties {
    type Item = (&'a str, &'a RawValue);
    type IntoIter = Box<dyn Iterator<Item = (&'a str, &'a RawValue)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// Equal when every name and every value's text is equal (text, not value: `1.0` ≠ `1`).
impl PartialEq for Properties {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .iter()
                .zip(other.iter())
                .all(|((a, va), (b, vb))| a == b && va.get() == vb.get())
    }
}

impl fmt::Debug for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(name, raw)| (name, raw.get())))
            .finish()
    }
}

/// The Table service's property types, with the size the service counts for each value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdmType {
    String,
    Binary,
    Boolean,
    DateTime,
    Double,
    Guid,
    Int32,
    Int64,
    /// `null`, or an annotation we do not know: sized as nothing, left to the service to judge.
    Other,
}

impl EdmType {
    /// The annotated type, else the type the service infers from the JSON token.
    pub(super) fn of(raw: &RawValue, annotation: Option<&RawValue>) -> EdmType {
        if let Some(annotation) = annotation {
            return match annotation.get() {
                "\"Edm.String\"" => EdmType::String,
                "\"Edm.Binary\"" => EdmType::Binary,
                "\"Edm.Boolean\"" => EdmType::Boolean,
                "\"Edm.DateTime\"" => EdmType::DateTime,
                "\"Edm.Double\"" => EdmType::Double,
                "\"Edm.Guid\"" => EdmType::Guid,
                "\"Edm.Int32\"" => EdmType::Int32,
                "\"Edm.Int64\"" => EdmType::Int64,
                _ => EdmType::Other,
            };
        }
        match raw.get().as_bytes().first() {
            Some(b'"') => EdmType::String,
            Some(b't' | b'f') => EdmType::Boolean,
            Some(b'-' | b'0'..=b'9') if is_fractional_number(raw.get()) => EdmType::Double,
            Some(b'-' | b'0'..=b'9') => EdmType::Int32,
            _ => EdmType::Other,
        }
    }

    /// The type's name as annotations spell it.
    pub(super) fn name(self) -> &'static str {
        match self {
            EdmType::String => "Edm.String",
            EdmType::Binary => "Edm.Binary",
            EdmType::Boolean => "Edm.Boolean",
            EdmType::DateTime => "Edm.DateTime",
            EdmType::Double => "Edm.Double",
            EdmType::Guid => "Edm.Guid",
            EdmType::Int32 => "Edm.Int32",
            EdmType::Int64 => "Edm.Int64",
            EdmType::Other => "Edm type",
        }
    }

    /// Bytes the service counts for a value of this type (`raw` is its JSON text).
    fn value_size(self, raw: &str) -> usize {
        match self {
            EdmType::String => 4 + 2 * json_string_utf16_len(raw),
            EdmType::Binary => 4 + base64_decoded_len(raw),
            EdmType::Boolean => 1,
            EdmType::Int32 => 4,
            EdmType::DateTime | EdmType::Double | EdmType::Int64 => 8,
            EdmType::Guid => 16,
            EdmType::Other => 0,
        }
    }
}

/// A JSON number token with a fraction or exponent: the Table service reads it as a Double.
pub(super) fn is_fractional_number(text: &str) -> bool {
    text.bytes().any(|b| matches!(b, b'.' | b'e' | b'E'))
}

/// UTF-16 code units of the string a JSON string literal denotes (escapes counted decoded; a
/// `\uXXXX` escape is one unit, so lone surrogates count as the service counts them).
fn json_string_utf16_len(literal: &str) -> usize {
    let inner = literal
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(literal);
    let mut units = 0;
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        units += 1;
        if c == '\\' {
            if chars.next() == Some('u') {
                chars.by_ref().take(4).for_each(drop);
            }
        } else {
            units += c.len_utf16() - 1;
        }
    }
    units
}

/// Bytes a base64 JSON string literal decodes to (padding accounted, whitespace ignored).
fn base64_decoded_len(literal: &str) -> usize {
    let symbols = literal
        .bytes()
        .filter(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/'))
        .count();
    symbols * 3 / 4
}

/// Properties the service maintains itself; they must not be copied into another table.
pub fn is_read_only_property(name: &str) -> bool {
    name.starts_with("odata.") || name == "Timestamp" || name == "Timestamp@odata.type"
}

fn is_annotation(name: &str) -> bool {
    name.contains('@')
}

impl Entity {
    pub fn new(partition_key: impl Into<String>, row_key: impl Into<String>) -> Self {
        Entity {
            partition_key: partition_key.into(),
            row_key: row_key.into(),
            properties: Properties::default(),
            etag: None,
        }
    }

    /// The entity as the service's JSON object (keys first), serialized without copying.
    /// The keys are the entity's own: a property named like a key cannot change where the row
    /// is written.
    pub fn wire(&self) -> WireEntity<'_> {
        WireEntity(self)
    }

    /// Exact size of [`Entity::wire`] as JSON, used to keep batches under the 4 MiB limit.
    pub fn wire_size(&self) -> usize {
        struct Count(usize);
        impl std::io::Write for Count {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0 += buf.len();
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut count = Count(0);
        match serde_json::to_writer(&mut count, &self.wire()) {
            Ok(()) => count.0,
            Err(_) => usize::MAX,
        }
    }

    /// The bytes of the entity's text: keys, property names and values (annotations included)
    /// as the service sent them. Cheap (lengths only): what a step's row budget counts.
    pub fn text_len(&self) -> usize {
        let properties = self.properties.iter();
        let text = properties.map(|(name, raw)| name.len() + raw.get().len());
        self.partition_key.len() + self.row_key.len() + text.sum::<usize>()
    }

    /// The entity's size as the Table service counts it against the 1 MiB limit:
    /// 4 bytes + 2 × UTF-16 length of both keys + for each property 8 bytes + 2 × its name's
    /// UTF-16 length + its value's size by type (String 4 + 2 per UTF-16 unit, Binary 4 + bytes,
    /// Boolean 1, Int32 4, Int64/Double/DateTime 8, Guid 16).
    pub fn service_size(&self) -> usize {
        self.keys_size() + self.sized_properties().map(|p| p.counted).sum::<usize>()
    }

    /// Checks the service's limits on one entity before it is sent: at most 252 custom
    /// properties, every String and Binary value at most 64 KiB, the whole at most 1 MiB. Each
    /// property is typed and sized once (this runs on every row a copy writes).
    pub fn check_limits(&self) -> Result<(), StorageError> {
        let row = || format!("row ({:?}, {:?})", self.partition_key, self.row_key);
        let count = self.custom_properties().count();
        if count > MAX_CUSTOM_PROPERTIES {
            return Err(StorageError::invalid_input(format!(
                "{} has {count} properties, over the {MAX_CUSTOM_PROPERTIES} the service allows",
                row()
            )));
        }
        let mut total = self.keys_size();
        for SizedProperty {
            name,
            edm,
            value,
            counted,
        } in self.sized_properties()
        {
            total += counted;
            if !matches!(edm, EdmType::String | EdmType::Binary) {
                continue;
            }
            let value = value - 4; // the length prefix is not part of the 64 KiB
            if value > MAX_PROPERTY_BYTES {
                return Err(StorageError::invalid_input(format!(
                    "property {name} of {} is {value} bytes, over the 64 KiB the service allows",
                    row()
                )));
            }
        }
        if total > MAX_ENTITY_BYTES {
            return Err(StorageError::invalid_input(format!(
                "{} is {total} bytes as the service counts it, over the 1 MiB entity limit",
                row()
            )));
        }
        Ok(())
    }

    /// 4 bytes of entity overhead plus both keys as UTF-16.
    fn keys_size(&self) -> usize {
        4 + 2 * (self.partition_key.encode_utf16().count() + self.row_key.encode_utf16().count())
    }

    /// Each custom property, typed and sized once.
    fn sized_properties(&self) -> impl Iterator<Item = SizedProperty<'_>> {
        self.custom_properties().map(|(name, raw)| {
            let edm = self.properties.edm_type(name).unwrap_or(EdmType::Other);
            let value = edm.value_size(raw.get());
            SizedProperty {
                name,
                edm,
                value,
                counted: 8 + 2 * name.encode_utf16().count() + value,
            }
        })
    }

    /// Properties other than annotations and the key names.
    fn custom_properties(&self) -> impl Iterator<Item = (&str, &RawValue)> {
        self.properties.iter().filter(|(name, _)| {
            !is_annotation(name) && *name != "PartitionKey" && *name != "RowKey"
        })
    }
}

/// A custom property as the service sizes it: its value's bytes by type, and in all (8 bytes,
/// its name as UTF-16, its value).
struct SizedProperty<'a> {
    name: &'a str,
    edm: EdmType,
    value: usize,
    counted: usize,
}

/// [`Entity::wire`]: serializes PartitionKey, RowKey, then the properties' JSON texts.
pub struct WireEntity<'a>(&'a Entity);

impl Serialize for WireEntity<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let entity = self.0;
        let mut map = serializer.serialize_map(Some(entity.properties.len() + 2))?;
        map.serialize_entry("PartitionKey", &entity.partition_key)?;
        map.serialize_entry("RowKey", &entity.row_key)?;
        for (name, value) in entity.properties.iter() {
            if name != "PartitionKey" && name != "RowKey" {
                map.serialize_entry(name, value)?;
            }
        }
        map.end()
    }
}

/// A row whose key the service stores but Rust cannot hold (a lone UTF-16 surrogate): it
/// cannot be named in a URL or a filter, so it cannot be read back, written or deleted by key.
/// Its keys are kept as the service's JSON text, to report exactly which row it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnaddressableRow {
    pub partition_key_json: String,
    pub row_key_json: String,
}

impl fmt::Display for UnaddressableRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "row (PartitionKey {}, RowKey {}) has a key with a lone UTF-16 surrogate, which \
             cannot be addressed by key",
            self.partition_key_json, self.row_key_json
        )
    }
}

/// One entity of a service response: usable, or a row whose keys cannot be addressed.
#[derive(Debug)]
pub enum ServiceEntity {
    Entity(Entity),
    Unaddressable(UnaddressableRow),
}

/// Parses one entity of the service's JSON (see the module's invariants): keys decoded,
/// read-only metadata skipped unparsed, every other value kept as its JSON text, fractional
/// numbers annotated as `Edm.Double`.
pub fn parse_service_entity<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<ServiceEntity, D::Error> {
    deserializer.deserialize_map(ServiceEntityVisitor)
}

impl<'de> Deserialize<'de> for ServiceEntity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        parse_service_entity(deserializer)
    }
}

struct ServiceEntityVisitor;

impl<'de> Visitor<'de> for ServiceEntityVisitor {
    type Value = ServiceEntity;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a table entity object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ServiceEntity, A::Error> {
        let (mut partition_key, mut row_key): (Option<Box<RawValue>>, Option<Box<RawValue>>) =
            (None, None);
        let mut properties = Properties::default();
        let mut etag: Option<String> = None;
        let twice = |name: &str| serde::de::Error::custom(format!("{name:?} is given twice"));
        while let Some(name) = map.next_key_seed(NameSeed)? {
            match &*name {
                "PartitionKey" | "RowKey" => {
                    let key = match &*name {
                        "PartitionKey" => &mut partition_key,
                        _ => &mut row_key,
                    };
                    if key.replace(map.next_value()?).is_some() {
                        return Err(twice(&name));
                    }
                }
                "odata.etag" => etag = Some(map.next_value()?),
                name if is_read_only_property(name) => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
                _ => {
                    let value = map.next_value_seed(RawSeed)?;
                    // Never "last one wins": a name given twice is refused. One search
                    // finds both whether the name is known and where it goes.
                    match properties.find(&name) {
                        Ok(_) => return Err(twice(&name)),
                        Err(at) => properties.0.insert(at, (name, value)),
                    }
                }
            }
        }
        let missing = |name| serde::de::Error::custom(format!("entity without a string {name}"));
        let partition_key = partition_key.ok_or_else(|| missing("PartitionKey"))?;
        let row_key = row_key.ok_or_else(|| missing("RowKey"))?;
        let decode = |raw: &RawValue| serde_json::from_str::<String>(raw.get());
        let (Ok(pk), Ok(rk)) = (decode(&partition_key), decode(&row_key)) else {
            if !partition_key.get().starts_with('"') || !row_key.get().starts_with('"') {
                return Err(missing("PartitionKey and RowKey"));
            }
            return Ok(ServiceEntity::Unaddressable(UnaddressableRow {
                partition_key_json: partition_key.get().to_string(),
                row_key_json: row_key.get().to_string(),
            }));
        };
        annotate_doubles(&mut properties);
        properties.shrink();
        Ok(ServiceEntity::Entity(Entity {
            partition_key: pk,
            row_key: rk,
            properties,
            etag,
        }))
    }
}

/// Reads a property name, shared with the rows parsed before it ([`names::shared`]) rather than
/// copied into a `String` of its own.
struct NameSeed;

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = Arc<str>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(NameSeed)
    }
}

impl Visitor<'_> for NameSeed {
    type Value = Arc<str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a property name")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Arc<str>, E> {
        Ok(names::shared(name))
    }
}

/// Reads one value as its raw JSON text.
struct RawSeed;

impl<'de> DeserializeSeed<'de> for RawSeed {
    type Value = Box<RawValue>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        Box::<RawValue>::deserialize(deserializer)
    }
}

/// Adds `Edm.Double` to every unannotated fractional or exponent number (invariant 2).
fn annotate_doubles(properties: &mut Properties) {
    let doubles: Vec<String> = properties
        .iter()
        .filter(|(name, raw)| {
            !is_annotation(name)
                && matches!(raw.get().as_bytes().first(), Some(b'-' | b'0'..=b'9'))
                && is_fractional_number(raw.get())
        })
        .map(|(name, _)| format!("{name}@odata.type"))
        .filter(|annotation| !properties.contains_key(annotation))
        .collect();
    for annotation in doubles {
        properties.insert(annotation, Value::String("Edm.Double".into()));
    }
}

#[cfg(test)]
#[path = "entity_tests.rs"]
mod tests;
