//! Node drivers: one trait ([`NodeDriver`]) between the reconciler and the GPUs, with two
//! implementations, `sim` (simulated nodes from a `ClusterState` file) and `nvml` (NVML through
//! nvml-wrapper).
//!
//! The trait is shaped like NVML itself, not like the solver's decision: GPU instances and
//! compute instances are created and destroyed one at a time, with explicit placements, and
//! every call can fail the way NVML fails ([`DriverError`] carries the NVML return code). The
//! reconciler's action plan is the only place that knows the order (compute instances before GPU
//! instances, mode change before creation); a driver only enforces the rules a real GPU enforces.

pub mod faults;
pub mod nvml;
pub mod observe_hook;
pub mod sim;

use serde::{Deserialize, Serialize};
use tessera_compiler::model::Node;
pub use tessera_mig::NvmlReturn;

/// One GPU: node name and NVML device index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GpuRef {
    pub node: String,
    pub index: u32,
}

impl std::fmt::Display for GpuRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/gpu{}", self.node, self.index)
    }
}

/// A GPU instance as NVML lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInstanceInfo {
    /// NVML's GPU instance id on its GPU.
    pub id: u32,
    pub profile_id: u32,
    /// First memory slice.
    pub start: u8,
    pub compute_instances: Vec<ComputeInstanceInfo>,
    /// The instance's own SM activity (GPM sampled per MIG instance); `None` where it is not
    /// reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_activity: Option<SmActivity>,
}

/// A compute instance; its MIG device carries the UUID that `CUDA_VISIBLE_DEVICES` names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeInstanceInfo {
    pub id: u32,
    /// `MIG-...`
    pub uuid: String,
}

/// A process holding a GPU, or one MIG instance of it (`gpu_instance` set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
}

/// Everything a driver observes of one GPU beyond [`Node`]: NVML ids of instances, the
/// processes that hold the device and how busy it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDetail {
    pub gpu: GpuRef,
    pub instances: Vec<GpuInstanceInfo>,
    pub processes: Vec<GpuProcess>,
    /// `None` where the device does not report it (NVML answers `NOT_SUPPORTED`, as it does
    /// for a GPU in MIG mode): never estimated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<GpuUtilization>,
    /// The whole GPU's SM activity (NVML GPM); `None` where the GPU has no GPM (before
    /// Hopper) or no interval has been sampled yet: never estimated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_activity: Option<SmActivity>,
}

/// What NVML's GPU Performance Monitoring (GPM, Hopper and later) measured over the interval
/// between two samples: of the SMs of the GPU, or of one MIG instance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SmActivity {
    /// Percent of the time the SMs were busy (`NVML_GPM_METRIC_SM_UTIL`, DCGM's
    /// `SM_ACTIVE`), 0 to 100.
    pub sm_util_percent: f64,
    /// Percent of the SMs' warp slots occupied (`NVML_GPM_METRIC_SM_OCCUPANCY`), 0 to 100.
    pub sm_occupancy_percent: f64,
}

impl SmActivity {
    /// Both figures clamped to 0..=100, or `None` if either is not a number: what a driver
    /// reports is a percentage or nothing.
    pub fn checked(sm_util_percent: f64, sm_occupancy_percent: f64) -> Option<SmActivity> {
        if sm_util_percent.is_nan() || sm_occupancy_percent.is_nan() {
            return None;
        }
        Some(SmActivity {
            sm_util_percent: sm_util_percent.clamp(0.0, 100.0),
            sm_occupancy_percent: sm_occupancy_percent.clamp(0.0, 100.0),
        })
    }
}

/// NVML's utilization rates over its last sample period (`nvmlDeviceGetUtilizationRates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuUtilization {
    /// Percent of the time one or more kernels ran.
    pub gpu_percent: u32,
    /// Percent of the time device memory was read or written.
    pub memory_percent: u32,
}

/// One observation of the fleet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Nodes as `ClusterState` describes them (MIG mode, pending mode, instances with UUIDs,
    /// health; a lost GPU is reported with `health: lost`, never dropped).
    pub nodes: Vec<Node>,
    /// Per GPU of every node, by node then index.
    pub details: Vec<GpuDetail>,
}

/// What a driver call failed with. `Nvml` keeps the NVML return code so that the journal and
/// the logs say exactly what the driver said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    #[error("{gpu}: {call} failed: {code}{}", advice(call, *code))]
    Nvml {
        gpu: GpuRef,
        /// The NVML function that answered, as `nvml.h` names it.
        call: &'static str,
        code: NvmlReturn,
    },
    #[error("no such GPU: {0}")]
    UnknownGpu(GpuRef),
    #[error("cannot load the NVML library {path}: {reason}")]
    Library { path: String, reason: String },
    #[error("{0}")]
    Other(String),
}

