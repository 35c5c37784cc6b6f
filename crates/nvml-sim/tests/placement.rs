//! `nvml-sim run` as root: each stand-in runs as its scenario `user`, in its scenario
//! `cgroup` (made in a private subtree, read through a cgroup namespace exactly as the
//! manager wrote it), a `crashed` run leaves its workers orphaned, and accounts and cgroups
//! are gone when the run ends, however it ends. Without root: one warning, as before.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const CHILD: &str = "NVML_SIM_TEST_PLACEMENT_CHILD";
const SLURM: &str = "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0";
const DOCKER: &str =
    "/system.slice/docker-28b3b0d2dfb93b8dd35399ea7061d93524f1c646335eef6f6edaf739c73dcf19.scope";

/// The hierarchies this host mounts that managers put processes in.
const HIERARCHIES: [&str; 3] = [
    "/sys/fs/cgroup/unified",
    "/sys/fs/cgroup/systemd",
    "/sys/fs/cgroup",
];

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "needs root: the launcher makes accounts and cgroups only as root (run the suite as root)"
    );
}

/// A user name of this test run's own: accounts are the whole machine's.
fn user_name() -> String {
    format!("nvsimtest{}", std::process::id() % 1_000_000)
}

fn scenario(dir: &Path, user: &str) -> std::path::PathBuf {
    let path = dir.join("team.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[[gpu]]
[[gpu]]
[[process]]
spawn = ["python3", "train.py", "--rank", "0"]
user = "{user}"
cgroup = "{SLURM}"
gpu = 0
used_mib = 1000
workers = 1
worker_used_mib = 10
[[process]]
spawn = ["python3", "serve.py"]
user = 4242
cgroup = "{DOCKER}"
gpu = 1
used_mib = 2000
[[process]]
spawn = ["python3", "crashed.py"]
crashed = true
gpu = 1
workers = 2
worker_used_mib = 300
"#
        ),
    )
    .unwrap();
    path
}

fn passwd_uid(name: &str) -> Option<u32> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f[0] == name)
        .map(|f| f[2].parse().unwrap())
}

/// The subtrees a launcher with `pid` made, still present.
fn subtrees_of(pid: u32) -> Vec<String> {
    HIERARCHIES
        .iter()
        .filter_map(|h| std::fs::read_dir(h).ok())
        .flat_map(|entries| entries.flatten())
        .map(|e| e.path().display().to_string())
        .filter(|p| p.contains(&format!("nvml-sim-run.{pid}.")))
        .collect()
}

/// One line per listed process: `PROC gpu pid uid pgid v2-path systemd-path`, then the
/// child's own cgroup and its parent (the launcher).
#[test]
fn placement_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let line_of = |text: &str, v2: bool| {
        text.lines()
            .find(|l| {
                if v2 {
                    l.starts_with("0::")
                } else {
                    l.contains(":name=systemd:")
                }
            })
            .map(|l| l.rsplit(':').next().unwrap().to_string())
            .unwrap_or_else(|| "-".into())
    };
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    println!("SELF {} {}", line_of(&own, true), line_of(&own, false));
    // SAFETY: getppid has no preconditions.
    println!("LAUNCHER {}", unsafe { libc::getppid() });
    let nvml = open_nvml();
    for i in 0..nvml.device_count().unwrap() {
        let d = nvml.device_by_index(i).unwrap();
        for p in d.running_compute_processes().unwrap() {
            let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid)).unwrap();
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next())
                .unwrap()
                .to_string();
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid)).unwrap();
            let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
            let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid)).unwrap();
            println!(
                "PROC {i} {} {uid} {} {} {}",
                p.pid,
                fields[2],
                line_of(&cgroup, true),
                line_of(&cgroup, false)
            );
        }
    }
}

struct Seen {
    /// (gpu, pid, uid, pgid, v2 path, systemd path)
    procs: Vec<(u32, u32, u32, u32, String, String)>,
    own: String,
    launcher: u32,
}

fn parse(stdout: &str) -> Seen {
    let mut seen = Seen {
        procs: Vec::new(),
        own: String::new(),
        launcher: 0,
    };
    for line in stdout.lines() {
        // libtest prints `test placement_child ... ` before the child's first line.
        let line = ["SELF ", "LAUNCHER ", "PROC "]
            .iter()
            .find_map(|tag| line.find(tag).map(|at| &line[at..]))
            .unwrap_or(line);
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "SELF" => seen.own = f[1].to_string(),
            "LAUNCHER" => seen.launcher = f[1].parse().unwrap(),
            "PROC" => seen.procs.push((
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[4].parse().unwrap(),
                f[5].to_string(),
                f[6].to_string(),
            )),
            _ => {}
        }
    }
    seen
}

