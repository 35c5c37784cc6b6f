//! Resource limits.

/// How many files a long-running reader may keep open for itself: a quarter of the soft
/// open-file limit (at most 16384), so the program keeps plenty for everything else.
pub fn open_file_budget() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur as usize
    } else {
        1024
    };
    (soft / 4).min(16384)
}
