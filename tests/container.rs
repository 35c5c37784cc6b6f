//! `gpuctl serve` and its clients in real kernel namespaces: `unshare --pid --fork
//! --mount-proc` stands in for a container without the host's PID namespace (Docker's
//! default, a pod without hostPID). Processes are started inside with nsenter, NVML is
//! nvml-sim (which, inside, lists the host PIDs as the driver does, and learns of their
//! deaths from the service's instance on the host, through the file beside the scenario),
//! and the service runs on the host on a socket of each test's own.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

/// Fails the test with one line where a tool it needs is missing.
fn require(tool: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
    assert!(
        found,
        "{tool} is not installed: the container tests need util-linux's unshare, nsenter and setpriv"
    );
}

/// A stand-in container: a PID namespace (and, rootless, a user namespace) with its own
/// /proc, whose init sleeps. Everything in it is SIGKILLed on drop.
struct Container {
    unshare: Child,
    /// The namespace's init (pid 1 inside), by its host pid.
    init: u32,
    namespace: u64,
    rootless: bool,
}

impl Container {
    fn start() -> Container {
        Container::start_as(None, None)
    }

    /// `unshare --user --map-root-user --pid --fork --mount-proc`, run by `uid` (not root):
    /// root inside is `uid` outside; the host's `dir` is mounted read-only inside, as the
    /// guide mounts the service's directory (docs/guide/containers.md:
    /// `-v /run/gpuctl:/run/gpuctl:ro`).
    fn rootless_with_read_only(uid: u32, dir: &Path) -> Container {
        Container::start_as(Some(uid), Some(dir))
    }

    fn start_as(uid: Option<u32>, read_only: Option<&Path>) -> Container {
        for tool in ["unshare", "nsenter", "setpriv"] {
            require(tool);
        }
        let mut command = match uid {
            None => Command::new("unshare"),
            Some(uid) => {
                let mut command = setpriv(uid);
                command.arg("unshare");
                command.args(["--user", "--map-root-user"]);
                command
            }
        };
        command.args(["--pid", "--fork", "--mount-proc", "--"]);
        match read_only {
            None => command.args(["sleep", "100000"]),
            Some(dir) => command
                .args([
                    "sh",
                    "-c",
                    "mount --bind -o ro \"$1\" \"$1\" && exec sleep 100000",
                    "sh",
                ])
                .arg(dir),
        };
        command.stdin(Stdio::null()).stderr(Stdio::piped());
        let mut unshare = command.spawn().expect("start unshare");
        let launcher = unshare.id();
        let mut init = None;
        wait_until(Duration::from_secs(10), || {
            init = children_of(launcher).into_iter().find(|&pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
            });
            if init.is_none() && unshare.try_wait().ok().flatten().is_some() {
                let mut err = String::new();
                let _ = unshare.stderr.take().unwrap().read_to_string(&mut err);
                panic!("unshare failed: {}", err.trim());
            }
            init.is_some()
        });
        let init = init.unwrap();
        let namespace = std::fs::metadata(format!("/proc/{init}/ns/pid"))
            .expect("the container's PID namespace")
            .ino();
        Container {
            unshare,
            init,
            namespace,
            rootless: uid.is_some(),
        }
    }

    /// `program args` run inside (nsenter: its PID, mount and, rootless, user namespace,
    /// where it is root).
    fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut command = Command::new("nsenter");
        command.args(["--target", &self.init.to_string(), "--pid", "--mount"]);
        if self.rootless {
            command.arg("--user");
        }
        command
            .arg("--")
            .arg(program)
            .args(args)
            .stdin(Stdio::null());
        command
    }

    /// `gpuctl ARGS` inside, against `sim`, asking the service at `socket`.
    fn gpuctl(&self, sim: &Sim, socket: &Path, args: &[&str]) -> Command {
        let inner = sim.gpuctl(args);
        let mut command = self.command(&gpuctl_bin(), args);
        for (key, value) in inner.get_envs() {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        command.env("GPUCTL_SOCKET", socket);
        if self.rootless {
            // Root inside a user namespace sees the host's root-owned files as nobody's,
            // so a library path fails root's trust check: the loader finds it by name,
            // as a container finds the driver's library the toolkit mounted.
            let dir = sim.dir.path().join("lib");
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap();
                std::fs::copy(sim_lib(), dir.join("libnvidia-ml.so.1")).unwrap();
                open_up(&dir);
            }
            // Its root may not trust the scratch directories either: no device directory.
            // Nor the host's configuration file (nobody's there): none, as in a container.
            command
                .env("GPUCTL_NVML_LIB", "libnvidia-ml.so.1")
                .env("LD_LIBRARY_PATH", &dir)
                .env("GPUCTL_CONFIG", "/dev/null")
                .env_remove("GPUCTL_DEV_DIR");
        }
        command
    }

    fn gpuctl_run(&self, sim: &Sim, socket: &Path, args: &[&str]) -> Run {
        Run::from(
            self.gpuctl(sim, socket, args)
                .output()
                .expect("run gpuctl inside"),
        )
    }

    /// `gpuctl info --json` inside, held to its published schema.
    fn info(&self, sim: &Sim, socket: &Path) -> serde_json::Value {
        let run = self.gpuctl_run(sim, socket, &["info", "--json"]);
        assert_eq!(run.code, 0, "info inside failed: {}", run.stderr);
        let info =
            serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout));
        crate::schema::conforms(&schema("info-v1.schema.json"), &info)
            .unwrap_or_else(|e| panic!("{e}"));
        info
    }

    /// A training process inside (its own session), ready: (host pid, local pid).
    fn trainer(&self) -> (Child, u32, u32) {
        let mut child = self
            .command(Path::new("setsid"), &[])
            .arg(testproc_bin())
            .args(["train.py", "--epochs", "90"])
            .env("GPUCTL_TESTPROC_MODE", "sleep")
            .env("GPUCTL_TESTPROC_READY", "1")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a trainer inside");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        let host = self.only_child_of(child.id());
        (child, host, self.local(host))
    }

    /// A run with `count` workers inside whose leader then crashes (SIGKILL): the workers
    /// live on, reparented to the container's init. Their host pids.
    fn crashed_run(&self, count: usize) -> Vec<u32> {
        let mut child = self
            .command(Path::new("setsid"), &[])
            .arg(testproc_bin())
            .args(["train.py", "--workers", &count.to_string()])
            .env("GPUCTL_TESTPROC_MODE", "run-with-workers")
            .env("GPUCTL_TESTPROC_WORKERS", count.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a run inside");
        let locals: Vec<u32> = BufReader::new(child.stdout.take().unwrap())
            .lines()
            .take(count)
            .map(|line| line.unwrap().trim().parse().unwrap())
            .collect();
        assert_eq!(locals.len(), count);
        let leader = self.only_child_of(child.id());
        // SAFETY: kill(2) on the run's leader, a process this test started.
        let killed = unsafe { libc::kill(leader as libc::pid_t, libc::SIGKILL) };
        assert_eq!(killed, 0, "crash the run's leader");
        child.wait().unwrap();
        locals.iter().map(|&local| self.host(local)).collect()
    }

    /// The one child of a host process (nsenter's, inside the namespace).
    fn only_child_of(&self, pid: u32) -> u32 {
        let mut found = None;
        wait_until(Duration::from_secs(5), || {
            found = children_of(pid).first().copied();
            found.is_some()
        });
        found.unwrap()
    }

    /// The pid a host process has inside.
    fn local(&self, host: u32) -> u32 {
        *nspid(host).expect("a process inside").last().unwrap()
    }

    /// The host pid of the process inside numbered `local`.
    fn host(&self, local: u32) -> u32 {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let inside = std::fs::metadata(format!("/proc/{pid}/ns/pid"))
                .is_ok_and(|meta| meta.ino() == self.namespace);
            if inside && nspid(pid).and_then(|ids| ids.last().copied()) == Some(local) {
                return pid;
            }
        }
        panic!("no process {local} in the container");
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // The init's death ends every process of its namespace.
        // SAFETY: kill(2) on the namespace's init, which this test started.
        unsafe { libc::kill(self.init as libc::pid_t, libc::SIGKILL) };
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// A reply line of the service, held to its published schema.
fn reply_of(line: &str) -> serde_json::Value {
    assert!(
        line.ends_with('\n') && line.trim_end().lines().count() == 1,
        "{line:?}"
    );
    let value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    crate::schema::conforms(&schema("serve-v1.schema.json"), &value)
        .unwrap_or_else(|e| panic!("{e}"));
    value
}

fn nspid(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().map(|f| f.parse().ok()).collect()
}

pub(crate) fn children_of(parent: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(parent) {
            children.push(pid);
        }
    }
    children
}

