//! One GPU's MIG state, modelled the way NVML exposes and guards it.
//!
//! The simulated node driver and the fake `libnvidia-ml.so` both answer NVML-shaped calls; if
//! each kept its own idea of when NVML says `IN_USE` or `INSUFFICIENT_RESOURCES` they would
//! drift from each other and from the placement rules the solver plans with. [`MigDevice`] is
//! that one idea: every operation either succeeds or returns the [`DeviceError`] NVML would,
//! and a failed operation leaves the device exactly as it was. Geometry questions are answered
//! by [`crate::validate`] and [`crate::possible_placements`], never by arithmetic of its own.
//!
//! Facts taken from NVML (see `nvml.h` and NVIDIA's MIG user guide):
//! - MIG mode changes are *pending* until a GPU reset; the mode cannot be changed while GPU
//!   instances exist, and a reset is refused while any process holds the GPU.
//! - A GPU instance is created at an explicit placement and cannot be destroyed while it has
//!   compute instances or a process uses it; a compute instance cannot be destroyed while a
//!   process uses it.
//! - Instance ids are the smallest id free on the GPU (GPU instances) or in the GPU instance
//!   (compute instances).
//! - A lost GPU answers every call with `GPU_IS_LOST`.
//!
//! One choice is ours, not NVML's documented behaviour: a reset is also refused while GPU
//! instances exist (unverified on hardware). Silently wiping them would hide a reconciler that
//! resets a GPU it has not drained.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::catalog::GpuModel;
use crate::fit::possible_placements;
use crate::nvml_return::NvmlReturn;
use crate::placement::{GeometryError, Placement, validate};
use crate::shape::shape;

/// Why an operation was refused, one variant per NVML return code; the text says which rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("not supported: {0}")]
    NotSupported(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("the GPU is lost")]
    GpuIsLost,
    #[error("in use: {0}")]
    InUse(String),
    #[error("insufficient resources: {0}")]
    InsufficientResources(String),
}

impl DeviceError {
    /// The NVML return code.
    pub fn nvml_return(&self) -> NvmlReturn {
        match self {
            DeviceError::InvalidArgument(_) => NvmlReturn::InvalidArgument,
            DeviceError::NotSupported(_) => NvmlReturn::NotSupported,
            DeviceError::NotFound(_) => NvmlReturn::NotFound,
            DeviceError::GpuIsLost => NvmlReturn::GpuIsLost,
            DeviceError::InUse(_) => NvmlReturn::InUse,
            DeviceError::InsufficientResources(_) => NvmlReturn::InsufficientResources,
        }
    }
}

/// MIG mode now, and the mode the next reset switches to (equal to `current` when nothing is
/// pending), as `nvmlDeviceGetMigMode` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

/// A compute instance; its MIG device UUID is what `CUDA_VISIBLE_DEVICES` names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeInstance {
    pub id: u32,
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
    pub uuid: String,
}

/// A GPU instance and the compute instances inside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInstance {
    pub id: u32,
    pub placement: Placement,
    /// By id.
    pub compute_instances: Vec<ComputeInstance>,
}

/// What a process holds: the whole GPU (a CUDA context on a non-MIG GPU, or a client such as
/// the persistence daemon), a GPU instance, or one compute instance of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessScope {
    Gpu,
    GpuInstance(u32),
    ComputeInstance {
        gpu_instance: u32,
        compute_instance: u32,
    },
}

impl ProcessScope {
    /// The GPU instance the process keeps alive, if any.
    pub fn gpu_instance(&self) -> Option<u32> {
        match *self {
            ProcessScope::Gpu => None,
            ProcessScope::GpuInstance(gi) => Some(gi),
            ProcessScope::ComputeInstance { gpu_instance, .. } => Some(gpu_instance),
        }
    }

    /// Whether a process in this scope keeps compute instance `ci` of `gi` alive: one bound to
    /// the whole GPU instance uses every compute instance in it.
    fn holds_compute_instance(&self, gi: u32, ci: u32) -> bool {
        match *self {
            ProcessScope::Gpu => false,
            ProcessScope::GpuInstance(g) => g == gi,
            ProcessScope::ComputeInstance {
                gpu_instance,
                compute_instance,
            } => gpu_instance == gi && compute_instance == ci,
        }
    }
}

/// A process NVML lists on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DeviceProcess {
    pub pid: u32,
    pub scope: ProcessScope,
}

/// An instance a device starts with (a snapshot's geometry): a GPU instance with one
/// full-size compute instance, keeping the snapshot's MIG UUID when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialInstance {
    pub placement: Placement,
    pub uuid: Option<String>,
}

/// A stored device that breaks an invariant the operations maintain (a hand-edited or
/// corrupted state file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid stored GPU state for {uuid}: {reason}")]
pub struct InvalidDeviceState {
    pub uuid: String,
    pub reason: String,
}

/// One GPU. Fields are private so that every change goes through an operation that enforces
/// NVML's rules; deserializing checks the same invariants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "DeviceRecord")]
pub struct MigDevice {
    uuid: String,
    model: GpuModel,
    mig: MigMode,
    /// By id.
    gpu_instances: Vec<GpuInstance>,
    /// Sorted.
    processes: Vec<DeviceProcess>,
    lost: bool,
}

/// The serialized form, checked before it becomes a [`MigDevice`].
#[derive(Deserialize)]
struct DeviceRecord {
    uuid: String,
    model: GpuModel,
    mig: MigMode,
    gpu_instances: Vec<GpuInstance>,
    processes: Vec<DeviceProcess>,
    lost: bool,
}

impl TryFrom<DeviceRecord> for MigDevice {
    type Error = InvalidDeviceState;

    fn try_from(r: DeviceRecord) -> Result<Self, Self::Error> {
        let device = MigDevice {
            uuid: r.uuid,
            model: r.model,
            mig: r.mig,
            gpu_instances: r.gpu_instances,
            processes: r.processes,
            lost: r.lost,
        };
        device.check_invariants()?;
        Ok(device)
    }
}

