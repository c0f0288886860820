//! The development tools, so they cannot rot: the demo (`demo`), the benchmark (`bench`) and the
//! simulator (`simulate`), each on a small table.

mod bench;
mod demo;
mod simulate;
