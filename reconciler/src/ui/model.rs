//! The fleet page's data: what one viewer may see of the service's state, in plain structures
//! the renderer walks once.
//!
//! Who sees what follows the API's rules: the operator everything; a tenant the fleet's
//! geometry with its own workloads named and others' shown only as taken, its own waiting
//! workloads (their messages redacted as `GET /v1/workloads` does), the usage of its subtree
//! (as `GET /v1/usage`), and the status a tenant's token reads (`GET /status`: no diagnostics,
//! only conditions about its own workloads).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tessera_compiler::model::{ClusterStateSpec, Health as NodeHealth, RunningWorkload};
use tessera_compiler::units::Gpus;
use tessera_mig::shape::{MEMORY_SLICES, shape};
use tessera_mig::{GpuModel, builtin_model};

use crate::auth::Principal;
use crate::metering::report::UsageReport;
use crate::service::{DecisionIndex, Status, StatusView};
use crate::snapshot::rfc3339;

/// Everything the page is built from, borrowed from the service.
pub struct Sources<'a> {
    pub viewer: &'a Principal,
    /// Unix seconds: when the page is made.
    pub now: i64,
    pub status: &'a Status,
    /// The last observed fleet; `None` before the first cycle.
    pub state: Option<&'a ClusterStateSpec>,
    /// The last decision; `None` before the first.
    pub decisions: Option<&'a DecisionIndex>,
    /// Metered usage over the last day as the viewer may see it; `None` while no revision is
    /// in force or the store cannot be read.
    pub day: Option<&'a UsageReport>,
}

/// The page.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetPage {
    /// `operator` or `tenant NAME`.
    pub viewer: String,
    pub generated_at: String,
    pub status: StatusSummary,
    pub observed_at: Option<jiff::Timestamp>,
    pub decided_at: Option<jiff::Timestamp>,
    pub pools: Vec<PoolView>,
    /// Waiting workloads in line order (those without a place last).
    pub queue: Vec<Waiting>,
    pub usage: Vec<UsageLine>,
    /// The metering window (RFC 3339) when `usage` carries the day's GPU-hours.
    pub metered: Option<(String, String)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StatusSummary {
    pub sync: &'static str,
    pub health: &'static str,
    pub suspended: bool,
    pub revision: Option<String>,
    pub head: Option<String>,
    pub cycles: u64,
    pub last_cycle_at: Option<String>,
    /// Conditions the viewer may read.
    pub conditions: Vec<String>,
    /// The rejected revision's diagnostics (operator only).
    pub diagnostics: Vec<String>,
    /// GPUs lost, as `node/index` (operator only).
    pub lost_gpus: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PoolView {
    pub name: String,
    /// From the last decision: GPUs of healthy nodes, and allocated.
    pub capacity: Option<Gpus>,
    pub allocated: Option<Gpus>,
    pub nodes: Vec<NodeView>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub health: NodeHealth,
    pub gpus: Vec<GpuView>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GpuView {
    pub index: u32,
    pub model: String,
    pub health: NodeHealth,
    pub mig: bool,
    /// MIG instances, or one block for a whole GPU.
    pub blocks: Vec<Block>,
}

/// A part of a GPU on its memory-slice grid ([`MEMORY_SLICES`] columns: where MIG placements
/// are defined; a 7g instance and a whole GPU span all of them).
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub start: u8,
    pub slices: u8,
    /// The MIG profile; `None` for a whole GPU.
    pub profile: Option<String>,
    pub holders: Vec<Holder>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    Workload {
        tenant: String,
        name: String,
    },
    /// Another tenant's workload, not named to a tenant viewer.
    Other,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    pub tenant: String,
    pub name: String,
    /// 1 is the head of the line; of how many.
    pub position: Option<(u32, u32)>,
    pub pool: Option<String>,
    pub reason: String,
    pub message: String,
}

/// One tenant in one pool.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageLine {
    pub tenant: String,
    pub pool: String,
    pub guarantee: Gpus,
    pub limit: Gpus,
    /// GPUs of the tenant and its subtree after the last decision, and the part above the
    /// guarantee.
    pub total: Gpus,
    pub borrowed: Gpus,
    /// GPU unit-seconds metered over the last day for the tenant's subtree in this pool.
    pub day_unit_seconds: Option<i64>,
}

