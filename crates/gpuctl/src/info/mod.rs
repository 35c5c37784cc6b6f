//! `gpuctl info`: every GPU and every process holding memory on it. This module gathers
//! (NVML, /proc, peak marks, the watchdog's findings) and watches; `table.rs` renders.

mod table;

use std::io::{self, Write};
use std::time::{Duration, Instant};

use anyhow::Result;
use gpuctl_core::classify;
use gpuctl_core::config;
use gpuctl_core::nvml::{self, Gpus, Place};
use gpuctl_core::protect::{self, Protection};
use gpuctl_core::report::{WatchdogFindings, watchdog_findings_path};
use gpuctl_core::snapshot::peaks::PeakStore;
use gpuctl_core::snapshot::totals::{By, Total, totals};
use gpuctl_core::snapshot::{GpuStatus, HolderScan};
use gpuctl_core::{Snapshot, SnapshotOptions};
use serde::Serialize;

use crate::Exit;
use crate::render::{self, Style};
use gpuctl::cli::{GroupBy, InfoArgs};

use table::view;

/// When set (and not empty), `info` says on stderr where its time went: opening NVML, the
/// NVML reads, the /proc reads (and the /proc view's setup), peak marks, rendering.
/// bench/info.py reads it.
const TIMINGS_ENV: &str = "GPUCTL_TIMINGS";

/// Version of the `gpuctl info --json` document; fields are only added within a version.
pub const INFO_SCHEMA: u32 = 1;

#[derive(Serialize)]
struct InfoDocument<'a> {
    schema: u32,
    timestamp: String,
    #[serde(flatten)]
    snapshot: &'a Snapshot,
    /// With `--by` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    totals: Option<Vec<Total>>,
    /// The watchdog's current findings, where its state directory is readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    watchdog: Option<WatchdogFindings>,
}

