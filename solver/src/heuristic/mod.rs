//! The fast greedy cycle: a valid [`Decision`] on its own, and the warm start and fallback of the
//! integer programs (`ilp`), which rebuild their answers through its checks and placement.
//!
//! (a) Keep every running workload that may stay (those whose tenant's limit no longer allows
//! them are preempted when preemptible). (b) Repeatedly pick the next pending workload: priority
//! desc, within-guarantee before borrowing, borrowed dominant share / weight asc, submission
//! time, tenant and name. (c) Place its gang all-or-nothing (at least `minMember`, up to `replicas`),
//! on the node and GPU that fragment the pool least for the workload mix of the decision
//! (FGD's measure, then the hosting capacity destroyed, then best fit: see `fragmentation.rs`),
//! domains best-fit so that whole domains stay free; MIG instances come from free instances,
//! else from re-laying out a GPU into one of the pool's layouts around its busy instances,
//! within the per-GPU change budget. (d) When it does not fit, preempt the cheapest sufficient
//! set of allowed victims. (e) Explain everything left waiting.
//!
//! Choices a reader should know:
//!
//! - A running workload is *within guarantee* when its tenant's usage (descendants included),
//!   counting running work by priority desc then start time, had not reached the guarantee
//!   before it; a workload that straddles the guarantee counts as within it (protected).
//! - Victims: only preemptible classes past their `minRuntime`; a requester within its
//!   guarantee may reclaim other tenants' borrowed work of any priority, or take lower-priority
//!   work (it then takes no more replicas than its guarantee covers); a borrower may only take
//!   lower-priority borrowed work. Victims are looked for in the requester's pool (within the subtree whose
//!   limit refused it, when a limit did). One sufficient victim with the fewest GPUs, then the
//!   least lost work, then the lowest priority; otherwise a set grown borrowed-first and
//!   lowest-tier-first, then pruned.
//! - A non-preemptible workload stays even when a policy change lowered its tenant's limit
//!   below its usage (invariant 4 over invariant 3 for work already running); a preemptible one
//!   is preempted (`OverLimit`).
//! - New work goes only to healthy GPUs of healthy nodes; running work on degraded or lost
//!   GPUs is kept (the reconciler decides about hardware), as is running work whose isolation
//!   or trust domain a policy change made invalid.
//! - The reconfiguration budget: a GPU changes geometry at most `maxPerGpuPerHour` times,
//!   counting this decision's changes and, for a change that takes something away (destroys an
//!   instance or resets the GPU into MIG mode), the ones the snapshot records for it in the
//!   hour before `now` (`spent`). Only such changes are recorded; laying instances out on free
//!   slices, or completing an interrupted change, is never barred by the past.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;

use tessera_compiler::compiled::Amounts;
use tessera_compiler::mig::{self, Placement};
use tessera_compiler::model::{ReconfigurationRecord, Sharing, TopologyMode};
use tessera_compiler::units::Gpus;

use crate::decision::{
    Decision, FORMAT_VERSION, GeometryPlan, Instance, Method, Outcome, PoolAttempt, PoolReport,
    PreemptReason, Protected, Reason, ReplicaBinding, Resource, TenantUsage, WorkloadDecision,
};
use crate::problem::{Demand, Exclusion, OrphanCause, Phase, Problem, Slot};
use crate::quota::{self, Ledger};

// The integer program's replay builds its decision with this cycle's own steps, so it lives
// beside the ILP but is a child of this module, which keeps the cycle's internals private.
mod replay;
pub(crate) use replay::{Admission, Directive, KeepPhase, solve_directed};

// Reservations read and write the cycle's internals as its own steps do.
mod reserve;
pub(crate) use preempt::cost_order;
pub(crate) use reserve::Hold;

mod assemble;
mod fleet;
mod fragmentation;
mod journal;
mod offers;
mod open;
mod outclass;
mod pick;
mod preempt;
mod protected;
mod queue;
mod reclaim_scan;
#[cfg(debug_assertions)]
mod scratch;
use crate::cow::CowVec;
pub use assemble::solve;
pub(crate) use assemble::*;
pub(crate) use fleet::*;
use fragmentation::*;
use journal::*;
use offers::*;
use open::*;
use outclass::Outclass;
use pick::*;
use preempt::*;
use protected::*;
pub(crate) use queue::*;

/// Per-workload status while solving.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Status {
    Keep,
    Admit { guaranteed: Gpus, borrowed: Gpus },
    Preempt(PreemptReason),
    Pending(Reason),
}

