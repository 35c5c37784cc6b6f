//! `reset`: restore the card settings a finished job may have changed, and clear peak marks.

use super::Session;
use crate::cardset::{self, GpuItems, ItemOutcome, ItemResult, ResetItem};
use crate::error::Result;
use crate::nvml::Place;
use crate::report::{RESET_SCHEMA, ResetReport};
use crate::snapshot::peaks::PeakStore;

/// Which GPUs, and which of their settings.
#[derive(Debug, Clone, Default)]
pub struct ResetRequest {
    /// GPUs or MIG instances by name; empty: every GPU.
    pub gpus: Vec<String>,
    /// Empty: every item ([`ResetItem::ALL`]).
    pub items: Vec<ResetItem>,
    pub dry_run: bool,
}

impl ResetRequest {
    /// The items to restore, in restoring order: those named, or every item.
    pub fn items(&self) -> Vec<ResetItem> {
        if self.items.is_empty() {
            return ResetItem::ALL.to_vec();
        }
        ResetItem::ALL
            .into_iter()
            .filter(|item| self.items.contains(item))
            .collect()
    }
}

/// What `reset` did: each GPU's items and how each ended. A MIG instance named is reported
/// with every item skipped: it has no settings of its own.
#[derive(Debug, Clone)]
pub struct Restored {
    pub gpus: Vec<GpuItems>,
}

impl Restored {
    /// No item failed (a skip is not a failure).
    pub fn clean(&self) -> bool {
        !self
            .gpus
            .iter()
            .flat_map(|gpu| &gpu.items)
            .any(|item| item.outcome.is_failure())
    }

    /// The `reset --json` document of this run of `request` (the CLI prints it).
    pub fn report<'a>(&'a self, request: &ResetRequest) -> ResetReport<'a> {
        ResetReport {
            schema: RESET_SCHEMA,
            dry_run: request.dry_run,
            gpus: &self.gpus,
            gpu_reset: None,
        }
    }
}

/// Restores what `request` names, GPU by GPU.
pub fn reset(session: &Session, request: &ResetRequest) -> Result<Restored> {
    let gpus = session.gpus()?;
    let items = request.items();
    // A MIG instance (`MIG-...`, `0/9`, as a Slurm epilog passes a job's slice) has no
    // settings of its own: the card's are shared by its other instances' tenants.
    let places = match session.places(&request.gpus)? {
        Some(places) => places,
        None => gpus.resolve(&[])?.into_iter().map(Place::whole).collect(),
    };
    let indices: Vec<u32> = places
        .iter()
        .filter(|p| p.gpu_instance.is_none())
        .map(|p| p.gpu)
        .collect();
    let peaks = PeakStore::default_location();
    let mut results = cardset::reset(gpus, &indices, &items, request.dry_run, peaks.as_ref());
    for place in places.iter().filter(|p| p.gpu_instance.is_some()) {
        let why = format!(
            "GPU {place} is a MIG instance; card settings and peak marks are the whole GPU's, \
             shared with its other instances (reset --gpu {} for the card; the MIG layout is \
             never changed)",
            place.gpu
        );
        results.push(GpuItems {
            index: place.gpu,
            uuid: None,
            items: items
                .iter()
                .map(|&item| ItemResult {
                    item,
                    outcome: ItemOutcome::Skipped { why: why.clone() },
                })
                .collect(),
        });
    }
    Ok(Restored { gpus: results })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_item_named_is_every_item_and_named_ones_keep_the_restoring_order() {
        assert_eq!(ResetRequest::default().items(), ResetItem::ALL);
        let request = ResetRequest {
            items: vec![ResetItem::PeakMarks, ResetItem::ComputeMode],
            ..ResetRequest::default()
        };
        assert_eq!(
            request.items(),
            [ResetItem::ComputeMode, ResetItem::PeakMarks]
        );
    }

    #[test]
    fn a_failed_item_fails_the_reset_and_a_skip_does_not() {
        let gpu = |outcome| GpuItems {
            index: 0,
            uuid: None,
            items: vec![ItemResult {
                item: ResetItem::ComputeMode,
                outcome,
            }],
        };
        let skipped = gpu(ItemOutcome::Skipped { why: "MIG".into() });
        let done = gpu(ItemOutcome::Done);
        let restored = Restored {
            gpus: vec![skipped, done.clone()],
        };
        assert!(restored.clean());
        let broken = gpu(ItemOutcome::Failed {
            error: "Unknown Error".into(),
        });
        assert!(
            !Restored {
                gpus: vec![done, broken]
            }
            .clean()
        );
    }

    #[test]
    fn the_report_is_the_reset_json_document() {
        let restored = Restored {
            gpus: vec![GpuItems {
                index: 1,
                uuid: Some("GPU-1".into()),
                items: vec![ItemResult {
                    item: ResetItem::ComputeMode,
                    outcome: ItemOutcome::Done,
                }],
            }],
        };
        let request = ResetRequest {
            dry_run: true,
            ..ResetRequest::default()
        };
        let json = serde_json::to_value(restored.report(&request)).unwrap();
        assert_eq!(json["schema"], RESET_SCHEMA);
        assert_eq!(json["dry_run"], true);
        assert_eq!(json["gpus"][0]["index"], 1);
        assert_eq!(json.as_object().unwrap().len(), 3, "{json}");
    }
}
