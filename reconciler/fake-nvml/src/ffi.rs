//! One NVML call: initialisation, the state file, faults, and writing results through C
//! out-pointers the way NVML does.

use std::ffi::{c_char, c_uint};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use nvml_wrapper_sys::bindings::*;
use tessera_mig::device::{DeviceError, MigDevice};
use tessera_mig::{NvmlReturn, Placement, shape};

use crate::state::{FakeState, ForeignInstance, STATE_ENV};

pub(crate) const SUCCESS: nvmlReturn_t = NvmlReturn::Success.raw();
pub(crate) const UNINITIALIZED: nvmlReturn_t = NvmlReturn::Uninitialized.raw();
pub(crate) const INVALID_ARGUMENT: nvmlReturn_t = NvmlReturn::InvalidArgument.raw();
pub(crate) const NOT_SUPPORTED: nvmlReturn_t = NvmlReturn::NotSupported.raw();
pub(crate) const NO_PERMISSION: nvmlReturn_t = NvmlReturn::NoPermission.raw();
pub(crate) const NOT_FOUND: nvmlReturn_t = NvmlReturn::NotFound.raw();
pub(crate) const INSUFFICIENT_SIZE: nvmlReturn_t = NvmlReturn::InsufficientSize.raw();
pub(crate) const DRIVER_NOT_LOADED: nvmlReturn_t = NvmlReturn::DriverNotLoaded.raw();
pub(crate) const IN_USE: nvmlReturn_t = NvmlReturn::InUse.raw();
pub(crate) const INSUFFICIENT_RESOURCES: nvmlReturn_t = NvmlReturn::InsufficientResources.raw();
pub(crate) const UNKNOWN: nvmlReturn_t = NvmlReturn::Unknown.raw();

/// What NVML puts in a process's instance ids when it runs on no MIG instance.
pub(crate) const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `nvmlInit` reference count; NVML answers `UNINITIALIZED` to calls made outside it. The lock
/// also serialises calls, so one process never interleaves two read-modify-write cycles.
pub(crate) static INIT: Mutex<u32> = Mutex::new(0);

pub(crate) fn lock() -> MutexGuard<'static, u32> {
    INIT.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn state_path() -> Result<PathBuf, String> {
    std::env::var_os(STATE_ENV)
        .map(PathBuf::from)
        .ok_or_else(|| format!("{STATE_ENV} is not set"))
}

/// Runs one NVML call: checks initialisation, loads the state, applies the faults (a `lose`
/// first; a lost GPU answers `GPU_IS_LOST` before a `fail` is counted; `live_only: false` for
/// the few calls a lost GPU still answers), runs `op`, and saves the state if anything changed.
pub(crate) fn call(
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
            return code.raw();
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
pub(crate) fn complain(function: &str, why: &str) -> nvmlReturn_t {
    eprintln!("fake libnvidia-ml: {function}: {why}");
    UNKNOWN
}

pub(crate) fn dev(st: &mut FakeState, gpu: u32) -> &mut MigDevice {
    &mut st.gpus[gpu as usize].device
}

pub(crate) fn nvml_err(e: DeviceError) -> nvmlReturn_t {
    e.nvml_return().raw()
}

/// `NO_PERMISSION` unless the caller holds the MIG capability (`monitor` to read instances,
/// `config` to change them).
pub(crate) fn permitted(capability: bool) -> Result<(), nvmlReturn_t> {
    if capability {
        Ok(())
    } else {
        Err(NO_PERMISSION)
    }
}

/// The hand-made instances of a profile tessera's catalog does not know, on GPU `gpu`.
pub(crate) fn foreign(st: &FakeState, gpu: u32) -> &[ForeignInstance] {
    &st.gpus[gpu as usize].foreign
}

/// Writes `v` through `out`, refusing a null pointer as NVML does.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) -> Result<(), nvmlReturn_t> {
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
pub(crate) unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), nvmlReturn_t> {
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
pub(crate) unsafe fn put_list<T>(
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

/// The MIG devices (one per compute instance, the foreign instances' included) in NVML's index
/// order: by GPU instance id, then compute instance id.
pub(crate) fn mig_devices(d: &MigDevice, foreign: &[ForeignInstance]) -> Vec<(u32, u32)> {
    let mut all: Vec<(u32, u32)> = d
        .gpu_instances()
        .iter()
        .flat_map(|g| g.compute_instances.iter().map(move |c| (g.id, c.id)))
        .chain(foreign.iter().map(|f| (f.id, 0)))
        .collect();
    all.sort_unstable();
    all
}

pub(crate) fn placement_of(d: &MigDevice, gi: u32) -> Result<Placement, nvmlReturn_t> {
    d.gpu_instance(gi).map(|g| g.placement).ok_or(NOT_FOUND)
}

pub(crate) fn compute_slices(profile_id: u32) -> Result<u8, nvmlReturn_t> {
    shape(profile_id)
        .map(|s| s.compute_slices)
        .ok_or(INVALID_ARGUMENT)
}