/// A queue key without its workload key (tenant and name, the workload's).
pub(crate) type Key = (i64, bool, SharePath, i64);

/// A tenant's fair share down the tree ([`Ledger::fair_share_path`]), shared by the keys of
/// its waiting workloads.
pub(crate) type SharePath = Rc<[u64]>;

/// A ledger change: (tenant, pool, amount, added or removed).
pub(crate) type Delta = (usize, usize, Amounts, bool);

/// One pick of the queue loop, in order. An arrival is ordered against these later (see
/// `session.rs`): its own key at each pick depends on the ledger changes of the admissions
/// before it, which are kept here.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) w: usize,
    pub(crate) key: Key,
    /// What its admission changed in the ledger: (tenant, pool, amount, added); empty when it
    /// was left waiting.
    pub(crate) deltas: Vec<Delta>,
    /// The workloads its admission preempted.
    pub(crate) victims: Vec<usize>,
}

/// The state of a cycle that outlives it: what a session keeps between events.
#[derive(Debug, Clone)]
pub(crate) struct Parts {
    pub(crate) fleet: Fleet,
    pub(crate) ledger: Ledger,
    pub(crate) status: Vec<Option<Status>>,
    pub(crate) within_guarantee: Vec<bool>,
    pub(crate) trace: Vec<Step>,
    pub(crate) running_by_pool: Vec<Vec<Running>>,
    pub(crate) by_cost: Vec<Option<Rc<[u32]>>>,
    pub(crate) holds: Vec<Hold>,
}

pub(crate) struct Solver<'p> {
    p: &'p Problem,
    pub(crate) fleet: Fleet,
    pub(crate) ledger: Ledger,
    pub(crate) status: Vec<Option<Status>>,
    /// Running workloads within their tenant's guarantee (at the start of the cycle).
    pub(crate) within_guarantee: Vec<bool>,
    /// The queue loop's picks, in order.
    pub(crate) trace: Vec<Step>,
    /// The victims of the last successful `preempt_for`, for the trace.
    victims: Vec<usize>,
    /// Running workloads of the snapshot per pool, by index: the only possible victims. The
    /// preemption search scans them instead of every workload (a fifth of them on the
    /// reference fleet's training pool). By index, so by tenant and name.
    running_by_pool: Vec<Vec<Running>>,
    /// Per pool, its running workloads cheapest to preempt first, once a search walked them
    /// (`Solver::by_cost`).
    by_cost: Vec<Option<Rc<[u32]>>>,
    /// The last refusal of a borrower with no allowed victim, by (pool, scope, priority), with
    /// the tenants it does not hold for. A borrower's candidates depend on nothing else but the
    /// running workloads' statuses, which only a preemption changes (it clears this), and on
    /// its tenant only through that tenant's own lower-priority work within guarantee, which it
    /// may displace: a queue of borrowers blocked behind the same protected work scans it once.
    refused: Option<(RefusalKey, BTreeSet<usize>, Refusal)>,
    /// The same for a requester within its guarantee, with the tenants whose own borrowed
    /// work it found protected only because it was their own: the refusal holds for a
    /// requester of any such tenant (none, mostly: a full pool of non-preemptible serving work
    /// refuses every requester alike), and as long as the statuses stay (until a preemption).
    refused_guaranteed: Option<(RefusalKey, BTreeSet<usize>, Refusal)>,
    /// The pool's candidates classified for requesters within their guarantee of one
    /// (pool, scope, priority), kept across their searches (`reclaim_scan.rs`).
    reclaim_scan: Option<reclaim_scan::ReclaimScan>,
    /// Workloads admitted only where they fit without preemption (an integer program found
    /// preempting for them not worth it; see `replay.rs`).
    pub(crate) hold: Vec<bool>,
    /// Capacity held for waiting gangs so far in this cycle, in pick order (see `reserve.rs`).
    pub(crate) holds: Vec<Hold>,
    /// Tenants by name, built on the first refusal that names one ([`Solver::tenant_named`]).
    tenant_index: std::cell::OnceCell<HashMap<&'p str, usize>>,
    /// Each tenant's rank by name, built on the first preemption search ([`Solver::tenant_ranks`]).
    tenant_ranks: std::cell::OnceCell<Rc<[u32]>>,
    /// The protected lists written so far, by the candidates they list ([`Solver::listed`]).
    listed: protected::Listed,
}

/// What a borrower's refusal depends on besides the statuses and its tenant: (pool, scope,
/// priority).
type RefusalKey = (usize, Option<usize>, i64);

