//! One module per function of the catalog.

pub mod cancel_scan;
pub mod get_scan;
pub mod list_scans;
pub mod lookup;
pub mod poisoned;
pub mod prefix_scan;
pub mod scan_cleanup;
pub mod start_scan;
pub mod status;
pub mod table_copy;
