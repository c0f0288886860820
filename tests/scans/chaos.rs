//! Crashes the platform recovers from (issue 27, part 8), through the local Functions host and
//! the real handler binary on Azurite, each at a point the test chooses (the fault proxy holds
//! the requests that would let the scan run past it), so the number of kills and rounds is the
//! test's, not the machine's speed's:
//! - an instance whose handler is killed three times is given up on and recycled by the host
//!   (which keeps running), and the copy ends exact;
//! - one item killed on every delivery of its first round (the host's function timeout), and
//!   one whose storage fails every delivery of its first round: each is re-queued by the poison
//!   function and its copy completes exactly; a duplicate copy of it, poisoned in the same
//!   round, starts no round;
//! - a poison-function invocation killed in its turn: its message comes back after the receive
//!   visibility, and the item is re-queued and completes;
//! - an item whose own code fails still fails on its last delivery, without extra rounds.
//!
//! About one kill a second on a two-instance host for a whole copy is a measurement
//! (`handler_killed_every_second`, ignored: `cargo test --release -- --ignored`), printing its
//! kills, recycles and re-queues.
//!
//! Destination and work rows are read with the test's own REST client (`support::raw`), never
//! through tablescan's parser.

use crate::support;

use std::time::{Duration, Instant};

use support::e2e::TestApp;
use support::faults::kills::{invocations, wait_until};
use support::faults::{
    failed_by_kills, item_log_lines, kill_every_second_while_running, proxy, recorded_state,
    seeded_source, source_entities, start_copy, start_then_arm, verify_copy, wait_recorded_end,
    Killer, Summary,
};
use support::raw::{self, RawClient};
use support::unique_name;
use tablescan::app::messages::{encode, StepMessage};
use tablescan::lab::proxy::{FaultPolicy, Hold, StorageProxy};
use tablescan::scan::Step;
use tablescan::storage::request_counts::RequestKind;
use tablescan::storage::QueueStore;

/// Bound on one faulted scan: only a hang reaches it (they take under a minute).
const SCAN_TIMEOUT: Duration = Duration::from_secs(240);

/// The receive visibility of the kill measurement's host: long beside a delivery here (renewed
/// at half-life meanwhile), short beside [`SCAN_TIMEOUT`], so a message whose poison-function
/// invocation was killed comes back within the run.
const CHAOS_RECEIVE_VISIBILITY: Duration = Duration::from_secs(30);

/// Measurement: about one kill a second on a two-instance host for the whole copy. Instances
/// give up after their third kill and are recycled (the host keeps running); a work item killed
/// on all of host.json's 5 deliveries is poisoned and the poison function re-queues it (10 s,
/// then 20 s, 40 s later), so the copy still ends exact. Prints the kills, recycles, re-queues,
/// failed poison invocations and the copy's duration; how many of each depends on the machine's
/// speed, which is why this is not a test. Each behaviour it exercises has its deterministic
/// test in this module.
///
/// Duplicate live copies of one item, poisoned in the same round, start one round between them
/// (the round is in the re-queued message). A kill that lands on a poison-function invocation
/// leaves its message invisible for the rest of the receive visibility (poison queues have no
/// poison queue; docs/architecture.md, "Re-queued rounds"): 10 minutes on Azure, longer than
/// this run waits, so the local host here shortens it to [`CHAOS_RECEIVE_VISIBILITY`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: one handler kill a second for a whole copy; prints kills, recycles, re-queues and duration"]
async fn handler_killed_every_second() {
    // A SIGKILL storm loads the machine for a minute or more: apart from the other fault runs
    // and measurements that take this lock.
    let _alone = support::alone().await;
    let mut summary = Summary::new("handler-kills-every-second");
    let connection = support::azurite().connection_string();
    let host = (5, "00:00:00", "00:01:00");
    let app = TestApp::start_tuned_with(2, &connection, host, &[], |config| {
        config.receive_visibility = CHAOS_RECEIVE_VISIBILITY;
    })
    .await;
    let (source, source_rows) = seeded_source(&app, source_entities(6000, 23)).await;
    let destination = unique_name("Dest");
    let started = Instant::now();
    let id = start_copy(&app, &source, &destination, 4).await;
    let kills = kill_every_second_while_running(&app, &id, 40).await;
    summary.faults = kills as u64;
    explain_if_stuck(&app, &id, SCAN_TIMEOUT).await;
    let took = started.elapsed();
    let verdict = verify_copy(&app, &id, &source_rows, &destination, SCAN_TIMEOUT).await;
    summary.add(&verdict);
    let logs = app.host().log_lines();
    if !verdict.problems.is_empty() {
        // Which item failed the scan, and every line about it.
        let (_, status) = app.get(&format!("/api/scans/{id}")).await;
        let error = status["error"].as_str().unwrap_or_default().to_string();
        eprintln!("handler-kills-every-second: scan error: {error}");
        for line in item_log_lines(&app, &error) {
            eprintln!("  {}", &line[..line.len().min(500)]);
        }
    }
    let count = |needle: &str| logs.iter().filter(|l| l.contains(needle)).count();
    eprintln!(
        "handler-kills-every-second: {kills} kills, {} instance recycles, {} re-queues, {} \
         poison invocation(s) failed, {} invocations failed by kills, copy of {} rows ended in \
         {took:?}",
        count("recycling the host instance"),
        count("re-queued for round"),
        count("Poison' (Failed"),
        failed_by_kills(&app),
        source_rows.len(),
    );
    summary.report(&[&verdict]);
    app.shutdown().await;
}