fn launch(args: &[&str], scenario: &Path, as_nobody: bool) -> (i32, String, String) {
    let mut command = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(bin_path());
        c
    } else {
        Command::new(bin_path())
    };
    let out = command
        .arg("run")
        .args(args)
        .arg(scenario)
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "placement_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env_remove("NVML_SIM_STATE")
        .env("TMPDIR", "/tmp")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn as_root_standins_run_as_their_users_in_their_managers_cgroups() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let user = user_name();
    assert_eq!(passwd_uid(&user), None, "{user} exists before the test");
    let scenario = scenario(dir.path(), &user);
    let (code, stdout, stderr) = launch(&["--create-users"], &scenario, false);
    assert_eq!(code, 0, "{stderr}\n{stdout}");
    assert_eq!(
        stderr, "",
        "as root with --create-users nothing needs saying"
    );
    let seen = parse(&stdout);
    // COMMAND is at the root of its cgroup namespace: the host's hierarchy is not seen.
    assert_eq!(seen.own, "/", "{stdout}");

    let on = |gpu: u32| seen.procs.iter().filter(|p| p.0 == gpu).collect::<Vec<_>>();
    let (rank, serve) = (on(0), on(1));
    assert_eq!(rank.len(), 2, "the rank and its worker: {stdout}");
    let made_uid = rank[0].2;
    assert!(made_uid != 0 && rank[1].2 == made_uid, "{stdout}");
    for p in &rank {
        assert_eq!(p.4, SLURM, "v2 path: {stdout}");
        assert_eq!(p.5, SLURM, "v1 name=systemd path: {stdout}");
    }
    // GPU 1: serve.py as uid 4242, which has no account, in its container; the crashed
    // run's two workers without their main process, which is not listed.
    assert_eq!(serve.len(), 3, "{stdout}");
    let server = serve.iter().find(|p| p.2 == 4242).expect("uid 4242");
    assert_eq!((server.4.as_str(), server.5.as_str()), (DOCKER, DOCKER));
    let workers: Vec<_> = serve.iter().filter(|p| p.2 != 4242).collect();
    assert_eq!(workers.len(), 2, "{stdout}");
    let leader = workers[0].3;
    assert!(workers.iter().all(|w| w.3 == leader && w.1 != leader));
    assert!(
        !Path::new(&format!("/proc/{leader}")).exists(),
        "the crashed run's main process {leader} is gone"
    );

    // Everything made for the run is gone with it.
    assert_eq!(subtrees_of(seen.launcher), Vec::<String>::new());
    assert_eq!(passwd_uid(&user), None, "{user} outlived the run");
    for p in &seen.procs {
        let gone = poll(Duration::from_secs(5), || {
            matches!(proc_state(p.1), None | Some('Z') | Some('X')).then_some(())
        });
        assert!(gone.is_some(), "stand-in {} outlived the launcher", p.1);
    }
}

#[test]
fn as_root_a_missing_user_without_create_users_is_said_once_and_runs_as_root() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let user = user_name() + "x";
    let scenario = scenario(dir.path(), &user);
    let (code, stdout, stderr) = launch(&[], &scenario, false);
    assert_eq!(code, 0, "{stderr}\n{stdout}");
    assert_eq!(
        stderr,
        format!(
            "nvml-sim: no user {user} here: its stand-ins run as root (--create-users makes system accounts for the run)\n"
        )
    );
    let seen = parse(&stdout);
    let rank: Vec<_> = seen.procs.iter().filter(|p| p.0 == 0).collect();
    assert!(rank.iter().all(|p| p.2 == 0 && p.4 == SLURM), "{stdout}");
    assert_eq!(passwd_uid(&user), None);
}

#[test]
fn without_root_user_and_cgroup_are_left_out_with_one_warning() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let scenario = scenario(dir.path(), "alice");
    let (code, stdout, stderr) = launch(&["--create-users"], &scenario, true);
    assert_eq!(code, 0, "{stderr}\n{stdout}");
    assert_eq!(
        stderr,
        "nvml-sim: not root: the stand-ins run as you, in your cgroup (the scenario's user and cgroup keys need root)\n"
    );
    let seen = parse(&stdout);
    assert_eq!(seen.procs.len(), 5, "{stdout}");
    assert!(
        seen.procs.iter().all(|p| p.2 == 65534 && p.4 != SLURM),
        "{stdout}"
    );
}

/// SIGTERM while COMMAND runs: COMMAND ends, and the accounts and cgroups made go too.
#[test]
fn a_terminated_run_removes_its_users_and_cgroups() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let user = user_name() + "t";
    let scenario = scenario(dir.path(), &user);
    let launcher = Command::new(bin_path())
        .args(["run", "--create-users"])
        .arg(&scenario)
        .args(["--", "sleep", "60"])
        .env_remove("NVML_SIM_STATE")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = launcher.id();
    let ready = poll(Duration::from_secs(10), || {
        (!subtrees_of(pid).is_empty() && passwd_uid(&user).is_some()).then_some(())
    });
    assert!(ready.is_some(), "no cgroups or no {user} while running");
    // Give COMMAND time to start, so the signal is forwarded rather than stopping setup.
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let out = launcher.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert_eq!(subtrees_of(pid), Vec::<String>::new());
    assert_eq!(passwd_uid(&user), None, "{user} outlived the run");
}

#[test]
fn bad_user_and_cgroup_keys_are_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[gpu]]\n[[process]]\nspawn = [\"x\"]\ngpu = 0\ncgroup = \"system.slice/x.service\"\n",
    )
    .unwrap();
    let out = Command::new(bin_path())
        .args(["run", "--create-users"])
        .arg(&bad)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("process[0]: cgroup 'system.slice/x.service' must be an absolute path"),
        "{stderr}"
    );
}