impl MigDevice {
    /// A healthy GPU with MIG disabled and nothing pending, as after a cold boot.
    pub fn new(uuid: impl Into<String>, model: GpuModel) -> Self {
        MigDevice {
            uuid: uuid.into(),
            model,
            mig: MigMode {
                current: false,
                pending: false,
            },
            gpu_instances: Vec::new(),
            processes: Vec::new(),
            lost: false,
        }
    }

    /// A GPU in a given state, built through the same operations a driver would call (so a
    /// geometry NVML could not produce is refused with the error NVML would give). Instances are
    /// created in placement order, so their ids follow the grid left to right.
    pub fn with_geometry(
        uuid: impl Into<String>,
        model: GpuModel,
        mig: MigMode,
        instances: &[InitialInstance],
    ) -> Result<Self, DeviceError> {
        let mut device = MigDevice::new(uuid, model);
        if mig.current {
            device.set_mig_mode(true)?;
            device.reset()?;
        }
        let mut sorted: Vec<&InitialInstance> = instances.iter().collect();
        sorted.sort_by_key(|i| i.placement);
        for inst in sorted {
            let gi = device.create_gpu_instance_with_placement(
                inst.placement.profile_id,
                inst.placement.start,
            )?;
            device.create_compute_instance(gi)?;
            if let Some(uuid) = &inst.uuid {
                if !is_mig_uuid(uuid) {
                    return Err(DeviceError::InvalidArgument(format!(
                        "{uuid} is not a MIG device UUID (MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
                    )));
                }
                let ci = &mut device.gpu_instance_mut(gi)?.compute_instances[0];
                ci.uuid = uuid.clone();
            }
        }
        // Pending differs from current only through a mode change requested after the
        // instances were created, which NVML allows; set it directly rather than replaying that.
        if mig.pending != mig.current && !device.model.is_mig_capable() {
            return Err(not_mig_capable(&device.model));
        }
        device.mig.pending = mig.pending;
        // Catches a UUID given to two instances (or equal to a generated one).
        device
            .check_invariants()
            .map_err(|e| DeviceError::InvalidArgument(e.reason))?;
        Ok(device)
    }

    // ----- read-only view -----

    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    pub fn model(&self) -> &GpuModel {
        &self.model
    }

    /// The mode last known; NVML cannot read it from a lost GPU, callers decide what to show.
    pub fn mig_mode(&self) -> MigMode {
        self.mig
    }

    /// By id.
    pub fn gpu_instances(&self) -> &[GpuInstance] {
        &self.gpu_instances
    }

    pub fn gpu_instance(&self, id: u32) -> Option<&GpuInstance> {
        self.gpu_instances.iter().find(|g| g.id == id)
    }

    /// The current layout, sorted left to right.
    pub fn placements(&self) -> Vec<Placement> {
        let mut v: Vec<Placement> = self.gpu_instances.iter().map(|g| g.placement).collect();
        v.sort();
        v
    }

    /// Sorted by pid, then scope.
    pub fn processes(&self) -> &[DeviceProcess] {
        &self.processes
    }

    pub fn is_lost(&self) -> bool {
        self.lost
    }

    // ----- operations -----

    /// Marks the GPU lost (fallen off the bus) or, for tests and simulations, brings it back.
    pub fn set_lost(&mut self, lost: bool) {
        self.lost = lost;
    }

    /// `nvmlDeviceSetMigMode`: records the mode the next reset applies.
    pub fn set_mig_mode(&mut self, enabled: bool) -> Result<(), DeviceError> {
        self.alive()?;
        if !self.model.is_mig_capable() {
            return Err(not_mig_capable(&self.model));
        }
        if !self.gpu_instances.is_empty() {
            return Err(DeviceError::InUse(format!(
                "{} GPU instance(s) exist; destroy them before changing the MIG mode",
                self.gpu_instances.len()
            )));
        }
        self.mig.pending = enabled;
        Ok(())
    }

    /// A GPU reset: applies the pending MIG mode.
    pub fn reset(&mut self) -> Result<(), DeviceError> {
        self.alive()?;
        if let Some(p) = self.processes.first() {
            return Err(DeviceError::InUse(format!(
                "{} process(es) hold the GPU (pid {} first); a reset needs none",
                self.processes.len(),
                p.pid
            )));
        }
        if !self.gpu_instances.is_empty() {
            return Err(DeviceError::InUse(format!(
                "{} GPU instance(s) exist; destroy them before resetting",
                self.gpu_instances.len()
            )));
        }
        self.mig.current = self.mig.pending;
        Ok(())
    }

