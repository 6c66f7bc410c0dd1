//! GPU instances and compute instances: profiles, placements, create, list, destroy.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::*;
use tessera_mig::{MEMORY_SLICES, possible_placements, shape, shape_by_nvml_enum};

use crate::ffi::*;
use crate::handle::{Handle, handle};

/// Takes the NVML profile *enum* (`NVML_GPU_INSTANCE_PROFILE_*`), not the profile ID. Answers
/// whether or not MIG is enabled, as driver 580.159.04 does on an H100: `NOT_SUPPORTED` for an
/// enum the GPU does not offer, `INVALID_ARGUMENT` for one past `NVML_GPU_INSTANCE_PROFILE_COUNT`.
///
/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceGetGpuInstanceProfileInfo", Some(g), true, |st| {
        if profile >= NVML_GPU_INSTANCE_PROFILE_COUNT {
            return Err(INVALID_ARGUMENT);
        }
        let foreign = foreign(st, g).to_vec();
        let d = dev(st, g);
        if !d.model().is_mig_capable() {
            return Err(NOT_SUPPORTED);
        }
        let memory_mb =
            |slices: u8| d.model().memory_mib * u64::from(slices) / u64::from(MEMORY_SLICES);
        let answer = if let Some(s) =
            shape_by_nvml_enum(profile).filter(|s| d.model().profile_name(s.profile_id).is_some())
        {
            (
                s.profile_id,
                s.compute_slices,
                s.max_per_gpu.into(),
                memory_mb(s.memory_slices),
            )
        } else if let Some(f) = foreign.iter().find(|f| f.nvml_enum == profile) {
            let count = foreign
                .iter()
                .filter(|o| o.profile_id == f.profile_id)
                .count();
            (
                f.profile_id,
                f.compute_slices,
                count as c_uint,
                memory_mb(f.size),
            )
        } else {
            return Err(NOT_SUPPORTED);
        };
        let (id, slices, instances, memory_size_mb) = answer;
        // SAFETY: NVML's contract on `info`.
        unsafe {
            put(
                info,
                nvmlGpuInstanceProfileInfo_t {
                    id,
                    isP2pSupported: 0,
                    sliceCount: c_uint::from(slices),
                    instanceCount: instances,
                    // Engine and SM counts are not modelled; nothing in tessera reads them.
                    multiprocessorCount: 0,
                    copyEngineCount: 0,
                    decoderCount: 0,
                    encoderCount: 0,
                    jpegCount: 0,
                    ofaCount: 0,
                    memorySizeMB: memory_size_mb,
                },
            )
        }
    })
}

/// Every placement of the profile, whatever is occupied and whether or not MIG is enabled:
/// nvml.h says so ("returns all the possible placements for the given profile regardless of
/// whether MIG is enabled or not"), and driver 580.159.04 answered so on an H100 with MIG
/// disabled. With `placements` null, `count` receives how many there are.
///
/// # Safety
/// `count` is null or valid; `placements` is null or valid for `*count` elements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profileId: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call(
        "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        Some(g),
        true,
        |st| {
            if count.is_null() {
                return Err(INVALID_ARGUMENT);
            }
            let foreign = foreign(st, g).to_vec();
            let d = dev(st, g);
            if !d.model().is_mig_capable() {
                return Err(NOT_SUPPORTED);
            }
            let items: Vec<nvmlGpuInstancePlacement_t> =
                if d.model().profile_name(profileId).is_some() {
                    // On an empty GPU every placement of the profile is possible.
                    possible_placements(&[], profileId)
                        .iter()
                        .map(|p| nvmlGpuInstancePlacement_t {
                            start: c_uint::from(p.start),
                            size: c_uint::from(p.size()),
                        })
                        .collect()
                } else if foreign.iter().any(|f| f.profile_id == profileId) {
                    foreign
                        .iter()
                        .filter(|f| f.profile_id == profileId)
                        .map(|f| nvmlGpuInstancePlacement_t {
                            start: c_uint::from(f.start),
                            size: c_uint::from(f.size),
                        })
                        .collect()
                } else {
                    return Err(INVALID_ARGUMENT);
                };
            if placements.is_null() {
                // SAFETY: `count` checked.
                return unsafe { put(count, items.len() as c_uint) };
            }
            // SAFETY: `count` checked; NVML's contract on `placements`.
            let capacity = unsafe { *count as usize };
            unsafe { put_list(placements, count, capacity, items) }
        },
    )
}

