//! The fast greedy cycle: a valid [`Decision`] on its own, and the warm start and fallback of the
//! integer programs (`ilp`), which rebuild their answers through its checks and placement.
//!
//! (a) Keep every running workload that may stay (those whose tenant's limit no longer allows
//! them are preempted when preemptible). (b) Repeatedly pick the next pending workload: priority
//! desc, within-guarantee before borrowing, borrowed dominant share / weight asc, submission
//! time, name. (c) Place its gang all-or-nothing (at least `minMember`, up to `replicas`),
//! best-fit so that whole nodes and domains stay free; MIG instances come from free instances,
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
//! - The reconfiguration budget is a per-decision cap: at most `maxPerGpuPerHour` geometry
//!   changes of one GPU in one decision.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

use tessera_compiler::compiled::Amounts;
use tessera_compiler::mig::{self, Placement};
use tessera_compiler::model::{Sharing, TopologyMode};
use tessera_compiler::units::Gpus;

use crate::decision::{
    Decision, FORMAT_VERSION, GeometryPlan, Instance, Method, Outcome, PoolAttempt, PoolReport,
    PreemptReason, Protected, Reason, ReplicaBinding, Resource, TenantUsage, WorkloadDecision,
};
use crate::problem::{Demand, Exclusion, OrphanCause, Phase, Problem, Slot};
use crate::quota::{self, Ledger};

// The integer program's replay builds its decision with this cycle's own steps, so it lives
// beside the ILP but is a child of this module, which keeps the cycle's internals private.
#[path = "ilp/replay.rs"]
mod replay;
pub(crate) use replay::{Admission, Directive, KeepPhase, keep_phase, solve_directed};

// Reservations read and write the cycle's internals as its own steps do.
#[path = "reserve.rs"]
mod reserve;
pub(crate) use reserve::Hold;

/// What holds a GPU now, in this decision.
#[derive(Debug, Clone, Default)]
struct GpuState {
    /// Held whole (exclusive pool, or the 7g instance of a MIG GPU).
    whole: Option<usize>,
    /// MIG geometry after the decision so far, sorted.
    geometry: Vec<Placement>,
    /// Instances held, by start.
    held: BTreeMap<u8, usize>,
    /// Shares: (workload, fraction, trust domain).
    shares: Vec<(usize, Gpus, String)>,
    /// Geometry changes in this decision.
    changes: u32,
    /// Placements (or the whole GPU, as start 255) released by preempted workloads.
    preempted: BTreeSet<u8>,
}

impl GpuState {
    fn share_total(&self) -> Gpus {
        self.shares.iter().map(|s| s.1).sum()
    }
    fn allocated(&self) -> Gpus {
        if self.whole.is_some() {
            return Gpus::whole(1);
        }
        let mig: Gpus = self
            .geometry
            .iter()
            .filter(|p| self.held.contains_key(&p.start))
            .map(|p| {
                Gpus::sevenths(i64::from(
                    mig::gpu_fraction_sevenths(p.profile_id).unwrap_or(0),
                ))
            })
            .sum();
        mig + self.share_total()
    }
    fn is_free(&self) -> bool {
        self.whole.is_none() && self.held.is_empty() && self.shares.is_empty()
    }
    fn busy(&self) -> Vec<Placement> {
        self.geometry
            .iter()
            .copied()
            .filter(|p| self.held.contains_key(&p.start))
            .collect()
    }
}

/// A replica's place in this decision.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    node: usize,
    gpus: Vec<usize>,
    mig: Option<Placement>,
    share: Option<Gpus>,
}

/// The fleet's occupancy, cloned for each tentative placement.
#[derive(Debug, Clone)]
pub(crate) struct Fleet {
    /// Shared until written: the preemption search tries many what-ifs, each a clone of the
    /// fleet that touches a few GPUs, so a clone copies pointers, not 4,000 GPU states.
    gpu: Vec<Rc<GpuState>>,
    cpu: Vec<u64>,
    memory: Vec<u64>,
    /// By workload index; a clone copies pointers (see `gpu`).
    pub(crate) placed: Vec<Option<Rc<Vec<Placed>>>>,
    /// Nodes held by reservations the workload being placed may not use (see `reserve.rs`);
    /// set only while one workload is decided.
    barred: Option<Rc<BTreeSet<usize>>>,
}

/// Why one replica does not fit on one node.
#[derive(Debug, Clone, Default)]
struct Misses {
    node_resources: Option<Resource>,
    trust: bool,
    budget: BTreeSet<usize>,
}

/// How to place one replica on a node.
#[derive(Debug, Clone)]
enum Plan {
    Whole {
        gpus: Vec<usize>,
        /// GPUs of a MIG pool that must be re-laid out to a 7g instance.
        relayout: Vec<usize>,
    },
    Instance {
        gpu: usize,
        placement: Placement,
        geometry: Option<Vec<Placement>>,
    },
    Share {
        gpu: usize,
    },
}

impl Fleet {
    fn new(p: &Problem) -> Fleet {
        Fleet {
            gpu: p
                .gpus
                .iter()
                .map(|g| {
                    Rc::new(GpuState {
                        geometry: g.instances.clone(),
                        ..GpuState::default()
                    })
                })
                .collect(),
            cpu: vec![0; p.nodes.len()],
            memory: vec![0; p.nodes.len()],
            placed: vec![None; p.workloads.len()],
            barred: None,
        }
    }

    fn occupy(&mut self, p: &Problem, w: usize, slot: Placed) {
        let wl = &p.workloads[w];
        self.cpu[slot.node] += wl.cpu.0;
        self.memory[slot.node] += wl.memory.0;
        match (slot.mig, slot.share) {
            (Some(pl), _) => {
                Rc::make_mut(&mut self.gpu[slot.gpus[0]])
                    .held
                    .insert(pl.start, w);
            }
            (None, Some(s)) => {
                let td = p.tenants[wl.tenant].trust_domain.clone();
                Rc::make_mut(&mut self.gpu[slot.gpus[0]])
                    .shares
                    .push((w, s, td));
            }
            (None, None) => {
                for &g in &slot.gpus {
                    Rc::make_mut(&mut self.gpu[g]).whole = Some(w);
                }
            }
        }
        Rc::make_mut(self.placed[w].get_or_insert_with(Rc::default)).push(slot);
    }

