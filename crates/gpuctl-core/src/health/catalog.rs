//! NVIDIA's Xid catalog for Ampere, Hopper and Blackwell GPUs: each Xid's meaning and the
//! catalog's immediate action ("Resolution Bucket (Immediate Action)"). This table is the
//! only place the mapping lives; a site overrides any entry with `[health] xid_actions`, and
//! chooses what an Xid the table lacks asks for with `[health] unknown_xid_action` (a
//! [`Catalog`] built from both).
//!
//! **Where the entries come from.** NVIDIA publishes the catalog as "Analyzing Xid Errors
//! with the Xid Catalog" (<https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html>,
//! with a downloadable spreadsheet), Xids 1 to 162. The numbers, mnemonics and immediate
//! actions here are NVIDIA's own machine-readable copy of that column, the
//! `xiderrorsmapping.csv` of NVIDIA's NVSentinel (github.com/NVIDIA/NVSentinel,
//! `distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv`, commit
//! 6f8b0fcfa8e502bdda78fabf96facef729a9285b, read 2026-11-28), which spells the
//! CONTACT_SUPPORT bucket `UNEXPECTED_ERR_REPORT_ISSUE` and RESTART_BM as it is. The short
//! descriptions of 28 entries are the catalog page's "Description" column as gpuctl's first
//! table (2026-11) quoted it; the others show NVIDIA's mnemonic. One entry changed from that
//! first table: Xid 38 (FECS watchdog timeout) was `restart_app` there and is `IGNORE` in
//! NVIDIA's copy, so `none` here. Xid 162 has no mnemonic in that copy.
//!
//! **From a bucket to an action** ([`Bucket::action`]): gpuctl's actions are NVML's
//! recovery actions plus `restart_app`. RESTART_APP, IGNORE (`none`), RESET_GPU and
//! RESTART_BM (`node_reboot`) map one to one. The buckets that need a person before the GPU
//! is used again (CONTACT_SUPPORT, CHECK_MECHANICALS, UPDATE_SWFW) hold the GPU with
//! `gpu_reset`, the first thing support asks for; RESTART_VM (confidential computing's key
//! rotation) is the node's reboot, the VM being the node. CHECK_UVM (Xid 159, non-fatal in
//! NVIDIA's copy) is the application's to restart. The WORKFLOW buckets are a first step
//! with the rest decided by the state the GPU shows (a row remap pending, uncorrected ECC
//! errors, the driver's recovery action), which the verdict reads on its own.

use std::collections::BTreeMap;

use super::Action;

/// NVIDIA's "Resolution Bucket (Immediate Action)".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bucket {
    RestartApp,
    Ignore,
    ResetGpu,
    /// RESTART_BM: restart the bare-metal node.
    RestartBm,
    /// CONTACT_SUPPORT (`UNEXPECTED_ERR_REPORT_ISSUE` in NVSentinel's copy).
    ContactSupport,
    CheckMechanicals,
    UpdateSwfw,
    RestartVm,
    CheckUvm,
    WorkflowXid45,
    WorkflowXid48,
    WorkflowNvlink,
    WorkflowNvlink5,
    /// Xid 154: follow the guidance of the Xid whose recovery action changed.
    FollowXid154,
}

impl Bucket {
    pub const ALL: [Bucket; 14] = [
        Bucket::RestartApp,
        Bucket::Ignore,
        Bucket::ResetGpu,
        Bucket::RestartBm,
        Bucket::ContactSupport,
        Bucket::CheckMechanicals,
        Bucket::UpdateSwfw,
        Bucket::RestartVm,
        Bucket::CheckUvm,
        Bucket::WorkflowXid45,
        Bucket::WorkflowXid48,
        Bucket::WorkflowNvlink,
        Bucket::WorkflowNvlink5,
        Bucket::FollowXid154,
    ];

