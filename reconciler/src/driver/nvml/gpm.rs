//! SM activity through NVML's GPU Performance Monitoring (GPM, Hopper and later).
//!
//! GPM measures between two samples: `nvmlGpmSampleGet` (or `nvmlGpmMigSampleGet` for one MIG
//! instance) fills a buffer, and `nvmlGpmMetricsGet` computes a metric over the interval
//! between two buffers of the same scope. Rather than sleep inside an observation, the driver
//! keeps each scope's last sample and measures from it to the next observation's: the
//! interval is the time between observations (the reconcile cycle), and the first observation
//! of a scope reports nothing.
//!
//! A scope is a GPU or one of its GPU instances, named with the instance's profile and
//! placement, so that an instance destroyed and made again under the same id starts over
//! instead of being measured across the change. Samples of scopes an observation no longer
//! sees are freed.
//!
//! Where GPM is not there (a GPU before Hopper, a driver without the symbols, `NOT_SUPPORTED`
//! for a MIG instance) the activity is `None`. So it is where a GPM call fails otherwise: a
//! measurement that cannot be taken must not stop the reconcile loop, whose observation is
//! about geometry and processes. Such a failure is logged once per distinct error; only a lost
//! GPU fails the read (it is reported lost, as for any call).

use std::collections::BTreeMap;
use std::ptr;

use nvml_wrapper_sys::bindings::{
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION, nvmlDevice_t,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY, nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL,
    nvmlGpmMetricsGet_t, nvmlGpmSample_t, nvmlGpmSupport_t,
};

use tracing::warn;

use super::{NvmlDriver, SUCCESS, check};
use crate::driver::{DriverError, GpuDetail, GpuRef, NvmlReturn, SmActivity};

/// What one sample is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Scope {
    gpu: u32,
    /// (GPU instance id, profile id, first memory slice); `None`: the whole GPU.
    instance: Option<(u32, u32, u8)>,
}

/// A sample buffer NVML allocated for this driver.
pub(super) struct Sample(nvmlGpmSample_t);

// SAFETY: a sample buffer is memory NVML handed to this driver alone; it is only touched through
// `&mut NvmlDriver`, so never from two threads at once.
unsafe impl Send for Sample {}

impl NvmlDriver {
    /// Whether the GPU supports GPM; a library without the GPM symbols (a driver before R520)
    /// does not.
    fn gpm_supported(&self, gpu: &GpuRef, h: nvmlDevice_t) -> Result<bool, DriverError> {
        if self.nvml.lib().nvmlGpmQueryDeviceSupport.is_err() {
            return Ok(false);
        }
        let mut support = nvmlGpmSupport_t {
            version: NVML_GPM_SUPPORT_VERSION,
            isSupportedDevice: 0,
        };
        let (ret, call) = nvml_call!(self, gpu, nvmlGpmQueryDeviceSupport(h, &mut support));
        if NvmlReturn::from_raw(ret) == NvmlReturn::NotSupported {
            return Ok(false);
        }
        check(gpu, call, ret)?;
        Ok(support.isSupportedDevice != 0)
    }

    /// Samples the GPU of `detail` and each of its GPU instances, filling their SM activity
    /// from the previous observation's samples. Samples of this GPU's scopes not sampled now
    /// (instances gone, or GPM gone) are freed.
    pub(super) fn sample_gpm(
        &mut self,
        h: nvmlDevice_t,
        detail: &mut GpuDetail,
    ) -> Result<(), DriverError> {
        let gpu = detail.gpu.clone();
        let mut sampled = Vec::new();
        let supported = self.gpm_supported(&gpu, h);
        if self.tolerated(supported)?.unwrap_or(false) {
            let whole = Scope {
                gpu: gpu.index,
                instance: None,
            };
            let measured = self.measure(&gpu, h, whole);
            detail.sm_activity = self.tolerated(measured)?.flatten();
            sampled.push(whole);
            for gi in &mut detail.instances {
                let scope = Scope {
                    gpu: gpu.index,
                    instance: Some((gi.id, gi.profile_id, gi.start)),
                };
                let measured = self.measure(&gpu, h, scope);
                gi.sm_activity = self.tolerated(measured)?.flatten();
                sampled.push(scope);
            }
        }
        let stale: Vec<Scope> = self
            .gpm_samples
            .keys()
            .filter(|s| s.gpu == gpu.index && !sampled.contains(s))
            .copied()
            .collect();
        for scope in stale {
            if let Some(old) = self.gpm_samples.remove(&scope) {
                self.free_sample(old);
            }
        }
        Ok(())
    }