/// # Safety
/// `placement` is null or valid for a read; `gpuInstance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profileId: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call(
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        Some(g),
        true,
        |st| {
            if placement.is_null() || gpuInstance.is_null() {
                return Err(INVALID_ARGUMENT);
            }
            // SAFETY: checked non-null; NVML's contract otherwise.
            let want = unsafe { placement.read() };
            let Some(s) = shape(profileId) else {
                return Err(INVALID_ARGUMENT);
            };
            if want.size != c_uint::from(s.memory_slices) {
                return Err(INVALID_ARGUMENT);
            }
            let start = u8::try_from(want.start).map_err(|_| INVALID_ARGUMENT)?;
            permitted(st.driver.mig_config)?;
            let end = want.start + want.size;
            if foreign(st, g)
                .iter()
                .any(|f| want.start < u32::from(f.start + f.size) && u32::from(f.start) < end)
            {
                return Err(INSUFFICIENT_RESOURCES);
            }
            let gi = dev(st, g)
                .create_gpu_instance_with_placement(profileId, start)
                .map_err(nvml_err)?;
            // SAFETY: checked non-null.
            unsafe { put(gpuInstance, Handle::GpuInstance { gpu: g, gi }.ptr()) }
        },
    )
}

/// Lists the GPU instances of one profile ID. Like NVML, it takes `gpuInstances` to have room
/// for the profile's `instanceCount`.
///
/// # Safety
/// `count` is null or valid; `gpuInstances` is null or valid for the profile's instance count.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profileId: c_uint,
    gpuInstances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceGetGpuInstances", Some(g), true, |st| {
        permitted(st.driver.mig_monitor)?;
        let foreign: Vec<u32> = foreign(st, g)
            .iter()
            .filter(|f| f.profile_id == profileId)
            .map(|f| f.id)
            .collect();
        let d = dev(st, g);
        let capacity = match shape(profileId) {
            Some(s) => usize::from(s.max_per_gpu),
            None if !foreign.is_empty() => foreign.len(),
            None => return Err(INVALID_ARGUMENT),
        };
        if gpuInstances.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // Driver 580.159.04 lists none, successfully, on an H100 with MIG disabled.
        let items: Vec<nvmlGpuInstance_t> = d
            .gpu_instances()
            .iter()
            .filter(|i| d.mig_mode().current && i.placement.profile_id == profileId)
            .map(|i| i.id)
            .chain(foreign)
            .map(|gi| Handle::GpuInstance { gpu: g, gi }.ptr())
            .collect();
        // SAFETY: NVML's contract: room for the profile's instance count.
        unsafe { put_list(gpuInstances, count, capacity, items) }
    })
}

/// # Safety
/// `gpuInstance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpuInstance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlDeviceGetGpuInstanceById", Some(g), true, |st| {
        permitted(st.driver.mig_monitor)?;
        let is_foreign = foreign(st, g).iter().any(|f| f.id == id);
        let d = dev(st, g);
        // Driver 580.159.04 answers NOT_FOUND on an H100 with MIG disabled.
        if !is_foreign && (!d.mig_mode().current || placement_of(d, id).is_err()) {
            return Err(NOT_FOUND);
        }
        // SAFETY: NVML's contract on `gpuInstance`.
        unsafe { put(gpuInstance, Handle::GpuInstance { gpu: g, gi: id }.ptr()) }
    })
}

