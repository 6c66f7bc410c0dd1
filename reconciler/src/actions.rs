//! From a decision and what the nodes and the runtime show now, to an ordered list of actions.
//!
//! Pure: no driver, no clock, no store. The service gathers the inputs, calls [`plan`], and
//! applies the actions in order through the journal.
//!
//! The order is the one a GPU needs, across the whole fleet: checkpoint signals, stops, compute
//! instances destroyed, GPU instances destroyed, MIG mode switched and GPUs reset, GPU instances
//! created with explicit placements, compute instances created, workloads started. A step that
//! cannot be taken yet (a victim still inside its grace period, a GPU not drained, a key in
//! retry backoff) is not forced: it is reported as a [`Wait`] and the next cycle tries again,
//! so a decision is reached over several cycles without ever destroying an instance in use.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use tessera_compiler::model::Binding;
use tessera_solver::Decision;
use tessera_solver::decision::{GeometryPlan, Instance, Outcome, ReplicaBinding};

use crate::driver::{GpuDetail, GpuRef, Observation};

/// What the planner needs to know of one workload the service tracks.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadView {
    /// Its key shown as `tenant/name` ([`tessera_compiler::WorkloadKey`]): actions, waits and
    /// the journal name workloads by key, since names are per tenant.
    pub key: String,
    pub phase: LivePhase,
    /// Replica processes still alive.
    pub alive_processes: usize,
    /// Where it runs (empty while pending).
    pub bindings: Vec<Binding>,
    /// Its class's checkpoint signal (`SIGUSR1`, ...).
    pub checkpoint_signal: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LivePhase {
    Pending,
    /// Started (or starting) and not asked to stop.
    Running,
    /// Signalled; stopped at `deadline` (Unix seconds) at the latest.
    Checkpointing {
        deadline: i64,
    },
}

/// One step toward the decision. Serialized into the journal as the intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Action {
    /// Send the checkpoint signal to every replica; stop at `deadline` at the latest.
    Checkpoint {
        workload: String,
        signal: String,
        deadline: i64,
    },
    /// Kill what is left of the workload and put it back in the queue with its checkpoint.
    Stop {
        workload: String,
        reason: String,
    },
    DestroyComputeInstance {
        gpu: GpuRef,
        gpu_instance: u32,
        compute_instance: u32,
    },
    DestroyGpuInstance {
        gpu: GpuRef,
        gpu_instance: u32,
    },
    SetMigMode {
        gpu: GpuRef,
        enabled: bool,
    },
    ResetGpu {
        gpu: GpuRef,
    },
    CreateGpuInstance {
        gpu: GpuRef,
        profile_id: u32,
        start: u8,
    },
    /// The full-size compute instance of the GPU instance at `start` (its id is known only once
    /// the GPU instance exists, so it is looked up when applied).
    CreateComputeInstance {
        gpu: GpuRef,
        start: u8,
    },
    Start {
        workload: String,
        bindings: Vec<ReplicaBinding>,
    },
}

impl Action {
    /// The thing an action works on, for retry backoff: a GPU or a workload.
    pub fn key(&self) -> String {
        match self {
            Action::Checkpoint { workload, .. }
            | Action::Stop { workload, .. }
            | Action::Start { workload, .. } => format!("workload/{workload}"),
            Action::DestroyComputeInstance { gpu, .. }
            | Action::DestroyGpuInstance { gpu, .. }
            | Action::SetMigMode { gpu, .. }
            | Action::ResetGpu { gpu }
            | Action::CreateGpuInstance { gpu, .. }
            | Action::CreateComputeInstance { gpu, .. } => format!("gpu/{gpu}"),
        }
    }

    /// Whether the action changes a GPU's geometry (counted against the reconfiguration budget).
    pub fn is_geometry(&self) -> bool {
        !matches!(
            self,
            Action::Checkpoint { .. } | Action::Stop { .. } | Action::Start { .. }
        )
    }
}

