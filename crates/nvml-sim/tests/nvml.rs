//! The built cdylib, loaded through nvml-wrapper (and raw dlsym for the ABI conventions).

mod common;

use std::ffi::{CStr, c_char, c_uint};
use std::time::{Duration, Instant};

use common::*;
use nvml_wrapper::enum_wrappers::device::{Clock, ComputeMode, TemperatureSensor};
use nvml_wrapper::enums::device::{GpuLockedClocksSetting, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;

const MIB: u64 = 1024 * 1024;

#[test]
fn devices_and_identity() {
    let sim = Sim::new(
        r#"
driver_version = "570.133.20"
cuda_driver_version = 12080
[[gpu]]
[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-11111111-2222-3333-4444-555555555555"
pci_bus_id = "00000000:9A:00.0"
serial = "1650000000042"
[[gpu]]
"#,
    );
    let nvml = sim.nvml();
    assert_eq!(nvml.sys_driver_version().unwrap(), "570.133.20");
    assert_eq!(nvml.sys_nvml_version().unwrap(), "12.570.133.20");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12080);
    assert_eq!(nvml.device_count().unwrap(), 3);
    let d0 = nvml.device_by_index(0).unwrap();
    assert_eq!(d0.name().unwrap(), "NVIDIA H200");
    assert_eq!(d0.memory_info().unwrap().total, 143_771 * MIB);
    let cc = d0.cuda_compute_capability().unwrap();
    assert_eq!((cc.major, cc.minor), (9, 0));
    let u0 = d0.uuid().unwrap();
    assert!(u0.starts_with("GPU-") && u0.len() == 40, "{u0}");
    let d1 = nvml.device_by_index(1).unwrap();
    assert_eq!(
        d1.uuid().unwrap(),
        "GPU-11111111-2222-3333-4444-555555555555"
    );
    assert_eq!(d1.serial().unwrap(), "1650000000042");
    assert_eq!(d1.memory_info().unwrap().total, 81_559 * MIB);
    let pci = d1.pci_info().unwrap();
    assert_eq!(pci.bus_id, "00000000:9A:00.0");
    assert_eq!(pci.bus, 0x9a);
    let by_uuid = nvml
        .device_by_uuid("GPU-11111111-2222-3333-4444-555555555555")
        .unwrap();
    assert_eq!(by_uuid.index().unwrap(), 1);
    let by_pci = nvml.device_by_pci_bus_id("0000:9a:00.0").unwrap();
    assert_eq!(by_pci.index().unwrap(), 1);
    assert!(matches!(
        nvml.device_by_uuid("GPU-nope"),
        Err(NvmlError::NotFound)
    ));
    let d2 = nvml.device_by_index(2).unwrap();
    assert_ne!(d2.uuid().unwrap(), u0);
    assert_ne!(d2.pci_info().unwrap().bus_id, d0.pci_info().unwrap().bus_id);
    assert!(matches!(
        nvml.device_by_index(3),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn memory_processes_and_utilization() {
    let mut a = sleeper();
    let mut b = sleeper();
    let sim = Sim::new(&format!(
        r#"
[[gpu]]
reserved_mib = 500
leaked_mib = 100
[[gpu]]
[[process]]
pid = {a}
gpu = [0, 1]
used_mib = 1000
sm_pct = 40
mem_pct = 10
[[process]]
pid = {b}
gpu = 0
sm_pct = 7
type = "graphics"
"#,
        a = a.id(),
        b = b.id()
    ));
    let nvml = sim.nvml();
    let d0 = nvml.device_by_index(0).unwrap();
    let m = d0.memory_info().unwrap();
    assert_eq!(m.total, 143_771 * MIB);
    assert_eq!(m.reserved, 500 * MIB);
    assert_eq!(m.used, 1100 * MIB);
    assert_eq!(m.free, m.total - m.reserved - m.used);
    let compute = d0.running_compute_processes().unwrap();
    assert_eq!(compute.len(), 1);
    assert_eq!(compute[0].pid, a.id());
    assert_eq!(compute[0].used_gpu_memory, UsedGpuMemory::Used(1000 * MIB));
    assert_eq!(compute[0].gpu_instance_id, None);
    let graphics = d0.running_graphics_processes().unwrap();
    assert_eq!(graphics.len(), 1);
    assert_eq!(graphics[0].pid, b.id());
    assert_eq!(graphics[0].used_gpu_memory, UsedGpuMemory::Unavailable);
    let util = d0.process_utilization_stats(None).unwrap();
    let mut sm: Vec<(u32, u32)> = util.iter().map(|s| (s.pid, s.sm_util)).collect();
    sm.sort();
    let mut want = vec![(a.id(), 40), (b.id(), 7)];
    want.sort();
    assert_eq!(sm, want);
    assert_eq!(d0.utilization_rates().unwrap().gpu, 47);
    let d1 = nvml.device_by_index(1).unwrap();
    assert_eq!(d1.running_compute_processes().unwrap().len(), 1);
    assert_eq!(d1.memory_info().unwrap().used, 1000 * MIB);
    assert_eq!(d1.running_graphics_processes().unwrap().len(), 0);
    drop(nvml);
    kill_and_reap(&mut a);
    kill_and_reap(&mut b);
}

#[test]
fn dead_and_zombie_processes_are_not_reported() {
    let mut victim = sleeper();
    let mut zombie = std::process::Command::new("true").spawn().unwrap();
    let zpid = zombie.id();
    assert!(
        poll(Duration::from_secs(5), || (proc_state(zpid) == Some('Z'))
            .then_some(()))
        .is_some(),
        "the child never became a zombie"
    );
    let sim = Sim::new(&format!(
        r#"
[[gpu]]
[[process]]
pid = {v}
gpu = 0
used_mib = 2000
[[process]]
pid = {zpid}
gpu = 0
used_mib = 3000
"#,
        v = victim.id()
    ));
    let nvml = sim.nvml();
    let d = nvml.device_by_index(0).unwrap();
    let pids: Vec<u32> = d
        .running_compute_processes()
        .unwrap()
        .iter()
        .map(|p| p.pid)
        .collect();
    assert_eq!(pids, vec![victim.id()], "a zombie must not be reported");
    assert_eq!(d.memory_info().unwrap().used, 2000 * MIB);
    kill_and_reap(&mut victim);
    let gone = poll(Duration::from_secs(5), || {
        let procs = d.running_compute_processes().unwrap();
        let used = d.memory_info().unwrap().used;
        (procs.is_empty() && used == 0).then_some(())
    });
    assert!(gone.is_some(), "a killed process is still reported");
    let _ = zombie.wait();
}

#[test]
fn zombie_leader_with_live_threads_is_reported() {
    let mut leader = std::process::Command::new(bin_path())
        .env("NVML_SIM_STANDIN", "1")
        .env("NVML_SIM_STANDIN_ZOMBIE_LEADER", "1")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = leader.id();
    assert!(
        poll(Duration::from_secs(5), || (proc_state(pid) == Some('Z'))
            .then_some(()))
        .is_some(),
        "the leader never became a zombie"
    );
    let sim = Sim::new(&format!(
        "[[gpu]]\n[[process]]\npid = {pid}\ngpu = 0\nused_mib = 10\n"
    ));
    let nvml = sim.nvml();
    let d = nvml.device_by_index(0).unwrap();
    assert_eq!(d.running_compute_processes().unwrap().len(), 1);
    drop(nvml);
    kill_and_reap(&mut leader);
}

#[test]
fn teardown_holds_memory_then_frees_it() {
    let mut child = sleeper();
    let pid = child.id();
    let sim = Sim::new(&format!(
        "[[gpu]]\n[[process]]\npid = {pid}\ngpu = 0\nused_mib = 4096\nteardown_ms = 400\n"
    ));
    let nvml = sim.nvml();
    let d = nvml.device_by_index(0).unwrap();
    assert_eq!(d.memory_info().unwrap().used, 4096 * MIB);
    kill_and_reap(&mut child);
    // The first query that sees it dead starts the teardown clock.
    let seen_dead = poll(Duration::from_secs(5), || {
        d.running_compute_processes()
            .unwrap()
            .is_empty()
            .then(Instant::now)
    })
    .expect("the dead process is still reported");
    let used_now = d.memory_info().unwrap().used;
    if seen_dead.elapsed() < Duration::from_millis(300) {
        assert_eq!(used_now, 4096 * MIB, "memory freed before teardown_ms");
    }
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&sim.state).unwrap()).unwrap();
    assert!(state["teardown"][pid.to_string()]["first_dead_unix_ms"].is_u64());
    let freed = poll(Duration::from_secs(5), || {
        (d.memory_info().unwrap().used == 0).then(Instant::now)
    })
    .expect("memory never freed");
    assert!(freed.duration_since(seen_dead) >= Duration::from_millis(350));
}

#[test]
fn scenario_is_reread_when_replaced() {
    let mut a = sleeper();
    let mut b = sleeper();
    let one = format!(
        "[[gpu]]\n[[process]]\npid = {}\ngpu = 0\nused_mib = 1\n",
        a.id()
    );
    let sim = Sim::new(&one);
    let nvml = sim.nvml();
    let d = nvml.device_by_index(0).unwrap();
    assert_eq!(d.running_compute_processes().unwrap().len(), 1);
    sim.replace(&format!(
        "{one}[[process]]\npid = {}\ngpu = 0\nused_mib = 2\n",
        b.id()
    ));
    assert_eq!(d.running_compute_processes().unwrap().len(), 2);
    assert_eq!(d.memory_info().unwrap().used, 3 * MIB);
    // A broken file keeps the last good scenario.
    sim.replace("[[gpu]]\nbogus = 1\n");
    let (listed, said) = stderr_of(|| d.running_compute_processes().unwrap().len());
    assert_eq!(listed, 2);
    assert!(said.contains("(keeping the last good scenario)"), "{said}");
    sim.replace("[[gpu]]\n[[gpu]]\n");
    assert_eq!(nvml.device_count().unwrap(), 2);
    assert_eq!(d.running_compute_processes().unwrap().len(), 0);
    drop(nvml);
    kill_and_reap(&mut a);
    kill_and_reap(&mut b);
}

#[test]
fn injected_faults_come_at_the_rate_asked_and_a_hang_blocks_only_its_gpu() {
    let sim = Sim::new(
        "fault_rate = 0.25\nfault_seed = 7\nfault_errors = [\"TIMEOUT\", \"GPU_IS_LOST\"]\n[[gpu]]\n",
    );
    let nvml = sim.nvml();
    let d0 = nvml.device_by_index(0).unwrap();
    let answers: Vec<Result<u64, NvmlError>> = (0..400)
        .map(|_| d0.memory_info().map(|m| m.total))
        .collect();
    let failed = answers.iter().filter(|a| a.is_err()).count();
    assert!(
        (60..=140).contains(&failed),
        "{failed} of 400 failed at rate 0.25"
    );
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(_) | Err(NvmlError::Timeout) | Err(NvmlError::GpuLost)))
    );
    assert!(answers.iter().any(|a| matches!(a, Err(NvmlError::Timeout))));
    assert!(answers.iter().any(|a| matches!(a, Err(NvmlError::GpuLost))));

    sim.replace("[[gpu]]\n[[gpu]]\nhang_ms = 400\n");
    std::thread::sleep(Duration::from_millis(20));
    let d0 = nvml.device_by_index(0).unwrap();
    let d1 = nvml.device_by_index(1).unwrap();
    let started = Instant::now();
    std::thread::scope(|scope| {
        let blocked = scope.spawn(|| d1.memory_info().map(|m| m.total));
        std::thread::sleep(Duration::from_millis(50));
        // GPU 0 answers while GPU 1's call is blocked.
        let quick = Instant::now();
        assert!(d0.memory_info().is_ok());
        assert!(quick.elapsed() < Duration::from_millis(200));
        assert!(blocked.join().unwrap().is_ok());
    });
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[test]
fn lost_gpu() {
    let sim = Sim::new("[[gpu]]\n[[gpu]]\nlost = true\n");
    let nvml = sim.nvml();
    assert_eq!(nvml.device_count().unwrap(), 2);
    assert!(matches!(nvml.device_by_index(1), Err(NvmlError::GpuLost)));
    let d0 = nvml.device_by_index(0).unwrap();
    let uuid = d0.uuid().unwrap();
    sim.replace("[[gpu]]\nlost = true\n[[gpu]]\nlost = true\n");
    assert!(matches!(d0.memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(d0.name(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        nvml.device_by_uuid(uuid.as_str()),
        Err(NvmlError::GpuLost)
    ));
}

#[test]
fn init_errors() {
    let sim = Sim::new("init_error = \"DRIVER_NOT_LOADED\"\n[[gpu]]\n");
    let r = nvml_wrapper::Nvml::builder()
        .lib_path(lib_path().as_os_str())
        .init();
    assert!(matches!(r, Err(NvmlError::DriverNotLoaded)), "{r:?}");
    sim.replace("[[gpu]]\nfoo = 1\n");
    let init = || {
        nvml_wrapper::Nvml::builder()
            .lib_path(lib_path().as_os_str())
            .init()
    };
    let (r, said) = stderr_of(init);
    assert!(matches!(r, Err(NvmlError::Unknown)), "{r:?}");
    assert!(
        said.contains("scenario.toml: line 2: unknown field 'foo'"),
        "{said}"
    );
    assert_eq!(said.lines().count(), 1, "{said}");
    std::fs::remove_file(&sim.scenario).unwrap();
    let (r, said) = stderr_of(init);
    assert!(matches!(r, Err(NvmlError::Unknown)), "{r:?}");
    assert!(
        said.contains("cannot read the scenario: No such file"),
        "{said}"
    );
}

#[test]
fn unsupported_and_no_permission() {
    let sim = Sim::new(
        "[[gpu]]\nunsupported = [\"temperature\", \"persistence_mode\"]\nno_permission = [\"compute_mode\"]\n[[gpu]]\nfan_pct = 30\n",
    );
    let nvml = sim.nvml();
    let mut d = nvml.device_by_index(0).unwrap();
    assert!(matches!(
        d.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        d.is_in_persistent_mode(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        d.set_persistent(true),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(d.fan_speed(0), Err(NvmlError::NotSupported)));
    // The video engines are idle on every simulated GPU (a default nvidia-smi -q reads).
    assert_eq!(d.encoder_utilization().unwrap().utilization, 0);
    assert!(matches!(
        d.set_compute_mode(ComputeMode::ExclusiveProcess),
        Err(NvmlError::NoPermission)
    ));
    assert!(d.power_usage().unwrap() > 0);
    let d1 = nvml.device_by_index(1).unwrap();
    assert_eq!(d1.fan_speed(0).unwrap(), 30);
    assert!(d1.temperature(TemperatureSensor::Gpu).unwrap() > 0);
}

const SETTINGS_CHILD: &str = "NVML_SIM_TEST_SETTINGS_CHILD";

#[test]
fn settings_persist_across_processes() {
    let mut a = sleeper();
    let sim = Sim::new(&format!(
        "[[gpu]]\n[[gpu]]\n[[process]]\npid = {}\ngpu = 1\n",
        a.id()
    ));
    {
        let nvml = sim.nvml();
        let mut d = nvml.device_by_index(1).unwrap();
        assert!(!d.is_in_persistent_mode().unwrap());
        d.set_persistent(true).unwrap();
        d.set_compute_mode(ComputeMode::ExclusiveProcess).unwrap();
        d.set_applications_clocks(2619, 1755).unwrap();
        assert!(matches!(
            d.set_applications_clocks(9999, 1755),
            Err(NvmlError::InvalidArg)
        ));
        d.set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
            min_clock_mhz: 1200,
            max_clock_mhz: 1500,
        })
        .unwrap();
        d.set_mem_locked_clocks(2000, 2619).unwrap();
        d.set_accounting(true).unwrap();
        assert_eq!(d.accounting_pids().unwrap(), vec![a.id()]);
        assert_eq!(d.applications_clock(Clock::Graphics).unwrap(), 1755);
    }
    let uuid = {
        let nvml = sim.nvml();
        nvml.device_by_index(1).unwrap().uuid().unwrap()
    };
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&sim.state).unwrap()).unwrap();
    let g = &state["gpus"][&uuid];
    assert_eq!(state["version"], 1);
    assert_eq!(g["persistence_mode"], true);
    assert_eq!(g["compute_mode"], "exclusive_process");
    assert_eq!(g["applications_clocks"]["mem_mhz"], 2619);
    assert_eq!(g["applications_clocks"]["graphics_mhz"], 1755);
    assert_eq!(g["locked_clocks"]["min_mhz"], 1200);
    assert_eq!(g["memory_locked_clocks"]["max_mhz"], 2619);
    assert_eq!(g["accounting_mode"], true);
    assert_eq!(g["accounting_pids"][0], a.id());

    // A second process reads the settings back and resets them.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "settings_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SETTINGS_CHILD, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("SETTINGS-OK"));
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&sim.state).unwrap()).unwrap();
    let g = &state["gpus"][&uuid];
    assert!(g.get("applications_clocks").is_none(), "{g}");
    assert!(g.get("locked_clocks").is_none(), "{g}");
    assert!(g.get("accounting_pids").is_none(), "{g}");
    kill_and_reap(&mut a);
}

