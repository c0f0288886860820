//! What an index build deletes, in bounded items, once it is published: the blobs no lookup
//! and no build reads any more.
//!
//! One chain of items, started by the publication item (which runs its first page itself) once
//! the pointer names the build: each lists one page (at most [`PAGE`] blobs) of the prefix's
//! `builds/` folder, judges each build the page names ([`judge`]), deletes what the judgement
//! allows, and queues the next page's item. Publication happens before: a build that fails
//! deletes nothing, and old garbage never delays a switch.
//!
//! The rule ([`judge`]), for a build `B` found under `builds/` by build `N` (the one cleaning),
//! with the pointer as it is then (naming `N`, or in a late duplicate a newer build):
//! - **Never touched**: a folder whose name is not a scan id; a build started after `N` (a
//!   newer build, perhaps running: only a late duplicate of this item could meet one); the
//!   reservation's holder unless it is `N`; another build started in `N`'s millisecond.
//! - **`N` itself**: published, so its **staging records** go (segments are built from them in
//!   phase 1, and nothing reads them after the switch); its manifest and segments stay.
//! - Every other build has **ended**: `N` took the reservation over from it (or it was refused,
//!   and wrote nothing), which a running build never allows. Its staging records go. The
//!   current build's manifest and segments stay. A build without a manifest was never named by
//!   the pointer (the manifest is written before the switch), so no lookup pages through it:
//!   all of it goes. A build with one may have been current, and a continuation token may name
//!   it: it goes only once `superseded + keepSupersededSeconds` is at or before `N`'s start
//!   (until then it stays, and a later build deletes it), where `superseded` is when the
//!   pointer moved away from it, as the pointer remembers (`Pointer::superseded`), or, for a
//!   build it does not remember, a time no earlier: its oldest remembered entry's (a forgotten
//!   build was superseded before that one), else `switchedAt` (every non-current build was
//!   superseded by then).
//! - Within a build, the manifest is deleted before the rest: a lookup naming a build being
//!   deleted answers 404 ("index build … is gone"), never a partial index.
//!
//! The items are idempotent (a delete of a missing blob is not an error; a redelivery lists its
//! page again) and never fail the build: an error is logged, and what it left is found by the
//! next build, which deletes any ended build's staging records.

use futures::stream::{self, StreamExt, TryStreamExt};
use time::{Duration, OffsetDateTime};

use crate::app::error::ApiError;
use crate::app::index_files::{Pointer, Reservation, Superseded, MAX_POINTER_BYTES};
use crate::app::job::{is_valid_scan_id, item_child, Begun, WorkError, WorkOutcome};
use crate::app::messages::ItemMessage;
use crate::app::state::AppState;
use crate::app::tracking::retention::started_at;
use crate::storage::blob::{BlobStore, Downloaded};
use crate::storage::stores::Stores;
use crate::storage::StorageError;

use super::{BuildWork, IndexDriver, IndexOptions, IndexWork};

/// A superseded build is kept at least this long (seconds) by default: an hour of paging.
pub const DEFAULT_KEEP_SUPERSEDED_SECONDS: u64 = 3600;
/// The longest `keepSupersededSeconds` accepted: 30 days.
pub const MAX_KEEP_SUPERSEDED_SECONDS: u64 = 30 * 24 * 3600;

pub fn default_keep() -> u64 {
    DEFAULT_KEEP_SUPERSEDED_SECONDS
}

/// 4xx naming `keepSupersededSeconds` past [`MAX_KEEP_SUPERSEDED_SECONDS`].
pub fn check_keep(seconds: u64) -> Result<(), ApiError> {
    if seconds > MAX_KEEP_SUPERSEDED_SECONDS {
        return Err(ApiError::field(
            "keepSupersededSeconds",
            format!("{seconds} is over {MAX_KEEP_SUPERSEDED_SECONDS} (30 days)"),
        ));
    }
    Ok(())
}

/// Blobs one item lists, and so at most deletes: about a second of deletes.
pub const PAGE: u32 = 1000;
/// Deletes (and manifest reads) in flight at once.
const DELETES_IN_FLIGHT: usize = 16;