impl std::fmt::Display for Action {
    /// One line for logs and `tessera reconcile --once`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Checkpoint {
                workload,
                signal,
                deadline,
            } => write!(
                f,
                "checkpoint {workload}: {signal}, stopped at {} at the latest",
                crate::snapshot::rfc3339(*deadline)
            ),
            Action::Stop { workload, reason } => write!(f, "stop {workload} ({reason}), requeued"),
            Action::DestroyComputeInstance {
                gpu,
                gpu_instance,
                compute_instance,
            } => write!(
                f,
                "{gpu}: destroy compute instance {compute_instance} of GPU instance {gpu_instance}"
            ),
            Action::DestroyGpuInstance { gpu, gpu_instance } => {
                write!(f, "{gpu}: destroy GPU instance {gpu_instance}")
            }
            Action::SetMigMode { gpu, enabled } => write!(
                f,
                "{gpu}: MIG mode {} (pending until reset)",
                if *enabled { "on" } else { "off" }
            ),
            Action::ResetGpu { gpu } => write!(f, "{gpu}: reset"),
            Action::CreateGpuInstance {
                gpu,
                profile_id,
                start,
            } => write!(
                f,
                "{gpu}: create GPU instance of profile {profile_id} at memory slice {start}"
            ),
            Action::CreateComputeInstance { gpu, start } => write!(
                f,
                "{gpu}: create the compute instance of the GPU instance at slice {start}"
            ),
            Action::Start { workload, bindings } => {
                let places: Vec<String> = bindings
                    .iter()
                    .map(|b| {
                        let gpus: Vec<String> = b.gpus.iter().map(|g| format!("gpu{g}")).collect();
                        let mut s = format!("{}/{}", b.node, gpus.join("+"));
                        if let (Some(p), Some(start)) = (&b.mig_profile, b.mig_start) {
                            s.push_str(&format!(" {p}@{start}"));
                        }
                        if let Some(share) = b.share {
                            s.push_str(&format!(" share {}", share.as_f64()));
                        }
                        s
                    })
                    .collect();
                write!(f, "start {workload} on {}", places.join(", "))
            }
        }
    }
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wait::Grace { workload, deadline } => write!(
                f,
                "{workload} is checkpointing until {}",
                crate::snapshot::rfc3339(*deadline)
            ),
            Wait::Drain { gpu, holders } => {
                write!(f, "{gpu} waits to drain: held by {}", holders.join(", "))
            }
            Wait::Devices { workload, detail } => write!(f, "{workload} waits: {detail}"),
            Wait::Backoff { key, until } => write!(
                f,
                "{key} retried after {}",
                crate::snapshot::rfc3339(*until)
            ),
        }
    }
}

/// Why part of the decision was not acted on this cycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "wait")]
pub enum Wait {
    /// A preempted workload is inside its grace period.
    Grace { workload: String, deadline: i64 },
    /// Instances to destroy on this GPU are still in use.
    Drain { gpu: GpuRef, holders: Vec<String> },
    /// A workload's devices are not free or not made yet.
    Devices { workload: String, detail: String },
    /// Earlier attempts failed; retried after `until`.
    Backoff { key: String, until: i64 },
}

/// Retry and rate-limit state the service keeps between cycles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Throttle {
    /// Keys (see [`Action::key`]) whose actions failed, blocked until the given instant.
    pub backoff: BTreeMap<String, i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionPlan {
    pub actions: Vec<Action>,
    pub waits: Vec<Wait>,
}

