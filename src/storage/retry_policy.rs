//! Retrying transient storage failures: the adapters' settings ([`RetryPolicy`]) run through the
//! crate's one retry loop ([`crate::retry`]).
//!
//! Invariants:
//! - The Azure SDK's own retry is switched off (`RetryOptions::none()`), so every attempt goes
//!   through here and is counted as a billable request by the caller's `op`.
//! - Only [`StorageError::is_transient`] errors (408, 429, 500, 502, 503, 504, timeouts, connection
//!   failures) are retried, never other 4xx nor our own validation errors.
//! - Waits are "full jitter": uniformly below the ceiling `min(max_delay, base_delay * 2^(r-1))`.
//! - The error returned after more than one attempt says so: `… (after N attempts)`.

use std::future::Future;
use std::time::Duration;

use crate::retry::{Backoff, FullJitter, Jitter};

use super::{StorageError, StorageResult};

/// How often and how patiently the storage adapters retry a transient failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts including the first (1 means no retry).
    pub max_attempts: u32,
    /// Upper bound of the first backoff; doubles with every retry.
    pub base_delay: Duration,
    /// Cap on any single backoff.
    pub max_delay: Duration,
}

/// 8 attempts, waits below 0.1, 0.2, … 6.4 s: about 6 s of waiting on average (at most 12.7 s)
/// before a call gives up. Throttling (`503 Server Busy`) on a hot partition lasts seconds; an
/// invocation that gives up waits out the queue's visibility timeout (30 s) instead, which in
/// the simulator made the slowest tail of every big copy (docs/simulator.md).
impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..Self::default()
        }
    }
}

/// The storage policy as the crate's backoff: bounded by attempts, no deadline.
impl From<RetryPolicy> for Backoff {
    fn from(policy: RetryPolicy) -> Self {
        Backoff::new(policy.max_attempts, policy.base_delay, policy.max_delay)
    }
}

/// Runs `op` until it succeeds, fails with a non-transient error, or `policy.max_attempts` attempts
/// have been made; sleeps a fully jittered backoff between attempts. Returns the last error.
pub(crate) async fn retry<T, F, Fut>(policy: &RetryPolicy, op: F) -> StorageResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StorageResult<T>>,
{
    retry_with_jitter(policy, FullJitter, op).await
}

/// [`retry`] with the jitter supplied, so tests can fix it.
pub(crate) async fn retry_with_jitter<T, F, Fut>(
    policy: &RetryPolicy,
    jitter: impl Jitter,
    op: F,
) -> StorageResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StorageResult<T>>,
{
    let mut attempt = 0u32;
    let transient = |error: &StorageError| {
        attempt += 1;
        let transient = error.is_transient();
        if super::refused::is_refusal(error) {
            super::refused::report(super::refused::is_account_limit(error));
        }
        if transient {
            tracing::debug!(attempt, error = %error, "transient storage error");
        }
        transient
    };
    crate::retry::retry(&Backoff::from(*policy), jitter, op, transient)
        .await
        .map_err(|failure| with_attempts(failure.error, failure.attempts))
}

fn with_attempts(mut error: StorageError, attempts: u32) -> StorageError {
    if attempts > 1 {
        error.message = format!("{} (after {attempts} attempts)", error.message);
    }
    error
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;
    use crate::storage::StorageErrorKind;

    fn transient() -> StorageError {
        StorageError::from_status(503, Some("ServerBusy".into()), "busy")
    }

    /// Runs `op` under the policy with maximal jitter, recording when each attempt started.
    async fn attempt_times(
        policy: RetryPolicy,
        mut outcome: impl FnMut(u32) -> StorageResult<u32>,
    ) -> (StorageResult<u32>, Vec<Duration>) {
        let start = Instant::now();
        let times = Mutex::new(Vec::new());
        let calls = AtomicU32::new(0);
        let result = retry_with_jitter(&policy, crate::retry::NoJitter, || {
            times.lock().unwrap().push(start.elapsed());
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let r = outcome(n);
            async move { r }
        })
        .await;
        (result, times.into_inner().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn delays_double_up_to_the_cap_and_attempts_are_bounded() {
        let policy = RetryPolicy {
            max_attempts: 6,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
        };
        let (result, times) = attempt_times(policy, |_| Err(transient())).await;
        let err = result.unwrap_err();
        assert_eq!(err.kind, StorageErrorKind::Transient);
        assert!(err.message.contains("after 6 attempts"), "{err}");
        let ms: Vec<u128> = times.iter().map(|d| d.as_millis()).collect();
        // Waits before retries 1..=5: 100, 200, 400, 500 (capped), 500 (capped).
        assert_eq!(ms, vec![0, 100, 300, 700, 1200, 1700]);
    }

    #[tokio::test(start_paused = true)]
    async fn succeeds_after_transient_failures() {
        let (result, times) = attempt_times(RetryPolicy::default(), |n| {
            if n < 3 {
                Err(transient())
            } else {
                Ok(n)
            }
        })
        .await;
        assert_eq!(result.unwrap(), 3);
        assert_eq!(times.len(), 3);
        assert_eq!(times[2].as_millis(), 300);
    }

    #[tokio::test(start_paused = true)]
    async fn client_errors_are_never_retried() {
        for (status, code) in [
            (400, "InvalidInput"),
            (403, "AuthenticationFailed"),
            (404, "TableNotFound"),
            (409, "EntityAlreadyExists"),
            (412, "UpdateConditionNotSatisfied"),
        ] {
            let (result, times) = attempt_times(RetryPolicy::default(), |_| {
                Err(StorageError::from_status(status, Some(code.into()), "no"))
            })
            .await;
            let err = result.unwrap_err();
            assert_eq!(err.status, Some(status));
            assert!(!err.message.contains("attempts"));
            assert_eq!(
                times,
                vec![Duration::ZERO],
                "status {status} must not be retried"
            );
        }
        let (result, times) = attempt_times(RetryPolicy::default(), |_| {
            Err(StorageError::invalid_input("bad"))
        })
        .await;
        assert_eq!(result.unwrap_err().kind, StorageErrorKind::InvalidInput);
        assert_eq!(times.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn every_transient_status_is_retried() {
        for status in [408, 429, 500, 502, 503, 504] {
            let (result, times) = attempt_times(
                RetryPolicy {
                    max_attempts: 2,
                    ..RetryPolicy::default()
                },
                |n| {
                    if n == 1 {
                        Err(StorageError::from_status(status, None, "try again"))
                    } else {
                        Ok(n)
                    }
                },
            )
            .await;
            assert_eq!(result.unwrap(), 2, "status {status}");
            assert_eq!(times.len(), 2);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn random_jitter_stays_below_the_ceiling() {
        let policy = RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(80),
            max_delay: Duration::from_millis(200),
        };
        let start = Instant::now();
        let calls = AtomicU32::new(0);
        let result: StorageResult<()> = retry(&policy, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(transient()) }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        // Ceilings 80 + 160 + 200 + 200.
        assert!(
            start.elapsed() <= Duration::from_millis(640),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn the_policy_is_the_crate_backoff_without_a_deadline() {
        let backoff = Backoff::from(RetryPolicy::default());
        assert_eq!(
            backoff,
            Backoff::new(8, Duration::from_millis(100), Duration::from_secs(10))
        );
        assert_eq!(backoff.ceiling(4), Duration::from_millis(800));
        assert_eq!(RetryPolicy::none().max_attempts, 1);
    }
}
