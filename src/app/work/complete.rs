//! Ending a drained scan: once all its work has finished, the scan's driver's completion step
//! runs (if it has one), then the scan is recorded `completed`.

use super::*;
use crate::app::error::ApiError;
use crate::app::job::DriverHooks;
use crate::app::tracking::ScanRecord;
use crate::storage::StorageErrorKind;

impl<T: TableStore + Clone, Q: QueueStore + Clone> Runner<'_, T, Q> {
    /// The context a scan's work runs with: the one recorded at start, naming a driver this
    /// app has (`Err` says why not).
    pub fn usable_context(&self, record: &ScanRecord) -> Result<ScanContext, String> {
        let context = record.recorded_context()?;
        self.app.drivers.of(&context).map_err(|e| e.to_string())?;
        Ok(context)
    }

    /// Ends the scan if all its work has finished (see `Tracker::complete_if_drained`; `shard`:
    /// check that shard first), running its driver's completion step first when it has one.
    pub async fn complete_if_drained<S: TableStore>(
        &self,
        tracker: &Tracker<'_, S>,
        scan: &ScanContext,
        shard: Option<u32>,
    ) -> Result<bool, StorageError> {
        let driver = self
            .app
            .drivers
            .of(scan)
            .map_err(|e| StorageError::new(StorageErrorKind::InvalidInput, e.to_string()))?;
        if driver.completes() {
            // Judged once, and the scan is completed only on that judgement: a scan found busy
            // here must not be completed by the check below if its last item finishes in
            // between (that item's own check then runs the step), or it would end `completed`
            // before its completion step ran. Once drained, nothing can add work.
            let Some(totals) = tracker.drained(&scan.scan_id, scan.shards).await? else {
                return Ok(false);
            };
            if totals.failed == 0 {
                // One execution at a time runs the step: the one holding the scan's completion
                // lease (see docs/architecture.md, "Ending a scan"); the others leave it to it.
                if !tracker.take_completion_lease(&scan.scan_id).await? {
                    return Ok(false);
                }
                match self.run_completion(driver, tracker, scan).await {
                    Ok(Some(ended)) => return Ok(ended),
                    Ok(None) => {}
                    Err(e) => {
                        // The next delivery may try again at once (else the lease expires).
                        if let Err(r) = tracker.release_completion_lease(&scan.scan_id).await {
                            tracing::warn!(scan = %scan.scan_id, error = %r, "could not release the completion lease");
                        }
                        return Err(e);
                    }
                }
            }
        }
        tracker
            .complete_if_drained(&scan.scan_id, scan.shards, shard)
            .await
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
    async fn run_completion<S: TableStore>(
        &self,
        driver: &dyn DriverHooks<AppState<T, Q>>,
        tracker: &Tracker<'_, S>,
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
