//! The export format, `tablescan-export/1` (described for users in `docs/export-format.md`):
//! part files of gzip-compressed JSON Lines, one entity per line in the Table service's own JSON
//! form, and a manifest listing the parts with their row counts, sizes and SHA-256 digests.
//! Pure: bytes in, bytes out, no I/O.
//!
//! Invariants:
//! - **Values pass through as text.** A line is `PartitionKey`, `RowKey` and every property's
//!   JSON text exactly as [`Entity`] holds it (the service's own text, see `storage::entity`), so
//!   encode → decode gives back every property byte for byte; no number is ever re-serialized.
//! - **A line says every type JSON cannot.** The service annotates Int64, DateTime, Guid and
//!   Binary itself (the annotations travel with the entity); the encoder adds `Edm.Double` to
//!   every Double that lacks it, so a decoder never guesses.
//! - **What the encoder writes, the decoder reads** with the default [`DecodeLimits`]: a line is at
//!   most [`MAX_LINE_BYTES`] and a part at most [`MAX_PART_DECOMPRESSED_BYTES`] decompressed, or
//!   the encoder refuses it.
//! - **The decoder is bounded and verifies before it trusts.** The SHA-256 of the blob's bytes is
//!   checked first, then at most `max_decompressed_bytes` are inflated and no line may exceed
//!   `max_line_bytes` (a zip bomb fails early, never exhausting memory), and the row count must
//!   match: more lines than expected fail as soon as they appear.
//! - **Names are deterministic.** A part's name depends only on the scan and the work item
//!   ([`part_name`]), so a redelivered work item rewrites the same blob.

use std::io::{BufRead, BufReader, Read, Write};

use bytes::Bytes;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::storage::blob::check_blob_name;
use crate::storage::entity::{parse_service_entity, EdmType, Entity, ServiceEntity};

/// The manifest's `format`.
pub const FORMAT: &str = "tablescan-export/1";
/// A part blob's `Content-Type`: the blob is a gzip file (no `Content-Encoding`, so every
/// client downloads exactly the bytes the manifest's SHA-256 covers).
pub const PART_CONTENT_TYPE: &str = "application/gzip";
/// The manifest's `Content-Type`.
pub const MANIFEST_CONTENT_TYPE: &str = "application/json";
/// The manifest's name under the export's prefix.
pub const MANIFEST_NAME: &str = "manifest.json";
/// A part's name ends with this.
pub const PART_SUFFIX: &str = ".jsonl.gz";
/// Longest line (one entity's JSON). An entity the service accepts is at most 1 MiB as it
/// counts it; as JSON text it can be about three times that (a string of `\uXXXX` escapes: six
/// bytes for each two-byte UTF-16 unit).
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;
/// Largest part, decompressed.
pub const MAX_PART_DECOMPRESSED_BYTES: u64 = 256 * 1024 * 1024;
/// An export closes a part once its lines reach this, before compression.
pub const PART_SPLIT_BYTES: u64 = 8 * 1024 * 1024;
/// Largest part (compressed) a reader downloads: what an export can write — less than
/// [`PART_SPLIT_BYTES`] of lines before the one that crosses it, at most [`MAX_LINE_BYTES`] —
/// plus gzip's framing (a few bytes per 64 KiB even of incompressible data), with room to
/// spare. A part is held whole while its SHA-256 is checked, so this bounds its memory.
pub const MAX_PART_BYTES: u64 = PART_SPLIT_BYTES + MAX_LINE_BYTES as u64 + 1024 * 1024;
/// Largest manifest a reader should download (about 300,000 parts).
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024 * 1024;
/// Longest scan id or work item id in a part name.
const MAX_ID_CHARS: usize = 128;
/// Longest export prefix (a part name adds at most ~300 characters; blob names allow 1,024).
const MAX_PREFIX_CHARS: usize = 512;
/// The compression level: zlib's default, a balance of CPU per row against bytes stored.
const COMPRESSION_LEVEL: u32 = 6;

