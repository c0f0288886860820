//! The scan engine: enumerate every row of a table range, serially or by recursive
//! partition-key prefix discovery (Joel Verhagen's prefix scan, made exact).
//!
//! Pure algorithm over the [`TableStore`] interface: no HTTP, no Azure, no Functions.
//! A scan is a tree of [`Step`]s. Steps carry key bounds, never continuation tokens, so any
//! step can be executed later by any process; executing one returns rows (as [`Step::Segment`])
//! and follow-up steps, in depth-first (PK, RK) order.

mod budget;
mod engine;
mod error;
mod midpoint;
mod params;
mod region;
mod step;

pub use budget::StepBudget;
pub use engine::{list, Scanner, StepOutput};
pub use error::ScanError;
pub use params::{ParameterError, ScanParameters, Strategy, MAX_SEGMENTS_PER_PREFIX};
pub use step::{LowerBound, Step};
