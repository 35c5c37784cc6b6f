//! Three GPU nodes and the Prometheus that scrapes them, all on this host: per node an
//! nvml-sim scenario with real processes of several users, a gpuctl-watchdog (report mode)
//! writing its textfile, and a prometheus-node-exporter serving that directory on a loopback
//! port; one Prometheus (job "node", 1 s scrapes, the repository's rules) on another.
//!
//! Every daemon is a child of the test process, in a scratch directory, its output in a log
//! file there; it is stopped by PID when the fleet is dropped (SIGTERM, then SIGKILL), and
//! gets SIGTERM if the test process dies first.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::api;
use crate::util::{Fetch, GIB, Gpu, Proc, Process, Scenario, Sim, sim_lib, tail, watchdog_bin};

/// How long a wait for the fleet (or a condition in a trial) may take before it fails.
pub const WAIT: Duration = Duration::from_secs(15);
/// How long a family the fleet has scraped once may take to show on every node: the
/// watchdog writes every family each loop, so one that is absent by then is not written.
pub const PRESENT: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(100);

/// The watchdog's loop: short, so the textfiles follow the scenarios quickly.
const INTERVAL: &str = "250ms";

/// Nodes 1 to 3 have NVML; node 4 has not (its driver is not loaded).
pub const NODES: usize = 4;
pub const GPU_NODES: usize = 3;

/// The memory that no process accounts for on node 2's GPU 0.
pub const LEAK: u64 = 3 * GIB;
/// A user with no name on this host: gpuctl labels it "uid 4242" (the totals: "4242").
pub const NAMELESS_UID: u32 = 4242;
/// nobody.
pub const NOBODY: u32 = 65534;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub const RULES: &str = "packaging/prometheus/gpuctl-rules.yml";
pub const DASHBOARD: &str = "packaging/grafana/gpuctl-dashboard.json";

/// Runs scripts/fetch-prometheus once per process: Ok(versions) or Err(its one-line reason).
pub fn ensure_prometheus() -> Result<&'static str, String> {
    static PROMETHEUS: Fetch = Fetch::new("fetch-prometheus");
    PROMETHEUS.once()
}

/// `count` loopback ports free now (all held while the next is chosen, so they differ).
fn free_ports(count: usize) -> Result<Vec<u16>, String> {
    let held: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind a free port: {e}")))
        .collect::<Result<_, _>>()?;
    held.iter()
        .map(|l| l.local_addr().map(|a| a.port()).map_err(|e| e.to_string()))
        .collect()
}

/// A daemon this test started; stopped by PID on drop.
pub struct Daemon {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    /// Stopped by the test on purpose: not a daemon that died.
    stopped: bool,
}

impl Daemon {
    /// Starts `command` with its stdout and stderr in `log`; SIGTERM when this process dies.
    fn start(name: &str, mut command: Command, log: PathBuf) -> Result<Daemon, String> {
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: prctl with integer arguments is async-signal-safe, fine between fork and
        // exec. (The fleet is started on the main thread: libtest-mimic runs the trials there
        // with one test thread, so the death signal is not tied to a thread that ends early.)
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", command.get_program()))?;
        Ok(Daemon {
            name: name.to_string(),
            child,
            log,
            stopped: false,
        })
    }

    /// Err (with its log's tail) when it has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        if self.stopped {
            return Ok(());
        }
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} exited ({status}); {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 15)
            )),
            Err(e) => Err(format!("{}: {e}", self.name)),
        }
    }

    pub fn tail(&self) -> String {
        format!(
            "--- {} ({}):\n{}",
            self.name,
            self.log.display(),
            tail(&self.log, 15)
        )
    }
}

impl Daemon {
    /// Stops it now, as a node that goes away mid-test.
    pub fn stop(&mut self) {
        self.stopped = true;
        self.end();
    }

    /// SIGTERM to its PID, up to 5 s to exit, then SIGKILL; reaped.
    fn end(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // SAFETY: kill(2) on our own child, not yet reaped, so the pid is still ours.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.end();
    }
}

