//! The NVML backend: loads libnvidia-ml (or nvml-sim) at run time, once per process.
//!
//! A GPU that falls off the bus can make every NVML call on it block for tens of seconds,
//! and nvidia-smi with it. gpuctl bounds them: with a timeout, each GPU is read by a worker
//! thread of its own, and a GPU whose worker has not answered by the deadline is reported
//! as not answering while the others are shown. Its worker stays busy with the blocked
//! call; later reads of that GPU do not queue behind it but report it at once, until it
//! answers again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use crate::error::{CoreError, Result};

pub(crate) mod lists;
mod places;
pub(crate) use places::mig_instance_ids;
pub use places::{GpuTables, MigName, Place, places_from, resolve_selectors};

/// Overrides the configuration's `nvml_timeout` (a duration: "2s", "500ms").
pub const TIMEOUT_ENV: &str = "GPUCTL_NVML_TIMEOUT";

/// How long an NVML call on one GPU may take when nothing says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The timeout in force: `flag` (a command line's), else GPUCTL_NVML_TIMEOUT, else
/// `configured`, else [`DEFAULT_TIMEOUT`]. An unreadable environment value is an error
/// naming it.
pub fn timeout(flag: Option<Duration>, configured: Option<Duration>) -> Result<Duration> {
    timeout_from(flag, std::env::var(TIMEOUT_ENV).ok().as_deref(), configured)
}

/// [`timeout`] with the environment's value given.
fn timeout_from(
    flag: Option<Duration>,
    env: Option<&str>,
    configured: Option<Duration>,
) -> Result<Duration> {
    if let Some(flag) = flag {
        return Ok(flag);
    }
    match env {
        Some(text) if !text.trim().is_empty() => crate::units::parse_duration(text)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                CoreError::BadSetting(format!(
                    "{TIMEOUT_ENV}={text:?} is not a duration above zero (like 10s, 500ms)"
                ))
            }),
        _ => Ok(configured.unwrap_or(DEFAULT_TIMEOUT)),
    }
}

/// Names the NVML library to load instead of the system's `libnvidia-ml.so.1`.
pub const LIB_ENV: &str = "GPUCTL_NVML_LIB";
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// The path or soname of the NVML library this process loads.
pub fn library_path() -> String {
    std::env::var(LIB_ENV)
        .ok()
        .filter(|path| !path.is_empty())
        .unwrap_or_else(|| DEFAULT_LIB.to_string())
}

/// [`library_path`] as this process may load it: under euid 0 a path from `GPUCTL_NVML_LIB`
/// must be root's down the whole path (`config::trusted_by_root`; `sudo -E` keeps the
/// variable, and loading runs the library's constructors as root), and its resolved path is
/// what is loaded. Checked before anything is loaded. A bare name (no `/`) is looked up by the
/// dynamic loader in the system's directories, as the default is.
pub fn checked_library_path() -> Result<String> {
    let library = library_path();
    if !library.contains('/') {
        return Ok(library);
    }
    let path = crate::config::root_may_use(LIB_ENV, std::path::Path::new(&library))?;
    Ok(path.to_string_lossy().into_owned())
}

/// An initialised NVML library. Hold one for the life of the process (or until the driver
/// goes away); NVML is shut down when it is dropped (and no call on it is still blocked).
pub struct Gpus {
    nvml: Arc<Nvml>,
    library: String,
    /// How long a call on one GPU may take; `None`: as long as it takes.
    timeout: Option<Duration>,
    /// One worker a GPU, started at its first bounded read.
    workers: Mutex<Vec<Option<Worker>>>,
    /// No per-GPU read waits past this instant while set ([`Gpus::cap_waits_at`]).
    cap: Mutex<Option<Instant>>,
}

/// Holds a cap on per-GPU waits ([`Gpus::cap_waits_at`]); lifts it when dropped.
pub struct WaitCap<'a> {
    gpus: &'a Gpus,
    previous: Option<Instant>,
}

impl Drop for WaitCap<'_> {
    fn drop(&mut self) {
        *self.gpus.cap.lock().unwrap_or_else(|e| e.into_inner()) = self.previous;
    }
}

/// A job for a GPU's worker.
type Job = Box<dyn FnOnce(&Nvml) + Send>;

