//! What one export item writes (its part blobs, its key chunk, its tombstone file) and
//! records (their descriptors, its work result), and how the completion step reads the results
//! back. Names are the item's (`parts/<scan>/<item>…`), so a redelivered item rewrites the same
//! blobs.

use bytes::Bytes;
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};

use crate::app::export_chain::{encode_keys, Key, KeyChunk, DELETED_FOLDER, KEYS_FOLDER};
use crate::app::export_format::{
    part_name, ExportFormatError, ManifestPart, PartEncoder, PART_CONTENT_TYPE, PART_SPLIT_BYTES,
};
use crate::app::job::WorkError;
use crate::storage::blob::{BlobStore, BlobWrite};
use crate::storage::Entity;

use super::ExportOptions;

/// An item's work result: what its execution wrote (kept on its finished work row).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ItemResult {
    parts: Vec<ManifestPart>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keys: Option<KeyChunk>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deleted: Option<ManifestPart>,
}

/// A blob named like the item's part, in `folder` instead of `parts`.
fn sibling(scan_id: &str, work_id: &str, folder: &str) -> Result<String, WorkError> {
    let name = part_name(scan_id, work_id).map_err(|e| WorkError::Permanent(e.to_string()))?;
    let rest = name.strip_prefix("parts/").unwrap_or(&name);
    Ok(format!("{folder}/{rest}"))
}

/// Writes an item's rows as parts, `keys` (the chain's state in its range, sorted) as its key
/// chunk and `deleted` as its tombstone file (each only if not empty), and returns its work
/// result (`None` if it wrote nothing).
pub(super) async fn write_item_blobs<B: BlobStore>(
    blobs: &B,
    options: &ExportOptions,
    scan_id: &str,
    work_id: &str,
    rows: &[Entity],
    keys: &[Key],
    deleted: &[Key],
) -> Result<Option<String>, WorkError> {
    let layout = options.layout()?;
    let mut blobs_out: Vec<(String, Bytes)> = Vec::new();
    let mut result = ItemResult::default();
    for (part, bytes) in encode_parts(scan_id, work_id, rows)? {
        blobs_out.push((part.name.clone(), bytes));
        result.parts.push(part);
    }
    if let Some(first) = keys.first() {
        let encoded = encode_keys(keys);
        let name = sibling(scan_id, work_id, KEYS_FOLDER)?;
        result.keys = Some(KeyChunk {
            name: name.clone(),
            first: first.clone(),
            rows: encoded.rows,
            bytes: encoded.bytes.len() as u64,
            sha256: encoded.sha256,
        });
        blobs_out.push((name, encoded.bytes));
    }
    if !deleted.is_empty() {
        let encoded = encode_keys(deleted);
        let name = sibling(scan_id, work_id, DELETED_FOLDER)?;
        result.deleted = Some(ManifestPart {
            name: name.clone(),
            rows: encoded.rows,
            bytes: encoded.bytes.len() as u64,
            sha256: encoded.sha256,
        });
        blobs_out.push((name, encoded.bytes));
    }
    let write = BlobWrite::new(PART_CONTENT_TYPE);
    try_join_all(blobs_out.into_iter().map(|(name, bytes)| {
        let name = layout.blob(&name);
        let (write, container) = (&write, &options.container);
        async move { blobs.upload(container, &name, bytes, write).await }
    }))
    .await?;
    let wrote = !result.parts.is_empty() || result.keys.is_some() || result.deleted.is_some();
    Ok(wrote.then(|| serde_json::to_string(&result).expect("a result serializes")))
}

/// The parts, key chunks (sorted by first key) and tombstone files the items' results list.
/// A result recorded before key chunks existed is the array of its parts.
#[allow(clippy::type_complexity)]
pub(super) fn collect_results(
    results: &[String],
) -> Result<(Vec<ManifestPart>, Vec<KeyChunk>, Vec<ManifestPart>), WorkError> {
    let (mut parts, mut keys, mut deleted) = (Vec::new(), Vec::new(), Vec::new());
    for text in results {
        let result = serde_json::from_str::<ItemResult>(text)
            .or_else(|_| {
                serde_json::from_str::<Vec<ManifestPart>>(text).map(|parts| ItemResult {
                    parts,
                    ..ItemResult::default()
                })
            })
            .map_err(|e| {
                WorkError::Permanent(format!("an export part record is unreadable: {e}"))
            })?;
        parts.extend(result.parts);
        keys.extend(result.keys);
        deleted.extend(result.deleted);
    }
    keys.sort_by(|a: &KeyChunk, b| crate::app::export_chain::compare(&a.first, &b.first));
    deleted.sort_by(|a: &ManifestPart, b| a.name.cmp(&b.name));
    Ok((parts, keys, deleted))
}

/// The item's rows as parts (none for no rows): the first named after the item, any further
/// one (past [`PART_SPLIT_BYTES`]) after the item and its number.
pub(super) fn encode_parts(
    scan_id: &str,
    work_id: &str,
    rows: &[Entity],
) -> Result<Vec<(ManifestPart, Bytes)>, WorkError> {
    let permanent =
        |e: ExportFormatError| WorkError::Permanent(format!("exporting {work_id}: {e}"));
    let mut parts = Vec::new();
    let mut encoder = PartEncoder::new();
    let close = |encoder: PartEncoder, parts: &mut Vec<(ManifestPart, Bytes)>| {
        let id = match parts.len() {
            0 => work_id.to_string(),
            n => format!("{work_id}-{n}"),
        };
        let encoded = encoder.finish();
        let part = ManifestPart {
            name: part_name(scan_id, &id).map_err(permanent)?,
            rows: encoded.rows,
            bytes: encoded.bytes.len() as u64,
            sha256: encoded.sha256,
        };
        parts.push((part, encoded.bytes));
        Ok::<(), WorkError>(())
    };
    for row in rows {
        if encoder.decompressed_bytes() >= PART_SPLIT_BYTES {
            close(std::mem::take(&mut encoder), &mut parts)?;
        }
        encoder.push(row).map_err(permanent)?;
    }
    if encoder.rows() > 0 {
        close(encoder, &mut parts)?;
    }
    Ok(parts)
}