/// What a build's blobs come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing is deleted.
    Keep,
    /// Its staging records are deleted.
    Staging,
    /// Everything is deleted (the manifest first).
    All,
}

/// What [`judge`] knows of the prefix when build `pruning` cleans, once published.
#[derive(Debug, Clone)]
pub struct Prefix<'a> {
    /// The build pruning.
    pub pruning: &'a str,
    /// When it started (its recorded `startedAt`): the clock the grace is measured on.
    pub now: OffsetDateTime,
    /// The pointer's build and when the pointer switched to it (`None`: no pointer).
    pub current: Option<(&'a str, OffsetDateTime)>,
    /// The builds the pointer remembers superseding, most recent first, and when.
    pub superseded: &'a [Superseded],
    /// The reservation's holder, if readable.
    pub holder: Option<&'a str>,
    /// How long a superseded build is kept (`keepSupersededSeconds`).
    pub keep: Duration,
}

/// The rule of the module documentation, for build `build` (`manifest`: whether it has one).
pub fn judge(prefix: &Prefix<'_>, build: &str, manifest: bool) -> Verdict {
    let (Some(started), Some(pruning)) = (started_at(build), started_at(prefix.pruning)) else {
        return Verdict::Keep;
    };
    if !is_valid_scan_id(build) || started > pruning {
        return Verdict::Keep;
    }
    if build == prefix.pruning {
        // Published (this runs after the switch): only its staging records are done with.
        return Verdict::Staging;
    }
    if prefix.holder == Some(build) || started == pruning {
        return Verdict::Keep;
    }
    let Some((current, switched)) = prefix.current else {
        // No pointer, yet a manifest: it may have been current; its supersession is unknown.
        return if manifest {
            Verdict::Staging
        } else {
            Verdict::All
        };
    };
    if current == build {
        return Verdict::Staging;
    }
    if !manifest {
        return Verdict::All;
    }
    // When it was superseded, or a time no earlier: a build the pointer does not remember was
    // superseded before the oldest one it does (or, remembering none, before the switch to the
    // current build).
    let superseded = prefix
        .superseded
        .iter()
        .find(|s| s.build == build)
        .or(prefix.superseded.last())
        .map_or(switched, |s| s.at);
    match superseded + prefix.keep <= prefix.now {
        true => Verdict::All,
        false => Verdict::Staging,
    }
}