/// Runs only as the second process of `settings_persist_across_processes`.
#[test]
fn settings_child() {
    if std::env::var_os(SETTINGS_CHILD).is_none() {
        return;
    }
    let nvml = open_nvml();
    let mut d = nvml.device_by_index(1).unwrap();
    assert!(d.is_in_persistent_mode().unwrap());
    assert_eq!(d.compute_mode().unwrap(), ComputeMode::ExclusiveProcess);
    assert_eq!(d.applications_clock(Clock::Memory).unwrap(), 2619);
    assert_eq!(d.clock_info(Clock::Memory).unwrap(), 2619);
    assert!(d.is_accounting_enabled().unwrap());
    assert!(
        !nvml
            .device_by_index(0)
            .unwrap()
            .is_in_persistent_mode()
            .unwrap()
    );
    d.reset_applications_clocks().unwrap();
    d.reset_gpu_locked_clocks().unwrap();
    d.clear_accounting_pids().unwrap();
    assert_eq!(d.applications_clock(Clock::Graphics).unwrap(), 1980);
    println!("SETTINGS-OK");
}

const DEVDIR_CHILD: &str = "NVML_SIM_TEST_DEVDIR_CHILD";

/// `device_dir`: init makes the device files (named by `minor`, which the minor-number
/// query returns), a reload makes the files of new GPUs and leaves the others as they are.
#[test]
fn device_dir_is_made_on_load_and_reload() {
    let sim = Sim::new("device_dir = \"dev\"\n[[gpu]]\nminor = 4\n[[gpu]]\n");
    let dir = sim.dir.path().join("dev");
    assert!(!dir.exists());
    let nvml = sim.nvml();
    assert_eq!(nvml.device_by_index(0).unwrap().minor_number().unwrap(), 4);
    assert_eq!(nvml.device_by_index(1).unwrap().minor_number().unwrap(), 1);
    assert_device_files(
        &dir,
        &[
            ("nvidia1", (1, 3)),
            ("nvidia4", (1, 5)),
            ("nvidiactl", (1, 7)),
            ("nvidia-uvm", (1, 8)),
        ],
    );
    // Another process's leftovers, and a file someone replaced: kept.
    std::fs::remove_file(dir.join("nvidiactl")).unwrap();
    sim.replace("device_dir = \"dev\"\n[[gpu]]\nminor = 4\n[[gpu]]\n[[gpu]]\nminor = 0\n");
    assert_eq!(nvml.device_count().unwrap(), 3);
    assert_eq!(nvml.device_by_index(2).unwrap().minor_number().unwrap(), 0);
    assert_device_files(
        &dir,
        &[
            ("nvidia0", (1, 3)),
            ("nvidia1", (1, 3)),
            ("nvidia4", (1, 5)),
            ("nvidiactl", (1, 8)),
            ("nvidia-uvm", (1, 8)),
        ],
    );
    drop(nvml);

    // A directory that cannot be made: one line on stderr, and NVML works.
    std::fs::write(sim.dir.path().join("blocker"), "").unwrap();
    sim.replace("device_dir = \"blocker/dev\"\n[[gpu]]\n");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "devdir_child", "--nocapture", "--test-threads=1"])
        .env(DEVDIR_CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("DEVDIR-CHILD 1 GPU"), "{stdout}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("nvml-sim: "))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains(&sim.scenario.display().to_string())
            && lines[0].contains("device_dir ")
            && lines[0].contains("cannot create it"),
        "{stderr}"
    );
}

