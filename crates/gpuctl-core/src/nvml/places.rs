//! What `--gpu` selectors name: whole GPUs by index, UUID (or a unique prefix) or PCI bus
//! id, and MIG instances by their UUID or `GPU/GI`; the UUID and bus tables are read once.

use super::{Gpus, describe};
use crate::error::{CoreError, Result};

impl Gpus {
    /// Resolves `--gpu` selectors (an index, a UUID or a unique UUID prefix, or a PCI bus id)
    /// to sorted, distinct indices. An empty list selects every GPU.
    pub fn resolve(&self, selectors: &[String]) -> Result<Vec<u32>> {
        let tables = self.tables()?;
        resolve_selectors(selectors, &tables.uuids, &tables.buses)
    }

    /// Every GPU's UUID and PCI bus id, by index (`None` where a GPU cannot be queried):
    /// what whole-GPU selectors are matched against.
    pub fn tables(&self) -> Result<GpuTables> {
        let uuids = self.uuids()?;
        let buses: Vec<Option<String>> = self
            .per_gpu(|nvml, index| {
                nvml.device_by_index(index)
                    .and_then(|device| device.pci_info())
                    .ok()
                    .map(|pci| pci.bus_id)
            })?
            .into_iter()
            .map(Option::flatten)
            .collect();
        Ok(GpuTables { uuids, buses })
    }
}

/// Every GPU's UUID and PCI bus id, by index, read once for any number of selectors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuTables {
    pub uuids: Vec<Option<String>>,
    pub buses: Vec<Option<String>>,
}

/// A GPU, or one MIG GPU instance of it, as a `--gpu` selector names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    pub gpu: u32,
    /// The MIG GPU instance id; `None`: the whole GPU.
    pub gpu_instance: Option<u32>,
}

impl Place {
    pub fn whole(gpu: u32) -> Place {
        Place {
            gpu,
            gpu_instance: None,
        }
    }

    /// The GPUs `places` lie on, each once, in order.
    pub fn gpus(places: &[Place]) -> Vec<u32> {
        let mut gpus: Vec<u32> = places.iter().map(|p| p.gpu).collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }

    /// Whether a process on GPU `gpu`, in instance `gpu_instance` there, is in this place.
    pub fn holds(&self, gpu: u32, gpu_instance: Option<u32>) -> bool {
        self.gpu == gpu && (self.gpu_instance.is_none() || self.gpu_instance == gpu_instance)
    }
}

/// As a `--gpu` selector names it: `3`, or `3/9` for GPU 3's GPU instance 9.
impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.gpu_instance {
            Some(instance) => write!(f, "{}/{instance}", self.gpu),
            None => write!(f, "{}", self.gpu),
        }
    }
}

impl Gpus {
    /// What `--gpu` selectors name: whole GPUs (index, UUID or its prefix, bus id, as
    /// [`Gpus::resolve`]) or MIG instances: a MIG device's UUID (`MIG-…`, as
    /// CUDA_VISIBLE_DEVICES and Slurm give them), or `GPU/GI` (`0/9`: GPU 0's GPU instance 9,
    /// the ids `nvidia-smi -L` and the MIG devices table show). Anything else naming an
    /// instance (`0:9`, `0.9`, a MIG device index) is refused with the forms that work.
    /// The UUID and bus tables are read once, however many GPUs are named, and not at all
    /// when only MIG instances are.
    pub fn places(&self, selectors: &[String]) -> Result<Vec<Place>> {
        places_from(
            selectors,
            || self.tables(),
            |mig| match mig {
                MigName::Uuid(uuid) => self.mig_by_uuid(uuid),
                MigName::Ids(gpu, instance) => self.mig_by_ids(gpu, instance),
            },
        )
    }

    fn mig_by_uuid(&self, uuid: &str) -> Result<Place> {
        let none = || CoreError::GpuSelector(format!("no MIG device has the UUID '{uuid}'"));
        let device = self.nvml.device_by_uuid(uuid).map_err(|_| none())?;
        if !device.mig_is_mig_device_handle().unwrap_or(false) {
            return Err(none());
        }
        let gpu = device
            .mig_parent_device()
            .and_then(|parent| parent.index())
            .map_err(|_| none())?;
        Ok(Place {
            gpu,
            gpu_instance: Some(mig_instance_ids(&device).0.ok_or_else(none)?),
        })
    }

