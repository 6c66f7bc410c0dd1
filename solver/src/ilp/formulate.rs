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
use super::window::Window;
use crate::heuristic::{Admission, KeepPhase, lost_units_seconds};
use crate::problem::Problem;

/// A preemption that costs no lost work still costs this much, so that it is chosen only when
/// it buys something.
const PREEMPTION_COST: f64 = 1e-3;

/// Scales that keep CPU (cores) and memory (GiB) coefficients near the GPU counts.
const MILLIS_PER_CORE: f64 = 1000.0;
const BYTES_PER_GIB: f64 = (1u64 << 30) as f64;

pub struct Formulation {
    pub model: Model,
    gangs: Vec<GangVars>,
    victims: Vec<(usize, Var)>,
    /// Auxiliary variables, each a function of the choices above (for the start point).
    aux: Vec<(Var, Aux)>,
    /// Usage per tenant in the pool, as an expression.
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
    /// The tenant admits (the expression: 1 or its `Admits` variable) and ends above its
    /// guarantee.
    Borrows(usize, Linear),
    /// One of the tenant's gangs is admitted.
    Admits(usize),
    /// The tenant's reserved idle guarantee, `max(0, guarantee − lending − usage)`.
    Reserved(usize, f64),
}

fn gpus(g: Gpus) -> f64 {
    g.as_f64()
}

