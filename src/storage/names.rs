//! Property names shared between the rows parsed on one thread: a page of a table repeats the
//! same dozen names on every row, and a step holds up to `MAX_STEP_ROWS` rows, so each row
//! keeping its own copy of every name would cost more than its values.
//!
//! Invariant: the cache is bounded ([`MAX_NAMES`] names of at most [`MAX_NAME_BYTES`] bytes);
//! when full it is emptied, so a table whose rows all have new names costs one map insert per
//! name and never grows the cache. Written here (a dozen lines) rather than taken from an
//! interning crate: those keep one global table behind a lock taken for every name of every row,
//! or keep every string for the process's life, which rows with hostile names must not make grow.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;

/// Most names the cache of one thread holds before it is emptied.
const MAX_NAMES: usize = 512;
/// Longer names are not cached (the service allows 255 characters).
const MAX_NAME_BYTES: usize = 64;

thread_local! {
    static NAMES: RefCell<HashSet<Arc<str>>> = RefCell::new(HashSet::new());
}

/// `name`, shared with the rows parsed before on this thread that have it.
pub fn shared(name: &str) -> Arc<str> {
    if name.len() > MAX_NAME_BYTES {
        return Arc::from(name);
    }
    NAMES.with_borrow_mut(|names| {
        if let Some(known) = names.get(name) {
            return known.clone();
        }
        if names.len() >= MAX_NAMES {
            names.clear();
        }
        let name: Arc<str> = Arc::from(name);
        names.insert(name.clone());
        name
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_seen_before_is_the_same_allocation() {
        let a = shared("Title");
        let b = shared("Title");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a, "Title");
    }

    #[test]
    fn the_cache_stays_bounded() {
        for i in 0..3 * MAX_NAMES {
            assert_eq!(&*shared(&format!("n{i}")), format!("n{i}"));
        }
        assert!(NAMES.with_borrow(HashSet::len) <= MAX_NAMES);
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert!(!Arc::ptr_eq(&shared(&long), &shared(&long)));
    }
}
