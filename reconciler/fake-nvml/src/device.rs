//! Devices: count, handles, identity, memory, MIG mode, MIG device handles and the processes
//! on a device.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::*;
use tessera_mig::COMPUTE_SLICES;
use tessera_mig::device::ProcessScope;

use crate::ffi::*;
use crate::handle::{Handle, handle};

/// # Safety
/// `count` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: NVML's contract on `count`.
    call("nvmlDeviceGetCount_v2", None, false, |st| unsafe {
        put(count, st.gpus.len() as c_uint)
    })
}

/// # Safety
/// `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // A lost GPU still has a handle; the calls on it fail.
    call(
        "nvmlDeviceGetHandleByIndex_v2",
        Some(index),
        false,
        |_| unsafe { put(device, Handle::Device(index).ptr()) },
    )
}

/// # Safety
/// `name` is null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    let Some(h) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceGetName", Some(h.gpu()), true, |st| {
        let g = &st.gpus[h.gpu() as usize];
        let text = match h {
            Handle::Device(_) => g.name.clone(),
            Handle::Mig { gi, .. } => {
                let p = placement_of(&g.device, gi)?;
                let profile = g.device.model().profile_name(p.profile_id).unwrap_or("?");
                format!("{} MIG {profile}", g.name)
            }
            _ => return Err(INVALID_ARGUMENT),
        };
        // SAFETY: NVML's contract on `name`.
        unsafe { put_str(name, length, &text) }
    })
}

/// # Safety
/// `uuid` is null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    let Some(h) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceGetUUID", Some(h.gpu()), true, |st| {
        let g = &st.gpus[h.gpu() as usize];
        let d = &g.device;
        let text = match h {
            Handle::Device(_) => d.uuid().to_owned(),
            Handle::Mig { gi, ci, .. } => d
                .gpu_instance(gi)
                .and_then(|g| g.compute_instances.iter().find(|c| c.id == ci))
                .map(|c| c.uuid.clone())
                .or_else(|| {
                    g.foreign
                        .iter()
                        .find(|f| f.id == gi && ci == 0)
                        .map(|f| f.uuid.clone())
                })
                .ok_or(NOT_FOUND)?,
            _ => return Err(INVALID_ARGUMENT),
        };
        // SAFETY: NVML's contract on `uuid`.
        unsafe { put_str(uuid, length, &text) }
    })
}

/// # Safety
/// `memory` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceGetMemoryInfo", Some(g), true, |st| {
        let total = st.gpus[g as usize].memory_total;
        // SAFETY: NVML's contract on `memory`.
        unsafe {
            put(
                memory,
                nvmlMemory_t {
                    total,
                    free: total,
                    used: 0,
                },
            )
        }
    })
}

/// # Safety
/// `utilization` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceGetUtilizationRates", Some(g), true, |st| {
        let gpu = &st.gpus[g as usize];
        // A GPU in MIG mode reports no utilization of its own.
        let rates = gpu
            .utilization
            .filter(|_| !gpu.device.mig_mode().current)
            .ok_or(NOT_SUPPORTED)?;
        // SAFETY: NVML's contract on `utilization`.
        unsafe {
            put(
                utilization,
                nvmlUtilization_t {
                    gpu: rates.gpu,
                    memory: rates.memory,
                },
            )
        }
    })
}

/// # Safety
/// `isMigDevice` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    isMigDevice: *mut c_uint,
) -> nvmlReturn_t {
    let Some(h) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call(
        "nvmlDeviceIsMigDeviceHandle",
        Some(h.gpu()),
        true,
        |_| unsafe { put(isMigDevice, c_uint::from(matches!(h, Handle::Mig { .. }))) },
    )
}

/// # Safety
/// `currentMode` and `pendingMode` are null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    currentMode: *mut c_uint,
    pendingMode: *mut c_uint,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceGetMigMode", Some(g), true, |st| {
        let d = dev(st, g);
        if !d.model().is_mig_capable() {
            return Err(NOT_SUPPORTED);
        }
        let m = d.mig_mode();
        // SAFETY: NVML's contract on the out pointers.
        unsafe {
            put(currentMode, c_uint::from(m.current))?;
            put(pendingMode, c_uint::from(m.pending))
        }
    })
}

/// Records the mode, then attempts the reset that activates it; `activationStatus` says how
/// that went (the call itself succeeds, and the mode stays pending, when it fails).
///
/// # Safety
/// `activationStatus` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    mode: c_uint,
    activationStatus: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceSetMigMode", Some(g), true, |st| {
        if mode > 1 || activationStatus.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        permitted(st.driver.mig_config)?;
        dev(st, g).set_mig_mode(mode == 1).map_err(nvml_err)?;
        let status = if st.reset_refused(g) {
            IN_USE
        } else {
            match dev(st, g).reset() {
                Ok(()) => SUCCESS,
                Err(e) => nvml_err(e),
            }
        };
        // SAFETY: checked non-null; NVML's contract otherwise.
        unsafe { put(activationStatus, status) }
    })
}

/// # Safety
/// `count` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceGetMaxMigDeviceCount", Some(g), true, |st| {
        // Driver 580.159.04 answers 0 on an H100 with MIG disabled.
        let d = dev(st, g);
        let max = if d.model().is_mig_capable() && d.mig_mode().current {
            c_uint::from(COMPUTE_SLICES)
        } else {
            0
        };
        // SAFETY: NVML's contract on `count`.
        unsafe { put(count, max) }
    })
}