/// An instance whose handler is killed three times (each time with an invocation in flight) is
/// given up on by the host and recycled after its recycle delay, while the other instance keeps
/// working; the copy ends exact. The copy's writes wait at the proxy until the instance is back,
/// so it cannot end before the kills. Every delivery killed here fails at most 3 of its 5
/// deliveries: none is poisoned, so no round is re-queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_three_times_is_recycled_and_the_copy_ends_exact() {
    let mut summary = Summary::new("instance-recycled");
    let proxy = proxy(FaultPolicy::none(), 37).await;
    // A function timeout no held delivery reaches (it would restart a handler too); a short
    // recycle delay, waited for as an event.
    let host = (5, "00:00:00", "00:10:00");
    let app = TestApp::start_tuned_with(2, &proxy.connection_string(), host, &[], |config| {
        config.recycle_delay = Duration::from_secs(1);
    })
    .await;
    let (source, source_rows) = seeded_source(&app, source_entities(1500, 23)).await;
    let destination = unique_name("Dest");
    proxy.hold(Hold::writes_to(&destination));
    let id = start_copy(&app, &source, &destination, 4).await;
    let mut killer = Killer::new(&app);
    for _ in 0..3 {
        killer
            .kill_one(&app, Some(&proxy), |i, _| i == 0, None)
            .await;
    }
    proxy.release();
    summary.faults = 3;
    let verdict = verify_copy(&app, &id, &source_rows, &destination, SCAN_TIMEOUT).await;
    summary.add(&verdict);
    let logs = app.host().log_lines();
    let count = |needles: &[&str]| {
        logs.iter()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .count()
    };
    eprintln!(
        "instance-recycled: kills {:?}, generations {:?}, invocations failed by kills {}",
        killer.kills,
        app.host().handler_generations(),
        failed_by_kills(&app)
    );
    summary.report(&[&verdict]);
    assert_eq!(
        count(&["[i0]", "Exceeded http worker restart retry count"]),
        1
    );
    assert_eq!(count(&["[i0]", "recycling the host instance"]), 1);
    assert_eq!(
        count(&["Exceeded http worker restart retry count"]),
        1,
        "only instance 0"
    );
    assert_eq!(
        app.host().handler_generations(),
        vec![4, 1],
        "three kills, then the recycle's fresh handler"
    );
    assert!(
        failed_by_kills(&app) > 0,
        "a kill hit an invocation in flight"
    );
    assert_eq!(count(&["re-queued for round"]), 0, "no item was poisoned");
    app.shutdown().await;
}