pub fn formulate(p: &Problem, win: &Window, states: &[State], keep: &KeepPhase) -> Formulation {
    let pool = win.pool;
    let mut m = Model::default();
    let capacity = gpus(win.fixed.capacity(pool).gpus);
    // Usage of each tenant in the pool, descendants included, as an expression.
    let mut usage: BTreeMap<usize, Linear> = BTreeMap::new();
    let mut cpu_use: BTreeMap<usize, Linear> = BTreeMap::new();
    let mut mem_use: BTreeMap<usize, Linear> = BTreeMap::new();
    let mut node_gpus: BTreeMap<usize, Linear> = BTreeMap::new();
    let mut node_cpu: BTreeMap<usize, Linear> = BTreeMap::new();
    let mut node_mem: BTreeMap<usize, Linear> = BTreeMap::new();
    let mut charge = |tenant: usize, e: &Linear, wl: &crate::problem::WorkloadInfo| {
        for &t in &p.tenants[tenant].lineage {
            usage
                .entry(t)
                .or_default()
                .add_all(e, gpus(wl.demand.gpus()));
            cpu_use
                .entry(t)
                .or_default()
                .add_all(e, wl.cpu.0 as f64 / MILLIS_PER_CORE);
            mem_use
                .entry(t)
                .or_default()
                .add_all(e, wl.memory.0 as f64 / BYTES_PER_GIB);
        }
    };

    // Gangs.
    let domains_of_window: BTreeSet<&str> = win
        .nodes
        .iter()
        .map(|&n| p.nodes[n].domain.as_str())
        .collect();
    let mut gangs = Vec::new();
    let mut aux = Vec::new();
    for gang in &win.gangs {
        let w = gang.workload;
        let wl = &p.workloads[w];
        let per_replica = gpus(wl.demand.gpus());
        let prio = p.classes[wl.class].priority as f64;
        let count = match wl.demand {
            crate::problem::Demand::Whole { count } => count,
            _ => 1,
        };
        let admit = m.binary(0.0);
        let mut replicas = Linear::default();
        let mut per_node = Vec::new();
        for &n in &win.nodes {
            if win.room[&n].gpus + held_by_victims(win, n) < count {
                continue;
            }
            let y = m.integer(wl.replicas, prio * per_replica);
            replicas.add(y, 1.0);
            per_node.push((n, y));
            let mut e = Linear::default();
            e.add(y, 1.0);
            node_gpus
                .entry(n)
                .or_default()
                .add_all(&e, f64::from(count));
            node_cpu
                .entry(n)
                .or_default()
                .add_all(&e, wl.cpu.0 as f64 / MILLIS_PER_CORE);
            node_mem
                .entry(n)
                .or_default()
                .add_all(&e, wl.memory.0 as f64 / BYTES_PER_GIB);
        }
        let mut lo = Linear::default();
        lo.add(admit, f64::from(wl.min_member));
        let mut hi = Linear::default();
        hi.add(admit, f64::from(wl.replicas));
        m.ge(&replicas, &lo);
        m.le(&replicas, &hi);
        if gang.entitled {
            let kept: u32 = gang
                .incumbent
                .iter()
                .flat_map(|pl| pl.nodes.values())
                .map(|h| h.replicas)
                .sum();
            m.ge(&replicas, &Linear::constant(f64::from(kept)));
        }
        if wl.topology == TopologyMode::Required && domains_of_window.len() > 1 {
            let mut one = Linear::default();
            for d in &domains_of_window {
                let z = m.binary(0.0);
                aux.push((z, Aux::Domain(gangs.len(), (*d).to_owned())));
                one.add(z, 1.0);
                let mut inside = Linear::default();
                for &(n, y) in &per_node {
                    if p.nodes[n].domain == *d {
                        inside.add(y, 1.0);
                    }
                }
                // Replicas outside domain d only when z_d is off: Σ_outside y ≤ R (1 − z_d).
                let mut outside = replicas.clone();
                outside.add_all(&inside, -1.0);
                let mut room = Linear::constant(f64::from(wl.replicas));
                room.add(z, -f64::from(wl.replicas));
                m.le(&outside, &room);
            }
            let mut a = Linear::default();
            a.add(admit, 1.0);
            m.eq(&one, &a);
        }
        charge(wl.tenant, &replicas, wl);
        gangs.push(GangVars {
            workload: w,
            admit,
            per_node,
        });
    }

    // Running workloads that may be preempted: what they hold stays unless x = 1.
    let mut victims = Vec::new();
    for v in &win.victims {
        let vl = &p.workloads[v.workload];
        let prio = p.classes[vl.class].priority as f64;
        let held = gpus(vl.amount(vl.replicas).gpus);
        let lost = lost_units_seconds(p, v.workload) as f64 / Gpus::UNITS_PER_GPU as f64 / 3600.0;
        let x = m.binary(-prio * (held + lost) - PREEMPTION_COST);
        let mut stays = Linear::constant(1.0);
        stays.add(x, -1.0);
        for (&n, h) in &v.placement.nodes {
            node_gpus
                .entry(n)
                .or_default()
                .add_all(&stays, f64::from(h.healthy_gpus));
            node_cpu.entry(n).or_default().add_all(
                &stays,
                (vl.cpu.0 * u64::from(h.replicas)) as f64 / MILLIS_PER_CORE,
            );
            node_mem.entry(n).or_default().add_all(
                &stays,
                (vl.memory.0 * u64::from(h.replicas)) as f64 / BYTES_PER_GIB,
            );
        }
        let mut replicas = Linear::default();
        replicas.add_all(&stays, f64::from(vl.replicas));
        charge(vl.tenant, &replicas, vl);
        victims.push((v.workload, x));
    }

    // Nodes.
    for &n in &win.nodes {
        let room = win.room[&n];
        for (map, cap) in [
            (&node_gpus, f64::from(room.gpus)),
            (&node_cpu, room.cpu_millis as f64 / MILLIS_PER_CORE),
            (&node_mem, room.memory_bytes as f64 / BYTES_PER_GIB),
        ] {
            if let Some(e) = map.get(&n) {
                m.le(e, &Linear::constant(cap));
            }
        }
    }

    // Every tenant whose usage the window can change: fixed usage plus the window's.
    let tenants: Vec<usize> = usage.keys().copied().collect();
    for &t in &tenants {
        let fixed = win.fixed.usage(t, pool);
        // `charge` gave every tenant of the window an entry in all three maps.
        for (map, amount) in [
            (&mut usage, gpus(fixed.gpus)),
            (
                &mut cpu_use,
                fixed.cpu.unwrap_or_default().0 as f64 / MILLIS_PER_CORE,
            ),
            (
                &mut mem_use,
                fixed.memory.unwrap_or_default().0 as f64 / BYTES_PER_GIB,
            ),
        ] {
            if let Some(e) = map.get_mut(&t) {
                e.constant += amount;
            }
        }
        let Some(q) = p.tenants[t].quota.get(&pool) else {
            // No quota: nothing may be admitted below it.
            forbid_below(p, &mut m, &gangs, t);
            continue;
        };
        let limits = [
            (&usage, Some(gpus(q.limit.gpus))),
            (&cpu_use, q.limit.cpu.map(|c| c.0 as f64 / MILLIS_PER_CORE)),
            (&mem_use, q.limit.memory.map(|b| b.0 as f64 / BYTES_PER_GIB)),
        ];
        for (map, limit) in limits {
            let (Some(limit), Some(e)) = (limit, map.get(&t)) else {
                continue;
            };
            // Work that cannot move already exceeds a lowered limit: nothing more goes below.
            if e.constant > limit + 1e-9 {
                forbid_below(p, &mut m, &gangs, t);
            } else {
                m.le(e, &Linear::constant(limit));
            }
        }
    }

    // Borrowing: a tenant that admits and ends above its guarantee needs the pool's free
    // capacity to cover every other tenant's reservation.
    let reserved = reservations(p, &mut m, win, &usage, pool, &mut aux);
    let mut pool_usage = Linear::default();
    for (t, info) in p.tenants.iter().enumerate() {
        if info.parent.is_none() {
            match usage.get(&t) {
                Some(e) => pool_usage.add_all(e, 1.0),
                None => pool_usage.constant += gpus(win.fixed.usage(t, pool).gpus),
            }
        }
    }
    let mut free = Linear::constant(capacity);
    free.add_all(&pool_usage, -1.0);
    // Who admits: the window's gangs (when chosen) and the incumbent's gangs outside it.
    let mut admitting: BTreeMap<usize, Linear> = BTreeMap::new();
    for g in &gangs {
        admitting.entry(p.workloads[g.workload].tenant).or_default();
    }
    for (w, st) in states.iter().enumerate() {
        if matches!(st, State::Admitted(pl, _) if pl.pool == pool)
            && !gangs.iter().any(|g| g.workload == w)
        {
            admitting.insert(p.workloads[w].tenant, Linear::constant(1.0));
        }
    }
    let big = capacity + reserved.iter().map(|r| r.1.1).sum::<f64>() + 1.0;
    for (&t, admits) in &mut admitting {
        if admits.terms.is_empty() && admits.constant == 0.0 {
            // On only if one of the tenant's gangs is admitted.
            let on = m.binary(0.0);
            aux.push((on, Aux::Admits(t)));
            let mut sum = Linear::default();
            for g in gangs.iter().filter(|g| p.workloads[g.workload].tenant == t) {
                sum.add(g.admit, 1.0);
                let mut a = Linear::default();
                a.add(g.admit, 1.0);
                let mut o = Linear::default();
                o.add(on, 1.0);
                m.ge(&o, &a);
            }
            let mut o = Linear::default();
            o.add(on, 1.0);
            m.le(&o, &sum);
            *admits = o;
        }
    }
    for (&t, admits) in &admitting {
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
        let b = m.binary(0.0);
        aux.push((b, Aux::Borrows(t, admits.clone())));
        let guarantee = gpus(crate::quota::Ledger::guarantee(p, t, pool));
        let own = usage.get(&t).cloned().unwrap_or_default();
        // own ≤ guarantee + big·b + big·(1 − admits): a tenant that admits nothing is not
        // checked, whatever it runs.
        let mut rhs = Linear::constant(guarantee + big);
        rhs.add(b, big);
        rhs.add_all(admits, -big);
        m.le(&own, &rhs);
        // claim ≤ free + big·(1 − b)
        let mut rhs = free.clone();
        rhs.constant += big;
        rhs.add(b, -big);
        m.le(&claim, &rhs);
    }

    // Preemptions need a beneficiary.
    let mut within_flag: BTreeMap<usize, Var> = BTreeMap::new();
    let positions: BTreeMap<usize, usize> = gangs
        .iter()
        .enumerate()
        .map(|(i, g)| (g.workload, i))
        .collect();
    for (vi, v) in win.victims.iter().enumerate() {
        let vw = v.workload;
        let vl = &p.workloads[vw];
        let vprio = p.classes[vl.class].priority;
        let within = keep.within_guarantee[vw];
        // A gang the incumbent admits elsewhere in the pool, of higher priority, covers a
        // borrowed victim whatever the window does.
        let covered = !within
            && states.iter().enumerate().any(|(w, st)| {
                matches!(st, State::Admitted(pl, _) if pl.pool == pool)
                    && !win.gangs.iter().any(|g| g.workload == w)
                    && p.classes[p.workloads[w].class].priority > vprio
            });
        if covered {
            continue;
        }
        let mut by = Linear::default();
        for g in &gangs {
            let wl = &p.workloads[g.workload];
            let prio = p.classes[wl.class].priority;
            if prio > vprio && !within {
                by.add(g.admit, 1.0);
            } else if prio > vprio || (!within && wl.tenant != vl.tenant) {
                let f = *within_flag.entry(g.workload).or_insert_with(|| {
                    let f = guaranteed_flag(p, &mut m, g, &usage, pool, capacity);
                    aux.push((f, Aux::Guaranteed(positions[&g.workload])));
                    f
                });
                by.add(f, 1.0);
            }
        }
        let mut x = Linear::default();
        x.add(victims[vi].1, 1.0);
        m.le(&x, &by);
    }

    let mut f = Formulation {
        model: m,
        gangs,
        victims,
        aux,
        usage,
    };
    f.start(p, win, pool);
    f
}

