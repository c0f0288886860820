//! Unit tests of the token cache ([`super`]) in tokio's paused time, against a fake source whose
//! tokens live a set time on tokio's clock: single flight, the refresh point, retries, failed
//! refreshes and expiry, each at its documented instant.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::{advance, sleep_until};

use super::*;

/// What the fake source did: how many fetches, and when each token it handed out was issued and
/// expires (tokio's clock), by token.
#[derive(Clone, Default)]
struct Record {
    fetches: Arc<AtomicUsize>,
    issued: Arc<Mutex<HashMap<String, (Instant, Instant)>>>,
    /// While set, every fetch fails with it.
    down: Arc<Mutex<Option<FetchError>>>,
    last_failure: Arc<Mutex<Option<Instant>>>,
}

impl Record {
    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
    fn go_down(&self, error: Option<FetchError>) {
        *self.down.lock().unwrap() = error;
    }
}

/// A fake token source: fetch `n` hands out `prefix` (n = 0) or `prefix-n`, living `lifetime`
/// from when it is handed out, after `delay` — unless the script's next entry is an error, or the
/// source is down.
struct FakeFetch {
    prefix: String,
    lifetime: Duration,
    delay: Duration,
    script: Mutex<VecDeque<Option<FetchError>>>,
    record: Record,
}

#[async_trait]
impl TokenFetch for FakeFetch {
    async fn fetch(&self) -> Result<Fetched, FetchError> {
        let n = self.record.fetches.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let scripted = self.script.lock().unwrap().pop_front().flatten();
        if let Some(e) = scripted.or_else(|| self.record.down.lock().unwrap().clone()) {
            *self.record.last_failure.lock().unwrap() = Some(Instant::now());
            return Err(e);
        }
        let token = match n {
            0 => self.prefix.clone(),
            n => format!("{}-{n}", self.prefix),
        };
        let fetched = Fetched::expiring_in(Secret::new(token.clone()), self.lifetime);
        let when = (Instant::now(), fetched.expires_at);
        self.record.issued.lock().unwrap().insert(token, when);
        Ok(fetched)
    }
}

fn fake_source(
    prefix: &str,
    lifetime: Duration,
    delay: Duration,
    script: Vec<Option<FetchError>>,
) -> (Arc<TokenProvider>, Record) {
    let record = Record::default();
    let fetch = FakeFetch {
        prefix: prefix.to_string(),
        lifetime,
        delay,
        script: Mutex::new(script.into()),
        record: record.clone(),
    };
    let provider =
        TokenProvider::with_fetch("Src", "managedidentity", Box::new(fetch), FETCH_BACKOFF);
    (Arc::new(provider), record)
}

fn fake(
    prefix: &str,
    lifetime: i64,
    delay: Duration,
    script: Vec<Option<FetchError>>,
) -> (Arc<TokenProvider>, Arc<AtomicUsize>) {
    let lifetime = Duration::from_secs(lifetime.max(0).unsigned_abs());
    let (provider, record) = fake_source(prefix, lifetime, delay, script);
    (provider, record.fetches)
}

/// A provider over a fake source handing out `token` (then `token-1`, …) living `lifetime`
/// seconds, and its fetch count.
pub(crate) fn fake_provider(token: &str, lifetime: i64) -> (Arc<TokenProvider>, Arc<AtomicUsize>) {
    fake(token, lifetime, Duration::ZERO, Vec::new())
}

async fn secret(provider: &TokenProvider) -> String {
    provider.token().await.unwrap().0.secret().to_string()
}

/// What `n` callers asking at once were handed.
async fn concurrent_secrets(provider: &Arc<TokenProvider>, n: usize) -> Vec<String> {
    let callers: Vec<_> = (0..n)
        .map(|_| {
            let p = provider.clone();
            tokio::spawn(async move { secret(&p).await })
        })
        .collect();
    let mut secrets = Vec::new();
    for c in callers {
        secrets.push(c.await.unwrap());
    }
    secrets
}

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn one_fetch_serves_every_concurrent_caller() {
    let (provider, fetches) = fake("tok", 3600, Duration::from_secs(2), Vec::new());
    assert_eq!(concurrent_secrets(&provider, 50).await, vec!["tok"; 50]);
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert_eq!(secret(&provider).await, "tok");
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
}