/// Waits for scan `id` to end (recorded); if it is still running after `timeout`, fails
/// showing each unfinished work row as stored and every host log line naming it.
async fn explain_if_stuck(app: &TestApp, id: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while recorded_state(app, id).await.as_deref() == Some("running") {
        if Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let prefix = format!("{id}-");
        let rows = RawClient::azurite().rows(&app.names.work_table).await;
        let logs = app.host().log_lines();
        let mut report = String::new();
        for row in rows.iter().filter(|e| {
            let state = e.text("State").map(raw::decode_string_lossy);
            e.partition_key().starts_with(&prefix)
                && matches!(state.as_deref(), Some("pending" | "expanded"))
        }) {
            report.push_str(&format!("row {}: {:?}\n", row.row_key(), row.properties));
            for line in logs.iter().filter(|l| l.contains(&row.row_key())) {
                report.push_str(&format!("  {}\n", &line[..line.len().min(400)]));
            }
        }
        panic!("scan {id} still running after {timeout:?}\n{report}");
    }
}

/// The app on `storage` with host.json's `maxDequeueCount` and `functionTimeout` set (quick
/// polling, immediate retries), `instances` host instances, `settings` added, the local host's
/// configuration changed by `tweak`.
async fn app_with(
    storage: &str,
    instances: usize,
    (max_dequeue_count, function_timeout): (u64, &str),
    settings: &[(&str, &str)],
    tweak: impl FnOnce(&mut tablescan::lab::host::HostConfig),
) -> TestApp {
    let host = (max_dequeue_count, "00:00:00", function_timeout);
    TestApp::start_tuned_with(instances, storage, host, settings, tweak).await
}

/// Waits until the host's log has a line containing `needle`; past `kills::HANG`, fails showing the
/// log's last lines.
async fn wait_for_line(app: &TestApp, needle: &str) {
    wait_until(&format!("{needle:?} in the host log"), || async {
        let logs = app.host().log_lines();
        match logs.iter().any(|l| l.contains(needle)) {
            true => Ok(()),
            false => Err(logs[logs.len().saturating_sub(40)..].join("\n")),
        }
    })
    .await
}

/// The `Requeues` of scan `id`'s unfinished work rows, read raw.
async fn requeues_of_unfinished(app: &TestApp, id: &str) -> Vec<i64> {
    let prefix = format!("{id}-");
    RawClient::azurite()
        .rows(&app.names.work_table)
        .await
        .iter()
        .filter(|e| e.partition_key().starts_with(&prefix) && e.row_key() != "counter")
        .filter(|e| {
            let state = e.text("State").map(raw::decode_string_lossy);
            matches!(state.as_deref(), Some("pending" | "expanded"))
        })
        .filter_map(|e| raw::integer(e.text("Requeues")))
        .collect()
}

/// What fails the first round of deliveries of a copy's root step.
#[derive(Debug, Clone, Copy)]
enum FirstRound {
    /// The root's queries are held at the proxy: the host's function timeout (5 s) restarts
    /// the handler in the middle of every delivery.
    Killed,
    /// Table queries answer 503 ServerBusy on every attempt: every delivery fails transiently,
    /// the last one too, and records nothing.
    StorageOut,
}

/// The function timeout of the runs whose deliveries are held until the host kills them: 10
/// times a delivery's usual length here, so that no delivery let through reaches it.
const KILLING_TIMEOUT: &str = "00:00:05";

/// A single-instance app behind `proxy` that gives each message 2 deliveries a round, with
/// `function_timeout`, and a copy of a seeded source started on it with no delivery before
/// `arm` ran ([`start_then_arm`]): the app, the scan's id, its source rows and destination.
async fn held_copy(
    proxy: &StorageProxy,
    function_timeout: &str,
    tweak: impl FnOnce(&mut tablescan::lab::host::HostConfig),
    arm: impl FnOnce(&TestApp, &str),
) -> (TestApp, String, Vec<raw::RawEntity>, String) {
    let app = app_with(
        &proxy.connection_string(),
        1,
        (2, function_timeout),
        &[],
        tweak,
    )
    .await;
    let (source, rows) = seeded_source(&app, source_entities(300, 35)).await;
    let destination = unique_name("Dest");
    let start = start_copy(&app, &source, &destination, 50);
    let id = start_then_arm(&app, proxy, start, |_| arm(&app, &source)).await;
    (app, id, rows, destination)
}

