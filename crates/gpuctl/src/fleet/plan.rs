//! What to run where: per node, the commands that reclaim or fix what the fleet view found,
//! and carrying them out through the site's exec template (ssh, clush, pdsh, srun), a few
//! nodes at a time.

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use gpuctl_core::text::escape;
use gpuctl_core::units::bytes;
use serde::Serialize;

use super::model::{Node, Status};
use super::prometheus::FleetError;

/// What gpuctl's drain reasons start with (slurm/drain.rs's `REASON_PREFIX`): the Slurm
/// health check resumes only the nodes gpuctl drained.
const REASON_PREFIX: &str = "gpuctl:";

/// One command on a node, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    pub why: String,
    /// Run through the exec template; empty for advice no command carries out.
    pub command: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodePlan {
    pub node: String,
    pub steps: Vec<Step>,
}

fn words(text: &[&str]) -> Vec<String> {
    text.iter().map(|w| w.to_string()).collect()
}

/// The plan for every node that needs something, in the view's order.
pub fn plan(nodes: &[Node]) -> Vec<NodePlan> {
    nodes
        .iter()
        .filter_map(|n| {
            let steps = steps(n, n.slurm);
            (!steps.is_empty()).then(|| NodePlan {
                node: n.node.clone(),
                steps,
            })
        })
        .collect()
}

/// Whether `name` may go into a command line: a host name or address, never an option
/// (`-oProxyCommand=…` to ssh) or shell syntax. Instance labels come from service
/// discovery, which may carry what a node's owner chose.
pub fn usable_node_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:[]".contains(&b))
}

fn steps(node: &Node, in_slurm: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    if !usable_node_name(&node.node) {
        steps.push(Step {
            why: "its name is not a host name: relabel its instance to one".into(),
            command: Vec::new(),
        });
        return steps;
    }
    if !matches!(node.status, Status::Reporting | Status::NvmlDown) {
        steps.push(Step {
            why: format!(
                "{}: see to its gpuctl-watchdog and node exporter",
                node.status.words()
            ),
            command: Vec::new(),
        });
        return steps;
    }
    let count = |k: &str| node.findings.get(k).copied().unwrap_or(0);
    let leftovers: u64 = super::model::CLEARED_KINDS.iter().map(|k| count(k)).sum();
    if leftovers > 0 || node.clearable_bytes > 0 {
        let mut command = words(&["gpuctl", "clear"]);
        if count("stopped") > 0 || node.held_bytes.contains_key("stopped") {
            command.push("--include-stopped".into());
        }
        steps.push(Step {
            why: format!(
                "{} held by leftovers of crashed runs ({})",
                bytes(node.clearable_bytes),
                leftover_owners(node)
            ),
            command,
        });
    }
    for gpu in &node.health {
        let action = gpu.action.as_str();
        let reason = format!("{REASON_PREFIX} GPU {} needs {action}", gpu.gpu);
        let drains = matches!(action, "node_reboot" | "drain_p2p" | "drain_and_reset");
        if drains && in_slurm {
            steps.push(Step {
                why: format!("GPU {} needs {action}: drain the node first", gpu.gpu),
                command: vec![
                    "scontrol".into(),
                    "update".into(),
                    format!("NodeName={}", node.node),
                    "State=DRAIN".into(),
                    format!("Reason={reason}"),
                ],
            });
        }
        match action {
            "gpu_reset" | "drain_and_reset" => steps.push(Step {
                why: format!("GPU {} needs a reset (gpuctl health)", gpu.gpu),
                command: vec![
                    "gpuctl".into(),
                    "reset".into(),
                    "--gpu-reset".into(),
                    "--gpu".into(),
                    gpu.gpu.to_string(),
                ],
            }),
            _ => steps.push(Step {
                why: format!(
                    "GPU {} needs {action}: by hand, once it is drained",
                    gpu.gpu
                ),
                command: Vec::new(),
            }),
        }
    }
    steps
}

