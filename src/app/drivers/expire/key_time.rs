//! Times in keys, pure: the `keyTime` formats an expire reads a row's time from, whether a key
//! is older than a cutoff, and the key bounds that hold the expired keys (docs/expire.md).
//!
//! A key is `prefix` + the time's text + anything. The formats:
//! - `ticks`: .NET ticks (100 ns since 0001-01-01T00:00:00Z), 19 zero-padded decimal digits;
//! - `reverseTicks`: `DateTime.MaxValue.Ticks − ticks`, as `ticks` (newest first);
//! - `unixSeconds`, `unixMilliseconds`: since 1970-01-01T00:00:00Z, zero-padded to 10 and 13
//!   digits (the widths of today's values, which sort as numbers only at a fixed width);
//! - `iso8601`: a sortable UTC date-time, `yyyy-MM-dd`, then optionally `THH`, `:mm`, `:ss` and
//!   `.f` to `.fffffff`, and `Z`.
//!
//! Invariants:
//! - **A key is expired only if every time it can stand for is before the cutoff.** The digit
//!   formats name one instant (after the digits the key ends or goes on with a non-digit; a
//!   digit there would make the width ambiguous: unreadable). An `iso8601` key names the
//!   period of its precision (`2024-05-01` is that whole day) and is expired once the period
//!   has ended by the cutoff.
//! - **A key whose time cannot be read is never expired** ([`KeyAge::Unreadable`]).
//! - **The bounds hold every expired key** ([`expired_range`]): a scan kept within them reads
//!   no key that is expired outside them. For digit keys with nothing after the time they hold
//!   exactly the expired keys; otherwise they may also hold keys of the cutoff's own instant
//!   or period (which [`age`] then calls live) and unreadable keys.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// .NET ticks per second.
pub const TICKS_PER_SECOND: i128 = 10_000_000;
/// `DateTime.UnixEpoch.Ticks`.
pub const UNIX_EPOCH_TICKS: i128 = 621_355_968_000_000_000;
/// `DateTime.MaxValue.Ticks` (9999-12-31T23:59:59.9999999).
pub const MAX_TICKS: i128 = 3_155_378_975_999_999_999;

/// Which key holds the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeKey {
    PartitionKey,
    RowKey,
}

/// How the time is written in the key (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum KeyFormat {
    Ticks,
    ReverseTicks,
    UnixSeconds,
    UnixMilliseconds,
    Iso8601,
}

/// The request's `keyTime`: `{"key": "PartitionKey", "format": "ticks", "prefix": "log-"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyTime {
    pub key: TimeKey,
    pub format: KeyFormat,
    /// Fixed text before the time (may be empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

/// What a key says of its row's age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAge {
    Expired,
    Live,
    Unreadable,
}

/// A time as .NET ticks (may be out of `0..=MAX_TICKS` for times the formats cannot write).
pub fn ticks(at: OffsetDateTime) -> i128 {
    at.unix_timestamp_nanos() / 100 + UNIX_EPOCH_TICKS
}

impl KeyFormat {
    /// Digits of a digit format (`None`: `iso8601`).
    fn width(self) -> Option<usize> {
        match self {
            KeyFormat::Ticks | KeyFormat::ReverseTicks => Some(19),
            KeyFormat::UnixSeconds => Some(10),
            KeyFormat::UnixMilliseconds => Some(13),
            KeyFormat::Iso8601 => None,
        }
    }

    /// The digit value a digit format writes for `at_ticks` (`None` if it cannot).
    fn value(self, at_ticks: i128) -> Option<i128> {
        let unix = at_ticks - UNIX_EPOCH_TICKS;
        let value = match self {
            KeyFormat::Ticks => at_ticks,
            KeyFormat::ReverseTicks => MAX_TICKS - at_ticks,
            KeyFormat::UnixSeconds => unix.div_euclid(TICKS_PER_SECOND),
            KeyFormat::UnixMilliseconds => unix.div_euclid(TICKS_PER_SECOND / 1000),
            KeyFormat::Iso8601 => return None,
        };
        let max = 10i128.pow(self.width()? as u32);
        ((0..max).contains(&value) && (0..=MAX_TICKS).contains(&at_ticks)).then_some(value)
    }

    /// The period `[start, end)` in ticks a digit value stands for.
    fn period(self, value: i128) -> (i128, i128) {
        match self {
            KeyFormat::Ticks => (value, value + 1),
            KeyFormat::ReverseTicks => (MAX_TICKS - value, MAX_TICKS - value + 1),
            KeyFormat::UnixSeconds => {
                let start = value * TICKS_PER_SECOND + UNIX_EPOCH_TICKS;
                (start, start + TICKS_PER_SECOND)
            }
            KeyFormat::UnixMilliseconds => {
                let start = value * (TICKS_PER_SECOND / 1000) + UNIX_EPOCH_TICKS;
                (start, start + TICKS_PER_SECOND / 1000)
            }
            KeyFormat::Iso8601 => (value, value + 1),
        }
    }
}

/// The text `format` writes for the instant `at_ticks` (`None` if it cannot), without prefix;
/// `iso8601` at full precision (`yyyy-MM-ddTHH:mm:ss.fffffffZ`).
pub fn format_time(format: KeyFormat, at_ticks: i128) -> Option<String> {
    match format.width() {
        Some(width) => Some(format!("{:0width$}", format.value(at_ticks)?)),
        None => iso_text(at_ticks),
    }
}

