//! The arguments of the commands that end processes or reset GPU state (`kill`, `clear`,
//! `reset`), and their translation into gpuctl-core's reclaim requests.

use std::time::Duration;

use clap::Args;
use gpuctl_core::act::Signal;
use gpuctl_core::cardset::ResetItem;
use gpuctl_core::reclaim::{ClearRequest, Ending, KillRequest, ResetRequest};
use gpuctl_core::select::OwnerMatch;
use gpuctl_core::units::{self, Amount};

use super::{DryRunArg, GpuArgs, JsonArg, parse_amount, parse_duration};

#[derive(Debug, Clone, Args)]
pub struct ResetArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,

    /// Application clocks back to their default.
    #[arg(long)]
    pub application_clocks: bool,

    /// Release locked GPU clocks.
    #[arg(long)]
    pub locked_clocks: bool,

    /// Release locked memory clocks.
    #[arg(long)]
    pub memory_locked_clocks: bool,

    /// Compute mode back to DEFAULT.
    #[arg(long)]
    pub compute_mode: bool,

    /// Clear accounting's records of finished processes.
    #[arg(long)]
    pub accounting: bool,

    /// Clear gpuctl's peak memory marks.
    #[arg(long)]
    pub peaks: bool,

    /// Reset the GPUs named with --gpu themselves (what a pending row remap, a page
    /// retirement or an Xid's gpu_reset needs), and nothing else: refused, naming every
    /// holder, while any process uses the GPU (listed by NVML, or holding its device file).
    /// With none, done through NVML where the driver offers it (drain, remove, rediscover),
    /// else with nvidia-smi --gpu-reset. The GPU's Xids up to then are acknowledged.
    #[arg(
        long,
        conflicts_with_all = [
            "application_clocks",
            "locked_clocks",
            "memory_locked_clocks",
            "compute_mode",
            "accounting",
            "peaks",
        ]
    )]
    pub gpu_reset: bool,

    #[command(flatten)]
    pub plan: DryRunArg,

    #[command(flatten)]
    pub output: JsonArg,
}

// How targets are ended.
#[derive(Debug, Clone, Args)]
pub struct SignalArgs {
    /// The first signal, by name or number (TERM, INT, HUP, KILL, 15, ...).
    #[arg(long, value_name = "SIGNAL", default_value = "TERM", value_parser = parse_signal)]
    pub signal: Signal,

    /// How long to wait for the process to exit after the first signal before SIGKILL, and
    /// for NVML to show its memory released (10s, 500ms, 2m).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct KillArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,

    /// This process. Repeat for several. A pid that is not using a GPU is refused.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Processes of this user (name or uid). Repeat for several.
    #[arg(long = "user", value_name = "USER", value_parser = parse_user)]
    pub users: Vec<u32>,

    /// Processes of this owner, from their cgroup: slurm:JOBID, pod:UID, container:ID,
    /// unit:NAME (a system unit), unit:NAME@UID (a unit of user UID's own manager) or
    /// scope:NAME (ids by a prefix of at least 8 characters); pods also by the
    /// names the node's container runtime gives them, pod:NAMESPACE/NAME and
    /// namespace:NAMESPACE (globs: pod:ml/trainer-*). Repeat for several.
    /// slurm:JOBID is the job as Slurm's cgroups name it; processes that only their
    /// environment ties to the job (proctrack/linuxproc, shown "(env)") are matched by
    /// slurm:JOBID@UID alone, the job as user UID's processes claim it: any user can set
    /// SLURM_JOB_ID. The Slurm epilog ends a finished job's leftovers of the job's own user
    /// only.
    #[arg(long = "owner", value_name = "KIND:ID")]
    pub owners: Vec<OwnerMatch>,

    /// Leftovers of crashed runs, as `gpuctl clear` finds them.
    #[arg(long)]
    pub stale: bool,

    /// Processes holding at least SIZE of GPU memory in all (512MiB, 40GiB, 1.5GB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub min_mem: Option<u64>,

    /// Processes running for at least DURATION (90s, 2h, 3d).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Option<Duration>,

    /// Every GPU process the other selectors allow. Needs --yes, or a confirmation on a
    /// terminal.
    #[arg(long)]
    pub all: bool,

    #[command(flatten)]
    pub how: SignalArgs,

    /// Do not ask before signalling several users' processes, or with --all.
    #[arg(long, short = 'y')]
    pub yes: bool,

    /// End a CUDA MPS server or control daemon that --pid names, and with it every client
    /// it serves. Without it they are never signalled; their skip names the clients.
    #[arg(long)]
    pub force: bool,

    #[command(flatten)]
    pub plan: DryRunArg,

    #[command(flatten)]
    pub output: JsonArg,
}

