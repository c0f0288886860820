//! Killing handlers (SIGKILL, as a crash or an out-of-memory kill would) at known points of a
//! scan, driven by what the host shows — its log's invocations, its handlers' generations —
//! never by a timer: a kill lands on an instance with an invocation in flight on its current
//! handler, and the next waits until the host has that instance's next handler up.
//!
//! With the scan's writes held at the proxy (`StorageProxy::hold`, armed before the scan
//! starts), the scan cannot end while the kills are made, and the invocations blocked there stay
//! in flight until a kill fails them: the number of kills is the test's, whatever the machine's
//! speed. Let the writes through afterwards (`StorageProxy::release`).
//!
//! Kills here are of this test's own handlers (their pids, from its own host); they need no
//! process of their own, but they load the machine (restarts, redeliveries).

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use rand::Rng;
use tablescan::lab::proxy::StorageProxy;

use super::recorded_state;
use crate::support::e2e::TestApp;

/// The bound on one wait of a kill run. Only a hang reaches it: a kill, the restart it causes
/// and the next invocation take about a second on a loaded machine.
pub const HANG: Duration = Duration::from_secs(120);

/// One queue-triggered invocation, as the host's log tells it (`[i<instance>] [<function>]
/// [<invocation id>] Executing '…'`, then `… Executed '…' (Succeeded|Failed …)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub instance: usize,
    pub function: String,
    pub id: String,
    /// Where its `Executing` line is in the log.
    pub began_at: usize,
    /// The text of its `Executed` line, once it ended.
    pub ended: Option<String>,
}

/// A host log line's tags and text: (instance, function, invocation id, text).
fn tagged(line: &str) -> Option<(usize, &str, &str, &str)> {
    let rest = line.split_once(' ')?.1.strip_prefix("[i")?;
    let (instance, rest) = rest.split_once("] [")?;
    let (function, rest) = rest.split_once("] [")?;
    let (id, text) = rest.split_once("] ")?;
    Some((instance.parse().ok()?, function, id, text))
}

/// Every invocation the log shows, in the order they began.
pub fn invocations(lines: &[String]) -> Vec<Invocation> {
    let mut all: Vec<Invocation> = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let Some((instance, function, id, text)) = tagged(line) else {
            continue;
        };
        // (Queue-triggered only: HTTP ones name their method and path instead of a queue.)
        if text.starts_with("Executing '") && text.contains("(queue ") {
            all.push(Invocation {
                instance,
                function: function.to_string(),
                id: id.to_string(),
                began_at: at,
                ended: None,
            });
        } else if text.starts_with("Executed '") {
            if let Some(i) = all.iter_mut().rev().find(|i| i.id == id) {
                i.ended = Some(text.to_string());
            }
        }
    }
    all
}

/// Invocations the log shows failed because their handler was killed. They fail at once
/// and their messages are released (visibilityTimeout), not left invisible for the 10-minute
/// receive visibility.
pub fn failed_by_kills(app: &TestApp) -> usize {
    app.host()
        .log_lines()
        .iter()
        .filter(|l| {
            l.contains("Failed")
                && (l.contains("handler process was restarted")
                    || l.contains("request to handler failed"))
        })
        .count()
}

/// `kill -9 pid`.
pub fn sigkill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -9 {pid}");
}