impl FleetPage {
    pub fn build(s: &Sources<'_>) -> FleetPage {
        let visible_tenants = visible_tenants(s);
        let may_see = |tenant: &str| s.viewer.may_act_for(tenant);
        let pool_reports: BTreeMap<&str, (Gpus, Gpus)> = s
            .decisions
            .map(|d| {
                d.pools
                    .iter()
                    .map(|p| (p.pool.as_str(), (p.capacity, p.allocated)))
                    .collect()
            })
            .unwrap_or_default();
        let pools = s
            .state
            .map(|state| pools(state, &pool_reports, &may_see))
            .unwrap_or_default();
        FleetPage {
            viewer: match s.viewer {
                Principal::Admin => "operator".to_string(),
                Principal::Tenant(t) => format!("tenant {t}"),
            },
            generated_at: rfc3339(s.now),
            status: status(s.status, s.viewer),
            observed_at: s.state.map(|st| st.observed_at),
            decided_at: s.decisions.map(|d| d.at),
            pools,
            queue: s
                .decisions
                .map(|d| queue(d, s.viewer, s.state))
                .unwrap_or_default(),
            usage: s
                .decisions
                .map(|d| usage(d, s.day, visible_tenants.as_ref()))
                .unwrap_or_default(),
            metered: s.day.map(|d| (rfc3339(d.since), rfc3339(d.until))),
        }
    }
}

/// The tenants whose usage the viewer may see: `None` for all (the operator); a tenant's
/// subtree (the report's tenants with the viewer on their path), or the tenant alone without
/// a report.
fn visible_tenants(s: &Sources<'_>) -> Option<BTreeSet<String>> {
    match s.viewer {
        Principal::Admin => None,
        Principal::Tenant(own) => {
            let mut set: BTreeSet<String> = s
                .day
                .map(|d| {
                    d.tenants
                        .iter()
                        .filter(|t| t.path.contains(own))
                        .map(|t| t.name.clone())
                        .collect()
                })
                .unwrap_or_default();
            set.insert(own.clone());
            Some(set)
        }
    }
}

fn status(status: &Status, viewer: &Principal) -> StatusSummary {
    let mut summary = StatusSummary {
        sync: status.sync_label(),
        health: status.health_label(),
        suspended: status.suspended,
        revision: status.revision.clone(),
        head: status.head.clone(),
        cycles: status.cycles,
        last_cycle_at: status.last_cycle_at.clone(),
        conditions: Vec::new(),
        diagnostics: Vec::new(),
        lost_gpus: Vec::new(),
    };
    match status.view_for(Some(viewer)) {
        StatusView::Operator(full) => {
            summary.conditions = full.conditions.into_iter().map(|c| c.message).collect();
            summary.diagnostics = full.diagnostics;
            summary.lost_gpus = full.lost_gpus;
        }
        StatusView::Tenant(t) => {
            summary.conditions = t.conditions.into_iter().map(|c| c.message).collect();
        }
        StatusView::Public(_) => {}
    }
    summary
}

