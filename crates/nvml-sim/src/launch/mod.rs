//! The launcher behind `nvml-sim run`: it starts the scenario's stand-in processes
//! (`standin`, `spawn`), as root each under its scenario user (`users`) and in its scenario
//! cgroup (`cgroups`), writes the scenario with their real pids (`resolve`) and runs COMMAND
//! against the simulated library (`run`).

pub mod cgroups;
mod resolve;
mod run;
mod spawn;
pub mod standin;
pub mod users;

pub use run::run;

/// The clock's nanoseconds within the second: with the pid, a name no other launcher takes.
fn clock_nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}
