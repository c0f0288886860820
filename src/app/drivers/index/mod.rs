//! The index driver (`"driver": "index"`): builds a secondary index of one property of the
//! source table — aligned cuckoo filters per key range, bucket-major segment files
//! (`crate::index`, docs/index-format.md) — in Blob Storage, in bounded steps, and switches the
//! prefix's pointer to it in one write when it completes. The lookup function reads it
//! (`functions/lookup.rs`). Where the files go: `app::index_files`. The write path in full:
//! docs/index.md.
//!
//! - **Phase 0, staging** ([`stage`]): the scan reads only the property (`$select`). A prefix
//!   scan's steps stage the rows they read themselves (`work_rows`, no re-read); a partition too
//!   big for one step (and a serial scan) becomes range items that re-read it with the same
//!   `$select`. Each step or item writes ONE staging record: its rows, as their contiguous
//!   runs (`Driver::work_runs`: a range never spans rows another step read), cut into key
//!   ranges of at most [`RANGE_ROWS`] rows, each with its bounds and the distinct hashes of its
//!   values.
//! - **Phase 1, assembly** ([`assemble`]): started once every phase-0 item finished and none
//!   failed. Chunk items list the staging records a page at a time and group consecutive ones
//!   into segments of about [`SEGMENT_STAGING_BYTES`] of records; each segment item reads its
//!   records, builds the segment file and writes it; its descriptor is its work result. A build
//!   of one page and one segment has it built by the chunk item itself.
//! - Steps read up to [`MAX_STEP_ROWS`] rows (`Driver::STEP_ROWS`), as many as a count's: the
//!   index's cost per step (one staging write, one read in assembly) weighs less per row.
//! - **Phase 2, publication** ([`publish`]): the manifest, then the pointer switched in one
//!   conditional write (the completion step has nothing left to do).
//! - **Cleanup** ([`prune`]): after the switch, this build's staging records and the old
//!   builds no lookup reads any more. Bounded pages, never failing the build.
//!
//! Invariants:
//! - **Deterministic names.** A staging record is named after its first row's keys, a segment
//!   after its first record: a redelivered step or item rewrites the same blob, never adds one
//!   (except after the table changed in between, which adds an overlapping record: ranges that
//!   overlap are merged in a segment, and a lookup merges candidate ranges that overlap).
//! - **No false negatives.** Every row holding the property that a step or item read is in a
//!   range of a record; every record of the build's staging folder is in exactly one segment
//!   (segment items re-list their records by name, first to last); every value a range held is
//!   in its filter (or the range is a candidate for every value: `crate::index`).
//! - **One build at a time per prefix, and lookups never see a half-built index**: the
//!   reservation and the pointer (`publish`).
//! - **Bounded.** A staging call writes one record of at most a step's rows; a chunk item lists
//!   one page; a segment item reads about [`SEGMENT_STAGING_BYTES`] of records.

mod assemble;
mod prune;
mod publish;
mod stage;

use std::sync::Arc;
use tokio::time::Instant;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::index_files::IndexLayout;
use crate::app::job::request::default_connection;
use crate::app::job::{
    item_child, Begun, Driver, RangeWork, ScanContext, ScanRequest, Segment, Setup, StepWork,
    WorkError, WorkOutcome, WorkSplit, Worked, MAX_STEP_QUERY_SCALE, MAX_STEP_ROWS,
};
use crate::app::messages::{ChildSpec, ItemMessage};
use crate::app::pace::Meter;
use crate::app::state::AppState;
use crate::app::tracking::Counters;
use crate::scan::Strategy;
use crate::storage::blob::BlobStore;
use crate::storage::stores::Stores;
use crate::storage::{odata, Entity};

use super::kit::range::page_items;
use super::kit::{check_blob_connection, check_container_field};

pub use assemble::{PublishedSegment, SEGMENT_STAGING_BYTES};
pub use stage::RANGE_ROWS;

