//! The index against a plain set: no false negatives, ever; the files' round trips and
//! refusals; the false-positive rate and size against the theory (figures in
//! docs/index-format.md).

use std::collections::HashSet;

use proptest::prelude::*;

use super::hash::{alternate_bucket, Placement};
use super::value_tests::any_value;
use super::*;

fn keys(i: usize) -> KeyBounds {
    let pk = format!("p{i:06}");
    KeyBounds::new((&pk, "a"), (&pk, "z"))
}

/// The candidate ranges of a hash, read from a whole segment's bytes as a lookup would: the
/// two spans only.
fn lookup(bytes: &[u8], dir: &SegmentDirectory, hash: u64) -> Vec<usize> {
    let [(o1, l1), (o2, l2)] = dir.bucket_spans_for_hash(hash);
    let span = |o: u64, l: u64| &bytes[o as usize..(o + l) as usize];
    dir.candidates_for_hash(hash, span(o1, l1), span(o2, l2))
        .unwrap()
}

/// Builds a segment of these ranges' values and checks every range holding a probe (by the
/// plain set) is among the probe's candidates; returns the false candidates seen.
fn check_no_false_negatives(ranges: &[Vec<IndexValue>], probes: &[IndexValue]) -> usize {
    let staged: Vec<StagedRange> = ranges
        .iter()
        .enumerate()
        .map(|(i, values)| StagedRange::from_values(keys(i), values))
        .collect();
    let bytes = build_segment(&staged).unwrap();
    let dir = SegmentDirectory::parse(&bytes).unwrap();
    assert_eq!(dir.segment_len(), bytes.len() as u64);
    let sets: Vec<HashSet<&IndexValue>> = ranges.iter().map(|r| r.iter().collect()).collect();
    let mut false_candidates = 0;
    for probe in ranges.iter().flatten().chain(probes) {
        let found = lookup(&bytes, &dir, probe.index_hash());
        for (i, set) in sets.iter().enumerate() {
            let holds = set.contains(probe);
            assert!(!holds || found.contains(&i), "range {i} holds {probe}");
            false_candidates += usize::from(!holds && found.contains(&i));
        }
    }
    false_candidates
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn no_false_negatives_against_a_plain_set(
        ranges in proptest::collection::vec(proptest::collection::vec(any_value(), 0..200), 1..12),
        probes in proptest::collection::vec(any_value(), 0..50),
    ) {
        check_no_false_negatives(&ranges, &probes);
    }
}

/// The values no canonicalisation may split, in every range, with duplicates.
fn tricky_values() -> Vec<IndexValue> {
    use IndexValue::*;
    vec![
        String(std::string::String::new()),
        String("'".into()),
        String("日本語 🎉 \u{FFFD}".into()),
        String("a\u{0}b".into()),
        Int32(i32::MIN),
        Int32(i32::MAX),
        Int32(0),
        Int64(i64::MIN),
        Int64(i64::MAX),
        Int64(0),
        Double(0.0),
        Double(-0.0),
        Double(f64::NAN),
        Double(f64::INFINITY),
        Double(f64::NEG_INFINITY),
        Double(3.0),
        Boolean(true),
        Boolean(false),
        DateTime(0),
        DateTime(1),
        DateTime(-116_444_736_000_000_000),
        Guid([0; 16]),
        Guid([0xFF; 16]),
        Binary(vec![]),
        Binary(vec![0]),
    ]
}

#[test]
fn tricky_values_are_found_in_every_range_that_holds_them() {
    let tricky = tricky_values();
    let mut ranges: Vec<Vec<IndexValue>> = (0..6).map(|_| tricky.clone()).collect();
    ranges[1].extend(tricky.iter().cloned()); // duplicates: stored once
    ranges[2].push(IndexValue::from_literal("-0.0").unwrap());
    ranges[3] = tricky[..3].to_vec();
    ranges.push(Vec::new());
    check_no_false_negatives(&ranges, &[IndexValue::Double(-0.0), IndexValue::Int32(3)]);
    assert_eq!(
        StagedRange::from_values(keys(0), &ranges[1]).hashes.len(),
        tricky.len() - 1,
        "duplicates and -0.0 = 0.0 are stored once"
    );
}

