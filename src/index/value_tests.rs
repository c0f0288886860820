//! Typed values: literals parsed and rendered, stored properties read, canonical forms.

use proptest::prelude::*;
use serde_json::value::RawValue;

use super::value::tag;
use super::*;
use crate::storage::Properties;

fn literal(text: &str) -> IndexValue {
    IndexValue::from_literal(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// A one-property row as the service's JSON gives it: `value` is JSON text, `edm` its
/// annotation if any.
fn stored(value: &str, edm: Option<&str>) -> Result<Option<IndexValue>, ValueError> {
    let mut properties = Properties::default();
    properties.insert_raw("P", RawValue::from_string(value.to_string()).unwrap());
    if let Some(edm) = edm {
        properties.insert("P@odata.type", serde_json::json!(edm));
    }
    IndexValue::from_property(&properties, "P")
}

fn stored_ok(value: &str, edm: Option<&str>) -> IndexValue {
    stored(value, edm)
        .unwrap_or_else(|e| panic!("{value}: {e}"))
        .unwrap_or_else(|| panic!("{value}: no value"))
}

#[test]
fn literals_of_every_type_parse_as_their_type() {
    let cases = [
        ("'alice'", IndexValue::String("alice".into())),
        ("'it''s'", IndexValue::String("it's".into())),
        ("''", IndexValue::String(String::new())),
        ("'日本 🎉'", IndexValue::String("日本 🎉".into())),
        ("42", IndexValue::Int32(42)),
        ("-2147483648", IndexValue::Int32(i32::MIN)),
        ("42L", IndexValue::Int64(42)),
        ("-9223372036854775808L", IndexValue::Int64(i64::MIN)),
        ("1.5", IndexValue::Double(1.5)),
        ("3.0", IndexValue::Double(3.0)),
        ("2.5E-3", IndexValue::Double(0.0025)),
        ("true", IndexValue::Boolean(true)),
        ("false", IndexValue::Boolean(false)),
        (
            "datetime'1970-01-01T00:00:00.0000001Z'",
            IndexValue::DateTime(1),
        ),
        (
            "datetime'1969-12-31T23:59:59.9999999Z'",
            IndexValue::DateTime(-1),
        ),
        (
            "datetime'1970-01-01T01:00:00+01:00'",
            IndexValue::DateTime(0),
        ),
        (
            "guid'C56A4180-65AA-42EC-A945-5FD21DEC0538'",
            IndexValue::Guid(*uuid::uuid!("c56a4180-65aa-42ec-a945-5fd21dec0538").as_bytes()),
        ),
        ("X'0aFF'", IndexValue::Binary(vec![0x0A, 0xFF])),
        ("binary'00'", IndexValue::Binary(vec![0])),
        ("X''", IndexValue::Binary(vec![])),
        ("  7  ", IndexValue::Int32(7)),
    ];
    for (text, want) in cases {
        let got = literal(text);
        assert_eq!(got, want, "{text}");
        assert_eq!(got.edm_name(), want.edm_name(), "{text}");
    }
}

#[test]
fn malformed_literals_are_refused_with_a_reason() {
    for (text, says) in [
        ("", "not a filter literal"),
        ("'abc", "unterminated"),
        ("12x", "not a number literal"),
        ("2147483648", "Int32 range"),
        ("guid'nope'", "not a GUID"),
        ("X'0'", "not binary"),
        ("datetime'2024-01-01'", "RFC 3339"),
        ("datetime'2024-01-01T00:00:00.00000001Z'", "100 ns"),
        ("alice", "a string is quoted: 'alice'"),
        ("'a' eq 'b'", "not a filter literal"),
        ("1 and V eq 2", "not one filter literal"),
        ("1e999", "Double range"),
    ] {
        let e = IndexValue::from_literal(text).unwrap_err().to_string();
        assert!(e.contains(says), "{text:?}: {e}");
    }
}

/// Literals longer than a filter (2,048 characters) are read too: strings up to the 32K
/// characters the service stores, binaries up to 64 KiB; anything else that long is refused.
#[test]
fn long_string_and_binary_literals_are_read() {
    for n in [2_043usize, 2_044, 2_047, 32_000] {
        let text = "x'".repeat(n / 2);
        let literal = format!("'{}'", text.replace('\'', "''"));
        assert_eq!(
            IndexValue::from_literal(&literal).unwrap(),
            IndexValue::String(text.clone()),
            "{n}"
        );
    }
    let bytes: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
    let hex: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
    for prefix in ["X", "binary"] {
        assert_eq!(
            IndexValue::from_literal(&format!("{prefix}'{hex}'")).unwrap(),
            IndexValue::Binary(bytes.clone())
        );
    }
    let long = "y".repeat(3000);
    for (text, says) in [
        (format!("'{long}'x"), "string"),
        (format!("'{long}'{long}'"), "lone quote"),
        (format!("X'{long}'"), "hex"),
        (format!("X'0{}'", "00".repeat(1500)), "hex"),
        (format!("guid'{long}'"), "string"),
        ("1".repeat(3000), "string"),
    ] {
        let e = IndexValue::from_literal(&text).unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn types_are_kept_apart_as_the_service_compares_them() {
    let three = ["3", "3L", "3.0", "'3'", "X'03'"].map(literal);
    for (i, a) in three.iter().enumerate() {
        for b in &three[i + 1..] {
            assert_ne!(a, b);
            assert_ne!(a.index_hash(), b.index_hash());
        }
    }
    assert_eq!(three[0].canonical_bytes(), [tag::INT32, 3, 0, 0, 0]);
    assert_eq!(literal("'A'"), IndexValue::String("A".into()));
    assert_ne!(literal("'A'"), literal("'a'"), "strings compare exactly");
}

#[test]
fn doubles_merge_zeros_and_nans_but_render_as_given() {
    let (zero, negative) = (literal("0.0"), literal("-0.0"));
    assert_eq!(zero, negative);
    assert_eq!(zero.index_hash(), negative.index_hash());
    assert_eq!(negative.to_literal().unwrap(), "-0.0");
    let nans = [f64::NAN, -f64::NAN, f64::from_bits(0x7FF0_0000_0000_0001)];
    for nan in nans {
        assert_eq!(IndexValue::Double(nan), IndexValue::Double(f64::NAN));
        assert!(IndexValue::Double(nan).to_literal().is_err());
    }
    assert!(IndexValue::Double(f64::INFINITY).to_literal().is_err());
    assert_ne!(
        IndexValue::Double(f64::INFINITY),
        IndexValue::Double(f64::MAX)
    );
    assert_ne!(literal("1.0"), literal("1.0000000000000002"));
}

#[test]
fn stored_values_key_like_the_literals_that_match_them() {
    let cases = [
        (r#""alice""#, None, "'alice'"),
        (r#""it's""#, Some("Edm.String"), "'it''s'"),
        ("42", None, "42"),
        ("42", Some("Edm.Int32"), "42"),
        (r#""42""#, Some("Edm.Int64"), "42L"),
        ("42", Some("Edm.Int64"), "42L"),
        (
            r#""9223372036854775807""#,
            Some("Edm.Int64"),
            "9223372036854775807L",
        ),
        ("3.0", None, "3.0"),
        ("3", Some("Edm.Double"), "3.0"),
        ("1e300", Some("Edm.Double"), "1.0E+300"),
        ("-0.0", Some("Edm.Double"), "0.0"),
        ("true", None, "true"),
        (
            r#""2024-01-01T00:00:00Z""#,
            Some("Edm.DateTime"),
            "datetime'2024-01-01T00:00:00Z'",
        ),
        (
            r#""2024-01-01T00:00:00.1234567Z""#,
            Some("Edm.DateTime"),
            "datetime'2024-01-01T00:00:00.1234567Z'",
        ),
        // Digits below 100 ns (the service keeps none) are dropped; no offset reads as UTC.
        (
            r#""2024-01-01T00:00:00.123456789Z""#,
            Some("Edm.DateTime"),
            "datetime'2024-01-01T00:00:00.1234567Z'",
        ),
        (
            r#""2024-01-01T00:00:00""#,
            Some("Edm.DateTime"),
            "datetime'2024-01-01T00:00:00Z'",
        ),
        (
            r#""2024-01-01T02:00:00+02:00""#,
            Some("Edm.DateTime"),
            "datetime'2024-01-01T00:00:00Z'",
        ),
        (
            r#""C56A4180-65AA-42EC-A945-5FD21DEC0538""#,
            Some("Edm.Guid"),
            "guid'c56a4180-65aa-42ec-a945-5fd21dec0538'",
        ),
        (r#""AAr/""#, Some("Edm.Binary"), "X'000AFF'"),
        (r#""""#, Some("Edm.Binary"), "X''"),
        (r#""""#, None, "''"),
    ];
    for (json, edm, text) in cases {
        assert_eq!(
            stored_ok(json, edm),
            literal(text),
            "{json} {edm:?} vs {text}"
        );
    }
    assert_eq!(
        stored_ok(r#""NaN""#, Some("Edm.Double")),
        IndexValue::Double(f64::NAN)
    );
    assert_eq!(
        stored_ok(r#""-Infinity""#, Some("Edm.Double")),
        IndexValue::Double(f64::NEG_INFINITY)
    );
    // A lone surrogate (the service stores it, Rust's String cannot hold it) keys as U+FFFD.
    assert_eq!(
        stored_ok(r#""a\ud800b""#, None),
        IndexValue::String("a\u{FFFD}b".into())
    );
    assert_eq!(stored_ok(r#""\u00e9\n""#, None), literal("'é\n'"));
}

#[test]
fn rows_without_the_value_are_not_indexed_and_bad_values_are_named() {
    assert_eq!(stored("null", Some("Edm.Int64")), Ok(None));
    assert_eq!(
        IndexValue::from_property(&Properties::default(), "P"),
        Ok(None)
    );
    for (json, edm) in [
        (r#""x""#, Some("Edm.Int64")),
        ("2147483648", None),
        (r#""nope""#, Some("Edm.Guid")),
        (r#""A""#, Some("Edm.Binary")),
        ("1", Some("Edm.Decimal")),
        ("[1]", None),
        (r#""yesterday""#, Some("Edm.DateTime")),
    ] {
        let e = stored(json, edm).unwrap_err().to_string();
        assert!(e.contains("property P"), "{json}: {e}");
    }
}

#[test]
fn datetimes_render_at_the_service_precision() {
    for text in [
        "datetime'1601-01-01T00:00:00Z'",
        "datetime'9999-12-31T23:59:59.9999999Z'",
        "datetime'2024-02-29T12:34:56.0000001Z'",
    ] {
        assert_eq!(literal(text).to_literal().unwrap(), text);
    }
    assert!(IndexValue::DateTime(i64::MIN).to_literal().is_err());
    assert!(IndexValue::DateTime(i64::MAX).to_literal().is_err());
}

/// Values of every type, tricky ones often.
pub(super) fn any_value() -> impl Strategy<Value = IndexValue> {
    prop_oneof![
        prop_oneof![Just(String::new()), "'*", "\\PC{0,12}", "[a-c]{0,3}"]
            .prop_map(IndexValue::String),
        prop_oneof![Just(i32::MIN), Just(i32::MAX), Just(0), any::<i32>()]
            .prop_map(IndexValue::Int32),
        prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0), any::<i64>()]
            .prop_map(IndexValue::Int64),
        prop_oneof![
            Just(0.0),
            Just(-0.0),
            Just(f64::MIN_POSITIVE),
            Just(f64::MAX),
            Just(5e-324),
            any::<f64>().prop_filter("finite", |x| x.is_finite()),
            (-1000i32..1000).prop_map(f64::from),
        ]
        .prop_map(IndexValue::Double),
        any::<bool>().prop_map(IndexValue::Boolean),
        // Years 1601 to 9999, in ticks since 1970.
        (-116_444_736_000_000_000i64..2_534_023_007_999_999_999).prop_map(IndexValue::DateTime),
        any::<[u8; 16]>().prop_map(IndexValue::Guid),
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(IndexValue::Binary),
    ]
}

proptest! {
    #[test]
    fn every_value_renders_as_a_literal_that_parses_back(value in any_value()) {
        let text = value.to_literal().unwrap();
        let back = IndexValue::from_literal(&text).unwrap();
        prop_assert_eq!(&back, &value, "{}", text);
        prop_assert_eq!(back.edm_name(), value.edm_name());
        prop_assert_eq!(back.canonical_bytes(), value.canonical_bytes());
        prop_assert_eq!(back.to_literal().unwrap(), text);
    }
}
