//! The health keys of a scenario: a GPU's recovery action, remapped rows, ECC counters,
//! retired pages and clock-event reasons, and the `[[xid]]` errors the driver raises.
//! Validated here; answered by `exports/health.rs` and `exports/events.rs`.

use nvml_wrapper_sys::bindings as sys;
use serde::Deserialize;

/// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's values (nvmlDeviceGpuRecoveryAction_t).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryAction {
    None,
    GpuReset,
    NodeReboot,
    DrainP2p,
    DrainAndReset,
}

impl RecoveryAction {
    pub fn to_nvml(self) -> u32 {
        match self {
            RecoveryAction::None => {
                sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_NONE
            }
            RecoveryAction::GpuReset => {
                sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_GPU_RESET
            }
            RecoveryAction::NodeReboot => {
                sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
            }
            RecoveryAction::DrainP2p => {
                sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_DRAIN_P2P
            }
            RecoveryAction::DrainAndReset => {
                sys::nvmlDeviceGpuRecoveryAction_s_NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
            }
        }
    }
}

/// The `recovery_action` key: an action, or `not_supported` for a driver without the
/// field.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryKey {
    None,
    GpuReset,
    NodeReboot,
    DrainP2p,
    DrainAndReset,
    NotSupported,
}

/// The first driver branch with the recovery-action field (fields 226, 227 and 230).
pub const RECOVERY_FIELD_SINCE_BRANCH: u32 = 550;

/// The field as a driver of `driver_version` answers it: the key's value; without the key,
/// `none` (a healthy GPU) where the branch has the field, NOT_SUPPORTED where it predates it.
/// A version that does not start with a branch number is taken as a current driver.
pub(super) fn recovery_action(
    key: Option<RecoveryKey>,
    driver_version: &str,
) -> Option<RecoveryAction> {
    let branch: Option<u32> = driver_version
        .split('.')
        .next()
        .and_then(|major| major.parse().ok());
    match key {
        None if branch.is_some_and(|b| b < RECOVERY_FIELD_SINCE_BRANCH) => None,
        None | Some(RecoveryKey::None) => Some(RecoveryAction::None),
        Some(RecoveryKey::NotSupported) => None,
        Some(RecoveryKey::GpuReset) => Some(RecoveryAction::GpuReset),
        Some(RecoveryKey::NodeReboot) => Some(RecoveryAction::NodeReboot),
        Some(RecoveryKey::DrainP2p) => Some(RecoveryAction::DrainP2p),
        Some(RecoveryKey::DrainAndReset) => Some(RecoveryAction::DrainAndReset),
    }
}

/// `remapped_rows = { correctable, uncorrectable, pending, failure }`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RemappedRows {
    #[serde(default)]
    pub correctable: u32,
    #[serde(default)]
    pub uncorrectable: u32,
    /// A remap waits for the next GPU reset.
    #[serde(default)]
    pub pending: bool,
    /// A remap failed: the GPU ran out of spare rows in a bank (an RMA criterion).
    #[serde(default)]
    pub failure: bool,
}

/// `ecc = { volatile_corrected, volatile_uncorrected, aggregate_corrected,
/// aggregate_uncorrected }`: device-memory (DRAM) error counts. Volatile counts restart
/// with the driver or a GPU reset; aggregate ones last the board's life and include them.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Ecc {
    #[serde(default)]
    pub volatile_corrected: u64,
    #[serde(default)]
    pub volatile_uncorrected: u64,
    #[serde(default)]
    pub aggregate_corrected: u64,
    #[serde(default)]
    pub aggregate_uncorrected: u64,
}

/// `retired_pages = { single_bit, double_bit, pending }`: pages retired for repeated
/// single-bit errors and for double-bit errors, and whether a retirement awaits a reset.
/// Pre-Ampere page retirement: a GPU without this key answers NOT_SUPPORTED, as Hopper does.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RetiredPages {
    #[serde(default)]
    pub single_bit: u32,
    #[serde(default)]
    pub double_bit: u32,
    #[serde(default)]
    pub pending: bool,
}

