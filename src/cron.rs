//! NCRONTAB with seconds (`{second} {minute} {hour} {day} {month} {day-of-week}`), in UTC: the
//! form the Functions timer trigger takes (docs/schedules.md, "Cron"). Pure, and shared like
//! `clock.rs`: schedules (`app::schedule`) and the local host's timer trigger (`lab::host`)
//! compute occurrences with it.
//!
//! Written here rather than taken from a crate: the maintained crates (`cron`, `croner`) accept
//! forms NCRONTAB refuses (`L`, `W`, `#`, `?`, a year field, 7 for Sunday) and bring `chrono`,
//! while NCRONTAB's grammar and its next occurrence fit in this file.
//!
//! Invariants:
//! - a parsed [`Cron`] has at least one allowed value in every field; a field is a list of
//!   `*`, `n`, `a-b`, each optionally `/step`; `n/step` means `n-max/step` (as NCRONTAB reads it);
//!   months and days of week also take English names or their prefixes (`Jan`, `Mon`), days of
//!   week are 0–6 with Sunday 0;
//! - a time matches when every field matches, the day of month AND the day of week (NCRONTAB's
//!   rule, unlike Vixie cron's OR);
//! - [`Cron::next_after`] is the first matching whole second strictly after `t`, and
//!   [`Cron::latest_at_or_before`] the last one at or before `t`; both walk at most
//!   [`SEARCH_DAYS`] days, so an expression matching no date (`0 0 0 30 2 *`) gives `None`.

use time::{Date, Duration, OffsetDateTime, Time};

/// How far the day walks search: 28 years covers every (day of month, month, day of week)
/// combination, leap days included.
pub const SEARCH_DAYS: i64 = 28 * 366 + 7;

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// The fields, in order: name, lowest and highest value, value names.
const FIELDS: [(&str, u8, u8, &[&str]); 6] = [
    ("second", 0, 59, &[]),
    ("minute", 0, 59, &[]),
    ("hour", 0, 23, &[]),
    ("day", 1, 31, &[]),
    ("month", 1, 12, &MONTHS),
    ("day of week", 0, 6, &WEEKDAYS),
];

/// A parsed expression: one bit per allowed value of each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    fields: [u64; 6],
}

impl Cron {
    /// Parses a 6-field NCRONTAB expression; the error names the field and what is wrong.
    pub fn parse(text: &str) -> Result<Cron, String> {
        let parts: Vec<&str> = text.split_whitespace().collect();
        if parts.len() != 6 {
            return Err(format!(
                "has {} fields; NCRONTAB with seconds has 6: second minute hour day month day-of-week",
                parts.len()
            ));
        }
        let mut fields = [0u64; 6];
        for (i, part) in parts.iter().enumerate() {
            let (name, lo, hi, names) = FIELDS[i];
            fields[i] = parse_field(part, lo, hi, names)
                .map_err(|e| format!("{name} field {part:?}: {e}"))?;
        }
        Ok(Cron { fields })
    }

    fn allows(&self, field: usize, value: u8) -> bool {
        self.fields[field] & (1 << value) != 0
    }

    fn day_matches(&self, date: Date) -> bool {
        self.allows(3, date.day())
            && self.allows(4, date.month() as u8)
            && self.allows(5, date.weekday().number_days_from_sunday())
    }

    /// The allowed times of day, ascending, from `from` (inclusive) on.
    fn first_time_from(&self, from: Time) -> Option<Time> {
        let start = u32::from(from.hour()) * 3600
            + u32::from(from.minute()) * 60
            + u32::from(from.second());
        (u32::from(from.hour())..24)
            .filter(|h| self.allows(2, *h as u8))
            .flat_map(|h| (0..60).map(move |m| (h, m)))
            .filter(|(_, m)| self.allows(1, *m as u8))
            .flat_map(|(h, m)| (0..60).map(move |s| (h, m, s)))
            .filter(|(_, _, s)| self.allows(0, *s as u8))
            .find(|(h, m, s)| h * 3600 + m * 60 + s >= start)
            .map(|(h, m, s)| Time::from_hms(h as u8, m as u8, s as u8).expect("in range"))
    }