    /// Frees everything `w` holds; `preempted` marks it for drains.
    pub(crate) fn release(&mut self, p: &Problem, w: usize, preempted: bool) {
        let wl = &p.workloads[w];
        for slot in self.placed[w].take().unwrap_or_default().iter() {
            self.cpu[slot.node] -= wl.cpu.0;
            self.memory[slot.node] -= wl.memory.0;
            match (slot.mig, slot.share) {
                (Some(pl), _) => {
                    let g = Rc::make_mut(&mut self.gpu[slot.gpus[0]]);
                    g.held.remove(&pl.start);
                    if preempted {
                        g.preempted.insert(pl.start);
                    }
                }
                (None, Some(_)) => {
                    let g = Rc::make_mut(&mut self.gpu[slot.gpus[0]]);
                    if let Some(i) = g.shares.iter().position(|s| s.0 == w) {
                        g.shares.remove(i);
                    }
                }
                (None, None) => {
                    for &g in &slot.gpus {
                        let g = Rc::make_mut(&mut self.gpu[g]);
                        g.whole = None;
                        if preempted {
                            g.preempted.insert(u8::MAX);
                        }
                    }
                }
            }
        }
    }

    fn usable(&self, p: &Problem, g: usize) -> bool {
        p.gpus[g].healthy
    }

    /// Free GPU units on a node (healthy GPUs).
    fn node_free(&self, p: &Problem, n: usize) -> i64 {
        p.nodes[n]
            .gpus
            .iter()
            .filter(|&&g| self.usable(p, g))
            .map(|&g| Gpus::whole(1).units() - self.gpu[g].allocated().units())
            .sum()
    }

    /// How a replica of `w` could go on node `n` of `pool`; with its cost (re-layouts first).
    fn option(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        n: usize,
        miss: &mut Misses,
    ) -> Option<Plan> {
        let wl = &p.workloads[w];
        let node = &p.nodes[n];
        if !node.healthy || node.pool != Some(pool) {
            return None;
        }
        if self.barred.as_ref().is_some_and(|b| b.contains(&n)) {
            return None;
        }
        if self.cpu[n] + wl.cpu.0 > node.cpu.0 {
            miss.node_resources.get_or_insert(Resource::Cpu);
            return None;
        }
        if self.memory[n] + wl.memory.0 > node.memory.0 {
            miss.node_resources.get_or_insert(Resource::Memory);
            return None;
        }
        let info = &p.pools[pool];
        let gpus: Vec<usize> = node
            .gpus
            .iter()
            .copied()
            .filter(|&g| self.usable(p, g))
            .collect();
        match wl.demand {
            Demand::Whole { count } => {
                let mut ready = Vec::new();
                let mut relayout = Vec::new();
                for &g in &gpus {
                    let s = &self.gpu[g];
                    if !s.is_free() {
                        continue;
                    }
                    if info.sharing != Sharing::Mig
                        || s.geometry == [Placement::new(mig::PROFILE_7G, 0)]
                    {
                        ready.push(g);
                    } else if s.changes < info.max_changes_per_gpu {
                        relayout.push(g);
                    } else {
                        miss.budget.insert(g);
                    }
                }
                let need = count as usize;
                if ready.len() + relayout.len() < need {
                    return None;
                }
                let take_ready = ready.len().min(need);
                let mut chosen: Vec<usize> = ready[..take_ready].to_vec();
                let extra: Vec<usize> = relayout[..need - take_ready].to_vec();
                chosen.extend(&extra);
                chosen.sort_unstable();
                Some(Plan::Whole {
                    gpus: chosen,
                    relayout: extra,
                })
            }
            Demand::Mig { profile_id } => {
                // A free existing instance, on the tightest GPU.
                let mut best: Option<(i64, usize, Placement)> = None;
                for &g in &gpus {
                    let s = &self.gpu[g];
                    if s.whole.is_some() {
                        continue;
                    }
                    if let Some(pl) = s
                        .geometry
                        .iter()
                        .find(|pl| pl.profile_id == profile_id && !s.held.contains_key(&pl.start))
                    {
                        let free = Gpus::whole(1).units() - s.allocated().units();
                        if best.as_ref().is_none_or(|b| free < b.0) {
                            best = Some((free, g, *pl));
                        }
                    }
                }
                if let Some((_, gpu, placement)) = best {
                    return Some(Plan::Instance {
                        gpu,
                        placement,
                        geometry: None,
                    });
                }
                // Re-lay out a GPU around its busy instances, destroying the fewest instances.
                type Candidate = ((usize, usize, i64), usize, Vec<Placement>);
                let mut best: Option<Candidate> = None;
                for &g in &gpus {
                    let s = &self.gpu[g];
                    if s.whole.is_some() {
                        continue;
                    }
                    let busy = s.busy();
                    for (li, layout) in info.layouts.iter().enumerate() {
                        let Some(geometry) = relayout_into(&busy, layout) else {
                            continue;
                        };
                        let free_of_profile = geometry
                            .iter()
                            .filter(|pl| {
                                pl.profile_id == profile_id && !s.held.contains_key(&pl.start)
                            })
                            .count();
                        if free_of_profile == 0 || geometry == s.geometry {
                            continue;
                        }
                        if s.changes >= info.max_changes_per_gpu {
                            miss.budget.insert(g);
                            continue;
                        }
                        let destroyed = s.geometry.iter().filter(|x| !geometry.contains(x)).count();
                        let free = Gpus::whole(1).units() - s.allocated().units();
                        let key = (destroyed, li, free);
                        if best.as_ref().is_none_or(|b| key < b.0) {
                            best = Some((key, g, geometry));
                        }
                    }
                }
                let (_, gpu, geometry) = best?;
                let s = &self.gpu[gpu];
                let placement = *geometry
                    .iter()
                    .find(|pl| pl.profile_id == profile_id && !s.held.contains_key(&pl.start))?;
                Some(Plan::Instance {
                    gpu,
                    placement,
                    geometry: Some(geometry),
                })
            }
            Demand::Share { fraction } => {
                let td = &p.tenants[wl.tenant].trust_domain;
                let mut best: Option<(Gpus, usize)> = None;
                for &g in &gpus {
                    let s = &self.gpu[g];
                    if s.whole.is_some() || !s.held.is_empty() {
                        continue;
                    }
                    let total = s.share_total();
                    if total + fraction > Gpus::whole(1)
                        || s.shares.len() as u32 >= info.max_clients_per_gpu
                    {
                        continue;
                    }
                    if s.shares.iter().any(|x| &x.2 != td) {
                        miss.trust = true;
                        continue;
                    }
                    // Tightest first: the most loaded GPU that still fits.
                    if best.as_ref().is_none_or(|b| total > b.0) {
                        best = Some((total, g));
                    }
                }
                best.map(|(_, gpu)| Plan::Share { gpu })
            }
        }
    }

    fn apply(&mut self, p: &Problem, w: usize, n: usize, plan: Plan) {
        let slot = match plan {
            Plan::Whole { gpus, relayout } => {
                for g in relayout {
                    let s = Rc::make_mut(&mut self.gpu[g]);
                    s.geometry = vec![Placement::new(mig::PROFILE_7G, 0)];
                    s.changes += 1;
                }
                Placed {
                    node: n,
                    gpus,
                    mig: None,
                    share: None,
                }
            }
            Plan::Instance {
                gpu,
                placement,
                geometry,
            } => {
                if let Some(geometry) = geometry {
                    let s = Rc::make_mut(&mut self.gpu[gpu]);
                    s.geometry = geometry;
                    s.changes += 1;
                }
                Placed {
                    node: n,
                    gpus: vec![gpu],
                    mig: Some(placement),
                    share: None,
                }
            }
            Plan::Share { gpu } => Placed {
                node: n,
                gpus: vec![gpu],
                mig: None,
                share: match p.workloads[w].demand {
                    Demand::Share { fraction } => Some(fraction),
                    _ => None,
                },
            },
        };
        self.occupy(p, w, slot);
    }