pub fn run(args: &InfoArgs, style: Style) -> Result<Exit> {
    let started = Instant::now();
    let loaded = readable_config();
    let configured = loaded.as_ref().and_then(config::Loaded::nvml_timeout);
    // Checked before NVML is loaded: a refused GPUCTL_DEV_DIR stops the command first.
    let dev_dir = config::device_dir(loaded.as_ref())?;
    let gpus = Gpus::open_within(nvml::timeout(args.timeout, configured)?)?;
    let opened = started.elapsed();
    // `--gpu` may name MIG instances: their GPU is read, and only those instances shown.
    let places = (!args.gpu.gpus.is_empty())
        .then(|| gpus.resolve_places(&args.gpu.gpus))
        .transpose()?;
    let options = SnapshotOptions {
        holders: Some(HolderScan {
            dev_dir,
            above_unattributed: (!args.holders).then(|| {
                loaded
                    .as_ref()
                    .and_then(config::Loaded::holders_threshold)
                    .unwrap_or(config::DEFAULT_HOLDERS_THRESHOLD)
            }),
        }),
        ..SnapshotOptions::info(places.as_deref().map(Place::gpus))
    };
    let peaks = PeakStore::default_location();
    // The programs `kill`, `clear` and the watchdog never signal.
    let protection = loaded.as_ref().map_or_else(Protection::built_in, |loaded| {
        Protection::configured(&loaded.protect())
    });
    let warned = std::cell::Cell::new(false);
    let take = || -> Result<Snapshot> {
        let mut snapshot = Snapshot::take(&gpus, &options)?;
        if let Some(places) = &places {
            keep_named_instances(&mut snapshot, places);
        }
        protect::mark_claims(&mut snapshot, &protection);
        classify::holders::annotate(&mut snapshot);
        if let Some(store) = &peaks {
            let marks = store.observe(&snapshot);
            // Once, not every frame of --watch.
            if let Some(warning) = store.oversized_warning()
                && !warned.replace(true)
            {
                eprintln!("gpuctl: warning: {}", gpuctl_core::text::escape(&warning));
            }
            for gpu in &mut snapshot.devices {
                gpu.peak = gpu.uuid.as_ref().and_then(|uuid| marks.get(uuid).copied());
            }
        }
        Ok(snapshot)
    };
    let Some(interval) = args.watch else {
        let taking = Instant::now();
        let snapshot = take()?;
        let taken = taking.elapsed();
        let rendering = Instant::now();
        let by = group_by(args);
        let watchdog = watchdog_findings(loaded.as_ref());
        render::emit(
            args.output.json,
            &document(&snapshot, by, watchdog.clone()),
            || view(&snapshot, by, watchdog.as_ref(), &style),
        )?;
        if std::env::var_os(TIMINGS_ENV).is_some_and(|v| !v.is_empty()) {
            let reads = snapshot.read_times;
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            // The device-file scan is named only when it ran.
            let holders = reads
                .holders
                .map(|took| format!("holders {:.3} ms, ", ms(took)))
                .unwrap_or_default();
            eprintln!(
                "gpuctl: timings: open {:.3} ms, nvml {:.3} ms, proc {:.3} ms, {holders}\
                 peaks {:.3} ms, render {:.3} ms",
                ms(opened),
                ms(reads.nvml),
                ms(reads.host),
                ms(taken
                    .saturating_sub(reads.nvml + reads.host + reads.holders.unwrap_or_default())),
                ms(rendering.elapsed()),
            );
        }
        return Ok(failed_gpus(&snapshot));
    };
    let mut out = io::stdout().lock();
    loop {
        let snapshot = take()?;
        let (by, watchdog) = (group_by(args), watchdog_findings(loaded.as_ref()));
        if args.output.json {
            let mut line = serde_json::to_string(&document(&snapshot, by, watchdog))?;
            line.push('\n');
            out.write_all(line.as_bytes())?;
        } else if style.terminal {
            // Home, draw over the old frame line by line, then clear what is left below it:
            // no flicker from clearing the whole screen first.
            let frame = view(&snapshot, by, watchdog.as_ref(), &style).replace('\n', "\x1b[K\n");
            write!(out, "\x1b[H{frame}\x1b[J")?;
        } else {
            writeln!(out, "{}", view(&snapshot, by, watchdog.as_ref(), &style))?;
        }
        out.flush()?;
        std::thread::sleep(interval);
    }
}

/// The report is complete for the healthy GPUs; each GPU that could not be read is named on
/// stderr and makes the status 1, so health checks notice.
fn failed_gpus(snapshot: &Snapshot) -> Exit {
    let mut exit = Exit::Ok;
    for gpu in snapshot
        .devices
        .iter()
        .filter(|gpu| gpu.status != GpuStatus::Ok)
    {
        let _ = writeln!(
            io::stderr().lock(),
            "gpuctl: GPU {}: {}",
            gpu.index,
            gpuctl_core::text::escape(gpu.error.as_deref().unwrap_or("cannot be read"))
        );
        exit = Exit::Failed;
    }
    exit
}

/// The configuration, where it can be read: `info` takes its `nvml_timeout` and `[protect]`
/// commands from it, and still shows the GPUs with one that cannot be read (`kill` and
/// `clear` refuse to run then).
fn readable_config() -> Option<config::Loaded> {
    config::load().ok()
}

/// On a GPU whose instances `--gpu` named one by one (and not the GPU whole), only those
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

fn group_by(args: &InfoArgs) -> Option<By> {
    args.by.map(|by| match by {
        GroupBy::User => By::User,
        GroupBy::Owner => By::Owner,
    })
}

fn document(
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

/// The watchdog's findings file in its state directory (the system configuration's
/// `watchdog.state_dir`, else /var/lib/gpuctl), where it exists and can be read.
pub(crate) fn watchdog_findings(loaded: Option<&config::Loaded>) -> Option<WatchdogFindings> {
    let dir = config::watchdog_state_dir(loaded)?;
    let bytes = std::fs::read(watchdog_findings_path(&dir)).ok()?;
    serde_json::from_slice(&bytes).ok()
}