pub struct IndexDriver;

/// The index driver's request fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexFields {
    /// The one non-key property indexed.
    pub property: String,
    pub destination_container: String,
    /// A "folder" in the container: the pointer is `<prefix>/index.json`.
    #[serde(default)]
    pub destination_prefix: String,
    #[serde(default = "default_connection")]
    pub destination_connection: String,
    /// How long a build the pointer no longer names is kept for lookups paging through it
    /// (`prune`); default `prune::DEFAULT_KEEP_SUPERSEDED_SECONDS`.
    #[serde(default = "prune::default_keep")]
    pub keep_superseded_seconds: u64,
}

/// What an index scan records (its `ScanContext::options`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexOptions {
    pub property: String,
    pub connection: String,
    pub container: String,
    pub prefix: String,
    /// When the scan's storage was prepared, on the app's clock (`Driver::prepare`).
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    #[serde(default = "prune::default_keep")]
    pub keep_superseded_seconds: u64,
}

impl IndexOptions {
    fn layout(&self) -> Result<IndexLayout, WorkError> {
        IndexLayout::new(&self.prefix).map_err(|e| WorkError::Permanent(e.to_string()))
    }
}

/// One unit of an index build: a key range to stage (phase 0), or assembly work (phase 1).
/// Untagged: a range item's JSON is the range's own (`{"kind":"range",…}`), and the assembly
/// kinds are names a range never has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IndexWork {
    Range(RangeWork),
    Build(BuildWork),
}

/// Phase 1's work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum BuildWork {
    /// Lists one page of staging records from `marker` and queues its segments and the next
    /// page.
    Assemble {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        marker: Option<String>,
    },
    /// Builds one segment from the staging records named `first` to `last` (inclusive), listed
    /// from `marker`.
    Segment {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        marker: Option<String>,
        first: String,
        last: String,
    },
    /// Phase 2's root: switches the pointer to this build (`publish`), then cleans up.
    Publish,
    /// Deletes what one page of the prefix's `builds/` folder, from `marker`, holds that no
    /// lookup or build reads any more, once the pointer names this build (`prune`).
    Clean {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        marker: Option<String>,
    },
}

/// 4xx naming `property` unless it names one non-key property a filter can compare.
fn check_property(property: &str) -> Result<(), ApiError> {
    if property == "Timestamp" {
        return Err(ApiError::field(
            "property",
            "Timestamp is set by the service; index a property of your own",
        ));
    }
    odata::parse(&format!("{property} eq 0"))
        .map(|_| ())
        .map_err(|e| {
            ApiError::field(
                "property",
                format!("{property:?} is not a non-key property name a filter can compare ({e})"),
            )
        })
}

/// A build's `segmentsPerFirstPrefix` and `segmentsPerSubsequentPrefix` when the request names
/// none: every step costs a staging write, its read in assembly and its deletion, so a build
/// asks for fewer, larger steps than the engine's default fan-out (4 and 2). Simulated,
/// against a count at its defaults (14,784 requests at 3.56M rows): 17,748 requests at 4 and 2,
/// 14,392 at 4 and 8, 9,286 at 16 and 16, in about the count's time at 35M (docs/index.md,
/// Build).
pub const BUILD_SEGMENTS_PER_PREFIX: u32 = 16;

impl Driver for IndexDriver {
    const NAME: &'static str = "index";
    const PHASES: u32 = 2;
    type Fields = IndexFields;
    type Options = IndexOptions;
    type Item = IndexWork;

    /// A step's cost beside a count's is one staging write: the more rows per step, the less
    /// it weighs (and the fewer records phase 1 reads).
    fn step_rows(_: &ScanContext) -> usize {
        MAX_STEP_ROWS
    }

    /// Four times the queries, for the same reason: in tables of small partitions a step's
    /// queries run out first (simulated: ~3,100 rows a step at the app's 16), and each step
    /// costs a staging write, its read in assembly and its deletion after publication.
    fn step_query_scale(_: &ScanContext) -> usize {
        MAX_STEP_QUERY_SCALE
    }

