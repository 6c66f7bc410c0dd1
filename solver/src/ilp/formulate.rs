//! The integer program of one [`Window`].
//!
//! Variables: per gang, admitted or not (`a`), replicas per window node (`y`), and for
//! `required` topology the NVLink domain it takes (`z`); per running workload, preempted or not
//! (`x`); per gang that could reclaim or take guaranteed work, whether it is admitted within its
//! tenant's guarantee (`g`); per tenant that admits, whether it ends above its guarantee (`b`),
//! and per tenant its reserved idle guarantee (`s`).
//!
//! Constraints, each the final-state form of a check the cycle makes when it admits (the
//! rebuild in `replay.rs` re-checks them one admission at a time, and these forms are
//! sufficient for those checks in any order):
//!
//! - a gang takes `minMember` to `replicas` replicas, or none; `required` gangs in one domain;
//!   a gang the incumbent admitted within its tenant's guarantee keeps at least its replicas
//!   (a guarantee is an entitlement, not a term of the objective);
//! - per node: GPUs, CPU and memory;
//! - per tenant and every ancestor: usage ≤ limit (GPUs, and CPU and memory where set);
//! - a tenant that ends above its guarantee borrows: the free capacity of the pool must cover
//!   what other tenants reserve (idle guarantee beyond their lending limit);
//! - a preempted workload names a beneficiary the cycle's rules allow: an admitted gang of
//!   higher priority (only a gang within its guarantee for work within guarantee), or a gang
//!   within its guarantee reclaiming another tenant's borrowed work.
//!
//! Objective: the decision's own, restricted to the window (priority × GPUs placed, minus lost
//! GPU-hours × priority of the preempted, and the GPUs they held), with a tiny cost per
//! preemption so that no workload is stopped for nothing.

use std::collections::{BTreeMap, BTreeSet};

use tessera_compiler::model::TopologyMode;
use tessera_compiler::units::Gpus;

use super::incumbent::State;
use super::model::{Linear, Model, Var};
use super::window::{Gang, Victim, Window};
use crate::heuristic::{Admission, KeepPhase, lost_units_seconds};
use crate::problem::{Demand, Problem, WorkloadInfo};
use crate::quota::Ledger;

/// A preemption that costs no lost work still costs this much, so that it is chosen only when
/// it buys something.
const PREEMPTION_COST: f64 = 1e-3;

/// GPUs, CPU cores and memory GiB: scales that keep the coefficients near one another.
const RESOURCES: usize = 3;
type Amount = [f64; RESOURCES];
const MILLIS_PER_CORE: f64 = 1000.0;
const BYTES_PER_GIB: f64 = (1u64 << 30) as f64;

fn amount(gpus: Gpus, cpu_millis: u64, memory_bytes: u64) -> Amount {
    [
        gpus.as_f64(),
        cpu_millis as f64 / MILLIS_PER_CORE,
        memory_bytes as f64 / BYTES_PER_GIB,
    ]
}

/// One replica of `wl`.
fn per_replica(wl: &WorkloadInfo) -> Amount {
    amount(wl.demand.gpus(), wl.cpu.0, wl.memory.0)
}

pub struct Formulation {
    pub model: Model,
    gangs: Vec<GangVars>,
    victims: Vec<(usize, Var)>,
    /// Auxiliary variables, each a function of the choices above (for the start point).
    aux: Vec<(Var, Aux)>,
    /// GPUs used per tenant in the pool, descendants included.
    usage: BTreeMap<usize, Linear>,
}

struct GangVars {
    workload: usize,
    admit: Var,
    per_node: Vec<(usize, Var)>,
}

enum Aux {
    /// The gang (by position) sits in this NVLink domain.
    Domain(usize, String),
    /// The gang (by position) is admitted and its tenant ends within its guarantee.
    Guaranteed(usize),
    /// One of the tenant's gangs is admitted.
    Admits(usize),
    /// The tenant admits (the expression: 1 or its `Admits` variable) and ends above its
    /// guarantee.
    Borrows(usize, Linear),
    /// The tenant's reserved idle guarantee, `max(0, guarantee − lending − usage)`.
    Reserved(usize, f64),
}