/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpuInstance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    let Some(Handle::GpuInstance { gpu, gi }) = handle(gpuInstance) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlGpuInstanceGetInfo", Some(gpu), true, |st| {
        let (profile_id, start, size) = match foreign(st, gpu).iter().find(|f| f.id == gi) {
            Some(f) => (f.profile_id, f.start, f.size),
            None => {
                let p = placement_of(dev(st, gpu), gi)?;
                (p.profile_id, p.start, p.size())
            }
        };
        // SAFETY: NVML's contract on `info`.
        unsafe {
            put(
                info,
                nvmlGpuInstanceInfo_t {
                    device: Handle::Device(gpu).ptr(),
                    id: gi,
                    profileId: profile_id,
                    placement: nvmlGpuInstancePlacement_t {
                        start: c_uint::from(start),
                        size: c_uint::from(size),
                    },
                },
            )
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(gpuInstance: nvmlGpuInstance_t) -> nvmlReturn_t {
    let Some(Handle::GpuInstance { gpu, gi }) = handle(gpuInstance) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlGpuInstanceDestroy", Some(gpu), true, |st| {
        permitted(st.driver.mig_config)?;
        // A foreign instance keeps its compute instance: NVML refuses while one exists.
        if foreign(st, gpu).iter().any(|f| f.id == gi) {
            return Err(IN_USE);
        }
        dev(st, gpu).destroy_gpu_instance(gi).map_err(nvml_err)
    })
}

/// Only the GPU instance's full-size profile is offered (see the module documentation).
///
/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpuInstance: nvmlGpuInstance_t,
    profile: c_uint,
    engProfile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    let Some(Handle::GpuInstance { gpu, gi }) = handle(gpuInstance) else {
        return INVALID_ARGUMENT;
    };
    call(
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        Some(gpu),
        true,
        |st| {
            let p = placement_of(dev(st, gpu), gi)?;
            let slices = compute_slices(p.profile_id)?;
            if engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                || full_compute_instance_profile(slices) != Some(profile)
            {
                return Err(NOT_SUPPORTED);
            }
            // SAFETY: NVML's contract on `info`.
            unsafe {
                put(
                    info,
                    nvmlComputeInstanceProfileInfo_t {
                        // NVML's compute instance profile IDs equal their enum values.
                        id: profile,
                        sliceCount: c_uint::from(slices),
                        instanceCount: 1,
                        multiprocessorCount: 0,
                        sharedCopyEngineCount: 0,
                        sharedDecoderCount: 0,
                        sharedEncoderCount: 0,
                        sharedJpegCount: 0,
                        sharedOfaCount: 0,
                    },
                )
            }
        },
    )
}

/// # Safety
/// `computeInstance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpuInstance: nvmlGpuInstance_t,
    profileId: c_uint,
    computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    let Some(Handle::GpuInstance { gpu, gi }) = handle(gpuInstance) else {
        return INVALID_ARGUMENT;
    };
    call(
        "nvmlGpuInstanceCreateComputeInstance",
        Some(gpu),
        true,
        |st| {
            if computeInstance.is_null() {
                return Err(INVALID_ARGUMENT);
            }
            permitted(st.driver.mig_config)?;
            let p = placement_of(dev(st, gpu), gi)?;
            if full_compute_instance_profile(compute_slices(p.profile_id)?) != Some(profileId) {
                return Err(NOT_SUPPORTED);
            }
            let ci = dev(st, gpu).create_compute_instance(gi).map_err(nvml_err)?;
            // SAFETY: checked non-null.
            unsafe {
                put(
                    computeInstance,
                    Handle::ComputeInstance { gpu, gi, ci: ci.id }.ptr(),
                )
            }
        },
    )
}

