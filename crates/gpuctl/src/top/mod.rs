//! `gpuctl top`: the interactive view. `model` holds what is shown and where the user is,
//! `keys` turns keys and clicks into changes, `view` draws, `kill` is the `k` flow on the
//! core road, `screen` takes the terminal and gives it back on every way out. This loop
//! reads the GPUs every interval and waits for input in between.
//!
//! A refresh rereads NVML and, for each process, only its /proc stat: the facts of a process
//! seen before with the same start time (command, user, cgroup owner) come from the core's
//! [`FactCache`], so a refresh costs less than one `gpuctl info`.

mod keys;
mod kill;
mod model;
mod screen;
mod view;

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossterm::event;
use gpuctl_core::host::FactCache;
use gpuctl_core::reclaim::PreparedKill;
use gpuctl_core::session::{Reader, Session, SessionOptions};
use gpuctl_core::snapshot::{HolderScan, Snapshot, SnapshotOptions};

use crate::Exit;
use crate::render::Style;
use gpuctl::cli::TopArgs;
use gpuctl_core::CoreError;
use keys::{Action, TableArea};
use model::{Model, Panel};
use screen::Screen;
use view::Palette;

/// The longest a refresh waits for one GPU: a GPU that has not answered by then is shown as
/// not answering, and later refreshes do not wait for it until it answers again.
const GPU_DEADLINE: Duration = Duration::from_secs(2);

/// How often the loop looks for an ending signal while it waits for input.
const SIGNAL_CHECK: Duration = Duration::from_millis(250);

pub fn run(args: &TopArgs, style: Style) -> Result<Exit> {
    if !std::io::stdout().is_terminal() {
        return Err(CoreError::Usage(
            "top needs a terminal on stdout; for scripts and pipes use `gpuctl info --watch \
             SECONDS` or `gpuctl info --json`"
                .into(),
        )
        .into());
    }
    // The view ends processes: it reads the configuration as `kill` does, and refuses one
    // it cannot read.
    let session = Session::open_with(&SessionOptions {
        at_most: Some(GPU_DEADLINE),
        holders: true,
        ..SessionOptions::default()
    })?;
    // An unknown GPU is refused before the screen is taken.
    let places = session.places(&args.gpu.gpus)?;
    let palette = Palette {
        color: style.color,
        unicode: style.unicode,
    };
    let mut reader = Refresher {
        holders: session.holder_scan(true)?,
        // Every refresh rereads each known process's stat (state, age); the rest is kept
        // while its start time is the same.
        reader: session
            .reader(SnapshotOptions::info(None))
            .showing_leases()
            .places(places)
            .keeping_facts(FactCache::refreshing_every(Duration::ZERO))
            .host_only()
            // Each GPU's health verdict, marked on its line when it needs an action.
            .judging_health(session.loaded()),
        session: &session,
    };
    let mut screen = Screen::enter().context("cannot take over the terminal")?;
    let outcome = run_loop(&mut screen, &mut reader, args.interval, palette);
    match screen.signalled() {
        Some(signal) => screen.end_by(signal),
        None => {
            drop(screen);
            outcome
        }
    }
}

/// What each refresh reads, and how.
struct Refresher<'s> {
    session: &'s Session,
    reader: Reader,
    holders: HolderScan,
}

impl Refresher<'_> {
    fn read(&mut self, holders: bool) -> Result<Snapshot> {
        // The device-file scan reads every process's descriptors: only while its panel is
        // open.
        self.reader
            .set_holders(holders.then(|| self.holders.clone()));
        // Marked as `info` marks it: what `clear` would reclaim, by its rules.
        Ok(gpuctl_core::info::take_marking_reclaimable(
            &mut self.reader,
            self.session.gpus()?,
        )?)
    }

    /// Reads the GPUs (and the holders, while their panel is open) and the watchdog's
    /// findings into `model`.
    fn refresh(&mut self, model: &mut Model) -> Result<()> {
        let holders = matches!(model.panel, Panel::Holders(_));
        let mut snapshot = self.read(holders)?;
        let watchdog = gpuctl_core::info::watchdog_findings(Some(self.session.loaded()));
        if let Some(findings) = &watchdog {
            gpuctl_core::info::mark_idle(&mut snapshot, findings);
        }
        model.update(snapshot, watchdog);
        Ok(())
    }
}

/// The kill of the chosen processes, ready to carry out once its plan (now in a panel) is
/// confirmed; none, with the reason in the status line, when nothing can be ended.
fn prepare_kill<'s>(model: &mut Model, session: &'s Session) -> Result<Option<PreparedKill<'s>>> {
    let chosen = model.chosen();
    if chosen.is_empty() {
        model.status = Some("no process under the cursor".into());
        return Ok(None);
    }
    let (prepared, plan) = kill::prepare(session, &chosen)?;
    match prepared {
        Some(_) => model.panel = Panel::Confirm(plan),
        None => model.status = plan.into_iter().next(),
    }
    Ok(prepared)
}

fn run_loop(
    screen: &mut Screen,
    reader: &mut Refresher<'_>,
    interval: Duration,
    palette: Palette,
) -> Result<Exit> {
    let session = reader.session;
    let root = nix::unistd::geteuid().is_root();
    let mut model = Model::new(root, nix::unistd::getuid().as_raw());
    model.places = reader.reader.named_places().map(<[_]>::to_vec);
    let every = humantime::format_duration(interval).to_string();
    let mut pending: Option<PreparedKill<'_>> = None;
    let mut area = TableArea::default();
    let mut next_read = Instant::now();
    let mut dirty = true;
    loop {
        if screen.signalled().is_some() {
            return Ok(Exit::Ok);
        }
        if screen::hung_up() {
            // The terminal is gone (its window closed, the ssh session dropped) and no
            // SIGHUP came to say so: end as SIGHUP would have, rather than read nothing forever.
            screen.hang_up();
            return Ok(Exit::Ok);
        }
        if Instant::now() >= next_read {
            reader.refresh(&mut model)?;
            next_read = Instant::now() + interval;
            dirty = true;
        }
        if dirty {
            screen
                .terminal
                .draw(|frame| area = view::draw(frame, &mut model, palette, &every).table)?;
            dirty = false;
        }
        let wait = next_read
            .saturating_duration_since(Instant::now())
            .min(SIGNAL_CHECK);
        if !event::poll(wait)? {
            continue;
        }
        let input = event::read()?;
        match keys::handle(&mut model, &input, area) {
            Action::Nothing => {}
            Action::Redraw => dirty = true,
            Action::Refresh => next_read = Instant::now(),
            Action::Quit => return Ok(Exit::Ok),
            Action::PrepareKill => {
                if let Some(prepared) = prepare_kill(&mut model, session)? {
                    pending = Some(prepared);
                }
                dirty = true;
            }
            Action::Confirm => {
                model.panel = Panel::None;
                if let Some(prepared) = pending.take() {
                    model.status = Some("ending…".into());
                    screen.terminal.draw(|frame| {
                        area = view::draw(frame, &mut model, palette, &every).table
                    })?;
                    model.status = Some(kill::carry_out(prepared));
                    model.marked.clear();
                }
                next_read = Instant::now();
            }
            Action::Cancel => {
                pending = None;
                model.panel = Panel::None;
                model.status = Some("nothing ended".into());
                dirty = true;
            }
        }
    }
}
