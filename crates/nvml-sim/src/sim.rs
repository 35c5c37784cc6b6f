//! The library's global state: the loaded scenario, the state file, liveness.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::deaths::Deaths;
use crate::live::LiveCache;
use crate::scenario::{self, Feature, Gpu, MAX_GPUS, ProcKind, Scenario};
use crate::state::{FileSig, GpuState, StateStore, file_sig};
use crate::types::*;

/// Environment variable naming the scenario file.
pub const SCENARIO_ENV: &str = "NVML_SIM_SCENARIO";
/// Environment variable naming the state file (overrides everything else).
pub const STATE_ENV: &str = "NVML_SIM_STATE";

/// The opaque object an `nvmlDevice_t` points to.
#[repr(C)]
pub struct DeviceSlot {
    index: u32,
    _pad: u32,
}

/// Handles are pointers into this array, indexed by GPU index.
pub static DEVICES: [DeviceSlot; MAX_GPUS] = {
    let mut a = [const { DeviceSlot { index: 0, _pad: 0 } }; MAX_GPUS];
    let mut i = 0;
    while i < MAX_GPUS {
        a[i].index = i as u32;
        i += 1;
    }
    a
};

pub fn handle_of(index: usize) -> nvmlDevice_t {
    std::ptr::from_ref(&DEVICES[index]).cast_mut().cast()
}

pub fn index_of(handle: nvmlDevice_t) -> Option<usize> {
    let base = DEVICES.as_ptr() as usize;
    let p = handle as usize;
    let size = std::mem::size_of::<DeviceSlot>();
    if p < base || p >= base + size * MAX_GPUS || !(p - base).is_multiple_of(size) {
        return None;
    }
    Some((p - base) / size)
}

/// Per GPU: GPU instance ids 0..=14.
pub const GI_PER_GPU: usize = crate::mig::MAX_GI_ID as usize + 1;
/// Per GPU: one slot per (GPU instance id, compute instance id) pair.
pub const MIG_PER_GPU: usize = GI_PER_GPU * (crate::mig::MAX_CI_ID as usize + 1);

// MIG device, GPU instance and compute instance handles point into these, one slot per
// id a GPU could have (not per instance that exists), so a handle keeps naming the same
// instance across scenario reloads. Only their addresses matter; nothing is read or
// written through them.
static MIG_DEVICES: [u64; MAX_GPUS * MIG_PER_GPU] = [0; MAX_GPUS * MIG_PER_GPU];
static GPU_INSTANCES: [u64; MAX_GPUS * GI_PER_GPU] = [0; MAX_GPUS * GI_PER_GPU];
static COMPUTE_INSTANCES: [u64; MAX_GPUS * MIG_PER_GPU] = [0; MAX_GPUS * MIG_PER_GPU];

fn slot_ptr<T>(array: &'static [u64], k: usize) -> *mut T {
    std::ptr::from_ref(&array[k]).cast_mut().cast()
}

fn slot_index<T>(array: &'static [u64], p: *mut T) -> Option<usize> {
    let base = array.as_ptr() as usize;
    let p = p as usize;
    let size = std::mem::size_of::<u64>();
    if p < base || p >= base + std::mem::size_of_val(array) || !(p - base).is_multiple_of(size) {
        return None;
    }
    Some((p - base) / size)
}

/// The handle of the MIG device (GPU `gpu`, GPU instance `gi`, compute instance `ci`).
pub fn mig_handle(gpu: usize, gi: u32, ci: u32) -> nvmlDevice_t {
    slot_ptr(&MIG_DEVICES, instance_slot(gpu, gi, ci))
}

/// (GPU index, GPU instance id, compute instance id) of a MIG device handle.
pub fn mig_of(handle: nvmlDevice_t) -> Option<(usize, u32, u32)> {
    slot_index(&MIG_DEVICES, handle).map(instance_of_slot)
}