/// One clock-event reason (nvmlClocksEventReason*), by NVML's name in snake case.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClockEventReason {
    GpuIdle,
    ApplicationsClocksSetting,
    SwPowerCap,
    HwSlowdown,
    SyncBoost,
    SwThermalSlowdown,
    HwThermalSlowdown,
    HwPowerBrakeSlowdown,
    DisplayClockSetting,
}

impl ClockEventReason {
    pub fn bit(self) -> u64 {
        u64::from(match self {
            ClockEventReason::GpuIdle => sys::nvmlClocksEventReasonGpuIdle,
            ClockEventReason::ApplicationsClocksSetting => {
                sys::nvmlClocksEventReasonApplicationsClocksSetting
            }
            ClockEventReason::SwPowerCap => sys::nvmlClocksEventReasonSwPowerCap,
            ClockEventReason::HwSlowdown => sys::nvmlClocksThrottleReasonHwSlowdown,
            ClockEventReason::SyncBoost => sys::nvmlClocksEventReasonSyncBoost,
            ClockEventReason::SwThermalSlowdown => sys::nvmlClocksEventReasonSwThermalSlowdown,
            ClockEventReason::HwThermalSlowdown => sys::nvmlClocksThrottleReasonHwThermalSlowdown,
            ClockEventReason::HwPowerBrakeSlowdown => {
                sys::nvmlClocksThrottleReasonHwPowerBrakeSlowdown
            }
            ClockEventReason::DisplayClockSetting => sys::nvmlClocksEventReasonDisplayClockSetting,
        })
    }
}

/// A GPU's health, as its scenario entry gives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuHealth {
    /// `None`: the driver lacks the field (before R550): NOT_SUPPORTED.
    pub recovery_action: Option<RecoveryAction>,
    pub remapped_rows: RemappedRows,
    pub ecc: Ecc,
    pub retired_pages: Option<RetiredPages>,
    /// `None`: the sim's model (idle when utilization is 0).
    pub clock_event_reasons: Option<u64>,
}

impl GpuHealth {
    /// Identifies these keys' values: a reset recorded under it holds while they stay.
    pub fn fingerprint(&self) -> String {
        format!("{self:?}")
    }

    /// What the GPU shows after a reset: nothing pending, volatile ECC counts restarted,
    /// the recovery action answered.
    pub fn after_reset(&self) -> GpuHealth {
        GpuHealth {
            recovery_action: self.recovery_action.map(|_| RecoveryAction::None),
            remapped_rows: RemappedRows {
                pending: false,
                ..self.remapped_rows
            },
            ecc: Ecc {
                volatile_corrected: 0,
                volatile_uncorrected: 0,
                ..self.ecc
            },
            retired_pages: self.retired_pages.map(|pages| RetiredPages {
                pending: false,
                ..pages
            }),
            clock_event_reasons: self.clock_event_reasons,
        }
    }
}

/// The raw `[[xid]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawXid {
    gpu: u32,
    xid: u32,
    pid: Option<u32>,
}

/// One Xid error the driver raises on a GPU; delivered once to each event set registered
/// for Xid events on that GPU. Entries are told apart by their position in the file, so
/// new ones are appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Xid {
    pub gpu: u32,
    pub xid: u32,
    /// The process the driver's kernel-log line names (NVML's event carries no pid).
    pub pid: Option<u32>,
}

