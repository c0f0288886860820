//! The job layer: what drivers, handlers and the work runner share, below all three (as a
//! job's types sit below the jobs in a background worker). Nothing here names a driver, a
//! handler or the runner.
//!
//! - `request`: a scan request as data and the checks of its common fields.
//! - `context`: what a scan records at start and its work reads (`ScanContext`, `Setup`), the
//!   driver's name, scan id validity.
//! - `range`: key ranges of the source table (`RangeWork`) and their exact filters.
//! - `outcome`, `error`, `begun`: what running a unit of work gives and needs.
//! - `driver`: the `Driver` trait a driver implements; `registry`: drivers as the app runs
//!   them (`DriverHooks`, `Drivers`).

pub mod begun;
pub mod context;
pub mod driver;
pub mod error;
pub mod outcome;
pub mod range;
pub mod registry;
pub mod request;

pub use begun::{Begun, Progress};
pub use context::{
    is_valid_scan_id, DriverName, ScanContext, Setup, StepWork, TableRef, WorkSplit,
};
pub use driver::{
    accepts, item_child, Driver, MAX_ITEM_QUERIES, MAX_ITEM_ROWS, MAX_STEP_QUERY_SCALE,
    MAX_STEP_ROWS, MAX_STEP_ROW_BYTES,
};
pub use error::WorkError;
pub use outcome::{Executed, Segment, WorkOutcome, Worked};
pub use range::RangeWork;
pub use registry::{BoxFuture, DriverHooks, Drivers};
pub use request::{Accepts, ScanRequest};
