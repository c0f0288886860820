//! Unit tests of [`super`]: how write failures are classified and named.

use super::*;

#[test]
fn write_failures_are_permanent_but_for_transient_answers_and_name_the_row() {
    let row = Entity::new("p", "r7");
    let ops = [
        BatchOperation::Upsert(Entity::new("p", "r6")),
        BatchOperation::Upsert(row),
    ];
    let mut refused = StorageError::from_status(400, Some("InvalidInput".into()), "bad value");
    refused.failed_operation = Some(1);
    let e = write_failed("c/x", (1, 2), 0, name_failed_row(refused, &ops));
    assert!(e.is_permanent(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("row (\"p\", \"r7\")") && text.contains("0 of them"),
        "{text}"
    );
    for status in [403, 404, 409, 413] {
        let e = write_failed(
            "c/x",
            (1, 2),
            1,
            StorageError::from_status(status, None, "no"),
        );
        assert!(e.is_permanent(), "{status}: {e}");
    }
    for status in [408, 429, 500, 503] {
        let e = write_failed(
            "c/x",
            (1, 2),
            1,
            StorageError::from_status(status, None, "busy"),
        );
        assert!(!e.is_permanent(), "{status}: {e}");
    }
}
