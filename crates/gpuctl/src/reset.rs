//! `gpuctl reset`: restore card settings a job changed, and clear peak marks.

use anyhow::Result;
use gpuctl_core::cardset::{GpuItems, ItemOutcome, ResetItem};
use gpuctl_core::reclaim::{self, GpuResetOutcome, GpuResetRequest, Session};
use gpuctl_core::report::{RESET_SCHEMA, ResetReport};

use crate::Exit;
use crate::render::{self, Color, Style};
use gpuctl::cli::ResetArgs;

pub fn run(args: &ResetArgs, style: Style) -> Result<Exit> {
    if args.gpu_reset {
        return run_gpu_reset(args, style);
    }
    let request = args.request();
    let restored = reclaim::reset(&Session::open()?, &request)?;
    render::emit(args.output.json, &restored.report(&request), || {
        table(&restored.gpus, &style)
    })?;
    Ok(if restored.clean() {
        Exit::Ok
    } else {
        Exit::Failed
    })
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

/// `--gpu-reset`: the GPUs themselves, each done, refused (naming its holders) or failed.
fn run_gpu_reset(args: &ResetArgs, style: Style) -> Result<Exit> {
    let request = GpuResetRequest {
        gpus: args.gpu.gpus.clone(),
        dry_run: args.plan.dry_run,
    };
    let results = reclaim::gpu_reset(&Session::open()?, &request)?;
    let document = ResetReport {
        schema: RESET_SCHEMA,
        dry_run: args.plan.dry_run,
        gpus: &[],
        gpu_reset: Some(&results),
    };
    render::emit(args.output.json, &document, || {
        let mut out = String::new();
        for gpu in &results {
            let title = match &gpu.uuid {
                Some(uuid) => format!("GPU {} · {uuid}", gpu.index),
                None => format!("GPU {}", gpu.index),
            };
            out.push_str(&style.paint(Color::Bold, &title));
            out.push('\n');
            let (text, failed) = match &gpu.outcome {
                GpuResetOutcome::Done { via } => (format!("GPU reset  done ({via})"), false),
                GpuResetOutcome::WouldReset { via } => (
                    format!("GPU reset  would reset: nothing holds it ({via})"),
                    false,
                ),
                GpuResetOutcome::Refused { holders } => (
                    format!("GPU reset  refused: in use by {}", holders.join(", ")),
                    true,
                ),
                GpuResetOutcome::Failed { error } => (format!("GPU reset  failed: {error}"), true),
                GpuResetOutcome::Skipped { why } => (format!("GPU reset  skipped: {why}"), false),
            };
            // Escaped first: holders' command lines are what users chose.
            let text = gpuctl_core::text::escape(&text);
            let line = if failed {
                style.paint(Color::Red, &text)
            } else {
                text.into_owned()
            };
            out.push_str(&format!("  {line}\n"));
        }
        out
    })?;
    Ok(if reclaim::gpu_reset_failed(&results) {
        Exit::Failed
    } else {
        Exit::Ok
    })
}