/// What is wrong with a part, a manifest or a name. Messages say what differed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportFormatError {
    #[error("SHA-256 mismatch: the manifest says {expected}, the blob's bytes hash to {actual}")]
    ChecksumMismatch { expected: String, actual: String },
    #[error("row count mismatch: the manifest says {expected} rows, the part holds {actual}")]
    RowCountMismatch { expected: u64, actual: String },
    #[error("decompressed, the part is over the {limit}-byte bound")]
    TooLarge { limit: u64 },
    #[error("line {line} is over the {limit}-byte bound")]
    LineTooLong { line: u64, limit: usize },
    #[error("line {line}: {message}")]
    BadLine { line: u64, message: String },
    #[error("not a valid gzip file: {0}")]
    Gzip(String),
    #[error("row ({partition_key:?}, {row_key:?}) cannot be written: {message}")]
    BadEntity {
        partition_key: String,
        row_key: String,
        message: String,
    },
    #[error("manifest: {0}")]
    BadManifest(String),
    #[error("{0}")]
    BadName(String),
}

type Result<T> = std::result::Result<T, ExportFormatError>;

/// An encoded part: the blob's bytes, its rows, and the SHA-256 of the bytes (lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedPart {
    pub bytes: Bytes,
    pub rows: u64,
    pub sha256: String,
}

/// Writes entities into one part, a line at a time.
pub struct PartEncoder {
    gzip: GzEncoder<Vec<u8>>,
    line: Vec<u8>,
    rows: u64,
    decompressed: u64,
}

impl Default for PartEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl PartEncoder {
    pub fn new() -> Self {
        PartEncoder {
            gzip: GzEncoder::new(Vec::new(), Compression::new(COMPRESSION_LEVEL)),
            line: Vec::new(),
            rows: 0,
            decompressed: 0,
        }
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes written so far before compression (a writer may start a new part before
    /// [`MAX_PART_DECOMPRESSED_BYTES`]).
    pub fn decompressed_bytes(&self) -> u64 {
        self.decompressed
    }

    /// Appends one entity as one line.
    pub fn push(&mut self, entity: &Entity) -> Result<()> {
        let refuse = |message: String| ExportFormatError::BadEntity {
            partition_key: entity.partition_key.clone(),
            row_key: entity.row_key.clone(),
            message,
        };
        self.line.clear();
        serde_json::to_writer(&mut self.line, &ExportLine(entity))
            .map_err(|e| refuse(format!("not serializable as JSON: {e}")))?;
        if self.line.contains(&b'\n') {
            return Err(refuse("a property value holds a raw line break".into()));
        }
        self.line.push(b'\n');
        if self.line.len() > MAX_LINE_BYTES {
            return Err(refuse(format!(
                "its line is {} bytes, over the {MAX_LINE_BYTES}-byte bound",
                self.line.len()
            )));
        }
        let decompressed = self.decompressed + self.line.len() as u64;
        if decompressed > MAX_PART_DECOMPRESSED_BYTES {
            return Err(refuse(format!(
                "the part would be over {MAX_PART_DECOMPRESSED_BYTES} bytes decompressed; start \
                 a new part"
            )));
        }
        self.gzip
            .write_all(&self.line)
            .expect("writing to a Vec cannot fail");
        self.decompressed = decompressed;
        self.rows += 1;
        Ok(())
    }

    /// The finished part.
    pub fn finish(self) -> EncodedPart {
        let bytes = self.gzip.finish().expect("writing to a Vec cannot fail");
        EncodedPart {
            sha256: sha256_hex(&bytes),
            bytes: Bytes::from(bytes),
            rows: self.rows,
        }
    }
}

/// Encodes entities into one part.
pub fn encode_part<'a>(entities: impl IntoIterator<Item = &'a Entity>) -> Result<EncodedPart> {
    let mut encoder = PartEncoder::new();
    for entity in entities {
        encoder.push(entity)?;
    }
    Ok(encoder.finish())
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One line: the keys, then every property's text, with `Edm.Double` added after each Double
/// that has no annotation (its text has a fraction or exponent: see `storage::entity`).
struct ExportLine<'a>(&'a Entity);

impl Serialize for ExportLine<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let entity = self.0;
        let properties = &entity.properties;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("PartitionKey", &entity.partition_key)?;
        map.serialize_entry("RowKey", &entity.row_key)?;
        for (name, value) in properties.iter() {
            if name == "PartitionKey" || name == "RowKey" {
                continue;
            }
            map.serialize_entry(name, value)?;
            if name.contains('@') {
                continue;
            }
            let annotation = format!("{name}@odata.type");
            if properties.edm_type(name) == Some(EdmType::Double)
                && !properties.contains_key(&annotation)
            {
                map.serialize_entry(&annotation, "Edm.Double")?;
            }
        }
        map.end()
    }
}