/// The slot of (GPU, GPU instance, compute instance) in the tables of MIG devices and of
/// compute instances, which share a layout.
fn instance_slot(gpu: usize, gi: u32, ci: u32) -> usize {
    gpu * MIG_PER_GPU + gi as usize * 8 + ci as usize
}

fn instance_of_slot(k: usize) -> (usize, u32, u32) {
    let r = k % MIG_PER_GPU;
    (k / MIG_PER_GPU, (r / 8) as u32, (r % 8) as u32)
}

pub fn gi_handle(gpu: usize, gi: u32) -> nvmlGpuInstance_t {
    slot_ptr(&GPU_INSTANCES, gpu * GI_PER_GPU + gi as usize)
}

pub fn gi_of(handle: nvmlGpuInstance_t) -> Option<(usize, u32)> {
    let k = slot_index(&GPU_INSTANCES, handle)?;
    Some((k / GI_PER_GPU, (k % GI_PER_GPU) as u32))
}

pub fn ci_handle(gpu: usize, gi: u32, ci: u32) -> nvmlComputeInstance_t {
    slot_ptr(&COMPUTE_INSTANCES, instance_slot(gpu, gi, ci))
}

pub fn ci_of(handle: nvmlComputeInstance_t) -> Option<(usize, u32, u32)> {
    slot_index(&COMPUTE_INSTANCES, handle).map(instance_of_slot)
}

/// Quick mirror of the init reference count, for the default exports.
pub static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

static SIM: Mutex<Option<Sim>> = Mutex::new(None);

pub fn lock() -> MutexGuard<'static, Option<Sim>> {
    SIM.lock().unwrap_or_else(|e| e.into_inner())
}

/// Now, since the Unix epoch (zero on a clock before it).
fn since_epoch() -> std::time::Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

pub fn now_unix_ms() -> u64 {
    since_epoch().as_millis() as u64
}

pub fn now_unix_us() -> u64 {
    since_epoch().as_micros() as u64
}

