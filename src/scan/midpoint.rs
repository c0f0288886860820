//! A key strictly between two keys in the Table service's order (UTF-16 code units), to split a
//! range in two when nothing in it can be read to split at.

use crate::storage::compare_keys;

/// The rank of a character in UTF-16 order: U+0000..U+D7FF, then U+10000..U+10FFFF, then
/// U+E000..U+FFFF, numbered from 0 without gaps.
fn utf16_rank(c: char) -> u32 {
    match c as u32 {
        n @ 0..=0xD7FF => n,
        n @ 0x1_0000..=0x10_FFFF => n - 0x1_0000 + 0xD800,
        n => n - 0xE000 + 0xD800 + 0x10_0000,
    }
}

/// The number of characters (ranks are `0..RANKS`).
const RANKS: u32 = 0xD800 + 0x10_0000 + 0x2000;

fn char_of_rank(r: u32) -> char {
    let n = match r {
        0..=0xD7FF => r,
        0xD800..=0x10_D7FF => r - 0xD800 + 0x1_0000,
        _ => r - 0xD800 - 0x10_0000 + 0xE000,
    };
    char::from_u32(n).expect("ranks map to characters")
}

/// A key strictly between `a` and `b` in UTF-16 order (`b: None` is unbounded above), about
/// halfway at the first character where they differ; `None` if there is none (`b <= a`, or `b`
/// is `a` followed by U+0000). Uses U+0000 only when `b` forces it.
pub(crate) fn key_between(a: &str, b: Option<&str>) -> Option<String> {
    if b.is_some_and(|b| compare_keys(a, b).is_ge()) {
        return None;
    }
    // While `bounded`, the key so far equals both `a` and `b` up to `i`; afterwards it is
    // already below `b`, and only `a` bounds the rest.
    let mut bounded = b.is_some();
    let a: Vec<u32> = a.chars().map(utf16_rank).collect();
    let b: Vec<u32> = b.map_or_else(Vec::new, |b| b.chars().map(utf16_rank).collect());
    let mut out: Vec<u32> = Vec::new();
    let mut i = 0;
    loop {
        let high = if bounded { *b.get(i)? } else { RANKS };
        match a.get(i) {
            // `b` goes on after a U+0000 here: that U+0000 alone is a key between.
            None if high == 0 => {
                out.push(0);
                if b.len() > i + 1 {
                    break;
                }
                return None;
            }
            None => {
                out.push(high / 2);
                break;
            }
            Some(&low) if bounded && low == high => out.push(low),
            Some(&low) if high - low >= 2 => {
                out.push(low + (high - low) / 2);
                break;
            }
            Some(&low) => {
                out.push(low);
                bounded = false;
            }
        }
        i += 1;
    }
    Some(out.into_iter().map(char_of_rank).collect())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::{prop, prop_assert, proptest, ProptestConfig};
    use proptest::strategy::Strategy as _;

    /// Keys from pieces that sit at the edges of UTF-16 order.
    pub(in crate::scan) fn key() -> impl proptest::strategy::Strategy<Value = String> {
        let parts = prop::sample::select(vec![
            "",
            "\0",
            "\u{1}",
            "a",
            "b",
            "az",
            "\u{D7FF}",
            "\u{E000}",
            "\u{FFFF}",
            "\u{10000}",
            "\u{1F600}",
            "\u{10FFFF}",
            "é",
        ]);
        prop::collection::vec(parts, 0..5).prop_map(|p| p.concat())
    }

    #[test]
    fn ranks_follow_utf16_order() {
        let chars = [
            '\0',
            'a',
            '\u{D7FF}',
            '\u{10000}',
            '\u{1F600}',
            '\u{10FFFF}',
            '\u{E000}',
            '\u{FFFF}',
        ];
        for w in chars.windows(2) {
            assert!(utf16_rank(w[0]) < utf16_rank(w[1]), "{w:?}");
            assert!(compare_keys(&w[0].to_string(), &w[1].to_string()).is_lt());
        }
        assert_eq!(utf16_rank('\u{FFFF}'), RANKS - 1);
        for c in chars {
            assert_eq!(char_of_rank(utf16_rank(c)), c);
        }
    }

    #[test]
    fn key_between_edge_cases() {
        assert_eq!(key_between("a", Some("a\0")), None);
        assert_eq!(key_between("a", Some("a")), None);
        assert_eq!(key_between("b", Some("a")), None);
        assert_eq!(key_between("", Some("")), None);
        let m = key_between("a", Some("b")).unwrap();
        assert!(compare_keys("a", &m).is_lt() && compare_keys(&m, "b").is_lt());
        assert!(!m.contains('\0'), "{m:?}");
        let m = key_between("\u{FFFF}\u{FFFF}", None).unwrap();
        assert!(compare_keys("\u{FFFF}\u{FFFF}", &m).is_lt());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn key_between_is_strictly_between(a in key(), b in prop::option::of(key())) {
            match key_between(&a, b.as_deref()) {
                Some(m) => {
                    prop_assert!(compare_keys(&a, &m).is_lt(), "{:?} !< {:?}", a, m);
                    if let Some(b) = &b {
                        prop_assert!(compare_keys(&m, b).is_lt(), "{:?} !< {:?}", m, b);
                        // U+0000 only where `b` forces it.
                        prop_assert!(!m.contains('\0') || b.contains(['\0', '\u{1}']), "{:?}", m);
                    } else {
                        prop_assert!(!m.contains('\0'), "{:?}", m);
                    }
                }
                None => {
                    let b = b.expect("an unbounded range always has a middle");
                    let adjacent = b == format!("{}\0", a);
                    prop_assert!(compare_keys(&a, &b).is_ge() || adjacent);
                }
            }
        }
    }
}
