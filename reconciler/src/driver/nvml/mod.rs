//! `nvml`: the GPUs of this machine, through NVML (nvml-wrapper loads `libnvidia-ml.so.1` at
//! run time, so the binary builds and starts on machines without a driver).
//!
//! One service drives one node: the machine it runs on. What NVML cannot say about the node
//! (its name, pool, labels, CPU and memory) comes from a `ClusterState` file holding that one
//! node with `gpus: []` (the same file format `--driver sim` reads); the GPUs themselves are
//! discovered through NVML at every observation, and their NVML names are mapped to catalog
//! models by [`model::catalog_model`].
//!
//! nvml-wrapper wraps only part of MIG, and its `possible_placements` returns an empty list, so
//! every call here goes through the raw symbols (`Nvml::lib()`) with the device handle: one
//! path for every return code. Rules this driver follows:
//!
//! - GPU instances are created at an explicit placement, one that
//!   `nvmlDeviceGetGpuInstancePossiblePlacements_v2` lists for the profile and that fits beside
//!   the instances listed now. That call lists every placement of the profile whatever is
//!   occupied (nvml.h), so occupancy is computed here, from the instances of every profile; a
//!   create that cannot fit is refused before anything is asked of the GPU.
//! - Profile info is queried by the NVML profile *enum*; creation, listing and placements take
//!   the profile *ID* the info returns (checked against the catalog's). Instances are listed for
//!   every enum the GPU answers, so an instance of a profile the catalog does not know (made by
//!   hand, or a newer profile) is reported with its profile ID and the GPU as `degraded`, never
//!   left out.
//! - Compute instances are the MIG devices `nvmlDeviceGetMigDeviceHandleByIndex` walks; an
//!   index with no device answers `NOT_FOUND` or `INVALID_ARGUMENT`, both an empty slot.
//! - NVML has no reset call: `nvmlDeviceSetMigMode` itself attempts the reset that activates
//!   the mode and reports how it went in `activationStatus` (the mode stays pending when it
//!   fails). So [`NodeDriver::set_mig_mode`] may already activate the mode (unlike `sim`, where
//!   it stays pending until `reset_gpu`), and [`NodeDriver::reset_gpu`] asks again for the
//!   pending mode and fails with the activation status. A reset that keeps failing (a client
//!   such as the persistence daemon or DCGM holds the GPU) needs an operator:
//!   `nvidia-smi -r -i INDEX` after stopping the client, or a reboot.
//! - A GPU that answers `GPU_IS_LOST` is reported `lost` with the last geometry read from it,
//!   as the `sim` driver reports it.
//! - Processes are whatever NVML lists (`nvmlDeviceGetComputeRunningProcesses_v3`), read at
//!   the entry size the driver's version writes ([`version`]); `process_started` and
//!   `process_ended` are ignored.
//! - SM activity comes from GPM (`gpm.rs`), measured between one observation's sample and the
//!   next; absent where the GPU has no GPM.
//! - Errors name the NVML function that answered and keep its return code as it came
//!   ([`NvmlReturn`]); `NO_PERMISSION` says which MIG capability the user lacks.

pub mod model;
pub mod version;

use std::collections::BTreeMap;
use std::ffi::{CStr, OsStr, c_char, c_uint};
use std::path::Path;
use std::ptr;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    nvmlComputeInstance_t, nvmlComputeInstanceProfileInfo_t, nvmlDevice_t, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlReturn_t,
};
use tessera_compiler::model::{Gpu, Health, Node};
use tessera_mig::{Placement, shape, validate};

use super::{
    ComputeInstanceInfo, DriverError, GpuDetail, GpuInstanceInfo, GpuRef, NodeDriver, NvmlReturn,
    Observation,
};

/// The library loaded when no path is given: the soname every NVIDIA driver installs.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

