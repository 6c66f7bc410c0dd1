//! Reservations with backfill: capacity held for a waiting gang so that a stream of small jobs
//! cannot starve it (as Slurm's backfill scheduler does).
//!
//! A gang that cannot start holds the nodes it will land on; as their GPUs free up they stay
//! idle for it instead of going to the next small job, until the gang fits. What holds:
//!
//! - **Who reserves.** Only in pools with `spec.reservations` (opt-in), only exclusive pools
//!   (whole GPUs: a reservation never shares a GPU, so it never mixes trust domains), only in
//!   pools the gang may use, only whole-GPU gangs of at least one node's GPUs (smaller work fits
//!   as soon as any node frees enough, so it does not starve the same way), and only when the
//!   gang is blocked for capacity: a limit, an idle guarantee of another tenant or isolation
//!   that refuses it is not fixed by waiting for GPUs. Gangs reserve in queue order while the
//!   pool's total of needed GPUs stays within `maxGpus`.
//! - **Where.** The previous decision's nodes when the snapshot carries them and they are still
//!   valid (healthy, in the pool, free of other reservations, enough GPUs, one NVLink domain
//!   when the gang requires it): a reservation that moved every cycle would hold nothing.
//!   Otherwise the nodes (or the domain, under `topology: required`) where the gang could start
//!   soonest: each GPU is ready now when free or held by work that would yield, at the declared
//!   end (`startedAt + maxDuration`) of the work on it otherwise, never when that work declares
//!   no end; ties go to nodes with fewer GPUs busy, then to the pool's node order. CPU and
//!   memory are not looked at.
//! - **What is held.** Every free GPU of the reservation's nodes, for work picked after the
//!   gang (earlier picks outrank it). Such work may still go there if (a) it is within its
//!   tenant's guarantee while the gang borrows and is another tenant's (guarantees come before
//!   borrowing; within one tenant the queue order decides, as in preemption), (b) its
//!   `maxDuration` ends before the reservation's eta (true backfill: it is gone before the gang
//!   could start, as long as the declared durations hold), or (c) it is preemptible (it yields,
//!   below). Otherwise it goes elsewhere or waits with [`Reason::ReservedFor`].
//! - **Yielding.** When the gang does not fit on its own, the preemptible work on its nodes of
//!   no higher priority that has run its `minRuntime` is counted as free: if that is enough, the
//!   gang starts and that work is preempted with [`PreemptReason::Reservation`] (after its
//!   grace period, as every preemption). Work within its tenant's guarantee never yields:
//!   guarantees come before reservations (rule (a) seen from the other side), and a gang that
//!   needs such capacity takes it, if at all, by the ordinary preemption rules.
//! - **Visible.** The gang waits with [`Reason::Reserving`] ("reserving 192/256 GPUs ..."), the
//!   decision lists every reservation (the next snapshot's), and each pool reports the GPUs it
//!   left idle for them (`reserved_idle`): the cost of not starving gangs, measured.
//!
//! Nothing here runs for a pool without the knob: its decisions are those of a solver without
//! reservations, byte for byte.

use std::collections::BTreeSet;
use std::rc::Rc;

use tessera_compiler::model::{Sharing, TopologyMode};
use tessera_compiler::units::Gpus;

use super::{Admitted, Solver, Status, try_pool};
use crate::decision::{PreemptReason, Reason, ReservationReport, Resource};
use crate::problem::{Demand, Phase, Problem, unix};
use crate::quota::Ledger;

/// Capacity held for one waiting gang in this decision.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) gang: usize,
    pub(crate) pool: usize,
    /// By index, sorted.
    pub(crate) nodes: Vec<usize>,
    /// Unix seconds.
    pub(crate) since: i64,
    /// GPUs the gang needs (`minMember` replicas).
    pub(crate) needed: u32,
    /// When enough of the nodes are declared free; `None`: some work in the way declares no end.
    pub(crate) eta: Option<i64>,
    /// Whether the gang would borrow above its tenant's guarantee.
    pub(crate) borrows: bool,
}

