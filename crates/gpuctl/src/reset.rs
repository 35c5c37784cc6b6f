//! `gpuctl reset`: restore card settings a job changed, and clear peak marks.

use anyhow::Result;
use gpuctl_core::cardset::{GpuItems, ItemOutcome, ResetItem};
use gpuctl_core::reclaim::{self, Session};

use crate::Exit;
use crate::render::{self, Color, Style};
use gpuctl::cli::ResetArgs;

pub fn run(args: &ResetArgs, style: Style) -> Result<Exit> {
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
