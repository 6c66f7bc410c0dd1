//! The single-process service's node side: this machine's driver and the embedded runtime,
//! one action at a time, each journaled around its call (intent, then done or failed, one
//! action's outcome committed with the next one's intent).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use tessera_compiler::WorkloadKey;
use tessera_compiler::model::Binding;
use tracing::{Span, info_span};

use super::{
    Carry, InFlight, LaunchContext, Launched, Launching, NodeSide, OnSettled, Unsettled,
    WorkloadExit,
};
use crate::actions::Action;
use crate::driver::{DriverError, GpuRef, NodeDriver, Observation};
use crate::runtime::{Exited, Runtime};
use crate::service::apply;
use crate::service::cycle::action_name;
use crate::service::error::CycleError;
use crate::store::{Phase, ReplicaProcess, StateStore, StateStoreExt, StoreError, WorkloadRecord};

/// This machine as the service's nodes.
pub struct LocalNodes {
    driver: Box<dyn NodeDriver>,
    runtime: Runtime,
    state_dir: PathBuf,
    /// Exits polled between cycles, reaped by the next one.
    exits: Vec<Exited>,
}

impl LocalNodes {
    pub fn new(driver: Box<dyn NodeDriver>, runtime: Runtime, state_dir: PathBuf) -> LocalNodes {
        LocalNodes {
            driver,
            runtime,
            state_dir,
            exits: Vec::new(),
        }
    }
}

impl NodeSide for LocalNodes {
    fn kind(&self) -> String {
        self.driver.kind().to_string()
    }

    fn observe(&mut self) -> Result<Observation, DriverError> {
        self.driver.observe()
    }

    fn generation(&mut self) -> Option<u64> {
        self.driver.generation()
    }

    fn in_flight_at_start(
        &mut self,
        _store: &dyn StateStore,
        _now: i64,
    ) -> Result<InFlight, StoreError> {
        Ok(InFlight::default())
    }

    fn adopt(&mut self, record: &WorkloadRecord, observation: Option<&Observation>) -> Vec<String> {
        let mut errors = Vec::new();
        for r in &record.replicas {
            let Some(pid) = r.pid else { continue };
            if let Err(e) = self.runtime.adopt(&runtime_id(record), r.replica, pid) {
                errors.push(format!("recovery: cannot adopt {}: {e}", record.key()));
            }
            if let Some(b) = record.bindings.get(r.replica as usize) {
                for &index in &b.gpus {
                    let gpu = GpuRef {
                        node: b.node.clone(),
                        index,
                    };
                    let gi = b
                        .mig_start
                        .and_then(|start| observation.and_then(|o| apply::find_gi(o, &gpu, start)));
                    self.driver.process_started(pid, &gpu, gi);
                }
            }
        }
        errors
    }

    fn stop_strays(&mut self, record: &WorkloadRecord) {
        for pid in self.runtime.pids_of(&runtime_id(record)) {
            let _ = self.runtime.kill(pid);
            self.driver.process_ended(pid);
        }
    }

    fn stop(&mut self, _key: &WorkloadKey, _bindings: &[Binding], replicas: &[ReplicaProcess]) {
        for pid in replicas.iter().filter_map(|r| r.pid) {
            // A process already gone is what stopping wants.
            let _ = self.runtime.kill(pid);
            self.driver.process_ended(pid);
        }
    }

    fn carry_out(
        &mut self,
        plan: &[Action],
        cx: &mut Carry<'_>,
        settled: &mut OnSettled<'_>,
    ) -> Result<Unsettled, CycleError> {
        let mut out = Unsettled::default();
        let mut created = BTreeMap::new();
        let mut observed_after_geometry = false;
        // Once an action on a GPU fails, the rest of that GPU's steps (and the workloads that
        // need it) wait for the next cycle, which re-plans from what the GPU then shows.
        let mut failed_keys: BTreeSet<String> = BTreeSet::new();
        // How the last applied action ended, recorded with the next one's intent (one commit
        // for both) or after the loop.
        let mut unrecorded: Option<(crate::store::ActionId, Result<(), String>)> = None;
        for action in plan {
            if depends_on_failed(action, &failed_keys) {
                out.skipped.push(action.clone());
                continue;
            }
            if matches!(action, Action::Start { .. }) && !observed_after_geometry {
                // New compute instances have UUIDs only the driver knows.
                if plan.iter().any(Action::is_geometry) {
                    *cx.observation = self.driver.observe().map_err(CycleError::Observe)?;
                }
                observed_after_geometry = true;
            }
            let id = match unrecorded.take() {
                Some((last, how)) => {
                    cx.store
                        .close_and_begin((last, ended(&how)), cx.cycle, action, cx.now)?
                }
                None => cx.store.begin_action(cx.cycle, action, cx.now)?,
            };
            let span = action_span(id, action);
            let _entered = span.enter();
            let mut apply_cx = apply::Context {
                driver: self.driver.as_mut(),
                runtime: &mut self.runtime,
                store: cx.store,
                state_dir: &self.state_dir,
                now: cx.now,
                run_commands: cx.run_commands,
                observation: cx.observation,
                created: &mut created,
            };
            let outcome = apply::apply(&mut apply_cx, action).map_err(|e| e.to_string());
            if outcome.is_err() {
                failed_keys.insert(action.key());
            }
            settled(action, &outcome)?;
            unrecorded = Some((id, outcome));
        }
        if let Some((last, how)) = unrecorded.take() {
            cx.store.close(last, ended(&how), cx.now)?;
        }
        Ok(out)
    }

