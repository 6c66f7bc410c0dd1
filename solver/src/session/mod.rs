//! [`Session`]: a cycle that stays, so that one arriving workload is decided against the
//! standing decision instead of re-deciding the whole queue.
//!
//! The greedy cycle ([`crate::heuristic`]) picks pending workloads one at a time by a key that
//! depends on the ledger, and only an admission changes the fleet or the ledger. A session keeps
//! the cycle's end state and its picks in order (each with its key and the ledger changes of its
//! admission). An arrival is then decided exactly as the full cycle on the snapshot plus the
//! arrival would decide it:
//!
//! - Pools split into *components*: the closure of the arrival's pools over the pools of the
//!   queue's workloads. Keys, placements, quota and preemption of a workload read only its own
//!   pools, so the picks of one component do not depend on the others' (nor on how they
//!   interleave), and only the arrival's component matters.
//! - The arrival's key at each earlier pick of its component is recomputed from the ledger
//!   changes of the admissions after that pick, for its tenant and every ancestor (the key
//!   orders borrowers by fair share down the tree). The first pick whose key is larger than
//!   the arrival's is where the full cycle would decide the arrival.
//! - If no admission of the component comes at or after that pick, the fleet and ledger there
//!   are the ones the session holds: the arrival is decided on them. Left waiting, it changes
//!   nothing else. Admitted, it can change what comes after it, so the component's picks after
//!   it are decided again, in key order, as the cycle would.
//! - Otherwise the arrival would be decided before work the cycle admitted, against a fleet the
//!   session no longer has: the answer is [`Admission::NeedsFullCycle`].
//!
//! Agreement: whenever a session answers, every workload's [`WorkloadDecision`] (the arrival's
//! and, through [`Admission::Decided::changed`] and [`Session::decision_for`], every other's) is
//! equal to the one [`crate::solve`] gives on the session's snapshot with every arrival added as
//! pending and every finished workload removed. The decision's pool reports, objective and bound
//! are not maintained.

mod order;

use std::collections::{BTreeMap, BTreeSet};

use tessera_compiler::compiled::Amounts;
use tessera_compiler::model::{ClusterStateSpec, PendingWorkload};
use tessera_compiler::units::{Bytes, Gpus, Millicores};
use tessera_compiler::{CompiledPolicy, WorkloadKey};

use crate::decision::{Decision, GeometryPlan, Method, WorkloadDecision};
use crate::heuristic::{self, Parts, Solver, Status, Step, pool_of, queue_key};
use crate::problem::{Phase, Problem, ProblemError};
use crate::quota::Ledger;
use crate::{SolveError, SolveOptions};

pub use order::{ArrivalOrder, PickKey};

/// Why an event cannot be decided without re-deciding the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FullCycle {
    /// The arrival would be decided before `before`, which the standing decision admits: from
    /// there on the cycle would see another fleet.
    Reorders { before: String },
    /// The arrival takes the key (tenant and name) of a workload the policy commits: which of
    /// the two stands is the full cycle's to decide.
    ReplacesCommitted { name: String },
    /// The finished workload frees capacity in `pool` that waiting, admitted or preempted work of
    /// its component could use.
    FreesCapacity { pool: String },
    /// The finished workload ran, so it counts in the fleet's running mix, which work of the
    /// standing decision that may use pool `pool` is placed by: every pool's nodes are weighed
    /// by the CPU per GPU of the fleet's running work, and a pool where nothing runs is scored
    /// against the whole mix.
    FleetMix { pool: String },
    /// The finished workload was admitted or preempted by the standing decision.
    Decided { name: String },
    /// Pool `pool` of the event's component may hold capacity for waiting gangs: holds are
    /// made, kept and released in queue order by the full cycle alone.
    Reservations { pool: String },
    /// The finished workload ran since the usage record was taken, so its tenant's fair-share
    /// history (or an ancestor's) counts it; without it, the history of `tenant` and of the
    /// tenants above that weigh history changes, and with it the order of the whole queue
    /// below them.
    History { tenant: String },
    /// The standing decision leaves `name` waiting: its reason was given against part of the
    /// admissions, where the next cycle gives it against all of them.
    Waiting { name: String },
    /// The standing decision changes the geometry of GPU `gpu` of node `node`: the next cycle
    /// observes the new one.
    Geometry { node: String, gpu: u32 },
}

impl std::fmt::Display for FullCycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FullCycle::Reorders { before } => {
                write!(
                    f,
                    "it would be decided before `{before}`, which the cycle admitted"
                )
            }
            FullCycle::ReplacesCommitted { name } => {
                write!(f, "`{name}` is also a committed workload")
            }
            FullCycle::FreesCapacity { pool } => {
                write!(
                    f,
                    "it frees capacity in pool `{pool}` that waiting work could use"
                )
            }
            FullCycle::FleetMix { pool } => write!(
                f,
                "it counts in the fleet's running mix, which placements in pool `{pool}` are weighed by"
            ),
            FullCycle::Decided { name } => {
                write!(
                    f,
                    "`{name}` was admitted or preempted by the standing decision"
                )
            }
            FullCycle::Reservations { pool } => {
                write!(f, "pool `{pool}` may hold capacity for waiting gangs")
            }
            FullCycle::History { tenant } => write!(
                f,
                "its run counts in the fair-share history of tenant `{tenant}`"
            ),
            FullCycle::Waiting { name } => {
                write!(f, "`{name}` waits, and would be decided again")
            }
            FullCycle::Geometry { node, gpu } => {
                write!(f, "GPU {gpu} of node `{node}` changes its geometry")
            }
        }
    }
}

