//! `gpuctl fleet` against the real thing: four named nodes (nvml-sim, a watchdog, a node
//! exporter each; Prometheus relabels each instance to `nodeN`), one with the orphans of a
//! crashed run, one with memory no process accounts for. Its rows are held to each node's
//! `gpuctl info --json`; `--exec` through a template that runs each node's commands under
//! that node's scenario reclaims the orphans; a node whose exporter stops and one whose
//! watchdog stops are listed as such, never as clean.
//!
//! The trials run in the order `main` lists them: the last two change the fleet.

use std::process::Command;

use serde_json::Value;

use crate::fleet::{Fleet, Held, Layout, NOBODY, write_root_file};
use crate::util::{GIB, Gpu, Proc, Process, Scenario, TrainingRun, gpuctl_bin, sim_lib};

/// Node 1's crashed run: two workers of 3 GiB each on GPU 0.
const ORPHANS: u64 = 6 * GIB;
/// Node 2's memory that no process accounts for.
const UNATTRIBUTED: u64 = GIB;

pub const LAYOUT: Layout = Layout {
    nodes: 4,
    nvml_nodes: 4,
    populate,
    named: true,
};

fn populate(number: usize) -> (Scenario, Vec<Held>) {
    let root = |args: &[&str]| Proc::spawn_ready("sleep", "python3", args);
    match number {
        1 => {
            let mut run = TrainingRun::start(2, "sleep", "python3", &["train.py"]);
            run.crash();
            let job =
                Proc::spawn_as_with_env(NOBODY, "sleep", &["job.sh"], &[("SLURM_JOB_ID", "812")]);
            let scenario = Scenario::new()
                .gpus(2, Gpu::h200())
                .process(Process::new(run.workers.pids[0]).on(0).used(3 * GIB))
                .process(Process::new(run.workers.pids[1]).on(0).used(3 * GIB))
                .process(Process::new(job.pid()).on(1).used(2 * GIB));
            (scenario, vec![Box::new(run), Box::new(job)])
        }
        2 => {
            let serve = Proc::spawn_as(NOBODY, "sleep", &["serve.py"]);
            let scenario = Scenario::new()
                .gpu(Gpu::h200().leaked(UNATTRIBUTED))
                .gpu(Gpu::h200())
                .process(Process::new(serve.pid()).on(1).used(4 * GIB));
            (scenario, vec![Box::new(serve)])
        }
        _ => {
            let eval = root(&["eval.py"]);
            let scenario = Scenario::new()
                .gpu(Gpu::h200())
                .process(Process::new(eval.pid()).on(0).used(GIB));
            (scenario, vec![Box::new(eval)])
        }
    }
}

/// The exec template of the test: each node's commands run here, under its own scenario.
fn template(fleet: &Fleet) -> Vec<String> {
    let root = fleet._dir.path().display().to_string();
    let bin = gpuctl_bin();
    let bin_dir = bin.parent().unwrap().display().to_string();
    vec![
        "env".into(),
        format!("GPUCTL_NVML_LIB={}", sim_lib().display()),
        format!("NVML_SIM_SCENARIO={root}/{{node}}/scenario.toml"),
        format!("NVML_SIM_STATE={root}/{{node}}/state.json"),
        format!("GPUCTL_CONFIG={root}/{{node}}/etc/gpuctl.toml"),
        format!("GPUCTL_DEV_DIR={root}/{{node}}/dev"),
        format!("GPUCTL_STATE_DIR={root}/{{node}}/gpuctl-state"),
        format!("PATH={bin_dir}:/usr/bin:/bin"),
    ]
}

/// A `gpuctl.toml` with `[fleet]` for this fleet; its path.
fn config(fleet: &Fleet) -> Result<std::path::PathBuf, String> {
    let path = fleet._dir.path().join("fleet.toml");
    let exec: Vec<toml::Value> = template(fleet)
        .into_iter()
        .map(toml::Value::String)
        .collect();
    let text = format!(
        "[fleet]\nprometheus = \"http://127.0.0.1:{}\"\nexec = {}\nconcurrency = 2\n",
        fleet.port,
        toml::Value::Array(exec)
    );
    write_root_file(&path, &text)?;
    Ok(path)
}

pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// `gpuctl fleet ARGS` with this fleet's configuration.
pub fn fleet_cmd(fleet: &Fleet, args: &[&str]) -> Result<Outcome, String> {
    let output = Command::new(gpuctl_bin())
        .arg("fleet")
        .args(args)
        .env("GPUCTL_CONFIG", config(fleet)?)
        .env_remove("NO_COLOR")
        .env("COLUMNS", "200")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run gpuctl fleet: {e}"))?;
    Ok(Outcome {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

fn fleet_json(fleet: &Fleet, args: &[&str]) -> Result<Value, String> {
    let mut all = args.to_vec();
    all.push("--json");
    let out = fleet_cmd(fleet, &all)?;
    if out.code != 0 {
        return Err(format!(
            "gpuctl fleet {all:?}: exit {}: {}",
            out.code, out.stderr
        ));
    }
    let doc: Value = serde_json::from_str(&out.stdout)
        .map_err(|e| format!("gpuctl fleet {all:?}: not JSON ({e}): {}", out.stdout))?;
    conforms(&doc)?;
    Ok(doc)
}

/// `doc` against docs/schema/fleet-v1.schema.json, by a complete JSON Schema validator.
fn conforms(doc: &Value) -> Result<(), String> {
    let path = crate::fleet::repo().join("docs/schema/fleet-v1.schema.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let schema: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let validator = jsonschema::draft202012::new(&schema).map_err(|e| e.to_string())?;
    let errors: Vec<String> = validator
        .iter_errors(doc)
        .map(|e| format!("at '{}': {e}", e.instance_path()))
        .collect();
    match errors.is_empty() {
        true => Ok(()),
        false => Err(format!("not fleet-v1: {}\n{doc:#}", errors.join("; "))),
    }
}

fn node<'a>(doc: &'a Value, name: &str) -> Result<&'a Value, String> {
    doc["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node"] == name))
        .ok_or_else(|| format!("no row for {name}: {doc:#}"))
}

/// Every node's totals as its own `gpuctl info --json` gives them: GPUs, used, total,
/// unattributed.
fn info_totals(fleet: &Fleet, number: usize) -> Result<[u64; 4], String> {
    let run = fleet.nodes[number - 1].sim.run(&["info", "--json"]);
    let doc: Value = serde_json::from_str(&run.stdout)
        .map_err(|e| format!("node{number} info: {e}: {}", run.stderr))?;
    let devices = doc["devices"].as_array().cloned().unwrap_or_default();
    let sum = |key: &str| -> u64 {
        devices
            .iter()
            .map(|d| d["memory"][key].as_u64().unwrap_or(0))
            .sum()
    };
    Ok([
        devices.len() as u64,
        sum("used_bytes"),
        sum("total_bytes"),
        sum("unattributed_bytes"),
    ])
}