/// `g = 1` only if the gang is admitted and its tenant ends within its guarantee.
fn guaranteed_flag(
    p: &Problem,
    m: &mut Model,
    g: &GangVars,
    usage: &BTreeMap<usize, Linear>,
    pool: usize,
    big: f64,
) -> Var {
    let t = p.workloads[g.workload].tenant;
    let flag = m.binary(0.0);
    let mut f = Linear::default();
    f.add(flag, 1.0);
    let mut a = Linear::default();
    a.add(g.admit, 1.0);
    m.le(&f, &a);
    let guarantee = gpus(crate::quota::Ledger::guarantee(p, t, pool));
    let own = usage.get(&t).cloned().unwrap_or_default();
    let mut rhs = Linear::constant(guarantee + big);
    rhs.add(flag, -big);
    m.le(&own, &rhs);
    flag
}

fn forbid_below(p: &Problem, m: &mut Model, gangs: &[GangVars], t: usize) {
    for g in gangs {
        if p.tenants[p.workloads[g.workload].tenant]
            .lineage
            .contains(&t)
        {
            let mut a = Linear::default();
            a.add(g.admit, 1.0);
            m.le(&a, &Linear::constant(0.0));
        }
    }
}

/// Per tenant with a reservation possible: `(expression of its reservation, its largest
/// value)`, where the expression is a variable `s ≥ guarantee − lending − usage, s ≥ 0` (the
/// claim only grows with `s`, so the solver sets it to the max) or a constant.
fn reservations(
    p: &Problem,
    m: &mut Model,
    win: &Window,
    usage: &BTreeMap<usize, Linear>,
    pool: usize,
    aux: &mut Vec<(Var, Aux)>,
) -> BTreeMap<usize, (Linear, f64)> {
    let mut out = BTreeMap::new();
    for (t, info) in p.tenants.iter().enumerate() {
        let Some(q) = info.quota.get(&pool) else {
            continue;
        };
        let idle_max = gpus(q.guarantee.gpus.saturating_sub(q.lending_limit.gpus));
        if idle_max <= 0.0 {
            continue;
        }
        match usage.get(&t) {
            None => {
                let fixed = gpus(win.fixed.usage(t, pool).gpus);
                let r = (idle_max - fixed).max(0.0);
                if r > 0.0 {
                    out.insert(t, (Linear::constant(r), r));
                }
            }
            Some(e) => {
                let s = m.continuous(idle_max);
                aux.push((s, Aux::Reserved(t, idle_max)));
                let mut sv = Linear::default();
                sv.add(s, 1.0);
                let mut floor = Linear::constant(idle_max);
                floor.add_all(e, -1.0);
                m.ge(&sv, &floor);
                out.insert(t, (sv, idle_max));
            }
        }
    }
    out
}

/// Tenants outside `t`'s lineage whose reservations a borrower of `t` must respect: the
/// siblings of `t` and of each ancestor, and the other roots (disjoint subtrees).
fn others(p: &Problem, t: usize) -> BTreeSet<usize> {
    let lineage = &p.tenants[t].lineage;
    p.tenants
        .iter()
        .enumerate()
        .filter(|(o, info)| {
            !lineage.contains(o)
                && match info.parent {
                    None => true,
                    Some(parent) => lineage.contains(&parent),
                }
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
        let within = |x: &[f64], t: usize| {
            own(x, t) <= gpus(crate::quota::Ledger::guarantee(p, t, pool)) + 1e-9
        };
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
