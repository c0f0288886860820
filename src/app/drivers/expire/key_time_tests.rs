//! The key formats and bounds against the module's invariants: fixed examples (the formats
//! exactly as .NET and Unix write them) and properties over random times, cutoffs, prefixes
//! and suffixes.

use proptest::prelude::*;
use time::macros::datetime;

use super::*;
use crate::storage::compare_keys;

const FORMATS: [KeyFormat; 5] = [
    KeyFormat::Ticks,
    KeyFormat::ReverseTicks,
    KeyFormat::UnixSeconds,
    KeyFormat::UnixMilliseconds,
    KeyFormat::Iso8601,
];

fn kt(format: KeyFormat, prefix: &str) -> KeyTime {
    KeyTime {
        key: TimeKey::PartitionKey,
        format,
        prefix: prefix.to_string(),
    }
}

fn in_range(range: &KeyRange, prefix: &str, key: &str) -> bool {
    key.starts_with(prefix)
        && range
            .after
            .as_ref()
            .map_or(true, |a| compare_keys(key, a).is_gt())
        && range
            .before
            .as_ref()
            .map_or(true, |b| compare_keys(key, b).is_lt())
}

#[test]
fn the_formats_write_what_dotnet_and_unix_write() {
    let at = ticks(datetime!(2024-05-01 12:34:56.789 UTC));
    // new DateTime(2024, 5, 1, 12, 34, 56, 789, DateTimeKind.Utc).Ticks
    assert_eq!(at, 638_501_636_967_890_000);
    assert_eq!(
        format_time(KeyFormat::Ticks, at).unwrap(),
        "0638501636967890000"
    );
    assert_eq!(
        format_time(KeyFormat::ReverseTicks, at).unwrap(),
        "2516877339032109999"
    );
    assert_eq!(
        format_time(KeyFormat::UnixSeconds, at).unwrap(),
        "1714566896"
    );
    assert_eq!(
        format_time(KeyFormat::UnixMilliseconds, at).unwrap(),
        "1714566896789"
    );
    assert_eq!(
        format_time(KeyFormat::Iso8601, at).unwrap(),
        "2024-05-01T12:34:56.7890000Z"
    );
    assert_eq!(ticks(datetime!(0001-01-01 0:00 UTC)), 0);
    assert_eq!(ticks(datetime!(1970-01-01 0:00 UTC)), UNIX_EPOCH_TICKS);
}

#[test]
fn an_iso_key_names_the_period_of_its_precision() {
    let day = kt(KeyFormat::Iso8601, "");
    let start = ticks(datetime!(2024-05-01 0:00 UTC));
    assert_eq!(
        period(&day, "2024-05-01"),
        Some((start, start + 864_000_000_000))
    );
    assert_eq!(period(&day, "2024-05-01_abc").map(|p| p.0), Some(start));
    let hour = ticks(datetime!(2024-05-01 13:00 UTC));
    assert_eq!(
        period(&day, "2024-05-01T13Z|x"),
        Some((hour, hour + 36_000_000_000))
    );
    let second = ticks(datetime!(2024-05-01 13:14:15 UTC));
    assert_eq!(
        period(&day, "2024-05-01T13:14:15.12"),
        Some((second + 1_200_000, second + 1_300_000))
    );
    // Expired once the whole day has ended by the cutoff.
    let cutoff = ticks(datetime!(2024-05-01 23:00 UTC));
    assert_eq!(age(&day, "2024-05-01", cutoff), KeyAge::Live);
    assert_eq!(age(&day, "2024-04-30", cutoff), KeyAge::Expired);
}