    /// The last allowed time of day at or before `to`.
    fn last_time_to(&self, to: Time) -> Option<Time> {
        let end =
            u32::from(to.hour()) * 3600 + u32::from(to.minute()) * 60 + u32::from(to.second());
        (0..=u32::from(to.hour()))
            .rev()
            .filter(|h| self.allows(2, *h as u8))
            .flat_map(|h| (0..60).rev().map(move |m| (h, m)))
            .filter(|(_, m)| self.allows(1, *m as u8))
            .flat_map(|(h, m)| (0..60).rev().map(move |s| (h, m, s)))
            .filter(|(_, _, s)| self.allows(0, *s as u8))
            .find(|(h, m, s)| h * 3600 + m * 60 + s <= end)
            .map(|(h, m, s)| Time::from_hms(h as u8, m as u8, s as u8).expect("in range"))
    }

    /// The first matching second strictly after `t` (UTC), if any within [`SEARCH_DAYS`].
    pub fn next_after(&self, t: OffsetDateTime) -> Option<OffsetDateTime> {
        let t = whole_second(t.to_offset(time::UtcOffset::UTC)) + Duration::SECOND;
        let mut date = t.date();
        let mut from = t.time();
        for _ in 0..SEARCH_DAYS {
            if self.day_matches(date) {
                if let Some(at) = self.first_time_from(from) {
                    return Some(date.with_time(at).assume_utc());
                }
            }
            date = date.next_day()?;
            from = Time::MIDNIGHT;
        }
        None
    }

    /// The last matching second at or before `t` (UTC), if any within [`SEARCH_DAYS`].
    pub fn latest_at_or_before(&self, t: OffsetDateTime) -> Option<OffsetDateTime> {
        let t = whole_second(t.to_offset(time::UtcOffset::UTC));
        let mut date = t.date();
        let mut to = t.time();
        for _ in 0..SEARCH_DAYS {
            if self.day_matches(date) {
                if let Some(at) = self.last_time_to(to) {
                    return Some(date.with_time(at).assume_utc());
                }
            }
            date = date.previous_day()?;
            to = Time::from_hms(23, 59, 59).expect("valid");
        }
        None
    }
}

fn whole_second(t: OffsetDateTime) -> OffsetDateTime {
    t.replace_nanosecond(0).expect("0 is a valid nanosecond")
}

/// One field: a comma-separated list of `*`, `n`, `a-b`, each with an optional `/step`.
fn parse_field(text: &str, lo: u8, hi: u8, names: &[&str]) -> Result<u64, String> {
    let mut bits = 0u64;
    for element in text.split(',') {
        let (range, step) = match element.split_once('/') {
            Some((range, step)) => {
                let step: u8 = step
                    .parse()
                    .map_err(|_| format!("step {step:?} is not a number"))?;
                if step == 0 {
                    return Err("a step of 0".into());
                }
                (range, Some(step))
            }
            None => (element, None),
        };
        let (first, last) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, lo, hi, names)?, value(b, lo, hi, names)?)
        } else {
            let v = value(range, lo, hi, names)?;
            (v, if step.is_some() { hi } else { v })
        };
        if first > last {
            return Err(format!("range {first}-{last} runs backwards"));
        }
        let step = usize::from(step.unwrap_or(1));
        for v in (first..=last).step_by(step) {
            bits |= 1 << v;
        }
    }
    Ok(bits)
}