    /// The action gpuctl shows for this bucket (see the module's doc for why).
    pub const fn action(self) -> Action {
        match self {
            Bucket::RestartApp | Bucket::CheckUvm => Action::RestartApp,
            Bucket::Ignore
            | Bucket::WorkflowXid45
            | Bucket::WorkflowXid48
            | Bucket::FollowXid154 => Action::None,
            Bucket::ResetGpu
            | Bucket::ContactSupport
            | Bucket::CheckMechanicals
            | Bucket::UpdateSwfw
            | Bucket::WorkflowNvlink
            | Bucket::WorkflowNvlink5 => Action::GpuReset,
            Bucket::RestartBm | Bucket::RestartVm => Action::NodeReboot,
        }
    }

    /// A multi-step workflow: the action is its first step, and the state the Xid leaves
    /// decides the rest.
    pub const fn workflow(self) -> bool {
        matches!(
            self,
            Bucket::WorkflowXid45
                | Bucket::WorkflowXid48
                | Bucket::WorkflowNvlink
                | Bucket::WorkflowNvlink5
        )
    }
}

/// One Xid of NVIDIA's catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEntry {
    pub xid: u32,
    /// NVIDIA's mnemonic (`ROBUST_CHANNEL_GR_EXCEPTION`); empty where the source has none.
    pub mnemonic: &'static str,
    /// NVIDIA's short description, where gpuctl quotes it; empty otherwise.
    pub description: &'static str,
    pub bucket: Bucket,
}

impl XidEntry {
    /// The description, else the mnemonic.
    pub fn meaning(&self) -> String {
        match (self.description, self.mnemonic) {
            ("", "") => format!("Xid {} (unnamed in NVIDIA's catalog copy)", self.xid),
            ("", mnemonic) => mnemonic.to_string(),
            (description, _) => description.to_string(),
        }
    }

    pub const fn action(&self) -> Action {
        self.bucket.action()
    }
}

const fn xid(
    xid: u32,
    mnemonic: &'static str,
    description: &'static str,
    bucket: Bucket,
) -> XidEntry {
    XidEntry {
        xid,
        mnemonic,
        description,
        bucket,
    }
}

use Bucket::{
    CheckMechanicals, CheckUvm, ContactSupport, FollowXid154, Ignore, ResetGpu, RestartApp,
    RestartBm, RestartVm, UpdateSwfw, WorkflowNvlink, WorkflowNvlink5, WorkflowXid45,
    WorkflowXid48,
};