/// The default state-file path for a scenario.
pub fn default_state_path(scenario: &Path) -> PathBuf {
    let canonical = std::fs::canonicalize(scenario).unwrap_or_else(|_| scenario.to_path_buf());
    let hash = crate::hash::stable_hash(canonical.as_os_str().as_encoded_bytes());
    let dir = std::env::var_os("TMPDIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    // SAFETY: getuid never fails.
    let uid = unsafe { libc::getuid() };
    dir.join(format!("nvml-sim-{uid}-{hash:016x}.json"))
}

/// Where the state of `scenario` lives: $NVML_SIM_STATE, else the scenario's `state_file`,
/// else [`default_state_path`].
pub fn state_path(scenario: &Scenario) -> PathBuf {
    if let Some(p) = std::env::var_os(STATE_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    scenario
        .state_file
        .clone()
        .unwrap_or_else(|| default_state_path(&scenario.path))
}

/// Makes the scenario's device files, if it names a `device_dir`. A failure is one line on
/// stderr: NVML calls do not depend on the files.
fn make_device_dir(scenario: &Scenario) {
    if let Err(e) = crate::devdir::create_device_dir(scenario) {
        eprintln!("nvml-sim: {e}");
    }
}

/// A process as reported now on one GPU.
#[derive(Debug, Clone, Copy)]
pub struct ProcNow {
    /// The pid NVML reports: the scenario's `listed_pid`, else the real pid.
    pub pid: u32,
    /// The process's pid in our PID namespace, where /proc has it.
    pub real_pid: u32,
    pub used_bytes: Option<u64>,
    pub sm_pct: u32,
    pub mem_pct: u32,
    pub kind: ProcKind,
    /// (GPU instance, compute instance) on a MIG GPU.
    pub instance: Option<(u32, u32)>,
    /// Its part in MPS on this GPU, if the GPU runs under MPS.
    pub mps: Option<crate::scenario::MpsRole>,
}

#[derive(Debug, Default, Clone)]
pub struct GpuNow {
    /// The processes NVML lists (every process list goes through this).
    pub procs: Vec<ProcNow>,
    pub used_mib: u64,
    /// Summed `sm_pct` and `mem_pct` of the live `unlisted` processes: the GPU is busy
    /// with them even though no list names them.
    pub unlisted_pct: (u32, u32),
    /// Memory used per GPU instance (MIG): (GI id, MiB), live processes (listed or not) and
    /// memory held in teardown.
    pub gi_used_mib: Vec<(u32, u64)>,
}

impl GpuNow {
    /// A live process: its memory, and either its listing or its share of the unlisted load.
    fn add_live(&mut self, p: &crate::scenario::Process, instance: Option<(u32, u32)>) {
        self.used_mib += p.used_mib.unwrap_or(0);
        self.add_gi(instance, p.used_mib.unwrap_or(0));
        if p.unlisted {
            self.unlisted_pct.0 += p.sm_pct;
            self.unlisted_pct.1 += p.mem_pct;
        } else {
            self.procs.push(ProcNow {
                pid: p.listed_pid.unwrap_or(p.pid),
                real_pid: p.pid,
                used_bytes: p.used_mib.map(|m| m * MIB),
                sm_pct: p.sm_pct,
                mem_pct: p.mem_pct,
                kind: p.kind,
                instance,
                mps: p.mps,
            });
        }
    }

    fn add_gi(&mut self, gi: Option<(u32, u32)>, mib: u64) {
        let Some((gi, _)) = gi else { return };
        match self.gi_used_mib.iter_mut().find(|(g, _)| *g == gi) {
            Some((_, m)) => *m += mib,
            None => self.gi_used_mib.push((gi, mib)),
        }
    }

    pub fn gi_used(&self, gi: u32) -> u64 {
        self.gi_used_mib
            .iter()
            .find(|(g, _)| *g == gi)
            .map_or(0, |(_, m)| *m)
    }
}

pub struct Sim {
    pub refcount: u32,
    path: PathBuf,
    sig: Option<FileSig>,
    /// Signature of the last version found invalid (`Some(None)`: missing), so that each
    /// bad version is reported once.
    bad: Option<Option<FileSig>>,
    pub scenario: Arc<Scenario>,
    pub state: StateStore,
    live: LiveCache,
    /// The deaths the host's instances share (read in a PID namespace of its own, kept up
    /// to date on the host).
    deaths: Deaths,
    /// The deaths file could not be written (said once).
    deaths_unwritable: bool,
    /// Per GPU: the last computed view and when; reused for at most the liveness TTL.
    /// Shared with callers: several queries per GPU per poll read the same answer.
    views: Vec<Option<(Instant, Arc<GpuNow>)>>,
    /// Whether each of the scenario's processes holds a context, by its index in the
    /// scenario, and when that was found: one answer per process for all the GPUs it is
    /// listed on (8 GPUs ask about the same process 8 times a poll).
    alive: Option<(Instant, Arc<Vec<bool>>)>,
    /// When the scenario file was last checked for a change.
    checked_at: Option<Instant>,
    /// The fault generator: the seed it was started from, and its state.
    faults: Option<(u64, u64)>,
}

pub use crate::state::RECHECK;

const MIB: u64 = 1024 * 1024;

impl Sim {
    /// Loads the scenario named by the environment; `Err` is the code nvmlInit returns.
    pub fn open() -> Result<Sim, nvmlReturn_t> {
        let Some(path) = std::env::var_os(SCENARIO_ENV).filter(|p| !p.is_empty()) else {
            eprintln!("nvml-sim: {SCENARIO_ENV} is not set: it must name a scenario file");
            return Err(NVML_ERROR_UNKNOWN);
        };
        let path = PathBuf::from(path);
        let sig = file_sig(&path);
        let scenario = scenario::load(&path).map_err(|e| {
            eprintln!("nvml-sim: {e}");
            NVML_ERROR_UNKNOWN
        })?;
        make_device_dir(&scenario);
        if let Some(code) = scenario.init_error {
            return Err(code);
        }
        let state = StateStore::new(state_path(&scenario));
        let deaths = Deaths::new(crate::deaths::path_for(&path));
        if crate::live::in_child_pid_namespace() {
            deaths.ask();
        } else {
            crate::deaths::start_sharing(deaths.path.clone(), share_deaths);
        }
        Ok(Sim {
            refcount: 1,
            path,
            sig,
            bad: None,
            scenario: Arc::new(scenario),
            state,
            live: LiveCache::default(),
            deaths,
            deaths_unwritable: false,
            views: Vec::new(),
            alive: None,
            checked_at: None,
            faults: None,
        })
    }

    /// Re-reads the scenario if the file changed (stat: dev, inode, size, mtime). An invalid
    /// new version is reported once on stderr and the last good scenario kept.
    pub fn refresh(&mut self) {
        // A stat of the file per NVML call is most of a quiet client's cost; a change is
        // seen within RECHECK instead.
        if !crate::state::recheck_due(&mut self.checked_at) {
            return;
        }
        let sig = file_sig(&self.path);
        if sig == self.sig || self.bad == Some(sig) {
            return;
        }
        let loaded = match sig {
            None => Err(format!(
                "{}: the scenario file is gone",
                self.path.display()
            )),
            Some(_) => scenario::load(&self.path),
        };
        match loaded {
            Ok(s) => {
                make_device_dir(&s);
                let new_state = state_path(&s);
                if new_state != self.state.path {
                    self.state = StateStore::new(new_state);
                }
                self.scenario = Arc::new(s);
                self.views.clear();
                self.alive = None;
                self.sig = sig;
                self.bad = None;
            }
            Err(e) => {
                eprintln!("nvml-sim: {e} (keeping the last good scenario)");
                self.bad = Some(sig);
            }
        }
    }

    /// An injected fault for this call, drawn as the scenario's `fault_rate` says: one of
    /// its `fault_errors`, or `None`. The same seed gives the same sequence of faults.
    pub fn inject_fault(&mut self) -> Option<u32> {
        let rate = self.scenario.fault_rate;
        if rate <= 0.0 {
            return None;
        }
        let seed = self.scenario.fault_seed;
        let state = match self.faults {
            Some((from, state)) if from == seed => state,
            _ => seed ^ 0x9e37_79b9_7f4a_7c15,
        };
        // xorshift64*: plenty for choosing which calls fail.
        let mut x = state.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.faults = Some((seed, x));
        let draw = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let unit = (draw >> 11) as f64 / (1u64 << 53) as f64;
        if unit >= rate {
            return None;
        }
        let errors = &self.scenario.fault_errors;
        Some(errors[(draw % errors.len() as u64) as usize])
    }

    pub fn gpu(&self, index: usize) -> &Gpu {
        &self.scenario.gpus[index]
    }

    pub fn gpu_state(&mut self, index: usize) -> GpuState {
        let uuid = self.scenario.gpus[index].uuid.clone();
        self.state
            .refresh()
            .gpus
            .get(&uuid)
            .cloned()
            .unwrap_or_default()
    }

    pub fn update_gpu_state(
        &mut self,
        index: usize,
        f: impl FnOnce(&mut GpuState),
    ) -> nvmlReturn_t {
        let uuid = self.scenario.gpus[index].uuid.clone();
        match self.state.update(|s| f(s.gpus.entry(uuid).or_default())) {
            Ok(()) => NVML_SUCCESS,
            Err(e) => {
                eprintln!(
                    "nvml-sim: {}: cannot write the state file: {e}",
                    self.state.path.display()
                );
                NVML_ERROR_UNKNOWN
            }
        }
    }

    /// The processes on GPU `index` that hold a context now, and the memory used. The
    /// answer is reused for at most [`crate::live::TTL`] (the liveness cache's lifetime).
    pub fn gpu_now(&mut self, index: usize) -> Arc<GpuNow> {
        let now = Instant::now();
        if let Some(Some((at, view))) = self.views.get(index)
            && now.duration_since(*at) < crate::live::TTL
        {
            return Arc::clone(view);
        }
        let view = Arc::new(self.compute_gpu_now(index, now));
        if self.views.len() < self.scenario.gpus.len() {
            self.views.resize(self.scenario.gpus.len(), None);
        }
        self.views[index] = Some((now, Arc::clone(&view)));
        view
    }

    fn compute_gpu_now(&mut self, index: usize, now: Instant) -> GpuNow {
        let sc = self.scenario.clone();
        let gpu = &sc.gpus[index];
        let mut out = GpuNow {
            procs: Vec::with_capacity(sc.by_gpu[index].len()),
            used_mib: gpu.leaked_mib,
            unlisted_pct: (0, 0),
            gi_used_mib: Vec::new(),
        };
        let mut state_fresh = false;
        let mut stale_records: Vec<u32> = Vec::new();
        let mut new_records: Vec<u32> = Vec::new();
        let now_ms = now_unix_ms();
        let alive = self.alive_now(now);
        for p_index in sc.by_gpu[index].iter().copied() {
            let p = &sc.processes[p_index];
            let instance = p.instance_on(index as u32);
            if alive[p_index] {
                out.add_live(p, instance);
                if p.teardown_ms.is_some() {
                    if !state_fresh {
                        self.state.refresh();
                        state_fresh = true;
                    }
                    if self
                        .state
                        .cached()
                        .teardown
                        .contains_key(&p.pid.to_string())
                    {
                        stale_records.push(p.pid);
                    }
                }
            } else if let Some(ms) = p.teardown_ms {
                if !state_fresh {
                    self.state.refresh();
                    state_fresh = true;
                }
                let first = match self.state.cached().teardown.get(&p.pid.to_string()) {
                    Some(r) => r.first_dead_unix_ms,
                    None => {
                        if !new_records.contains(&p.pid) {
                            new_records.push(p.pid);
                        }
                        now_ms
                    }
                };
                if now_ms < first.saturating_add(ms) {
                    out.used_mib += p.used_mib.unwrap_or(0);
                    out.add_gi(instance, p.used_mib.unwrap_or(0));
                }
            }
        }
        self.record_teardowns(&stale_records, &new_records, now_ms);
        out
    }

    /// Forgets the teardown records of processes alive again (`stale`) and starts those of
    /// processes seen dead for the first time (`new`), at `now_ms`.
    fn record_teardowns(&mut self, stale: &[u32], new: &[u32], now_ms: u64) {
        if new.is_empty() && stale.is_empty() {
            return;
        }
        let _ = self.state.update(|s| {
            for pid in stale {
                s.teardown.remove(&pid.to_string());
            }
            for pid in new {
                s.teardown
                    .entry(pid.to_string())
                    .or_insert(crate::state::Teardown {
                        first_dead_unix_ms: now_ms,
                    });
            }
        });
    }

    /// Liveness of every scenario process, reused for at most [`crate::live::TTL`].
    fn alive_now(&mut self, now: Instant) -> Arc<Vec<bool>> {
        if let Some((at, alive)) = &self.alive
            && now.duration_since(*at) < crate::live::TTL
        {
            return Arc::clone(alive);
        }
        let processes = &self.scenario.processes;
        let alive: Arc<Vec<bool>> = if crate::live::in_child_pid_namespace() {
            // Host pids: dead only where an instance on the host saw them die.
            let dead = self.deaths.current();
            Arc::new(processes.iter().map(|p| !dead.contains(&p.pid)).collect())
        } else {
            self.live.refresh(processes.iter().map(|p| p.pid), now);
            Arc::new(
                processes
                    .iter()
                    .map(|p| self.live.is_alive(p.pid, now))
                    .collect(),
            )
        };
        self.alive = Some((now, Arc::clone(&alive)));
        alive
    }

    pub fn memory_bytes(&mut self, index: usize) -> (u64, u64, u64, u64) {
        let used_mib = self.gpu_now(index).used_mib;
        let g = self.gpu(index);
        let total = g.memory_total_mib * MIB;
        let reserved = g.reserved_mib * MIB;
        let used = (used_mib * MIB).min(total - reserved);
        let free = total - reserved - used;
        (total, reserved, free, used)
    }

    /// A MIG device's memory (total, reserved, free, used) in bytes: its profile's size, and
    /// what the processes in its GPU instance hold.
    pub fn mig_memory_bytes(&mut self, index: usize, gi: u32) -> (u64, u64, u64, u64) {
        let used_mib = self.gpu_now(index).gi_used(gi);
        let total = self
            .gpu(index)
            .mig
            .iter()
            .find(|m| m.gi == gi)
            .map_or(0, |m| m.profile.memory_mib)
            * MIB;
        let used = (used_mib * MIB).min(total);
        (total, 0, total - used, used)
    }

    /// GPU and memory utilization: the scenario's values, else the sum over the live
    /// processes, listed or not (capped at 100).
    pub fn utilization(&mut self, index: usize) -> (u32, u32) {
        let g = self.gpu(index);
        let (gu, mu) = (g.utilization_pct, g.memory_utilization_pct);
        if let (Some(a), Some(b)) = (gu, mu) {
            return (a, b);
        }
        let now = self.gpu_now(index);
        let sm: u32 = now.procs.iter().map(|p| p.sm_pct).sum::<u32>() + now.unlisted_pct.0;
        let mem: u32 = now.procs.iter().map(|p| p.mem_pct).sum::<u32>() + now.unlisted_pct.1;
        (gu.unwrap_or(sm.min(100)), mu.unwrap_or(mem.min(100)))
    }

    pub fn is_alive(&mut self, pid: u32) -> bool {
        if crate::live::in_child_pid_namespace() {
            return !self.deaths.current().contains(&pid);
        }
        self.live.is_alive(pid, Instant::now())
    }

    /// On the host: writes which of the scenario's processes are dead to the file beside
    /// it, where an instance in another PID namespace asked for it (see [`crate::deaths`]).
    fn share_deaths_now(&mut self) {
        if !self.deaths.asked() {
            return;
        }
        self.refresh();
        let alive = self.alive_now(Instant::now());
        let dead: BTreeSet<u32> = self
            .scenario
            .processes
            .iter()
            .zip(alive.iter())
            .filter(|(_, alive)| !**alive)
            .map(|(p, _)| p.pid)
            .collect();
        if let Err(e) = self.deaths.share(&dead) {
            if !self.deaths_unwritable {
                eprintln!(
                    "nvml-sim: {}: cannot share the deaths seen on the host: {e}",
                    self.deaths.path.display()
                );
            }
            self.deaths_unwritable = true;
        }
    }

    /// The checks every setting goes through, in the driver's order.
    pub fn setting_allowed(&self, index: usize, f: Feature) -> Result<(), nvmlReturn_t> {
        let g = self.gpu(index);
        if !g.supports(f) {
            return Err(NVML_ERROR_NOT_SUPPORTED);
        }
        if g.no_permission.contains(&f) {
            return Err(NVML_ERROR_NO_PERMISSION);
        }
        // SAFETY: geteuid never fails.
        if self.scenario.settings_require_root && unsafe { libc::geteuid() } != 0 {
            return Err(NVML_ERROR_NO_PERMISSION);
        }
        Ok(())
    }
}

/// One pass of the host's sharing thread: the loaded scenario's deaths, if one is loaded.
fn share_deaths() {
    if let Some(sim) = lock().as_mut() {
        sim.share_deaths_now();
    }
}
