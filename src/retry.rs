//! One retry policy and one retry loop for the whole crate: capped exponential backoff with an
//! injected jitter source, bounded by a number of attempts and/or a deadline.
//!
//! Invariants:
//! - The wait before retry `r` (1-based: after the `r`-th failed attempt) never exceeds its
//!   *ceiling* `min(max_delay, base_delay * 2^(r-1))`; the [`Jitter`] only chooses where below it.
//! - At most `max_attempts` attempts are made, the first included (0 is taken as 1).
//! - With a `deadline`, a retry is made only if it would start strictly before `start + deadline`,
//!   `start` being when the [`Schedule`] was made (just before the first attempt): no wait is begun
//!   that would end past the deadline.
//! - The caller decides which errors are worth another attempt ([`Verdict`]); nothing here knows
//!   what an error is, and the last error is returned as it was, with how many attempts were made.
//! - Waiting uses tokio's clock, so paused-time tests and the simulator's virtual clock drive it.
//!
//! ```
//! # async fn example() {
//! use std::time::Duration;
//! use tablescan::retry::{retry, Backoff, NoJitter};
//!
//! // 0.5 s doubling to 8 s, for as long as a retry can start within a minute.
//! const PATIENCE: Backoff =
//!     Backoff::new(u32::MAX, Duration::from_millis(500), Duration::from_secs(8))
//!         .with_deadline(Duration::from_secs(60));
//! let busy = || async { Err::<(), _>("busy") };
//! let failure = retry(&PATIENCE, NoJitter, busy, |e: &&str| *e == "busy")
//!     .await
//!     .unwrap_err();
//! assert!(failure.exhausted);
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// How often and how patiently to retry: capped exponential backoff, bounded by attempts and/or
/// a deadline. The jitter is not part of the policy: it is handed to [`retry`] or
/// [`Backoff::schedule`], so a caller can draw it from its own (seedable) random source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Total attempts including the first (1 means no retry; `u32::MAX` for "until the deadline").
    pub max_attempts: u32,
    /// Ceiling of the first wait; doubles with every retry.
    pub base_delay: Duration,
    /// Cap on any single wait's ceiling.
    pub max_delay: Duration,
    /// No retry starts this long or later after the first attempt started.
    pub deadline: Option<Duration>,
}

impl Backoff {
    /// A policy bounded by attempts only.
    pub const fn new(max_attempts: u32, base_delay: Duration, max_delay: Duration) -> Self {
        Backoff {
            max_attempts,
            base_delay,
            max_delay,
            deadline: None,
        }
    }

    /// The same policy, also bounded by a deadline measured from the first attempt.
    pub const fn with_deadline(self, deadline: Duration) -> Self {
        Backoff {
            deadline: Some(deadline),
            ..self
        }
    }

    /// The longest wait before retry number `retry` (1-based): `min(max_delay, base * 2^(retry-1))`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1).min(31))
            .unwrap_or(u32::MAX);
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }

    /// Starts counting attempts (and the deadline) now, drawing waits from `jitter`.
    pub fn schedule<J: Jitter>(&self, jitter: J) -> Schedule<J> {
        Schedule {
            backoff: *self,
            jitter,
            deadline: self.deadline.map(|d| Instant::now() + d),
            failures: 0,
        }
    }
}

/// Where below its ceiling a wait falls. Any `FnMut(Duration) -> Duration` is one (given the
/// ceiling, return the wait); what it returns is capped at the ceiling.
pub trait Jitter {
    fn delay(&mut self, ceiling: Duration) -> Duration;
}

impl<F: FnMut(Duration) -> Duration> Jitter for F {
    fn delay(&mut self, ceiling: Duration) -> Duration {
        self(ceiling)
    }
}

/// "Full jitter" from this thread's random generator: uniformly anywhere in `0..=ceiling`, so many
/// clients retrying at once spread out.
#[derive(Debug, Clone, Copy, Default)]
pub struct FullJitter;

impl Jitter for FullJitter {
    fn delay(&mut self, ceiling: Duration) -> Duration {
        full_jitter(ceiling, rand::thread_rng().gen_range(0.0..=1.0))
    }
}