/// The answer to an arrival.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    Decided {
        /// The arrival's decision: admitted with its bindings, or pending with its reason.
        decision: Box<WorkloadDecision>,
        /// Other workloads whose decision changed because of it (victims, and waiting work
        /// decided again behind it), by tenant and name.
        changed: Vec<WorkloadDecision>,
        /// The MIG GPUs whose geometry plan changed (a re-layout for an instance, a drain for
        /// a victim), as the full cycle's `geometry` lists them.
        geometry: Vec<GeometryPlan>,
    },
    /// Nothing was changed; run a full cycle (a new session).
    NeedsFullCycle(FullCycle),
}

/// The answer to a removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// Nothing was changed; run a full cycle (a new session).
    NeedsFullCycle(FullCycle),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The arrival is invalid, or its key is taken: the full cycle would fail the same way.
    #[error(transparent)]
    Problem(#[from] ProblemError),
    #[error("no workload `{0}` in the session")]
    Unknown(String),
}

/// A solved cycle kept between events. See the module documentation.
#[derive(Debug, Clone)]
pub struct Session {
    policy: CompiledPolicy,
    problem: Problem,
    /// Always `Some` between calls; taken while a [`Solver`] borrows the problem.
    parts: Option<Parts>,
    /// A ledger with no usage: a pool's within-guarantee flags are counted again on it when a
    /// running workload leaves.
    blank: Ledger,
    /// Workloads of the session by key (finished ones removed), as indices into the problem.
    names: BTreeMap<WorkloadKey, usize>,
    /// An upper bound on the standing decision's objective: the LP bound of the snapshot the
    /// session opened on, plus the most each decided arrival could add (see `bound.rs`).
    bound: Option<f64>,
    /// Per pool, its running workloads in the order the cycle's first step weighs guarantees
    /// ([`guarantee_order`]): built when a pool's guarantees are first counted again, then
    /// kept as runs come and go, so that counting them again walks the pool once rather than
    /// sorting every workload of the session.
    by_guarantee: Vec<Option<Vec<usize>>>,
}

/// An amount that may go below zero while ledger changes are undone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Signed {
    gpus: i64,
    cpu: i128,
    memory: i128,
}

impl Signed {
    fn of(a: Amounts) -> Signed {
        Signed {
            gpus: a.gpus.units(),
            cpu: i128::from(a.cpu.unwrap_or_default().0),
            memory: i128::from(a.memory.unwrap_or_default().0),
        }
    }
    fn add(&mut self, a: Amounts, sign: i64) {
        let s = Signed::of(a);
        self.gpus += sign * s.gpus;
        self.cpu += i128::from(sign) * s.cpu;
        self.memory += i128::from(sign) * s.memory;
    }
    fn amounts(self) -> Amounts {
        let clamp = |x: i128| u64::try_from(x.max(0)).unwrap_or(u64::MAX);
        Amounts {
            gpus: Gpus::from_units(self.gpus.max(0)),
            cpu: Some(Millicores(clamp(self.cpu))),
            memory: Some(Bytes(clamp(self.memory))),
        }
    }
}

/// Arrivals a session has room for when it opens ([`Session::reserve`]): sixteen of the
/// service's largest batches. Past it the tables grow as vectors do, doubling, so a later
/// arrival copies them seldom, not never.
pub const ARRIVAL_ROOM: usize = 256;

impl Session {
    /// Runs the full cycle on `state` and keeps it. The decision is the one [`crate::solve`]
    /// gives.
    pub fn new(
        policy: &CompiledPolicy,
        state: &ClusterStateSpec,
        options: &SolveOptions,
    ) -> Result<(Session, Decision), SolveError> {
        Session::open(policy, state, options).map(|(session, decision, _)| (session, decision))
    }