/// The whole-GPU count per replica of `w`, when `w` is a gang that may reserve in `pool`.
fn gang_gpus(p: &Problem, w: usize, pool: usize) -> Option<u32> {
    let wl = &p.workloads[w];
    let info = &p.pools[pool];
    info.reservation_max_gpus?;
    if info.sharing != Sharing::Exclusive {
        return None;
    }
    let Demand::Whole { count } = wl.demand else {
        return None;
    };
    (count > 0 && count * wl.min_member >= info.gpus_per_node.max(1)).then_some(count)
}

/// Whether a limit other than the pool's size refuses gang `w` in `pool`. A limit of at least
/// the pool's GPUs (a root's, typically) refuses only what the pool could not hold anyway: that
/// is capacity, and the reservation is what frees it for the gang.
fn limited(p: &Problem, ledger: &Ledger, w: usize, pool: usize) -> bool {
    let wl = &p.workloads[w];
    match ledger.refusal(p, wl.tenant, pool, wl.amount(wl.min_member)) {
        None => false,
        Some((level, Resource::Gpus)) => {
            let limit = p.tenants[level]
                .quota
                .get(&pool)
                .map_or(Gpus::ZERO, |q| q.limit.gpus);
            limit < ledger.capacity(pool).gpus
        }
        Some((_, Resource::Cpu | Resource::Memory)) => true,
    }
}

/// Whether `w` may use GPUs held by `h` (rules (a) to (c) of the module documentation).
fn eligible(p: &Problem, s: &Solver, h: &Hold, w: usize) -> bool {
    let wl = &p.workloads[w];
    if p.classes[wl.class].preemptible {
        return true;
    }
    if let (Some(eta), Some(d)) = (h.eta, wl.max_duration_seconds)
        && p.now.saturating_add(i64::try_from(d).unwrap_or(i64::MAX)) <= eta
    {
        return true;
    }
    h.borrows
        && wl.tenant != p.workloads[h.gang].tenant
        && s.ledger
            .split(
                p,
                wl.tenant,
                h.pool,
                wl.demand.gpus() * i64::from(wl.min_member),
            )
            .1
            == Gpus::ZERO
}

/// The holds `w` may not use, by index into `s.holds`.
pub(super) fn barring(s: &Solver, w: usize) -> Vec<usize> {
    let p = s.p;
    s.holds
        .iter()
        .enumerate()
        .filter(|(_, h)| {
            h.gang != w && p.workloads[w].pools.contains(&h.pool) && !eligible(p, s, h, w)
        })
        .map(|(i, _)| i)
        .collect()
}

/// The nodes of the given holds.
pub(super) fn barred_nodes(s: &Solver, holds: &[usize]) -> Rc<BTreeSet<usize>> {
    Rc::new(
        holds
            .iter()
            .flat_map(|&i| s.holds[i].nodes.iter().copied())
            .collect(),
    )
}

/// The preemptible work on `nodes` that would yield to gang `g` (see the module
/// documentation), by index.
fn yielding(s: &Solver, g: usize, pool: usize, nodes: &[usize]) -> Vec<usize> {
    let p = s.p;
    let prio = p.classes[p.workloads[g].class].priority;
    s.running_by_pool[pool]
        .iter()
        .map(|r| r.workload)
        .filter(|&v| {
            let vl = &p.workloads[v];
            let class = &p.classes[vl.class];
            let Phase::Running { started_at, .. } = vl.phase else {
                return false;
            };
            matches!(s.status[v], Some(Status::Keep))
                && class.preemptible
                && class.priority <= prio
                && (p.now - started_at).max(0) as u64 >= class.min_runtime_seconds
                && !s.within_guarantee[v]
                && s.fleet.placed[v]
                    .as_ref()
                    .is_some_and(|sl| sl.iter().any(|x| nodes.binary_search(&x.node).is_ok()))
        })
        .collect()
}

/// When GPU `g` is declared free for a gang: now when free or held by work in `yields`, the
/// holder's declared end otherwise, `i64::MAX` when it declares none.
fn ready_at(s: &Solver, g: usize, yields: &BTreeSet<usize>) -> i64 {
    let p = s.p;
    let Some(v) = s.fleet.gpu[g].whole else {
        return p.now;
    };
    if yields.contains(&v) {
        return p.now;
    }
    let vl = &p.workloads[v];
    let Some(d) = vl.max_duration_seconds else {
        return i64::MAX;
    };
    let start = match vl.phase {
        Phase::Running { started_at, .. } if matches!(s.status[v], Some(Status::Keep)) => {
            started_at
        }
        _ => p.now,
    };
    start
        .saturating_add(i64::try_from(d).unwrap_or(i64::MAX))
        .max(p.now)
}

