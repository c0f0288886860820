//! A scan that continues across a handler restart and a redeployment, each made mid-scan by
//! construction: the fault proxy holds the copy's writes while every handler is killed, and
//! hides its work items' queue across the redeployment, so the copy cannot end before either.

use crate::support;

use support::faults::kills::{invocations, sigkill, wait_until};
use support::faults::{
    app_behind, failed_by_kills, proxy, recorded_state, seeded_source, source_entities, start_copy,
    verify_copy, with_big_partition, Summary,
};
use tablescan::lab::proxy::{FaultPolicy, Hold};
use tablescan::storage::QueueStore;

/// Bound on the copy: only a hang reaches it (it takes seconds).
const SCAN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(240);

/// The fault suite's `handler_crashes` kills handlers one at a time and `scale_out_with_an_
/// instance_stopped` stops one instance of three; here every instance goes at once, twice:
/// 1. every handler process is SIGKILLed mid-scan at the same moment (invocations in flight
///    die); the host starts a fresh handler process per instance (generation 2);
/// 2. the whole host is stopped mid-scan (no new work, invocations in flight finish, handlers
///    stop) and a new host with new handler processes starts on the same app, storage, queues
///    and tables: a redeployment of the same version.
///
/// The copy must complete by itself, exactly: destination = source row for row and property
/// for property (read with the test's own REST client), every counter exact, no work left in
/// the work table or the queues.
///
/// Mid-scan by construction: the copy's writes are held at the proxy from its start until the
/// restarted handlers have written (so the kill finds a write in flight, and the copy running);
/// its work items (a big partition's pages, on the copy queue) are hidden from the host until
/// the new host is up, so the copy is still running when the old host stops, and the new host
/// has work to continue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_continues_across_a_redeployment_mid_scan() {
    let mut summary = Summary::new("redeployment");
    let proxy = proxy(FaultPolicy::none(), 41).await;
    let mut app = app_behind(&proxy, 2).await;
    let entities = with_big_partition(source_entities(400, 27), "Big", 60);
    let (source, source_rows) = seeded_source(&app, entities).await;
    let destination = support::unique_name("Dest");
    proxy.hide_messages(&[&app.names.copy_queue]);
    proxy.hold(Hold::writes_to(&destination));
    let id = start_copy(&app, &source, &destination, 4).await;

    // 1. Every handler killed at once, with a write in flight (held).
    wait_until("a write held", || async {
        let held = proxy.held();
        (held.now > 0).then_some(()).ok_or(format!("{held:?}"))
    })
    .await;
    let pids: Vec<u32> = app.host().handler_pids().into_iter().flatten().collect();
    assert_eq!(pids.len(), 2, "every instance has a handler");
    for pid in &pids {
        sigkill(*pid);
    }
    wait_until("both handlers restarted", || async {
        let generations = app.host().handler_generations();
        let up = app.host().handler_pids().iter().all(Option::is_some);
        (generations == [2, 2] && up)
            .then_some(())
            .ok_or(format!("{generations:?}"))
    })
    .await;
    app.host()
        .wait_ready(std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let restarted: Vec<u32> = app.host().handler_pids().into_iter().flatten().collect();
    assert!(
        restarted.iter().all(|p| !pids.contains(p)),
        "fresh handler processes"
    );
    let failed_by_kill = failed_by_kills(&app);
    assert!(failed_by_kill > 0, "the held write's invocation died");
    // The restarted handlers continue: a write of theirs reaches the proxy.
    let killed = proxy.held();
    wait_until("a write from the restarted handlers", || async {
        let held = proxy.held();
        (held.total > killed.total)
            .then_some(())
            .ok_or(format!("{held:?}, {killed:?} at the kill"))
    })
    .await;

    // 2. A redeployment, the writes let through (the old host's invocations finish while it
    // drains), the items still hidden: the copy cannot end before the new host is up.
    proxy.release();
    wait_until("work items queued", || async {
        let queued = support::queue_store()
            .0
            .approximate_count(&app.names.copy_queue)
            .await
            .unwrap_or(0);
        (queued > 0).then_some(()).ok_or(format!("{queued} queued"))
    })
    .await;
    let before = invocations(&app.host().log_lines()).len();
    app.redeploy().await;
    assert_eq!(app.host().handler_generations(), vec![1, 1], "a new host");
    assert_eq!(
        recorded_state(&app, &id).await.as_deref(),
        Some("running"),
        "the copy's items wait for the new host"
    );
    proxy.hide_messages(&[]);
    summary.faults = 2;

    let verdict = verify_copy(&app, &id, &source_rows, &destination, SCAN_TIMEOUT).await;
    let continued = invocations(&app.host().log_lines());
    eprintln!(
        "redeployment: {} rows; every handler killed with a write in flight ({failed_by_kill} \
         invocations failed), the old host ran {before} invocations, the new one {}",
        source_rows.len(),
        continued.len()
    );
    assert!(
        continued.iter().any(|v| v.function == "TableCopy"),
        "the new host ran the items"
    );
    summary.add(&verdict);
    summary.report(&[&verdict]);
    app.shutdown().await;
}
