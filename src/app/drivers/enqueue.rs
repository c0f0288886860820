//! The enqueue driver (`"driver": "enqueue"`): hands every row of the scanned range to the
//! user's own code as messages on `destinationQueue` (on any allowed connection), so that a
//! queue-triggered function in any language does its work on every row (docs/enqueue.md).
//!
//! A message is the JSON object `{"scanId": "...", "rows": [ ... ]}`; each row is the entity in
//! the Table service's own JSON (`Entity::wire`: `PartitionKey`, `RowKey`, the properties with
//! their `@odata.type` annotations, a Double always annotated), at most `rowsPerMessage` rows.
//! Where the rows are read is as for copies: without a `filter`, a prefix scan's prefix-query
//! steps put the rows they read themselves (`StepWork::Rows`: no work item, no re-read); other
//! key ranges become `RangeWork` items that re-read their rows (with the filter).
//!
//! Invariants:
//! - **No row is dropped.** Every row handed to the driver is in a message; a row whose message
//!   would exceed the queue's limit on its own is sent as its two keys and the marker
//!   [`TOO_LARGE`] (a name no property can have), for the consumer to read it itself.
//! - **A message fits the queue.** Its text, as put (base64 or not), is at most
//!   `MAX_MESSAGE_TEXT` bytes (the 64 KiB the service counts, UTF-8); batches are cut by that
//!   size, not only by `rowsPerMessage`.
//! - **Values are the service's text.** Property values are copied byte for byte; with
//!   `messageEncoding: "none"` only U+FFFE and U+FFFF (which XML, and so the queue's API, cannot
//!   carry) are written as the JSON escapes `\ufffe` and `\uffff`, the same string.
//! - **Messages never expire** (`messagettl=-1`): a consumer may run days behind a big scan.
//! - **An execution's puts stop in time.** Past `Config::hand_off_after` (60 s by default,
//!   counted from just before its first put, after its reads) a step or item starts no put, and
//!   hands the rows not yet in a message to items of their own ([`rest_of`]: a run's rest after
//!   its last packed row, later runs whole), which read them again: at its share of a paced
//!   scan's rate a step's puts would otherwise take as long as the fleet's steps running at
//!   once times its puts over the rate, past the handler's deadline with many instances
//!   (docs/enqueue.md). An item counts its time from after its read, so it puts at least one
//!   message and the hand-offs end. Its bookkeeping is paced too and not bounded by this
//!   (simulated: the longest execution 321 s at 40 instances, 547 s at 100).
//! - **Puts stop when the scan ends.** Before each put a step or item looks whether its scan
//!   has ended (`kit::scan_ended`, kept fresh while it works: `work::watch`); once it has, it
//!   starts no put and hands nothing on, and commits the rows it put. So a cancel stops the
//!   puts within `work::watch::NOTICE`, not at the hand-off time.
//! - **A destination gone is a failure.** A put answered `QueueNotFound` (the queue was deleted
//!   after the scan created it) fails the scan at once, naming the queue.
//! - **At least once.** A redelivered step or item puts its messages again; duplicates come
//!   only from that (and from a put retried after its answer was lost). Consumers deduplicate
//!   by scan id and keys. `rowsWritten` and `messagesWritten` count the committed execution's.

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::app::pace::Meter;
use std::borrow::Borrow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::request::{check_connection, default_connection};
use crate::app::job::{
    item_child, Begun, Driver, RangeWork, ScanContext, ScanRequest, Segment, Setup, StepWork,
    WorkError, WorkOutcome, WorkSplit, Worked, MAX_ITEM_ROWS,
};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::app::tracking::Counters;
use crate::scan::Strategy;
use crate::storage::stores::Stores;
use crate::storage::{Entity, MessageEncoding, QueueStore, MAX_MESSAGE_TEXT};

use super::kit::range::{begin_range_item, page_items, rest_of, unaddressable_error};
use super::kit::{check_queue_target, drop_nulls, scan_ended};

