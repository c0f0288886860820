//! `olderThan`: a whole number of seconds (`s`), minutes (`m`), hours (`h`) or days (`d`), from
//! one minute to 100 years (36,500 days).

/// Shortest `olderThan`, in seconds.
pub const MIN_SECONDS: i64 = 60;
/// Longest `olderThan`, in seconds (36,500 days).
pub const MAX_SECONDS: i64 = 36_500 * 86_400;

/// `olderThan` in seconds, or why it is refused.
pub fn parse_older_than(text: &str) -> Result<i64, String> {
    let usage = || {
        format!("must be a whole number of s, m, h or d, at least 1m and at most 36500d (e.g. \"30d\"), got {text:?}")
    };
    let unit = match text.chars().last() {
        Some('s') => 1,
        Some('m') => 60,
        Some('h') => 3_600,
        Some('d') => 86_400,
        _ => return Err(usage()),
    };
    let number = &text[..text.len() - 1];
    if number.is_empty() || number.len() > 12 || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(usage());
    }
    let seconds = number.parse::<i64>().map_err(|_| usage())? * unit;
    match seconds {
        s if s < MIN_SECONDS => Err(format!("must be at least 1 minute, got {text:?}")),
        s if s > MAX_SECONDS => Err(format!("must be at most 36500d, got {text:?}")),
        s => Ok(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_unit_reads_and_the_rest_is_refused() {
        assert_eq!(parse_older_than("30d"), Ok(30 * 86_400));
        assert_eq!(parse_older_than("60s"), Ok(60));
        assert_eq!(parse_older_than("1m"), Ok(60));
        assert_eq!(parse_older_than("12h"), Ok(43_200));
        assert_eq!(parse_older_than("36500d"), Ok(MAX_SECONDS));
        for bad in [
            "0",
            "0d",
            "59s",
            "-1d",
            "30x",
            "1e9d",
            "d",
            "",
            "1.5d",
            " 1d",
            "+1d",
            "36501d",
            "999999999999d",
            "1D",
        ] {
            assert!(parse_older_than(bad).is_err(), "{bad:?} accepted");
        }
    }
}
