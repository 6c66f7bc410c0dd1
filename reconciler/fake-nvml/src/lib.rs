//! A stand-in `libnvidia-ml.so`: the NVML C functions the `nvml` node driver calls, with
//! NVML's signatures (taken from `nvml-wrapper-sys`, the bindings the driver calls through),
//! structs and return codes, answering from a JSON state file instead of a GPU.
//!
//! No machine this project runs on has an NVIDIA GPU; without this library the real driver
//! would only ever be compiled. Loaded with `Nvml::builder().lib_path(..)`, it lets the driver
//! run through its real FFI in CI.
//!
//! - State: the file named by `TESSERA_FAKE_NVML_STATE` ([`state::FakeState`]), read at every
//!   call and written back after every change. Each GPU is a [`tessera_mig::device::MigDevice`],
//!   the same rule model the `sim` driver wraps, so both answer `IN_USE`,
//!   `INSUFFICIENT_RESOURCES`, `NOT_SUPPORTED` and `GPU_IS_LOST` under one set of rules.
//! - Faults: listed in the same file ([`state::FakeFault`]): a call that fails, a GPU that is
//!   lost, a reset that is refused. An instance held by a process is plain state: a process
//!   in the file with that instance as its scope.
//! - Exported: only the functions the driver calls. nvml-wrapper resolves every symbol lazily,
//!   per call (`FailedToLoadSymbol` for a missing one), so the rest need no stubs.
//! - Reset: NVML has no reset call of its own; `nvmlDeviceSetMigMode` attempts the reset that
//!   activates the mode and reports its outcome in `activationStatus` (the mode stays pending
//!   when it fails). The fake does the same, through `MigDevice::reset`.
//! - Compute instances: only the full-size one per GPU instance (what tessera creates and
//!   `MigDevice` models); asking for a smaller compute instance profile is `NOT_SUPPORTED`.
//!
//! Handles are not pointers to memory: they encode (kind, GPU, GPU instance, compute instance)
//! in the pointer's address, so a handle stays meaningful across calls that reload the file.

#![allow(non_snake_case)]

pub mod state;

use std::ffi::{c_char, c_uint};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use nvml_wrapper_sys::bindings::*;
use tessera_mig::device::{DeviceError, MigDevice, ProcessScope};
use tessera_mig::{COMPUTE_SLICES, MEMORY_SLICES, Placement, shape, shape_by_nvml_enum};

use state::{FakeState, STATE_ENV};

const SUCCESS: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const UNINITIALIZED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const INVALID_ARGUMENT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const DRIVER_NOT_LOADED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
const GPU_IS_LOST: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
const IN_USE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_IN_USE;
const INSUFFICIENT_RESOURCES: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
const UNKNOWN: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// What NVML puts in a process's instance ids when it runs on no MIG instance.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `nvmlInit` reference count; NVML answers `UNINITIALIZED` to calls made outside it. The lock
/// also serialises calls, so one process never interleaves two read-modify-write cycles.
static INIT: Mutex<u32> = Mutex::new(0);

fn lock() -> MutexGuard<'static, u32> {
    INIT.lock().unwrap_or_else(|p| p.into_inner())
}

fn state_path() -> Result<PathBuf, String> {
    std::env::var_os(STATE_ENV)
        .map(PathBuf::from)
        .ok_or_else(|| format!("{STATE_ENV} is not set"))
}

// ----- handles -----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handle {
    Device(u32),
    Mig { gpu: u32, gi: u32, ci: u32 },
    GpuInstance { gpu: u32, gi: u32 },
    ComputeInstance { gpu: u32, gi: u32, ci: u32 },
}

const FIELD: u32 = 20;
const MASK: usize = (1 << FIELD) - 1;

impl Handle {
    fn addr(self) -> usize {
        let (tag, gpu, gi, ci) = match self {
            Handle::Device(g) => (1, g, 0, 0),
            Handle::Mig { gpu, gi, ci } => (2, gpu, gi, ci),
            Handle::GpuInstance { gpu, gi } => (3, gpu, gi, 0),
            Handle::ComputeInstance { gpu, gi, ci } => (4, gpu, gi, ci),
        };
        let f = |v: u32| v as usize & MASK;
        (tag << (3 * FIELD)) | (f(gpu) << (2 * FIELD)) | (f(gi) << FIELD) | f(ci)
    }