/// A small JSON blob, `None` if it is missing or unreadable.
async fn read_json<J: serde::de::DeserializeOwned, B: BlobStore>(
    blobs: &B,
    container: &str,
    name: &str,
) -> Result<Option<J>, StorageError> {
    match blobs.download(container, name, MAX_POINTER_BYTES).await {
        Ok(Downloaded { bytes, .. }) => Ok(serde_json::from_slice(&bytes).ok()),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Deletes `names`, [`DELETES_IN_FLIGHT`] at a time; returns how many were there.
async fn delete_all<B: BlobStore>(
    blobs: &B,
    container: &str,
    names: &[String],
) -> Result<usize, StorageError> {
    let deleted: Vec<bool> = stream::iter(names.iter().cloned())
        .map(|name| async move { blobs.delete(container, &name).await })
        .buffer_unordered(DELETES_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(deleted.into_iter().filter(|d| *d).count())
}

/// One page of the cleanup, its deletes, and the item of the next page (the children). An
/// error is logged and the page counts as done: cleanup never fails a build (the next build
/// finds what is left). The first page runs inside the publication item, so a build whose
/// cleanup fits a page queues no item for it.
pub async fn cleanup<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    marker: Option<String>,
) -> WorkOutcome {
    let scan = &begun.scan.scan_id;
    page(state, begun, marker).await.unwrap_or_else(|e| {
        tracing::warn!(scan = %scan, error = %e, "index cleanup left blobs for the next build");
        WorkOutcome::default()
    })
}

async fn page<S: Stores>(
    state: &AppState<S>,
    begun: &Begun<ItemMessage>,
    marker: Option<String>,
) -> Result<WorkOutcome, WorkError> {
    let scan = &*begun.scan;
    let options: IndexOptions = scan.options()?;
    let layout = options.layout()?;
    let blobs = state.blob_store(&options.connection, &begun.requests)?;
    let container = &options.container;
    let folder = layout.blob("builds/");
    let page = blobs
        .list(container, &folder, PAGE, marker.as_deref())
        .await?;
    let names: Vec<&str> = page.blobs.iter().map(|b| b.name.as_str()).collect();
    let own = |n: &&str| build_of(&folder, n) == Some(scan.scan_id.as_str());
    let (first, rest) = if names.iter().all(own) {
        // Only this build's blobs (a first build's page): its staging records, without reading
        // the pointer and the reservation (the rule needs neither for them).
        let staging = layout.staging_folder(&scan.scan_id);
        let rest = names.iter().filter(|n| n.starts_with(&staging));
        (Vec::new(), rest.map(|n| n.to_string()).collect())
    } else {
        let pointer: Option<Pointer> = read_json(&blobs, container, &layout.pointer()).await?;
        let reservation: Option<Reservation> =
            read_json(&blobs, container, &layout.reservation()).await?;
        let prefix = Prefix {
            pruning: &scan.scan_id,
            now: options.started_at,
            current: pointer.as_ref().map(|p| (p.build.as_str(), p.switched_at)),
            superseded: pointer.as_ref().map_or(&[], |p| p.superseded.as_slice()),
            holder: reservation.as_ref().map(|r| r.scan_id.as_str()),
            keep: Duration::seconds(options.keep_superseded_seconds as i64),
        };
        doomed(&blobs, container, &folder, &prefix, &names).await?
    };
    let deleted =
        delete_all(&blobs, container, &first).await? + delete_all(&blobs, container, &rest).await?;
    if deleted > 0 {
        tracing::info!(scan = %scan.scan_id, deleted, "index cleanup: blobs deleted");
    }
    let mut outcome = WorkOutcome::default();
    if let Some(next) = page.next_marker {
        let work = IndexWork::Build(BuildWork::Clean { marker: Some(next) });
        outcome.children.push(item_child::<IndexDriver>(&work)?);
    }
    Ok(outcome)
}

/// The build a blob of the `builds/` folder belongs to.
fn build_of<'a>(folder: &str, name: &'a str) -> Option<&'a str> {
    let (build, _) = name.strip_prefix(folder)?.split_once('/')?;
    Some(build)
}