#[derive(Debug, Clone, Args)]
pub struct ClearArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,

    /// Also reclaim stopped processes (state T).
    #[arg(long)]
    pub include_stopped: bool,

    /// Also end the processes holding a GPU's device file (/dev/nvidiaN) that NVML does not
    /// list on it and that no live job claims: a zombie or exiting process, one in a
    /// container's PID namespace, one nothing places (see `gpuctl info --holders`). Never a
    /// protected program, a process NVML lists on another GPU, or a process of a job NVML
    /// lists alive.
    #[arg(long)]
    pub holders: bool,

    /// Then wait until the selected GPUs (or MIG instances: their own memory) are free (see
    /// --min-free), for at most TIMEOUT: `--wait 2m` or `--wait=2m`; a bare --wait (followed
    /// by an option or nothing) waits 60s. Not free by then: exit status 4.
    #[arg(
        long,
        value_name = "TIMEOUT",
        num_args = 0..=1,
        default_missing_value = "60s",
        value_parser = parse_duration
    )]
    pub wait: Option<Duration>,

    /// What --wait waits for: at least this much free memory on each selected GPU, as a size
    /// (130GiB) or a percentage of its memory (90%). Default: no process left on the GPU and
    /// under 256 MiB in use.
    #[arg(long, value_name = "AMOUNT", value_parser = parse_amount, requires = "wait")]
    pub min_free: Option<Amount>,

    #[command(flatten)]
    pub how: SignalArgs,

    #[command(flatten)]
    pub plan: DryRunArg,

    #[command(flatten)]
    pub output: JsonArg,
}

impl SignalArgs {
    /// The request's form of these flags.
    pub fn ending(&self) -> Ending {
        Ending {
            signal: self.signal,
            timeout: self.timeout,
        }
    }
}

impl KillArgs {
    /// A `KillRequest` field as the flag that sets it, for core's errors that name fields
    /// ("no process selected: give --pid, ...").
    pub fn flag(field: &str) -> Option<&'static str> {
        Some(match field {
            "gpus" => "--gpu",
            "pids" => "--pid",
            "uids" => "--user",
            "owners" => "--owner",
            "stale" => "--stale",
            "min_bytes" => "--min-mem",
            "older_than" => "--older-than",
            "all" => "--all",
            _ => return None,
        })
    }

    /// What these arguments ask of gpuctl-core.
    pub fn request(&self) -> KillRequest {
        KillRequest {
            gpus: self.gpu.gpus.clone(),
            pids: self.pids.clone(),
            // The command line names pids; a process identity is a view's (`top`).
            processes: Vec::new(),
            uids: self.users.clone(),
            owners: self.owners.clone(),
            stale: self.stale,
            min_bytes: self.min_mem,
            older_than: self.older_than,
            all: self.all,
            ending: self.how.ending(),
            force: self.force,
            dry_run: self.plan.dry_run,
        }
    }
}

impl ClearArgs {
    /// What these arguments ask of gpuctl-core.
    pub fn request(&self) -> ClearRequest {
        ClearRequest {
            gpus: self.gpu.gpus.clone(),
            include_stopped: self.include_stopped,
            holders: self.holders,
            wait: self.wait,
            min_free: self.min_free,
            ending: self.how.ending(),
            dry_run: self.plan.dry_run,
        }
    }
}

impl ResetArgs {
    /// What these arguments ask of gpuctl-core: the items named, or with none every item.
    pub fn request(&self) -> ResetRequest {
        let items = [
            (self.application_clocks, ResetItem::ApplicationClocks),
            (self.locked_clocks, ResetItem::LockedClocks),
            (self.memory_locked_clocks, ResetItem::MemoryLockedClocks),
            (self.compute_mode, ResetItem::ComputeMode),
            (self.accounting, ResetItem::AccountingPids),
            (self.peaks, ResetItem::PeakMarks),
        ]
        .into_iter()
        .filter_map(|(wanted, item)| wanted.then_some(item))
        .collect();
        ResetRequest {
            gpus: self.gpu.gpus.clone(),
            items,
            dry_run: self.plan.dry_run,
        }
    }
}

fn parse_signal(text: &str) -> Result<Signal, String> {
    Signal::parse(text)
}

/// A user name or uid, as a uid.
fn parse_user(user: &str) -> Result<u32, String> {
    gpuctl_core::host::uid_of(user)
}

fn parse_size(text: &str) -> Result<u64, String> {
    units::parse_size(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;

    #[test]
    fn each_selector_of_a_kill_request_is_a_flag_of_kill() {
        use clap::CommandFactory;
        let mut command = Cli::command();
        // The subcommands' options are deferred until the command is built.
        command.build();
        let kill = command.find_subcommand("kill").unwrap();
        for field in gpuctl_core::reclaim::KillRequest::SELECTORS {
            let flag = KillArgs::flag(field).unwrap_or_else(|| panic!("{field} has no flag"));
            let long = flag.trim_start_matches("--");
            assert!(
                kill.get_arguments().any(|a| a.get_long() == Some(long)),
                "{flag} is not a flag of kill"
            );
        }
    }
}
