//! NVIDIA's Xid catalog, as far as gpuctl acts on it: each Xid's meaning and the catalog's
//! immediate action ("Resolution Bucket (Immediate Action)" for Ampere and later GPUs).
//! This table is the only place the mapping lives; a site overrides any entry with
//! `[health] xid_actions` (a [`Catalog`] built from it), so it is never stuck with a
//! hard-coded ignore list.

use std::collections::BTreeMap;

use super::Action;

/// How the catalog says to respond to one Xid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEntry {
    pub xid: u32,
    /// NVIDIA's description, short.
    pub meaning: &'static str,
    pub action: Action,
    /// The catalog's answer is a multi-step workflow: the action here is its first step,
    /// and the state the Xid leaves (a pending row remap, uncorrected ECC errors, another
    /// Xid) decides the rest, as the verdict reads that state on its own.
    pub workflow: bool,
}

const fn entry(xid: u32, meaning: &'static str, action: Action) -> XidEntry {
    XidEntry {
        xid,
        meaning,
        action,
        workflow: false,
    }
}

const fn workflow(xid: u32, meaning: &'static str, action: Action) -> XidEntry {
    XidEntry {
        xid,
        meaning,
        action,
        workflow: true,
    }
}

use Action::{GpuReset, NodeReboot, RestartApp};

/// The catalog's entries for the Xids Ampere and later GPUs raise, by number. CONTACT_SUPPORT
/// and CHECK_MECHANICALS buckets that leave the GPU unusable are a reset here: that is the
/// first thing support asks for.
pub const XID_CATALOG: &[XidEntry] = &[
    entry(8, "GPU stopped processing", RestartApp),
    entry(13, "Graphics Engine Exception", RestartApp),
    entry(31, "GPU memory page fault", RestartApp),
    entry(32, "Invalid or corrupted push buffer stream", RestartApp),
    entry(38, "Driver firmware error", RestartApp),
    entry(
        43,
        "GPU stopped processing (reset channel verification)",
        Action::None,
    ),
    workflow(
        45,
        "Preemptive cleanup, due to previous errors",
        Action::None,
    ),
    workflow(48, "Double Bit ECC Error", Action::None),
    entry(61, "Internal micro-controller breakpoint/warning", GpuReset),
    entry(62, "Internal micro-controller halt", GpuReset),
    entry(
        63,
        "ECC page retirement or row remapping recording event",
        Action::None,
    ),
    entry(
        64,
        "ECC page retirement or row remapper recording failure",
        GpuReset,
    ),
    entry(68, "NVDEC0 Exception", RestartApp),
    entry(69, "Graphics Engine class error", RestartApp),
    entry(74, "NVLINK Error", GpuReset),
    entry(79, "GPU has fallen off the bus", NodeReboot),
    entry(92, "High single-bit ECC error rate", Action::None),
    entry(94, "Contained ECC error", RestartApp),
    entry(95, "Uncontained ECC error", GpuReset),
    entry(109, "Context Switch Timeout Error", GpuReset),
    entry(119, "GSP RPC Timeout", GpuReset),
    entry(120, "GSP Error", GpuReset),
    entry(121, "C2C Link corrected error", Action::None),
    entry(123, "SPI PMU RPC write failure", GpuReset),
    entry(136, "Link training failed", GpuReset),
    entry(140, "Unrecovered ECC Error", GpuReset),
    entry(143, "GPU Initialization Failure", GpuReset),
    entry(
        154,
        "GPU recovery action changed (the recovery action says which)",
        Action::None,
    ),
];

/// The catalog in force: NVIDIA's table with the site's overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    overrides: BTreeMap<u32, Action>,
}

/// What the catalog in force says of one Xid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidRule {
    pub meaning: String,
    pub action: Action,
    pub workflow: bool,
    /// The site's configuration chose the action.
    pub overridden: bool,
}

impl Catalog {
    /// NVIDIA's table with `overrides` (`[health] xid_actions`) in place of its entries.
    pub fn with_overrides(overrides: BTreeMap<u32, Action>) -> Catalog {
        Catalog { overrides }
    }

    /// The rule for `xid`. An Xid the table lacks is listed with action `none` (gpuctl does
    /// not guess), unless the site names it.
    pub fn rule(&self, xid: u32) -> XidRule {
        let known = XID_CATALOG.iter().find(|e| e.xid == xid);
        let meaning = known.map_or_else(
            || "not in gpuctl's Xid catalog: see NVIDIA's".to_string(),
            |e| e.meaning.to_string(),
        );
        match self.overrides.get(&xid) {
            Some(&action) => XidRule {
                meaning,
                action,
                workflow: false,
                overridden: true,
            },
            None => XidRule {
                meaning,
                action: known.map_or(Action::None, |e| e.action),
                workflow: known.is_some_and(|e| e.workflow),
                overridden: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_follows_nvidias_catalog_for_the_xids_it_names() {
        let catalog = Catalog::default();
        for xid in [13, 31, 94] {
            assert_eq!(catalog.rule(xid).action, Action::RestartApp, "Xid {xid}");
        }
        for xid in [43, 63] {
            assert_eq!(catalog.rule(xid).action, Action::None, "Xid {xid}");
        }
        for xid in [64, 95, 109, 119, 120] {
            assert_eq!(catalog.rule(xid).action, Action::GpuReset, "Xid {xid}");
        }
        assert_eq!(catalog.rule(79).action, Action::NodeReboot);
        for xid in [45, 48] {
            assert!(catalog.rule(xid).workflow, "Xid {xid}");
        }
        assert_eq!(catalog.rule(79).meaning, "GPU has fallen off the bus");
    }

    #[test]
    fn the_table_names_each_xid_once_in_order() {
        for pair in XID_CATALOG.windows(2) {
            assert!(
                pair[0].xid < pair[1].xid,
                "{} then {}",
                pair[0].xid,
                pair[1].xid
            );
        }
    }

    #[test]
    fn unknown_xids_hold_no_action_and_say_so() {
        let rule = Catalog::default().rule(999);
        assert_eq!(rule.action, Action::None);
        assert!(rule.meaning.contains("not in gpuctl's Xid catalog"));
    }

    #[test]
    fn a_site_override_replaces_the_catalogs_action() {
        let catalog = Catalog::with_overrides(BTreeMap::from([
            (109, Action::None),
            (43, Action::GpuReset),
            (500, Action::DrainP2p),
        ]));
        assert_eq!(catalog.rule(109).action, Action::None);
        assert!(catalog.rule(109).overridden);
        assert_eq!(catalog.rule(43).action, Action::GpuReset);
        assert_eq!(catalog.rule(500).action, Action::DrainP2p);
        assert!(!catalog.rule(48).overridden);
        assert_eq!(catalog.rule(48).meaning, "Double Bit ECC Error");
    }
}
