//! The registry of drivers as the app runs them: [`DriverHooks`], a [`Driver`] with its types
//! erased (one trait object per driver, a boxed future per call), and [`Drivers`], the list of
//! them the app is built with (`drivers::registry`, handed to `AppState::new`). The start
//! handler, the work runner and the status handler reach a scan's driver only through it, by
//! the name the scan records: none of them names a driver.
//!
//! `S` is the app state the hooks run against (`AppState<S>`); it is a parameter so that
//! this list sits below the state that holds it.
//!
//! [`Driver`]: crate::app::job::driver::Driver

use crate::app::pace::Meter;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::time::Instant;

use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::begun::Begun;
use crate::app::job::context::{ScanContext, Setup};
use crate::app::job::error::WorkError;
use crate::app::job::outcome::{WorkOutcome, Worked};
use crate::app::job::range::RangeWork;
use crate::app::job::request::ScanRequest;
use crate::app::messages::{ChildSpec, ItemMessage};
use crate::storage::Entity;

/// A future a hook returns (boxed: one allocation per call, against a work item's requests).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A registered driver, its types erased: what the handlers and the runner call. Implemented
/// for every `Driver` by `drivers::kit::hooks`; see `Driver` for what each step means.
pub trait DriverHooks<S>: Send + Sync {
    /// `Driver::NAME`.
    fn name(&self) -> &'static str;
    /// `Driver::SCANS_TABLE`.
    fn scans_table(&self) -> bool;
    /// `Driver::COMPLETES`.
    fn completes(&self) -> bool;
    /// `Driver::PHASES`.
    fn phases(&self) -> u32;
    /// `Driver::phase`.
    fn phase(&self, context: &ScanContext, n: u32) -> Result<ChildSpec, WorkError>;
    /// `Driver::ends_phases`.
    fn ends_phases(&self, n: u32, result: Option<&str>) -> bool;
    /// `Driver::CHANGES_SOURCE`.
    fn changes_source(&self) -> bool;
    /// `Driver::step_rows`, at most `MAX_STEP_ROWS`.
    fn step_rows(&self, context: &ScanContext) -> usize;
    /// `Driver::step_query_scale`, 1..=`MAX_STEP_QUERY_SCALE`.
    fn step_query_scale(&self, context: &ScanContext) -> usize;
    /// Reads and checks the driver's fields and the common ones it accepts (a 4xx names the
    /// field), records the fields as read in `request`, and gives what the scan records.
    fn plan(&self, request: &mut ScanRequest, config: &Config) -> Result<Setup, ApiError>;
    /// `Driver::prepare`.
    fn prepare<'a>(
        &'a self,
        state: &'a S,
        context: &'a mut ScanContext,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
    /// `Driver::root`.
    fn root(&self, context: &ScanContext) -> Result<ChildSpec, WorkError>;
    /// Adds what one scanned segment becomes (`Driver::segment`) to `outcome`.
    fn segment(
        &self,
        context: &ScanContext,
        rows: &[Entity],
        outcome: &mut WorkOutcome,
    ) -> Result<(), WorkError>;
    /// `Driver::work_runs` on rows a step read, as its contiguous runs (every row not handed
    /// off matched; a paced driver stops starting work at `until`).
    fn work_rows<'a>(
        &'a self,
        state: &'a S,
        scan: &'a ScanContext,
        requests: &'a Arc<Meter>,
        runs: Vec<Vec<Entity>>,
        until: Instant,
    ) -> BoxFuture<'a, Result<Worked, WorkError>>;
    /// Reads one key range of a step's rows again and works on it: for a delivery that
    /// adopted a step's recorded outcome, whose rows the recording delivery may not have
    /// worked on (as `work_rows`, with `until`).
    fn rework<'a>(
        &'a self,
        state: &'a S,
        scan: &'a ScanContext,
        requests: &'a Arc<Meter>,
        range: &'a RangeWork,
        until: Instant,
    ) -> BoxFuture<'a, Result<Worked, WorkError>>;
    /// Parses the item of `begun` as the driver's and runs it (`Driver::run`).
    fn run<'a>(
        &'a self,
        state: &'a S,
        begun: &'a Begun<ItemMessage>,
    ) -> BoxFuture<'a, Result<WorkOutcome, WorkError>>;
    /// `Driver::complete`.
    fn complete<'a>(
        &'a self,
        state: &'a S,
        context: &'a ScanContext,
    ) -> BoxFuture<'a, Result<(), WorkError>>;
}

/// The app's drivers, by name. Cheap to clone.
pub struct Drivers<S>(Arc<[Box<dyn DriverHooks<S>>]>);

impl<S> Clone for Drivers<S> {
    fn clone(&self) -> Self {
        Drivers(self.0.clone())
    }
}

impl<S> Drivers<S> {
    /// The registry of `drivers`; their names must differ.
    pub fn new(drivers: Vec<Box<dyn DriverHooks<S>>>) -> Self {
        for (i, d) in drivers.iter().enumerate() {
            assert!(
                drivers[..i].iter().all(|e| e.name() != d.name()),
                "driver {} is registered twice",
                d.name()
            );
        }
        Drivers(drivers.into())
    }

    /// Every registered name, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|d| d.name()).collect()
    }

    /// The driver named `name`.
    pub fn get(&self, name: &str) -> Option<&dyn DriverHooks<S>> {
        self.0.iter().find(|d| d.name() == name).map(|d| &**d)
    }

    /// The driver `scan` records; a scan recording one this app lacks cannot run (permanent).
    pub fn of(&self, scan: &ScanContext) -> Result<&dyn DriverHooks<S>, WorkError> {
        self.get(scan.driver.as_str()).ok_or_else(|| {
            WorkError::Permanent(format!(
                "scan {} records driver {:?}, which this app does not have (it has: {})",
                scan.scan_id,
                scan.driver.as_str(),
                self.names().join(", ")
            ))
        })
    }
}
