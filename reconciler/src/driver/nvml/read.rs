//! Reading one GPU through NVML: identity, MIG mode, GPU and compute instances, MIG device
//! UUIDs, processes. Any failed call fails the whole read, so a GPU is never reported half
//! read.

use std::collections::BTreeMap;
use std::ffi::c_uint;
use std::ptr;

use nvml_wrapper_sys::bindings::{
    NVML_GPU_INSTANCE_PROFILE_COUNT, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t,
    nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceProfileInfo_t, nvmlMemory_t, nvmlUtilization_t,
};
use tessera_compiler::model::{Gpu, Health, MigInstance, MigState};
use tessera_mig::{NvmlReturn, shape_by_nvml_enum};

use super::version::WIDE_PROCESS_INFO;
use super::{NO_INSTANCE, NvmlDriver, check, model};
use crate::driver::{
    ComputeInstanceInfo, DriverError, GpuDetail, GpuInstanceInfo, GpuProcess, GpuRef,
    GpuUtilization,
};

/// Where `nvmlProcessInfo_t`'s fields sit, in either layout (see [`super::version`]).
const PID_AT: usize = 0;
const GPU_INSTANCE_AT: usize = 16;

fn u32_at(entry: &[u8], at: usize) -> u32 {
    let mut b = [0; 4];
    b.copy_from_slice(&entry[at..at + 4]);
    u32::from_ne_bytes(b)
}

impl NvmlDriver {
    /// The MIG device UUID of each (GPU instance, compute instance).
    pub(super) fn mig_uuids(
        &self,
        gpu: &GpuRef,
        h: nvmlDevice_t,
    ) -> Result<BTreeMap<(u32, u32), String>, DriverError> {
        let mut max: c_uint = 0;
        nvml!(self, gpu, nvmlDeviceGetMaxMigDeviceCount(h, &mut max))?;
        let mut out = BTreeMap::new();
        for index in 0..max {
            let mut mig: nvmlDevice_t = ptr::null_mut();
            let (ret, call) = nvml_call!(
                self,
                gpu,
                nvmlDeviceGetMigDeviceHandleByIndex(h, index, &mut mig)
            );
            // An index with no MIG device answers NOT_FOUND (driver 580.159.04) or
            // INVALID_ARGUMENT (skipped by NVIDIA's device plugin too): an empty slot either way.
            if matches!(
                NvmlReturn::from_raw(ret),
                NvmlReturn::NotFound | NvmlReturn::InvalidArgument
            ) {
                continue;
            }
            check(gpu, call, ret)?;
            let (mut gi, mut ci): (c_uint, c_uint) = (0, 0);
            nvml!(self, gpu, nvmlDeviceGetGpuInstanceId(mig, &mut gi))?;
            nvml!(self, gpu, nvmlDeviceGetComputeInstanceId(mig, &mut ci))?;
            out.insert((gi, ci), self.string(gpu, mig, true)?);
        }
        Ok(out)
    }

