//! The demo's backup and restore: after the copies, an export of the source table to Blob
//! Storage on the same account (gzip JSON Lines parts and a manifest, docs/export-format.md),
//! its manifest summarised, then an import of that backup into a new table, verified against
//! the source with the same fingerprint as the copies.

use std::sync::Arc;

use serde_json::json;
use time::OffsetDateTime;

use crate::app::export_format::{ExportLayout, Manifest, MAX_MANIFEST_BYTES};
use crate::storage::blob::{BlobRequestCounters, BlobStore};

use super::{announce, run_scan, table_fingerprint, RunSummary, Session};

/// The container the demo's backups go to.
pub const CONTAINER: &str = "tablescan-demo";

/// A backup made and restored, verified against the source.
pub struct Backup {
    pub export: RunSummary,
    pub import: RunSummary,
    pub manifest: Manifest,
    /// `container/prefix/manifest.json`.
    pub manifest_path: String,
    pub restored_table: String,
}

impl Backup {
    /// The sum of the parts' sizes (the backup's size in Blob Storage, manifest aside).
    pub fn compressed_bytes(&self) -> u64 {
        self.manifest.parts.iter().map(|p| p.bytes).sum()
    }
}

/// `backups/<source>-<UTC time>`: a fresh prefix, since an export refuses one holding a manifest.
fn backup_prefix(source: &str) -> String {
    let now = OffsetDateTime::now_utc();
    format!(
        "backups/{source}-{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    )
}

/// Exports the source table, prints the manifest's summary, imports the backup into a new
/// table and verifies it against the source. An error for a failed scan or a restore that
/// differs from the source.
pub(super) async fn backup_and_restore(session: &Session<'_>) -> Result<Backup, String> {
    let source = &session.source;
    let prefix = backup_prefix(source);
    let body = json!({"driver": "export", "sourceTable": source,
        "destinationContainer": CONTAINER, "destinationPrefix": prefix});
    announce(&session.base, &body);
    let export = run_scan(
        &session.client,
        &session.base,
        "export",
        body,
        session.source_print.rows,
        false,
    )
    .await?;
    let manifest_blob = ExportLayout::new(&prefix)
        .map_err(|e| format!("backup prefix {prefix}: {e}"))?
        .manifest_blob();
    let manifest_path = format!("{CONTAINER}/{manifest_blob}");
    let manifest = read_manifest(session, &manifest_blob).await?;
    if manifest.rows != session.source_print.rows {
        return Err(format!(
            "the export's manifest {manifest_path} lists {} rows; the source has {}",
            manifest.rows, session.source_print.rows
        ));
    }
    print_manifest_summary(session, &manifest, &manifest_path);

    let restored_table = format!("DemoRestored{}", session.suffix);
    let body = json!({"driver": "import", "sourceContainer": CONTAINER,
        "sourcePrefix": prefix, "destinationTable": restored_table});
    announce(&session.base, &body);
    let import = run_scan(
        &session.client,
        &session.base,
        "import",
        body,
        manifest.rows,
        false,
    )
    .await?;
    let restored = table_fingerprint(session.store, &restored_table).await?;
    let expected = &session.source_print;
    if (restored.rows, &restored.checksum) != (expected.rows, &expected.checksum) {
        return Err(format!(
            "restore mismatch: source {} rows #{}, {restored_table} (imported from {manifest_path}) {} rows #{}",
            expected.rows, expected.checksum, restored.rows, restored.checksum
        ));
    }
    eprintln!(
        "restore verified: {restored_table} has {} rows, checksum {} = source",
        restored.rows, restored.checksum
    );
    Ok(Backup {
        export,
        import,
        manifest,
        manifest_path,
        restored_table,
    })
}

/// Downloads and parses the export's manifest (its parts are checked by the import).
async fn read_manifest(session: &Session<'_>, manifest_blob: &str) -> Result<Manifest, String> {
    let blobs = session
        .account
        .blob_store(Arc::new(BlobRequestCounters::new()))
        .map_err(|e| format!("reading the backup's manifest: {e}"))?;
    let downloaded = blobs
        .download(CONTAINER, manifest_blob, MAX_MANIFEST_BYTES)
        .await
        .map_err(|e| format!("reading {CONTAINER}/{manifest_blob}: {e}"))?;
    Manifest::parse(&downloaded.bytes).map_err(|e| format!("{CONTAINER}/{manifest_blob}: {e}"))
}

fn print_manifest_summary(session: &Session<'_>, manifest: &Manifest, manifest_path: &str) {
    let compressed: u64 = manifest.parts.iter().map(|p| p.bytes).sum();
    let text = session.source_print.json_bytes;
    let span = (manifest.completed_at - manifest.started_at).as_seconds_f64();
    eprintln!(
        "backup: {} part{}, {} rows, {} gzip ({:.0}% of the rows' {} as JSON text), exported in {span:.1} s (manifest startedAt to completedAt)",
        manifest.parts.len(),
        plural(manifest.parts.len()),
        manifest.rows,
        mib(compressed),
        compressed as f64 * 100.0 / (text.max(1) as f64),
        mib(text),
    );
    let endpoint = session.account.blob_endpoint().unwrap_or("<blob endpoint>");
    eprintln!("backup: manifest at {endpoint}/{manifest_path}");
}

/// Bytes as MiB with one decimal (KiB below 1 MiB).
pub fn mib(bytes: u64) -> String {
    if bytes < 1024 * 1024 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
    }
}

/// `"s"` unless `n` is 1.
pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