fn leftover_owners(node: &Node) -> String {
    let mut names: Vec<&str> = node
        .owners
        .iter()
        .filter(|o| super::model::CLEARED_KINDS.contains(&o.kind.as_str()))
        .map(|o| o.owner.as_str())
        .collect();
    names.dedup();
    if names.is_empty() {
        "owners unknown".into()
    } else {
        names.join(", ")
    }
}

/// `template` with each `{node}` replaced, then the command: as one shell-quoted word where
/// the template has a `{command}` word (ssh and pdsh hand a remote shell one string), else
/// as words of their own (srun, clush, env).
pub fn argv(template: &[String], node: &str, command: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut placed = false;
    for word in template {
        if word == "{command}" {
            out.push(
                command
                    .iter()
                    .map(|w| shell_quote(w))
                    .collect::<Vec<_>>()
                    .join(" "),
            );
            placed = true;
        } else {
            out.push(word.replace("{node}", node));
        }
    }
    if !placed {
        out.extend(command.iter().cloned());
    }
    out
}

/// `word` as a POSIX shell reads it back as one word.
fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@,+%".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// The plan as text: per node, each step's why and command as the template runs it.
pub fn show(plans: &[NodePlan], template: &[String]) -> String {
    let mut out = String::new();
    if plans.is_empty() {
        out.push_str("Nothing to do: no node has leftovers or a GPU needing an action.\n");
    }
    for p in plans {
        out.push_str(&format!("{}:\n", escape(&p.node)));
        for step in &p.steps {
            if step.command.is_empty() {
                out.push_str(&format!("  # {}\n", escape(&step.why)));
            } else {
                let shown = if template.is_empty() {
                    step.command.clone()
                } else {
                    argv(template, &p.node, &step.command)
                };
                let line: Vec<String> = shown.iter().map(|w| shell_quote(w)).collect();
                out.push_str(&format!(
                    "  {}    # {}\n",
                    escape(&line.join(" ")),
                    escape(&step.why)
                ));
            }
        }
    }
    out
}

/// How one node's steps went.
#[derive(Debug)]
pub struct NodeOutcome {
    pub node: String,
    pub ok: bool,
    pub lines: Vec<String>,
}

/// Runs each node's commands (in order, stopping at the first that fails), `concurrency`
/// nodes at a time; each node's outcome is printed as it ends.
pub fn execute(plans: &[NodePlan], template: &[String], concurrency: usize) -> Vec<NodeOutcome> {
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..concurrency.clamp(1, plans.len().max(1)) {
            scope.spawn(|| {
                while let Some(p) = plans.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let outcome = run_node(p, template);
                    print_outcome(&outcome);
                    done.lock().unwrap_or_else(|e| e.into_inner()).push(outcome);
                }
            });
        }
    });
    done.into_inner().unwrap_or_else(|e| e.into_inner())
}

fn run_node(p: &NodePlan, template: &[String]) -> NodeOutcome {
    let mut lines = Vec::new();
    for step in p.steps.iter().filter(|s| !s.command.is_empty()) {
        let argv = argv(template, &p.node, &step.command);
        let shown = step.command.join(" ");
        let output = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .output();
        let output = match output {
            Ok(output) => output,
            Err(e) => {
                lines.push(format!("{shown}: cannot run {}: {e}", argv[0]));
                return NodeOutcome {
                    node: p.node.clone(),
                    ok: false,
                    lines,
                };
            }
        };
        let said = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        let status = output
            .status
            .code()
            .map_or("killed by a signal".into(), |c| format!("exit {c}"));
        lines.push(format!("{shown}: {status}"));
        lines.extend(
            said.lines()
                .rev()
                .take(8)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .map(|l| format!("  {l}")),
        );
        if !output.status.success() {
            return NodeOutcome {
                node: p.node.clone(),
                ok: false,
                lines,
            };
        }
    }
    NodeOutcome {
        node: p.node.clone(),
        ok: true,
        lines,
    }
}