/// One GPU node: its scenario, the processes it names, its watchdog and node exporter.
pub struct Node {
    /// 1, 2, 3.
    pub number: usize,
    // Daemons first: dropped (stopped) before the processes and the sim's directory go.
    pub watchdog: Daemon,
    pub exporter: Daemon,
    pub sim: Sim,
    pub port: u16,
    /// The node exporter's textfile directory, where the watchdog writes `gpuctl.prom`.
    pub textfile_dir: PathBuf,
    /// Prometheus relabels its instance to this name (a [`Layout::named`] fleet).
    pub name: Option<String>,
    nvml: bool,
    /// Held only so that they live as long as the node (killed on drop).
    pub _procs: Vec<Held>,
}

/// What a node holds for as long as it runs: its processes, a crashed run's workers.
pub type Held = Box<dyn std::any::Any + Send>;

/// A fleet's nodes: how many, what each runs, how they are named.
pub struct Layout {
    pub nodes: usize,
    /// The nodes numbered up to this one have NVML.
    pub nvml_nodes: usize,
    /// Node `n`'s scenario and what it holds.
    pub populate: fn(usize) -> (Scenario, Vec<Held>),
    /// Each node's instance is relabelled to `nodeN`, and its sim's directory is
    /// `DIR/nodeN`, so that a command template can name its files by `{node}`.
    pub named: bool,
}

/// The layout of the shared fleet of the metrics, rules and dashboard checks.
const CHECKS: Layout = Layout {
    nodes: NODES,
    nvml_nodes: GPU_NODES,
    populate: |number| {
        let (scenario, procs) = populate(number);
        let held = procs.into_iter().map(|p| Box::new(p) as Held).collect();
        (scenario, held)
    },
    named: false,
};

impl Node {
    /// The `instance` label Prometheus gives the node's series.
    pub fn instance(&self) -> String {
        match &self.name {
            Some(name) => name.clone(),
            None => format!("127.0.0.1:{}", self.port),
        }
    }

    /// Whether NVML answers on it (nodes 1 to 3 of the checks' fleet).
    pub fn has_nvml(&self) -> bool {
        self.nvml
    }

    pub fn metrics_file(&self) -> PathBuf {
        self.textfile_dir.join("gpuctl.prom")
    }
}

/// What a node runs: its GPUs, and its processes (spawned here: the scenario names pids).
fn populate(number: usize) -> (Scenario, Vec<Proc>) {
    let root = |args: &[&str]| Proc::spawn_ready("sleep", "python3", args);
    match number {
        // Two users; a Slurm job known only by its environment (proctrack/linuxproc).
        1 => {
            let a = root(&["train.py"]);
            let b =
                Proc::spawn_as_with_env(NOBODY, "sleep", &["job.sh"], &[("SLURM_JOB_ID", "812")]);
            let c = root(&["eval.py"]);
            let scenario = Scenario::new()
                .gpus(2, Gpu::h200())
                .process(Process::new(a.pid()).on(0).used(8 * GIB))
                .process(Process::new(b.pid()).on(1).used(6 * GIB))
                .process(Process::new(c.pid()).on_each(&[0, 1]).used(GIB));
            (scenario, vec![a, b, c])
        }
        // The leak, a user with no name, and an application Xid.
        2 => {
            let a = Proc::spawn_as(NOBODY, "sleep", &["serve.py"]);
            let b = Proc::spawn_as(NAMELESS_UID, "sleep", &["notebook"]);
            let scenario = Scenario::new()
                .gpu(Gpu::h200().leaked(LEAK))
                .gpu(Gpu::h200())
                .process(Process::new(a.pid()).on(0).used(4 * GIB))
                .process(Process::new(b.pid()).on(1).used(2 * GIB))
                // An application's Xid on GPU 1: counted, and the GPU stays fit.
                .xid(1, 94, Some(b.pid()));
            (scenario, vec![a, b])
        }
        // MIG, a GPU fallen off the bus, and a job of the nameless user.
        3 => {
            let a = root(&["finetune.py"]);
            let b = Proc::spawn_as_with_env(
                NAMELESS_UID,
                "sleep",
                &["job.sh"],
                &[("SLURM_JOB_ID", "913")],
            );
            let scenario = Scenario::new()
                .gpu(Gpu::h100().mig("3g.40gb", 1))
                .gpu(Gpu::h200())
                .gpu(Gpu::h200().lost())
                .process(Process::new(a.pid()).on(0).instance(1).used(5 * GIB))
                .process(Process::new(b.pid()).on(1).used(7 * GIB));
            (scenario, vec![a, b])
        }
        // A node whose driver is not loaded: NVML down, as the dashboard's "not answering"
        // table and the rules' alerts must show.
        _ => (
            Scenario::new()
                .init_error("DRIVER_NOT_LOADED")
                .gpus(2, Gpu::h200()),
            Vec::new(),
        ),
    }
}