/// Plans the steps from what runs now toward `decision`.
pub fn plan(
    decision: &Decision,
    observation: &Observation,
    workloads: &[WorkloadView],
    throttle: &Throttle,
    now: i64,
) -> ActionPlan {
    // Looked up, never walked: hashed, and the decision's keys written into one buffer, since
    // a fleet's decision names tens of thousands of workloads.
    let views: HashMap<&str, &WorkloadView> =
        workloads.iter().map(|w| (w.key.as_str(), w)).collect();
    let mut key_buf = String::new();
    let mut view_of = |tenant: &str, name: &str| {
        key_buf.clear();
        // As `WorkloadKey` shows itself; writing into a String cannot fail.
        let _ = write!(key_buf, "{tenant}/{name}");
        views.get(key_buf.as_str()).copied()
    };
    let details: HashMap<&GpuRef, &GpuDetail> =
        observation.details.iter().map(|d| (&d.gpu, d)).collect();
    let blocked = |key: &str| throttle.backoff.get(key).copied().filter(|&t| t > now);

    let mut out = ActionPlan::default();
    let mut stops = Vec::new();
    // Workloads that still hold devices and are on their way out: nothing else may start on
    // their GPUs until they are gone.
    let mut leaving: BTreeSet<&str> = BTreeSet::new();

    for w in &decision.workloads {
        let Some(view) = view_of(&w.tenant, &w.name) else {
            continue;
        };
        match (&w.outcome, view.phase) {
            (_, LivePhase::Checkpointing { deadline }) => {
                // A signal is not taken back: the workload is checkpointing, so it stops.
                if view.alive_processes == 0 || now >= deadline {
                    stops.push(stop(view, "preempted"));
                } else {
                    out.waits.push(Wait::Grace {
                        workload: view.key.clone(),
                        deadline,
                    });
                }
                if view.alive_processes > 0 {
                    leaving.insert(&view.key);
                }
            }
            (Outcome::Preempt { grace_seconds, .. }, LivePhase::Running) => {
                let key = format!("workload/{}", view.key);
                if let Some(until) = blocked(&key) {
                    out.waits.push(Wait::Backoff { key, until });
                    leaving.insert(&view.key);
                    continue;
                }
                if view.alive_processes == 0 {
                    stops.push(stop(view, "preempted"));
                } else {
                    out.actions.push(Action::Checkpoint {
                        workload: view.key.clone(),
                        signal: view.checkpoint_signal.clone(),
                        deadline: now
                            .saturating_add(i64::try_from(*grace_seconds).unwrap_or(i64::MAX)),
                    });
                    leaving.insert(&view.key);
                }
            }
            _ => {}
        }
    }
    out.actions.extend(stops);
    let stopped: HashSet<&str> = out
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Stop { workload, .. } => Some(workload.as_str()),
            _ => None,
        })
        .collect();

    // GPUs held by workloads on their way out, and GPU instances held by anyone still running,
    // by (node, index) and (node, index, start) borrowed: only looked up, for the few GPUs a
    // decision reconfigures or a start needs, while every running workload is recorded.
    let mut leaving_gpus: HashMap<(&str, u32), Vec<&str>> = HashMap::new();
    let mut held_instances: HashMap<(&str, u32, u8), Vec<&str>> = HashMap::new();
    for view in workloads {
        let is_leaving = leaving.contains(view.key.as_str());
        let holds =
            !matches!(view.phase, LivePhase::Pending) && !stopped.contains(view.key.as_str());
        for b in &view.bindings {
            for &index in &b.gpus {
                if is_leaving {
                    leaving_gpus
                        .entry((b.node.as_str(), index))
                        .or_default()
                        .push(&view.key);
                }
                if let (true, Some(start)) = (holds, b.mig_start) {
                    held_instances
                        .entry((b.node.as_str(), index, start))
                        .or_default()
                        .push(&view.key);
                }
            }
        }
    }

    let mut destroy_ci = Vec::new();
    let mut destroy_gi = Vec::new();
    let mut mode = Vec::new();
    let mut create_gi = Vec::new();
    let mut create_ci = Vec::new();
    // GPUs whose geometry could not be brought to target this cycle.
    let mut unready: BTreeSet<GpuRef> = BTreeSet::new();

    for g in &decision.geometry {
        if !g.changes() {
            continue;
        }
        let gpu = GpuRef {
            node: g.node.clone(),
            index: g.gpu,
        };
        let Some(detail) = details.get(&gpu) else {
            unready.insert(gpu);
            continue;
        };
        let key = format!("gpu/{gpu}");
        if let Some(until) = blocked(&key) {
            out.waits.push(Wait::Backoff { key, until });
            unready.insert(gpu);
            continue;
        }
        let holders = holders(g, &gpu, detail, &held_instances);
        if !holders.is_empty() {
            out.waits.push(Wait::Drain {
                gpu: gpu.clone(),
                holders,
            });
            unready.insert(gpu);
            continue;
        }
        for inst in &g.destroy {
            if let Some(gi) = find_instance(detail, inst) {
                for ci in &gi.compute_instances {
                    destroy_ci.push(Action::DestroyComputeInstance {
                        gpu: gpu.clone(),
                        gpu_instance: gi.id,
                        compute_instance: ci.id,
                    });
                }
                destroy_gi.push(Action::DestroyGpuInstance {
                    gpu: gpu.clone(),
                    gpu_instance: gi.id,
                });
            }
        }
        if g.enable_mig {
            mode.push(Action::SetMigMode {
                gpu: gpu.clone(),
                enabled: true,
            });
            mode.push(Action::ResetGpu { gpu: gpu.clone() });
        }
        for inst in &g.create {
            match find_instance(detail, inst) {
                // Made by an earlier, interrupted cycle: keep it, complete it.
                Some(gi) if gi.compute_instances.is_empty() => {
                    create_ci.push(Action::CreateComputeInstance {
                        gpu: gpu.clone(),
                        start: inst.start,
                    })
                }
                Some(_) => {}
                None => {
                    create_gi.push(Action::CreateGpuInstance {
                        gpu: gpu.clone(),
                        profile_id: inst.profile_id,
                        start: inst.start,
                    });
                    create_ci.push(Action::CreateComputeInstance {
                        gpu: gpu.clone(),
                        start: inst.start,
                    });
                }
            }
        }
    }
    // Instances of the target that exist without a compute instance (a cycle killed between
    // the two creations) are completed even when the decision has nothing else to change.
    for g in &decision.geometry {
        let gpu = GpuRef {
            node: g.node.clone(),
            index: g.gpu,
        };
        if unready.contains(&gpu) || !g.create.is_empty() {
            continue;
        }
        if let Some(detail) = details.get(&gpu) {
            for inst in &g.target {
                if let Some(gi) = find_instance(detail, inst)
                    && gi.compute_instances.is_empty()
                {
                    create_ci.push(Action::CreateComputeInstance {
                        gpu: gpu.clone(),
                        start: inst.start,
                    });
                }
            }
        }
    }
    out.actions.extend(destroy_ci);
    out.actions.extend(destroy_gi);
    out.actions.extend(mode);
    out.actions.extend(create_gi);
    out.actions.extend(create_ci);

    for w in &decision.workloads {
        let Outcome::Admit { bindings, .. } = &w.outcome else {
            continue;
        };
        let Some(view) = view_of(&w.tenant, &w.name) else {
            continue;
        };
        if view.phase != LivePhase::Pending {
            continue;
        }
        let key = format!("workload/{}", view.key);
        if let Some(until) = blocked(&key) {
            out.waits.push(Wait::Backoff { key, until });
            continue;
        }
        match devices_ready(bindings, &unready, &leaving_gpus) {
            Ok(()) => out.actions.push(Action::Start {
                workload: view.key.clone(),
                bindings: bindings.clone(),
            }),
            Err(detail) => out.waits.push(Wait::Devices {
                workload: view.key.clone(),
                detail,
            }),
        }
    }
    out
}

