//! Card settings: restoring what a finished job may have changed (`gpuctl reset`, as Slurm
//! epilogs do with nvidia-smi) and turning persistence mode on (`gpuctl enable
//! --persistence`). Never resets the GPU itself.

use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use serde::Serialize;

use crate::nvml::{Gpus, describe};
use crate::snapshot::peaks::PeakStore;

/// What `reset` can restore, in the order it restores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetItem {
    /// Application clocks back to the default (nvidia-smi -rac).
    ApplicationClocks,
    /// Locked GPU clocks released (nvidia-smi -rgc).
    LockedClocks,
    /// Locked memory clocks released (nvidia-smi -rmc).
    MemoryLockedClocks,
    /// Compute mode back to DEFAULT (nvidia-smi -c 0).
    ComputeMode,
    /// Accounting's record of finished processes cleared (nvidia-smi -caa).
    AccountingPids,
    /// gpuctl's own "peak since reset" memory mark.
    PeakMarks,
}

impl ResetItem {
    pub const ALL: [ResetItem; 6] = [
        ResetItem::ApplicationClocks,
        ResetItem::LockedClocks,
        ResetItem::MemoryLockedClocks,
        ResetItem::ComputeMode,
        ResetItem::AccountingPids,
        ResetItem::PeakMarks,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ResetItem::ApplicationClocks => "application clocks",
            ResetItem::LockedClocks => "locked GPU clocks",
            ResetItem::MemoryLockedClocks => "locked memory clocks",
            ResetItem::ComputeMode => "compute mode",
            ResetItem::AccountingPids => "accounting pids",
            ResetItem::PeakMarks => "peak memory mark",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ItemOutcome {
    Done,
    /// `--dry-run`: what would be done.
    WouldDo,
    NotSupported,
    NotPermitted,
    Failed {
        error: String,
    },
    /// Not done, by design: `why` says what instead.
    Skipped {
        why: String,
    },
}

impl ItemOutcome {
    pub fn label(&self) -> String {
        match self {
            ItemOutcome::Done => "done".into(),
            ItemOutcome::WouldDo => "would reset".into(),
            ItemOutcome::NotSupported => "not supported".into(),
            ItemOutcome::NotPermitted => "not permitted".into(),
            ItemOutcome::Failed { error } => format!("failed: {error}"),
            ItemOutcome::Skipped { why } => format!("skipped: {why}"),
        }
    }

    /// Not supported is not a failure: there was nothing to restore on that card.
    pub fn is_failure(&self) -> bool {
        matches!(self, ItemOutcome::NotPermitted | ItemOutcome::Failed { .. })
    }

    fn of(result: Result<(), NvmlError>) -> ItemOutcome {
        match result {
            Ok(()) => ItemOutcome::Done,
            Err(NvmlError::NotSupported) => ItemOutcome::NotSupported,
            Err(NvmlError::NoPermission) => ItemOutcome::NotPermitted,
            Err(error) => ItemOutcome::Failed {
                error: describe(&error),
            },
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuItems {
    pub index: u32,
    pub uuid: Option<String>,
    pub items: Vec<ItemResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ItemResult {
    pub item: ResetItem,
    #[serde(flatten)]
    pub outcome: ItemOutcome,
}

/// Restores `items` on each GPU of `indices`; with `dry_run`, reports what would be reset.
/// Each GPU's card settings are restored within the NVML timeout: a GPU that does not
/// answer has every item failed, saying so.
pub fn reset(
    gpus: &Gpus,
    indices: &[u32],
    items: &[ResetItem],
    dry_run: bool,
    peaks: Option<&PeakStore>,
) -> Vec<GpuItems> {
    let wanted = items.to_vec();
    let answers = gpus.on_each(indices, move |nvml, index| {
        card_reset(nvml, index, &wanted, dry_run)
    });
    let silent = gpus.timeout().map_or_else(String::new, |limit| {
        format!("not answering after {}", humantime::format_duration(limit))
    });
    indices
        .iter()
        .zip(answers)
        .map(|(&index, answer)| {
            let (uuid, card) = answer.unwrap_or_else(|| {
                let failed = ItemOutcome::Failed {
                    error: silent.clone(),
                };
                (None, items.iter().map(|_| Some(failed.clone())).collect())
            });
            let results = items
                .iter()
                .zip(card)
                .map(|(&item, outcome)| ItemResult {
                    item,
                    // Only peak marks are left: they are gpuctl's own, not the card's.
                    outcome: outcome.unwrap_or_else(|| {
                        if dry_run {
                            ItemOutcome::WouldDo
                        } else {
                            reset_peaks(peaks, uuid.as_deref())
                        }
                    }),
                })
                .collect();
            GpuItems {
                index,
                uuid,
                items: results,
            }
        })
        .collect()
}

/// The card's part of a reset, on one GPU: its UUID, and each item's outcome (`None` for
/// peak marks, which are not the card's).
fn card_reset(
    nvml: &Nvml,
    index: u32,
    items: &[ResetItem],
    dry_run: bool,
) -> (Option<String>, Vec<Option<ItemOutcome>>) {
    let device = nvml.device_by_index(index);
    let uuid = device.as_ref().ok().and_then(|d| d.uuid().ok());
    // Setters take the device mutably; a fresh handle per item keeps each one independent.
    let card = |reset: fn(&mut Device<'_>) -> Result<(), NvmlError>| {
        ItemOutcome::of(
            nvml.device_by_index(index)
                .and_then(|mut device| reset(&mut device)),
        )
    };
    let outcomes = items
        .iter()
        .map(|&item| match (&device, dry_run, item) {
            (Err(error), _, _) => Some(ItemOutcome::Failed {
                error: describe(error),
            }),
            (_, _, ResetItem::PeakMarks) => None,
            (Ok(_), true, _) => Some(ItemOutcome::WouldDo),
            (Ok(_), false, ResetItem::ApplicationClocks) => {
                Some(card(|d| d.reset_applications_clocks()))
            }
            (Ok(_), false, ResetItem::LockedClocks) => Some(card(|d| d.reset_gpu_locked_clocks())),
            (Ok(_), false, ResetItem::MemoryLockedClocks) => {
                Some(card(|d| d.reset_mem_locked_clocks()))
            }
            (Ok(_), false, ResetItem::ComputeMode) => {
                Some(card(|d| d.set_compute_mode(ComputeMode::Default)))
            }
            (Ok(_), false, ResetItem::AccountingPids) => Some(card(|d| d.clear_accounting_pids())),
        })
        .collect();
    (uuid, outcomes)
}

fn reset_peaks(peaks: Option<&PeakStore>, uuid: Option<&str>) -> ItemOutcome {
    match (peaks, uuid) {
        (Some(store), Some(uuid)) => match store.reset(uuid) {
            Ok(()) => ItemOutcome::Done,
            Err(error) => ItemOutcome::Failed { error },
        },
        (None, _) => ItemOutcome::Failed {
            error: "no state directory for peak marks".into(),
        },
        (_, None) => ItemOutcome::Failed {
            error: "the GPU's UUID cannot be read".into(),
        },
    }
}

/// Turns persistence mode on for each GPU of `indices`, each within the NVML timeout.
pub fn enable_persistence(gpus: &Gpus, indices: &[u32]) -> Vec<(u32, ItemOutcome)> {
    let answers = gpus.on_each(indices, |nvml, index| match nvml.device_by_index(index) {
        Ok(mut device) => ItemOutcome::of(device.set_persistent(true)),
        Err(error) => ItemOutcome::of(Err(error)),
    });
    indices
        .iter()
        .zip(answers)
        .map(|(&index, answer)| {
            let outcome = answer.unwrap_or_else(|| ItemOutcome::Failed {
                error: format!(
                    "not answering after {}",
                    humantime::format_duration(gpus.timeout().unwrap_or_default())
                ),
            });
            (index, outcome)
        })
        .collect()
}
