//! The command line, defined once: help, man pages and completions come from here.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use gpuctl_core::exit;
use gpuctl_core::units::{self, Amount};

mod fleet;
mod reclaim;
mod run;

pub use fleet::{FleetArgs, FleetBy};
pub use reclaim::{ClearArgs, KillArgs, ResetArgs, SignalArgs};
pub use run::{CandidateArgs, PickArgs, RunArgs};

/// What `gpuctl --help` and the man pages print after the options: the exit statuses (from
/// the one table in gpuctl-core) and the environment.
pub fn after_help() -> String {
    format!("{}\n\n{ENVIRONMENT}", exit::help(exit::GPUCTL))
}

const ENVIRONMENT: &str = "\
Environment:
  GPUCTL_NVML_LIB  NVML library to load (default libnvidia-ml.so.1; nvml-sim for rehearsals);
                   as root, only a path that root alone can write, down from /
  NO_COLOR         when set and not empty, --color auto does not color
  GPUCTL_CONFIG    the one configuration file to read, which must exist (default
                   /etc/gpuctl/gpuctl.toml and $XDG_CONFIG_HOME/gpuctl/gpuctl.toml, each
                   optional); /dev/null: none
  GPUCTL_STATE_DIR where peak marks are kept (default /var/lib/gpuctl as root,
                   $XDG_STATE_HOME/gpuctl otherwise), and the watchdog's state directory
                   (health --ack) when the configuration sets no watchdog.state_dir
  GPUCTL_TIMINGS   when set and not empty, info says on stderr where its time went
  GPUCTL_NVML_TIMEOUT  how long NVML may take to answer for one GPU (default 10s, or the
                   configuration's nvml_timeout)
  GPUCTL_SOCKET    the host service's socket (default /run/gpuctl/api.sock): asked in a
                   container's own PID namespace, and where `gpuctl serve` listens
  GPUCTL_LEASE_DIR where `gpuctl run` keeps its GPU leases (default /run/gpuctl/leases)";

/// See who holds GPU memory on shared NVIDIA servers, and get it back safely.
#[derive(Debug, Parser)]
#[command(name = "gpuctl", version, after_help = after_help())]
pub struct Cli {
    /// When to color the output: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ColorChoice::Auto, global = true)]
    pub color: ColorChoice,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

/// Each subcommand's options are built only when it runs (or for help, man pages and
/// completions), not on every start. Built that late, a doc comment on an `Args` struct would
/// replace the about of each command that has it, so those structs carry `//` comments (the
/// man pages' check, `xtask man --check`, fails on one).
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Show every GPU and every process holding memory on it (the default command).
    ///
    /// For each GPU: memory in use (and how much of it no process accounts for),
    /// utilization, temperature and power. For each process: pid, user, GPU memory, age,
    /// state, owner (systemd unit or scope, container, Kubernetes pod, Slurm job) and
    /// command. A process that cannot be tied to a local process (another PID namespace,
    /// hidden /proc) is shown as unconfirmed, never attributed to another process.
    Info(InfoArgs),

    /// Terminate GPU processes by selector, safely.
    ///
    /// Selectors combine as AND (repeat one to widen it); at least one is required, never an
    /// implicit "everything". Each process is signalled by identity (pid and start time,
    /// through a pidfd), SIGTERM first, then SIGKILL after --timeout; then NVML is checked
    /// until it left the GPU and its memory was released. Never signalled: init, gpuctl and
    /// its ancestors, protected daemons (nvidia-persistenced, nv-hostengine,
    /// nvidia-fabricmanager, display servers, and the configuration's protect commands),
    /// and, unless root, other users' processes.
    ///
    /// A daemon is protected by what it is, not by its name: a process that names itself
    /// after one (command name or argv[0]) is spared only when its executable is a
    /// root-owned file of that name (or linked from that name), writable by no one else, in
    /// directories that are all root's and writable by no one else; it runs as root or as
    /// the daemon's own service user (display servers: a display manager's; configured
    /// commands: the configured users); nothing traces it; and the code it maps and the
    /// libraries its environment names (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT) pass the same
    /// rule. A user's own run of a protected program is that user's process. Any other
    /// process using the name is not protected; `gpuctl info` shows it as "claims to be
    /// NAME", and why.
    Kill(KillArgs),

    /// Reclaim GPU memory that crashed runs left behind; with --wait, until it is free.
    ///
    /// The pre-run step of a job launcher. Reclaims processes whose run died (orphaned
    /// workers, idle, with evidence that their run crashed) and zombie holders; with
    /// --include-stopped, stopped processes too. Only the caller's own processes, or
    /// everyone's as root. What is only suspicious (a lone idle orphan that may be a
    /// background job, a process stuck in D state, memory no process accounts for) is
    /// reported, never acted on.
    Clear(ClearArgs),

    /// Restore what a finished job may have changed on a card, as Slurm epilogs do.
    ///
    /// Application clocks to default, locked GPU and memory clocks released, compute mode
    /// back to DEFAULT, accounting's finished-process records cleared, and gpuctl's "peak
    /// since reset" memory marks cleared. Give item flags to restore only those. Each GPU
    /// and item reports done, not supported, not permitted, or failed. The GPU itself is
    /// not reset, unless --gpu-reset asks for it (and names the GPU with --gpu).
    Reset(ResetArgs),

    /// Tell a broken GPU from a busy one: one health verdict per GPU, with its causes.
    ///
    /// The action each GPU needs, in NVML's recovery-action names: none, gpu_reset,
    /// node_reboot, drain_p2p, drain_and_reset; restart_app marks an Xid the application
    /// caused (the GPU itself is fit). The causes: the driver's recovery action (R550 on),
    /// a pending row remap, a row-remap failure (an RMA criterion), volatile uncorrected ECC
    /// errors, a pending page retirement, a GPU fallen off the bus (listed by its index,
    /// node_reboot), hardware clock slowdowns (a warning), and the Xids the watchdog saw
    /// since the GPU's last reset, with the processes that were on it. The verdict clears
    /// itself when the GPU's state does. Where the driver lacks the recovery-action field,
    /// an Xid's action holds until a reset shows or an admin acknowledges it (--ack). The
    /// Xid actions follow NVIDIA's Xid catalog; an Xid it lacks ("unknown Xid N") holds the
    /// GPU with gpu_reset unless `[health] unknown_xid_action` says otherwise, and
    /// `[health] xid_actions` in the system configuration overrides any. A MIG instance
    /// named with --gpu judges its GPU.
    Health(HealthArgs),

    /// The whole fleet's GPU memory, waste and health, from the Prometheus that scrapes it.
    ///
    /// One row per node that runs gpuctl-watchdog: GPUs, memory used, memory no process
    /// accounts for, memory held by findings (orphaned, zombie, stuck, idle) and its owners,
    /// GPUs whose health needs an action, and how old its metrics are; the nodes with the
    /// most to reclaim first. A node whose target is down, or whose metrics are older than
    /// --stale-after, is listed as not reporting, never as clean. A few PromQL queries for
    /// the whole fleet, never one per node; per-process rows stay on the node (--detail).
    Fleet(FleetArgs),

    /// Show or set the per-process memory-share policy: the share of one GPU's memory a
    /// single process may hold.
    ///
    /// With no VALUE, show the share in force on each GPU (for --user, or the caller) and the
    /// file and key it comes from. With a VALUE in (0, 1] (or a percentage), store it: in the
    /// system file as root, in the caller's own file otherwise (which may only lower the
    /// system's share). --gpu or --user store a per-GPU or per-user entry. Comments and layout
    /// of the file are kept. Programs using gpuctl-core apply the share in-process, `gpuctl
    /// enable` exports it to JAX, and the watchdog enforces it.
    Fraction(FractionArgs),

    /// Print or apply memory-efficient allocator settings for PyTorch, JAX and TensorFlow.
    ///
    /// PyTorch: expandable_segments:True added to PYTORCH_ALLOC_CONF and
    /// PYTORCH_CUDA_ALLOC_CONF (keeping the keys already there); CUDA_MODULE_LOADING=LAZY; JAX:
    /// no preallocation, and the memory share policy as XLA_PYTHON_CLIENT_MEM_FRACTION;
    /// TensorFlow: memory growth. Variables already set are kept. Without a command, print
    /// them for eval: eval "$(gpuctl enable)". With one, run it with them set (no shell in
    /// between; its exit status is gpuctl's).
    Enable(EnableArgs),

    /// The interactive view: every GPU and every process, refreshed, with gpuctl's safe kill.
    ///
    /// A full-screen terminal view: per GPU (and MIG instance) a memory bar, utilization,
    /// power, temperature, history sparklines and the memory no process accounts for; the
    /// processes with user, GPU, memory, SM%, age, state, owner and command; the watchdog's
    /// findings marked on their rows, and a GPU whose health needs an action on its line
    /// ([needs a reset]). Keys: arrows, PgUp/PgDn, Home/End move; Space marks;
    /// s sorts (memory, SM, age, pid, user); / filters (Esc clears); g narrows to one GPU; t
    /// groups by owner; u shows per-user totals; h the device-file holders of the GPU; k or
    /// F9 ends the marked processes or the cursor's, after a confirmation that shows the
    /// plan (the same road as `gpuctl kill`: by identity, SIGTERM then SIGKILL, verified);
    /// ? help; q or Ctrl-C quits. The mouse selects rows. Needs a terminal on stdout: for
    /// scripts, use `gpuctl info --watch` or `--json`.
    Top(TopArgs),

    /// Slurm's prolog, epilog and node health check for GPU nodes.
    ///
    /// What the scripts in /usr/share/gpuctl/slurm run, with the job's environment
    /// (SLURM_JOB_ID, SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES, SLURMD_NODENAME). When a
    /// job's GPUs cannot be made clean, the node is drained with a reason that starts with
    /// "gpuctl:" and names the GPU, the memory held and the process to blame; the health
    /// check resumes such a node once those GPUs are free, and never a node drained for any
    /// other reason. Actions are logged to slurm.log, and each job's account (its peak GPU
    /// memory, leftovers ended, memory reclaimed) to slurm-jobs.jsonl, both in the watchdog's
    /// state directory (/var/lib/gpuctl).
    #[command(subcommand)]
    Slurm(SlurmCommand),

    /// Answer containers' "which GPU processes are mine" on a Unix socket (host service).
    ///
    /// Inside a container without the host's PID namespace, NVML lists host PIDs that the
    /// container cannot see; gpuctl there asks this service. Each connection sends one JSON
    /// request and gets one JSON reply (docs/json.md): the GPU processes in the caller's PID
    /// namespace or below it, by the PIDs and start times the caller sees and with its user
    /// namespace's uids, and for each GPU the memory held outside it as one number. The
    /// caller is known from the kernel (SO_PEERCRED), never from the request. The service
    /// reads only: it never sends a signal. A request over 4 KiB is refused, a client silent
    /// for 1 s is dropped. Socket: --socket, else GPUCTL_SOCKET, else /run/gpuctl/api.sock;
    /// under systemd socket activation (gpuctl-api.socket) the inherited socket is used.
    Serve(ServeArgs),

    /// Lease free, healthy GPUs, run a command on them, and leave nothing behind.
    ///
    /// A GPU qualifies (or a MIG instance, where a GPU is split) when its health verdict is
    /// none, it is free as `clear --wait` judges free (no process and under 256 MiB in use;
    /// or by --min-free and --max-util where given), and no other run holds its lease. The
    /// lease is a lock on a file named by the GPU's UUID in GPUCTL_LEASE_DIR (default
    /// /run/gpuctl/leases); the kernel drops it when gpuctl dies, even by SIGKILL. Several
    /// GPUs are leased all or nothing, so two runs can never deadlock holding one each.
    /// Without --wait, too few GPUs is refused at once (exit status 4), saying why each
    /// other GPU does not qualify and who holds its lease.
    ///
    /// The command runs with CUDA_VISIBLE_DEVICES set to the leased UUIDs (MIG UUIDs for
    /// instances), CUDA_DEVICE_ORDER=PCI_BUS_ID, GPUCTL_RUN_GPUS naming them as nvidia-smi
    /// does (0,1 or 0/3), and `gpuctl enable`'s allocator settings unless --no-enable (the
    /// caller's own values are kept). gpuctl stays its parent and a child subreaper:
    /// SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded, and its exit status is the
    /// command's (128+N for signal N). When the command's main process exits, every
    /// descendant still alive (even one that left with setsid) is a leftover, ended as
    /// `gpuctl kill` ends processes: by identity, SIGTERM then SIGKILL, never a protected
    /// program, its memory verified released. Then the leases are released and a summary
    /// goes to stderr: the GPUs, wall time, peak memory and mean utilization, leftovers.
    Run(RunArgs),

    /// Print free, healthy GPUs for scripts that launch by other means; takes no lease.
    ///
    /// The same candidates as `gpuctl run` (health verdict none, free as `clear --wait`
    /// judges free, or by --min-free and --max-util), N of them, by UUID one per line
    /// (or index with --index). Nothing is held: another launcher may pick the same GPUs
    /// at the same moment. To hold them while a command runs, use `gpuctl run`.
    Pick(PickArgs),
}

#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// The Unix socket to listen on (default: GPUCTL_SOCKET, else /run/gpuctl/api.sock).
    /// Ignored when systemd passes a socket (LISTEN_FDS).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<std::path::PathBuf>,

    /// Exit after this long without a client (e.g. 60s): under socket activation systemd
    /// keeps the socket and starts the service again for the next client, so it holds no
    /// memory at rest. Default: serve until stopped.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub idle_exit: Option<Duration>,
}