/// # Safety
/// `migDevice` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    migDevice: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceGetMigDeviceHandleByIndex", Some(g), true, |st| {
        let empty = st.driver.empty_mig_slot.raw();
        let foreign = foreign(st, g).to_vec();
        let d = dev(st, g);
        // Driver 580.159.04 answers NOT_FOUND on an H100 with MIG disabled.
        if !d.mig_mode().current {
            return Err(NOT_FOUND);
        }
        let &(gi, ci) = mig_devices(d, &foreign).get(index as usize).ok_or(empty)?;
        // SAFETY: NVML's contract on `migDevice`.
        unsafe { put(migDevice, Handle::Mig { gpu: g, gi, ci }.ptr()) }
    })
}

/// # Safety
/// `id` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    let Some(Handle::Mig { gpu, gi, .. }) = handle(device) else {
        return NOT_SUPPORTED;
    };
    call("nvmlDeviceGetGpuInstanceId", Some(gpu), true, |_| unsafe {
        put(id, gi)
    })
}

/// # Safety
/// `id` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    let Some(Handle::Mig { gpu, ci, .. }) = handle(device) else {
        return NOT_SUPPORTED;
    };
    call(
        "nvmlDeviceGetComputeInstanceId",
        Some(gpu),
        true,
        |_| unsafe { put(id, ci) },
    )
}

/// Where each field of a process entry sits; `usedGpuCcProtectedMemory` only in the 32-byte
/// layout of drivers 535.43 to 535.86.
const PID_AT: usize = 0;
const USED_MEMORY_AT: usize = 8;
const GPU_INSTANCE_AT: usize = 16;
const COMPUTE_INSTANCE_AT: usize = 20;
const CC_PROTECTED_AT: usize = 24;

/// Writes one entry of `stride` bytes at `base`.
///
/// # Safety
/// `base` is valid for `stride` bytes.
unsafe fn write_process(base: *mut u8, stride: usize, p: &nvmlProcessInfo_t) {
    // SAFETY: every offset plus its field's size is within `stride` (24 or 32); unaligned
    // writes, since a caller's buffer is only as aligned as its own entry type.
    unsafe {
        base.add(PID_AT).cast::<c_uint>().write_unaligned(p.pid);
        base.add(USED_MEMORY_AT)
            .cast::<u64>()
            .write_unaligned(p.usedGpuMemory);
        base.add(GPU_INSTANCE_AT)
            .cast::<c_uint>()
            .write_unaligned(p.gpuInstanceId);
        base.add(COMPUTE_INSTANCE_AT)
            .cast::<c_uint>()
            .write_unaligned(p.computeInstanceId);
        if stride > CC_PROTECTED_AT {
            base.add(CC_PROTECTED_AT).cast::<u64>().write_unaligned(0);
        }
    }
}

/// On the GPU's handle: every process, with its instance ids; on a MIG device's handle: the
/// processes of that compute instance. With `infos` null, or too small, `infoCount` receives
/// the count needed and the answer is `INSUFFICIENT_SIZE` (`SUCCESS` when there are none).
/// Entries are `driver.process_info_bytes` apart: 24 as nvml.h declares, or 32 as drivers
/// 535.43 to 535.86 write them through this same symbol.
///
/// # Safety
/// `infoCount` is null or valid; `infos` is null or valid for `*infoCount` entries of the
/// configured size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    let Some(h) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        Some(h.gpu()),
        true,
        |st| {
            if infoCount.is_null() {
                return Err(INVALID_ARGUMENT);
            }
            let d = dev(st, h.gpu());
            let info = |pid: u32, gi: c_uint, ci: c_uint| nvmlProcessInfo_t {
                pid,
                usedGpuMemory: 0,
                gpuInstanceId: gi,
                computeInstanceId: ci,
            };
            let items: Vec<nvmlProcessInfo_t> = d
                .processes()
                .iter()
                .filter_map(|p| {
                    let (gi, ci) = match p.scope {
                        ProcessScope::Gpu => (NO_INSTANCE, NO_INSTANCE),
                        ProcessScope::GpuInstance(gi) => (gi, NO_INSTANCE),
                        ProcessScope::ComputeInstance {
                            gpu_instance,
                            compute_instance,
                        } => (gpu_instance, compute_instance),
                    };
                    match h {
                        Handle::Device(_) => Some(info(p.pid, gi, ci)),
                        // A process bound to a whole GPU instance runs on each of its
                        // compute instances.
                        Handle::Mig { gi: mg, ci: mc, .. }
                            if gi == mg && (ci == NO_INSTANCE || ci == mc) =>
                        {
                            Some(info(p.pid, gi, ci))
                        }
                        _ => None,
                    }
                })
                .collect();
            // SAFETY: `infoCount` checked; NVML's contract on `infos`.
            let capacity = if infos.is_null() {
                0
            } else {
                unsafe { *infoCount as usize }
            };
            // SAFETY: `infoCount` checked.
            unsafe { put(infoCount, items.len() as c_uint)? };
            if items.is_empty() {
                return Ok(());
            }
            if items.len() > capacity {
                return Err(INSUFFICIENT_SIZE);
            }
            let stride = st.driver.process_info_bytes as usize;
            for (i, p) in items.iter().enumerate() {
                // SAFETY: i < capacity entries of `stride` bytes (the caller's contract).
                unsafe { write_process(infos.cast::<u8>().add(i * stride), stride, p) };
            }
            Ok(())
        },
    )
}
