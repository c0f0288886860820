//! Tests of the export format. Oracles independent of the code under test: doubles are checked
//! against the random bit patterns they were made from (Rust's correctly rounded
//! `str::parse::<f64>`), files are read and written by the system's `gzip` and by JSON built by
//! hand, and every property is compared as JSON text, byte for byte.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};

use proptest::prelude::{any, prop, prop_assert_eq, proptest, ProptestConfig};
use proptest::strategy::Strategy;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use serde_json::value::RawValue;

use super::*;

/// One generated property: its name, JSON text, annotation, and (doubles) the bits it stands for.
#[derive(Debug, Clone)]
struct Generated {
    text: String,
    annotation: Option<&'static str>,
    /// `Some(bits)` for a double (NaN: any NaN).
    bits: Option<u64>,
}

/// The texts a service or a tool may use for a double with these bits (all parse back to them).
fn double_texts(bits: u64) -> Vec<String> {
    let v = f64::from_bits(bits);
    if v.is_nan() {
        return vec!["\"NaN\"".into()];
    }
    if v.is_infinite() {
        return vec![if v > 0.0 {
            "\"Infinity\""
        } else {
            "\"-Infinity\""
        }
        .into()];
    }
    let shortest = format!("{v:?}"); // "0.1", "1e308", "-0.0", "5e-324"
    let js = shortest.replace("e", "e+").replace("e+-", "e-"); // "1e+308"
    let dotnet = format!("{v:E}").replace("E", "E+").replace("E+-", "E-"); // "1E+308"
    let seventeen = format!("{v:.16e}"); // "1.0000000000000000e0"
    vec![shortest, js, dotnet, seventeen]
}

/// A double's value from its JSON text, by Rust's parser (not serde_json's).
fn parse_double(text: &str) -> f64 {
    match text {
        "\"NaN\"" => f64::NAN,
        "\"Infinity\"" => f64::INFINITY,
        "\"-Infinity\"" => f64::NEG_INFINITY,
        number => number.parse().unwrap_or_else(|e| panic!("{number}: {e}")),
    }
}

fn double(bits: u64, form: usize) -> Generated {
    let texts = double_texts(bits);
    let text = texts[form % texts.len()].clone();
    let parsed = parse_double(&text);
    assert!(
        parsed.to_bits() == bits || (parsed.is_nan() && f64::from_bits(bits).is_nan()),
        "the generator's text {text} is not the double {bits:#x}"
    );
    Generated {
        text,
        annotation: Some("Edm.Double"),
        bits: Some(bits),
    }
}

fn string_text() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..24).prop_map(|chars| {
        let s: String = chars.into_iter().collect();
        serde_json::to_string(&s).unwrap()
    })
}

/// Any property of any EDM type, as the service's JSON would hold it.
fn property() -> impl Strategy<Value = Generated> {
    let plain = |text: String| Generated {
        text,
        annotation: None,
        bits: None,
    };
    let typed = |text: String, annotation| Generated {
        text,
        annotation: Some(annotation),
        bits: None,
    };
    prop::strategy::Union::new(vec![
        string_text().prop_map(plain).boxed(),
        // A lone surrogate, which only JSON's escape can carry.
        (0xD800u32..0xE000)
            .prop_map(move |u| plain(format!("\"x\\u{u:04x}y\"")))
            .boxed(),
        any::<bool>()
            .prop_map(move |b| plain(b.to_string()))
            .boxed(),
        any::<i32>().prop_map(move |i| plain(i.to_string())).boxed(),
        any::<i64>()
            .prop_map(move |i| typed(format!("\"{i}\""), "Edm.Int64"))
            .boxed(),
        (any::<u64>(), 0usize..4)
            .prop_map(|(bits, form)| double(bits, form))
            .boxed(),
        (0i64..253_402_300_799, 0u32..10_000_000)
            .prop_map(move |(secs, ticks)| {
                let t = OffsetDateTime::from_unix_timestamp(secs - 11_644_473_600).unwrap();
                let date = t
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap();
                let text = format!("\"{}.{ticks:07}Z\"", date.trim_end_matches('Z'));
                typed(text, "Edm.DateTime")
            })
            .boxed(),
        any::<u128>()
            .prop_map(move |u| {
                typed(
                    format!("\"{}\"", uuid::Uuid::from_u128(u).hyphenated()),
                    "Edm.Guid",
                )
            })
            .boxed(),
        prop::collection::vec(any::<u8>(), 0..64)
            .prop_map(move |bytes| {
                use base64::Engine;
                let text = base64::engine::general_purpose::STANDARD.encode(bytes);
                typed(format!("\"{text}\""), "Edm.Binary")
            })
            .boxed(),
    ])
}

