//! Reading one GPU through NVML: identity, MIG mode, GPU and compute instances, MIG device
//! UUIDs, processes. Any failed call fails the whole read, so a GPU is never reported half
//! read.

use std::collections::BTreeMap;
use std::ffi::c_uint;
use std::ptr;

use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlDevice_t, nvmlGpuInstance_t,
    nvmlGpuInstanceProfileInfo_t, nvmlMemory_t, nvmlProcessInfo_t,
};
use tessera_compiler::model::{Gpu, Health, MigInstance, MigState};
use tessera_mig::{GpuModel, SHAPES};

use super::{INSUFFICIENT_SIZE, NO_INSTANCE, NOT_FOUND, NOT_SUPPORTED, NvmlDriver, check, model};
use crate::driver::{
    ComputeInstanceInfo, DriverError, GpuDetail, GpuInstanceInfo, GpuProcess, GpuRef,
};

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
            // Indices past the MIG devices that exist answer NOT_FOUND.
            if ret == NOT_FOUND {
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

    /// The GPU instances (with their compute instances, UUIDs not yet filled) of one GPU.
    fn instances(
        &self,
        gpu: &GpuRef,
        h: nvmlDevice_t,
        model: &GpuModel,
    ) -> Result<Vec<GpuInstanceInfo>, DriverError> {
        let mut out = Vec::new();
        for s in SHAPES.iter() {
            if model.profile_name(s.profile_id).is_none() {
                continue;
            }
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
                nvmlDeviceGetGpuInstanceProfileInfo(h, s.nvml_enum, &mut info)
            );
            // A driver older than the catalog may not offer a profile (1g.20gb came later):
            // then the GPU has no instance of it.
            if ret == NOT_SUPPORTED {
                continue;
            }
            check(gpu, call, ret)?;
            if info.id != s.profile_id {
                return Err(DriverError::Other(format!(
                    "{gpu}: NVML gives profile ID {} for profile enum {}, tessera's catalog {}",
                    info.id, s.nvml_enum, s.profile_id
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
                let ci_profile = self.compute_profile(gpu, gi, info.id)?;
                let mut cis: Vec<nvmlComputeInstance_t> =
                    vec![ptr::null_mut(); ci_profile.instanceCount as usize];
                let mut n: c_uint = 0;
                nvml!(
                    self,
                    gpu,
                    nvmlGpuInstanceGetComputeInstances(gi, ci_profile.id, cis.as_mut_ptr(), &mut n)
                )?;
                cis.truncate(n as usize);
                let mut compute_instances = Vec::with_capacity(cis.len());
                for ci in cis {
                    let ci_info = self.compute_instance_info(gpu, ci)?;
                    compute_instances.push(ComputeInstanceInfo {
                        id: ci_info.id,
                        uuid: String::new(),
                    });
                }
                compute_instances.sort_by_key(|c| c.id);
                out.push(GpuInstanceInfo {
                    id: gi_info.id,
                    profile_id: gi_info.profileId,
                    start,
                    compute_instances,
                });
            }
        }
        out.sort_by_key(|g| g.id);
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

    fn processes(&self, gpu: &GpuRef, h: nvmlDevice_t) -> Result<Vec<GpuProcess>, DriverError> {
        let mut infos: Vec<nvmlProcessInfo_t> = Vec::new();
        // The list can grow between asking its length and reading it: ask again then.
        for _ in 0..4 {
            let mut n = infos.len() as c_uint;
            let (ret, call) = nvml_call!(
                self,
                gpu,
                nvmlDeviceGetComputeRunningProcesses_v3(
                    h,
                    &mut n,
                    if infos.is_empty() {
                        ptr::null_mut()
                    } else {
                        infos.as_mut_ptr()
                    }
                )
            );
            if ret == INSUFFICIENT_SIZE {
                let blank = nvmlProcessInfo_t {
                    pid: 0,
                    usedGpuMemory: 0,
                    gpuInstanceId: 0,
                    computeInstanceId: 0,
                };
                infos = vec![blank; n as usize + 4];
                continue;
            }
            check(gpu, call, ret)?;
            infos.truncate(n as usize);
            let mut out: Vec<GpuProcess> = infos
                .iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    gpu_instance: (p.gpuInstanceId != NO_INSTANCE).then_some(p.gpuInstanceId),
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
        let mut instances = if current {
            self.instances(&at, h, &model)?
        } else {
            Vec::new()
        };
        if current {
            let uuids = self.mig_uuids(&at, h)?;
            for gi in &mut instances {
                for ci in &mut gi.compute_instances {
                    ci.uuid = uuids.get(&(gi.id, ci.id)).cloned().ok_or_else(|| {
                        DriverError::Other(format!(
                            "{at}: compute instance {} of GPU instance {} has no MIG device",
                            ci.id, gi.id
                        ))
                    })?;
                }
            }
        }
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
        let gpu = Gpu {
            index,
            uuid,
            model: model.name.clone(),
            health: Health::Healthy,
            mig: MigState {
                enabled: current,
                pending: (pending != current).then_some(pending),
            },
            instances: shown,
        };
        let detail = GpuDetail {
            gpu: at,
            instances,
            processes,
        };
        Ok((gpu, detail))
    }
}
