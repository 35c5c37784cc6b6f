//! The command-line definition of gpuctl-watchdog, shared by the daemon and by xtask (which
//! generates the gpuctl-watchdog(8) man page from it, so it never drifts from `--help`).

pub mod cli;
