//! Applying one action: the driver or runtime call, and what the store records of it.
//!
//! Every action is written to the journal as an intent before it runs and marked done or
//! failed after (by the caller, [`super::cycle`]); this module only performs it. Each is
//! idempotent in effect: applying it again after a crash either does nothing more or fails
//! with a code the next cycle's plan already accounts for (an instance that exists, a process
//! that is gone).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tessera_compiler::WorkloadKey;
use tessera_compiler::model::Binding;
use tessera_solver::decision::ReplicaBinding;

use crate::actions::Action;
use crate::driver::{DriverError, GpuRef, NodeDriver, Observation};
use crate::runtime::{GpuDevice, LaunchSpec, Runtime, Signal};
use crate::store::{ReplicaProcess, Store, WorkloadRecord};

/// What an action failed with.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Precondition(String),
}

/// What applying needs, borrowed from the reconciler for one cycle.
pub struct Context<'a> {
    pub driver: &'a mut dyn NodeDriver,
    pub runtime: &'a mut Runtime,
    pub store: &'a Store,
    pub state_dir: &'a Path,
    pub now: i64,
    pub run_commands: bool,
    /// The latest observation; refreshed after geometry changes so that starts see new UUIDs.
    pub observation: &'a mut Observation,
    /// GPU instances this cycle created, by GPU and start, before the next observation.
    pub created: &'a mut BTreeMap<(GpuRef, u8), u32>,
}

/// The key an action names its workload by, `tenant/name`.
fn key_of(workload: &str) -> Result<WorkloadKey, ApplyError> {
    WorkloadKey::parse(workload).ok_or_else(|| {
        ApplyError::Precondition(format!(
            "`{workload}` is not a workload key (`tenant/name`)"
        ))
    })
}

pub fn apply(cx: &mut Context<'_>, action: &Action) -> Result<(), ApplyError> {
    match action {
        Action::Checkpoint {
            workload,
            signal,
            deadline,
        } => {
            let key = key_of(workload)?;
            let record = cx.store.workload(&key)?;
            let signal = Signal::parse(signal)?;
            for pid in live_pids(&record) {
                cx.runtime.signal(pid, signal)?;
            }
            cx.store.mark_checkpointing(&key, *deadline, cx.now)?;
            Ok(())
        }
        Action::Stop { workload, reason } => {
            let key = key_of(workload)?;
            let record = cx.store.workload(&key)?;
            for pid in live_pids(&record) {
                cx.runtime.kill(pid)?;
                cx.driver.process_ended(pid);
            }
            cx.store.requeue(&key, reason, cx.now)?;
            Ok(())
        }
        Action::DestroyComputeInstance {
            gpu,
            gpu_instance,
            compute_instance,
        } => Ok(cx
            .driver
            .destroy_compute_instance(gpu, *gpu_instance, *compute_instance)?),
        Action::DestroyGpuInstance { gpu, gpu_instance } => {
            Ok(cx.driver.destroy_gpu_instance(gpu, *gpu_instance)?)
        }
        Action::SetMigMode { gpu, enabled } => Ok(cx.driver.set_mig_mode(gpu, *enabled)?),
        Action::ResetGpu { gpu } => Ok(cx.driver.reset_gpu(gpu)?),
        Action::CreateGpuInstance {
            gpu,
            profile_id,
            start,
        } => {
            let id = cx.driver.create_gpu_instance(gpu, *profile_id, *start)?;
            cx.created.insert((gpu.clone(), *start), id);
            Ok(())
        }
        Action::CreateComputeInstance { gpu, start } => {
            let gi = match cx.created.get(&(gpu.clone(), *start)) {
                Some(&id) => id,
                None => find_gi(cx.observation, gpu, *start).ok_or_else(|| {
                    ApplyError::Precondition(format!(
                        "{gpu}: no GPU instance at memory slice {start}"
                    ))
                })?,
            };
            cx.driver.create_compute_instance(gpu, gi)?;
            Ok(())
        }
        Action::Start { workload, bindings } => start(cx, &key_of(workload)?, bindings),
    }
}