    /// [`Session::new`], with what the cycle's step (a) kept, for the integer program.
    fn open(
        policy: &CompiledPolicy,
        state: &ClusterStateSpec,
        options: &SolveOptions,
    ) -> Result<(Session, Decision, heuristic::KeepPhase), SolveError> {
        let mut problem = Problem::new(policy, state, options.now)?;
        problem.listing = options.listing;
        let (bound, s, keep) = heuristic::run_with_bound(&problem);
        let (parts, decision, keep) = {
            let d = heuristic::decision(&problem, &s, Method::Heuristic, bound);
            let mut parts = s.into_parts();
            for (order, running) in parts.by_cost.iter_mut().zip(&parts.running_by_pool) {
                order.get_or_insert_with(|| heuristic::cost_order(&problem, running));
            }
            (parts, d, keep)
        };
        let names = problem
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| (w.key.clone(), i))
            .collect();
        let problem_pools = problem.pools.len();
        let mut session = Session {
            policy: policy.clone(),
            blank: Ledger::new(&problem),
            problem,
            parts: Some(parts),
            names,
            bound,
            by_guarantee: vec![None; problem_pools],
        };
        session.reserve(ARRIVAL_ROOM);
        Ok((session, decision, keep))
    }

    /// Makes room for `arrivals` more workloads, so that deciding them grows no table: an
    /// arrival adds an entry to tables as long as the fleet's workloads (70,000 at 50,000
    /// GPUs), and a table at capacity is copied whole to grow, on the arrival path. A session
    /// reserves [`ARRIVAL_ROOM`] when it opens; a clone has no room to spare.
    pub fn reserve(&mut self, arrivals: usize) {
        self.problem.workloads.reserve(arrivals);
        if let Some(parts) = self.parts.as_mut() {
            parts.status.reserve(arrivals);
            parts.within_guarantee.reserve(arrivals);
        }
    }

    /// The cycle [`crate::solve`] runs (the heuristic, then the integer program per pool), and
    /// a session standing for its decision when it can. The decision is `solve`'s, byte for
    /// byte. The session is `None` when the integer program improved the heuristic's decision
    /// in some pool: the session holds the heuristic's end state, so the work it would decide
    /// arrivals against would not be what runs.
    ///
    /// With a session, arrivals are decided as the heuristic cycle would decide them; the
    /// integer program may still improve on that, at the next full cycle.
    pub fn refined(
        policy: &CompiledPolicy,
        state: &ClusterStateSpec,
        options: &SolveOptions,
    ) -> Result<(Decision, Option<Session>), SolveError> {
        let (session, heuristic, keep) = Session::open(policy, state, options)?;
        let decision = crate::ilp::refine(
            &session.problem,
            heuristic,
            &keep,
            crate::ilp::Budget::new(options.time_limit),
        );
        let session = (decision.method == Method::Heuristic).then_some(session);
        Ok((decision, session))
    }

    /// The standing decision whole, as the heuristic cycle on the session's snapshot (with
    /// every arrival added and every finished workload removed) gives it: every workload, the
    /// geometry, usage and pool reports and the objective. The bound is the session's (see
    /// [`Session::bound`]), not the LP solved again: that was chosen when the LP took over a
    /// hundred milliseconds on a fleet of thousands of workloads; solved as a flow it takes
    /// about 20 ms at 12.5× (70,000 workloads), so an exact bound here is now affordable.
    pub fn decision(&mut self) -> Decision {
        let parts = self
            .parts
            .take()
            .expect("parts are put back after each call");
        let p = &self.problem;
        let live: Vec<bool> = p
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| self.names.get(&w.key) == Some(&i))
            .collect();
        let s = Solver::from_parts(p, parts);
        let decision = heuristic::decision_of(p, &s, Method::Heuristic, self.bound, |w| live[w]);
        self.parts = Some(s.into_parts());
        decision
    }

    /// An upper bound on the standing decision's objective. At the start, the LP bound of the
    /// snapshot (the full cycle's); each decided arrival then adds the most it could add to
    /// the LP's optimum (its priority times its GPUs: with it at zero, any solution of the
    /// larger LP is one of the smaller), and a finished workload adds nothing (its removal
    /// only takes options away). Still an upper bound, looser with each arrival; the next
    /// full cycle solves the LP again.
    pub fn bound(&self) -> Option<f64> {
        self.bound
    }

    fn parts(&self) -> &Parts {
        self.parts
            .as_ref()
            .expect("parts are put back after each call")
    }

    /// Whether the session holds workload `key` (decided by the cycle it opened on or as an
    /// arrival since, and not finished): a workload it holds is not an arrival.
    pub fn contains(&self, key: &WorkloadKey) -> bool {
        self.names.contains_key(key)
            || self
                .problem
                .orphans
                .iter()
                .any(|o| (o.tenant.as_str(), o.name.as_str()) == key.as_pair())
    }

    /// The standing decision for one workload, as the full cycle would give it.
    pub fn decision_for(&self, key: &WorkloadKey) -> Option<WorkloadDecision> {
        if let Some(&w) = self.names.get(key) {
            let parts = self.parts();
            return Some(
                heuristic::workload_decision(
                    &self.problem,
                    &parts.fleet,
                    w,
                    parts.status[w].as_ref(),
                )
                .0,
            );
        }
        self.problem
            .orphans
            .iter()
            .find(|o| (o.tenant.as_str(), o.name.as_str()) == key.as_pair())
            .map(|o| heuristic::orphan_decision(&self.problem, o))
    }

    /// Every workload's standing decision, by tenant and name.
    pub fn decisions(&self) -> Vec<WorkloadDecision> {
        let orphans = self
            .problem
            .orphans
            .iter()
            .map(|o| WorkloadKey::new(&o.tenant, &o.name));
        let mut out: Vec<WorkloadDecision> = self
            .names
            .keys()
            .cloned()
            .chain(orphans)
            .filter_map(|k| self.decision_for(&k))
            .collect();
        out.sort_by(|a, b| (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name)));
        out
    }

    /// A pool of the component of `pools` where reservations may be held, by name.
    fn reserving(&self, pools: &[usize]) -> Option<String> {
        self.component(pools)
            .into_iter()
            .find(|&pl| self.problem.pools[pl].reservation_max_gpus.is_some())
            .map(|pl| self.problem.pools[pl].name.clone())
    }

    /// Pools reachable from `start` through the pools of the queue's workloads.
    fn component(&self, start: &[usize]) -> BTreeSet<usize> {
        let p = &self.problem;
        let mut c: BTreeSet<usize> = start.iter().copied().collect();
        let trace = &self.parts().trace;
        loop {
            let before = c.len();
            for step in trace {
                let pools = &p.workloads[step.w].pools;
                if pools.iter().any(|q| c.contains(q)) {
                    c.extend(pools.iter().copied());
                }
            }
            if c.len() == before {
                return c;
            }
        }
    }

    /// Decides one arriving workload against the standing decision.
    pub fn admit(&mut self, arrival: &PendingWorkload) -> Result<Admission, SessionError> {
        let key = WorkloadKey::new(&arrival.spec.tenant, &arrival.name);
        if self
            .policy
            .workloads
            .iter()
            .any(|w| (w.tenant.as_str(), w.name.as_str()) == key.as_pair())
        {
            return Ok(Admission::NeedsFullCycle(FullCycle::ReplacesCommitted {
                name: key.to_string(),
            }));
        }
        let orphaned =
            |o: &crate::problem::Orphan| (o.tenant.as_str(), o.name.as_str()) == key.as_pair();
        if self.names.contains_key(&key) || self.problem.orphans.iter().any(orphaned) {
            return Err(ProblemError::DuplicateWorkload(key.to_string()).into());
        }
        // The arrival resolved against the session's problem, whose pools, classes and
        // tenants are the policy's in its order.
        let orphans = self.problem.orphans.len();
        self.problem.add_arrival(&self.policy, arrival)?;
        if self.problem.orphans.len() > orphans {
            let orphan = self.problem.orphans.last().expect("just pushed");
            let decision = heuristic::orphan_decision(&self.problem, orphan);
            return Ok(Admission::Decided {
                decision: Box::new(decision),
                changed: Vec::new(),
                geometry: Vec::new(),
            });
        }
        let w = self.problem.workloads.len() - 1;
        if let Some(pool) = self.reserving(&self.problem.workloads[w].pools) {
            self.problem.workloads.pop();
            return Ok(Admission::NeedsFullCycle(FullCycle::Reservations { pool }));
        }
        let place = self.position(w);
        let at = match place {
            Ok(at) => at,
            Err(before) => {
                self.problem.workloads.pop();
                return Ok(Admission::NeedsFullCycle(FullCycle::Reorders { before }));
            }
        };
        let (changed, geometry) = self.decide(w, at);
        self.names.insert(key, w);
        self.bound = self
            .bound
            .map(|b| b + crate::bound::most_added(&self.problem, w));
        let parts = self.parts();
        let decision =
            heuristic::workload_decision(&self.problem, &parts.fleet, w, parts.status[w].as_ref())
                .0;
        Ok(Admission::Decided {
            decision: Box::new(decision),
            changed,
            geometry,
        })
    }

    /// Where the full cycle would pick `arrival` were it decided after every pick the
    /// session holds: its queue key at the session's ledger now, with its workload key as the
    /// last tie-break. `None` when its place changes nothing: it names no known tenant or
    /// class, asks for no pool it may use, or is refused outright (its own turn says why).
    /// Nothing is kept.
    pub fn pick_key(&mut self, arrival: &PendingWorkload) -> Option<PickKey> {
        let (workloads, orphans) = (self.problem.workloads.len(), self.problem.orphans.len());
        let added = self.problem.add_arrival(&self.policy, arrival);
        let key = match added {
            Ok(()) if self.problem.workloads.len() > workloads => {
                let w = workloads;
                (!self.problem.workloads[w].pools.is_empty()).then(|| {
                    let (priority, borrows, share, submitted, name) =
                        queue_key(&self.problem, &self.parts().ledger, w);
                    PickKey::new((priority, borrows, share, submitted), name.clone())
                })
            }
            _ => None,
        };
        self.problem.workloads.truncate(workloads);
        self.problem.orphans.truncate(orphans);
        key
    }

    /// Where in the trace the full cycle would pick workload `w` (an arrival already pushed on
    /// the problem): `Ok(None)` after every pick, `Ok(Some(i))` right before pick `i`, or the
    /// key (`tenant/name`) of an admission it would precede.
    fn position(&mut self, w: usize) -> Result<Option<usize>, String> {
        let pools = self.problem.workloads[w].pools.clone();
        if pools.is_empty() {
            // Waits whatever the order: no pool, no effect.
            return Ok(None);
        }
        let component = self.component(&pools);
        let p = &self.problem;
        let parts = self
            .parts
            .as_ref()
            .expect("parts are put back after each call");
        let lineage = &p.tenants[p.workloads[w].tenant].lineage;
        // The usage of the arrival's tenant and of each of its ancestors (its key reads them)
        // at each of its pools, `usage[level][pool]`, walked back from now through the
        // admissions.
        let mut usage: Vec<Vec<Signed>> = lineage
            .iter()
            .map(|&t| {
                pools
                    .iter()
                    .map(|&q| Signed::of(parts.ledger.usage(t, q)))
                    .collect()
            })
            .collect();
        let mut key: Option<(heuristic::Key, Vec<Vec<Signed>>)> = None;
        let mut first: Option<usize> = None;
        let mut admission_from_first: Option<usize> = None;
        let mut admission_seen: Option<usize> = None;
        for (i, step) in parts.trace.iter().enumerate().rev() {
            let x = &p.workloads[step.w];
            if !x.pools.iter().any(|q| component.contains(q)) {
                continue;
            }
            // The key used at pick `i` was computed before its own admission.
            for (t, q, amount, added) in &step.deltas {
                let Some(k) = pools.iter().position(|pq| pq == q) else {
                    continue;
                };
                for (level, a) in lineage.iter().enumerate() {
                    if p.tenants[*t].lineage.contains(a) {
                        usage[level][k].add(*amount, if *added { -1 } else { 1 });
                    }
                }
            }
            if !step.deltas.is_empty() {
                admission_seen = Some(i);
            }
            if key.as_ref().is_none_or(|(_, u)| *u != usage) {
                let k = key_with(p, &parts.ledger, w, &pools, &usage);
                key = Some((k, usage.clone()));
            }
            let mine = &key.as_ref().expect("just computed").0;
            if (mine, &p.workloads[w].key) < (&step.key, &x.key) {
                first = Some(i);
                admission_from_first = admission_seen;
            }
        }
        match (first, admission_from_first) {
            (Some(_), Some(a)) => Err(p.workloads[parts.trace[a].w].key.to_string()),
            (first, _) => Ok(first),
        }
    }

    /// Decides arrival `w` at trace position `at` (no admission of its component at or after
    /// it); when admitted, decides its component's later picks again. Returns the other
    /// workloads whose decision changed, and the geometry plans that changed.
    fn decide(
        &mut self,
        w: usize,
        at: Option<usize>,
    ) -> (Vec<WorkloadDecision>, Vec<GeometryPlan>) {
        let mut parts = self
            .parts
            .take()
            .expect("parts are put back after each call");
        parts.fleet.placed.push(None);
        parts.status.push(None);
        parts.within_guarantee.push(false);
        let pools = self.problem.workloads[w].pools.clone();
        let component = if pools.is_empty() {
            BTreeSet::new()
        } else {
            // The trace does not hold `w` yet: its own pools seed the closure.
            self.parts = Some(parts);
            let c = self.component(&pools);
            parts = self.parts.take().expect("just put back");
            c
        };
        let p = &self.problem;
        let before = parts.fleet.clone();
        let mut s = Solver::from_parts(p, parts);
        // Its key when picked: no admission of its component comes after `at`.
        let key = {
            let (a, b, c, d, _) = queue_key(p, &s.ledger, w);
            (a, b, c, d)
        };
        let status = s.admit(w);
        let admitted = matches!(status, Status::Admit { .. });
        s.status[w] = Some(status);
        let at = at.unwrap_or(s.trace.len());
        if !admitted {
            if !pools.is_empty() {
                s.trace.insert(
                    at,
                    Step {
                        w,
                        key,
                        deltas: Vec::new(),
                        victims: Vec::new(),
                    },
                );
                in_pick_order(p, &mut s.trace);
            }
            self.parts = Some(s.into_parts());
            return (Vec::new(), Vec::new());
        }
        let (deltas, victims) = s.admission_deltas(w);
        // The component's picks from `at` on come after the arrival now: decided again.
        let mut tail = Vec::new();
        let mut kept = Vec::with_capacity(s.trace.len() + 1);
        let mut mine = None;
        for (i, step) in std::mem::take(&mut s.trace).into_iter().enumerate() {
            if i == at {
                mine = Some(kept.len());
            }
            let in_component = p.workloads[step.w]
                .pools
                .iter()
                .any(|q| component.contains(q));
            if i >= at && in_component {
                tail.push(step.w);
            } else {
                kept.push(step);
            }
        }
        kept.insert(
            mine.unwrap_or(kept.len()),
            Step {
                w,
                key,
                deltas,
                victims: victims.clone(),
            },
        );
        s.trace = kept;
        // A waiting pick's status is taken, not cloned: `run_queue` decides it again, reading
        // no waiting workload's status (only running work's `Keep`), and a waiting reason can
        // list protected work (cloning thousands of them was a sixth of such an admission).
        let old: Vec<(usize, Option<Status>)> = tail
            .iter()
            .map(|&x| {
                let was = match s.status[x] {
                    Some(Status::Pending(_)) => s.status[x].take(),
                    _ => s.status[x].clone(),
                };
                (x, was)
            })
            .collect();
        let from = s.trace.len();
        s.run_queue(tail);
        // What changed: the victims (kept before), and the picks decided again.
        let mut touched: BTreeMap<usize, Option<Status>> = old.into_iter().collect();
        for &v in &victims {
            touched.insert(v, Some(Status::Keep));
        }
        for step in &s.trace[from..] {
            for &v in &step.victims {
                touched.entry(v).or_insert(Some(Status::Keep));
            }
        }
        let mut changed: Vec<WorkloadDecision> = touched
            .into_iter()
            .filter_map(|(x, was)| {
                // Most picks decided again wait for the same reason: no decision to build.
                let waits = match (&was, &s.status[x]) {
                    (Some(Status::Pending(a)), Some(Status::Pending(b))) => Some(a.same(b)),
                    _ => None,
                };
                if waits == Some(true) {
                    return None;
                }
                let now = heuristic::workload_decision(p, &s.fleet, x, s.status[x].as_ref()).0;
                // Waiting for another reason: a waiting decision carries its reason whole, so
                // it differs (the reason of a borrower behind protected work counts the
                // protected, which one preemption changes for thousands of waiting picks).
                if waits == Some(false) {
                    return Some(now);
                }
                let then = heuristic::workload_decision(p, &before, x, was.as_ref()).0;
                (now != then).then_some(now)
            })
            .collect();
        changed.sort_by(|a, b| (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name)));
        let geometry = heuristic::geometry_changes(p, &before, &s.fleet);
        in_pick_order(p, &mut s.trace);
        self.parts = Some(s.into_parts());
        (changed, geometry)
    }

    /// Removes a workload that finished (or was cancelled) from the standing state, when that
    /// cannot change another decision; otherwise changes nothing and asks for a full cycle.
    pub fn finish(&mut self, key: &WorkloadKey) -> Result<Removal, SessionError> {
        let Some(&w) = self.names.get(key) else {
            if let Some(i) = self
                .problem
                .orphans
                .iter()
                .position(|o| (o.tenant.as_str(), o.name.as_str()) == key.as_pair())
            {
                // Orphans hold nothing in the decision.
                self.problem.orphans.remove(i);
                return Ok(Removal::Removed);
            }
            return Err(SessionError::Unknown(key.to_string()));
        };
        let pools = self.problem.workloads[w].pools.clone();
        if let Some(pool) = self.reserving(&pools) {
            return Ok(Removal::NeedsFullCycle(FullCycle::Reservations { pool }));
        }
        let p = &self.problem;
        let parts = self
            .parts
            .as_mut()
            .expect("parts are put back after each call");
        match parts.status[w] {
            Some(Status::Pending(_)) => {
                // A waiting workload changed nothing: its picks go, nothing else moves. Its
                // component may split, and each part's picks take their own place.
                parts.trace.retain(|s| s.w != w);
                in_pick_order(p, &mut parts.trace);
                parts.status[w] = None;
                self.names.remove(key);
                return Ok(Removal::Removed);
            }
            Some(Status::Admit { .. }) | Some(Status::Preempt(_)) => {
                return Ok(Removal::NeedsFullCycle(FullCycle::Decided {
                    name: key.to_string(),
                }));
            }
            Some(Status::Keep) | None => {}
        }
        let wl = &p.workloads[w];
        if p.usage.is_some()
            && wl.is_running()
            && p.tenants[wl.tenant]
                .lineage
                .iter()
                .any(|&t| p.tenants[t].fair_share.is_some())
        {
            return Ok(Removal::NeedsFullCycle(FullCycle::History {
                tenant: p.tenants[wl.tenant].name.clone(),
            }));
        }
        let pool = pool_of(p, w);
        let component = self.component(&[pool]);
        let parts = self
            .parts
            .as_ref()
            .expect("parts are put back after each call");
        let queued = parts
            .trace
            .iter()
            .any(|s| p.workloads[s.w].pools.iter().any(|q| component.contains(q)));
        let stopped = (0..p.workloads.len()).any(|v| {
            matches!(parts.status[v], Some(Status::Preempt(_)))
                && p.workloads[v].is_running()
                && component.contains(&pool_of(p, v))
        });
        if queued || stopped {
            return Ok(Removal::NeedsFullCycle(FullCycle::FreesCapacity {
                pool: p.pools[pool].name.clone(),
            }));
        }
        // A running workload counts in the fleet's running mix, whose CPU per GPU weighs the
        // nodes of every pool (and which a pool where nothing runs is scored against): every
        // pick, in any component, would be placed again.
        if p.workloads[w].is_running()
            && let Some(&pool) = parts
                .trace
                .iter()
                .find_map(|s| p.workloads[s.w].pools.first())
        {
            return Ok(Removal::NeedsFullCycle(FullCycle::FleetMix {
                pool: p.pools[pool].name.clone(),
            }));
        }
        let parts = self
            .parts
            .as_mut()
            .expect("parts are put back after each call");
        let wl = &p.workloads[w];
        let running = wl.is_running();
        parts.fleet.release(p, w, false);
        parts
            .ledger
            .remove(p, wl.tenant, pool, wl.amount(wl.replicas));
        parts.status[w] = None;
        // Placements are scored against the running set (`heuristic/fragmentation.rs`), which
        // no longer holds it: later arrivals are decided as a cycle without it would.
        let status = &parts.status;
        parts.fleet.forget(p, |v| status[v].is_none());
        self.names.remove(key);
        if running {
            self.guarantee_index(pool, w, false);
        }
        self.refresh_guarantees(pool);
        Ok(Removal::Removed)
    }

    /// The standing decision carried out whole: every workload it admits now runs on its
    /// bindings, as `after` (the next snapshot) shows it, started when `after` says. The session then
    /// stands for that snapshot (its arrivals decided as a full cycle on it would decide them)
    /// rather than for the one it opened on, so that an arrival is no longer ordered against
    /// admissions already carried out.
    ///
    /// Only when the decision leaves nothing waiting, preempts nothing, holds no reservation,
    /// changes no geometry and admits no work of a tenant that weighs fair-share history: a
    /// waiting workload's reason, a preemption, a new geometry and a history that counts the
    /// new runs read differently on the next snapshot, and the full cycle decides those.
    /// Otherwise nothing is changed and the answer says why. Like the arrivals, the session
    /// keeps the instant it opened at.
    pub fn carried_out(&mut self, after: &ClusterStateSpec) -> Result<(), FullCycle> {
        let p = &self.problem;
        let parts = self.parts();
        if let Some(pool) = parts.holds.first().map(|h| h.pool) {
            return Err(FullCycle::Reservations {
                pool: p.pools[pool].name.clone(),
            });
        }
        let mut admitted = Vec::new();
        for (key, &w) in &self.names {
            match parts.status[w] {
                Some(Status::Admit { .. }) => admitted.push(w),
                Some(Status::Keep) | None => {}
                Some(Status::Pending(_)) if p.workloads[w].pools.is_empty() => {}
                Some(Status::Pending(_)) => {
                    return Err(FullCycle::Waiting {
                        name: key.to_string(),
                    });
                }
                Some(Status::Preempt(_)) => {
                    return Err(FullCycle::Decided {
                        name: key.to_string(),
                    });
                }
            }
        }
        let runs: BTreeMap<(&str, &str), &tessera_compiler::model::RunningWorkload> =
            if admitted.is_empty() {
                BTreeMap::new()
            } else {
                after
                    .running
                    .iter()
                    .map(|r| ((r.spec.tenant.as_str(), r.name.as_str()), r))
                    .collect()
            };
        let mut slots = Vec::with_capacity(admitted.len());
        for &w in &admitted {
            let wl = &p.workloads[w];
            if p.usage.is_some()
                && p.tenants[wl.tenant]
                    .lineage
                    .iter()
                    .any(|&t| p.tenants[t].fair_share.is_some())
            {
                // Running, it counts in the history the next cycle reads from `after`'s
                // record; admitted, it did not.
                return Err(FullCycle::History {
                    tenant: p.tenants[wl.tenant].name.clone(),
                });
            }
            let placed = parts.fleet.placed[w]
                .as_ref()
                .expect("an admitted workload is placed");
            if matches!(p.workloads[w].demand, crate::problem::Demand::Mig { .. }) {
                for g in placed.iter().flat_map(|x| heuristic::slot_of(x).gpus) {
                    if heuristic::geometry_changes_on(p, &parts.fleet, g) {
                        let gpu = &p.gpus[g];
                        return Err(FullCycle::Geometry {
                            node: p.nodes[gpu.node].name.clone(),
                            gpu: gpu.index,
                        });
                    }
                }
            }
            let key = &p.workloads[w].key;
            let Some(run) = runs.get(&key.as_pair()) else {
                return Err(FullCycle::Decided {
                    name: key.to_string(),
                });
            };
            slots.push((
                placed.iter().map(heuristic::slot_of).collect::<Vec<_>>(),
                run.started_at.as_second(),
                run.last_checkpoint_at.map(|t| t.as_second()),
            ));
        }
        let mut pools = BTreeSet::new();
        let parts = self
            .parts
            .as_mut()
            .expect("parts are put back after each call");
        for (&w, (slots, started_at, last_checkpoint_at)) in admitted.iter().zip(slots) {
            let wl = &mut self.problem.workloads[w];
            let pool = self.problem.nodes[slots[0].node]
                .pool
                .expect("a placement is on a node of a pool");
            // As the snapshot reads a running workload: the replicas it holds, in the pool it
            // runs in.
            let replicas = u32::try_from(slots.len()).unwrap_or(u32::MAX);
            wl.replicas = replicas;
            wl.min_member = wl.min_member.min(replicas);
            wl.pools = vec![pool];
            wl.excluded.clear();
            wl.phase = Phase::Running {
                slots,
                started_at,
                last_checkpoint_at,
            };
            parts.status[w] = Some(Status::Keep);
            pools.insert(pool);
        }
        let p = &self.problem;
        for &w in &admitted {
            // By tenant and name, as a snapshot's running workloads are indexed: each new run
            // goes to its place, the pool's running set is not sorted again.
            let running = &mut parts.running_by_pool[pool_of(p, w)];
            let key = &p.workloads[w].key;
            let at = running.partition_point(|r| p.workloads[r.workload].key < *key);
            let run = heuristic::Running::of(p, w).expect("an admission carried out runs");
            running.insert(at, run);
            // Places moved: the pool's candidates are ordered again below.
        }
        let p = &self.problem;
        for pool in admitted
            .iter()
            .map(|&w| pool_of(p, w))
            .collect::<BTreeSet<_>>()
        {
            parts.by_cost[pool] = Some(heuristic::cost_order(p, &parts.running_by_pool[pool]));
        }
        for &w in &admitted {
            self.guarantee_index(pool_of(&self.problem, w), w, true);
        }
        let p = &self.problem;
        let parts = self
            .parts
            .as_mut()
            .expect("parts are put back after each call");
        // Every pick was an admission now carried out: the next cycle's queue starts empty.
        parts.trace.clear();
        // Placements are scored against the running set (`heuristic/fragmentation.rs`), which
        // now holds them.
        let status = &parts.status;
        parts.fleet.forget(p, |v| status[v].is_none());
        for pool in pools {
            self.refresh_guarantees(pool);
        }
        Ok(())
    }

    /// Recomputes which running workloads of `pool` are within their tenant's guarantee, as
    /// the cycle's first step does: by priority desc, then start, then tenant and name.
    fn refresh_guarantees(&mut self, pool: usize) {
        let p = &self.problem;
        let parts = self
            .parts
            .as_mut()
            .expect("parts are put back after each call");
        let order = self.by_guarantee[pool].get_or_insert_with(|| {
            let mut running: Vec<usize> = parts.running_by_pool[pool]
                .iter()
                .map(|r| r.workload)
                .filter(|&v| p.workloads[v].is_running())
                .collect();
            running.sort_by(|&a, &b| guarantee_order(p, a).cmp(&guarantee_order(p, b)));
            running
        });
        let mut ledger = self.blank.clone();
        for &v in order.iter() {
            if !matches!(parts.status[v], Some(Status::Keep)) {
                continue;
            }
            let wl = &p.workloads[v];
            let before = ledger.usage(wl.tenant, pool).gpus;
            parts.within_guarantee[v] = before < Ledger::guarantee(p, wl.tenant, pool);
            ledger.add(p, wl.tenant, pool, wl.amount(wl.replicas));
        }
    }

    /// Keeps [`Session::by_guarantee`] of `pool`, when built, holding running workload `w`
    /// (`true`) or not.
    fn guarantee_index(&mut self, pool: usize, w: usize, runs: bool) {
        let p = &self.problem;
        let Some(order) = self.by_guarantee[pool].as_mut() else {
            return;
        };
        let key = guarantee_order(p, w);
        let at = order.partition_point(|&v| guarantee_order(p, v) < key);
        let there = order.get(at) == Some(&w);
        match (runs, there) {
            (true, false) => order.insert(at, w),
            (false, true) => {
                order.remove(at);
            }
            _ => {}
        }
    }
}