/// NVIDIA's catalog, by number, each Xid once.
pub const XID_CATALOG: &[XidEntry] = &[
    xid(
        1,
        "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD",
        "",
        ContactSupport,
    ),
    xid(2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "", ContactSupport),
    xid(
        3,
        "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD",
        "",
        ContactSupport,
    ),
    xid(
        4,
        "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY",
        "",
        ContactSupport,
    ),
    xid(
        5,
        "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW",
        "",
        ContactSupport,
    ),
    xid(6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "", ContactSupport),
    xid(7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "", ContactSupport),
    xid(
        8,
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "GPU stopped processing",
        RestartApp,
    ),
    xid(9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "", ContactSupport),
    xid(
        10,
        "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP",
        "",
        ContactSupport,
    ),
    xid(11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "", RestartApp),
    xid(12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "", ContactSupport),
    xid(
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY",
        "Graphics Engine Exception",
        RestartApp,
    ),
    xid(14, "ROBUST_CHANNEL_FAKE_ERROR", "", Ignore),
    xid(15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "", ContactSupport),
    xid(
        16,
        "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT",
        "",
        ContactSupport,
    ),
    xid(17, "ROBUST_CHANNEL_PARAMETER_ERROR", "", ContactSupport),
    xid(
        18,
        "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR",
        "",
        ContactSupport,
    ),
    xid(
        19,
        "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER",
        "",
        ContactSupport,
    ),
    xid(
        20,
        "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD",
        "",
        ContactSupport,
    ),
    xid(21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "", ContactSupport),
    xid(22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "", ContactSupport),
    xid(23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "", ContactSupport),
    xid(
        24,
        "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT",
        "",
        ContactSupport,
    ),
    xid(25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "", RestartApp),
    xid(
        26,
        "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT",
        "",
        ContactSupport,
    ),
    xid(27, "ROBUST_CHANNEL_VP_ERROR", "", ContactSupport),
    xid(28, "ROBUST_CHANNEL_VP2_ERROR", "", ContactSupport),
    xid(29, "ROBUST_CHANNEL_BSP_ERROR", "", ContactSupport),
    xid(30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "", ContactSupport),
    xid(
        31,
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "GPU memory page fault",
        RestartApp,
    ),
    xid(
        32,
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "Invalid or corrupted push buffer stream",
        RestartApp,
    ),
    xid(33, "ROBUST_CHANNEL_SEC_ERROR", "", ContactSupport),
    xid(34, "ROBUST_CHANNEL_MSVLD_ERROR", "", ContactSupport),
    xid(35, "ROBUST_CHANNEL_MSPDEC_ERROR", "", ContactSupport),
    xid(36, "ROBUST_CHANNEL_MSPPP_ERROR", "", ContactSupport),
    xid(
        37,
        "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD",
        "",
        Ignore,
    ),
    xid(
        38,
        "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT",
        "Driver firmware error",
        Ignore,
    ),
    xid(39, "ROBUST_CHANNEL_CE0_ERROR", "", RestartApp),
    xid(40, "ROBUST_CHANNEL_CE1_ERROR", "", RestartApp),
    xid(41, "ROBUST_CHANNEL_CE2_ERROR", "", RestartApp),
    xid(42, "ROBUST_CHANNEL_VIC_ERROR", "", ContactSupport),
    xid(
        43,
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "GPU stopped processing (reset channel verification)",
        Ignore,
    ),
    xid(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "", Ignore),
    xid(
        45,
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "Preemptive cleanup, due to previous errors",
        WorkflowXid45,
    ),
    xid(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "", ResetGpu),
    xid(47, "ROBUST_CHANNEL_NVENC0_ERROR", "", ContactSupport),
    xid(
        48,
        "ROBUST_CHANNEL_GPU_ECC_DBE",
        "Double Bit ECC Error",
        WorkflowXid48,
    ),
    xid(
        49,
        "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY",
        "",
        ContactSupport,
    ),
    xid(
        50,
        "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR",
        "",
        ContactSupport,
    ),
    xid(51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "", ContactSupport),
    xid(
        52,
        "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE",
        "",
        ContactSupport,
    ),
    xid(
        53,
        "SILENT_RUNNING_TEMP_REDUCED_CLOCKING",
        "",
        ContactSupport,
    ),
    xid(
        54,
        "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
        "",
        CheckMechanicals,
    ),
    xid(
        55,
        "SILENT_RUNNING_TEMPERATURE_READ_ERROR",
        "",
        ContactSupport,
    ),
    xid(56, "DISPLAY_CHANNEL_EXCEPTION", "", ContactSupport),
    xid(57, "FB_LINK_TRAINING_FAILURE_ERROR", "", ContactSupport),
    xid(58, "FB_MEMORY_ERROR", "", ContactSupport),
    xid(59, "PMU_ERROR", "", ContactSupport),
    xid(60, "ROBUST_CHANNEL_SEC2_ERROR", "", RestartApp),
    xid(
        61,
        "PMU_BREAKPOINT",
        "Internal micro-controller breakpoint/warning",
        ContactSupport,
    ),
    xid(
        62,
        "PMU_HALT_ERROR",
        "Internal micro-controller halt",
        ResetGpu,
    ),
    xid(
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "ECC page retirement or row remapping recording event",
        Ignore,
    ),
    xid(
        64,
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        "ECC page retirement or row remapper recording failure",
        ResetGpu,
    ),
    xid(65, "ROBUST_CHANNEL_NVENC1_ERROR", "", ContactSupport),
    xid(
        66,
        "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION",
        "",
        Ignore,
    ),
    xid(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "", Ignore),
    xid(
        68,
        "ROBUST_CHANNEL_NVDEC0_ERROR",
        "NVDEC0 Exception",
        RestartApp,
    ),
    xid(
        69,
        "ROBUST_CHANNEL_GR_CLASS_ERROR",
        "Graphics Engine class error",
        RestartApp,
    ),
    xid(70, "ROBUST_CHANNEL_CE3_ERROR", "", RestartApp),
    xid(71, "ROBUST_CHANNEL_CE4_ERROR", "", RestartApp),
    xid(72, "ROBUST_CHANNEL_CE5_ERROR", "", RestartApp),
    xid(73, "ROBUST_CHANNEL_NVENC2_ERROR", "", ContactSupport),
    xid(74, "NVLINK_ERROR", "NVLINK Error", WorkflowNvlink),
    xid(75, "ROBUST_CHANNEL_CE6_ERROR", "", RestartApp),
    xid(76, "ROBUST_CHANNEL_CE7_ERROR", "", RestartApp),
    xid(77, "ROBUST_CHANNEL_CE8_ERROR", "", RestartApp),
    xid(78, "VGPU_START_ERROR", "", UpdateSwfw),
    xid(
        79,
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "GPU has fallen off the bus",
        RestartBm,
    ),
    xid(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "", RestartApp),
    xid(81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "", ContactSupport),
    xid(82, "ROBUST_CHANNEL_NVJPG0_ERROR", "", RestartApp),
    xid(83, "ROBUST_CHANNEL_NVDEC1_ERROR", "", RestartApp),
    xid(84, "ROBUST_CHANNEL_NVDEC2_ERROR", "", RestartApp),
    xid(85, "ROBUST_CHANNEL_CE9_ERROR", "", RestartApp),
    xid(86, "ROBUST_CHANNEL_OFA0_ERROR", "", RestartApp),
    xid(87, "NVTELEMETRY_DRIVER_REPORT", "", ContactSupport),
    xid(88, "ROBUST_CHANNEL_NVDEC3_ERROR", "", RestartApp),
    xid(89, "ROBUST_CHANNEL_NVDEC4_ERROR", "", RestartApp),
    xid(90, "LTC_ERROR", "", ContactSupport),
    xid(91, "RESERVED_XID", "", ContactSupport),
    xid(
        92,
        "EXCESSIVE_SBE_INTERRUPTS",
        "High single-bit ECC error rate",
        Ignore,
    ),
    xid(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "", Ignore),
    xid(
        94,
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        "Contained ECC error",
        RestartApp,
    ),
    xid(
        95,
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "Uncontained ECC error",
        ResetGpu,
    ),
    xid(96, "ROBUST_CHANNEL_NVDEC5_ERROR", "", RestartApp),
    xid(97, "ROBUST_CHANNEL_NVDEC6_ERROR", "", RestartApp),
    xid(98, "ROBUST_CHANNEL_NVDEC7_ERROR", "", RestartApp),
    xid(99, "ROBUST_CHANNEL_NVJPG1_ERROR", "", RestartApp),
    xid(100, "ROBUST_CHANNEL_NVJPG2_ERROR", "", RestartApp),
    xid(101, "ROBUST_CHANNEL_NVJPG3_ERROR", "", RestartApp),
    xid(102, "ROBUST_CHANNEL_NVJPG4_ERROR", "", RestartApp),
    xid(103, "ROBUST_CHANNEL_NVJPG5_ERROR", "", RestartApp),
    xid(104, "ROBUST_CHANNEL_NVJPG6_ERROR", "", RestartApp),
    xid(105, "ROBUST_CHANNEL_NVJPG7_ERROR", "", RestartApp),
    xid(106, "SMBPBI_TEST_MESSAGE", "", Ignore),
    xid(107, "SMBPBI_TEST_MESSAGE_SILENT", "", Ignore),
    xid(108, "DESTINATION_FLA_TRANSLATION_ERROR", "", ContactSupport),
    xid(
        109,
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        "Context Switch Timeout Error",
        ResetGpu,
    ),
    xid(110, "SEC_FAULT_ERROR", "", ResetGpu),
    xid(111, "BUNDLE_ERROR_EVENT", "", ContactSupport),
    xid(112, "DISP_SUPERVISOR_ERROR", "", ContactSupport),
    xid(113, "DP_LT_FAILURE", "", ContactSupport),
    xid(114, "HEAD_RG_UNDERFLOW", "", ContactSupport),
    xid(115, "CORE_CHANNEL_REGS", "", ContactSupport),
    xid(116, "WINDOW_CHANNEL_REGS", "", ContactSupport),
    xid(117, "CURSOR_CHANNEL_REGS", "", ContactSupport),
    xid(118, "HEAD_REGS", "", ContactSupport),
    xid(119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", ResetGpu),
    xid(120, "GSP_ERROR", "GSP Error", ResetGpu),
    xid(121, "C2C_ERROR", "C2C Link corrected error", Ignore),
    xid(122, "SPI_PMU_RPC_READ_FAIL", "", ContactSupport),
    xid(
        123,
        "SPI_PMU_RPC_WRITE_FAIL",
        "SPI PMU RPC write failure",
        ContactSupport,
    ),
    xid(124, "SPI_PMU_RPC_ERASE_FAIL", "", ContactSupport),
    xid(125, "INFOROM_FS_ERROR", "", ContactSupport),
    xid(126, "ROBUST_CHANNEL_CE10_ERROR", "", RestartApp),
    xid(127, "ROBUST_CHANNEL_CE11_ERROR", "", RestartApp),
    xid(128, "ROBUST_CHANNEL_CE12_ERROR", "", RestartApp),
    xid(129, "ROBUST_CHANNEL_CE13_ERROR", "", RestartApp),
    xid(130, "ROBUST_CHANNEL_CE14_ERROR", "", RestartApp),
    xid(131, "ROBUST_CHANNEL_CE15_ERROR", "", RestartApp),
    xid(132, "ROBUST_CHANNEL_CE16_ERROR", "", RestartApp),
    xid(133, "ROBUST_CHANNEL_CE17_ERROR", "", RestartApp),
    xid(134, "ROBUST_CHANNEL_CE18_ERROR", "", RestartApp),
    xid(135, "ROBUST_CHANNEL_CE19_ERROR", "", RestartApp),
    xid(136, "ALI_TRAINING_FAIL", "Link training failed", ResetGpu),
    xid(137, "NVLINK_FLA_PRIV_ERR", "", Ignore),
    xid(138, "ROBUST_CHANNEL_DLA_ERROR", "", ContactSupport),
    xid(139, "ROBUST_CHANNEL_OFA1_ERROR", "", RestartApp),
    xid(
        140,
        "UNRECOVERABLE_ECC_ERROR_ESCAPE",
        "Unrecovered ECC Error",
        ResetGpu,
    ),
    xid(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "", Ignore),
    xid(142, "ROBUST_CHANNEL_NVENC3_ERROR", "", ContactSupport),
    xid(
        143,
        "GPU_INIT_ERROR",
        "GPU Initialization Failure",
        ResetGpu,
    ),
    xid(144, "NVLINK_SAW_ERROR", "", WorkflowNvlink5),
    xid(145, "NVLINK_RLW_ERROR", "", WorkflowNvlink5),
    xid(146, "NVLINK_TLW_ERROR", "", WorkflowNvlink5),
    xid(147, "NVLINK_TREX_ERROR", "", WorkflowNvlink5),
    xid(148, "NVLINK_NVLPW_CTRL_ERROR", "", WorkflowNvlink5),
    xid(149, "NVLINK_NETIR_ERROR", "", WorkflowNvlink5),
    xid(150, "NVLINK_MSE_ERROR", "", WorkflowNvlink5),
    xid(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "", RestartVm),
    xid(152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "", Ignore),
    xid(153, "ROBUST_CHANNEL_DLA_TIMEOUT", "", Ignore),
    xid(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "GPU recovery action changed (the recovery action says which)",
        FollowXid154,
    ),
    xid(155, "NVLINK_SW_DEFINED_ERROR", "", ResetGpu),
    xid(156, "RESOURCE_RETIREMENT_EVENT", "", ResetGpu),
    xid(157, "RESOURCE_RETIREMENT_FAILURE", "", Ignore),
    xid(158, "GPU_FATAL_TIMEOUT", "", ResetGpu),
    xid(159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "", CheckUvm),
    xid(160, "CHANNEL_RETIREMENT_EVENT", "", RestartBm),
    xid(161, "CHANNEL_RETIREMENT_FAILURE", "", Ignore),
    xid(162, "", "", ResetGpu),
];

/// The catalog's entry for `xid`.
pub fn entry(xid: u32) -> Option<&'static XidEntry> {
    XID_CATALOG
        .binary_search_by_key(&xid, |e| e.xid)
        .ok()
        .map(|i| &XID_CATALOG[i])
}