    /// Places up to `want` replicas of `w` on `nodes`, one at a time, each on the node where it
    /// fits with the least room left (re-layouts last). Returns how many were placed.
    fn fill(
        &mut self,
        p: &Problem,
        w: usize,
        pool: usize,
        nodes: &[usize],
        want: u32,
        miss: &mut Misses,
    ) -> u32 {
        let mut placed = 0;
        while placed < want {
            let mut best: Option<((bool, i64, usize), usize, Plan)> = None;
            for &n in nodes {
                if let Some(plan) = self.option(p, w, pool, n, miss) {
                    let relayout = match &plan {
                        Plan::Whole { relayout, .. } => !relayout.is_empty(),
                        Plan::Instance { geometry, .. } => geometry.is_some(),
                        Plan::Share { .. } => false,
                    };
                    let key = (relayout, self.node_free(p, n), n);
                    if best.as_ref().is_none_or(|b| key < b.0) {
                        best = Some((key, n, plan));
                    }
                }
            }
            let Some((_, n, plan)) = best else { break };
            self.apply(p, w, n, plan);
            placed += 1;
        }
        placed
    }

    /// Places the gang on `pool` honouring its topology: at least `min`, up to `want` replicas.
    fn place_gang(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        want: u32,
        min: u32,
    ) -> Result<Fleet, Reason> {
        let wl = &p.workloads[w];
        let info = &p.pools[pool];
        let mut miss = Misses::default();
        let all: Vec<usize> = info.nodes.clone();
        // Each domain's nodes, in pool order, gathered once: the sorts below ask for them
        // O(domains × log domains) times per gang.
        let mut members: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for &n in &all {
            members
                .entry(p.nodes[n].domain.as_str())
                .or_default()
                .push(n);
        }
        let by_domain = |d: &str| -> Vec<usize> { members.get(d).cloned().unwrap_or_default() };
        let domain_free = |f: &Fleet, d: &str| -> i64 {
            members
                .get(d)
                .map_or(0, |ns| ns.iter().map(|&n| f.node_free(p, n)).sum())
        };
        let try_sets = |sets: Vec<Vec<usize>>, at_least: u32, miss: &mut Misses| -> Option<Fleet> {
            for set in sets {
                let mut f = self.clone();
                if f.fill(p, w, pool, &set, want, miss) >= at_least {
                    return Some(f);
                }
            }
            None
        };
        // Domains and nodes best-fit: the smallest free room first, so large ones stay free.
        let mut domains: Vec<&String> = info.domains.iter().collect();
        domains.sort_by_cached_key(|d| {
            let d: &String = d;
            (domain_free(self, d), d.as_str())
        });
        let domain_sets: Vec<Vec<usize>> = domains.iter().map(|d| by_domain(d)).collect();
        match wl.topology {
            TopologyMode::Required => {
                // A domain that takes every replica, else one that takes at least `min`.
                let mut scratch = Misses::default();
                if let Some(f) = try_sets(domain_sets.clone(), want, &mut scratch) {
                    return Ok(f);
                }
                if let Some(f) = try_sets(domain_sets, min, &mut miss) {
                    return Ok(f);
                }
                // Would it fit split? Then the domain is the reason; otherwise the capacity.
                let mut f = self.clone();
                let mut m2 = Misses::default();
                if f.fill(p, w, pool, &all, want, &mut m2) >= min {
                    let best = info
                        .domains
                        .iter()
                        .map(|d| domain_free(self, d))
                        .max()
                        .unwrap_or(0);
                    return Err(Reason::NoNvlinkDomain {
                        pool: info.name.clone(),
                        needed_gpus: wl.demand.gpus() * i64::from(min),
                        best_free: Gpus::from_units(best),
                    });
                }
                Err(self.capacity_reason(p, w, pool, min, &f, &m2))
            }
            TopologyMode::Preferred => {
                let mut nodes = all.clone();
                nodes.sort_by_cached_key(|&n| (self.node_free(p, n), n));
                let node_sets = nodes.iter().map(|&n| vec![n]).collect();
                // A one-node, then one-domain placement, if it takes the whole gang.
                for sets in [node_sets, domain_sets] {
                    for set in sets {
                        let mut f = self.clone();
                        let mut m = Misses::default();
                        if f.fill(p, w, pool, &set, want, &mut m) >= want {
                            return Ok(f);
                        }
                    }
                }
                let mut f = self.clone();
                if f.fill(p, w, pool, &all, want, &mut miss) >= min {
                    return Ok(f);
                }
                Err(self.capacity_reason(p, w, pool, min, &f, &miss))
            }
            TopologyMode::None => {
                let mut f = self.clone();
                if f.fill(p, w, pool, &all, want, &mut miss) >= min {
                    return Ok(f);
                }
                Err(self.capacity_reason(p, w, pool, min, &f, &miss))
            }
        }
    }

    fn capacity_reason(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        min: u32,
        after: &Fleet,
        miss: &Misses,
    ) -> Reason {
        let wl = &p.workloads[w];
        let info = &p.pools[pool];
        let fit = after.placed[w].as_ref().map_or(0, |v| v.len() as u32);
        if let Demand::Mig { profile_id } = wl.demand
            && fit == 0
        {
            if !miss.budget.is_empty() {
                return Reason::ReconfigurationBudget {
                    pool: info.name.clone(),
                    gpus: miss.budget.iter().map(|&g| p.gpu_label(g)).collect(),
                };
            }
            return Reason::NoMigInstance {
                pool: info.name.clone(),
                profile: info.profile_name(profile_id),
            };
        }
        if matches!(wl.demand, Demand::Share { .. }) && miss.trust && fit == 0 {
            return Reason::TrustDomain {
                pool: info.name.clone(),
                trust_domain: p.tenants[wl.tenant].trust_domain.clone(),
            };
        }
        if let Some(resource) = miss.node_resources
            && fit == 0
        {
            return Reason::NodeResources {
                pool: info.name.clone(),
                resource,
            };
        }
        let free: i64 = info.nodes.iter().map(|&n| self.node_free(p, n)).sum();
        Reason::NoCapacity {
            pool: info.name.clone(),
            needed: min,
            fit,
            free: Gpus::from_units(free),
        }
    }
}

