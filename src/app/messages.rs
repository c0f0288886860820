//! Queue messages: a versioned JSON envelope `{"n": name, "v": version, "d": data}`, stored
//! base64-encoded (the Functions queue trigger's default `messageEncoding`), never over 64 KiB.
//!
//! A message carries only its scan's id and its unit of work. What the scan reads and writes —
//! its `job::ScanContext` — is recorded on the scan record when the scan starts and read from
//! there, so a forged or stale message cannot redirect a scan. The envelope's version (`v`, 2
//! for both kinds) tells a future format apart: a message of any other version is refused
//! ([`MessageError::WrongKind`]), never guessed at.
//!
//! A driver's work item (the `w` of a `table-copy` message, a [`ChildSpec::Item`]) is opaque
//! here: [`ItemJson`], the JSON text its driver wrote, kept byte for byte, because that text is
//! the item's identity ([`work_id`]). Only the scan's driver (from the recorded context) reads it.
//!
//! A poison function's re-queued copy carries its re-queue round in the envelope (`r`, absent
//! on a driver's message: round 0); the round never changes `d`, so never the item's id.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::scan::Step;
use crate::storage::{MessageEncoding, MAX_MESSAGE_TEXT};

/// A typed queue message: its envelope name and version, and the function that handles it.
pub trait WorkMessage: Serialize + DeserializeOwned {
    const NAME: &'static str;
    /// The version written and the only one read (see [`decode`]).
    const VERSION: u32;
    /// Deterministic identity of this unit of work within its scan (independent of delivery).
    fn work_key(&self) -> String;
    /// The scan this work belongs to.
    fn scan_id(&self) -> &str;
    /// The shard the message names for its row, if any (see [`shard_for`]).
    fn shard_hint(&self) -> Option<u32> {
        None
    }
}

/// One scan step to execute (PrefixScan function).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMessage {
    #[serde(rename = "s")]
    pub scan_id: String,
    #[serde(rename = "w")]
    pub step: Step,
    /// The counter shard the step's row lives in, as for [`ItemMessage::shard`]: its parent's
    /// when the parent registered it with its outcome. Absent: the shard its id hashes to.
    #[serde(rename = "h", default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
}

impl WorkMessage for StepMessage {
    const NAME: &'static str = "scan-step";
    const VERSION: u32 = 2;
    fn work_key(&self) -> String {
        format!(
            "step:{}",
            serde_json::to_string(&self.step).expect("steps serialize")
        )
    }
    fn scan_id(&self) -> &str {
        &self.scan_id
    }
    fn shard_hint(&self) -> Option<u32> {
        self.shard
    }
}

/// One work item of the scan's driver (TableCopy function, which runs any driver's items; the
/// envelope keeps its historical name `table-copy`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemMessage {
    #[serde(rename = "s")]
    pub scan_id: String,
    #[serde(rename = "w")]
    pub work: ItemJson,
    /// The counter shard the item's row lives in: its parent's, so that the parent registers it
    /// in the transaction that records its outcome. Not part of the item's identity. Absent
    /// (items queued by earlier versions, roots): the shard its id hashes to ([`shard_of`]).
    #[serde(rename = "h", default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
}

/// A driver's work item as JSON text, exactly as written (its identity: see [`work_id`]).
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ItemJson(Box<RawValue>);

impl ItemJson {
    /// The item's JSON text (compact, as its driver serialized it).
    pub fn from_item<I: Serialize>(item: &I) -> Result<Self, MessageError> {
        let text =
            serde_json::to_string(item).map_err(|e| MessageError::Malformed(e.to_string()))?;
        RawValue::from_string(text)
            .map(ItemJson)
            .map_err(|e| MessageError::Malformed(e.to_string()))
    }

    /// Reads the item as its driver's type.
    pub fn parse<I: DeserializeOwned>(&self) -> Result<I, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for ItemJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl fmt::Debug for ItemJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.get())
    }
}

/// A child a work item spawns, in the compact form recorded on the parent's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ChildSpec {
    #[serde(rename = "s")]
    Step(Step),
    /// A driver's work item (recorded as `"c"`: copy items were the first kind).
    #[serde(rename = "c")]
    Item(ItemJson),
}

