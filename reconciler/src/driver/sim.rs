//! `sim`: simulated nodes that obey NVML's rules, for development, CI and fault-injection tests.
//!
//! The nodes come from a `ClusterState` document (the file `tessera plan` reads; its running
//! and pending workloads are ignored), read through the compiler so that a mistake in it is
//! reported at `file:line:col`. Each GPU is a [`MigDevice`]: the MIG rules live in
//! `tessera_mig::device`, shared with the fake NVML library, so this module only routes calls,
//! injects faults and persists.
//!
//! Real GPUs keep their geometry when the service is killed and restarted, so the simulated
//! ones do too: the whole fleet is written to a JSON state file after every change (to a
//! temporary file, then renamed over the old one, so a kill mid-write leaves the previous state
//! whole), and a state file that exists is loaded instead of the nodes file's geometry.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tessera_compiler::model::{Gpu, Health, MigInstance, MigState, Node};
use tessera_compiler::{Code, Diagnostic};
use tessera_mig::device::{DeviceError, InitialInstance, MigDevice, MigMode, ProcessScope};
use tessera_mig::{Placement, builtin_model};

use super::faults::{Call, FaultPlan, FaultState};
use super::{
    ComputeInstanceInfo, DriverError, GpuDetail, GpuInstanceInfo, GpuProcess, GpuRef,
    GpuUtilization, NodeDriver, NvmlReturn, Observation, SmActivity,
};

/// Bumped when the state file's shape changes; an unknown version is refused, not guessed at.
const STATE_FORMAT: u32 = 1;

/// Why a simulated fleet could not be built or loaded.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{path}: cannot read: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}: the nodes file has errors:\n{}", render(.diagnostics))]
    Nodes {
        path: String,
        diagnostics: Vec<Diagnostic>,
    },
    #[error("{path}: expected one ClusterState document, found {found}")]
    ClusterStateCount { path: String, found: usize },
    #[error("GPU {gpu}: model {model} is not a built-in GPU model; the simulator knows only those")]
    UnknownModel { gpu: GpuRef, model: String },
    #[error("GPU {gpu}: {model} has no MIG profile `{profile}`")]
    UnknownProfile {
        gpu: GpuRef,
        model: String,
        profile: String,
    },
    #[error("GPU {gpu}: NVML could not produce this state: {source}")]
    Geometry {
        gpu: GpuRef,
        #[source]
        source: DeviceError,
    },
    #[error("{what} is listed twice")]
    Duplicate { what: String },
    #[error("{path}: not a simulator state file: {reason}")]
    State { path: String, reason: String },
    #[error("{path}: cannot write the state: {reason}")]
    Write { path: String, reason: String },
}

