//! The listener's pure rules: polling backoff and settlement.

use super::*;

#[test]
fn backoff_doubles_from_the_minimum_with_its_jitter_up_to_the_maximum() {
    let ms = Duration::from_millis;
    let mut b = Backoff::new(ms(100), Duration::from_secs(2));
    let delays: Vec<Duration> = (0..6).map(|_| b.next_delay_with(1.0)).collect();
    assert_eq!(
        delays,
        [ms(200), ms(400), ms(800), ms(1600), ms(2000), ms(2000)]
    );
    b.reset();
    // min + min * (2^1 - 1) * jitter
    assert_eq!(b.next_delay_with(0.8), ms(180));
    assert_eq!(b.next_delay_with(1.2), ms(460));
}

#[test]
fn failed_deliveries_are_released_poisoned_on_the_last_or_kept_without_poison_queue() {
    let ten = Duration::from_secs(10);
    assert_eq!(settlement(1, 5, true, ten), Settlement::Release(ten));
    assert_eq!(
        settlement(4, 5, true, Duration::ZERO),
        Settlement::Release(Duration::ZERO)
    );
    assert_eq!(settlement(5, 5, true, ten), Settlement::Poison);
    assert_eq!(settlement(7, 5, true, ten), Settlement::Poison);
    // A poison queue's own messages: never released at visibilityTimeout (0 would retry in a
    // fast loop), never poisoned.
    assert_eq!(
        settlement(1, 5, false, Duration::ZERO),
        Settlement::KeepInvisible
    );
    assert_eq!(settlement(5, 5, false, ten), Settlement::KeepInvisible);
}

#[test]
fn backoff_grows_to_max_and_resets() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    let first = b.next_delay();
    assert!(
        first >= Duration::from_millis(170) && first <= Duration::from_millis(230),
        "{first:?}"
    );
    let mut last = first;
    for _ in 0..10 {
        last = b.next_delay();
    }
    assert_eq!(last, Duration::from_secs(2));
    b.reset();
    assert!(b.next_delay() < Duration::from_millis(300));
}
