//! A real terminal for the end-to-end tests: a tmux server on its own socket in a scratch
//! directory, one session running a command, typed into with `send-keys` and read with
//! `capture-pane`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a screen may take to show what a test waits for.
pub const SCREEN_DEADLINE: Duration = Duration::from_secs(20);

/// The one session of a terminal's server.
const SESSION: &str = "term";

/// tmux, or the test fails saying why.
fn tmux_bin() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("tmux"))
        .find(|candidate| candidate.is_file())
        .expect("tmux is not installed: scripts/test installs it (apt-get install tmux)")
}

/// `text` as one word for sh.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// `command` as one line for sh: `env`, the variables it removes and sets, `wrapper`, then
/// its program and arguments.
fn shell_line(command: &Command, wrapper: &[&str]) -> String {
    let mut removed = Vec::new();
    let mut set = Vec::new();
    for (key, value) in command.get_envs() {
        let key = key.to_string_lossy();
        match value {
            Some(value) => set.push(format!("{key}={}", quote(&value.to_string_lossy()))),
            None => removed.push(format!("-u {}", quote(&key))),
        }
    }
    let words = wrapper
        .iter()
        .map(|word| quote(word))
        .chain(std::iter::once(quote(
            &command.get_program().to_string_lossy(),
        )))
        .chain(command.get_args().map(|arg| quote(&arg.to_string_lossy())));
    std::iter::once("env".to_string())
        .chain(removed)
        .chain(set)
        .chain(words)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A tmux server of its own whose one session runs a command in a shell that then says how
/// it exited (`gpuctl exited STATUS`) and stays, so that the screen it left can be read.
/// The server is killed on drop.
pub struct Terminal {
    tmux: PathBuf,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Terminal {
    /// `command` (its program, arguments and environment) in a terminal of `size` (columns,
    /// rows). Extra variables go on `command` (`.env`); the ones it removes are unset.
    pub fn start(command: &Command, size: (u16, u16)) -> Terminal {
        Terminal::start_wrapped(command, size, &[])
    }

    /// [`Terminal::start`], the command run by `wrapper` (a command that execs its
    /// arguments, such as setpriv).
    pub fn start_wrapped(command: &Command, size: (u16, u16), wrapper: &[&str]) -> Terminal {
        let dir = tempfile::tempdir().expect("tempdir");
        let term = Terminal {
            tmux: tmux_bin(),
            socket: dir.path().join("tmux.sock"),
            _dir: dir,
        };
        // The trap keeps the shell through a Ctrl-C sent to the foreground (the command gets
        // SIGINT's default back), so that it still says how the command exited.
        let script = format!(
            "trap : INT; {} ; echo \"gpuctl exited $?\"; exec sleep 600",
            shell_line(command, wrapper)
        );
        let (columns, rows) = (size.0.to_string(), size.1.to_string());
        term.tmux(&[
            "new-session",
            "-d",
            "-s",
            SESSION,
            "-x",
            &columns,
            "-y",
            &rows,
            // As words, tmux runs sh itself rather than through the user's shell: the pane's
            // process is this sh, whose child is the command, whatever $SHELL is.
            "sh",
            "-c",
            &script,
        ]);
        term
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.tmux);
        command
            .arg("-u")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            // UTF-8 for the bars and arrows; not inside the tmux the tests may run in.
            .env("LANG", "C.UTF-8")
            .env_remove("TMUX")
            .stdin(Stdio::null());
        command
    }

    /// `tmux ARGS` on this terminal's server, which must succeed; its output.
    pub fn tmux(&self, args: &[&str]) -> String {
        // No configuration file of this machine.
        let mut all = vec!["-f", "/dev/null"];
        all.extend_from_slice(args);
        let out = self.command(&all).output().expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Keys by tmux's names (`Enter`, `C-c`, `Space`), or text.
    pub fn keys(&self, keys: &[&str]) {
        let mut all = vec!["send-keys", "-t", SESSION];
        all.extend_from_slice(keys);
        self.tmux(&all);
    }

    /// Text typed as it is (no key names).
    pub fn type_text(&self, text: &str) {
        self.tmux(&["send-keys", "-t", SESSION, "-l", text]);
    }

    pub fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", SESSION])
    }

    /// The screen with its colors and attributes as escape sequences.
    pub fn screen_escaped(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-e", "-t", SESSION])
    }

    /// A tmux format (`#{pane_pid}`, `#{alternate_on}`) expanded for the session.
    pub fn display(&self, format: &str) -> String {
        self.tmux(&["display-message", "-p", "-t", SESSION, format])
            .trim()
            .to_string()
    }

    /// The window resized to `size` (columns, rows), as a user's terminal would be.
    pub fn resize(&self, size: (u16, u16)) {
        let (columns, rows) = (size.0.to_string(), size.1.to_string());
        self.tmux(&["resize-window", "-t", SESSION, "-x", &columns, "-y", &rows]);
    }

    /// Polls the screen until `done` holds on a whole frame; fails with the last screen after
    /// the deadline. A capture can land while the program is still drawing (a row's pid
    /// written, the rest of it not yet), so a screen counts only once a second capture, a
    /// moment later, shows the same.
    pub fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if done(&screen) && {
                std::thread::sleep(Duration::from_millis(20));
                self.screen() == screen
            } {
                return screen;
            }
            assert!(
                start.elapsed() < SCREEN_DEADLINE,
                "the screen did not show {what} within {SCREEN_DEADLINE:?}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn wait_text(&self, text: &str) -> String {
        self.wait_for(&format!("'{text}'"), |s| s.contains(text))
    }

    /// The command's pid: the child of the pane's shell (env and the wrapper exec it).
    pub fn child_pid(&self) -> u32 {
        let shell: u32 = self.display("#{pane_pid}").parse().expect("pane pid");
        let mut found = None;
        crate::util::wait_until(Duration::from_secs(10), || {
            found = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
                .ok()
                .and_then(|c| c.split_whitespace().next()?.parse().ok());
            found.is_some()
        });
        found.unwrap()
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.command(&["kill-server"]).output();
    }
}
