//! How the proxy names what it forwards: which service, which kind of request (as the
//! storage adapters' own counters count it) and which table, queue or container.

use crate::storage::blob::BlobRequestKind;
use crate::storage::request_counts::RequestKind;

/// Which service a proxy listener fronts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Service {
    Table,
    Queue,
    Blob,
}

/// What a request is: a table or queue request, or a blob request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Storage(RequestKind),
    Blob(BlobRequestKind),
}

pub(super) fn kind_name(kind: RequestKind) -> &'static str {
    match kind {
        RequestKind::Query => "query",
        RequestKind::Batch => "batch",
        RequestKind::PointRead => "point_read",
        RequestKind::TableAdmin => "table_admin",
        RequestKind::QueuePut => "queue_put",
        RequestKind::QueueGet => "queue_get",
        RequestKind::QueueDelete => "queue_delete",
        RequestKind::QueueUpdate => "queue_update",
        RequestKind::QueueAdmin => "queue_admin",
    }
}

pub(super) fn blob_kind_name(kind: BlobRequestKind) -> &'static str {
    match kind {
        BlobRequestKind::Write => "blob_write",
        BlobRequestKind::Read => "blob_read",
        BlobRequestKind::List => "blob_list",
        BlobRequestKind::Admin => "blob_admin",
        BlobRequestKind::Delete => "blob_delete",
    }
}

pub(super) fn any_kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Storage(k) => kind_name(k),
        Kind::Blob(k) => blob_kind_name(k),
    }
}

/// Classifies a blob request as `BlobRequestCounters` counts it, and names its container:
/// List Blobs (`restype=container&comp=list`), container calls (`restype=container`), reads
/// (GET/HEAD of a blob: Get Blob, its properties, its block list), deletes (DELETE of a blob)
/// and writes (Put Blob, Put Block, Put Block List, and anything else sent to a blob).
fn classify_blob(method: &hyper::Method, path: &str, query: &str) -> (BlobRequestKind, String) {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // Path-style URLs: /{account}/{container}/{blob...}
    let container = segments.get(1).copied().unwrap_or("").to_string();
    let blob = segments.len() > 2 && segments[2..].iter().any(|s| !s.is_empty());
    let params: Vec<&str> = query.split('&').collect();
    let kind = if params.contains(&"comp=list") {
        BlobRequestKind::List
    } else if !blob {
        BlobRequestKind::Admin
    } else if *method == hyper::Method::GET || *method == hyper::Method::HEAD {
        BlobRequestKind::Read
    } else if *method == hyper::Method::DELETE {
        BlobRequestKind::Delete
    } else {
        BlobRequestKind::Write
    };
    (kind, container)
}

/// Classifies a request and names the table or queue it addresses.
pub(super) fn classify(
    service: Service,
    method: &hyper::Method,
    path: &str,
    query: &str,
    body: &[u8],
) -> (Kind, String) {
    if service == Service::Blob {
        let (kind, container) = classify_blob(method, path, query);
        return (Kind::Blob(kind), container);
    }
    let (kind, resource) = classify_storage(service, method, path, query, body);
    (Kind::Storage(kind), resource)
}

/// Classifies a table or queue request and names the table or queue it addresses.
pub(super) fn classify_storage(
    service: Service,
    method: &hyper::Method,
    path: &str,
    query: &str,
    body: &[u8],
) -> (RequestKind, String) {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // Path-style URLs: /{account}/{resource}...
    let resource = segments.get(1).copied().unwrap_or("");
    match service {
        Service::Table => {
            if resource == "$batch" {
                return (RequestKind::Batch, batch_table(body));
            }
            let name = resource.split('(').next().unwrap_or("").to_string();
            if name.eq_ignore_ascii_case("Tables") {
                let table = resource.split('\'').nth(1).unwrap_or("").to_string();
                return (RequestKind::TableAdmin, table);
            }
            let kind = match *method {
                hyper::Method::GET if resource.contains("PartitionKey=") => RequestKind::PointRead,
                hyper::Method::GET => RequestKind::Query,
                _ => RequestKind::TableAdmin,
            };
            (kind, name)
        }
        Service::Queue | Service::Blob => {
            let queue = resource.to_string();
            let messages = segments.get(2) == Some(&"messages");
            let kind = match (method.clone(), messages, segments.len() > 3) {
                (hyper::Method::POST, true, false) => RequestKind::QueuePut,
                (hyper::Method::GET, true, _) if !query.contains("peekonly=true") => {
                    RequestKind::QueueGet
                }
                (hyper::Method::DELETE, true, true) => RequestKind::QueueDelete,
                (hyper::Method::PUT, true, true) => RequestKind::QueueUpdate,
                _ => RequestKind::QueueAdmin,
            };
            (kind, queue)
        }
    }
}

/// The table an entity group transaction writes to, from its first operation's URL.
fn batch_table(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    for line in text.lines() {
        let Some((_, rest)) = line.split_once(" http") else {
            continue;
        };
        let Some(url) = rest.split_whitespace().next() else {
            continue;
        };
        let path = url.splitn(4, '/').nth(3).unwrap_or("");
        if let Some(resource) = path.split('/').nth(1) {
            return resource.split('(').next().unwrap_or("").to_string();
        }
    }
    String::new()
}
