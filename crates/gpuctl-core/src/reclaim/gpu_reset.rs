//! `reset --gpu-reset`: the vendor's GPU reset, only when it is safe. A GPU that any process
//! still uses, listed by NVML or holding its device file, is refused, naming each holder.
//! With none, the GPU is reset through NVML where the driver offers it (drain, remove from
//! the driver's view, rediscover: a PCIe remove and rescan), else with `nvidia-smi
//! --gpu-reset`. A reset clears pending row remaps and page retirements and restarts the
//! volatile ECC counters; gpuctl also acknowledges the GPU's Xids up to then, so the health
//! verdict starts over.

use std::process::Command;

use super::Session;
use crate::config;
use crate::error::{CoreError, Result};
use crate::health::log::Acks;
use crate::nvml::Place;
pub use crate::report::{GpuReset, GpuResetOutcome};
use crate::snapshot::{GpuSnapshot, HolderScan, SnapshotOptions};

/// Which GPUs to reset: named, never implied.
#[derive(Debug, Clone, Default)]
pub struct GpuResetRequest {
    pub gpus: Vec<String>,
    pub dry_run: bool,
}

/// Resets the named GPUs that nothing holds.
pub fn gpu_reset(session: &Session, request: &GpuResetRequest) -> Result<Vec<GpuReset>> {
    if request.gpus.is_empty() {
        return Err(CoreError::Usage(
            "--gpu-reset resets only the GPUs named: give --gpu GPU".into(),
        ));
    }
    let places = session.places(&request.gpus)?.unwrap_or_default();
    let mut results = Vec::new();
    for place in places.iter().filter(|p| p.gpu_instance.is_some()) {
        results.push(GpuReset {
            index: place.gpu,
            uuid: None,
            pci_bus_id: None,
            outcome: GpuResetOutcome::Skipped {
                why: format!(
                    "GPU {place} is a MIG instance: a reset is the whole GPU's, its other \
                     instances' too (name GPU {} to reset it)",
                    place.gpu
                ),
            },
        });
    }
    let indices = Place::gpus(
        &places
            .iter()
            .filter(|p| p.gpu_instance.is_none())
            .copied()
            .collect::<Vec<_>>(),
    );
    if indices.is_empty() {
        return Ok(results);
    }
    // Every holder counts: NVML's processes and the device files' (any size held).
    let options = SnapshotOptions {
        holders: Some(HolderScan {
            dev_dir: config::device_dir(Some(session.loaded()))?,
            above_unattributed: None,
        }),
        ..SnapshotOptions::info(Some(indices.clone()))
    };
    let snapshot = session.take(&mut session.plain_reader(options))?;
    let via_nvml = nvml_reset_offered(session);
    let via = if via_nvml { "nvml" } else { "nvidia-smi" }.to_string();
    for gpu in &snapshot.devices {
        let holders = holders(gpu);
        let outcome = if !holders.is_empty() {
            GpuResetOutcome::Refused { holders }
        } else if request.dry_run {
            GpuResetOutcome::WouldReset { via: via.clone() }
        } else {
            match reset_one(session, gpu, via_nvml) {
                Ok(()) => {
                    acknowledge(session, gpu);
                    GpuResetOutcome::Done { via: via.clone() }
                }
                Err(error) => GpuResetOutcome::Failed { error },
            }
        };
        results.push(GpuReset {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            pci_bus_id: gpu.pci_bus_id.clone(),
            outcome,
        });
    }
    results.sort_by_key(|r| r.index);
    Ok(results)
}

/// Whether any reset failed or was refused.
pub fn gpu_reset_failed(results: &[GpuReset]) -> bool {
    results.iter().any(|r| r.outcome.is_failure())
}

/// Each process on the GPU: listed by NVML, or holding its device file (gpuctl itself
/// excepted: NVML opens the files in this process too).
fn holders(gpu: &GpuSnapshot) -> Vec<String> {
    let own = std::process::id();
    let name = |pid: u32, host: &crate::host::HostProcess| {
        let user = host.user_name().unwrap_or_else(|| "?".into());
        let command = host
            .command
            .clone()
            .or_else(|| host.comm.clone())
            .unwrap_or_else(|| "?".into());
        format!("pid {pid} ({user}, {command})")
    };
    let mut out: Vec<String> = gpu
        .processes
        .iter()
        .filter(|p| p.pid != own)
        .map(|p| name(p.pid, &p.host))
        .collect();
    for holder in gpu.holders.iter().flatten().filter(|h| h.pid != own) {
        out.push(format!(
            "{} holding its device file",
            name(holder.pid, &holder.host)
        ));
    }
    if let Some(why) = &gpu.holders_not_scanned {
        out.push(format!("unknown device-file holders ({why})"));
    }
    out
}