/// A copy whose root step fails both deliveries of its first round (`maxDequeueCount` 2): the
/// host poisons the message, the poison function re-queues it for round 1 (the row, read raw,
/// unmarked with `Requeues` 1), storage is healthy again, and the copy completes exactly. With
/// `duplicate`, a second copy of the root's message, poisoned in the same round (as a duplicate
/// live copy is), reaches the poison function after round 1 started: it starts no round.
///
/// The faults are armed before the root's first delivery, and once round 1 is re-queued the
/// proxy holds the live queue's receives until the checks of round 1's start are done, so round
/// 1 cannot run (and end) under them.
async fn first_round_fails_then_completes(first_round: FirstRound, duplicate: bool) {
    let proxy = proxy(FaultPolicy::none(), 27).await;
    let timeout = match first_round {
        FirstRound::Killed => KILLING_TIMEOUT,
        FirstRound::StorageOut => "00:01:00",
    };
    let (app, id, rows, destination) = held_copy(
        &proxy,
        timeout,
        |_| {},
        |_, source| match first_round {
            FirstRound::Killed => proxy.hold(Hold {
                kinds: vec![RequestKind::Query],
                resources: vec![source.to_string()],
                ..Hold::default()
            }),
            FirstRound::StorageOut => {
                proxy.set_faults(FaultPolicy {
                    server_busy: 1.0,
                    kinds: vec![RequestKind::Query],
                    ..FaultPolicy::none()
                });
                proxy.release();
            }
        },
    )
    .await;
    wait_for_line(&app, "re-queued for round 1").await;
    proxy.hold(Hold::receives_from(&app.names.prefix_queue));
    proxy.set_faults(FaultPolicy::none());
    assert_eq!(
        requeues_of_unfinished(&app, &id).await,
        vec![1],
        "the root's row records its round"
    );
    if duplicate {
        // The driver's root message (round 0, no `r`), as the host moves a poisoned copy.
        let root = encode(&StepMessage {
            scan_id: id.clone(),
            step: Step::Start,
            shard: None,
        })
        .unwrap();
        let poison = format!("{}-poison", app.names.prefix_queue);
        let queues = support::queue_store().0;
        queues
            .put_message(&poison, &root, Duration::ZERO)
            .await
            .unwrap();
        wait_for_line(&app, "a poisoned copy of re-queue round 0").await;
        assert_eq!(
            requeues_of_unfinished(&app, &id).await,
            vec![1],
            "the duplicate started no round"
        );
    }
    proxy.release();
    let verdict = verify_copy(&app, &id, &rows, &destination, SCAN_TIMEOUT).await;
    assert!(verdict.problems.is_empty(), "{:?}", verdict.problems);
    assert_eq!(verdict.rows_copied, rows.len());
    let logs = app.host().log_lines();
    if let FirstRound::Killed = first_round {
        // Round 0's two deliveries, logged before its re-queue (later deliveries run on a
        // healthy store, but one may still outlast the 5-s timeout on a loaded machine).
        let round_0 = logs
            .iter()
            .take_while(|l| !l.contains("re-queued for round 1"));
        let timeouts = round_0.filter(|l| l.contains("Timeout value of"));
        assert_eq!(
            timeouts.count(),
            2,
            "the host's function timeout killed both deliveries"
        );
    }
    assert!(!logs.iter().any(|l| l.contains("re-queued for round 2")));
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_killed_on_every_delivery_of_its_first_round_is_re_queued_and_completes() {
    first_round_fails_then_completes(FirstRound::Killed, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_poisoned_in_the_same_round_start_one_round() {
    first_round_fails_then_completes(FirstRound::Killed, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_storage_fails_through_its_first_round_is_re_queued_and_completes() {
    first_round_fails_then_completes(FirstRound::StorageOut, false).await;
}

/// A poison-function invocation that is killed (here by the host's function timeout, as a kill
/// of its handler would: the host restarts it) fails, and its message, on a queue without a
/// poison queue, stays invisible for the rest of the receive visibility (docs/architecture.md,
/// "Re-queued rounds"; 10 minutes on Azure, 5 s on this host). Then it comes back, the poison
/// function runs again and re-queues the item, and the copy completes exactly.
///
/// The root's two deliveries are held until killed (as in `first_round_fails_then_completes`),
/// the poison queue's receives until the root's message is moved there, and then the work
/// table's requests (the poison function's first) until its invocation failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_poison_invocation_is_run_again_and_its_item_completes() {
    let proxy = proxy(FaultPolicy::none(), 29).await;
    let visibility = |config: &mut tablescan::lab::host::HostConfig| {
        config.receive_visibility = Duration::from_secs(5);
    };
    let (app, id, rows, destination) =
        held_copy(&proxy, KILLING_TIMEOUT, visibility, |app, source| {
            proxy.hold(Hold {
                kinds: vec![RequestKind::Query, RequestKind::QueueGet],
                resources: vec![
                    source.to_string(),
                    format!("{}-poison", app.names.prefix_queue),
                ],
                ..Hold::default()
            })
        })
        .await;
    wait_for_line(&app, "Moving message to queue").await;
    proxy.hold(Hold {
        resources: vec![app.names.work_table.clone()],
        ..Hold::default()
    });
    wait_for_line(&app, "Executed 'PrefixScanPoison' (Failed").await;
    proxy.release();
    wait_for_line(&app, "re-queued for round 1").await;
    let verdict = verify_copy(&app, &id, &rows, &destination, SCAN_TIMEOUT).await;
    assert!(verdict.problems.is_empty(), "{:?}", verdict.problems);
    let poison_runs: Vec<_> = invocations(&app.host().log_lines())
        .into_iter()
        .filter(|v| v.function == "PrefixScanPoison")
        .collect();
    assert!(
        poison_runs.len() >= 2
            && poison_runs[0]
                .ended
                .as_deref()
                .is_some_and(|e| e.contains("Failed")),
        "the first poison invocation failed, and another one re-queued the item: {poison_runs:#?}"
    );
    assert!(!app
        .host()
        .log_lines()
        .iter()
        .any(|l| l.contains("re-queued for round 2")));
    app.shutdown().await;
}

/// An item whose own code fails (`TABLESCAN_TEST_FAIL_PREFIX`) records its failure on its last
/// delivery: the scan fails at once with that error (after its 2 deliveries, not after any
/// re-queued round), and the poison function, which finds the item finished, re-queues nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_genuinely_failing_item_fails_without_extra_rounds() {
    let connection = support::azurite().connection_string();
    let settings = [("TABLESCAN_TEST_FAIL_PREFIX", "System.")];
    let app = app_with(&connection, 1, (2, "00:01:00"), &settings, |_| {}).await;
    let all = source_entities(400, 61);
    assert!(all.iter().any(|e| e.partition_key.starts_with("System.")));
    let (source, _) = seeded_source(&app, all).await;
    let started = Instant::now();
    // Small pages: partitions with more rows are read by partition-key steps, which fail.
    let id = start_copy(&app, &source, &unique_name("Dest"), 5).await;
    let state = wait_recorded_end(&app, &id, SCAN_TIMEOUT).await;
    let took = started.elapsed();
    assert_eq!(state, "failed");
    let status = app.wait_for_end(&id, SCAN_TIMEOUT).await;
    let error = status["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("System.") && error.contains("failed after 2 attempts"),
        "its own error: {status}"
    );
    // The poison function settles the poisoned message (the host moves it after the failed
    // last delivery) and finds the item finished.
    wait_for_line(&app, "poisoned message of a").await;
    let logs = app.host().log_lines();
    assert!(
        !logs.iter().any(|l| l.contains("re-queued for round")),
        "no extra round"
    );
    eprintln!("genuine failure: the scan failed {took:?} after its start");
    app.shutdown().await;
}