    /// A GPM result, with its failure turned into nothing reported (logged the first time it
    /// is seen); a lost GPU stays an error.
    fn tolerated<T>(&mut self, result: Result<T, DriverError>) -> Result<Option<T>, DriverError> {
        match result {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code() == Some(NvmlReturn::GpuIsLost) => Err(e),
            Err(e) => {
                if self.gpm_warned.insert(e.to_string()) {
                    warn!("SM activity not reported: {e}");
                }
                Ok(None)
            }
        }
    }

    /// Takes a sample of `scope`; the activity since its previous sample, if it has one and
    /// the scope reports it. The new sample replaces the previous one.
    fn measure(
        &mut self,
        gpu: &GpuRef,
        h: nvmlDevice_t,
        scope: Scope,
    ) -> Result<Option<SmActivity>, DriverError> {
        let mut buffer: nvmlGpmSample_t = ptr::null_mut();
        nvml!(self, gpu, nvmlGpmSampleAlloc(&mut buffer))?;
        let new = Sample(buffer);
        let (ret, call) = match scope.instance {
            None => nvml_call!(self, gpu, nvmlGpmSampleGet(h, new.0)),
            Some((id, _, _)) => nvml_call!(self, gpu, nvmlGpmMigSampleGet(h, id, new.0)),
        };
        if ret != SUCCESS {
            self.free_sample(new);
            if let Some(old) = self.gpm_samples.remove(&scope) {
                self.free_sample(old);
            }
            if NvmlReturn::from_raw(ret) == NvmlReturn::NotSupported {
                return Ok(None);
            }
            return check(gpu, call, ret).map(|()| None);
        }
        let activity = match self.gpm_samples.remove(&scope) {
            Some(old) => {
                let between = self.metrics(gpu, &old, &new);
                self.free_sample(old);
                match between {
                    Ok(a) => a,
                    Err(e) => {
                        self.free_sample(new);
                        return Err(e);
                    }
                }
            }
            None => None,
        };
        self.gpm_samples.insert(scope, new);
        Ok(activity)
    }

    /// `SM_UTIL` and `SM_OCCUPANCY` between two samples; `None` if NVML computes either one
    /// not (its own entry's return) or not as a number.
    fn metrics(
        &self,
        gpu: &GpuRef,
        first: &Sample,
        second: &Sample,
    ) -> Result<Option<SmActivity>, DriverError> {
        // SAFETY: every field of the struct is an integer, a float or a raw pointer, for which
        // all zeroes is a valid value (null pointers, as NVML expects in unused entries).
        let mut get: Box<nvmlGpmMetricsGet_t> = Box::new(unsafe { std::mem::zeroed() });
        get.version = NVML_GPM_METRICS_GET_VERSION;
        get.sample1 = first.0;
        get.sample2 = second.0;
        get.numMetrics = 2;
        get.metrics[0].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL;
        get.metrics[1].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY;
        nvml!(self, gpu, nvmlGpmMetricsGet(&mut *get))?;
        let [util, occupancy] = [&get.metrics[0], &get.metrics[1]];
        if util.nvmlReturn != SUCCESS || occupancy.nvmlReturn != SUCCESS {
            return Ok(None);
        }
        Ok(SmActivity::checked(util.value, occupancy.value))
    }

    /// Hands a sample buffer back to NVML. A failure leaks the buffer; nothing else can be done
    /// with it, and the observation goes on.
    fn free_sample(&self, sample: Sample) {
        if let Ok(free) = self.nvml.lib().nvmlGpmSampleFree.as_ref() {
            // SAFETY: the buffer came from nvmlGpmSampleAlloc and is freed once (moved here).
            unsafe { free(sample.0) };
        }
    }

    /// Frees every sample buffer (the driver is going away).
    pub(super) fn free_all_samples(&mut self) {
        let all = std::mem::take(&mut self.gpm_samples);
        for (_, sample) in all {
            self.free_sample(sample);
        }
    }
}

/// The samples the driver keeps between observations.
pub(super) type Samples = BTreeMap<Scope, Sample>;
