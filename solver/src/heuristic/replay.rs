//! The heuristic cycle, steered by an integer program's choice: stop these running workloads,
//! admit these gangs on these nodes, then let the ordinary queue decide everything else.
//!
//! This is how a MILP answer becomes a [`Decision`]: every step goes through the cycle's own
//! quota checks (`check_limit`, `split`, `check_borrow`) and node placement (`fill`, which
//! checks health, free GPUs, CPU and memory), and each preemption must name an admitted
//! workload it is allowed for under the cycle's rules. Whatever the program got wrong (a
//! rounding, a rule it models more loosely) fails here as a [`ReplayError`], never as an
//! invalid decision.
//!
//! It is a child of `heuristic` (declared there with `#[path]`) so that it can use the cycle's
//! private state without widening its API.

use super::{
    Decision, Gpus, Method, Misses, Phase, PreemptReason, Problem, Solver, Status, TopologyMode,
};

/// What the integer program decided for one pool's window.
#[derive(Debug, Clone, Default)]
pub(crate) struct Directive {
    /// Running workloads to stop before anything is admitted.
    pub preempt: Vec<usize>,
    /// Gangs to admit, in this order.
    pub admit: Vec<Admission>,
    /// Gangs the program left waiting: the queue admits them only where they fit without
    /// preemption (which adds value and takes nothing from the program's choice).
    pub hold: Vec<usize>,
}

/// One gang: its pool and how many replicas go on each node.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    pub workload: usize,
    pub pool: usize,
    pub nodes: Vec<(usize, u32)>,
}

/// Where a directed decision failed to rebuild.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ReplayError {
    #[error("`{0}` is not a running workload the cycle keeps")]
    NotKept(String),
    #[error("`{0}` is not waiting or already decided")]
    NotPending(String),
    #[error("`{workload}` cannot take {replicas} replicas in pool `{pool}`")]
    Replicas {
        workload: String,
        pool: String,
        replicas: u32,
    },
    #[error("`{workload}`: {reason}")]
    Quota { workload: String, reason: String },
    #[error("`{workload}` does not fit {replicas} replicas on node `{node}`")]
    Placement {
        workload: String,
        node: String,
        replicas: u32,
    },
    #[error("`{0}` needs one NVLink domain")]
    Topology(String),
    #[error("no admitted workload may preempt `{0}`")]
    NoBeneficiary(String),
}

/// Which running workloads the cycle keeps at its start, and which of those are within their
/// tenant's guarantee (protected from borrowers).
#[derive(Debug, Clone)]
pub(crate) struct KeepPhase {
    pub kept: Vec<bool>,
    pub within_guarantee: Vec<bool>,
}

/// Runs the cycle with `d` decided first; the decision carries `method` and `bound`.
pub(crate) fn solve_directed(
    p: &Problem,
    d: &Directive,
    bound: Option<f64>,
) -> Result<Decision, ReplayError> {
    let mut s = Solver::new(p);
    s.keep_running();
    for &v in &d.preempt {
        if !matches!(s.status[v], Some(Status::Keep)) {
            return Err(ReplayError::NotKept(p.workloads[v].key.to_string()));
        }
        let vl = &p.workloads[v];
        s.fleet.release(p, v, true);
        s.ledger
            .remove(p, vl.tenant, super::pool_of(p, v), vl.amount(vl.replicas));
        // Settled below, once the beneficiaries are admitted.
        s.status[v] = Some(Status::Preempt(PreemptReason::OverLimit {
            tenant: String::new(),
            pool: String::new(),
        }));
    }
    for a in &d.admit {
        admit(p, &mut s, a)?;
    }
    for &v in &d.preempt {
        let reason = beneficiary(p, &s, d, v)
            .ok_or_else(|| ReplayError::NoBeneficiary(p.workloads[v].key.to_string()))?;
        s.status[v] = Some(Status::Preempt(reason));
    }
    for &w in &d.hold {
        s.hold[w] = true;
    }
    s.run_undecided();
    Ok(super::decision(p, &s, Method::Refined, bound))
}

/// Quota, then the given nodes, for one gang.
fn admit(p: &Problem, s: &mut Solver, a: &Admission) -> Result<(), ReplayError> {
    let w = a.workload;
    let wl = &p.workloads[w];
    if s.status[w].is_some() {
        return Err(ReplayError::NotPending(wl.key.to_string()));
    }
    let replicas: u32 = a.nodes.iter().map(|n| n.1).sum();
    if !wl.pools.contains(&a.pool) || replicas < wl.min_member || replicas > wl.replicas {
        return Err(ReplayError::Replicas {
            workload: wl.key.to_string(),
            pool: p.pools[a.pool].name.clone(),
            replicas,
        });
    }
    let quota = |reason: crate::decision::Reason| ReplayError::Quota {
        workload: wl.key.to_string(),
        reason: reason.to_string(),
    };
    let amount = wl.amount(replicas);
    s.ledger
        .check_limit(p, wl.tenant, a.pool, amount)
        .map_err(quota)?;
    let (guaranteed, borrowed) = s.ledger.split(p, wl.tenant, a.pool, amount.gpus);
    s.ledger
        .check_borrow(p, wl.tenant, a.pool, amount.gpus, borrowed)
        .map_err(quota)?;
    if wl.topology == TopologyMode::Required
        && a.nodes
            .windows(2)
            .any(|x| p.nodes[x[0].0].domain != p.nodes[x[1].0].domain)
    {
        return Err(ReplayError::Topology(wl.key.to_string()));
    }
    for &(n, count) in &a.nodes {
        let placed = s
            .fleet
            .fill(p, w, a.pool, &[n], count, &mut Misses::default());
        if placed != count {
            return Err(ReplayError::Placement {
                workload: wl.key.to_string(),
                node: p.nodes[n].name.clone(),
                replicas: count,
            });
        }
    }
    s.ledger.add(p, wl.tenant, a.pool, amount);
    s.status[w] = Some(Status::Admit {
        guaranteed,
        borrowed,
    });
    Ok(())
}

/// The first admitted workload of `v`'s pool that the cycle's rules let preempt `v`, as the
/// reason: a requester admitted within its guarantee reclaims other tenants' borrowed work, or
/// takes lower-priority work; a borrower takes only lower-priority borrowed work.
fn beneficiary(p: &Problem, s: &Solver, d: &Directive, v: usize) -> Option<PreemptReason> {
    let vl = &p.workloads[v];
    let victim = &p.classes[vl.class];
    let Phase::Running { started_at, .. } = vl.phase else {
        return None;
    };
    if !victim.preemptible || ((p.now - started_at).max(0) as u64) < victim.min_runtime_seconds {
        return None;
    }
    let within = s.within_guarantee[v];
    let pool = super::pool_of(p, v);
    d.admit.iter().filter(|a| a.pool == pool).find_map(|a| {
        let wl = &p.workloads[a.workload];
        let prio = p.classes[wl.class].priority;
        let Some(Status::Admit { borrowed, .. }) = &s.status[a.workload] else {
            return None;
        };
        let guaranteed = *borrowed == Gpus::ZERO;
        let lower = victim.priority < prio;
        if guaranteed && !within && (wl.tenant != vl.tenant || lower) {
            Some(PreemptReason::Reclaim {
                for_workload: wl.key.to_string(),
                owner: p.tenants[wl.tenant].name.clone(),
            })
        } else if lower && (guaranteed || !within || wl.tenant == vl.tenant) {
            Some(PreemptReason::Priority {
                for_workload: wl.key.to_string(),
                priority: prio,
            })
        } else {
            None
        }
    })
}
