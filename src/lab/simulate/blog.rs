//! The blog's design (docs/prefix-scan.md, "The reference's copy app"; commit ece06a15), as the
//! calibration runs need it: ONE worker queue whose function dispatches by envelope name, scan
//! steps executed by tablescan's real `Scanner` (one query step per message, unlimited step budget,
//! so a prefix query runs its whole loop and a partition-key query its whole partition), copy work
//! split by tablescan's real `copy_work(WorkSplit::PartitionKey, …)` (one message per partition key
//! carrying row keys), the blog's bulk enqueue (`hbe`) and its row copy. The blog tracked nothing
//! for completion, so neither does this driver: a run is over when the queue is empty and nothing
//! is executing.
//! This is simulator code modelling the reference; tablescan itself never runs this way.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::app::drivers::kit::range::page_items as copy_work;
use crate::app::job::{RangeWork as CopyWork, WorkSplit};
use crate::scan::{ScanParameters, Scanner, Step, StepBudget};
use crate::storage::{
    BatchOperation, CompareOp, Filter, Query, QueueStore, TableStore, MAX_BATCH_OPERATIONS,
    MAX_TAKE,
};

use super::cloud::{CloudQueues, CloudTables};

/// The blog's bulk-enqueue threshold (`BulkEnqueueThreshold`, default 10).
pub const BULK_THRESHOLD: usize = 10;
/// An `hbe` message is filled up to the queue's message size (64 KiB), less some envelope room.
pub const BULK_BYTES: usize = 60 * 1024;

/// A row-copy message (`trc.lpf`): source, destination, partition key and its row keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RowCopy {
    pub s: String,
    pub d: String,
    pub p: String,
    pub r: Vec<String>,
}

/// The blog's queue envelope, dispatched by name (`n`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "n", content = "d")]
pub enum BlogMessage {
    /// `tc.lpf`: one scan step (the blog's `TableCopyMessage` with its scan parameters).
    #[serde(rename = "tc.lpf")]
    Scan(Step),
    /// `trc.lpf`: copy the listed rows of one partition.
    #[serde(rename = "trc.lpf")]
    RowCopy(RowCopy),
    /// `hbe`: homogeneous bulk enqueue; its execution re-enqueues every item one by one.
    #[serde(rename = "hbe")]
    Bulk(Vec<BlogMessage>),
}

impl BlogMessage {
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("blog messages serialize")
    }
}

/// The blog's worker function and its enqueuer.
#[derive(Clone)]
pub struct Blog {
    pub tables: CloudTables,
    pub queues: CloudQueues,
    pub queue: String,
    pub source: String,
    pub destination: String,
    /// Keys-only scan (`$select=PartitionKey,RowKey`), take 1000, segments 1/1.
    pub params: ScanParameters,
}

impl Blog {
    pub fn new(tables: CloudTables, queues: CloudQueues, take: u32) -> Self {
        Blog {
            tables,
            queues,
            queue: "work".into(),
            source: "Source".into(),
            destination: "Dest".into(),
            // The blog's parameters, fixed here so that tablescan's defaults never move them.
            params: ScanParameters {
                take,
                select: Some(Vec::new()),
                expand_partition_keys: true,
                segments_per_first_prefix: 1,
                segments_per_subsequent_prefix: 1,
                ..ScanParameters::default()
            },
        }
    }

    /// `WorkerQueueFunction`: one message, dispatched by its envelope name.
    pub async fn execute(&self, text: &str) -> Result<(), String> {
        let message: BlogMessage = serde_json::from_str(text).map_err(|e| e.to_string())?;
        match message {
            BlogMessage::Scan(step @ Step::Serial { .. }) => self.serial(step).await,
            BlogMessage::Scan(step) => self.scan_step(step).await,
            BlogMessage::RowCopy(copy) => self.row_copy(copy).await,
            BlogMessage::Bulk(items) => {
                // The fan-out processor: `EnqueueWorkers` = 1, so one put after another.
                let texts: Vec<String> = items.iter().map(BlogMessage::encode).collect();
                self.put_all(&texts).await
            }
        }
    }