/// No jitter: every wait is its ceiling.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoJitter;

impl Jitter for NoJitter {
    fn delay(&mut self, ceiling: Duration) -> Duration {
        ceiling
    }
}

/// The full-jitter wait for a draw in `0.0..=1.0` (clamped): `ceiling * draw`.
pub fn full_jitter(ceiling: Duration, draw: f64) -> Duration {
    ceiling.mul_f64(draw.clamp(0.0, 1.0))
}

/// What to do after a failed attempt. `bool` converts: `true` is [`Verdict::Retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Return this error.
    Stop,
    /// Try again after the backoff.
    Retry,
    /// Try again at once (the attempt still counts, and the next backoff still grows).
    RetryNow,
}

impl From<bool> for Verdict {
    fn from(retry: bool) -> Self {
        if retry {
            Verdict::Retry
        } else {
            Verdict::Stop
        }
    }
}

/// What [`Schedule::after_failure`] says to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Sleep this long, then try again.
    Sleep(Duration),
    /// Try again without sleeping.
    Now,
    /// The verdict was [`Verdict::Stop`]: give up.
    Stop,
    /// The verdict asked for a retry, but the attempts or the deadline are used up: give up.
    Exhausted,
}

/// The running state of one [`Backoff`]: how many attempts failed and when the deadline falls.
/// For loops that cannot be a single closure (state changed between attempts, async checks);
/// [`retry`] is this in a loop.
#[derive(Debug, Clone)]
pub struct Schedule<J> {
    backoff: Backoff,
    jitter: J,
    deadline: Option<Instant>,
    failures: u32,
}

impl<J: Jitter> Schedule<J> {
    /// Attempts that have failed so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Records one failed attempt and says what to do next. The jitter is drawn only for a retry
    /// the attempts allow; a retry whose wait would end at or past the deadline is not made.
    pub fn after_failure(&mut self, verdict: impl Into<Verdict>) -> Step {
        self.failures = self.failures.saturating_add(1);
        let verdict = verdict.into();
        if verdict == Verdict::Stop {
            return Step::Stop;
        }
        if self.failures >= self.backoff.max_attempts.max(1) {
            return Step::Exhausted;
        }
        let delay = match verdict {
            Verdict::RetryNow => Duration::ZERO,
            _ => {
                let ceiling = self.backoff.ceiling(self.failures);
                self.jitter.delay(ceiling).min(ceiling)
            }
        };
        if let Some(deadline) = self.deadline {
            if Instant::now() + delay >= deadline {
                return Step::Exhausted;
            }
        }
        match verdict {
            Verdict::RetryNow => Step::Now,
            _ => Step::Sleep(delay),
        }
    }
}

/// The last error of a [`retry`] that gave up, with how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure<E> {
    pub error: E,
    /// Attempts made, the failed last one included.
    pub attempts: u32,
    /// `true` when the error was worth a retry but the attempts or the deadline ran out;
    /// `false` when the verdict on it was [`Verdict::Stop`].
    pub exhausted: bool,
}

impl<E> Failure<E> {
    pub fn into_error(self) -> E {
        self.error
    }
}