fn render(diagnostics: &[Diagnostic]) -> String {
    diagnostics
        .iter()
        .map(|d| {
            let at = d
                .location
                .as_ref()
                .map(|l| format!("{}:{}:{}: ", l.file, l.line, l.column))
                .unwrap_or_default();
            format!("  {at}{} {}: {}", d.code, d.code.name(), d.message)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// One simulated GPU: the health the nodes file gave it (a lost device overrides it), its
/// MIG state, and the utilization and SM activity it reports (set in the state file; none
/// unless set).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SimGpu {
    index: u32,
    health: Health,
    device: MigDevice,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    utilization: Option<GpuUtilization>,
    /// The whole GPU's SM activity, as GPM reports it (in MIG mode too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sm_activity: Option<SmActivity>,
    /// Per GPU instance id: that MIG instance's SM activity. An id no instance has now is
    /// ignored (the instance it meant was destroyed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    instance_sm_activity: BTreeMap<u32, SmActivity>,
}

/// A node: what the nodes file says about it (its `gpus` left empty, the devices are the
/// truth) and its GPUs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SimNode {
    node: Node,
    gpus: Vec<SimGpu>,
}

#[derive(Deserialize)]
struct StateFile {
    nodes: Vec<SimNode>,
}

#[derive(Deserialize)]
struct StateHeader {
    format: u32,
}

/// The simulated driver. See the module documentation.
#[derive(Debug)]
pub struct SimDriver {
    nodes: Vec<SimNode>,
    state_path: PathBuf,
    faults: FaultState,
    process_errors: Vec<DriverError>,
    /// Bumped by every change to a GPU's geometry, mode or health ([`NodeDriver::generation`]);
    /// only this driver's calls change them.
    generation: u64,
}

/// How many unread process-bookkeeping failures a [`SimDriver`] keeps.
pub const MAX_PROCESS_ERRORS: usize = 64;

/// Reads the nodes of a `ClusterState` file through the compiler. Only the problems that
/// concern the nodes are errors here: the driver reads no policy (so a node's pool is not
/// checked) and ignores the workloads.
pub fn load_nodes(path: &Path) -> Result<Vec<Node>, SimError> {
    let shown = path.display().to_string();
    let loaded =
        tessera_compiler::source::discover(&[path.to_path_buf()]).map_err(|e| SimError::Read {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
    let compilation = tessera_compiler::compile_loaded(loaded);
    let about_nodes = |d: &Diagnostic| {
        d.is_error()
            && !matches!(d.code, Code::UnknownPool | Code::EmptyRepository)
            && !d
                .field
                .as_deref()
                .is_some_and(|f| f.starts_with("spec.running") || f.starts_with("spec.pending"))
    };
    // A document that failed to load yields no state at all: then every error explains why.
    let no_state = compilation.states.is_empty();
    let errors: Vec<Diagnostic> = compilation
        .diagnostics
        .into_iter()
        .filter(|d| {
            if no_state {
                d.is_error()
            } else {
                about_nodes(d)
            }
        })
        .collect();
    if !errors.is_empty() {
        return Err(SimError::Nodes {
            path: shown,
            diagnostics: errors,
        });
    }
    let mut states = compilation.states;
    if states.len() != 1 {
        return Err(SimError::ClusterStateCount {
            path: shown,
            found: states.len(),
        });
    }
    Ok(states.remove(0).1.nodes)
}

impl SimDriver {
    /// Opens the simulated fleet: the state file when it exists (the fleet as the last run left
    /// it), else the nodes of the `ClusterState` file at `nodes_file`, which is then written to
    /// the state file at once.
    pub fn open(nodes_file: &Path, state_path: &Path) -> Result<SimDriver, SimError> {
        if state_path.exists() {
            return SimDriver::load_state(state_path);
        }
        let nodes = load_nodes(nodes_file)?;
        SimDriver::create(&nodes, state_path)
    }

    /// Like [`SimDriver::open`], from nodes already read (the state file still wins).
    pub fn from_nodes(nodes: &[Node], state_path: &Path) -> Result<SimDriver, SimError> {
        if state_path.exists() {
            return SimDriver::load_state(state_path);
        }
        SimDriver::create(nodes, state_path)
    }

    fn create(nodes: &[Node], state_path: &Path) -> Result<SimDriver, SimError> {
        let mut sim_nodes: Vec<SimNode> = Vec::with_capacity(nodes.len());
        for node in nodes {
            if sim_nodes.iter().any(|n| n.node.name == node.name) {
                return Err(SimError::Duplicate {
                    what: format!("node {}", node.name),
                });
            }
            let mut gpus: Vec<SimGpu> = Vec::with_capacity(node.gpus.len());
            for gpu in &node.gpus {
                if gpus.iter().any(|g| g.index == gpu.index) {
                    return Err(SimError::Duplicate {
                        what: format!("GPU {}/gpu{}", node.name, gpu.index),
                    });
                }
                gpus.push(sim_gpu(&node.name, gpu)?);
            }
            gpus.sort_by_key(|g| g.index);
            let mut template = node.clone();
            template.gpus.clear();
            sim_nodes.push(SimNode {
                node: template,
                gpus,
            });
        }
        let driver = SimDriver {
            nodes: sim_nodes,
            state_path: state_path.to_path_buf(),
            faults: FaultState::default(),
            process_errors: Vec::new(),
            generation: 0,
        };
        driver.persist()?;
        Ok(driver)
    }

    fn load_state(path: &Path) -> Result<SimDriver, SimError> {
        let shown = path.display().to_string();
        let bytes = fs::read(path).map_err(|e| SimError::Read {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        // The version first, so that a file from another build is named as such rather than
        // reported by whatever field changed.
        let header: StateHeader = serde_json::from_slice(&bytes).map_err(|e| SimError::State {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        if header.format != STATE_FORMAT {
            return Err(SimError::State {
                path: shown,
                reason: format!(
                    "format {} (this build reads format {STATE_FORMAT})",
                    header.format
                ),
            });
        }
        let state: StateFile = serde_json::from_slice(&bytes).map_err(|e| SimError::State {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let mut seen = std::collections::BTreeSet::new();
        for n in &state.nodes {
            for g in &n.gpus {
                if !seen.insert((n.node.name.as_str(), g.index)) {
                    return Err(SimError::State {
                        path: shown,
                        reason: format!("GPU {}/gpu{} is listed twice", n.node.name, g.index),
                    });
                }
            }
        }
        Ok(SimDriver {
            nodes: state.nodes,
            state_path: path.to_path_buf(),
            faults: FaultState::default(),
            process_errors: Vec::new(),
            generation: 0,
        })
    }

    /// Replaces the fault plan; its counters start at zero.
    pub fn set_faults(&mut self, plan: FaultPlan) {
        self.faults = FaultState::new(plan);
    }

    pub fn faults(&self) -> &FaultPlan {
        self.faults.plan()
    }

    /// Every GPU, by node then index.
    pub fn gpus(&self) -> Vec<GpuRef> {
        self.nodes
            .iter()
            .flat_map(|n| {
                n.gpus.iter().map(|g| GpuRef {
                    node: n.node.name.clone(),
                    index: g.index,
                })
            })
            .collect()
    }

    /// A GPU's simulated state, for tests and diagnostics.
    pub fn device(&self, gpu: &GpuRef) -> Option<&MigDevice> {
        let (n, g) = self.locate(gpu).ok()?;
        Some(&self.nodes[n].gpus[g].device)
    }

    /// Marks a GPU lost (or brings it back), as a `lose` fault does; persisted.
    pub fn set_gpu_lost(&mut self, gpu: &GpuRef, lost: bool) -> Result<(), DriverError> {
        let (n, g) = self.locate(gpu)?;
        let before = self.nodes[n].gpus[g].device.clone();
        self.nodes[n].gpus[g].device.set_lost(lost);
        // Counted even if the write fails and the GPU is put back: a change too many only
        // costs the arrival path an observation.
        self.generation += 1;
        self.persist_or_restore(n, g, before)
    }

    /// Records that `pid` holds the GPU (`gpu_instance: None`) or one of its GPU instances, so
    /// that the GPU cannot be reset, nor the instance destroyed, while it runs; persisted.
    /// Fails for an unknown GPU, a lost GPU, an instance that does not exist, or a pid that is
    /// not one process (0, or beyond `i32::MAX`).
    pub fn attach_process(
        &mut self,
        pid: u32,
        gpu: &GpuRef,
        gpu_instance: Option<u32>,
    ) -> Result<(), DriverError> {
        if i32::try_from(pid).map_or(true, |p| p <= 0) {
            return Err(DriverError::Other(format!(
                "{gpu}: {pid} is not a process id"
            )));
        }
        let (n, g) = self.locate(gpu)?;
        let scope = gpu_instance.map_or(ProcessScope::Gpu, ProcessScope::GpuInstance);
        let before = self.nodes[n].gpus[g].device.clone();
        self.nodes[n].gpus[g]
            .device
            .attach_process(pid, scope)
            .map_err(|e| DriverError::Other(format!("{gpu}: process {pid} on {scope}: {e}")))?;
        self.persist_or_restore(n, g, before)
    }

    /// The failures of [`NodeDriver::process_started`] and [`NodeDriver::process_ended`]
    /// since the last call, oldest first (at most [`MAX_PROCESS_ERRORS`]).
    pub fn take_process_errors(&mut self) -> Vec<DriverError> {
        std::mem::take(&mut self.process_errors)
    }

    fn note_process_error(&mut self, e: DriverError) {
        if self.process_errors.len() == MAX_PROCESS_ERRORS {
            self.process_errors.remove(0);
        }
        self.process_errors.push(e);
    }

    pub fn state_path(&self) -> &Path {
        &self.state_path
    }

    fn locate(&self, gpu: &GpuRef) -> Result<(usize, usize), DriverError> {
        let n = self
            .nodes
            .iter()
            .position(|n| n.node.name == gpu.node)
            .ok_or_else(|| DriverError::UnknownGpu(gpu.clone()))?;
        let g = self.nodes[n]
            .gpus
            .iter()
            .position(|g| g.index == gpu.index)
            .ok_or_else(|| DriverError::UnknownGpu(gpu.clone()))?;
        Ok((n, g))
    }

    /// Applies the `lose` faults that fire on a call touching `gpus`.
    fn lose_faults(&mut self, gpus: &[GpuRef]) -> Result<(), DriverError> {
        for gpu in self.faults.lose(gpus) {
            self.set_gpu_lost(&gpu, true)?;
        }
        Ok(())
    }

    /// One NVML call on one GPU: faults first (a lost GPU fails before any other fault is
    /// counted against it), then the device's own rules, then persistence. The device is left
    /// as it was when any of them fails.
    fn device_call<T>(
        &mut self,
        call: Call,
        gpu: &GpuRef,
        op: impl FnOnce(&mut MigDevice) -> Result<T, DeviceError>,
    ) -> Result<T, DriverError> {
        let (n, g) = self.locate(gpu)?;
        self.lose_faults(std::slice::from_ref(gpu))?;
        if self.nodes[n].gpus[g].device.is_lost() {
            return Err(nvml(gpu, call, NvmlReturn::GpuIsLost));
        }
        let verdict = self.faults.on_call(call, std::slice::from_ref(gpu));
        if !verdict.delay.is_zero() {
            std::thread::sleep(verdict.delay);
        }
        if let Some((code, _)) = verdict.fail {
            return Err(nvml(gpu, call, code));
        }
        let before = self.nodes[n].gpus[g].device.clone();
        let value =
            op(&mut self.nodes[n].gpus[g].device).map_err(|e| nvml(gpu, call, e.nvml_return()))?;
        self.generation += 1;
        self.persist_or_restore(n, g, before)?;
        Ok(value)
    }

    /// Writes the state; if that fails, puts GPU (n, g) back as it was so that memory and disk
    /// agree and the failed call changed nothing.
    fn persist_or_restore(
        &mut self,
        n: usize,
        g: usize,
        before: MigDevice,
    ) -> Result<(), DriverError> {
        if let Err(e) = self.persist() {
            self.nodes[n].gpus[g].device = before;
            return Err(DriverError::Other(e.to_string()));
        }
        Ok(())
    }

    /// Writes the whole fleet to a temporary file beside the state file, flushes it and renames
    /// it over the state file, then flushes the directory so that the rename itself survives a
    /// crash.
    fn persist(&self) -> Result<(), SimError> {
        let shown = self.state_path.display().to_string();
        let failed = |reason: String| SimError::Write {
            path: shown.clone(),
            reason,
        };
        let json = serde_json::to_vec(&StateFileRef {
            format: STATE_FORMAT,
            nodes: &self.nodes,
        })
        .map_err(|e| failed(e.to_string()))?;
        let dir = match self.state_path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self
            .state_path
            .file_name()
            .ok_or_else(|| failed("the path names no file".into()))?;
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp = dir.join(tmp_name);
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&json)?;
            f.sync_all()?;
            fs::rename(&tmp, &self.state_path)?;
            fs::File::open(&dir)?.sync_all()
        };
        write().map_err(|e| {
            // The temporary file is ours and useless now; the state file is untouched.
            let _ = fs::remove_file(&tmp);
            failed(e.to_string())
        })
    }

    /// Drops the processes that no longer exist, as NVML stops listing a process once it has
    /// exited.
    fn reap_dead_processes(&mut self) -> Result<(), DriverError> {
        let mut changed = false;
        for node in &mut self.nodes {
            for gpu in &mut node.gpus {
                let mut pids: Vec<u32> = gpu.device.processes().iter().map(|p| p.pid).collect();
                pids.dedup();
                for pid in pids {
                    if !process_exists(pid) {
                        changed |= gpu.device.detach_process(pid);
                    }
                }
            }
        }
        if changed {
            self.persist()
                .map_err(|e| DriverError::Other(e.to_string()))?;
        }
        Ok(())
    }

    fn observation(&self) -> Observation {
        let mut nodes = Vec::with_capacity(self.nodes.len());
        let mut details = Vec::new();
        for n in &self.nodes {
            let mut node = n.node.clone();
            node.gpus = n.gpus.iter().map(observed_gpu).collect();
            nodes.push(node);
            details.extend(n.gpus.iter().map(|g| detail(&n.node.name, g)));
        }
        Observation { nodes, details }
    }
}

/// Serializes the fleet without cloning it.
#[derive(Serialize)]
struct StateFileRef<'a> {
    format: u32,
    nodes: &'a [SimNode],
}

fn nvml(gpu: &GpuRef, call: Call, code: NvmlReturn) -> DriverError {
    DriverError::Nvml {
        gpu: gpu.clone(),
        call: call.nvml_function(),
        code,
    }
}

/// Whether `pid` is a live process. `kill(pid, 0)` checks without signalling: `ESRCH` means
/// gone, `EPERM` means alive but not ours. Pids outside what `kill` accepts as one process
/// (0 and values past `i32::MAX` would address process groups) count as gone.
fn process_exists(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    !matches!(kill(Pid::from_raw(raw), None), Err(Errno::ESRCH))
}

fn sim_gpu(node: &str, gpu: &Gpu) -> Result<SimGpu, SimError> {
    let at = GpuRef {
        node: node.to_owned(),
        index: gpu.index,
    };
    let model = builtin_model(&gpu.model).ok_or_else(|| SimError::UnknownModel {
        gpu: at.clone(),
        model: gpu.model.clone(),
    })?;
    let mut instances = Vec::with_capacity(gpu.instances.len());
    for inst in &gpu.instances {
        let profile_id =
            model
                .resolve_profile(&inst.profile)
                .ok_or_else(|| SimError::UnknownProfile {
                    gpu: at.clone(),
                    model: model.name.clone(),
                    profile: inst.profile.clone(),
                })?;
        instances.push(InitialInstance {
            placement: Placement::new(profile_id, inst.start),
            uuid: inst.uuid.clone(),
        });
    }
    let mig = MigMode {
        current: gpu.mig.enabled,
        pending: gpu.mig.pending.unwrap_or(gpu.mig.enabled),
    };
    let mut device =
        MigDevice::with_geometry(gpu.uuid.clone(), model, mig, &instances).map_err(|source| {
            SimError::Geometry {
                gpu: at.clone(),
                source,
            }
        })?;
    // A GPU the snapshot saw lost stays lost; its geometry is the last one known.
    device.set_lost(gpu.health == Health::Lost);
    Ok(SimGpu {
        index: gpu.index,
        health: gpu.health,
        device,
        utilization: None,
        sm_activity: None,
        instance_sm_activity: BTreeMap::new(),
    })
}

/// The GPU as `ClusterState` shows it. A lost GPU keeps its last known geometry (NVML cannot
/// read it, and nothing can change it while it is lost) and is reported `lost`.
fn observed_gpu(g: &SimGpu) -> Gpu {
    let d = &g.device;
    let mode = d.mig_mode();
    let mut instances: Vec<MigInstance> = d
        .gpu_instances()
        .iter()
        .map(|gi| MigInstance {
            profile: d
                .model()
                .profile_name(gi.placement.profile_id)
                .map_or_else(|| gi.placement.profile_id.to_string(), str::to_owned),
            start: gi.placement.start,
            uuid: gi.compute_instances.first().map(|c| c.uuid.clone()),
        })
        .collect();
    instances.sort_by_key(|i| i.start);
    Gpu {
        index: g.index,
        uuid: d.uuid().to_owned(),
        model: d.model().name.clone(),
        health: if d.is_lost() { Health::Lost } else { g.health },
        mig: MigState {
            enabled: mode.current,
            pending: (mode.pending != mode.current).then_some(mode.pending),
        },
        instances,
    }
}

fn detail(node: &str, g: &SimGpu) -> GpuDetail {
    let d = &g.device;
    let mut processes: Vec<GpuProcess> = d
        .processes()
        .iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            gpu_instance: p.scope.gpu_instance(),
        })
        .collect();
    processes.dedup();
    GpuDetail {
        gpu: GpuRef {
            node: node.to_owned(),
            index: g.index,
        },
        instances: d
            .gpu_instances()
            .iter()
            .map(|gi| GpuInstanceInfo {
                id: gi.id,
                profile_id: gi.placement.profile_id,
                start: gi.placement.start,
                compute_instances: gi
                    .compute_instances
                    .iter()
                    .map(|c| ComputeInstanceInfo {
                        id: c.id,
                        uuid: c.uuid.clone(),
                    })
                    .collect(),
                sm_activity: g.instance_sm_activity.get(&gi.id).copied(),
            })
            .collect(),
        processes,
        // As NVML: a GPU in MIG mode reports none.
        utilization: g.utilization.filter(|_| !d.mig_mode().current),
        sm_activity: g.sm_activity,
    }
}

impl NodeDriver for SimDriver {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn observe(&mut self) -> Result<Observation, DriverError> {
        let all = self.gpus();
        self.lose_faults(&all)?;
        let verdict = self.faults.on_call(Call::Observe, &all);
        if !verdict.delay.is_zero() {
            std::thread::sleep(verdict.delay);
        }
        if let Some((code, gpu)) = verdict.fail {
            return Err(nvml(&gpu, Call::Observe, code));
        }
        self.reap_dead_processes()?;
        Ok(self.observation())
    }

    /// The count of changes to the GPUs' geometry, mode and health; `None` while a fault plan
    /// is set, whose faults count observations (a `lose` fault fires on the N-th call that
    /// touches its GPU, an observation included): every check then observes, so that the
    /// faults fire when they would have.
    fn generation(&self) -> Option<u64> {
        self.faults
            .plan()
            .faults
            .is_empty()
            .then_some(self.generation)
    }

    fn set_mig_mode(&mut self, gpu: &GpuRef, enabled: bool) -> Result<(), DriverError> {
        self.device_call(Call::SetMigMode, gpu, |d| d.set_mig_mode(enabled))
    }

    fn reset_gpu(&mut self, gpu: &GpuRef) -> Result<(), DriverError> {
        self.device_call(Call::ResetGpu, gpu, MigDevice::reset)
    }

    fn create_gpu_instance(
        &mut self,
        gpu: &GpuRef,
        profile_id: u32,
        start: u8,
    ) -> Result<u32, DriverError> {
        self.device_call(Call::CreateGpuInstance, gpu, |d| {
            d.create_gpu_instance_with_placement(profile_id, start)
        })
    }

    fn destroy_gpu_instance(&mut self, gpu: &GpuRef, gpu_instance: u32) -> Result<(), DriverError> {
        self.device_call(Call::DestroyGpuInstance, gpu, |d| {
            d.destroy_gpu_instance(gpu_instance)
        })
    }

    fn create_compute_instance(
        &mut self,
        gpu: &GpuRef,
        gpu_instance: u32,
    ) -> Result<ComputeInstanceInfo, DriverError> {
        self.device_call(Call::CreateComputeInstance, gpu, |d| {
            d.create_compute_instance(gpu_instance)
        })
        .map(|ci| ComputeInstanceInfo {
            id: ci.id,
            uuid: ci.uuid,
        })
    }

    fn destroy_compute_instance(
        &mut self,
        gpu: &GpuRef,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<(), DriverError> {
        self.device_call(Call::DestroyComputeInstance, gpu, |d| {
            d.destroy_compute_instance(gpu_instance, compute_instance)
        })
    }

    /// See [`SimDriver::attach_process`]; a failure is kept for
    /// [`SimDriver::take_process_errors`], since the trait has no way to return it.
    fn process_started(&mut self, pid: u32, gpu: &GpuRef, gpu_instance: Option<u32>) {
        if let Err(e) = self.attach_process(pid, gpu, gpu_instance) {
            self.note_process_error(e);
        }
    }

    fn process_ended(&mut self, pid: u32) {
        let mut changed = false;
        for node in &mut self.nodes {
            for gpu in &mut node.gpus {
                changed |= gpu.device.detach_process(pid);
            }
        }
        // Memory is right either way; the next successful write records the exit.
        if changed && let Err(e) = self.persist() {
            self.note_process_error(DriverError::Other(e.to_string()));
        }
    }
}