fn print_outcome(outcome: &NodeOutcome) {
    use std::io::Write;
    let mut text = format!(
        "{}: {}\n",
        escape(&outcome.node),
        if outcome.ok { "done" } else { "FAILED" }
    );
    for line in &outcome.lines {
        text.push_str(&format!("  {}\n", escape(line)));
    }
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// `gpuctl info --json` on `node` through the template: its document.
pub fn detail(template: &[String], node: &str) -> Result<serde_json::Value, FleetError> {
    let argv = argv(template, node, &words(&["gpuctl", "info", "--json"]));
    let output = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| FleetError::Failed(format!("{node}: cannot run {}: {e}", argv[0])))?;
    let doc: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|_| {
        let said = String::from_utf8_lossy(&output.stderr);
        FleetError::Failed(format!(
            "{node}: gpuctl info gave no JSON document ({}): {}",
            output.status,
            said.lines().last().unwrap_or("nothing on stderr")
        ))
    })?;
    if doc["schema"] != 1 {
        return Err(FleetError::Failed(format!(
            "{node}: gpuctl info answered schema {} (this gpuctl reads 1)",
            doc["schema"]
        )));
    }
    Ok(doc)
}

/// The node's GPUs and processes from its `info --json` document.
pub fn detail_table(node: &str, doc: &serde_json::Value) -> String {
    let mut out = format!("{}:\n", escape(node));
    for gpu in doc["devices"].as_array().into_iter().flatten() {
        let mem = &gpu["memory"];
        let used = mem["used_bytes"].as_u64().map_or("?".into(), bytes);
        let total = mem["total_bytes"].as_u64().map_or("?".into(), bytes);
        let unattributed = mem["unattributed_bytes"].as_u64().unwrap_or(0);
        out.push_str(&format!(
            "GPU {} {}  {used} / {total}{}\n",
            gpu["index"],
            escape(gpu["name"].as_str().unwrap_or("?")),
            if unattributed > 0 {
                format!("  ({} unattributed)", bytes(unattributed))
            } else {
                String::new()
            }
        ));
        for p in gpu["processes"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  {:>8}  {:<12}  {:>10}  {:<16}  {}\n",
                p["pid"].as_u64().unwrap_or(0),
                escape(p["user"].as_str().unwrap_or("?")),
                p["used_bytes"].as_u64().map_or("?".into(), bytes),
                escape(&owner_text(&p["owner"])),
                escape(p["command"].as_str().unwrap_or("?")),
            ));
        }
    }
    out
}

fn owner_text(owner: &serde_json::Value) -> String {
    match owner {
        serde_json::Value::Null => "-".into(),
        serde_json::Value::Object(o) => {
            let kind = o.get("kind").and_then(|k| k.as_str()).unwrap_or("?");
            let id = ["job_id", "unit", "pod_uid", "id", "name"]
                .iter()
                .find_map(|k| {
                    o.get(*k)
                        .map(|v| v.to_string().trim_matches('"').to_string())
                });
            match id {
                Some(id) => format!("{kind}:{id}"),
                None => kind.to_string(),
            }
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_goes_after_the_template_or_as_one_quoted_word() {
        let command = words(&["scontrol", "update", "Reason=gpuctl: GPU 3"]);
        let srun = words(&["srun", "-w", "{node}", "-N1", "--"]);
        assert_eq!(
            argv(&srun, "gpu-01", &command),
            words(&[
                "srun",
                "-w",
                "gpu-01",
                "-N1",
                "--",
                "scontrol",
                "update",
                "Reason=gpuctl: GPU 3"
            ])
        );
        let ssh = words(&["ssh", "-oBatchMode=yes", "{node}", "{command}"]);
        assert_eq!(
            argv(&ssh, "gpu-01", &command),
            words(&[
                "ssh",
                "-oBatchMode=yes",
                "gpu-01",
                "scontrol update 'Reason=gpuctl: GPU 3'"
            ])
        );
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn only_host_names_go_into_commands() {
        for good in ["gpu-01", "dgx.example.org", "10.0.0.7", "[::1]"] {
            assert!(usable_node_name(good), "{good}");
        }
        for bad in ["", "-oProxyCommand=sh", "a b", "a;b", "$(x)", "a/b"] {
            assert!(!usable_node_name(bad), "{bad}");
        }
    }
}