const SUCCESS: nvmlReturn_t = NvmlReturn::Success.raw();
/// What NVML puts in a process's instance ids when it runs on no MIG instance.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;
/// Room for NVML's UUID and name strings (`NVML_DEVICE_UUID_V2_BUFFER_SIZE` is 96).
const STRING_BUFFER: usize = 96;

/// The driver. See the module documentation.
pub struct NvmlDriver {
    nvml: Nvml,
    library: String,
    /// The node as the descriptor gives it; `gpus` is filled at each observation.
    node: Node,
    /// The last successful read of each GPU, reported (as `lost`) once the GPU is lost.
    last_seen: BTreeMap<u32, (Gpu, GpuDetail)>,
    /// What `nvmlSystemGetDriverVersion` answered.
    driver_version: String,
    /// Bytes between the process entries this driver version writes ([`version`]).
    process_stride: usize,
    /// Each GPM scope's last sample, measured from at the next observation ([`gpm`]).
    gpm_samples: gpm::Samples,
    /// The GPM failures already logged (each once).
    gpm_warned: std::collections::BTreeSet<String>,
}

impl Drop for NvmlDriver {
    fn drop(&mut self) {
        self.free_all_samples();
    }
}

impl std::fmt::Debug for NvmlDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlDriver")
            .field("library", &self.library)
            .field("node", &self.node.name)
            .finish_non_exhaustive()
    }
}

/// An NVML return code as the driver's error for `call` on `gpu`.
fn check(gpu: &GpuRef, call: &'static str, ret: nvmlReturn_t) -> Result<(), DriverError> {
    if ret == SUCCESS {
        Ok(())
    } else {
        Err(DriverError::Nvml {
            gpu: gpu.clone(),
            call,
            code: NvmlReturn::from_raw(ret),
        })
    }
}

/// Whether `want` may join the GPU instances listed (each with its size in memory slices): the
/// catalog's placement rules against the instances of known profiles, and no shared memory
/// slice with an instance of a profile the catalog does not know.
fn fits(listed: &[(GpuInstanceInfo, u8)], want: Placement) -> bool {
    let mut layout: Vec<Placement> = vec![want];
    for (gi, size) in listed {
        if shape(gi.profile_id).is_some() {
            layout.push(Placement::new(gi.profile_id, gi.start));
        } else if gi.start < want.end() && want.start < gi.start + size {
            return false;
        }
    }
    validate(&layout).is_ok()
}

/// Calls the raw NVML function `$name` with `$args`; a symbol the library lacks is an error
/// naming it (an old driver), a non-success return is [`DriverError::Nvml`].
macro_rules! nvml_call {
    ($self:expr, $gpu:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        let f = $self.nvml.lib().$name.as_ref().map_err(|e| {
            DriverError::Other(format!(
                "{}: the library has no {}: {e}",
                $self.library,
                stringify!($name)
            ))
        })?;
        // SAFETY: the arguments follow nvml.h: handles come from this library, and out
        // pointers point at live locals or buffers of the length passed.
        let ret = unsafe { f($($arg),*) };
        (ret, stringify!($name))
    }};
}

/// Like [`nvml_call!`], failing on any return but success.
macro_rules! nvml {
    ($self:expr, $gpu:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        let (ret, call) = nvml_call!($self, $gpu, $name($($arg),*));
        check($gpu, call, ret)
    }};
}

// After the macros, which they use.
mod gpm;
mod read;

/// The full-size compute instance profile (`NVML_COMPUTE_INSTANCE_PROFILE_*`) of a GPU
/// instance with `compute_slices` slices.
fn full_compute_instance_profile(compute_slices: u8) -> Option<c_uint> {
    Some(match compute_slices {
        1 => NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        7 => NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        _ => return None,
    })
}