/// A refused preemption: the protected workloads listed, and how many there were.
type Refusal = (Arc<[Protected]>, usize);

/// A running workload of the snapshot, with what the preemption search reads of it to tell
/// whether it may be a victim (kept beside it: the search tests tens of thousands of
/// candidates per gang on a 50,000-GPU fleet, and reading each one's workload cost a cache miss
/// or two apiece).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Running {
    pub(crate) workload: usize,
    pub(crate) tenant: usize,
    pub(crate) class: usize,
    pub(crate) started_at: i64,
}

impl Running {
    /// Running workload `w` of `p`; `None` when it is not running.
    pub(crate) fn of(p: &Problem, w: usize) -> Option<Running> {
        let wl = &p.workloads[w];
        match wl.phase {
            Phase::Running { started_at, .. } => Some(Running {
                workload: w,
                tenant: wl.tenant,
                class: wl.class,
                started_at,
            }),
            Phase::Pending { .. } => None,
        }
    }
}

pub(crate) fn pool_of(p: &Problem, w: usize) -> usize {
    p.workloads[w].pools[0]
}

impl<'p> Solver<'p> {
    pub(crate) fn new(p: &'p Problem) -> Self {
        let fleet = Fleet::with(p, |fleet| {
            for (w, wl) in p.workloads.iter().enumerate() {
                if let Phase::Running { slots, .. } = &wl.phase {
                    for s in slots {
                        fleet.occupy(p, w, placed_of(p, w, s));
                    }
                }
            }
        });
        let mut running_by_pool = vec![Vec::new(); p.pools.len()];
        for w in 0..p.workloads.len() {
            if let Some(run) = Running::of(p, w) {
                running_by_pool[pool_of(p, w)].push(run);
            }
        }
        Solver {
            p,
            fleet,
            ledger: Ledger::new(p),
            status: vec![None; p.workloads.len()],
            within_guarantee: vec![false; p.workloads.len()],
            trace: Vec::new(),
            victims: Vec::new(),
            running_by_pool,
            by_cost: vec![None; p.pools.len()],
            refused: None,
            refused_guaranteed: None,
            reclaim_scan: None,
            hold: vec![false; p.workloads.len()],
            holds: Vec::new(),
            tenant_index: std::cell::OnceCell::new(),
            tenant_ranks: std::cell::OnceCell::new(),
            listed: protected::Listed::default(),
        }
    }

    pub(crate) fn from_parts(p: &'p Problem, parts: Parts) -> Self {
        Solver {
            p,
            fleet: parts.fleet,
            ledger: parts.ledger,
            status: parts.status,
            within_guarantee: parts.within_guarantee,
            trace: parts.trace,
            victims: Vec::new(),
            running_by_pool: parts.running_by_pool,
            by_cost: parts.by_cost,
            refused: None,
            refused_guaranteed: None,
            reclaim_scan: None,
            hold: vec![false; p.workloads.len()],
            holds: parts.holds,
            tenant_index: std::cell::OnceCell::new(),
            tenant_ranks: std::cell::OnceCell::new(),
            listed: protected::Listed::default(),
        }
    }

    pub(crate) fn into_parts(self) -> Parts {
        Parts {
            fleet: self.fleet,
            ledger: self.ledger,
            status: self.status,
            within_guarantee: self.within_guarantee,
            trace: self.trace,
            running_by_pool: self.running_by_pool,
            by_cost: self.by_cost,
            holds: self.holds,
        }
    }

