//! `gpuctl fleet`: every node's GPU memory, waste and health from the Prometheus that
//! scrapes the watchdogs' textfiles (`model.rs` the queries and rows, `view.rs` the tables
//! and documents, `plan.rs` what to run where, `prometheus.rs` the query API's client).

mod model;
mod plan;
mod prometheus;
mod view;

use std::io::{IsTerminal, Write};

use anyhow::Result;
use gpuctl_core::config::FleetConfig;
use gpuctl_core::exit::Exit;

use crate::render::{self, Style};
use gpuctl::cli::{FleetArgs, FleetBy};
use gpuctl_core::session::{Session, SessionOptions};
use model::By;
use prometheus::{Client, Endpoint, FleetError};

/// `[fleet] concurrency` when neither it nor --concurrency is given.
const DEFAULT_CONCURRENCY: usize = 8;

pub fn run(args: &FleetArgs, style: Style) -> Result<Exit> {
    let config = Session::open_with(&SessionOptions::config_only())?
        .loaded()
        .fleet();
    match fleet(args, &config, &style) {
        Ok(exit) => Ok(exit),
        Err(error) => {
            let message = gpuctl_core::text::escape(&error.to_string()).into_owned();
            let _ = writeln!(std::io::stderr().lock(), "gpuctl: fleet: {message}");
            Ok(error.exit())
        }
    }
}

fn fleet(args: &FleetArgs, config: &FleetConfig, style: &Style) -> Result<Exit, FleetError> {
    if let Some(node) = &args.detail {
        return detail(args, config, node);
    }
    let url = args
        .prometheus
        .clone()
        .or_else(|| config.prometheus.clone())
        .ok_or_else(|| {
            FleetError::Usage(
                "no Prometheus: give --prometheus URL or [fleet] prometheus in gpuctl.toml".into(),
            )
        })?;
    let client = Client::new(&Endpoint {
        url: url.clone(),
        bearer_token_file: args
            .bearer_token_file
            .clone()
            .or(config.bearer_token_file.clone()),
        ca_file: args.ca_file.clone().or(config.ca_file.clone()),
        timeout: args.timeout,
    })?;
    let matcher = model::node_matcher(args.node.as_deref())?;
    if let Some(by) = args.by {
        return holders(args, &client, &url, &matcher, by, style);
    }
    if args.exec || args.plan {
        return plan_and_exec(args, config, &client, &matcher);
    }
    let Some(interval) = args.watch else {
        let nodes = model::nodes(
            &client.query(&model::nodes_query(&matcher))?,
            args.stale_after,
        );
        emit_nodes(args, &url, &nodes, style)?;
        timings(&client);
        return Ok(Exit::Ok);
    };
    let mut out = std::io::stdout().lock();
    loop {
        let frame = match client.query(&model::nodes_query(&matcher)) {
            Ok(samples) => view::nodes_table(&model::nodes(&samples, args.stale_after), style),
            // A Prometheus restarting is a frame that says so, not the end of the watch.
            Err(e) => format!("{}\n", gpuctl_core::text::escape(&e.to_string())),
        };
        let written = if style.terminal {
            write!(out, "\x1b[H{}\x1b[J", frame.replace('\n', "\x1b[K\n"))
        } else {
            writeln!(out, "{frame}")
        };
        if written.and_then(|()| out.flush()).is_err() {
            return Ok(Exit::Ok);
        }
        std::thread::sleep(interval);
    }
}

/// With GPUCTL_TIMINGS set: how many queries were made, on stderr (the benchmark counts).
fn timings(client: &Client) {
    if std::env::var_os("GPUCTL_TIMINGS").is_some_and(|v| !v.is_empty()) {
        eprintln!("gpuctl: timings: {} queries", client.queries.get());
    }
}

fn emit_nodes(
    args: &FleetArgs,
    url: &str,
    nodes: &[model::Node],
    style: &Style,
) -> Result<(), FleetError> {
    let document = view::NodesDocument {
        schema: view::FLEET_SCHEMA,
        prometheus: url,
        timestamp: gpuctl_core::units::unix_seconds(),
        nodes,
    };
    render::emit(args.output.json, &document, || {
        view::nodes_table(nodes, style)
    })
    .map_err(|e| FleetError::Failed(format!("cannot write the output: {e}")))
}

