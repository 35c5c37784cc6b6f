//! Memory monitoring: the caching allocator's figures (allocated, reserved, peak) on CUDA,
//! the host tensors' (the bridge's counting CPU allocator) on the host, and at milestones
//! this process's resident memory (sysinfo; its peak from procfs) and what NVML says it holds.
//! A per-micro-step trace of the cheap figures becomes the CSV and the plot.

use std::cell::Cell;
use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuctl_core::nvml::Gpus;
use sysinfo::{MemoryRefreshKind, Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use crate::alloc::{self, AllocatorStats};

/// One reading. The caching allocator's figures are there on CUDA only.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reading {
    pub allocator: Option<AllocatorStats>,
    /// Bytes of libtorch's CPU tensors alive (the counting CPU allocator of the bridge): the
    /// host's counterpart of the caching allocator's "allocated".
    pub host_allocated_bytes: u64,
}

/// Reads memory for one device.
pub struct Monitor<'s> {
    /// CUDA device index, when training on CUDA.
    cuda: Option<usize>,
    /// The run's NVML (its session's), where it is on CUDA and the library loaded.
    nvml: Option<&'s Gpus>,
    /// Host memory and this process's resident set, refreshed at milestones only; made at the
    /// first that asks (making one reads the boot time from /proc/stat).
    host: Option<System>,
    /// The allocator's peak before the last reset of its peak marks.
    earlier_peak: u64,
    /// Time spent in `read`: what the per-micro-step hooks cost, for the summary.
    spent: Cell<Duration>,
}

impl<'s> Monitor<'s> {
    pub fn new(cuda: Option<usize>, nvml: Option<&'s Gpus>) -> Monitor<'s> {
        Monitor {
            cuda,
            nvml,
            host: None,
            earlier_peak: 0,
            spent: Cell::new(Duration::ZERO),
        }
    }

    /// The cheap figures, counters kept in this process (no system call: reading
    /// /proc/self/statm costs 50-70 us once libtorch is mapped): what each micro-step
    /// records.
    pub fn read(&self) -> Reading {
        let started = Instant::now();
        let reading = Reading {
            allocator: self.cuda.and_then(|d| alloc::device_stats(d).ok()),
            host_allocated_bytes: alloc::host_stats().0.max(0) as u64,
        };
        self.spent.set(self.spent.get() + started.elapsed());
        reading
    }

    /// Time spent taking readings so far.
    pub fn spent(&self) -> Duration {
        self.spent.get()
    }

    /// What NVML reports this process holds, over all GPUs; `None` without NVML or when this
    /// process is not listed (no CUDA context yet).
    pub fn nvml_used(&mut self) -> Option<u64> {
        self.nvml?.used_by(std::process::id()).ok().flatten()
    }

    fn host(&mut self) -> &mut System {
        self.host.get_or_insert_with(System::new)
    }

    /// Host memory available for new allocations (MemAvailable), in bytes. 13 us, as reading
    /// /proc/meminfo by hand did (`reading_costs` below).
    pub fn host_available(&mut self) -> Option<u64> {
        let host = self.host();
        host.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        Some(host.available_memory()).filter(|&available| available > 0)
    }

    /// This process's resident set in bytes. 38 us against 7 us for /proc/self/statm by hand
    /// (`reading_costs` below): sysinfo reads status (is the pid a thread?) and stat besides
    /// statm. Kept all the same: it is read at milestones only, a few per run and one per
    /// epoch, never per micro-step.
    fn rss(&mut self) -> u64 {
        let pid = Pid::from_u32(std::process::id());
        let host = self.host();
        host.refresh_processes_specifics(
            ProcessesToUpdate::Some(&[pid]),
            false,
            ProcessRefreshKind::nothing().with_memory(),
        );
        host.process(pid).map_or(0, |process| process.memory())
    }

    /// A log line's figures for a milestone.
    pub fn milestone(&mut self) -> String {
        let reading = self.read();
        let mut text = String::new();
        match reading.allocator {
            Some(stats) => {
                let _ = write!(
                    text,
                    "allocated {}, reserved {}, peak {} (reserved peak {})",
                    bytes(stats.allocated_bytes),
                    bytes(stats.reserved_bytes),
                    bytes(stats.allocated_peak_bytes),
                    bytes(stats.reserved_peak_bytes)
                );
            }
            None => {
                let _ = write!(
                    text,
                    "allocated {} (host tensors), peak {}; resident {}, peak resident {}",
                    bytes(reading.host_allocated_bytes as i64),
                    bytes(alloc::host_stats().1),
                    bytes(self.rss() as i64),
                    bytes(peak_rss() as i64)
                );
            }
        }
        if self.cuda.is_some() {
            match self.nvml_used() {
                Some(used) => {
                    let _ = write!(text, "; NVML: this process holds {}", bytes(used as i64));
                }
                None => text.push_str("; NVML: no figure for this process"),
            }
        }
        text
    }

    /// Resets the allocator's peak marks (the next milestone shows the peak since), keeping
    /// the run's peak for the summary.
    pub fn reset_peak(&mut self) {
        let Some(device) = self.cuda else {
            self.earlier_peak = self.earlier_peak.max(alloc::host_stats().1.max(0) as u64);
            alloc::host_reset_peak();
            return;
        };
        if let Ok(stats) = alloc::device_stats(device) {
            self.earlier_peak = self
                .earlier_peak
                .max(stats.allocated_peak_bytes.max(0) as u64);
        }
        let _ = alloc::reset_peak_stats(device);
    }

    /// The peak for the summary: the caching allocator's on CUDA, the host tensors' on cpu.
    pub fn peak(&self) -> (u64, &'static str) {
        match self.read().allocator {
            Some(stats) => (
                (stats.allocated_peak_bytes.max(0) as u64).max(self.earlier_peak),
                "cuda_allocated",
            ),
            None => (
                (alloc::host_stats().1.max(0) as u64).max(self.earlier_peak),
                "host_allocated",
            ),
        }
    }
}

/// The resident set's high-water mark (VmHWM) in bytes: procfs, since sysinfo has no peak.
/// 30 us against 15 us for finding the line by hand (procfs parses all of /proc/self/status);
/// milestones only, as `Monitor::rss`.
fn peak_rss() -> u64 {
    procfs::process::Process::myself()
        .and_then(|me| me.status())
        .ok()
        .and_then(|status| status.vmhwm)
        .map_or(0, |kib| kib * 1024)
}

/// "1.50 GiB", "320 MiB": gpuctl's byte format, with two decimals from GiB up. libtorch
/// reports sizes as i64.
pub fn bytes(value: i64) -> String {
    gpuctl_core::units::bytes_to(value.max(0) as u64, 2)
}

/// When in a step a trace row was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Forward,
    Backward,
    OptimizerStep,
    OutOfMemory,
}