/// Runs only as the second process of `device_dir_is_made_on_load_and_reload`.
#[test]
fn devdir_child() {
    if std::env::var_os(DEVDIR_CHILD).is_none() {
        return;
    }
    let nvml = open_nvml();
    println!("DEVDIR-CHILD {} GPU", nvml.device_count().unwrap());
}

// Raw ABI conventions, through dlsym.

type Dev = *mut std::ffi::c_void;

/// Every process list NVML has, by name: the public exports (every version), both
/// process-utilization calls and the private table's slots 213-215 (compute, graphics, MPS).
const LISTS: [&str; 14] = [
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "slot 213",
    "slot 214",
    "slot 215",
];

/// The pids each of [`LISTS`] reports on GPU `index` now, and the names the private table
/// gives them, through the raw ABI.
fn every_list(raw: &Raw, index: u32) -> Vec<(&'static str, Vec<u32>, Vec<String>)> {
    use nvml_wrapper_sys::bindings as b;
    type Init = unsafe extern "C" fn() -> u32;
    type ByIndex = unsafe extern "C" fn(c_uint, *mut Dev) -> u32;
    type V1 = unsafe extern "C" fn(Dev, *mut c_uint, *mut b::nvmlProcessInfo_v1_t) -> u32;
    type V2 = unsafe extern "C" fn(Dev, *mut c_uint, *mut b::nvmlProcessInfo_t) -> u32;
    type Util =
        unsafe extern "C" fn(Dev, *mut b::nvmlProcessUtilizationSample_t, *mut c_uint, u64) -> u32;
    type UtilInfo = unsafe extern "C" fn(Dev, *mut b::nvmlProcessesUtilizationInfo_t) -> u32;
    type Table = unsafe extern "C" fn(*mut *const usize, *const u8) -> u32;
    type Slot = unsafe extern "C" fn(usize, usize, usize, usize, usize, usize) -> u32;
    const ID: [u8; 16] = [
        0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7,
        0xc4,
    ];
    const RECORD: usize = 4128;
    const CAP: usize = 16;
    let init: Init = raw.f("nvmlInit_v2");
    let shutdown: Init = raw.f("nvmlShutdown");
    let by_index: ByIndex = raw.f("nvmlDeviceGetHandleByIndex_v2");
    let mut out = Vec::new();
    // SAFETY: each call passes buffers of CAP entries of the named function's type.
    unsafe {
        assert_eq!(init(), 0);
        let mut dev: Dev = std::ptr::null_mut();
        assert_eq!(by_index(index, &mut dev), 0);
        for name in LISTS {
            let mut count = CAP as c_uint;
            let mut names = Vec::new();
            let (rc, pids): (u32, Vec<u32>) = if name.ends_with("Processes") {
                let mut buf: [b::nvmlProcessInfo_v1_t; CAP] = std::mem::zeroed();
                let rc = raw.f::<V1>(name)(dev, &mut count, buf.as_mut_ptr());
                (rc, buf.iter().map(|p| p.pid).collect())
            } else if name.contains("RunningProcesses_v") {
                let mut buf: [b::nvmlProcessInfo_t; CAP] = std::mem::zeroed();
                let rc = raw.f::<V2>(name)(dev, &mut count, buf.as_mut_ptr());
                (rc, buf.iter().map(|p| p.pid).collect())
            } else if name == "nvmlDeviceGetProcessUtilization" {
                let mut buf: [b::nvmlProcessUtilizationSample_t; CAP] = std::mem::zeroed();
                let rc = raw.f::<Util>(name)(dev, buf.as_mut_ptr(), &mut count, 0);
                (rc, buf.iter().map(|p| p.pid).collect())
            } else if name == "nvmlDeviceGetProcessesUtilizationInfo" {
                let mut buf: [b::nvmlProcessUtilizationInfo_v1_t; CAP] = std::mem::zeroed();
                let mut info: b::nvmlProcessesUtilizationInfo_t = std::mem::zeroed();
                info.version = 0x0100_0018;
                info.processSamplesCount = count;
                info.procUtilArray = buf.as_mut_ptr();
                let rc = raw.f::<UtilInfo>(name)(dev, &mut info);
                count = info.processSamplesCount;
                (rc, buf.iter().map(|p| p.pid).collect())
            } else {
                let n: usize = name["slot ".len()..].parse().unwrap();
                let mut table: *const usize = std::ptr::null();
                assert_eq!(
                    raw.f::<Table>("nvmlInternalGetExportTable")(&mut table, ID.as_ptr()),
                    0
                );
                let slot: Slot = std::mem::transmute(*table.add(n));
                let mut records = vec![0u8; RECORD * CAP];
                let rc = slot(
                    dev as usize,
                    &mut count as *mut c_uint as usize,
                    records.as_mut_ptr() as usize,
                    0,
                    0,
                    0,
                );
                let records: Vec<&[u8]> = records.chunks(RECORD).collect();
                for r in records.iter().take(count as usize) {
                    let name = CStr::from_bytes_until_nul(&r[32..]).unwrap();
                    names.push(name.to_string_lossy().into_owned());
                }
                let pids = records
                    .iter()
                    .map(|r| u32::from_ne_bytes(r[0..4].try_into().unwrap()))
                    .collect();
                (rc, pids)
            };
            // An empty process-utilization answer is NOT_FOUND (6), every other is SUCCESS.
            let empty_ok = rc == 6 && name.contains("Utilization");
            assert!(rc == 0 || empty_ok, "{name}: {rc}");
            let n = if empty_ok { 0 } else { count as usize };
            out.push((name, pids[..n].to_vec(), names));
        }
        assert_eq!(shutdown(), 0);
    }
    out
}

