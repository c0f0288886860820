//! Key ordering as Azure Table Storage (and Azurite) sort: ordinal over UTF-16 code units.
//!
//! Rust's `str` ordering is by code point (UTF-8 bytes), which puts U+E000..U+FFFF *below*
//! supplementary characters; UTF-16 order puts them above (their units beat surrogates D800..DFFF). Never compare keys with `<` on `str`.

use std::cmp::Ordering;

/// Compares two keys the way the Table service does: UTF-16 code unit by code unit.
///
/// Computed on the UTF-8 bytes without re-encoding. Byte order is code point order, and the two
/// orders differ only where the strings first differ by a supplementary character (lead byte
/// F0..F4) against one of U+E000..U+FFFF (lead byte EE or EF): there the supplementary
/// character is a surrogate pair (D800..DBFF first) and sorts below in UTF-16. The first
/// differing byte is either a lead byte in both strings (they share every character before it)
/// or a continuation byte of two characters with the same lead byte, which are then both
/// supplementary or both from the same BMP block, ordered alike either way.
pub fn compare_keys(a: &str, b: &str) -> Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    match x.iter().zip(y).position(|(p, q)| p != q) {
        None => x.len().cmp(&y.len()),
        Some(i) => {
            let (p, q) = (x[i], y[i]);
            let high_bmp = |c: u8| c == 0xEE || c == 0xEF;
            if p >= 0xF0 && high_bmp(q) {
                Ordering::Less
            } else if q >= 0xF0 && high_bmp(p) {
                Ordering::Greater
            } else {
                p.cmp(&q)
            }
        }
    }
}

/// The lesser of two keys in UTF-16 order.
pub fn min_key<'a>(a: &'a str, b: &'a str) -> &'a str {
    if compare_keys(a, b).is_le() {
        a
    } else {
        b
    }
}

/// The next character after `c` in UTF-16 order, or `None` for U+FFFF (the greatest).
/// UTF-16 order of characters is U+0000..U+D7FF, then U+10000..U+10FFFF (surrogate pairs,
/// lead units D800..DBFF), then U+E000..U+FFFF.
pub fn next_char_utf16(c: char) -> Option<char> {
    match c as u32 {
        0xD7FF => char::from_u32(0x10000),
        0x10FFFF => char::from_u32(0xE000),
        0xFFFF => None,
        n => char::from_u32(n + 1),
    }
}

/// The exact successor bound of a prefix: the smallest valid string greater (in UTF-16 order)
/// than every string that starts with `prefix`. `None` means no such string exists (the prefix is
/// empty or made only of U+FFFF), i.e. the range is unbounded above.
///
/// This replaces the reference design's `prefix + '\u{FFFF}'` sentinel, which is *not* above keys
/// that continue with U+FFFF and so makes prefix discovery loop forever on them.
pub fn key_successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        if let Some(next) = next_char_utf16(last) {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_order_differs_from_str_order_for_supplementary_characters() {
        let bmp_high = "\u{FFFF}";
        let supplementary = "\u{1F600}";
        assert!(
            bmp_high < supplementary,
            "str order puts U+FFFF below U+1F600"
        );
        assert_eq!(compare_keys(bmp_high, supplementary), Ordering::Greater);
        assert_eq!(compare_keys("\u{E000}", "\u{10000}"), Ordering::Greater);
        assert_eq!(compare_keys("\u{D7FF}", "\u{10000}"), Ordering::Less);
    }

    #[test]
    fn byte_comparison_equals_utf16_comparison() {
        use rand::{Rng, SeedableRng};
        // Characters from every block whose order matters: ASCII, 2- and 3-byte BMP, the top of
        // the BMP (U+E000..U+FFFF), around the surrogate gap, and supplementary planes.
        let alphabet = [
            'a',
            'b',
            'z',
            '\u{7F}',
            '\u{80}',
            '\u{7FF}',
            '\u{800}',
            '\u{D7FF}',
            '\u{E000}',
            '\u{E001}',
            '\u{F8FF}',
            '\u{FFFF}',
            '\u{10000}',
            '\u{10001}',
            '\u{1F600}',
            '\u{10FFFF}',
            '\u{0}',
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let word = |rng: &mut rand::rngs::StdRng| -> String {
            (0..rng.gen_range(0..5))
                .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                .collect()
        };
        for _ in 0..200_000 {
            let common = word(&mut rng);
            let a = format!("{common}{}", word(&mut rng));
            let b = format!("{common}{}", word(&mut rng));
            assert_eq!(
                compare_keys(&a, &b),
                a.encode_utf16().cmp(b.encode_utf16()),
                "{a:?} vs {b:?}"
            );
        }
    }

    #[test]
    fn successor_is_above_every_extension_and_minimal() {
        assert_eq!(key_successor(""), None);
        assert_eq!(key_successor("\u{FFFF}\u{FFFF}"), None);
        assert_eq!(key_successor("ab").as_deref(), Some("ac"));
        assert_eq!(key_successor("a\u{FFFF}").as_deref(), Some("b"));
        assert_eq!(key_successor("a\u{D7FF}").as_deref(), Some("a\u{10000}"));
        assert_eq!(key_successor("a\u{10FFFF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(key_successor("a\u{103FF}").as_deref(), Some("a\u{10400}"));
        for prefix in ["D", "a\u{D7FF}", "x\u{10FFFF}", "q\u{FFFF}", "\u{1F600}"] {
            let succ = key_successor(prefix).unwrap();
            for suffix in [
                "",
                "\u{FFFF}",
                "\u{FFFF}\u{FFFF}",
                "\u{10FFFF}",
                "zz",
                "\u{0}",
            ] {
                let key = format!("{prefix}{suffix}");
                assert_eq!(
                    compare_keys(&key, &succ),
                    Ordering::Less,
                    "{key:?} < {succ:?}"
                );
            }
            assert!(!succ.starts_with(prefix));
        }
    }

    #[test]
    fn next_char_walks_utf16_order() {
        assert_eq!(next_char_utf16('a'), Some('b'));
        assert_eq!(next_char_utf16('\u{D7FF}'), Some('\u{10000}'));
        assert_eq!(next_char_utf16('\u{10FFFF}'), Some('\u{E000}'));
        assert_eq!(next_char_utf16('\u{FFFF}'), None);
    }
}