impl Event {
    fn as_str(self) -> &'static str {
        match self {
            Event::Forward => "forward",
            Event::Backward => "backward",
            Event::OptimizerStep => "optimizer_step",
            Event::OutOfMemory => "oom",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct TraceRow {
    pub step: u64,
    pub micro_step: u32,
    pub grad_accum: u32,
    pub micro_batch: u32,
    pub event: Event,
    pub reading: Reading,
}

impl TraceRow {
    /// The figure the plot draws as "allocated": the caching allocator's on CUDA, the
    /// counting CPU allocator's on the host.
    pub fn in_use(&self) -> u64 {
        self.reading
            .allocator
            .map_or(self.reading.host_allocated_bytes, |s| {
                s.allocated_bytes.max(0) as u64
            })
    }
}

/// The per-micro-step memory trace: rows in memory, written as CSV.
#[derive(Debug, Default)]
pub struct Trace {
    pub rows: Vec<TraceRow>,
}

impl Trace {
    pub fn write_csv(&self, path: &Path) -> io::Result<()> {
        let mut text = String::from(
            "step,micro_step,grad_accum,micro_batch,event,allocated_bytes,reserved_bytes,\
             allocated_peak_bytes,host_allocated_bytes\n",
        );
        for row in &self.rows {
            let stats = row.reading.allocator;
            let field = |f: fn(&AllocatorStats) -> i64| {
                stats.as_ref().map_or(String::new(), |s| f(s).to_string())
            };
            let _ = writeln!(
                text,
                "{},{},{},{},{},{},{},{},{}",
                row.step,
                row.micro_step,
                row.grad_accum,
                row.micro_batch,
                row.event.as_str(),
                field(|s| s.allocated_bytes),
                field(|s| s.reserved_bytes),
                field(|s| s.allocated_peak_bytes),
                row.reading.host_allocated_bytes
            );
        }
        crate::checkpoint::write_atomically(path, text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written readings that sysinfo and procfs replaced: the reference that the
    /// readings are checked and timed against.
    mod by_hand {
        pub fn rss() -> u64 {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
            let pages: u64 = statm
                .split_whitespace()
                .nth(1)
                .and_then(|field| field.parse().ok())
                .unwrap_or(0);
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
            pages * page
        }

        pub fn kib_field(path: &str, name: &str) -> Option<u64> {
            let text = std::fs::read_to_string(path).ok()?;
            let rest = text.lines().find_map(|line| line.strip_prefix(name))?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kib * 1024)
        }
    }

    /// Within 64 MiB: host memory moves between two readings, by other processes too.
    fn close(a: u64, b: u64) -> bool {
        a.abs_diff(b) < 64 << 20
    }

    #[test]
    fn host_readings_match_the_kernels_figures() {
        let mut monitor = Monitor::new(None, None);
        let available = monitor.host_available().expect("MemAvailable");
        let by_hand = by_hand::kib_field("/proc/meminfo", "MemAvailable:").unwrap();
        assert!(close(available, by_hand), "{available} vs {by_hand}");

        let rss = monitor.rss();
        assert!(rss > 0 && close(rss, by_hand::rss()), "{rss}");
        let peak = peak_rss();
        let peak_by_hand = by_hand::kib_field("/proc/self/status", "VmHWM:").unwrap();
        assert!(
            peak >= rss && close(peak, peak_by_hand),
            "{peak} vs {peak_by_hand}"
        );
    }

    /// The cost of each host reading, sysinfo/procfs against by hand, in a process with
    /// libtorch mapped and its thread pool started (where /proc/self/statm once took 50-70
    /// us). Prints figures; times nothing against a bound:
    /// `cargo test -p gpuctl-trainer --release -- --ignored --nocapture reading_costs`.
    #[test]
    #[ignore = "a benchmark: prints figures"]
    fn reading_costs() {
        let a = tch::Tensor::randn([256, 256], (tch::Kind::Float, tch::Device::Cpu));
        let _ = a.matmul(&a).sum(tch::Kind::Float).double_value(&[]);
        fn median(name: &str, reading: &mut dyn FnMut() -> u64) -> f64 {
            for _ in 0..100 {
                std::hint::black_box(reading());
            }
            let mut took: Vec<Duration> = (0..2001)
                .map(|_| {
                    let started = Instant::now();
                    std::hint::black_box(reading());
                    started.elapsed()
                })
                .collect();
            took.sort();
            let us = took[took.len() / 2].as_secs_f64() * 1e6;
            println!("{name:<44} {us:>7.1} us");
            us
        }
        let mut monitor = Monitor::new(None, None);
        let statm = median("resident: /proc/self/statm by hand", &mut by_hand::rss);
        let process = median("resident: sysinfo, this pid, memory only", &mut || {
            monitor.rss()
        });
        let status = median("peak resident: VmHWM by hand", &mut || {
            by_hand::kib_field("/proc/self/status", "VmHWM:").unwrap_or(0)
        });
        let procfs = median("peak resident: procfs status().vmhwm", &mut peak_rss);
        let meminfo = median("available: MemAvailable by hand", &mut || {
            by_hand::kib_field("/proc/meminfo", "MemAvailable:").unwrap_or(0)
        });
        let ram = median("available: sysinfo, kept System, ram only", &mut || {
            monitor.host_available().unwrap_or(0)
        });
        let fresh = median("available: sysinfo, new System each time", &mut || {
            Monitor::new(None, None).host_available().unwrap_or(0)
        });
        println!(
            "ratios: resident {:.2}, peak {:.2}, available {:.2} (new System {:.2})",
            process / statm,
            procfs / status,
            ram / meminfo,
            fresh / meminfo
        );
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(3 << 30), "3.00 GiB");
        assert_eq!(bytes(320 << 20), "320 MiB");
        assert_eq!(bytes(12 << 10), "12 KiB");
        // gpuctl's one byte format: nothing is "0 B" (this trainer printed "0 KiB" before).
        assert_eq!(bytes(-5), "0 B");
    }
}