/// Where running workload `w` comes when the cycle's first step counts guarantees: by
/// priority desc, then start, then tenant and name.
fn guarantee_order(p: &Problem, w: usize) -> (i64, i64, &WorkloadKey) {
    let wl = &p.workloads[w];
    let started = match wl.phase {
        Phase::Running { started_at, .. } => started_at,
        Phase::Pending { .. } => 0,
    };
    (-p.classes[wl.class].priority, started, &wl.key)
}

/// The queue key of `w` were the usage of its tenant and of each ancestor at `pools` the given
/// one (`usage[level][pool]`, levels as in the tenant's lineage); `ledger` gives the pools'
/// capacity.
fn key_with(
    p: &Problem,
    ledger: &Ledger,
    w: usize,
    pools: &[usize],
    usage: &[Vec<Signed>],
) -> heuristic::Key {
    let lineage = &p.tenants[p.workloads[w].tenant].lineage;
    let at = |pool: usize| {
        pools
            .iter()
            .position(|&x| x == pool)
            .expect("a key reads its workload's pools only")
    };
    let (a, b, c, d, _) = heuristic::queue_key_from(
        p,
        w,
        |pool| usage[0][at(pool)].amounts().gpus,
        |pool| {
            let k = at(pool);
            ledger
                .fair_share_path(p, lineage[0], pool, |t| {
                    let level = lineage
                        .iter()
                        .position(|&x| x == t)
                        .expect("a share path reads its tenant's lineage only");
                    usage[level][k].amounts()
                })
                .into()
        },
    );
    (a, b, c, d)
}