// The GPUs or MIG instances a command is limited to: `--gpu`, defined once for every
// command that selects places.
#[derive(Debug, Clone, Default, Args)]
pub struct GpuArgs {
    /// Only this GPU: its index, UUID (or a unique prefix of one) or PCI bus id; or only
    /// this MIG instance: its MIG-... UUID, or GPU/GI as nvidia-smi -L shows them (0/9).
    /// Repeat for several. Default: every GPU.
    #[arg(long = "gpu", value_name = "GPU")]
    pub gpus: Vec<String>,
}

// `--json`, defined once.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct JsonArg {
    /// Print one JSON document (its version in the `schema` field; see docs/json.md).
    #[arg(long)]
    pub json: bool,
}

// `--dry-run`, defined once for the commands that act.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct DryRunArg {
    /// Say what would be done and why, and do it not: nothing is signalled, reset or
    /// resumed.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Subcommand)]
#[command(defer = true)]
pub enum SlurmCommand {
    /// Before a job: reclaim crashed runs' leftovers on the job's GPUs only, and wait until
    /// they are free; if they are not, drain the node with the reason and exit 1 (Slurm then
    /// requeues the job).
    Prolog(SlurmPrologArgs),

    /// After a job: end what is left of it (by its cgroup, or by SLURM_JOB_ID in the
    /// environment of processes no cgroup ties to a job), check its GPUs' memory is
    /// released, restore the card settings it may have changed, and write its account. On
    /// failure, drain the node with the reason and exit 1.
    Epilog(SlurmEpilogArgs),

