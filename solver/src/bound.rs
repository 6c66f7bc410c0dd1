//! An upper bound on a decision's objective: the LP relaxation of admitting work into pools.
//!
//! Every workload (running or waiting) may be admitted fractionally into any of its pools; a
//! pool holds at most its GPUs (healthy or not: running work on an unhealthy GPU may be kept),
//! and a tenant and each of its ancestors at most their limit per pool (or what non-preemptible
//! work already holds there, which a decision never takes away). Placement detail, MIG
//! geometry, topology, CPU and memory are relaxed away, and preemption costs nothing. Every
//! decision the solver can return is feasible here at no lower value, so the LP optimum bounds
//! the objective; the gap shows how much a better method could still win, at most.

use std::collections::BTreeMap;

use good_lp::{Expression, ProblemVariables, Solution, SolverModel, microlp, variable};

use crate::problem::Problem;

/// The relaxation's optimum, or `None` when the LP solver fails (which would be a bug: the
/// all-zero admission is always feasible).
pub fn lp_bound(p: &Problem) -> Option<f64> {
    lp_bound_of(p, |_| true)
}

/// What workload `w` is worth in the objective when placed whole (its priority, at least 0,
/// times its GPUs): its variable's coefficient, so the most it adds to the LP's optimum.
pub(crate) fn most_added(p: &Problem, w: usize) -> f64 {
    let wl = &p.workloads[w];
    p.classes[wl.class].priority.max(0) as f64 * wl.amount(wl.replicas).gpus.as_f64()
}

/// [`lp_bound`] over the workloads `live` accepts (a session's, once some have finished).
pub(crate) fn lp_bound_of(p: &Problem, live: impl Fn(usize) -> bool) -> Option<f64> {
    let mut vars = ProblemVariables::new();
    let mut objective = Expression::from(0.0);
    let mut per_workload: Vec<Expression> = Vec::new();
    let mut pool_use: BTreeMap<usize, Expression> = BTreeMap::new();
    // (tenant, pool) → GPUs admitted in that subtree, and what non-preemptible work holds.
    let mut quota_use: BTreeMap<(usize, usize), Expression> = BTreeMap::new();
    let mut pinned: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    for (w, wl) in p.workloads.iter().enumerate() {
        let gpus = wl.amount(wl.replicas).gpus.as_f64();
        if gpus <= 0.0 || !live(w) {
            continue;
        }
        let value = most_added(p, w);
        let mut share = Expression::from(0.0);
        for &pool in &wl.pools {
            let x = vars.add(variable().min(0.0).max(1.0));
            share += x;
            objective += value * x;
            *pool_use.entry(pool).or_default() += gpus * x;
            for &t in &p.tenants[wl.tenant].lineage {
                *quota_use.entry((t, pool)).or_default() += gpus * x;
                if wl.is_running() && !p.classes[wl.class].preemptible {
                    *pinned.entry((t, pool)).or_default() += gpus;
                }
            }
        }
        per_workload.push(share);
    }
    let mut model = vars.maximise(objective.clone()).using(microlp);
    for share in per_workload {
        model = model.with(share.leq(1.0));
    }
    for (pool, used) in pool_use {
        let capacity: usize = p.pools[pool]
            .nodes
            .iter()
            .map(|&n| p.nodes[n].gpus.len())
            .sum();
        model = model.with(used.leq(capacity as f64));
    }
    for ((t, pool), used) in quota_use {
        let limit = p.tenants[t]
            .quota
            .get(&pool)
            .map_or(0.0, |q| q.limit.gpus.as_f64());
        let floor = pinned.get(&(t, pool)).copied().unwrap_or(0.0);
        model = model.with(used.leq(limit.max(floor)));
    }
    let solution = model.solve().ok()?;
    Some(solution.eval(&objective))
}