/// Like NVML, takes `computeInstances` to have room for the profile's instance count (one).
///
/// # Safety
/// `count` is null or valid; `computeInstances` is null or valid for one element.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpuInstance: nvmlGpuInstance_t,
    profileId: c_uint,
    computeInstances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let Some(Handle::GpuInstance { gpu, gi }) = handle(gpuInstance) else {
        return INVALID_ARGUMENT;
    };
    call(
        "nvmlGpuInstanceGetComputeInstances",
        Some(gpu),
        true,
        |st| {
            permitted(st.driver.mig_monitor)?;
            let d = dev(st, gpu);
            let p = placement_of(d, gi)?;
            if full_compute_instance_profile(compute_slices(p.profile_id)?) != Some(profileId) {
                return Err(NOT_SUPPORTED);
            }
            if computeInstances.is_null() {
                return Err(INVALID_ARGUMENT);
            }
            let items: Vec<nvmlComputeInstance_t> = d
                .gpu_instance(gi)
                .map(|g| g.compute_instances.as_slice())
                .unwrap_or_default()
                .iter()
                .map(|c| Handle::ComputeInstance { gpu, gi, ci: c.id }.ptr())
                .collect();
            // SAFETY: NVML's contract on the out pointers.
            unsafe { put_list(computeInstances, count, 1, items) }
        },
    )
}

/// # Safety
/// `computeInstance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpuInstance: nvmlGpuInstance_t,
    id: c_uint,
    computeInstance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    let Some(Handle::GpuInstance { gpu, gi }) = handle(gpuInstance) else {
        return INVALID_ARGUMENT;
    };
    call(
        "nvmlGpuInstanceGetComputeInstanceById",
        Some(gpu),
        true,
        |st| {
            permitted(st.driver.mig_monitor)?;
            let d = dev(st, gpu);
            let found = d
                .gpu_instance(gi)
                .ok_or(NOT_FOUND)?
                .compute_instances
                .iter()
                .any(|c| c.id == id);
            if !found {
                return Err(NOT_FOUND);
            }
            // SAFETY: NVML's contract on `computeInstance`.
            unsafe {
                put(
                    computeInstance,
                    Handle::ComputeInstance { gpu, gi, ci: id }.ptr(),
                )
            }
        },
    )
}

/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    computeInstance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    let Some(Handle::ComputeInstance { gpu, gi, ci }) = handle(computeInstance) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlComputeInstanceGetInfo_v2", Some(gpu), true, |st| {
        let d = dev(st, gpu);
        let g = d.gpu_instance(gi).ok_or(NOT_FOUND)?;
        if !g.compute_instances.iter().any(|c| c.id == ci) {
            return Err(NOT_FOUND);
        }
        let slices = compute_slices(g.placement.profile_id)?;
        let profile = full_compute_instance_profile(slices).ok_or(NOT_SUPPORTED)?;
        // SAFETY: NVML's contract on `info`.
        unsafe {
            put(
                info,
                nvmlComputeInstanceInfo_t {
                    device: Handle::Device(gpu).ptr(),
                    gpuInstance: Handle::GpuInstance { gpu, gi }.ptr(),
                    id: ci,
                    profileId: profile,
                    placement: nvmlComputeInstancePlacement_t {
                        start: 0,
                        size: c_uint::from(slices),
                    },
                },
            )
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(
    computeInstance: nvmlComputeInstance_t,
) -> nvmlReturn_t {
    let Some(Handle::ComputeInstance { gpu, gi, ci }) = handle(computeInstance) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlComputeInstanceDestroy", Some(gpu), true, |st| {
        permitted(st.driver.mig_config)?;
        dev(st, gpu)
            .destroy_compute_instance(gi, ci)
            .map_err(nvml_err)
    })
}

#[cfg(test)]
mod tests {
    use crate::ffi::full_compute_instance_profile;

    #[test]
    fn full_size_compute_profiles_follow_nvml_h() {
        assert_eq!(full_compute_instance_profile(1), Some(0));
        assert_eq!(full_compute_instance_profile(3), Some(2));
        assert_eq!(full_compute_instance_profile(7), Some(4));
        assert_eq!(full_compute_instance_profile(5), None);
    }
}