/// What an Xid the catalog lacks asks for unless `[health] unknown_xid_action` says
/// otherwise: the GPU waits for a person (a reset, an acknowledgement, the driver's
/// recovery action) rather than being handed out on a guess.
pub const UNKNOWN_XID_DEFAULT: Action = Action::GpuReset;

/// How an Xid the catalog lacks is named: "unknown Xid 170".
pub const UNKNOWN_XID: &str = "unknown Xid";

/// The catalog in force: NVIDIA's table with the site's overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    overrides: BTreeMap<u32, Action>,
    unknown: Action,
}

impl Default for Catalog {
    fn default() -> Catalog {
        Catalog {
            overrides: BTreeMap::new(),
            unknown: UNKNOWN_XID_DEFAULT,
        }
    }
}

/// What the catalog in force says of one Xid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidRule {
    pub meaning: String,
    pub action: Action,
    pub workflow: bool,
    /// The site's configuration chose the action.
    pub overridden: bool,
    /// The Xid is in NVIDIA's catalog.
    pub known: bool,
}

impl Catalog {
    /// NVIDIA's table with `overrides` (`[health] xid_actions`) in place of its entries.
    pub fn with_overrides(overrides: BTreeMap<u32, Action>) -> Catalog {
        Catalog {
            overrides,
            ..Catalog::default()
        }
    }

    /// The same catalog, with `action` for the Xids it lacks (`[health]
    /// unknown_xid_action`).
    pub fn unknown_xid_action(self, action: Action) -> Catalog {
        Catalog {
            unknown: action,
            ..self
        }
    }

    /// The rule for `xid`. An Xid the table lacks is `unknown Xid N`, with the site's
    /// action for unknown Xids (by default [`UNKNOWN_XID_DEFAULT`]), unless the site
    /// names it.
    pub fn rule(&self, xid: u32) -> XidRule {
        let known = entry(xid);
        let meaning = known.map_or_else(|| format!("{UNKNOWN_XID} {xid}"), XidEntry::meaning);
        let overridden = self.overrides.get(&xid).copied();
        XidRule {
            meaning,
            action: overridden.unwrap_or(known.map_or(self.unknown, XidEntry::action)),
            workflow: overridden.is_none() && known.is_some_and(|e| e.bucket.workflow()),
            overridden: overridden.is_some(),
            known: known.is_some(),
        }
    }
}

#[cfg(test)]
mod tests;
