//! Starting Azurite (filled in by the storage work).
