//! `gpuctl reset`: restore card settings a job changed, and clear peak marks.

use anyhow::Result;
use gpuctl_core::cardset::{self, GpuItems, ItemOutcome, ItemResult, ResetItem};
use gpuctl_core::config;
use gpuctl_core::nvml::{self, Gpus, Place};
use gpuctl_core::snapshot::peaks::PeakStore;
use serde::Serialize;

use crate::Exit;
use crate::render::{self, Color, Style};
use gpuctl::cli::ResetArgs;

/// Version of the `reset --json` document.
pub const RESET_SCHEMA: u32 = 1;

#[derive(Serialize)]
struct ResetDocument<'a> {
    schema: u32,
    dry_run: bool,
    gpus: &'a [GpuItems],
}

/// The reset road without its rendering: each GPU's items and how each ended.
pub fn reset(args: &ResetArgs, gpus: &Gpus) -> Result<Vec<GpuItems>> {
    let chosen: Vec<ResetItem> = [
        (args.application_clocks, ResetItem::ApplicationClocks),
        (args.locked_clocks, ResetItem::LockedClocks),
        (args.memory_locked_clocks, ResetItem::MemoryLockedClocks),
        (args.compute_mode, ResetItem::ComputeMode),
        (args.accounting, ResetItem::AccountingPids),
        (args.peaks, ResetItem::PeakMarks),
    ]
    .into_iter()
    .filter_map(|(wanted, item)| wanted.then_some(item))
    .collect();
    let items = if chosen.is_empty() {
        ResetItem::ALL.to_vec()
    } else {
        chosen
    };
    // A MIG instance (`--gpu MIG-...`, `0/9`, as a Slurm epilog passes a job's slice) has no
    // settings of its own: the card's are shared by its other instances' tenants.
    let places = if args.gpus.is_empty() {
        gpus.resolve(&[])?.into_iter().map(Place::whole).collect()
    } else {
        gpus.resolve_places(&args.gpus)?
    };
    let indices: Vec<u32> = places
        .iter()
        .filter(|p| p.gpu_instance.is_none())
        .map(|p| p.gpu)
        .collect();
    let peaks = PeakStore::default_location();
    let mut results = cardset::reset(gpus, &indices, &items, args.dry_run, peaks.as_ref());
    for place in places.iter().filter(|p| p.gpu_instance.is_some()) {
        let why = format!(
            "GPU {}/{} is a MIG instance; card settings and peak marks are the whole GPU's, \
             shared with its other instances (reset --gpu {} for the card; the MIG layout is \
             never changed)",
            place.gpu,
            place.gpu_instance.unwrap_or_default(),
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
    Ok(results)
}

pub fn run(args: &ResetArgs, style: Style) -> Result<Exit> {
    let gpus = Gpus::open_within(nvml::timeout(None, config::load()?.nvml_timeout())?)?;
    let results = reset(args, &gpus)?;
    let failed = results
        .iter()
        .flat_map(|gpu| &gpu.items)
        .any(|item| item.outcome.is_failure());

    let document = ResetDocument {
        schema: RESET_SCHEMA,
        dry_run: args.dry_run,
        gpus: &results,
    };
    render::emit(args.json, &document, || table(&results, &style))?;
    Ok(if failed { Exit::Failed } else { Exit::Ok })
}

fn table(results: &[GpuItems], style: &Style) -> String {
    let mut out = String::new();
    let width = ResetItem::ALL
        .iter()
        .map(|item| item.label().len())
        .max()
        .unwrap_or(0);
    for gpu in results {
        let title = match &gpu.uuid {
            Some(uuid) => format!("GPU {} · {uuid}", gpu.index),
            None => format!("GPU {}", gpu.index),
        };
        out.push_str(&style.paint(Color::Bold, &title));
        out.push('\n');
        // A MIG instance: every item skipped for one reason, said once.
        if let [first, rest @ ..] = gpu.items.as_slice()
            && matches!(first.outcome, ItemOutcome::Skipped { .. })
            && rest.iter().all(|r| r.outcome == first.outcome)
        {
            out.push_str(&format!("  {}\n", first.outcome.label()));
            continue;
        }
        for result in &gpu.items {
            let label = result.outcome.label();
            let label = if result.outcome.is_failure() {
                style.paint(Color::Red, &label)
            } else {
                label
            };
            out.push_str(&format!(
                "  {:width$}  {label}\n",
                result.item.label(),
                width = width
            ));
        }
    }
    out
}
