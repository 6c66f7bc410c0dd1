//! The decision's assembly: per workload its outcome and bindings, the geometry plan per GPU,
//! usage per tenant and pool, and the pools' figures.

use super::*;
use crate::decision::Listing;
use crate::problem::GpuInfo;

pub(super) fn placed_of(p: &Problem, w: usize, s: &Slot) -> Placed {
    let mig = match p.workloads[w].demand {
        Demand::Mig { profile_id } => s.mig_start.map(|start| Placement::new(profile_id, start)),
        _ => None,
    };
    Placed {
        node: s.node,
        gpus: s.gpus.clone(),
        mig,
        share: s.share,
    }
}

/// The snapshot's slot for a placement: what [`placed_of`] reads back.
pub(crate) fn slot_of(placed: &Placed) -> Slot {
    Slot {
        node: placed.node,
        gpus: placed.gpus.clone(),
        mig_start: placed.mig.map(|m| m.start),
        share: placed.share,
    }
}

/// Whether GPU `g` is to change its geometry (MIG instances created or destroyed) in `fleet`.
pub(crate) fn geometry_changes_on(p: &Problem, fleet: &Fleet, g: usize) -> bool {
    gpu_layout(p, fleet, g).is_some_and(|layout| layout.changes(&p.gpus[g]))
}

/// GPU units × seconds of work since the last checkpoint (or the start).
pub(crate) fn lost_units_seconds(p: &Problem, w: usize) -> i64 {
    let wl = &p.workloads[w];
    match wl.phase {
        Phase::Running {
            started_at,
            last_checkpoint_at,
            ..
        } => {
            let since = last_checkpoint_at.unwrap_or(started_at).max(started_at);
            wl.amount(wl.replicas).gpus.units() * (p.now - since).max(0)
        }
        Phase::Pending { .. } => 0,
    }
}

pub(super) fn round(x: f64, scale: f64) -> f64 {
    (x * scale).round() / scale
}

pub(super) fn bindings(p: &Problem, slots: &[Placed]) -> Vec<ReplicaBinding> {
    let pool = slots.first().and_then(|s| p.nodes[s.node].pool);
    slots
        .iter()
        .map(|s| ReplicaBinding {
            node: p.nodes[s.node].name.clone(),
            gpus: s.gpus.iter().map(|&g| p.gpus[g].index).collect(),
            mig_profile: s.mig.map(|m| {
                pool.map_or_else(
                    || m.profile_id.to_string(),
                    |pl| p.pools[pl].profile_name(m.profile_id),
                )
            }),
            mig_start: s.mig.map(|m| m.start),
            share: s.share,
        })
        .collect()
}

pub(super) fn orphan_cause(c: &OrphanCause) -> String {
    match c {
        OrphanCause::Tenant(t) => format!("tenant `{t}` was removed from the policy"),
        OrphanCause::SloClass(c) => format!("SLO class `{c}` was removed from the policy"),
        OrphanCause::Pool(pl) => format!("pool `{pl}` was removed from the policy"),
        OrphanCause::ClassNotAllowed { tenant, class } => {
            format!("tenant `{tenant}` may no longer use SLO class `{class}`")
        }
        OrphanCause::NodePool { node, pool } => {
            format!("pool `{pool}` of node `{node}` was removed from the policy")
        }
    }
}

/// Runs one heuristic cycle.
pub fn solve(p: &Problem) -> Decision {
    solve_keeping(p).0
}

/// [`solve`], with what its step (a) kept (see [`Solver::run`]).
pub(crate) fn solve_keeping(p: &Problem) -> (Decision, KeepPhase) {
    let (bound, s, keep) = run_with_bound(p);
    (decision(p, &s, Method::Heuristic, bound), keep)
}

/// The heuristic's cycle on `p` ([`Solver::run`]) and the LP bound, which reads the problem
/// alone: computed on a second core while the cycle runs.
pub(crate) fn run_with_bound(p: &Problem) -> (Option<f64>, Solver<'_>, KeepPhase) {
    let (bound, (s, keep)) = crate::split::beside(
        crate::split::large(p.workloads.len()),
        || crate::bound::lp_bound(p),
        || {
            let mut s = Solver::new(p);
            let keep = s.run();
            (s, keep)
        },
    );
    (bound, s, keep)
}

/// The decision for one workload of the problem given its status, and what it adds to the
/// objective.
pub(crate) fn workload_decision(
    p: &Problem,
    fleet: &Fleet,
    w: usize,
    status: Option<&Status>,
) -> (WorkloadDecision, f64) {
    workload_decision_on(p, placed_on(fleet, w), w, status)
}

