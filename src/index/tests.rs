//! Property tests of the index against a plain set: no false negatives, ever.

use std::collections::HashSet;

use super::*;

fn keys(i: usize) -> KeyBounds {
    let first = format!("p{i:06}");
    KeyBounds::new((&first, "a"), (&first, "z"))
}

#[test]
fn every_staged_value_is_a_candidate_of_its_range() {
    let ranges: Vec<StagedRange> = (0..20)
        .map(|i| {
            let values: Vec<IndexValue> = (0..(i * 37 % 500))
                .map(|n| IndexValue::Int64((i * 1000 + n) as i64))
                .collect();
            StagedRange::from_values(keys(i), &values)
        })
        .collect();
    let bytes = build_segment(&ranges).unwrap();
    let dir = SegmentDirectory::parse(&bytes).unwrap();
    for (i, range) in ranges.iter().enumerate() {
        for &h in &range.hashes {
            let [(o1, l1), (o2, l2)] = dir.bucket_spans_for_hash(h);
            let row1 = &bytes[o1 as usize..(o1 + l1) as usize];
            let row2 = &bytes[o2 as usize..(o2 + l2) as usize];
            let found: HashSet<usize> = dir
                .candidates_for_hash(h, row1, row2)
                .unwrap()
                .into_iter()
                .collect();
            assert!(found.contains(&i));
        }
    }
}
