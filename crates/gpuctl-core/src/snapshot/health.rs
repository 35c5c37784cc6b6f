//! Reading a GPU's health from NVML (only for snapshots whose purpose shows it:
//! [`SnapshotOptions::health`]): the recovery-action field, remapped rows, device-memory ECC
//! counts, retired pages and clock-event reasons. Read in the same per-GPU job as the rest of
//! the GPU (`read::read_gpu`), within the session's timeout, where the GPU is not lost.

use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;

use crate::health::{Action, EccCounts, Readings, RemappedRows, RetiredPages};

use super::field::optional;

/// The recovery-action field (R550 on).
const FIELD_RECOVERY_ACTION: u32 =
    nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;

/// One GPU's readings; a value the GPU or driver does not offer is `None`. `Err` only for
/// a lost GPU.
pub(super) fn read_health(device: &Device<'_>) -> Result<Readings, NvmlError> {
    Ok(Readings {
        recovery_action: recovery_action(device)?,
        remapped_rows: remapped_rows(device)?,
        ecc: ecc(device)?,
        retired_pages: retired_pages(device)?,
        clock_event_reasons: optional(device.current_throttle_reasons())?
            .map(|reasons| reasons.bits()),
    })
}

fn recovery_action(device: &Device<'_>) -> Result<Option<Action>, NvmlError> {
    let Some(values) = optional(device.field_values_for(&[FieldId(FIELD_RECOVERY_ACTION)]))? else {
        return Ok(None);
    };
    let value = match values.into_iter().next() {
        Some(Ok(sample)) => sample.value,
        Some(Err(error)) => Err(error),
        None => return Ok(None),
    };
    Ok(match optional(value)? {
        Some(SampleValue::U32(v)) => Action::from_nvml(v),
        Some(SampleValue::U64(v)) => u32::try_from(v).ok().and_then(Action::from_nvml),
        _ => None,
    })
}

/// `nvmlDeviceGetRemappedRows`, which nvml-wrapper has no call for.
fn remapped_rows(device: &Device<'_>) -> Result<Option<RemappedRows>, NvmlError> {
    let lib = device.nvml().lib();
    let Ok(get) = lib.nvmlDeviceGetRemappedRows.as_ref() else {
        return Ok(None);
    };
    let (mut correctable, mut uncorrectable, mut pending, mut failure) = (0, 0, 0, 0);
    // SAFETY: a valid device handle and four out-pointers to local integers, as nvml.h says.
    let code = unsafe {
        get(
            device.handle(),
            &mut correctable,
            &mut uncorrectable,
            &mut pending,
            &mut failure,
        )
    };
    const GPU_IS_LOST: u32 = 15;
    match code {
        0 => Ok(Some(RemappedRows {
            correctable,
            uncorrectable,
            pending: pending != 0,
            failure: failure != 0,
        })),
        GPU_IS_LOST => Err(NvmlError::GpuLost),
        _ => Ok(None),
    }
}

fn ecc(device: &Device<'_>) -> Result<Option<EccCounts>, NvmlError> {
    let count =
        |error: MemoryError, counter: EccCounter| optional(device.total_ecc_errors(error, counter));
    let counts = (
        count(MemoryError::Corrected, EccCounter::Volatile)?,
        count(MemoryError::Uncorrected, EccCounter::Volatile)?,
        count(MemoryError::Corrected, EccCounter::Aggregate)?,
        count(MemoryError::Uncorrected, EccCounter::Aggregate)?,
    );
    Ok(match counts {
        (Some(vc), Some(vu), Some(ac), Some(au)) => Some(EccCounts {
            volatile_corrected: vc,
            volatile_uncorrected: vu,
            aggregate_corrected: ac,
            aggregate_uncorrected: au,
        }),
        _ => None,
    })
}

fn retired_pages(device: &Device<'_>) -> Result<Option<RetiredPages>, NvmlError> {
    let Some(pending) = optional(device.are_pages_pending_retired())? else {
        return Ok(None);
    };
    let count = |cause| -> Result<u32, NvmlError> {
        Ok(optional(device.retired_pages(cause))?.map_or(0, |pages| pages.len() as u32))
    };
    Ok(Some(RetiredPages {
        single_bit: count(RetirementCause::MultipleSingleBitEccErrors)?,
        double_bit: count(RetirementCause::DoubleBitEccError)?,
        pending,
    }))
}
