//! gpuctl in real containers, under a real Docker engine (Debian's docker.io 20.10 with
//! runc, installed by scripts/fetch-docker): `gpuctl serve` on the host, the service's
//! directory mounted read-only into containers as a user mounts it, and gpuctl run inside
//! with `docker exec`. NVML is nvml-sim, which inside lists host pids as the driver does and
//! learns of their deaths from the service's instance on the host.
//!
//! One engine serves the whole test binary: started on first use with a data root, exec
//! root, pid file and socket of its own, no bridge and no iptables rules, the cgroupfs
//! driver, and stopped at the process's exit (dockerd, then the containerd it started, each
//! by its pid; then its directory is unmounted and removed). Each test's containers run with
//! `--network none` from an image imported from a root filesystem the harness makes (the
//! host's /usr read-only; the built binaries and each test's scratch directory are mounted
//! at their host paths), and are ended by their pid and removed when the test ends.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::container::{Service, children_of, hints, listed, rendezvous};
use crate::util::*;

static DOCKER: Fetch = Fetch::new("fetch-docker");

/// The image every container runs: an empty root with the host's /usr mounted over it.
const IMAGE: &str = "gpuctl-test:rootfs";

/// The test binary's one engine.
struct Engine {
    dir: PathBuf,
    socket: PathBuf,
    dockerd: u32,
    /// The containerd dockerd started, by pidfd (not our child: its pid could be reused).
    containerd: Option<std::os::fd::OwnedFd>,
}

static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();

/// Containers not yet removed, for the engine's end to remove should a test not get to.
static RUNNING: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn engine() -> &'static Engine {
    match ENGINE.get_or_init(Engine::start) {
        Ok(engine) => engine,
        Err(reason) => panic!("{reason}"),
    }
}

/// The docker client of the package that installed dockerd (a newer one elsewhere on PATH
/// would negotiate down, but this one speaks the engine's API as it is).
fn docker_client() -> PathBuf {
    let packaged = Path::new("/usr/bin/docker");
    if packaged.is_file() {
        packaged.to_path_buf()
    } else {
        PathBuf::from("docker")
    }
}