/// A number in `lo..=hi`, or a name (or a prefix of one, matched in order, case-insensitively).
fn value(text: &str, lo: u8, hi: u8, names: &[&str]) -> Result<u8, String> {
    if text.is_empty() {
        return Err("an empty value".into());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<u8>() {
            Ok(v) if (lo..=hi).contains(&v) => Ok(v),
            _ => Err(format!("{text} is not between {lo} and {hi}")),
        };
    }
    let lower = text.to_ascii_lowercase();
    names
        .iter()
        .position(|n| n.to_ascii_lowercase().starts_with(&lower))
        .map(|i| lo + i as u8)
        .ok_or_else(|| format!("{text:?} is neither a number between {lo} and {hi} nor a name"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use time::macros::datetime;

    use super::*;

    #[test]
    fn the_default_and_common_forms() {
        let every_minute = Cron::parse("0 * * * * *").unwrap();
        let t = datetime!(2026-11-28 19:11:32 UTC);
        assert_eq!(
            every_minute.next_after(t),
            Some(datetime!(2026-11-28 19:12:00 UTC))
        );
        assert_eq!(
            every_minute.latest_at_or_before(t),
            Some(datetime!(2026-11-28 19:11:00 UTC))
        );
        let nightly = Cron::parse("0 0 3 * * *").unwrap();
        assert_eq!(
            nightly.next_after(datetime!(2026-11-28 03:00:00 UTC)),
            Some(datetime!(2026-11-29 03:00:00 UTC))
        );
        let weekdays = Cron::parse("0 30 9 * * Mon-Fri").unwrap();
        // 2026-11-28 is a Saturday.
        assert_eq!(
            weekdays.next_after(t),
            Some(datetime!(2026-11-30 09:30:00 UTC))
        );
        let stepped = Cron::parse("5/20 * * * * *").unwrap();
        assert_eq!(
            stepped.next_after(datetime!(2026-01-01 00:00:45 UTC)),
            Some(datetime!(2026-01-01 00:01:05 UTC))
        );
        // Day of month AND day of week: the 13th that is a Friday.
        let friday13 = Cron::parse("0 0 0 13 * 5").unwrap();
        assert_eq!(
            friday13.next_after(datetime!(2026-01-01 00:00:00 UTC)),
            Some(datetime!(2026-02-13 00:00:00 UTC))
        );
        assert_eq!(Cron::parse("0 0 0 30 Feb *").unwrap().next_after(t), None);
    }

    #[test]
    fn refusals_name_the_field() {
        for (text, field) in [
            ("* * * * *", "fields"),
            ("60 * * * * *", "second"),
            ("0 * * * * 7", "day of week"),
            ("0 * * L * *", "day field"),
            ("0 * * * * MON#1", "day of week"),
            ("0 */0 * * * *", "minute"),
            ("0 * 5-2 * * *", "hour"),
            ("0 * * * Foo *", "month"),
            ("0 * * ? * *", "day field"),
        ] {
            let e = Cron::parse(text).unwrap_err();
            assert!(e.contains(field), "{text}: {e}");
        }
    }

    /// The oracle: second by second.
    fn brute_next(cron: &Cron, t: OffsetDateTime, limit: i64) -> Option<OffsetDateTime> {
        let start = whole_second(t) + Duration::SECOND;
        (0..limit).map(|s| start + Duration::seconds(s)).find(|c| {
            cron.day_matches(c.date())
                && cron.allows(2, c.hour())
                && cron.allows(1, c.minute())
                && cron.allows(0, c.second())
        })
    }

    fn field(lo: u8, hi: u8) -> impl Strategy<Value = String> {
        prop_oneof![
            Just("*".to_string()),
            (lo..=hi).prop_map(|v| v.to_string()),
            (lo..=hi, lo..=hi).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
            (lo..=hi, 1u8..10).prop_map(|(a, s)| format!("{a}/{s}")),
            (1u8..20).prop_map(|s| format!("*/{s}")),
            (lo..=hi, lo..=hi).prop_map(|(a, b)| format!("{a},{b}")),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Dense expressions (every hour, day and month allowed, any seconds, minutes and days
        /// of week) against the second-by-second oracle over 3 days.
        #[test]
        fn next_after_matches_the_brute_force_oracle(
            s in field(0, 59), m in field(0, 59), dow in field(0, 6),
            start in 1_700_000_000i64..1_900_000_000,
        ) {
            let cron = Cron::parse(&format!("{s} {m} * * * {dow}")).unwrap();
            let t = OffsetDateTime::from_unix_timestamp(start).unwrap();
            let window = 3 * 86_400;
            let expected = brute_next(&cron, t, window);
            match expected {
                Some(_) => prop_assert_eq!(cron.next_after(t), expected),
                // Nothing in the oracle's window: the walk finds nothing in it either.
                None => prop_assert!(cron
                    .next_after(t)
                    .map_or(true, |n| n > whole_second(t) + Duration::seconds(window))),
            }
            if let Some(next) = expected {
                // Nothing matches between the latest at or before t and the next after it.
                let latest = cron.latest_at_or_before(next - Duration::SECOND);
                prop_assert!(latest.map_or(true, |l| l <= whole_second(t)));
                prop_assert_eq!(cron.latest_at_or_before(next), Some(next));
            }
        }

        /// Sparse expressions (hours, days, months): next_after lands on a match, and the
        /// walk back from it finds it again.
        #[test]
        fn sparse_expressions_round_trip(
            h in field(0, 23), d in field(1, 31), mo in field(1, 12),
            start in 1_700_000_000i64..1_900_000_000,
        ) {
            let cron = Cron::parse(&format!("0 0 {h} {d} {mo} *")).unwrap();
            let t = OffsetDateTime::from_unix_timestamp(start).unwrap();
            if let Some(next) = cron.next_after(t) {
                prop_assert!(next > t);
                prop_assert_eq!(cron.latest_at_or_before(next), Some(next));
                let before = cron.latest_at_or_before(next - Duration::SECOND);
                prop_assert!(before.map_or(true, |b| b <= t));
            }
        }
    }
}