    /// (a) Running workloads, highest priority and oldest first, stay while their tenant's limit
    /// allows them; the part of each tenant's work up to its guarantee is protected.
    fn keep_running(&mut self) {
        let p = self.p;
        // Ordered by (priority, start, key), the key compared as (tenant's rank, name). The
        // numbers are read once into the list: a comparison that read each workload again
        // missed the cache twice per step of sorting 65,000 at 50,000 GPUs. The names are
        // compared only within a run of equal numbers, which is one tenant's.
        let ranks = self.tenant_ranks();
        let mut running: Vec<(i64, i64, u32, usize)> = (0..p.workloads.len())
            .filter_map(|w| {
                let wl = &p.workloads[w];
                let Phase::Running { started_at, .. } = wl.phase else {
                    return None;
                };
                let prio = -p.classes[wl.class].priority;
                Some((prio, started_at, ranks[wl.tenant], w))
            })
            .collect();
        running.sort_unstable_by_key(|&(prio, started, rank, _)| (prio, started, rank));
        for tie in running.chunk_by_mut(|a, b| (a.0, a.1, a.2) == (b.0, b.1, b.2)) {
            if tie.len() > 1 {
                tie.sort_unstable_by(|a, b| {
                    p.workloads[a.3].key.name.cmp(&p.workloads[b.3].key.name)
                });
            }
        }
        for (_, _, _, w) in running {
            let wl = &p.workloads[w];
            let pool = pool_of(p, w);
            let amount = wl.amount(wl.replicas);
            let before = self.ledger.usage(wl.tenant, pool).gpus;
            self.within_guarantee[w] = before < Ledger::guarantee(p, wl.tenant, pool);
            if !self.ledger.within_limits(p, wl.tenant, pool, amount)
                && p.classes[wl.class].preemptible
            {
                self.fleet.release(p, w, true);
                self.status[w] = Some(Status::Preempt(PreemptReason::OverLimit {
                    tenant: p.tenants[wl.tenant].name.clone(),
                    pool: p.pools[pool].name.clone(),
                }));
                continue;
            }
            // A non-preemptible workload stays even above a lowered limit (invariant 4 wins).
            self.ledger.add(p, wl.tenant, pool, amount);
            self.status[w] = Some(Status::Keep);
        }
    }

    /// The cycle, (a) to (e). Returns what step (a) kept ([`KeepPhase`]): the integer program's
    /// windows read it, and a cycle that refined ran step (a) a second time for it.
    pub(crate) fn run(&mut self) -> KeepPhase {
        self.keep_running();
        let keep = KeepPhase {
            kept: self
                .status
                .iter()
                .map(|st| matches!(st, Some(Status::Keep)))
                .collect(),
            within_guarantee: self.within_guarantee.clone(),
        };
        let queue: Vec<usize> = (0..self.p.workloads.len())
            .filter(|&w| !self.p.workloads[w].is_running())
            .collect();
        self.run_queue(queue);
        keep
    }

    /// (b)-(d) for every workload not decided yet (after steps decided first, as a replay of
    /// the integer program's answer does).
    pub(crate) fn run_undecided(&mut self) {
        let queue: Vec<usize> = (0..self.p.workloads.len())
            .filter(|&w| self.status[w].is_none())
            .collect();
        self.run_queue(queue);
    }

    /// (b)-(d) for `queue`, picked in key order; each pick is recorded in `trace`.
    pub(crate) fn run_queue(&mut self, queue: Vec<usize>) {
        let p = self.p;
        self.forget_refusals();
        // A key depends on the ledger alone, which only an admission changes (`admit` replaces
        // it right before returning `Admit`): keys move after admissions, not after every
        // workload left waiting (see `pick.rs`).
        let mut picker = Picker::new(p, &self.ledger, &queue);
        #[cfg(debug_assertions)]
        let mut waiting = queue;
        while let Some((w, key)) = picker.pop() {
            #[cfg(debug_assertions)]
            scan_agrees(p, &self.ledger, &mut waiting, w, &key);
            let mut status = self.admit(w);
            if let Status::Pending(reason) = &status
                && let Some(s) = self.reserve(w, reason)
            {
                status = s;
            }
            let admitted = matches!(status, Status::Admit { .. });
            self.status[w] = Some(status);
            let (deltas, victims) = if admitted {
                self.admission_deltas(w)
            } else {
                (Vec::new(), Vec::new())
            };
            if admitted {
                picker.rekey(p, &self.ledger, &deltas);
            }
            self.trace.push(Step {
                w,
                key,
                deltas,
                victims,
            });
        }
    }

    /// Forgets the refusals remembered (see `refused`): a preemption changed the statuses
    /// they depend on.
    pub(crate) fn forget_refusals(&mut self) {
        self.refused = None;
        self.refused_guaranteed = None;
        self.reclaim_scan = None;
    }

    /// The ledger changes of admitting `w` (its victims released, itself added), and the
    /// victims.
    pub(crate) fn admission_deltas(&mut self, w: usize) -> (Vec<Delta>, Vec<usize>) {
        let p = self.p;
        let wl = &p.workloads[w];
        let victims = std::mem::take(&mut self.victims);
        let mut deltas: Vec<_> = victims
            .iter()
            .map(|&v| {
                let vl = &p.workloads[v];
                (vl.tenant, pool_of(p, v), vl.amount(vl.replicas), false)
            })
            .collect();
        if let Some(slots) = &self.fleet.placed[w]
            && let Some(pool) = slots.first().and_then(|s| p.nodes[s.node].pool)
        {
            deltas.push((wl.tenant, pool, wl.amount(slots.len() as u32), true));
        }
        (deltas, victims)
    }

