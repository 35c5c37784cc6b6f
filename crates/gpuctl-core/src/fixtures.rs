//! Fixtures for unit tests: GPU processes, GPUs and snapshots, built with only the facts a
//! test is about written out. Core's tests use them, and the crates above core's through
//! its `fixtures` feature (a dev-dependency feature: never in a build that ships). A test
//! whose point is one particular literal keeps its literal; these are for the plain ones.
//!
//! ```ignore
//! let p = fixtures::process(10).used_gib(2).confirmed().user("alice").build();
//! let snapshot = fixtures::one_gpu(vec![p]);
//! ```

use std::sync::Arc;

use crate::host::{HostProcess, ProcState};
use crate::owner::Owner;
use crate::snapshot::{GpuProcess, GpuSnapshot, Memory, ProcessType, Snapshot};

/// A compute process `pid` on a GPU: no memory or SM figure, in no MIG instance, and host
/// facts /proc did not confirm (reason "test") until the test gives them.
pub fn process(pid: u32) -> ProcessFixture {
    ProcessFixture {
        pid,
        used_bytes: None,
        sm_util_pct: None,
        host: HostProcess::unconfirmed("test"),
    }
}

/// A [`GpuProcess`] being built; [`ProcessFixture::build`] ends it.
pub struct ProcessFixture {
    pid: u32,
    used_bytes: Option<u64>,
    sm_util_pct: Option<u32>,
    host: HostProcess,
}

impl ProcessFixture {
    pub fn used_bytes(mut self, bytes: Option<u64>) -> Self {
        self.used_bytes = bytes;
        self
    }

    pub fn used_mib(self, mib: u64) -> Self {
        self.used_bytes(Some(mib << 20))
    }

    pub fn used_gib(self, gib: u64) -> Self {
        self.used_bytes(Some(gib << 30))
    }

    /// Its SM utilization: a figure, or `None` where the driver reports none.
    pub fn sm_pct(mut self, pct: impl Into<Option<u32>>) -> Self {
        self.sm_util_pct = pct.into();
        self
    }

    /// /proc confirmed it: its facts are its own (no unconfirmed reason).
    pub fn confirmed(mut self) -> Self {
        self.host.confirmed = true;
        self.host.unconfirmed_reason = None;
        self
    }

    pub fn user(mut self, user: &str) -> Self {
        self.host.user = Some(user.into());
        self
    }

    pub fn uid(mut self, uid: u32) -> Self {
        self.host.uid = Some(uid);
        self
    }

    pub fn state(mut self, state: ProcState) -> Self {
        self.host.state = Some(state);
        self
    }

    pub fn ppid(mut self, ppid: u32) -> Self {
        self.host.ppid = Some(ppid);
        self
    }

    /// Its start time, in clock ticks after boot (with the pid, its identity).
    pub fn started(mut self, ticks: u64) -> Self {
        self.host.start_ticks = Some(ticks);
        self
    }

    pub fn owner(mut self, owner: Option<Owner>) -> Self {
        self.host.owner = owner;
        self
    }

    /// Any other host fact, set by `set`.
    pub fn host(mut self, set: impl FnOnce(&mut HostProcess)) -> Self {
        set(&mut self.host);
        self
    }

    pub fn build(self) -> GpuProcess {
        GpuProcess {
            pid: self.pid,
            used_bytes: self.used_bytes,
            kind: ProcessType::Compute,
            sm_util_pct: self.sm_util_pct,
            idle: None,
            reclaimable: None,
            gpu_instance_id: None,
            compute_instance_id: None,
            mps: None,
            host: Arc::new(self.host),
        }
    }
}

/// GPU `index`, nothing read of it but `processes`.
pub fn gpu(index: u32, processes: Vec<GpuProcess>) -> GpuSnapshot {
    GpuSnapshot {
        processes,
        ..GpuSnapshot::unread(index)
    }
}

/// A snapshot of one GPU, 0, with `processes` on it.
pub fn one_gpu(processes: Vec<GpuProcess>) -> Snapshot {
    Snapshot::of(vec![gpu(0, processes)])
}

/// A GPU's memory: `used_bytes` of `total_bytes`, the rest free, none reserved, and all of
/// it accounted for by its processes.
pub fn memory(total_bytes: u64, used_bytes: u64) -> Memory {
    Memory {
        total_bytes,
        used_bytes,
        free_bytes: total_bytes - used_bytes,
        reserved_bytes: 0,
        unattributed_bytes: Some(0),
    }
}
