//! The command-line definition of gpuctl, shared by the binary and by xtask (which generates
//! man pages and shell completions from it, so they never drift from `--help`).

pub mod cli;
