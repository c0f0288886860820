//! Unit tests of [`super`]: entities as the service writes and reads them.

use super::*;
use serde_json::json;

fn parse(text: &str) -> ServiceEntity {
    let mut de = serde_json::Deserializer::from_str(text);
    parse_service_entity(&mut de).unwrap()
}

fn entity(text: &str) -> Entity {
    match parse(text) {
        ServiceEntity::Entity(e) => e,
        other => panic!("{other:?}"),
    }
}

#[test]
fn values_pass_through_as_text_and_whole_doubles_keep_their_type() {
    let text = r#"{"odata.etag":"W/\"x\"","PartitionKey":"p","RowKey":"r","Timestamp":"2020-01-01T00:00:00Z",
        "Score":0.46464804158416084,"Whole":3.0,"Tiny":5e-324,"Int":3,
        "Big@odata.type":"Edm.Int64","Big":"9223372036854775807",
        "Nan@odata.type":"Edm.Double","Nan":"NaN","Lone":"x\ud800y","Date@odata.type":"Edm.DateTime",
        "Date":"2020-01-01T00:00:00.1234567Z"}"#;
    let e = entity(text);
    let p = &e.properties;
    assert_eq!(p.get("Score").unwrap().get(), "0.46464804158416084");
    assert_eq!(p.get("Whole").unwrap().get(), "3.0");
    assert_eq!(p.get_str("Whole@odata.type").as_deref(), Some("Edm.Double"));
    assert_eq!(p.get_str("Tiny@odata.type").as_deref(), Some("Edm.Double"));
    assert!(!p.contains_key("Int@odata.type"));
    assert!(!p.contains_key("Timestamp") && !p.contains_key("odata.etag"));
    assert_eq!(p.get("Lone").unwrap().get(), r#""x\ud800y""#);
    assert_eq!(
        p.get("Date").unwrap().get(),
        r#""2020-01-01T00:00:00.1234567Z""#
    );
    let written = serde_json::to_string(&e.wire()).unwrap();
    assert!(written.starts_with(r#"{"PartitionKey":"p","RowKey":"r","#));
    for fragment in [
        r#""Score":0.46464804158416084"#,
        r#""Lone":"x\ud800y""#,
        r#""Big":"9223372036854775807""#,
        r#""Whole":3.0"#,
        r#""Whole@odata.type":"Edm.Double""#,
    ] {
        assert!(written.contains(fragment), "{fragment} in {written}");
    }
    assert_eq!(e.wire_size(), written.len());
}

#[test]
fn keys_with_lone_surrogates_are_reported_not_parsed() {
    match parse(r#"{"PartitionKey":"b\ud800","RowKey":"r","V":1}"#) {
        ServiceEntity::Unaddressable(row) => {
            assert_eq!(row.partition_key_json, r#""b\ud800""#);
            assert!(row.to_string().contains(r#"PartitionKey "b\ud800""#));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn service_size_counts_utf16_and_types() {
    let mut e = Entity::new("pk", "r\u{1F600}"); // 2 + 3 UTF-16 units
    e.properties.insert("S", json!("a\u{1F600}")); // 3 units
    e.properties.insert("I", json!(7));
    e.properties.insert("D", json!(1.5));
    e.properties.insert("D@odata.type", json!("Edm.Double"));
    e.properties.insert("B", json!("AAAA")); // String unless annotated
    e.properties.insert("L", json!(true));
    let expected =
        4 + 2 * 5 + (8 + 2 + 4 + 6) + (8 + 2 + 4) + (8 + 2 + 8) + (8 + 2 + 4 + 8) + (8 + 2 + 1);
    assert_eq!(e.service_size(), expected);
    e.properties.insert("B@odata.type", json!("Edm.Binary"));
    assert_eq!(e.service_size(), expected - 8 + 3);
    assert_eq!(json_string_utf16_len(r#""x\ud800y\n\"""#), 5);
}

#[test]
fn names_given_twice_are_refused() {
    for text in [
        r#"{"PartitionKey":"p","PartitionKey":"q","RowKey":"r"}"#,
        r#"{"PartitionKey":"p","RowKey":"r","V":1,"V":2}"#,
    ] {
        let mut de = serde_json::Deserializer::from_str(text);
        let e = parse_service_entity(&mut de).unwrap_err().to_string();
        assert!(e.contains("is given twice"), "{e}");
    }
}

#[test]
fn limits_are_checked_as_the_service_counts() {
    let mut e = Entity::new("p", "r");
    e.properties.insert("S", json!("x".repeat(32 * 1024)));
    e.check_limits().unwrap();
    e.properties
        .insert("S", json!("\u{1F600}".repeat(16 * 1024 + 1)));
    let err = e.check_limits().unwrap_err().to_string();
    assert!(
        err.contains("property S") && err.contains("64 KiB"),
        "{err}"
    );
    let mut wide = Entity::new("p", "r");
    for i in 0..=MAX_CUSTOM_PROPERTIES {
        wide.properties.insert(format!("P{i}"), json!(i));
    }
    assert!(wide.check_limits().unwrap_err().to_string().contains("253"));
    let mut big = Entity::new("p", "r");
    for i in 0..17 {
        big.properties
            .insert(format!("S{i}"), json!("x".repeat(32_000)));
    }
    let err = big.check_limits().unwrap_err().to_string();
    assert!(err.contains("1 MiB"), "{err}");
}

/// Names with escapes are decoded before they are shared; the same name twice is still
/// refused when one of them is escaped.
#[test]
fn escaped_names_are_decoded_and_shared() {
    let e = entity(r#"{"PartitionKey":"p","RowKey":"r","T\u0069tle":"a","N\"q":1}"#);
    assert_eq!(e.properties.keys().collect::<Vec<_>>(), ["N\"q", "Title"]);
    let text = r#"{"PartitionKey":"p","RowKey":"r","Title":1,"T\u0069tle":2}"#;
    let mut de = serde_json::Deserializer::from_str(text);
    assert!(parse_service_entity(&mut de).is_err());
}

mod oracle {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(String, i64),
        Remove(String),
    }

    fn op() -> impl Strategy<Value = Op> {
        let name = prop::sample::select(vec!["A", "B", "B@odata.type", "Z", "a", "É", ""]);
        prop_oneof![
            (name.clone(), any::<i64>()).prop_map(|(n, v)| Op::Insert(n.into(), v)),
            name.prop_map(|n| Op::Remove(n.into())),
        ]
    }

    proptest! {
        /// The sorted vector behaves as a map in name order: inserts replace, removes return
        /// what was there, iteration and lookups agree with a `BTreeMap` given the same steps.
        #[test]
        fn properties_behave_as_an_ordered_map(ops in prop::collection::vec(op(), 0..40)) {
            let mut properties = Properties::default();
            let mut map: BTreeMap<String, String> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(name, v) => {
                        properties.insert(name.clone(), json!(v));
                        map.insert(name, v.to_string());
                    }
                    Op::Remove(name) => {
                        let got = properties.remove(&name).map(|raw| raw.get().to_string());
                        prop_assert_eq!(got, map.remove(&name));
                    }
                }
            }
            let got: Vec<(String, String)> =
                properties.iter().map(|(n, v)| (n.to_string(), v.get().to_string())).collect();
            let want: Vec<(String, String)> = map.clone().into_iter().collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(properties.len(), map.len());
            for name in ["A", "B", "Q"] {
                prop_assert_eq!(properties.get(name).map(|v| v.get().to_string()), map.get(name).cloned());
            }
        }
    }
}