    /// Tries each pool without preemption, then with, away from the capacity reservations
    /// hold for gangs `w` may not backfill; the status of `w`.
    pub(crate) fn admit(&mut self, w: usize) -> Status {
        let barring = reserve::barring(self, w);
        if barring.is_empty() {
            return self.admit_anywhere(w);
        }
        self.fleet.barred = Some(reserve::barred_nodes(self, &barring));
        let status = self.admit_anywhere(w);
        self.fleet.barred = None;
        match status {
            Status::Pending(reason) => Status::Pending(self.reserved_reason(w, &barring, reason)),
            other => other,
        }
    }

    /// [`Self::admit`] on the fleet as it is.
    fn admit_anywhere(&mut self, w: usize) -> Status {
        let p = self.p;
        let wl = &p.workloads[w];
        if wl.pools.is_empty() {
            return Status::Pending(no_pool_reason(p, w));
        }
        let mut attempts = Vec::new();
        // Of the pools that take it, the one where it breaks the fewest only-home replicas,
        // then leaves the fewest GPUs unfed for CPU, then is not kept for last (a pool with a
        // node none of the others matches, by how many of them it outclasses: `outclass.rs`),
        // then fragments least (FGD's whole-point score against each pool's mix, summed over
        // the nodes it lands on), then the least versatile (the one that could host the
        // fewest of the fleet's running replicas), then the first listed. A pool that runs
        // out of CPU next to idle GPUs, or the most capable pool, must not be filled first
        // only because it is listed first, or because small work scored a point better there.
        if let [pool] = wl.pools[..] {
            // One pool: nothing to compare, so the gang is placed on the solver's own fleet.
            match admit_on(p, &mut self.fleet, &mut self.ledger, w, pool, wl.replicas) {
                Ok((guaranteed, borrowed)) => {
                    return Status::Admit {
                        guaranteed,
                        borrowed,
                    };
                }
                Err(r) => attempts.push((pool, r)),
            }
        } else {
            // Each pool's placement is written on the solver's own fleet under a mark,
            // measured, and undone, its writes kept while it is the best; the best is written
            // again (`journal.rs`). A clone of the fleet per pool cost the fleet's size.
            let mix = Rc::clone(&self.fleet.mix);
            let least = wl.pools.iter().map(|&q| mix.versatility(q)).min();
            let outclass = Rc::clone(&self.fleet.outclass);
            let outclassing: Vec<u64> = wl
                .pools
                .iter()
                .map(|&q| outclass.rank(q, &wl.pools))
                .collect();
            let least_outclassing = outclassing.iter().copied().min();
            let mut best: Option<(PoolKey, usize, Redo)> = None;
            for (&pool, &outclassing) in wl.pools.iter().zip(&outclassing) {
                let placed =
                    quota_allows(p, &self.ledger, w, pool, wl.replicas).and_then(|(want, min)| {
                        let mark = self.fleet.mark();
                        match self.fleet.place_gang(p, w, pool, want, min) {
                            Ok(()) => Ok(mark),
                            Err(r) => {
                                self.fleet.rollback(mark);
                                Err(r)
                            }
                        }
                    });
                match placed {
                    Ok(mark) => {
                        let nodes = nodes_of(&self.fleet, w);
                        let after = tier_reading(p, &self.fleet, pool, &nodes);
                        let redo = self.fleet.rollback_keeping(mark);
                        let before = tier_reading(p, &self.fleet, pool, &nodes);
                        let (tier, unfed, lost) = placement_tier(&mix, pool, &before, &after);
                        let versatility = mix.versatility(pool);
                        let key = (lost, unfed, outclassing, tier, versatility);
                        if best.as_ref().is_none_or(|b| key < b.0) {
                            best = Some((key, pool, redo));
                        }
                        // Breaks no only-home replica, leaves nothing unfed and fragments
                        // nothing, in a pool kept for last the least and least versatile:
                        // taken without trying the pools after it.
                        if (lost, unfed, tier) == (0, 0, 0)
                            && Some(outclassing) == least_outclassing
                            && Some(versatility) == least
                        {
                            break;
                        }
                    }
                    Err(r) => attempts.push((pool, r)),
                }
            }
            if let Some((_, pool, redo)) = best {
                self.fleet.redo(redo);
                let (guaranteed, borrowed) = book(p, &self.fleet, &mut self.ledger, w, pool);
                return Status::Admit {
                    guaranteed,
                    borrowed,
                };
            }
        }
        // Releasing victims frees room and quota alike (the root's limit is the pool).
        let preempting = if self.hold[w] { 0 } else { attempts.len() };
        for (pool, reason) in attempts.iter_mut().take(preempting) {
            // A limit refused at tenant X: only X's subtree can give quota back.
            let scope = match reason {
                Reason::QuotaExceeded { tenant, .. } | Reason::PoolFull { tenant, .. } => {
                    self.tenant_named(tenant)
                }
                _ => None,
            };
            match self.preempt_for(w, *pool, scope) {
                Ok(status) => return status,
                Err((protected, protected_total)) if protected_total > 0 => {
                    // Moved, not cloned: the placeholder allocates nothing.
                    let capacity = std::mem::replace(
                        reason,
                        Reason::NoPool {
                            attempts: Vec::new(),
                        },
                    );
                    *reason = Reason::PreemptionNotAllowed {
                        pool: p.pools[*pool].name.clone(),
                        capacity: Box::new(capacity),
                        protected,
                        protected_total,
                    };
                }
                Err(_) => {}
            }
        }
        if attempts.len() == 1 {
            return Status::Pending(attempts.remove(0).1);
        }
        Status::Pending(Reason::Pools {
            attempts: attempts
                .into_iter()
                .map(|(pool, r)| PoolAttempt {
                    pool: p.pools[pool].name.clone(),
                    reason: r.to_string(),
                })
                .collect(),
        })
    }