    fn mig_by_ids(&self, gpu: u32, instance: u32) -> Result<Place> {
        let count = self.count()?;
        if gpu >= count {
            return Err(CoreError::GpuSelector(format!(
                "'{gpu}/{instance}': there is no GPU {gpu} ({count} GPUs)"
            )));
        }
        let device = self
            .nvml
            .device_by_index(gpu)
            .map_err(|error| CoreError::GpuSelector(format!("GPU {gpu}: {}", describe(&error))))?;
        let enabled = device.mig_mode().is_ok_and(|mode| mode.current == 1);
        if !enabled {
            return Err(CoreError::GpuSelector(format!(
                "'{gpu}/{instance}': GPU {gpu} is not in MIG mode"
            )));
        }
        let mut instances = Vec::new();
        for slot in 0..device.mig_device_count().unwrap_or(0) {
            if let Ok(mig) = device.mig_device_by_index(slot)
                && let Some(id) = mig_instance_ids(&mig).0
            {
                instances.push(id);
            }
        }
        instances.sort_unstable();
        if !instances.contains(&instance) {
            return Err(CoreError::GpuSelector(format!(
                "GPU {gpu} has no GPU instance {instance} (its instances: {})",
                instances
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(Place {
            gpu,
            gpu_instance: Some(instance),
        })
    }
}

/// A MIG device's GPU and compute instance ids (nvml-wrapper has no call for them).
pub(crate) fn mig_instance_ids(mig: &nvml_wrapper::Device<'_>) -> (Option<u32>, Option<u32>) {
    let lib = mig.nvml().lib();
    // SAFETY: a valid MIG device handle and out-pointers to local integers, as nvml.h says.
    unsafe {
        let handle = mig.handle();
        let mut gi: std::os::raw::c_uint = 0;
        let mut ci: std::os::raw::c_uint = 0;
        let gi = lib
            .nvmlDeviceGetGpuInstanceId
            .as_ref()
            .ok()
            .filter(|f| f(handle, &mut gi) == 0)
            .map(|_| gi);
        let ci = lib
            .nvmlDeviceGetComputeInstanceId
            .as_ref()
            .ok()
            .filter(|f| f(handle, &mut ci) == 0)
            .map(|_| ci);
        (gi, ci)
    }
}

/// A selector naming a MIG instance: by its MIG device UUID, or as `GPU/GI`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigName<'a> {
    Uuid(&'a str),
    Ids(u32, u32),
}

/// Pure part of [`Gpus::places`]: `tables` is read at the first whole-GPU selector, and only
/// then; `mig` looks up each MIG instance named. Selectors are taken in order, the first bad
/// one refused, and each place is kept once.
pub fn places_from(
    selectors: &[String],
    tables: impl FnOnce() -> Result<GpuTables>,
    mut mig: impl FnMut(MigName<'_>) -> Result<Place>,
) -> Result<Vec<Place>> {
    let mut read = Some(tables);
    let mut tables: Option<GpuTables> = None;
    let mut places = Vec::new();
    for selector in selectors {
        let wanted = selector.trim();
        let place = if wanted.len() > 4 && wanted[..4].eq_ignore_ascii_case("MIG-") {
            mig(MigName::Uuid(wanted))?
        } else if let Some((gpu, instance)) = wanted.split_once('/') {
            let (Ok(gpu), Ok(instance)) = (gpu.parse::<u32>(), instance.parse::<u32>()) else {
                return Err(CoreError::GpuSelector(format!(
                    "'{wanted}' is not a MIG instance: give GPU/GI (0/9) or a MIG UUID \
                     (MIG-...)"
                )));
            };
            mig(MigName::Ids(gpu, instance))?
        } else {
            let tables = match (&mut tables, read.take()) {
                (Some(tables), _) => tables,
                (slot, Some(read)) => slot.insert(read()?),
                (None, None) => unreachable!("the tables are read before they are kept"),
            };
            let index =
                resolve_selectors(std::slice::from_ref(selector), &tables.uuids, &tables.buses)?[0];
            Place::whole(index)
        };
        if !places.contains(&place) {
            places.push(place);
        }
    }
    Ok(places)
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