pub fn formulate(p: &Problem, win: &Window, states: &[State], keep: &KeepPhase) -> Formulation {
    let mut b = Builder {
        p,
        win,
        states,
        pool: win.pool,
        m: Model::default(),
        aux: Vec::new(),
        gangs: Vec::new(),
        victims: Vec::new(),
        usage: BTreeMap::new(),
        node_use: BTreeMap::new(),
        guaranteed: BTreeMap::new(),
    };
    for g in &win.gangs {
        b.gang(g);
    }
    for v in &win.victims {
        b.victim(v);
    }
    b.nodes();
    b.limits();
    b.borrowing();
    for (i, v) in win.victims.iter().enumerate() {
        b.beneficiary(i, v, keep.within_guarantee[v.workload]);
    }
    let mut f = Formulation {
        model: b.m,
        gangs: b.gangs,
        victims: b.victims,
        aux: b.aux,
        usage: b
            .usage
            .into_iter()
            .map(|(t, [gpus, ..])| (t, gpus))
            .collect(),
    };
    f.start(p, win, win.pool);
    f
}

struct Builder<'a> {
    p: &'a Problem,
    win: &'a Window,
    states: &'a [State],
    pool: usize,
    m: Model,
    aux: Vec<(Var, Aux)>,
    gangs: Vec<GangVars>,
    victims: Vec<(usize, Var)>,
    /// Per tenant whose usage the window changes: GPUs, CPU and memory, descendants included.
    usage: BTreeMap<usize, [Linear; RESOURCES]>,
    /// Per window node: what the window's workloads hold there.
    node_use: BTreeMap<usize, [Linear; RESOURCES]>,
    /// Per gang (workload), its "admitted within guarantee" flag, made when first needed.
    guaranteed: BTreeMap<usize, Var>,
}