/// Replica slots of `nodes` for replicas of `count` GPUs: (ready at, GPUs busy on the node,
/// node), soonest first.
fn slots(
    s: &Solver,
    nodes: &[usize],
    count: u32,
    yields: &BTreeSet<usize>,
) -> Vec<(i64, u32, usize)> {
    let p = s.p;
    let mut out = Vec::new();
    for &n in nodes {
        let node = &p.nodes[n];
        if !node.healthy {
            continue;
        }
        let healthy: Vec<usize> = node
            .gpus
            .iter()
            .copied()
            .filter(|&g| p.gpus[g].healthy)
            .collect();
        let busy = healthy
            .iter()
            .filter(|&&g| !s.fleet.gpu[g].is_free())
            .count() as u32;
        let mut times: Vec<i64> = healthy.iter().map(|&g| ready_at(s, g, yields)).collect();
        times.sort_unstable();
        for k in 1..=times.len() / count as usize {
            out.push((times[k * count as usize - 1], busy, n));
        }
    }
    out.sort_unstable();
    out
}

/// The eta of `min` replicas on `nodes` and the nodes the soonest slots are on.
fn plan(
    s: &Solver,
    nodes: &[usize],
    count: u32,
    min: u32,
    yields: &BTreeSet<usize>,
) -> Option<(i64, u32, Vec<usize>)> {
    let sl = slots(s, nodes, count, yields);
    if sl.len() < min as usize {
        return None;
    }
    let taken = &sl[..min as usize];
    let eta = taken.iter().map(|x| x.0).max().unwrap_or(s.p.now);
    let busy: u32 = taken.iter().map(|x| x.1).sum();
    let mut chosen: Vec<usize> = taken.iter().map(|x| x.2).collect();
    chosen.sort_unstable();
    chosen.dedup();
    Some((eta, busy, chosen))
}

impl<'p> Solver<'p> {
    /// Called when gang `w` was left waiting: it starts by making backfill yield, or holds
    /// capacity; `None` when it may not reserve (it then waits with `reason`).
    pub(super) fn reserve(&mut self, w: usize, reason: &Reason) -> Option<Status> {
        let p = self.p;
        let wl = &p.workloads[w];
        if matches!(reason, Reason::Orphaned { .. }) || self.hold[w] {
            return None;
        }
        for &pool in &wl.pools {
            let Some(count) = gang_gpus(p, w, pool) else {
                continue;
            };
            let needed = count * wl.min_member;
            let max = p.pools[pool].reservation_max_gpus.unwrap_or(0);
            let held: u32 = self
                .holds
                .iter()
                .filter(|h| h.pool == pool)
                .map(|h| h.needed)
                .sum();
            if held + needed > max {
                continue;
            }
            // Blocked for capacity only: quota and idle guarantees are not fixed by holding GPUs.
            let amount = wl.amount(wl.min_member);
            if limited(p, &self.ledger, w, pool) {
                continue;
            }
            // Borrowing is refused while the borrow and other tenants' idle guarantees exceed
            // the free GPUs: waiting for GPUs helps unless they exceed the whole pool.
            let (_, borrowed) = self.ledger.split(p, wl.tenant, pool, amount.gpus);
            if borrowed > Gpus::ZERO
                && amount.gpus + self.ledger.reserved_by_others(p, wl.tenant, pool)
                    > self.ledger.capacity(pool).gpus
            {
                continue;
            }
            let borrows = borrowed > Gpus::ZERO;
            let taken: BTreeSet<usize> = self
                .holds
                .iter()
                .filter(|h| h.pool == pool)
                .flat_map(|h| h.nodes.iter().copied())
                .collect();
            let Some((nodes, since)) = self.reservation_nodes(w, pool, count, &taken) else {
                continue;
            };
            let victims = yielding(self, w, pool, &nodes);
            if let Some(status) = self.yield_to(w, pool, &victims) {
                return Some(status);
            }
            let yields: BTreeSet<usize> = victims.iter().copied().collect();
            let eta = plan(self, &nodes, count, wl.min_member, &yields)
                .map(|x| x.0)
                .filter(|&t| t != i64::MAX);
            let ready: u32 = nodes
                .iter()
                .flat_map(|&n| p.nodes[n].gpus.iter().copied())
                .filter(|&g| p.gpus[g].healthy && p.nodes[p.gpus[g].node].healthy)
                .filter(|&g| {
                    let st = &self.fleet.gpu[g];
                    st.is_free() || st.whole.is_some_and(|v| yields.contains(&v))
                })
                .count() as u32;
            let domains: BTreeSet<String> =
                nodes.iter().map(|&n| p.nodes[n].domain.clone()).collect();
            self.holds.push(Hold {
                gang: w,
                pool,
                nodes: nodes.clone(),
                since,
                needed,
                eta,
                borrows,
            });
            return Some(Status::Pending(Reason::Reserving {
                pool: p.pools[pool].name.clone(),
                held: ready.min(needed),
                needed,
                domains: domains.into_iter().collect(),
                nodes: nodes.iter().map(|&n| p.nodes[n].name.clone()).collect(),
                eta: eta.map(unix),
            }));
        }
        None
    }