/// The per-node rows equal each node's `gpuctl info`; the orphans are node 1's, held by
/// its run's owner, and sorted first; the table says the same.
pub fn rows_match_info(fleet: &mut Fleet) -> Result<(), String> {
    let doc = fleet.poll("node1's orphans in gpuctl fleet", |f| {
        let doc = fleet_json(f, &[])?;
        let held = node(&doc, "node1")?["held_bytes"]["orphaned"].as_u64();
        Ok((held == Some(ORPHANS)).then_some(doc))
    })?;
    let names: Vec<&str> = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["node"].as_str())
        .collect();
    if names != ["node1", "node2", "node3", "node4"] {
        return Err(format!("not sorted by what can be reclaimed: {names:?}"));
    }
    for number in 1..=4 {
        let row = node(&doc, &format!("node{number}"))?;
        let want = info_totals(fleet, number)?;
        let got = ["gpus", "used_bytes", "total_bytes", "unattributed_bytes"]
            .map(|k| row[k].as_u64().unwrap_or(u64::MAX));
        if got != want || row["status"] != "reporting" {
            return Err(format!(
                "node{number}: fleet {got:?}, info {want:?}: {row:#}"
            ));
        }
    }
    let row1 = node(&doc, "node1")?;
    if row1["clearable_bytes"] != ORPHANS || row1["findings"]["orphaned"] != 2 {
        return Err(format!("node1's leftovers: {row1:#}"));
    }
    if node(&doc, "node2")?["reclaimable_bytes"] != UNATTRIBUTED {
        return Err(format!("node2's unattributed memory: {doc:#}"));
    }
    let table = fleet_cmd(fleet, &[])?;
    let first = table.stdout.lines().nth(1).unwrap_or("");
    if table.code != 0 || !first.starts_with("node1 ") || !first.contains("6.0 GiB") {
        return Err(format!(
            "the table: exit {}:\n{}{}",
            table.code, table.stdout, table.stderr
        ));
    }
    // --node: the pattern matches names whole.
    let only = fleet_json(fleet, &["--node", "node[12]"])?;
    if only["nodes"].as_array().map(Vec::len) != Some(2) {
        return Err(format!("--node node[12]: {only:#}"));
    }
    Ok(())
}