/// The decoder's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    pub max_decompressed_bytes: u64,
    pub max_line_bytes: usize,
}

impl Default for DecodeLimits {
    /// What the encoder may write.
    fn default() -> Self {
        DecodeLimits {
            max_decompressed_bytes: MAX_PART_DECOMPRESSED_BYTES,
            max_line_bytes: MAX_LINE_BYTES,
        }
    }
}

/// Checks the SHA-256 of a part's bytes against the manifest's (case-insensitive hex).
pub fn check_sha256(bytes: &[u8], expected_sha256: &str) -> Result<()> {
    let actual = sha256_hex(bytes);
    if !actual.eq_ignore_ascii_case(expected_sha256) {
        return Err(ExportFormatError::ChecksumMismatch {
            expected: expected_sha256.to_string(),
            actual,
        });
    }
    Ok(())
}

/// Decodes a part, verifying its SHA-256 (before inflating anything) and its row count, within
/// `limits`. Accepts what other tools write too: several gzip members, `\r\n` line ends, no final
/// line break, `Timestamp` and `odata.*` members (ignored, as the service ignores them on write).
/// Holds every row: for bounded work on one part, read it with [`PartLines`] instead.
pub fn decode_part(
    bytes: &[u8],
    expected_rows: u64,
    expected_sha256: &str,
    limits: &DecodeLimits,
) -> Result<Vec<Entity>> {
    check_sha256(bytes, expected_sha256)?;
    let mut lines = PartLines::new(bytes, *limits);
    let capacity = usize::try_from(expected_rows.min(4096)).unwrap_or(4096);
    let mut entities = Vec::with_capacity(capacity);
    while let Some((number, text)) = lines.next_line()? {
        if entities.len() as u64 == expected_rows {
            return Err(ExportFormatError::RowCountMismatch {
                expected: expected_rows,
                actual: format!("more than {expected_rows}"),
            });
        }
        entities.push(decode_line(number, text)?);
    }
    if entities.len() as u64 != expected_rows {
        return Err(ExportFormatError::RowCountMismatch {
            expected: expected_rows,
            actual: entities.len().to_string(),
        });
    }
    Ok(entities)
}

/// A part's lines, inflated and split as they are read: memory is one line (at most
/// `max_line_bytes`) and the inflater's buffers, whatever the part holds, and no more than
/// `max_decompressed_bytes` are ever inflated. The caller checks the SHA-256 first
/// ([`check_sha256`]) and decides how many lines it needs: it can stop at any line.
pub struct PartLines<R: Read> {
    reader: BufReader<std::io::Take<MultiGzDecoder<R>>>,
    line: Vec<u8>,
    number: u64,
    total: u64,
    limits: DecodeLimits,
}

