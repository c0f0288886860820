//! Local Functions host (filled in by the host work).
