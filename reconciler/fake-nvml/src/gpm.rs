//! GPU Performance Monitoring (`nvmlGpm*`): support, sample buffers, samples of a GPU or of
//! one MIG instance, and the metrics between two samples.
//!
//! A sample buffer is memory this library allocates (`nvmlGpmSampleAlloc`) and frees
//! (`nvmlGpmSampleFree`), as NVML's are. A sample records the figures the state file holds when
//! it is taken, what it is of (GPU, GPU instance) and its place in the order samples were
//! taken; `nvmlGpmMetricsGet` answers the later one's figures for `SM_UTIL` and `SM_OCCUPANCY`,
//! in percent, with NVML's names for them.
//!
//! As a real H100 answered (driver 580.159.04, `evidence/h100-580.159.04-gpm.txt`): one sample
//! twice, or one never filled, is `INVALID_ARGUMENT`; two samples in either order are measured;
//! a struct version other than 1 is `ARGUMENT_VERSION_MISMATCH`; a MIG sample of a GPU with
//! MIG off is `INVALID_ARGUMENT`; freeing NULL succeeds. Beyond the evidence: samples of two
//! scopes are `INVALID_ARGUMENT`, and every metric but those two answers `NOT_SUPPORTED` in its
//! own entry (the H100 computes them all; the driver asks for none).

use std::ffi::c_uint;
use std::sync::atomic::{AtomicU64, Ordering};

use nvml_wrapper_sys::bindings::*;
use tessera_mig::NvmlReturn;

use crate::ffi::*;
use crate::handle::{Handle, handle};
use crate::state::FakeSmActivity;

/// Tells a buffer this library allocated from anything else handed to it.
const MAGIC: u64 = 0x6770_6d5f_7361_6d70;

/// Orders samples across every buffer of this process.
static NEXT_SAMPLE: AtomicU64 = AtomicU64::new(1);

/// What `nvmlGpmSample_t` points at.
struct Sample {
    magic: u64,
    taken: Option<Taken>,
}

#[derive(Clone, Copy)]
struct Taken {
    gpu: u32,
    /// `None`: the whole GPU.
    gpu_instance: Option<u32>,
    order: u64,
    activity: FakeSmActivity,
}

const ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = NvmlReturn::ArgumentVersionMismatch.raw();

/// The buffer behind `p`, if this library allocated it.
///
/// # Safety
/// `p` is null or a pointer `nvmlGpmSampleAlloc` returned and `nvmlGpmSampleFree` has not
/// freed (NVML's contract on sample handles).
unsafe fn sample<'a>(p: nvmlGpmSample_t) -> Option<&'a mut Sample> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per the caller's contract, `p` came from `Box::into_raw` in nvmlGpmSampleAlloc.
    let s = unsafe { &mut *p.cast::<Sample>() };
    (s.magic == MAGIC).then_some(s)
}

fn initialised() -> Result<(), nvmlReturn_t> {
    if *lock() == 0 {
        Err(UNINITIALIZED)
    } else {
        Ok(())
    }
}

/// # Safety
/// `gpmSample` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(gpmSample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    if let Err(code) = initialised() {
        return code;
    }
    if gpmSample.is_null() {
        return INVALID_ARGUMENT;
    }
    let buffer = Box::into_raw(Box::new(Sample {
        magic: MAGIC,
        taken: None,
    }));
    // SAFETY: non-null, and valid for a write per NVML's contract.
    unsafe { gpmSample.write(buffer.cast()) };
    SUCCESS
}

/// # Safety
/// `gpmSample` is null or a live buffer from `nvmlGpmSampleAlloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleFree(gpmSample: nvmlGpmSample_t) -> nvmlReturn_t {
    if gpmSample.is_null() {
        return SUCCESS;
    }
    // SAFETY: per the caller's contract.
    let Some(s) = (unsafe { sample(gpmSample) }) else {
        return INVALID_ARGUMENT;
    };
    s.magic = 0;
    // SAFETY: allocated by Box::into_raw in nvmlGpmSampleAlloc, freed once (magic cleared).
    drop(unsafe { Box::from_raw(gpmSample.cast::<Sample>()) });
    SUCCESS
}

