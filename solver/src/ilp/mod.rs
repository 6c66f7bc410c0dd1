//! Refinement of the heuristic's decision by integer programs, one bounded sub-problem per pool.
//!
//! A fleet-wide MILP does not finish on microlp (no presolve, cuts or primal heuristics, a basis
//! copied per open node), so the work is decomposed: per pool, in name order, a [`window`] of
//! the gangs left waiting and the nodes where room could be made, everything else fixed as the
//! incumbent has it; [`formulate`] writes that window's program, [`backend`] solves it from the
//! incumbent as start point under a node limit, and the answer is rebuilt through the
//! heuristic's own steps (`replay.rs`), so that every invariant holds by construction. It
//! replaces the incumbent only when the rebuilt decision is strictly better; in every other case
//! the incumbent stands, and the pool's report says why.
//!
//! Determinism: the node limit, not the clock, bounds each search, so the same input gives the
//! same bytes. The one exception is the time limit ([`crate::SolveOptions::time_limit`]): a
//! search it stops, and every pool not reached by then, keep the incumbent and report
//! `time_limit`; only a cycle that hits its limit can differ from one run to the next.

mod backend;
mod formulate;
mod incumbent;
mod model;
mod window;

use std::time::{Duration, Instant};

use crate::decision::{Decision, Method, PoolRefinement, RefineStatus};
use crate::heuristic::{self, Directive, KeepPhase};
use crate::problem::Problem;

pub use backend::Stop;

/// Limits of the refinement.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Wall-clock limit for all sub-problems together.
    pub time: Duration,
    /// Branch-and-bound nodes per sub-problem.
    pub nodes: u64,
    /// Gangs waiting and nodes per window.
    pub gangs: usize,
    pub window_nodes: usize,
    /// Sub-problems with more variables are not solved.
    pub variables: usize,
}

impl Budget {
    pub fn new(time: Duration) -> Budget {
        Budget {
            time,
            nodes: 2_000,
            gangs: 6,
            window_nodes: 8,
            variables: 400,
        }
    }
}