/// What [`every_list`] should say when these (pid, kind) are listed: compute lists name
/// the compute processes, graphics lists the graphics ones (the private table's slot 215;
/// 214 is its MPS list), MPS lists nothing and the
/// utilization calls every one.
fn expect_lists(procs: &[(u32, &str)]) -> Vec<(&'static str, Vec<u32>)> {
    LISTS
        .iter()
        .map(|name| {
            let pids = procs
                .iter()
                .filter(|(_, kind)| {
                    if name.contains("MPS") || *name == "slot 214" {
                        false
                    } else if name.contains("Compute") || *name == "slot 213" {
                        kind.contains("compute")
                    } else if name.contains("Graphics") || *name == "slot 215" {
                        kind.contains("graphics")
                    } else {
                        true
                    }
                })
                .map(|(pid, _)| *pid)
                .collect();
            (*name, pids)
        })
        .collect()
}

fn pids_only(lists: Vec<(&'static str, Vec<u32>, Vec<String>)>) -> Vec<(&'static str, Vec<u32>)> {
    lists.into_iter().map(|(n, p, _)| (n, p)).collect()
}

/// `unlisted = true`: the memory is used while the process lives (and through its
/// teardown), but no list, public or private, names it.
#[test]
fn unlisted_process_holds_memory_in_no_list() {
    let mut job = sleeper();
    let mut hidden = sleeper();
    let mut tearing = sleeper();
    let sim = Sim::new(&format!(
        r#"
[[gpu]]
[[gpu]]
[[process]]
pid = {job}
gpu = 0
used_mib = 1000
sm_pct = 10
[[process]]
pid = {hidden}
gpu = 0
used_mib = 30720
sm_pct = 30
type = "compute+graphics"
unlisted = true
[[process]]
pid = {tearing}
gpu = 1
used_mib = 500
teardown_ms = 300
unlisted = true
"#,
        job = job.id(),
        hidden = hidden.id(),
        tearing = tearing.id()
    ));
    let nvml = sim.nvml();
    let raw = Raw::open();
    let d0 = nvml.device_by_index(0).unwrap();
    let d1 = nvml.device_by_index(1).unwrap();
    assert_eq!(d0.memory_info().unwrap().used, 31_720 * MIB);
    assert_eq!(d1.memory_info().unwrap().used, 500 * MIB);
    // The GPU is busy with it all the same.
    assert_eq!(d0.utilization_rates().unwrap().gpu, 40);
    assert_eq!(
        pids_only(every_list(&raw, 0)),
        expect_lists(&[(job.id(), "compute")])
    );
    assert_eq!(pids_only(every_list(&raw, 1)), expect_lists(&[]));
    let recorded = {
        let mut d0 = nvml.device_by_index(0).unwrap();
        d0.set_accounting(true).unwrap();
        d0.accounting_pids().unwrap()
    };
    assert_eq!(recorded, vec![job.id()]);

    // Dead: its memory is free at once, or after its teardown.
    kill_and_reap(&mut hidden);
    let freed = poll(Duration::from_secs(5), || {
        (d0.memory_info().unwrap().used == 1000 * MIB).then_some(())
    });
    assert!(
        freed.is_some(),
        "a dead unlisted process still holds memory"
    );
    assert_eq!(d0.utilization_rates().unwrap().gpu, 10);
    kill_and_reap(&mut tearing);
    let started = Instant::now();
    let freed = poll(Duration::from_secs(5), || {
        (d1.memory_info().unwrap().used == 0).then(Instant::now)
    })
    .expect("the teardown never ended");
    assert!(freed.duration_since(started) >= Duration::from_millis(250));
    assert_eq!(pids_only(every_list(&raw, 1)), expect_lists(&[]));
    drop(nvml);
    kill_and_reap(&mut job);
}

/// `listed_pid`: every list reports that pid (the private table still names the real
/// process); liveness is the real pid's.
#[test]
fn listed_pid_is_what_lists_report_and_the_real_pid_decides_liveness() {
    let mut job = sleeper();
    // Pid 1 is always alive: if liveness followed listed_pid, the entry would never go.
    let sim = Sim::new(&format!(
        "[[gpu]]\n[[process]]\npid = {}\ngpu = 0\nused_mib = 700\nlisted_pid = 1\ntype = \"compute+graphics\"\n",
        job.id()
    ));
    let nvml = sim.nvml();
    let raw = Raw::open();
    let d = nvml.device_by_index(0).unwrap();
    assert_eq!(d.memory_info().unwrap().used, 700 * MIB);
    let lists = every_list(&raw, 0);
    for (name, _, names) in &lists {
        if *name == "slot 213" || *name == "slot 215" {
            assert_eq!(names, &["sleep".to_string()], "{name}");
        }
    }
    assert_eq!(pids_only(lists), expect_lists(&[(1, "compute+graphics")]));
    let pids: Vec<u32> = d
        .running_compute_processes()
        .unwrap()
        .iter()
        .map(|p| p.pid)
        .collect();
    assert_eq!(pids, vec![1]);
    kill_and_reap(&mut job);
    let gone = poll(Duration::from_secs(5), || {
        let used = d.memory_info().unwrap().used;
        (used == 0 && d.running_compute_processes().unwrap().is_empty()).then_some(())
    });
    assert!(
        gone.is_some(),
        "listed under pid 1, it outlived its real pid"
    );
    assert_eq!(pids_only(every_list(&raw, 0)), expect_lists(&[]));
}

#[test]
fn size_query_conventions() {
    let mut a = sleeper();
    let mut b = sleeper();
    let sim = Sim::new(&format!(
        "[[gpu]]\n[[gpu]]\n[[process]]\npid = {}\ngpu = 0\nused_mib = 5\n[[process]]\npid = {}\ngpu = 0\n",
        a.id(),
        b.id()
    ));
    let raw = Raw::open();
    type Init = unsafe extern "C" fn() -> u32;
    type ByIndex = unsafe extern "C" fn(c_uint, *mut Dev) -> u32;
    type Procs3 = unsafe extern "C" fn(
        Dev,
        *mut c_uint,
        *mut nvml_wrapper_sys::bindings::nvmlProcessInfo_t,
    ) -> u32;
    type Procs1 = unsafe extern "C" fn(
        Dev,
        *mut c_uint,
        *mut nvml_wrapper_sys::bindings::nvmlProcessInfo_v1_t,
    ) -> u32;
    type PUtil = unsafe extern "C" fn(
        Dev,
        *mut nvml_wrapper_sys::bindings::nvmlProcessUtilizationSample_t,
        *mut c_uint,
        u64,
    ) -> u32;
    type Name = unsafe extern "C" fn(Dev, *mut c_char, c_uint) -> u32;
    type Mem1 = unsafe extern "C" fn(Dev, *mut nvml_wrapper_sys::bindings::nvmlMemory_t) -> u32;
    type ErrStr = unsafe extern "C" fn(u32) -> *const c_char;
    type Stub = unsafe extern "C" fn() -> u32;
    let init: Init = raw.f("nvmlInit_v2");
    let shutdown: Init = raw.f("nvmlShutdown");
    let by_index: ByIndex = raw.f("nvmlDeviceGetHandleByIndex_v2");
    let procs3: Procs3 = raw.f("nvmlDeviceGetComputeRunningProcesses_v3");
    let procs1: Procs1 = raw.f("nvmlDeviceGetComputeRunningProcesses");
    let putil: PUtil = raw.f("nvmlDeviceGetProcessUtilization");
    let name: Name = raw.f("nvmlDeviceGetName");
    let mem1: Mem1 = raw.f("nvmlDeviceGetMemoryInfo");
    let err_str: ErrStr = raw.f("nvmlErrorString");
    let stub: Stub = raw.f("nvmlDeviceGetVgpuUtilization");
    // SAFETY: calls with the C signatures of nvml.h and valid buffers.
    unsafe {
        let mut dev: Dev = std::ptr::null_mut();
        assert_eq!(by_index(0, &mut dev), 1, "before init: UNINITIALIZED");
        assert_eq!(stub(), 1);
        assert_eq!(init(), 0);
        assert_eq!(init(), 0, "init is reference counted");
        assert_eq!(shutdown(), 0);
        assert_eq!(by_index(0, &mut dev), 0);
        let mut count: c_uint = 0;
        assert_eq!(procs3(dev, &mut count, std::ptr::null_mut()), 7);
        assert_eq!(count, 2);
        let mut buf = vec![std::mem::zeroed(); 1];
        count = 1;
        assert_eq!(procs3(dev, &mut count, buf.as_mut_ptr()), 7);
        assert_eq!(count, 2);
        let mut buf: Vec<nvml_wrapper_sys::bindings::nvmlProcessInfo_t> =
            vec![std::mem::zeroed(); 5];
        count = 5;
        assert_eq!(procs3(dev, &mut count, buf.as_mut_ptr()), 0);
        assert_eq!(count, 2);
        assert_eq!(buf[0].usedGpuMemory, 5 * MIB);
        assert_eq!(buf[1].usedGpuMemory, u64::MAX, "NVML_VALUE_NOT_AVAILABLE");
        assert_eq!(buf[0].gpuInstanceId, 0xFFFF_FFFF);
        let mut v1: Vec<nvml_wrapper_sys::bindings::nvmlProcessInfo_v1_t> =
            vec![std::mem::zeroed(); 2];
        count = 2;
        assert_eq!(procs1(dev, &mut count, v1.as_mut_ptr()), 0);
        assert_eq!(v1[0].pid, a.id());
        count = 0;
        assert_eq!(putil(dev, std::ptr::null_mut(), &mut count, 0), 7);
        assert_eq!(count, 2);
        let mut m: nvml_wrapper_sys::bindings::nvmlMemory_t = std::mem::zeroed();
        assert_eq!(mem1(dev, &mut m), 0);
        assert_eq!(m.used, 5 * MIB);
        assert_eq!(m.total - m.free, m.used);
        let mut short = [0 as c_char; 4];
        assert_eq!(name(dev, short.as_mut_ptr(), 4), 7);
        let mut bad: Dev = std::ptr::null_mut();
        assert_eq!(
            name(bad, short.as_mut_ptr(), 4),
            2,
            "bad handle: INVALID_ARGUMENT"
        );
        assert_eq!(by_index(1, &mut bad), 0);
        count = 0;
        assert_eq!(
            procs3(bad, &mut count, std::ptr::null_mut()),
            0,
            "no processes: SUCCESS"
        );
        assert_eq!(count, 0);
        assert_eq!(
            putil(bad, std::ptr::null_mut(), &mut count, 0),
            6,
            "NOT_FOUND"
        );
        assert_eq!(stub(), 3, "unmodelled: NOT_SUPPORTED");
        assert_eq!(
            CStr::from_ptr(err_str(9)).to_str().unwrap(),
            "Driver Not Loaded"
        );
        assert_eq!(CStr::from_ptr(err_str(15)).to_str().unwrap(), "GPU is lost");
        assert_eq!(
            CStr::from_ptr(err_str(4)).to_str().unwrap(),
            "Insufficient Permissions"
        );
        assert_eq!(shutdown(), 0);
        assert_eq!(shutdown(), 1, "shut down twice: UNINITIALIZED");
    }
    drop(sim);
    kill_and_reap(&mut a);
    kill_and_reap(&mut b);
}

#[test]
fn every_nvml_wrapper_sys_function_is_exported() {
    let src = include_str!("../src/stubs.rs");
    let raw = Raw::open();
    let mut n = 0;
    for name in src
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("nvml"))
        .map(|l| l.split_whitespace().next().unwrap())
    {
        // SAFETY: only looking the symbol up; it is never called through this type.
        let found = unsafe { raw.lib.get::<*const ()>(name.as_bytes()) }.is_ok();
        assert!(found, "{name}");
        n += 1;
    }
    // Shrinks as functions get modelled (MIG took 21).
    assert!(n > 250, "{n}");
}

