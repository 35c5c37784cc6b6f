//! `gpuctl health`: one verdict per GPU. Core judges (`gpuctl_core::checkup`); this module
//! opens NVML the way `info` does, renders, and picks the exit status.

use std::io::Write;

use anyhow::Result;
use gpuctl_core::checkup::{self, GpuHealth, HealthDocument};
use gpuctl_core::health::{Action, Cause};
use gpuctl_core::info::{InfoRequest, Survey};
use gpuctl_core::text::escape;

use crate::Exit;
use crate::render::{self, Color, Style};
use gpuctl::cli::HealthArgs;

pub fn run(args: &HealthArgs, style: Style) -> Result<Exit> {
    let document = check(args)?;
    render::emit(args.output.json, &document, || view(&document, &style))?;
    for gpu in document.unread() {
        let _ = writeln!(
            std::io::stderr().lock(),
            "gpuctl: GPU {}: {}",
            gpu.index,
            escape(gpu.error.as_deref().unwrap_or("cannot be read"))
        );
    }
    Ok(if document.needs_action() {
        Exit::NeedsAction
    } else if document.unread().next().is_some() {
        Exit::Failed
    } else {
        Exit::Ok
    })
}

/// Opens NVML as `info` does (its survey reads and judges each GPU's health), after
/// recording `--ack` where asked.
fn check(args: &HealthArgs) -> Result<HealthDocument> {
    // `info` shows the GPUs under a configuration it cannot read; health cannot judge
    // without its Xid actions: the file's one-line error, status 2.
    let mut survey = Survey::open(&InfoRequest {
        gpus: args.gpu.gpus.clone(),
        all_holders: false,
        timeout: args.timeout,
        config_required: true,
    })?;
    let mut snapshot = survey.take()?;
    if !args.ack.is_empty() {
        let session = survey.session();
        let indices = session.gpu_indices(&args.ack)?;
        checkup::acknowledge(Some(session.loaded()), &indices, &snapshot)?;
        snapshot = survey.take()?;
    }
    Ok(checkup::document(&snapshot))
}

fn action_color(action: Action) -> Color {
    match action.for_gpu() {
        Action::None => Color::Green,
        Action::DrainP2p => Color::Yellow,
        _ => Color::Red,
    }
}

/// One line a GPU, then one line a cause.
fn view(document: &HealthDocument, style: &Style) -> String {
    let mut out = String::new();
    for gpu in &document.gpus {
        out.push_str(&gpu_line(gpu, style));
        out.push('\n');
        for cause in &gpu.causes {
            out.push_str(&format!("    {}\n", cause_line(cause, style)));
        }
    }
    out
}

fn gpu_line(gpu: &GpuHealth, style: &Style) -> String {
    let uuid = gpu.uuid.as_deref().unwrap_or("-");
    match gpu.action {
        None => format!(
            "GPU {}  {uuid}  {}",
            gpu.index,
            style.paint(
                Color::Yellow,
                &format!(
                    "unknown: {}",
                    escape(gpu.error.as_deref().unwrap_or("not read"))
                )
            )
        ),
        Some(action) => {
            let mut line = format!(
                "GPU {}  {uuid}  {}",
                gpu.index,
                style.paint(action_color(action), action.name())
            );
            if action != Action::None {
                line.push_str(&format!("  ({})", action.needs()));
            }
            line
        }
    }
}

fn cause_line(cause: &Cause, style: &Style) -> String {
    let kind = serde_json::to_value(cause.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let mut line = format!(
        "{kind} ({}): {}",
        style.paint(action_color(cause.action), cause.action.name()),
        escape(&cause.message)
    );
    if let Some(at) = cause.at_unix {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(at);
        line.push_str(&format!(" at {}", humantime::format_rfc3339_seconds(at)));
    }
    if !cause.processes.is_empty() {
        let on: Vec<String> = cause
            .processes
            .iter()
            .map(|p| escape(&p.to_string()).into_owned())
            .collect();
        line.push_str(&format!("; on the GPU: {}", on.join(", ")));
    }
    line
}