    /// Where an instance of the profile could be created now. Not what
    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` answers: that lists every placement of
    /// the profile, occupied or not (nvml.h), and the fake library answers so.
    pub fn gpu_instance_possible_placements(
        &self,
        profile_id: u32,
    ) -> Result<Vec<Placement>, DeviceError> {
        self.alive()?;
        self.mig_enabled_now()?;
        self.known_profile(profile_id)?;
        Ok(possible_placements(&self.placements(), profile_id))
    }

    /// `nvmlDeviceCreateGpuInstanceWithPlacement`; returns the new GPU instance's id.
    pub fn create_gpu_instance_with_placement(
        &mut self,
        profile_id: u32,
        start: u8,
    ) -> Result<u32, DeviceError> {
        self.alive()?;
        self.mig_enabled_now()?;
        self.known_profile(profile_id)?;
        let placement = Placement::new(profile_id, start);
        let mut layout = self.placements();
        layout.push(placement);
        validate(&layout).map_err(|e| match e {
            GeometryError::UnknownProfile { .. } => DeviceError::InvalidArgument(e.to_string()),
            _ => DeviceError::InsufficientResources(e.to_string()),
        })?;
        let id = smallest_free(self.gpu_instances.iter().map(|g| g.id));
        let at = self.gpu_instances.partition_point(|g| g.id < id);
        self.gpu_instances.insert(
            at,
            GpuInstance {
                id,
                placement,
                compute_instances: Vec::new(),
            },
        );
        Ok(id)
    }

    /// `nvmlGpuInstanceDestroy`.
    pub fn destroy_gpu_instance(&mut self, gpu_instance: u32) -> Result<(), DeviceError> {
        self.alive()?;
        self.mig_enabled_now()?;
        let gi = self.gpu_instance_ref(gpu_instance)?;
        if !gi.compute_instances.is_empty() {
            return Err(DeviceError::InUse(format!(
                "GPU instance {gpu_instance} still has {} compute instance(s); destroy them first",
                gi.compute_instances.len()
            )));
        }
        if let Some(p) = self
            .processes
            .iter()
            .find(|p| p.scope.gpu_instance() == Some(gpu_instance))
        {
            return Err(DeviceError::InUse(format!(
                "process {} uses GPU instance {gpu_instance}",
                p.pid
            )));
        }
        self.gpu_instances.retain(|g| g.id != gpu_instance);
        Ok(())
    }

    /// `nvmlGpuInstanceCreateComputeInstance` with the GPU instance's full-size profile, the
    /// only one tessera uses: a second one does not fit.
    pub fn create_compute_instance(
        &mut self,
        gpu_instance: u32,
    ) -> Result<ComputeInstance, DeviceError> {
        self.alive()?;
        self.mig_enabled_now()?;
        let gpu_uuid = self.uuid.clone();
        let gi = self.gpu_instance_mut(gpu_instance)?;
        if let Some(ci) = gi.compute_instances.first() {
            return Err(DeviceError::InsufficientResources(format!(
                "GPU instance {gpu_instance} already has full-size compute instance {}",
                ci.id
            )));
        }
        let id = smallest_free(gi.compute_instances.iter().map(|c| c.id));
        let ci = ComputeInstance {
            id,
            uuid: mig_uuid(&gpu_uuid, gi.placement, gpu_instance, id),
        };
        let at = gi.compute_instances.partition_point(|c| c.id < id);
        gi.compute_instances.insert(at, ci.clone());
        Ok(ci)
    }

    /// `nvmlComputeInstanceDestroy`.
    pub fn destroy_compute_instance(
        &mut self,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<(), DeviceError> {
        self.alive()?;
        self.mig_enabled_now()?;
        let gi = self.gpu_instance_ref(gpu_instance)?;
        if !gi
            .compute_instances
            .iter()
            .any(|c| c.id == compute_instance)
        {
            return Err(DeviceError::NotFound(format!(
                "GPU instance {gpu_instance} has no compute instance {compute_instance}"
            )));
        }
        if let Some(p) = self.processes.iter().find(|p| {
            p.scope
                .holds_compute_instance(gpu_instance, compute_instance)
        }) {
            return Err(DeviceError::InUse(format!(
                "process {} uses compute instance {compute_instance} of GPU instance \
                 {gpu_instance}",
                p.pid
            )));
        }
        self.gpu_instance_mut(gpu_instance)?
            .compute_instances
            .retain(|c| c.id != compute_instance);
        Ok(())
    }

    /// A process opened the GPU or one of its instances. Attaching the same process to the same
    /// scope twice is one attachment.
    pub fn attach_process(&mut self, pid: u32, scope: ProcessScope) -> Result<(), DeviceError> {
        self.alive()?;
        match scope {
            ProcessScope::Gpu => {}
            ProcessScope::GpuInstance(gi) => {
                self.gpu_instance_ref(gi)?;
            }
            ProcessScope::ComputeInstance {
                gpu_instance,
                compute_instance,
            } => {
                let gi = self.gpu_instance_ref(gpu_instance)?;
                if !gi
                    .compute_instances
                    .iter()
                    .any(|c| c.id == compute_instance)
                {
                    return Err(DeviceError::NotFound(format!(
                        "GPU instance {gpu_instance} has no compute instance {compute_instance}"
                    )));
                }
            }
        }
        let p = DeviceProcess { pid, scope };
        if let Err(at) = self.processes.binary_search(&p) {
            self.processes.insert(at, p);
        }
        Ok(())
    }

    /// The process exited or closed the device; true when it held anything. Works on a lost GPU
    /// too: a process dying is not a call to the GPU.
    pub fn detach_process(&mut self, pid: u32) -> bool {
        let before = self.processes.len();
        self.processes.retain(|p| p.pid != pid);
        self.processes.len() != before
    }

    // ----- helpers -----

    fn alive(&self) -> Result<(), DeviceError> {
        if self.lost {
            Err(DeviceError::GpuIsLost)
        } else {
            Ok(())
        }
    }

    fn mig_enabled_now(&self) -> Result<(), DeviceError> {
        if !self.model.is_mig_capable() {
            return Err(not_mig_capable(&self.model));
        }
        if !self.mig.current {
            let pending = if self.mig.pending {
                " (enabling is pending until a GPU reset)"
            } else {
                ""
            };
            return Err(DeviceError::NotSupported(format!(
                "MIG is not enabled on {}{pending}",
                self.uuid
            )));
        }
        Ok(())
    }

    fn known_profile(&self, profile_id: u32) -> Result<(), DeviceError> {
        if shape(profile_id).is_none() || self.model.profile_name(profile_id).is_none() {
            return Err(DeviceError::InvalidArgument(format!(
                "{} has no MIG profile ID {profile_id}",
                self.model.name
            )));
        }
        Ok(())
    }

    fn gpu_instance_ref(&self, id: u32) -> Result<&GpuInstance, DeviceError> {
        self.gpu_instance(id)
            .ok_or_else(|| DeviceError::NotFound(format!("no GPU instance {id}")))
    }

    fn gpu_instance_mut(&mut self, id: u32) -> Result<&mut GpuInstance, DeviceError> {
        self.gpu_instances
            .iter_mut()
            .find(|g| g.id == id)
            .ok_or_else(|| DeviceError::NotFound(format!("no GPU instance {id}")))
    }

    /// What the operations guarantee, checked on stored state (and by the tests after every
    /// operation). Reports the first broken rule.
    pub fn check_invariants(&self) -> Result<(), InvalidDeviceState> {
        self.first_broken_rule()
            .map_err(|reason| InvalidDeviceState {
                uuid: self.uuid.clone(),
                reason,
            })
    }

    fn first_broken_rule(&self) -> Result<(), String> {
        if !self.mig.current && !self.gpu_instances.is_empty() {
            return Err("GPU instances exist but MIG is disabled".into());
        }
        if (self.mig.current || self.mig.pending) && !self.model.is_mig_capable() {
            return Err(format!(
                "MIG mode set on {}, which has no MIG",
                self.model.name
            ));
        }
        if !self.gpu_instances.windows(2).all(|w| w[0].id < w[1].id) {
            return Err("GPU instance ids are not unique and sorted".into());
        }
        for g in &self.gpu_instances {
            if self.model.profile_name(g.placement.profile_id).is_none() {
                return Err(format!(
                    "GPU instance {} has profile {}, which {} does not offer",
                    g.id, g.placement.profile_id, self.model.name
                ));
            }
            if g.compute_instances.len() > 1 {
                return Err(format!(
                    "GPU instance {} has more than one full-size compute instance",
                    g.id
                ));
            }
            if let Some(c) = g.compute_instances.iter().find(|c| !is_mig_uuid(&c.uuid)) {
                return Err(format!("{} is not a MIG device UUID", c.uuid));
            }
        }
        validate(&self.placements()).map_err(|e| e.to_string())?;
        let mut uuids: Vec<&str> = self
            .gpu_instances
            .iter()
            .flat_map(|g| &g.compute_instances)
            .map(|c| c.uuid.as_str())
            .collect();
        uuids.sort_unstable();
        if uuids.windows(2).any(|w| w[0] == w[1]) {
            return Err("two compute instances share a MIG UUID".into());
        }
        if !self.processes.windows(2).all(|w| w[0] < w[1]) {
            return Err("processes are not unique and sorted".into());
        }
        for p in &self.processes {
            let known = match p.scope {
                ProcessScope::Gpu => true,
                ProcessScope::GpuInstance(gi) => self.gpu_instance(gi).is_some(),
                ProcessScope::ComputeInstance {
                    gpu_instance,
                    compute_instance,
                } => self
                    .gpu_instance(gpu_instance)
                    .is_some_and(|g| g.compute_instances.iter().any(|c| c.id == compute_instance)),
            };
            if !known {
                return Err(format!(
                    "process {} holds an instance that does not exist",
                    p.pid
                ));
            }
        }
        Ok(())
    }
}

fn not_mig_capable(model: &GpuModel) -> DeviceError {
    DeviceError::NotSupported(format!("{} has no MIG", model.name))
}

fn smallest_free(used: impl Iterator<Item = u32>) -> u32 {
    let mut used: Vec<u32> = used.collect();
    used.sort_unstable();
    let mut id = 0;
    for u in used {
        if u == id {
            id += 1;
        } else if u > id {
            break;
        }
    }
    id
}

/// A MIG device UUID derived from the GPU's UUID and the instance (ids and placement), so that
/// simulated runs are reproducible and a reused id on a different placement gets a new UUID.
pub fn mig_uuid(
    gpu_uuid: &str,
    placement: Placement,
    gpu_instance: u32,
    compute_instance: u32,
) -> String {
    let key = format!(
        "{gpu_uuid}/gi{gpu_instance}/ci{compute_instance}/p{}@{}",
        placement.profile_id, placement.start
    );
    let hi = hash64(key.as_bytes(), 0x9E37_79B9_7F4A_7C15);
    let lo = hash64(key.as_bytes(), 0xC2B2_AE3D_27D4_EB4F);
    let v = (u128::from(hi) << 64) | u128::from(lo);
    let hex = format!("{v:032x}");
    format!(
        "MIG-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// FNV-1a with a seed, then a SplitMix64 finaliser so every input bit reaches every output bit.
fn hash64(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325 ^ seed;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// `MIG-` followed by a UUID in 8-4-4-4-12 hex groups.
pub fn is_mig_uuid(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("MIG-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl fmt::Display for ProcessScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcessScope::Gpu => f.write_str("the GPU"),
            ProcessScope::GpuInstance(gi) => write!(f, "GPU instance {gi}"),
            ProcessScope::ComputeInstance {
                gpu_instance,
                compute_instance,
            } => write!(
                f,
                "compute instance {compute_instance} of GPU instance {gpu_instance}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::builtin_model;
    use crate::shape::*;

    const GPU: &str = "GPU-767c5291-2c3f-0785-831a-22d41d0e178f";

    fn h100() -> GpuModel {
        builtin_model("H100-SXM5-80GB").expect("built-in model")
    }

    /// An H100 with MIG enabled and no instances.
    fn enabled() -> MigDevice {
        MigDevice::with_geometry(
            GPU,
            h100(),
            MigMode {
                current: true,
                pending: true,
            },
            &[],
        )
        .expect("empty MIG GPU")
    }

    fn code(r: Result<impl fmt::Debug, DeviceError>) -> NvmlReturn {
        match r {
            Ok(v) => panic!("expected an error, got {v:?}"),
            Err(e) => e.nvml_return(),
        }
    }

    /// Runs `op` expecting NVML code `want`, and checks that the device did not change.
    fn refused<T: fmt::Debug>(
        d: &mut MigDevice,
        want: NvmlReturn,
        op: impl FnOnce(&mut MigDevice) -> Result<T, DeviceError>,
    ) {
        let before = d.clone();
        assert_eq!(code(op(d)), want);
        assert_eq!(*d, before, "a refused operation changed the device");
    }

    const INVALID_ARGUMENT: NvmlReturn = NvmlReturn::InvalidArgument;
    const NOT_SUPPORTED: NvmlReturn = NvmlReturn::NotSupported;
    const NOT_FOUND: NvmlReturn = NvmlReturn::NotFound;
    const GPU_IS_LOST: NvmlReturn = NvmlReturn::GpuIsLost;
    const IN_USE: NvmlReturn = NvmlReturn::InUse;
    const INSUFFICIENT_RESOURCES: NvmlReturn = NvmlReturn::InsufficientResources;

    fn create(d: &mut MigDevice, profile: u32, start: u8) -> u32 {
        d.create_gpu_instance_with_placement(profile, start)
            .unwrap_or_else(|e| panic!("create {profile}@{start}: {e}"))
    }

    #[test]
    fn error_codes_are_nvml_values() {
        let all = [
            DeviceError::InvalidArgument(String::new()),
            DeviceError::NotSupported(String::new()),
            DeviceError::NotFound(String::new()),
            DeviceError::GpuIsLost,
            DeviceError::InUse(String::new()),
            DeviceError::InsufficientResources(String::new()),
        ];
        let codes: Vec<(u32, &str)> = all
            .iter()
            .map(|e| (e.nvml_return().raw(), e.nvml_return().name().unwrap()))
            .collect();
        assert_eq!(
            codes,
            [
                (2, "NVML_ERROR_INVALID_ARGUMENT"),
                (3, "NVML_ERROR_NOT_SUPPORTED"),
                (6, "NVML_ERROR_NOT_FOUND"),
                (15, "NVML_ERROR_GPU_IS_LOST"),
                (19, "NVML_ERROR_IN_USE"),
                (23, "NVML_ERROR_INSUFFICIENT_RESOURCES"),
            ]
        );
    }

    #[test]
    fn mig_mode_is_pending_until_reset() {
        let mut d = MigDevice::new(GPU, h100());
        refused(&mut d, NOT_SUPPORTED, |d| {
            d.create_gpu_instance_with_placement(PROFILE_7G, 0)
        });
        d.set_mig_mode(true).unwrap();
        assert_eq!(
            d.mig_mode(),
            MigMode {
                current: false,
                pending: true
            }
        );
        // Pending is not enabled: NVML still refuses MIG calls.
        refused(&mut d, NOT_SUPPORTED, |d| {
            d.create_gpu_instance_with_placement(PROFILE_7G, 0)
        });
        refused(&mut d, NOT_SUPPORTED, |d| {
            d.gpu_instance_possible_placements(PROFILE_7G)
        });
        d.reset().unwrap();
        assert_eq!(
            d.mig_mode(),
            MigMode {
                current: true,
                pending: true
            }
        );
        assert_eq!(create(&mut d, PROFILE_7G, 0), 0);
    }

    #[test]
    fn mode_change_refused_while_gpu_instances_exist() {
        let mut d = enabled();
        let gi = create(&mut d, PROFILE_3G, 4);
        refused(&mut d, IN_USE, |d| d.set_mig_mode(false));
        // Asking for the mode already set is refused too: NVML checks instances first.
        refused(&mut d, IN_USE, |d| d.set_mig_mode(true));
        d.destroy_gpu_instance(gi).unwrap();
        d.set_mig_mode(false).unwrap();
        d.reset().unwrap();
        assert!(!d.mig_mode().current);
    }

    #[test]
    fn pending_change_can_be_withdrawn() {
        let mut d = enabled();
        d.set_mig_mode(false).unwrap();
        assert!(!d.mig_mode().pending);
        d.set_mig_mode(true).unwrap();
        d.reset().unwrap();
        assert_eq!(
            d.mig_mode(),
            MigMode {
                current: true,
                pending: true
            }
        );
    }

    #[test]
    fn reset_refused_while_a_process_holds_the_gpu() {
        let mut d = MigDevice::new(GPU, h100());
        d.set_mig_mode(true).unwrap();
        d.attach_process(4242, ProcessScope::Gpu).unwrap();
        refused(&mut d, IN_USE, |d| d.reset());
        assert!(d.detach_process(4242));
        assert!(!d.detach_process(4242));
        d.reset().unwrap();
        assert!(d.mig_mode().current);
    }

    #[test]
    fn reset_refused_while_gpu_instances_exist() {
        let mut d = enabled();
        create(&mut d, PROFILE_1G, 0);
        refused(&mut d, IN_USE, |d| d.reset());
    }

    #[test]
    fn gpu_without_mig_refuses_mig_calls() {
        let l4 = builtin_model("L4-24GB").unwrap();
        let mut d = MigDevice::new("GPU-1111", l4.clone());
        refused(&mut d, NOT_SUPPORTED, |d| d.set_mig_mode(true));
        refused(&mut d, NOT_SUPPORTED, |d| {
            d.create_gpu_instance_with_placement(PROFILE_7G, 0)
        });
        d.reset().unwrap();
        let on = MigMode {
            current: true,
            pending: true,
        };
        assert_eq!(
            code(MigDevice::with_geometry("GPU-1111", l4, on, &[])),
            NOT_SUPPORTED
        );
    }

    #[test]
    fn worked_example_4g_plus_3g() {
        let mut d = enabled();
        create(&mut d, PROFILE_4G, 0);
        create(&mut d, PROFILE_3G, 4);
        assert_eq!(
            d.placements(),
            [Placement::new(PROFILE_4G, 0), Placement::new(PROFILE_3G, 4)]
        );
    }

    #[test]
    fn worked_example_two_3g_leave_no_room_for_a_1g() {
        let mut d = enabled();
        create(&mut d, PROFILE_3G, 0);
        create(&mut d, PROFILE_3G, 4);
        for start in 0..8 {
            refused(&mut d, INSUFFICIENT_RESOURCES, |d| {
                d.create_gpu_instance_with_placement(PROFILE_1G, start)
            });
        }
        assert_eq!(d.gpu_instance_possible_placements(PROFILE_1G), Ok(vec![]));
    }

    #[test]
    fn worked_example_three_2g_and_a_1g() {
        let mut d = enabled();
        for start in [0, 2, 4] {
            create(&mut d, PROFILE_2G, start);
        }
        create(&mut d, PROFILE_1G, 6);
        // All 7 compute slices are used: slice 7 is free but nothing fits.
        for s in &SHAPES {
            assert_eq!(d.gpu_instance_possible_placements(s.profile_id), Ok(vec![]));
        }
    }

    #[test]
    fn worked_example_seven_1g_and_no_eighth() {
        let mut d = enabled();
        for start in 0..7 {
            assert_eq!(create(&mut d, PROFILE_1G, start), u32::from(start));
        }
        for start in 0..8 {
            refused(&mut d, INSUFFICIENT_RESOURCES, |d| {
                d.create_gpu_instance_with_placement(PROFILE_1G, start)
            });
        }
    }

    #[test]
    fn worked_example_only_one_4g() {
        let mut d = enabled();
        create(&mut d, PROFILE_4G, 0);
        refused(&mut d, INSUFFICIENT_RESOURCES, |d| {
            d.create_gpu_instance_with_placement(PROFILE_4G, 0)
        });
    }

    #[test]
    fn per_gpu_maximum_is_enforced_on_free_slices() {
        let mut d = enabled();
        create(&mut d, PROFILE_1G_ME, 0);
        // Slice 3 is free, but a GPU has one media-engine instance at most.
        refused(&mut d, INSUFFICIENT_RESOURCES, |d| {
            d.create_gpu_instance_with_placement(PROFILE_1G_ME, 3)
        });
        create(&mut d, PROFILE_1G, 3);
    }

    #[test]
    fn start_must_be_one_of_the_profiles_starts() {
        let mut d = enabled();
        refused(&mut d, INSUFFICIENT_RESOURCES, |d| {
            d.create_gpu_instance_with_placement(PROFILE_3G, 2)
        });
        refused(&mut d, INSUFFICIENT_RESOURCES, |d| {
            d.create_gpu_instance_with_placement(PROFILE_1G, 7)
        });
        refused(&mut d, INSUFFICIENT_RESOURCES, |d| {
            d.create_gpu_instance_with_placement(PROFILE_1G, 200)
        });
    }

    #[test]
    fn overlap_is_refused() {
        let mut d = enabled();
        create(&mut d, PROFILE_2G, 2);
        refused(&mut d, INSUFFICIENT_RESOURCES, |d| {
            d.create_gpu_instance_with_placement(PROFILE_1G, 3)
        });
        refused(&mut d, INSUFFICIENT_RESOURCES, |d| {
            d.create_gpu_instance_with_placement(PROFILE_3G, 0)
        });
    }

    #[test]
    fn unknown_profile_is_an_invalid_argument() {
        let mut d = enabled();
        // 1 is NVML_GPU_INSTANCE_PROFILE_2_SLICE, an enum value, not a profile ID.
        refused(&mut d, INVALID_ARGUMENT, |d| {
            d.create_gpu_instance_with_placement(1, 0)
        });
        refused(&mut d, INVALID_ARGUMENT, |d| {
            d.gpu_instance_possible_placements(1)
        });
    }

    #[test]
    fn possible_placements_are_nvmls_answer() {
        let mut d = enabled();
        assert_eq!(
            d.gpu_instance_possible_placements(PROFILE_3G),
            Ok(vec![Placement::new(9, 0), Placement::new(9, 4)])
        );
        create(&mut d, PROFILE_1G, 1);
        assert_eq!(
            d.gpu_instance_possible_placements(PROFILE_3G),
            Ok(vec![Placement::new(9, 4)])
        );
        assert_eq!(
            d.gpu_instance_possible_placements(PROFILE_1G_MEM2),
            Ok(vec![
                Placement::new(15, 2),
                Placement::new(15, 4),
                Placement::new(15, 6)
            ])
        );
    }

    #[test]
    fn gpu_instance_ids_are_the_smallest_free() {
        let mut d = enabled();
        assert_eq!(create(&mut d, PROFILE_2G, 0), 0);
        assert_eq!(create(&mut d, PROFILE_2G, 2), 1);
        assert_eq!(create(&mut d, PROFILE_2G, 4), 2);
        d.destroy_gpu_instance(1).unwrap();
        assert_eq!(create(&mut d, PROFILE_1G, 3), 1);
        assert_eq!(create(&mut d, PROFILE_1G, 6), 3);
        let ids: Vec<u32> = d.gpu_instances().iter().map(|g| g.id).collect();
        assert_eq!(ids, [0, 1, 2, 3]);
    }

    #[test]
    fn one_full_size_compute_instance_per_gpu_instance() {
        let mut d = enabled();
        let gi = create(&mut d, PROFILE_3G, 0);
        let ci = d.create_compute_instance(gi).unwrap();
        assert_eq!(ci.id, 0);
        assert!(is_mig_uuid(&ci.uuid), "{}", ci.uuid);
        refused(&mut d, INSUFFICIENT_RESOURCES, |d| {
            d.create_compute_instance(gi)
        });
        refused(&mut d, NOT_FOUND, |d| d.create_compute_instance(gi + 1));
        assert_eq!(d.gpu_instance(gi).unwrap().compute_instances, [ci]);
    }

    #[test]
    fn gpu_instance_with_compute_instances_cannot_be_destroyed() {
        let mut d = enabled();
        let gi = create(&mut d, PROFILE_4G, 0);
        let ci = d.create_compute_instance(gi).unwrap();
        refused(&mut d, IN_USE, |d| d.destroy_gpu_instance(gi));
        d.destroy_compute_instance(gi, ci.id).unwrap();
        d.destroy_gpu_instance(gi).unwrap();
        assert!(d.gpu_instances().is_empty());
    }

    #[test]
    fn instances_in_use_cannot_be_destroyed() {
        let mut d = enabled();
        let a = create(&mut d, PROFILE_3G, 0);
        let b = create(&mut d, PROFILE_3G, 4);
        let ca = d.create_compute_instance(a).unwrap();
        let cb = d.create_compute_instance(b).unwrap();
        d.attach_process(
            7,
            ProcessScope::ComputeInstance {
                gpu_instance: a,
                compute_instance: ca.id,
            },
        )
        .unwrap();
        d.attach_process(8, ProcessScope::GpuInstance(b)).unwrap();
        refused(&mut d, IN_USE, |d| d.destroy_compute_instance(a, ca.id));
        // A process on the whole GPU instance holds each compute instance of it.
        refused(&mut d, IN_USE, |d| d.destroy_compute_instance(b, cb.id));
        d.detach_process(8);
        d.destroy_compute_instance(b, cb.id).unwrap();
        d.attach_process(9, ProcessScope::GpuInstance(b)).unwrap();
        refused(&mut d, IN_USE, |d| d.destroy_gpu_instance(b));
        d.detach_process(9);
        d.destroy_gpu_instance(b).unwrap();
        // A process on the GPU itself does not hold an instance.
        d.attach_process(10, ProcessScope::Gpu).unwrap();
        d.detach_process(7);
        d.destroy_compute_instance(a, ca.id).unwrap();
        d.destroy_gpu_instance(a).unwrap();
    }

    #[test]
    fn unknown_instances_are_not_found() {
        let mut d = enabled();
        refused(&mut d, NOT_FOUND, |d| d.destroy_gpu_instance(0));
        let gi = create(&mut d, PROFILE_7G, 0);
        refused(&mut d, NOT_FOUND, |d| d.destroy_compute_instance(gi, 0));
        refused(&mut d, NOT_FOUND, |d| d.destroy_compute_instance(gi + 1, 0));
        refused(&mut d, NOT_FOUND, |d| {
            d.attach_process(1, ProcessScope::GpuInstance(gi + 1))
        });
        refused(&mut d, NOT_FOUND, |d| {
            d.attach_process(
                1,
                ProcessScope::ComputeInstance {
                    gpu_instance: gi,
                    compute_instance: 0,
                },
            )
        });
    }

    #[test]
    fn attaching_twice_is_one_attachment() {
        let mut d = enabled();
        d.attach_process(5, ProcessScope::Gpu).unwrap();
        d.attach_process(5, ProcessScope::Gpu).unwrap();
        d.attach_process(3, ProcessScope::Gpu).unwrap();
        let pids: Vec<u32> = d.processes().iter().map(|p| p.pid).collect();
        assert_eq!(pids, [3, 5]);
    }

    #[test]
    fn a_lost_gpu_answers_every_call_with_gpu_is_lost() {
        let mut d = enabled();
        let gi = create(&mut d, PROFILE_7G, 0);
        let ci = d.create_compute_instance(gi).unwrap();
        d.attach_process(11, ProcessScope::GpuInstance(gi)).unwrap();
        d.set_lost(true);
        assert!(d.is_lost());
        refused(&mut d, GPU_IS_LOST, |d| d.set_mig_mode(false));
        refused(&mut d, GPU_IS_LOST, |d| d.reset());
        refused(&mut d, GPU_IS_LOST, |d| {
            d.create_gpu_instance_with_placement(PROFILE_1G, 0)
        });
        refused(&mut d, GPU_IS_LOST, |d| d.destroy_gpu_instance(gi));
        refused(&mut d, GPU_IS_LOST, |d| d.create_compute_instance(gi));
        refused(&mut d, GPU_IS_LOST, |d| {
            d.destroy_compute_instance(gi, ci.id)
        });
        refused(&mut d, GPU_IS_LOST, |d| {
            d.attach_process(12, ProcessScope::Gpu)
        });
        refused(&mut d, GPU_IS_LOST, |d| {
            d.gpu_instance_possible_placements(PROFILE_1G)
        });
        // Processes die with the GPU; that is not a call to it.
        assert!(d.detach_process(11));
        d.set_lost(false);
        d.destroy_compute_instance(gi, ci.id).unwrap();
    }

    #[test]
    fn mig_uuids_are_well_formed_deterministic_and_distinct() {
        let p = Placement::new(PROFILE_1G, 0);
        let a = mig_uuid(GPU, p, 0, 0);
        assert!(is_mig_uuid(&a), "{a}");
        assert_eq!(a, mig_uuid(GPU, p, 0, 0));
        let others = [
            mig_uuid(GPU, p, 1, 0),
            mig_uuid(GPU, p, 0, 1),
            mig_uuid(GPU, Placement::new(PROFILE_1G, 1), 0, 0),
            mig_uuid("GPU-524af401-a6b6-d6e6-5b23-abd59f5a0478", p, 0, 0),
        ];
        for o in &others {
            assert_ne!(&a, o);
        }
        assert!(!is_mig_uuid("GPU-767c5291-2c3f-0785-831a-22d41d0e178f"));
        assert!(!is_mig_uuid("MIG-767c5291-2c3f-0785-831a-22d41d0e178"));
        assert!(!is_mig_uuid("MIG-767c5291-2c3f-0785-831a-22d41d0e178g"));
        assert!(is_mig_uuid("MIG-767C5291-2C3F-0785-831A-22D41D0E178F"));
    }

    fn quickstart_balanced() -> Vec<InitialInstance> {
        [
            (PROFILE_3G, 4),
            (PROFILE_2G, 0),
            (PROFILE_1G, 2),
            (PROFILE_1G, 3),
        ]
        .into_iter()
        .map(|(id, start)| InitialInstance {
            placement: Placement::new(id, start),
            uuid: None,
        })
        .collect()
    }

    #[test]
    fn with_geometry_numbers_instances_left_to_right() {
        let on = MigMode {
            current: true,
            pending: true,
        };
        let mut given = quickstart_balanced();
        given[0].uuid = Some("MIG-11111111-2222-3333-4444-555555555555".into());
        let d = MigDevice::with_geometry(GPU, h100(), on, &given).unwrap();
        let got: Vec<(u32, Placement, usize)> = d
            .gpu_instances()
            .iter()
            .map(|g| (g.id, g.placement, g.compute_instances.len()))
            .collect();
        assert_eq!(
            got,
            [
                (0, Placement::new(PROFILE_2G, 0), 1),
                (1, Placement::new(PROFILE_1G, 2), 1),
                (2, Placement::new(PROFILE_1G, 3), 1),
                (3, Placement::new(PROFILE_3G, 4), 1),
            ]
        );
        assert_eq!(
            d.gpu_instance(3).unwrap().compute_instances[0].uuid,
            "MIG-11111111-2222-3333-4444-555555555555"
        );
        d.check_invariants().unwrap();
    }

    #[test]
    fn with_geometry_refuses_what_nvml_could_not_produce() {
        let on = MigMode {
            current: true,
            pending: true,
        };
        let off = MigMode {
            current: false,
            pending: false,
        };
        let two_3g_and_1g: Vec<InitialInstance> = [(9, 0), (9, 4), (19, 6)]
            .into_iter()
            .map(|(id, start)| InitialInstance {
                placement: Placement::new(id, start),
                uuid: None,
            })
            .collect();
        assert_eq!(
            code(MigDevice::with_geometry(GPU, h100(), on, &two_3g_and_1g)),
            INSUFFICIENT_RESOURCES
        );
        assert_eq!(
            code(MigDevice::with_geometry(
                GPU,
                h100(),
                off,
                &quickstart_balanced()
            )),
            NOT_SUPPORTED
        );
        let mut dup = quickstart_balanced();
        dup[0].uuid = Some("MIG-11111111-2222-3333-4444-555555555555".into());
        dup[1].uuid = dup[0].uuid.clone();
        assert_eq!(
            code(MigDevice::with_geometry(GPU, h100(), on, &dup)),
            INVALID_ARGUMENT
        );
        let mut bad = quickstart_balanced();
        bad[2].uuid = Some("GPU-11111111-2222-3333-4444-555555555555".into());
        assert_eq!(
            code(MigDevice::with_geometry(GPU, h100(), on, &bad)),
            INVALID_ARGUMENT
        );
        // A pending disable beside existing instances is reachable through NVML (set the mode
        // on an empty GPU, then create), so a snapshot may show it.
        let pending_off = MigMode {
            current: true,
            pending: false,
        };
        let d = MigDevice::with_geometry(GPU, h100(), pending_off, &quickstart_balanced()).unwrap();
        assert_eq!(d.mig_mode(), pending_off);
    }

    #[test]
    fn serde_round_trip_and_corrupted_state_is_refused() {
        let mut d = MigDevice::with_geometry(
            GPU,
            h100(),
            MigMode {
                current: true,
                pending: true,
            },
            &quickstart_balanced(),
        )
        .unwrap();
        d.attach_process(77, ProcessScope::GpuInstance(3)).unwrap();
        let json = serde_json::to_value(&d).unwrap();
        let back: MigDevice = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, d);

        let mut overlapping = json.clone();
        overlapping["gpu_instances"][0]["placement"]["start"] = 2.into();
        let err = serde_json::from_value::<MigDevice>(overlapping).unwrap_err();
        assert!(err.to_string().contains("overlaps"), "{err}");

        let mut orphan = json.clone();
        orphan["processes"][0]["scope"] = serde_json::json!({"gpu_instance": 9});
        assert!(serde_json::from_value::<MigDevice>(orphan).is_err());

        let mut disabled = json;
        disabled["mig"]["current"] = false.into();
        assert!(serde_json::from_value::<MigDevice>(disabled).is_err());
    }

    mod sequences {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            SetMig(bool),
            Reset,
            CreateGi(u32, u8),
            DestroyGi(u32),
            CreateCi(u32),
            DestroyCi(u32, u32),
            Attach(u32, ProcessScope),
            Detach(u32),
            Lose(bool),
        }

        fn scope() -> impl Strategy<Value = ProcessScope> {
            prop_oneof![
                Just(ProcessScope::Gpu),
                (0u32..8).prop_map(ProcessScope::GpuInstance),
                (0u32..8, 0u32..2).prop_map(|(g, c)| ProcessScope::ComputeInstance {
                    gpu_instance: g,
                    compute_instance: c
                }),
            ]
        }

        fn op() -> impl Strategy<Value = Op> {
            // Profile 1 is not a profile ID: exercised as an invalid argument.
            let profile = prop::sample::select(vec![19u32, 20, 15, 14, 9, 5, 0, 1]);
            prop_oneof![
                1 => any::<bool>().prop_map(Op::SetMig),
                2 => Just(Op::Reset),
                // Mostly one of the profile's own starts, so that creates often succeed and
                // the grid fills up; otherwise any slice, 8 (off the grid) included.
                8 => (profile, 0u8..9, prop::bool::weighted(0.75)).prop_map(|(p, s, own)| {
                    let start = match shape(p) {
                        Some(sh) if own => sh.starts[usize::from(s) % sh.starts.len()],
                        _ => s,
                    };
                    Op::CreateGi(p, start)
                }),
                3 => (0u32..8).prop_map(Op::DestroyGi),
                4 => (0u32..8).prop_map(Op::CreateCi),
                3 => (0u32..8, 0u32..2).prop_map(|(g, c)| Op::DestroyCi(g, c)),
                2 => (1u32..4, scope()).prop_map(|(p, s)| Op::Attach(p, s)),
                2 => (1u32..4).prop_map(Op::Detach),
                1 => prop::bool::weighted(0.3).prop_map(Op::Lose),
            ]
        }

        fn apply(d: &mut MigDevice, op: &Op) -> Result<(), DeviceError> {
            match *op {
                Op::SetMig(on) => d.set_mig_mode(on),
                Op::Reset => d.reset(),
                Op::CreateGi(p, s) => d.create_gpu_instance_with_placement(p, s).map(drop),
                Op::DestroyGi(g) => d.destroy_gpu_instance(g),
                Op::CreateCi(g) => d.create_compute_instance(g).map(drop),
                Op::DestroyCi(g, c) => d.destroy_compute_instance(g, c),
                Op::Attach(pid, scope) => d.attach_process(pid, scope),
                Op::Detach(pid) => {
                    d.detach_process(pid);
                    Ok(())
                }
                Op::Lose(lost) => {
                    d.set_lost(lost);
                    Ok(())
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any sequence of operations keeps a geometry NVML accepts, and a refused operation
            /// leaves the device untouched.
            #[test]
            fn operations_keep_the_device_valid(
                start_enabled in any::<bool>(),
                ops in prop::collection::vec(op(), 1..60),
            ) {
                // Half the runs start with MIG on, so that most of their operations reach the
                // placement rules instead of stopping at NOT_SUPPORTED.
                let mut d = if start_enabled { enabled() } else { MigDevice::new(GPU, h100()) };
                for op in &ops {
                    let before = d.clone();
                    // What NVML's placement query says beforehand decides whether a create
                    // may succeed: the query and the call must agree.
                    let predicted = match *op {
                        Op::CreateGi(p, s) => Some(
                            d.gpu_instance_possible_placements(p)
                                .is_ok_and(|v| v.contains(&Placement::new(p, s))),
                        ),
                        _ => None,
                    };
                    let result = apply(&mut d, op);
                    if let Some(ok) = predicted {
                        prop_assert_eq!(ok, result.is_ok(), "{:?} -> {:?}", op, result);
                    }
                    if result.is_err() {
                        prop_assert_eq!(&d, &before, "{:?} failed but changed the device", op);
                    }
                    prop_assert!(validate(&d.placements()).is_ok());
                    prop_assert_eq!(d.check_invariants(), Ok(()), "after {:?}", op);
                }
            }
        }
    }
}
