//! Scan parameters and their validation.

use serde::{Deserialize, Serialize};

use crate::storage::{compare_keys, MAX_TAKE};

use super::budget::StepBudget;

/// Most pages a request may ask a prefix query to read per prefix: each one costs a query, so a
/// step on the default budget could never read more (and a larger value only meant more work).
pub const MAX_SEGMENTS_PER_PREFIX: u32 = StepBudget::DEFAULT.max_queries as u32;

/// How the key range is enumerated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Recursive partition-key prefix discovery: disjoint ranges that can run in parallel.
    #[default]
    Prefix,
    /// Plain paging of the whole range with one cursor: the baseline.
    Serial,
}

/// What to scan and how. Every step of a scan carries (a copy of) these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScanParameters {
    /// Only partition keys starting with this (may be empty).
    #[serde(default)]
    pub prefix: String,
    /// Exclusive lower partition-key bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower: Option<String>,
    /// Exclusive upper partition-key bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper: Option<String>,
    /// Page size (`$top`), 1..=1000.
    pub take: u32,
    /// Columns to read besides PartitionKey and RowKey; `None` reads every column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<Vec<String>>,
    /// Emit the rest of a discovered partition as its own step (fan-out) rather than reading it
    /// inline in the step that discovered it.
    pub expand_partition_keys: bool,
    /// With `expand_partition_keys`: read the first page of the rest of a discovered partition
    /// inline, and fan out only what is left after it (most partitions end within that page, so
    /// they cost no step of their own, and their rows join the page that discovered them).
    /// `false` (the reference design, and scans recorded before it existed): fan out every rest.
    #[serde(default, skip_serializing_if = "is_false")]
    pub inline_first_partition_page: bool,
    /// Non-empty pages read for the first prefix of a prefix query before fanning out
    /// (1..=[`MAX_SEGMENTS_PER_PREFIX`]; a step also stops when its query budget is spent).
    pub segments_per_first_prefix: u32,
    /// Non-empty pages read for each later prefix of a prefix query (1..=16, as above).
    pub segments_per_subsequent_prefix: u32,
}

fn is_false(b: &bool) -> bool {
    !b
}

impl ScanParameters {
    /// Default `segmentsPerFirstPrefix`. 4 (with 2 below) rather than 1/1: fewer discovery
    /// queries and work items per row, so a copy finishes sooner and cheaper in the simulator on
    /// both plans and sizes (docs/simulator.md, "Defaults").
    pub const DEFAULT_SEGMENTS_PER_FIRST_PREFIX: u32 = 4;
    /// Default `segmentsPerSubsequentPrefix` (see above).
    pub const DEFAULT_SEGMENTS_PER_SUBSEQUENT_PREFIX: u32 = 2;
}

impl Default for ScanParameters {
    fn default() -> Self {
        ScanParameters {
            prefix: String::new(),
            lower: None,
            upper: None,
            take: MAX_TAKE,
            select: None,
            expand_partition_keys: true,
            inline_first_partition_page: false,
            segments_per_first_prefix: Self::DEFAULT_SEGMENTS_PER_FIRST_PREFIX,
            segments_per_subsequent_prefix: Self::DEFAULT_SEGMENTS_PER_SUBSEQUENT_PREFIX,
        }
    }
}

/// A parameter that cannot be used, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ParameterError {
    pub field: &'static str,
    pub message: String,
}

impl ParameterError {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        ParameterError {
            field,
            message: message.into(),
        }
    }
}

impl ScanParameters {
    pub fn validate(&self) -> Result<(), ParameterError> {
        if self.take == 0 || self.take > MAX_TAKE {
            return Err(ParameterError::new(
                "takeCount",
                format!("must be 1..=1000, got {}", self.take),
            ));
        }
        for (field, value) in [
            ("segmentsPerFirstPrefix", self.segments_per_first_prefix),
            (
                "segmentsPerSubsequentPrefix",
                self.segments_per_subsequent_prefix,
            ),
        ] {
            if !(1..=MAX_SEGMENTS_PER_PREFIX).contains(&value) {
                return Err(ParameterError::new(
                    field,
                    format!("must be 1..={MAX_SEGMENTS_PER_PREFIX}, got {value}"),
                ));
            }
        }
        if let (Some(lower), Some(upper)) = (&self.lower, &self.upper) {
            if compare_keys(lower, upper).is_ge() {
                return Err(ParameterError::new(
                    "partitionKeyLowerBound",
                    "the lower bound must be below the upper bound",
                ));
            }
        }
        if let Some(select) = &self.select {
            if let Some(bad) = select
                .iter()
                .find(|c| c.is_empty() || c.contains(['\'', ',', ' ']))
            {
                return Err(ParameterError::new(
                    "select",
                    format!("invalid column name {bad:?}"),
                ));
            }
        }
        Ok(())
    }

    /// The `$select` list to send: the requested columns plus PartitionKey and RowKey.
    pub fn select_columns(&self) -> Option<Vec<String>> {
        self.select.as_ref().map(|columns| {
            let mut all = vec!["PartitionKey".to_string(), "RowKey".to_string()];
            for c in columns {
                if !all.contains(c) {
                    all.push(c.clone());
                }
            }
            all
        })
    }

    /// Whether a partition key is inside the scanned range.
    pub fn contains_partition_key(&self, pk: &str) -> bool {
        pk.starts_with(&self.prefix)
            && self
                .lower
                .as_deref()
                .map_or(true, |l| compare_keys(pk, l).is_gt())
            && self
                .upper
                .as_deref()
                .map_or(true, |u| compare_keys(pk, u).is_lt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_bounded_by_the_step_budget() {
        for (field, set) in [
            (
                "segmentsPerFirstPrefix",
                (|p, v| ScanParameters {
                    segments_per_first_prefix: v,
                    ..p
                }) as fn(ScanParameters, u32) -> ScanParameters,
            ),
            ("segmentsPerSubsequentPrefix", |p, v| ScanParameters {
                segments_per_subsequent_prefix: v,
                ..p
            }),
        ] {
            for ok in [1, 2, MAX_SEGMENTS_PER_PREFIX] {
                assert_eq!(set(ScanParameters::default(), ok).validate(), Ok(()));
            }
            for bad in [0, MAX_SEGMENTS_PER_PREFIX + 1, 500, u32::MAX] {
                let err = set(ScanParameters::default(), bad).validate().unwrap_err();
                assert_eq!(err.field, field);
                assert!(err.message.contains(&bad.to_string()), "{err}");
                assert!(err.message.contains("1..=16"), "{err}");
            }
        }
        assert_eq!(MAX_SEGMENTS_PER_PREFIX, 16);
    }

    #[test]
    fn take_count_is_bounded() {
        for bad in [0, MAX_TAKE + 1, u32::MAX] {
            let err = ScanParameters {
                take: bad,
                ..Default::default()
            }
            .validate()
            .unwrap_err();
            assert_eq!(err.field, "takeCount");
        }
    }
}
