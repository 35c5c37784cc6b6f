//! A real single-node Slurm (Debian's slurmctld, slurmd and munged) in a scratch directory:
//! its own munge key and socket, configuration, state, spool, logs and free ports. The
//! daemons are children of the test process and are stopped by PID when the cluster is
//! dropped (or the test process dies: they get SIGTERM as their parent goes).
//!
//! Slurm runs the Prolog, Epilog and HealthCheckProgram with a clean environment (no PATH,
//! nothing of slurmd's), so the cluster points them at small generated wrappers that export
//! the caller's variables and exec the real script.

use std::fmt::Write as _;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::util::{Fetch, tail};

/// How long the waiting loops poll before they give up, unless told otherwise.
pub const WAIT: Duration = Duration::from_secs(30);
/// How often they poll.
const POLL: Duration = Duration::from_millis(100);
/// A client command (srun, sbatch, scontrol, ...) that runs longer is killed: a failure.
const CLIENT_LIMIT: Duration = Duration::from_secs(120);

/// In the environment of the daemons (only): a script that has it got slurmd's environment.
pub const DAEMON_MARK: &str = "GPUCTL_SLURM_DAEMON";

/// Slurm's process tracking: which plugin finds (and kills) a job's processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracking {
    /// proctrack/cgroup: a job's processes in the freezer cgroup
    /// `/slurm_<host>/uid_<uid>/job_<id>/step_<n>`, all killed when the job ends.
    Cgroup,
    /// proctrack/linuxproc: the process tree under slurmstepd; background children that
    /// left it outlive the job (carrying SLURM_JOB_ID).
    Linuxproc,
}

impl Tracking {
    pub fn name(self) -> &'static str {
        match self {
            Tracking::Cgroup => "cgroup",
            Tracking::Linuxproc => "linuxproc",
        }
    }
}

/// What the cluster is made of, beyond the fixed configuration.
#[derive(Clone, Debug, Default)]
pub struct ClusterSpec {
    /// GPUs of the node (`Gres=gpu:<gpus>`); at least 1.
    pub gpus: usize,
    /// The directory holding the character devices `nvidia0` .. `nvidia<gpus-1>` (gres.conf
    /// `File=`): nvml-sim makes them for a scenario's `device_dir`.
    pub dev_dir: PathBuf,
    /// The real scripts (executables) behind Prolog=, Epilog= and HealthCheckProgram=.
    pub prolog: Option<PathBuf>,
    pub epilog: Option<PathBuf>,
    pub health_check: Option<PathBuf>,
    /// HealthCheckInterval= in seconds. 0 (Slurm's default): slurmd never runs the health
    /// check; else at its start, before it registers, and then every so many seconds.
    pub health_check_interval: u32,
    /// Exported by the wrappers before they exec the real scripts (Slurm's own variables,
    /// SLURM_JOB_ID and the like, pass through).
    pub script_env: Vec<(String, String)>,
}

/// How `sbatch` gets its job.
#[derive(Clone, Copy, Debug)]
pub enum Batch<'a> {
    /// A batch script's text (starting `#!`).
    Script(&'a str),
    /// A command line, as `sbatch --wrap`.
    Wrap(&'a str),
}

/// Runs scripts/fetch-slurm once per process: Ok(version) or Err(its one-line reason).
pub fn ensure_slurm() -> Result<&'static str, String> {
    static SLURM: Fetch = Fetch::new("fetch-slurm");
    SLURM.once()
}

/// PATH with the system's sbin directories, where the daemons live.
fn search_path() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    format!("{path}:/usr/sbin:/sbin:/usr/bin:/bin")
}

/// The short host name, as slurmd registers itself.
fn short_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(rc, 0, "gethostname failed");
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    name.split('.').next().unwrap_or(&name).to_string()
}

/// Two TCP ports free now (both held while the second is chosen, so they differ).
fn free_ports() -> (u16, u16) {
    let a = TcpListener::bind("0.0.0.0:0").expect("bind a free port");
    let b = TcpListener::bind("0.0.0.0:0").expect("bind a free port");
    (
        a.local_addr().expect("port").port(),
        b.local_addr().expect("port").port(),
    )
}

