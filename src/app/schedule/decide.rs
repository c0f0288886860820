//! What a firing of the `Scheduler` does with one schedule: a pure function of the schedule, its
//! last started run and the time (no storage, no clock of its own), tested without either.
//!
//! Invariants:
//! - a schedule is due when its recorded next due time is at or before now; the run is for the
//!   LATEST due time at or before now, so a schedule missed for a while (the app stopped, every
//!   firing failed) runs once, not once per missed occurrence;
//! - the next due time is always the first occurrence strictly after now, so two firings at the
//!   same `now` decide the same due time (the store then lets only one of them record it);
//! - with `overlap: skip`, a due time whose schedule's last started scan is still running is
//!   recorded as skipped, not started.

use time::OffsetDateTime;

use super::Overlap;
use crate::cron::Cron;

/// The state of a schedule's last started scan, as the scheduler read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastRun {
    /// No scan started yet, or its record is gone (removed after its retention).
    None,
    Running,
    /// Completed, failed or cancelled.
    Ended,
}

/// What to do at a due time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Start,
    /// `overlap: skip` and the last run is still running.
    Skip,
}

/// A firing's decision for one schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The due time to act on, and how; `None` when nothing is due.
    pub due: Option<(OffsetDateTime, Action)>,
    /// What to record as the next due time (`None`: the expression matches no later date).
    pub next_due: Option<OffsetDateTime>,
}

/// Decides one schedule's firing at `now`.
pub fn decide(
    cron: &Cron,
    overlap: Overlap,
    next_due: Option<OffsetDateTime>,
    last: LastRun,
    now: OffsetDateTime,
) -> Decision {
    let Some(recorded) = next_due.filter(|d| *d <= now) else {
        return Decision {
            due: None,
            next_due,
        };
    };
    // The recorded due time is an occurrence of the expression (written by the PUT or an earlier
    // firing), so the latest occurrence at or before now is at least that one.
    let due = cron.latest_at_or_before(now).filter(|d| *d >= recorded);
    let action = match (overlap, last) {
        (Overlap::Skip, LastRun::Running) => Action::Skip,
        _ => Action::Start,
    };
    Decision {
        due: due.map(|d| (d, action)),
        next_due: cron.next_after(now),
    }
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    fn every_minute() -> Cron {
        Cron::parse("0 * * * * *").unwrap()
    }

    #[test]
    fn nothing_is_due_before_the_recorded_time() {
        let next = datetime!(2026-11-28 19:12:00 UTC);
        let d = decide(
            &every_minute(),
            Overlap::Skip,
            Some(next),
            LastRun::None,
            datetime!(2026-11-28 19:11:59 UTC),
        );
        assert_eq!(
            d,
            Decision {
                due: None,
                next_due: Some(next)
            }
        );
    }

    #[test]
    fn a_due_time_starts_and_the_next_is_after_now() {
        let d = decide(
            &every_minute(),
            Overlap::Skip,
            Some(datetime!(2026-11-28 19:12:00 UTC)),
            LastRun::Ended,
            datetime!(2026-11-28 19:12:00.250 UTC),
        );
        assert_eq!(
            d.due,
            Some((datetime!(2026-11-28 19:12:00 UTC), Action::Start))
        );
        assert_eq!(d.next_due, Some(datetime!(2026-11-28 19:13:00 UTC)));
    }

    #[test]
    fn times_missed_while_stopped_run_once_for_the_latest() {
        let d = decide(
            &every_minute(),
            Overlap::Skip,
            Some(datetime!(2026-11-28 19:12:00 UTC)),
            LastRun::None,
            datetime!(2026-11-28 22:47:31 UTC),
        );
        assert_eq!(
            d.due,
            Some((datetime!(2026-11-28 22:47:00 UTC), Action::Start))
        );
        assert_eq!(d.next_due, Some(datetime!(2026-11-28 22:48:00 UTC)));
    }

    #[test]
    fn overlap_skip_skips_only_while_the_last_run_runs() {
        let at = datetime!(2026-11-28 03:00:05 UTC);
        let nightly = Cron::parse("0 0 3 * * *").unwrap();
        let due = Some(datetime!(2026-11-28 03:00:00 UTC));
        let act = |overlap, last| decide(&nightly, overlap, due, last, at).due.unwrap().1;
        assert_eq!(act(Overlap::Skip, LastRun::Running), Action::Skip);
        assert_eq!(act(Overlap::Skip, LastRun::Ended), Action::Start);
        assert_eq!(act(Overlap::Skip, LastRun::None), Action::Start);
        assert_eq!(act(Overlap::Allow, LastRun::Running), Action::Start);
    }

    #[test]
    fn duplicate_firings_decide_the_same_due_time() {
        let cron = every_minute();
        let due = Some(datetime!(2026-11-28 19:12:00 UTC));
        let now = datetime!(2026-11-28 19:12:01 UTC);
        let a = decide(&cron, Overlap::Allow, due, LastRun::None, now);
        let b = decide(&cron, Overlap::Allow, due, LastRun::None, now);
        assert_eq!(a, b);
        // The firing after the first one recorded its next due time has nothing to do.
        let c = decide(&cron, Overlap::Allow, a.next_due, LastRun::Running, now);
        assert_eq!(c.due, None);
    }

    #[test]
    fn an_expression_with_no_later_date_records_none() {
        let cron = Cron::parse("0 0 0 30 2 *").unwrap();
        let d = decide(
            &cron,
            Overlap::Skip,
            None,
            LastRun::None,
            datetime!(2026-11-28 19:12:00 UTC),
        );
        assert_eq!(
            d,
            Decision {
                due: None,
                next_due: None
            }
        );
    }
}