fn text(buf: &[c_char]) -> String {
    // SAFETY: NVML wrote a NUL-terminated string into the buffer (checked by the caller's
    // success return); the buffer ends with a NUL we put there in any case.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

impl NvmlDriver {
    /// Loads NVML (`lib`, else [`DEFAULT_LIBRARY`] through the loader's search path),
    /// initialises it and reads the GPUs once. `node` describes this machine; its `gpus` must
    /// be empty, since NVML is the one that says which GPUs there are.
    pub fn open(lib: Option<&Path>, node: Node) -> Result<NvmlDriver, DriverError> {
        if !node.gpus.is_empty() {
            return Err(DriverError::Other(format!(
                "node {} lists {} GPU(s); with the nvml driver the GPUs are discovered through \
                 NVML: describe the node with `gpus: []`",
                node.name,
                node.gpus.len()
            )));
        }
        let path: &OsStr = lib.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
        let library = path.to_string_lossy().into_owned();
        let nvml = Nvml::builder().lib_path(path).init().map_err(|e| {
            let reason = match e {
                NvmlError::LibloadingError(e) => e.to_string(),
                other => format!("nvmlInit_v2 failed: {other}"),
            };
            DriverError::Library {
                path: library.clone(),
                reason,
            }
        })?;
        let mut driver = NvmlDriver {
            nvml,
            library,
            node,
            last_seen: BTreeMap::new(),
            driver_version: String::new(),
            process_stride: version::PROCESS_INFO,
            gpm_samples: gpm::Samples::new(),
            gpm_warned: std::collections::BTreeSet::new(),
        };
        driver.driver_version = driver.read_driver_version()?;
        driver.process_stride = version::process_info_stride(&driver.driver_version);
        driver.observe()?;
        Ok(driver)
    }

    /// The library this driver loaded, as given.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The NVIDIA driver's version, as `nvmlSystemGetDriverVersion` gave it.
    pub fn driver_version(&self) -> &str {
        &self.driver_version
    }

    fn read_driver_version(&self) -> Result<String, DriverError> {
        let mut buf: [c_char; STRING_BUFFER] = [0; STRING_BUFFER];
        let at = self.gpu_ref(0);
        nvml!(
            self,
            &at,
            nvmlSystemGetDriverVersion(buf.as_mut_ptr(), STRING_BUFFER as c_uint - 1)
        )?;
        Ok(text(&buf))
    }

    fn gpu_ref(&self, index: u32) -> GpuRef {
        GpuRef {
            node: self.node.name.clone(),
            index,
        }
    }

    fn device_count(&self) -> Result<u32, DriverError> {
        let mut n: c_uint = 0;
        let at = self.gpu_ref(0);
        nvml!(self, &at, nvmlDeviceGetCount_v2(&mut n))?;
        Ok(n)
    }

    fn handle(&self, gpu: &GpuRef) -> Result<nvmlDevice_t, DriverError> {
        if gpu.node != self.node.name || gpu.index >= self.device_count()? {
            return Err(DriverError::UnknownGpu(gpu.clone()));
        }
        let mut h: nvmlDevice_t = ptr::null_mut();
        nvml!(self, gpu, nvmlDeviceGetHandleByIndex_v2(gpu.index, &mut h))?;
        Ok(h)
    }

    fn gpu_instance(&self, gpu: &GpuRef, id: u32) -> Result<nvmlGpuInstance_t, DriverError> {
        let h = self.handle(gpu)?;
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        nvml!(self, gpu, nvmlDeviceGetGpuInstanceById(h, id, &mut gi))?;
        Ok(gi)
    }

    fn gpu_instance_info(
        &self,
        gpu: &GpuRef,
        gi: nvmlGpuInstance_t,
    ) -> Result<nvmlGpuInstanceInfo_t, DriverError> {
        let mut info = nvmlGpuInstanceInfo_t {
            device: ptr::null_mut(),
            id: 0,
            profileId: 0,
            placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
        };
        nvml!(self, gpu, nvmlGpuInstanceGetInfo(gi, &mut info))?;
        Ok(info)
    }

    /// The profile ID of the full-size compute instance of a GPU instance of `profile_id`.
    fn compute_profile(
        &self,
        gpu: &GpuRef,
        gi: nvmlGpuInstance_t,
        profile_id: u32,
    ) -> Result<nvmlComputeInstanceProfileInfo_t, DriverError> {
        let slices = shape(profile_id).map(|s| s.compute_slices).ok_or_else(|| {
            DriverError::Other(format!(
                "{gpu}: NVML reports unknown MIG profile {profile_id}"
            ))
        })?;
        let enum_value = full_compute_instance_profile(slices).ok_or_else(|| {
            DriverError::Other(format!(
                "{gpu}: no compute instance profile of {slices} slices"
            ))
        })?;
        let mut info = nvmlComputeInstanceProfileInfo_t {
            id: 0,
            sliceCount: 0,
            instanceCount: 0,
            multiprocessorCount: 0,
            sharedCopyEngineCount: 0,
            sharedDecoderCount: 0,
            sharedEncoderCount: 0,
            sharedJpegCount: 0,
            sharedOfaCount: 0,
        };
        nvml!(
            self,
            gpu,
            nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                enum_value,
                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info
            )
        )?;
        Ok(info)
    }

    fn string(&self, gpu: &GpuRef, h: nvmlDevice_t, uuid: bool) -> Result<String, DriverError> {
        let mut buf: [c_char; STRING_BUFFER] = [0; STRING_BUFFER];
        let len = STRING_BUFFER as c_uint - 1;
        if uuid {
            nvml!(self, gpu, nvmlDeviceGetUUID(h, buf.as_mut_ptr(), len))?;
        } else {
            nvml!(self, gpu, nvmlDeviceGetName(h, buf.as_mut_ptr(), len))?;
        }
        Ok(text(&buf))
    }
}