fn iso_text(at_ticks: i128) -> Option<String> {
    let nanos = (at_ticks - UNIX_EPOCH_TICKS).checked_mul(100)?;
    let at = OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()?;
    if !(1..=9999).contains(&at.year()) {
        return None;
    }
    let fraction = at.nanosecond() / 100;
    Some(format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{fraction:07}Z",
        at.year(),
        at.month() as u8,
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    ))
}

/// The period `[start, end)` in ticks that `key` names, `None` when it names none.
pub fn period(key_time: &KeyTime, key: &str) -> Option<(i128, i128)> {
    let text = key.strip_prefix(key_time.prefix.as_str())?;
    match key_time.format.width() {
        Some(width) => {
            let digits = text.get(..width)?;
            let after = text[width..].chars().next();
            if !digits.bytes().all(|b| b.is_ascii_digit())
                || after.is_some_and(|c| c.is_ascii_digit())
            {
                return None;
            }
            let value: i128 = digits.parse().ok()?;
            let (start, end) = key_time.format.period(value);
            (0..=MAX_TICKS).contains(&start).then_some((start, end))
        }
        None => iso_period(text),
    }
}

/// Reads `n` ASCII digits at the start of `text`.
fn digits(text: &[u8], n: usize) -> Option<u32> {
    let d = text.get(..n)?;
    d.iter()
        .all(u8::is_ascii_digit)
        .then(|| d.iter().fold(0, |v, b| v * 10 + u32::from(b - b'0')))
}

/// The period of a sortable UTC date-time at the start of `text` (see the module).
fn iso_period(text: &str) -> Option<(i128, i128)> {
    let b = text.as_bytes();
    let (year, month, day) = (
        digits(b, 4)?,
        digits(b.get(5..)?, 2)?,
        digits(b.get(8..)?, 2)?,
    );
    if b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let month = time::Month::try_from(u8::try_from(month).ok()?).ok()?;
    let date =
        time::Date::from_calendar_date(i32::try_from(year).ok()?, month, u8::try_from(day).ok()?)
            .ok()?;
    let (mut clock, mut unit, mut at) = ([0u32; 3], 864_000_000_000i128, 10usize);
    // `THH`, `:mm`, `:ss`: each narrows the period.
    for (i, (sep, span)) in [
        (b'T', 36_000_000_000i128),
        (b':', 600_000_000),
        (b':', TICKS_PER_SECOND),
    ]
    .into_iter()
    .enumerate()
    {
        match (b.get(at), digits(b.get(at + 1..).unwrap_or_default(), 2)) {
            (Some(&s), Some(v)) if s == sep => {
                clock[i] = v;
                unit = span;
                at += 3;
            }
            _ => break,
        }
    }
    let mut fraction = 0i128;
    if unit == TICKS_PER_SECOND && b.get(at) == Some(&b'.') {
        let n = b[at + 1..]
            .iter()
            .take(7)
            .take_while(|c| c.is_ascii_digit())
            .count();
        if n > 0 {
            fraction = i128::from(digits(&b[at + 1..], n)?) * 10i128.pow(7 - n as u32);
            unit = 10i128.pow(7 - n as u32);
            at += 1 + n;
        }
    }
    if b.get(at) == Some(&b'Z') && unit < 864_000_000_000 {
        at += 1;
    }
    if b.get(at).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let time = time::Time::from_hms(
        u8::try_from(clock[0]).ok()?,
        u8::try_from(clock[1]).ok()?,
        u8::try_from(clock[2]).ok()?,
    )
    .ok()?;
    let start = ticks(time::PrimitiveDateTime::new(date, time).assume_utc()) + fraction;
    Some((start, start + unit))
}

/// Whether `key` is expired at `cutoff` (ticks): every time it can stand for is before it.
pub fn age(key_time: &KeyTime, key: &str, cutoff: i128) -> KeyAge {
    match period(key_time, key) {
        None => KeyAge::Unreadable,
        Some((_, end)) if end <= cutoff => KeyAge::Expired,
        Some(_) => KeyAge::Live,
    }
}

/// Exclusive bounds on a key that hold every key expired at a cutoff (beside starting with
/// the prefix); `None` sides are unbounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyRange {
    pub after: Option<String>,
    pub before: Option<String>,
}

/// The bounds of the keys expired at `cutoff` (ticks). Digit formats are fixed-width, so a
/// key's text order is its time order: `ticks` and the Unix formats are expired below the
/// cutoff's text, `reverseTicks` above it; every digit key sorts below the prefix followed by
/// `:` (after `9`). An `iso8601` key expired at the cutoff sorts below the cutoff's full text.
pub fn expired_range(key_time: &KeyTime, cutoff: i128) -> KeyRange {
    let prefix = &key_time.prefix;
    let digits_end = Some(format!("{prefix}:"));
    let cutoff = cutoff.clamp(0, MAX_TICKS);
    match key_time.format {
        KeyFormat::ReverseTicks => KeyRange {
            // Expired: reverse value above the cutoff's (the cutoff's instant itself is live).
            after: format_time(KeyFormat::ReverseTicks, cutoff).map(|t| format!("{prefix}{t}")),
            before: digits_end,
        },
        KeyFormat::Iso8601 => KeyRange {
            after: None,
            before: iso_text(cutoff).map(|t| format!("{prefix}{t}")),
        },
        format => KeyRange {
            after: None,
            // A value whose whole period ends by the cutoff is below the first one that does
            // not: the value holding the cutoff's last tick before it… or the cutoff's own.
            before: format_time(format, cutoff)
                .map(|t| format!("{prefix}{t}"))
                .or(digits_end),
        },
    }
}

#[cfg(test)]
#[path = "key_time_tests.rs"]
mod tests;
