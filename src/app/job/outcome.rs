//! What running a unit of work gives, for the runner and the drivers alike: what executing it
//! produced ([`WorkOutcome`], recorded on the item's row, so its serialized field names never
//! change; [`Executed`] adds the rows a scan step read for its driver), and a driver's view of one
//! scanned segment ([`Segment`]).

use serde::{Deserialize, Serialize};

use crate::app::job::range::RangeWork;
use crate::app::messages::ChildSpec;
use crate::app::tracking::Counters;
use crate::storage::Entity;

/// What executing a work item produced: children to spawn and counters to add.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkOutcome {
    #[serde(rename = "c")]
    pub children: Vec<ChildSpec>,
    #[serde(rename = "d")]
    pub delta: Counters,
    /// The driver's result for this item, kept on its finished row (e.g. an export part's
    /// descriptor; read back with `Tracker::work_results`). Short: the row must fit an entity.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The outcome's first driver work item lives in the item's own shard (registered in the
    /// transaction that recorded the outcome). Written by the version before [`first_grouped`]
    /// and still honoured when read; outcomes with neither flag (earlier versions) have their
    /// children in the shards their ids hash to.
    ///
    /// [`first_grouped`]: WorkOutcome::first_grouped
    #[serde(rename = "g", default, skip_serializing_if = "std::ops::Not::not")]
    pub grouped: bool,
    /// The outcome's first child, of either kind (a scan step's follow-up step, or a work
    /// item), lives in the item's own shard, registered in the transaction that recorded the
    /// outcome (what this version records). One, not all: siblings in one shard contend for its
    /// counter (in the simulator, every follow-up step in the parent's shard cost 4 % more
    /// requests and 6–20 s more at 3.56M rows than the registrations saved).
    #[serde(rename = "g1", default, skip_serializing_if = "std::ops::Not::not")]
    pub first_grouped: bool,
    /// The key ranges of `rows`, one per run of contiguous rows, recorded with the outcome: a
    /// delivery that adopts the outcome (the recording one died, or lost the race) reads them
    /// again and works on them (the driver's `rework` hook), since it cannot know whether the
    /// recording delivery did.
    #[serde(rename = "ir", default, skip_serializing_if = "Vec::is_empty")]
    pub in_step: Vec<RangeWork>,
}

impl WorkOutcome {
    /// Whether child `i` lives in the recording item's own shard (see [`WorkOutcome::grouped`]
    /// and [`WorkOutcome::first_grouped`]); the others live where their ids hash.
    pub fn in_own_shard(&self, i: usize) -> bool {
        let first_item = || {
            self.children
                .iter()
                .position(|c| matches!(c, ChildSpec::Item(_)))
        };
        if self.first_grouped {
            return i == 0;
        }
        self.grouped && first_item() == Some(i)
    }
}

/// What executing a work item produced: its outcome, and the rows a scan step read for its
/// driver to work on (scans that work in their steps), done once the step's children are
/// registered and queued, so that they start meanwhile. The rows are never recorded: the
/// outcome's `in_step` ranges are.
#[derive(Debug, Default)]
pub struct Executed {
    pub outcome: WorkOutcome,
    pub rows: Vec<Entity>,
}

impl From<WorkOutcome> for Executed {
    fn from(outcome: WorkOutcome) -> Self {
        Executed {
            outcome,
            rows: Vec::new(),
        }
    }
}

/// What a driver's work on a step's rows did ([`Driver::work_runs`]): its counters, and the
/// rows it left to work items of its own (`handed_off`, with `rows_handed_off` rows), for a
/// driver whose work is paced (the enqueue driver's puts) and would otherwise outlast its
/// invocation: it stops starting work once its time is up (`Config::hand_off_after`) and hands
/// the rows it did not reach on. Their `rowsMatched` goes with them: the items count it when
/// they read them again (their `rowsScanned` stays with the step or item that scanned them).
///
/// [`Driver::work_runs`]: crate::app::job::Driver::work_runs
#[derive(Debug, Default)]
pub struct Worked {
    pub counters: Counters,
    pub handed_off: Vec<ChildSpec>,
    pub rows_handed_off: i64,
}

impl From<Counters> for Worked {
    fn from(counters: Counters) -> Self {
        Worked {
            counters,
            ..Worked::default()
        }
    }
}

impl Worked {
    /// `self` and then `other`, done in one execution.
    pub fn plus(mut self, other: Worked) -> Worked {
        self.counters = self.counters.plus(&other.counters);
        self.handed_off.extend(other.handed_off);
        self.rows_handed_off += other.rows_handed_off;
        self
    }
}

/// What one scanned segment becomes: counters to add and work items to queue.
#[derive(Debug)]
pub struct Segment<I> {
    pub delta: Counters,
    pub items: Vec<I>,
}

impl<I> Default for Segment<I> {
    fn default() -> Self {
        Segment {
            delta: Counters::default(),
            items: Vec::new(),
        }
    }
}