impl Builder<'_> {
    /// `count` of the window's workload `wl` (an expression) held by its tenant and ancestors.
    fn charge(&mut self, wl: &WorkloadInfo, count: &Linear) {
        let each = per_replica(wl);
        for &t in &self.p.tenants[wl.tenant].lineage {
            let u = self.usage.entry(t).or_default();
            for r in 0..RESOURCES {
                u[r].add_all(count, each[r]);
            }
        }
    }

    fn hold(&mut self, node: usize, count: &Linear, each: Amount) {
        let u = self.node_use.entry(node).or_default();
        for r in 0..RESOURCES {
            u[r].add_all(count, each[r]);
        }
    }

    /// A gang: admitted or not, replicas per node, its domain when `required`.
    fn gang(&mut self, gang: &Gang) {
        let p = self.p;
        let wl = &p.workloads[gang.workload];
        let prio = p.classes[wl.class].priority as f64;
        let gpus_per_replica = match wl.demand {
            Demand::Whole { count } => count,
            _ => 1,
        };
        let admit = self.m.binary(0.0);
        let mut replicas = Linear::default();
        let mut per_node = Vec::new();
        for &n in &self.win.nodes {
            if self.win.room[&n].gpus + held_by_victims(self.win, n) < gpus_per_replica {
                continue;
            }
            let y = self
                .m
                .integer(wl.replicas, prio * wl.demand.gpus().as_f64());
            replicas.add(y, 1.0);
            per_node.push((n, y));
            let mut each = per_replica(wl);
            // Whole GPUs of the node, by count (the quota counts the same).
            each[0] = f64::from(gpus_per_replica);
            self.hold(n, &Linear::term(y, 1.0), each);
        }
        let admitted = Linear::term(admit, 1.0);
        let mut least = Linear::term(admit, f64::from(wl.min_member));
        if gang.entitled {
            let kept: u32 = gang
                .incumbent
                .iter()
                .flat_map(|pl| pl.nodes.values())
                .map(|h| h.replicas)
                .sum();
            least = Linear::constant(f64::from(kept.max(wl.min_member)));
            self.m.ge(&admitted, &Linear::constant(1.0));
        }
        self.m.ge(&replicas, &least);
        self.m
            .le(&replicas, &Linear::term(admit, f64::from(wl.replicas)));
        let domains: BTreeSet<&str> = self
            .win
            .nodes
            .iter()
            .map(|&n| p.nodes[n].domain.as_str())
            .collect();
        if wl.topology == TopologyMode::Required && domains.len() > 1 {
            let mut chosen = Linear::default();
            for d in domains {
                let z = self.m.binary(0.0);
                self.aux
                    .push((z, Aux::Domain(self.gangs.len(), d.to_owned())));
                chosen.add(z, 1.0);
                // Replicas outside domain d only when z is off: Σ outside ≤ R (1 − z).
                let mut outside = Linear::default();
                for &(n, y) in &per_node {
                    if p.nodes[n].domain != d {
                        outside.add(y, 1.0);
                    }
                }
                let mut room = Linear::constant(f64::from(wl.replicas));
                room.add(z, -f64::from(wl.replicas));
                self.m.le(&outside, &room);
            }
            self.m.eq(&chosen, &admitted);
        }
        self.charge(wl, &replicas);
        self.gangs.push(GangVars {
            workload: gang.workload,
            admit,
            per_node,
        });
    }

    /// A running workload: what it holds stays unless it is preempted.
    fn victim(&mut self, v: &Victim) {
        let p = self.p;
        let vl = &p.workloads[v.workload];
        let prio = p.classes[vl.class].priority as f64;
        let held = vl.amount(vl.replicas).gpus.as_f64();
        let lost = lost_units_seconds(p, v.workload) as f64 / Gpus::UNITS_PER_GPU as f64 / 3600.0;
        let x = self.m.binary(-prio * (held + lost) - PREEMPTION_COST);
        let mut stays = Linear::constant(1.0);
        stays.add(x, -1.0);
        for (&n, h) in &v.placement.nodes {
            let mut each = per_replica(vl);
            each[0] = f64::from(h.healthy_gpus) / f64::from(h.replicas.max(1));
            let mut on_node = Linear::default();
            on_node.add_all(&stays, f64::from(h.replicas));
            self.hold(n, &on_node, each);
        }
        let mut replicas = Linear::default();
        replicas.add_all(&stays, f64::from(vl.replicas));
        self.charge(vl, &replicas);
        self.victims.push((v.workload, x));
    }

    /// Per node: what the window holds fits the room the rest leaves.
    fn nodes(&mut self) {
        for &n in &self.win.nodes {
            let room = self.win.room[&n];
            let cap = amount(
                Gpus::whole(i64::from(room.gpus)),
                room.cpu_millis,
                room.memory_bytes,
            );
            if let Some(used) = self.node_use.get(&n) {
                for r in 0..RESOURCES {
                    self.m.le(&used[r], &Linear::constant(cap[r]));
                }
            }
        }
    }

    /// Per tenant whose usage the window changes: fixed usage plus the window's ≤ limit.
    fn limits(&mut self) {
        let (p, pool) = (self.p, self.pool);
        let tenants: Vec<usize> = self.usage.keys().copied().collect();
        for t in tenants {
            let f = self.win.fixed.usage(t, pool);
            let fixed = amount(
                f.gpus,
                f.cpu.unwrap_or_default().0,
                f.memory.unwrap_or_default().0,
            );
            let used = self.usage.get_mut(&t).expect("listed above");
            for r in 0..RESOURCES {
                used[r].constant += fixed[r];
            }
            let used = used.clone();
            let Some(q) = p.tenants[t].quota.get(&pool) else {
                self.forbid_below(t);
                continue;
            };
            let limit = [
                Some(q.limit.gpus.as_f64()),
                q.limit.cpu.map(|c| c.0 as f64 / MILLIS_PER_CORE),
                q.limit.memory.map(|b| b.0 as f64 / BYTES_PER_GIB),
            ];
            for r in 0..RESOURCES {
                let Some(limit) = limit[r] else { continue };
                // Work that cannot move already exceeds a lowered limit: nothing more goes below.
                if used[r].constant > limit + 1e-9 {
                    self.forbid_below(t);
                } else {
                    self.m.le(&used[r], &Linear::constant(limit));
                }
            }
        }
    }

    fn forbid_below(&mut self, t: usize) {
        for g in &self.gangs {
            if self.p.tenants[self.p.workloads[g.workload].tenant]
                .lineage
                .contains(&t)
            {
                self.m
                    .le(&Linear::term(g.admit, 1.0), &Linear::constant(0.0));
            }
        }
    }

    fn gpus_used(&self, t: usize) -> Linear {
        match self.usage.get(&t) {
            Some(u) => u[0].clone(),
            None => Linear::constant(self.win.fixed.usage(t, self.pool).gpus.as_f64()),
        }
    }

    /// A tenant that admits and ends above its guarantee borrows: the pool's free GPUs must
    /// cover every other tenant's reservation.
    fn borrowing(&mut self) {
        let (p, pool) = (self.p, self.pool);
        let reserved = self.reservations();
        let capacity = self.win.fixed.capacity(pool).gpus.as_f64();
        let mut free = Linear::constant(capacity);
        for (t, info) in p.tenants.iter().enumerate() {
            if info.parent.is_none() {
                free.add_all(&self.gpus_used(t), -1.0);
            }
        }
        let big = capacity + reserved.values().map(|r| r.1).sum::<f64>() + 1.0;
        for (t, admits) in self.admitting() {
            let others = others(p, t);
            let mut claim = Linear::default();
            for (o, (e, _)) in &reserved {
                if others.contains(o) {
                    claim.add_all(e, 1.0);
                }
            }
            if claim.terms.is_empty() && claim.constant <= 0.0 {
                continue;
            }
            let b = self.m.binary(0.0);
            self.aux.push((b, Aux::Borrows(t, admits.clone())));
            let guarantee = Ledger::guarantee(p, t, pool).as_f64();
            // used ≤ guarantee + big·b + big·(1 − admits): a tenant that admits nothing is
            // not checked, whatever it runs.
            let mut rhs = Linear::constant(guarantee + big);
            rhs.add(b, big);
            rhs.add_all(&admits, -big);
            self.m.le(&self.gpus_used(t), &rhs);
            // claim ≤ free + big·(1 − b)
            let mut rhs = free.clone();
            rhs.constant += big;
            rhs.add(b, -big);
            self.m.le(&claim, &rhs);
        }
    }

    /// Per tenant that may admit in the pool: 1 when the incumbent admits one of its gangs
    /// outside the window, otherwise a variable on only when one of its gangs is admitted.
    fn admitting(&mut self) -> BTreeMap<usize, Linear> {
        let p = self.p;
        let mut out: BTreeMap<usize, Linear> = BTreeMap::new();
        for (w, st) in self.states.iter().enumerate() {
            if matches!(st, State::Admitted(pl, _) if pl.pool == self.pool)
                && !self.gangs.iter().any(|g| g.workload == w)
            {
                out.insert(p.workloads[w].tenant, Linear::constant(1.0));
            }
        }
        let tenants: BTreeSet<usize> = self
            .gangs
            .iter()
            .map(|g| p.workloads[g.workload].tenant)
            .collect();
        for t in tenants {
            if out.contains_key(&t) {
                continue;
            }
            let on = self.m.binary(0.0);
            self.aux.push((on, Aux::Admits(t)));
            let o = Linear::term(on, 1.0);
            let mut any = Linear::default();
            for g in self
                .gangs
                .iter()
                .filter(|g| p.workloads[g.workload].tenant == t)
            {
                any.add(g.admit, 1.0);
                self.m.ge(&o, &Linear::term(g.admit, 1.0));
            }
            self.m.le(&o, &any);
            out.insert(t, o);
        }
        out
    }

    /// Per tenant with a reservation possible: `(its reservation, its largest value)`, a
    /// constant or a variable `s ≥ guarantee − lending − usage, s ≥ 0` (the claim only grows
    /// with `s`, so the search keeps it at the max).
    fn reservations(&mut self) -> BTreeMap<usize, (Linear, f64)> {
        let (p, pool) = (self.p, self.pool);
        let mut out = BTreeMap::new();
        for (t, info) in p.tenants.iter().enumerate() {
            let Some(q) = info.quota.get(&pool) else {
                continue;
            };
            let idle_max = q
                .guarantee
                .gpus
                .saturating_sub(q.lending_limit.gpus)
                .as_f64();
            if idle_max <= 0.0 {
                continue;
            }
            let used = self.gpus_used(t);
            if used.terms.is_empty() {
                let r = (idle_max - used.constant).max(0.0);
                if r > 0.0 {
                    out.insert(t, (Linear::constant(r), r));
                }
                continue;
            }
            let s = self.m.continuous(idle_max);
            self.aux.push((s, Aux::Reserved(t, idle_max)));
            let mut floor = Linear::constant(idle_max);
            floor.add_all(&used, -1.0);
            self.m.ge(&Linear::term(s, 1.0), &floor);
            out.insert(t, (Linear::term(s, 1.0), idle_max));
        }
        out
    }

    /// The `i`-th victim is preempted only for a gang the cycle's rules allow: one of higher
    /// priority (within its guarantee if the victim is and the two tenants differ), or one
    /// within its guarantee reclaiming another tenant's borrowed work.
    fn beneficiary(&mut self, i: usize, v: &Victim, within: bool) {
        let p = self.p;
        let vl = &p.workloads[v.workload];
        let vprio = p.classes[vl.class].priority;
        // A gang the incumbent admits in the pool outside the window, of higher priority,
        // covers a borrowed victim (or one of its own tenant's) whatever the window does.
        let covered = self.states.iter().enumerate().any(|(w, st)| {
            matches!(st, State::Admitted(pl, _) if pl.pool == self.pool)
                && !self.win.gangs.iter().any(|g| g.workload == w)
                && p.classes[p.workloads[w].class].priority > vprio
                && (!within || p.workloads[w].tenant == vl.tenant)
        });
        if covered {
            return;
        }
        let mut by = Linear::default();
        for gi in 0..self.gangs.len() {
            let wl = &p.workloads[self.gangs[gi].workload];
            let prio = p.classes[wl.class].priority;
            if prio > vprio && (!within || wl.tenant == vl.tenant) {
                by.add(self.gangs[gi].admit, 1.0);
            } else if prio > vprio || (!within && wl.tenant != vl.tenant) {
                let flag = self.guaranteed_flag(gi);
                by.add(flag, 1.0);
            }
        }
        let x = self.victims[i].1;
        self.m.le(&Linear::term(x, 1.0), &by);
    }

    /// `g = 1` only if the gang is admitted and its tenant ends within its guarantee.
    fn guaranteed_flag(&mut self, gi: usize) -> Var {
        let w = self.gangs[gi].workload;
        if let Some(&f) = self.guaranteed.get(&w) {
            return f;
        }
        let t = self.p.workloads[w].tenant;
        let flag = self.m.binary(0.0);
        self.aux.push((flag, Aux::Guaranteed(gi)));
        self.m.le(
            &Linear::term(flag, 1.0),
            &Linear::term(self.gangs[gi].admit, 1.0),
        );
        let big = self.win.fixed.capacity(self.pool).gpus.as_f64();
        let mut rhs = Linear::constant(Ledger::guarantee(self.p, t, self.pool).as_f64() + big);
        rhs.add(flag, -big);
        self.m.le(&self.gpus_used(t), &rhs);
        self.guaranteed.insert(w, flag);
        flag
    }
}

