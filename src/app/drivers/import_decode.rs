//! The import's decoding of parts (pure: bytes in, rows or findings out), run on a blocking
//! thread by the driver (`import.rs`). A part is read as a stream ([`PartLines`]): memory is
//! one line and the rows an item keeps, whatever the part holds.

use crate::app::export_format::{
    check_sha256, decode_line, DecodeLimits, ExportFormatError, PartLines,
};
use crate::storage::Entity;

use super::{PartRef, WRITE_ITEM_BYTES};
use crate::app::job::MAX_ITEM_ROWS;

/// A line as an entity the service would accept (see `Entity::check_writable`).
fn writable_line(number: u64, text: &[u8]) -> Result<Entity, ExportFormatError> {
    let entity = decode_line(number, text)?;
    entity
        .check_writable()
        .map_err(|e| ExportFormatError::BadLine {
            line: number,
            message: e.message,
        })?;
    Ok(entity)
}

/// Skips the first `skip` lines of a part (counted, not parsed).
fn skip_lines<R: std::io::Read>(
    lines: &mut PartLines<R>,
    skip: u64,
    rows: u64,
) -> Result<(), ExportFormatError> {
    for done in 0..skip {
        if lines.next_line()?.is_none() {
            return Err(ExportFormatError::RowCountMismatch {
                expected: rows,
                actual: done.to_string(),
            });
        }
    }
    Ok(())
}

/// What a verification slice found: the lines verified so far (from the part's start), whether
/// it reached the end of the part, and the bytes it inflated.
pub(super) struct Verified {
    pub lines: u64,
    pub ended: bool,
    pub inflated: u64,
}

/// Verifies a part's lines `skip + 1 ..` (see the module documentation): checks the SHA-256,
/// skips `skip` lines, then checks each line until the part ends (the row count must then be
/// the manifest's) or `budget` bytes were inflated past the skipped lines.
pub(super) fn verify_lines(
    bytes: &[u8],
    part: &PartRef,
    skip: u64,
    budget: u64,
) -> Result<Verified, ExportFormatError> {
    check_sha256(bytes, &part.sha256)?;
    let mut lines = PartLines::new(bytes, DecodeLimits::default());
    skip_lines(&mut lines, skip, part.rows)?;
    let start = lines.decompressed_bytes();
    let more_than = |rows: u64| ExportFormatError::RowCountMismatch {
        expected: rows,
        actual: format!("more than {rows}"),
    };
    let mut last = skip;
    // Bounded: every line inflates at least one byte, and the slice stops at `budget`.
    while let Some((number, text)) = lines.next_line()? {
        if number > part.rows {
            return Err(more_than(part.rows));
        }
        writable_line(number, text)?;
        last = number;
        let inflated = lines.decompressed_bytes() - start;
        if inflated >= budget && number < part.rows {
            return Ok(Verified {
                lines: number,
                ended: false,
                inflated,
            });
        }
    }
    if last != part.rows {
        return Err(ExportFormatError::RowCountMismatch {
            expected: part.rows,
            actual: last.to_string(),
        });
    }
    Ok(Verified {
        lines: last,
        ended: true,
        inflated: lines.decompressed_bytes() - start,
    })
}

/// A write item's rows: lines `skip + 1 ..` of a part (SHA-256 checked first), at most
/// [`MAX_ITEM_ROWS`] of them and the line that brings them past [`WRITE_ITEM_BYTES`].
pub(super) fn write_slice(
    bytes: &[u8],
    part: &PartRef,
    skip: u64,
) -> Result<Vec<Entity>, ExportFormatError> {
    check_sha256(bytes, &part.sha256)?;
    let mut lines = PartLines::new(bytes, DecodeLimits::default());
    skip_lines(&mut lines, skip, part.rows)?;
    let start = lines.decompressed_bytes();
    let want = part.rows.saturating_sub(skip).min(MAX_ITEM_ROWS as u64);
    let mut rows = Vec::with_capacity(want as usize);
    // Bounded by `want` (at most MAX_ITEM_ROWS).
    while (rows.len() as u64) < want {
        let Some((number, text)) = lines.next_line()? else {
            return Err(ExportFormatError::RowCountMismatch {
                expected: part.rows,
                actual: (skip + rows.len() as u64).to_string(),
            });
        };
        rows.push(writable_line(number, text)?);
        if lines.decompressed_bytes() - start >= WRITE_ITEM_BYTES {
            break;
        }
    }
    Ok(rows)
}