    async fn put_all(&self, texts: &[String]) -> Result<(), String> {
        for t in texts {
            self.queues
                .put_message(&self.queue, t, std::time::Duration::ZERO)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// `EnqueueAsync`: below the threshold one put per message; otherwise `hbe` messages filled
    /// up to 64 KiB, one per kind (homogeneous).
    async fn enqueue(&self, messages: Vec<BlogMessage>) -> Result<(), String> {
        if messages.len() < BULK_THRESHOLD {
            let texts: Vec<String> = messages.iter().map(BlogMessage::encode).collect();
            return self.put_all(&texts).await;
        }
        // `{"n":"hbe","d":[item,item,…]}`, exactly what encoding `Bulk(items)` gives.
        const HEAD: &str = r#"{"n":"hbe","d":["#;
        let mut bulks: Vec<String> = Vec::new();
        let mut current = String::from(HEAD);
        for m in messages {
            let item = m.encode();
            if current.len() > HEAD.len() && current.len() + item.len() + 3 > BULK_BYTES {
                current.push_str("]}");
                bulks.push(std::mem::replace(&mut current, String::from(HEAD)));
            }
            if current.len() > HEAD.len() {
                current.push(',');
            }
            current.push_str(&item);
        }
        current.push_str("]}");
        bulks.push(current);
        self.put_all(&bulks).await
    }

    /// Row keys only, grouped by partition key, via tablescan's real work split.
    fn row_copies(&self, rows: &[crate::storage::Entity]) -> Vec<BlogMessage> {
        if rows.is_empty() {
            return Vec::new();
        }
        copy_work(WorkSplit::PartitionKey, rows)
            .into_iter()
            .filter_map(|w| match w {
                CopyWork::Rows { pk, row_keys } => Some(BlogMessage::RowCopy(RowCopy {
                    s: self.source.clone(),
                    d: self.destination.clone(),
                    p: pk,
                    r: row_keys,
                })),
                CopyWork::Range { .. } | CopyWork::After { .. } => None,
            })
            .collect()
    }

    /// `ProcessPrefixScanAsync`: a Start runs its initial queries in the same execution; any
    /// other step is exactly one query step. Rows become row-copy messages, follow-up steps
    /// become scan messages.
    async fn scan_step(&self, step: Step) -> Result<(), String> {
        let scanner = Scanner::new(
            &self.tables,
            &self.source,
            &self.params,
            StepBudget::UNLIMITED,
        );
        let to_run = if step == Step::Start {
            scanner
                .execute(&Step::Start)
                .await
                .map_err(|e| e.to_string())?
                .steps
        } else {
            vec![step]
        };
        let mut rows = Vec::new();
        let mut children = Vec::new();
        for s in to_run {
            let out = scanner.execute(&s).await.map_err(|e| e.to_string())?;
            for o in out.steps {
                match o {
                    Step::Segment { entities, .. } => rows.extend(entities),
                    next => children.push(BlogMessage::Scan(next)),
                }
            }
        }
        let copies = self.row_copies(&rows);
        self.enqueue(copies).await?;
        self.enqueue(children).await
    }

    /// `ProcessSerialAsync`: one execution pages the whole table (keys only, 1,000 per page) and
    /// enqueues each page's row-copy messages before reading the next page.
    async fn serial(&self, mut step: Step) -> Result<(), String> {
        let budget = StepBudget {
            max_pages: 1,
            max_queries: usize::MAX,
            max_rows: usize::MAX,
            max_row_bytes: usize::MAX,
        };
        let scanner = Scanner::new(&self.tables, &self.source, &self.params, budget);
        loop {
            let out = scanner.execute(&step).await.map_err(|e| e.to_string())?;
            let mut next = None;
            let mut rows = Vec::new();
            for s in out.steps {
                match s {
                    Step::Segment { entities, .. } => rows.extend(entities),
                    other => next = Some(other),
                }
            }
            let copies = self.row_copies(&rows);
            self.enqueue(copies).await?;
            match next {
                Some(s) => step = s,
                None => return Ok(()),
            }
        }
    }

    /// `TableRowCopyMessageProcessor`: read the partition's key range with every column, keep
    /// the listed rows (all must exist), write them with InsertOrReplace in batches of ≤ 100,
    /// one after another.
    async fn row_copy(&self, copy: RowCopy) -> Result<(), String> {
        let mut keys = copy.r.clone();
        keys.sort_by(|a, b| crate::storage::compare_keys(a, b));
        let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
            return Ok(());
        };
        let mut query = Query {
            filter: Some(Filter::and(vec![
                Filter::pk(CompareOp::Eq, copy.p.clone()),
                Filter::rk(CompareOp::Ge, first.clone()),
                Filter::rk(CompareOp::Le, last.clone()),
            ])),
            top: Some(MAX_TAKE),
            select: None,
            continuation: None,
        };
        let wanted: HashSet<&str> = keys.iter().map(String::as_str).collect();
        let mut rows = Vec::new();
        loop {
            let page = self
                .tables
                .query_page(&copy.s, &query)
                .await
                .map_err(|e| e.to_string())?;
            rows.extend(
                page.entities
                    .into_iter()
                    .filter(|e| wanted.contains(e.row_key.as_str())),
            );
            match page.continuation {
                Some(c) => query.continuation = Some(c),
                None => break,
            }
        }
        if rows.len() != wanted.len() {
            return Err("When copying rows, some rows were not found.".into());
        }
        let mut rows = rows.into_iter().peekable();
        while rows.peek().is_some() {
            let ops: Vec<BatchOperation> = rows
                .by_ref()
                .take(MAX_BATCH_OPERATIONS)
                .map(BatchOperation::Upsert)
                .collect();
            self.tables
                .submit_batch(&copy.d, &copy.p, &ops)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}