fn start(
    cx: &mut Context<'_>,
    workload: &WorkloadKey,
    bindings: &[ReplicaBinding],
) -> Result<(), ApplyError> {
    let record = cx.store.workload(workload)?;
    // Resolve every replica's devices before starting any: a gang starts whole or not at all.
    let mut launches = Vec::with_capacity(bindings.len());
    for (replica, b) in bindings.iter().enumerate() {
        launches.push((replica as u32, b, devices(cx.observation, b)?));
    }
    let plain: Vec<Binding> = bindings.iter().map(ReplicaBinding::binding).collect();
    cx.store.mark_starting(workload, &plain, cx.now)?;

    let checkpoint_dir = checkpoint_dir(cx.state_dir, workload);
    let resume_from =
        (record.attempts > 0 && dir_has_entries(&checkpoint_dir)).then(|| checkpoint_dir.clone());
    let mut replicas = Vec::with_capacity(launches.len());
    if cx.run_commands && !record.spec.command.is_empty() {
        for (replica, b, ReplicaDevices { uuids, gi, gpus }) in &launches {
            let spec = LaunchSpec {
                tenant: workload.tenant.clone(),
                workload: workload.name.clone(),
                replica: *replica,
                command: record.spec.command.clone(),
                env: record.spec.env.clone(),
                devices: uuids.clone(),
                gpus: gpus.clone(),
                cpu_millis: record.spec.cpu.0,
                memory_bytes: record.spec.memory.0,
                mps_thread_percentage: b.share.map(|s| {
                    // MPS takes a whole percentage; a share never rounds to 0.
                    ((s.as_f64() * 100.0).round() as u32).clamp(1, 100)
                }),
                work_dir: work_dir(cx.state_dir, workload),
                checkpoint_dir: checkpoint_dir.clone(),
                resume_from: resume_from.clone(),
            };
            match cx.runtime.start(&spec) {
                Ok(started) => {
                    for &index in &b.gpus {
                        let gpu = GpuRef {
                            node: b.node.clone(),
                            index,
                        };
                        cx.driver.process_started(started.pid, &gpu, *gi);
                    }
                    replicas.push(ReplicaProcess {
                        replica: *replica,
                        pid: Some(started.pid),
                        devices: uuids.clone(),
                    });
                }
                Err(e) => {
                    // All or nothing: what started of the gang is stopped again.
                    for r in &replicas {
                        if let Some(pid) = r.pid {
                            let _ = cx.runtime.kill(pid);
                            cx.driver.process_ended(pid);
                        }
                    }
                    cx.store
                        .requeue(workload, &format!("start failed: {e}"), cx.now)?;
                    return Err(e.into());
                }
            }
        }
    } else {
        for (replica, _, devices) in &launches {
            replicas.push(ReplicaProcess {
                replica: *replica,
                pid: None,
                devices: devices.uuids.clone(),
            });
        }
    }
    cx.store.mark_running(workload, &replicas, cx.now)?;
    Ok(())
}

/// The pids of a workload's replicas that the store knows.
pub fn live_pids(record: &WorkloadRecord) -> Vec<u32> {
    record.replicas.iter().filter_map(|r| r.pid).collect()
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

/// The id of the GPU instance at memory slice `start` of `gpu`, as observed.
pub fn find_gi(observation: &Observation, gpu: &GpuRef, start: u8) -> Option<u32> {
    observation
        .details
        .iter()
        .find(|d| &d.gpu == gpu)?
        .instances
        .iter()
        .find(|gi| gi.start == start)
        .map(|gi| gi.id)
}

/// One replica's devices, resolved from the observation.
struct ReplicaDevices {
    /// What `CUDA_VISIBLE_DEVICES` names.
    uuids: Vec<String>,
    /// The GPU instance of a MIG replica.
    gi: Option<u32>,
    /// The devices whose nodes its sandbox shows.
    gpus: Vec<GpuDevice>,
}

fn devices(observation: &Observation, b: &ReplicaBinding) -> Result<ReplicaDevices, ApplyError> {
    let node = observation
        .nodes
        .iter()
        .find(|n| n.name == b.node)
        .ok_or_else(|| ApplyError::Precondition(format!("node {} is not observed", b.node)))?;
    if let Some(start) = b.mig_start {
        let index = *b.gpus.first().ok_or_else(|| {
            ApplyError::Precondition(format!("{}: a MIG binding names no GPU", b.node))
        })?;
        let gpu = GpuRef {
            node: b.node.clone(),
            index,
        };
        let detail = observation
            .details
            .iter()
            .find(|d| d.gpu == gpu)
            .ok_or_else(|| ApplyError::Precondition(format!("{gpu} is not observed")))?;
        let gi = detail
            .instances
            .iter()
            .find(|gi| gi.start == start)
            .ok_or_else(|| {
                ApplyError::Precondition(format!("{gpu}: no GPU instance at memory slice {start}"))
            })?;
        let ci = gi.compute_instances.first().ok_or_else(|| {
            ApplyError::Precondition(format!(
                "{gpu}: the GPU instance at memory slice {start} has no compute instance"
            ))
        })?;
        let device = GpuDevice {
            index,
            mig: Some((gi.id, ci.id)),
        };
        return Ok(ReplicaDevices {
            uuids: vec![ci.uuid.clone()],
            gi: Some(gi.id),
            gpus: vec![device],
        });
    }
    let mut uuids = Vec::with_capacity(b.gpus.len());
    for &index in &b.gpus {
        let gpu = node.gpus.iter().find(|g| g.index == index).ok_or_else(|| {
            ApplyError::Precondition(format!("{}/gpu{index} is not observed", b.node))
        })?;
        uuids.push(gpu.uuid.clone());
    }
    let gpus = b
        .gpus
        .iter()
        .map(|&index| GpuDevice { index, mig: None })
        .collect();
    Ok(ReplicaDevices {
        uuids,
        gi: None,
        gpus,
    })
}
