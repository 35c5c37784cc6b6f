//! The NVML backend: loads libnvidia-ml (or nvml-sim) at run time, once per process.

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use crate::error::{CoreError, Result};

/// Names the NVML library to load instead of the system's `libnvidia-ml.so.1`.
pub const LIB_ENV: &str = "GPUCTL_NVML_LIB";
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// The path or soname of the NVML library this process loads.
pub fn library_path() -> String {
    std::env::var(LIB_ENV)
        .ok()
        .filter(|path| !path.is_empty())
        .unwrap_or_else(|| DEFAULT_LIB.to_string())
}

/// An initialised NVML library. Hold one for the life of the process (or until the driver
/// goes away); NVML is shut down when it is dropped.
pub struct Gpus {
    nvml: Nvml,
    library: String,
}

impl std::fmt::Debug for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpus")
            .field("library", &self.library)
            .finish()
    }
}

impl Gpus {
    /// Loads and initialises NVML from [`library_path`].
    pub fn open() -> Result<Gpus> {
        Gpus::open_library(&library_path())
    }

    pub fn open_library(library: &str) -> Result<Gpus> {
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new(library))
            .init()
            .map_err(|error| unavailable(library, error))?;
        Ok(Gpus {
            nvml,
            library: library.to_string(),
        })
    }

    pub(crate) fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    pub fn count(&self) -> Result<u32> {
        self.nvml.device_count().map_err(|error| CoreError::Nvml {
            call: "nvmlDeviceGetCount",
            reason: describe(&error),
        })
    }

    /// The UUID of each GPU, by index; `None` for a GPU that cannot be queried (lost).
    pub fn uuids(&self) -> Result<Vec<Option<String>>> {
        let count = self.count()?;
        Ok((0..count)
            .map(|index| {
                self.nvml
                    .device_by_index(index)
                    .and_then(|device| device.uuid())
                    .ok()
            })
            .collect())
    }

    /// The GPU memory NVML lists process `pid` as holding, summed over every GPU (a process
    /// with compute and graphics contexts is listed twice with the same figure: counted
    /// once); `None` where it is listed on none, or its figure is not reported. Only NVML is
    /// asked: no /proc read, as a process asking about itself needs none.
    pub fn used_by(&self, pid: u32) -> Result<Option<u64>> {
        let mut total: Option<u64> = None;
        for index in 0..self.count()? {
            let Ok(device) = self.nvml.device_by_index(index) else {
                continue;
            };
            let lists = [
                device.running_compute_processes(),
                device.running_graphics_processes(),
            ];
            let used = lists
                .into_iter()
                .flat_map(|list| list.unwrap_or_default())
                .filter(|process| process.pid == pid)
                .filter_map(|process| match process.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(bytes) => Some(bytes),
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                })
                .max();
            if let Some(used) = used {
                total = Some(total.unwrap_or(0) + used);
            }
        }
        Ok(total)
    }

    /// Resolves `--gpu` selectors (an index, a UUID or a unique UUID prefix, or a PCI bus id)
    /// to sorted, distinct indices. An empty list selects every GPU.
    pub fn resolve(&self, selectors: &[String]) -> Result<Vec<u32>> {
        let uuids = self.uuids()?;
        let buses: Vec<Option<String>> = (0..uuids.len() as u32)
            .map(|index| {
                self.nvml
                    .device_by_index(index)
                    .and_then(|device| device.pci_info())
                    .ok()
                    .map(|pci| pci.bus_id)
            })
            .collect();
        resolve_selectors(selectors, &uuids, &buses)
    }
}