/// Puts `trace` in the order the full cycle picks, given each component's picks in order.
///
/// The cycle picks the least key of the whole queue. A key reads only its component's ledger,
/// so the least key of a component is the key of that component's next pick whatever the
/// others do, and the cycle's order is the merge of the components' sequences, at each step
/// taking the component whose next pick has the least key. The session needs that order kept
/// across components, not only within each: when an arrival joins two components, the
/// position it takes in the joint sequence, and the picks decided again after it, are only
/// right if the two sequences were merged as the cycle would have (an arrival placed by one
/// component's keys alone was once decided before a pick of the other with a smaller key).
/// Removing a waiting pick can likewise split a component and change the merge.
fn in_pick_order(p: &Problem, trace: &mut Vec<Step>) {
    let mut root: Vec<usize> = (0..p.pools.len()).collect();
    fn find(root: &mut [usize], mut x: usize) -> usize {
        while root[x] != x {
            root[x] = root[root[x]];
            x = root[x];
        }
        x
    }
    for step in trace.iter() {
        let pools = &p.workloads[step.w].pools;
        if let Some((&first, rest)) = pools.split_first() {
            let a = find(&mut root, first);
            for &q in rest {
                let b = find(&mut root, q);
                root[b] = a;
            }
        }
    }
    // Each component's picks, in trace order; a pick without a pool is a component alone.
    let mut groups: Vec<std::collections::VecDeque<usize>> = Vec::new();
    let mut group_of_root: BTreeMap<usize, usize> = BTreeMap::new();
    for (i, step) in trace.iter().enumerate() {
        let g = match p.workloads[step.w].pools.first() {
            Some(&q) => {
                let r = find(&mut root, q);
                *group_of_root.entry(r).or_insert_with(|| {
                    groups.push(Default::default());
                    groups.len() - 1
                })
            }
            None => {
                groups.push(Default::default());
                groups.len() - 1
            }
        };
        groups[g].push_back(i);
    }
    if groups.len() < 2 {
        return;
    }
    // Ties go by workload key, as the cycle's picker ranks them (`pick.rs`): by name alone,
    // `a1/p-4` once came before `a/x-0` of the same key.
    let head = |i: usize| (&trace[i].key, &p.workloads[trace[i].w].key);
    let mut heads: std::collections::BinaryHeap<_> = groups
        .iter_mut()
        .enumerate()
        .filter_map(|(g, q)| q.pop_front().map(|i| std::cmp::Reverse((head(i), i, g))))
        .collect();
    let mut order = Vec::with_capacity(trace.len());
    while let Some(std::cmp::Reverse((_, i, g))) = heads.pop() {
        order.push(i);
        if let Some(next) = groups[g].pop_front() {
            heads.push(std::cmp::Reverse((head(next), next, g)));
        }
    }
    if order.iter().enumerate().all(|(k, &i)| k == i) {
        return;
    }
    let mut steps: Vec<Option<Step>> = std::mem::take(trace).into_iter().map(Some).collect();
    *trace = order
        .into_iter()
        .map(|i| steps[i].take().expect("each pick once"))
        .collect();
}