/// An enqueue's `maxRequestsPerSecond` when the request names none: one queue takes about 2,000
/// messages a second (the service's published scalability target), and puts refused past it
/// fail a step after the retry policy's attempts, which then puts its messages again (measured
/// in the simulator: a 35M-row enqueue at 32 rows a message, unpaced, poisoned 1,712 steps).
/// Puts and reads together at this rate keep the puts below the queue's limit.
pub const DEFAULT_MAX_REQUESTS_PER_SECOND: u32 = 2_000;

/// An enqueue's `segmentsPerFirstPrefix` and `segmentsPerSubsequentPrefix` at more than one row
/// a message when the request names none: a paced scan gains nothing from the engine's wide
/// fan-out (4 and 2), and fewer, larger steps cut the bookkeeping that weighs on few puts.
/// Simulated, 35M rows at 32 rows a message (docs/enqueue.md): 1.112 × the minimum requests at
/// 4 and 8 (7,472 steps), 1.103 × at 4 and 16, 1.079 × at 8 and 16, 1.064 × at 16 and 16
/// (4,103 steps, the longest 74 s), on `bb4afdf`. 16 is the most either field takes.
pub const PACED_SEGMENTS_PER_PREFIX: u32 = 16;

/// Puts one step sends at once. A paced scan's instances take the scan's rate in turns (a chunk
/// of its schedule each, `app::pace`), and tokens an instance cannot use in its turn are lost:
/// its steps must have puts waiting. Simulated with a handler per instance (35M rows at 32 rows
/// a message on Flex, docs/enqueue.md): at 8 puts (the copies' `TABLESCAN_COPY_CONCURRENCY`),
/// 1,143 s and 1.101 × the minimum requests; at 16, 959 s and 1.095 ×; at 32, 913 s and
/// 1.091 ×, but a queue slower than the scan's limit (`tests/scans/lab/simulate.rs`, 400 puts/s
/// against 2,000) then refused so many puts that steps kept failing and putting their rows
/// again. At most this many texts (each under 64 KiB) are held per step.
pub const PUTS_IN_FLIGHT: usize = 16;

/// The marker of a row sent as its keys only (too big for a message of its own): an OData
/// instance annotation, `@namespace.term`. Table property names follow C# identifier rules, so
/// none can contain `@` or `.`, and an annotation of a property is `Name@odata.type`.
pub const TOO_LARGE: &str = "@tablescan.tooLarge";
/// Most rows in one message.
pub const MAX_ROWS_PER_MESSAGE: u32 = 100;

pub struct EnqueueDriver;

fn default_rows_per_message() -> u32 {
    1
}

/// The enqueue driver's request fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnqueueFields {
    /// Created if missing. Azure's queue naming rules; none of tablescan's own queues.
    pub destination_queue: String,
    /// App-setting name of the queue's connection.
    #[serde(default = "default_connection")]
    pub destination_connection: String,
    /// 1..=100 rows in one message (fewer when the rows would not fit its 64 KiB).
    #[serde(default = "default_rows_per_message")]
    pub rows_per_message: u32,
    /// `base64` (what a Functions queue trigger decodes by default) or `none`.
    #[serde(default)]
    pub message_encoding: MessageEncoding,
}

/// What an enqueue scan records (the context's `o`), read back by every step and item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnqueueTarget {
    pub connection: String,
    pub queue: String,
    pub rows_per_message: u32,
    pub encoding: MessageEncoding,
}

impl Driver for EnqueueDriver {
    const NAME: &'static str = "enqueue";
    const FILTER: bool = true;
    const SELECT: bool = true;
    type Fields = EnqueueFields;
    type Options = EnqueueTarget;
    type Item = RangeWork;

