//! The node-local half of applying an action: the driver calls that change a GPU's geometry
//! and the runtime calls that start, signal and stop a workload's processes, with no store in
//! them.
//!
//! Both the single-process service (`service/apply.rs`, which adds the SQLite bookkeeping
//! around each call) and fleet mode's node agent (`tessera-fleet agent`, which journals in
//! etcd) apply actions through this module, so the code that touches the hardware is written
//! once, wherever the hardware is.

mod devices;
mod gang;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tessera_compiler::WorkloadKey;

use crate::actions::Action;
use crate::driver::{DriverError, GpuRef, NodeDriver, Observation};
use crate::runtime::{Runtime, RuntimeError, Signal};

pub use devices::{ReplicaDevices, ReplicaPlan, find_gi, resolve};
pub use gang::{GangSpec, StartedReplica, launch};

/// What a node-local step failed with.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The action cannot be applied to what the node shows (a GPU instance that is not
    /// there, a node that is not observed).
    #[error("{0}")]
    Precondition(String),
}

/// GPU instances created since the last observation, by GPU and first memory slice: a
/// compute instance created right after its GPU instance finds it here before any observation
/// shows it.
pub type Created = BTreeMap<(GpuRef, u8), u32>;

/// Applies one geometry action ([`Action::is_geometry`]) through the driver. `observation`
/// is the latest one; `created` carries what this run of actions created.
pub fn apply_geometry(
    driver: &mut dyn NodeDriver,
    observation: &Observation,
    created: &mut Created,
    action: &Action,
) -> Result<(), NodeError> {
    match action {
        Action::DestroyComputeInstance {
            gpu,
            gpu_instance,
            compute_instance,
        } => Ok(driver.destroy_compute_instance(gpu, *gpu_instance, *compute_instance)?),
        Action::DestroyGpuInstance { gpu, gpu_instance } => {
            Ok(driver.destroy_gpu_instance(gpu, *gpu_instance)?)
        }
        Action::SetMigMode { gpu, enabled } => Ok(driver.set_mig_mode(gpu, *enabled)?),
        Action::ResetGpu { gpu } => Ok(driver.reset_gpu(gpu)?),
        Action::CreateGpuInstance {
            gpu,
            profile_id,
            start,
        } => {
            let id = driver.create_gpu_instance(gpu, *profile_id, *start)?;
            created.insert((gpu.clone(), *start), id);
            Ok(())
        }
        Action::CreateComputeInstance { gpu, start } => {
            let gi = match created.get(&(gpu.clone(), *start)) {
                Some(&id) => id,
                None => find_gi(observation, gpu, *start).ok_or_else(|| {
                    NodeError::Precondition(format!(
                        "{gpu}: no GPU instance at memory slice {start}"
                    ))
                })?,
            };
            driver.create_compute_instance(gpu, gi)?;
            Ok(())
        }
        Action::Checkpoint { .. } | Action::Stop { .. } | Action::Start { .. } => Err(
            NodeError::Precondition(format!("`{action}` is not a geometry step")),
        ),
    }
}

/// Sends a workload's checkpoint signal to each of its replicas' processes.
pub fn signal_all(runtime: &mut Runtime, pids: &[u32], signal: Signal) -> Result<(), NodeError> {
    for &pid in pids {
        runtime.signal(pid, signal)?;
    }
    Ok(())
}

/// Kills a workload's replicas' processes and tells the driver they no longer hold devices.
pub fn kill_all(
    driver: &mut dyn NodeDriver,
    runtime: &mut Runtime,
    pids: &[u32],
) -> Result<(), NodeError> {
    for &pid in pids {
        runtime.kill(pid)?;
        driver.process_ended(pid);
    }
    Ok(())
}

/// Where a workload's checkpoints live: the same directory across attempts, so a requeued
/// workload resumes from what it saved; one per tenant and name, so two tenants' workloads of
/// one name never share it.
pub fn checkpoint_dir(state_dir: &Path, workload: &WorkloadKey) -> PathBuf {
    state_dir
        .join("checkpoints")
        .join(&workload.tenant)
        .join(&workload.name)
}

/// A workload's working directory, per tenant and name like [`checkpoint_dir`].
pub fn work_dir(state_dir: &Path, workload: &WorkloadKey) -> PathBuf {
    state_dir
        .join("workloads")
        .join(&workload.tenant)
        .join(&workload.name)
}

/// Whether a checkpoint directory holds anything to resume from.
pub fn dir_has_entries(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}