/// Runs `op` until it succeeds, `should_retry` gives up on its error, or `backoff`'s attempts or
/// deadline run out, waiting a `jitter`ed backoff between attempts.
///
/// `should_retry` returns a `bool` (retry after the backoff, or stop) or a [`Verdict`].
pub async fn retry<T, E, F, Fut, P, V>(
    backoff: &Backoff,
    jitter: impl Jitter,
    mut op: F,
    mut should_retry: P,
) -> Result<T, Failure<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    P: FnMut(&E) -> V,
    V: Into<Verdict>,
{
    let mut schedule = backoff.schedule(jitter);
    loop {
        let error = match op().await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let exhausted = match schedule.after_failure(should_retry(&error)) {
            Step::Sleep(delay) => {
                tokio::time::sleep(delay).await;
                continue;
            }
            Step::Now => continue,
            Step::Stop => false,
            Step::Exhausted => true,
        };
        return Err(Failure {
            error,
            attempts: schedule.failures(),
            exhausted,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::Mutex;

    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum E {
        Busy,
        Conflict,
        Fatal,
    }

    /// Runs `outcome(n)` for attempt `n` (1-based) under `retry`, recording when each attempt
    /// started (ms since the start, on the paused clock).
    async fn run<J: Jitter>(
        backoff: Backoff,
        jitter: J,
        outcome: impl Fn(u32) -> Result<u32, E>,
        verdict: impl FnMut(&E) -> Verdict,
    ) -> (Result<u32, Failure<E>>, Vec<u128>) {
        let start = Instant::now();
        let times = Mutex::new(Vec::new());
        let result = retry(
            &backoff,
            jitter,
            || {
                let mut times = times.lock().unwrap();
                times.push(start.elapsed().as_millis());
                let r = outcome(times.len() as u32);
                async move { r }
            },
            verdict,
        )
        .await;
        (result, times.into_inner().unwrap())
    }

    fn busy_retries(e: &E) -> Verdict {
        (*e == E::Busy).into()
    }

    #[tokio::test(start_paused = true)]
    async fn waits_double_to_the_cap_and_attempts_are_bounded() {
        let backoff = Backoff::new(6, Duration::from_millis(100), Duration::from_millis(500));
        let start = Instant::now();
        let (result, times) = run(backoff, NoJitter, |_| Err(E::Busy), busy_retries).await;
        assert_eq!(
            result.unwrap_err(),
            Failure {
                error: E::Busy,
                attempts: 6,
                exhausted: true
            }
        );
        // Waits 100, 200, 400, 500 (capped), 500 (capped); none after the last attempt.
        assert_eq!(times, vec![0, 100, 300, 700, 1200, 1700]);
        assert_eq!(start.elapsed(), Duration::from_millis(1700));
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_once_on_an_error_not_worth_retrying() {
        let backoff = Backoff::new(6, Duration::from_millis(100), Duration::from_secs(1));
        let (result, times) = run(
            backoff,
            NoJitter,
            |n| if n < 3 { Err(E::Busy) } else { Err(E::Fatal) },
            busy_retries,
        )
        .await;
        assert_eq!(
            result.unwrap_err(),
            Failure {
                error: E::Fatal,
                attempts: 3,
                exhausted: false
            }
        );
        assert_eq!(times, vec![0, 100, 300]);
        let (result, _) = run(
            backoff,
            NoJitter,
            |n| if n < 3 { Err(E::Busy) } else { Ok(n) },
            busy_retries,
        )
        .await;
        assert_eq!(result.unwrap(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_or_one_attempt_means_no_retry() {
        for max_attempts in [0, 1] {
            let backoff =
                Backoff::new(max_attempts, Duration::from_secs(1), Duration::from_secs(1));
            let (result, times) = run(backoff, NoJitter, |_| Err(E::Busy), busy_retries).await;
            assert_eq!(result.unwrap_err().attempts, 1);
            assert_eq!(times, vec![0]);
        }
    }

    /// `work.rs`'s `patiently`: 0.5 s doubling to 8 s, while a retry can start within 60 s.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_ends_retries_that_would_start_too_late() {
        let backoff = Backoff::new(u32::MAX, Duration::from_millis(500), Duration::from_secs(8))
            .with_deadline(Duration::from_secs(60));
        let (result, times) = run(backoff, NoJitter, |_| Err(E::Busy), busy_retries).await;
        let failure = result.unwrap_err();
        assert!(failure.exhausted);
        // 0.5 + 1 + 2 + 4 = 7.5 s, then 8 s waits: 15.5, 23.5, …, 55.5; 55.5 + 8 is past 60.
        assert_eq!(
            times,
            vec![0, 500, 1500, 3500, 7500, 15500, 23500, 31500, 39500, 47500, 55500]
        );
        assert_eq!(failure.attempts, 11);
        // A wait ending exactly at the deadline is not begun either.
        let exact = Backoff::new(u32::MAX, Duration::from_secs(1), Duration::from_secs(1))
            .with_deadline(Duration::from_secs(3));
        let (_, times) = run(exact, NoJitter, |_| Err(E::Busy), busy_retries).await;
        assert_eq!(times, vec![0, 1000, 2000]);
    }

    #[tokio::test(start_paused = true)]
    async fn full_jitter_stays_below_the_ceiling() {
        let backoff = Backoff::new(5, Duration::from_millis(80), Duration::from_millis(200));
        let (result, times) = run(backoff, FullJitter, |_| Err(E::Busy), busy_retries).await;
        assert_eq!(result.unwrap_err().attempts, 5);
        // Ceilings 80 + 160 + 200 + 200.
        let gaps: Vec<u128> = times.windows(2).map(|w| w[1] - w[0]).collect();
        for (gap, ceiling) in gaps.iter().zip([80, 160, 200, 200]) {
            assert!(*gap <= ceiling, "{gaps:?}");
        }
    }

    /// `tracking`'s contention backoff: `base + U[0, base)` ms with `base = 5 ms << min(a, 6)`
    /// for attempt index `a`, drawn from a re-seedable thread-local generator; a 409 on an insert
    /// is retried at once but still uses up one of the 50 attempts.
    #[tokio::test(start_paused = true)]
    async fn an_injected_seeded_jitter_reproduces_tracking_backoff() {
        use rand::SeedableRng;
        thread_local! {
            static RNG: RefCell<rand::rngs::StdRng> = RefCell::new(rand::rngs::StdRng::seed_from_u64(7));
        }
        let contention = Backoff::new(50, Duration::from_millis(10), Duration::from_millis(640));
        let jitter = |ceiling: Duration| {
            let base = ceiling.as_millis() as u64 / 2;
            Duration::from_millis(base + RNG.with(|r| r.borrow_mut().gen_range(0..base)))
        };
        let verdict = |e: &E| match e {
            E::Busy => Verdict::Retry,
            E::Conflict => Verdict::RetryNow,
            E::Fatal => Verdict::Stop,
        };
        let (result, times) = run(
            contention,
            jitter,
            |n| {
                if n == 2 {
                    Err(E::Conflict)
                } else {
                    Err(E::Busy)
                }
            },
            verdict,
        )
        .await;
        let failure = result.unwrap_err();
        assert_eq!((failure.attempts, failure.exhausted), (50, true));

        // The same draws, the old way.
        let mut expected_rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut expected = vec![0u128];
        for attempt in 0..49usize {
            let wait = if attempt == 1 {
                0
            } else {
                let base = 5u64 << attempt.min(6);
                base + expected_rng.gen_range(0..base)
            };
            expected.push(expected.last().unwrap() + u128::from(wait));
        }
        assert_eq!(times, expected);
    }

    #[test]
    fn ceilings_saturate() {
        let backoff = Backoff::new(6, Duration::from_millis(100), Duration::from_secs(10));
        assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
        assert_eq!(backoff.ceiling(1), Duration::from_millis(100));
        assert_eq!(backoff.ceiling(4), Duration::from_millis(800));
        assert_eq!(backoff.ceiling(40), Duration::from_secs(10));
        assert_eq!(
            full_jitter(backoff.ceiling(3), 0.5),
            Duration::from_millis(200)
        );
        assert_eq!(
            full_jitter(backoff.ceiling(3), 7.0),
            Duration::from_millis(400)
        );
        assert_eq!(full_jitter(backoff.ceiling(3), -1.0), Duration::ZERO);
    }

    #[test]
    fn a_jitter_above_the_ceiling_is_capped() {
        let backoff = Backoff::new(3, Duration::from_millis(100), Duration::from_secs(1));
        let mut schedule = backoff.schedule(|c: Duration| c * 3);
        assert_eq!(
            schedule.after_failure(true),
            Step::Sleep(Duration::from_millis(100))
        );
        assert_eq!(schedule.after_failure(Verdict::RetryNow), Step::Now);
        assert_eq!(schedule.after_failure(true), Step::Exhausted);
        assert_eq!(schedule.failures(), 3);
    }
}