/// A GPU left with part of a layout (a reconfiguration interrupted between destroying and
/// creating, or a node set up by hand) is completed to an allowed layout that keeps every
/// instance it has: only instances are added, on free memory slices, so nothing running is
/// disturbed. `None` when the geometry is empty, already a layout of the pool, cannot be
/// completed without destroying something, or the GPU's change budget is spent.
fn complete_layout(
    pool: &crate::problem::PoolInfo,
    geometry: &[Placement],
    changes: u32,
) -> Option<Vec<Placement>> {
    if geometry.is_empty() || changes >= pool.max_changes_per_gpu {
        return None;
    }
    let multiset = |v: &[Placement]| {
        let mut ids: Vec<u32> = v.iter().map(|p| p.profile_id).collect();
        ids.sort_unstable();
        ids
    };
    let have = multiset(geometry);
    if pool.layouts.iter().any(|l| multiset(l) == have) {
        return None;
    }
    pool.layouts
        .iter()
        .filter_map(|l| relayout_into(geometry, l))
        // The smallest completion: the fewest instances to create.
        .min_by_key(|g| g.len())
}

/// The geometry `layout` takes on a GPU whose `busy` instances must stay where they are, if
/// the busy instances are part of the layout's multiset and the rest can be placed around them.
fn relayout_into(busy: &[Placement], layout: &[Placement]) -> Option<Vec<Placement>> {
    let mut rest: Vec<u32> = layout.iter().map(|p| p.profile_id).collect();
    for b in busy {
        let i = rest.iter().position(|&id| id == b.profile_id)?;
        rest.remove(i);
    }
    if busy.is_empty() {
        return Some(layout.to_vec());
    }
    let g = mig::place_with(busy, &rest).ok()?;
    mig::validate(&g).ok()?;
    Some(g)
}

/// Per-workload status while solving.
#[derive(Debug, Clone)]
pub(crate) enum Status {
    Keep,
    Admit { guaranteed: Gpus, borrowed: Gpus },
    Preempt(PreemptReason),
    Pending(Reason),
}

/// A queue key without its name (the name is the workload's).
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
    /// reference fleet's training pool). By index, so by name.
    running_by_pool: Vec<Vec<Running>>,
    /// The last refusal of a borrower with no allowed victim, by (pool, scope, priority), with
    /// the tenants it does not hold for. A borrower's candidates depend on nothing else but the
    /// running workloads' statuses, which only a preemption changes (it clears this), and on
    /// its tenant only through that tenant's own lower-priority work within guarantee, which it
    /// may displace: a queue of borrowers blocked behind the same protected work scans it once.
    refused: Option<(RefusalKey, BTreeSet<usize>, Refusal)>,
    /// Workloads admitted only where they fit without preemption (an integer program found
    /// preempting for them not worth it; see `ilp/replay.rs`).
    pub(crate) hold: Vec<bool>,
    /// Capacity held for waiting gangs so far in this cycle, in pick order (see `reserve.rs`).
    pub(crate) holds: Vec<Hold>,
}

/// What a borrower's refusal depends on besides the statuses and its tenant: (pool, scope,
/// priority).
type RefusalKey = (usize, Option<usize>, i64);

/// A refused preemption: the protected workloads listed, and how many there were.
type Refusal = (Vec<Protected>, usize);

/// A running workload of the snapshot, with its tenant (kept beside it: the preemption search
/// tests thousands of candidates' tenants against a scope before it reads anything else).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Running {
    pub(crate) workload: usize,
    pub(crate) tenant: usize,
}

pub(crate) fn pool_of(p: &Problem, w: usize) -> usize {
    p.workloads[w].pools[0]
}

