//! gpuctl-core: who holds GPU memory on this machine, and how to get it back.
//!
//! Everything flows one way, one module a stage (see [`reclaim`] for the whole road):
//! NVML and /proc facts are joined into a [`snapshot::Snapshot`]; [`classify`] turns facts
//! into findings with reasons; [`select`] picks targets; [`plan`] guards them; [`act`]
//! signals by identity; [`verify`] checks through NVML that memory came back; [`report`]
//! holds the documents. [`protect`] says which processes are the programs never signalled. [`sys`] is the bottom layer of Linux primitives under them all.
//! This crate knows nothing of terminals, argument parsing or systemd.

pub mod act;
pub mod cardset;
pub mod checkup;
pub mod classify;
pub mod config;
pub mod cri;
pub mod error;
pub mod exit;
pub mod failure;
pub mod files;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod health;
pub mod host;
pub mod info;
pub mod lease;
pub mod mps;
pub mod nvml;
pub mod owner;
pub mod pick;
pub mod pidmap;
pub mod plan;
pub mod protect;
pub mod reclaim;
pub mod report;
pub mod runfile;
pub mod select;
pub mod serve;
pub mod service;
pub mod session;
pub mod settings;
pub mod snapshot;
pub mod supervise;
pub mod sys;
pub mod text;
pub mod units;
pub mod verify;
pub mod xid_events;

pub use error::{CoreError, Result};
pub use snapshot::{Snapshot, SnapshotOptions};