impl NodeDriver for NvmlDriver {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn observe(&mut self) -> Result<Observation, DriverError> {
        let count = self.device_count()?;
        let mut node = self.node.clone();
        let mut details = Vec::with_capacity(count as usize);
        for index in 0..count {
            let read = self.read_gpu(index).and_then(|(gpu, mut detail)| {
                let h = self.handle(&detail.gpu)?;
                self.sample_gpm(h, &mut detail)?;
                Ok((gpu, detail))
            });
            match read {
                Ok(read) => {
                    node.gpus.push(read.0.clone());
                    details.push(read.1.clone());
                    self.last_seen.insert(index, read);
                }
                Err(e) if e.code() == Some(NvmlReturn::GpuIsLost) => {
                    // A GPU lost before it was ever read has no geometry to report: that is
                    // an error, not an empty GPU.
                    let Some((gpu, detail)) = self.last_seen.get(&index) else {
                        return Err(e);
                    };
                    let mut gpu = gpu.clone();
                    gpu.health = Health::Lost;
                    node.gpus.push(gpu);
                    // Its geometry is the last read; how busy it was then is not now.
                    let mut detail = detail.clone();
                    detail.utilization = None;
                    detail.sm_activity = None;
                    for gi in &mut detail.instances {
                        gi.sm_activity = None;
                    }
                    details.push(detail);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Observation {
            nodes: vec![node],
            details,
        })
    }

    /// May activate the mode at once (see the module documentation); a failed activation is
    /// not an error here: the mode is pending and `reset_gpu` reports it.
    fn set_mig_mode(&mut self, gpu: &GpuRef, enabled: bool) -> Result<(), DriverError> {
        let h = self.handle(gpu)?;
        let mut activation: nvmlReturn_t = SUCCESS;
        nvml!(
            self,
            gpu,
            nvmlDeviceSetMigMode(h, c_uint::from(enabled), &mut activation)
        )
    }

    fn reset_gpu(&mut self, gpu: &GpuRef) -> Result<(), DriverError> {
        let h = self.handle(gpu)?;
        let (mut current, mut pending): (c_uint, c_uint) = (0, 0);
        nvml!(
            self,
            gpu,
            nvmlDeviceGetMigMode(h, &mut current, &mut pending)
        )?;
        let mut activation: nvmlReturn_t = SUCCESS;
        nvml!(self, gpu, nvmlDeviceSetMigMode(h, pending, &mut activation))?;
        check(gpu, "nvmlDeviceSetMigMode (activation)", activation)
    }

    fn create_gpu_instance(
        &mut self,
        gpu: &GpuRef,
        profile_id: u32,
        start: u8,
    ) -> Result<u32, DriverError> {
        let h = self.handle(gpu)?;
        let refused = |code| DriverError::Nvml {
            gpu: gpu.clone(),
            call: "nvmlDeviceCreateGpuInstanceWithPlacement",
            code,
        };
        let size = shape(profile_id)
            .map(|s| s.memory_slices)
            .ok_or(refused(NvmlReturn::InvalidArgument))?;
        // Every placement the profile may take on this GPU, occupied or not (nvml.h).
        let mut n: c_uint = 0;
        nvml!(
            self,
            gpu,
            nvmlDeviceGetGpuInstancePossiblePlacements_v2(h, profile_id, ptr::null_mut(), &mut n)
        )?;
        let mut possible = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; n as usize];
        if n > 0 {
            nvml!(
                self,
                gpu,
                nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                    h,
                    profile_id,
                    possible.as_mut_ptr(),
                    &mut n
                )
            )?;
            possible.truncate(n as usize);
        }
        let want = nvmlGpuInstancePlacement_t {
            start: c_uint::from(start),
            size: c_uint::from(size),
        };
        // What is occupied is what the instances listed now occupy, of any profile.
        let listed = self.instances(gpu, h, &BTreeMap::new())?;
        let placeable = possible
            .iter()
            .any(|p| p.start == want.start && p.size == want.size)
            && fits(&listed, Placement::new(profile_id, start));
        if !placeable {
            // Not sent: NVML would refuse it, with this code.
            return Err(refused(NvmlReturn::InsufficientResources));
        }
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        nvml!(
            self,
            gpu,
            nvmlDeviceCreateGpuInstanceWithPlacement(h, profile_id, &want, &mut gi)
        )?;
        Ok(self.gpu_instance_info(gpu, gi)?.id)
    }

