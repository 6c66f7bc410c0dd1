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
pub mod sim;

use serde::{Deserialize, Serialize};
use tessera_compiler::model::Node;

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInstanceInfo {
    /// NVML's GPU instance id on its GPU.
    pub id: u32,
    pub profile_id: u32,
    /// First memory slice.
    pub start: u8,
    pub compute_instances: Vec<ComputeInstanceInfo>,
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

/// Everything a driver observes of one GPU beyond [`Node`]: NVML ids of instances and the
/// processes that hold the device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDetail {
    pub gpu: GpuRef,
    pub instances: Vec<GpuInstanceInfo>,
    pub processes: Vec<GpuProcess>,
}

/// One observation of the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    #[error("{gpu}: {call} failed: {code}")]
    Nvml {
        gpu: GpuRef,
        call: &'static str,
        code: NvmlCode,
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
    pub fn code(&self) -> Option<NvmlCode> {
        match self {
            DriverError::Nvml { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// The NVML return codes a driver can see, with their values from `nvml.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NvmlCode {
    Uninitialized = 1,
    InvalidArgument = 2,
    NotSupported = 3,
    NoPermission = 4,
    NotFound = 6,
    InsufficientSize = 7,
    GpuIsLost = 15,
    ResetRequired = 16,
    OperationSystem = 17,
    InUse = 19,
    InsufficientResources = 23,
    Unknown = 999,
}

impl NvmlCode {
    pub fn from_raw(code: u32) -> NvmlCode {
        match code {
            1 => NvmlCode::Uninitialized,
            2 => NvmlCode::InvalidArgument,
            3 => NvmlCode::NotSupported,
            4 => NvmlCode::NoPermission,
            6 => NvmlCode::NotFound,
            7 => NvmlCode::InsufficientSize,
            15 => NvmlCode::GpuIsLost,
            16 => NvmlCode::ResetRequired,
            17 => NvmlCode::OperationSystem,
            19 => NvmlCode::InUse,
            23 => NvmlCode::InsufficientResources,
            _ => NvmlCode::Unknown,
        }
    }

    pub fn raw(self) -> u32 {
        self as u32
    }

    /// `NVML_ERROR_*` as `nvml.h` spells it.
    pub fn name(self) -> &'static str {
        match self {
            NvmlCode::Uninitialized => "NVML_ERROR_UNINITIALIZED",
            NvmlCode::InvalidArgument => "NVML_ERROR_INVALID_ARGUMENT",
            NvmlCode::NotSupported => "NVML_ERROR_NOT_SUPPORTED",
            NvmlCode::NoPermission => "NVML_ERROR_NO_PERMISSION",
            NvmlCode::NotFound => "NVML_ERROR_NOT_FOUND",
            NvmlCode::InsufficientSize => "NVML_ERROR_INSUFFICIENT_SIZE",
            NvmlCode::GpuIsLost => "NVML_ERROR_GPU_IS_LOST",
            NvmlCode::ResetRequired => "NVML_ERROR_RESET_REQUIRED",
            NvmlCode::OperationSystem => "NVML_ERROR_OPERATING_SYSTEM",
            NvmlCode::InUse => "NVML_ERROR_IN_USE",
            NvmlCode::InsufficientResources => "NVML_ERROR_INSUFFICIENT_RESOURCES",
            NvmlCode::Unknown => "NVML_ERROR_UNKNOWN",
        }
    }
}

impl std::fmt::Display for NvmlCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.raw())
    }
}

/// The operations the reconciler drives. Every mutating call is one NVML call (or, for
/// `reset_gpu`, one `nvmlDeviceResetGpu`-equivalent) and obeys NVML's rules:
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