    fn validate(f: &EnqueueFields, _: &ScanRequest, config: &Config) -> Result<(), ApiError> {
        check_connection(config, "destinationConnection", &f.destination_connection)?;
        check_queue_target(
            config,
            "destinationQueue",
            &f.destination_connection,
            &f.destination_queue,
        )?;
        if !(1..=MAX_ROWS_PER_MESSAGE).contains(&f.rows_per_message) {
            return Err(ApiError::field(
                "rowsPerMessage",
                format!(
                    "rowsPerMessage: must be 1..={MAX_ROWS_PER_MESSAGE}, got {}",
                    f.rows_per_message
                ),
            ));
        }
        Ok(())
    }

    fn setup(f: &EnqueueFields, request: &ScanRequest) -> Setup<EnqueueTarget> {
        let in_step = request.filter.is_none() && request.strategy == Strategy::Prefix;
        let paced = f.rows_per_message > 1;
        Setup {
            options: Some(EnqueueTarget {
                connection: f.destination_connection.clone(),
                queue: f.destination_queue.clone(),
                rows_per_message: f.rows_per_message,
                encoding: f.message_encoding,
            }),
            step_work: match in_step {
                true => StepWork::Rows {
                    select: request.select.clone(),
                },
                false => StepWork::Items,
            },
            default_max_requests_per_second: Some(DEFAULT_MAX_REQUESTS_PER_SECOND),
            default_segments_per_first_prefix: paced.then_some(PACED_SEGMENTS_PER_PREFIX),
            default_segments_per_subsequent_prefix: paced.then_some(PACED_SEGMENTS_PER_PREFIX),
            ..Setup::default()
        }
    }

    async fn prepare<S: Stores>(
        state: &AppState<S>,
        context: &mut ScanContext,
    ) -> Result<(), ApiError> {
        let target: EnqueueTarget = context
            .options()
            .map_err(|e| ApiError::field("destinationQueue", e.to_string()))?;
        let queues = state.queue_store(&target.connection, &Arc::default())?;
        Ok(queues.create_queue(&target.queue).await?)
    }

    /// A step puts at most about as many messages as a copy's step writes rows
    /// (`MAX_ITEM_ROWS`): with many rows a message it reads more rows (up to `MAX_STEP_ROWS`,
    /// and `MAX_STEP_ROW_BYTES` of them), so that its bookkeeping weighs little beside its few
    /// puts (docs/enqueue.md, Cost).
    fn step_rows(context: &ScanContext) -> usize {
        let target = context.options::<EnqueueTarget>();
        let per_message = target.map_or(1, |t| t.rows_per_message.max(1) as usize);
        per_message.saturating_mul(MAX_ITEM_ROWS)
    }

    /// Twice the app's queries when a message carries several rows: in tables of small
    /// partitions a step's queries run out before its rows (simulated: ~2,800 rows a step).
    fn step_query_scale(context: &ScanContext) -> usize {
        let target = context.options::<EnqueueTarget>();
        match target.map_or(1, |t| t.rows_per_message) {
            1 => 1,
            _ => 2,
        }
    }

    fn segment(_: &ScanContext, rows: &[Entity]) -> Segment<RangeWork> {
        Segment {
            items: page_items(WorkSplit::Page, rows),
            ..Segment::default()
        }
    }

    async fn work_runs<S: Stores>(
        state: &AppState<S>,
        scan: &ScanContext,
        requests: &Arc<Meter>,
        runs: Vec<Vec<Entity>>,
        until: Instant,
    ) -> Result<Worked, WorkError> {
        enqueue(state, scan, requests, runs, until).await
    }