/// The filters' own seeded generator, for the bigger tests.
use super::filter::SplitMix64 as Seeded;

#[test]
fn ranges_of_very_different_sizes_have_no_false_negatives() {
    let mut rng = Seeded(29);
    let sizes = [0usize, 1, 2, 7, 60, 300, 1000, 4000, 9000, 3, 2500];
    let ranges: Vec<Vec<IndexValue>> = sizes
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| match rng.next() % 4 {
                    0 => IndexValue::String(format!("v{}", rng.next() % 20_000)),
                    1 => IndexValue::Int64((rng.next() % 20_000) as i64),
                    2 => IndexValue::Double((rng.next() % 20_000) as f64),
                    _ => IndexValue::Guid(u128::from(rng.next() % 20_000).to_le_bytes()),
                })
                .collect()
        })
        .collect();
    let probes: Vec<IndexValue> = (0..20_000).map(IndexValue::Int32).collect();
    let false_candidates = check_no_false_negatives(&ranges, &probes);
    let pairs = (ranges.iter().map(Vec::len).sum::<usize>() + probes.len()) * ranges.len();
    assert!(
        (false_candidates as f64) < 2e-4 * pairs as f64,
        "{false_candidates} of {pairs}"
    );
}

#[test]
fn a_range_that_cannot_fit_is_a_candidate_for_everything() {
    // 200 distinct fingerprints whose buckets are all bucket 0: no bucket size up to the
    // maximum holds them, so the range is stored as "always a candidate", never dropped.
    let buckets = bucket_count(&[200]);
    let hashes: Vec<u64> = (1..=u16::MAX)
        .filter(|&fp| alternate_bucket(0, fp, buckets) == 0)
        .map(|fp| u64::from(fp - 1) << 32)
        .take(200)
        .collect();
    assert_eq!(hashes.len(), 200);
    assert!(hashes
        .iter()
        .all(|&h| Placement::of(h, buckets).bucket2 == 0));
    let ranges = vec![
        StagedRange::new(keys(0), 200, hashes.clone()),
        StagedRange::new(keys(1), 1, vec![12345]),
    ];
    let bytes = build_segment(&ranges).unwrap();
    let dir = SegmentDirectory::parse(&bytes).unwrap();
    assert_eq!(dir.buckets, buckets);
    assert!(dir.ranges()[0].always_candidate && dir.ranges()[0].bucket_size == 0);
    assert!(!dir.ranges()[1].always_candidate);
    for h in hashes.iter().copied().chain([12345, 999]) {
        assert!(lookup(&bytes, &dir, h).contains(&0));
    }
    assert_eq!(lookup(&bytes, &dir, 12345), vec![0, 1]);
}

#[test]
fn the_directory_reads_back_from_a_prefix() {
    let ranges: Vec<StagedRange> = (0..5)
        .map(|i| StagedRange::new(keys(i), 10 * i as u64, (0..i as u64 * 30).collect()))
        .collect();
    let bytes = build_segment(&ranges).unwrap();
    let len = SegmentDirectory::directory_len(&bytes[..DIRECTORY_FIXED_LEN]).unwrap();
    let dir = SegmentDirectory::parse(&bytes[..len]).unwrap();
    assert_eq!(dir, SegmentDirectory::parse(&bytes).unwrap());
    assert_eq!(dir.directory_len, len as u64);
    assert_eq!(dir.segment_len(), bytes.len() as u64);
    for (entry, range) in dir.ranges().iter().zip(&ranges) {
        assert_eq!(entry.keys, range.keys);
        assert_eq!(entry.rows, range.rows);
        assert_eq!(entry.distinct as usize, range.hashes.len());
        assert!(!entry.always_candidate);
    }
    assert_eq!(
        dir.ranges()[0].bucket_size,
        0,
        "an empty range has no slots"
    );
    assert!(SegmentDirectory::parse(&bytes[..len - 1])
        .unwrap_err()
        .to_string()
        .contains("directory is"));
    let err = |b: &[u8]| SegmentDirectory::parse(b).unwrap_err().to_string();
    let mut corrupt = bytes.clone();
    corrupt[40] ^= 1;
    assert!(err(&corrupt).contains("checksum"));
    let mut version = bytes.clone();
    version[8] = 2;
    assert!(err(&version).contains("version 2"));
    let mut hash = bytes.clone();
    hash[10] = 9;
    assert!(err(&hash).contains("hash id 9"));
    assert!(err(b"TSIDXSTG").contains("not an index segment"));
    // The reserved field and unknown flag bits are refused, not ignored.
    let resealed = |at: usize| {
        let mut b = bytes[..len].to_vec();
        b[at] = 1;
        let sum = hash::value_hash(&b[..len - 8]);
        b[len - 8..].copy_from_slice(&sum.to_le_bytes());
        err(&b)
    };
    assert!(resealed(28).contains("reserved field 1"));
    assert!(resealed(DIRECTORY_FIXED_LEN + 4 + 1).contains("flags 0x100"));
    let [(_, row), _] = dir.bucket_spans_for_hash(7);
    assert!(dir
        .candidates_for_hash(7, &[0; 3], &vec![0; row as usize])
        .is_err());
}