/// `REFRESH_MARGIN` before expiry, to the millisecond; half the lifetime for a short token.
#[tokio::test(start_paused = true)]
async fn refreshed_at_the_margin_before_expiry_not_sooner() {
    let (provider, fetches) = fake("tok", 3600, Duration::ZERO, Vec::new());
    assert_eq!(secret(&provider).await, "tok");
    advance(Duration::from_secs(3600) - REFRESH_MARGIN - MS).await;
    assert_eq!(secret(&provider).await, "tok");
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    advance(MS).await;
    assert_eq!(secret(&provider).await, "tok-1");
    assert_eq!(fetches.load(Ordering::SeqCst), 2);

    let (short, fetches) = fake("s", 60, Duration::ZERO, Vec::new());
    assert_eq!(secret(&short).await, "s");
    advance(Duration::from_secs(30) - MS).await;
    assert_eq!(secret(&short).await, "s");
    advance(MS).await;
    assert_eq!(secret(&short).await, "s-1");
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried_permanent_ones_name_the_connection() {
    let (provider, fetches) = fake(
        "tok",
        3600,
        Duration::ZERO,
        vec![
            Some(FetchError::transient("503")),
            Some(FetchError::transient("connection refused")),
        ],
    );
    assert_eq!(secret(&provider).await, "tok-2");
    assert_eq!(fetches.load(Ordering::SeqCst), 3);

    let (provider, fetches) = fake(
        "tok",
        3600,
        Duration::ZERO,
        vec![Some(FetchError::permanent(
            "the identity endpoint answered 400 invalid_resource",
        ))],
    );
    let error = provider.token().await.unwrap_err();
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert!(!error.transient);
    assert_eq!(
        error.to_string(),
        "no storage token for connection Src (managedidentity): the identity endpoint answered 400 invalid_resource"
    );

    // Transient for ever: gives up after the backoff's attempts, still transient.
    let always = (0..10)
        .map(|_| Some(FetchError::transient("503")))
        .collect();
    let (provider, fetches) = fake("tok", 3600, Duration::ZERO, always);
    let error = provider.token().await.unwrap_err();
    assert!(error.transient);
    assert!(
        error.message.ends_with("(gave up after 6 attempts)"),
        "{error}"
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 6);

    // The SDK path sees the same verdict: transient as I/O, permanent as a credential error.
    let always = (0..6).map(|_| Some(FetchError::transient("503"))).collect();
    let (provider, _) = fake("tok", 3600, Duration::ZERO, always);
    let sdk = provider.get_token(&[STORAGE_SCOPE]).await.unwrap_err();
    assert!(
        matches!(sdk.kind(), azure_core::error::ErrorKind::Io),
        "{sdk}"
    );
    let (provider, _) = fake(
        "tok",
        3600,
        Duration::ZERO,
        vec![Some(FetchError::permanent("403"))],
    );
    let sdk = provider.get_token(&[STORAGE_SCOPE]).await.unwrap_err();
    assert!(
        matches!(sdk.kind(), azure_core::error::ErrorKind::Credential),
        "{sdk}"
    );
    assert!(sdk.to_string().contains("connection Src"), "{sdk}");
}

/// A failed refresh keeps the still-valid token; the next fetch is `RETRY_REFRESH_AFTER` later,
/// to the millisecond, and not before.
#[tokio::test(start_paused = true)]
async fn a_failed_refresh_keeps_the_valid_token_and_tries_again_after_the_delay() {
    let (provider, source) =
        fake_source("tok", Duration::from_secs(3600), Duration::ZERO, Vec::new());
    assert_eq!(secret(&provider).await, "tok");
    source.go_down(Some(FetchError::permanent("down")));
    advance(Duration::from_secs(3600) - REFRESH_MARGIN).await;
    assert_eq!(secret(&provider).await, "tok", "still valid: kept");
    assert_eq!(source.fetches(), 2);
    advance(RETRY_REFRESH_AFTER - MS).await;
    assert_eq!(secret(&provider).await, "tok");
    assert_eq!(source.fetches(), 2, "not asked again before the delay");
    advance(MS).await;
    assert_eq!(secret(&provider).await, "tok");
    assert_eq!(source.fetches(), 3, "asked again, failed again");
    source.go_down(None);
    advance(RETRY_REFRESH_AFTER).await;
    assert_eq!(secret(&provider).await, "tok-3");
}

/// Refreshes that keep failing: the old token is handed out up to its expiry, never at or after
/// it, even when the last failure was less than `RETRY_REFRESH_AFTER` before it (a token was
/// once handed out for that long past its expiry). Then callers get the failure, until the
/// source is back.
#[tokio::test(start_paused = true)]
async fn a_token_whose_refreshes_keep_failing_is_not_handed_out_past_its_expiry() {
    let start = Instant::now();
    let (provider, source) =
        fake_source("tok", Duration::from_secs(3600), Duration::ZERO, Vec::new());
    assert_eq!(secret(&provider).await, "tok");
    source.go_down(Some(FetchError::permanent("down")));
    sleep_until(start + Duration::from_secs(3590)).await;
    assert_eq!(secret(&provider).await, "tok");
    assert_eq!(source.fetches(), 2);
    sleep_until(start + Duration::from_secs(3600) - MS).await;
    assert_eq!(
        secret(&provider).await,
        "tok",
        "valid for one more millisecond"
    );
    assert_eq!(source.fetches(), 2);
    advance(MS).await;
    let error = provider.token().await.unwrap_err();
    assert_eq!((error.transient, source.fetches()), (false, 3), "{error}");
    assert!(error.message.starts_with("down"), "{error}");
    assert!(provider.token().await.is_err());
    assert_eq!(source.fetches(), 4, "an expired token is no reason to wait");
    source.go_down(None);
    assert_eq!(secret(&provider).await, "tok-4");

    // The same through the retry loop (random waits): 60-s tokens, refreshed from 30 s on.
    let (provider, source) = fake_source("s", Duration::from_secs(60), Duration::ZERO, Vec::new());
    let start = Instant::now();
    assert_eq!(secret(&provider).await, "s");
    source.go_down(Some(FetchError::transient("503")));
    sleep_until(start + Duration::from_secs(30)).await;
    // Every caller waiting for the failed refresh keeps the valid token.
    assert_eq!(concurrent_secrets(&provider, 10).await, vec!["s"; 10]);
    assert_eq!(source.fetches(), 1 + 6, "one refresh, retried");
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
    sleep_until(start + Duration::from_secs(60)).await;
    let error = provider.token().await.unwrap_err();
    assert!(error.transient, "{error}");
}

/// A source that hands out a token already expired (by this machine's clock): an error, retried
/// as transient, never the token.
#[tokio::test(start_paused = true)]
async fn an_already_expired_token_is_refused() {
    let (provider, fetches) = fake("old", 0, Duration::ZERO, Vec::new());
    let error = provider.token().await.unwrap_err();
    assert!(error.transient, "{error}");
    assert!(error.message.contains("had already expired"), "{error}");
    assert!(!error.to_string().contains("old"), "{error}");
    assert_eq!(fetches.load(Ordering::SeqCst), 6);
}

/// A wall-clock expiry becomes tokio's at the moment it is received: what is left of it then.
#[tokio::test(start_paused = true)]
async fn a_wall_clock_expiry_counts_from_when_it_is_received() {
    let wall = OffsetDateTime::from_unix_timestamp(1_900_000_000).unwrap();
    let now = Instant::now();
    let received = |expires_on| Fetched::received(Secret::new("t"), expires_on, wall, now);
    let soon = received(wall + time::Duration::seconds(90));
    assert_eq!(soon.expires_at, now + Duration::from_secs(90));
    assert_eq!(soon.expires_on, wall + time::Duration::seconds(90));
    assert_eq!(received(wall - time::Duration::seconds(5)).expires_at, now);
    let relative = Fetched::expiring_in(Secret::new("t"), Duration::from_secs(60));
    assert_eq!(
        relative.expires_at,
        Instant::now() + Duration::from_secs(60)
    );
}

/// A seeded walk of outages (permanent, transient, none) and waits over many token lifetimes:
/// every token handed out is unexpired; with the source up, none is an error and none is past
/// its refresh point unless a refresh failed within `RETRY_REFRESH_AFTER`.
#[tokio::test(start_paused = true)]
async fn the_invariants_hold_over_a_random_walk_of_outages() {
    let mut rng = StdRng::seed_from_u64(0x704E_2026);
    for lifetime in [60, 700, 3600] {
        let lifetime = Duration::from_secs(lifetime);
        let (provider, source) = fake_source("t", lifetime, Duration::ZERO, Vec::new());
        for _ in 0..400 {
            let outage = match rng.gen_range(0..10) {
                0 => Some(FetchError::permanent("refused")),
                1 | 2 => Some(FetchError::transient("busy")),
                _ => None,
            };
            let up = outage.is_none();
            source.go_down(outage);
            advance(lifetime.mul_f64(rng.gen_range(0.0..0.4))).await;
            let result = provider.token().await;
            let now = Instant::now();
            let Ok((token, _)) = result else {
                assert!(!up, "an error with the source up");
                continue;
            };
            let (issued, expires) = source.issued.lock().unwrap()[token.secret()];
            assert!(now < expires, "an expired token handed out");
            let refresh = expires - REFRESH_MARGIN.min((expires - issued) / 2);
            let failed = *source.last_failure.lock().unwrap();
            let retrying = failed.is_some_and(|f| now < f + RETRY_REFRESH_AFTER);
            assert!(
                !up || now < refresh || retrying,
                "a token past its refresh point"
            );
        }
    }
}

#[test]
fn a_provider_prints_no_token() {
    let (provider, _) = fake_provider("eyJ0eXAi", 3600);
    assert!(!format!("{provider:?}").contains("eyJ0eXAi"));
}