/// # Safety
/// `gpmSupport` is null or valid for a read and a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    gpmSupport: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlGpmQueryDeviceSupport", Some(g), true, |st| {
        if gpmSupport.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null, valid per NVML's contract.
        let support = unsafe { &mut *gpmSupport };
        if support.version != NVML_GPM_SUPPORT_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        support.isSupportedDevice = c_uint::from(st.gpus[g as usize].gpm.is_some());
        Ok(())
    })
}

/// # Safety
/// `gpmSample` is null or a live buffer from `nvmlGpmSampleAlloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: nvmlDevice_t,
    gpmSample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlGpmSampleGet", Some(g), true, |st| {
        // SAFETY: per the caller's contract.
        let s = unsafe { sample(gpmSample) }.ok_or(INVALID_ARGUMENT)?;
        let gpm = st.gpus[g as usize].gpm.as_ref().ok_or(NOT_SUPPORTED)?;
        s.taken = Some(taken(g, None, gpm.gpu));
        Ok(())
    })
}

/// # Safety
/// `gpmSample` is null or a live buffer from `nvmlGpmSampleAlloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpuInstanceId: c_uint,
    gpmSample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    let Some(Handle::Device(g)) = handle(device) else {
        return INVALID_ARGUMENT;
    };
    call("nvmlGpmMigSampleGet", Some(g), true, |st| {
        // SAFETY: per the caller's contract.
        let s = unsafe { sample(gpmSample) }.ok_or(INVALID_ARGUMENT)?;
        let gpu = &st.gpus[g as usize];
        let gpm = gpu.gpm.as_ref().ok_or(NOT_SUPPORTED)?;
        let exists = gpu.device.gpu_instance(gpuInstanceId).is_some()
            || gpu.foreign.iter().any(|f| f.id == gpuInstanceId);
        // With MIG off there is no instance: the H100 answered INVALID_ARGUMENT.
        if !gpu.device.mig_mode().current || !exists {
            return Err(INVALID_ARGUMENT);
        }
        let activity = *gpm.instances.get(&gpuInstanceId).ok_or(NOT_SUPPORTED)?;
        s.taken = Some(taken(g, Some(gpuInstanceId), activity));
        Ok(())
    })
}

fn taken(gpu: u32, gpu_instance: Option<u32>, activity: FakeSmActivity) -> Taken {
    Taken {
        gpu,
        gpu_instance,
        order: NEXT_SAMPLE.fetch_add(1, Ordering::Relaxed),
        activity,
    }
}

/// # Safety
/// `metricsGet` is null or valid for a read and a write; its samples are null or live buffers
/// from `nvmlGpmSampleAlloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(metricsGet: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    if let Err(code) = initialised() {
        return code;
    }
    if metricsGet.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null, valid per NVML's contract.
    let m = unsafe { &mut *metricsGet };
    if m.version != NVML_GPM_METRICS_GET_VERSION {
        return ARGUMENT_VERSION_MISMATCH;
    }
    if m.numMetrics as usize > m.metrics.len() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: per the caller's contract.
    let (first, second) = unsafe { (sample(m.sample1), sample(m.sample2)) };
    let (Some(Some(first)), Some(Some(second))) = (first.map(|s| s.taken), second.map(|s| s.taken))
    else {
        return INVALID_ARGUMENT;
    };
    if (first.gpu, first.gpu_instance) != (second.gpu, second.gpu_instance)
        || first.order == second.order
    {
        return INVALID_ARGUMENT;
    }
    let later = if first.order < second.order {
        second
    } else {
        first
    };
    for metric in &mut m.metrics[..m.numMetrics as usize] {
        // Names as the H100 gave them.
        let value = if metric.metricId == nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL {
            Some((later.activity.sm_util, c"smutil", c"SM_UTIL"))
        } else if metric.metricId == nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY {
            Some((later.activity.sm_occupancy, c"smocc", c"SM_OCCUPANCY"))
        } else {
            None
        };
        match value {
            Some((v, short, long)) => {
                metric.nvmlReturn = SUCCESS;
                metric.value = v;
                // Static strings: NVML's are its own too, never freed by the caller.
                metric.metricInfo.shortName = short.as_ptr().cast_mut();
                metric.metricInfo.longName = long.as_ptr().cast_mut();
                metric.metricInfo.unit = c"%".as_ptr().cast_mut();
            }
            None => metric.nvmlReturn = NOT_SUPPORTED,
        }
    }
    SUCCESS
}
