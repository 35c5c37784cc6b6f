//! The terminal, taken over and given back on every way out: a normal quit, an error, a
//! panic (the hook restores before the message is printed, so it lands on the normal
//! screen), and SIGTERM, SIGHUP or SIGINT sent from outside (restored, then the signal's
//! default action, so the parent sees how it ended).

use std::io::{self, Stdout};
use std::sync::Arc;
use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossterm::cursor::{Hide, Show};
use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

/// The signals that end the view from outside.
const ENDING: [i32; 3] = [libc::SIGTERM, libc::SIGHUP, libc::SIGINT];

pub struct Screen {
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
    /// The last ending signal received, 0 for none.
    signalled: Arc<AtomicUsize>,
}

impl Screen {
    pub fn enter() -> io::Result<Screen> {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        let signalled = Arc::new(AtomicUsize::new(0));
        for signal in ENDING {
            signal_hook::flag::register_usize(signal, Arc::clone(&signalled), signal as usize)?;
        }
        enable_raw_mode()?;
        let mut out = io::stdout();
        if let Err(error) = execute!(out, EnterAlternateScreen, EnableMouseCapture, Hide) {
            restore();
            return Err(error);
        }
        let terminal = match Terminal::new(CrosstermBackend::new(out)) {
            Ok(terminal) => terminal,
            Err(error) => {
                restore();
                return Err(error);
            }
        };
        Ok(Screen {
            terminal,
            signalled,
        })
    }

    /// The ending signal received since the screen was taken, if any.
    pub fn signalled(&self) -> Option<i32> {
        match self.signalled.load(Ordering::SeqCst) {
            0 => None,
            signal => Some(signal as i32),
        }
    }

    /// Records a hangup found by [`hung_up`], so that the view ends as SIGHUP ends it.
    pub fn hang_up(&self) {
        self.signalled
            .store(libc::SIGHUP as usize, Ordering::SeqCst);
    }

    /// Gives the terminal back, then ends the process as `signal` would have.
    pub fn end_by(self, signal: i32) -> ! {
        drop(self);
        let _ = signal_hook::low_level::emulate_default_handler(signal);
        // Not ended by the default action (it was ignored when gpuctl started).
        std::process::exit(128 + signal);
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves the alternate screen, shows the cursor, stops mouse reports and raw mode. Safe
/// to run more than once.
fn restore() {
    let mut out = io::stdout();
    let _ = execute!(out, DisableMouseCapture, LeaveAlternateScreen, Show);
    let _ = disable_raw_mode();
}

/// Whether the terminal on stdin has hung up: a read would return end-of-file forever.
pub fn hung_up() -> bool {
    let mut stdin = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, count 1, no wait; poll only writes its revents.
    let ready = unsafe { libc::poll(&mut stdin, 1, 0) };
    ready > 0 && stdin.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}
