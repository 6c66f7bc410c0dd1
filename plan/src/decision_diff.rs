//! What the policy change does to the fleet: the solver's decisions for one snapshot under the
//! base and the head policy, compared.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_compiler::WorkloadKey;
use tessera_compiler::units::Gpus;
use tessera_solver::decision::{FairShareReport, GeometryPlan, Instance};
use tessera_solver::{Decision, Outcome};

/// The decision under the head compared with the decision under the base, for the same state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DecisionDiff {
    /// Workloads whose outcome differs, by tenant and name (a workload's identity).
    pub workloads: Vec<WorkloadChange>,
    /// GPUs whose target MIG geometry differs, by node and index.
    pub geometry: Vec<GeometryChange>,
    /// Tenants whose guaranteed or borrowed usage of a pool differs, by tenant and pool.
    pub usage: Vec<UsageChange>,
    /// Every pool, before and after (unchanged pools too: the fleet's figures are the context).
    pub pools: Vec<PoolChange>,
    /// Fair share over time, per tenant with a setting under either revision, pre-order (head's
    /// first): decayed usage, history and share of idle capacity, before and after. Context like
    /// `pools`: a half-life or weight change moves shares without moving any workload yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fair_share: Vec<FairShareChange>,
}

impl DecisionDiff {
    /// Changes that matter to someone: a workload, a GPU or a tenant's usage.
    pub fn is_empty(&self) -> bool {
        self.workloads.is_empty() && self.geometry.is_empty() && self.usage.is_empty()
    }
}

/// What happens to a workload under the head, where the base decided otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadChange {
    pub name: String,
    pub tenant: String,
    pub change: Change,
    pub before: Fate,
    pub after: Fate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Runs under the head, waits or stops under the base.
    Admitted,
    /// Stopped (after a checkpoint) under the head.
    Preempted,
    /// Runs in both, elsewhere.
    Moved,
    /// Waits under the head where the base would run it, or waits for another reason.
    Pending,
    /// Present under one revision only (its tenant or class came or went).
    Appeared,
}

/// One workload's outcome in one decision, flattened for display.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fate {
    /// `keep`, `admit`, `preempt`, `pending`, or `absent`.
    pub outcome: String,
    pub pool: Option<String>,
    /// `node:gpus` per replica, for those that run.
    pub placement: Vec<String>,
    /// The reason it waits or is stopped.
    pub reason: Option<String>,
    /// GPU-seconds of work lost since the last checkpoint, for a preemption.
    pub lost_gpu_seconds: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GeometryChange {
    pub node: String,
    pub gpu: u32,
    pub pool: String,
    /// The target under the base (the current geometry where the base changes nothing).
    pub before: Vec<String>,
    pub after: Vec<String>,
    /// Instances the head destroys on this GPU; a drain precedes it when they hold work.
    pub destroy: Vec<String>,
    pub drain: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageChange {
    pub tenant: String,
    pub pool: String,
    pub guaranteed: (Gpus, Gpus),
    pub borrowed: (Gpus, Gpus),
}

/// One tenant's standing for idle capacity under each revision (`None`: no fair-share setting,
/// or no "before" when the plan has no base).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FairShareChange {
    pub tenant: String,
    pub before: Option<Standing>,
    pub after: Option<Standing>,
}

/// A tenant's fair-share figures in one decision.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Standing {
    pub weight: f64,
    /// Decayed GPU-hours, weighted by model: all it ran, and the part above its guarantee.
    pub used_gpu_hours: f64,
    pub borrowed_gpu_hours: f64,
    /// Decayed dominant borrowed share of the fleet.
    pub history: f64,
    /// Its share of borrowable capacity among its siblings, after history.
    pub share: f64,
}

fn standings(r: Option<&FairShareReport>) -> Vec<(String, Standing)> {
    let Some(r) = r else {
        return Vec::new();
    };
    r.tenants
        .iter()
        .map(|t| {
            let rec = r.record.tenants.get(&t.tenant).copied().unwrap_or_default();
            (
                t.tenant.clone(),
                Standing {
                    weight: t.weight,
                    used_gpu_hours: rec.used.gpu_hours,
                    borrowed_gpu_hours: rec.borrowed.gpu_hours,
                    history: t.history,
                    share: t.share,
                },
            )
        })
        .collect()
}

