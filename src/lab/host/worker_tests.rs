//! Unit tests of [`super`] on tokio's paused clock: the error count that makes an instance give
//! up, and its recycle wait. Also [`Worker::without_process`], the worker other modules' tests
//! (the function timeout, `invoke.rs`) run against.

use super::*;

impl Worker {
    /// A worker without a process, for paused-time tests of what depends on one: ready on `port`
    /// as generation 1 (starting for ever when `port` is `None`); a restart of the running
    /// generation makes the next one ready at once. The reasons of those restarts, in order.
    pub(crate) fn without_process(
        port: Option<u16>,
    ) -> (Arc<Worker>, Arc<std::sync::Mutex<Vec<String>>>) {
        let status = match port {
            Some(port) => WorkerStatus::Ready { port },
            None => WorkerStatus::Starting,
        };
        let (state_tx, state_rx) = watch::channel(WorkerState {
            generation: 1,
            status,
            pid: None,
        });
        let (cmd_tx, mut cmd_rx) = mpsc::unbounded_channel();
        let restarts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = restarts.clone();
        let task = tokio::spawn(async move {
            while let Some(WorkerCommand::Restart { generation, reason }) = cmd_rx.recv().await {
                if generation == state_tx.borrow().generation {
                    seen.lock().unwrap().push(reason);
                    state_tx.send_modify(|s| s.generation += 1);
                }
            }
        });
        let worker = Arc::new(Worker {
            state: state_rx,
            commands: cmd_tx,
            task: tokio::sync::Mutex::new(Some(task)),
        });
        (worker, restarts)
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// Sends `command` once `after` has passed.
async fn send_after(
    tx: &mpsc::UnboundedSender<WorkerCommand>,
    after: Duration,
    command: WorkerCommand,
) {
    tokio::time::sleep(after).await;
    tx.send(command).unwrap();
}

#[test]
fn three_errors_within_thirty_minutes_give_up_and_older_ones_are_forgotten() {
    let start = Instant::now();
    let mut errors = ErrorCount::default();
    assert!(!errors.too_many(start));
    assert!(!errors.too_many(start + 29 * MINUTE));
    assert!(
        errors.too_many(start + 30 * MINUTE),
        "the window holds its bounds"
    );

    errors.clear();
    let later = start + 60 * MINUTE;
    assert!(!errors.too_many(later));
    assert!(!errors.too_many(later + 20 * MINUTE));
    // The first one is now more than 30 minutes old: two errors count.
    assert!(!errors.too_many(later + 30 * MINUTE + Duration::from_secs(1)));
    assert!(errors.too_many(later + 31 * MINUTE));
}

#[tokio::test(start_paused = true)]
async fn an_instance_that_gave_up_waits_out_its_recycle_delay_whatever_restarts_ask() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let start = Instant::now();
    let restart = WorkerCommand::Restart {
        generation: 1,
        reason: "function timeout".into(),
    };
    let restart_meanwhile = send_after(&tx, Duration::from_secs(1), restart);
    let (back, ()) = tokio::join!(
        wait_recycle(Duration::from_secs(10), &mut rx),
        restart_meanwhile
    );
    assert!(back);
    assert_eq!(start.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn a_stop_ends_the_recycle_wait_at_once() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let start = Instant::now();
    let stop_at_3s = send_after(&tx, Duration::from_secs(3), WorkerCommand::Stop);
    let (back, ()) = tokio::join!(wait_recycle(RECYCLE_DELAY, &mut rx), stop_at_3s);
    assert!(!back);
    assert_eq!(start.elapsed(), Duration::from_secs(3));

    drop(tx);
    assert!(!wait_recycle(RECYCLE_DELAY, &mut rx).await);
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(3),
        "no sender: no wait"
    );
}