/// nvidia-smi's private table: handed out for its id only; the process-list slots follow
/// the size-query convention with inline names; other slots are NOT_SUPPORTED.
#[test]
fn private_export_table_serves_nvidia_smi() {
    let mut job = sleeper();
    let sim = Sim::new(&format!(
        "[[gpu]]\n[[gpu]]\npci_bus_id = \"0001:2A:00.0\"\n[[process]]\npid = {}\ngpu = 0\nused_mib = 7\n",
        job.id()
    ));
    let raw = Raw::open();
    type Init = unsafe extern "C" fn() -> u32;
    type Table = unsafe extern "C" fn(*mut *const usize, *const u8) -> u32;
    type Slot = unsafe extern "C" fn(usize, usize, usize, usize, usize, usize) -> u32;
    let init: Init = raw.f("nvmlInit_v2");
    let shutdown: Init = raw.f("nvmlShutdown");
    let get_table: Table = raw.f("nvmlInternalGetExportTable");
    const ID: [u8; 16] = [
        0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7,
        0xc4,
    ];
    const RECORD: usize = 4128;
    // SAFETY: the calls follow the slot contracts documented in src/exports/internal.rs.
    unsafe {
        assert_eq!(init(), 0);
        let mut table: *const usize = std::ptr::null();
        assert_eq!(get_table(&mut table, [0u8; 16].as_ptr()), 2, "unknown id");
        assert_eq!(get_table(std::ptr::null_mut(), ID.as_ptr()), 2, "null out");
        assert_eq!(get_table(&mut table, ID.as_ptr()), 0);
        let size = *table;
        assert!(
            size >= 256 * 8,
            "first word: the table's size in bytes ({size})"
        );
        let slot = |n: usize| -> Slot { std::mem::transmute(*table.add(n)) };

        let mut dev: Dev = std::ptr::null_mut();
        assert_eq!(slot(81)(0, &mut dev as *mut Dev as usize, 0x22, 0, 0, 0), 0);
        assert!(!dev.is_null());
        assert_eq!(slot(81)(9, &mut dev as *mut Dev as usize, 0x22, 0, 0, 0), 2);

        // Process list: count query, short buffer, then the record itself.
        let mut count: c_uint = 0;
        assert_eq!(
            slot(213)(dev as usize, &mut count as *mut _ as usize, 0, 0, 0, 0),
            7
        );
        assert_eq!(count, 1, "INSUFFICIENT_SIZE with the needed count");
        let mut records = vec![0u8; RECORD * 2];
        count = 2;
        let buf = records.as_mut_ptr() as usize;
        assert_eq!(
            slot(213)(dev as usize, &mut count as *mut _ as usize, buf, 0, 0, 0),
            0
        );
        assert_eq!(count, 1);
        let pid = u32::from_ne_bytes(records[0..4].try_into().unwrap());
        let used = u64::from_ne_bytes(records[8..16].try_into().unwrap());
        let gi = u32::from_ne_bytes(records[16..20].try_into().unwrap());
        let name = CStr::from_bytes_until_nul(&records[32..RECORD]).unwrap();
        assert_eq!(pid, job.id());
        assert_eq!(used, 7 * MIB);
        assert_eq!(gi, u32::MAX, "no GPU instance");
        assert!(!name.to_bytes().is_empty(), "the name is inline");
        count = 2;
        assert_eq!(
            slot(214)(dev as usize, &mut count as *mut _ as usize, buf, 0, 0, 0),
            0
        );
        assert_eq!(count, 0, "no graphics processes");
        assert_eq!(
            slot(213)(0x10, &mut count as *mut _ as usize, buf, 0, 0, 0),
            2,
            "bad handle"
        );

        // -i BUS_ID: slot 12 parses, slot 75 gives each GPU's location.
        let mut loc = [0u32; 4];
        let base = loc.as_mut_ptr() as usize;
        let p = |i: usize| base + 4 * i;
        let bus = c"0001:2a:00.0";
        assert_eq!(
            slot(12)(bus.as_ptr() as usize, p(0), p(1), p(2), p(3), 0),
            0
        );
        assert_eq!(loc, [1, 0x2a, 0, 0]);
        assert_eq!(
            slot(12)(c"nonsense".as_ptr() as usize, p(0), p(1), p(2), p(3), 0),
            2
        );
        let mut at = [0u32; 3];
        let base = at.as_mut_ptr() as usize;
        let q = |i: usize| base + 4 * i;
        assert_eq!(slot(75)(1, q(0), q(1), q(2), 0, 0), 0);
        assert_eq!(at, [1, 0x2a, 0]);
        assert_eq!(slot(75)(2, q(0), q(1), q(2), 0, 0), 2, "no GPU 2");

        assert_eq!(slot(100)(0, 0, 0, 0, 0, 0), 3, "an unmodelled slot");
        assert_eq!(shutdown(), 0);
    }
    drop(sim);
    job.kill().ok();
    job.wait().ok();
}