    /// The previous decision's nodes for `w` in `pool` when still valid, else the soonest.
    fn reservation_nodes(
        &self,
        w: usize,
        pool: usize,
        count: u32,
        taken: &BTreeSet<usize>,
    ) -> Option<(Vec<usize>, i64)> {
        let p = self.p;
        let wl = &p.workloads[w];
        let usable = |n: usize| p.nodes[n].healthy && !taken.contains(&n);
        if let Some(prior) = p
            .reservations
            .iter()
            .find(|r| r.workload == w && r.pool == pool)
        {
            let one_domain = wl.topology != TopologyMode::Required
                || prior
                    .nodes
                    .iter()
                    .all(|&n| p.nodes[n].domain == p.nodes[prior.nodes[0]].domain);
            let yields: BTreeSet<usize> =
                yielding(self, w, pool, &prior.nodes).into_iter().collect();
            if one_domain
                && prior.nodes.iter().all(|&n| usable(n))
                && plan(self, &prior.nodes, count, wl.min_member, &yields).is_some()
            {
                return Some((prior.nodes.clone(), prior.since));
            }
        }
        let info = &p.pools[pool];
        let candidates: Vec<usize> = info.nodes.iter().copied().filter(|&n| usable(n)).collect();
        let sets: Vec<Vec<usize>> = if wl.topology == TopologyMode::Required {
            info.domains
                .iter()
                .map(|d| {
                    candidates
                        .iter()
                        .copied()
                        .filter(|&n| &p.nodes[n].domain == d)
                        .collect()
                })
                .collect()
        } else {
            vec![candidates]
        };
        let mut best: Option<((i64, u32), Vec<usize>)> = None;
        for set in sets {
            let yields: BTreeSet<usize> = yielding(self, w, pool, &set).into_iter().collect();
            if let Some((eta, busy, nodes)) = plan(self, &set, count, wl.min_member, &yields)
                && best.as_ref().is_none_or(|b| (eta, busy) < b.0)
            {
                best = Some(((eta, busy), nodes));
            }
        }
        best.map(|(_, nodes)| (nodes, p.now))
    }

    /// Admits gang `w` in `pool` with `victims` preempted, if that makes it fit; only the
    /// victims whose GPUs it takes are preempted.
    fn yield_to(&mut self, w: usize, pool: usize, victims: &[usize]) -> Option<Status> {
        let p = self.p;
        if victims.is_empty() {
            return None;
        }
        let all = self.admitted_without(w, pool, victims)?;
        let used: BTreeSet<usize> = all.0.placed[w]
            .iter()
            .flat_map(|sl| sl.iter().flat_map(|x| x.gpus.iter().copied()))
            .collect();
        let needed: Vec<usize> = victims
            .iter()
            .copied()
            .filter(|&v| {
                self.fleet.placed[v]
                    .iter()
                    .flat_map(|sl| sl.iter().flat_map(|x| x.gpus.iter()))
                    .any(|g| used.contains(g))
            })
            .collect();
        // Fewer victims place the gang elsewhere at worst; if not even that, all of them (the
        // what-if above: the fleet and ledger have not changed since).
        let attempt = if needed.is_empty() {
            None
        } else {
            self.admitted_without(w, pool, &needed)
        };
        let (chosen, (fleet, ledger, guaranteed, borrowed)) = match attempt {
            Some(x) => (needed, x),
            None => (victims.to_vec(), all),
        };
        for &v in &chosen {
            self.status[v] = Some(Status::Preempt(PreemptReason::Reservation {
                for_workload: p.workloads[w].key.to_string(),
            }));
        }
        self.forget_refusals();
        self.victims = chosen;
        self.fleet = fleet;
        self.ledger = ledger;
        Some(Status::Admit {
            guaranteed,
            borrowed,
        })
    }