/// The health keys of `[[gpu]]` entry `at`.
pub(super) fn gpu_health(
    at: &str,
    recovery_action: Option<RecoveryAction>,
    remapped_rows: Option<RemappedRows>,
    ecc: Option<Ecc>,
    retired_pages: Option<RetiredPages>,
    clock_event_reasons: Option<Vec<ClockEventReason>>,
) -> Result<GpuHealth, String> {
    let ecc = ecc.unwrap_or_default();
    if ecc.aggregate_corrected < ecc.volatile_corrected {
        return Err(format!(
            "{at}: ecc.aggregate_corrected ({}) is below ecc.volatile_corrected ({}): the aggregate count includes the volatile one",
            ecc.aggregate_corrected, ecc.volatile_corrected
        ));
    }
    if ecc.aggregate_uncorrected < ecc.volatile_uncorrected {
        return Err(format!(
            "{at}: ecc.aggregate_uncorrected ({}) is below ecc.volatile_uncorrected ({}): the aggregate count includes the volatile one",
            ecc.aggregate_uncorrected, ecc.volatile_uncorrected
        ));
    }
    let rows = remapped_rows.unwrap_or_default();
    // An HBM3 stack has 2560 banks, each with a handful of spare rows: more remaps than
    // that is not a GPU.
    const MAX_REMAPS: u32 = 2560 * 8;
    if rows.correctable.saturating_add(rows.uncorrectable) > MAX_REMAPS {
        return Err(format!(
            "{at}: remapped_rows counts more than {MAX_REMAPS} remaps (correctable + uncorrectable)"
        ));
    }
    if let Some(pages) = retired_pages {
        // NVML lists at most 64 retired pages per cause on the GPUs that retire pages.
        const MAX_PAGES: u32 = 64;
        if pages.single_bit > MAX_PAGES || pages.double_bit > MAX_PAGES {
            return Err(format!(
                "{at}: retired_pages counts more than {MAX_PAGES} pages of one cause"
            ));
        }
    }
    let clock_event_reasons = clock_event_reasons.map(|reasons| {
        reasons
            .iter()
            .fold(0u64, |bits, reason| bits | reason.bit())
    });
    Ok(GpuHealth {
        recovery_action,
        remapped_rows: rows,
        ecc,
        retired_pages,
        clock_event_reasons,
    })
}

