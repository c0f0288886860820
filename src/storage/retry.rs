//! Retrying transient storage failures with capped exponential backoff and full jitter.
//!
//! The Azure SDK's own retry is switched off (`RetryOptions::none()`) so that every attempt goes
//! through here and is counted as a billable request; only [`StorageError::is_transient`] errors
//! (408, 429, 500, 502, 503, 504, timeouts, connection failures) are retried, never other 4xx.

use std::future::Future;
use std::time::Duration;

use rand::Rng;

use super::{StorageError, StorageResult};

/// How often and how patiently to retry a transient failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts including the first (1 means no retry).
    pub max_attempts: u32,
    /// Upper bound of the first backoff; doubles with every retry.
    pub base_delay: Duration,
    /// Cap on any single backoff.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 6,
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

    /// The longest backoff before retry number `retry` (1-based): `min(max_delay, base * 2^(retry-1))`.
    pub fn backoff_ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1).min(31))
            .unwrap_or(u32::MAX);
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }

    /// The backoff before retry number `retry` for a jitter draw in `0.0..=1.0` ("full jitter":
    /// uniformly anywhere below the ceiling, so many clients retrying at once spread out).
    pub fn backoff(&self, retry: u32, jitter: f64) -> Duration {
        self.backoff_ceiling(retry).mul_f64(jitter.clamp(0.0, 1.0))
    }
}

/// Runs `op` until it succeeds, fails with a non-transient error, or `policy.max_attempts` attempts
/// have been made; sleeps a jittered backoff between attempts. Returns the last error.
pub async fn retry<T, F, Fut>(policy: &RetryPolicy, op: F) -> StorageResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StorageResult<T>>,
{
    retry_with_jitter(policy, || rand::thread_rng().gen_range(0.0..=1.0), op).await
}

/// [`retry`] with the jitter source supplied, so tests can fix it.
pub async fn retry_with_jitter<T, F, Fut>(
    policy: &RetryPolicy,
    mut jitter: impl FnMut() -> f64,
    mut op: F,
) -> StorageResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StorageResult<T>>,
{
    let max_attempts = policy.max_attempts.max(1);
    let mut attempt = 1;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(error) if error.is_transient() && attempt < max_attempts => {
                let delay = policy.backoff(attempt, jitter());
                tracing::debug!(attempt, ?delay, error = %error, "transient storage error, retrying");
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
            Err(error) => return Err(with_attempts(error, attempt)),
        }
    }
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
        let result = retry_with_jitter(
            &policy,
            || 1.0,
            || {
                times.lock().unwrap().push(start.elapsed());
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                let r = outcome(n);
                async move { r }
            },
        )
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
    fn backoff_ceiling_saturates() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.backoff_ceiling(1), Duration::from_millis(100));
        assert_eq!(policy.backoff_ceiling(4), Duration::from_millis(800));
        assert_eq!(policy.backoff_ceiling(40), Duration::from_secs(10));
        assert_eq!(policy.backoff(3, 0.5), Duration::from_millis(200));
        assert_eq!(policy.backoff(3, 7.0), Duration::from_millis(400));
        assert_eq!(RetryPolicy::none().max_attempts, 1);
    }
}