    async fn run<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<ItemMessage>,
        item: RangeWork,
    ) -> Result<WorkOutcome, WorkError> {
        let scan = &*begun.scan;
        let (_, read, mut outcome) =
            begin_range_item::<Self, S>(state, begun, &item, scan.select.clone()).await?;
        let until = Instant::now() + state.config.hand_off_after;
        let put = enqueue(state, scan, &begun.requests, vec![read.rows], until).await?;
        // Every other row is enqueued; a row that cannot be addressed fails the item, named.
        if let Some(e) = unaddressable_error("enqueued", &read.unaddressable) {
            return Err(e);
        }
        outcome.delta.rows_written = put.counters.rows_written;
        outcome.delta.messages_written = put.counters.messages_written;
        outcome.delta.rows_matched -= put.rows_handed_off;
        if put.rows_handed_off > 0 {
            tracing::info!(work = %begun.work_id, scan = %scan.scan_id, rows = put.rows_handed_off, "an item handed rows on to an item of their own");
        }
        outcome.children.extend(put.handed_off);
        Ok(outcome)
    }
}

/// Puts the rows of `runs` (read from the scan's source; each run contiguous, runs in key
/// order) on the scan's queue. It starts no put at or after `until`: the rows not packed into
/// a message by then are handed to items of their own (a run's rest after its last packed
/// row, and every later run whole), so that an execution's puts at its share of a paced scan's
/// rate stop in time (module invariants). Returns the rows and messages written.
async fn enqueue<S: Stores>(
    state: &AppState<S>,
    scan: &ScanContext,
    requests: &Arc<Meter>,
    mut runs: Vec<Vec<Entity>>,
    until: Instant,
) -> Result<Worked, WorkError> {
    let target: EnqueueTarget = scan.options()?;
    let queues = &state.queue_store(&target.connection, requests)?;
    // The service answers a selected property a row lacks as null; the row has no such
    // property, and the message says so by leaving it out.
    if scan.select.is_some() {
        runs.iter_mut().flatten().for_each(drop_nulls);
    }
    // Packed lazily: a message's text is made when a put can start, so at most
    // `PUTS_IN_FLIGHT` texts are held beside the rows.
    let (queue, target) = (target.queue.as_str(), &target);
    let mut packer = Packer::new(&scan.scan_id, runs.iter().flatten(), target);
    // Once the scan has ended no put starts, and nothing is handed on (module invariants).
    let ended = AtomicBool::new(false);
    let texts = std::iter::from_fn(|| {
        ended.store(scan_ended(state, &scan.scan_id), Ordering::Relaxed);
        match Instant::now() < until && !ended.load(Ordering::Relaxed) {
            true => packer.next(),
            false => None,
        }
    });
    let messages = stream::iter(texts)
        .map(|text| async move {
            let text = text?;
            queues
                .put_message_never_expiring(queue, &text)
                .await
                .map_err(|e| destination_error(target, e))?;
            Ok::<_, WorkError>(())
        })
        .buffer_unordered(PUTS_IN_FLIGHT)
        .try_fold(0i64, |n, ()| async move { Ok(n + 1) })
        .await?;
    let packed = packer.packed;
    let (rest, rows_handed_off) = match ended.into_inner() {
        true => (Vec::new(), 0),
        false => (
            rest_of(&runs, packed),
            (runs.iter().map(Vec::len).sum::<usize>() - packed) as i64,
        ),
    };
    Ok(Worked {
        counters: Counters {
            rows_written: packed as i64,
            messages_written: messages,
            ..Counters::default()
        },
        handed_off: rest
            .iter()
            .map(item_child::<EnqueueDriver>)
            .collect::<Result<_, _>>()?,
        rows_handed_off,
    })
}

/// A put's error: a destination queue that is gone (`QueueNotFound`: deleted since the scan
/// created it) fails the scan at once, naming the queue — every retry would meet it again;
/// other errors as they are (transient ones retried).
fn destination_error(target: &EnqueueTarget, e: crate::storage::StorageError) -> WorkError {
    match e.is_not_found() {
        true => WorkError::Permanent(format!(
            "destinationQueue {:?} on connection {} does not exist (deleted since the scan created it): {e}",
            target.queue, target.connection
        )),
        false => e.into(),
    }
}