    /// The tenant named `name` (the first so named, as the policy lists them): a refusal names
    /// its tenant, and a fleet has a thousand of them.
    fn tenant_named(&self, name: &str) -> Option<usize> {
        let p = self.p;
        self.tenant_index
            .get_or_init(|| {
                let mut index = HashMap::with_capacity(p.tenants.len());
                for (i, t) in p.tenants.iter().enumerate() {
                    index.entry(t.name.as_str()).or_insert(i);
                }
                index
            })
            .get(name)
            .copied()
    }

    /// Each tenant's rank by name (equal names share one): a workload's key orders as (its
    /// tenant's rank, its name), since its key's tenant is its tenant's name. The preemption
    /// search orders thousands of protected candidates by key per search; most differ in
    /// tenant, and comparing names cost a third of a cycle on a 50,000-GPU fleet.
    pub(crate) fn tenant_ranks(&self) -> Rc<[u32]> {
        let p = self.p;
        Rc::clone(self.tenant_ranks.get_or_init(|| {
            let mut by_name: Vec<usize> = (0..p.tenants.len()).collect();
            by_name.sort_by(|&a, &b| p.tenants[a].name.cmp(&p.tenants[b].name));
            let mut ranks = vec![0u32; p.tenants.len()];
            let mut rank = 0u32;
            for (i, &t) in by_name.iter().enumerate() {
                if i > 0 && p.tenants[by_name[i - 1]].name != p.tenants[t].name {
                    rank += 1;
                }
                ranks[t] = rank;
            }
            ranks.into()
        }))
    }

    /// A what-if: the fleet and ledger with `victims`, running in `pool`, released (drains
    /// recorded on the fleet returned). Only the debug builds' search from scratch
    /// (`scratch.rs`) still clones: the cycle's what-ifs roll back an undo journal.
    #[cfg(debug_assertions)]
    pub(crate) fn without(&self, pool: usize, victims: &[usize]) -> (Fleet, Ledger) {
        let p = self.p;
        let mut fleet = self.fleet.clone();
        let mut ledger = self.ledger.clone();
        for &v in victims {
            let vl = &p.workloads[v];
            fleet.release(p, v, true);
            ledger.remove(p, vl.tenant, pool, vl.amount(vl.replicas));
        }
        (fleet, ledger)
    }