    fn validate(fields: &IndexFields, _: &ScanRequest, config: &Config) -> Result<(), ApiError> {
        check_property(&fields.property)?;
        check_container_field("destinationContainer", &fields.destination_container)?;
        IndexLayout::new(&fields.destination_prefix)
            .map_err(|e| ApiError::field("destinationPrefix", e.to_string()))?;
        prune::check_keep(fields.keep_superseded_seconds)?;
        check_blob_connection(
            config,
            "destinationConnection",
            &fields.destination_connection,
        )
    }

    fn setup(fields: &IndexFields, request: &ScanRequest) -> Setup<IndexOptions> {
        let options = IndexOptions {
            property: fields.property.clone(),
            connection: fields.destination_connection.clone(),
            container: fields.destination_container.clone(),
            prefix: fields.destination_prefix.clone(),
            // The app's clock is not at hand here: `prepare` sets it.
            started_at: OffsetDateTime::UNIX_EPOCH,
            keep_superseded_seconds: fields.keep_superseded_seconds,
        };
        let step_work = match request.strategy {
            Strategy::Prefix => StepWork::Rows {
                select: Some(vec![fields.property.clone()]),
            },
            _ => StepWork::Items,
        };
        Setup {
            options: Some(options),
            step_work,
            default_segments_per_first_prefix: Some(BUILD_SEGMENTS_PER_PREFIX),
            default_segments_per_subsequent_prefix: Some(BUILD_SEGMENTS_PER_PREFIX),
            ..Setup::default()
        }
    }

    /// Creates the container and reserves the prefix for this build (`publish::reserve`).
    async fn prepare<S: Stores>(
        state: &AppState<S>,
        context: &mut ScanContext,
    ) -> Result<(), ApiError> {
        let mut options: IndexOptions = context
            .options()
            .map_err(|e| ApiError::field("body", e.to_string()))?;
        options.started_at = state.clock.now();
        context.set_options(&options);
        let layout = options
            .layout()
            .map_err(|e| ApiError::field("destinationPrefix", e.to_string()))?;
        let blobs = state.blob_store(&options.connection, &Meter::new())?;
        blobs.create_container(&options.container).await?;
        publish::reserve(state, &blobs, &options, &layout, &context.scan_id).await
    }

    fn segment(_: &ScanContext, rows: &[Entity]) -> Segment<IndexWork> {
        Segment {
            items: page_items(WorkSplit::Page, rows)
                .into_iter()
                .map(IndexWork::Range)
                .collect(),
            ..Segment::default()
        }
    }

    async fn work_rows<S: Stores>(
        state: &AppState<S>,
        scan: &ScanContext,
        requests: &Arc<Meter>,
        rows: Vec<Entity>,
    ) -> Result<i64, WorkError> {
        stage::stage(state, scan, requests, &[rows]).await
    }

    /// One staging record for all of a step's runs (ranges never span two runs).
    async fn work_runs<S: Stores>(
        state: &AppState<S>,
        scan: &ScanContext,
        requests: &Arc<Meter>,
        runs: Vec<Vec<Entity>>,
        _: Instant,
    ) -> Result<Worked, WorkError> {
        let rows_written = stage::stage(state, scan, requests, &runs).await?;
        Ok(Worked::from(Counters {
            rows_written,
            ..Counters::default()
        }))
    }

