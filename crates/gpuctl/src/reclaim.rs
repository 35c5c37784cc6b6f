//! `gpuctl kill` and `gpuctl clear`: the CLI faces of gpuctl-core's reclaim road.

use std::collections::BTreeSet;
use std::io::{self, IsTerminal};
use std::time::Duration;

use anyhow::Result;
use gpuctl_core::act::Escalation;
use gpuctl_core::classify::{self, Finding, Policy, Remedy, Verdict};
use gpuctl_core::config;
use gpuctl_core::host::ProcView;
use gpuctl_core::nvml::{self, Gpus, Place};
use gpuctl_core::plan::{Guard, Outcome};
use gpuctl_core::protect::{self, Protection};
use gpuctl_core::reclaim::Reclaim;
use gpuctl_core::report::{RECLAIM_SCHEMA, ReclaimReport};
use gpuctl_core::select::{self, Criterion, Refusal, Selector, Target};
use gpuctl_core::snapshot::HolderScan;
use gpuctl_core::units;
use gpuctl_core::verify::{self, WaitReport};
use gpuctl_core::{CoreError, Snapshot, SnapshotOptions};

use crate::render::{self, Color, Style};
use crate::{Exit, Usage};
use gpuctl::cli::{ClearArgs, KillArgs, SignalArgs};

/// Per-process utilization is read over this window: activity in it is evidence of life.
const ACTIVITY_WINDOW: Duration = Duration::from_secs(10);

/// What the reclaim road reads before it looks: the configuration, and NVML with every
/// per-GPU call bounded by the timeout in force (GPUCTL_NVML_TIMEOUT, the configuration's
/// nvml_timeout, 10 s). Opened once per command, whatever walks the road after.
pub struct Session {
    pub loaded: config::Loaded,
    pub gpus: Gpus,
}

impl Session {
    pub fn open() -> Result<Session> {
        Session::with(config::load()?)
    }

    /// NVML opened under the configuration already read.
    pub fn with(loaded: config::Loaded) -> Result<Session> {
        let gpus = Gpus::open_within(nvml::timeout(None, loaded.nvml_timeout())?)?;
        Ok(Session { loaded, gpus })
    }
}

/// The GPUs and MIG instances `--gpu` names; `None` without `--gpu`.
fn resolve_places(gpus: &Gpus, wanted: &[String]) -> Result<Option<Vec<Place>>, CoreError> {
    (!wanted.is_empty())
        .then(|| gpus.resolve_places(wanted))
        .transpose()
}

/// A snapshot with the evidence classification needs, and its findings. `holders`: also
/// scan for device-file holders NVML does not list (`clear --holders`).
fn classified(
    gpus: &Gpus,
    policy: &Policy,
    holders: Option<HolderScan>,
    protection: &Protection,
) -> Result<(Snapshot, Vec<Finding>)> {
    let view = ProcView::system()?;
    let mut snapshot = Snapshot::take_with(
        gpus,
        &view,
        &SnapshotOptions {
            gpus: None,
            utilization_window: Some(ACTIVITY_WINDOW),
            only_memory_and_processes: false,
            activity: false,
            holders,
        },
    )?;
    // Holders that are protected programs are tools, not suspects.
    if snapshot.devices.iter().any(|gpu| gpu.holders.is_some()) {
        protect::mark_claims(&mut snapshot, protection);
    }
    let lineages = snapshot.lineages(&view);
    let findings = classify::classify(&snapshot, &lineages, None, policy);
    Ok((snapshot, findings))
}

/// The road from the plan on: guarded, signalled with `how` (unless a dry run), verified.
fn reclaim(
    gpus: &Gpus,
    guard: &Guard,
    how: &SignalArgs,
    dry_run: bool,
    snapshot: &Snapshot,
    targets: Vec<Target>,
) -> Vec<Outcome> {
    Reclaim {
        gpus,
        guard,
        how: Escalation::then_kill(how.signal, how.timeout),
        verify_for: how.timeout,
        dry_run,
    }
    .run(snapshot, targets)
}

/// What `gpuctl kill` did: the road's outcome for each target, and the pids it refused.
pub struct Killed {
    pub outcomes: Vec<Outcome>,
    pub refused: Vec<Refusal>,
}