#[test]
fn segments_refuse_ranges_out_of_order_or_over_the_bounds() {
    let range = |first: (&str, &str), last: (&str, &str)| {
        StagedRange::new(KeyBounds::new(first, last), 1, vec![1])
    };
    let say = |ranges: &[StagedRange]| build_segment(ranges).unwrap_err().to_string();
    assert!(say(&[range(("b", ""), ("a", ""))]).contains("ends before it starts"));
    let a = range(("a", "1"), ("a", "5"));
    assert!(say(&[a.clone(), range(("a", "5"), ("b", ""))]).contains("key order"));
    assert!(say(&[range(("b", ""), ("c", "")), a.clone()]).contains("key order"));
    let unsorted = StagedRange {
        hashes: vec![2, 1],
        ..a.clone()
    };
    assert!(say(&[unsorted]).contains("ascending"));
    let many = vec![StagedRange::default(); MAX_SEGMENT_RANGES + 1];
    assert!(say(&many).contains("at most"));
    // Key order is the service's (UTF-16): U+FFFD sorts above U+10000.
    build_segment(&[
        range(("\u{10000}", ""), ("\u{10000}", "")),
        range(("\u{FFFD}", ""), ("\u{FFFD}", "")),
    ])
    .unwrap();
    build_segment(&[]).unwrap();
}

#[test]
fn staging_records_round_trip_and_refuse_damage() {
    let values = tricky_values();
    let ranges = vec![
        StagedRange::from_values(KeyBounds::new(("p", "r1"), ("p", "r9")), &values),
        StagedRange::new(
            KeyBounds::new(("q\u{1F600}", ""), ("q\u{1F600}", "'")),
            0,
            vec![],
        ),
    ];
    assert_eq!(ranges[0].rows, values.len() as u64);
    let bytes = encode_staging(&ranges).unwrap();
    assert_eq!(decode_staging(&bytes).unwrap(), ranges);
    let err = |b: &[u8]| decode_staging(b).unwrap_err().to_string();
    let mut corrupt = bytes.clone();
    corrupt[20] ^= 1;
    assert!(err(&corrupt).contains("checksum"));
    assert!(err(&bytes[..bytes.len() - 1]).contains("checksum"));
    assert!(err(&[]).contains("shorter"));
    let unsorted = StagedRange {
        hashes: vec![2, 1],
        ..StagedRange::default()
    };
    assert!(encode_staging(&[unsorted]).is_err());
    let many = vec![StagedRange::default(); MAX_STAGING_RANGES + 1];
    assert!(encode_staging(&many)
        .unwrap_err()
        .to_string()
        .contains("at most"));
    let long = StagedRange::new(
        KeyBounds::new((&"k".repeat(MAX_KEY_BYTES + 1), ""), ("", "")),
        0,
        vec![],
    );
    assert!(encode_staging(&[long]).is_err());
}

/// What the false-positive measurement found.
struct Measured {
    rate: f64,
    theory: f64,
    bytes_per_row: f64,
    buckets: u32,
    bucket_sizes: Vec<u32>,
}