    async fn run<S: Stores>(
        state: &AppState<S>,
        begun: &Begun<ItemMessage>,
        item: IndexWork,
    ) -> Result<WorkOutcome, WorkError> {
        match item {
            IndexWork::Range(range) => stage::stage_item(state, begun, &range).await,
            IndexWork::Build(BuildWork::Assemble { marker }) => {
                assemble::chunk(state, begun, marker).await
            }
            IndexWork::Build(BuildWork::Segment {
                marker,
                first,
                last,
            }) => assemble::segment(state, begun, marker, &first, &last).await,
            IndexWork::Build(BuildWork::Publish) => publish::publish_item(state, begun).await,
            IndexWork::Build(BuildWork::Clean { marker }) => {
                Ok(prune::cleanup(state, begun, marker).await)
            }
        }
    }

    /// A small build's assembly item publishes the build itself (`assemble::build_and_publish`,
    /// its result marked `published`): phase 2 does not start.
    fn ends_phases(n: u32, result: Option<&str>) -> bool {
        let published = result.and_then(|r| serde_json::from_str::<PublishedSegment>(r).ok());
        n == 1 && published.is_some_and(|p| p.published)
    }

    fn phase(_: &ScanContext, n: u32) -> Result<ChildSpec, WorkError> {
        match n {
            1 => item_child::<Self>(&IndexWork::Build(BuildWork::Assemble { marker: None })),
            2 => item_child::<Self>(&IndexWork::Build(BuildWork::Publish)),
            _ => Err(WorkError::Permanent(format!(
                "the index driver has no phase {n}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::messages::ItemJson;

    /// Items are identified by their JSON text: a range item's is the range's own.
    /// Only a phase-1 root whose result says it published the build ends the phases: a
    /// segment item's descriptor (a build of several segments) or no result does not.
    #[test]
    fn a_published_assembly_result_ends_the_phases() {
        let published =
            r#"{"published":true,"segment":{"name":"s.seg","ranges":2,"rows":9,"bytes":64}}"#;
        let descriptor = r#"{"name":"s.seg","ranges":2,"rows":9,"bytes":64}"#;
        assert!(IndexDriver::ends_phases(1, Some(published)));
        assert!(IndexDriver::ends_phases(1, Some(r#"{"published":true}"#)));
        assert!(!IndexDriver::ends_phases(1, Some(descriptor)));
        assert!(!IndexDriver::ends_phases(1, None));
        assert!(!IndexDriver::ends_phases(2, Some(published)));
        let entry: SegmentEntryCheck = serde_json::from_str(published).unwrap();
        assert_eq!(entry.segment.name, "s.seg");
    }

    /// The published result still holds the descriptor in the manifest's own form.
    #[derive(serde::Deserialize)]
    struct SegmentEntryCheck {
        segment: crate::app::index_files::SegmentEntry,
    }

    #[test]
    fn items_serialize_as_their_kinds() {
        let range = IndexWork::Range(RangeWork::Range {
            from: ("a".into(), "1".into()),
            to: ("b".into(), "2".into()),
        });
        let text = ItemJson::from_item(&range).unwrap();
        assert_eq!(
            text.as_str(),
            r#"{"kind":"range","from":["a","1"],"to":["b","2"]}"#
        );
        assert_eq!(text.parse::<IndexWork>().unwrap(), range);
        let chunk = IndexWork::Build(BuildWork::Assemble { marker: None });
        let text = ItemJson::from_item(&chunk).unwrap();
        assert_eq!(text.as_str(), r#"{"kind":"assemble"}"#);
        assert_eq!(text.parse::<IndexWork>().unwrap(), chunk);
        let segment = IndexWork::Build(BuildWork::Segment {
            marker: Some("m".into()),
            first: "a".into(),
            last: "b".into(),
        });
        let text = ItemJson::from_item(&segment).unwrap();
        assert_eq!(text.parse::<IndexWork>().unwrap(), segment);
    }

    #[test]
    fn only_a_comparable_non_key_property_is_indexed() {
        check_property("Owner").unwrap();
        for bad in ["PartitionKey", "RowKey", "Timestamp", "", "a b", "x'"] {
            let e = check_property(bad).unwrap_err().to_string();
            assert!(e.starts_with("property:"), "{bad}: {e}");
        }
    }
}