impl WorkMessage for ItemMessage {
    const NAME: &'static str = "table-copy";
    const VERSION: u32 = 2;
    fn work_key(&self) -> String {
        // The text as its driver wrote it (`copy:` from when copy items were the only kind).
        format!("copy:{}", self.work.as_str())
    }
    fn scan_id(&self) -> &str {
        &self.scan_id
    }
    fn shard_hint(&self) -> Option<u32> {
        self.shard
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    n: String,
    v: u32,
    /// The re-queue round a poison function put this message back on its live queue for
    /// (`app::work::poison`); absent (0) on a message its driver queued. Not part of the item's
    /// identity (that is `d` alone), and a reader that does not know it ignores it.
    #[serde(default, skip_serializing_if = "is_zero")]
    r: u32,
    d: T,
}

fn is_zero(round: &u32) -> bool {
    *round == 0
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

/// The shard (0..shards) a message's work item's row and counter live in: the one it names, or
/// the one its id hashes to.
pub fn shard_for<M: WorkMessage>(message: &M, work_id: &str, shards: u32) -> u32 {
    item_shard(message.shard_hint(), work_id, shards)
}

/// The shard a message naming `hint` (if any) has its row in (a hint out of range is ignored).
pub fn item_shard(hint: Option<u32>, work_id: &str, shards: u32) -> u32 {
    match hint {
        Some(shard) if shard < shards.max(1) => shard,
        _ => shard_of(work_id, shards),
    }
}

/// The shard (0..shards) a work item's row and counter live in when no message names one.
pub fn shard_of(work_id: &str, shards: u32) -> u32 {
    let digest = Sha256::digest(work_id.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % shards.max(1)
}

/// The queue text of a message's JSON on tablescan's own queues: base64, what host.json's
/// `messageEncoding` makes the queue trigger decode (a text it cannot decode goes straight to
/// the poison queue). Every message tablescan puts on its own queues goes through this.
pub fn queue_text(json: &[u8]) -> String {
    MessageEncoding::Base64.encode(json)
}

/// Serializes a message into queue text (base64 of the envelope JSON), refusing oversize ones.
pub fn encode<M: WorkMessage>(message: &M) -> Result<String, MessageError> {
    let json = serde_json::to_vec(&Envelope {
        n: M::NAME.to_string(),
        v: M::VERSION,
        r: 0,
        d: message,
    })
    .map_err(|e| MessageError::Malformed(e.to_string()))?;
    let text = queue_text(&json);
    if text.len() > MAX_MESSAGE_TEXT {
        return Err(MessageError::TooLarge(text.len()));
    }
    Ok(text)
}

/// Parses a message's JSON (already decoded from the queue's encoding by the host). A message
/// of another kind or version is refused naming both.
pub fn decode<M: WorkMessage>(json: &str) -> Result<M, MessageError> {
    if json.len() > MAX_MESSAGE_TEXT {
        return Err(MessageError::TooLarge(json.len()));
    }
    // The data stays raw text: a driver's work item is kept byte for byte (its identity).
    let header: Envelope<Box<RawValue>> =
        serde_json::from_str(json).map_err(|e| MessageError::Malformed(e.to_string()))?;
    if header.n != M::NAME || header.v != M::VERSION {
        return Err(MessageError::WrongKind {
            found: header.n,
            version: header.v,
            expected: M::NAME,
            expected_version: M::VERSION,
        });
    }
    serde_json::from_str(header.d.get()).map_err(|e| MessageError::Malformed(e.to_string()))
}

/// The re-queue round (`r`) of a message's envelope JSON: 0 when absent, or when the text is
/// not an envelope (such a message is refused by [`decode`] anyway).
pub fn round_of(json: &str) -> u32 {
    serde_json::from_str::<Envelope<&RawValue>>(json).map_or(0, |envelope| envelope.r)
}

/// The same message's envelope JSON for re-queue round `round`: `n`, `v` and the data `d` kept
/// byte for byte (the item's identity), only `r` set.
pub fn with_round(json: &str, round: u32) -> Result<String, MessageError> {
    let mut envelope: Envelope<&RawValue> =
        serde_json::from_str(json).map_err(|e| MessageError::Malformed(e.to_string()))?;
    envelope.r = round;
    serde_json::to_string(&envelope).map_err(|e| MessageError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_is_in_the_envelope_and_never_in_the_identity() {
        let m = StepMessage {
            scan_id: "s1".into(),
            step: Step::Start,
            shard: Some(3),
        };
        let json = String::from_utf8(
            MessageEncoding::Base64
                .decode(&encode(&m).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(round_of(&json), 0);
        assert!(!json.contains("\"r\""), "round 0 is not written: {json}");
        let again = with_round(&json, 2).unwrap();
        assert_eq!(round_of(&again), 2);
        assert_eq!(round_of(&with_round(&again, 3).unwrap()), 3);
        let decoded = decode::<StepMessage>(&again).unwrap();
        assert_eq!(decoded, m);
        assert_eq!(work_id(&decoded), work_id(&m));
        assert_eq!(round_of("not json"), 0);
        assert!(with_round("not json", 1).is_err());
    }

    #[test]
    fn round_trip_and_rejections() {
        let m = StepMessage {
            scan_id: "s1".into(),
            step: Step::Start,
            shard: None,
        };
        let text = encode(&m).unwrap();
        let json = String::from_utf8(MessageEncoding::Base64.decode(&text).unwrap()).unwrap();
        assert!(
            json.starts_with(r#"{"n":"scan-step","v":2,"d":{"s":"s1","w":"#),
            "a message carries the scan id and its work only: {json}"
        );
        assert_eq!(decode::<StepMessage>(&json).unwrap(), m);
        assert!(matches!(
            decode::<ItemMessage>(&json),
            Err(MessageError::WrongKind { .. })
        ));
        assert!(matches!(
            decode::<StepMessage>(&json[..json.len() / 2]),
            Err(MessageError::Malformed(_))
        ));
        let v3 = json.replace("\"v\":2", "\"v\":3");
        assert!(matches!(
            decode::<StepMessage>(&v3),
            Err(MessageError::WrongKind { version: 3, .. })
        ));
        assert!(matches!(
            decode::<StepMessage>(&"x".repeat(70_000)),
            Err(MessageError::TooLarge(_))
        ));
        let huge = StepMessage {
            scan_id: "s1".into(),
            step: Step::PartitionKeyQuery {
                partition_key: "k".repeat(60_000),
                row_key_skip: None,
                depth: 1,
            },
            shard: None,
        };
        assert!(matches!(encode(&huge), Err(MessageError::TooLarge(_))));
    }

    /// Messages of another version (such as the first, which carried the whole context) are
    /// refused naming the version; a copy item's identity is its driver's text.
    #[test]
    fn other_versions_are_refused() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Work {
            from: (String, String),
            to: (String, String),
        }
        let work = Work {
            from: ("a".into(), "1".into()),
            to: ("b".into(), "2".into()),
        };
        let m = ItemMessage {
            scan_id: "s1".into(),
            work: ItemJson::from_item(&work).unwrap(),
            shard: None,
        };
        let json = String::from_utf8(
            MessageEncoding::Base64
                .decode(&encode(&m).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(decode::<ItemMessage>(&json).unwrap(), m);
        assert_eq!(m.work.parse::<Work>().unwrap(), work);
        assert_eq!(
            m.work_key(),
            format!("copy:{}", serde_json::to_string(&work).unwrap())
        );
        let v1 = json.replace("\"v\":2", "\"v\":1");
        match decode::<ItemMessage>(&v1) {
            Err(e @ MessageError::WrongKind { version: 1, .. }) => {
                assert!(
                    e.to_string().contains("v1, expected \"table-copy\" v2"),
                    "{e}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn work_ids_are_deterministic_and_distinct() {
        let a = StepMessage {
            scan_id: "s1".into(),
            step: Step::Start,
            shard: None,
        };
        let b = StepMessage {
            scan_id: "s2".into(),
            step: Step::Start,
            shard: None,
        };
        assert_eq!(
            work_id(&a),
            work_id(&b),
            "identity is the work, not the envelope"
        );
        let c = StepMessage {
            scan_id: "s1".into(),
            step: Step::Serial { after: None },
            shard: None,
        };
        assert_ne!(work_id(&a), work_id(&c));
        assert!(shard_of(&work_id(&a), 16) < 16);
    }
}