    /// Slurm's HealthCheckProgram: drain this node when a GPU's health verdict needs a
    /// reset, a reboot or a drain (the reason names the GPU, the action and the causes);
    /// resume it if gpuctl drained it and the GPUs are healthy, and the GPUs a memory
    /// reason named free, now. A node drained for any other reason is left alone.
    Healthcheck(SlurmHealthcheckArgs),

    /// The per-job accounts the epilog wrote (slurm-jobs.jsonl in the watchdog's state
    /// directory), oldest first: GPUs, peak memory, mean SM, and the time and GiB-hours
    /// held idle as the watchdog measured them. Exit status 1 when --job names a job with
    /// no account.
    Account(SlurmAccountArgs),
}

#[derive(Debug, Clone, Args)]
pub struct SlurmAccountArgs {
    /// Only this job's account.
    #[arg(long, value_name = "JOBID")]
    pub job: Option<u64>,

    #[command(flatten)]
    pub output: JsonArg,
}

#[derive(Debug, Clone, Args)]
pub struct SlurmPrologArgs {
    /// How long to wait for the job's GPUs to be free.
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub wait: Duration,

    /// Exit 1 on failure without draining the node (Slurm then drains it with its own
    /// reason, "Prolog error").
    #[arg(long)]
    pub no_drain: bool,
}