/// The blobs of one listing page the rule deletes: manifests (deleted first), then the rest.
async fn doomed<B: BlobStore>(
    blobs: &B,
    container: &str,
    folder: &str,
    prefix: &Prefix<'_>,
    names: &[&str],
) -> Result<(Vec<String>, Vec<String>), StorageError> {
    let mut builds: Vec<&str> = names.iter().filter_map(|n| build_of(folder, n)).collect();
    builds.dedup(); // in name order, so a build's blobs are consecutive
    let manifest = |build: &str| format!("{folder}{build}/manifest.json");
    // A manifest is read only where it decides and the page does not show it: at most one
    // properties read per build the page names, READS_IN_FLIGHT at a time.
    let unsure: Vec<String> = builds
        .iter()
        .filter(|b| judge(prefix, b, true) != judge(prefix, b, false))
        .map(|b| manifest(b))
        .filter(|m| !names.contains(&m.as_str()))
        .collect();
    let found: Vec<String> = stream::iter(unsure)
        .map(|name| async move {
            let there = blobs.properties(container, &name).await?;
            Ok::<_, StorageError>(there.map(|_| name))
        })
        .buffer_unordered(DELETES_IN_FLIGHT)
        .try_filter_map(|found| async move { Ok(found) })
        .try_collect()
        .await?;
    let has_manifest = |build: &str| {
        let name = manifest(build);
        names.contains(&name.as_str()) || found.contains(&name)
    };
    let verdicts: Vec<(&str, Verdict)> = builds
        .iter()
        .map(|b| (*b, judge(prefix, b, has_manifest(b))))
        .collect();
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for &name in names {
        let Some(build) = build_of(folder, name) else {
            continue;
        };
        let verdict = verdicts.iter().find(|(b, _)| *b == build).map(|(_, v)| *v);
        let in_build = &name[folder.len() + build.len() + 1..];
        match verdict {
            Some(Verdict::All) if in_build == "manifest.json" => first.push(name.to_string()),
            Some(Verdict::All) => rest.push(name.to_string()),
            Some(Verdict::Staging) if in_build.starts_with("staging/") => {
                rest.push(name.to_string())
            }
            _ => {}
        }
    }
    Ok((first, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::index_files::MAX_SUPERSEDED;

    /// A scan id started `millis` after the epoch (the format `start_scan` makes).
    fn id(millis: u64) -> String {
        format!("{:013}-0000abcd", 9_999_999_999_999u64 - millis)
    }

    fn at(millis: u64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000).unwrap()
    }

    /// The publication and cleanup items' JSON (their identity): kinds no range item has.
    #[test]
    fn cleanup_items_serialize_as_their_kinds() {
        use crate::app::messages::ItemJson;
        for (item, text) in [
            (
                IndexWork::Build(BuildWork::Publish),
                r#"{"kind":"publish"}"#,
            ),
            (
                IndexWork::Build(BuildWork::Clean {
                    marker: Some("m".into()),
                }),
                r#"{"kind":"clean","marker":"m"}"#,
            ),
        ] {
            let json = ItemJson::from_item(&item).unwrap();
            assert_eq!(json.as_str(), text);
            assert_eq!(json.parse::<IndexWork>().unwrap(), item);
        }
    }

    #[test]
    fn the_rule_keeps_what_a_lookup_or_a_build_may_still_read() {
        let (old, current, pruning, newer) = (id(1_000), id(2_000), id(3_000), id(4_000));
        let prefix = |keep_secs: i64, now: u64| Prefix {
            pruning: &pruning,
            now: at(now),
            current: Some((&current, at(2_500))),
            superseded: &[],
            holder: Some(&pruning),
            keep: Duration::seconds(keep_secs),
        };
        let within = prefix(10, 3_000); // switched at 2.5 s, kept 10 s: not yet
        let past = prefix(10, 12_500);
        // The pruning build, a newer one (maybe running), a foreign folder: never touched.
        for p in [&within, &past] {
            // The cleaning build is published: its staging records go, nothing else.
            assert_eq!(judge(p, &pruning, true), Verdict::Staging);
            assert_eq!(judge(p, &newer, false), Verdict::Keep);
            let same_millisecond = format!("{}ffff", &pruning[..pruning.len() - 4]);
            assert_eq!(judge(p, &same_millisecond, false), Verdict::Keep);
            assert_eq!(judge(p, "not-a-build", false), Verdict::Keep);
            assert_eq!(judge(p, "0000000000001-mine", false), Verdict::Keep);
            // The current build keeps its segments; its staging records go.
            assert_eq!(judge(p, &current, true), Verdict::Staging);
            // Never published (no manifest): no lookup pages through it.
            assert_eq!(judge(p, &old, false), Verdict::All);
        }
        // Superseded: kept until the grace has passed, measured from the current's switch.
        assert_eq!(judge(&within, &old, true), Verdict::Staging);
        assert_eq!(judge(&past, &old, true), Verdict::All);
        // The reservation's holder is never touched, whatever its age.
        let held = Prefix {
            holder: Some(&old),
            ..past.clone()
        };
        assert_eq!(judge(&held, &old, false), Verdict::Keep);
        // No pointer: a build with a manifest may have been current; only its staging goes.
        let none = Prefix {
            current: None,
            ..past.clone()
        };
        assert_eq!(judge(&none, &old, true), Verdict::Staging);
        assert_eq!(judge(&none, &old, false), Verdict::All);
    }

    /// Rebuilds more often than the grace: each superseded build goes once its own grace has
    /// passed (as the pointer remembers it), so the builds kept do not grow with the rebuilds.
    #[test]
    fn frequent_rebuilds_delete_each_build_after_its_own_grace() {
        let ids: Vec<String> = (0..6).map(|i| id(500 + 1_000 * i)).collect();
        // ids[4] is current (switched at 4.8 s); ids[5] prunes. The pointer remembers ids[3],
        // ids[2] and ids[1] (superseded at 4.8, 3.8, 2.8 s); ids[0] it forgot.
        let remembered: Vec<Superseded> = (1..4)
            .rev()
            .map(|i| Superseded {
                build: ids[i].clone(),
                at: at(1_800 + 1_000 * i as u64),
            })
            .collect();
        let prefix = |now: u64| Prefix {
            pruning: &ids[5],
            now: at(now),
            current: Some((&ids[4], at(4_800))),
            superseded: &remembered,
            holder: Some(&ids[5]),
            keep: Duration::seconds(10),
        };
        let verdicts = |now: u64| -> Vec<Verdict> {
            (0..4).map(|i| judge(&prefix(now), &ids[i], true)).collect()
        };
        use Verdict::{All, Staging};
        assert_eq!(verdicts(12_700), [Staging, Staging, Staging, Staging]);
        // The forgotten build goes with the oldest remembered one (superseded no later).
        assert_eq!(verdicts(12_800), [All, All, Staging, Staging]);
        assert_eq!(verdicts(13_800), [All, All, All, Staging]);
        assert_eq!(verdicts(14_800), [All, All, All, All]);
    }

    /// A page's blobs: the rule per build, a manifest the page does not show read from the
    /// store, manifests first.
    #[cfg(feature = "lab")]
    #[tokio::test]
    async fn a_page_deletes_what_the_rule_allows_manifests_first() {
        use crate::lab::memory::MemoryBlobStore;
        use crate::storage::blob::BlobWrite;
        let (gone, kept, failed, pruning) = (id(1_000), id(2_000), id(2_500), id(3_000));
        let store = MemoryBlobStore::new();
        store.create_container("idx").await.unwrap();
        let folder = "p/builds/";
        let all = [
            format!("{folder}{gone}/manifest.json"),
            format!("{folder}{gone}/segments/a.seg"),
            format!("{folder}{kept}/manifest.json"),
            format!("{folder}{kept}/segments/a.seg"),
            format!("{folder}{kept}/staging/a.rec"),
            format!("{folder}{failed}/staging/a.rec"),
            format!("{folder}{pruning}/manifest.json"),
            format!("{folder}{pruning}/staging/a.rec"),
        ];
        for name in &all {
            let write = BlobWrite::new("x");
            store
                .upload("idx", name, bytes::Bytes::new(), &write)
                .await
                .unwrap();
        }
        // `gone` superseded long ago, `kept` just now (by `pruning`, current).
        let remembered = [
            Superseded {
                build: kept.clone(),
                at: at(3_500),
            },
            Superseded {
                build: gone.clone(),
                at: at(2_100),
            },
        ];
        let prefix = Prefix {
            pruning: &pruning,
            now: at(3_000 + 10_000),
            current: Some((&pruning, at(3_500))),
            superseded: &remembered,
            holder: Some(&pruning),
            keep: Duration::seconds(10),
        };
        // The page starts after `kept`'s manifest: it is read from the store.
        let page: Vec<&str> = all
            .iter()
            .map(String::as_str)
            .filter(|n| *n != all[2])
            .collect();
        let (first, rest) = doomed(&store, "idx", folder, &prefix, &page).await.unwrap();
        assert_eq!(first, vec![all[0].clone()]);
        assert_eq!(
            rest,
            vec![
                all[1].clone(),
                all[4].clone(),
                all[5].clone(),
                all[7].clone()
            ]
        );
    }

    #[test]
    fn a_pointer_remembers_a_bounded_list_of_superseded_builds() {
        let pointer = |build: &str, superseded: Vec<Superseded>| Pointer {
            format: "f".into(),
            build: build.into(),
            manifest: "m".into(),
            switched_at: at(0),
            superseded,
            indexed: None,
        };
        let mut list = Vec::new();
        for i in 0..(MAX_SUPERSEDED as u64 + 5) {
            list =
                super::super::publish::superseded_after(Some(pointer(&i.to_string(), list)), at(i));
        }
        assert_eq!(list.len(), MAX_SUPERSEDED);
        let last = MAX_SUPERSEDED as u64 + 4;
        assert_eq!(list[0].build, last.to_string());
        assert_eq!(list[0].at, at(last));
        assert!(list.windows(2).all(|w| w[0].at > w[1].at));
        assert!(super::super::publish::superseded_after(None, at(1)).is_empty());
    }
}
