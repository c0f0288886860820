//! A realistic, deterministic source table for the demo, the benchmark and tests: partition keys
//! shaped like NuGet package IDs with a skewed prefix distribution (many IDs under a few big
//! namespaces such as `Microsoft.` and `System.`, a long tail of short ones), row keys like
//! versions, and one property of every Edm type.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::storage::{Entity, Properties};

const NAMESPACES: &[(&str, u32)] = &[
    ("Microsoft.", 30),
    ("System.", 14),
    ("Azure.", 8),
    ("AWSSDK.", 6),
    ("Newtonsoft.", 2),
    ("NuGet.", 3),
    ("Serilog.", 3),
    ("Xamarin.", 4),
    ("Google.", 3),
    ("", 27),
];
const WORDS: &[&str] = &[
    "Extensions",
    "Core",
    "Json",
    "Http",
    "Logging",
    "Data",
    "Sql",
    "Identity",
    "AspNetCore",
    "Configuration",
    "Caching",
    "Storage",
    "Blobs",
    "Tables",
    "Queues",
    "Security",
    "Runtime",
    "Collections",
    "Threading",
    "Text",
    "Net",
    "IO",
    "Linq",
    "Reflection",
    "Diagnostics",
    "Hosting",
    "Options",
    "Primitives",
    "Abstractions",
    "Client",
    "Server",
    "Tools",
    "Analyzers",
    "Compilers",
    "Build",
    "Tasks",
    "Mvc",
    "Razor",
    "Web",
    "Forms",
    "Android",
    "iOS",
    "Maps",
    "Auth",
];

/// Rows per partition key: mostly a few versions, sometimes many (popular packages).
#[derive(Debug, Clone, Copy)]
pub struct RowsPerKey {
    /// Average rows per partition key (≥ 1).
    pub mean: f64,
}

impl Default for RowsPerKey {
    fn default() -> Self {
        RowsPerKey { mean: 3.0 }
    }
}

/// Generates partition keys in no particular order, each with its row count, until `rows` rows.
pub fn partition_keys(rows: u64, seed: u64, per_key: RowsPerKey) -> Vec<(String, u32)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let total_weight: u32 = NAMESPACES.iter().map(|(_, w)| w).sum();
    let mut seen = std::collections::HashSet::new();
    let mut keys = Vec::new();
    let mut remaining = rows;
    while remaining > 0 {
        let mut pick = rng.gen_range(0..total_weight);
        let namespace = NAMESPACES
            .iter()
            .find(|(_, w)| {
                if pick < *w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .map(|(n, _)| *n)
            .unwrap_or("");
        let parts = rng.gen_range(1..=3);
        let mut id = namespace.to_string();
        for i in 0..parts {
            if i > 0 {
                id.push('.');
            }
            id.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
        }
        if namespace.is_empty() && rng.gen_bool(0.5) {
            // The long tail: short, lower-case community package names.
            id = format!(
                "{}{}",
                WORDS[rng.gen_range(0..WORDS.len())].to_lowercase(),
                rng.gen_range(0..10_000)
            );
        }
        if !seen.insert(id.clone()) {
            continue;
        }
        // Geometric-ish counts with the requested mean; a few packages have many versions.
        let count = if rng.gen_bool(0.01) {
            rng.gen_range(20..=200)
        } else {
            let p = 1.0 / per_key.mean.max(1.0);
            let mut n = 1;
            while !rng.gen_bool(p.clamp(0.01, 1.0)) && n < 60 {
                n += 1;
            }
            n
        };
        let count = (count as u64).min(remaining) as u32;
        remaining -= count as u64;
        keys.push((id, count));
    }
    keys
}

/// The row key of version `index` of a package: semantic-version-like text.
pub fn version(index: u32) -> String {
    format!("{}.{}.{}", index / 100, (index / 10) % 10, index % 10)
}

fn typed(props: &mut Properties, name: &str, value: Value, edm: Option<&str>) {
    props.insert(name, value);
    if let Some(t) = edm {
        props.insert(format!("{name}@odata.type"), json!(t));
    }
}

/// The row for version `index` of package `id`, with string, Int32, Int64, Double, Boolean,
/// DateTime, Binary and Guid properties derived deterministically from the keys.
pub fn entity(id: &str, index: u32) -> Entity {
    let mut e = Entity::new(id, version(index));
    let h = fxhash(id) ^ u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let p = &mut e.properties;
    typed(p, "Title", json!(format!("{id} {}", version(index))), None);
    typed(p, "Authors", json!(format!("author{}", h % 997)), None);
    typed(p, "VersionIndex", json!(index), None);
    typed(
        p,
        "Downloads",
        json!((h % 50_000_000_000).to_string()),
        Some("Edm.Int64"),
    );
    typed(
        p,
        "Rating",
        json!((h % 50) as f64 / 10.0),
        Some("Edm.Double"),
    );
    typed(p, "Listed", json!(h % 7 != 0), None);
    let day = 1_420_070_400 + (h % 300_000_000) as i64;
    let published = time::OffsetDateTime::from_unix_timestamp(day).expect("valid time");
    typed(
        p,
        "Published",
        json!(published
            .format(&time::format_description::well_known::Rfc3339)
            .expect("formats")),
        Some("Edm.DateTime"),
    );
    let bytes: Vec<u8> = (0..16)
        .map(|i| (h >> (i % 8 * 8)) as u8 ^ i as u8)
        .collect();
    typed(
        p,
        "Hash",
        json!(base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            bytes
        )),
        Some("Edm.Binary"),
    );
    let g = format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        h as u32,
        (h >> 32) as u16,
        (h >> 48) as u16 & 0xfff,
        index & 0xfff,
        h & 0xffff_ffff_ffff
    );
    typed(p, "PackageId", json!(g), Some("Edm.Guid"));
    e
}

/// Every row of the dataset, grouped by partition key (in generation order, not key order).
pub fn entities(rows: u64, seed: u64, per_key: RowsPerKey) -> impl Iterator<Item = Vec<Entity>> {
    partition_keys(rows, seed, per_key)
        .into_iter()
        .map(|(id, count)| (0..count).map(|i| entity(&id, i)).collect())
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_skewed_and_exact_in_size() {
        let a = partition_keys(10_000, 1, RowsPerKey::default());
        let b = partition_keys(10_000, 1, RowsPerKey::default());
        assert_eq!(a, b);
        assert_eq!(a.iter().map(|(_, n)| u64::from(*n)).sum::<u64>(), 10_000);
        let microsoft = a
            .iter()
            .filter(|(id, _)| id.starts_with("Microsoft."))
            .count();
        assert!(
            microsoft * 5 > a.len(),
            "a big shared namespace: {microsoft} of {}",
            a.len()
        );
        let mean = 10_000.0 / a.len() as f64;
        assert!(
            (2.0..5.0).contains(&mean),
            "about 3 rows per key, got {mean}"
        );
        let e = entity("Microsoft.Extensions.Logging", 3);
        assert_eq!(
            e.properties.get_str("Downloads@odata.type").as_deref(),
            Some("Edm.Int64")
        );
        assert_eq!(
            e.properties.get_str("PackageId@odata.type").as_deref(),
            Some("Edm.Guid")
        );
        assert_eq!(entity("x", 1), entity("x", 1));
    }
}