impl DriverError {
    /// The NVML return code, when the failure came from an NVML call.
    pub fn code(&self) -> Option<NvmlReturn> {
        match self {
            DriverError::Nvml { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// What an operator can do about a refusal that is not the GPU's state but the caller's rights.
/// MIG is guarded by two capability device files (NVIDIA's MIG user guide, "Device Nodes and
/// Capabilities"): `mig/monitor` to read instances (world-readable by default) and `mig/config`
/// to change them (root only by default).
fn advice(call: &str, code: NvmlReturn) -> &'static str {
    if code != NvmlReturn::NoPermission {
        return "";
    }
    let changes = ["Create", "Destroy", "SetMigMode"];
    if changes.iter().any(|c| call.contains(c)) {
        "; changing MIG needs root or read access to /proc/driver/nvidia/capabilities/mig/config \
         (run the service as root)"
    } else {
        "; this user may not read MIG instances: run the service as root, or give it read access \
         to /proc/driver/nvidia/capabilities/mig/monitor (its /dev/nvidia-caps device)"
    }
}

/// The operations the reconciler drives. Every mutating call is one NVML call (`reset_gpu` is
/// the activation that `nvmlDeviceSetMigMode` attempts; NVML has no reset call of its own) and
/// obeys NVML's rules:
///
/// - `set_mig_mode` only records a pending mode; it takes effect at `reset_gpu`, which fails
///   with `InUse` while any process holds the GPU. Enabling or disabling MIG with GPU instances
///   present fails with `InUse`.
/// - `create_gpu_instance` takes an explicit placement and fails with `InsufficientResources`
///   when it overlaps an existing instance or breaks the placement rules, `NotSupported` when
///   MIG is not enabled (now, not pending).
/// - `destroy_compute_instance` and `destroy_gpu_instance` fail with `InUse` while a process
///   holds the instance; a GPU instance with compute instances left fails with `InUse` too.
/// - Any call on a lost GPU fails with `GpuIsLost`.
pub trait NodeDriver: Send {
    /// Which implementation: `sim` or `nvml`.
    fn kind(&self) -> &'static str;

    fn observe(&mut self) -> Result<Observation, DriverError>;

    /// A number that changes whenever what [`NodeDriver::observe`] reports of the nodes'
    /// geometry and health may have changed: `Observation::nodes` (MIG modes, instances and
    /// their UUIDs, health) and the GPU instances of `Observation::details`, whatever changed
    /// them. Processes, utilization and SM activity are not counted. Read before an
    /// observation, an unchanged number vouches that the observation still holds, so the
    /// arrival path needs no new one. `None` (the default): only an observation can tell, as
    /// for real NVML, where a GPU can fall off the bus or be re-partitioned by hand.
    fn generation(&self) -> Option<u64> {
        None
    }

    fn set_mig_mode(&mut self, gpu: &GpuRef, enabled: bool) -> Result<(), DriverError>;

    fn reset_gpu(&mut self, gpu: &GpuRef) -> Result<(), DriverError>;

    /// Creates a GPU instance of `profile_id` at memory slice `start`; returns its id.
    fn create_gpu_instance(
        &mut self,
        gpu: &GpuRef,
        profile_id: u32,
        start: u8,
    ) -> Result<u32, DriverError>;

    fn destroy_gpu_instance(&mut self, gpu: &GpuRef, gpu_instance: u32) -> Result<(), DriverError>;

    /// Creates the full-size compute instance of a GPU instance (what mig-parted and the
    /// device plugins use); returns its id and the MIG device UUID.
    fn create_compute_instance(
        &mut self,
        gpu: &GpuRef,
        gpu_instance: u32,
    ) -> Result<ComputeInstanceInfo, DriverError>;

    fn destroy_compute_instance(
        &mut self,
        gpu: &GpuRef,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<(), DriverError>;

    /// The embedded runtime started (or stopped) a process on a device. Real NVML sees CUDA
    /// processes by itself, so the `nvml` driver ignores this; the `sim` driver records it, so
    /// that a held instance cannot be destroyed and a held GPU cannot be reset, as on hardware.
    fn process_started(&mut self, _pid: u32, _gpu: &GpuRef, _gpu_instance: Option<u32>) {}

    fn process_ended(&mut self, _pid: u32) {}
}