/// Which running workloads hold which part of which GPU, by node and GPU index.
type HoldersByGpu<'a> = HashMap<(&'a str, u32), Vec<(Option<u8>, &'a RunningWorkload)>>;

fn pools(
    state: &ClusterStateSpec,
    reports: &BTreeMap<&str, (Gpus, Gpus)>,
    may_see: &impl Fn(&str) -> bool,
) -> Vec<PoolView> {
    let mut held: HoldersByGpu<'_> = HashMap::new();
    for w in &state.running {
        for b in &w.bindings {
            for &gpu in &b.gpus {
                held.entry((b.node.as_str(), gpu))
                    .or_default()
                    .push((b.mig_start, w));
            }
        }
    }
    let holder = |w: &RunningWorkload| {
        if may_see(&w.spec.tenant) {
            Holder::Workload {
                tenant: w.spec.tenant.clone(),
                name: w.name.clone(),
            }
        } else {
            Holder::Other
        }
    };
    // Built-in models are built on each lookup; a fleet has a handful of models.
    let mut models: HashMap<&str, Option<GpuModel>> = HashMap::new();
    let mut by_pool: BTreeMap<&str, Vec<NodeView>> = BTreeMap::new();
    for node in &state.nodes {
        let gpus = node
            .gpus
            .iter()
            .map(|g| {
                let holders = held
                    .get(&(node.name.as_str(), g.index))
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let blocks = if g.mig.enabled {
                    let model = models
                        .entry(g.model.as_str())
                        .or_insert_with(|| builtin_model(&g.model));
                    g.instances
                        .iter()
                        .map(|i| Block {
                            start: i.start,
                            slices: memory_slices(model.as_ref(), &i.profile),
                            profile: Some(i.profile.clone()),
                            holders: holders_of(holders, Some(i.start), &holder),
                        })
                        .collect()
                } else {
                    vec![Block {
                        start: 0,
                        slices: MEMORY_SLICES,
                        profile: None,
                        holders: holders_of(holders, None, &holder),
                    }]
                };
                GpuView {
                    index: g.index,
                    model: g.model.clone(),
                    health: g.health,
                    mig: g.mig.enabled,
                    blocks,
                }
            })
            .collect();
        by_pool
            .entry(node.pool.as_str())
            .or_default()
            .push(NodeView {
                name: node.name.clone(),
                health: node.health,
                gpus,
            });
    }
    by_pool
        .into_iter()
        .map(|(name, nodes)| PoolView {
            name: name.to_string(),
            capacity: reports.get(name).map(|r| r.0),
            allocated: reports.get(name).map(|r| r.1),
            nodes,
        })
        .collect()
}

/// The holders of the instance at `start` (`None`: the whole GPU, or shares of it).
fn holders_of(
    held: &[(Option<u8>, &RunningWorkload)],
    start: Option<u8>,
    holder: &impl Fn(&RunningWorkload) -> Holder,
) -> Vec<Holder> {
    let mut out: Vec<Holder> = held
        .iter()
        .filter(|(s, _)| *s == start)
        .map(|(_, w)| holder(w))
        .collect();
    out.sort();
    // A gang with several replicas on one GPU (shares) is one holder.
    out.dedup();
    out
}

/// How many memory slices a profile spans on `model`; one when the model or profile is
/// unknown to the catalogue (the block is still drawn, and labelled).
fn memory_slices(model: Option<&GpuModel>, profile: &str) -> u8 {
    model
        .and_then(|m| m.resolve_profile(profile))
        .and_then(shape)
        .map_or(1, |s| s.memory_slices)
}

/// The waiting workloads the viewer may see. A waiting workload has no pool in the decision;
/// the one its spec asks for, if any, is shown.
fn queue(d: &DecisionIndex, viewer: &Principal, state: Option<&ClusterStateSpec>) -> Vec<Waiting> {
    let tenant_viewer = match viewer {
        Principal::Admin => None,
        Principal::Tenant(t) => Some(t.as_str()),
    };
    let asked: HashMap<(&str, &str), &str> = state
        .map(|st| {
            st.pending
                .iter()
                .filter_map(|p| {
                    let pool = p.spec.pool.as_deref()?;
                    Some(((p.spec.tenant.as_str(), p.name.as_str()), pool))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut waiting: Vec<Waiting> = d
        .workloads()
        .filter(|(key, w)| w.outcome == "pending" && viewer.may_act_for(&key.tenant))
        .map(|(key, w)| {
            let message = w.message.clone().unwrap_or_default();
            Waiting {
                tenant: key.tenant.clone(),
                name: key.name.clone(),
                position: w.queue_position.map(|q| (q.position, q.of)),
                pool: w.pool.clone().or_else(|| {
                    asked
                        .get(&(key.tenant.as_str(), key.name.as_str()))
                        .map(|p| p.to_string())
                }),
                reason: w.reason.clone().unwrap_or_default(),
                message: match tenant_viewer {
                    Some(t) => d.redact(&message, t),
                    None => message,
                },
            }
        })
        .collect();
    waiting.sort_by(|a, b| {
        (a.position.is_none(), a.position, &a.tenant, &a.name).cmp(&(
            b.position.is_none(),
            b.position,
            &b.tenant,
            &b.name,
        ))
    });
    waiting
}

fn usage(
    d: &DecisionIndex,
    day: Option<&UsageReport>,
    visible: Option<&BTreeSet<String>>,
) -> Vec<UsageLine> {
    // The day's metered unit-seconds per (tenant, pool), each row counted for its tenant and
    // every ancestor: the decision's figures are subtree totals too.
    let mut metered: HashMap<(&str, &str), i64> = HashMap::new();
    if let Some(day) = day {
        let paths: HashMap<&str, &[String]> = day
            .tenants
            .iter()
            .map(|t| (t.name.as_str(), t.path.as_slice()))
            .collect();
        for row in &day.rows {
            let path = paths.get(row.tenant.as_str()).copied().unwrap_or_default();
            let mut counted_own = false;
            for t in path {
                counted_own |= *t == row.tenant;
                *metered.entry((t.as_str(), row.pool.as_str())).or_default() +=
                    row.gpu_unit_seconds;
            }
            if !counted_own {
                *metered
                    .entry((row.tenant.as_str(), row.pool.as_str()))
                    .or_default() += row.gpu_unit_seconds;
            }
        }
    }
    let mut lines: Vec<UsageLine> = d
        .usage
        .iter()
        .filter(|u| visible.is_none_or(|v| v.contains(&u.tenant)))
        .map(|u| UsageLine {
            tenant: u.tenant.clone(),
            pool: u.pool.clone(),
            guarantee: u.guarantee,
            limit: u.limit,
            total: u.total,
            borrowed: u.borrowed,
            day_unit_seconds: day.map(|_| {
                metered
                    .get(&(u.tenant.as_str(), u.pool.as_str()))
                    .copied()
                    .unwrap_or(0)
            }),
        })
        .collect();
    lines.sort_by(|a, b| (&a.tenant, &a.pool).cmp(&(&b.tenant, &b.pool)));
    lines
}