#[test]
fn keys_that_hold_no_time_are_unreadable() {
    let cutoff = ticks(datetime!(2030-01-01 0:00 UTC));
    let ticks_key = kt(KeyFormat::Ticks, "log-");
    for key in [
        "0638501636967890000",      // no prefix
        "log-063850125296789000",   // 18 digits
        "log-06385012529678900001", // a 20th digit: the width is ambiguous
        "log-063850125296789000x",  // a letter among the digits
        "log-",
        "log-9999999999999999999", // past DateTime.MaxValue
    ] {
        assert_eq!(age(&ticks_key, key, cutoff), KeyAge::Unreadable, "{key}");
    }
    let iso = kt(KeyFormat::Iso8601, "");
    for key in [
        "2024-13-01",
        "2024-02-30",
        "2024-5-01",
        "20240501",
        "2024-05-011",
        "x",
    ] {
        assert_eq!(age(&iso, key, cutoff), KeyAge::Unreadable, "{key}");
    }
}

/// Keys of one format: the time's text after `prefix`, maybe followed by a suffix that does not
/// start with a digit.
fn key_of(format: KeyFormat, prefix: &str, at: i128, suffix: &str) -> Option<String> {
    Some(format!("{prefix}{}{suffix}", format_time(format, at)?))
}

fn times() -> impl Strategy<Value = i128> {
    // 1970 to 2200: every format writes these.
    UNIX_EPOCH_TICKS..ticks(datetime!(2200-01-01 0:00 UTC))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// A written time reads back as the period holding it.
    #[test]
    fn a_written_time_reads_back(at in times(), f in 0..5usize, prefix in "[a-z]{0,3}", suffix in "(|_[a-z]{0,3}|Z)") {
        let format = FORMATS[f];
        let key = key_of(format, &prefix, at, &suffix).unwrap();
        let (start, end) = period(&kt(format, &prefix), &key).expect("reads back");
        prop_assert!(start <= at && at < end, "{key}: {start}..{end} holds {at}");
    }

    /// Expired exactly when the period holding the key's time has ended by the cutoff, and the
    /// bounds hold every expired key; without a suffix, a digit key is in the bounds exactly
    /// when it is expired.
    #[test]
    fn the_bounds_hold_exactly_the_expired_keys(at in times(), cutoff in times(), f in 0..5usize, prefix in "[a-z]{0,3}", suffix in "(|_[a-z]{0,3})") {
        let format = FORMATS[f];
        let key_time = kt(format, &prefix);
        let key = key_of(format, &prefix, at, &suffix).unwrap();
        let (_, end) = period(&key_time, &key).unwrap();
        let expired = age(&key_time, &key, cutoff) == KeyAge::Expired;
        prop_assert_eq!(expired, end <= cutoff);
        let range = expired_range(&key_time, cutoff);
        let inside = in_range(&range, &prefix, &key);
        if expired {
            prop_assert!(inside, "{} expired at {} but outside {:?}", key, cutoff, range);
        }
        if suffix.is_empty() && format != KeyFormat::Iso8601 {
            prop_assert_eq!(inside, expired, "{} at {}: {:?}", key, cutoff, range);
        }
    }

    /// Whatever the text, a key is expired only if its period ended by the cutoff, and then it
    /// is inside the bounds.
    #[test]
    fn no_text_is_expired_outside_the_bounds(text in "[0-9:.TZ_a-]{0,32}", cutoff in times(), f in 0..5usize) {
        let key_time = kt(FORMATS[f], "");
        if age(&key_time, &text, cutoff) == KeyAge::Expired {
            let (_, end) = period(&key_time, &text).unwrap();
            prop_assert!(end <= cutoff);
            prop_assert!(in_range(&expired_range(&key_time, cutoff), "", &text), "{}", text);
        }
    }

    /// Key order is time order within a format (same prefix, no suffix).
    #[test]
    fn key_order_is_time_order(a in times(), b in times(), f in 0..4usize) {
        let format = FORMATS[f];
        let (ka, kb) = (key_of(format, "", a, "").unwrap(), key_of(format, "", b, "").unwrap());
        let (pa, pb) = (period(&kt(format, ""), &ka).unwrap().0, period(&kt(format, ""), &kb).unwrap().0);
        let by_key = compare_keys(&ka, &kb);
        let by_time = if format == KeyFormat::ReverseTicks { pb.cmp(&pa) } else { pa.cmp(&pb) };
        prop_assert_eq!(by_key, by_time);
    }
}
