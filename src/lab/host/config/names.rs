//! The host's naming rules for functions, bindings and storage queues.

/// `^[a-z][a-z0-9_\-]{0,127}$` case-insensitive, and not `host` (host `Utility.IsValidFunctionName`).
pub fn is_valid_function_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphabetic()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
        && !name.eq_ignore_ascii_case("host")
}

/// `^([a-zA-Z][a-zA-Z0-9]{0,127}|\$return)$` (host `Utility.BindingNameValidationRegex`).
pub fn is_valid_binding_name(name: &str) -> bool {
    if name == "$return" {
        return true;
    }
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphabetic()
        && b[1..].iter().all(|c| c.is_ascii_alphanumeric())
}

/// Storage queue name rules: 3-63 chars of `a-z0-9-`, starting and ending alphanumeric,
/// no consecutive hyphens.
pub fn validate_queue_name(name: &str) -> Result<(), String> {
    let b = name.as_bytes();
    let ok = (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid queue name (3-63 characters of a-z, 0-9 and single hyphens, \
             starting and ending with a letter or digit)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_valid_function_name("PrefixScan"));
        assert!(is_valid_function_name("a_b-c9"));
        assert!(!is_valid_function_name("Host"));
        assert!(!is_valid_function_name("9abc"));
        assert!(!is_valid_function_name("a.b"));
        assert!(!is_valid_function_name(&"a".repeat(129)));
        assert!(is_valid_binding_name("$return"));
        assert!(is_valid_binding_name("myQueueItem"));
        assert!(!is_valid_binding_name("my_item"));
        assert!(!is_valid_binding_name("$ret"));
        assert!(validate_queue_name("orders-in").is_ok());
        assert!(validate_queue_name("Orders").is_err());
        assert!(validate_queue_name("a--b").is_err());
        assert!(validate_queue_name("ab").is_err());
    }
}