/// What `w` holds on `fleet`, as a slice that may cross threads (the fleet's `Rc` may not).
fn placed_on(fleet: &Fleet, w: usize) -> &[Placed] {
    fleet.placed[w].as_deref().map_or(&[], Vec::as_slice)
}

/// [`workload_decision`] from what `w` holds.
fn workload_decision_on(
    p: &Problem,
    slots: &[Placed],
    w: usize,
    status: Option<&Status>,
) -> (WorkloadDecision, f64) {
    let wl = &p.workloads[w];
    let class = &p.classes[wl.class];
    let objective = value_of(p, slots, w, status);
    let status = status.cloned().unwrap_or(Status::Keep);
    let pool = match (&status, slots.first()) {
        (Status::Admit { .. }, Some(sl)) => p.nodes[sl.node].pool.map(|x| p.pools[x].name.clone()),
        (Status::Keep | Status::Admit { .. }, _) => Some(p.pools[pool_of(p, w)].name.clone()),
        _ => None,
    };
    let outcome = match status {
        Status::Keep => Outcome::Keep {
            bindings: bindings(p, slots),
        },
        Status::Admit {
            guaranteed,
            borrowed,
        } => Outcome::Admit {
            bindings: bindings(p, slots),
            guaranteed,
            borrowed,
        },
        Status::Preempt(reason) => {
            let lost = lost_units_seconds(p, w) as f64 / Gpus::UNITS_PER_GPU as f64;
            Outcome::Preempt {
                grace_seconds: class.grace_period_seconds,
                lost_gpu_seconds: round(lost, 1e3),
                reason,
            }
        }
        Status::Pending(reason) => Outcome::Pending { reason },
    };
    let decision = WorkloadDecision {
        name: wl.key.name.clone(),
        tenant: p.tenants[wl.tenant].name.clone(),
        slo_class: class.name.clone(),
        priority: class.priority,
        pool,
        outcome,
    };
    (decision, objective)
}

/// What `w` adds to the decision's objective given its status and what it holds.
fn value_of(p: &Problem, slots: &[Placed], w: usize, status: Option<&Status>) -> f64 {
    let wl = &p.workloads[w];
    let class = &p.classes[wl.class];
    match status.unwrap_or(&Status::Keep) {
        Status::Keep | Status::Admit { .. } => {
            class.priority as f64 * (wl.demand.gpus() * slots.len() as i64).as_f64()
        }
        Status::Preempt(_) => {
            let lost = lost_units_seconds(p, w) as f64 / Gpus::UNITS_PER_GPU as f64;
            // Subtracting is adding the negation, bit for bit: the total is unchanged.
            -(class.priority as f64 * lost / 3600.0)
        }
        Status::Pending(_) => 0.0,
    }
}

/// Whether a decision listing `listing` lists a workload of status `status`.
fn listed(listing: Listing, status: Option<&Status>) -> bool {
    match listing {
        Listing::All => true,
        Listing::Changes => matches!(status, Some(Status::Admit { .. } | Status::Preempt(_))),
    }
}

/// The decision for a workload whose tenant, class or pool left the policy.
pub(crate) fn orphan_decision(p: &Problem, o: &crate::problem::Orphan) -> WorkloadDecision {
    let cause = orphan_cause(&o.cause);
    // The class's grace period and priority, when the class still exists.
    let class = p.classes.iter().find(|c| c.name == o.class);
    let outcome = if o.was_running {
        let lost = o.gpus.units() as f64 * (p.now - o.since.unwrap_or(p.now)).max(0) as f64
            / Gpus::UNITS_PER_GPU as f64;
        let reason = PreemptReason::Orphaned { cause };
        Outcome::Preempt {
            grace_seconds: class.map_or(0, |c| c.grace_period_seconds),
            lost_gpu_seconds: round(lost, 1e3),
            reason,
        }
    } else {
        let reason = Reason::Orphaned { cause };
        Outcome::Pending { reason }
    };
    WorkloadDecision {
        name: o.name.clone(),
        tenant: o.tenant.clone(),
        slo_class: o.class.clone(),
        priority: class.map_or(0, |c| c.priority),
        pool: None,
        outcome,
    }
}

/// The whole decision of a finished cycle.
/// The decision of a finished cycle, valued, with the relaxation's `bound`.
pub(crate) fn decision(p: &Problem, s: &Solver, method: Method, bound: Option<f64>) -> Decision {
    decision_of(p, s, method, bound, |_| true)
}

