//! Kubernetes pods as a kubelet makes them, under a real containerd: Debian's containerd
//! 1.6 with its CRI plugin and runc (installed by scripts/fetch-containerd), driven through
//! the CRI gRPC API with gpuctl-core's own client, as the kubelet drives it. gpuctl then
//! names the pods' GPU processes by asking that containerd.
//!
//! One containerd serves the whole test binary: started on first use with a root, state,
//! socket and configuration of its own (CRI enabled, the cgroupfs driver,
//! `restrict_oom_score_adj` since root here lacks CAP_SYS_RESOURCE, CNI pointed at empty
//! directories: pods use the node's network), and stopped at the process's exit by pid,
//! after the pods it still has are removed; then its directory is unmounted and removed.
//! Its two images are made here without a registry: a pause image (a static binary the
//! test compiles) and an empty root whose /usr is the host's, mounted read-only, each an
//! OCI layout imported with `ctr images import`.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use gpuctl_core::cri::{Runtime, Writer, proto};

use crate::docker::{end, unmount_below, which_sbin};
use crate::util::*;

static CONTAINERD: Fetch = Fetch::new("fetch-containerd");

const PAUSE_IMAGE: &str = "docker.io/gpuctl-test/pause:1";
const IMAGE: &str = "docker.io/gpuctl-test/rootfs:1";
/// The namespace the CRI plugin keeps its images and containers in.
const CRI_NAMESPACE: &str = "k8s.io";

struct Node {
    dir: PathBuf,
    socket: PathBuf,
    containerd: u32,
}

static NODE: OnceLock<Result<Node, String>> = OnceLock::new();

/// Pod sandboxes not yet removed, for the node's end to remove should a test not get to.
static PODS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn node() -> &'static Node {
    match NODE.get_or_init(Node::start) {
        Ok(node) => node,
        Err(reason) => panic!("{reason}"),
    }
}