/// The texts (as put, encoded) of the messages carrying `rows`, in order: at most
/// `rows_per_message` rows each, none over `MAX_MESSAGE_TEXT` bytes.
pub fn pack(
    scan_id: &str,
    rows: &[Entity],
    target: &EnqueueTarget,
) -> Result<Vec<String>, WorkError> {
    Packer::new(scan_id, rows.iter(), target).collect()
}

/// [`pack`] one message at a time: each `next` reads rows until a message is full (or the rows
/// end) and gives its text. Bounded by the rows: each row is read once.
pub struct Packer<I> {
    rows: I,
    /// The text of the row read last that did not fit the message before: the next one's first.
    carry: Option<String>,
    head: String,
    encoding: MessageEncoding,
    per_message: usize,
    /// Rows in the messages given so far (the carried row is not yet in one).
    pub packed: usize,
}

/// The end of a message's payload.
const TAIL: &str = "]}";

impl<I: Iterator<Item: Borrow<Entity>>> Packer<I> {
    pub fn new(scan_id: &str, rows: I, target: &EnqueueTarget) -> Self {
        Packer {
            rows,
            carry: None,
            head: format!(
                "{{\"scanId\":{},\"rows\":[",
                serde_json::to_string(scan_id).expect("a str serializes")
            ),
            encoding: target.encoding,
            per_message: target.rows_per_message.clamp(1, MAX_ROWS_PER_MESSAGE) as usize,
            packed: 0,
        }
    }

    fn fits(&self, payload: usize) -> bool {
        encoded_len(self.encoding, payload) <= MAX_MESSAGE_TEXT
    }

    /// The text of `row` in a message: the row's JSON, or its keys and the marker when the row
    /// would not fit a message on its own.
    fn text_of(&self, row: &Entity) -> Result<String, WorkError> {
        let text = row_text(row, self.encoding)?;
        if self.fits(self.head.len() + text.len() + TAIL.len()) {
            return Ok(text);
        }
        let text = xml_safe(too_large_text(row)?, self.encoding);
        if !self.fits(self.head.len() + text.len() + TAIL.len()) {
            return Err(WorkError::Permanent(format!(
                "row ({:?}, {:?}): even its keys do not fit a queue message",
                row.partition_key, row.row_key
            )));
        }
        Ok(text)
    }
}

impl<I: Iterator<Item: Borrow<Entity>>> Iterator for Packer<I> {
    type Item = Result<String, WorkError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut batch: Vec<String> = Vec::new();
        // The payload's length with the rows of `batch` (head, commas, tail included).
        let mut length = self.head.len() + TAIL.len();
        while batch.len() < self.per_message {
            let text = match self.carry.take() {
                Some(text) => text,
                None => match self.rows.next().map(|row| self.text_of(row.borrow())) {
                    None => break,
                    Some(Ok(text)) => text,
                    Some(Err(e)) => {
                        // The error ends the packing: nothing after it.
                        self.rows.by_ref().for_each(drop);
                        return Some(Err(e));
                    }
                },
            };
            let comma = usize::from(!batch.is_empty());
            if !batch.is_empty() && !self.fits(length + comma + text.len()) {
                self.carry = Some(text);
                break;
            }
            length += comma + text.len();
            batch.push(text);
        }
        self.packed += batch.len();
        (!batch.is_empty()).then(|| Ok(finish(&self.head, &batch, TAIL, self.encoding)))
    }
}

/// Bytes of a payload of `payload` bytes as put: base64 makes 4 of every 3 (padded).
fn encoded_len(encoding: MessageEncoding, payload: usize) -> usize {
    match encoding {
        MessageEncoding::Base64 => payload.div_ceil(3) * 4,
        MessageEncoding::None => payload,
    }
}

