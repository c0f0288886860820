//! .NET `TimeSpan` text as host.json uses it (`hh:mm:ss`, `hh:mm:ss.fffffff`, `d.hh:mm:ss`).

use std::time::Duration;

/// Parses the `TimeSpan.Parse` forms host.json settings use. Negative values are rejected here;
/// `functionTimeout: "-1"` is handled by the caller.
pub fn parse_timespan(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let bad = || format!("{text:?} is not a time span (expected hh:mm:ss[.fffffff] or d.hh:mm:ss)");
    if t.is_empty() || t.starts_with('-') {
        return Err(bad());
    }
    // A bare integer is a number of days in .NET.
    if t.bytes().all(|b| b.is_ascii_digit()) {
        let days: u64 = t.parse().map_err(|_| bad())?;
        return Ok(Duration::from_secs(days * 86_400));
    }
    let (days, rest) = match t.split_once('.') {
        // `d.hh:mm:ss`: a '.' before the first ':' separates days.
        Some((d, rest)) if !d.contains(':') => (d.parse::<u64>().map_err(|_| bad())?, rest),
        _ => (0, t),
    };
    let (clock, fraction) = match rest.split_once('.') {
        Some((c, f)) => (c, Some(f)),
        None => (rest, None),
    };
    let parts: Vec<&str> = clock.split(':').collect();
    if parts.len() < 2 || parts.len() > 3 {
        return Err(bad());
    }
    let num = |s: &str, max: u64| -> Result<u64, String> {
        if s.is_empty() || s.len() > 2 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let v: u64 = s.parse().map_err(|_| bad())?;
        if v > max {
            return Err(bad());
        }
        Ok(v)
    };
    let hours = num(parts[0], 23)?;
    let minutes = num(parts[1], 59)?;
    let seconds = if parts.len() == 3 {
        num(parts[2], 59)?
    } else {
        0
    };
    let mut nanos = 0u64;
    if let Some(f) = fraction {
        if parts.len() != 3 || f.is_empty() || f.len() > 7 || !f.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        // .NET fractions are in ticks (100 ns), up to 7 digits.
        let padded = format!("{f:0<9}");
        nanos = padded.parse().map_err(|_| bad())?;
    }
    Ok(
        Duration::from_secs(days * 86_400 + hours * 3600 + minutes * 60 + seconds)
            + Duration::from_nanos(nanos),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dotnet_forms() {
        assert_eq!(
            parse_timespan("00:05:00").unwrap(),
            Duration::from_secs(300)
        );
        assert_eq!(
            parse_timespan("00:00:00.100").unwrap(),
            Duration::from_millis(100)
        );
        assert_eq!(
            parse_timespan("00:00:01.5").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_timespan("1.02:00:00").unwrap(),
            Duration::from_secs(86_400 + 7200)
        );
        assert_eq!(parse_timespan("00:10").unwrap(), Duration::from_secs(600));
        assert_eq!(
            parse_timespan("2").unwrap(),
            Duration::from_secs(2 * 86_400)
        );
        assert_eq!(
            parse_timespan("00:00:00.0000001").unwrap(),
            Duration::from_nanos(100)
        );
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "-1",
            "abc",
            "00:60:00",
            "24:00:00",
            "1:2:3:4",
            "00:00:00.",
            "00:00.5",
            "5s",
        ] {
            assert!(parse_timespan(bad).is_err(), "{bad:?} accepted");
        }
    }
}