#[derive(Debug, Clone, Args)]
pub struct SlurmEpilogArgs {
    /// How long a leftover gets after SIGTERM before SIGKILL, and how long its memory may
    /// take to be released.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Exit 1 on failure without draining the node (Slurm then drains it with its own
    /// reason, "Epilog error").
    #[arg(long)]
    pub no_drain: bool,
}

#[derive(Debug, Clone, Args)]
pub struct SlurmHealthcheckArgs {
    /// The node to check (default: SLURMD_NODENAME, else the short host name).
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,

    #[command(flatten)]
    pub plan: DryRunArg,
}

#[derive(Debug, Clone, Args)]
pub struct FractionArgs {
    /// The share to store, in (0, 1], or a percentage ("0.8", "80%").
    #[arg(value_name = "VALUE", allow_negative_numbers = true)]
    pub value: Option<String>,

    /// A per-GPU entry (index or UUID); when showing, only this GPU.
    #[arg(long = "gpu", value_name = "GPU")]
    pub gpu: Option<String>,

    /// A per-user entry; when showing, the share this user's processes get.
    #[arg(long, value_name = "USER", conflicts_with = "gpu")]
    pub user: Option<String>,

    #[command(flatten)]
    pub output: JsonArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShellKind {
    Sh,
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Clone, Args)]
pub struct EnableArgs {
    /// Print the settings for this shell.
    #[arg(long, value_enum, value_name = "SHELL", default_value_t = ShellKind::Sh)]
    pub shell: ShellKind,

