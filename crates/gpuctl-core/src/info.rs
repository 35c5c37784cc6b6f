//! What `gpuctl info` shows, gathered once for every front that shows it (the CLI's `info`
//! and the Python package's `gpuctl.snapshot()`): NVML joined with /proc, protected
//! programs marked, device-file holders named, peak marks, and the `info --json` document.
//! A front opens a [`Survey`] from an [`InfoRequest`], [`Survey::take`]s snapshots, and
//! serializes [`document`]; the same snapshot gives the same document whoever asked.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::classify;
use crate::config::{self, Loaded};
use crate::error::Result;
use crate::nvml::{self, Gpus, Place};
use crate::protect::{self, Protection};
use crate::report::{WatchdogFindings, watchdog_findings_path};
use crate::snapshot::peaks::PeakStore;
use crate::snapshot::totals::{By, Total, totals};
use crate::snapshot::{HolderScan, Snapshot, SnapshotOptions};

/// Version of the `gpuctl info --json` document; fields are only added within a version.
pub const INFO_SCHEMA: u32 = 1;

/// What to show.
#[derive(Debug, Clone, Default)]
pub struct InfoRequest {
    /// GPUs or MIG instances by name; empty: every GPU.
    pub gpus: Vec<String>,
    /// Every device-file holder, not only where memory is unattributed (`--holders`).
    pub all_holders: bool,
    /// The NVML deadline asked for (`--timeout`); else the environment's, the
    /// configuration's, or 10 s.
    pub timeout: Option<Duration>,
}

/// NVML opened and everything a snapshot for `info` needs decided once: taken again and
/// again by `--watch`, or by a Python program.
pub struct Survey {
    /// The configuration, where it can be read: `info` still shows the GPUs with one that
    /// cannot be (`kill` and `clear` refuse to run then).
    pub loaded: Option<Loaded>,
    pub gpus: Gpus,
    places: Option<Vec<Place>>,
    options: SnapshotOptions,
    protection: Protection,
    peaks: Option<PeakStore>,
    /// How long opening NVML took.
    pub opened: Duration,
}

impl Survey {
    pub fn open(request: &InfoRequest) -> Result<Survey> {
        let started = Instant::now();
        let loaded = config::load().ok();
        let configured = loaded.as_ref().and_then(Loaded::nvml_timeout);
        // Checked before NVML is loaded: a refused GPUCTL_DEV_DIR stops the command first.
        let dev_dir = config::device_dir(loaded.as_ref())?;
        let gpus = Gpus::open_within(nvml::timeout(request.timeout, configured)?)?;
        let opened = started.elapsed();
        // MIG instances may be named: their GPU is read, and only those instances shown.
        let places = (!request.gpus.is_empty())
            .then(|| gpus.resolve_places(&request.gpus))
            .transpose()?;
        let options = SnapshotOptions {
            holders: Some(HolderScan {
                dev_dir,
                above_unattributed: (!request.all_holders).then(|| {
                    loaded
                        .as_ref()
                        .and_then(Loaded::holders_threshold)
                        .unwrap_or(config::DEFAULT_HOLDERS_THRESHOLD)
                }),
            }),
            ..SnapshotOptions::info(places.as_deref().map(Place::gpus))
        };
        // The programs `kill`, `clear` and the watchdog never signal.
        let protection = loaded.as_ref().map_or_else(Protection::built_in, |loaded| {
            Protection::configured(&loaded.protect())
        });
        Ok(Survey {
            loaded,
            gpus,
            places,
            options,
            protection,
            peaks: PeakStore::default_location(),
            opened,
        })
    }

    /// One snapshot as `info` shows it (peak marks observed and recorded).
    pub fn take(&self) -> Result<Snapshot> {
        let mut snapshot = Snapshot::take(&self.gpus, &self.options)?;
        if let Some(places) = &self.places {
            keep_named_instances(&mut snapshot, places);
        }
        protect::mark_claims(&mut snapshot, &self.protection);
        classify::holders::annotate(&mut snapshot);
        crate::checkup::Judge::load(self.loaded.as_ref()).annotate(&mut snapshot);
        if let Some(store) = &self.peaks {
            let marks = store.observe(&snapshot);
            for gpu in &mut snapshot.devices {
                gpu.peak = gpu.uuid.as_ref().and_then(|uuid| marks.get(uuid).copied());
            }
        }
        Ok(snapshot)
    }

    /// The peak store's warning that its file is too large, if it is.
    pub fn peaks_warning(&self) -> Option<String> {
        self.peaks.as_ref()?.oversized_warning()
    }

    /// The watchdog's findings, as [`watchdog_findings`] reads them.
    pub fn watchdog_findings(&self) -> Option<WatchdogFindings> {
        watchdog_findings(self.loaded.as_ref())
    }
}

/// The watchdog's findings file in its state directory (the system configuration's
/// `watchdog.state_dir`, else /var/lib/gpuctl), where it exists and can be read.
pub fn watchdog_findings(loaded: Option<&config::Loaded>) -> Option<WatchdogFindings> {
    let dir = config::watchdog_state_dir(loaded)?;
    let bytes = std::fs::read(watchdog_findings_path(&dir)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// On a GPU whose instances were named one by one (and not the GPU whole), only those
/// instances are shown.
fn keep_named_instances(snapshot: &mut Snapshot, places: &[Place]) {
    for gpu in &mut snapshot.devices {
        let whole = places
            .iter()
            .any(|p| p.gpu == gpu.index && p.gpu_instance.is_none());
        if !whole {
            gpu.mig_devices
                .retain(|m| places.iter().any(|p| p.holds(gpu.index, m.gpu_instance_id)));
        }
    }
}

/// The `gpuctl info --json` document.
#[derive(Serialize)]
pub struct InfoDocument<'a> {
    pub schema: u32,
    pub timestamp: String,
    #[serde(flatten)]
    pub snapshot: &'a Snapshot,
    /// With `--by` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub totals: Option<Vec<Total>>,
    /// The watchdog's current findings, where its state directory is readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<WatchdogFindings>,
}

pub fn document(
    snapshot: &Snapshot,
    by: Option<By>,
    watchdog: Option<WatchdogFindings>,
) -> InfoDocument<'_> {
    InfoDocument {
        schema: INFO_SCHEMA,
        timestamp: humantime::format_rfc3339_seconds(snapshot.taken_at).to_string(),
        snapshot,
        totals: by.map(|by| totals(snapshot, by)),
        watchdog,
    }
}