    /// A what-if: `w` admitted in `pool` with `victims` released. The victims are released on
    /// the solver's own fleet and ledger and rolled back after (see `journal.rs`), as the
    /// preemption search's what-ifs are: a clone of the whole fleet per what-if cost its size.
    fn admitted_without(&mut self, w: usize, pool: usize, victims: &[usize]) -> Option<Admitted> {
        let p = self.p;
        let (fm, lm) = (self.fleet.mark(), self.ledger.mark());
        for &v in victims {
            self.release_victim(pool, v);
        }
        let admitted = try_pool(
            p,
            &mut self.fleet,
            &mut self.ledger,
            w,
            pool,
            p.workloads[w].replicas,
        );
        self.fleet.rollback(fm);
        self.ledger.rollback(lm);
        admitted.ok()
    }

    /// The reason for `w`, left waiting while `holds` were barred to it: [`Reason::ReservedFor`]
    /// when it would have fit without them.
    pub(super) fn reserved_reason(&self, w: usize, holds: &[usize], reason: Reason) -> Reason {
        let p = self.p;
        let wl = &p.workloads[w];
        let (mut fleet, mut ledger) = (self.fleet.clone(), self.ledger.clone());
        fleet.barred = None;
        for &i in holds {
            let h = &self.holds[i];
            if try_pool(p, &mut fleet, &mut ledger, w, h.pool, wl.replicas).is_ok() {
                return Reason::ReservedFor {
                    pool: p.pools[h.pool].name.clone(),
                    gang: p.workloads[h.gang].key.to_string(),
                    capacity: Box::new(reason),
                };
            }
        }
        reason
    }
}

/// What the decision reports about each hold, by workload key; and per pool, the GPUs left
/// idle for them.
pub(super) fn reports(s: &Solver) -> (Vec<ReservationReport>, Vec<Gpus>) {
    let p = s.p;
    let mut idle = vec![Gpus::ZERO; p.pools.len()];
    let mut out: Vec<ReservationReport> = s
        .holds
        .iter()
        .filter(|h| matches!(s.status[h.gang], Some(Status::Pending(_))))
        .map(|h| {
            let gpus = h
                .nodes
                .iter()
                .flat_map(|&n| p.nodes[n].gpus.iter().copied())
                .filter(|&g| p.gpus[g].healthy && p.nodes[p.gpus[g].node].healthy);
            let mut free = 0u32;
            let mut backfill = 0u32;
            let prio = p.classes[p.workloads[h.gang].class].priority;
            for g in gpus {
                match s.fleet.gpu[g].whole {
                    None if s.fleet.gpu[g].is_free() => free += 1,
                    Some(v) => {
                        let class = &p.classes[p.workloads[v].class];
                        if class.preemptible && class.priority <= prio {
                            backfill += 1;
                        }
                    }
                    None => {}
                }
            }
            let held_idle = free.min(h.needed);
            idle[h.pool] += Gpus::whole(i64::from(held_idle));
            ReservationReport {
                workload: p.workloads[h.gang].key.to_string(),
                pool: p.pools[h.pool].name.clone(),
                nodes: h.nodes.iter().map(|&n| p.nodes[n].name.clone()).collect(),
                since: unix(h.since),
                needed: h.needed,
                held_idle,
                backfilled: backfill.min(h.needed - held_idle),
                eta: h.eta.map(unix),
            }
        })
        .collect();
    // By (tenant, name), as the decision lists workloads, not by the shown `tenant/name`.
    out.sort_by_cached_key(|r| tessera_compiler::WorkloadKey::parse(&r.workload));
    (out, idle)
}
