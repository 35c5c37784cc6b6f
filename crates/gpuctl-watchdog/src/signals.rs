//! SIGTERM, SIGINT and SIGHUP as flags, through signal-hook: each signal sets its flag, then
//! writes one byte to a self-pipe (a socket pair) whose read end the daemon's sleep blocks on,
//! so a signal wakes it at once.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);
/// The read end of the self-pipe, once the handlers are installed.
static WAKE: OnceLock<UnixStream> = OnceLock::new();

/// Installs the handlers. Call once, before any other thread starts; a second call does
/// nothing.
pub fn install() -> std::io::Result<()> {
    if WAKE.get().is_some() {
        return Ok(());
    }
    let (read, write) = UnixStream::pair()?;
    for (signal, flag) in [(SIGTERM, &STOP), (SIGINT, &STOP), (SIGHUP, &RELOAD)] {
        // The flag first, then the byte: a woken sleeper always finds the flag set.
        signal_hook::flag::register(signal, flag)?;
        signal_hook::low_level::pipe::register(signal, write.try_clone()?)?;
    }
    let _ = WAKE.set(read);
    Ok(())
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Whether SIGHUP came since the last call.
pub fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}

/// Sleeps up to `limit`, waking early when a signal arrives.
pub fn sleep(limit: Duration) {
    let Some(mut wake) = WAKE.get() else {
        std::thread::sleep(limit);
        return;
    };
    if limit.is_zero() {
        return;
    }
    // A blocking read with a timeout: it returns with the bytes of the signals that came
    // (up to 64 at once, more than the three signals can queue), or at the timeout. The
    // timeout has microsecond resolution, so a short remainder never turns into a spin.
    if wake.set_read_timeout(Some(limit)).is_err() {
        std::thread::sleep(limit);
        return;
    }
    let mut buffer = [0u8; 64];
    let _ = wake.read(&mut buffer);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_signal_cuts_the_sleep_short_and_sets_its_flag() {
        install().unwrap();
        install().unwrap();
        assert!(!take_reload());
        let raiser = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            signal_hook::low_level::raise(SIGHUP).unwrap();
        });
        let start = Instant::now();
        sleep(Duration::from_secs(20));
        let slept = start.elapsed();
        raiser.join().unwrap();
        assert!(slept < Duration::from_secs(5), "slept {slept:?}");
        assert!(take_reload());
        assert!(!take_reload(), "taken once");
        assert!(!stop_requested());

        // Without a signal, the sleep lasts its limit.
        let start = Instant::now();
        sleep(Duration::from_millis(150));
        assert!(
            start.elapsed() >= Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
        sleep(Duration::ZERO);
    }
}