/// [`decision`] over the workloads `live` accepts (a session's, once some have finished).
pub(crate) fn decision_of(
    p: &Problem,
    s: &Solver,
    method: Method,
    bound: Option<f64>,
    live: impl Fn(usize) -> bool,
) -> Decision {
    // Each workload's decision is built on the machine's cores (`split`): at 50,000 GPUs they
    // are 70,000, each a few strings. They are built in the decision's order, (tenant, name),
    // sorted by the tenant's rank and the name, which orders as the strings do at the cost of
    // one name comparison.
    let ranks = s.tenant_ranks();
    let ranks = &ranks[..];
    let status = &s.status;
    // The objective is summed in workload order, so that its bits are the sequential loop's
    // whatever the decision's order; a workload not listed is valued here.
    let mut values = vec![0.0; p.workloads.len()];
    let mut held: Vec<(usize, &[Placed])> = Vec::new();
    for w in (0..p.workloads.len()).filter(|&w| live(w)) {
        let slots = placed_on(&s.fleet, w);
        if listed(p.listing, status[w].as_ref()) {
            held.push((w, slots));
        } else {
            values[w] = value_of(p, slots, w, status[w].as_ref());
        }
    }
    crate::split::sort_by(&mut held, |&(a, _), &(b, _)| {
        let (a, b) = (&p.workloads[a], &p.workloads[b]);
        (ranks[a.tenant], &a.key.name).cmp(&(ranks[b.tenant], &b.key.name))
    });
    let decided = crate::split::map(&held, |&(w, slots)| {
        workload_decision_on(p, slots, w, status[w].as_ref())
    });
    let mut workloads = Vec::with_capacity(decided.len() + p.orphans.len());
    for (&(w, _), (d, value)) in held.iter().zip(decided) {
        values[w] = value;
        workloads.push(d);
    }
    let objective = values
        .into_iter()
        .filter(|&v| v != 0.0)
        .fold(0.0, |sum, v| sum + v);
    if !p.orphans.is_empty() {
        // An orphan's tenant may have left the policy, and has no rank: sorted by names.
        workloads.extend(
            p.orphans.iter().map(|o| orphan_decision(p, o)).filter(|d| {
                p.listing == Listing::All || matches!(d.outcome, Outcome::Preempt { .. })
            }),
        );
        crate::split::sort_by(&mut workloads, |a, b| {
            (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name))
        });
    }

    let (reservations, reserved_idle) = reserve::reports(s);
    let mut pools = pool_reports(p, s);
    for (r, idle) in pools
        .iter_mut()
        .zip(pool_order(p).into_iter().map(|pl| reserved_idle[pl]))
    {
        r.reserved_idle = idle;
    }
    let geometry = geometry(p, &s.fleet);
    let reconfigurations = reconfigurations(p, &geometry);
    let mut queued = BTreeSet::new();
    let queue = s
        .trace
        .iter()
        // A workload no pool may hold waits for a policy change, not for its turn (and a
        // session, deciding it alone, never enters it in the trace).
        .filter(|step| live(step.w) && !p.workloads[step.w].pools.is_empty())
        .filter(|step| matches!(s.status[step.w], Some(Status::Pending(_))))
        .filter(|step| queued.insert(step.w))
        .map(|step| p.workloads[step.w].key.to_string())
        .collect();
    Decision {
        format_version: FORMAT_VERSION,
        now: p.now_at,
        method,
        objective: round(objective, 1e6),
        // Rounded up, so that rounding never makes the bound smaller than the objective.
        bound: bound.map(|b| (b * 1e6).ceil() / 1e6),
        gap: bound.map(|b| {
            if b.abs() < 1e-9 {
                0.0
            } else {
                round(((b - objective) / b.abs()).max(0.0), 1e6)
            }
        }),
        geometry,
        usage: usage(p, &s.ledger),
        pools,
        workloads,
        listing: p.listing,
        fair_share: crate::fairshare::report(p),
        reservations,
        queue,
        reconfigurations,
    }
}

/// What the budget has spent after a decision whose geometry plans are `geometry`.
fn reconfigurations(p: &Problem, geometry: &[GeometryPlan]) -> Vec<ReconfigurationRecord> {
    let mut out = p.reconfigurations.clone();
    out.extend(
        geometry
            .iter()
            .filter(|g| g.spends_budget())
            .map(|g| ReconfigurationRecord {
                node: g.node.clone(),
                gpu: g.gpu,
                at: p.now_at,
            }),
    );
    out.sort();
    out
}

pub(super) fn instances(p: &Problem, pool: usize, v: &[Placement]) -> Vec<Instance> {
    let mut out: Vec<Instance> = v
        .iter()
        .map(|pl| Instance {
            start: pl.start,
            profile_id: pl.profile_id,
            profile: p.pools[pool].profile_name(pl.profile_id),
        })
        .collect();
    out.sort();
    out
}

