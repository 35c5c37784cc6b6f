//! `gpuctl kill` and `gpuctl clear`: their arguments mapped onto gpuctl-core's requests,
//! and what the road returns rendered as a table or a JSON document.

use std::io::{self, IsTerminal};
use std::time::Duration;

use anyhow::Result;
use gpuctl_core::classify::Finding;
use gpuctl_core::plan::Outcome;
use gpuctl_core::reclaim::{self, Consent, Session};
use gpuctl_core::report::ReclaimReport;
use gpuctl_core::units;
use gpuctl_core::verify::{GpuState, WaitReport};

use crate::Exit;
use crate::render::{self, Color, Style};
use gpuctl::cli::{ClearArgs, KillArgs};
use gpuctl_core::CoreError;

pub fn run_kill(args: &KillArgs, style: Style) -> Result<Exit> {
    let session = Session::open()?;
    let request = args.request();
    let prepared =
        reclaim::prepare_kill(&session, &request).map_err(|error| error.worded(KillArgs::flag))?;
    let Some(prepared) = prepared else {
        eprintln!("gpuctl: no GPU process matches the selection");
        return Ok(Exit::Ok);
    };
    if !args.yes
        && let Some(consent) = prepared.consent()
    {
        confirm(&consent)?;
    }
    let killed = prepared.run();
    let document = killed.report(&request);
    render::emit(args.output.json, &document, || {
        table(&document, &style, args.plan.dry_run || args.stale)
    })?;
    Ok(if killed.clean() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

pub fn run_clear(args: &ClearArgs, style: Style) -> Result<Exit> {
    let request = args.request();
    let limit = args.wait.unwrap_or_default();
    // As `run --wait` does: say what is waited for, and again whenever that changes.
    let mut waiting = |busy: &[GpuState]| {
        eprintln!(
            "gpuctl clear: waiting up to {} for {}",
            humantime::format_duration(limit),
            busy_places(busy)
        );
    };
    let cleared = reclaim::clear_saying(&Session::open()?, &request, &mut waiting)?;
    let document = cleared.report(&request);
    let wait = &cleared.wait;
    render::emit(args.output.json, &document, || {
        table(&document, &style, true)
    })?;
    Ok(match wait {
        Some(wait) if !wait.met => {
            eprintln!(
                "gpuctl: {}",
                not_free_message(wait, args.wait.unwrap_or_default())
            );
            Exit::NotClean
        }
        _ if cleared.clean() => Exit::Ok,
        _ => Exit::Failed,
    })
}

/// One line naming what still holds memory on each GPU that is not free.
fn not_free_message(wait: &WaitReport, limit: Duration) -> String {
    let busy: Vec<GpuState> = wait.gpus.iter().filter(|g| !g.free).cloned().collect();
    format!(
        "GPUs not free after {}: {}",
        humantime::format_duration(limit),
        busy_places(&busy)
    )
}

/// Each place not free, with what holds its memory: "GPU 0: 4.0 GiB in use by 1 process
/// (pid 812)", joined by "; ".
fn busy_places(busy: &[GpuState]) -> String {
    let busy: Vec<String> = busy
        .iter()
        .map(|g| {
            let used = g.used_bytes.map_or("memory unknown".into(), |b| {
                format!("{} in use", units::bytes(b))
            });
            let place = g.place();
            match g.processes.len() {
                0 => format!("GPU {place}: {used}, held by no process (unattributed)"),
                n => format!(
                    "GPU {place}: {used} by {n} process{} (pid {})",
                    units::plural(n, "es"),
                    g.processes
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        })
        .collect();
    busy.join("; ")
}

/// Several users' processes, or --all, are signalled only after a yes on a terminal.
fn confirm(consent: &Consent) -> Result<()> {
    let users = consent.users.join(", ");
    let why = if consent.all {
        "--all".to_string()
    } else {
        format!("processes of several users ({users})")
    };
    if !(io::stdin().is_terminal() && io::stderr().is_terminal()) {
        return Err(usage(&format!(
            "refusing to signal {why} without --yes (no terminal to confirm on)"
        )));
    }
    eprint!(
        "Send {} to {} process{} of {users}? [y/N] ",
        consent.signal.name(),
        consent.processes,
        units::plural(consent.processes, "es")
    );
    let mut answer = String::new();
    io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(usage("not confirmed; nothing was signalled"))
    }
}

fn usage(message: &str) -> anyhow::Error {
    anyhow::Error::new(CoreError::Usage(message.to_string()))
}

fn table(document: &ReclaimReport, style: &Style, with_reasons: bool) -> String {
    let mut out = String::new();
    let outcomes = document.outcomes;
    if outcomes.is_empty() && document.refused.is_empty() {
        out.push_str(&format!(
            "{}\n",
            style.paint(Color::Dim, "nothing to reclaim")
        ));
    } else if !outcomes.is_empty() {
        outcome_table(&mut out, outcomes, style, with_reasons);
    }
    for refusal in document.refused {
        let reason = render::safe(&refusal.reason);
        out.push_str(&style.paint(Color::Red, &format!("  refused: {reason}")));
        out.push('\n');
    }
    if !document.reported.is_empty() {
        reported_lines(&mut out, &document.reported, style);
    }
    // A wait that ran out is said once, on stderr, with the deadline the user gave
    // (`not_free_message`).
    if let Some(wait) = document.wait.as_ref().filter(|wait| wait.met) {
        out.push_str(&format!(
            "\nselected GPUs {} after {:.1}s\n",
            style.paint(Color::Green, "free"),
            wait.waited_ms as f64 / 1000.0
        ));
    }
    out
}

/// One row per process acted on (or skipped): what came of it, in red where it failed,
/// with the reasons it was chosen under it when asked for.
fn outcome_table(out: &mut String, outcomes: &[Outcome], style: &Style, with_reasons: bool) {
    let rows: Vec<[String; 6]> = outcomes
        .iter()
        .map(|o| {
            let t = &o.target;
            [
                t.pid.to_string(),
                render::safe(&t.owner_name()).into_owned(),
                units::gpu_list(&t.gpus),
                t.used_bytes.map_or("n/a".into(), units::bytes),
                match o.skipped() {
                    Some(reason) => format!("skipped: {}", render::safe(reason)),
                    None => o.summary(),
                },
                render::safe(&t.shown_command()).into_owned(),
            ]
        })
        .collect();
    let headers = ["PID", "USER", "GPU", "MEMORY", "RESULT", "COMMAND"].map(String::from);
    // The command, last, is cut to what room is left rather than padded.
    let widths = render::column_widths(&headers, &rows, 5);
    let line = |cells: &[String; 6]| {
        let fixed = format!(
            "  {}  {}  {}  {}  {}  ",
            render::pad_left(&cells[0], widths[0]),
            render::pad(&cells[1], widths[1]),
            render::pad(&cells[2], widths[2]),
            render::pad_left(&cells[3], widths[3]),
            render::pad(&cells[4], widths[4]),
        );
        let room = style
            .width
            .map(|w| w.saturating_sub(fixed.chars().count()).max(20));
        let command = match room {
            Some(room) => render::cut_middle(&cells[5], room, style.unicode),
            None => cells[5].clone(),
        };
        format!("{fixed}{command}")
    };
    out.push_str(&style.paint(Color::Dim, line(&headers).trim_end()));
    out.push('\n');
    for (row, outcome) in rows.iter().zip(outcomes) {
        let text = line(row);
        let color = if outcome.succeeded() {
            None
        } else {
            Some(Color::Red)
        };
        match color {
            Some(color) => out.push_str(&style.paint(color, text.trim_end())),
            None => out.push_str(text.trim_end()),
        }
        out.push('\n');
        if with_reasons {
            for reason in &outcome.target.reasons {
                let reason = render::safe(reason);
                out.push_str(&format!("         {}\n", style.paint(Color::Dim, &reason)));
            }
        }
    }
}

/// What `clear` found and only reports: each finding's process or GPU, and why.
fn reported_lines(out: &mut String, reported: &[&Finding], style: &Style) {
    out.push_str(&format!(
        "\n{}\n",
        style.paint(Color::Bold, "reported, not acted on:")
    ));
    for finding in reported {
        let gpus = units::gpu_list(&finding.gpus);
        let subject = match finding.identity {
            Some(identity) => format!("pid {} on GPU {gpus}", identity.pid),
            None => format!(
                "GPU {gpus}: {}",
                finding.bytes.map_or("memory".into(), units::bytes)
            ),
        };
        out.push_str(&format!("  {subject}: {}\n", render::safe(&finding.reason)));
    }
}