/// Per tenant of either report: the head's tenants in their order, then those only the base
/// weighs.
pub fn fair_share_diff(
    before: Option<&FairShareReport>,
    after: Option<&FairShareReport>,
) -> Vec<FairShareChange> {
    let (b, a) = (standings(before), standings(after));
    let find =
        |v: &[(String, Standing)], name: &str| v.iter().find(|(n, _)| n == name).map(|(_, s)| *s);
    let mut out: Vec<FairShareChange> = a
        .iter()
        .map(|(name, s)| FairShareChange {
            tenant: name.clone(),
            before: find(&b, name),
            after: Some(*s),
        })
        .collect();
    for (name, s) in &b {
        if find(&a, name).is_none() {
            out.push(FairShareChange {
                tenant: name.clone(),
                before: Some(*s),
                after: None,
            });
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolChange {
    pub pool: String,
    /// Allocated over capacity, fractions counted: before, after.
    pub allocation: (f64, f64),
    /// Free capacity no waiting shape can use: before, after.
    pub stranded: (Gpus, Gpus),
    pub free_nodes: (u32, u32),
}

fn fate(outcome: Option<(&Option<String>, &Outcome)>) -> Fate {
    let placement = |b: &[tessera_solver::decision::ReplicaBinding]| {
        b.iter()
            .map(|r| {
                let gpus: Vec<String> = r.gpus.iter().map(u32::to_string).collect();
                match (&r.mig_profile, r.mig_start) {
                    (Some(p), Some(s)) => format!("{}:{}/{p}@{s}", r.node, gpus.join(",")),
                    _ => format!("{}:{}", r.node, gpus.join(",")),
                }
            })
            .collect()
    };
    let Some((pool, o)) = outcome else {
        return Fate {
            outcome: "absent".into(),
            pool: None,
            placement: Vec::new(),
            reason: None,
            lost_gpu_seconds: None,
        };
    };
    let (name, placement, reason, lost) = match o {
        Outcome::Keep { bindings } => ("keep", placement(bindings), None, None),
        Outcome::Admit { bindings, .. } => ("admit", placement(bindings), None, None),
        Outcome::Preempt {
            reason,
            lost_gpu_seconds,
            ..
        } => (
            "preempt",
            Vec::new(),
            Some(reason.to_string()),
            Some(*lost_gpu_seconds),
        ),
        Outcome::Pending { reason } => ("pending", Vec::new(), Some(reason.to_string()), None),
    };
    Fate {
        outcome: name.into(),
        pool: pool.clone(),
        placement,
        reason,
        lost_gpu_seconds: lost,
    }
}

fn runs(f: &Fate) -> bool {
    f.outcome == "keep" || f.outcome == "admit"
}

fn instances(v: &[Instance]) -> Vec<String> {
    v.iter()
        .map(|i| format!("{}@{}", i.profile, i.start))
        .collect()
}

/// Compares two decisions taken for the same snapshot.
pub fn decision_diff(before: &Decision, after: &Decision) -> DecisionDiff {
    // Workloads are identified by (tenant, name): names are per tenant.
    let by_key = |d: &Decision| -> BTreeMap<WorkloadKey, (Option<String>, Outcome)> {
        d.workloads
            .iter()
            .map(|w| {
                (
                    WorkloadKey::new(&w.tenant, &w.name),
                    (w.pool.clone(), w.outcome.clone()),
                )
            })
            .collect()
    };
    let (b, a) = (by_key(before), by_key(after));
    let mut keys: Vec<&WorkloadKey> = b.keys().chain(a.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut workloads = Vec::new();
    for key in keys {
        let fb = fate(b.get(key).map(|(p, o)| (p, o)));
        let fa = fate(a.get(key).map(|(p, o)| (p, o)));
        // Waiting under both is no change to the fleet, whatever the reason's numbers say.
        let waits = |f: &Fate| f.outcome == "pending";
        if fb == fa
            || (runs(&fb) && runs(&fa) && fb.placement == fa.placement)
            || (waits(&fb) && waits(&fa))
        {
            continue;
        }
        let change = match (fb.outcome.as_str(), fa.outcome.as_str()) {
            ("absent", _) | (_, "absent") => Change::Appeared,
            (_, "preempt") => Change::Preempted,
            (_, "pending") => Change::Pending,
            (x, _) if x == "keep" || x == "admit" => Change::Moved,
            _ => Change::Admitted,
        };
        workloads.push(WorkloadChange {
            name: key.name.clone(),
            tenant: key.tenant.clone(),
            change,
            before: fb,
            after: fa,
        });
    }

    let target = |d: &Decision| -> BTreeMap<(String, u32), GeometryPlan> {
        d.geometry
            .iter()
            .map(|g| ((g.node.clone(), g.gpu), g.clone()))
            .collect()
    };
    let (gb, ga) = (target(before), target(after));
    let mut geometry = Vec::new();
    for (key, g) in &ga {
        let before_target = gb.get(key).map(|x| &x.target).unwrap_or(&g.current);
        if before_target != &g.target {
            geometry.push(GeometryChange {
                node: key.0.clone(),
                gpu: key.1,
                pool: g.pool.clone(),
                before: instances(before_target),
                after: instances(&g.target),
                destroy: instances(&g.destroy),
                drain: g.drain,
            });
        }
    }
    for (key, g) in &gb {
        if !ga.contains_key(key) && g.target != g.current {
            geometry.push(GeometryChange {
                node: key.0.clone(),
                gpu: key.1,
                pool: g.pool.clone(),
                before: instances(&g.target),
                after: instances(&g.current),
                destroy: Vec::new(),
                drain: false,
            });
        }
    }
    geometry.sort_by(|x, y| (&x.node, x.gpu).cmp(&(&y.node, y.gpu)));

    let usage_of = |d: &Decision| -> BTreeMap<(String, String), (Gpus, Gpus)> {
        d.usage
            .iter()
            .map(|u| {
                (
                    (u.tenant.clone(), u.pool.clone()),
                    (u.guaranteed, u.borrowed),
                )
            })
            .collect()
    };
    let (ub, ua) = (usage_of(before), usage_of(after));
    let mut keys: Vec<&(String, String)> = ub.keys().chain(ua.keys()).collect();
    keys.sort();
    keys.dedup();
    let usage = keys
        .into_iter()
        .filter_map(|k| {
            let x = ub.get(k).copied().unwrap_or_default();
            let y = ua.get(k).copied().unwrap_or_default();
            (x != y).then(|| UsageChange {
                tenant: k.0.clone(),
                pool: k.1.clone(),
                guaranteed: (x.0, y.0),
                borrowed: (x.1, y.1),
            })
        })
        .collect();

    let pools_of = |d: &Decision| -> BTreeMap<String, (f64, Gpus, u32)> {
        d.pools
            .iter()
            .map(|p| (p.pool.clone(), (p.allocation, p.stranded, p.free_nodes)))
            .collect()
    };
    let (pb, pa) = (pools_of(before), pools_of(after));
    let mut pool_names: Vec<&String> = pb.keys().chain(pa.keys()).collect();
    pool_names.sort();
    pool_names.dedup();
    let pools = pool_names
        .into_iter()
        .map(|n| {
            let x = pb.get(n).copied().unwrap_or_default();
            let y = pa.get(n).copied().unwrap_or_default();
            PoolChange {
                pool: n.clone(),
                allocation: (x.0, y.0),
                stranded: (x.1, y.1),
                free_nodes: (x.2, y.2),
            }
        })
        .collect();
    DecisionDiff {
        workloads,
        geometry,
        usage,
        pools,
        fair_share: fair_share_diff(before.fair_share.as_ref(), after.fair_share.as_ref()),
    }
}

/// What one decision changes in the fleet as observed, when there is no base policy to compare
/// with (`tessera plan --policy DIR`): admissions, preemptions and re-partitions relative to the
/// snapshot. Tenant usage and pool figures have no "before" here and are left empty; `tessera
/// solve` prints the decision's own. Fair-share standings are given with no "before".
pub fn against_observed(decision: &Decision) -> DecisionDiff {
    let pending = |pool: &Option<String>| Fate {
        outcome: "pending".into(),
        pool: pool.clone(),
        placement: Vec::new(),
        reason: None,
        lost_gpu_seconds: None,
    };
    let mut workloads = Vec::new();
    for w in &decision.workloads {
        let after = fate(Some((&w.pool, &w.outcome)));
        let (change, before) = match &w.outcome {
            Outcome::Admit { .. } => (Change::Admitted, pending(&None)),
            Outcome::Preempt { .. } => (
                Change::Preempted,
                Fate {
                    outcome: "keep".into(),
                    ..pending(&w.pool)
                },
            ),
            Outcome::Keep { .. } | Outcome::Pending { .. } => continue,
        };
        workloads.push(WorkloadChange {
            name: w.name.clone(),
            tenant: w.tenant.clone(),
            change,
            before,
            after,
        });
    }
    let geometry = decision
        .geometry
        .iter()
        .filter(|g| g.target != g.current)
        .map(|g| GeometryChange {
            node: g.node.clone(),
            gpu: g.gpu,
            pool: g.pool.clone(),
            before: instances(&g.current),
            after: instances(&g.target),
            destroy: instances(&g.destroy),
            drain: g.drain,
        })
        .collect();
    DecisionDiff {
        workloads,
        geometry,
        usage: Vec::new(),
        pools: Vec::new(),
        // No "before": the standing under this policy alone.
        fair_share: fair_share_diff(None, decision.fair_share.as_ref()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_solver::decision::{Method, ReplicaBinding, WorkloadDecision};
    use tessera_solver::{PreemptReason, Reason};

    fn on(node: &str, gpus: &[u32]) -> Outcome {
        Outcome::Keep {
            bindings: vec![ReplicaBinding {
                node: node.into(),
                gpus: gpus.to_vec(),
                mig_profile: None,
                mig_start: None,
                share: None,
            }],
        }
    }

    fn waiting(why: &str) -> Outcome {
        Outcome::Pending {
            reason: Reason::Orphaned { cause: why.into() },
        }
    }

    fn decision(workloads: Vec<(&str, Outcome)>) -> Decision {
        Decision {
            format_version: 1,
            now: "2026-11-20T08:00:00Z".parse().unwrap(),
            method: Method::Heuristic,
            objective: 0.0,
            bound: None,
            gap: None,
            workloads: workloads
                .into_iter()
                .map(|(name, outcome)| WorkloadDecision {
                    name: name.into(),
                    tenant: "t".into(),
                    slo_class: "c".into(),
                    priority: 1,
                    pool: Some("p".into()),
                    outcome,
                })
                .collect(),
            listing: Default::default(),
            geometry: Vec::new(),
            usage: Vec::new(),
            pools: Vec::new(),
            fair_share: None,
            reservations: Vec::new(),
            queue: Vec::new(),
            reconfigurations: Vec::new(),
        }
    }

    #[test]
    fn classifies_each_workload_change_once() {
        let before = decision(vec![
            ("same", on("n1", &[0])),
            ("moves", on("n1", &[1])),
            ("stops", on("n1", &[2])),
            ("starts", waiting("no room")),
            ("still-waits", waiting("no room: 3 free")),
            ("gone", on("n2", &[0])),
        ]);
        let after = decision(vec![
            ("same", on("n1", &[0])),
            ("moves", on("n2", &[1])),
            (
                "stops",
                Outcome::Preempt {
                    grace_seconds: 300,
                    lost_gpu_seconds: 3600.0,
                    reason: PreemptReason::Orphaned { cause: "x".into() },
                },
            ),
            ("starts", on("n3", &[0])),
            ("still-waits", waiting("no room: 2 free")),
        ]);
        let d = decision_diff(&before, &after);
        let got: Vec<(&str, Change)> = d
            .workloads
            .iter()
            .map(|w| (w.name.as_str(), w.change))
            .collect();
        assert_eq!(
            got,
            [
                ("gone", Change::Appeared),
                ("moves", Change::Moved),
                ("starts", Change::Admitted),
                ("stops", Change::Preempted),
            ]
        );
        let stops = d.workloads.iter().find(|w| w.name == "stops").unwrap();
        assert_eq!(stops.after.lost_gpu_seconds, Some(3600.0));
        assert!(decision_diff(&before, &before).is_empty());
    }
}