/// The decision's geometry: every GPU of a MIG pool, or with [`Listing::Changes`] only those
/// whose layout changes (the rest are named, profile by profile, only to be dropped: a few per
/// cent of a simulated day).
pub(super) fn geometry(p: &Problem, fleet: &Fleet) -> Vec<GeometryPlan> {
    (0..p.gpus.len())
        .filter_map(|g| {
            let layout = gpu_layout(p, fleet, g)?;
            (p.listing == Listing::All || layout.changes(&p.gpus[g])).then(|| plan(p, g, &layout))
        })
        .collect()
}

/// The plans of the GPUs whose plan differs between two fleets of the same problem, in the
/// decision's order. Only GPUs a placement wrote to can differ: the others share their state.
pub(crate) fn geometry_changes(p: &Problem, before: &Fleet, after: &Fleet) -> Vec<GeometryPlan> {
    (0..p.gpus.len())
        .filter(|&g| !Rc::ptr_eq(&before.gpu[g], &after.gpu[g]))
        .filter_map(|g| {
            let now = gpu_plan(p, after, g)?;
            (gpu_plan(p, before, g).as_ref() != Some(&now)).then_some(now)
        })
        .collect()
}

/// The geometry plan of GPU `g`, if it is in a MIG pool.
pub(super) fn gpu_plan(p: &Problem, fleet: &Fleet, g: usize) -> Option<GeometryPlan> {
    gpu_layout(p, fleet, g).map(|layout| plan(p, g, &layout))
}

/// What a GPU of a MIG pool is to become, in placements: a [`GeometryPlan`] before it is named.
struct Layout<'a> {
    pool: usize,
    /// The fleet's geometry for the GPU, or that completed into one of the pool's layouts.
    target: std::borrow::Cow<'a, [Placement]>,
    destroy: Vec<Placement>,
    create: Vec<Placement>,
    drain: bool,
}

impl Layout<'_> {
    /// [`GeometryPlan::changes`] of the plan, before it is named.
    fn changes(&self, info: &GpuInfo) -> bool {
        self.enable_mig(info) || !self.create.is_empty() || !self.destroy.is_empty()
    }

    fn enable_mig(&self, info: &GpuInfo) -> bool {
        !info.mig_enabled && !self.target.is_empty()
    }
}

fn gpu_layout<'a>(p: &Problem, fleet: &'a Fleet, g: usize) -> Option<Layout<'a>> {
    let info = &p.gpus[g];
    let pool = p.nodes[info.node].pool?;
    if p.pools[pool].sharing != Sharing::Mig {
        return None;
    }
    let state = &fleet.gpu[g];
    let current = &info.instances;
    // An unhealthy GPU is left as it is: completing its layout would re-partition a GPU
    // that tessera places nothing on (and may not fully see).
    let completed = if info.healthy {
        complete_layout(&p.pools[pool], &state.geometry, state.changes)
    } else {
        None
    };
    let target = completed.map_or(std::borrow::Cow::Borrowed(&state.geometry[..]), Into::into);
    let destroy: Vec<Placement> = current
        .iter()
        .copied()
        .filter(|x| !target.contains(x))
        .collect();
    let create: Vec<Placement> = target
        .iter()
        .copied()
        .filter(|x| !current.contains(x))
        .collect();
    let drain = destroy.iter().any(|d| state.preempted.contains(&d.start))
        || (!destroy.is_empty() && state.preempted.contains(&u8::MAX));
    Some(Layout {
        pool,
        target,
        destroy,
        create,
        drain,
    })
}

fn plan(p: &Problem, g: usize, layout: &Layout) -> GeometryPlan {
    let info = &p.gpus[g];
    let pool = layout.pool;
    GeometryPlan {
        node: p.nodes[info.node].name.clone(),
        gpu: info.index,
        pool: p.pools[pool].name.clone(),
        current: instances(p, pool, &info.instances),
        target: instances(p, pool, &layout.target),
        destroy: instances(p, pool, &layout.destroy),
        create: instances(p, pool, &layout.create),
        enable_mig: layout.enable_mig(info),
        drain: layout.drain,
    }
}

