//! Refused requests, reported to whoever sent them: a storage attempt the service refused for
//! load (`503`, e.g. `ServerBusy`, or `500 OperationTimedOut`) is retried inside the adapters'
//! retry loop, below the caller's counting wrapper, so the loop reports it here and the caller
//! that scoped the call ([`scope`]) hears of it (the adaptive pacer, `app::pace::adaptive`),
//! with whether it was the account's limit ([`is_account_limit`]) or another refusal (a hot
//! partition's, which slowing the whole scan would not help).
//!
//! Invariants:
//! 1. Reporting is free outside a scope (no allocation, no lock): only a task-local read.
//! 2. Every refused attempt inside a scope is reported exactly once, to the innermost scope.

use std::future::Future;
use std::sync::Arc;

use super::StorageError;

/// Hears of refused attempts.
pub trait Sink: Send + Sync {
    /// One refused attempt; `account_limit`: the account's limit refused it.
    fn refused(&self, account_limit: bool);
}

tokio::task_local! {
    static SINK: Arc<dyn Sink>;
}

/// Runs `call` with its refused attempts reported to `sink`.
pub async fn scope<F: Future>(sink: Arc<dyn Sink>, call: F) -> F::Output {
    SINK.scope(sink, call).await
}

/// Whether `error` is the service refusing for load: any `503`, or `500 OperationTimedOut`.
pub fn is_refusal(error: &StorageError) -> bool {
    match error.status {
        Some(503) => true,
        Some(500) => error.code.as_deref() == Some("OperationTimedOut"),
        _ => false,
    }
}

/// Whether `error` is the account refusing for its limits: a `503` saying "over the account
/// limit" (the service's documented messages for its request rate, ingress and egress targets:
/// "Operations per second is over the account limit." and the like), or a `500
/// OperationTimedOut` (the service timing out under load). A partition's `503` says "The server
/// is busy." instead.
pub fn is_account_limit(error: &StorageError) -> bool {
    match error.status {
        Some(503) => error.message.contains("over the account limit"),
        Some(500) => error.code.as_deref() == Some("OperationTimedOut"),
        _ => false,
    }
}

/// Reports one refused attempt to the current scope, if any.
pub fn report(account_limit: bool) {
    let _ = SINK.try_with(|sink| sink.refused(account_limit));
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[derive(Default)]
    struct Count(AtomicU32);
    impl Sink for Count {
        fn refused(&self, _: bool) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[tokio::test]
    async fn reports_reach_the_innermost_scope_only() {
        let outer = Arc::new(Count::default());
        let inner = Arc::new(Count::default());
        report(true); // outside any scope: nothing
        scope(outer.clone(), async {
            report(true);
            scope(inner.clone(), async { report(false) }).await;
        })
        .await;
        assert_eq!(outer.0.load(Ordering::Relaxed), 1);
        assert_eq!(inner.0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn refusals_are_503s_and_operation_timeouts() {
        let busy = StorageError::from_status(503, Some("ServerBusy".into()), "busy");
        let timeout = StorageError::from_status(500, Some("OperationTimedOut".into()), "t");
        let internal = StorageError::from_status(500, Some("InternalError".into()), "i");
        assert!(is_refusal(&busy) && is_refusal(&timeout));
        assert!(!is_refusal(&internal));
        let account = StorageError::from_status(
            503,
            Some("ServerBusy".into()),
            "Operations per second is over the account limit.",
        );
        assert!(is_account_limit(&account) && is_account_limit(&timeout));
        assert!(!is_account_limit(&busy), "a partition's 503");
    }
}
