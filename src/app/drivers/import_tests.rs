//! Unit tests of [`super`]: how write failures are classified and named.

use super::*;

#[test]
fn write_failures_are_permanent_but_for_transient_answers_and_name_the_row() {
    let row = Entity::new("p", "r7");
    let ops = [
        BatchOperation::Upsert(Entity::new("p", "r6")),
        BatchOperation::Upsert(row),
    ];
    let mut refused = StorageError::from_status(400, Some("InvalidInput".into()), "bad value");
    refused.failed_operation = Some(1);
    let e = write_failed("c/x", (1, 2), 0, name_failed_row(refused, &ops));
    assert!(e.is_permanent(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("row (\"p\", \"r7\")") && text.contains("0 of them"),
        "{text}"
    );
    for status in [403, 404, 409, 413] {
        let e = write_failed(
            "c/x",
            (1, 2),
            1,
            StorageError::from_status(status, None, "no"),
        );
        assert!(e.is_permanent(), "{status}: {e}");
    }
    for status in [408, 429, 500, 503] {
        let e = write_failed(
            "c/x",
            (1, 2),
            1,
            StorageError::from_status(status, None, "busy"),
        );
        assert!(!e.is_permanent(), "{status}: {e}");
    }
}

/// The decoder's memory, counted: every byte allocated and not yet freed on the test's thread
/// (a counting global allocator of this test binary), so a decoder that kept what it inflated
/// (a `read_to_end`, rows beyond its item) shows as a count, deterministically, instead of as
/// the handler's RSS (measured by `tests/scans/backups/verify.rs`, docs/development.md).
mod memory {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::io::Write;

    use super::super::decode::{verify_lines, write_slice};
    use super::super::{PartRef, VERIFY_SLICE_BYTES, WRITE_ITEM_BYTES};
    use crate::app::export_format::{sha256_hex, ExportFormatError, MAX_PART_DECOMPRESSED_BYTES};

    /// The system allocator, counting per thread (other tests' threads count their own).
    struct Counting;

    thread_local! {
        static LIVE: Cell<i64> = const { Cell::new(0) };
        static PEAK: Cell<i64> = const { Cell::new(0) };
    }

    fn count(delta: i64) {
        // `try_with`: nothing to count on a thread whose locals are gone (its exit).
        let _ = LIVE.try_with(|live| {
            let now = live.get() + delta;
            live.set(now);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
        });
    }

    // SAFETY: every call is the system allocator's, with the caller's arguments.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let p = System.alloc(layout);
            if !p.is_null() {
                count(layout.size() as i64);
            }
            p
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            let p = System.alloc_zeroed(layout);
            if !p.is_null() {
                count(layout.size() as i64);
            }
            p
        }
        unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
            System.dealloc(p, layout);
            count(-(layout.size() as i64));
        }
        unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
            let q = System.realloc(p, layout, size);
            if !q.is_null() {
                count(size as i64 - layout.size() as i64);
            }
            q
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// `f`'s result and the most bytes held on this thread while it ran, over what was held
    /// when it started.
    fn peak_bytes<R>(f: impl FnOnce() -> R) -> (R, u64) {
        let base = LIVE.with(Cell::get);
        PEAK.with(|peak| peak.set(base));
        let result = f();
        (result, (PEAK.with(Cell::get) - base) as u64)
    }

    const MIB: u64 = 1024 * 1024;

    /// A part of `members` copies of one gzip member holding `block` (an export's reader
    /// takes concatenated members as one stream): a bomb costs one compression of `block`.
    fn repeated(block: &str, members: usize, rows: u64) -> (Vec<u8>, PartRef) {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(block.as_bytes()).unwrap();
        let member = gz.finish().unwrap();
        let bytes = member.repeat(members);
        let part = PartRef {
            name: "parts/s1/x.jsonl.gz".into(),
            rows,
            bytes: bytes.len() as u64,
            sha256: sha256_hex(&bytes),
        };
        (bytes, part)
    }

    /// 1,024 lines of about 1 KiB each.
    fn kib_lines() -> String {
        let line = format!(
            r#"{{"PartitionKey":"p","RowKey":"r","S":"{}"}}"#,
            "x".repeat(1000)
        ) + "\n";
        line.repeat(1024)
    }

    /// The crafted part of `tests/scans/backups/verify.rs` (1 KiB lines past the 256 MiB bound,
    /// listed as 10^9 rows): a verification slice inflates its 64 MiB holding one line and the
    /// inflater's buffers, and the slice that reaches the bound fails there holding no more.
    /// Each holds under 1 MiB (the documented bound: one line, here 1 KiB, and the inflater).
    #[test]
    fn a_bomb_is_inflated_holding_one_line_and_the_inflaters_buffers() {
        let block = kib_lines();
        let members = (300 * MIB) as usize / block.len();
        let (bytes, part) = repeated(&block, members, 1_000_000_000);
        let (slice, first) = peak_bytes(|| verify_lines(&bytes, &part, 0, VERIFY_SLICE_BYTES));
        let slice = slice.unwrap();
        assert!(
            !slice.ended && slice.inflated >= VERIFY_SLICE_BYTES,
            "{}",
            slice.inflated
        );
        // The last slice: it skips (counts) the lines its parents checked, then inflates up to
        // the bound.
        let skip = MAX_PART_DECOMPRESSED_BYTES / (block.len() as u64 / 1024) - 1024;
        let (last, at_bound) = peak_bytes(|| verify_lines(&bytes, &part, skip, VERIFY_SLICE_BYTES));
        println!(
            "bomb of {} bytes: the first slice inflated {} MiB holding at most {first} bytes, \
             the last slice held at most {at_bound} bytes",
            bytes.len(),
            slice.inflated / MIB
        );
        assert!(
            matches!(last, Err(ExportFormatError::TooLarge { .. })),
            "{:?}",
            last.err()
        );
        for held in [first, at_bound] {
            assert!(held < MIB, "{held} bytes held");
        }
    }

    /// The worst part a write item reads: lines that barely compress (two 29 KB random strings
    /// each, as in `tests/scans/backups/verify.rs`), more of them than one item takes. The
    /// item stops after the line that brings it past [`WRITE_ITEM_BYTES`] and holds its rows
    /// (kept as the JSON text of their values), one line and the inflater: under 1 MiB more
    /// (8.57 MB held for 8.39 MB of lines).
    #[test]
    fn a_write_item_holds_its_own_rows_and_no_more() {
        use base64::Engine;
        use rand::{RngCore, SeedableRng};
        let mut random = rand::rngs::StdRng::seed_from_u64(28);
        let mut noise = vec![0u8; 22_000];
        let mut text = String::new();
        let mut rows = 0;
        while (text.len() as u64) < 12 * MIB {
            let mut value = || {
                random.fill_bytes(&mut noise);
                base64::engine::general_purpose::STANDARD.encode(&noise)
            };
            let (v, w) = (value(), value());
            text += &format!(r#"{{"PartitionKey":"p{rows:04}","RowKey":"r","V":"{v}","W":"{w}"}}"#);
            text.push('\n');
            rows += 1;
        }
        let (bytes, part) = repeated(&text, 1, rows);
        drop(text);
        let (slice, held) = peak_bytes(|| write_slice(&bytes, &part, 0));
        let slice = slice.unwrap();
        println!(
            "dense part: {rows} rows, {} bytes stored; a write item took {} rows holding at most {held} bytes",
            bytes.len(),
            slice.len()
        );
        assert!(
            slice.len() < rows as usize,
            "{} of {rows} rows",
            slice.len()
        );
        assert!(held < WRITE_ITEM_BYTES + MIB, "{held} bytes held");
    }
}
