//! The adaptive rate controller (issue 43): a pure function of what was observed. The rate is
//! per instance (each instance of the scan sends at most this many requests per second to the
//! account), shared through the scan's row for the account (`adaptive`), and changed only by a
//! refusal: additive increase over time, multiplicative decrease on a refusal (AIMD).
//!
//! Invariants:
//! 1. The shared state is the rate set at the last decrease and when ([`Control`]); the rate at
//!    any later time follows from it ([`rate_at`]), so increases cost no write and every
//!    instance computes the same rate from the same row.
//! 2. A decrease happens at most once per [`DECREASE_GAP_US`] (the time it takes every instance
//!    to read it), however many instances saw refusals meanwhile: one congestion event, one cut.
//! 3. A decrease is from what was being sent: the rate then, or for the first one (no rate yet:
//!    the scan was not paced) the deciding instance's measured rate; never below [`MIN_RATE`].
//! 4. Only congestion cuts: at least [`MIN_REFUSED`] refusals and [`CUT_FRACTION`] of the
//!    instance's requests since its last decision. A few refusals of one hot partition (the
//!    service refuses a partition past 2,000 entities/s with the same 503) do not slow the
//!    scan's other partitions; an account past its target refuses far more (22 % at 35M rows
//!    on Flex, simulated: docs/rate-limit.md).

/// A decrease multiplies the rate by this.
pub const BETA: f64 = 0.7;
/// After a decrease the rate grows by this fraction of the decreased rate per second: from
/// `BETA` back to the rate before the cut in `(1 - BETA) / BETA / INCREASE` ≈ 21 s.
pub const INCREASE: f64 = 0.02;
/// At most one decrease per this long (invariant 2): an instance reads the row at least this
/// often while paced ([`REFRESH_US`]), so the next cut follows the last one's effect.
pub const DECREASE_GAP_US: i64 = 1_500_000;
/// How often a paced instance reads its scan's row for the account.
pub const REFRESH_US: i64 = 1_000_000;
/// How often an unpaced instance looks whether another instance started pacing.
pub const IDLE_REFRESH_US: i64 = 5_000_000;
/// Fewest refusals since an instance's last decision that cut the rate (invariant 4).
pub const MIN_REFUSED: u64 = 3;
/// Smallest fraction of an instance's requests since its last decision refused that cuts.
pub const CUT_FRACTION: f64 = 0.01;
/// How often an instance that saw refusals decides (at most).
pub const DECIDE_US: i64 = 500_000;
/// The lowest rate per instance, requests per second.
pub const MIN_RATE: f64 = 2.0;
/// The highest rate kept (beyond it the rate binds nothing anyway).
pub const MAX_RATE: f64 = 1e6;

/// The shared state of one scan's pacing towards one account: the rate per instance set at the
/// last decrease (requests per second) and when (microseconds since the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Control {
    pub rate: f64,
    pub at_us: i64,
}

/// The rate per instance at `now_us` (invariant 1): the decreased rate plus [`INCREASE`] of it
/// per second since.
pub fn rate_at(control: Control, now_us: i64) -> f64 {
    let seconds = (now_us - control.at_us).max(0) as f64 / 1e6;
    (control.rate * (1.0 + INCREASE * seconds)).min(MAX_RATE)
}

/// What an instance saw since its last decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seen {
    /// Requests it sent to the account.
    pub sent: u64,
    /// Attempts of those the account refused.
    pub refused: u64,
    /// Its requests per second to the account lately.
    pub measured: f64,
}

/// What an instance's decision at `now_us` makes of `control` after it `saw` (`None`: no
/// change: too few refusals, invariant 4, or a decrease too recent, invariant 2).
pub fn decide(control: Option<Control>, now_us: i64, saw: Seen) -> Option<Control> {
    let congested =
        saw.refused >= MIN_REFUSED && saw.refused as f64 >= CUT_FRACTION * saw.sent as f64;
    match congested {
        true => on_refused(control, now_us, saw.measured),
        false => None,
    }
}