fn key() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..16).prop_map(|c| c.into_iter().collect())
}

/// An entity, and whether each double's annotation is left out of its source (the encoder must
/// add it back).
fn entity() -> impl Strategy<Value = (Entity, BTreeMap<String, Generated>)> {
    (
        key(),
        key(),
        prop::collection::vec((property(), any::<bool>()), 0..12),
    )
        .prop_map(|(pk, rk, props)| {
            let mut entity = Entity::new(pk, rk);
            let mut expected = BTreeMap::new();
            for (i, (generated, drop_double_annotation)) in props.into_iter().enumerate() {
                let name = format!("P{i}_é");
                let raw = RawValue::from_string(generated.text.clone()).unwrap();
                entity.properties.insert_raw(&name, raw);
                let unannotated_double = drop_double_annotation
                    && generated.bits.is_some()
                    && generated.text.contains(['.', 'e', 'E']);
                if let (Some(annotation), false) = (generated.annotation, unannotated_double) {
                    entity
                        .properties
                        .insert(format!("{name}@odata.type"), json!(annotation));
                }
                expected.insert(name, generated);
            }
            (entity, expected)
        })
}

/// Every generated property came back as the same text, with its annotation, and each double
/// stands for the bits it was made from.
fn assert_decoded(decoded: &Entity, source: &Entity, expected: &BTreeMap<String, Generated>) {
    assert_eq!(decoded.partition_key, source.partition_key);
    assert_eq!(decoded.row_key, source.row_key);
    let texts = decoded
        .properties
        .iter()
        .map(|(name, raw)| (name.to_string(), raw.get().to_string()))
        .collect();
    assert_texts(&texts, expected);
}

/// `texts` (property name -> JSON text) holds exactly the generated properties, each with its
/// annotation, each double the bits it was made from.
fn assert_texts(texts: &BTreeMap<String, String>, expected: &BTreeMap<String, Generated>) {
    for (name, generated) in expected {
        let text = &texts[name];
        assert_eq!(text, &generated.text, "{name}");
        let annotation = texts.get(&format!("{name}@odata.type"));
        let expected_annotation = generated.annotation.map(|a| format!("\"{a}\""));
        assert_eq!(annotation, expected_annotation.as_ref(), "{name}");
        if let Some(bits) = generated.bits {
            let value = parse_double(text);
            assert!(
                value.to_bits() == bits || (value.is_nan() && f64::from_bits(bits).is_nan()),
                "{name}: {text} is not {bits:#x}"
            );
        }
    }
    // Nothing else: one annotation per annotated property, no strays.
    let annotated = expected.values().filter(|g| g.annotation.is_some()).count();
    assert_eq!(texts.len(), expected.len() + annotated);
}

/// The file's lines as read without our decoder: each line's keys, and its members as text.
fn file_lines(bytes: &[u8]) -> Vec<(String, String, BTreeMap<String, String>)> {
    let mut text = String::new();
    MultiGzDecoder::new(bytes)
        .read_to_string(&mut text)
        .unwrap();
    let body = text.strip_suffix('\n').unwrap_or(&text);
    if body.is_empty() {
        return Vec::new();
    }
    body.split('\n')
        .map(|line| {
            let members: BTreeMap<String, Box<RawValue>> = serde_json::from_str(line).unwrap();
            let mut texts: BTreeMap<String, String> = members
                .into_iter()
                .map(|(k, v)| (k, v.get().to_string()))
                .collect();
            let mut key = |name: &str| -> String {
                serde_json::from_str(&texts.remove(name).unwrap()).unwrap()
            };
            let (pk, rk) = (key("PartitionKey"), key("RowKey"));
            (pk, rk, texts)
        })
        .collect()
}