impl Node {
    fn start() -> Result<Node, String> {
        CONTAINERD.once()?;
        let dir = PathBuf::from(format!("/tmp/gpuctl-k8s-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["cni/bin", "cni/conf", "logs", "images"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let socket = dir.join("containerd.sock");
        std::fs::write(dir.join("config.toml"), config(&dir, &socket)).unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new(which_sbin("containerd"))
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start containerd: {e}"))?;
        let node = Node {
            dir,
            socket,
            containerd: child.id(),
        };
        std::mem::forget(child);
        extern "C" fn stop_at_exit() {
            if let Some(Ok(node)) = NODE.get() {
                node.stop();
            }
        }
        // SAFETY: registers a plain function with no captured state.
        unsafe { libc::atexit(stop_at_exit) };
        if let Err(reason) = node.wait_ready().and_then(|()| node.import_images()) {
            node.stop();
            return Err(reason);
        }
        Ok(node)
    }

    /// Until the CRI plugin answers `Version`.
    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let soon = Instant::now() + Duration::from_secs(2);
            let answer = Runtime::connect(&self.socket, soon)
                .and_then(|mut runtime| runtime.call("Version", Writer::new()));
            if answer.is_ok() {
                return Ok(());
            }
            if !alive(self.containerd) || Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
                let last = log
                    .lines()
                    .rev()
                    .find(|l| l.contains("level=error"))
                    .or(log.lines().last());
                return Err(format!(
                    "containerd did not start ({answer:?}): {}",
                    last.unwrap_or("no output").trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn runtime(&self) -> Runtime {
        Runtime::connect(&self.socket, Instant::now() + Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("containerd's CRI socket: {e}"))
    }

    fn import_images(&self) -> Result<(), String> {
        let pause_root = self.dir.join("images/pause-root");
        std::fs::create_dir_all(&pause_root).unwrap();
        let source = self.dir.join("images/pause.c");
        std::fs::write(
            &source,
            "#include <signal.h>\n#include <unistd.h>\n\
             static void stop(int s) { (void)s; _exit(0); }\n\
             int main(void) { signal(SIGTERM, stop); signal(SIGINT, stop); for (;;) pause(); }\n",
        )
        .unwrap();
        run(Command::new("cc")
            .args(["-static", "-O2", "-o"])
            .arg(pause_root.join("pause"))
            .arg(&source))?;
        self.import(&pause_root, PAUSE_IMAGE, &["/pause"])?;
        let root = self.dir.join("images/rootfs");
        for sub in ["usr", "proc", "sys", "dev", "etc", "tmp", "root"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        for link in ["bin", "sbin", "lib", "lib64"] {
            std::os::unix::fs::symlink(format!("usr/{link}"), root.join(link)).unwrap();
        }
        std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
        self.import(&root, IMAGE, &["/usr/bin/sleep", "infinity"])
    }

    /// An OCI image layout of one uncompressed layer (`root`), imported as `name`.
    fn import(&self, root: &Path, name: &str, entrypoint: &[&str]) -> Result<(), String> {
        let short = name.rsplit('/').next().unwrap().replace(':', "-");
        let layout = self.dir.join("images").join(format!("{short}-layout"));
        let blobs = layout.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        let layer = self.dir.join("images").join(format!("{short}.tar"));
        run(Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(root)
            .arg("-cf")
            .arg(&layer)
            .arg("."))?;
        let layer = add_blob(&blobs, &std::fs::read(&layer).unwrap());
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", layer.0)]},
        });
        let config = add_blob(&blobs, config.to_string().as_bytes());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
            "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", &layer)],
        });
        let manifest = add_blob(&blobs, manifest.to_string().as_bytes());
        let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
        entry["annotations"] = serde_json::json!({
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap(),
        });
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [entry]});
        std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
        std::fs::write(
            layout.join("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        let archive = self.dir.join("images").join(format!("{short}.oci.tar"));
        run(Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(&archive)
            .arg("."))?;
        run(Command::new(which_sbin("ctr"))
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", CRI_NAMESPACE, "images", "import"])
            .arg(&archive))
    }

    /// Removes the pods left, stops containerd (by pid, TERM then KILL) and the shims it
    /// started, and removes the node's directory with whatever it still had mounted.
    fn stop(&self) {
        let left: Vec<String> = PODS
            .lock()
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        if !left.is_empty()
            && let Ok(mut runtime) =
                Runtime::connect(&self.socket, Instant::now() + Duration::from_secs(30))
        {
            for sandbox in left {
                remove_sandbox(&mut runtime, &sandbox);
            }
        }
        end(self.containerd, Duration::from_secs(10));
        let address = self.socket.display().to_string();
        for shim in pids_with_argument(&address) {
            end(shim, Duration::from_secs(5));
        }
        unmount_below(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config(dir: &Path, socket: &Path) -> String {
    let dir = dir.display();
    format!(
        r#"version = 2
root = "{dir}/root"
state = "{dir}/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{dir}/cni/bin"
    conf_dir = "{dir}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
"#,
        socket = socket.display()
    )
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{:?} failed: {}",
        command.get_program(),
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// Stores `bytes` under its digest; the digest and size.
fn add_blob(blobs: &Path, bytes: &[u8]) -> (String, usize) {
    let tmp = blobs.join("incoming");
    std::fs::write(&tmp, bytes).unwrap();
    let sum = Command::new("sha256sum")
        .arg(&tmp)
        .output()
        .expect("sha256sum");
    let digest = String::from_utf8_lossy(&sum.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    std::fs::rename(&tmp, blobs.join(&digest)).unwrap();
    (digest, bytes.len())
}

fn descriptor(media_type: &str, (digest, size): &(String, usize)) -> serde_json::Value {
    serde_json::json!({"mediaType": media_type, "digest": format!("sha256:{digest}"), "size": size})
}

fn alive(pid: u32) -> bool {
    !matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// The processes whose command line has `argument` (the shims of this node's containerd).
fn pids_with_argument(argument: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                cmdline
                    .split(|b| *b == 0)
                    .any(|arg| arg == argument.as_bytes())
            })
        })
        .collect()
}

fn remove_sandbox(runtime: &mut Runtime, sandbox: &str) {
    let request = || Writer::new().string(1, sandbox);
    let _ = runtime.call("StopPodSandbox", request());
    let _ = runtime.call("RemovePodSandbox", request());
}

/// A pod made as the kubelet makes it, removed through CRI when dropped.
struct Pod {
    sandbox: String,
    uid: String,
    /// Each container's id and name.
    containers: Vec<(String, String)>,
    removed: bool,
}

/// The CRI `NamespaceMode` of a pod on the node's network (no CNI here).
const NODE_NETWORK: u64 = 2;

impl Pod {
    /// Pod NAMESPACE/NAME (Burstable, the cgroupfs driver's parent) with one running
    /// container of each name in `containers`, each running `sleep infinity`.
    fn run(namespace: &str, name: &str, containers: &[&str]) -> Pod {
        let node = node();
        let uid = new_uid();
        let labels = [
            ("io.kubernetes.pod.name", name),
            ("io.kubernetes.pod.namespace", namespace),
            ("io.kubernetes.pod.uid", uid.as_str()),
        ];
        let network = || Writer::new().uint(1, NODE_NETWORK);
        let log_dir = node.dir.join("logs").join(&uid);
        let sandbox_config = Writer::new()
            .message(
                1,
                Writer::new()
                    .string(1, name)
                    .string(2, &uid)
                    .string(3, namespace),
            )
            // No hostname: on the node's network the kubelet leaves it to the node's.
            .string(3, &log_dir.display().to_string())
            .map(6, &labels)
            .message(
                8,
                Writer::new()
                    .string(1, &format!("/kubepods/burstable/pod{uid}"))
                    .message(2, Writer::new().message(1, network())),
            );
        let mut runtime = node.runtime();
        let answer = runtime
            .call(
                "RunPodSandbox",
                Writer::new().message(1, sandbox_config.clone()),
            )
            .unwrap_or_else(|e| panic!("RunPodSandbox {namespace}/{name}: {e}"));
        let sandbox = first_string(&answer);
        PODS.lock().unwrap().insert(sandbox.clone());
        let mut pod = Pod {
            sandbox,
            uid: uid.clone(),
            containers: Vec::new(),
            removed: false,
        };
        for container in containers {
            let id = pod.start_container(&mut runtime, container, &labels, &sandbox_config);
            pod.containers.push((id, container.to_string()));
        }
        pod
    }

    fn start_container(
        &self,
        runtime: &mut Runtime,
        name: &str,
        pod_labels: &[(&str, &str)],
        sandbox_config: &Writer,
    ) -> String {
        let mut labels = pod_labels.to_vec();
        labels.push(("io.kubernetes.container.name", name));
        let usr = Writer::new().string(1, "/usr").string(2, "/usr").uint(3, 1);
        let security = Writer::new().message(3, Writer::new().uint(1, NODE_NETWORK));
        let config = Writer::new()
            .message(1, Writer::new().string(1, name))
            .message(2, Writer::new().string(1, IMAGE))
            .strings(3, &["/usr/bin/sleep", "infinity"])
            .message(7, usr)
            .map(9, &labels)
            .string(11, &format!("{name}/0.log"))
            .message(15, Writer::new().message(2, security));
        let request = Writer::new()
            .string(1, &self.sandbox)
            .message(2, config)
            .message(3, sandbox_config.clone());
        let answer = runtime
            .call("CreateContainer", request)
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}"));
        let id = first_string(&answer);
        runtime
            .call("StartContainer", Writer::new().string(1, &id))
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e}"));
        id
    }

    /// The host pids of container `index`, from its cgroup (as the kubelet's cgroupfs
    /// driver placed it).
    fn pids(&self, index: usize) -> Vec<u32> {
        let (id, _) = &self.containers[index];
        let relative = format!("kubepods/burstable/pod{}/{id}/cgroup.procs", self.uid);
        let procs = [
            "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup",
        ]
        .iter()
        .map(|root| Path::new(root).join(&relative))
        .find_map(|path| std::fs::read_to_string(path).ok())
        .unwrap_or_else(|| panic!("no cgroup for container {id}"));
        procs
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect()
    }

    /// The pid of container `index`'s one process.
    fn pid(&self, index: usize) -> u32 {
        let pids = self.pids(index);
        assert_eq!(pids.len(), 1, "container {index}: {pids:?}");
        pids[0]
    }

    /// Stops and removes the pod through CRI, as the kubelet does when it is deleted.
    fn remove(&mut self) {
        if std::mem::replace(&mut self.removed, true) {
            return;
        }
        remove_sandbox(&mut node().runtime(), &self.sandbox);
        PODS.lock().unwrap().remove(&self.sandbox);
        // The pod's own cgroup is the kubelet's to remove, not the runtime's; one that still
        // holds a process (a test's leftover) stays until the test removes it.
        for dir in self.cgroup_dirs() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The first field of an answer, a string: RunPodSandbox's and CreateContainer's id.
fn first_string(answer: &[u8]) -> String {
    match proto::fields(answer).next() {
        Some(Ok((1, proto::Value::Bytes(id)))) => String::from_utf8_lossy(id).into_owned(),
        other => panic!("no id in the answer: {other:?}"),
    }
}

/// A random pod UID, as the API server makes them.
fn new_uid() -> String {
    let bytes = std::fs::read("/proc/sys/kernel/random/uuid").expect("a random uuid");
    String::from_utf8_lossy(&bytes).trim().to_string()
}

fn runtime_config(socket: &Path, timeout: &str) -> String {
    format!(
        "[kubernetes]\nruntime_socket = \"{}\"\nruntime_timeout = \"{timeout}\"\n",
        socket.display()
    )
}

fn scenario(used: &[(u32, u64)]) -> Scenario {
    Scenario::new().gpu(Gpu::h100()).processes(
        used.iter()
            .map(|&(pid, bytes)| Process::new(pid).on(0).used(bytes)),
    )
}

#[test]
fn info_names_pods_by_namespace_name_and_container() {
    let trainer = Pod::run("ml", "trainer-0", &["trainer"]);
    let notebook = Pod::run("ml", "notebook-7", &["jupyter"]);
    let sim = Sim::new(&scenario(&[
        (trainer.pid(0), 30 * GIB),
        (notebook.pid(0), 6 * GIB),
    ]));
    std::fs::write(sim.config_path(), runtime_config(&node().socket, "10s")).unwrap();

    let table = sim.run(&["info"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table
            .stdout
            .contains("pod ml/trainer-0 (container trainer)"),
        "{}",
        table.stdout
    );
    assert!(
        table
            .stdout
            .contains("pod ml/notebook-7 (container jupyter)"),
        "{}",
        table.stdout
    );

    let json = sim.json(&["info"]);
    crate::schema::conforms(&crate::schema::schema("info-v1.schema.json"), &json).unwrap();
    let owners: Vec<&serde_json::Value> = json["devices"][0]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["owner"])
        .collect();
    let trainer_owner = owners
        .iter()
        .find(|o| o["pod"]["name"] == "trainer-0")
        .expect("trainer");
    assert_eq!(trainer_owner["pod"]["namespace"], "ml");
    assert_eq!(trainer_owner["pod"]["container"], "trainer");
    assert_eq!(trainer_owner["pod_uid"], trainer.uid.as_str());
    assert_eq!(trainer_owner["qos"], "Burstable");
    assert_eq!(
        trainer_owner["container_id"],
        trainer.containers[0].0.as_str()
    );
    assert_eq!(
        json["pod_runtime"]["error"],
        serde_json::Value::Null,
        "{json}"
    );

    // Totals: per namespace, and per pod (not per container) as the owner.
    let by_namespace = sim.json(&["info", "--by", "namespace"]);
    crate::schema::conforms(&crate::schema::schema("info-v1.schema.json"), &by_namespace).unwrap();
    assert_eq!(
        by_namespace["totals"][0]["namespace"], "ml",
        "{by_namespace}"
    );
    assert_eq!(by_namespace["totals"][0]["used_bytes"], 36 * GIB);
    assert_eq!(by_namespace["totals"][0]["processes"], 2);
    let by_owner = sim.run(&["info", "--by", "owner"]);
    assert!(
        by_owner.stdout.contains("pod ml/trainer-0 "),
        "{}",
        by_owner.stdout
    );
    assert!(
        !by_owner.stdout.contains("(container"),
        "{}",
        by_owner.stdout
    );
    let table = sim.run(&["info", "--by", "namespace"]);
    assert!(table.stdout.contains("NAMESPACE"), "{}", table.stdout);

    // Selected by the names: a dry run of kill through the reclaim road.
    let (trainer_pid, notebook_pid) = (trainer.pid(0), notebook.pid(0));
    let kill = sim.run(&[
        "kill",
        "--owner",
        "pod:ml/notebook-*",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(kill.code, 0, "{}", kill.stderr);
    assert!(
        kill.stdout.contains(&format!("\"pid\": {notebook_pid}"))
            || kill.stdout.contains(&format!("\"pid\":{notebook_pid}")),
        "{}",
        kill.stdout
    );
    assert!(
        !kill.stdout.contains(&format!("{trainer_pid}")),
        "{}",
        kill.stdout
    );
    drop(notebook);
}

#[test]
fn an_absent_or_hanging_runtime_leaves_pods_named_by_uid_and_says_why() {
    let pod = Pod::run("ml", "absent-1", &["worker"]);
    let sim = Sim::new(&scenario(&[(pod.pid(0), GIB)]));
    let short = &pod.uid[..8];

    let absent = sim.dir.path().join("no-runtime.sock");
    std::fs::write(sim.config_path(), runtime_config(&absent, "300ms")).unwrap();
    let run = sim.run(&["info"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains(&format!("k8s pod {short}")),
        "{}",
        run.stdout
    );
    let json = sim.json(&["info"]);
    let error = json["pod_runtime"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("cannot connect") && error.contains("no-runtime.sock"),
        "{json}"
    );

    // A runtime that takes the connection and never answers.
    let hanging = sim.dir.path().join("hanging.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&hanging).unwrap();
    std::fs::write(sim.config_path(), runtime_config(&hanging, "300ms")).unwrap();
    let json = sim.json(&["info"]);
    let error = json["pod_runtime"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("did not answer within 300ms"), "{json}");
    crate::schema::conforms(&crate::schema::schema("info-v1.schema.json"), &json).unwrap();
    assert_eq!(
        json["devices"][0]["processes"][0]["owner"]["pod_uid"],
        pod.uid.as_str()
    );
}

impl Pod {
    /// Moves `pid` into the pod's own cgroup, beside its containers' (in every hierarchy
    /// that has it): a process outside its containers' lifecycle. The runtime ends only
    /// what is in a container's cgroup when it removes the pod; what is left in the pod's
    /// is the kubelet's to end, and is what a pod whose cleanup failed leaves behind.
    fn adopt(&self, pid: u32) {
        let mut moved = 0;
        for hierarchy in self.cgroup_dirs() {
            if std::fs::write(hierarchy.join("cgroup.procs"), pid.to_string()).is_ok() {
                moved += 1;
            }
        }
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        assert!(
            moved > 0 && cgroup.contains(&format!("pod{}", self.uid)),
            "{cgroup}"
        );
    }

    /// The pod's own cgroup directory in each hierarchy that has one.
    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let relative = format!("kubepods/burstable/pod{}", self.uid);
        let mut roots = vec![PathBuf::from("/sys/fs/cgroup")];
        if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
            roots.extend(entries.flatten().map(|entry| entry.path()));
        }
        roots
            .into_iter()
            .map(|root| root.join(&relative))
            .filter(|dir| dir.is_dir())
            .collect()
    }
}

#[test]
fn a_removed_pods_leftover_is_named_by_its_last_name_and_clear_ends_it_alone() {
    let mut trainer = Pod::run("ml", "trainer-0", &["trainer"]);
    let keeper = Pod::run("ml", "keeper-1", &["worker"]);
    let mut leftover = Proc::sleeper("python3", &["train.py", "--rank", "0"]);
    trainer.adopt(leftover.pid());
    let mut bystander = Proc::sleeper("python3", &["notebook.py"]);
    let sim = Sim::new(&scenario(&[
        (leftover.pid(), 20 * GIB),
        (keeper.pid(0), 4 * GIB),
        (bystander.pid(), 2 * GIB),
    ]));
    let socket = &node().socket;
    std::fs::write(sim.config_path(), runtime_config(socket, "10s")).unwrap();
    let process = |json: &serde_json::Value, pid: u32| -> serde_json::Value {
        crate::util::process_on(json, 0, pid)
            .cloned()
            .unwrap_or_else(|| panic!("no process {pid}: {json}"))
    };

    // While the pod lives, its process is the pod's, named, and nothing to reclaim.
    let living = sim.json(&["info"]);
    let before = process(&living, leftover.pid());
    assert_eq!(before["owner"]["pod"]["name"], "trainer-0", "{before}");
    assert!(before.get("reclaimable").is_none(), "{before}");

    trainer.remove();
    assert!(
        alive(leftover.pid()),
        "the runtime ended the pod's own cgroup"
    );

    // A runtime that does not answer has lost no pod: nothing is reclaimable.
    let absent = sim.dir.path().join("no-runtime.sock");
    std::fs::write(sim.config_path(), runtime_config(&absent, "300ms")).unwrap();
    let down = sim.json(&["info"]);
    assert!(down["pod_runtime"]["error"].is_string(), "{down}");
    let unanswered = process(&down, leftover.pid());
    assert!(unanswered.get("reclaimable").is_none(), "{unanswered}");
    let dry = sim.run(&["clear", "--dry-run", "--json"]);
    assert!(
        !dry.stdout.contains(&format!("\"pid\": {}", leftover.pid())),
        "{}",
        dry.stdout
    );

    // The runtime answers that it no longer has the pod: a leftover, by its last name.
    std::fs::write(sim.config_path(), runtime_config(socket, "10s")).unwrap();
    let gone = sim.json(&["info"]);
    crate::schema::conforms(&crate::schema::schema("info-v1.schema.json"), &gone).unwrap();
    let after = process(&gone, leftover.pid());
    assert_eq!(after["reclaimable"], "pod_leftover", "{after}");
    assert_eq!(after["owner"]["pod"]["namespace"], "ml", "{after}");
    assert_eq!(after["owner"]["pod"]["name"], "trainer-0", "{after}");
    assert!(process(&gone, keeper.pid(0)).get("reclaimable").is_none());
    let table = sim.run(&["info"]);
    let line = table
        .stdout
        .lines()
        .find(|line| line.trim_start().starts_with(&leftover.pid().to_string()))
        .unwrap_or_else(|| panic!("{}", table.stdout));
    assert!(
        line.contains("pod_leftover") && line.contains("pod ml/trainer-0"),
        "{line}"
    );

    // The watchdog judges it so too (a dry run: clear is the one that ends it here).
    let watchdog = crate::watchdog::command(&sim, &["--once", "--mode", "reclaim", "--dry-run"])
        .env("GPUCTL_STATE_DIR", sim.dir.path().join("gpuctl-state"))
        .output()
        .expect("run gpuctl-watchdog");
    let watchdog = Run::from(watchdog);
    assert!(
        watchdog.stderr.contains("ACTION=would-reclaim")
            && watchdog.stderr.contains("leftover of pod ml/trainer-0"),
        "{}",
        watchdog.stderr
    );
    assert!(alive(leftover.pid()));

    let cleared = sim.run(&["clear", "--json"]);
    assert_eq!(cleared.code, 0, "{}{}", cleared.stdout, cleared.stderr);
    let report: serde_json::Value = serde_json::from_str(&cleared.stdout).unwrap();
    crate::schema::conforms(&crate::schema::schema("reclaim-v1.schema.json"), &report).unwrap();
    let outcomes = report["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 1, "{report}");
    assert_eq!(outcomes[0]["pid"], leftover.pid(), "{report}");
    assert_eq!(outcomes[0]["ended"]["outcome"], "exited", "{report}");
    assert!(
        outcomes[0]["reasons"][0]
            .as_str()
            .unwrap()
            .starts_with("leftover of pod ml/trainer-0:"),
        "{report}"
    );
    wait_until(Duration::from_secs(10), || !alive(leftover.pid()));
    assert!(alive(keeper.pid(0)), "the living pod's process was spared");
    assert!(alive(bystander.pid()), "the process of no pod was spared");
    leftover.kill();
    bystander.kill();
    for dir in trainer.cgroup_dirs() {
        let _ = std::fs::remove_dir(dir);
    }
}

#[test]
fn protect_owners_spare_a_namespaces_pods_from_clear() {
    let mut server = Pod::run("prod", "server-0", &["server"]);
    let mut trainer = Pod::run("ml", "trainer-1", &["trainer"]);
    let mut spared = Proc::sleeper("python3", &["serve.py"]);
    server.adopt(spared.pid());
    let mut ended = Proc::sleeper("python3", &["train.py"]);
    trainer.adopt(ended.pid());
    let sim = Sim::new(&scenario(&[
        (spared.pid(), 8 * GIB),
        (ended.pid(), 8 * GIB),
    ]));
    let config = format!(
        "{}\n[protect]\nowners = [\"namespace:prod\"]\n",
        runtime_config(&node().socket, "10s")
    );
    std::fs::write(sim.config_path(), config).unwrap();
    // Seen named while the pods live, then both deleted, leaving their processes.
    assert_eq!(sim.run(&["info"]).code, 0);
    server.remove();
    trainer.remove();

    // A target spared is one not reclaimed: exit status 1, as for a protected user.
    let cleared = sim.run(&["clear", "--json"]);
    assert_eq!(cleared.code, 1, "{}{}", cleared.stdout, cleared.stderr);
    let report: serde_json::Value = serde_json::from_str(&cleared.stdout).unwrap();
    let outcome = |pid: u32| {
        report["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["pid"] == pid)
            .cloned()
            .unwrap_or_else(|| panic!("no outcome for {pid}: {report}"))
    };
    assert_eq!(
        outcome(ended.pid())["ended"]["outcome"],
        "exited",
        "{report}"
    );
    let skipped = outcome(spared.pid())["skipped"].to_string();
    assert!(
        skipped.contains("protected owner: namespace:prod"),
        "{report}"
    );
    assert!(alive(spared.pid()));
    wait_until(Duration::from_secs(10), || !alive(ended.pid()));
    spared.kill();
    ended.kill();
    for dir in server
        .cgroup_dirs()
        .into_iter()
        .chain(trainer.cgroup_dirs())
    {
        let _ = std::fs::remove_dir(dir);
    }
}