/// A job id range of its own: clusters side by side on one host (the other mode, another
/// run, a cluster started by hand) share the freezer hierarchy `/slurm_<host>/uid_0`, so
/// their jobs must not share `job_<id>` names.
fn first_job_id() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 ^ d.as_secs())
        .unwrap_or(0);
    let salt = (u64::from(std::process::id()) * 7919 + nanos) % 500_000;
    // Slurm job ids stay below 0x03ff_ffff; a step of 100 leaves each cluster a range.
    1_000_000 + salt * 100
}

/// Single-quoted for sh.
fn sh_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

fn is_shell_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// `command`'s output, killed and reported as a failure after `limit`.
fn output_within(mut command: Command, limit: Duration) -> Result<Output, String> {
    let what = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("{what}: {e}"))? {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what} still ran after {limit:?}: killed"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    })
}

/// Sends `signal` to `pid` (nothing if it is gone).
fn signal(pid: u32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// SIGTERM, up to `grace` to exit, then SIGKILL; reaped.
fn stop_child(child: &mut Child, grace: Duration) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    signal(child.id(), libc::SIGTERM);
    let start = Instant::now();
    while start.elapsed() < grace {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The processes (other than this one) whose environment holds `marker` (`NAME=value`).
fn processes_with_env(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|&b| b == 0).any(|var| var == marker.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// Reaps this process's zombie children named slurmstepd: the ones slurmd daemonized for
/// every job and step, orphaned to this process (their subreaper) when they end.
fn reap_stepd_zombies() {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let mut rest = stat[close + 1..].split_whitespace();
        let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse::<u32>().ok()));
        if comm == "slurmstepd" && state == Some("Z") && ppid == Some(me) {
            // SAFETY: waitpid on a pid; no memory is shared.
            unsafe {
                libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
    }
}

/// A running single-node Slurm cluster; stopped when dropped.
pub struct Cluster {
    tracking: Tracking,
    host: String,
    dir: tempfile::TempDir,
    conf: PathBuf,
    munged: Option<Child>,
    slurmctld: Option<Child>,
    slurmd: Option<Child>,
}

impl Cluster {
    /// Installs Slurm if needed (scripts/fetch-slurm, once per process), writes the
    /// configuration, starts munged, slurmctld and slurmd, and waits for the node to be
    /// idle. `Err`: why it could not, with the daemons' logs.
    pub fn try_start(tracking: Tracking, spec: ClusterSpec) -> Result<Cluster, String> {
        ensure_slurm()?;
        // slurmd's daemonized slurmstepd processes (and jobs' orphans) are reparented to
        // this process rather than to init, so that `stop` can reap them.
        // SAFETY: prctl with integer arguments.
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
        }
        if spec.gpus == 0 {
            return Err("ClusterSpec.gpus: a node needs at least one GPU".into());
        }
        for k in 0..spec.gpus {
            let dev = spec.dev_dir.join(format!("nvidia{k}"));
            match std::fs::metadata(&dev) {
                Ok(meta) if meta.file_type().is_char_device() => {}
                Ok(_) => {
                    return Err(format!(
                        "{} is not a character device (Slurm's gres.conf accepts only \
                         devices; nvml-sim makes them only as root)",
                        dev.display()
                    ));
                }
                Err(e) => return Err(format!("{}: {e}", dev.display())),
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("gpuctl-slurm-")
            .tempdir()
            .map_err(|e| format!("cannot make the cluster's directory: {e}"))?;
        let mut cluster = Cluster {
            tracking,
            host: short_hostname(),
            conf: dir.path().join("slurm.conf"),
            dir,
            munged: None,
            slurmctld: None,
            slurmd: None,
        };
        // On an error the daemons started so far are stopped by Drop.
        cluster.write_files(&spec)?;
        cluster.start_daemons()?;
        cluster.try_wait_node_idle(WAIT)?;
        Ok(cluster)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write_files(&self, spec: &ClusterSpec) -> Result<(), String> {
        let write = |rel: &str, text: &str, mode: u32| -> Result<PathBuf, String> {
            let path = self.path(rel);
            std::fs::write(&path, text)
                .and_then(|()| {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                })
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(path)
        };
        for sub in ["munge", "state", "spool", "run", "log", "wrappers", "jobs"] {
            std::fs::create_dir_all(self.path(sub))
                .map_err(|e| format!("cannot make {sub}: {e}"))?;
        }
        std::fs::set_permissions(self.path("munge"), std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("munge directory: {e}"))?;
        let mut key = vec![0u8; 1024];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .map_err(|e| format!("cannot read /dev/urandom for the munge key: {e}"))?;
        std::fs::write(self.path("munge/munge.key"), &key)
            .and_then(|()| {
                std::fs::set_permissions(
                    self.path("munge/munge.key"),
                    std::fs::Permissions::from_mode(0o600),
                )
            })
            .map_err(|e| format!("cannot write the munge key: {e}"))?;

        for (name, _) in &spec.script_env {
            if !is_shell_name(name) {
                return Err(format!("ClusterSpec.script_env: {name:?} is no shell name"));
            }
        }
        let wrapper = |kind: &str, target: &Option<PathBuf>| -> Result<Option<PathBuf>, String> {
            let Some(target) = target else {
                return Ok(None);
            };
            let mut text = String::from("#!/bin/sh\n# Slurm runs this with a clean environment.\n");
            for (name, value) in &spec.script_env {
                let _ = writeln!(text, "export {name}={}", sh_quote(value));
            }
            // Slurm gives the Prolog and Epilog SLURM_CONF, but not the health check: on a
            // real node scontrol finds /etc/slurm/slurm.conf; here it is told where ours is.
            let _ = writeln!(
                text,
                "[ -n \"${{SLURM_CONF:-}}\" ] || SLURM_CONF={}\nexport SLURM_CONF",
                sh_quote(&self.conf.display().to_string())
            );
            let _ = writeln!(
                text,
                "exec {} \"$@\"",
                sh_quote(&target.display().to_string())
            );
            write(&format!("wrappers/{kind}"), &text, 0o755).map(Some)
        };
        let prolog = wrapper("prolog", &spec.prolog)?;
        let epilog = wrapper("epilog", &spec.epilog)?;
        let health = wrapper("healthcheck", &spec.health_check)?;

        let d = self.dir.path().display();
        let host = &self.host;
        let (ctld_port, slurmd_port) = free_ports();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut conf = format!(
            "ClusterName=gpuctl{mode}\n\
             SlurmctldHost={host}\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={d}/munge/munge.sock\n\
             CredType=cred/munge\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             StateSaveLocation={d}/state\n\
             SlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/run/slurmctld.pid\n\
             SlurmdPidFile={d}/run/slurmd.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\n\
             SlurmdLogFile={d}/log/slurmd.log\n\
             SlurmctldPort={ctld_port}\n\
             SlurmdPort={slurmd_port}\n\
             ProctrackType=proctrack/{mode}\n\
             TaskPlugin=task/none\n\
             SchedulerType=sched/builtin\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             SchedulerParameters=batch_sched_delay=0\n\
             ReturnToService=2\n\
             MpiDefault=none\n\
             FirstJobId={first_job}\n\
             GresTypes=gpu\n",
            mode = self.tracking.name(),
            first_job = first_job_id(),
        );
        // gpuctl's lines as docs/guide/slurm.md gives them to admins (packaging/slurm's example),
        // with the scripts behind this cluster's wrappers and the test's interval.
        let example =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/slurm/slurm.conf.example");
        let example =
            std::fs::read_to_string(&example).map_err(|e| format!("{}: {e}", example.display()))?;
        for line in example.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let script = [
                ("prolog", &prolog),
                ("epilog", &epilog),
                ("healthcheck", &health),
            ]
            .into_iter()
            .find(|(name, _)| line.ends_with(&format!("/usr/share/gpuctl/slurm/{name}.sh")));
            match script {
                Some((_, None)) => continue,
                Some((_, Some(wrapper))) => {
                    let key = line.split('=').next().unwrap_or_default();
                    let _ = writeln!(conf, "{key}={}", wrapper.display());
                }
                None if line.starts_with("HealthCheckInterval=") => {
                    let _ = writeln!(conf, "HealthCheckInterval={}", spec.health_check_interval);
                }
                None => {
                    let _ = writeln!(conf, "{line}");
                }
            }
        }
        let _ = write!(
            conf,
            "NodeName={host} CPUs={cpus} Gres=gpu:{gpus} State=UNKNOWN\n\
             PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
            gpus = spec.gpus
        );
        write("slurm.conf", &conf, 0o644)?;
        let files = if spec.gpus == 1 {
            "nvidia0".to_string()
        } else {
            format!("nvidia[0-{}]", spec.gpus - 1)
        };
        write(
            "gres.conf",
            &format!("Name=gpu File={}/{files}\n", spec.dev_dir.display()),
            0o644,
        )?;
        write(
            "cgroup.conf",
            "CgroupMountpoint=/sys/fs/cgroup\nCgroupPlugin=cgroup/v1\n",
            0o644,
        )?;
        Ok(())
    }

    /// A daemon, in the foreground, in a session of its own, its output in log/<name>.out;
    /// SIGTERM when this process dies.
    fn daemon(&self, program: &str, args: &[&str], name: &str) -> Result<Child, String> {
        let out = std::fs::File::create(self.path(&format!("log/{name}.out")))
            .map_err(|e| format!("cannot create {name}'s output file: {e}"))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{name}'s output file: {e}"))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .env("PATH", search_path())
            // Also how the processes of this cluster (slurmstepd, job tasks) are told apart
            // from any other's when it stops.
            .env("SLURM_CONF", &self.conf)
            .env(DAEMON_MARK, "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        command
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))
    }

    fn start_daemons(&mut self) -> Result<(), String> {
        let munge = |f: &str| self.path(&format!("munge/{f}")).display().to_string();
        let munged = self.daemon(
            &self.find("munged")?,
            &[
                "-F",
                "-f",
                &format!("--key-file={}", munge("munge.key")),
                &format!("--socket={}", munge("munge.sock")),
                &format!("--pid-file={}", munge("munged.pid")),
                &format!("--seed-file={}", munge("seed")),
            ],
            "munged",
        )?;
        self.munged = Some(munged);
        let socket = self.path("munge/munge.sock");
        self.poll(WAIT, "munged's socket", |c| {
            c.check_alive()?;
            Ok(socket.exists().then_some(()))
        })?;
        let conf = self.conf.display().to_string();
        let ctld = self.daemon(&self.find("slurmctld")?, &["-D", "-f", &conf], "slurmctld")?;
        self.slurmctld = Some(ctld);
        let slurmd = self.daemon(&self.find("slurmd")?, &["-D", "-f", &conf], "slurmd")?;
        self.slurmd = Some(slurmd);
        Ok(())
    }

    fn find(&self, tool: &str) -> Result<String, String> {
        search_path()
            .split(':')
            .map(|dir| Path::new(dir).join(tool))
            .find(|p| p.is_file())
            .map(|p| p.display().to_string())
            .ok_or_else(|| format!("{tool} is not installed (scripts/fetch-slurm installs it)"))
    }

    /// Err when a daemon has exited.
    fn check_alive(&mut self) -> Result<(), String> {
        for (name, child) in [
            ("munged", &mut self.munged),
            ("slurmctld", &mut self.slurmctld),
            ("slurmd", &mut self.slurmd),
        ] {
            if let Some(c) = child
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(format!("{name} exited ({status})"));
            }
        }
        Ok(())
    }

    /// Polls `probe` until it gives a value; Err names `what` with the logs on timeout, or
    /// the probe's error.
    fn poll<T>(
        &mut self,
        limit: Duration,
        what: &str,
        mut probe: impl FnMut(&mut Self) -> Result<Option<T>, String>,
    ) -> Result<T, String> {
        let start = Instant::now();
        loop {
            match probe(self) {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(e) => return Err(format!("waiting for {what}: {e}\n{}", self.logs())),
            }
            if start.elapsed() > limit {
                return Err(format!(
                    "waited {limit:?} for {what}, in vain\n{}",
                    self.logs()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    pub fn tracking(&self) -> Tracking {
        self.tracking
    }

    /// The node's (and SlurmctldHost's) name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// What a command the test runs itself needs to talk to this cluster.
    fn slurm_env(&self) -> Vec<(String, String)> {
        vec![
            ("SLURM_CONF".into(), self.conf.display().to_string()),
            ("PATH".into(), search_path()),
        ]
    }

    /// A Slurm client (srun, sbatch, scontrol, squeue, sinfo, scancel) for this cluster.
    fn command(&self, tool: &str) -> Command {
        let mut command = Command::new(self.find(tool).unwrap_or_else(|e| panic!("{e}")));
        command
            .envs(self.slurm_env())
            .current_dir(self.path("jobs"));
        command
    }

    fn client(&self, tool: &str, args: &[&str]) -> Output {
        let mut command = self.command(tool);
        command.args(args);
        output_within(command, CLIENT_LIMIT).unwrap_or_else(|e| panic!("{e}\n{}", self.logs()))
    }

    /// `srun ARGS` to its end (killed after two minutes: a failure).
    pub fn srun(&self, args: &[&str]) -> Output {
        self.client("srun", args)
    }

    /// `scontrol ARGS`.
    pub fn scontrol(&self, args: &[&str]) -> Output {
        self.client("scontrol", args)
    }

    /// Submits a batch job (output to `jobs/slurm-<id>.out` unless `extra` says otherwise);
    /// its id. Panics when sbatch fails.
    pub fn sbatch(&self, job: Batch<'_>, extra: &[&str]) -> u64 {
        let jobs = self.path("jobs");
        let output_arg = format!("--output={}/slurm-%j.out", jobs.display());
        let mut args: Vec<String> = vec!["--parsable".into(), output_arg];
        args.extend(extra.iter().map(|s| s.to_string()));
        match job {
            Batch::Wrap(command) => args.push(format!("--wrap={command}")),
            Batch::Script(text) => {
                let path = jobs.join(format!(
                    "batch-{}.sh",
                    SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos())
                ));
                std::fs::write(&path, text).expect("write the batch script");
                args.push(path.display().to_string());
            }
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.client("sbatch", &refs);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let id = stdout.trim().split(';').next().unwrap_or("").parse::<u64>();
        match (out.status.success(), id) {
            (true, Ok(id)) => id,
            _ => panic!(
                "sbatch {refs:?} failed ({}): {}{}\n{}",
                out.status,
                stdout,
                String::from_utf8_lossy(&out.stderr),
                self.logs()
            ),
        }
    }

    /// What a batch job wrote to its default output file ("" while there is none).
    pub fn job_output(&self, id: u64) -> String {
        std::fs::read_to_string(self.path(&format!("jobs/slurm-{id}.out"))).unwrap_or_default()
    }

    /// The job's `JobState` (COMPLETING while its epilog runs), None once Slurm has
    /// forgotten it.
    pub fn job_state(&self, id: u64) -> Option<String> {
        let out = self.scontrol(&["-o", "show", "job", &id.to_string()]);
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || text.trim().is_empty() {
            return None;
        }
        field(&text, "JobState").map(str::to_string)
    }

    /// Waits until the job is over (its epilog done): its final state (COMPLETED, FAILED,
    /// CANCELLED, TIMEOUT, NODE_FAIL, ...), or "GONE" when Slurm no longer knows it.
    /// Panics on timeout, naming the job's last state.
    pub fn wait_job_done(&self, id: u64, timeout: Duration) -> String {
        const RUNNING: [&str; 6] = [
            "PENDING",
            "CONFIGURING",
            "RUNNING",
            "COMPLETING",
            "SUSPENDED",
            "REQUEUED",
        ];
        let start = Instant::now();
        let mut last: String;
        loop {
            match self.job_state(id) {
                None => return "GONE".into(),
                Some(state) if !RUNNING.contains(&state.as_str()) => return state,
                Some(state) => last = state,
            }
            if start.elapsed() > timeout {
                panic!(
                    "waited {timeout:?} for job {id} to end, in vain: still {last}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// The node's `State=` (IDLE, MIXED, IDLE+DRAIN, DOWN+NOT_RESPONDING, ...) and
    /// `Reason=` ("" when none; without the ` [user@time]` Slurm appends).
    pub fn node_state(&self) -> (String, String) {
        let out = self.scontrol(&["show", "node", &self.host]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "scontrol show node {} failed: {}",
            self.host,
            String::from_utf8_lossy(&out.stderr)
        );
        parse_node_state(&text)
    }

    /// Waits until the node is idle (not drained, not down); panics on timeout with its
    /// last state and reason.
    pub fn wait_node_idle(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            let (state, reason) = self.node_state();
            if state == "IDLE" {
                return;
            }
            if start.elapsed() > timeout {
                panic!(
                    "waited {timeout:?} for node {} to be IDLE, in vain: {state} ({reason})\n{}",
                    self.host,
                    self.logs()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    fn try_wait_node_idle(&mut self, timeout: Duration) -> Result<(), String> {
        let host = self.host.clone();
        let last = std::cell::RefCell::new(String::from("never shown"));
        self.poll(timeout, &format!("node {host} to be IDLE"), |c| {
            c.check_alive()?;
            let mut command = c.command("scontrol");
            command.args(["show", "node", &host]);
            let out = output_within(command, Duration::from_secs(20))?;
            let (state, reason) = parse_node_state(&String::from_utf8_lossy(&out.stdout));
            *last.borrow_mut() = format!("{state} ({reason})");
            Ok((state == "IDLE").then_some(()))
        })
        .map_err(|e| format!("{e}\nlast node state: {}", last.borrow()))
    }

    /// The last lines of the daemons' logs, for assertion messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for (name, path, lines) in [
            ("slurmctld", "log/slurmctld.log", 25),
            ("slurmd", "log/slurmd.log", 25),
            ("slurmctld stdout/stderr", "log/slurmctld.out", 5),
            ("slurmd stdout/stderr", "log/slurmd.out", 5),
            ("munged", "log/munged.out", 5),
        ] {
            let _ = writeln!(
                text,
                "--- {name} ({}) ---\n{}",
                self.tracking.name(),
                tail(&self.path(path), lines)
            );
        }
        text
    }

    /// Stops the cluster: slurmd and slurmctld (SIGTERM, then SIGKILL after 5 s), what is
    /// left of its jobs (slurmstepd and tasks, known by this cluster's SLURM_CONF in their
    /// environment), then munged. Done on drop too.
    pub fn stop(&mut self) {
        let grace = Duration::from_secs(5);
        for child in [&mut self.slurmd, &mut self.slurmctld]
            .into_iter()
            .flatten()
        {
            signal(child.id(), libc::SIGTERM);
        }
        for child in [&mut self.slurmd, &mut self.slurmctld] {
            if let Some(mut c) = child.take() {
                stop_child(&mut c, grace);
            }
        }
        let marker = format!("SLURM_CONF={}", self.conf.display());
        let leftovers = processes_with_env(&marker);
        for &pid in &leftovers {
            signal(pid, libc::SIGKILL);
        }
        // This process is their subreaper (see `try_start`): reap them, or they stay
        // zombies (a container's init may reap nothing).
        let start = Instant::now();
        let mut waiting = leftovers;
        while !waiting.is_empty() && start.elapsed() < grace {
            waiting.retain(|&pid| {
                // SAFETY: waitpid on a pid; no memory is shared.
                let rc = unsafe {
                    libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG)
                };
                rc == 0
            });
            std::thread::sleep(Duration::from_millis(20));
        }
        // munged in the foreground lingers on SIGTERM (seen: past 5 s); it keeps nothing
        // the tests need.
        if let Some(mut c) = self.munged.take() {
            stop_child(&mut c, Duration::from_millis(500));
        }
        reap_stepd_zombies();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `NAME=value` in scontrol's output (the value ends at white space).
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=");
    text.split_whitespace()
        .find_map(|word| word.strip_prefix(key.as_str()))
}

/// State and reason from `scontrol show node`: the reason runs to its line's end, less the
/// ` [user@time]` Slurm appends.
pub fn parse_node_state(text: &str) -> (String, String) {
    let state = field(text, "State").unwrap_or("").to_string();
    let reason = text
        .lines()
        .find_map(|line| line.trim_start().strip_prefix("Reason="))
        .map(|r| match r.rfind(" [") {
            Some(at) if r.ends_with(']') => &r[..at],
            _ => r,
        })
        .unwrap_or("")
        .trim()
        .to_string();
    (state, reason)
}