/// The thread that reads one GPU, and whether it is inside a call now.
struct Worker {
    jobs: mpsc::Sender<Job>,
    busy: Arc<AtomicBool>,
}

impl std::fmt::Debug for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpus")
            .field("library", &self.library)
            .finish()
    }
}

impl Gpus {
    /// Loads and initialises NVML from [`checked_library_path`].
    pub fn open() -> Result<Gpus> {
        Gpus::open_library(&checked_library_path()?)
    }

    pub fn open_library(library: &str) -> Result<Gpus> {
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new(library))
            .init()
            .map_err(|error| unavailable(library, error))?;
        Ok(Gpus {
            nvml: Arc::new(nvml),
            library: library.to_string(),
            timeout: None,
            workers: Mutex::new(Vec::new()),
            cap: Mutex::new(None),
        })
    }

    /// Loads and initialises NVML, waiting at most `timeout` for the driver to answer (a
    /// sick GPU can block initialisation too), and bounds every later per-GPU read by it.
    pub fn open_within(timeout: Duration) -> Result<Gpus> {
        // Before the first thread: growing the table later waits on RCU (see the function).
        crate::sys::limits::reserve_descriptors(1024);
        let library = checked_library_path()?;
        let (answer, answered) = mpsc::channel();
        let opening = library.clone();
        // The thread that opens NVML stays on as the all-GPU worker (slot 0): the first
        // snapshot's reads need no second thread (nor its stack and malloc arena).
        let (jobs, queue) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("nvml-gpus".to_string())
            .spawn(move || {
                let opened = Gpus::open_library(&opening);
                let nvml = opened.as_ref().ok().map(|gpus| Arc::clone(&gpus.nvml));
                let _ = answer.send(opened.map(|gpus| gpus.with_all_gpu_worker(jobs)));
                if let Some(nvml) = nvml {
                    for job in queue {
                        job(&nvml);
                    }
                }
            });
        if let Err(error) = started {
            return Err(CoreError::NvmlUnavailable {
                library,
                reason: format!("cannot start the thread that opens it: {error}"),
                hint: "The system is out of threads or memory.",
            });
        }
        match answered.recv_timeout(timeout) {
            Ok(opened) => opened.map(|gpus| gpus.bounded_by(timeout)),
            Err(_) => Err(CoreError::NvmlUnavailable {
                library,
                reason: format!(
                    "the driver did not answer within {}",
                    humantime::format_duration(timeout)
                ),
                hint: "A GPU may have fallen off the bus: check `dmesg | grep -i xid`.",
            }),
        }
    }

    /// Slot 0 of the workers (the all-GPU one) is the thread that sends on `jobs`' queue.
    fn with_all_gpu_worker(self, jobs: mpsc::Sender<Job>) -> Gpus {
        let worker = Worker {
            jobs,
            busy: Arc::new(AtomicBool::new(false)),
        };
        *self.workers.lock().unwrap_or_else(|e| e.into_inner()) = vec![Some(worker)];
        self
    }

    /// Bounds every per-GPU read of snapshots by `timeout`.
    pub fn bounded_by(mut self, timeout: Duration) -> Gpus {
        self.timeout = Some(timeout);
        self
    }

    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// How long a per-GPU read may wait from now: the timeout, or less while a cap is set
    /// ([`Gpus::cap_waits_at`]). `None`: unbounded (no timeout).
    pub fn wait_limit(&self) -> Option<Duration> {
        let cap = *self.cap.lock().unwrap_or_else(|e| e.into_inner());
        match (self.timeout, cap) {
            (Some(limit), Some(cap)) => {
                Some(limit.min(cap.saturating_duration_since(Instant::now())))
            }
            (limit, _) => limit,
        }
    }

    /// Until the guard is dropped, no per-GPU read waits past `deadline` (nor past the
    /// timeout): a step that must end by its own deadline (verifying a release, waiting for
    /// a GPU to be free) reads a GPU that answers each call late for no longer than it has.
    /// Only a bounded `Gpus` (one with a timeout) is capped.
    pub fn cap_waits_at(&self, deadline: Instant) -> WaitCap<'_> {
        let mut cap = self.cap.lock().unwrap_or_else(|e| e.into_inner());
        let previous = *cap;
        *cap = Some(previous.map_or(deadline, |earlier| earlier.min(deadline)));
        WaitCap {
            gpus: self,
            previous,
        }
    }

    pub(crate) fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// The session itself, for what must keep it alive (an NVML event set).
    pub(crate) fn shared_nvml(&self) -> Arc<Nvml> {
        Arc::clone(&self.nvml)
    }

    /// Starts `read` on GPU `index`'s worker; its answer comes on the receiver. `None` when
    /// that worker is still inside an earlier call (the GPU stopped answering), or cannot
    /// be started.
    pub(crate) fn ask<T: Send + 'static>(
        &self,
        index: u32,
        read: impl FnOnce(&Nvml) -> T + Send + 'static,
    ) -> Option<mpsc::Receiver<T>> {
        let (answer, answered) = mpsc::channel();
        self.run_on(Some(index), move |nvml, release| {
            let read = read(nvml);
            // Free before answering: whoever gets the answer may ask this worker again.
            release();
            let _ = answer.send(read);
        })
        .then_some(answered)
    }

    /// Runs `job` on a worker: GPU `index`'s, or with `None` the one that reads every GPU in
    /// turn when none is stuck (one hand-over a snapshot instead of one a GPU). The job is
    /// given `release`, which frees the worker for the next job: a job calls it before its
    /// last answer (it is called after the job too). False when that worker is still inside
    /// an earlier call, or cannot be started.
    pub(crate) fn run_on(
        &self,
        index: Option<u32>,
        job: impl FnOnce(&Nvml, &dyn Fn()) + Send + 'static,
    ) -> bool {
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        // Slot 0 is the all-GPU worker; GPU i's is slot i + 1.
        let slot = index.map_or(0, |i| i as usize + 1);
        if workers.len() <= slot {
            workers.resize_with(slot + 1, || None);
        }
        if workers[slot].is_none() {
            let (jobs, queue) = mpsc::channel::<Job>();
            let nvml = Arc::clone(&self.nvml);
            let name = index.map_or("nvml-gpus".to_string(), |i| format!("nvml-gpu-{i}"));
            let started = std::thread::Builder::new().name(name).spawn(move || {
                for job in queue {
                    job(&nvml);
                }
            });
            if started.is_err() {
                return false;
            }
            workers[slot] = Some(Worker {
                jobs,
                busy: Arc::new(AtomicBool::new(false)),
            });
        }
        let Some(worker) = workers[slot].as_ref() else {
            return false;
        };
        if worker.busy.swap(true, Ordering::SeqCst) {
            return false;
        }
        let busy = Arc::clone(&worker.busy);
        let job: Job = Box::new(move |nvml| {
            let release = || busy.store(false, Ordering::SeqCst);
            job(nvml, &release);
            release();
        });
        if worker.jobs.send(job).is_err() {
            worker.busy.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    pub fn count(&self) -> Result<u32> {
        self.nvml.device_count().map_err(|error| CoreError::Nvml {
            call: "nvmlDeviceGetCount",
            reason: describe(&error),
        })
    }

    /// The UUID of each GPU, by index; `None` for a GPU that cannot be queried (lost, or
    /// not answering within the timeout).
    pub fn uuids(&self) -> Result<Vec<Option<String>>> {
        Ok(self
            .per_gpu(|nvml, index| {
                nvml.device_by_index(index)
                    .and_then(|device| device.uuid())
                    .ok()
            })?
            .into_iter()
            .map(Option::flatten)
            .collect())
    }

    /// `read` of every GPU, by index, each within the timeout (`None`: no answer in time).
    fn per_gpu<T: Send + 'static>(&self, read: fn(&Nvml, u32) -> T) -> Result<Vec<Option<T>>> {
        let indices: Vec<u32> = (0..self.count()?).collect();
        Ok(self.on_each(&indices, read))
    }

    /// `work` on each GPU of `indices`, each on its own worker, all within one timeout;
    /// `None` for a GPU that did not answer in time (or is still inside an earlier call).
    /// Without a timeout, in turn on this thread.
    pub fn on_each<T, F>(&self, indices: &[u32], work: F) -> Vec<Option<T>>
    where
        T: Send + 'static,
        F: Fn(&Nvml, u32) -> T + Clone + Send + 'static,
    {
        let deadline = self.wait_limit().map(|limit| Instant::now() + limit);
        self.on_each_until(indices, deadline, work)
    }

    /// [`Gpus::on_each`] with the deadline given (`None`: in turn on this thread).
    pub(crate) fn on_each_until<T, F>(
        &self,
        indices: &[u32],
        deadline: Option<std::time::Instant>,
        work: F,
    ) -> Vec<Option<T>>
    where
        T: Send + 'static,
        F: Fn(&Nvml, u32) -> T + Clone + Send + 'static,
    {
        let Some(deadline) = deadline else {
            return indices
                .iter()
                .map(|&index| Some(work(&self.nvml, index)))
                .collect();
        };
        let asked: Vec<_> = indices
            .iter()
            .map(|&index| {
                let work = work.clone();
                self.ask(index, move |nvml| work(nvml, index))
            })
            .collect();
        asked
            .into_iter()
            .map(|answer| {
                answer?
                    .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
                    .ok()
            })
            .collect()
    }

    /// The GPU memory NVML lists process `pid` as holding, summed over every GPU (a process
    /// with compute and graphics contexts is listed twice with the same figure: counted
    /// once); `None` where it is listed on none, or its figure is not reported. Only NVML is
    /// asked: no /proc read, as a process asking about itself needs none.
    pub fn used_by(&self, pid: u32) -> Result<Option<u64>> {
        let mut total: Option<u64> = None;
        for index in 0..self.count()? {
            let Ok(device) = self.nvml.device_by_index(index) else {
                continue;
            };
            let lists = [
                lists::processes(&device, lists::ProcessList::Compute),
                lists::processes(&device, lists::ProcessList::Graphics),
            ];
            let used = lists
                .into_iter()
                .flat_map(|list| list.unwrap_or_default())
                .filter(|process| process.pid == pid)
                .filter_map(|process| match process.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(bytes) => Some(bytes),
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                })
                .max();
            if let Some(used) = used {
                total = Some(total.unwrap_or(0) + used);
            }
        }
        Ok(total)
    }
}