    fn launch(&mut self, starts: &[Launching<'_>], cx: &LaunchContext<'_>) -> Vec<Launched> {
        starts
            .iter()
            .map(|s| {
                match apply::launch(
                    self.driver.as_mut(),
                    &mut self.runtime,
                    &self.state_dir,
                    cx.run_commands,
                    s.key,
                    s.record,
                    s.plans.clone(),
                ) {
                    Ok(replicas) => Launched::Started(replicas),
                    Err(e) => Launched::Failed(e.to_string()),
                }
            })
            .collect()
    }

    fn has_exits(&mut self) -> bool {
        self.exits.extend(self.runtime.poll());
        !self.exits.is_empty()
    }

    fn exits(&mut self, store: &dyn StateStore, now: i64) -> Result<Vec<WorkloadExit>, StoreError> {
        let mut exits = std::mem::take(&mut self.exits);
        exits.extend(self.runtime.poll());
        let mut ended = Vec::new();
        for exit in exits {
            self.driver.process_ended(exit.pid);
            let Some(record) = store.workload_by_pid(exit.pid)? else {
                continue;
            };
            let remaining = store.replica_exited(&record.key(), exit.pid, now)?;
            if remaining > 0 {
                continue;
            }
            let checkpoint = (record.phase == Phase::Checkpointing)
                .then(|| apply::checkpoint_dir(&self.state_dir, &record.key()))
                .filter(|dir| apply::dir_has_entries(dir))
                .map(|dir| dir.display().to_string());
            ended.push(WorkloadExit {
                record,
                status: exit.status,
                checkpoint,
            });
        }
        Ok(ended)
    }

    fn lost(&mut self) -> Vec<(String, String)> {
        // A node this machine's driver reports lost is reported as lost hardware; nothing
        // else runs its workloads, so they are not moved.
        Vec::new()
    }

    fn conditions(&mut self, run_commands: bool) -> Vec<String> {
        // A host that cannot confine workloads runs none: the service is not healthy, whether
        // or not a start was due this cycle.
        match self.runtime.refusal() {
            Some(why) if run_commands => vec![format!("runtime: {why}")],
            _ => Vec::new(),
        }
    }
}

/// The runtime's id of a stored workload ([`crate::runtime::workload_id`]).
fn runtime_id(r: &WorkloadRecord) -> String {
    crate::runtime::workload_id(&r.tenant, &r.name)
}

/// The journal's record of how an action ended.
fn ended(how: &Result<(), String>) -> crate::store::Ended<'_> {
    match how {
        Ok(()) => crate::store::Ended::Done,
        Err(message) => crate::store::Ended::Failed(message),
    }
}

/// The span one action is applied in: its journal id, and the node and workload it is on.
fn action_span(id: crate::store::ActionId, action: &Action) -> Span {
    let node = match action {
        Action::Start { bindings, .. } => {
            let nodes: BTreeSet<&str> = bindings.iter().map(|b| b.node.as_str()).collect();
            Some(nodes.into_iter().collect::<Vec<_>>().join(","))
        }
        other => crate::service::cycle::gpu_of(other).map(|g| g.node.clone()),
    };
    info_span!(
        "action",
        id,
        action = action_name(action),
        node = node.as_deref(),
        workload = crate::service::cycle::workload_of(action)
    )
}

/// Whether `action` needs a GPU (or is itself on a key) whose action failed this cycle.
fn depends_on_failed(action: &Action, failed: &BTreeSet<String>) -> bool {
    if failed.is_empty() {
        return false;
    }
    if failed.contains(&action.key()) {
        return true;
    }
    match action {
        Action::Start { bindings, .. } => bindings.iter().any(|b| {
            b.gpus.iter().any(|&index| {
                let gpu = GpuRef {
                    node: b.node.clone(),
                    index,
                };
                failed.contains(&format!("gpu/{gpu}"))
            })
        }),
        _ => false,
    }
}