/// Pure part of [`Gpus::resolve`], so the matching rules are testable without NVML.
pub fn resolve_selectors(
    selectors: &[String],
    uuids: &[Option<String>],
    buses: &[Option<String>],
) -> Result<Vec<u32>> {
    if selectors.is_empty() {
        return Ok((0..uuids.len() as u32).collect());
    }
    let mut chosen = Vec::new();
    for selector in selectors {
        let wanted = selector.trim();
        let matches: Vec<u32> = if let Ok(index) = wanted.parse::<u32>() {
            (index < uuids.len() as u32)
                .then_some(index)
                .into_iter()
                .collect()
        } else {
            let lower = wanted.to_ascii_lowercase();
            let by_uuid: Vec<u32> = uuids
                .iter()
                .enumerate()
                .filter(|(_, uuid)| {
                    uuid.as_deref().is_some_and(|uuid| {
                        let uuid = uuid.to_ascii_lowercase();
                        // "GPU-" may be left off; a prefix of at least 4 characters may stand
                        // for the whole UUID when it is unique.
                        let bare = uuid.strip_prefix("gpu-").unwrap_or(&uuid);
                        let lower_bare = lower.strip_prefix("gpu-").unwrap_or(&lower);
                        lower_bare.len() >= 4 && bare.starts_with(lower_bare)
                    })
                })
                .map(|(index, _)| index as u32)
                .collect();
            if by_uuid.is_empty() {
                buses
                    .iter()
                    .enumerate()
                    .filter(|(_, bus)| bus.as_deref().is_some_and(|bus| same_bus_id(bus, wanted)))
                    .map(|(index, _)| index as u32)
                    .collect()
            } else {
                by_uuid
            }
        };
        match matches.as_slice() {
            [index] => chosen.push(*index),
            [] => {
                return Err(CoreError::GpuSelector(format!(
                    "no GPU matches '{wanted}'; {}",
                    present(uuids)
                )));
            }
            _ => {
                return Err(CoreError::GpuSelector(format!(
                    "'{wanted}' matches several GPUs ({}); give more of the UUID",
                    matches
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
    }
    chosen.sort_unstable();
    chosen.dedup();
    Ok(chosen)
}

/// PCI bus ids compare without case and with either a 4- or 8-digit domain.
fn same_bus_id(reported: &str, wanted: &str) -> bool {
    fn normal(id: &str) -> Option<String> {
        let id = id.to_ascii_lowercase();
        let (domain, rest) = id.split_once(':')?;
        let domain = u32::from_str_radix(domain, 16).ok()?;
        Some(format!("{domain:08x}:{rest}"))
    }
    normal(reported).is_some_and(|r| Some(r) == normal(wanted))
}

fn present(uuids: &[Option<String>]) -> String {
    if uuids.is_empty() {
        return "this machine has no GPUs".to_string();
    }
    let list = uuids
        .iter()
        .enumerate()
        .map(|(index, uuid)| match uuid {
            Some(uuid) => format!("{index} ({uuid})"),
            None => format!("{index} (unavailable)"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!("GPUs present: {list}")
}

fn unavailable(library: &str, error: NvmlError) -> CoreError {
    let (reason, hint) = match &error {
        NvmlError::LibloadingError(cause) => (
            // The loader says why: not found, wrong architecture, not a shared object.
            {
                let detail = std::error::Error::source(cause)
                    .map_or_else(|| cause.to_string(), |s| s.to_string());
                let detail = detail
                    .strip_prefix(&format!("{library}: "))
                    .unwrap_or(&detail)
                    .to_string();
                format!("the NVIDIA management library could not be loaded: {detail}")
            },
            "Check that the NVIDIA driver is installed (ldconfig -p | grep libnvidia-ml), or set GPUCTL_NVML_LIB to the library's path.",
        ),
        NvmlError::DriverNotLoaded => (
            "the NVIDIA kernel driver is not loaded".to_string(),
            "Check `lsmod | grep nvidia` and `dmesg | grep -i nvrm`.",
        ),
        NvmlError::NoPermission => (
            "no permission to talk to the NVIDIA driver".to_string(),
            "Check the permissions of /dev/nvidiactl and /dev/nvidia*.",
        ),
        NvmlError::LibRmVersionMismatch => (
            "the NVML library and the kernel driver are different versions".to_string(),
            "A driver upgrade is half done: reload the nvidia modules or reboot.",
        ),
        other => (
            describe(other),
            "Check that the NVIDIA driver works (nvidia-smi).",
        ),
    };
    CoreError::NvmlUnavailable {
        library: library.to_string(),
        reason,
        hint,
    }
}

/// One line for an NVML error, in NVIDIA's words where it has them.
pub fn describe(error: &NvmlError) -> String {
    match error {
        NvmlError::GpuLost => "GPU is lost".to_string(),
        NvmlError::NotSupported => "not supported".to_string(),
        NvmlError::NoPermission => "insufficient permissions".to_string(),
        NvmlError::FailedToLoadSymbol(symbol) => {
            format!("the driver's NVML lacks a function ({symbol})")
        }
        other => other.to_string().replace('\n', " "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids() -> Vec<Option<String>> {
        vec![
            Some("GPU-0b6c1d2e-aaaa-bbbb-cccc-000000000000".into()),
            Some("GPU-0b6c9999-aaaa-bbbb-cccc-000000000001".into()),
            None,
        ]
    }

    fn buses() -> Vec<Option<String>> {
        vec![
            Some("00000000:18:00.0".into()),
            Some("00000000:2A:00.0".into()),
            None,
        ]
    }

    fn resolve(selectors: &[&str]) -> Result<Vec<u32>> {
        let selectors: Vec<String> = selectors.iter().map(|s| s.to_string()).collect();
        resolve_selectors(&selectors, &uuids(), &buses())
    }

    #[test]
    fn selects_by_index_uuid_prefix_and_bus() {
        assert_eq!(resolve(&[]).unwrap(), vec![0, 1, 2]);
        assert_eq!(resolve(&["2", "0", "0"]).unwrap(), vec![0, 2]);
        assert_eq!(
            resolve(&["GPU-0b6c1d2e-aaaa-bbbb-cccc-000000000000"]).unwrap(),
            vec![0]
        );
        assert_eq!(resolve(&["gpu-0B6C99"]).unwrap(), vec![1]);
        assert_eq!(resolve(&["0b6c1d"]).unwrap(), vec![0]);
        assert_eq!(resolve(&["0000:2a:00.0"]).unwrap(), vec![1]);
    }

    #[test]
    fn bad_selectors_name_what_exists() {
        let message = resolve(&["7"]).unwrap_err().to_string();
        assert!(message.contains("no GPU matches '7'"), "{message}");
        assert!(message.contains("0 (GPU-0b6c1d2e"), "{message}");
        assert!(message.contains("2 (unavailable)"), "{message}");
        let ambiguous = resolve(&["GPU-0b6c"]).unwrap_err().to_string();
        assert!(
            ambiguous.contains("matches several GPUs (0, 1)"),
            "{ambiguous}"
        );
        // Too short to stand for a UUID, and not a number.
        assert!(resolve(&["0b"]).is_err());
        assert!(resolve(&["-1"]).is_err());
    }

    #[test]
    fn no_gpus_says_so() {
        let message = resolve_selectors(&["0".into()], &[], &[])
            .unwrap_err()
            .to_string();
        assert!(message.contains("this machine has no GPUs"), "{message}");
    }
}