    /// Whether borrowed work `v`, of the requester's priority, may yield to borrower `w` by fair
    /// share: `v` is another tenant's, its side borrows, and with `w`'s smallest gang admitted
    /// and `v` gone the requester's side holds no more per unit of weight than `v`'s. `Ok` with
    /// a rank: from `v`'s side down to its tenant, each level's share, highest first when
    /// sorted (so that work is taken from the most over-served side, and within it from the
    /// most over-served subtree); `Err` when the shares forbid it; `None` when the rule does
    /// not apply (same tenant, or one tenant's ancestor).
    fn fairly_yields(&self, w: usize, v: usize, pool: usize) -> Option<Result<Vec<u64>, ()>> {
        let p = self.p;
        let (wl, vl) = (&p.workloads[w], &p.workloads[v]);
        let (a, b) = quota::sides(p, wl.tenant, vl.tenant)?;
        let none = Amounts::default();
        let theirs_before = self.ledger.borrowed_share(p, b, pool, none, none)?;
        let mine = self
            .ledger
            .borrowed_share(p, a, pool, wl.amount(wl.min_member), none)?;
        let theirs = self
            .ledger
            .borrowed_share(p, b, pool, none, vl.amount(vl.replicas))?;
        Some(if theirs_before > 0.0 && at_most(mine, theirs) {
            let lineage = &p.tenants[vl.tenant].lineage;
            let down = lineage
                .iter()
                .position(|&t| t == b)
                .expect("b is on v's path");
            Ok(lineage[..=down]
                .iter()
                .rev()
                .map(|&t| {
                    let s = self.ledger.borrowed_share(p, t, pool, none, none);
                    u64::MAX - (s.unwrap_or(0.0) * 1e9).round() as u64
                })
                .collect())
        } else {
            Err(())
        })
    }
}

/// Debug builds: the pick `w` (key `key`) is the one a scan of the whole queue (`waiting`,
/// in queue order) for the first least key, every key computed afresh, takes; `w` leaves
/// `waiting`.
#[cfg(debug_assertions)]
fn scan_agrees(p: &Problem, ledger: &Ledger, waiting: &mut Vec<usize>, w: usize, key: &Key) {
    let keys = queue_keys(p, ledger, waiting);
    let (i, least) = keys
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.cmp(b.1))
        .expect("a pick comes from a non-empty queue");
    let (priority, borrows, share, submitted, _) = least;
    assert_eq!(
        (waiting[i], (*priority, *borrows, share.clone(), *submitted)),
        (w, key.clone()),
        "the queue's pick differs from the scan's"
    );
    waiting.remove(i);
}