/// Refines `incumbent` (the heuristic's decision for `p`, whose step (a) kept `keep`) pool by
/// pool within `budget`.
pub(crate) fn refine(
    p: &Problem,
    mut incumbent: Decision,
    keep: &KeepPhase,
    budget: Budget,
) -> Decision {
    let started = Instant::now();
    // The incumbent's states, read again only once a pool's rebuild replaced it.
    let mut read: Option<Vec<incumbent::State>> = None;
    let mut order: Vec<usize> = (0..p.pools.len()).collect();
    order.sort_by(|&a, &b| p.pools[a].name.cmp(&p.pools[b].name));
    let mut reports: Vec<(usize, PoolRefinement)> = Vec::new();
    let mut improved = false;
    for (i, &pool) in order.iter().enumerate() {
        let left = budget.time.saturating_sub(started.elapsed());
        let mut report = PoolRefinement {
            gangs: 0,
            running: 0,
            nodes: 0,
            variables: 0,
            constraints: 0,
            status: RefineStatus::TimeLimit,
        };
        if left.is_zero() {
            reports.push((pool, report));
            continue;
        }
        // Nor does it model borrowers preempting each other by fair share.
        if p.pools[pool].fair_share_preemption {
            report.status = RefineStatus::Skipped {
                reason: "borrowers preempt each other by fair share here, which the integer program does not model".to_string(),
            };
            reports.push((pool, report));
            continue;
        }
        // The integer program does not model held capacity: a pool where a gang holds some,
        // or where backfill yielded to one, keeps the heuristic's decision.
        if let Some(r) = incumbent
            .reservations
            .iter()
            .find(|r| r.pool == p.pools[pool].name)
        {
            report.status = RefineStatus::Skipped {
                reason: format!(
                    "capacity is reserved for gang `{}`, which the integer program does not model",
                    r.workload
                ),
            };
            reports.push((pool, report));
            continue;
        }
        if let Some(w) = incumbent.workloads.iter().find(|w| {
            matches!(
                &w.outcome,
                crate::decision::Outcome::Preempt {
                    reason: crate::decision::PreemptReason::Reservation { .. },
                    ..
                }
            ) && p.workloads.iter().any(|x| {
                x.key.as_pair() == (w.tenant.as_str(), w.name.as_str())
                    && x.pools.first() == Some(&pool)
            })
        }) {
            report.status = RefineStatus::Skipped {
                reason: format!(
                    "`{}/{}` yields to a reservation, which the integer program does not model",
                    w.tenant, w.name
                ),
            };
            reports.push((pool, report));
            continue;
        }
        // The time left, shared evenly by the pools still to do.
        let share = left / (order.len() - i) as u32;
        let states = read.get_or_insert_with(|| incumbent::read(p, &incumbent));
        let caps = window::Caps {
            gangs: budget.gangs,
            nodes: budget.window_nodes,
        };
        let win = match window::build(p, states, keep, pool, caps) {
            Ok(w) => w,
            Err(e) => {
                report.status = RefineStatus::Skipped {
                    reason: e.to_string(),
                };
                reports.push((pool, report));
                continue;
            }
        };
        let f = formulate::formulate(p, &win, states, keep);
        report.gangs = f.gangs() as u32;
        report.running = f.victims() as u32;
        report.nodes = win.nodes.len() as u32;
        report.variables = f.model.vars.len() as u32;
        report.constraints = f.model.constraints.len() as u32;
        if f.model.vars.len() > budget.variables {
            report.status = RefineStatus::Skipped {
                reason: format!(
                    "{} variables, more than the {} a sub-problem may have",
                    f.model.vars.len(),
                    budget.variables
                ),
            };
            reports.push((pool, report));
            continue;
        }
        let limits = backend::Limits {
            nodes: budget.nodes,
            time: share,
        };
        let answer = match backend::solve(&f.model, limits) {
            Ok(a) => a,
            Err(e) => {
                report.status = RefineStatus::Skipped {
                    reason: e.to_string(),
                };
                reports.push((pool, report));
                continue;
            }
        };
        if answer.stop == Stop::TimeLimit {
            reports.push((pool, report));
            continue;
        }
        let start = f.model.objective(&f.model.start);
        let found = f.model.objective(&answer.values);
        let unchanged = match answer.stop {
            Stop::Optimal => RefineStatus::Optimal,
            _ => RefineStatus::NodeLimit,
        };
        // Only a strict gain, beyond the solver's tolerances, is worth a rebuild.
        if found <= start + 1e-6 {
            report.status = unchanged;
            reports.push((pool, report));
            continue;
        }
        let directive = directive(p, states, keep, &f, pool, &answer.values);
        report.status = match heuristic::solve_directed(p, &directive, incumbent.bound) {
            Err(e) => RefineStatus::Rejected {
                reason: e.to_string(),
            },
            Ok(d) if d.objective > incumbent.objective + 1e-6 => {
                let gain = round6(d.objective - incumbent.objective);
                incumbent = d;
                read = None;
                improved = true;
                RefineStatus::Improved { gain }
            }
            Ok(d) => RefineStatus::Rejected {
                reason: format!(
                    "rebuilt, the decision is worth {} against {}",
                    d.objective, incumbent.objective
                ),
            },
        };
        reports.push((pool, report));
    }
    incumbent.method = if improved {
        Method::Refined
    } else {
        Method::Heuristic
    };
    for (pool, report) in reports {
        if let Some(r) = incumbent
            .pools
            .iter_mut()
            .find(|r| r.pool == p.pools[pool].name)
        {
            r.refinement = Some(report);
        }
    }
    incumbent
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// The whole decision as the rebuild must make it: the incumbent's admissions and preemptions
/// in exclusive pools outside the window, as they are, its waiting gangs there held from
/// preempting, then the window's answer. (Shared pools are left to the cycle's queue, which
/// decides them as it did.)
fn directive(
    p: &Problem,
    states: &[incumbent::State],
    keep: &heuristic::KeepPhase,
    f: &formulate::Formulation,
    pool: usize,
    values: &[f64],
) -> Directive {
    let (window_admit, window_preempt, hold) = f.read(pool, values);
    let decided: std::collections::BTreeSet<usize> = f.workloads().collect();
    let exclusive = |pl: usize| p.pools[pl].sharing == tessera_compiler::model::Sharing::Exclusive;
    let mut d = Directive::default();
    for (w, st) in states.iter().enumerate() {
        if decided.contains(&w) {
            continue;
        }
        match st {
            incumbent::State::Admitted(pl, _) if exclusive(pl.pool) => {
                d.admit.push(incumbent::admission(w, pl));
            }
            incumbent::State::Preempted if keep.kept[w] && exclusive(p.workloads[w].pools[0]) => {
                d.preempt.push(w);
            }
            // Left waiting by the incumbent (by an earlier pool's program, it may be): the
            // queue may still admit it where room is free, but not by preempting, which would
            // undo that program's choice.
            incumbent::State::Pending
                if !p.workloads[w].is_running()
                    && p.workloads[w]
                        .pools
                        .first()
                        .is_some_and(|&pl| exclusive(pl)) =>
            {
                d.hold.push(w);
            }
            _ => {}
        }
    }
    d.admit.extend(window_admit);
    d.preempt.extend(window_preempt);
    d.hold.extend(hold);
    // In the order of the cycle's queue: highest priority first, then the gangs the incumbent
    // admitted within their guarantee, then the earliest. Which of a tenant's gangs is
    // admitted first decides which takes its guarantee: in another order the next pool's
    // program would hold a different gang to its replicas as an entitlement.
    d.admit.sort_by_cached_key(|a| {
        let wl = &p.workloads[a.workload];
        let guaranteed = matches!(states[a.workload], incumbent::State::Admitted(_, true));
        let submitted = match wl.phase {
            crate::problem::Phase::Pending { submitted_at } => submitted_at,
            crate::problem::Phase::Running { .. } => 0,
        };
        (
            -p.classes[wl.class].priority,
            !guaranteed,
            submitted,
            wl.key.clone(),
        )
    });
    d.preempt.sort_unstable();
    d
}
