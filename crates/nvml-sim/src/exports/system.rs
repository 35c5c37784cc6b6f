//! Init, shutdown and the system-wide queries (driver, NVML and CUDA versions, process names).

use super::*;

fn init() -> nvmlReturn_t {
    let mut guard = sim::lock();
    if let Some(s) = guard.as_mut() {
        s.refcount += 1;
        INIT_COUNT.store(s.refcount, std::sync::atomic::Ordering::SeqCst);
        return NVML_SUCCESS;
    }
    match Sim::open() {
        Ok(s) => {
            *guard = Some(s);
            INIT_COUNT.store(1, std::sync::atomic::Ordering::SeqCst);
            NVML_SUCCESS
        }
        Err(code) => code,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    guard!(init())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard!(init())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    guard!(init())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard!({
        let mut guard = sim::lock();
        let Some(s) = guard.as_mut() else {
            return NVML_ERROR_UNINITIALIZED;
        };
        s.refcount -= 1;
        INIT_COUNT.store(s.refcount, std::sync::atomic::Ordering::SeqCst);
        if s.refcount == 0 {
            *guard = None;
        }
        NVML_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    std::panic::catch_unwind(|| {
        RETURN_CODES
            .iter()
            .find(|(_, code, _)| *code == result)
            .map(|(_, _, text)| text.as_ptr())
            .unwrap_or(c"Unknown Error".as_ptr())
    })
    .unwrap_or(c"Unknown Error".as_ptr())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(buf version => with_sim(|s| {
        put_str(version, length, &s.scenario.driver_version)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(buf version => with_sim(|s| {
        put_str(version, length, &s.scenario.nvml_version)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    guard!(mut v => with_sim(|s| {
        put(v, s.scenario.cuda_driver_version)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    guard!(mut v => with_sim(|s| {
        put(v, s.scenario.cuda_driver_version)
    }))
}

/// The process's name as the driver gives it: argv[0] from /proc/PID/cmdline, else comm.
/// In a PID namespace of its own the pid is the host's, which /proc here does not name.
pub(super) fn process_name(pid: c_uint) -> Option<String> {
    if crate::live::in_child_pid_namespace() {
        return None;
    }
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|c| {
            let first = c.split(|b| *b == 0).next()?.to_vec();
            (!first.is_empty()).then(|| String::from_utf8_lossy(&first).into_owned())
        })
        .or_else(|| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .map(|c| c.trim_end().to_string())
        })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard!(buf name => with_sim(|_| match process_name(pid) {
        None => NVML_ERROR_NOT_FOUND,
        Some(n) => {
            let n: String = n
                .chars()
                .take((length as usize).saturating_sub(1))
                .collect();
            put_str(name, length, &n)
        }
    }))
}