/// Polls `check` (every 25 ms) until it gives `Ok`; past [`HANG`], panics saying what it waited
/// for and what `check` saw last (its `Err`).
pub async fn wait_until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + HANG;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) if Instant::now() > deadline => {
                panic!("waited {HANG:?} for {what}; saw last: {seen}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

/// The last `n` lines of the host's log, for a give-up message.
fn tail(app: &TestApp, n: usize) -> String {
    let lines = app.host().log_lines();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A kill run: the kills made per instance, and for each instance where in the log its current
/// handler's invocations begin.
pub struct Killer {
    pub kills: Vec<usize>,
    since: Vec<usize>,
}

impl Killer {
    pub fn new(app: &TestApp) -> Killer {
        let instances = app.host().handler_pids().len();
        Killer {
            kills: vec![0; instances],
            since: vec![0; instances],
        }
    }

    /// Kills `count` handlers, one at a time, no instance past `per_instance` kills (the host
    /// gives up on an instance at its third). With `held`, each kill also waits for a request
    /// held at that proxy (an invocation blocked in flight). With `scan`, stops early once that
    /// scan is no longer running (a run without a hold, which may outpace the kills). Returns
    /// the kills made.
    pub async fn kill(
        &mut self,
        app: &TestApp,
        held: Option<&StorageProxy>,
        count: usize,
        per_instance: usize,
        scan: Option<&str>,
    ) -> usize {
        for made in 0..count {
            let eligible = |i: usize, kills: &[usize]| kills[i] < per_instance;
            if self.kill_one(app, held, eligible, scan).await.is_none() {
                return made;
            }
        }
        count
    }

    /// Waits for an instance that `eligible` allows (given the kills so far) whose current
    /// handler has an invocation in flight (of those, the one killed least, then the one with
    /// most in flight, then the first: kills spread over the instances), kills that
    /// handler, then waits until the host has the instance's next handler up (after its recycle
    /// delay if the host gave up on it). The instance killed; `None` if `scan` ended first.
    pub async fn kill_one(
        &mut self,
        app: &TestApp,
        held: Option<&StorageProxy>,
        eligible: impl Fn(usize, &[usize]) -> bool,
        scan: Option<&str>,
    ) -> Option<usize> {
        let (kills, since, eligible) = (&self.kills, &self.since, &eligible);
        let target = wait_until(
            "an instance to kill with an invocation in flight",
            || async move {
                if let Some(id) = scan {
                    if recorded_state(app, id).await.as_deref() != Some("running") {
                        return Ok(None);
                    }
                }
                let pids = app.host().handler_pids();
                let open = invocations(&app.host().log_lines());
                let in_flight = |i: usize| {
                    open.iter()
                        .filter(|v| v.instance == i && v.ended.is_none() && v.began_at >= since[i])
                        .count()
                };
                let blocked = held.map_or(true, |p| p.held().now > 0);
                let best = (0..pids.len())
                    .filter(|i| eligible(*i, kills) && pids[*i].is_some() && in_flight(*i) > 0)
                    .max_by_key(|i| (Reverse(kills[*i]), in_flight(*i), Reverse(*i)));
                match (best, blocked) {
                    (Some(i), true) => Ok(Some((i, pids[i].unwrap()))),
                    _ => Err(format!(
                        "kills {kills:?}, pids {pids:?}, in flight {:?}, held {:?}\n{}",
                        (0..pids.len()).map(in_flight).collect::<Vec<_>>(),
                        held.map(|p| p.held()),
                        tail(app, 20)
                    )),
                }
            },
        )
        .await;
        let (i, pid) = target?;
        let generation = app.host().handler_generations()[i];
        sigkill(pid);
        self.kills[i] += 1;
        wait_until("the killed instance's next handler", || async move {
            let (generations, pids) = (app.host().handler_generations(), app.host().handler_pids());
            if generations[i] > generation && pids[i].is_some() {
                return Ok(());
            }
            Err(format!(
                "generations {generations:?}, pids {pids:?}\n{}",
                tail(app, 20)
            ))
        })
        .await;
        app.host()
            .wait_ready(HANG)
            .await
            .expect("every handler answers after a kill");
        self.since[i] = app.host().log_lines().len();
        Some(i)
    }
}

/// Kills handlers (at most `per_instance` times each, at most 4 in all) while scan `id` runs;
/// returns the kills per instance. Without a hold on the scan's work the scan may end first:
/// prefer [`Killer::kill`] with the scan's writes held.
pub async fn kill_while_running(
    app: &TestApp,
    id: &str,
    _instances: usize,
    per_instance: usize,
) -> Vec<usize> {
    let mut killer = Killer::new(app);
    let budget = deliveries_budget(&killer.kills, per_instance);
    killer.kill(app, None, budget, per_instance, Some(id)).await;
    killer.kills
}

/// The most kills a run that must end exact can make: each kill fails at most one delivery of
/// each message in flight, so five kills could fail one message on all of host.json's 5
/// deliveries (it is then poisoned and re-queued, a slower path the chaos tests cover). At most
/// 4, and no instance past `per_instance` kills in all.
pub fn deliveries_budget(kills: &[usize], per_instance: usize) -> usize {
    const MAX_DELIVERIES: usize = 5;
    let room: usize = kills.iter().map(|k| per_instance.saturating_sub(*k)).sum();
    room.min(MAX_DELIVERIES - 1)
}

/// After a crash run: every killed handler was restarted once per kill, there were at least
/// two kills, and some hit an invocation in flight (so redelivery was exercised).
pub async fn check_kills(app: &TestApp, kills: &[usize]) {
    let host = app.host();
    host.wait_ready(Duration::from_secs(60))
        .await
        .expect("every killed handler was restarted");
    let generations = host.handler_generations();
    let failed_by_kill = failed_by_kills(app);
    eprintln!(
        "handler-crash: kills per instance {kills:?}, generations {generations:?}, invocations failed by kills {failed_by_kill}"
    );
    for (i, k) in kills.iter().enumerate() {
        assert_eq!(
            generations[i],
            1 + *k as u64,
            "instance {i} restarted once per kill"
        );
    }
    assert!(
        kills.iter().sum::<usize>() >= 2,
        "the scan ended before the handlers could be killed twice"
    );
    assert!(
        failed_by_kill > 0,
        "no kill hit an invocation in flight; the test did not exercise redelivery"
    );
}

/// Kills a running handler of a random instance about once a second while scan `id` runs, at
/// most `max` times and with no limit per instance: an instance killed three times gives up and
/// is recycled by the host. Returns the kills. A timer on purpose: the chaos measurement
/// (`chaos::handler_killed_every_second`), not a test.
pub async fn kill_every_second_while_running(app: &TestApp, id: &str, max: usize) -> usize {
    let mut made = 0;
    while made < max {
        let pause = rand::thread_rng().gen_range(700..1300);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if recorded_state(app, id).await.as_deref() != Some("running") {
            break;
        }
        let running: Vec<u32> = app.host().handler_pids().into_iter().flatten().collect();
        if running.is_empty() {
            continue;
        }
        sigkill(running[rand::thread_rng().gen_range(0..running.len())]);
        made += 1;
    }
    made
}