/// Tenants outside `t`'s lineage whose reservations a borrower of `t` must respect: the
/// siblings of `t` and of each ancestor, and the other roots (disjoint subtrees).
fn others(p: &Problem, t: usize) -> BTreeSet<usize> {
    let lineage = &p.tenants[t].lineage;
    p.tenants
        .iter()
        .enumerate()
        .filter(|(o, info)| {
            !lineage.contains(o) && info.parent.is_none_or(|parent| lineage.contains(&parent))
        })
        .map(|(o, _)| o)
        .collect()
}

fn held_by_victims(win: &Window, n: usize) -> u32 {
    win.victims
        .iter()
        .filter_map(|v| v.placement.nodes.get(&n))
        .map(|h| h.healthy_gpus)
        .sum()
}

impl Formulation {
    /// The incumbent as a start point, so that the search starts from the heuristic's value.
    fn start(&mut self, p: &Problem, win: &Window, pool: usize) {
        let m = &mut self.model;
        for (g, gv) in win.gangs.iter().zip(&self.gangs) {
            if let Some(pl) = &g.incumbent {
                m.start[gv.admit.0] = 1.0;
                for &(n, y) in &gv.per_node {
                    m.start[y.0] = pl.nodes.get(&n).map_or(0.0, |h| f64::from(h.replicas));
                }
            }
        }
        for (v, &(_, x)) in win.victims.iter().zip(&self.victims) {
            m.start[x.0] = if v.preempted { 1.0 } else { 0.0 };
        }
        let mut x = m.start.clone();
        let own = |x: &[f64], t: usize| self.usage.get(&t).map_or(0.0, |e| e.eval(x));
        let within =
            |x: &[f64], t: usize| own(x, t) <= Ledger::guarantee(p, t, pool).as_f64() + 1e-9;
        // In creation order, so that `Borrows` sees the `Admits` it depends on.
        for (var, a) in &self.aux {
            let on = |b: bool| if b { 1.0 } else { 0.0 };
            x[var.0] = match a {
                Aux::Domain(g, d) => {
                    let gv = &self.gangs[*g];
                    on(x[gv.admit.0] > 0.5
                        && gv
                            .per_node
                            .iter()
                            .all(|&(n, y)| x[y.0] < 0.5 || p.nodes[n].domain == *d))
                }
                Aux::Guaranteed(g) => {
                    let gv = &self.gangs[*g];
                    on(x[gv.admit.0] > 0.5 && within(&x, p.workloads[gv.workload].tenant))
                }
                Aux::Admits(t) => on(self
                    .gangs
                    .iter()
                    .any(|g| p.workloads[g.workload].tenant == *t && x[g.admit.0] > 0.5)),
                Aux::Borrows(t, admits) => on(admits.eval(&x) > 0.5 && !within(&x, *t)),
                Aux::Reserved(t, idle_max) => (idle_max - own(&x, *t)).max(0.0),
            };
        }
        m.start = x;
    }