    /// The GPU instances of one GPU, of every profile NVML reports (not only the catalog's:
    /// an instance made by hand, or of a newer profile, still occupies its slices), with their
    /// compute instances from the MIG devices `uuids` lists; each with its size in memory
    /// slices, which for a profile the catalog does not know only NVML can say.
    pub(super) fn instances(
        &self,
        gpu: &GpuRef,
        h: nvmlDevice_t,
        uuids: &BTreeMap<(u32, u32), String>,
    ) -> Result<Vec<(GpuInstanceInfo, u8)>, DriverError> {
        let mut out = Vec::new();
        for nvml_enum in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            let mut info = nvmlGpuInstanceProfileInfo_t {
                id: 0,
                isP2pSupported: 0,
                sliceCount: 0,
                instanceCount: 0,
                multiprocessorCount: 0,
                copyEngineCount: 0,
                decoderCount: 0,
                encoderCount: 0,
                jpegCount: 0,
                ofaCount: 0,
                memorySizeMB: 0,
            };
            let (ret, call) = nvml_call!(
                self,
                gpu,
                nvmlDeviceGetGpuInstanceProfileInfo(h, nvml_enum, &mut info)
            );
            // NOT_SUPPORTED: the GPU does not offer the profile (driver 580.159.04 on an H100:
            // enums 5, 6, 8 and 10 to 16). INVALID_ARGUMENT: a driver older than these bindings
            // does not know the enum. Either way it has no instance of it.
            if matches!(
                NvmlReturn::from_raw(ret),
                NvmlReturn::NotSupported | NvmlReturn::InvalidArgument
            ) {
                continue;
            }
            check(gpu, call, ret)?;
            if let Some(s) = shape_by_nvml_enum(nvml_enum)
                && info.id != s.profile_id
            {
                return Err(DriverError::Other(format!(
                    "{gpu}: NVML gives profile ID {} for profile enum {nvml_enum}, tessera's \
                     catalog {}",
                    info.id, s.profile_id
                )));
            }
            // NVML fills at most the profile's instance count, and wants room for all of them.
            let mut gis: Vec<nvmlGpuInstance_t> =
                vec![ptr::null_mut(); info.instanceCount as usize];
            let mut count: c_uint = 0;
            nvml!(
                self,
                gpu,
                nvmlDeviceGetGpuInstances(h, info.id, gis.as_mut_ptr(), &mut count)
            )?;
            gis.truncate(count as usize);
            for gi in gis {
                let gi_info = self.gpu_instance_info(gpu, gi)?;
                let start = u8::try_from(gi_info.placement.start).map_err(|_| {
                    DriverError::Other(format!(
                        "{gpu}: GPU instance {} starts at slice {}",
                        gi_info.id, gi_info.placement.start
                    ))
                })?;
                let size = u8::try_from(gi_info.placement.size).map_err(|_| {
                    DriverError::Other(format!(
                        "{gpu}: GPU instance {} spans {} slices",
                        gi_info.id, gi_info.placement.size
                    ))
                })?;
                let compute_instances = uuids
                    .range((gi_info.id, 0)..=(gi_info.id, u32::MAX))
                    .map(|(&(_, ci), uuid)| ComputeInstanceInfo {
                        id: ci,
                        uuid: uuid.clone(),
                    })
                    .collect();
                let info = GpuInstanceInfo {
                    id: gi_info.id,
                    profile_id: gi_info.profileId,
                    start,
                    compute_instances,
                    // Sampled after the read ([`super::gpm`]).
                    sm_activity: None,
                };
                out.push((info, size));
            }
        }
        out.sort_by_key(|(g, _)| g.id);
        out.dedup_by_key(|(g, _)| g.id);
        Ok(out)
    }

    pub(super) fn compute_instance_info(
        &self,
        gpu: &GpuRef,
        ci: nvmlComputeInstance_t,
    ) -> Result<nvmlComputeInstanceInfo_t, DriverError> {
        let mut info = nvmlComputeInstanceInfo_t {
            device: ptr::null_mut(),
            gpuInstance: ptr::null_mut(),
            id: 0,
            profileId: 0,
            placement: nvml_wrapper_sys::bindings::nvmlComputeInstancePlacement_t {
                start: 0,
                size: 0,
            },
        };
        nvml!(self, gpu, nvmlComputeInstanceGetInfo_v2(ci, &mut info))?;
        Ok(info)
    }

    /// The processes on a GPU. Entries are read at the stride this driver version writes
    /// ([`super::version`]) from a buffer with room for the wider layout, so that neither
    /// layout can overflow it.
    fn processes(&self, gpu: &GpuRef, h: nvmlDevice_t) -> Result<Vec<GpuProcess>, DriverError> {
        let stride = self.process_stride;
        // u64s: NVML's entries hold 8-byte fields, so the buffer is aligned for them.
        let mut buf: Vec<u64> = Vec::new();
        let mut capacity: usize = 0;
        // The list can grow between asking its length and reading it: ask again then.
        for _ in 0..4 {
            let mut n = capacity as c_uint;
            let (ret, call) = nvml_call!(
                self,
                gpu,
                nvmlDeviceGetComputeRunningProcesses_v3(
                    h,
                    &mut n,
                    if capacity == 0 {
                        ptr::null_mut()
                    } else {
                        buf.as_mut_ptr().cast()
                    }
                )
            );
            if NvmlReturn::from_raw(ret) == NvmlReturn::InsufficientSize {
                capacity = n as usize + 4;
                buf = vec![0; capacity * WIDE_PROCESS_INFO / 8];
                continue;
            }
            check(gpu, call, ret)?;
            let n = (n as usize).min(capacity);
            // SAFETY: a u64 buffer viewed as its bytes.
            let bytes: &[u8] =
                unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), buf.len() * 8) };
            let mut out: Vec<GpuProcess> = bytes
                .chunks_exact(stride)
                .take(n)
                .map(|entry| {
                    let gi = u32_at(entry, GPU_INSTANCE_AT);
                    GpuProcess {
                        pid: u32_at(entry, PID_AT),
                        gpu_instance: (gi != NO_INSTANCE).then_some(gi),
                    }
                })
                .collect();
            out.sort_by_key(|p| (p.pid, p.gpu_instance));
            out.dedup();
            return Ok(out);
        }
        Err(DriverError::Other(format!(
            "{gpu}: the process list kept growing while it was read"
        )))
    }

    /// The GPU's utilization rates; `None` where NVML does not report them (`NOT_SUPPORTED`:
    /// a GPU in MIG mode, or a model without the counters).
    fn utilization(
        &self,
        gpu: &GpuRef,
        h: nvmlDevice_t,
    ) -> Result<Option<GpuUtilization>, DriverError> {
        let mut rates = nvmlUtilization_t { gpu: 0, memory: 0 };
        let (ret, call) = nvml_call!(self, gpu, nvmlDeviceGetUtilizationRates(h, &mut rates));
        if NvmlReturn::from_raw(ret) == NvmlReturn::NotSupported {
            return Ok(None);
        }
        check(gpu, call, ret)?;
        Ok(Some(GpuUtilization {
            gpu_percent: rates.gpu.min(100),
            memory_percent: rates.memory.min(100),
        }))
    }

    /// Reads one GPU completely; any NVML failure (a lost GPU included) fails the whole read.
    pub(super) fn read_gpu(&self, index: u32) -> Result<(Gpu, GpuDetail), DriverError> {
        let at = self.gpu_ref(index);
        let h = self.handle(&at)?;
        let name = self.string(&at, h, false)?;
        let uuid = self.string(&at, h, true)?;
        let mut memory = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        nvml!(self, &at, nvmlDeviceGetMemoryInfo(h, &mut memory))?;
        let model = model::catalog_model(&name, memory.total)
            .map_err(|e| DriverError::Other(format!("{at}: {e}")))?;
        let (mut current, mut pending): (c_uint, c_uint) = (0, 0);
        if model.is_mig_capable() {
            nvml!(
                self,
                &at,
                nvmlDeviceGetMigMode(h, &mut current, &mut pending)
            )?;
        }
        let (current, pending) = (current == 1, pending == 1);
        let instances: Vec<GpuInstanceInfo> = if current {
            let uuids = self.mig_uuids(&at, h)?;
            let listed = self.instances(&at, h, &uuids)?;
            listed.into_iter().map(|(gi, _)| gi).collect()
        } else {
            Vec::new()
        };
        let processes = self.processes(&at, h)?;
        let mut shown: Vec<MigInstance> = instances
            .iter()
            .map(|gi| MigInstance {
                profile: model
                    .profile_name(gi.profile_id)
                    .map_or_else(|| gi.profile_id.to_string(), str::to_owned),
                start: gi.start,
                uuid: gi.compute_instances.first().map(|c| c.uuid.clone()),
            })
            .collect();
        shown.sort_by_key(|i| i.start);
        // An instance of a profile the catalog does not know is reported with its profile ID
        // (so its slices count as occupied, and the solver names it), and the GPU as degraded:
        // tessera places nothing new on a GPU it cannot fully describe.
        let foreign = instances
            .iter()
            .any(|gi| model.profile_name(gi.profile_id).is_none());
        let gpu = Gpu {
            index,
            uuid,
            model: model.name.clone(),
            health: if foreign {
                Health::Degraded
            } else {
                Health::Healthy
            },
            mig: MigState {
                enabled: current,
                pending: (pending != current).then_some(pending),
            },
            instances: shown,
        };
        let utilization = self.utilization(&at, h)?;
        let detail = GpuDetail {
            gpu: at,
            instances,
            processes,
            utilization,
            sm_activity: None,
        };
        Ok((gpu, detail))
    }
}