impl<'p> Solver<'p> {
    pub(crate) fn new(p: &'p Problem) -> Self {
        let mut fleet = Fleet::new(p);
        let mut running_by_pool = vec![Vec::new(); p.pools.len()];
        for (w, wl) in p.workloads.iter().enumerate() {
            if let Phase::Running { slots, .. } = &wl.phase {
                for s in slots {
                    fleet.occupy(p, w, placed_of(p, w, s));
                }
                running_by_pool[pool_of(p, w)].push(Running {
                    workload: w,
                    tenant: wl.tenant,
                });
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
            refused: None,
            hold: vec![false; p.workloads.len()],
            holds: Vec::new(),
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
            refused: None,
            hold: vec![false; p.workloads.len()],
            holds: parts.holds,
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
            holds: self.holds,
        }
    }

    /// (a) Running workloads, highest priority and oldest first, stay while their tenant's limit
    /// allows them; the part of each tenant's work up to its guarantee is protected.
    fn keep_running(&mut self) {
        let p = self.p;
        let mut running: Vec<usize> = (0..p.workloads.len())
            .filter(|&w| p.workloads[w].is_running())
            .collect();
        running.sort_by_cached_key(|&w| {
            let wl = &p.workloads[w];
            let started = match wl.phase {
                Phase::Running { started_at, .. } => started_at,
                Phase::Pending { .. } => 0,
            };
            (-p.classes[wl.class].priority, started, wl.name.clone())
        });
        for w in running {
            let wl = &p.workloads[w];
            let pool = pool_of(p, w);
            let amount = wl.amount(wl.replicas);
            let before = self.ledger.usage(wl.tenant, pool).gpus;
            self.within_guarantee[w] = before < Ledger::guarantee(p, wl.tenant, pool);
            if self.ledger.check_limit(p, wl.tenant, pool, amount).is_err()
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

    pub(crate) fn run(&mut self) {
        self.keep_running();
        let queue: Vec<usize> = (0..self.p.workloads.len())
            .filter(|&w| !self.p.workloads[w].is_running())
            .collect();
        self.run_queue(queue);
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
    pub(crate) fn run_queue(&mut self, mut queue: Vec<usize>) {
        let p = self.p;
        self.refused = None;
        // A key depends on the ledger alone, which only an admission changes (`admit` replaces
        // it right before returning `Admit`): keys are recomputed after admissions, not after
        // every workload left waiting.
        let mut keys = queue_keys(p, &self.ledger, &queue);
        while !queue.is_empty() {
            let (i, _) = keys
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.cmp(b.1))
                .expect("non-empty");
            let w = queue.remove(i);
            let (priority, borrows, share, submitted, _) = keys.remove(i);
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
            self.trace.push(Step {
                w,
                key: (priority, borrows, share, submitted),
                deltas,
                victims,
            });
            if admitted {
                keys = queue_keys(p, &self.ledger, &queue);
            }
        }
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
        for &pool in &wl.pools {
            match try_pool(p, &self.fleet, &self.ledger, w, pool, wl.replicas) {
                Ok((fleet, ledger, guaranteed, borrowed)) => {
                    self.fleet = fleet;
                    self.ledger = ledger;
                    return Status::Admit {
                        guaranteed,
                        borrowed,
                    };
                }
                Err(r) => attempts.push((pool, r)),
            }
        }
        // Releasing victims frees room and quota alike (the root's limit is the pool).
        let preempting = if self.hold[w] { 0 } else { attempts.len() };
        for (pool, reason) in attempts.iter_mut().take(preempting) {
            // A limit refused at tenant X: only X's subtree can give quota back.
            let scope = match reason {
                Reason::QuotaExceeded { tenant, .. } | Reason::PoolFull { tenant, .. } => {
                    p.tenants.iter().position(|t| &t.name == tenant)
                }
                _ => None,
            };
            match self.preempt_for(w, *pool, scope) {
                Ok(status) => return status,
                Err((protected, protected_total)) if protected_total > 0 => {
                    *reason = Reason::PreemptionNotAllowed {
                        pool: p.pools[*pool].name.clone(),
                        capacity: Box::new(reason.clone()),
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

    /// A what-if: the fleet and ledger with `victims`, running in `pool`, released (drains
    /// recorded on the fleet returned). Clones are copy-on-write, so this costs pointers.
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

    /// (d) Finds the cheapest sufficient set of allowed victims in `pool` and admits `w`; the
    /// protected workloads otherwise.
    fn preempt_for(
        &mut self,
        w: usize,
        pool: usize,
        scope: Option<usize>,
    ) -> Result<Status, (Vec<Protected>, usize)> {
        let p = self.p;
        let wl = &p.workloads[w];
        let prio = p.classes[wl.class].priority;
        let amount = wl.demand.gpus() * i64::from(wl.min_member);
        let requester_guaranteed = self.ledger.split(p, wl.tenant, pool, amount).1 == Gpus::ZERO;
        // Borrowers compete for borrowed work of their own priority here: whether one may take
        // another's depends on both tenants' shares, so a refusal holds for no one else.
        let fair = p.pools[pool].fair_share_preemption && !requester_guaranteed;
        let refusal_key = (!requester_guaranteed && !fair).then_some((pool, scope, prio));
        if let (Some(key), Some((k, owners, refusal))) = (refusal_key, &self.refused)
            && key == *k
            && !owners.contains(&wl.tenant)
        {
            return Err(refusal.clone());
        }
        let mut protected = Blocking::default();
        let mut eligible = Vec::new();
        // Eligible by fair share alone, with how far above its share each level of its side
        // is (see `fairly_yields`).
        let mut fair_victims: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        // Tenants whose borrower could displace protected work here (their own, within
        // guarantee, of lower priority): a refusal holds for every other tenant's borrower.
        let mut owners = BTreeSet::new();
        // Whether each tenant is in the scope: a borrower's scan visits thousands of
        // candidates, a fleet has hundreds of tenants.
        let in_scope: Option<Vec<bool>> =
            scope.map(|x| p.tenants.iter().map(|t| t.lineage.contains(&x)).collect());
        for &Running {
            workload: v,
            tenant,
        } in &self.running_by_pool[pool]
        {
            if in_scope.as_ref().is_some_and(|s| !s[tenant]) {
                continue;
            }
            if !matches!(self.status[v], Some(Status::Keep)) {
                continue;
            }
            let vl = &p.workloads[v];
            let class = &p.classes[vl.class];
            // Names are cloned only for the few candidates a reason lists (see `listed`).
            let name = v;
            let Phase::Running { started_at, .. } = vl.phase else {
                continue;
            };
            let ran = (p.now - started_at).max(0) as u64;
            if !class.preemptible {
                protected.push(name, Blocked::NonPreemptible);
            } else if ran < class.min_runtime_seconds {
                protected.push(name, Blocked::MinRuntime(class.min_runtime_seconds - ran));
            } else if self.within_guarantee[v]
                && !(class.priority < prio && (requester_guaranteed || vl.tenant == wl.tenant))
            {
                // Guarantee protection guards against other tenants' borrowing; within one
                // tenant, priority alone decides.
                if class.priority < prio {
                    owners.insert(vl.tenant);
                }
                protected.push(name, Blocked::WithinGuarantee);
            } else if !self.within_guarantee[v] && !requester_guaranteed && class.priority >= prio {
                match (fair && class.priority == prio)
                    .then(|| self.fairly_yields(w, v, pool))
                    .flatten()
                {
                    Some(Ok(rank)) => {
                        fair_victims.insert(v, rank);
                        eligible.push(v);
                    }
                    Some(Err(())) => protected.push(name, Blocked::FairShare),
                    None => protected.push(name, Blocked::NotLowerPriority),
                }
            } else if !self.within_guarantee[v]
                && requester_guaranteed
                && class.priority >= prio
                && vl.tenant == wl.tenant
            {
                // Reclaiming from oneself is no reclaim.
                protected.push(name, Blocked::NotLowerPriority);
            } else {
                eligible.push(v);
            }
        }
        let cost = |v: usize| {
            let vl = &p.workloads[v];
            (
                vl.amount(vl.replicas).gpus,
                lost_units_seconds(p, v),
                p.classes[vl.class].priority,
                vl.name.clone(),
            )
        };
        // Preempting within-guarantee work is only for work that stays within guarantee: a
        // guaranteed requester takes no more replicas than its guarantee covers.
        let cap = if requester_guaranteed {
            (wl.min_member..=wl.replicas)
                .rev()
                .find(|&n| {
                    self.ledger
                        .split(p, wl.tenant, pool, wl.demand.gpus() * i64::from(n))
                        .1
                        == Gpus::ZERO
                })
                .unwrap_or(wl.min_member)
        } else {
            wl.replicas
        };
        let attempt = |victims: &[usize]| {
            let (fleet, ledger) = self.without(pool, victims);
            let admitted = try_pool(p, &fleet, &ledger, w, pool, cap).map_err(|_| ())?;
            // Taken together, each side that gives up work by fair share still holds at least
            // what the requester's side holds with the gang admitted.
            let fair_ok = victims
                .iter()
                .filter(|v| fair_victims.contains_key(v))
                .all(|&v| {
                    let (a, b) = quota::sides(p, wl.tenant, p.workloads[v].tenant)
                        .expect("a fair victim has a side");
                    let none = Amounts::default();
                    match (
                        admitted.1.borrowed_share(p, a, pool, none, none),
                        admitted.1.borrowed_share(p, b, pool, none, none),
                    ) {
                        (Some(mine), Some(theirs)) => at_most(mine, theirs),
                        _ => false,
                    }
                });
            if fair_ok { Ok(admitted) } else { Err(()) }
        };
        // No victim allowed: nothing below could succeed, and the pool's free room (a scan of
        // its GPUs) is not needed.
        if eligible.is_empty() {
            let refusal = listed(p, protected);
            if let Some(key) = refusal_key {
                self.refused = Some((key, owners, refusal.clone()));
            }
            return Err(refusal);
        }
        // A what-if costs a fleet clone. It cannot succeed unless the pool's free GPU units plus
        // what the victims hold reach the gang's minimum, nor unless enough nodes then have a
        // replica's units free: skip those that cannot (units freed are over-counted for
        // partial gangs and unhealthy GPUs, and a node's free units bound what one replica
        // finds there, so nothing is skipped that could succeed).
        let node_free: BTreeMap<usize, i64> = p.pools[pool]
            .nodes
            .iter()
            .map(|&n| (n, self.fleet.node_free(p, n)))
            .collect();
        let pool_free: i64 = node_free.values().sum();
        let needed = amount.units();
        let holds = |v: usize| {
            let vl = &p.workloads[v];
            vl.amount(vl.replicas).gpus.units()
        };
        let per_replica = wl.demand.gpus().units();
        let replicas_on = |n: usize, freed: i64| {
            let free = node_free.get(&n).copied().unwrap_or(0);
            if per_replica > 0 {
                (free + freed) / per_replica
            } else {
                i64::MAX / 4
            }
        };
        let base_fit: i64 = node_free.keys().map(|&n| replicas_on(n, 0)).sum();
        // What each victim frees, by node.
        let frees = |v: usize, freed: &mut BTreeMap<usize, i64>| {
            let units = p.workloads[v].demand.gpus().units();
            for slot in self.fleet.placed[v].iter().flat_map(|s| s.iter()) {
                *freed.entry(slot.node).or_default() += units;
            }
        };
        let fit_with = |freed: &BTreeMap<usize, i64>| {
            base_fit
                + freed
                    .iter()
                    .map(|(&n, &f)| replicas_on(n, f) - replicas_on(n, 0))
                    .sum::<i64>()
        };
        let could_fit = |victims: &[usize]| {
            let mut freed = BTreeMap::new();
            for &v in victims {
                frees(v, &mut freed);
            }
            let fit = fit_with(&freed) >= i64::from(wl.min_member);
            // The bound is only worth having if it never skips a what-if that succeeds.
            debug_assert!(
                fit || attempt(victims).is_err(),
                "a what-if skipped would succeed"
            );
            fit
        };
        // One victim, the cheapest that suffices; borrowed work of the requester's priority
        // last, from the side furthest above its share first.
        let mut singles: Vec<usize> = eligible.clone();
        singles.sort_by_cached_key(|&v| (fair_victims.get(&v).cloned(), cost(v)));
        let mut chosen = None;
        for &v in &singles {
            if pool_free + holds(v) < needed || !could_fit(&[v]) {
                continue;
            }
            if let Ok(admitted) = attempt(&[v]) {
                chosen = Some((vec![v], admitted));
                break;
            }
        }
        // Otherwise accumulate, borrowed and low tiers first, then drop the unneeded.
        if chosen.is_none() {
            let mut order = eligible.clone();
            // Among borrowed work of the requester's priority, the side furthest above its
            // share gives first.
            order.sort_by_cached_key(|&v| {
                let c = cost(v);
                (
                    self.within_guarantee[v],
                    c.2,
                    fair_victims.get(&v).cloned(),
                    c.0,
                    c.1,
                    c.3,
                )
            });
            let mut set = Vec::new();
            let mut freed = 0;
            let mut freed_by_node = BTreeMap::new();
            for v in order {
                set.push(v);
                freed += holds(v);
                frees(v, &mut freed_by_node);
                if pool_free + freed < needed {
                    continue;
                }
                if fit_with(&freed_by_node) < i64::from(wl.min_member) {
                    debug_assert!(attempt(&set).is_err(), "a what-if skipped would succeed");
                    continue;
                }
                if let Ok(mut admitted) = attempt(&set) {
                    let mut i = set.len();
                    while i > 0 {
                        i -= 1;
                        let mut without = set.clone();
                        without.remove(i);
                        if without.is_empty() || !could_fit(&without) {
                            continue;
                        }
                        if let Ok(smaller) = attempt(&without) {
                            set = without;
                            admitted = smaller;
                        }
                    }
                    chosen = Some((set, admitted));
                    break;
                }
            }
        }
        // The what-if of the victims chosen is the fleet that admits `w`.
        let Some((victims, (fleet, ledger, guaranteed, borrowed))) = chosen else {
            let refusal = listed(p, protected);
            // The scope's own work, released, gives back the quota but not the room: work
            // outside the scope may be allowed to make the room, as for any gang short of
            // capacity (Kueue weighs a queue's own and its cohort's candidates together). The
            // search without a scope keeps the scope's victims only where the limit needs them.
            if scope.is_some() {
                let (_, released) = self.without(pool, &eligible);
                if released
                    .check_limit(p, wl.tenant, pool, wl.amount(wl.min_member))
                    .is_ok()
                    && let Ok(status) = self.preempt_for(w, pool, None)
                {
                    return Ok(status);
                }
            }
            return Err(refusal);
        };
        for &v in &victims {
            // Drains are recorded on the fleet that admits `w`.
            let reason = if fair_victims.contains_key(&v) {
                let (a, b) = quota::sides(p, wl.tenant, p.workloads[v].tenant)
                    .expect("a fair victim has a side");
                PreemptReason::FairShare {
                    for_workload: wl.name.clone(),
                    from: p.tenants[b].name.clone(),
                    to: p.tenants[a].name.clone(),
                }
            } else if requester_guaranteed && !self.within_guarantee[v] {
                PreemptReason::Reclaim {
                    for_workload: wl.name.clone(),
                    owner: p.tenants[wl.tenant].name.clone(),
                }
            } else {
                PreemptReason::Priority {
                    for_workload: wl.name.clone(),
                    priority: prio,
                }
            };
            self.status[v] = Some(Status::Preempt(reason));
        }
        self.refused = None;
        self.victims = victims;
        self.fleet = fleet;
        self.ledger = ledger;
        Ok(Status::Admit {
            guaranteed,
            borrowed,
        })
    }
}

/// `a ≤ b` up to rounding: shares are ratios of integers divided by weights, and an exact tie
/// (an even split) must count as a tie.
fn at_most(a: f64, b: f64) -> bool {
    a <= b + 1e-9 * b.abs().max(1.0)
}

/// Sort key of a pending workload under `ledger`: priority desc, guaranteed first, fair share
/// down the tenant tree (see [`Ledger::fair_share_path`]), time, name.
pub(crate) fn queue_key<'p>(p: &'p Problem, ledger: &Ledger, w: usize) -> FullKey<'p> {
    let tenant = p.workloads[w].tenant;
    queue_key_from(
        p,
        w,
        |pool| ledger.usage(tenant, pool).gpus,
        |pool| {
            ledger
                .fair_share_path(p, tenant, pool, |t| ledger.usage(t, pool))
                .into()
        },
    )
}

/// A queue key with the workload's name, the last tie-break.
pub(crate) type FullKey<'p> = (i64, bool, SharePath, i64, &'p str);

/// The keys of `queue` under `ledger`, each tenant's share path computed once per pool (a
/// queue has many workloads per tenant, and is keyed again after every admission).
pub(crate) fn queue_keys<'p>(p: &'p Problem, ledger: &Ledger, queue: &[usize]) -> Vec<FullKey<'p>> {
    let mut paths: HashMap<(usize, usize), SharePath> = HashMap::new();
    queue
        .iter()
        .map(|&w| {
            let tenant = p.workloads[w].tenant;
            queue_key_from(
                p,
                w,
                |pool| ledger.usage(tenant, pool).gpus,
                |pool| {
                    paths
                        .entry((tenant, pool))
                        .or_insert_with(|| {
                            ledger
                                .fair_share_path(p, tenant, pool, |t| ledger.usage(t, pool))
                                .into()
                        })
                        .clone()
                },
            )
        })
        .collect()
}

/// [`queue_key`] from the GPUs the workload's tenant uses in each of its pools (`own_gpus`)
/// and the tenant's share path in each (`path`).
pub(crate) fn queue_key_from<'p>(
    p: &'p Problem,
    w: usize,
    own_gpus: impl Fn(usize) -> Gpus,
    mut path: impl FnMut(usize) -> SharePath,
) -> FullKey<'p> {
    let wl = &p.workloads[w];
    let amount = wl.demand.gpus() * i64::from(wl.min_member);
    let guaranteed = wl.pools.iter().any(|&pool| {
        Ledger::split_with(p, wl.tenant, pool, amount, own_gpus(pool)).1 == Gpus::ZERO
    });
    // The pool where the workload's tenant stands best.
    let share = wl
        .pools
        .iter()
        .map(|&pool| path(pool))
        .min()
        .unwrap_or_else(|| Rc::from([]));
    let submitted = match wl.phase {
        Phase::Pending { submitted_at } => submitted_at,
        Phase::Running { .. } => 0,
    };
    (
        -p.classes[wl.class].priority,
        !guaranteed,
        share,
        submitted,
        wl.name.as_str(),
    )
}

/// Why a candidate victim is protected, before its name is needed.
#[derive(Debug, Clone, Copy)]
enum Blocked {
    NonPreemptible,
    MinRuntime(u64),
    WithinGuarantee,
    NotLowerPriority,
    /// Borrowed work of the requester's priority whose side would hold less than the
    /// requester's after the swap.
    FairShare,
}

/// The protected candidates of one preemption search: all counted, the first
/// [`crate::decision::PROTECTED_LISTED`] by name kept (a borrower refused on a large fleet
/// has thousands, and a queue has thousands of borrowers).
#[derive(Debug, Default)]
struct Blocking {
    /// By index, which is by name: candidates are running workloads, which the problem
    /// numbers in name order.
    first: Vec<(usize, Blocked)>,
    total: usize,
}

impl Blocking {
    fn push(&mut self, v: usize, why: Blocked) {
        self.total += 1;
        // The scan visits candidates by index: past the first few, this returns at once.
        if self.first.len() == crate::decision::PROTECTED_LISTED {
            if self.first.last().is_some_and(|&(last, _)| last < v) {
                return;
            }
            self.first.pop();
        }
        let at = self.first.partition_point(|&(u, _)| u < v);
        self.first.insert(at, (v, why));
    }
}

/// The protected candidates a reason lists, by name, and how many there were in all. Names
/// are cloned for the listed ones only.
fn listed(p: &Problem, blocked: Blocking) -> (Vec<Protected>, usize) {
    let Blocking { first, total } = blocked;
    debug_assert!(
        first
            .windows(2)
            .all(|x| p.workloads[x[0].0].name < p.workloads[x[1].0].name)
    );
    let list = first
        .into_iter()
        .map(|(v, why)| {
            let workload = p.workloads[v].name.clone();
            match why {
                Blocked::NonPreemptible => Protected::NonPreemptible { workload },
                Blocked::MinRuntime(remaining_seconds) => Protected::MinRuntime {
                    workload,
                    remaining_seconds,
                },
                Blocked::WithinGuarantee => Protected::WithinGuarantee { workload },
                Blocked::NotLowerPriority => Protected::NotLowerPriority { workload },
                Blocked::FairShare => Protected::FairShare { workload },
            }
        })
        .collect();
    (list, total)
}

/// Quota, then placement, of `w` on `pool`: the new fleet and ledger and the
/// (guaranteed, borrowed) split of what was admitted.
fn try_pool(
    p: &Problem,
    fleet: &Fleet,
    ledger: &Ledger,
    w: usize,
    pool: usize,
    cap: u32,
) -> Result<(Fleet, Ledger, Gpus, Gpus), Reason> {
    let wl = &p.workloads[w];
    let min = wl.min_member;
    ledger.check_limit(p, wl.tenant, pool, wl.amount(min))?;
    // The most replicas (up to `cap`) the limit and the reservations allow.
    let mut want = min;
    for n in (min..=cap.clamp(min, wl.replicas)).rev() {
        if ledger.check_limit(p, wl.tenant, pool, wl.amount(n)).is_ok() {
            want = n;
            break;
        }
    }
    let borrow_ok = |n: u32| {
        let gpus = wl.amount(n).gpus;
        let (_, borrowed) = ledger.split(p, wl.tenant, pool, gpus);
        ledger.check_borrow(p, wl.tenant, pool, gpus, borrowed)
    };
    borrow_ok(min)?;
    while want > min && borrow_ok(want).is_err() {
        want -= 1;
    }
    let fleet = fleet.place_gang(p, w, pool, want, min)?;
    let placed = fleet.placed[w].as_ref().map_or(0, |v| v.len() as u32);
    let amount = wl.amount(placed);
    let (guaranteed, borrowed) = ledger.split(p, wl.tenant, pool, amount.gpus);
    let mut ledger = ledger.clone();
    ledger.add(p, wl.tenant, pool, amount);
    Ok((fleet, ledger, guaranteed, borrowed))
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

fn placed_of(p: &Problem, w: usize, s: &Slot) -> Placed {
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

fn round(x: f64, scale: f64) -> f64 {
    (x * scale).round() / scale
}

fn bindings(p: &Problem, slots: &[Placed]) -> Vec<ReplicaBinding> {
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

fn orphan_cause(c: &OrphanCause) -> String {
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
    let mut s = Solver::new(p);
    s.run();
    decision(p, &s, Method::Heuristic, crate::bound::lp_bound(p))
}

/// The decision for one workload of the problem given its status, and what it adds to the
/// objective.
pub(crate) fn workload_decision(
    p: &Problem,
    fleet: &Fleet,
    w: usize,
    status: Option<&Status>,
) -> (WorkloadDecision, f64) {
    let wl = &p.workloads[w];
    let class = &p.classes[wl.class];
    let status = status.cloned().unwrap_or(Status::Keep);
    let slots = fleet.placed[w].clone().unwrap_or_default();
    let placed_gpus = wl.demand.gpus() * slots.len() as i64;
    let mut objective = 0.0;
    let pool = match status {
        Status::Keep | Status::Admit { .. } => {
            objective = class.priority as f64 * placed_gpus.as_f64();
            Some(p.pools[pool_of(p, w)].name.clone())
        }
        _ => None,
    };
    let pool = match (&status, &slots.first()) {
        (Status::Admit { .. }, Some(sl)) => p.nodes[sl.node].pool.map(|x| p.pools[x].name.clone()),
        _ => pool,
    };
    let outcome = match status {
        Status::Keep => Outcome::Keep {
            bindings: bindings(p, &slots),
        },
        Status::Admit {
            guaranteed,
            borrowed,
        } => Outcome::Admit {
            bindings: bindings(p, &slots),
            guaranteed,
            borrowed,
        },
        Status::Preempt(reason) => {
            let lost = lost_units_seconds(p, w) as f64 / Gpus::UNITS_PER_GPU as f64;
            // Subtracting is adding the negation, bit for bit: the total is unchanged.
            objective = -(class.priority as f64 * lost / 3600.0);
            Outcome::Preempt {
                grace_seconds: class.grace_period_seconds,
                lost_gpu_seconds: round(lost, 1e3),
                message: reason.to_string(),
                reason,
            }
        }
        Status::Pending(reason) => Outcome::Pending {
            message: reason.to_string(),
            reason,
        },
    };
    let decision = WorkloadDecision {
        name: wl.name.clone(),
        tenant: p.tenants[wl.tenant].name.clone(),
        slo_class: class.name.clone(),
        priority: class.priority,
        pool,
        outcome,
    };
    (decision, objective)
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
            message: reason.to_string(),
            reason,
        }
    } else {
        let reason = Reason::Orphaned { cause };
        Outcome::Pending {
            message: reason.to_string(),
            reason,
        }
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
    let mut workloads = Vec::new();
    let mut objective = 0.0;
    for w in (0..p.workloads.len()).filter(|&w| live(w)) {
        let (d, value) = workload_decision(p, &s.fleet, w, s.status[w].as_ref());
        if value != 0.0 {
            objective += value;
        }
        workloads.push(d);
    }
    for o in &p.orphans {
        workloads.push(orphan_decision(p, o));
    }
    workloads.sort_by(|a, b| a.name.cmp(&b.name));

    let (reservations, reserved_idle) = reserve::reports(s);
    let mut pools = pool_reports(p, s);
    for (r, idle) in pools
        .iter_mut()
        .zip(pool_order(p).into_iter().map(|pl| reserved_idle[pl]))
    {
        r.reserved_idle = idle;
    }
    Decision {
        format_version: FORMAT_VERSION,
        now: p.now_text.clone(),
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
        geometry: geometry(p, &s.fleet),
        usage: usage(p, &s.ledger),
        pools,
        workloads,
        fair_share: crate::fairshare::report(p),
        reservations,
    }
}

fn instances(p: &Problem, pool: usize, v: &[Placement]) -> Vec<Instance> {
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

fn geometry(p: &Problem, fleet: &Fleet) -> Vec<GeometryPlan> {
    (0..p.gpus.len())
        .filter_map(|g| gpu_plan(p, fleet, g))
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
fn gpu_plan(p: &Problem, fleet: &Fleet, g: usize) -> Option<GeometryPlan> {
    let info = &p.gpus[g];
    let pool = p.nodes[info.node].pool?;
    if p.pools[pool].sharing != Sharing::Mig {
        return None;
    }
    let state = &fleet.gpu[g];
    let current = &info.instances;
    let completed = complete_layout(&p.pools[pool], &state.geometry, state.changes);
    let target = completed.as_ref().unwrap_or(&state.geometry);
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
    Some(GeometryPlan {
        node: p.nodes[info.node].name.clone(),
        gpu: info.index,
        pool: p.pools[pool].name.clone(),
        current: instances(p, pool, current),
        target: instances(p, pool, target),
        destroy: instances(p, pool, &destroy),
        create: instances(p, pool, &create),
        enable_mig: !info.mig_enabled && !target.is_empty(),
        drain,
    })
}

fn usage(p: &Problem, ledger: &Ledger) -> Vec<TenantUsage> {
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
fn pool_order(p: &Problem) -> Vec<usize> {
    let mut order: Vec<usize> = (0..p.pools.len()).collect();
    order.sort_by(|&a, &b| p.pools[a].name.cmp(&p.pools[b].name));
    order
}

fn pool_reports(p: &Problem, s: &Solver) -> Vec<PoolReport> {
    let fleet = &s.fleet;
    let order = pool_order(p);
    // Shapes still pending per pool.
    let mut pending: BTreeMap<usize, Vec<Demand>> = BTreeMap::new();
    for (w, wl) in p.workloads.iter().enumerate() {
        if matches!(s.status[w], Some(Status::Pending(_))) {
            for &pl in &wl.pools {
                pending.entry(pl).or_default().push(wl.demand);
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
            let mut free_nodes = 0;
            let mut free_domains: BTreeMap<&str, bool> = BTreeMap::new();
            let shapes = pending.get(&pl).cloned().unwrap_or_default();
            for &n in &info.nodes {
                let node = &p.nodes[n];
                let healthy: Vec<usize> = node
                    .gpus
                    .iter()
                    .copied()
                    .filter(|&g| p.gpus[g].healthy)
                    .collect();
                let node_free = node.healthy
                    && node
                        .gpus
                        .iter()
                        .all(|&g| p.gpus[g].healthy && fleet.gpu[g].is_free());
                if node_free {
                    free_nodes += 1;
                }
                let e = free_domains.entry(node.domain.as_str()).or_insert(true);
                *e &= node_free;
                let free_whole = healthy.iter().filter(|&&g| fleet.gpu[g].is_free()).count() as u32;
                for &g in &healthy {
                    let st = &fleet.gpu[g];
                    capacity += Gpus::whole(1);
                    let a = st.allocated();
                    allocated += a;
                    let free = Gpus::whole(1) - a;
                    if free > Gpus::ZERO && !shapes.is_empty() {
                        let usable = shapes.iter().any(|d| match *d {
                            Demand::Whole { count } => st.is_free() && free_whole >= count,
                            Demand::Mig { profile_id } => {
                                st.whole.is_none()
                                    && (st.geometry.iter().any(|x| {
                                        x.profile_id == profile_id
                                            && !st.held.contains_key(&x.start)
                                    }) || info.layouts.iter().any(|l| {
                                        relayout_into(&st.busy(), l).is_some_and(|geo| {
                                            geo.iter().any(|x| {
                                                x.profile_id == profile_id
                                                    && !st.held.contains_key(&x.start)
                                            })
                                        })
                                    }))
                            }
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
                free_nodes,
                free_domains: free_domains.values().filter(|v| **v).count() as u32,
                reserved_idle: Gpus::ZERO,
                refinement: None,
            }
        })
        .collect()
}