/// One message's text: the payload, encoded.
fn finish(head: &str, rows: &[String], tail: &str, encoding: MessageEncoding) -> String {
    let payload = format!("{head}{}{tail}", rows.join(","));
    match encoding {
        MessageEncoding::Base64 => encoding.encode(payload.as_bytes()),
        MessageEncoding::None => payload,
    }
}

/// A row as the service's JSON text (see the module's invariants for `none`).
fn row_text(row: &Entity, encoding: MessageEncoding) -> Result<String, WorkError> {
    let text = serde_json::to_string(&row.wire()).map_err(|e| {
        WorkError::Permanent(format!(
            "row ({:?}, {:?}) is not serializable as JSON: {e}",
            row.partition_key, row.row_key
        ))
    })?;
    Ok(xml_safe(text, encoding))
}

/// Without base64, U+FFFE and U+FFFF (only ever inside JSON strings) as their JSON escapes:
/// XML, and so the queue's API, cannot carry them.
fn xml_safe(text: String, encoding: MessageEncoding) -> String {
    match encoding {
        MessageEncoding::None if text.contains(['\u{FFFE}', '\u{FFFF}']) => text
            .replace('\u{FFFE}', "\\ufffe")
            .replace('\u{FFFF}', "\\uffff"),
        _ => text,
    }
}