/// The `[[xid]]` entries, checked against the GPUs.
pub(super) fn xids(raw: Vec<RawXid>, gpu_count: usize) -> Result<Vec<Xid>, String> {
    raw.into_iter()
        .enumerate()
        .map(|(i, x)| {
            let at = format!("xid[{i}]");
            if x.gpu as usize >= gpu_count {
                return Err(format!(
                    "{at}: gpu {} does not exist (the scenario has {gpu_count} GPUs)",
                    x.gpu
                ));
            }
            // NVIDIA's catalog numbers Xids from 1; none is above 999.
            if !(1..=999).contains(&x.xid) {
                return Err(format!("{at}: xid must be in 1..=999, not {}", x.xid));
            }
            if let Some(pid) = x.pid
                && (pid == 0 || pid > i32::MAX as u32)
            {
                return Err(format!("{at}: pid must be in 1..={}", i32::MAX));
            }
            Ok(Xid {
                gpu: x.gpu,
                xid: x.xid,
                pid: x.pid,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::scenario::{Scenario, parse};

    fn p(text: &str) -> Result<Scenario, String> {
        parse(Path::new("/tmp/x.toml"), text)
    }

    #[test]
    fn the_health_keys_are_read() {
        let s = p(r#"
[[gpu]]
[[gpu]]
recovery_action = "gpu_reset"
remapped_rows = { correctable = 3, uncorrectable = 1, pending = true, failure = false }
ecc = { volatile_corrected = 0, volatile_uncorrected = 2, aggregate_corrected = 10, aggregate_uncorrected = 2 }
retired_pages = { single_bit = 0, double_bit = 1, pending = true }
clock_event_reasons = ["hw_slowdown", "sw_thermal_slowdown"]
[[xid]]
gpu = 1
xid = 48
pid = 4242
[[xid]]
gpu = 0
xid = 79
"#)
        .unwrap();
        // A GPU without health keys on the default driver (570) is what a healthy H200
        // answers: the recovery-action field reads none.
        assert_eq!(
            s.gpus[0].health,
            GpuHealth {
                recovery_action: Some(RecoveryAction::None),
                ..GpuHealth::default()
            }
        );
        let h = &s.gpus[1].health;
        assert_eq!(h.recovery_action, Some(RecoveryAction::GpuReset));
        assert_eq!(
            h.remapped_rows,
            RemappedRows {
                correctable: 3,
                uncorrectable: 1,
                pending: true,
                failure: false
            }
        );
        assert_eq!(h.ecc.volatile_uncorrected, 2);
        assert_eq!(h.ecc.aggregate_corrected, 10);
        assert_eq!(
            h.retired_pages,
            Some(RetiredPages {
                single_bit: 0,
                double_bit: 1,
                pending: true
            })
        );
        assert_eq!(h.clock_event_reasons, Some(0x8 | 0x20));
        assert_eq!(
            s.xids,
            [
                Xid {
                    gpu: 1,
                    xid: 48,
                    pid: Some(4242)
                },
                Xid {
                    gpu: 0,
                    xid: 79,
                    pid: None
                }
            ]
        );
        let after = h.after_reset();
        assert_eq!(after.recovery_action, Some(RecoveryAction::None));
        assert!(!after.remapped_rows.pending && after.remapped_rows.correctable == 3);
        assert_eq!(after.ecc.volatile_uncorrected, 0);
        assert_eq!(after.ecc.aggregate_uncorrected, 2);
        assert!(!after.retired_pages.unwrap().pending);
    }

    #[test]
    fn the_recovery_action_field_is_none_where_the_driver_has_it_unless_the_scenario_says() {
        let action = |text: &str| p(text).unwrap().gpus[0].health.recovery_action;
        assert_eq!(action("[[gpu]]\n"), Some(RecoveryAction::None));
        assert_eq!(
            action("driver_version = \"550.54.15\"\n[[gpu]]\n"),
            Some(RecoveryAction::None)
        );
        assert_eq!(action("driver_version = \"535.183.01\"\n[[gpu]]\n"), None);
        assert_eq!(
            action("[[gpu]]\nrecovery_action = \"not_supported\"\n"),
            None
        );
        assert_eq!(
            action("[[gpu]]\nrecovery_action = \"drain_p2p\"\n"),
            Some(RecoveryAction::DrainP2p)
        );
        assert_eq!(
            action("driver_version = \"dev\"\n[[gpu]]\n"),
            Some(RecoveryAction::None)
        );
    }

    #[test]
    fn bad_health_values_are_one_line_errors() {
        for (text, says) in [
            (
                "[[gpu]]\nrecovery_action = \"reboot\"\n",
                "line 2: unknown variant 'reboot'",
            ),
            ("[[gpu]]\nremapped_rows = { pending = \"yes\" }\n", "line 2"),
            (
                "[[gpu]]\nremapped_rows = { spare = 1 }\n",
                "unknown field 'spare'",
            ),
            ("[[gpu]]\nremapped_rows = { correctable = -1 }\n", "line 2"),
            (
                "[[gpu]]\nremapped_rows = { correctable = 30000 }\n",
                "gpu[0]: remapped_rows counts more than 20480 remaps",
            ),
            (
                "[[gpu]]\necc = { volatile_uncorrected = 2 }\n",
                "gpu[0]: ecc.aggregate_uncorrected (0) is below ecc.volatile_uncorrected (2)",
            ),
            (
                "[[gpu]]\necc = { volatile_corrected = 5, aggregate_corrected = 1 }\n",
                "gpu[0]: ecc.aggregate_corrected (1) is below ecc.volatile_corrected (5)",
            ),
            (
                "[[gpu]]\nretired_pages = { double_bit = 65 }\n",
                "gpu[0]: retired_pages counts more than 64 pages of one cause",
            ),
            (
                "[[gpu]]\nclock_event_reasons = [\"too_hot\"]\n",
                "line 2: unknown variant 'too_hot'",
            ),
            ("[[gpu]]\nclock_event_reasons = \"hw_slowdown\"\n", "line 2"),
            (
                "[[gpu]]\n[[xid]]\ngpu = 1\nxid = 13\n",
                "xid[0]: gpu 1 does not exist (the scenario has 1 GPUs)",
            ),
            (
                "[[gpu]]\n[[xid]]\ngpu = 0\nxid = 0\n",
                "xid[0]: xid must be in 1..=999, not 0",
            ),
            (
                "[[gpu]]\n[[xid]]\ngpu = 0\nxid = 13\npid = 0\n",
                "xid[0]: pid must be in 1..=",
            ),
            ("[[gpu]]\n[[xid]]\nxid = 13\n", "missing field 'gpu'"),
            (
                "[[gpu]]\n[[xid]]\ngpu = 0\nxid = 13\nwhen = 1\n",
                "unknown field 'when'",
            ),
        ] {
            let e = p(text).unwrap_err();
            assert!(e.starts_with("/tmp/x.toml: "), "{text}: {e}");
            assert!(e.contains(says), "{text}: {e}");
            assert!(!e.contains('\n'), "{text}: {e}");
        }
    }
}