/// The kill road without its rendering: select, confirm (unless `--yes` or a dry run),
/// signal, verify. `None` when no GPU process matches the selection.
pub fn kill(args: &KillArgs, session: &Session) -> Result<Option<Killed>> {
    let Session { loaded, gpus } = session;
    let mut criteria = Vec::new();
    if let Some(places) = resolve_places(gpus, &args.gpus)? {
        criteria.push(Criterion::Gpus(places));
    }
    if !args.pids.is_empty() {
        criteria.push(Criterion::Pids(args.pids.clone()));
    }
    if !args.users.is_empty() {
        criteria.push(Criterion::Uids(args.users.clone()));
    }
    if !args.owners.is_empty() {
        criteria.push(Criterion::Owners(args.owners.clone()));
    }
    if args.stale {
        criteria.push(Criterion::Stale);
    }
    if let Some(min) = args.min_mem {
        criteria.push(Criterion::MinBytes(min));
    }
    if let Some(age) = args.older_than {
        criteria.push(Criterion::OlderThan(age));
    }
    if args.all {
        criteria.push(Criterion::All);
    }
    let selector = Selector::all_of(criteria).map_err(|_| {
        usage(
            "no process selected: give --pid, --gpu, --user, --owner, --stale, --min-mem, \
             --older-than or --all",
        )
    })?;
    // An explicit kill is the admin's call: only protected commands are spared, not users.
    let protection = Protection::configured(&loaded.protect()).programs_only();
    let (snapshot, findings) = classified(gpus, &Policy::default(), None, &protection)?;
    let (targets, refused) = select::select(&snapshot, &findings, &selector);
    let guard = Guard::for_this_process(protection);

    if targets.is_empty() && refused.is_empty() {
        return Ok(None);
    }
    if !args.dry_run && !args.yes {
        confirm(&targets, &guard, selector.is_all(), &args.how)?;
    }
    let outcomes = reclaim(gpus, &guard, &args.how, args.dry_run, &snapshot, targets);
    Ok(Some(Killed { outcomes, refused }))
}

pub fn run_kill(args: &KillArgs, style: Style) -> Result<Exit> {
    let Some(Killed { outcomes, refused }) = kill(args, &Session::open()?)? else {
        eprintln!("gpuctl: no GPU process matches the selection");
        return Ok(Exit::Ok);
    };
    let ok = outcomes.iter().all(Outcome::succeeded) && refused.is_empty();
    let document = ReclaimReport {
        schema: RECLAIM_SCHEMA,
        command: "kill",
        dry_run: args.dry_run,
        signal: args.how.signal.name(),
        timeout_ms: args.how.timeout.as_millis() as u64,
        outcomes: &outcomes,
        refused: &refused,
        reported: Vec::new(),
        wait: None,
    };
    render::emit(args.json, &document, || {
        table(&document, &style, args.dry_run || args.stale)
    })?;
    Ok(if ok { Exit::Ok } else { Exit::Failed })
}

/// What `gpuctl clear` did: the road's outcome for each leftover, what it only reported, and
/// with `--wait`, how the wait ended.
pub struct Cleared {
    pub outcomes: Vec<Outcome>,
    pub reported: Vec<Finding>,
    pub wait: Option<WaitReport>,
}

/// The clear road without its rendering.
pub fn clear(args: &ClearArgs, session: &Session) -> Result<Cleared> {
    let Session { loaded, gpus } = session;
    let places = resolve_places(gpus, &args.gpus)?;
    let policy = Policy {
        include_stopped: args.include_stopped,
        ..Policy::default()
    };
    let protection = Protection::configured(&loaded.protect());
    let holders = args.holders.then(|| HolderScan {
        dev_dir: config::device_dir(Some(loaded)),
        above_unattributed: None,
    });
    let (snapshot, findings) = classified(gpus, &policy, holders, &protection)?;
    let guard = Guard::for_this_process(protection);
    // Leftovers of dead runs; clear enforces no policy.
    let leftovers: Vec<Finding> = findings
        .iter()
        .filter(|f| f.kind.remedy() == Remedy::Reclaim)
        .cloned()
        .collect();
    let mut targets = select::from_findings(&snapshot, &leftovers, places.as_deref());
    // Only root reclaims other users' leftovers; the caller's others are reported.
    let others = guard.keep_callers_own(&mut targets, &findings);
    let targeted: BTreeSet<u32> = targets.iter().map(|t| t.pid).collect();
    let on_selected = |finding: &&Finding| {
        places
            .as_deref()
            .is_none_or(|places| select::concerns(&snapshot, finding, places))
    };
    let reported: Vec<Finding> = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Report)
        .chain(others.iter())
        .filter(on_selected)
        .filter(|f| !f.identity.is_some_and(|i| targeted.contains(&i.pid)))
        .cloned()
        .collect();

    let outcomes = reclaim(gpus, &guard, &args.how, args.dry_run, &snapshot, targets);
    let wait = match (args.wait, args.dry_run) {
        (Some(limit), false) => Some(verify::wait_until_free(
            gpus,
            places.as_deref(),
            limit,
            args.min_free,
        )?),
        _ => None,
    };
    Ok(Cleared {
        outcomes,
        reported,
        wait,
    })
}