impl Measured {
    fn report(&self) -> String {
        let mut sizes = std::collections::BTreeMap::<u32, usize>::new();
        for &b in &self.bucket_sizes {
            *sizes.entry(b).or_default() += 1;
        }
        format!(
            "false-positive rate {:.3e} (theory {:.3e}, {:+.1}%), {:.3} bytes/row, B = {}, \
             ranges per bucket size {sizes:?}",
            self.rate,
            self.theory,
            100.0 * (self.rate / self.theory - 1.0),
            self.bytes_per_row,
            self.buckets
        )
    }
}

/// Builds one segment of `sizes[i]` distinct Int64 values per range, probes it with `probes`
/// absent values, and compares the rate of false candidates per (probe, range) with the
/// theory: a probe meets each occupied slot of its two buckets with probability 1/65535.
fn measure(sizes: &[u64], probes: u64) -> Measured {
    let mut next = 0i64;
    let ranges: Vec<StagedRange> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let values: Vec<IndexValue> = (0..n)
                .map(|_| {
                    IndexValue::Int64({
                        next += 1;
                        next
                    })
                })
                .collect();
            StagedRange::from_values(keys(i), &values)
        })
        .collect();
    let bytes = build_segment(&ranges).unwrap();
    let dir = SegmentDirectory::parse(&bytes).unwrap();
    let mut false_candidates = 0u64;
    for k in 0..probes {
        let probe = IndexValue::Int64(-1 - k as i64); // never staged: staged values are > 0
        false_candidates += lookup(&bytes, &dir, probe.index_hash()).len() as u64;
    }
    let body = &bytes[dir.directory_len as usize..];
    let occupied = body.chunks_exact(2).filter(|s| s != &[0, 0]).count() as f64;
    let theory = 2.0 * occupied / f64::from(dir.buckets) / 65535.0 / sizes.len() as f64;
    Measured {
        rate: false_candidates as f64 / (probes * sizes.len() as u64) as f64,
        theory,
        bytes_per_row: bytes.len() as f64 / sizes.iter().sum::<u64>() as f64,
        buckets: dir.buckets,
        bucket_sizes: dir.ranges().iter().map(|r| r.bucket_size).collect(),
    }
}

/// The goal on 200 ranges of 2,000 distinct values, probed with 10^5 absent values: about
/// 1,000 false candidates are expected, so the 20 % band around the theory is several standard
/// deviations wide; values and probes are fixed, so the figure is the same on every run.
#[test]
fn false_positive_rate_and_size_meet_the_goals() {
    let m = measure(&[2000; 200], 100_000);
    eprintln!("200 ranges x 2,000 values: {}", m.report());
    assert!(m.rate <= 1e-4, "{}", m.report());
    assert!((m.rate / m.theory - 1.0).abs() <= 0.2, "{}", m.report());
    assert!(m.bytes_per_row <= 3.0, "{}", m.report());
}

/// The goal's own measurement, 10^6 absent probes (two minutes in a debug build; a measurement:
/// `cargo test --release -- --ignored`, docs/development.md).
#[test]
#[ignore = "measurement: the false-positive rate on 10^6 probes"]
fn false_positive_rate_on_a_million_probes() {
    let m = measure(&[2000; 200], 1_000_000);
    eprintln!("200 ranges x 2,000 values, 10^6 probes: {}", m.report());
    assert!(m.rate <= 1e-4, "{}", m.report());
    assert!((m.rate / m.theory - 1.0).abs() <= 0.2, "{}", m.report());
}

/// Ranges of mixed sizes (1,000 to 3,000 values, seeded): the rate stays within the goal and
/// the theory; the size grows, because every range shares the biggest one's bucket count.
#[test]
fn ranges_of_mixed_sizes_stay_within_the_rate() {
    let mut rng = Seeded(2029);
    let sizes: Vec<u64> = (0..200).map(|_| 1000 + rng.next() % 2001).collect();
    let m = measure(&sizes, 50_000);
    eprintln!("200 ranges x 1,000..3,000 values: {}", m.report());
    assert!(m.rate <= 1e-4, "{}", m.report());
    assert!((m.rate / m.theory - 1.0).abs() <= 0.2, "{}", m.report());
}