    fn destroy_gpu_instance(&mut self, gpu: &GpuRef, gpu_instance: u32) -> Result<(), DriverError> {
        let gi = self.gpu_instance(gpu, gpu_instance)?;
        nvml!(self, gpu, nvmlGpuInstanceDestroy(gi))
    }

    fn create_compute_instance(
        &mut self,
        gpu: &GpuRef,
        gpu_instance: u32,
    ) -> Result<ComputeInstanceInfo, DriverError> {
        let gi = self.gpu_instance(gpu, gpu_instance)?;
        let info = self.gpu_instance_info(gpu, gi)?;
        let profile = self.compute_profile(gpu, gi, info.profileId)?;
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        nvml!(
            self,
            gpu,
            nvmlGpuInstanceCreateComputeInstance(gi, profile.id, &mut ci)
        )?;
        let id = self.compute_instance_info(gpu, ci)?.id;
        let h = self.handle(gpu)?;
        let uuid = self
            .mig_uuids(gpu, h)?
            .remove(&(gpu_instance, id))
            .ok_or_else(|| {
                DriverError::Other(format!(
                    "{gpu}: compute instance {id} of GPU instance {gpu_instance} was created but \
                     NVML lists no MIG device for it"
                ))
            })?;
        Ok(ComputeInstanceInfo { id, uuid })
    }

    fn destroy_compute_instance(
        &mut self,
        gpu: &GpuRef,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<(), DriverError> {
        let gi = self.gpu_instance(gpu, gpu_instance)?;
        let mut ci: nvmlComputeInstance_t = ptr::null_mut();
        nvml!(
            self,
            gpu,
            nvmlGpuInstanceGetComputeInstanceById(gi, compute_instance, &mut ci)
        )?;
        nvml!(self, gpu, nvmlComputeInstanceDestroy(ci))
    }
}
