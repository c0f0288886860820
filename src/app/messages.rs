//! Queue messages: a versioned JSON envelope `{"n": name, "v": version, "d": data}`, stored
//! base64-encoded (the Functions queue trigger's default `messageEncoding`), never over 64 KiB.
//!
//! Every message carries the whole [`ScanContext`], so any child step can run anywhere with no
//! other lookup than the scan's state.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::scan::{ScanParameters, Step, Strategy};
use crate::storage::{MessageEncoding, MAX_MESSAGE_TEXT};

/// What a scan does with the rows it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Driver {
    /// Copy every row to the destination table (upsert-replace).
    Copy,
    /// Count rows without copying.
    Count,
}

/// A table in one of the allowed storage connections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRef {
    /// App-setting name of the connection (never the connection string itself).
    #[serde(rename = "c")]
    pub connection: String,
    #[serde(rename = "t")]
    pub table: String,
}

/// Everything a work item of a scan needs, copied into every message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScanContext {
    #[serde(rename = "id")]
    pub scan_id: String,
    /// Counter shards of this scan (fixed at start).
    #[serde(rename = "sh")]
    pub shards: u32,
    #[serde(rename = "dr")]
    pub driver: Driver,
    #[serde(rename = "st")]
    pub strategy: Strategy,
    #[serde(rename = "src")]
    pub source: TableRef,
    #[serde(rename = "dst", default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<TableRef>,
    #[serde(rename = "p")]
    pub params: ScanParameters,
    /// How copy work is split (copy driver only).
    #[serde(rename = "ws", default, skip_serializing_if = "is_default_split")]
    pub work_split: WorkSplit,
}

fn is_default_split(split: &WorkSplit) -> bool {
    *split == WorkSplit::Page
}

/// A typed queue message: its envelope name and version, and the function that handles it.
pub trait WorkMessage: Serialize + DeserializeOwned {
    const NAME: &'static str;
    const VERSION: u32;
    /// Deterministic identity of this unit of work within its scan (independent of delivery).
    fn work_key(&self) -> String;
}

/// One scan step to execute (PrefixScan function).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMessage {
    #[serde(rename = "s")]
    pub scan: ScanContext,
    #[serde(rename = "w")]
    pub step: Step,
}

impl WorkMessage for StepMessage {
    const NAME: &'static str = "scan-step";
    const VERSION: u32 = 1;
    fn work_key(&self) -> String {
        format!(
            "step:{}",
            serde_json::to_string(&self.step).expect("steps serialize")
        )
    }
}

/// One unit of copy work (TableCopy function).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyMessage {
    #[serde(rename = "s")]
    pub scan: ScanContext,
    #[serde(rename = "w")]
    pub work: CopyWork,
}

/// The rows one copy work item covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum CopyWork {
    /// Every row from `from` to `to` inclusive in (PartitionKey, RowKey) order: one scanned page,
    /// re-read once with all columns.
    Range {
        from: (String, String),
        to: (String, String),
    },
    /// Every row after `after` (exclusive) up to `to` inclusive: the rest of a range that grew
    /// past what one copy invocation reads (rows inserted since it was scanned).
    After {
        after: (String, String),
        to: (String, String),
    },
    /// The reference design's split (kept for honest comparison): named rows of one partition,
    /// re-read with `PK eq pk and RK between first and last` and checked to all be there.
    Rows { pk: String, row_keys: Vec<String> },
}

/// How the copy driver splits work into TableCopy messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WorkSplit {
    /// One work item per scanned page (tablescan's design): about one extra read per 1,000 rows.
    #[default]
    Page,
    /// One work item per partition key carrying its row keys (the reference design).
    PartitionKey,
}

/// A child a work item spawns, in the compact form recorded on the parent's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ChildSpec {
    #[serde(rename = "s")]
    Step(Step),
    #[serde(rename = "c")]
    Copy(CopyWork),
}

impl WorkMessage for CopyMessage {
    const NAME: &'static str = "table-copy";
    const VERSION: u32 = 1;
    fn work_key(&self) -> String {
        format!(
            "copy:{}",
            serde_json::to_string(&self.work).expect("copy work serializes")
        )
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    n: String,
    v: u32,
    d: T,
}

/// Why a message could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("message is not a valid envelope: {0}")]
    Malformed(String),
    #[error("message is a {found:?} v{version}, expected {expected:?} v{expected_version}")]
    WrongKind {
        found: String,
        version: u32,
        expected: &'static str,
        expected_version: u32,
    },
    #[error("message text is {0} bytes, over the 64 KiB queue limit")]
    TooLarge(usize),
}

