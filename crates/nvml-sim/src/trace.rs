//! `NVML_SIM_TRACE`: names, once each, every entry point a client called that the sim does
//! not model, or answers from a fixed default rather than from the scenario. The list is a
//! map of what the simulated world leaves out, for the client that was traced.
//!
//! `NVML_SIM_TRACE=1` writes to stderr; any other non-empty value except `0` is a file path,
//! appended to (one line per entry point and process, so several clients can share a file).

use std::collections::HashSet;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

pub const TRACE_ENV: &str = "NVML_SIM_TRACE";

/// Why a traced call was not answered from the scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gap {
    /// The sim exports the name but does not model it: NOT_SUPPORTED (a stub).
    NotModelled,
    /// Answered with a fixed value that no scenario key sets.
    Default,
}

impl Gap {
    fn word(self) -> &'static str {
        match self {
            Gap::NotModelled => "not-modelled",
            Gap::Default => "default",
        }
    }
}

enum Sink {
    Off,
    Stderr,
    File(std::path::PathBuf),
}

fn sink() -> &'static Sink {
    static SINK: OnceLock<Sink> = OnceLock::new();
    SINK.get_or_init(|| match std::env::var_os(TRACE_ENV) {
        None => Sink::Off,
        Some(v) if v.is_empty() || v == "0" => Sink::Off,
        Some(v) if v == "1" => Sink::Stderr,
        Some(v) => Sink::File(v.into()),
    })
}

/// Records that `name` was answered without the scenario's say; the first time only.
/// `name` is rendered only when tracing is on (callers pass `format_args!`), so an
/// untraced call costs no allocation.
pub fn gap(name: impl std::fmt::Display, why: Gap) {
    let sink = sink();
    if matches!(sink, Sink::Off) {
        return;
    }
    let name = name.to_string();
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    {
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        if !seen.get_or_insert_with(HashSet::new).insert(name.clone()) {
            return;
        }
    }
    let line = format!("nvml-sim: trace: {name}: {}\n", why.word());
    // A trace that cannot be written is not the client's failure: it is dropped.
    let _ = match sink {
        Sink::Off => Ok(()),
        Sink::Stderr => std::io::stderr().write_all(line.as_bytes()),
        Sink::File(path) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes())),
    };
}