/// The nodes `w` holds, each once, in order.
fn nodes_of(fleet: &Fleet, w: usize) -> Vec<usize> {
    let mut nodes: Vec<usize> = fleet.placed[w]
        .as_ref()
        .map_or_else(Vec::new, |slots| slots.iter().map(|s| s.node).collect());
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

/// What [`placement_tier`] reads of `nodes` of `pool` on `fleet`: each one's measure against
/// the pool's mix and the GPU units it leaves unfed for CPU (none when the pool's mix scores
/// nothing).
fn tier_reading(p: &Problem, fleet: &Fleet, pool: usize, nodes: &[usize]) -> Vec<(Measure, i64)> {
    if !fleet.mix.scores(pool) {
        return Vec::new();
    }
    nodes
        .iter()
        .map(|&n| (fleet.measure(p, pool, n, None), fleet.unfed_at(p, n)))
        .collect()
}

/// A pool's placement key in [`Solver::admit_anywhere`], lower is better: the only-home
/// replicas broken, the unfed GPUs, the pool's rank among the workload's pools
/// ([`Outclass::rank`]), the tier, the pool's versatility.
type PoolKey = (u64, i64, u64, u64, u64);

/// How much placing a workload in `pool` fragments the nodes it lands on, from their readings
/// before and after ([`tier_reading`]): `100 −` FGD's whole-point score of each such node
/// against the pool's mix, summed; then the GPU units it leaves unfed for CPU on them, summed
/// and in whole GPUs ([`Fleet::unfed_at`], [`whole_gpus`]; negative where it feeds some); then
/// the replicas of the pool's
/// only-home shapes they could host before and no longer after, summed
/// ([`Measure::only_home`]). `(0, 0, 0)` (the best) when nothing runs in the fleet: there is
/// no mix to score against. A pool where nothing runs is scored against the fleet's mix
/// (`fragmentation.rs`), so it is not every placement's first choice.
fn placement_tier(
    mix: &Mix,
    pool: usize,
    before: &[(Measure, i64)],
    after: &[(Measure, i64)],
) -> (u64, i64, u64) {
    let (tier, unfed, lost) = before
        .iter()
        .zip(after)
        .map(|(&(b, unfed_b), &(a, unfed_a))| {
            (
                u64::from(mix.cost(pool, b, a).0),
                unfed_a - unfed_b,
                b.only_home.saturating_sub(a.only_home),
            )
        })
        .fold((0, 0, 0), |(t, u, l), (tier, unfed, lost)| {
            (t + tier, u + unfed, l + lost)
        });
    (tier, whole_gpus(unfed), lost)
}

/// The replicas of `w` the quota allows in `pool`: `(want, min)`, the most up to `cap` that
/// the limits and the borrowing rules allow, and the gang's smallest; why not, when not `min`.
fn quota_allows(
    p: &Problem,
    ledger: &Ledger,
    w: usize,
    pool: usize,
    cap: u32,
) -> Result<(u32, u32), Reason> {
    let wl = &p.workloads[w];
    let min = wl.min_member;
    ledger.check_limit(p, wl.tenant, pool, wl.amount(min))?;
    let mut want = min;
    for n in (min..=cap.clamp(min, wl.replicas)).rev() {
        if ledger.within_limits(p, wl.tenant, pool, wl.amount(n)) {
            want = n;
            break;
        }
    }
    let borrow_ok = |n: u32| borrow_allows(p, ledger, w, pool, n);
    borrow_ok(min)?;
    while want > min && borrow_ok(want).is_err() {
        want -= 1;
    }
    Ok((want, min))
}

/// Places `w` on `pool` (from `min` up to `want` replicas) and books it: the (guaranteed,
/// borrowed) split of what was admitted. On `Err` neither the fleet nor the ledger changed.
fn place_and_book(
    p: &Problem,
    fleet: &mut Fleet,
    ledger: &mut Ledger,
    w: usize,
    pool: usize,
    (want, min): (u32, u32),
) -> Result<(Gpus, Gpus), Reason> {
    fleet.place_gang(p, w, pool, want, min)?;
    Ok(book(p, fleet, ledger, w, pool))
}

/// Books on `ledger` what `w` holds on `fleet` in `pool`: the (guaranteed, borrowed) split.
fn book(p: &Problem, fleet: &Fleet, ledger: &mut Ledger, w: usize, pool: usize) -> (Gpus, Gpus) {
    let wl = &p.workloads[w];
    let placed = fleet.placed[w].as_ref().map_or(0, |v| v.len() as u32);
    let amount = wl.amount(placed);
    let split = ledger.split(p, wl.tenant, pool, amount.gpus);
    ledger.add(p, wl.tenant, pool, amount);
    split
}

/// Quota, then placement, of `w` on `pool`, written on the solver's own fleet and ledger: the
/// (guaranteed, borrowed) split of what was admitted. On `Err` nothing changed.
fn admit_on(
    p: &Problem,
    fleet: &mut Fleet,
    ledger: &mut Ledger,
    w: usize,
    pool: usize,
    cap: u32,
) -> Result<(Gpus, Gpus), Reason> {
    let replicas = quota_allows(p, ledger, w, pool, cap)?;
    place_and_book(p, fleet, ledger, w, pool, replicas)
}

/// A what-if: `w` admitted in `pool` on the fleet and ledger as they stand, the result a copy
/// of both (a pool compared, a preemption search's witness). Placed under marks, copied when
/// admitted, then undone: a what-if that fails costs what it wrote, where a copy of the fleet
/// made first cost the fleet's size (a pointer per chunk) each time.
fn try_pool(
    p: &Problem,
    fleet: &mut Fleet,
    ledger: &mut Ledger,
    w: usize,
    pool: usize,
    cap: u32,
) -> Result<Admitted, Reason> {
    let replicas = quota_allows(p, ledger, w, pool, cap)?;
    let (fm, lm) = (fleet.mark(), ledger.mark());
    let admitted = place_and_book(p, fleet, ledger, w, pool, replicas)
        .map(|(guaranteed, borrowed)| (fleet.clone(), ledger.clone(), guaranteed, borrowed));
    fleet.rollback(fm);
    ledger.rollback(lm);
    admitted
}

fn no_pool_reason(p: &Problem, w: usize) -> Reason {
    let wl = &p.workloads[w];
    let isolation: Vec<String> = wl
        .excluded
        .iter()
        .filter(|(_, e)| matches!(e, Exclusion::Isolation { .. }))
        .map(|(pool, _)| p.pools[*pool].name.clone())
        .collect();
    if !isolation.is_empty() {
        let class = &p.classes[wl.class];
        return Reason::Isolation {
            class: class.name.clone(),
            minimum: class.isolation_minimum,
            pools: isolation,
        };
    }
    Reason::NoPool {
        attempts: wl
            .excluded
            .iter()
            .map(|(pool, e)| PoolAttempt {
                pool: p.pools[*pool].name.clone(),
                reason: match e {
                    Exclusion::Isolation { .. } => unreachable!("handled above"),
                    Exclusion::NoQuota => {
                        format!("tenant `{}` has no quota there", p.tenants[wl.tenant].name)
                    }
                    Exclusion::Shape(s) => s.clone(),
                },
            })
            .collect(),
    }
}