fn unavailable(library: &str, error: NvmlError) -> CoreError {
    let (reason, hint) = match &error {
        NvmlError::LibloadingError(cause) => (
            // The loader says why: not found, wrong architecture, not a shared object.
            {
                let detail = std::error::Error::source(cause)
                    .map_or_else(|| cause.to_string(), |s| s.to_string());
                let detail = detail
                    .strip_prefix(&format!("{library}: "))
                    .unwrap_or(&detail)
                    .to_string();
                format!("the NVIDIA management library could not be loaded: {detail}")
            },
            "Check that the NVIDIA driver is installed (ldconfig -p | grep libnvidia-ml), or set GPUCTL_NVML_LIB to the library's path.",
        ),
        NvmlError::DriverNotLoaded => (
            "the NVIDIA kernel driver is not loaded".to_string(),
            "Check `lsmod | grep nvidia` and `dmesg | grep -i nvrm`.",
        ),
        NvmlError::NoPermission => (
            "no permission to talk to the NVIDIA driver".to_string(),
            "Check the permissions of /dev/nvidiactl and /dev/nvidia*.",
        ),
        NvmlError::LibRmVersionMismatch => (
            "the NVML library and the kernel driver are different versions".to_string(),
            "A driver upgrade is half done: reload the nvidia modules or reboot.",
        ),
        other => (
            describe(other),
            "Check that the NVIDIA driver works (nvidia-smi).",
        ),
    };
    CoreError::NvmlUnavailable {
        library: library.to_string(),
        reason,
        hint,
    }
}

/// One line for an NVML error, in NVIDIA's words where it has them.
pub fn describe(error: &NvmlError) -> String {
    match error {
        NvmlError::GpuLost => "GPU is lost".to_string(),
        NvmlError::NotSupported => "not supported".to_string(),
        NvmlError::NoPermission => "insufficient permissions".to_string(),
        NvmlError::FailedToLoadSymbol(symbol) => {
            format!("the driver's NVML lacks a function ({symbol})")
        }
        other => other.to_string().replace('\n', " "),
    }
}

#[cfg(test)]
mod tests;
