//! A stand-in GPU process for end-to-end tests. Modes (env GPUCTL_TESTPROC_MODE, so that the
//! command line is exactly what the test gave):
//!   sleep          sleep until killed (default)
//!   zombie-leader  the main thread exits while a second thread lives on, so /proc shows the
//!                  leader as a zombie while the process still holds its (simulated) context
//! Tests give it a realistic argv; the arguments are not read.

use std::time::Duration;

fn main() {
    match std::env::var("GPUCTL_TESTPROC_MODE").as_deref() {
        Ok("zombie-leader") => {
            std::thread::spawn(|| sleep_forever());
            std::thread::sleep(Duration::from_millis(50));
            // SYS_exit ends only the calling thread (exit(3) would end the whole group).
            unsafe { libc::syscall(libc::SYS_exit, 0) };
            unreachable!("SYS_exit returned");
        }
        _ => sleep_forever(),
    }
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
