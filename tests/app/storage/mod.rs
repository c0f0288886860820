//! The storage adapters against a real Azurite:
//! - `tables`: tables and queues, one test per gap of the Azure SDK 0.21 crates the adapters cover;
//! - `blobs`: the blob store (conditions, bounded downloads and listings, blocks, keyless);
//! - `records`: tablescan's own records at the service's size limits;
//! - `proxy`: the storage proxy that counts requests and injects Azure's faults.

mod blobs;
mod proxy;
mod records;
mod tables;