    fn from_addr(addr: usize) -> Option<Handle> {
        let gpu = ((addr >> (2 * FIELD)) & MASK) as u32;
        let gi = ((addr >> FIELD) & MASK) as u32;
        let ci = (addr & MASK) as u32;
        Some(match addr >> (3 * FIELD) {
            1 => Handle::Device(gpu),
            2 => Handle::Mig { gpu, gi, ci },
            3 => Handle::GpuInstance { gpu, gi },
            4 => Handle::ComputeInstance { gpu, gi, ci },
            _ => return None,
        })
    }

    fn gpu(self) -> u32 {
        match self {
            Handle::Device(gpu)
            | Handle::Mig { gpu, .. }
            | Handle::GpuInstance { gpu, .. }
            | Handle::ComputeInstance { gpu, .. } => gpu,
        }
    }

    fn ptr<T>(self) -> *mut T {
        std::ptr::without_provenance_mut(self.addr())
    }
}

fn handle<T>(p: *mut T) -> Option<Handle> {
    Handle::from_addr(p.addr())
}

// ----- one call -----

/// Runs one NVML call: checks initialisation, loads the state, applies the faults (a `lose`
/// first; a lost GPU answers `GPU_IS_LOST` before a `fail` is counted; `live_only: false` for
/// the few calls a lost GPU still answers), runs `op`, and saves the state if anything changed.
fn call(
    function: &str,
    gpu: Option<u32>,
    live_only: bool,
    op: impl FnOnce(&mut FakeState) -> Result<(), nvmlReturn_t>,
) -> nvmlReturn_t {
    let init = lock();
    if *init == 0 {
        return UNINITIALIZED;
    }
    let path = match state_path() {
        Ok(p) => p,
        Err(e) => return complain(function, &e),
    };
    let mut st = match FakeState::load(&path) {
        Ok(s) => s,
        Err(e) => return complain(function, &e),
    };
    let before = st.clone();
    let code = (|| {
        if let Some(g) = gpu
            && g as usize >= st.gpus.len()
        {
            return INVALID_ARGUMENT;
        }
        if let Some(code) = st.gate(function, gpu, live_only) {
            return code;
        }
        match op(&mut st) {
            Ok(()) => SUCCESS,
            Err(code) => code,
        }
    })();
    if st != before
        && let Err(e) = st.save(&path)
    {
        return complain(function, &e);
    }
    code
}

/// A stand-in that cannot read its own state says why on stderr: NVML's return codes alone
/// would leave a test author guessing.
fn complain(function: &str, why: &str) -> nvmlReturn_t {
    eprintln!("fake libnvidia-ml: {function}: {why}");
    UNKNOWN
}

fn dev(st: &mut FakeState, gpu: u32) -> &mut MigDevice {
    &mut st.gpus[gpu as usize].device
}

fn nvml_err(e: DeviceError) -> nvmlReturn_t {
    e.nvml_return()
}

/// Writes `v` through `out`, refusing a null pointer as NVML does.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, v: T) -> Result<(), nvmlReturn_t> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid per the caller's contract (NVML's API contract).
    unsafe { out.write(v) };
    Ok(())
}

/// Copies `s` and a NUL into `buf` of `len` bytes.
///
/// # Safety
/// `buf` is null or valid for `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), nvmlReturn_t> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` has room for `len` >= s.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// Writes `items` into an array of `capacity`, or answers `INSUFFICIENT_SIZE` with the count
/// needed, as NVML's list calls do.
///
/// # Safety
/// `count` is null or valid; `out` is null or valid for `capacity` elements.
unsafe fn put_list<T>(
    out: *mut T,
    count: *mut c_uint,
    capacity: usize,
    items: Vec<T>,
) -> Result<(), nvmlReturn_t> {
    // SAFETY: per the caller's contract.
    unsafe { put(count, items.len() as c_uint)? };
    if items.len() > capacity || (out.is_null() && !items.is_empty()) {
        return Err(INSUFFICIENT_SIZE);
    }
    for (i, item) in items.into_iter().enumerate() {
        // SAFETY: i < capacity, and `out` is valid for `capacity` elements.
        unsafe { out.add(i).write(item) };
    }
    Ok(())
}