pub(super) fn usage(p: &Problem, ledger: &Ledger) -> Vec<TenantUsage> {
    let mut out = Vec::new();
    for (t, info) in p.tenants.iter().enumerate() {
        let mut pools: Vec<(&String, usize)> = info
            .quota
            .keys()
            .map(|&pl| (&p.pools[pl].name, pl))
            .collect();
        pools.sort();
        for (name, pl) in pools {
            let q = &info.quota[&pl];
            let total = ledger.usage(t, pl).gpus;
            let guaranteed = total.min(q.guarantee.gpus);
            out.push(TenantUsage {
                tenant: info.name.clone(),
                pool: name.clone(),
                guarantee: q.guarantee.gpus,
                limit: q.limit.gpus,
                total,
                guaranteed,
                borrowed: total - guaranteed,
            });
        }
    }
    out
}

/// Pools by name: the order of the decision's pool reports.
pub(super) fn pool_order(p: &Problem) -> Vec<usize> {
    let mut order: Vec<usize> = (0..p.pools.len()).collect();
    order.sort_by(|&a, &b| p.pools[a].name.cmp(&p.pools[b].name));
    order
}

pub(super) fn pool_reports(p: &Problem, s: &Solver) -> Vec<PoolReport> {
    let fleet = &s.fleet;
    let order = pool_order(p);
    // The distinct demands still pending per pool: each GPU is asked whether any could use
    // it, and a long queue repeats a few demands (a thousand waiting workloads asked every
    // GPU of the acme fleet a thousand questions, MIG re-layouts among them, each cycle).
    let mut pending: BTreeMap<usize, Vec<Demand>> = BTreeMap::new();
    for (w, wl) in p.workloads.iter().enumerate() {
        if matches!(s.status[w], Some(Status::Pending(_))) {
            for &pl in &wl.pools {
                let demands = pending.entry(pl).or_default();
                if !demands.contains(&wl.demand) {
                    demands.push(wl.demand);
                }
            }
        }
    }
    order
        .into_iter()
        .map(|pl| {
            let info = &p.pools[pl];
            let mut capacity = Gpus::ZERO;
            let mut allocated = Gpus::ZERO;
            let mut stranded = Gpus::ZERO;
            // F summed over the pool's healthy nodes, in GPU units x replicas of the mix.
            let mut fragmented: u128 = 0;
            let mut free_nodes = 0;
            let mut free_domains: BTreeMap<&str, bool> = BTreeMap::new();
            let shapes = pending.get(&pl).cloned().unwrap_or_default();
            for &n in &info.nodes {
                let node = &p.nodes[n];
                let healthy = || node.gpus.iter().copied().filter(|&g| p.gpus[g].healthy);
                let node_free = node.healthy
                    && node
                        .gpus
                        .iter()
                        .all(|&g| p.gpus[g].healthy && fleet.gpu[g].is_free());
                if node_free {
                    free_nodes += 1;
                }
                if node.healthy && fleet.mix.runs_in(pl) {
                    fragmented += u128::from(fleet.measure(p, pl, n, None).own_fragmentation);
                }
                let e = free_domains.entry(node.domain.as_str()).or_insert(true);
                *e &= node_free;
                let free_whole = healthy().filter(|&g| fleet.gpu[g].is_free()).count() as u32;
                for g in healthy() {
                    let st = &fleet.gpu[g];
                    capacity += Gpus::whole(1);
                    let a = st.allocated();
                    allocated += a;
                    let free = Gpus::whole(1) - a;
                    if free > Gpus::ZERO && !shapes.is_empty() {
                        let usable = shapes.iter().any(|d| match *d {
                            Demand::Whole { count } => st.is_free() && free_whole >= count,
                            // A free instance of the profile, laid out or laid out by a
                            // re-layout into one of the pool's layouts: what the fleet keeps
                            // for the GPU (`offers.rs`), as the placement search reads it.
                            Demand::Mig { .. } => st.whole.is_none() && st.offers.may_offer(*d),
                            Demand::Share { fraction } => {
                                st.whole.is_none()
                                    && st.held.is_empty()
                                    && st.share_total() + fraction <= Gpus::whole(1)
                                    && (st.shares.len() as u32) < info.max_clients_per_gpu
                            }
                        });
                        if !usable {
                            stranded += free;
                        }
                    }
                }
            }
            let allocation = if capacity == Gpus::ZERO {
                0.0
            } else {
                round(allocated.units() as f64 / capacity.units() as f64, 1e4)
            };
            PoolReport {
                pool: info.name.clone(),
                sharing: info.sharing,
                capacity,
                allocated,
                allocation,
                free: capacity - allocated,
                stranded,
                fragmentation: fleet.mix.expected(pl, fragmented),
                free_nodes,
                free_domains: free_domains.values().filter(|v| **v).count() as u32,
                reserved_idle: Gpus::ZERO,
                refinement: None,
            }
        })
        .collect()
}