fn stop(view: &WorkloadView, reason: &str) -> Action {
    Action::Stop {
        workload: view.key.clone(),
        reason: reason.to_string(),
    }
}

/// Who still holds an instance this plan destroys (or, for a mode change, the GPU).
fn holders(
    g: &GeometryPlan,
    gpu: &GpuRef,
    detail: &GpuDetail,
    held: &HashMap<(&str, u32, u8), Vec<&str>>,
) -> Vec<String> {
    let mut out = BTreeSet::new();
    for inst in &g.destroy {
        if let Some(names) = held.get(&(gpu.node.as_str(), gpu.index, inst.start)) {
            out.extend(names.iter().map(|n| n.to_string()));
        }
        if let Some(gi) = find_instance(detail, inst) {
            for p in &detail.processes {
                if p.gpu_instance == Some(gi.id) {
                    out.insert(format!("pid {}", p.pid));
                }
            }
        }
    }
    if g.enable_mig {
        for p in &detail.processes {
            out.insert(format!("pid {}", p.pid));
        }
    }
    out.into_iter().collect()
}

fn find_instance<'d>(
    detail: &'d GpuDetail,
    inst: &Instance,
) -> Option<&'d crate::driver::GpuInstanceInfo> {
    detail
        .instances
        .iter()
        .find(|gi| gi.start == inst.start && gi.profile_id == inst.profile_id)
}

fn devices_ready(
    bindings: &[ReplicaBinding],
    unready: &BTreeSet<GpuRef>,
    leaving: &HashMap<(&str, u32), Vec<&str>>,
) -> Result<(), String> {
    for b in bindings {
        for &index in &b.gpus {
            let gpu = || GpuRef {
                node: b.node.clone(),
                index,
            };
            // Most cycles reconfigure nothing: no GPU named for each replica started.
            if !unready.is_empty() && unready.contains(&gpu()) {
                return Err(format!("{}: geometry not ready", gpu()));
            }
            if let Some(names) = leaving.get(&(b.node.as_str(), index)) {
                return Err(format!("{}: still held by {}", gpu(), names.join(", ")));
            }
        }
    }
    Ok(())
}