impl Engine {
    fn start() -> Result<Engine, String> {
        DOCKER.once()?;
        let dir = PathBuf::from(format!("/tmp/gpuctl-docker-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let socket = dir.join("docker.sock");
        let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
        let dockerd = Command::new(which_sbin("dockerd"))
            .arg("--data-root")
            .arg(dir.join("root"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", socket.display()))
            .args([
                "--bridge",
                "none",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-forward=false",
                "--ip-masq=false",
                "--userland-proxy=false",
                "--exec-opt",
                "native.cgroupdriver=cgroupfs",
                "--containerd-namespace",
                "gpuctl-test",
                "--containerd-plugins-namespace",
                "gpuctl-test-plugins",
                "--log-level",
                "warn",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start dockerd: {e}"))?;
        let mut engine = Engine {
            dir,
            socket,
            dockerd: dockerd.id(),
            containerd: None,
        };
        // Stopped at the process's exit, by pid: the Child is not kept (a static never drops).
        extern "C" fn stop_at_exit() {
            if let Some(Ok(engine)) = ENGINE.get() {
                engine.stop();
            }
        }
        // SAFETY: registers a plain function with no captured state.
        unsafe { libc::atexit(stop_at_exit) };
        std::mem::forget(dockerd);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let version = engine
                .docker(&["version", "--format", "{{.Server.Version}}"])
                .output();
            if version.is_ok_and(|o| o.status.success()) {
                break;
            }
            if !alive(engine.dockerd) || Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(engine.dir.join("dockerd.log")).unwrap_or_default();
                let last = log
                    .lines()
                    .rev()
                    .find(|l| l.contains("level=error"))
                    .or(log.lines().last());
                engine.stop();
                return Err(format!(
                    "dockerd did not start: {}",
                    last.unwrap_or("no output").trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        engine.containerd = children_of(engine.dockerd).into_iter().find_map(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "containerd")
                .then(|| pidfd(pid))
                .flatten()
        });
        engine.import_image()?;
        Ok(engine)
    }

    /// `docker import` of a root filesystem made here: the merged-/usr links, empty mount
    /// points, a root user. /usr itself is the host's, mounted read-only at `docker run`.
    fn import_image(&self) -> Result<(), String> {
        let root = self.dir.join("rootfs");
        for sub in [
            "usr",
            "proc",
            "sys",
            "dev",
            "etc",
            "tmp",
            "run/gpuctl",
            "root",
        ] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))
            .unwrap();
        for link in ["bin", "sbin", "lib", "lib64"] {
            std::os::unix::fs::symlink(format!("usr/{link}"), root.join(link)).unwrap();
        }
        std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run tar: {e}"))?;
        let import = self
            .docker(&["import", "-", IMAGE])
            .stdin(tar.stdout.take().unwrap())
            .output()
            .map_err(|e| format!("cannot run docker import: {e}"))?;
        let _ = tar.wait();
        if !import.status.success() {
            return Err(format!(
                "docker import failed: {}",
                String::from_utf8_lossy(&import.stderr).trim()
            ));
        }
        Ok(())
    }

    fn docker(&self, args: &[&str]) -> Command {
        let mut command = Command::new(docker_client());
        command
            .args(args)
            .env("DOCKER_HOST", format!("unix://{}", self.socket.display()))
            .env_remove("DOCKER_CONTEXT")
            .env_remove("DOCKER_CONFIG")
            .stdin(Stdio::null());
        command
    }

    /// Removes what is left, stops dockerd and then its containerd (each by pid, TERM then
    /// KILL), and removes the engine's directory with whatever it still had mounted.
    fn stop(&self) {
        let left: Vec<String> = RUNNING
            .lock()
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        for id in left {
            let _ = self.docker(&["rm", "-f", &id]).output();
        }
        end(self.dockerd, Duration::from_secs(15));
        // dockerd stops its containerd as it goes; this is for one it left.
        if let Some(containerd) = &self.containerd {
            end_by_pidfd(containerd, Duration::from_secs(5));
        }
        unmount_below(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SIGTERM, up to `limit` for it to go (reaped where it is our child), then SIGKILL.
pub(crate) fn end(pid: u32, limit: Duration) {
    let deadline = Instant::now() + limit;
    // SAFETY: kill(2) and waitpid(2) on a process this test binary started.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    while Instant::now() < deadline {
        // SAFETY: as above; WNOHANG never blocks, and a non-child only fails with ECHILD.
        unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
        if !alive(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
        libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
    }
}

/// As [`end`], for a process that is not our child, named by a pidfd.
fn end_by_pidfd(fd: &std::os::fd::OwnedFd, limit: Duration) {
    use std::os::fd::AsRawFd;
    let exited = |timeout_ms: i32| {
        let mut poll = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd that we own.
        unsafe { libc::poll(&mut poll, 1, timeout_ms) > 0 }
    };
    if exited(0) {
        return;
    }
    kill_by_pidfd(fd, libc::SIGTERM);
    if !exited(limit.as_millis() as i32) {
        kill_by_pidfd(fd, libc::SIGKILL);
    }
}

/// Unmounts every mount at or below `dir`, deepest first (overlays, shm, netns files).
pub(crate) fn unmount_below(dir: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| Path::new(point).starts_with(dir))
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.len()));
    for point in points {
        if let Ok(path) = std::ffi::CString::new(point) {
            // SAFETY: umount2 reads a NUL-terminated path.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

fn pidfd(pid: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative return is a descriptor that we now own.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Signals the process a pidfd names (none, once it has exited).
fn kill_by_pidfd(fd: &std::os::fd::OwnedFd, signal: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal on a descriptor we own, no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

pub(crate) fn which_sbin(tool: &str) -> PathBuf {
    [
        "/usr/sbin",
        "/sbin",
        "/usr/bin",
        "/usr/local/sbin",
        "/usr/local/bin",
    ]
    .iter()
    .map(|dir| Path::new(dir).join(tool))
    .find(|path| path.is_file())
    .unwrap_or_else(|| PathBuf::from(tool))
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
        .unwrap_or_default()
}

/// The pid a host process has in its own (innermost) PID namespace.
fn local(host: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{host}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap();
    line.split_whitespace().last().unwrap().parse().unwrap()
}

/// How a container is started.
#[derive(Default)]
struct Options<'a> {
    /// The host directory of the service's socket, mounted read-only at /run/gpuctl.
    socket_dir: Option<&'a Path>,
    /// `--pid=host`.
    host_pids: bool,
}

/// A running container: its init is `sh -c SCRIPT` (then `sleep`), with the built binaries,
/// the test's scratch directory and the sim's environment.
struct Container {
    id: String,
    /// The container's init, by its host pid.
    init: u32,
    /// A pidfd of the init, so that the end signals that process and no later one given
    /// its pid (after `docker stop`, the pid is free).
    init_fd: Option<std::os::fd::OwnedFd>,
}

impl Container {
    fn start(sim: &Sim, options: Options, script: &str) -> Container {
        let engine = engine();
        let target = target_dir();
        let scratch = sim.dir.path();
        let mut args: Vec<String> = ["run", "-d", "--network", "none", "-v", "/usr:/usr:ro"]
            .map(String::from)
            .to_vec();
        args.push("-v".into());
        args.push(format!("{0}:{0}:ro", target.display()));
        args.push("-v".into());
        args.push(format!("{0}:{0}", scratch.display()));
        if let Some(dir) = options.socket_dir {
            args.push("-v".into());
            args.push(format!("{}:/run/gpuctl:ro", dir.display()));
        }
        if options.host_pids {
            args.push("--pid=host".into());
        }
        // gpuctl's environment against this scenario, as the host's runs have it, but for
        // the socket: inside, the default /run/gpuctl/api.sock, the mount or nothing.
        for (key, value) in sim.gpuctl(&[]).get_envs() {
            if key == "GPUCTL_SOCKET" {
                continue;
            }
            if let Some(value) = value {
                args.push("-e".into());
                args.push(format!(
                    "{}={}",
                    key.to_string_lossy(),
                    value.to_string_lossy()
                ));
            }
        }
        args.push("-e".into());
        args.push(format!("T={}", testproc_bin().display()));
        args.extend([IMAGE.into(), "sh".into(), "-c".into(), script.into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = engine.docker(&args).output().expect("run docker run");
        assert!(
            run.status.success(),
            "docker run failed: {}",
            String::from_utf8_lossy(&run.stderr).trim()
        );
        let id = String::from_utf8_lossy(&run.stdout).trim().to_string();
        assert_eq!(id.len(), 64, "{id}");
        RUNNING.lock().unwrap().insert(id.clone());
        let pid = engine
            .docker(&["inspect", "--format", "{{.State.Pid}}", &id])
            .output()
            .expect("docker inspect");
        let init = String::from_utf8_lossy(&pid.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no init pid: {}", String::from_utf8_lossy(&pid.stderr)));
        Container {
            id,
            init,
            init_fd: pidfd(init),
        }
    }

    /// The id as `docker ps` shows it.
    fn short_id(&self) -> String {
        let ps = engine()
            .docker(&[
                "ps",
                "--filter",
                &format!("id={}", self.id),
                "--format",
                "{{.ID}}",
            ])
            .output()
            .expect("docker ps");
        let short = String::from_utf8_lossy(&ps.stdout).trim().to_string();
        assert!(!short.is_empty() && self.id.starts_with(&short), "{short}");
        short
    }

    /// Every process in the container's cgroup, by host pid.
    fn processes(&self) -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|cgroup| cgroup.contains(&self.id))
            })
            .collect()
    }

    /// `docker exec ID gpuctl ARGS`.
    fn gpuctl(&self, args: &[&str]) -> Command {
        let gpuctl = gpuctl_bin();
        let mut all = vec!["exec", &self.id[..]];
        let gpuctl = gpuctl.to_str().unwrap();
        all.push(gpuctl);
        all.extend(args);
        engine().docker(&all)
    }

    fn gpuctl_run(&self, args: &[&str]) -> Run {
        Run::from(self.gpuctl(args).output().expect("run docker exec"))
    }

    fn info(&self) -> serde_json::Value {
        let run = self.gpuctl_run(&["info", "--json"]);
        assert_eq!(run.code, 0, "info inside failed: {}", run.stderr);
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
    }

    /// The container's processes (by the cgroup the engine made for it) whose command line
    /// has `word`, not zombies, once there are `count` of them (within 20 s; else the
    /// container's output and processes are said). Not only the init's children: with
    /// `--pid=host`, an orphan goes to the runtime's shim (a subreaper), not to the init.
    fn processes_named(&self, word: &str, count: usize) -> Vec<u32> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let children = self.processes();
            let mut found: Vec<u32> = children
                .iter()
                .copied()
                .filter(|&pid| alive(pid) && cmdline(pid).contains(word))
                .collect();
            if found.len() == count {
                found.sort();
                return found;
            }
            if Instant::now() > deadline {
                let logs = engine()
                    .docker(&["logs", &self.id])
                    .output()
                    .map(|o| {
                        String::from_utf8_lossy(&o.stdout).to_string()
                            + &String::from_utf8_lossy(&o.stderr)
                    })
                    .unwrap_or_default();
                let seen: Vec<String> = children
                    .iter()
                    .map(|&pid| format!("{pid} {:?} {}", proc_state(pid), cmdline(pid)))
                    .collect();
                panic!(
                    "{count} x {word} not started in the container: its processes {seen:?}, output: {}",
                    logs.trim()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // The init's death ends every process of its PID namespace; then the engine's record.
        if let Some(fd) = &self.init_fd {
            kill_by_pidfd(fd, libc::SIGKILL);
        }
        let _ = engine().docker(&["rm", "-f", &self.id]).output();
        if let Ok(mut running) = RUNNING.lock() {
            running.remove(&self.id);
        }
    }
}

/// A trainer (`train.py`, alive) and a crashed run (a session of its own, as a launcher
/// makes) whose two workers (`worker.py`) live on, reparented to the container's init; then
/// the init sleeps.
const TENANT: &str = r#"
GPUCTL_TESTPROC_MODE=sleep setsid "$T" train.py --epochs 90 &
GPUCTL_TESTPROC_MODE=run-with-workers GPUCTL_TESTPROC_WORKERS=2 setsid "$T" worker.py > /tmp/workers &
run=$!
until [ "$(wc -l < /tmp/workers)" -ge 2 ]; do sleep 0.02; done
kill -9 "$run"
exec sleep 100000
"#;

/// One container's processes, by host pid.
struct Tenant {
    container: Container,
    trainer: u32,
    orphans: Vec<u32>,
}

impl Tenant {
    fn start(sim: &Sim, options: Options) -> Tenant {
        let container = Container::start(sim, options, TENANT);
        let trainer = container.processes_named("train.py", 1)[0];
        let orphans = container.processes_named("worker.py", 2);
        Tenant {
            container,
            trainer,
            orphans,
        }
    }
}

/// Containers A and B share two GPUs with a host process. Inside each, `info` lists exactly
/// its own processes by its own pids, owned by its container as `docker ps` names it;
/// `clear --wait` in A ends A's orphans and returns once their memory is back; `kill` by
/// local pid in A ends A's trainer and reports its memory released; B is untouched.
#[test]
fn each_container_sees_and_reclaims_only_its_own_processes() {
    let run_dir = rendezvous();
    let sim = Sim::new(&Scenario::new().gpus(2, Gpu::h200()));
    let service = Service::start_at(&sim, run_dir.path().join("api.sock"));
    let mounted = Options {
        socket_dir: Some(run_dir.path()),
        ..Options::default()
    };
    let a = Tenant::start(&sim, mounted);
    let b = Tenant::start(
        &sim,
        Options {
            socket_dir: Some(run_dir.path()),
            ..Options::default()
        },
    );
    let host = Proc::sleeper("nv-hostjob", &["--serve"]);
    // A trains on GPU 0 and its orphans hold GPU 1; B and the host only GPU 0.
    let mut processes = vec![
        Process::new(a.trainer).on(0).used(10 * GIB),
        Process::new(b.trainer).on(0).used(8 * GIB),
        Process::new(host.pid()).on(0).used(4 * GIB),
    ];
    processes.extend(
        a.orphans
            .iter()
            .map(|&p| Process::new(p).on(1).used(2 * GIB)),
    );
    processes.extend(b.orphans.iter().map(|&p| Process::new(p).on(0).used(GIB)));
    sim.write(&Scenario::new().gpus(2, Gpu::h200()).processes(processes));

    for (tenant, trainer_gpu, trainer_bytes, orphan_gpu, orphan_bytes) in
        [(&a, 0, 10 * GIB, 1, 2 * GIB), (&b, 0, 8 * GIB, 0, GIB)]
    {
        let info = tenant.container.info();
        let mut expected: BTreeSet<(u64, u64, u64)> =
            [(local(tenant.trainer) as u64, trainer_gpu, trainer_bytes)].into();
        expected.extend(
            tenant
                .orphans
                .iter()
                .map(|&p| (local(p) as u64, orphan_gpu, orphan_bytes)),
        );
        assert_eq!(listed(&info), expected, "{info}");
        let short = tenant.container.short_id();
        for gpu in info["devices"].as_array().unwrap() {
            for p in gpu["processes"].as_array().unwrap() {
                assert_eq!(p["confirmed"], true, "{p}");
                assert_eq!(p["owner"]["kind"], "container", "{p}");
                assert_eq!(p["owner"]["runtime"], "docker", "{p}");
                let id = p["owner"]["id"].as_str().unwrap();
                assert!(
                    tenant.container.id.starts_with(id) && id.starts_with(&short),
                    "owner id {id}, docker ps {short}"
                );
            }
        }
        assert!(!info.to_string().contains("nv-hostjob"), "{info}");
        // The table names the owner as `docker ps` shows the container.
        let run = tenant.container.gpuctl_run(&["info"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert!(
            run.stdout.contains(&format!("docker {short}")),
            "{}",
            run.stdout
        );
        assert!(hints(&run.stderr).is_empty(), "{}", run.stderr);
    }

    // clear --wait in A: A's orphans end, and it returns once GPU 1's memory is back.
    let started = Instant::now();
    let run = a
        .container
        .gpuctl_run(&["clear", "--gpu", "1", "--wait=30s", "--timeout", "5s"]);
    assert_eq!(run.code, 0, "clear in A: {}\n{}", run.stdout, run.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "clear --wait returned only after {:?}",
        started.elapsed()
    );
    for &pid in &a.orphans {
        assert!(!alive(pid), "A's orphan {pid} lives on");
    }
    for &pid in b
        .orphans
        .iter()
        .chain([&a.trainer, &b.trainer, &host.pid()])
    {
        assert!(alive(pid), "{pid} was ended by clear in A");
    }
    let info = a.container.info();
    assert_eq!(
        listed(&info),
        [(local(a.trainer) as u64, 0, 10 * GIB)].into(),
        "{info}"
    );

    // kill by local pid in A: ended, memory released, exit 0.
    let local_trainer = local(a.trainer).to_string();
    let run = a
        .container
        .gpuctl_run(&["kill", "--pid", &local_trainer, "--timeout", "5s"]);
    assert_eq!(run.code, 0, "kill in A: {}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("ended (SIGTERM)") && !run.stdout.contains("still held"),
        "{}",
        run.stdout
    );
    assert!(!alive(a.trainer), "A's trainer lives on");
    for &pid in b.orphans.iter().chain([&b.trainer, &host.pid()]) {
        assert!(alive(pid), "{pid} was ended by kill in A");
    }
    let info = b.container.info();
    assert_eq!(listed(&info).len(), 3, "B's own, untouched: {info}");
    drop(service);
}

/// A process started with `docker exec` (its parent is the runtime's shim, outside the
/// container's init) is the container's all the same: listed by its local pid, owned by the
/// container, and ended by `kill` there.
#[test]
fn a_process_started_by_docker_exec_is_the_containers() {
    let run_dir = rendezvous();
    let sim = Sim::new(&Scenario::new().gpus(1, Gpu::h200()));
    let service = Service::start_at(&sim, run_dir.path().join("api.sock"));
    let container = Container::start(
        &sim,
        Options {
            socket_dir: Some(run_dir.path()),
            ..Options::default()
        },
        "exec sleep 100000",
    );
    let mut exec = ExecProcess::start(&container);
    sim.write(
        &Scenario::new()
            .gpus(1, Gpu::h200())
            .process(Process::new(exec.host).on(0).used(3 * GIB)),
    );
    assert_ne!(
        parent_of(exec.host),
        container.init,
        "docker exec's process is not the init's child"
    );
    let info = container.info();
    assert_eq!(
        listed(&info),
        [(local(exec.host) as u64, 0, 3 * GIB)].into(),
        "{info}"
    );
    let p = &info["devices"][0]["processes"][0];
    assert_eq!(p["owner"]["kind"], "container", "{p}");
    assert_eq!(p["confirmed"], true, "{p}");
    let run = container.gpuctl_run(&[
        "kill",
        "--pid",
        &local(exec.host).to_string(),
        "--timeout",
        "5s",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(!alive(exec.host));
    exec.end();
    drop(service);
}

/// `docker exec -i ID testproc` (a trainer), ready: the client on the host and the
/// process inside by its host pid.
struct ExecProcess {
    client: Child,
    host: u32,
    /// Its pidfd: the end signals this process, never a later one given its pid.
    fd: Option<std::os::fd::OwnedFd>,
}

impl ExecProcess {
    fn start(container: &Container) -> ExecProcess {
        let testproc = testproc_bin();
        let mut client = engine()
            .docker(&[
                "exec",
                "-i",
                "-e",
                "GPUCTL_TESTPROC_MODE=sleep",
                "-e",
                "GPUCTL_TESTPROC_READY=1",
                &container.id,
                testproc.to_str().unwrap(),
                "serve.py",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("docker exec");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(client.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready");
        let namespace = std::fs::metadata(format!("/proc/{}/ns/pid", container.init))
            .unwrap()
            .ino();
        let host = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
            .find(|&pid| {
                cmdline(pid).contains("serve.py")
                    && std::fs::metadata(format!("/proc/{pid}/ns/pid"))
                        .is_ok_and(|m| m.ino() == namespace)
            })
            .expect("the exec'd process inside");
        ExecProcess {
            client,
            host,
            fd: pidfd(host),
        }
    }

    fn end(&mut self) {
        if let Some(fd) = &self.fd {
            kill_by_pidfd(fd, libc::SIGKILL);
        }
        let _ = self.client.kill();
        let _ = self.client.wait();
    }
}

impl Drop for ExecProcess {
    fn drop(&mut self) {
        self.end();
    }
}

fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        .unwrap()
}

/// With `--pid=host`, gpuctl in the container is gpuctl on the host: host pids, every
/// process confirmed by its own look, no service asked, and `kill` by host pid.
#[test]
fn with_the_hosts_pid_namespace_gpuctl_behaves_as_on_the_host() {
    let sim = Sim::new(&Scenario::new().gpus(1, Gpu::h200()));
    let tenant = Tenant::start(
        &sim,
        Options {
            host_pids: true,
            ..Options::default()
        },
    );
    let host = Proc::sleeper("nv-hostjob", &["--serve"]);
    sim.write(&Scenario::new().gpus(1, Gpu::h200()).processes([
        Process::new(tenant.trainer).on(0).used(5 * GIB),
        Process::new(host.pid()).on(0).used(GIB),
    ]));
    assert_eq!(local(tenant.trainer), tenant.trainer, "a host pid");
    let info = tenant.container.info();
    assert_eq!(
        listed(&info),
        [
            (u64::from(tenant.trainer), 0, 5 * GIB),
            (u64::from(host.pid()), 0, GIB)
        ]
        .into(),
        "{info}"
    );
    for p in info["devices"][0]["processes"].as_array().unwrap() {
        assert_eq!(p["confirmed"], true, "{p}");
    }
    let trainer = info["devices"][0]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == tenant.trainer)
        .unwrap();
    assert_eq!(trainer["owner"]["kind"], "container", "{trainer}");
    let run = tenant.container.gpuctl_run(&["info"]);
    assert!(hints(&run.stderr).is_empty(), "{}", run.stderr);
    let run = tenant.container.gpuctl_run(&[
        "kill",
        "--pid",
        &tenant.trainer.to_string(),
        "--timeout",
        "5s",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(!alive(tenant.trainer));
    assert!(alive(host.pid()), "the host's job was ended");
}

/// Without the socket mounted, gpuctl inside says once how to mount it, and acts on
/// nothing: no process it cannot confirm is a target.
#[test]
fn without_the_socket_mounted_one_hint_and_nothing_acted_on() {
    let run_dir = rendezvous();
    let sim = Sim::new(&Scenario::new().gpus(1, Gpu::h200()));
    // A service is running on the host: only the mount is missing.
    let service = Service::start_at(&sim, run_dir.path().join("api.sock"));
    let tenant = Tenant::start(&sim, Options::default());
    let mut processes = vec![Process::new(tenant.trainer).on(0).used(GIB)];
    processes.extend(
        tenant
            .orphans
            .iter()
            .map(|&p| Process::new(p).on(0).used(GIB)),
    );
    sim.write(&Scenario::new().gpus(1, Gpu::h200()).processes(processes));
    let info = tenant.container.gpuctl_run(&["info"]);
    assert_eq!(info.code, 0, "{}", info.stderr);
    assert_eq!(hints(&info.stderr).len(), 1, "{}", info.stderr);
    assert_eq!(info.stderr.lines().count(), 1, "{}", info.stderr);
    assert!(
        hints(&info.stderr)[0].contains("/run/gpuctl"),
        "{}",
        info.stderr
    );
    let kill = tenant.container.gpuctl_run(&[
        "kill",
        "--pid",
        &local(tenant.trainer).to_string(),
        "--timeout",
        "2s",
    ]);
    assert_ne!(kill.code, 0, "an unconfirmed process is never a target");
    assert_eq!(hints(&kill.stderr).len(), 1, "{}", kill.stderr);
    let clear = tenant.container.gpuctl_run(&["clear", "--timeout", "2s"]);
    assert_eq!(hints(&clear.stderr).len(), 1, "{}", clear.stderr);
    for &pid in tenant.orphans.iter().chain([&tenant.trainer]) {
        assert!(alive(pid), "{pid} was acted on without the service");
    }
    drop(service);
}

/// `docker stop` while `clear --wait` waits inside: the wait ends with the container, the
/// client gets a clear exit, and the service answers the next caller.
#[test]
fn docker_stop_during_clear_wait_ends_it_cleanly() {
    let run_dir = rendezvous();
    let sim = Sim::new(&Scenario::new().gpus(1, Gpu::h200()));
    let service = Service::start_at(&sim, run_dir.path().join("api.sock"));
    let options = || Options {
        socket_dir: Some(run_dir.path()),
        ..Options::default()
    };
    let tenant = Tenant::start(&sim, options());
    let other = Tenant::start(&sim, options());
    // The trainer is alive: not a target, and its memory keeps the GPU busy.
    sim.write(&Scenario::new().gpus(1, Gpu::h200()).processes([
        Process::new(tenant.trainer).on(0).used(GIB),
        Process::new(other.trainer).on(0).used(GIB),
    ]));
    let mut clear = tenant
        .container
        .gpuctl(&["clear", "--wait=120s", "--timeout", "2s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker exec clear");
    // Until gpuctl waits inside.
    wait_until(Duration::from_secs(20), || {
        tenant
            .container
            .processes()
            .into_iter()
            .any(|pid| cmdline(pid).contains("--wait=120s"))
    });
    std::thread::sleep(Duration::from_millis(500));
    let stopped = Instant::now();
    let stop = engine()
        .docker(&["stop", "--time", "1", &tenant.container.id])
        .output()
        .expect("docker stop");
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let mut status = None;
    wait_until(Duration::from_secs(20), || {
        status = clear.try_wait().unwrap();
        status.is_some()
    });
    let status = status.unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(clear.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(
        stopped.elapsed() < Duration::from_secs(20),
        "clear --wait outlived docker stop by {:?}",
        stopped.elapsed()
    );
    // The engine ends the container's every process with SIGKILL once its init is gone;
    // docker exec says so as a shell would: 128 + 9.
    assert_eq!(status.code(), Some(137), "{status}: {stderr}");
    assert!(!alive(tenant.trainer));
    // The service still answers another container.
    let info = other.container.info();
    assert_eq!(info["host_service"]["answered"], true, "{info}");
    drop(service);
}