fn holders(
    args: &FleetArgs,
    client: &Client,
    url: &str,
    matcher: &str,
    by: FleetBy,
    style: &Style,
) -> Result<Exit, FleetError> {
    let by = match by {
        FleetBy::User => By::User,
        FleetBy::Owner => By::Owner,
    };
    let rows = model::holders(
        by,
        &client.query(&model::by_query(by, matcher, args.since))?,
    );
    let since = humantime::format_duration(args.since).to_string();
    let document = view::HoldersDocument {
        schema: view::FLEET_SCHEMA,
        prometheus: url,
        timestamp: gpuctl_core::units::unix_seconds(),
        by: by.label(),
        since_seconds: args.since.as_secs(),
        rows: &rows,
    };
    render::emit(args.output.json, &document, || {
        view::holders_table(by, &rows, &since, style)
    })
    .map_err(|e| FleetError::Failed(format!("cannot write the output: {e}")))?;
    timings(client);
    Ok(Exit::Ok)
}

/// `--plan` shows; `--exec` shows, asks (unless --yes), and carries it out.
fn plan_and_exec(
    args: &FleetArgs,
    config: &FleetConfig,
    client: &Client,
    matcher: &str,
) -> Result<Exit, FleetError> {
    let nodes = model::nodes(
        &client.query(&model::nodes_query(matcher))?,
        args.stale_after,
    );
    let plans = plan::plan(&nodes);
    if args.exec && config.exec.is_empty() {
        return Err(FleetError::Usage(
            "--exec needs [fleet] exec in gpuctl.toml: how to run a command on a node, as \
             [\"ssh\", \"{node}\", \"{command}\"]"
                .into(),
        ));
    }
    if args.plan && args.output.json {
        let doc = serde_json::json!({ "schema": view::FLEET_SCHEMA, "plan": plans });
        render::emit(true, &doc, String::new)
            .map_err(|e| FleetError::Failed(format!("cannot write the output: {e}")))?;
        return Ok(Exit::Ok);
    }
    print!("{}", plan::show(&plans, &config.exec));
    let runnable: Vec<plan::NodePlan> = plans
        .into_iter()
        .filter(|p| p.steps.iter().any(|s| !s.command.is_empty()))
        .collect();
    if !args.exec || runnable.is_empty() {
        return Ok(Exit::Ok);
    }
    if !args.yes && !confirm(runnable.len())? {
        println!("Nothing done.");
        return Ok(Exit::Ok);
    }
    let concurrency = args
        .concurrency
        .map(usize::from)
        .or(config.concurrency)
        .unwrap_or(DEFAULT_CONCURRENCY);
    let outcomes = plan::execute(&runnable, &config.exec, concurrency);
    let failed = outcomes.iter().filter(|o| !o.ok).count();
    if failed > 0 {
        return Err(FleetError::Failed(format!(
            "{failed} of {} nodes failed (above)",
            outcomes.len()
        )));
    }
    Ok(Exit::Ok)
}

/// Asks on the terminal; without one, --yes is needed.
fn confirm(nodes: usize) -> Result<bool, FleetError> {
    if !std::io::stdin().is_terminal() {
        return Err(FleetError::Usage(
            "--exec: stdin is not a terminal to confirm on: give --yes to carry the plan out"
                .into(),
        ));
    }
    print!(
        "Carry out this plan on {nodes} node{}? [y/N] ",
        gpuctl_core::units::plural(nodes, "s")
    );
    let _ = std::io::stdout().flush();
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(|e| FleetError::Failed(format!("cannot read the answer: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

fn detail(args: &FleetArgs, config: &FleetConfig, node: &str) -> Result<Exit, FleetError> {
    if config.exec.is_empty() {
        return Err(FleetError::Usage(
            "--detail needs [fleet] exec in gpuctl.toml: how to run a command on a node".into(),
        ));
    }
    if !plan::usable_node_name(node) {
        return Err(FleetError::Usage(format!(
            "--detail: '{node}' is not a node name"
        )));
    }
    let doc = plan::detail(&config.exec, node)?;
    render::emit(args.output.json, &doc, || plan::detail_table(node, &doc))
        .map_err(|e| FleetError::Failed(format!("cannot write the output: {e}")))?;
    Ok(Exit::Ok)
}