/// The full-size compute instance profile (an `NVML_COMPUTE_INSTANCE_PROFILE_*` value) of a
/// GPU instance with `compute_slices` slices, from `nvml.h`.
pub fn full_compute_instance_profile(compute_slices: u8) -> Option<c_uint> {
    Some(match compute_slices {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        7 => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        _ => return None,
    })
}

/// The MIG devices (one per compute instance) in NVML's index order: by GPU instance id, then
/// compute instance id.
fn mig_devices(d: &MigDevice) -> Vec<(u32, u32)> {
    d.gpu_instances()
        .iter()
        .flat_map(|g| g.compute_instances.iter().map(move |c| (g.id, c.id)))
        .collect()
}

fn placement_of(d: &MigDevice, gi: u32) -> Result<Placement, nvmlReturn_t> {
    d.gpu_instance(gi).map(|g| g.placement).ok_or(NOT_FOUND)
}

fn compute_slices(profile_id: u32) -> Result<u8, nvmlReturn_t> {
    shape(profile_id)
        .map(|s| s.compute_slices)
        .ok_or(INVALID_ARGUMENT)
}

// ----- init -----

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    let mut init = lock();
    // A real NVML with no kernel driver answers DRIVER_NOT_LOADED; a stand-in with no state
    // is the same situation.
    let loaded = state_path().and_then(|p| FakeState::load(&p));
    if let Err(e) = loaded {
        eprintln!("fake libnvidia-ml: nvmlInit_v2: {e}");
        return DRIVER_NOT_LOADED;
    }
    *init += 1;
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let mut init = lock();
    if *init == 0 {
        return UNINITIALIZED;
    }
    *init -= 1;
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static std::ffi::CStr = match result {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        GPU_IS_LOST => c"GPU is lost",
        IN_USE => c"In use by another client",
        INSUFFICIENT_RESOURCES => c"Insufficient resources",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

// ----- devices -----

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
        let d = &st.gpus[h.gpu() as usize].device;
        let text = match h {
            Handle::Device(_) => d.uuid().to_owned(),
            Handle::Mig { gi, ci, .. } => d
                .gpu_instance(gi)
                .and_then(|g| g.compute_instances.iter().find(|c| c.id == ci))
                .map(|c| c.uuid.clone())
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

// ----- MIG mode -----

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
        dev(st, g).set_mig_mode(mode == 1).map_err(nvml_err)?;
        let status = if st.reset_refused(g) {
            IN_USE
        } else {
            match dev(st, g).reset() {
                Ok(()) => SUCCESS,
                Err(e) => e.nvml_return(),
            }
        };
        // SAFETY: checked non-null; NVML's contract otherwise.
        unsafe { put(activationStatus, status) }
    })
}

// ----- GPU instances -----

/// Takes the NVML profile *enum* (`NVML_GPU_INSTANCE_PROFILE_*`), not the profile ID.
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
        let d = dev(st, g);
        let Some(s) = shape_by_nvml_enum(profile) else {
            return Err(INVALID_ARGUMENT);
        };
        if !d.mig_mode().current || d.model().profile_name(s.profile_id).is_none() {
            return Err(NOT_SUPPORTED);
        }
        let memory_mb =
            d.model().memory_mib * u64::from(s.memory_slices) / u64::from(MEMORY_SLICES);
        // SAFETY: NVML's contract on `info`.
        unsafe {
            put(
                info,
                nvmlGpuInstanceProfileInfo_t {
                    id: s.profile_id,
                    isP2pSupported: 0,
                    sliceCount: c_uint::from(s.compute_slices),
                    instanceCount: c_uint::from(s.max_per_gpu),
                    // Engine and SM counts are not modelled; nothing in tessera reads them.
                    multiprocessorCount: 0,
                    copyEngineCount: 0,
                    decoderCount: 0,
                    encoderCount: 0,
                    jpegCount: 0,
                    ofaCount: 0,
                    memorySizeMB: memory_mb,
                },
            )
        }
    })
}