/// Versioned structs answer as the driver does for their version, and
/// ARGUMENT_VERSION_MISMATCH (25) for any other; bad pointers are INVALID_ARGUMENT.
#[test]
fn versioned_structs_and_bad_pointers() {
    let _sim = Sim::new("[[gpu]]\n");
    let raw = Raw::open();
    type Init = unsafe extern "C" fn() -> u32;
    type ByIndex = unsafe extern "C" fn(c_uint, *mut Dev) -> u32;
    type WithPtr = unsafe extern "C" fn(Dev, *mut c_uint) -> u32;
    use nvml_wrapper_sys::bindings as b;
    let init: Init = raw.f("nvmlInit_v2");
    let shutdown: Init = raw.f("nvmlShutdown");
    let by_index: ByIndex = raw.f("nvmlDeviceGetHandleByIndex_v2");
    // SAFETY: each call passes a struct of the named function's type, or null.
    unsafe {
        assert_eq!(init(), 0);
        let mut dev: Dev = std::ptr::null_mut();
        assert_eq!(by_index(0, &mut dev), 0);

        let mem2: unsafe extern "C" fn(Dev, *mut b::nvmlMemory_v2_t) -> u32 =
            raw.f("nvmlDeviceGetMemoryInfo_v2");
        let mut m: b::nvmlMemory_v2_t = std::mem::zeroed();
        m.version = (std::mem::size_of::<b::nvmlMemory_v2_t>() as u32) | (1 << 24);
        assert_eq!(mem2(dev, &mut m), 25, "memory info v2 with version 1");
        m.version = (std::mem::size_of::<b::nvmlMemory_v2_t>() as u32) | (2 << 24);
        assert_eq!(mem2(dev, &mut m), 0);

        let sram: unsafe extern "C" fn(Dev, *mut b::nvmlEccSramErrorStatus_v1_t) -> u32 =
            raw.f("nvmlDeviceGetSramEccErrorStatus");
        let mut e: b::nvmlEccSramErrorStatus_v1_t = std::mem::zeroed();
        e.version = 7;
        assert_eq!(
            sram(dev, &mut e),
            25,
            "SRAM ECC status with a wrong version"
        );
        e.version = (std::mem::size_of::<b::nvmlEccSramErrorStatus_v1_t>() as u32) | (1 << 24);
        assert_eq!(sram(dev, &mut e), 0);
        assert_eq!(sram(dev, std::ptr::null_mut()), 2);

        let putil: unsafe extern "C" fn(Dev, *mut b::nvmlProcessesUtilizationInfo_t) -> u32 =
            raw.f("nvmlDeviceGetProcessesUtilizationInfo");
        let mut u: b::nvmlProcessesUtilizationInfo_t = std::mem::zeroed();
        u.version = 2 << 24;
        assert_eq!(putil(dev, &mut u), 25);

        // Everything nvidia-smi reads through one pointer: null is INVALID_ARGUMENT.
        for name in [
            "nvmlDeviceGetDisplayActive",
            "nvmlDeviceGetDisplayMode",
            "nvmlDeviceGetMaxMigDeviceCount",
            "nvmlDeviceIsMigDeviceHandle",
            "nvmlDeviceGetVirtualizationMode",
            "nvmlDeviceGetMultiGpuBoard",
            "nvmlDeviceGetBoardId",
            "nvmlDeviceGetModuleId",
            "nvmlDeviceGetAccountingBufferSize",
            "nvmlDeviceGetMaxPcieLinkGeneration",
            "nvmlDeviceGetCurrPcieLinkWidth",
            "nvmlDeviceGetPcieReplayCounter",
            "nvmlDeviceGetSupportedEventTypes",
            "nvmlDeviceGetSupportedClocksThrottleReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            "nvmlDeviceGetGpuFabricInfo",
            "nvmlDeviceGetRowRemapperHistogram",
            "nvmlDeviceGetConfComputeProtectedMemoryUsage",
            "nvmlDeviceGetFBCStats",
            "nvmlEventSetCreate",
        ] {
            let f: WithPtr = raw.f(name);
            let code = if name == "nvmlEventSetCreate" {
                let f: unsafe extern "C" fn(*mut c_uint) -> u32 = raw.f(name);
                f(std::ptr::null_mut())
            } else {
                f(dev, std::ptr::null_mut())
            };
            assert_eq!(code, 2, "{name}(null)");
            let mut out: [c_uint; 16] = [0; 16];
            if name != "nvmlEventSetCreate" {
                assert_eq!(
                    f(std::ptr::null_mut(), out.as_mut_ptr()),
                    2,
                    "{name}(bad handle)"
                );
            }
        }

        // Field values: known fields answer, unknown ones fail alone.
        let fields: unsafe extern "C" fn(Dev, i32, *mut b::nvmlFieldValue_t) -> u32 =
            raw.f("nvmlDeviceGetFieldValues");
        let mut values: [b::nvmlFieldValue_t; 2] = std::mem::zeroed();
        values[0].fieldId = 190; // NVML_FI_DEV_POWER_CURRENT_LIMIT
        values[1].fieldId = 9999;
        assert_eq!(fields(dev, 2, values.as_mut_ptr()), 0);
        assert_eq!(values[0].nvmlReturn, 0);
        assert_eq!(values[0].value.uiVal, 700_000);
        assert_eq!(values[1].nvmlReturn, 3, "an unknown field: NOT_SUPPORTED");
        assert_eq!(fields(dev, 1, std::ptr::null_mut()), 2);

        // Event sets: registered, waited on (nothing happens: TIMEOUT), freed once.
        type Create = unsafe extern "C" fn(*mut *mut std::ffi::c_void) -> u32;
        type Register = unsafe extern "C" fn(Dev, u64, *mut std::ffi::c_void) -> u32;
        type Wait =
            unsafe extern "C" fn(*mut std::ffi::c_void, *mut b::nvmlEventData_t, c_uint) -> u32;
        type Free = unsafe extern "C" fn(*mut std::ffi::c_void) -> u32;
        let create: Create = raw.f("nvmlEventSetCreate");
        let register: Register = raw.f("nvmlDeviceRegisterEvents");
        let wait: Wait = raw.f("nvmlEventSetWait_v2");
        let free: Free = raw.f("nvmlEventSetFree");
        let mut set = std::ptr::null_mut();
        assert_eq!(create(&mut set), 0);
        assert_eq!(register(dev, 0x8, set), 0, "XID critical errors");
        assert_eq!(register(dev, 0x4, set), 3, "P-state events: not on Linux");
        let mut data: b::nvmlEventData_t = std::mem::zeroed();
        assert_eq!(wait(set, &mut data, 10), 10, "TIMEOUT");
        assert_eq!(free(set), 0);
        assert_eq!(free(set), 2, "a freed set");
        assert_eq!(wait(set, &mut data, 10), 2, "a freed set");
        assert_eq!(shutdown(), 0);
    }
}