    #[command(flatten)]
    pub output: JsonArg,

    /// Also turn persistence mode on for the selected GPUs (root): the driver stays loaded
    /// between jobs, so the next one starts without the initialisation delay.
    #[arg(long)]
    pub persistence: bool,

    /// The GPUs for --persistence and for the share policy (index, UUID or bus id).
    /// Repeat for several. Default: every GPU.
    #[arg(long = "gpu", value_name = "GPU")]
    pub gpus: Vec<String>,

    /// The command to run with the settings, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<std::ffi::OsString>,
}

fn parse_amount(text: &str) -> Result<Amount, String> {
    units::parse_amount(text)
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    units::parse_duration(text)
}

#[derive(Debug, Clone, Default, Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,

    #[command(flatten)]
    pub output: JsonArg,

    /// Refresh every SECONDS (fractions allowed) until interrupted; with --json, one
    /// document per line at each refresh.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, allow_negative_numbers = true)]
    pub watch: Option<Duration>,

    /// How long NVML may take to answer for one GPU (default: GPUCTL_NVML_TIMEOUT, else the
    /// configuration's nvml_timeout, else 10s). A GPU that has not answered by then is shown
    /// as not answering (exit status 1) and the others as read; info never waits longer
    /// than this and a second.
    #[arg(long, value_name = "DURATION", value_parser = parse_nonzero_duration)]
    pub timeout: Option<Duration>,

    /// Totals instead of the per-GPU view: one row per user, per owner (Slurm job, systemd
    /// unit, container, Kubernetes pod), or per Kubernetes namespace, with the memory and the
    /// GPUs it holds. With --json, the document gains a `totals` list.
    #[arg(long, value_enum, value_name = "GROUP")]
    pub by: Option<GroupBy>,

    /// Look for the processes holding each GPU's device file (/dev/nvidiaN) that NVML does
    /// not list on it, and say what each is suspected to be. The scan reads every process's
    /// open files, so it runs only when asked: without it, the table says where a GPU has
    /// at least `holders_threshold` (default 1 GiB) of memory no listed process accounts
    /// for and no one looked. With --json, each device then carries `holders`.
    #[arg(long)]
    pub holders: bool,

    /// Only the processes the watchdog finds idle (memory held with SM under
    /// `[idle] util_below` for `[idle] after`), longest idle first: how long, since when, the
    /// memory, how much of the window was measured. Read from the watchdog's findings, so it
    /// works as soon as gpuctl starts. With --json, the document's processes are those.
    #[arg(long, conflicts_with_all = ["by", "holders"])]
    pub idle: bool,
}

#[derive(Debug, Clone, Default, Args)]
pub struct HealthArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,

    #[command(flatten)]
    pub output: JsonArg,

    /// Acknowledge this GPU's Xids up to now (index, UUID or PCI bus id; repeat for
    /// several): on a driver without the recovery-action field they then hold no action,
    /// and stay listed as history. Written to the watchdog's state directory (root's).
    #[arg(long = "ack", value_name = "GPU")]
    pub ack: Vec<String>,

    /// How long NVML may take to answer for one GPU (default: GPUCTL_NVML_TIMEOUT, else the
    /// configuration's nvml_timeout, else 10s). A GPU that has not answered by then is
    /// listed without a verdict (exit status 1, unless another GPU needs an action).
    #[arg(long, value_name = "DURATION", value_parser = parse_nonzero_duration)]
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,

    /// Refresh every SECONDS (fractions allowed, at least 0.1).
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_seconds, allow_negative_numbers = true)]
    pub interval: Duration,
}

/// What `info --by` groups processes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GroupBy {
    User,
    Owner,
    /// The Kubernetes namespace of each pod, as the node's container runtime names it.
    Namespace,
}

/// A duration above zero.
fn parse_nonzero_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        duration if duration.is_zero() => Err(format!("'{text}': give a duration above zero")),
        duration => Ok(duration),
    }
}

/// A positive, finite number of seconds, at least 0.1.
fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number of seconds"))?;
    if !seconds.is_finite() || seconds < 0.1 {
        return Err(format!(
            "'{text}' is out of range: give at least 0.1 seconds"
        ));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("'{text}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_seconds_validation() {
        assert_eq!(parse_seconds("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_seconds("0.5").unwrap(), Duration::from_millis(500));
        for bad in ["0", "-1", "0.05", "NaN", "inf", "abc", "", "1e400"] {
            assert!(parse_seconds(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