/// Both the file's own lines and our decoder's entities hold every generated property.
fn assert_part(part: &EncodedPart, rows: &[(Entity, BTreeMap<String, Generated>)]) {
    let lines = file_lines(&part.bytes);
    assert_eq!(lines.len(), rows.len());
    for ((pk, rk, texts), (source, expected)) in lines.iter().zip(rows) {
        assert_eq!((pk, rk), (&source.partition_key, &source.row_key));
        assert_texts(texts, expected);
    }
    let decoded = decode_part(
        &part.bytes,
        part.rows,
        &part.sha256,
        &DecodeLimits::default(),
    )
    .unwrap();
    assert_eq!(decoded.len(), rows.len());
    for ((source, expected), decoded) in rows.iter().zip(&decoded) {
        assert_decoded(decoded, source, expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn encode_then_decode_gives_back_every_property_byte_for_byte(
        rows in prop::collection::vec(entity(), 0..24)
    ) {
        let part = encode_part(rows.iter().map(|(e, _)| e)).unwrap();
        prop_assert_eq!(part.rows, rows.len() as u64);
        prop_assert_eq!(&part.sha256, &sha256_hex(&part.bytes));
        assert_part(&part, &rows);
    }
}

/// 4,096 random double bit patterns (and the special values), in every text form, through one
/// part; each decoded double has the bits it was made from.
#[test]
fn thousands_of_random_doubles_keep_their_bits() {
    let mut rng = StdRng::seed_from_u64(0x7AB1_E5CA_2026);
    let mut bits: Vec<u64> = (0..4096).map(|_| rng.gen()).collect();
    for special in [
        0.0f64,
        -0.0,
        5e-324,
        -5e-324,
        f64::MIN_POSITIVE,
        f64::MAX,
        f64::MIN,
        f64::EPSILON,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.1,
        1e21,
        9007199254740993.0,
    ] {
        bits.push(special.to_bits());
    }
    let mut rows = Vec::new();
    for (i, chunk) in bits.chunks(200).enumerate() {
        let mut entity = Entity::new("doubles", format!("{i:04}"));
        let mut expected = BTreeMap::new();
        for (j, &b) in chunk.iter().enumerate() {
            let generated = double(b, i + j);
            let name = format!("D{j}");
            entity.properties.insert_raw(
                &name,
                RawValue::from_string(generated.text.clone()).unwrap(),
            );
            // Half the source rows carry the service's annotation, half rely on the encoder.
            if i % 2 == 0 || generated.text.starts_with('"') {
                entity
                    .properties
                    .insert(format!("{name}@odata.type"), json!("Edm.Double"));
            }
            expected.insert(name, generated);
        }
        rows.push((entity, expected));
    }
    let part = encode_part(rows.iter().map(|(e, _)| e)).unwrap();
    assert_part(&part, &rows);
    let checked: usize = rows.iter().map(|(_, expected)| expected.len()).sum();
    assert!(checked >= 4096 + 14, "{checked}");
}

/// Runs `program args` with `input` on stdin; its stdout.
fn pipe(program: &str, args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} is needed by this test: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(output.status.success(), "{program} {args:?} failed");
    output.stdout
}

/// What we write, another tool reads: the system's `gunzip`, then a JSON reader that is not
/// ours, line by line. Every line has the keys, every property's text and its annotations.
#[test]
fn another_tool_reads_what_we_write() {
    let mut e = Entity::new("p\u{2028}1", "r\"1");
    for (name, text) in [
        ("S", r#""a\u0000b\ud800""#),
        ("I", "-7"),
        ("B", "true"),
        ("D", "0.46464804158416084"),
    ] {
        e.properties
            .insert_raw(name, RawValue::from_string(text.into()).unwrap());
    }
    e.properties.insert("L", json!("9223372036854775807"));
    e.properties.insert("L@odata.type", json!("Edm.Int64"));
    let part = encode_part([&e, &Entity::new("p2", "r2")]).unwrap();
    let text = pipe("gzip", &["-dc"], &part.bytes);
    let text = String::from_utf8(text).unwrap();
    assert!(text.ends_with('\n'));
    let lines: Vec<&str> = text.split('\n').filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 2);
    let first: BTreeMap<String, Box<RawValue>> = serde_json::from_str(lines[0]).unwrap();
    let texts: BTreeMap<&str, &str> = first.iter().map(|(k, v)| (k.as_str(), v.get())).collect();
    assert_eq!(texts["PartitionKey"], "\"p\u{2028}1\"");
    assert_eq!(texts["RowKey"], r#""r\"1""#);
    assert_eq!(texts["S"], r#""a\u0000b\ud800""#);
    assert_eq!(texts["D"], "0.46464804158416084");
    assert_eq!(texts["D@odata.type"], "\"Edm.Double\"");
    assert_eq!(texts["L"], "\"9223372036854775807\"");
    assert_eq!(texts["L@odata.type"], "\"Edm.Int64\"");
    assert_eq!(texts["I"], "-7");
    assert!(!texts.contains_key("I@odata.type") && !texts.contains_key("B@odata.type"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(lines[1]).unwrap(),
        json!({"PartitionKey": "p2", "RowKey": "r2"})
    );
}

/// What another tool writes, we read: lines built by hand (`json!` for every type but the
/// double, whose text is spliced in), `\r\n` line ends, the service's read-only members, two
/// gzip members (one from the system's `gzip`, one with a file name and time in its header).
#[test]
fn we_read_what_another_tool_writes() {
    let first = json!({
        "odata.etag": "W/\"datetime'2026-01-01T00%3A00%3A00Z'\"",
        "PartitionKey": "pk", "RowKey": "rk", "Timestamp": "2026-01-01T00:00:00Z",
        "Name": "a\u{1F600}b", "Count": 42, "Flag": false,
        "Big": "-9223372036854775808", "Big@odata.type": "Edm.Int64",
        "When": "1601-01-01T00:00:00.0000001Z", "When@odata.type": "Edm.DateTime",
        "Id": "c9da6455-213d-42c9-9a79-3e9149a57833", "Id@odata.type": "Edm.Guid",
        "Blob": "AAEC/w==", "Blob@odata.type": "Edm.Binary",
    })
    .to_string();
    let first = format!(
        "{},\"Score\":1.7976931348623157E+308,\"Score@odata.type\":\"Edm.Double\"}}",
        first.trim_end_matches('}')
    );
    let second = json!({"PartitionKey": "pk", "RowKey": "rk2", "Whole": 3}).to_string();
    let mut bytes = pipe("gzip", &["-c"], format!("{first}\r\n").as_bytes());
    let mut member = flate2::GzBuilder::new()
        .filename("second.jsonl")
        .mtime(1_767_225_600)
        .write(Vec::new(), flate2::Compression::best());
    member.write_all(second.as_bytes()).unwrap(); // no final line break
    bytes.extend(member.finish().unwrap());
    let sha = sha256_hex(&bytes);
    let decoded = decode_part(&bytes, 2, &sha.to_uppercase(), &DecodeLimits::default()).unwrap();
    let p = &decoded[0].properties;
    assert_eq!(
        (
            decoded[0].partition_key.as_str(),
            decoded[0].row_key.as_str()
        ),
        ("pk", "rk")
    );
    for (name, text) in [
        ("Name", "\"a\u{1F600}b\""),
        ("Count", "42"),
        ("Flag", "false"),
        ("Big", "\"-9223372036854775808\""),
        ("When", "\"1601-01-01T00:00:00.0000001Z\""),
        ("When@odata.type", "\"Edm.DateTime\""),
        ("Id@odata.type", "\"Edm.Guid\""),
        ("Blob", "\"AAEC/w==\""),
        ("Score", "1.7976931348623157E+308"),
    ] {
        assert_eq!(p.get(name).unwrap().get(), text, "{name}");
    }
    assert_eq!(
        parse_double(p.get("Score").unwrap().get()).to_bits(),
        f64::MAX.to_bits()
    );
    assert!(!p.contains_key("Timestamp") && !p.contains_key("odata.etag"));
    assert_eq!(p.len(), 13);
    assert_eq!(decoded[1].properties.get("Whole").unwrap().get(), "3");
    assert!(!decoded[1].properties.contains_key("Whole@odata.type"));
}

#[test]
fn a_mismatch_names_what_differed() {
    let rows = [Entity::new("a", "1"), Entity::new("a", "2")];
    let part = encode_part(&rows).unwrap();
    let limits = DecodeLimits::default();
    let wrong = "0".repeat(64);
    let e = decode_part(&part.bytes, 2, &wrong, &limits).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "SHA-256 mismatch: the manifest says {wrong}, the blob's bytes hash to {}",
            part.sha256
        )
    );
    let e = decode_part(&part.bytes, 3, &part.sha256, &limits).unwrap_err();
    assert_eq!(
        e.to_string(),
        "row count mismatch: the manifest says 3 rows, the part holds 2"
    );
    let e = decode_part(&part.bytes, 1, &part.sha256, &limits).unwrap_err();
    assert!(e.to_string().contains("holds more than 1"), "{e}");
    // A flipped byte is caught by the digest before anything is inflated.
    let mut flipped = part.bytes.to_vec();
    flipped[12] ^= 1;
    assert!(matches!(
        decode_part(&flipped, 2, &part.sha256, &limits),
        Err(ExportFormatError::ChecksumMismatch { .. })
    ));
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn decode_with(bytes: &[u8], rows: u64, limits: DecodeLimits) -> Result<Vec<Entity>> {
    decode_part(bytes, rows, &sha256_hex(bytes), &limits)
}

/// A zip bomb (64 MiB of one byte, 64 KiB compressed) fails at the bound, and so does one line
/// longer than the line bound, whatever the total.
#[test]
fn bombs_and_long_lines_fail_at_their_bounds() {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
    let chunk = vec![b'{'; 1 << 20];
    for _ in 0..64 {
        encoder.write_all(&chunk).unwrap();
    }
    let bomb = encoder.finish().unwrap();
    assert!(bomb.len() < 256 * 1024, "{}", bomb.len());
    let limits = DecodeLimits {
        max_decompressed_bytes: 1 << 20,
        max_line_bytes: 4 << 20,
    };
    assert_eq!(
        decode_with(&bomb, 1, limits).unwrap_err(),
        ExportFormatError::TooLarge { limit: 1 << 20 }
    );
    let small_lines = DecodeLimits {
        max_decompressed_bytes: 1 << 30,
        max_line_bytes: 1000,
    };
    assert_eq!(
        decode_with(&bomb, 1, small_lines).unwrap_err(),
        ExportFormatError::LineTooLong {
            line: 1,
            limit: 1000
        }
    );
    // A line of exactly the bound is fine; one byte more is not.
    let line = |len: usize| {
        let filler = "x".repeat(len - r#"{"PartitionKey":"","RowKey":""}"#.len());
        format!("{{\"PartitionKey\":\"{filler}\",\"RowKey\":\"\"}}\n")
    };
    let limits = DecodeLimits {
        max_decompressed_bytes: 1 << 20,
        max_line_bytes: 100,
    };
    let ok = gzip(format!("{}{}", line(100), line(100)).as_bytes());
    assert_eq!(decode_with(&ok, 2, limits).unwrap().len(), 2);
    let long = gzip(format!("{}{}", line(100), line(101)).as_bytes());
    assert_eq!(
        decode_with(&long, 2, limits).unwrap_err(),
        ExportFormatError::LineTooLong {
            line: 2,
            limit: 100
        }
    );
}

#[test]
fn bad_files_and_lines_are_refused_with_their_line_number() {
    let limits = DecodeLimits::default();
    let ok = r#"{"PartitionKey":"a","RowKey":"b"}"#;
    let cases: [(Vec<u8>, &str); 7] = [
        (b"not gzip at all".to_vec(), "not a valid gzip file"),
        (
            [gzip(format!("{ok}\n").as_bytes()), b"trailing".to_vec()].concat(),
            "not a valid gzip file",
        ),
        (
            gzip(format!("{ok}\n\n{ok}\n").as_bytes()),
            "line 2: is empty",
        ),
        (
            gzip(format!("{ok} x\n").as_bytes()),
            "line 1: not an entity",
        ),
        (gzip(b"[1,2]\n"), "line 1: not an entity"),
        (gzip(br#"{"PartitionKey":"a"}"#), "line 1: not an entity"),
        (
            gzip(br#"{"PartitionKey":"a\ud800","RowKey":"b"}"#),
            "line 1: row (PartitionKey \"a\\ud800\"",
        ),
    ];
    for (bytes, expected) in cases {
        let e = decode_with(&bytes, 2, limits).unwrap_err().to_string();
        assert!(e.contains(expected), "{e:?} should say {expected:?}");
    }
    // An empty part is a gzip file with no lines.
    let empty = encode_part(&Vec::<Entity>::new()).unwrap();
    assert!(!empty.bytes.is_empty());
    assert_eq!(decode_with(&empty.bytes, 0, limits).unwrap(), vec![]);
}

#[test]
fn the_encoder_refuses_what_could_not_be_read_back() {
    let mut e = Entity::new("p", "r");
    e.properties
        .insert_raw("A", RawValue::from_string("[1,\n2]".into()).unwrap());
    let error = encode_part([&e]).unwrap_err().to_string();
    assert!(
        error.contains(r#"row ("p", "r")"#) && error.contains("line break"),
        "{error}"
    );
    let mut big = Entity::new("p", "r");
    big.properties
        .insert("S", json!("x".repeat(MAX_LINE_BYTES)));
    let error = encode_part([&big]).unwrap_err().to_string();
    assert!(error.contains("4194304-byte bound"), "{error}");
}
