//! When the floors run: every job's floor eight batches at a time before the variants (pass 1)
//! and after them (pass 2), and right after each variant that writes batches its job's floor
//! again, as many at a time as the variant had requests in flight (pass 3, judged against;
//! run next to the variant so that the machine's drift over minutes stays out of the ratio).

use std::collections::BTreeMap;

use super::floor::{measure_floors, Floor, FloorJob, FloorTargets};
use super::report::{floor_row, VariantResult};
use super::upstream::Upstream;
use super::variant::{Job, Variant};
use crate::storage::connection::ConnectionSettings;

/// Where the floors run and what they read: Azurite's endpoints (each pass fronts them with a
/// counting proxy of its own) and the seeded source.
pub(super) struct FloorRuns<'a> {
    pub upstream: Upstream,
    pub seed: u64,
    pub source: &'a str,
    /// The run's random name suffix.
    pub suffix: &'a str,
    /// The first copy floor's destination, which prefix-delete empties.
    pub doomed: &'a str,
}

/// The floors the selected variants are judged against; the copy's always (its first pass
/// makes the table prefix-delete empties).
pub(super) fn floor_jobs(variants: &[Variant]) -> Vec<FloorJob> {
    let mut jobs = vec![FloorJob::Copy];
    jobs.extend(variants.iter().map(|v| FloorJob::of(v.job())));
    jobs.sort();
    jobs.dedup();
    jobs
}

/// The batches at a time of a variant's third-pass floor: its mean requests in flight, rounded
/// up. `None` for variants that send no batches (counts and exports are judged against passes
/// 1 and 2).
fn matched_in_flight(variant: &VariantResult) -> Option<usize> {
    matches!(variant.job, Job::Copy | Job::Import | Job::Delete)
        .then(|| variant.mean_in_flight.ceil().max(1.0) as usize)
}

impl FloorRuns<'_> {
    /// Pass 1 or 2: every job's floor, eight batches at a time.
    pub async fn pass(&self, jobs: &[FloorJob], pass: u8) -> Result<Vec<Floor>, String> {
        let targets = self.targets(&pass.to_string(), pass == 1);
        self.run(jobs, BTreeMap::new(), targets, pass, None).await
    }

    /// Pass 3 for the `index`th variant (none for variants without batches).
    pub async fn matched(
        &self,
        variant: &VariantResult,
        index: usize,
    ) -> Result<Vec<Floor>, String> {
        let Some(n) = matched_in_flight(variant) else {
            return Ok(Vec::new());
        };
        let job = FloorJob::of(variant.job);
        let targets = self.targets(&format!("3v{index}"), false);
        let in_flight = BTreeMap::from([(job, n)]);
        self.run(&[job], in_flight, targets, 3, Some(variant.name))
            .await
    }

    fn targets(&self, tag: &str, first: bool) -> FloorTargets {
        let suffix = self.suffix;
        FloorTargets {
            source: self.source.to_string(),
            copy_destination: match first {
                true => self.doomed.to_string(),
                false => format!("BenchFloor{tag}{suffix}"),
            },
            container: format!("benchfloor{tag}{suffix}"),
            import_destination: format!("BenchFloorImport{tag}{suffix}"),
        }
    }

    /// Runs the floors of `jobs` (and those they read from), each printed as it ends. The bare
    /// client talks to Azurite through a counting proxy of its own, as the handler does in
    /// every variant, so both sides pay for the same path.
    async fn run(
        &self,
        jobs: &[FloorJob],
        in_flight: BTreeMap<FloorJob, usize>,
        targets: FloorTargets,
        pass: u8,
        variant: Option<&'static str>,
    ) -> Result<Vec<Floor>, String> {
        let proxy = self.upstream.counting_proxy(self.seed).await?;
        let settings = ConnectionSettings::parse(&proxy.connection_string())
            .map_err(|e| format!("the floors' proxy: {e}"))?;
        let (wanted, gauge) = (jobs.to_vec(), proxy.in_flight().clone());
        let mut floors = tokio::task::spawn_blocking(move || {
            measure_floors(settings, targets, wanted, in_flight, gauge, pass)
        })
        .await
        .map_err(|e| format!("the floor measurement: {e}"))??;
        let sent: u64 = floors.iter().map(|f| f.requests).sum();
        let counted: u64 = proxy.counts().values().sum();
        // Tables and the container are created outside the measured runs: up to three requests.
        if counted < sent || counted > sent + 3 {
            return Err(format!(
                "the floors counted {sent} requests but their proxy saw {counted}"
            ));
        }
        // Floors run only because a later one reads what they wrote are not reported.
        floors.retain(|f| jobs.contains(&f.job));
        for f in &mut floors {
            f.variant = variant;
            eprintln!("floor: {}", floor_row(f));
        }
        Ok(floors)
    }
}
