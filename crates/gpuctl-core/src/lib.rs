//! gpuctl-core: who holds GPU memory on this machine, and how to get it back.
//!
//! Everything flows one way: NVML and /proc facts are joined into a [`snapshot::Snapshot`];
//! later stages classify, select, plan, act and verify on top of it. This crate knows nothing
//! of terminals, argument parsing or systemd.

pub mod act;
pub mod cardset;
pub mod classify;
pub mod config;
pub mod cuda;
pub mod error;
pub mod files;
pub mod host;
pub mod nvml;
pub mod owner;
pub mod pidmap;
pub mod reclaim;
pub mod settings;
pub mod snapshot;
pub mod sys;
pub mod units;

pub use error::{CoreError, Result};
pub use snapshot::{Snapshot, SnapshotOptions};
