//! The agent's node: its driver, its runtime and its record, and how an action is applied to
//! them or, when a previous agent died applying it, settled. No etcd here: this is the part a
//! benchmark of many simulated agents in one process drives as well.

use std::path::{Path, PathBuf};

use tessera_compiler::WorkloadKey;
use tessera_reconciler::actions::Action;
use tessera_reconciler::driver::{DriverError, GpuRef, NodeDriver, Observation};
use tessera_reconciler::node::{self, Created, GangSpec};
use tessera_reconciler::runtime::{Runtime, Signal, workload_id};
use tessera_solver::decision::ReplicaBinding;
use tracing::{info, warn};

use super::record::{LocalReplica, LocalWorkload, Record, RecordError};
use crate::protocol::{self, ActionMessage, Bound, Launch, Observed, VERSION};

/// Why the previous agent's intent is settled as failed.
pub const INTERRUPTED: &str =
    "interrupted: the agent stopped while applying it, and the node does not show its effect";

/// One node as its agent drives it.
pub struct NodeState {
    name: String,
    driver: Box<dyn NodeDriver>,
    runtime: Runtime,
    record: Record,
    state_dir: PathBuf,
    run_commands: bool,
}

impl NodeState {
    /// The node `name` behind `driver`, with the workloads a previous agent recorded in
    /// `state_dir` (their processes are the runtime's to adopt; the driver is told which
    /// devices they hold).
    pub fn open(
        name: &str,
        driver: Box<dyn NodeDriver>,
        runtime: Runtime,
        state_dir: &Path,
        run_commands: bool,
    ) -> Result<NodeState, RecordError> {
        let record = Record::load(state_dir)?;
        let mut node = NodeState {
            name: name.to_string(),
            driver,
            runtime,
            record,
            state_dir: state_dir.to_path_buf(),
            run_commands,
        };
        let held: Vec<(u32, ReplicaBinding, Option<u32>)> = node
            .record
            .workloads
            .values()
            .flat_map(|w| &w.replicas)
            .filter_map(|r| Some((r.live_pid()?, r.binding.clone(), r.gpu_instance)))
            .collect();
        for (pid, binding, gi) in held {
            node.hold(pid, &binding, gi);
        }
        Ok(node)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn record(&self) -> &Record {
        &self.record
    }

    /// What the agent registers: the node as its driver observes it now.
    pub fn registration(&mut self) -> Result<crate::registration::Registration, crate::FleetError> {
        let (registration, _) =
            crate::registration::Registration::observe(self.driver.as_mut(), &self.name)?;
        Ok(registration)
    }

    /// What `observed` reports now.
    pub fn observe(&mut self) -> Result<Observed, DriverError> {
        let observation = self.driver.observe()?;
        let node = observation
            .nodes
            .into_iter()
            .find(|n| n.name == self.name)
            .ok_or_else(|| {
                DriverError::Other(format!("the driver does not observe node {}", self.name))
            })?;
        let details = observation
            .details
            .into_iter()
            .filter(|d| d.gpu.node == self.name)
            .collect();
        Ok(Observed {
            version: VERSION,
            node,
            details,
            workloads: self.record.replica_states(),
        })
    }

    /// Takes the exits the runtime saw since the last call into the record; whether any.
    pub fn poll_exits(&mut self) -> Result<bool, RecordError> {
        let exits = self.runtime.poll();
        if exits.is_empty() {
            return Ok(false);
        }
        for exit in &exits {
            self.driver.process_ended(exit.pid);
            for (key, w) in &mut self.record.workloads {
                for r in &mut w.replicas {
                    if r.pid == Some(exit.pid) && r.exited.is_none() {
                        info!(workload = %key, replica = r.replica, status = %exit.status, "replica ended");
                        r.exited = Some(exit.status.to_string());
                    }
                }
            }
        }
        self.record.save(&self.state_dir)?;
        Ok(true)
    }

    /// Stops every workload the record holds that `bound` does not (at that attempt): what
    /// the control plane moved elsewhere while this agent was away must not run twice.
    /// Returns the keys stopped.
    pub fn stop_unbound(&mut self, bound: &Bound) -> Result<Vec<String>, RecordError> {
        let unbound: Vec<String> = self
            .record
            .workloads
            .iter()
            .filter(|(key, w)| !bound.holds(key, w.attempt))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &unbound {
            let pids = self.live_pids(key);
            if let Err(e) = node::kill_all(self.driver.as_mut(), &mut self.runtime, &pids) {
                // A process that is already gone is what stopping wants anyway.
                warn!(workload = %key, "stopping an unbound workload: {e}");
            }
            self.record.workloads.remove(key);
            info!(workload = %key, "stopped: no longer bound to this node");
        }
        if !unbound.is_empty() {
            self.record.save(&self.state_dir)?;
        }
        Ok(unbound)
    }

    /// Applies one action as the leader wrote it; the error is what the journal records.
    pub fn apply(&mut self, body: &[u8]) -> Result<(), String> {
        self.apply_bound(body, None)
    }

    /// [`NodeState::apply`], a start for this node refused unless `bound` (what the control
    /// plane binds to the node now, where it wrote any) holds its workload at its attempt: a
    /// start that waited while the node was away may be for a workload placed elsewhere since.
    pub fn apply_bound(&mut self, body: &[u8], bound: Option<&Bound>) -> Result<(), String> {
        let message: ActionMessage =
            protocol::decode(body).map_err(|e| format!("the action cannot be read: {e}"))?;
        if let (Action::Start { workload, bindings }, Some(launch), Some(bound)) =
            (&message.action, &message.launch, bound)
            && bindings.iter().any(|b| b.node == self.name)
            && !bound.holds(workload, launch.attempt)
        {
            return Err(format!(
                "{workload} (attempt {}) is no longer bound to this node; not started",
                launch.attempt
            ));
        }
        self.apply_message(&message).map_err(|e| e.to_string())
    }

    /// Settles an action a previous agent began and did not finish, from what the node shows
    /// now: done where its effect is there, failed as interrupted otherwise (the control
    /// plane re-plans from `observed`). Nothing is applied again.
    pub fn settle(&mut self, body: &[u8]) -> Result<(), String> {
        let message: ActionMessage =
            protocol::decode(body).map_err(|e| format!("the action cannot be read: {e}"))?;
        let observation = self.driver.observe().map_err(|e| e.to_string())?;
        let done = match &message.action {
            Action::Start { workload, .. } => {
                let attempt = message.launch.as_ref().map(|l| l.attempt);
                let recorded = self.record.workloads.get(workload).map(|w| w.attempt);
                if attempt.is_some() && recorded == attempt {
                    true
                } else {
                    // Killed between starting processes and recording them: stop what started.
                    if let Some(key) = WorkloadKey::parse(workload) {
                        let id = workload_id(&key.tenant, &key.name);
                        for pid in self.runtime.pids_of(&id) {
                            let _ = self.runtime.kill(pid);
                            self.driver.process_ended(pid);
                        }
                    }
                    false
                }
            }
            Action::Stop { workload, .. } => !self.record.workloads.contains_key(workload),
            Action::Checkpoint { .. } => false,
            geometry => shows_effect(&observation, geometry),
        };
        if done {
            Ok(())
        } else {
            Err(INTERRUPTED.to_string())
        }
    }

    fn apply_message(&mut self, message: &ActionMessage) -> Result<(), node::NodeError> {
        let precondition = |m: String| node::NodeError::Precondition(m);
        match &message.action {
            Action::Start { workload, bindings } => {
                let launch = message.launch.as_ref().ok_or_else(|| {
                    precondition(format!("the start of {workload} carries no launch"))
                })?;
                self.start(workload, bindings, launch)
            }
            Action::Checkpoint {
                workload, signal, ..
            } => {
                let signal = Signal::parse(signal)?;
                if !self.record.workloads.contains_key(workload) {
                    return Err(precondition(format!(
                        "{workload} does not run on this node"
                    )));
                }
                let pids = self.live_pids(workload);
                node::signal_all(&mut self.runtime, &pids, signal)
            }
            Action::Stop { workload, .. } => {
                let pids = self.live_pids(workload);
                node::kill_all(self.driver.as_mut(), &mut self.runtime, &pids)?;
                if self.record.workloads.remove(workload).is_some() {
                    self.save()?;
                }
                Ok(())
            }
            geometry => {
                if let Some(gpu) = gpu_of(geometry)
                    && gpu.node != self.name
                {
                    return Err(precondition(format!(
                        "{gpu} is not a GPU of this node ({})",
                        self.name
                    )));
                }
                // Observed afresh for each step, so a compute instance finds its GPU instance
                // in the observation rather than in a map of what was created before.
                let observation = self.driver.observe()?;
                node::apply_geometry(
                    self.driver.as_mut(),
                    &observation,
                    &mut Created::new(),
                    geometry,
                )
            }
        }
    }

    fn start(
        &mut self,
        workload: &str,
        bindings: &[ReplicaBinding],
        launch: &Launch,
    ) -> Result<(), node::NodeError> {
        let precondition = |m: String| node::NodeError::Precondition(m);
        let key = WorkloadKey::parse(workload).ok_or_else(|| {
            precondition(format!(
                "`{workload}` is not a workload key (`tenant/name`)"
            ))
        })?;
        if let Some(running) = self.record.workloads.get(workload) {
            // A run whose every replica ended is only remembered until its exit is reported;
            // a new start replaces it.
            if running.replicas.iter().any(|r| r.exited.is_none()) {
                return Err(precondition(format!(
                    "{workload} already runs here (attempt {}); stop it first",
                    running.attempt
                )));
            }
        }
        let mine: Vec<(u32, &ReplicaBinding)> = bindings
            .iter()
            .enumerate()
            .filter(|(_, b)| b.node == self.name)
            .map(|(i, b)| (i as u32, b))
            .collect();
        if mine.is_empty() {
            return Err(precondition(format!(
                "no replica of {workload} is bound to this node ({})",
                self.name
            )));
        }
        // New compute instances have UUIDs only the driver knows: observe now.
        let observation: Observation = self.driver.observe()?;
        let plans = node::resolve(&observation, mine)?;
        let checkpoint_dir = node::checkpoint_dir(&self.state_dir, &key);
        let started = if self.run_commands && !launch.command.is_empty() {
            let resume_from = (launch.attempt > 0 && node::dir_has_entries(&checkpoint_dir))
                .then(|| checkpoint_dir.clone());
            let gang = GangSpec {
                workload: key.clone(),
                command: launch.command.clone(),
                env: launch.env.clone(),
                cpu_millis: launch.cpu_millis,
                memory_bytes: launch.memory_bytes,
                work_dir: node::work_dir(&self.state_dir, &key),
                checkpoint_dir,
                resume_from,
            };
            node::launch(self.driver.as_mut(), &mut self.runtime, &gang, &plans)?
                .into_iter()
                .map(|s| (s.replica, Some(s.pid)))
                .collect()
        } else {
            plans.iter().map(|p| (p.replica, None)).collect::<Vec<_>>()
        };
        let replicas = plans
            .iter()
            .zip(started)
            .map(|(plan, (replica, pid))| LocalReplica {
                replica,
                binding: plan.binding.clone(),
                gpu_instance: plan.devices.gi,
                pid,
                exited: None,
            })
            .collect();
        self.record.workloads.insert(
            workload.to_string(),
            LocalWorkload {
                attempt: launch.attempt,
                replicas,
            },
        );
        self.save()
    }

    fn save(&self) -> Result<(), node::NodeError> {
        self.record
            .save(&self.state_dir)
            .map_err(|e| node::NodeError::Precondition(format!("recording the start: {e}")))
    }

    fn live_pids(&self, workload: &str) -> Vec<u32> {
        self.record
            .workloads
            .get(workload)
            .map(|w| {
                w.replicas
                    .iter()
                    .filter_map(LocalReplica::live_pid)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Tells the driver which devices a running process holds (the `sim` driver keeps a held
    /// instance from being destroyed, as a real GPU does).
    fn hold(&mut self, pid: u32, binding: &ReplicaBinding, gi: Option<u32>) {
        for &index in &binding.gpus {
            let gpu = GpuRef {
                node: binding.node.clone(),
                index,
            };
            self.driver.process_started(pid, &gpu, gi);
        }
    }
}

/// The GPU a geometry action works on.
fn gpu_of(action: &Action) -> Option<&GpuRef> {
    Some(match action {
        Action::DestroyComputeInstance { gpu, .. }
        | Action::DestroyGpuInstance { gpu, .. }
        | Action::SetMigMode { gpu, .. }
        | Action::ResetGpu { gpu }
        | Action::CreateGpuInstance { gpu, .. }
        | Action::CreateComputeInstance { gpu, .. } => gpu,
        Action::Checkpoint { .. } | Action::Stop { .. } | Action::Start { .. } => return None,
    })
}

/// Whether the observation already shows what a geometry action makes.
fn shows_effect(observation: &Observation, action: &Action) -> bool {
    let detail = |gpu: &GpuRef| observation.details.iter().find(|d| &d.gpu == gpu);
    let gpu_state = |gpu: &GpuRef| {
        observation
            .nodes
            .iter()
            .find(|n| n.name == gpu.node)
            .and_then(|n| n.gpus.iter().find(|g| g.index == gpu.index))
    };
    match action {
        Action::CreateGpuInstance {
            gpu,
            profile_id,
            start,
        } => detail(gpu).is_some_and(|d| {
            d.instances
                .iter()
                .any(|gi| gi.start == *start && gi.profile_id == *profile_id)
        }),
        Action::CreateComputeInstance { gpu, start } => detail(gpu).is_some_and(|d| {
            d.instances
                .iter()
                .any(|gi| gi.start == *start && !gi.compute_instances.is_empty())
        }),
        Action::DestroyGpuInstance { gpu, gpu_instance } => {
            detail(gpu).is_some_and(|d| d.instances.iter().all(|gi| gi.id != *gpu_instance))
        }
        Action::DestroyComputeInstance {
            gpu,
            gpu_instance,
            compute_instance,
        } => detail(gpu).is_some_and(|d| {
            d.instances
                .iter()
                .filter(|gi| gi.id == *gpu_instance)
                .all(|gi| {
                    gi.compute_instances
                        .iter()
                        .all(|ci| ci.id != *compute_instance)
                })
        }),
        Action::SetMigMode { gpu, enabled } => {
            gpu_state(gpu).is_some_and(|g| g.mig.pending.unwrap_or(g.mig.enabled) == *enabled)
        }
        Action::ResetGpu { gpu } => gpu_state(gpu).is_some_and(|g| g.mig.pending.is_none()),
        Action::Checkpoint { .. } | Action::Stop { .. } | Action::Start { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tessera_reconciler::driver::sim::SimDriver;
    use tessera_reconciler::runtime::Confinement;

    fn node(dir: &Path) -> NodeState {
        let nodes = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/nodes/quickstart.yaml");
        let sim = SimDriver::open(&nodes, &dir.join("sim.json")).unwrap();
        let runtime = Runtime::new(dir.join("runtime"), Confinement::Insecure).unwrap();
        NodeState::open("train-0", Box::new(sim), runtime, &dir.join("state"), false).unwrap()
    }

    fn body(action: serde_json::Value) -> Vec<u8> {
        let mut message = json!({"version": VERSION, "action": action});
        if message["action"]["action"] == "start" {
            message["launch"] = json!({"attempt": 1, "command": ["true"]});
        }
        serde_json::to_vec(&message).unwrap()
    }

    /// An interrupted action is settled done exactly when the node shows its effect: before
    /// applying it, it is interrupted; after, it is done. A checkpoint's effect (a signal)
    /// cannot be seen, so it is always interrupted.
    #[test]
    fn an_interrupted_action_is_done_only_where_the_node_shows_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = node(dir.path());
        let gpu = json!({"node": "train-0", "index": 0});
        let steps = [
            json!({"action": "set_mig_mode", "gpu": gpu, "enabled": true}),
            json!({"action": "reset_gpu", "gpu": gpu}),
            json!({"action": "create_gpu_instance", "gpu": gpu, "profile_id": 9, "start": 0}),
            json!({"action": "create_compute_instance", "gpu": gpu, "start": 0}),
            json!({"action": "start", "workload": "a/w", "bindings": [{"node": "train-0", "gpus": [0], "migStart": 0}]}),
            json!({"action": "stop", "workload": "a/w", "reason": "test"}),
        ];
        for step in steps {
            let b = body(step.clone());
            assert_eq!(
                node.settle(&b),
                Err(INTERRUPTED.to_string()),
                "before {step}"
            );
            node.apply(&b).unwrap_or_else(|e| panic!("{step}: {e}"));
            assert_eq!(node.settle(&b), Ok(()), "after {step}");
        }
        let checkpoint = body(
            json!({"action": "checkpoint", "workload": "a/w", "signal": "SIGUSR1", "deadline": 0}),
        );
        assert_eq!(node.settle(&checkpoint), Err(INTERRUPTED.to_string()));
    }

    /// What the agent started is in its record, and a new agent on the same state directory
    /// knows it; what is not bound any more is dropped from it.
    #[test]
    fn the_record_survives_the_agent_and_unbound_work_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let start = body(
            json!({"action": "start", "workload": "a/w", "bindings": [{"node": "train-0", "gpus": [3]}]}),
        );
        node(dir.path()).apply(&start).unwrap();
        let mut again = node(dir.path());
        assert_eq!(again.record().workloads["a/w"].attempt, 1);
        assert_eq!(
            again.apply(&start),
            Err("a/w already runs here (attempt 1); stop it first".to_string())
        );
        let bound = Bound {
            version: VERSION,
            workloads: [("a/w".to_string(), 1)].into(),
        };
        assert!(again.stop_unbound(&bound).unwrap().is_empty());
        let moved = Bound {
            version: VERSION,
            workloads: [("a/w".to_string(), 2)].into(),
        };
        assert_eq!(again.stop_unbound(&moved).unwrap(), ["a/w"]);
        assert!(node(dir.path()).record().workloads.is_empty());
    }

    /// A start is taken only while `bound` names its workload at its attempt (where the
    /// control plane wrote any); a run whose replicas all exited is replaced by a new start.
    #[test]
    fn a_start_needs_its_binding_and_replaces_an_ended_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = node(dir.path());
        let start = body(
            json!({"action": "start", "workload": "a/w", "bindings": [{"node": "train-0", "gpus": [2]}]}),
        );
        let bound = |attempt: u32| Bound {
            version: VERSION,
            workloads: [("a/w".to_string(), attempt)].into(),
        };
        assert_eq!(
            node.apply_bound(&start, Some(&bound(0))),
            Err("a/w (attempt 1) is no longer bound to this node; not started".to_string())
        );
        assert!(node.record().workloads.is_empty());
        node.apply_bound(&start, Some(&bound(1))).unwrap();
        assert!(
            node.apply_bound(&start, Some(&bound(1))).is_err(),
            "runs already"
        );
        for r in &mut node.record.workloads.get_mut("a/w").unwrap().replicas {
            r.exited = Some("exit code 0".into());
        }
        node.apply_bound(&start, Some(&bound(1))).unwrap();
        assert_eq!(node.record().workloads["a/w"].replicas[0].exited, None);
    }
}