    /// The window's part of a directive: the gangs admitted (with their nodes), the running
    /// workloads preempted, and the gangs left waiting.
    pub fn read(&self, pool: usize, values: &[f64]) -> (Vec<Admission>, Vec<usize>, Vec<usize>) {
        let on = |v: Var| values.get(v.0).is_some_and(|x| *x > 0.5);
        let admit = self
            .gangs
            .iter()
            .filter(|g| on(g.admit))
            .map(|g| Admission {
                workload: g.workload,
                pool,
                nodes: g
                    .per_node
                    .iter()
                    .map(|&(n, y)| (n, values[y.0].round().max(0.0) as u32))
                    .filter(|&(_, r)| r > 0)
                    .collect(),
            })
            .collect();
        let preempt = self
            .victims
            .iter()
            .filter(|&&(_, x)| on(x))
            .map(|&(w, _)| w)
            .collect();
        let hold = self
            .gangs
            .iter()
            .filter(|g| !on(g.admit))
            .map(|g| g.workload)
            .collect();
        (admit, preempt, hold)
    }

    /// The workloads the program decides: gangs, then running workloads.
    pub fn workloads(&self) -> impl Iterator<Item = usize> + '_ {
        self.gangs
            .iter()
            .map(|g| g.workload)
            .chain(self.victims.iter().map(|v| v.0))
    }

    pub fn gangs(&self) -> usize {
        self.gangs.len()
    }
    pub fn victims(&self) -> usize {
        self.victims.len()
    }
}
