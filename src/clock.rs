//! Where the function app's time of day comes from: its [`Clock`].
//!
//! Invariants:
//! 1. Every time the app stores (`StartedAt`, `CompletedAt`, `ClaimedAt`, a lease's end, a
//!    manifest's stamps, a scan id's milliseconds) and every decision it takes on the time of day
//!    (a retention age, a stale phase claim, an unexpired completion lease, whether a scan's
//!    record may still appear, how long superseded index builds are kept) reads the app's
//!    clock: `AppState::clock`, and `Tracker::now` for bookkeeping (a tracker made by
//!    `AppState::tracker_on` holds the app's clock). Nothing under `src/app` calls
//!    `OffsetDateTime::now_utc` or `SystemTime::now` for such a time.
//! 2. What ships runs on [`Clock::system`], the system's UTC time. A test gives the app a
//!    [`Clock::manual`] one, which stands still until the test sets or advances it, so "X happens
//!    after a day" is a test that advances the clock by a day, without waiting or racing. The
//!    simulator gives it [`Clock::following_tokio`], which moves with tokio's (virtual) clock.
//! 3. Intervals one instance measures for itself (how long a cached scan state is trusted, how
//!    long an invocation waits for tokens, when a step hands its work off) are not times of day:
//!    they use tokio's clock (`tokio::time::Instant`), which paused-time tests and the simulator
//!    drive. So does the rate limiter's schedule (`app::pace::now_us`, tokio's clock read as UTC).
//!    Durations only logged (an invocation's `ms=`) are real time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;

/// The app's source of the time of day (see the module). Cloning is cheap and shares the clock:
/// a test keeps a clone of the manual clock it gave the app, to move it.
#[derive(Clone, Debug, Default)]
pub struct Clock(Source);

#[derive(Clone, Debug, Default)]
enum Source {
    /// The system's UTC time.
    #[default]
    System,
    /// A time that only moves when set or advanced.
    Manual(Arc<Mutex<OffsetDateTime>>),
    /// The time of day when the clock was made, plus the time tokio's clock has moved since.
    Tokio {
        since: tokio::time::Instant,
        at: OffsetDateTime,
    },
}

/// The system's clock, for a `&'static Clock` where no other is given (`Tracker::new`).
pub static SYSTEM: Clock = Clock(Source::System);

impl Clock {
    /// The system's UTC time: what ships.
    pub fn system() -> Clock {
        Clock(Source::System)
    }

    /// A clock standing at `at` until [`Clock::set`] or [`Clock::advance`] moves it.
    pub fn manual(at: OffsetDateTime) -> Clock {
        Clock(Source::Manual(Arc::new(Mutex::new(at))))
    }

    /// The system's time now, moving from here on as tokio's clock moves: virtual time under a
    /// paused runtime (the simulator), where every instance of a run shares this one clock.
    pub fn following_tokio() -> Clock {
        Clock(Source::Tokio {
            since: tokio::time::Instant::now(),
            at: OffsetDateTime::now_utc(),
        })
    }

    /// The time of day, in UTC.
    pub fn now(&self) -> OffsetDateTime {
        match &self.0 {
            Source::System => OffsetDateTime::now_utc(),
            Source::Manual(at) => *at.lock().unwrap_or_else(|p| p.into_inner()),
            Source::Tokio { since, at } => *at + since.elapsed(),
        }
    }

    /// Moves a manual clock to `at` (backwards too: a test of a clock that went back).
    /// Panics on any other clock: only a test moves time.
    pub fn set(&self, at: OffsetDateTime) {
        match &self.0 {
            Source::Manual(now) => *now.lock().unwrap_or_else(|p| p.into_inner()) = at,
            other => panic!("only a manual clock is set, not {other:?}"),
        }
    }

    /// Moves a manual clock `by` forward. Panics on any other clock.
    pub fn advance(&self, by: Duration) {
        self.set(self.now() + by);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_its_clones_share_it() {
        let start = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let clock = Clock::manual(start);
        let app = clock.clone();
        assert_eq!(app.now(), start);
        clock.advance(Duration::from_secs(86_400));
        assert_eq!(app.now(), start + time::Duration::days(1));
        clock.set(start);
        assert_eq!(app.now(), start);
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_following_tokio_moves_with_paused_time() {
        let clock = Clock::following_tokio();
        let before = clock.now();
        tokio::time::sleep(Duration::from_secs(3_600)).await;
        assert_eq!(clock.now() - before, time::Duration::hours(1));
    }

    #[test]
    #[should_panic(expected = "only a manual clock")]
    fn the_system_clock_is_not_moved() {
        Clock::system().advance(Duration::from_secs(1));
    }
}
