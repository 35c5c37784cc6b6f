//! Resource limits.

use nix::fcntl::{FcntlArg, fcntl};
use nix::sys::resource::{Resource, getrlimit};
use nix::unistd::close;

/// How many files a long-running reader may keep open for itself: a quarter of the soft
/// open-file limit (at most 16384), so the program keeps plenty for everything else.
pub fn open_file_budget() -> usize {
    let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft as usize);
    (soft / 4).min(16384)
}

/// Grows this process's descriptor table to hold `count` descriptors now, while it may still
/// be single-threaded. The kernel grows the table on demand, but once a process has several
/// threads each growth waits for an RCU grace period (`expand_fdtable`): about 10 ms a time
/// on a VM, paid in the middle of a read when a library opens its 256th descriptor (nvml-sim
/// holds a pidfd per process). Best effort: a limit lower than `count` leaves it as it is.
pub fn reserve_descriptors(count: i32) {
    // F_DUPFD duplicates stdin (or fails) to the lowest free descriptor at or above
    // count - 1; the copy is closed at once. Nothing else is touched.
    if let Ok(high) = fcntl(std::io::stdin(), FcntlArg::F_DUPFD_CLOEXEC(count - 1)) {
        let _ = close(high);
    }
}