/// The stable id of a work item: a hash of its kind and content, so duplicate processing of a
/// parent re-creates the same child rows instead of new ones.
pub fn work_id<M: WorkMessage>(message: &M) -> String {
    let digest = Sha256::digest(message.work_key().as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{}-{hex}", &M::NAME[..1])
}

/// The shard (0..shards) a work item's row and counter live in.
pub fn shard_of(work_id: &str, shards: u32) -> u32 {
    let digest = Sha256::digest(work_id.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % shards.max(1)
}

/// Serializes a message into queue text (base64 of the envelope JSON), refusing oversize ones.
pub fn encode<M: WorkMessage>(message: &M) -> Result<String, MessageError> {
    let json = serde_json::to_vec(&Envelope {
        n: M::NAME.to_string(),
        v: M::VERSION,
        d: message,
    })
    .map_err(|e| MessageError::Malformed(e.to_string()))?;
    let text = MessageEncoding::Base64.encode(&json);
    if text.len() > MAX_MESSAGE_TEXT {
        return Err(MessageError::TooLarge(text.len()));
    }
    Ok(text)
}

/// Parses a message's JSON (already decoded from the queue's encoding by the host).
pub fn decode<M: WorkMessage>(json: &str) -> Result<M, MessageError> {
    if json.len() > MAX_MESSAGE_TEXT {
        return Err(MessageError::TooLarge(json.len()));
    }
    let header: Envelope<serde_json::Value> =
        serde_json::from_str(json).map_err(|e| MessageError::Malformed(e.to_string()))?;
    if header.n != M::NAME || header.v != M::VERSION {
        return Err(MessageError::WrongKind {
            found: header.n,
            version: header.v,
            expected: M::NAME,
            expected_version: M::VERSION,
        });
    }
    serde_json::from_value(header.d).map_err(|e| MessageError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> ScanContext {
        ScanContext {
            scan_id: "s1".into(),
            shards: 4,
            driver: Driver::Copy,
            strategy: Strategy::Prefix,
            source: TableRef {
                connection: "AzureWebJobsStorage".into(),
                table: "Src".into(),
            },
            destination: Some(TableRef {
                connection: "AzureWebJobsStorage".into(),
                table: "Dst".into(),
            }),
            params: ScanParameters::default(),
            work_split: WorkSplit::Page,
        }
    }

    #[test]
    fn round_trip_and_rejections() {
        let m = StepMessage {
            scan: context(),
            step: Step::Start,
        };
        let text = encode(&m).unwrap();
        let json = String::from_utf8(MessageEncoding::Base64.decode(&text).unwrap()).unwrap();
        assert_eq!(decode::<StepMessage>(&json).unwrap(), m);
        assert!(matches!(
            decode::<CopyMessage>(&json),
            Err(MessageError::WrongKind { .. })
        ));
        assert!(matches!(
            decode::<StepMessage>(&json[..json.len() / 2]),
            Err(MessageError::Malformed(_))
        ));
        let v2 = json.replace("\"v\":1", "\"v\":2");
        assert!(matches!(
            decode::<StepMessage>(&v2),
            Err(MessageError::WrongKind { version: 2, .. })
        ));
        assert!(matches!(
            decode::<StepMessage>(&"x".repeat(70_000)),
            Err(MessageError::TooLarge(_))
        ));
        let huge = StepMessage {
            scan: context(),
            step: Step::PartitionKeyQuery {
                partition_key: "k".repeat(60_000),
                row_key_skip: None,
                depth: 1,
            },
        };
        assert!(matches!(encode(&huge), Err(MessageError::TooLarge(_))));
    }

    #[test]
    fn work_ids_are_deterministic_and_distinct() {
        let a = StepMessage {
            scan: context(),
            step: Step::Start,
        };
        let mut other_scan = context();
        other_scan.scan_id = "s2".into();
        let b = StepMessage {
            scan: other_scan,
            step: Step::Start,
        };
        assert_eq!(
            work_id(&a),
            work_id(&b),
            "identity is the work, not the envelope"
        );
        let c = StepMessage {
            scan: context(),
            step: Step::Serial { after: None },
        };
        assert_ne!(work_id(&a), work_id(&c));
        assert!(shard_of(&work_id(&a), 16) < 16);
    }
}
