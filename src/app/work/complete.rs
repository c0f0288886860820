//! Ending a drained scan: once all its work has finished, the driver's further phases start
//! one after the other (if it has any), its completion step runs (if it has one), then the
//! scan is recorded `completed`.

use super::*;
use crate::app::error::ApiError;
use crate::app::job::DriverHooks;
use crate::app::tracking::ScanRecord;
use crate::storage::stores::Stores;
use crate::storage::StorageErrorKind;

/// What a drained scan's driver does next.
enum NextPhase {
    /// Every phase root has finished: the completion step, then the end.
    Done,
    /// Phase `n` has no root yet: start it with this message.
    Start(u32, ChildMessage),
}

impl<S: Stores> Runner<'_, S> {
    /// The context a scan's work runs with: the one recorded at start, naming a driver this
    /// app has (`Err` says why not).
    pub fn usable_context(&self, record: &ScanRecord) -> Result<ScanContext, String> {
        let context = record.recorded_context()?;
        self.app.drivers.of(&context).map_err(|e| e.to_string())?;
        Ok(context)
    }

    /// Ends the scan if all its work has finished (see `Tracker::complete_if_drained`; `shard`:
    /// check that shard first), running its driver's completion step first when it has one.
    pub async fn complete_if_drained<T: TableStore>(
        &self,
        tracker: &Tracker<'_, T>,
        scan: &ScanContext,
        shard: Option<u32>,
    ) -> Result<bool, StorageError> {
        let driver = self
            .app
            .drivers
            .of(scan)
            .map_err(|e| StorageError::new(StorageErrorKind::InvalidInput, e.to_string()))?;
        if !driver.completes() && driver.phases() == 0 {
            return tracker
                .complete_if_drained(&scan.scan_id, scan.shards, shard)
                .await;
        }
        // Judged once, on one snapshot, and acted on only by that judgement: a scan found busy
        // here is left to the check of its last item, and a phase starts, or the completion
        // step runs, only on a snapshot that shows the scan drained while the phase roots were
        // read (see `Tracker::drained_around`), so every item a finished root spawned is in it.
        let phases = || self.next_phase(driver, tracker, scan);
        let Some((totals, next)) = tracker
            .drained_around(&scan.scan_id, scan.shards, shard, phases)
            .await?
        else {
            return Ok(false);
        };
        if totals.failed > 0 {
            return tracker.finish_drained(&scan.scan_id, &totals).await;
        }
        match next {
            NextPhase::Start(n, message) => {
                self.start_phase(tracker, scan, n, &message).await?;
                Ok(false)
            }
            NextPhase::Done if driver.completes() => {
                self.complete_once(driver, tracker, scan, &totals).await
            }
            NextPhase::Done => tracker.finish_drained(&scan.scan_id, &totals).await,
        }
    }

    /// The completion step under the scan's lease, then the end of the scan (on the drained
    /// judgement `totals` the caller made: nothing adds work to a drained scan whose phases
    /// have all run).
    async fn complete_once<T: TableStore>(
        &self,
        driver: &dyn DriverHooks<AppState<S>>,
        tracker: &Tracker<'_, T>,
        scan: &ScanContext,
        totals: &Counters,
    ) -> Result<bool, StorageError> {
        // One execution at a time runs the step: the one holding the scan's completion lease
        // (see docs/architecture.md, "Ending a scan"); the others leave it to it.
        if !tracker.take_completion_lease(&scan.scan_id).await? {
            return Ok(false);
        }
        match self.run_completion(driver, tracker, scan).await {
            Ok(Some(ended)) => Ok(ended),
            Ok(None) => tracker.finish_drained(&scan.scan_id, totals).await,
            Err(e) => {
                // The next delivery may try again at once (else the lease expires).
                if let Err(r) = tracker.release_completion_lease(&scan.scan_id).await {
                    tracing::warn!(scan = %scan.scan_id, error = %r, "could not release the completion lease");
                }
                Err(e)
            }
        }
    }

    /// The next phase of the driver after the root's to start (`Driver::phase`): `Done` if
    /// every phase root has finished, or one finished with a result that ends the phases
    /// (`Driver::ends_phases`); no answer (`Ok(None)`) if one is registered and unfinished.
    /// Read by [`Runner::complete_if_drained`] while it judges the scan drained.
    async fn next_phase<T: TableStore>(
        &self,
        driver: &dyn DriverHooks<AppState<S>>,
        tracker: &Tracker<'_, T>,
        scan: &ScanContext,
    ) -> Result<Option<NextPhase>, StorageError> {
        let unusable = |e: String| StorageError::invalid_input(e);
        for n in 1..=driver.phases() {
            let root = driver.phase(scan, n).map_err(|e| unusable(e.to_string()))?;
            let message = self
                .child_message_in(scan, &root, None)
                .map_err(|e| unusable(e.to_string()))?;
            let work = &message.work;
            match tracker
                .work_state_rounds(&scan.scan_id, work.shard, &work.id)
                .await?
            {
                Some((WorkState::Finished, row))
                    if driver.ends_phases(n, row.result.as_deref()) =>
                {
                    return Ok(Some(NextPhase::Done))
                }
                Some((WorkState::Finished, _)) => continue,
                Some(_) => return Ok(None),
                None => return Ok(Some(NextPhase::Start(n, message))),
            }
        }
        Ok(Some(NextPhase::Done))
    }

    /// Starts phase `n` of a scan judged drained with every earlier phase finished, if this
    /// check wins the phase's claim (`Tracker::claim_phase_start`: of checks judging at once,
    /// one starts it; the others return): its root is queued and then registered, so a crash
    /// in between leaves nothing registered and unqueued (the scan still looks drained, and a
    /// later drained check starts it again, taking the stale claim over). The message is
    /// visible at once: a delivery that comes before the registration waits for it once
    /// (`begin`'s `PHASE_REGISTRATION_WAIT`), and else fails and is retried. (It was invisible
    /// for 1 s, the least a queue message's visibility can be delayed; the host polls an idle
    /// queue ever less often, so the message often waited for the poll after next: up to
    /// 1.7 s a phase in the bench's builds.) Starting twice is still harmless: the id hashes
    /// the item, registering an existing row leaves it alone, and a second message is a
    /// duplicate delivery.
    async fn start_phase<T: TableStore>(
        &self,
        tracker: &Tracker<'_, T>,
        scan: &ScanContext,
        n: u32,
        message: &ChildMessage,
    ) -> Result<(), StorageError> {
        let work = &message.work;
        if !tracker
            .claim_phase_start(&scan.scan_id, work.shard, n)
            .await?
        {
            return Ok(());
        }
        self.app
            .queues
            .put_message(&message.queue, &message.text, Duration::ZERO)
            .await?;
        tracker.register_children(&scan.scan_id, &[work]).await?;
        tracing::info!(scan = %scan.scan_id, phase = n, "phase started");
        Ok(())
    }

    /// Whether `work_id` in `shard` is the root of one of the scan's further phases.
    pub(super) fn is_phase_root(&self, scan: &ScanContext, work_id: &str, shard: u32) -> bool {
        let Ok(driver) = self.app.drivers.of(scan) else {
            return false;
        };
        (1..=driver.phases()).any(|n| {
            let root = driver.phase(scan, n).ok();
            let message = root.and_then(|r| self.child_message_in(scan, &r, None).ok());
            message.is_some_and(|m| m.work.id == work_id && m.work.shard == shard)
        })
    }

    /// Queues the drained check of a scan that a status read found running with no pending
    /// work: its root work message once more (one queue put). Its delivery finds the root
    /// finished and, like any duplicate delivery, runs the drained check and the driver's
    /// completion step; a status read never runs them itself.
    pub async fn queue_drained_check(&self, scan: &ScanContext) -> Result<(), ApiError> {
        let unusable = |e: String| ApiError::Storage(StorageError::invalid_response(e));
        let driver = self
            .app
            .drivers
            .of(scan)
            .map_err(|e| unusable(e.to_string()))?;
        let root = driver.root(scan).map_err(|e| unusable(e.to_string()))?;
        let message = self
            .child_message(scan, &root)
            .map_err(|e| unusable(e.to_string()))?;
        self.app
            .queues
            .put_message(&message.queue, &message.text, Duration::ZERO)
            .await?;
        Ok(())
    }

    /// Runs the driver's completion step. `Some(ended)`: it failed for good and the scan was
    /// failed (`ended` as `Tracker::finish_scan` says); any other error is returned as
    /// transient (the scan stays running, and the next drained check tries again).
    async fn run_completion<T: TableStore>(
        &self,
        driver: &dyn DriverHooks<AppState<S>>,
        tracker: &Tracker<'_, T>,
        scan: &ScanContext,
    ) -> Result<Option<bool>, StorageError> {
        match driver.complete(self.app, scan).await {
            Ok(()) => Ok(None),
            Err(e) if e.is_permanent() => {
                let reason = format!("the {} driver's completion step failed: {e}", driver.name());
                tracker
                    .finish_scan(&scan.scan_id, ScanState::Failed, Some(&reason))
                    .await
                    .map(Some)
            }
            Err(WorkError::Storage(e)) => Err(e),
            Err(e) => Err(StorageError::new(
                StorageErrorKind::Transient,
                format!("the {} driver's completion step: {e}", driver.name()),
            )),
        }
    }
}