const SUCCESS: u32 = 0;
const NOT_SUPPORTED: u32 = 3;
const FUNCTION_NOT_FOUND: u32 = 13;

/// Whether the driver's NVML has the drain and remove calls (a real driver answers them for
/// root on data-center GPUs).
fn nvml_reset_offered(session: &Session) -> bool {
    session.nvml().is_some_and(|gpus| {
        let lib = gpus.nvml().lib();
        lib.nvmlDeviceModifyDrainState.is_ok()
            && lib.nvmlDeviceRemoveGpu_v2.is_ok()
            && lib.nvmlDeviceDiscoverGpus.is_ok()
    })
}

fn reset_one(
    session: &Session,
    gpu: &GpuSnapshot,
    via_nvml: bool,
) -> std::result::Result<(), String> {
    let bus = gpu
        .pci_bus_id
        .clone()
        .ok_or_else(|| "its PCI bus id cannot be read".to_string())?;
    if via_nvml {
        match nvml_reset(session, gpu.index) {
            Ok(()) => return Ok(()),
            // Not offered for this GPU after all: the documented tool.
            Err(code) if code == NOT_SUPPORTED || code == FUNCTION_NOT_FOUND => {}
            Err(code) => {
                let why = nvml_wrapper::error::nvml_try(code).err().map_or_else(
                    || format!("NVML error {code}"),
                    |e| crate::nvml::describe(&e),
                );
                return Err(format!("NVML's reset failed: {why}"));
            }
        }
    }
    let out = Command::new("nvidia-smi")
        .args(["--gpu-reset", "-i", &bus])
        .output()
        .map_err(|e| format!("cannot run nvidia-smi --gpu-reset: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "nvidia-smi --gpu-reset -i {bus}: {}",
            text.split_whitespace().collect::<Vec<_>>().join(" ")
        ))
    }
}

/// Drain, remove (keeping the PCIe link), rediscover: NVML's reset of one GPU.
fn nvml_reset(session: &Session, index: u32) -> std::result::Result<(), u32> {
    let nvml = session.nvml().ok_or(NOT_SUPPORTED)?.nvml();
    let lib = nvml.lib();
    let device = nvml.device_by_index(index).map_err(|_| NOT_SUPPORTED)?;
    let pci = device.pci_info().map_err(|_| NOT_SUPPORTED)?;
    let mut raw: nvml_wrapper_sys::bindings::nvmlPciInfo_t =
        TryInto::try_into(pci).map_err(|_| NOT_SUPPORTED)?;
    let (Ok(drain), Ok(remove), Ok(discover)) = (
        lib.nvmlDeviceModifyDrainState.as_ref(),
        lib.nvmlDeviceRemoveGpu_v2.as_ref(),
        lib.nvmlDeviceDiscoverGpus.as_ref(),
    ) else {
        return Err(FUNCTION_NOT_FOUND);
    };
    const ENABLE: u32 = 1;
    const DISABLE: u32 = 0;
    const DETACH_GPU_KEEP: u32 = 0;
    const PCIE_LINK_KEEP: u32 = 0;
    // SAFETY: a local nvmlPciInfo_t made from the device's own PCI info, valid for each call.
    unsafe {
        let code = drain(&mut raw, ENABLE);
        if code != SUCCESS {
            return Err(code);
        }
        let code = remove(&mut raw, DETACH_GPU_KEEP, PCIE_LINK_KEEP);
        if code != SUCCESS {
            // Back to serving jobs: nothing was reset.
            drain(&mut raw, DISABLE);
            return Err(code);
        }
        let code = discover(&mut raw);
        if code != SUCCESS {
            return Err(code);
        }
    }
    Ok(())
}

/// The GPU's Xids up to the reset are history now.
fn acknowledge(session: &Session, gpu: &GpuSnapshot) {
    let (Some(dir), Some(uuid)) = (
        config::watchdog_state_dir(Some(session.loaded())),
        gpu.uuid.as_deref(),
    ) else {
        return;
    };
    let _ = Acks::acknowledge(&dir, uuid, crate::units::unix_whole_seconds());
}