/// The running fleet; everything stops when it is dropped.
pub struct Fleet {
    // Prometheus first: it stops scraping before the exporters go.
    pub prometheus: Daemon,
    pub nodes: Vec<Node>,
    pub port: u16,
    /// Whether the repository has the rules file (Prometheus loads it when it does).
    pub rules: bool,
    /// Held: removed on drop, after the daemons that write in it have stopped.
    pub _dir: tempfile::TempDir,
}

impl Fleet {
    /// Starts the nodes and Prometheus, and waits until Prometheus has scraped the
    /// watchdog's metrics from every node. Err: why not, with the logs' tails.
    pub fn start() -> Result<Fleet, String> {
        Fleet::start_with(&CHECKS)
    }

    /// [`Fleet::start`] with the nodes `layout` says.
    pub fn start_with(layout: &Layout) -> Result<Fleet, String> {
        ensure_prometheus()?;
        let dir = tempfile::Builder::new()
            .prefix("gpuctl-prometheus-")
            .tempdir()
            .map_err(|e| format!("cannot make the fleet's directory: {e}"))?;
        let ports = free_ports(layout.nodes + 1)?;
        let mut nodes = Vec::new();
        for (i, &port) in ports[..layout.nodes].iter().enumerate() {
            nodes.push(start_node(layout, i + 1, port, dir.path())?);
        }
        let rules_file = repo().join(RULES);
        let rules = rules_file.exists();
        let port = ports[layout.nodes];
        let config = prometheus_config(dir.path(), &nodes, rules.then_some(&rules_file))?;
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // Debian's defaults point here; nothing of the machine's own installation.
            .arg(format!(
                "--web.console.templates={}",
                dir.path().join("consoles").display()
            ))
            .arg(format!(
                "--web.console.libraries={}",
                dir.path().join("console_libraries").display()
            ));
        let prometheus = Daemon::start("prometheus", command, dir.path().join("prometheus.log"))?;
        let mut fleet = Fleet {
            prometheus,
            nodes,
            port,
            rules,
            _dir: dir,
        };
        fleet.wait_scraped()?;
        Ok(fleet)
    }