/// A row too big for a message of its own: its keys and the [`TOO_LARGE`] marker.
fn too_large_text(row: &Entity) -> Result<String, WorkError> {
    let mut keys = serde_json::Map::new();
    keys.insert("PartitionKey".into(), row.partition_key.clone().into());
    keys.insert("RowKey".into(), row.row_key.clone().into());
    keys.insert(TOO_LARGE.into(), true.into());
    serde_json::to_string(&keys).map_err(|e| WorkError::Permanent(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn target(rows_per_message: u32, encoding: MessageEncoding) -> EnqueueTarget {
        EnqueueTarget {
            connection: "AzureWebJobsStorage".into(),
            queue: "work".into(),
            rows_per_message,
            encoding,
        }
    }

    fn row(i: usize, bytes: usize) -> Entity {
        let mut e = Entity::new("p", format!("{i:05}"));
        e.properties.insert("S", json!("x".repeat(bytes)));
        e
    }

    fn payloads(texts: &[String], encoding: MessageEncoding) -> Vec<Value> {
        texts
            .iter()
            .map(|t| {
                assert!(t.len() <= MAX_MESSAGE_TEXT, "{} bytes", t.len());
                serde_json::from_slice(&encoding.decode(t).unwrap()).unwrap()
            })
            .collect()
    }

    /// `segmentsPerFirstPrefix` and `segmentsPerSubsequentPrefix`: the driver's default at
    /// several rows a message, the engine's at one, and what the request names, always.
    #[test]
    fn several_rows_a_message_default_to_fewer_larger_steps() {
        use crate::app::drivers::kit::hooks::hooks;
        use crate::storage::stores::AzureStores;
        let config = crate::app::config::emulator_only();
        let planned = |extra: Value| {
            let mut body = json!({"driver": "enqueue", "sourceTable": "Source",
                "destinationQueue": "work"});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let mut request: ScanRequest = serde_json::from_value(body).unwrap();
            hooks::<EnqueueDriver, AzureStores>()
                .plan(&mut request, &config)
                .unwrap();
            (
                request.segments_per_first_prefix,
                request.segments_per_subsequent_prefix,
            )
        };
        let paced = Some(PACED_SEGMENTS_PER_PREFIX);
        assert_eq!(planned(json!({"rowsPerMessage": 32})), (paced, paced));
        assert_eq!(planned(json!({})), (Some(4), Some(2)));
        let named = json!({"rowsPerMessage": 32, "segmentsPerSubsequentPrefix": 2});
        assert_eq!(planned(named), (paced, Some(2)));
        let named = json!({"rowsPerMessage": 32, "segmentsPerFirstPrefix": 1});
        assert_eq!(planned(named), (Some(1), paced));
    }

    #[test]
    fn batches_are_cut_by_count_and_by_encoded_size() {
        let rows: Vec<Entity> = (0..70).map(|i| row(i, 2_000)).collect();
        for (encoding, per_message, at_most) in [
            (MessageEncoding::Base64, 1, 1),
            // Rows of 2,036 bytes: 24 in 48 KiB of payload (base64), 32 in 64 KiB.
            (MessageEncoding::Base64, 32, 24),
            (MessageEncoding::None, 40, 32),
            (MessageEncoding::None, 10, 10),
        ] {
            let texts = pack("s-1", &rows, &target(per_message, encoding)).unwrap();
            let messages = payloads(&texts, encoding);
            let counts: Vec<usize> = messages
                .iter()
                .map(|m| m["rows"].as_array().unwrap().len())
                .collect();
            assert!(counts.iter().all(|&n| n <= at_most), "{counts:?}");
            assert!(counts.contains(&at_most), "{counts:?}");
            let keys: Vec<&str> = messages
                .iter()
                .flat_map(|m| m["rows"].as_array().unwrap())
                .map(|r| r["RowKey"].as_str().unwrap())
                .collect();
            let want: Vec<String> = (0..70).map(|i| format!("{i:05}")).collect();
            assert_eq!(keys, want, "every row once, in order");
            assert!(messages.iter().all(|m| m["scanId"] == "s-1"));
        }
    }

    #[test]
    fn a_row_too_big_alone_travels_as_its_keys_with_the_marker() {
        let rows = vec![row(0, 10), row(1, 60_000), row(2, 10)];
        for encoding in [MessageEncoding::Base64, MessageEncoding::None] {
            let texts = pack("s", &rows, &target(100, encoding)).unwrap();
            let messages = payloads(&texts, encoding);
            let all: Vec<&Value> = messages
                .iter()
                .flat_map(|m| m["rows"].as_array().unwrap())
                .collect();
            assert_eq!(all.len(), 3);
            let big = json!({"PartitionKey": "p", "RowKey": "00001", TOO_LARGE: true});
            match encoding {
                // 60 KB fits 64 KiB unencoded, not 48 KiB of base64 payload.
                MessageEncoding::Base64 => assert_eq!(all[1], &big),
                MessageEncoding::None => assert_eq!(all[1]["S"].as_str().unwrap().len(), 60_000),
            }
        }
        let huge = vec![row(0, 70_000)];
        let texts = pack("s", &huge, &target(1, MessageEncoding::None)).unwrap();
        let marker = &payloads(&texts, MessageEncoding::None)[0]["rows"][0];
        assert_eq!(marker[TOO_LARGE], true);
    }

    #[test]
    fn values_keep_their_text_and_xml_unsafe_characters_are_escaped_only_without_base64() {
        let mut e = Entity::new("p", "r");
        e.properties.insert_raw(
            "D",
            serde_json::value::RawValue::from_string("1.0000000000000002e-300".into()).unwrap(),
        );
        e.properties.insert("D@odata.type", json!("Edm.Double"));
        e.properties.insert("U", json!("a\u{FFFF}b\u{FFFE}"));
        let base64 = pack("s", &[e.clone()], &target(1, MessageEncoding::Base64)).unwrap();
        let text = String::from_utf8(MessageEncoding::Base64.decode(&base64[0]).unwrap()).unwrap();
        assert!(text.contains("\"D\":1.0000000000000002e-300,\"D@odata.type\":\"Edm.Double\""));
        assert!(text.contains('\u{FFFF}'), "{text}");
        let none = pack("s", &[e], &target(1, MessageEncoding::None)).unwrap();
        assert!(!none[0].contains(['\u{FFFE}', '\u{FFFF}']));
        let v: Value = serde_json::from_str(&none[0]).unwrap();
        assert_eq!(v["rows"][0]["U"], "a\u{FFFF}b\u{FFFE}");
    }
}