impl<R: Read> PartLines<R> {
    /// The lines of the gzip file `compressed`.
    pub fn new(compressed: R, limits: DecodeLimits) -> Self {
        let inflated =
            MultiGzDecoder::new(compressed).take(limits.max_decompressed_bytes.saturating_add(1));
        PartLines {
            reader: BufReader::new(inflated),
            line: Vec::new(),
            number: 0,
            total: 0,
            limits,
        }
    }

    /// Bytes inflated so far.
    pub fn decompressed_bytes(&self) -> u64 {
        self.total
    }

    /// The next line's number (1-based) and text without its line end, or `None` at the end of
    /// the part. A line
    /// over `max_line_bytes` or a part over `max_decompressed_bytes` is an error, found before
    /// more than one line's worth past the bound is held.
    pub fn next_line(&mut self) -> Result<Option<(u64, &[u8])>> {
        self.line.clear();
        let read = (&mut self.reader)
            .take(self.limits.max_line_bytes as u64 + 1)
            .read_until(b'\n', &mut self.line)
            .map_err(|e| ExportFormatError::Gzip(e.to_string()))?;
        self.total += read as u64;
        if self.total > self.limits.max_decompressed_bytes {
            return Err(ExportFormatError::TooLarge {
                limit: self.limits.max_decompressed_bytes,
            });
        }
        if read == 0 {
            return Ok(None);
        }
        self.number += 1;
        let ended = self.line.last() == Some(&b'\n');
        let text = trim_line_end(&self.line);
        if text.len() > self.limits.max_line_bytes || (!ended && read > self.limits.max_line_bytes)
        {
            return Err(ExportFormatError::LineTooLong {
                line: self.number,
                limit: self.limits.max_line_bytes,
            });
        }
        Ok(Some((self.number, text)))
    }
}

fn trim_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// One line as an entity (values kept as their text; fractional numbers annotated as doubles;
/// a name given twice refused). `number` names the line in errors.
pub fn decode_line(number: u64, text: &[u8]) -> Result<Entity> {
    let bad = |message: String| ExportFormatError::BadLine {
        line: number,
        message,
    };
    if text.is_empty() {
        return Err(bad("is empty".into()));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    let parsed = parse_service_entity(&mut deserializer)
        .and_then(|entity| deserializer.end().map(|()| entity))
        .map_err(|e| bad(format!("not an entity object: {e}")))?;
    match parsed {
        ServiceEntity::Entity(entity) => Ok(entity),
        ServiceEntity::Unaddressable(row) => Err(bad(row.to_string())),
    }
}

/// Where an export's blobs go: every name is the (normalized) prefix plus a relative name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportLayout {
    prefix: String,
}

impl ExportLayout {
    /// An export under `prefix` (a "folder": `/` is added unless it is empty or ends with one).
    pub fn new(prefix: &str) -> Result<Self> {
        let bad = |why: &str| ExportFormatError::BadName(format!("prefix {prefix:?} {why}"));
        if prefix.chars().count() > MAX_PREFIX_CHARS {
            return Err(bad(&format!(
                "is longer than {MAX_PREFIX_CHARS} characters"
            )));
        }
        if prefix.starts_with('/') {
            return Err(bad("starts with `/`"));
        }
        let mut prefix = prefix.to_string();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        check_blob_name(&format!("{prefix}{MANIFEST_NAME}"))
            .map_err(|e| ExportFormatError::BadName(e.message))?;
        Ok(ExportLayout { prefix })
    }

    /// The normalized prefix: empty, or ending with `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>manifest.json`.
    pub fn manifest_blob(&self) -> String {
        self.blob(MANIFEST_NAME)
    }

    /// The blob of a name relative to the prefix (as a manifest lists parts).
    pub fn blob(&self, relative_name: &str) -> String {
        format!("{}{relative_name}", self.prefix)
    }
}

