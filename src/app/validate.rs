//! Azure naming and key rules, checked before anything is written.

/// Azure table names: 3–63 alphanumeric characters starting with a letter, not `tables`.
pub fn table_name(name: &str) -> Result<(), String> {
    let ok_chars = name.chars().all(|c| c.is_ascii_alphanumeric());
    let starts_with_letter = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    if !(3..=63).contains(&name.len()) || !ok_chars || !starts_with_letter {
        return Err(format!(
            "{name:?} is not a valid table name (3-63 letters and digits, starting with a letter)"
        ));
    }
    if name.eq_ignore_ascii_case("tables") {
        return Err("\"tables\" is a reserved table name".into());
    }
    Ok(())
}

/// A queue of the app's own (the step, copy and cleanup queues): Azure's queue name rules
/// ([`destination_queue_name`]) within 56 characters, so that the host's `<name>-poison` queue,
/// which the app's poison functions listen to, is a valid name too (the Storage Queues
/// extension uses no poison queue at all when `<name>-poison` would be invalid).
pub fn queue_name(name: &str) -> Result<(), String> {
    queue_name_within(name, 56, ", so that \"-poison\" still fits")
}

/// A queue the app only writes to (an enqueue scan's destination): exactly Azure's queue name
/// rules, 3–63 lowercase letters, digits and single hyphens, starting and ending with a letter
/// or digit.
pub fn destination_queue_name(name: &str) -> Result<(), String> {
    queue_name_within(name, 63, ", starting and ending with a letter or digit")
}

fn queue_name_within(name: &str, max: usize, why: &str) -> Result<(), String> {
    let valid = (3..=max).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid queue name (3-{max} lowercase letters, digits and single hyphens{why})"
        ))
    }
}

/// Characters Azure forbids in PartitionKey and RowKey values: `/`, `\`, `#`, `?` and control
/// characters U+0000–U+001F and U+007F–U+009F. Keys are also limited to 1 KiB.
pub fn key(value: &str) -> Result<(), String> {
    if let Some(c) = value
        .chars()
        .find(|c| matches!(c, '/' | '\\' | '#' | '?') || c.is_control())
    {
        return Err(format!(
            "contains the character {c:?}, which Azure does not allow in keys"
        ));
    }
    if value.encode_utf16().count() * 2 > 1024 {
        return Err("is longer than the 1 KiB Azure allows for a key".into());
    }
    Ok(())
}

/// Most properties `select` may name (an entity has at most 252 besides the keys and Timestamp).
pub const MAX_SELECT: usize = 252;

/// A `select` list: 1 to [`MAX_SELECT`] distinct property names, each a valid property name
/// (a letter or `_`, then letters, digits or `_`; at most 255 characters), none a key (keys are
/// always read).
pub fn select(names: &[String]) -> Result<(), String> {
    if names.is_empty() || names.len() > MAX_SELECT {
        return Err(format!(
            "must name 1 to {MAX_SELECT} properties, got {}",
            names.len()
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for name in names {
        let mut chars = name.chars();
        let valid = chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
            && chars.all(|c| c.is_alphanumeric() || c == '_')
            && name.chars().count() <= 255;
        if !valid {
            return Err(format!("{name:?} is not a property name (a letter or _, then letters, digits or _; at most 255 characters)"));
        }
        if name == "PartitionKey" || name == "RowKey" {
            return Err(format!("{name} is always read; name the other properties"));
        }
        if !seen.insert(name) {
            return Err(format!("{name:?} is named twice"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_keys() {
        assert!(table_name("Source1").is_ok());
        assert!(table_name("1abc").is_err());
        assert!(table_name("ab").is_err());
        assert!(table_name("has-dash").is_err());
        assert!(table_name("Tables").is_err());
        assert!(queue_name("tablescan-prefixscan").is_ok());
        assert!(queue_name("Upper").is_err());
        assert!(queue_name("a--b").is_err());
        assert!(key("Microsoft.Extensions").is_ok());
        assert!(key("a/b").is_err());
        assert!(key("tab\there").is_err());
        assert!(key("\u{7F}").is_err());
        assert!(key(&"x".repeat(600)).is_err());
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(select(&names(&["Downloads", "_x1", "Ünï"])).is_ok());
        for bad in [
            names(&[]),
            names(&["A", "A"]),
            names(&["1A"]),
            names(&["A B"]),
            names(&["A@odata.type"]),
            names(&["RowKey"]),
            names(&[&"x".repeat(256)]),
            (0..253).map(|i| format!("P{i}")).collect(),
        ] {
            assert!(select(&bad).is_err(), "{bad:?}");
        }
    }
}
