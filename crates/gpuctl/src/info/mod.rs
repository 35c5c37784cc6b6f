//! `gpuctl info`: every GPU and every process holding memory on it. gpuctl-core's
//! `info::Survey` gathers (NVML, /proc, peak marks, the watchdog's findings); this module
//! watches, and `table.rs` renders (`processes.rs` its process rows, `idle.rs` the `--idle`
//! view).

mod idle;
mod processes;
mod table;

use std::io::{self, Write};
use std::time::{Duration, Instant};

use anyhow::Result;
use gpuctl_core::Snapshot;
use gpuctl_core::info::{InfoRequest, Survey, document};
use gpuctl_core::snapshot::GpuStatus;
use gpuctl_core::snapshot::totals::By;

use crate::Exit;
use crate::render::{self, Style};
use gpuctl::cli::{GroupBy, InfoArgs};

use table::view;

/// When set (and not empty), `info` says on stderr where its time went: opening NVML, the
/// NVML reads, the /proc reads (and the /proc view's setup), peak marks, rendering.
/// bench/info.py reads it.
const TIMINGS_ENV: &str = "GPUCTL_TIMINGS";

pub fn run(args: &InfoArgs, style: Style) -> Result<Exit> {
    // Gathering is core's (the Python package's snapshot() is the same survey).
    let mut survey = Survey::open(&InfoRequest {
        gpus: args.gpu.gpus.clone(),
        all_holders: args.holders,
        timeout: args.timeout,
        ..InfoRequest::default()
    })?;
    let opened = survey.session().opened();
    let unscanned_above = survey.unscanned_above();
    let mut warned = false;
    let Some(interval) = args.watch else {
        let taking = Instant::now();
        let snapshot = take(&mut survey, &mut warned, args.idle)?;
        let taken = taking.elapsed();
        let rendering = Instant::now();
        let by = group_by(args);
        let watchdog = survey.watchdog_findings();
        render::emit(
            args.output.json,
            &document(&snapshot, by, watchdog.clone()),
            || match args.idle {
                true => idle::idle_view(&snapshot, watchdog.as_ref(), &style),
                false => view(&snapshot, by, watchdog.as_ref(), unscanned_above, &style),
            },
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
        let snapshot = take(&mut survey, &mut warned, args.idle)?;
        let (by, watchdog) = (group_by(args), survey.watchdog_findings());
        if args.output.json {
            let mut line = serde_json::to_string(&document(&snapshot, by, watchdog))?;
            line.push('\n');
            out.write_all(line.as_bytes())?;
        } else if style.terminal {
            // Home, draw over the old frame line by line, then clear what is left below it:
            // no flicker from clearing the whole screen first.
            let frame = match args.idle {
                true => idle::idle_view(&snapshot, watchdog.as_ref(), &style),
                false => view(&snapshot, by, watchdog.as_ref(), unscanned_above, &style),
            }
            .replace('\n', "\x1b[K\n");
            write!(out, "\x1b[H{frame}\x1b[J")?;
        } else {
            let text = match args.idle {
                true => idle::idle_view(&snapshot, watchdog.as_ref(), &style),
                false => view(&snapshot, by, watchdog.as_ref(), unscanned_above, &style),
            };
            writeln!(out, "{text}")?;
        }
        out.flush()?;
        std::thread::sleep(interval);
    }
}

/// A snapshot from `survey`; the peak store's warning said once (`warned`), not every frame
/// of --watch.
fn take(survey: &mut Survey, warned: &mut bool, idle_only: bool) -> Result<Snapshot> {
    let mut snapshot = survey.take()?;
    if idle_only {
        // `--idle`: only the processes the watchdog finds idle.
        for gpu in &mut snapshot.devices {
            gpu.processes.retain(|p| p.idle.is_some());
            for instance in &mut gpu.mig_devices {
                instance.processes.retain(|p| p.idle.is_some());
            }
        }
    }
    if let Some(warning) = survey.peaks_warning()
        && !std::mem::replace(warned, true)
    {
        eprintln!("gpuctl: warning: {}", gpuctl_core::text::escape(&warning));
    }
    Ok(snapshot)
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

fn group_by(args: &InfoArgs) -> Option<By> {
    args.by.map(|by| match by {
        GroupBy::User => By::User,
        GroupBy::Owner => By::Owner,
        GroupBy::Namespace => By::Namespace,
    })
}