/// A part's name relative to the export's prefix: `parts/<scan id>/<item id>.jsonl.gz`. Ids are
/// 1..=128 characters of ASCII letters, digits, `-` and `_`, so the name needs no escaping.
pub fn part_name(scan_id: &str, item_id: &str) -> Result<String> {
    for (what, id) in [("scan id", scan_id), ("work item id", item_id)] {
        let valid = !id.is_empty()
            && id.len() <= MAX_ID_CHARS
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(ExportFormatError::BadName(format!(
                "{what} {id:?} must be 1 to {MAX_ID_CHARS} ASCII letters, digits, `-` or `_`"
            )));
        }
    }
    Ok(format!("parts/{scan_id}/{item_id}{PART_SUFFIX}"))
}

/// The manifest: what an export holds. Part names are relative to the export's prefix, so an
/// export can be copied elsewhere as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub format: String,
    pub source_table: String,
    pub scan_id: String,
    /// The sum of the parts' rows.
    pub rows: u64,
    /// In name order.
    pub parts: Vec<ManifestPart>,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub completed_at: OffsetDateTime,
}

/// One part in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestPart {
    /// Relative to the export's prefix.
    pub name: String,
    pub rows: u64,
    /// The blob's size.
    pub bytes: u64,
    /// Lowercase hex SHA-256 of the blob's bytes.
    pub sha256: String,
}

impl Manifest {
    /// A manifest of these parts (sorted by name; rows summed), so the same parts always give
    /// the same bytes.
    pub fn new(
        source_table: &str,
        scan_id: &str,
        mut parts: Vec<ManifestPart>,
        started_at: OffsetDateTime,
        completed_at: OffsetDateTime,
    ) -> Self {
        parts.sort_by(|a, b| a.name.cmp(&b.name));
        Manifest {
            format: FORMAT.to_string(),
            source_table: source_table.to_string(),
            scan_id: scan_id.to_string(),
            rows: parts.iter().map(|p| p.rows).sum(),
            parts,
            started_at,
            completed_at,
        }
    }

    /// The manifest's JSON (indented: it is meant to be read by people too).
    pub fn to_json(&self) -> Vec<u8> {
        let mut json = serde_json::to_vec_pretty(self).expect("a manifest serializes");
        json.push(b'\n');
        json
    }

    /// Parses and checks a manifest: the format, the rows adding up, each part's name (relative,
    /// `…jsonl.gz`, once) and digest (64 hex digits).
    pub fn parse(bytes: &[u8]) -> Result<Manifest> {
        let bad = |m: String| ExportFormatError::BadManifest(m);
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a valid manifest: {e}")))?;
        if manifest.format != FORMAT {
            return Err(bad(format!(
                "format {:?} is not {FORMAT:?}, the only one this version reads",
                manifest.format
            )));
        }
        let mut names = std::collections::HashSet::with_capacity(manifest.parts.len());
        let mut rows: u64 = 0;
        for part in &manifest.parts {
            let name = &part.name;
            if !name.ends_with(PART_SUFFIX) || name.starts_with('/') {
                return Err(bad(format!(
                    "part {name:?} is not a relative name ending in {PART_SUFFIX}"
                )));
            }
            check_blob_name(name).map_err(|e| bad(e.message))?;
            if !names.insert(name.as_str()) {
                return Err(bad(format!("part {name:?} is listed twice")));
            }
            if part.sha256.len() != 64 || !part.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(format!(
                    "part {name:?} has sha256 {:?}, not 64 hex digits",
                    part.sha256
                )));
            }
            rows = rows.saturating_add(part.rows);
        }
        if rows != manifest.rows {
            return Err(bad(format!(
                "rows is {}, but the parts hold {rows}",
                manifest.rows
            )));
        }
        Ok(manifest)
    }
}

#[cfg(test)]
#[path = "export_format_tests.rs"]
mod tests;

/// Names and manifests.
#[cfg(test)]
#[path = "export_format_manifest_tests.rs"]
mod manifest_tests;