/// `--by user` and `--by owner`: the memory each holds now across the fleet, as the nodes'
/// `gpuctl info` give it, and GiB-hours that grow.
pub fn by_user_and_owner(fleet: &mut Fleet) -> Result<(), String> {
    let nobody = fleet.poll("nobody's memory across the fleet", |f| {
        let doc = fleet_json(f, &["--by", "user", "--since", "1h"])?;
        let row = doc["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["name"] == "nobody").cloned())
            .ok_or("no row for nobody")?;
        let hours = row["held_gib_hours"].as_f64().unwrap_or(0.0);
        Ok((row["held_bytes"] == 6 * GIB && hours > 0.0).then_some(row))
    })?;
    let owners = fleet_json(fleet, &["--by", "owner"])?;
    let job = format!("slurm:812@{NOBODY}");
    let held = owners["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == job.as_str()))
        .map(|r| r["held_bytes"].clone());
    if held != Some(Value::from(2 * GIB)) {
        return Err(format!("{job}: {owners:#} (nobody: {nobody})"));
    }
    let table = fleet_cmd(fleet, &["--by", "user"])?;
    if !table.stdout.starts_with("USER ") || !table.stdout.contains("nobody") {
        return Err(format!("--by user's table:\n{}", table.stdout));
    }
    Ok(())
}

/// `--detail NODE` runs `gpuctl info --json` there through the template and shows it.
pub fn detail(fleet: &mut Fleet) -> Result<(), String> {
    let out = fleet_cmd(fleet, &["--detail", "node2"])?;
    let shows = out.stdout.contains("serve.py") && out.stdout.contains("4.0 GiB");
    if out.code != 0 || !shows {
        return Err(format!(
            "--detail node2: exit {}:\n{}{}",
            out.code, out.stdout, out.stderr
        ));
    }
    let out = fleet_cmd(fleet, &["--detail", "node9"])?;
    if out.code != 1 || out.stderr.lines().count() != 1 {
        return Err(format!(
            "--detail of no node: exit {}: {}",
            out.code, out.stderr
        ));
    }
    Ok(())
}

/// Each bad input is one line on stderr and its documented status.
pub fn errors(fleet: &mut Fleet) -> Result<(), String> {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let exporter = format!("http://127.0.0.1:{}", fleet.nodes[0].port);
    let cases: [(&[&str], i32, &str); 6] = [
        (&["--prometheus", "prom:9090"], 2, "is not a Prometheus URL"),
        (
            &["--prometheus", &format!("http://127.0.0.1:{closed}")],
            3,
            "cannot reach Prometheus",
        ),
        (&["--node", "("], 1, "Prometheus refused the query"),
        (&["--prometheus", &exporter], 1, "no JSON API answer"),
        (
            &["--bearer-token-file", "/nonexistent/token"],
            2,
            "bearer token file /nonexistent/token",
        ),
        (
            &["--ca-file", "/nonexistent/ca.pem"],
            2,
            "CA file /nonexistent/ca.pem",
        ),
    ];
    for (args, code, says) in cases {
        let out = fleet_cmd(fleet, args)?;
        let one_line = out.stderr.lines().count() == 1 && out.stderr.starts_with("gpuctl: fleet: ");
        if out.code != code || !out.stderr.contains(says) || !one_line || !out.stdout.is_empty() {
            return Err(format!(
                "gpuctl fleet {args:?}: exit {} (want {code}), stderr {:?} (want {says:?})",
                out.code, out.stderr
            ));
        }
    }
    Ok(())
}

/// `--plan` names `gpuctl clear` on node 1 only; `--exec --yes` carries it out through the
/// template and the next `fleet` shows node 1 clean.
pub fn exec_reclaims_the_orphans(fleet: &mut Fleet) -> Result<(), String> {
    fleet.poll("node1's orphans found", |f| {
        let doc = fleet_json(f, &[])?;
        Ok((node(&doc, "node1")?["clearable_bytes"] == ORPHANS).then_some(()))
    })?;
    let plan = fleet_json(fleet, &["--plan"])?;
    let planned: Vec<(String, Vec<String>)> = plan["plan"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| {
            p["steps"].as_array().into_iter().flatten().map(move |s| {
                let words = s["command"].as_array().into_iter().flatten();
                (
                    p["node"].as_str().unwrap_or("").to_string(),
                    words.filter_map(|w| w.as_str().map(String::from)).collect(),
                )
            })
        })
        .collect();
    let want = vec![(
        "node1".to_string(),
        vec!["gpuctl".to_string(), "clear".to_string()],
    )];
    if planned != want {
        return Err(format!("the plan: {plan:#}"));
    }
    let refused = fleet_cmd(fleet, &["--exec"])?;
    if refused.code != 2 || !refused.stderr.contains("--yes") {
        return Err(format!(
            "--exec without a terminal or --yes: {}",
            refused.stderr
        ));
    }
    let out = fleet_cmd(fleet, &["--exec", "--yes"])?;
    if out.code != 0 || !out.stdout.contains("node1: done") || !out.stdout.contains("gpuctl clear")
    {
        return Err(format!(
            "--exec: exit {}:\n{}{}",
            out.code, out.stdout, out.stderr
        ));
    }
    fleet.poll("node1 clean in the next gpuctl fleet", |f| {
        let doc = fleet_json(f, &[])?;
        let row = node(&doc, "node1")?;
        let clean = row["clearable_bytes"] == 0 && row["findings"].get("orphaned").is_none();
        Ok((clean && row["used_bytes"] == 2 * GIB).then_some(()))
    })
}

/// A node whose exporter stops is "target down"; one whose watchdog stops goes stale; both
/// are listed, with no figures, and not counted clean.
pub fn silent_nodes_are_listed_as_such(fleet: &mut Fleet) -> Result<(), String> {
    fleet.nodes[2].exporter.stop();
    fleet.nodes[3].watchdog.stop();
    let doc = fleet.poll("node3 down and node4 stale", |f| {
        let doc = fleet_json(f, &["--stale-after", "5s"])?;
        let status = |n: &str| node(&doc, n).map(|r| r["status"].clone());
        let (three, four) = (status("node3")?, status("node4")?);
        Ok((three == "target_down" && four == "stale").then_some(doc))
    })?;
    if node(&doc, "node2")?["status"] != "reporting" {
        return Err(format!("node2 should still report: {doc:#}"));
    }
    let table = fleet_cmd(fleet, &["--stale-after", "5s", "--color", "never"])?;
    let line = |n: &str| {
        table
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{n} ")))
            .unwrap_or("")
            .to_string()
    };
    if !line("node3").contains("target down") || !line("node4").contains("stale") {
        return Err(format!("the table:\n{}", table.stdout));
    }
    if !table.stdout.contains("2 not reporting") {
        return Err(format!("the summary:\n{}", table.stdout));
    }
    Ok(())
}
