//! Applying one action in the single-process service: the node-local call ([`crate::node`])
//! and what the store records around it.
//!
//! Every action is written to the journal as an intent before it runs and marked done or
//! failed after (by the caller, [`super::cycle`]); this module only performs it. Each is
//! idempotent in effect: applying it again after a crash either does nothing more or fails
//! with a code the next cycle's plan already accounts for (an instance that exists, a process
//! that is gone).

use std::collections::BTreeMap;
use std::path::Path;

use tessera_compiler::WorkloadKey;
use tessera_compiler::model::Binding;
use tessera_solver::decision::ReplicaBinding;

use crate::actions::Action;
use crate::driver::{GpuRef, NodeDriver, Observation};
use crate::node::{self, GangSpec, NodeError};
use crate::runtime::{Runtime, Signal};
use crate::store::{ReplicaProcess, StateStore, WorkloadRecord};

pub use crate::node::{checkpoint_dir, dir_has_entries, find_gi, work_dir};

/// What an action failed with.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Precondition(String),
}

impl From<crate::runtime::RuntimeError> for ApplyError {
    fn from(e: crate::runtime::RuntimeError) -> ApplyError {
        ApplyError::Node(e.into())
    }
}

/// What applying needs, borrowed from the reconciler for one cycle.
pub struct Context<'a> {
    pub driver: &'a mut dyn NodeDriver,
    pub runtime: &'a mut Runtime,
    pub store: &'a dyn StateStore,
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
            node::signal_all(cx.runtime, &live_pids(&record), signal)?;
            cx.store.mark_checkpointing(&key, *deadline, cx.now)?;
            Ok(())
        }
        Action::Stop { workload, reason } => {
            let key = key_of(workload)?;
            let record = cx.store.workload(&key)?;
            node::kill_all(cx.driver, cx.runtime, &live_pids(&record))?;
            cx.store.requeue(&key, reason, cx.now)?;
            Ok(())
        }
        Action::Start { workload, bindings } => start(cx, &key_of(workload)?, bindings),
        geometry => Ok(node::apply_geometry(
            cx.driver,
            cx.observation,
            cx.created,
            geometry,
        )?),
    }
}

fn start(
    cx: &mut Context<'_>,
    workload: &WorkloadKey,
    bindings: &[ReplicaBinding],
) -> Result<(), ApplyError> {
    let record = cx.store.workload(workload)?;
    let plans = node::resolve(
        cx.observation,
        bindings.iter().enumerate().map(|(i, b)| (i as u32, b)),
    )?;
    let plain: Vec<Binding> = bindings.iter().map(ReplicaBinding::binding).collect();
    cx.store.mark_starting(workload, &plain, cx.now)?;

    let launched = launch(
        cx.driver,
        cx.runtime,
        cx.state_dir,
        cx.run_commands,
        workload,
        &record,
        plans,
    );
    let replicas = match launched {
        Ok(replicas) => replicas,
        Err(e) => {
            cx.store
                .requeue(workload, &format!("start failed: {e}"), cx.now)?;
            return Err(e.into());
        }
    };
    cx.store.mark_running(workload, &replicas, cx.now)?;
    Ok(())
}

/// Launches a placed workload's replicas on their resolved devices (its command, when
/// commands run and it has one), resuming from its checkpoint when it has been requeued; the
/// replicas as the store records them. Nothing is left running when it fails.
pub fn launch(
    driver: &mut dyn NodeDriver,
    runtime: &mut Runtime,
    state_dir: &Path,
    run_commands: bool,
    workload: &WorkloadKey,
    record: &WorkloadRecord,
    plans: Vec<node::ReplicaPlan>,
) -> Result<Vec<ReplicaProcess>, NodeError> {
    if !run_commands || record.spec.command.is_empty() {
        return Ok(plans
            .into_iter()
            .map(|p| ReplicaProcess {
                replica: p.replica,
                pid: None,
                devices: p.devices.uuids,
            })
            .collect());
    }
    let checkpoint_dir = checkpoint_dir(state_dir, workload);
    let resume_from =
        (record.attempts > 0 && dir_has_entries(&checkpoint_dir)).then(|| checkpoint_dir.clone());
    let gang = GangSpec {
        workload: workload.clone(),
        command: record.spec.command.clone(),
        env: record.spec.env.clone(),
        cpu_millis: record.spec.cpu.0,
        memory_bytes: record.spec.memory.0,
        work_dir: work_dir(state_dir, workload),
        checkpoint_dir,
        resume_from,
    };
    let started = node::launch(driver, runtime, &gang, &plans)?;
    Ok(started
        .into_iter()
        .map(|s| ReplicaProcess {
            replica: s.replica,
            pid: Some(s.pid),
            devices: s.devices,
        })
        .collect())
}

/// The pids of a workload's replicas that the store knows.
pub fn live_pids(record: &WorkloadRecord) -> Vec<u32> {
    record.replicas.iter().filter_map(|r| r.pid).collect()
}
