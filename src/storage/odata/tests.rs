//! Tests of the filter language: canonical rendering, refusals, bounds, evaluation.

use super::*;

fn canonical(text: &str) -> String {
    parse(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .render()
}

#[test]
fn renders_canonically() {
    for (given, want) in [
        (
            "Downloads gt 1000L and Listed eq true",
            "(Downloads gt 1000L) and (Listed eq true)",
        ),
        ("1000L lt Downloads", "Downloads gt 1000L"),
        ("Name eq 'it''s'", "Name eq 'it''s'"),
        ("not (A eq 1) or B ne -2", "(not (A eq 1)) or (B ne -2)"),
        (
            "A eq 1 or B eq 2 and C eq 3",
            "(A eq 1) or ((B eq 2) and (C eq 3))",
        ),
        ("((X ge 1.5))", "X ge 1.5"),
        ("X lt 3.0", "X lt 3.0"),
        ("X lt 1e300", "X lt 1.0E+300"),
        ("X lt 2.5E-7", "X lt 2.5E-7"),
        ("X lt -0.0", "X lt -0.0"),
        (
            "T ge datetime'2024-01-02T03:04:05.1234567+01:00'",
            "T ge datetime'2024-01-02T02:04:05.1234567Z'",
        ),
        (
            "T ge datetime'2024-01-02T03:04:05Z'",
            "T ge datetime'2024-01-02T03:04:05Z'",
        ),
        (
            "G eq guid'0A1B2C3D-0000-1111-2222-333344445555'",
            "G eq guid'0a1b2c3d-0000-1111-2222-333344445555'",
        ),
        ("B eq binary'0aff'", "B eq X'0AFF'"),
        ("Ünï_1 eq 'x'", "Ünï_1 eq 'x'"),
    ] {
        assert_eq!(canonical(given), want, "{given}");
        assert_eq!(canonical(want), want, "canonical text is a fixed point");
    }
}

#[test]
fn refuses_with_position_and_reason() {
    for (text, position, says) in [
        ("PartitionKey eq 'a'", 1, "key property"),
        ("A eq 1 and RowKey gt 'x'", 12, "key property"),
        ("A eq B", 6, "must be a literal"),
        ("1 eq 2", 1, "must be a property"),
        ("A like 'x'", 3, "unknown operator"),
        ("A EQ 1", 3, "unknown operator"),
        ("A eq 1 AND B eq 2", 8, "unexpected"),
        ("A eq 'open", 6, "unterminated"),
        ("A eq 3000000000", 6, "Int32 range"),
        ("A eq 12x", 6, "not a number"),
        ("A eq 1.", 6, "not a number"),
        ("A eq 1e999", 6, "Double range"),
        ("A eq datetime'2024-13-01T00:00:00Z'", 6, "RFC 3339"),
        ("A eq datetime'2024-01-01T00:00:00'", 6, "RFC 3339"),
        ("A eq datetime'2024-01-01T00:00:00.123456789Z'", 6, "100 ns"),
        ("A eq guid'xyz'", 6, "not a GUID"),
        ("A eq X'abc'", 6, "not binary"),
        ("A eq time'x'", 6, "unknown literal type"),
        ("A eq datetime'1600-12-31T00:00:00Z'", 6, "1601"),
        ("startswith(A, 'x') eq true", 1, "functions"),
        ("Listed", 7, "a property alone"),
        ("(A eq 1", 8, "closing"),
        ("A eq 1)", 7, "unexpected"),
        ("A eq 1 and", 11, "ends where"),
        ("A eq 1 & B eq 2", 8, "unexpected character"),
        ("", 1, "ends where"),
    ] {
        let e = parse(text).expect_err(text);
        assert_eq!(e.position, position, "{text}: {e}");
        assert!(e.message.contains(says), "{text}: {e}");
    }
}

#[test]
fn bounds_hold() {
    let nine = (0..9)
        .map(|i| format!("A{i} eq {i}"))
        .collect::<Vec<_>>()
        .join(" or ");
    assert!(parse(&nine).is_ok());
    let ten = format!("{nine} or B eq 1");
    assert!(parse(&ten).unwrap_err().message.contains("comparisons"));
    let deep = format!("{}A eq 1{}", "(".repeat(40), ")".repeat(40));
    assert!(parse(&deep).unwrap_err().message.contains("nested"));
    let nots = format!("{}A eq 1", "not ".repeat(40));
    assert!(parse(&nots).unwrap_err().message.contains("nested"));
    let long = format!("A eq '{}'", "x".repeat(MAX_FILTER_CHARS));
    assert!(parse(&long).unwrap_err().message.contains("characters"));
}

#[test]
fn evaluates_typed_values() {
    let mut e = Entity::new("p", "r");
    e.properties.insert("S", serde_json::json!("it's"));
    e.properties.insert("N", serde_json::json!("5000"));
    e.properties
        .insert("N@odata.type", serde_json::json!("Edm.Int64"));
    e.properties.insert("I", serde_json::json!(7));
    e.properties.insert("D", serde_json::json!(2.5));
    e.properties.insert("B", serde_json::json!(true));
    e.properties
        .insert("T", serde_json::json!("2024-01-02T03:04:05Z"));
    e.properties
        .insert("T@odata.type", serde_json::json!("Edm.DateTime"));
    for (filter, want) in [
        ("S eq 'it''s'", true),
        ("N gt 1000L and B eq true", true),
        ("N gt 1000", false),
        ("I le 7 and D lt 3.0", true),
        ("T ge datetime'2024-01-02T04:00:00+01:00'", true),
        ("Missing eq 1", false),
        ("not (Missing eq 1)", true),
    ] {
        assert_eq!(parse(filter).unwrap().matches(&e), want, "{filter}");
    }
}