/// What congestion seen at `now_us` makes of `control` (`None`: no change, a decrease is too
/// recent), given the deciding instance's `measured` rate (requests per second it sent to the
/// account lately).
pub fn on_refused(control: Option<Control>, now_us: i64, measured: f64) -> Option<Control> {
    let from = match control {
        Some(c) if now_us - c.at_us < DECREASE_GAP_US => return None,
        Some(c) => rate_at(c, now_us),
        None => measured,
    };
    Some(Control {
        rate: (from * BETA).clamp(MIN_RATE, MAX_RATE),
        at_us: now_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn the_first_refusal_cuts_the_measured_rate() {
        let c = on_refused(None, 10 * S, 500.0).unwrap();
        assert_eq!(
            c,
            Control {
                rate: 350.0,
                at_us: 10 * S
            }
        );
    }

    #[test]
    fn the_rate_grows_linearly_after_a_cut_and_is_the_same_for_everyone() {
        let c = Control {
            rate: 100.0,
            at_us: 0,
        };
        assert_eq!(rate_at(c, 0), 100.0);
        assert!((rate_at(c, 10 * S) - 120.0).abs() < 1e-9);
        assert!((rate_at(c, 50 * S) - 200.0).abs() < 1e-9);
        // A clock behind the cut's does not go below it.
        assert_eq!(rate_at(c, -S), 100.0);
        assert_eq!(rate_at(c, i64::MAX / 2), MAX_RATE);
    }

    #[test]
    fn one_cut_per_gap_however_many_refusals() {
        let c = on_refused(None, 0, 1_000.0).unwrap();
        assert_eq!(on_refused(Some(c), DECREASE_GAP_US - 1, 1_000.0), None);
        let again = on_refused(Some(c), DECREASE_GAP_US, 1_000.0).unwrap();
        let expected = rate_at(c, DECREASE_GAP_US) * BETA;
        assert!((again.rate - expected).abs() < 1e-9, "{again:?}");
    }

    #[test]
    fn a_few_refusals_among_many_requests_do_not_cut() {
        let saw = |sent, refused| Seen {
            sent,
            refused,
            measured: 500.0,
        };
        assert_eq!(
            decide(None, 0, saw(1_000, 2)),
            None,
            "fewer than MIN_REFUSED"
        );
        assert_eq!(decide(None, 0, saw(1_000, 9)), None, "under 1 %");
        assert!(decide(None, 0, saw(1_000, 10)).is_some());
        assert!(decide(None, 0, saw(100, 3)).is_some());
    }

    #[test]
    fn the_rate_never_falls_below_the_floor() {
        let mut c = on_refused(None, 0, 3.0).unwrap();
        for i in 1..50 {
            c = on_refused(Some(c), i * DECREASE_GAP_US, 0.0).unwrap();
        }
        assert_eq!(c.rate, MIN_RATE);
    }

    /// The controller against a fluid model of an account: `n` instances, each sending at most
    /// `demand` requests/s and at most the controlled rate; the account refuses whatever goes
    /// past `capacity` in a 100-ms step. It converges under the capacity with few refusals and
    /// recovers when the capacity returns.
    #[test]
    fn aimd_settles_under_the_capacity_with_few_refusals() {
        let (n, demand) = (40.0, 800.0);
        let simulate = |capacity: &dyn Fn(i64) -> f64, seconds: i64| {
            let mut control = None;
            let (mut sent, mut refused) = (0.0, 0.0);
            let mut last = 0.0;
            for step in 0..seconds * 10 {
                let now = step * S / 10;
                let per = control.map_or(demand, |c| rate_at(c, now).min(demand));
                let offered = per * n / 10.0;
                let over = (offered - capacity(now) / 10.0).max(0.0);
                sent += offered;
                refused += over;
                if over > 0.0 {
                    control = on_refused(control, now, per).or(control);
                }
                last = per * n;
            }
            (sent, refused, last)
        };
        let (sent, refused, last) = simulate(&|_| 20_000.0, 120);
        println!("sent {sent}, refused {refused}, last {last}");
        assert!(refused / sent < 0.01, "{refused} of {sent}");
        assert!(sent / 120.0 > 20_000.0 * 0.8, "too slow: {}", sent / 120.0);
        // Another 5,000/s comes and goes: the scan makes room, then takes it back.
        let (_, _, during) = simulate(&|t| if t < 60 * S { 15_000.0 } else { 20_000.0 }, 59);
        assert!(during <= 15_000.0, "{during}");
        let (_, _, after) = simulate(&|t| if t < 60 * S { 15_000.0 } else { 20_000.0 }, 120);
        assert!(after > 15_000.0, "did not recover: {after}");
    }
}