pub fn run_clear(args: &ClearArgs, style: Style) -> Result<Exit> {
    let Cleared {
        outcomes,
        reported,
        wait,
    } = clear(args, &Session::open()?)?;
    let reclaimed_ok = outcomes.iter().all(Outcome::succeeded);
    let document = ReclaimReport {
        schema: RECLAIM_SCHEMA,
        command: "clear",
        dry_run: args.dry_run,
        signal: args.how.signal.name(),
        timeout_ms: args.how.timeout.as_millis() as u64,
        outcomes: &outcomes,
        refused: &[],
        reported: reported.iter().collect(),
        wait: wait.clone(),
    };
    render::emit(args.json, &document, || table(&document, &style, true))?;
    Ok(match wait {
        Some(wait) if !wait.met => {
            eprintln!(
                "gpuctl: {}",
                not_free_message(&wait, args.wait.unwrap_or_default())
            );
            Exit::NotClean
        }
        Some(_) => Exit::Ok,
        None if reclaimed_ok => Exit::Ok,
        None => Exit::Failed,
    })
}

/// One line naming what still holds memory on each GPU that is not free.
fn not_free_message(wait: &WaitReport, limit: Duration) -> String {
    let busy: Vec<String> = wait
        .gpus
        .iter()
        .filter(|g| !g.free)
        .map(|g| {
            let used = g.used_bytes.map_or("memory unknown".into(), |b| {
                format!("{} in use", units::bytes(b))
            });
            let place = match g.gpu_instance {
                Some(gi) => format!("{}/{gi}", g.index),
                None => g.index.to_string(),
            };
            match g.processes.len() {
                0 => format!("GPU {place}: {used}, held by no process (unattributed)"),
                n => format!(
                    "GPU {place}: {used} by {n} process{} (pid {})",
                    if n == 1 { "" } else { "es" },
                    g.processes
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        })
        .collect();
    format!(
        "GPUs not free after {}: {}",
        humantime::format_duration(limit),
        busy.join("; ")
    )
}

/// Several users' processes, or --all, are signalled only after a yes on a terminal.
fn confirm(targets: &[Target], guard: &Guard, all: bool, how: &SignalArgs) -> Result<()> {
    let acting: Vec<&Target> = targets
        .iter()
        .filter(|t| guard.check(t).is_none())
        .collect();
    let users: BTreeSet<String> = acting.iter().map(|t| t.owner_name()).collect();
    if acting.is_empty() || (!all && users.len() <= 1) {
        return Ok(());
    }
    let users = users.into_iter().collect::<Vec<_>>().join(", ");
    let why = if all {
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
        how.signal.name(),
        acting.len(),
        if acting.len() == 1 { "" } else { "es" }
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
    anyhow::Error::new(Usage(message.to_string()))
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
        let rows: Vec<[String; 6]> = outcomes
            .iter()
            .map(|o| {
                let t = &o.target;
                [
                    t.pid.to_string(),
                    render::safe(&t.owner_name()).into_owned(),
                    t.gpus
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                    t.used_bytes.map_or("n/a".into(), units::bytes),
                    match &o.skipped {
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
                Some(room) => render::cut(&cells[5], room, style.unicode),
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
    for refusal in document.refused {
        let reason = render::safe(&refusal.reason);
        out.push_str(&style.paint(Color::Red, &format!("  refused: {reason}")));
        out.push('\n');
    }
    if !document.reported.is_empty() {
        out.push_str(&format!(
            "\n{}\n",
            style.paint(Color::Bold, "reported, not acted on:")
        ));
        for finding in &document.reported {
            let gpus = finding
                .gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
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
    if let Some(wait) = &document.wait {
        let verdict = if wait.met {
            style.paint(Color::Green, "free")
        } else {
            style.paint(Color::Red, "not free")
        };
        out.push_str(&format!(
            "\nselected GPUs {verdict} after {:.1}s\n",
            wait.waited_ms as f64 / 1000.0
        ));
    }
    out
}