/// With `placements` null, `count` receives how many there are.
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
            let found = dev(st, g)
                .gpu_instance_possible_placements(profileId)
                .map_err(nvml_err)?;
            let items: Vec<nvmlGpuInstancePlacement_t> = found
                .iter()
                .map(|p| nvmlGpuInstancePlacement_t {
                    start: c_uint::from(p.start),
                    size: c_uint::from(p.size()),
                })
                .collect();
            // SAFETY: `count` checked; NVML's contract on `placements`.
            let capacity = if placements.is_null() {
                0
            } else {
                unsafe { *count as usize }
            };
            if placements.is_null() {
                return unsafe { put(count, items.len() as c_uint) };
            }
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
        let d = dev(st, g);
        let Some(s) = shape(profileId) else {
            return Err(INVALID_ARGUMENT);
        };
        if !d.mig_mode().current {
            return Err(NOT_SUPPORTED);
        }
        let items: Vec<nvmlGpuInstance_t> = d
            .gpu_instances()
            .iter()
            .filter(|i| i.placement.profile_id == profileId)
            .map(|i| Handle::GpuInstance { gpu: g, gi: i.id }.ptr())
            .collect();
        if gpuInstances.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: NVML's contract: room for the profile's instance count.
        unsafe { put_list(gpuInstances, count, usize::from(s.max_per_gpu), items) }
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
        let d = dev(st, g);
        if !d.mig_mode().current {
            return Err(NOT_SUPPORTED);
        }
        placement_of(d, id)?;
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
        let p = placement_of(dev(st, gpu), gi)?;
        // SAFETY: NVML's contract on `info`.
        unsafe {
            put(
                info,
                nvmlGpuInstanceInfo_t {
                    device: Handle::Device(gpu).ptr(),
                    id: gi,
                    profileId: p.profile_id,
                    placement: nvmlGpuInstancePlacement_t {
                        start: c_uint::from(p.start),
                        size: c_uint::from(p.size()),
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
        dev(st, gpu).destroy_gpu_instance(gi).map_err(nvml_err)
    })
}

// ----- compute instances -----

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
        dev(st, gpu)
            .destroy_compute_instance(gi, ci)
            .map_err(nvml_err)
    })
}

// ----- MIG devices -----

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
        let max = if dev(st, g).model().is_mig_capable() {
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
        let d = dev(st, g);
        if !d.mig_mode().current {
            return Err(NOT_SUPPORTED);
        }
        let &(gi, ci) = mig_devices(d).get(index as usize).ok_or(NOT_FOUND)?;
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

// ----- processes -----

/// On the GPU's handle: every process, with its instance ids; on a MIG device's handle: the
/// processes of that compute instance. With `infos` null, or too small, `infoCount` receives
/// the count needed and the answer is `INSUFFICIENT_SIZE` (`SUCCESS` when there are none).
///
/// # Safety
/// `infoCount` is null or valid; `infos` is null or valid for `*infoCount` elements.
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
            if items.is_empty() {
                return unsafe { put(infoCount, 0) };
            }
            unsafe { put_list(infos, infoCount, capacity, items) }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_garbage_is_no_handle() {
        for h in [
            Handle::Device(0),
            Handle::Device(7),
            Handle::Mig {
                gpu: 3,
                gi: 5,
                ci: 0,
            },
            Handle::GpuInstance { gpu: 1, gi: 6 },
            Handle::ComputeInstance {
                gpu: 2,
                gi: 4,
                ci: 1,
            },
        ] {
            assert_eq!(Handle::from_addr(h.addr()), Some(h));
            assert_ne!(h.addr(), 0);
        }
        assert_eq!(Handle::from_addr(0), None);
        assert_eq!(Handle::from_addr(0x1000), None);
    }

    #[test]
    fn full_size_compute_profiles_follow_nvml_h() {
        assert_eq!(full_compute_instance_profile(1), Some(0));
        assert_eq!(full_compute_instance_profile(3), Some(2));
        assert_eq!(full_compute_instance_profile(7), Some(4));
        assert_eq!(full_compute_instance_profile(5), None);
    }
}
