//! How tablescan's own records store values in table properties: Int64 and DateTime with their
//! annotations, strings measured in UTF-16 units, diagnostics cut with a marker.

use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::NewWork;
use crate::storage::{Entity, Properties};

/// Longest diagnostic text (an error) stored on a record, in UTF-16 units: 16 KB of the
/// 64 KiB a string property may hold; longer texts are cut with a marker.
const MAX_DIAGNOSTIC_UNITS: usize = 8_000;

/// An Int64 property (sent as a string, as the service's JSON does); `None` if unreadable.
pub(super) fn int64(props: &Properties, name: &str) -> Option<i64> {
    match props.get_value(name) {
        None => Some(0),
        Some(Value::String(s)) => s.parse().ok(),
        Some(Value::Number(n)) => n.as_i64(),
        Some(_) => None,
    }
}

pub(super) fn put_int64(props: &mut Properties, name: &str, value: i64) {
    props.insert(name, Value::String(value.to_string()));
    props.insert(
        format!("{name}@odata.type"),
        Value::String("Edm.Int64".into()),
    );
}

pub(super) fn put_str(props: &mut Properties, name: &str, value: &str) {
    props.insert(name, Value::String(value.to_string()));
}

pub(super) fn put_time(props: &mut Properties, name: &str, value: OffsetDateTime) {
    props.insert(name, Value::String(format_time(value)));
    props.insert(
        format!("{name}@odata.type"),
        Value::String("Edm.DateTime".into()),
    );
}

/// RFC 3339 in UTC with millisecond precision.
pub fn format_time(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let t = t
        .replace_nanosecond(t.millisecond() as u32 * 1_000_000)
        .unwrap_or(t);
    t.format(&Rfc3339).unwrap_or_default()
}

pub(super) fn get_time(props: &Properties, name: &str) -> Option<OffsetDateTime> {
    props
        .get_str(name)
        .and_then(|s| OffsetDateTime::parse(&s, &Rfc3339).ok())
}

pub(super) fn get_str(props: &Properties, name: &str) -> Option<String> {
    props.get_str(name)
}

/// Splits `text` into pieces of at most `max_units` UTF-16 units, never inside a character.
pub(super) fn utf16_chunks(text: &str, max_units: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut units = 0;
        let end = rest
            .char_indices()
            .find(|(_, c)| {
                units += c.len_utf16();
                units > max_units
            })
            .map_or(rest.len(), |(i, _)| i);
        let (chunk, tail) = rest.split_at(end);
        rest = tail;
        Some(chunk)
    })
}

/// A diagnostic text cut to [`MAX_DIAGNOSTIC_UNITS`] UTF-16 units, with a marker saying so.
pub(super) fn diagnostic(text: &str) -> String {
    let total = text.encode_utf16().count();
    if total <= MAX_DIAGNOSTIC_UNITS {
        return text.to_string();
    }
    let marker = format!(" … [truncated: {total} UTF-16 units in all]");
    let keep = MAX_DIAGNOSTIC_UNITS - marker.encode_utf16().count();
    let head = utf16_chunks(text, keep).next().unwrap_or("");
    format!("{head}{marker}")
}

/// A newly registered work item's row: `pending`, its kind, and when it was created (`now`).
pub(super) fn work_row(partition_key: &str, work: &NewWork, now: OffsetDateTime) -> Entity {
    let mut row = Entity::new(partition_key, work.id.clone());
    row.properties.insert("State", Value::from("pending"));
    row.properties.insert("Kind", Value::from(work.kind));
    put_time(&mut row.properties, "CreatedAt", now);
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_and_diagnostics_are_measured_in_utf16_units() {
        let text = format!("{}{}", "a".repeat(5), "\u{1F600}".repeat(3));
        let chunks: Vec<&str> = utf16_chunks(&text, 6).collect();
        assert_eq!(chunks.concat(), text);
        assert!(chunks.iter().all(|c| c.encode_utf16().count() <= 6));
        let wide = "\u{1F600}".repeat(MAX_DIAGNOSTIC_UNITS);
        let cut = diagnostic(&wide);
        assert!(cut.encode_utf16().count() <= MAX_DIAGNOSTIC_UNITS);
        assert!(cut.ends_with(&format!(
            "[truncated: {} UTF-16 units in all]",
            2 * MAX_DIAGNOSTIC_UNITS
        )));
        assert_eq!(diagnostic("short"), "short");
    }
}
