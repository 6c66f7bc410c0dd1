//! A decision carried out on paper: the snapshot the next cycle would observe if every action
//! of `d` succeeded at once. Multi-cycle tests and benchmarks drive the solver with it; the
//! reconciler does the same for real, through the node drivers.

use std::collections::BTreeMap;

use tessera_compiler::model::{ClusterStateSpec, MigInstance, PendingWorkload, RunningWorkload};

use crate::decision::{Decision, Listing, Outcome, ReplicaBinding};

/// The snapshot after `d`: admitted work runs on its bindings (started at `d.now`), preempted
/// work waits again (submitted at `d.now`), kept work runs on (with [`Listing::Changes`], all
/// the running work `d` does not list), GPUs have their target geometry, waiting work still
/// waits, and the decision's usage record, reservations and reconfiguration records are
/// carried forward.
pub fn carry_out(before: &ClusterStateSpec, d: &Decision) -> ClusterStateSpec {
    let mut nodes = before.nodes.clone();
    for g in &d.geometry {
        if !g.changes() {
            continue;
        }
        let Some(node) = nodes.iter_mut().find(|n| n.name == g.node) else {
            continue;
        };
        if let Some(gpu) = node.gpus.iter_mut().find(|x| x.index == g.gpu) {
            gpu.instances = g
                .target
                .iter()
                .map(|i| MigInstance {
                    profile: i.profile.clone(),
                    start: i.start,
                    uuid: None,
                })
                .collect();
            gpu.mig.enabled = true;
        }
    }
    let outcome: BTreeMap<(&str, &str), &Outcome> = d
        .workloads
        .iter()
        .map(|w| ((w.tenant.as_str(), w.name.as_str()), &w.outcome))
        .collect();
    // A decision listing only its changes keeps every running workload it does not list.
    let unlisted_runs_on = d.listing == Listing::Changes;
    let mut running = Vec::new();
    let mut pending = Vec::new();
    for r in &before.running {
        match outcome.get(&(r.spec.tenant.as_str(), r.name.as_str())) {
            Some(Outcome::Keep { .. }) => running.push(r.clone()),
            None if unlisted_runs_on => running.push(r.clone()),
            Some(Outcome::Preempt { .. }) => pending.push(PendingWorkload {
                name: r.name.clone(),
                spec: r.spec.clone(),
                submitted_at: d.now,
            }),
            _ => {}
        }
    }
    for p in &before.pending {
        match outcome.get(&(p.spec.tenant.as_str(), p.name.as_str())) {
            Some(Outcome::Admit { bindings, .. }) => {
                running.push(RunningWorkload {
                    name: p.name.clone(),
                    spec: p.spec.running_as(bindings.len() as u32),
                    bindings: bindings.iter().map(ReplicaBinding::binding).collect(),
                    started_at: d.now,
                    last_checkpoint_at: None,
                });
            }
            _ => pending.push(p.clone()),
        }
    }
    running.sort_by(|a, b| (&a.spec.tenant, &a.name).cmp(&(&b.spec.tenant, &b.name)));
    ClusterStateSpec {
        observed_at: d.now,
        nodes,
        running,
        pending,
        usage: d
            .fair_share
            .as_ref()
            .map(|f| f.record.clone())
            .or_else(|| before.usage.clone()),
        reservations: d.reservations.iter().map(|r| r.record()).collect(),
        reconfigurations: d.reconfigurations.clone(),
    }
}