    /// The nodes with NVML, whose figures `gpuctl info` gives.
    pub fn gpu_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.has_nvml())
    }

    /// A label matcher for the series of the nodes with NVML.
    pub fn gpu_instances(&self) -> String {
        let all: Vec<String> = self.gpu_nodes().map(|n| n.instance()).collect();
        format!("instance=~\"{}\"", all.join("|").replace('.', "\\\\."))
    }

    /// Every daemon's log tail, for a failure message.
    pub fn logs(&self) -> String {
        let mut all = vec![self.prometheus.tail()];
        for node in &self.nodes {
            all.push(node.watchdog.tail());
            all.push(node.exporter.tail());
        }
        all.join("\n")
    }

    /// Err (with the log of the one that exited) when a daemon is gone.
    pub fn check_alive(&mut self) -> Result<(), String> {
        self.prometheus.check_alive()?;
        for node in &mut self.nodes {
            node.watchdog.check_alive()?;
            node.exporter.check_alive()?;
        }
        Ok(())
    }

    /// Polls `probe` until it gives Some, a daemon exits, or `WAIT` passes; the error then
    /// says what was waited for and the probe's last word.
    pub fn poll<T>(
        &mut self,
        what: &str,
        probe: impl FnMut(&Fleet) -> Result<Option<T>, String>,
    ) -> Result<T, String> {
        self.poll_for(WAIT, what, probe)
    }

    /// [`Fleet::poll`] for up to `limit`.
    pub fn poll_for<T>(
        &mut self,
        limit: Duration,
        what: &str,
        mut probe: impl FnMut(&Fleet) -> Result<Option<T>, String>,
    ) -> Result<T, String> {
        let start = Instant::now();
        let mut last = String::new();
        loop {
            self.check_alive()?;
            match probe(self) {
                Ok(Some(found)) => return Ok(found),
                Ok(None) => {}
                Err(e) => last = e,
            }
            if start.elapsed() > limit {
                return Err(format!(
                    "{what}: not within {limit:?} (last: {last})\n{}",
                    self.logs()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    fn wait_scraped(&mut self) -> Result<(), String> {
        self.poll("Prometheus ready", |f| {
            let (status, _) = api::get(f.port, "/-/ready")?;
            Ok((status == 200).then_some(()))
        })?;
        self.poll("every target up", |f| {
            let data = api::api(f.port, "/api/v1/targets?state=active")?;
            let targets = data["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let up = targets.iter().filter(|t| t["health"] == "up").count();
            if up == f.nodes.len() {
                Ok(Some(()))
            } else {
                Err(format!("{up} of {} up: {targets:?}", f.nodes.len()))
            }
        })?;
        // Up is not enough: the first scrape may precede the watchdog's first textfile.
        self.poll("the watchdog's metrics of every node", |f| {
            let found = api::query(f.port, "count by (instance) (gpuctl_watchdog_loops_total)")?;
            Ok((found.len() == f.nodes.len()).then_some(()))
        })
    }
}

fn start_node(layout: &Layout, number: usize, port: u16, root: &Path) -> Result<Node, String> {
    let (scenario, procs) = (layout.populate)(number);
    let name = layout.named.then(|| format!("node{number}"));
    let sim = match &name {
        Some(name) => Sim {
            dir: tempfile::Builder::new()
                .prefix(name)
                .rand_bytes(0)
                .tempdir_in(root)
                .map_err(|e| format!("{}/{name}: {e}", root.display()))?,
        },
        None => Sim::new(""),
    };
    sim.write(&scenario.device_dir(&sim.dev_dir()));
    // A named node's directory is made here, not by Sim::new: its configuration's too.
    let etc = sim.dir.path().join("etc");
    std::fs::create_dir_all(&etc).map_err(|e| format!("{}: {e}", etc.display()))?;
    let textfile_dir = root.join(format!("node{number}-textfile"));
    std::fs::create_dir_all(&textfile_dir)
        .map_err(|e| format!("{}: {e}", textfile_dir.display()))?;
    let config = format!(
        "[watchdog]\nmode = \"report\"\ninterval = \"{INTERVAL}\"\nmetrics_file = {}\nstate_dir = {}\n",
        toml::Value::String(textfile_dir.join("gpuctl.prom").display().to_string()),
        toml::Value::String(sim.dir.path().join("state").display().to_string()),
    );
    write_root_file(&sim.config_path(), &config)?;
    let mut command = Command::new(watchdog_bin());
    // The node's own kernel log (the sim writes its Xid lines there), not this machine's.
    sim.kernel_log_env(&mut command)
        .env("GPUCTL_NVML_LIB", sim_lib())
        .env("NVML_SIM_SCENARIO", sim.scenario_path())
        .env("NVML_SIM_STATE", sim.state_path())
        .env("GPUCTL_CONFIG", sim.config_path())
        .env("GPUCTL_DEV_DIR", sim.dev_dir())
        // Not under systemd: no sd_notify, no journal.
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .env_remove("JOURNAL_STREAM");
    let watchdog = Daemon::start(
        &format!("node{number} gpuctl-watchdog"),
        command,
        root.join(format!("node{number}-watchdog.log")),
    )?;
    let mut command = Command::new("prometheus-node-exporter");
    command
        // Only the textfile collector, and none of the exporter's own Go metrics.
        .args(["--collector.disable-defaults", "--collector.textfile"])
        .arg("--web.disable-exporter-metrics")
        .arg(format!(
            "--collector.textfile.directory={}",
            textfile_dir.display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"));
    let exporter = Daemon::start(
        &format!("node{number} node-exporter"),
        command,
        root.join(format!("node{number}-exporter.log")),
    )?;
    Ok(Node {
        number,
        watchdog,
        exporter,
        sim,
        port,
        textfile_dir,
        name,
        nvml: number <= layout.nvml_nodes,
        _procs: procs,
    })
}

/// The watchdog refuses a configuration anyone but root could have written.
pub fn write_root_file(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text)
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// prometheus.yml: 1 s scrapes and evaluations, job "node" on the three exporters, and the
/// repository's rules. The rules are loaded from a copy whose group `interval:` lines say
/// 1s, so a group with a long interval is evaluated within the test's time; the rules
/// themselves are unchanged.
fn prometheus_config(
    dir: &Path,
    nodes: &[Node],
    rules: Option<&PathBuf>,
) -> Result<PathBuf, String> {
    let mut rule_files = String::new();
    if let Some(rules) = rules {
        let text =
            std::fs::read_to_string(rules).map_err(|e| format!("{}: {e}", rules.display()))?;
        let fast: Vec<String> = text
            .lines()
            .map(|line| {
                let body = line.trim_start();
                match body.strip_prefix("interval:") {
                    Some(_) => format!("{}interval: 1s", &line[..line.len() - body.len()]),
                    None => line.to_string(),
                }
            })
            .collect();
        let copy = dir.join("gpuctl-rules.yml");
        std::fs::write(&copy, fast.join("\n") + "\n")
            .map_err(|e| format!("{}: {e}", copy.display()))?;
        rule_files = format!(
            "rule_files:\n  - {}\n",
            json_string(&copy.display().to_string())
        );
    }
    let targets: Vec<String> = nodes
        .iter()
        .map(|n| json_string(&format!("127.0.0.1:{}", n.port)))
        .collect();
    // A named node's instance is its name, as sites relabel theirs.
    let mut relabel = String::new();
    for node in nodes.iter().filter(|n| n.name.is_some()) {
        relabel.push_str(&format!(
            "      - source_labels: [__address__]\n        regex: {}\n        \
             target_label: instance\n        replacement: {}\n",
            json_string(&format!("127\\.0\\.0\\.1:{}", node.port)),
            json_string(&node.instance())
        ));
    }
    if !relabel.is_empty() {
        relabel = format!("    relabel_configs:\n{relabel}");
    }
    let text = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         {rule_files}\
         scrape_configs:\n  - job_name: node\n    static_configs:\n      - targets: [{}]\n{relabel}",
        targets.join(", ")
    );
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// A YAML scalar written as a JSON string (YAML is a superset of JSON): quoted and escaped.
fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

/// `program args` with `stdin` fed from a file: its output, or why it could not run.
pub fn run_with_input(program: &str, args: &[&str], stdin: &Path) -> Result<Output, String> {
    let input = std::fs::File::open(stdin).map_err(|e| format!("{}: {e}", stdin.display()))?;
    Command::new(program)
        .args(args)
        .stdin(input)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))
}