/// Alive as the driver sees it: not gone, not a zombie.
fn alive(pid: u32) -> bool {
    !matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// Makes a directory and its files readable and writable by all (a rootless container's
/// root is nobody on the host).
fn open_up(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        // The configuration's directory stays root's: root trusts nothing others may write.
        if entry.file_name() == "etc" {
            continue;
        }
        let mode = if entry.file_type().unwrap().is_dir() {
            0o777
        } else {
            0o666
        };
        let mode = if entry.file_name() == "libnvidia-ml.so.1" {
            0o755
        } else {
            mode
        };
        std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// `gpuctl serve` on the host against `sim`, on a socket of its own; stopped on drop.
/// (tests/docker.rs runs its containers against it too.)
pub(crate) struct Service {
    child: Child,
    pub(crate) socket: PathBuf,
}

impl Service {
    fn start(sim: &Sim) -> Service {
        let socket = sim.dir.path().join("api.sock");
        Service::start_at(sim, socket)
    }

    pub(crate) fn start_at(sim: &Sim, socket: PathBuf) -> Service {
        let child = sim
            .gpuctl(&["serve", "--socket", socket.to_str().unwrap()])
            .stderr(Stdio::null())
            .spawn()
            .expect("start gpuctl serve");
        let mut service = Service { child, socket };
        wait_until(Duration::from_secs(10), || {
            if let Ok(Some(status)) = service.child.try_wait() {
                panic!("gpuctl serve exited: {status}");
            }
            UnixStream::connect(&service.socket).is_ok()
        });
        service
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Every process the JSON document lists, over every GPU: (pid, GPU index, used bytes).
pub(crate) fn listed(info: &serde_json::Value) -> BTreeSet<(u64, u64, u64)> {
    info["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|gpu| {
            gpu["processes"].as_array().unwrap().iter().map(move |p| {
                (
                    p["pid"].as_u64().unwrap(),
                    gpu["index"].as_u64().unwrap(),
                    p["used_bytes"].as_u64().unwrap(),
                )
            })
        })
        .collect()
}

fn outside(info: &serde_json::Value, gpu: usize) -> u64 {
    info["devices"][gpu]["outside_namespace_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no outside_namespace_bytes on GPU {gpu}: {info}"))
}

/// One container's processes: its trainer and a crashed run's orphaned workers.
struct Tenant {
    container: Container,
    _trainer: Child,
    trainer_host: u32,
    trainer_local: u32,
    orphans: Vec<u32>,
}

impl Tenant {
    fn start(container: Container, orphans: usize) -> Tenant {
        let (trainer, trainer_host, trainer_local) = container.trainer();
        let orphans = container.crashed_run(orphans);
        Tenant {
            container,
            _trainer: trainer,
            trainer_host,
            trainer_local,
            orphans,
        }
    }

    fn orphan_locals(&self) -> Vec<u32> {
        self.orphans
            .iter()
            .map(|&h| self.container.local(h))
            .collect()
    }
}

/// Two containers share two GPUs with a host process. Inside each, `info` lists exactly
/// its own processes by its own pids, the rest as one number per GPU; `clear --wait` there
/// ends its own crashed run's workers only.
#[test]
fn each_container_sees_and_clears_only_its_own_processes() {
    let a = Tenant::start(Container::start(), 3);
    let b = Tenant::start(Container::start(), 2);
    let host = Proc::sleeper("nv-hostjob", &["--serve"]);
    // A trains on GPU 0, its crashed run's workers sit on GPU 1; B the other way round.
    let mut processes = vec![
        Process::new(a.trainer_host).on(0).used(10 * GIB),
        Process::new(b.trainer_host).on(1).used(8 * GIB),
        Process::new(host.pid()).on(0).used(4 * GIB),
    ];
    processes.extend(
        a.orphans
            .iter()
            .map(|&pid| Process::new(pid).on(1).used(2 * GIB)),
    );
    processes.extend(
        b.orphans
            .iter()
            .map(|&pid| Process::new(pid).on(0).used(GIB)),
    );
    let sim = Sim::new(&Scenario::new().gpus(2, Gpu::h200()).processes(processes));
    let service = Service::start(&sim);

    // Inside A: A's trainer and orphans, by A's pids; B's and the host's memory as sums.
    let info = a.container.info(&sim, &service.socket);
    let mut expected: BTreeSet<(u64, u64, u64)> = [(a.trainer_local as u64, 0, 10 * GIB)]
        .into_iter()
        .collect();
    expected.extend(a.orphan_locals().iter().map(|&p| (p as u64, 1, 2 * GIB)));
    assert_eq!(listed(&info), expected, "{info}");
    assert_eq!(
        outside(&info, 0),
        4 * GIB + 2 * GIB,
        "the host's 4 GiB and B's 2 x 1 GiB"
    );
    assert_eq!(outside(&info, 1), 8 * GIB, "B's trainer");
    for gpu in info["devices"].as_array().unwrap() {
        for p in gpu["processes"].as_array().unwrap() {
            assert_eq!(p["confirmed"], true, "{p}");
            assert_eq!(p["confirmed_by"], "host service", "{p}");
        }
    }
    assert_eq!(info["host_service"]["answered"], true);
    let text = info.to_string();
    assert!(
        !text.contains("nv-hostjob"),
        "another's command leaked: {text}"
    );

    // clear --wait in A ends A's orphans only.
    let run = a.container.gpuctl_run(
        &sim,
        &service.socket,
        &["clear", "--gpu", "1", "--wait=30s", "--timeout", "5s"],
    );
    assert_eq!(run.code, 0, "clear in A: {}\n{}", run.stdout, run.stderr);
    for &pid in &a.orphans {
        assert!(!alive(pid), "A's orphan {pid} lives on");
    }
    assert!(alive(a.trainer_host), "A's live job was ended");
    for &pid in b.orphans.iter().chain([&b.trainer_host, &host.pid()]) {
        assert!(alive(pid), "{pid}, not A's, was ended");
    }

    // Then from B.
    let info = b.container.info(&sim, &service.socket);
    let mut expected: BTreeSet<(u64, u64, u64)> =
        [(b.trainer_local as u64, 1, 8 * GIB)].into_iter().collect();
    expected.extend(b.orphan_locals().iter().map(|&p| (p as u64, 0, GIB)));
    assert_eq!(listed(&info), expected, "{info}");
    assert_eq!(outside(&info, 0), 10 * GIB + 4 * GIB);
    assert_eq!(outside(&info, 1), 0, "A's orphans are gone");
    let run = b.container.gpuctl_run(
        &sim,
        &service.socket,
        &["clear", "--wait=30s", "--timeout", "5s", "--gpu", "0"],
    );
    // GPU 0 still holds A's trainer and the host's job: not free, but not B's to wait for.
    assert_eq!(run.code, 0, "clear in B: {}\n{}", run.stdout, run.stderr);
    for &pid in &b.orphans {
        assert!(!alive(pid), "B's orphan {pid} lives on");
    }
    for pid in [a.trainer_host, b.trainer_host, host.pid()] {
        assert!(alive(pid), "{pid} was ended");
    }
}

/// A rootless container (made by an unprivileged user with a user namespace): the same,
/// with uids as the container maps them.
#[test]
fn a_rootless_container_sees_its_processes_with_its_own_uids() {
    // Its root cannot inspect the host's root-owned service (another uid), so the client
    // believes the socket by its mount: a read-only one of a directory only root writes in.
    let run_dir = rendezvous();
    let container = Container::rootless_with_read_only(65534, run_dir.path());
    let tenant = Tenant::start(container, 2);
    let mut processes = vec![Process::new(tenant.trainer_host).on(0).used(3 * GIB)];
    processes.extend(
        tenant
            .orphans
            .iter()
            .map(|&pid| Process::new(pid).on(0).used(GIB)),
    );
    let sim = Sim::new(&Scenario::new().gpus(1, Gpu::h200()).processes(processes));
    open_up(sim.dir.path());
    let service = Service::start_at(&sim, run_dir.path().join("api.sock"));
    // On the host, its processes are nobody's.
    let host_uid = std::fs::metadata(format!("/proc/{}", tenant.trainer_host))
        .unwrap()
        .uid();
    assert_eq!(host_uid, 65534);

    let info = tenant.container.info(&sim, &service.socket);
    let mut expected: BTreeSet<(u64, u64, u64)> = [(tenant.trainer_local as u64, 0, 3 * GIB)]
        .into_iter()
        .collect();
    expected.extend(tenant.orphan_locals().iter().map(|&p| (p as u64, 0, GIB)));
    assert_eq!(listed(&info), expected, "{info}");
    for p in info["devices"][0]["processes"].as_array().unwrap() {
        assert_eq!(p["uid"], 0, "mapped to the container's root: {p}");
        assert_eq!(p["confirmed_by"], "host service");
    }
    let run = tenant.container.gpuctl_run(
        &sim,
        &service.socket,
        &["clear", "--wait=2s", "--timeout", "5s"],
    );
    // GPU 0 keeps the trainer: the wait is not met (exit 4), but the orphans are ended.
    for &pid in &tenant.orphans {
        assert!(
            !alive(pid),
            "orphan {pid} lives on: {}\n{}",
            run.stdout,
            run.stderr
        );
    }
    assert!(alive(tenant.trainer_host), "the live job was ended");
    assert_ne!(run.code, 0, "GPU 0 still holds the trainer: {}", run.stdout);

    // The same service's socket in a directory the container has writable (the mount the
    // docs once showed, `-v /run/gpuctl:/run/gpuctl`): nothing proves it is the host's, so it is not asked.
    let writable = rendezvous();
    let elsewhere = Service::start_at(&sim, writable.path().join("api.sock"));
    let run = tenant
        .container
        .gpuctl_run(&sim, &elsewhere.socket, &["info", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let info: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(info["host_service"]["answered"], false, "{info}");
    let hints: Vec<&str> = run.stderr.lines().filter(|l| l.contains("hint")).collect();
    assert_eq!(hints.len(), 1, "{}", run.stderr);
    assert!(
        hints[0].contains("not mounted read-only") && hints[0].contains(":ro"),
        "{}",
        hints[0]
    );
}

/// Whatever a request says of whom it is for, the answer is the kernel's caller's.
#[test]
fn a_forged_request_gets_only_the_callers_own_processes() {
    require("python3");
    let a = Tenant::start(Container::start(), 2);
    let b = Tenant::start(Container::start(), 1);
    let mut processes = vec![
        Process::new(a.trainer_host).on(0).used(GIB),
        Process::new(b.trainer_host).on(0).used(5 * GIB),
    ];
    processes.extend(
        a.orphans
            .iter()
            .chain(&b.orphans)
            .map(|&pid| Process::new(pid).on(0).used(GIB)),
    );
    let sim = Sim::new(&Scenario::new().gpus(1, Gpu::h200()).processes(processes));
    let service = Service::start(&sim);
    let forged = format!(
        "{{\"schema\":1,\"request\":\"processes\",\"pid\":{},\"pid_namespace\":{},\"uid\":0,\"caller\":{{\"pid\":{}}}}}\n",
        b.trainer_host, b.container.namespace, b.trainer_local
    );
    let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n\
                  s.sendall(sys.argv[2].encode())\ns.shutdown(socket.SHUT_WR)\n\
                  sys.stdout.write(s.makefile().read())";
    let python = which("python3");
    let output = a
        .container
        .command(
            &python,
            &["-c", script, service.socket.to_str().unwrap(), &forged],
        )
        .output()
        .unwrap();
    let reply = reply_of(&String::from_utf8_lossy(&output.stdout));
    let pids: BTreeSet<u64> = reply["gpus"][0]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    let mut own: BTreeSet<u64> = a.orphan_locals().iter().map(|&p| p as u64).collect();
    own.insert(a.trainer_local as u64);
    assert_eq!(pids, own, "{reply}");
    assert_eq!(reply["caller"]["pid_namespace"], a.container.namespace);
    assert_eq!(
        reply["gpus"][0]["outside_bytes"],
        6 * GIB,
        "B's 5 + 1 GiB as one number"
    );
}

/// With no service, inside is today's: every process unconfirmed, and one hint line naming
/// the socket to mount.
#[test]
fn without_the_service_processes_are_unconfirmed_with_one_hint() {
    let container = Container::start();
    let (_trainer, host, _) = container.trainer();
    let sim = Sim::new(
        &Scenario::new()
            .gpus(1, Gpu::h200())
            .process(Process::new(host).on(0).used(GIB)),
    );
    let socket = sim.dir.path().join("nobody-listens.sock");
    for args in [&["info", "--json"][..], &["info"][..]] {
        let run = container.gpuctl_run(&sim, &socket, args);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let hints: Vec<&str> = run.stderr.lines().filter(|l| l.contains("hint")).collect();
        assert_eq!(hints.len(), 1, "{}", run.stderr);
        assert!(hints[0].contains(socket.to_str().unwrap()), "{}", hints[0]);
        if args.len() == 2 {
            let info: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
            let process = &info["devices"][0]["processes"][0];
            assert_eq!(process["pid"], host, "the host pid NVML listed");
            assert_eq!(process["confirmed"], false);
            assert_eq!(info["host_service"]["answered"], false);
        } else {
            assert!(run.stdout.contains("unconfirmed"), "{}", run.stdout);
        }
    }
    // A stopped service is no service: the same.
    let mut service = Service::start(&sim);
    service.stop();
    let run = container.gpuctl_run(&sim, &service.socket, &["kill", "--pid", &host.to_string()]);
    assert_ne!(run.code, 0, "an unconfirmed process is never a target");
    assert!(alive(host));
    assert_eq!(
        run.stderr.lines().filter(|l| l.contains("hint")).count(),
        1,
        "{}",
        run.stderr
    );
}

/// `kill` inside acts on the container's own process, by its local pid, through the
/// service's confirmation, and sees its memory released as the driver reports it: nvml-sim
/// inside learns of the death from the service's instance on the host (no test plays the
/// driver here).
#[test]
fn kill_inside_ends_the_containers_process_by_its_local_pid() {
    let container = Container::start();
    let (_trainer, host, local) = container.trainer();
    let sim = Sim::new(
        &Scenario::new()
            .gpus(1, Gpu::h200())
            // More than verification's slack (1% of the GPU's memory), so that a release
            // is seen only if the memory really came back.
            .process(Process::new(host).on(0).used(10 * GIB)),
    );
    let service = Service::start(&sim);
    let run = container.gpuctl_run(
        &sim,
        &service.socket,
        &[
            "kill",
            "--pid",
            &local.to_string(),
            "--timeout",
            "2s",
            "--json",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(!alive(host), "the trainer lives on");
    let report: serde_json::Value =
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout));
    let outcome = &report["outcomes"][0];
    assert_eq!(outcome["pid"], local, "{report}");
    assert_eq!(outcome["left_gpu"], true, "{report}");
    assert_eq!(outcome["memory_released"], true, "{report}");
}

fn which(tool: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|dir| dir.join(tool))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{tool} is not installed"))
}

// ---- Bad input to the service, from the host.

fn ask_raw(socket: &Path, request: &[u8]) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = stream.write_all(request);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

fn error_of(reply: &str) -> String {
    let value = reply_of(reply);
    value["error"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error: {reply}"))
        .to_string()
}

fn one_gpu_sim() -> Sim {
    Sim::new(&Scenario::new().gpus(1, Gpu::h200()))
}

#[test]
fn the_service_refuses_bad_requests_with_one_line() {
    let sim = one_gpu_sim();
    let service = Service::start(&sim);
    let big = vec![b'x'; 5000];
    assert!(error_of(&ask_raw(&service.socket, &big)).contains("over 4096 bytes refused"));
    // Exactly the limit is read (and found not to be JSON).
    let mut at_limit = vec![b' '; 4096];
    at_limit[0] = b'{';
    assert!(error_of(&ask_raw(&service.socket, &at_limit)).contains("malformed JSON"));
    for (request, needle) in [
        (&b"{\"schema\":1,\"request\":\n"[..], "malformed JSON"),
        (b"not json\n", "malformed JSON"),
        (b"\n", "empty request"),
        (
            b"{\"schema\":7,\"request\":\"processes\"}\n",
            "schema 7 is not supported",
        ),
        (
            b"{\"schema\":1,\"request\":\"signal\"}\n",
            "unknown variant `signal`",
        ),
    ] {
        let error = error_of(&ask_raw(&service.socket, request));
        assert!(error.contains(needle), "{error:?} lacks {needle:?}");
    }
    // Still serving.
    let reply = ask_raw(
        &service.socket,
        b"{\"schema\":1,\"request\":\"processes\"}\n",
    );
    assert!(reply_of(&reply)["gpus"].is_array(), "{reply}");
}

#[test]
fn a_silent_client_is_dropped_after_a_second_without_delaying_others() {
    let sim = one_gpu_sim();
    let service = Service::start(&sim);
    let mut silent = UnixStream::connect(&service.socket).unwrap();
    let connected = Instant::now();
    let asked = Instant::now();
    let reply = ask_raw(
        &service.socket,
        b"{\"schema\":1,\"request\":\"processes\"}\n",
    );
    assert!(
        asked.elapsed() < Duration::from_millis(800),
        "another client waited {:?} behind a silent one",
        asked.elapsed()
    );
    assert!(reply.contains("\"gpus\""), "{reply}");
    let mut dropped = String::new();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    silent.read_to_string(&mut dropped).unwrap();
    let waited = connected.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "dropped after {waited:?}"
    );
    assert!(error_of(&dropped).contains("no request within 1 s"));
}

#[test]
fn a_hundred_concurrent_clients_are_all_answered() {
    let sim = Sim::new(
        &Scenario::new()
            .gpus(2, Gpu::h200())
            .process(Process::new(std::process::id()).on(0).used(GIB)),
    );
    let service = Service::start(&sim);
    // All connected before any asks, then all ask at once.
    let streams: Vec<UnixStream> = (0..100)
        .map(|_| UnixStream::connect(&service.socket).unwrap())
        .collect();
    let threads: Vec<_> = streams
        .into_iter()
        .map(|mut stream| {
            std::thread::spawn(move || {
                stream
                    .set_read_timeout(Some(Duration::from_secs(20)))
                    .unwrap();
                stream
                    .write_all(b"{\"schema\":1,\"request\":\"processes\"}\n")
                    .unwrap();
                let mut reply = String::new();
                stream.read_to_string(&mut reply).unwrap();
                reply
            })
        })
        .collect();
    for thread in threads {
        let reply = reply_of(&thread.join().unwrap());
        assert_eq!(reply["gpus"].as_array().unwrap().len(), 2, "{reply}");
        assert_eq!(reply["caller"]["host_pid_namespace"], true);
        // Root on the host: its own process is listed by its host pid.
        assert_eq!(reply["gpus"][0]["processes"][0]["pid"], std::process::id());
    }
}

#[test]
fn the_service_refuses_a_path_that_is_not_a_socket() {
    let sim = one_gpu_sim();
    let file = sim.dir.path().join("a-file");
    std::fs::write(&file, "keep me").unwrap();
    let run = sim.run(&["serve", "--socket", file.to_str().unwrap()]);
    run.assert_one_line_error(2, "exists and is not a socket");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    // And a second service on a socket that one already answers on.
    let service = Service::start(&sim);
    let run = sim.run(&["serve", "--socket", service.socket.to_str().unwrap()]);
    run.assert_one_line_error(2, "another service already answers");
}

/// Under systemd socket activation the socket is inherited as fd 3 (LISTEN_FDS and
/// LISTEN_PID, as systemd sets them), and with --idle-exit nothing runs at rest.
#[test]
fn an_inherited_socket_is_served_and_the_service_exits_when_idle() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let sim = one_gpu_sim();
    let socket = sim.dir.path().join("activated.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let fd = listener.as_raw_fd();
    // The shell's pid is the service's once it execs: LISTEN_PID names it, as systemd's does.
    let mut command = sim.gpuctl(&[]);
    let program = command.get_program().to_owned();
    command = {
        let mut shell = Command::new("sh");
        shell
            .args([
                "-c",
                "export LISTEN_PID=$$ LISTEN_FDS=1; exec \"$0\" serve --idle-exit 1s",
            ])
            .arg(&program);
        for (key, value) in command.get_envs() {
            if let Some(value) = value {
                shell.env(key, value);
            }
        }
        // Were the socket not taken, this one (not the default) would be bound.
        shell.env("GPUCTL_SOCKET", sim.dir.path().join("not-inherited.sock"));
        shell
    };
    // SAFETY: dup2 is async-signal-safe; both descriptors are open in the child.
    unsafe {
        command.pre_exec(move || {
            // Kept across exec (dup2 onto itself leaves close-on-exec set).
            if libc::dup2(fd, 3) < 0 || libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut service = command
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let reply = ask_raw(&socket, b"{\"schema\":1,\"request\":\"processes\"}\n");
    assert!(reply.contains("\"gpus\""), "{reply}");
    // Idle for a second after that: it exits, its work done.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = service.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still running when idle"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    service
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status}: {err}");
    assert!(err.contains("the socket systemd passed"), "{err}");
    assert!(!sim.dir.path().join("not-inherited.sock").exists());
}

/// NVIDIA's nvidia-smi, run inside on the sim, shows what the driver shows there: the
/// host's PIDs, which the container cannot see; gpuctl inside shows the same processes,
/// unconfirmed without the service. A process that ends leaves both lists once the
/// driver (the test, inside) drops it.
#[test]
fn nvidia_smi_inside_lists_the_host_pids_as_the_driver_does() {
    let smi = crate::nvidia_smi::nvidia_smi();
    let container = Container::start();
    let (_trainer, host, local) = container.trainer();
    let (_other, other_host, _) = container.trainer();
    assert_ne!(host, local, "the container numbers its processes itself");
    let both = Scenario::new()
        .gpus(1, Gpu::h200())
        .process(Process::new(host).on(0).used(3 * GIB))
        .process(Process::new(other_host).on(0).used(GIB));
    let sim = Sim::new(&both);
    let lib = crate::nvidia_smi::lib_dir(&sim);
    let apps = || {
        let out = container
            .command(
                smi,
                &[
                    "--query-compute-apps=pid,used_memory",
                    "--format=csv,noheader,nounits",
                ],
            )
            .env("LD_LIBRARY_PATH", &lib)
            .env("NVML_SIM_SCENARIO", sim.scenario_path())
            .env("NVML_SIM_STATE", sim.state_path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.split(',').map(str::trim).collect::<Vec<_>>().join(","))
            .collect::<BTreeSet<String>>()
    };
    let expected: BTreeSet<String> = [format!("{host},3072"), format!("{other_host},1024")].into();
    assert_eq!(apps(), expected);
    let socket = sim.dir.path().join("none.sock");
    let info = container.info(&sim, &socket);
    let pids: BTreeSet<u64> = listed(&info).into_iter().map(|(pid, _, _)| pid).collect();
    assert_eq!(pids, [host as u64, other_host as u64].into());
    // One ends; the driver (this test) drops it.
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(other_host as libc::pid_t, libc::SIGKILL) };
    sim.write(
        &Scenario::new()
            .gpus(1, Gpu::h200())
            .process(Process::new(host).on(0).used(3 * GIB)),
    );
    assert_eq!(apps(), [format!("{host},3072")].into());
    let pids: BTreeSet<u64> = listed(&container.info(&sim, &socket))
        .into_iter()
        .map(|(pid, _, _)| pid)
        .collect();
    assert_eq!(pids, [host as u64].into());
}

/// A container started inside a container: its processes are the outer one's too, by the
/// pids the outer one sees; a sibling container gets them only as one number.
#[test]
fn a_namespace_below_the_callers_is_the_callers() {
    let outer = Container::start();
    let sibling = Container::start();
    let mut inner = outer
        .command(
            Path::new("unshare"),
            &["--pid", "--fork", "--mount-proc", "--", "sleep", "100000"],
        )
        .stderr(Stdio::null())
        .spawn()
        .expect("a container inside the container");
    // nsenter -> unshare (in the outer namespace) -> the inner namespace's init.
    let unshare = outer.only_child_of(inner.id());
    let nested = outer.only_child_of(unshare);
    wait_until(Duration::from_secs(5), || {
        nspid(nested).is_some_and(|ids| ids.len() == 3)
    });
    let ids = nspid(nested).unwrap();
    let sim = Sim::new(
        &Scenario::new()
            .gpus(1, Gpu::h200())
            .process(Process::new(nested).on(0).used(2 * GIB)),
    );
    let service = Service::start(&sim);
    let info = outer.info(&sim, &service.socket);
    assert_eq!(
        listed(&info),
        [(u64::from(ids[1]), 0, 2 * GIB)].into(),
        "the outer container's pid for it: {info}"
    );
    let info = sibling.info(&sim, &service.socket);
    assert!(listed(&info).is_empty(), "{info}");
    assert_eq!(outside(&info, 0), 2 * GIB);
    // SAFETY: kill(2) on the inner namespace's init, which this test started.
    unsafe { libc::kill(nested as libc::pid_t, libc::SIGKILL) };
    let _ = inner.wait();
}

// ---- Hostile users, round four: a stand-in for the service, its words, a flood, a pid
// ---- reused under socket activation, and where the socket may be made.

/// A directory for the service's socket as /run/gpuctl is: root's, 0755 (containers mount
/// it; their root can write in it unless the mount is read-only).
pub(crate) fn rendezvous() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A Python every user can run (the tests' own may live under root's home).
fn system_python() -> PathBuf {
    let system = PathBuf::from("/usr/bin/python3");
    assert!(
        system.is_file(),
        "/usr/bin/python3 is not installed: the flood and pid-reuse tests run it as another user"
    );
    system
}

/// Binds a stand-in at `socket` (removing what is there) that answers `reply` to anyone;
/// prints "listening", then "asked" for each request it reads.
const FAKE_SERVICE: &str = r#"import os, socket, sys
path, reply = sys.argv[1], sys.argv[2]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX)
s.bind(path)
os.chmod(path, 0o666)
s.listen(64)
print('listening', flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(2)
    try:
        data = c.recv(4096)
    except Exception:
        data = b''
    if data:
        print('asked', flush=True)
    try:
        c.sendall(reply.encode() + b'\n')
    except Exception:
        pass
    c.close()
"#;

/// A stand-in service process (its stdout read for "asked"); killed on drop. `inner`: the
/// process itself where `child` is nsenter, which runs it as its child.
struct Fake {
    child: Child,
    inner: Option<u32>,
}

impl Fake {
    fn ready(mut child: Child, inside: Option<&Container>) -> Fake {
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "listening", "the stand-in did not start");
        let inner = inside.map(|container| container.only_child_of(child.id()));
        Fake { child, inner }
    }

    fn stop(&mut self) {
        if let Some(pid) = self.inner.take() {
            // SAFETY: kill(2) on the stand-in this test started (nsenter's child).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Ends it; whether anything was asked of it.
    fn was_asked(mut self) -> bool {
        self.stop();
        let mut rest = String::new();
        let _ = self.child.stdout.take().unwrap().read_to_string(&mut rest);
        rest.contains("asked")
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A reply as the service would give it: GPU `uuid` with nothing of the caller's on it.
fn empty_reply(uuid: &str) -> String {
    serde_json::json!({
        "schema": 1,
        "caller": {"pid": 1, "uid": 0, "pid_namespace": 1, "host_pid_namespace": false},
        "gpus": [{"uuid": uuid, "outside_bytes": 0, "processes": []}],
    })
    .to_string()
}

pub(crate) fn hints(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains("hint")).collect()
}

/// Root of one container replaces the socket in the shared, writable directory with its own
/// (finding 1); and a host user binds one where a victim's GPUCTL_SOCKET points. Neither is
/// asked: the victim's processes stay unconfirmed, with one hint saying why.
#[test]
fn a_socket_bound_by_another_container_or_a_host_user_is_not_believed() {
    let python = which("python3");
    let victim = Container::start();
    let attacker = Container::start();
    let (_trainer, trainer_host, trainer_local) = victim.trainer();
    let process = Process::new(trainer_host).on(0).used(3 * GIB);
    let sim = Sim::new(&Scenario::new().gpus(1, Gpu::h200()).process(process));
    let run_dir = rendezvous();
    let service = Service::start_at(&sim, run_dir.path().join("api.sock"));
    // The genuine service is believed.
    let info = victim.info(&sim, &service.socket);
    assert_eq!(info["host_service"]["answered"], true, "{info}");
    assert_eq!(
        listed(&info),
        [(u64::from(trainer_local), 0, 3 * GIB)].into()
    );
    let uuid = info["devices"][0]["uuid"].as_str().unwrap().to_string();

    // The attacker's root swaps the socket for its own, which says "nothing of yours here".
    let socket = service.socket.to_str().unwrap();
    let fake = Fake::ready(
        attacker
            .command(&python, &["-c", FAKE_SERVICE, socket, &empty_reply(&uuid)])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
        Some(&attacker),
    );
    for args in [&["info", "--json"][..], &["info"][..]] {
        let run = victim.gpuctl_run(&sim, &service.socket, args);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let hint = hints(&run.stderr);
        assert_eq!(hint.len(), 1, "{}", run.stderr);
        assert!(
            hint[0].contains("is not the host's gpuctl serve")
                && hint[0].contains("another container"),
            "{}",
            hint[0]
        );
        if args.len() == 2 {
            let info: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
            assert_eq!(info["host_service"]["answered"], false, "{info}");
            let listed = &info["devices"][0]["processes"];
            assert_eq!(listed[0]["pid"], trainer_host, "{info}");
            assert_eq!(listed[0]["confirmed"], false, "{info}");
        } else {
            assert!(run.stdout.contains("unconfirmed"), "{}", run.stdout);
        }
    }
    assert!(!fake.was_asked(), "a request was sent to the stand-in");

    // A host user's socket, in a directory of theirs, where GPUCTL_SOCKET points.
    let theirs = tempfile::tempdir().unwrap();
    std::fs::set_permissions(theirs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(theirs.path(), Some(65534), Some(65534)).unwrap();
    let their_socket = theirs.path().join("api.sock");
    let fake = Fake::ready(
        setpriv(65534)
            .arg(system_python())
            .args(["-c", FAKE_SERVICE, their_socket.to_str().unwrap()])
            .arg(empty_reply(&uuid))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
        None,
    );
    let run = victim.gpuctl_run(&sim, &their_socket, &["info", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let info: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(info["host_service"]["answered"], false, "{info}");
    let hint = hints(&run.stderr);
    assert_eq!(hint.len(), 1, "{}", run.stderr);
    assert!(hint[0].contains("uid 65534"), "{}", hint[0]);
    assert!(
        !fake.was_asked(),
        "a request was sent to the host user's stand-in"
    );
}

/// What a service says, and the socket path from GPUCTL_SOCKET, reach the terminal escaped:
/// ESC, BEL, CSI and bidirectional controls (finding 2). The words come from a listener the
/// client believes (root on the host: this test), as a compromised service's would.
#[test]
fn the_services_words_and_the_socket_path_reach_the_terminal_escaped() {
    let container = Container::start();
    let (_trainer, host, _) = container.trainer();
    let sim = Sim::new(
        &Scenario::new()
            .gpus(1, Gpu::h200())
            .process(Process::new(host).on(0).used(GIB)),
    );
    let run_dir = rendezvous();
    let socket = run_dir.path().join("api.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let hostile = "\u{1b}]0;PWNED\u{7}\u{1b}[2J\u{9b}1m\u{202e}gnp.exe";
    let error = serde_json::json!({"schema": 1, "error": hostile}).to_string();
    let answering = std::thread::spawn(move || {
        // Two asks: `info` and `info --json`.
        for _ in 0..2 {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(format!("{error}\n").as_bytes());
        }
    });
    let raw = |text: &str| {
        text.chars()
            .any(|c| matches!(c, '\u{1b}' | '\u{7}' | '\u{9b}' | '\u{202e}'))
    };
    for args in [&["info"][..], &["info", "--json"][..]] {
        let run = container.gpuctl_run(&sim, &socket, args);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert!(
            !raw(&run.stderr),
            "a control reached the terminal: {:?}",
            run.stderr
        );
        let hint = hints(&run.stderr);
        assert_eq!(hint.len(), 1, "{}", run.stderr);
        assert!(
            hint[0].contains("the service refused: \\e]0;PWNED\\x07\\e[2J\\u{9b}1m\\u{202e}"),
            "{}",
            hint[0]
        );
    }
    answering.join().unwrap();
    // A socket path with controls in it (GPUCTL_SOCKET), where nothing listens.
    let path = run_dir
        .path()
        .join("\u{1b}[2J\u{7}\u{202e}")
        .join("api.sock");
    let run = container.gpuctl_run(&sim, &path, &["info"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        !raw(&run.stderr),
        "a control reached the terminal: {:?}",
        run.stderr
    );
    assert!(
        run.stderr.contains("\\e[2J\\x07\\u{202e}/api.sock"),
        "{}",
        run.stderr
    );
}

/// Holds `count` silent connections as another user, reconnecting each one dropped; prints
/// "holding" once all are open, then the reply to one more connection that does ask.
const FLOODER: &str = r#"import resource, selectors, socket, sys
path, count = sys.argv[1], int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
sel = selectors.DefaultSelector()
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(path)
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
for _ in range(count):
    connect()
extra = socket.socket(socket.AF_UNIX)
extra.settimeout(10)
extra.connect(path)
extra.sendall(b'{"schema":1,"request":"processes"}\n')
print('holding', flush=True)
try:
    print('extra', extra.makefile().readline().strip(), flush=True)
except Exception as e:
    print('extra failed', e, flush=True)
while True:
    for key, _ in sel.select(1):
        s = key.fileobj
        sel.unregister(s)
        s.close()
        try:
            connect()
        except Exception:
            pass
"#;

/// Asks `count` times, one connection each, and prints each answer's time and whether it was
/// one (first try: no retry).
const ASKER: &str = r#"import json, socket, sys, time
path, count = sys.argv[1], int(sys.argv[2])
for _ in range(count):
    t = time.monotonic()
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(path)
        s.sendall(b'{"schema":1,"request":"processes"}\n')
        line = s.makefile().readline()
        s.close()
        ok = 'gpus' in json.loads(line)
    except Exception as e:
        line, ok = str(e), False
    print(json.dumps({'ms': (time.monotonic() - t) * 1000, 'ok': ok, 'reply': line[:600]}), flush=True)
    time.sleep(0.1)
"#;

/// One local user holds 1,400 silent connections (reconnecting each one dropped); a
/// container is still answered every time, first try, within a second; and the user's
/// connection over its share gets the "busy" reply once its request is read (finding 3).
#[test]
fn a_user_holding_1400_connections_crowds_out_no_container() {
    let python = which("python3");
    let container = Container::start();
    let (_trainer, host, local) = container.trainer();
    let sim = Sim::new(
        &Scenario::new()
            .gpus(1, Gpu::h200())
            .process(Process::new(host).on(0).used(GIB)),
    );
    let run_dir = rendezvous();
    let service = Service::start_at(&sim, run_dir.path().join("api.sock"));
    let mut flooder = setpriv(65534)
        .arg(system_python())
        .args(["-c", FLOODER, service.socket.to_str().unwrap(), "1400"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(flooder.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        "holding",
        "the flooder did not connect: {line}"
    );
    line.clear();
    out.read_line(&mut line).unwrap();
    let over_share = line.trim().to_string();
    let asked = container
        .command(
            &python,
            &["-c", ASKER, service.socket.to_str().unwrap(), "15"],
        )
        .output()
        .unwrap();
    let _ = flooder.kill();
    let _ = flooder.wait();
    assert!(
        over_share.starts_with("extra {") && over_share.contains("busy"),
        "the flooder's connection over its share: {over_share}"
    );
    let answers: Vec<serde_json::Value> = String::from_utf8_lossy(&asked.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        answers.len(),
        15,
        "{}",
        String::from_utf8_lossy(&asked.stderr)
    );
    for answer in &answers {
        assert_eq!(answer["ok"], true, "not answered: {answer}");
        assert!(answer["ms"].as_f64().unwrap() < 1000.0, "slow: {answer}");
        assert!(
            answer["reply"]
                .as_str()
                .unwrap()
                .contains(&format!("\"pid\":{local}")),
            "{answer}"
        );
    }
}

/// A process put into `container` at host pid `pid` (clone3 with set_tid in the container's
/// PID namespace, as a pid reuse would land it there). Killed and reaped on drop.
struct PlacedIn {
    pid: u32,
}

impl PlacedIn {
    fn spawn(container: &Container, pid: u32, local: u32) -> PlacedIn {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let namespace = std::fs::File::open(format!("/proc/{}/ns/pid", container.init)).unwrap();
        let program = CString::new(testproc_bin().as_os_str().as_bytes()).unwrap();
        let arg0 = CString::new("python3").unwrap();
        let env = CString::new("GPUCTL_TESTPROC_MODE=sleep").unwrap();
        // A thread of its own: setns(CLONE_NEWPID) changes where its children go.
        let placed = std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            // SAFETY: setns(2) on an open namespace descriptor, for this thread's children.
            let rc = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWPID) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            let argv = [arg0.as_ptr(), std::ptr::null()];
            let envp = [env.as_ptr(), std::ptr::null()];
            // The innermost namespace's pid first.
            let tids: [libc::pid_t; 2] = [local as libc::pid_t, pid as libc::pid_t];
            clone3_exec(&tids, &program, &argv, &envp)
                .unwrap_or_else(|error| panic!("clone3: {error}"))
        })
        .join()
        .unwrap();
        assert_eq!(placed, pid, "clone3 gave another pid");
        wait_until(Duration::from_secs(10), || {
            nspid(pid).is_some_and(|ids| ids.last() == Some(&local))
        });
        PlacedIn { pid }
    }
}

impl Drop for PlacedIn {
    fn drop(&mut self) {
        // SAFETY: our own child, killed and reaped here.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(self.pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
}

/// Connects, asks, hands the connection to a child and exits; the child prints the reply.
const HAND_OFF: &str = r#"import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"schema":1,"request":"processes"}\n')
if os.fork() == 0:
    s.settimeout(60)
    sys.stdout.write(s.makefile().read())
    sys.stdout.flush()
os._exit(0)
"#;

/// Under socket activation connections wait while the service starts. A user connects,
/// hands the connection to a child and exits; a process of a container lands on that pid;
/// then the service accepts. It must not answer with the container's processes (finding 4).
#[test]
fn a_caller_whose_pid_went_to_a_container_before_the_accept_gets_no_answer() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let victim = Container::start();
    let (_trainer, trainer_host, trainer_local) = victim.trainer();
    let sim = Sim::new(
        &Scenario::new()
            .gpus(1, Gpu::h200())
            .process(Process::new(trainer_host).on(0).used(2 * GIB)),
    );
    let run_dir = rendezvous();
    let socket = run_dir.path().join("activated.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut mallory = setpriv(65534)
        .arg(system_python())
        .args(["-c", HAND_OFF, socket.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let reply_pipe = mallory.stdout.take().unwrap();
    let pid = mallory.id();
    assert!(mallory.wait().unwrap().success());
    let _placed = PlacedIn::spawn(&victim, pid, 4242);
    // Now the service starts, as systemd starts it, with the socket as fd 3.
    let fd = listener.as_raw_fd();
    let program = gpuctl_bin();
    let mut command = Command::new("sh");
    command
        .args([
            "-c",
            "export LISTEN_PID=$$ LISTEN_FDS=1; exec \"$0\" serve --idle-exit 2s",
        ])
        .arg(&program);
    for (key, value) in sim.gpuctl(&[]).get_envs() {
        if let Some(value) = value {
            command.env(key, value);
        }
    }
    // SAFETY: dup2 and fcntl are async-signal-safe; both descriptors are open in the child.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 || libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut service = command
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reply = String::new();
    BufReader::new(reply_pipe)
        .read_to_string(&mut reply)
        .unwrap();
    let _ = service.kill();
    let _ = service.wait();
    let value = reply_of(&reply);
    let error = value["error"].as_str().unwrap_or_else(|| {
        panic!("answered as the container (its trainer is pid {trainer_local}): {reply}")
    });
    assert!(error.contains("exited before it was answered"), "{error}");
}

/// `gpuctl serve` makes its socket only where nobody but root can swap it (finding 5): a
/// directory another user owns, or that others may write in without the sticky bit, on the
/// way is refused with one line (exit 2); what it makes is 0755 and the socket 0666.
#[test]
fn serve_refuses_a_socket_under_a_directory_others_can_write_in() {
    let sim = one_gpu_sim();
    let theirs = tempfile::tempdir().unwrap();
    std::fs::set_permissions(theirs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(theirs.path(), Some(65534), Some(65534)).unwrap();
    let socket = theirs.path().join("api.sock");
    let run = sim.run(&["serve", "--socket", socket.to_str().unwrap()]);
    run.assert_one_line_error(2, "writable by uid 65534");
    assert!(!socket.exists());
    // Below it, and through a link to it, the same.
    let below = theirs.path().join("gpuctl/api.sock");
    sim.run(&["serve", "--socket", below.to_str().unwrap()])
        .assert_one_line_error(2, "writable by uid 65534");
    let link = sim.dir.path().join("run");
    std::os::unix::fs::symlink(theirs.path(), &link).unwrap();
    sim.run(&["serve", "--socket", link.join("api.sock").to_str().unwrap()])
        .assert_one_line_error(2, "writable by uid 65534");
    // Writable by all, not sticky.
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    sim.run(&[
        "serve",
        "--socket",
        open.path().join("api.sock").to_str().unwrap(),
    ])
    .assert_one_line_error(2, "writable by group or others");
    // A safe place: made 0755, the socket 0666, whatever the umask.
    let fresh = sim.dir.path().join("new/gpuctl/api.sock");
    let service = Service::start_at(&sim, fresh.clone());
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(fresh.parent().unwrap()), 0o755);
    assert_eq!(mode(&fresh), 0o666);
    drop(service);
}
