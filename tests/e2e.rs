//! End-to-end tests: the real binaries, against nvml-sim, with real processes.

mod terminal;
mod util;

mod container;
mod docker;
mod exit_codes;
mod guide_examples;
mod health;
mod holders;
mod hostile;
mod hostile_deadline;
mod hostile_lease;
mod hostile_misc;
mod hostile_owner;
mod hostile_protect;
mod hostile_reuse;
mod idle;
mod info;
mod kill_clear;
mod kubernetes;
mod mig;
mod mps;
mod nvidia_smi;
mod output;
mod run;
mod schema;
mod settings;
mod slurm;
mod top;
mod watchdog;
mod watchdog_health;
