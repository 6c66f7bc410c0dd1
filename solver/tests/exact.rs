//! Exactness of the refinement against brute force, on tiny random fleets.
//!
//! Each case: 1–2 exclusive pools of 2–3 nodes with 1–4 GPUs (NVLink domains of 2 nodes), a
//! tenant tree `org → {a, b}` with random guarantees, limits, lending limits and CPU limits, a
//! few running workloads and 1–5 gangs waiting, each for one pool. The brute force below,
//! written from the policy's rules and nothing of the solver's, tries every choice of running
//! workloads to preempt and of replicas to admit per gang (placements searched depth-first),
//! and keeps the best value among the feasible ones:
//!
//! - running work is kept highest priority and oldest first while its tenant's limits allow it
//!   (preemptible work above a lowered limit is stopped, at its lost work's cost); a kept
//!   workload is within guarantee when its tenant's usage before it was below the guarantee;
//! - a gang takes `minMember` to `replicas` replicas or none, `required` gangs in one domain,
//!   and replicas fit the nodes' free GPUs and CPU;
//! - usage ≤ limit (GPUs, CPU where set) at the admitting tenant and every ancestor;
//! - a gang that borrows (takes its tenant above its guarantee) needs the pool's free GPUs to
//!   cover what the other tenants reserve (idle guarantee beyond their lending limit);
//! - a preempted workload (preemptible, past its minRuntime) has a beneficiary: an admitted
//!   gang of higher priority, which must be within its tenant's guarantee if the victim is and
//!   the two tenants differ (within one tenant, priority alone decides); or
//!   an admitted gang within guarantee reclaiming another tenant's borrowed work;
//! - a gang the cycle admitted within its tenant's guarantee stays admitted with at least its
//!   replicas: a guarantee is an entitlement, not something the value may trade away;
//! - value: priority × GPUs of every placed workload, minus priority × GPU-hours lost by every
//!   preempted one.
//!
//! The cycle checks borrowing and "within guarantee" one admission at a time, so they depend
//! on the order of admissions. The brute force reads them two ways ([`Mode`]): on the final
//! state, as the integer program does (its optimum is what the refinement must reach), and in
//! the most favourable state any order could give (its optimum no valid decision exceeds). On
//! most cases the two agree, and the refined objective is then exactly the optimum.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use proptest::prelude::*;
use tessera_compiler::model::TopologyMode;
use tessera_compiler::units::Gpus;
use tessera_compiler::{SourceFile, compile};
use tessera_solver::decision::{Decision, Outcome, RefineStatus};
use tessera_solver::problem::{Demand, Phase, Problem};
use tessera_solver::{SolveOptions, heuristic, solve};

const NOW: i64 = 1_795_000_000;

/// splitmix64: the case's seed drives every choice.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next() % u64::from(hi - lo + 1)) as u32
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn rfc3339(t: i64) -> jiff::Timestamp {
    tessera_solver::problem::unix(t)
}

/// The policy and snapshot of one case, as YAML.
fn instance(seed: u64) -> String {
    let mut rng = Rng(seed);
    let h = "apiVersion: tessera/v1alpha1\n";
    let mut y = format!(
        "{h}kind: PriorityTiers\nmetadata: {{name: tiers}}\nspec: {{tiers: [{{name: high, value: 1000}}, {{name: mid, value: 500}}, {{name: low, value: 100}}]}}\n\
         ---\n{h}kind: SloClass\nmetadata: {{name: critical}}\nspec: {{tier: high, preemptible: false}}\n\
         ---\n{h}kind: SloClass\nmetadata: {{name: urgent}}\nspec: {{tier: mid, preemptible: true}}\n\
         ---\n{h}kind: SloClass\nmetadata: {{name: batch}}\nspec: {{tier: low, preemptible: true, preemption: {{minRuntime: 10m}}}}\n"
    );
    let pools = rng.range(1, 2);
    let mut shape = Vec::new();
    for i in 0..pools {
        let (nodes, gpus, cpu) = (rng.range(2, 3), rng.range(1, 4), rng.range(3, 8));
        shape.push((format!("p{i}"), nodes, gpus, cpu));
        let _ = write!(
            y,
            "---\n{h}kind: Pool\nmetadata: {{name: p{i}}}\nspec:\n  gpuModel: H100-SXM5-80GB\n  sharing: exclusive\n  nvlinkDomain: rack\n  capacity: {{nodes: {nodes}, gpusPerNode: {gpus}, cpuPerNode: {cpu}, memoryPerNode: 1Ti, nodesPerNvlinkDomain: 2}}\n"
        );
    }
    let root: Vec<String> = shape
        .iter()
        .map(|(p, n, g, _)| format!("{p}: {}", n * g))
        .collect();
    let _ = write!(
        y,
        "---\n{h}kind: Tenant\nmetadata: {{name: org}}\nspec: {{guarantee: {{{}}}, sloClasses: [critical, urgent, batch]}}\n",
        root.join(", ")
    );
    let mut spent = vec![0; shape.len()];
    for t in ["a", "b"] {
        let (mut g, mut l, mut ll) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (p, n, gp, cpu)) in shape.iter().enumerate() {
            let cap = n * gp;
            let guarantee = rng.range(0, (cap - spent[i]).min(cap / 2 + 1));
            spent[i] += guarantee;
            let limit = rng.range(guarantee.max(1), cap);
            g.push(format!("{p}: {guarantee}"));
            l.push(if rng.chance(30) {
                format!("{p}: {{gpus: {limit}, cpu: {}}}", rng.range(2, n * cpu))
            } else {
                format!("{p}: {limit}")
            });
            ll.push(format!("{p}: {}", rng.range(0, guarantee)));
        }
        let _ = write!(
            y,
            "---\n{h}kind: Tenant\nmetadata: {{name: {t}}}\nspec: {{parent: org, guarantee: {{{}}}, limit: {{{}}}, lendingLimit: {{{}}}}}\n",
            g.join(", "),
            l.join(", "),
            ll.join(", ")
        );
    }
    let classes = ["critical", "urgent", "batch"];
    let _ = write!(
        y,
        "---\n{h}kind: ClusterState\nmetadata: {{name: snap}}\nspec:\n  observedAt: \"{}\"\n  nodes:\n",
        rfc3339(NOW)
    );
    let mut uuid = 0;
    let mut free: Vec<(String, String, Vec<u32>, u32)> = Vec::new();
    for (p, n, g, cpu) in &shape {
        for k in 0..*n {
            let _ = write!(
                y,
                "    - name: {p}-{k}\n      pool: {p}\n      nvlinkDomain: {p}-rack-{}\n      cpu: {cpu}\n      memory: 1Ti\n      gpus:\n",
                k / 2
            );
            for i in 0..*g {
                uuid += 1;
                let _ = writeln!(
                    y,
                    "        - {{index: {i}, uuid: GPU-{uuid:08x}-0000-0000-0000-000000000000, model: H100-SXM5-80GB}}"
                );
            }
            free.push((p.clone(), format!("{p}-{k}"), (0..*g).collect(), *cpu));
        }
    }
    // Running work on free GPUs, one core per replica.
    y += "  running:\n";
    let mut running = 0;
    for r in 0..rng.range(0, 4) {
        let node = rng.range(0, free.len() as u32 - 1) as usize;
        let (pool, name, gpus, cpu) = &mut free[node];
        if gpus.is_empty() || *cpu == 0 {
            continue;
        }
        let count = rng.range(1, gpus.len() as u32);
        let taken: Vec<u32> = gpus.drain(..count as usize).collect();
        *cpu -= 1;
        running += 1;
        let started = NOW - i64::from(rng.range(1, 120)) * 60;
        let checkpoint = if rng.chance(50) {
            format!(
                ", lastCheckpointAt: \"{}\"",
                rfc3339(started + i64::from(rng.range(0, 60)) * 60)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            y,
            "    - {{name: r-{r}, spec: {{tenant: {}, sloClass: {}, pool: {pool}, replicas: 1, gpu: {{count: {count}}}, cpu: 1, memory: 1Gi}}, bindings: [{{node: {name}, gpus: {taken:?}}}], startedAt: \"{}\"{checkpoint}}}",
            ["a", "b"][rng.range(0, 1) as usize],
            classes[rng.range(0, 2) as usize],
            rfc3339(started)
        );
    }
    if running == 0 {
        y += "    []\n";
    }
    y += "  pending:\n";
    for q in 0..rng.range(1, 5) {
        let (p, _, gpus, _) = &shape[rng.range(0, shape.len() as u32 - 1) as usize];
        let replicas = rng.range(1, 2);
        let min = rng.range(1, replicas);
        let topology = if rng.chance(30) { "required" } else { "none" };
        let _ = writeln!(
            y,
            "    - {{name: q-{q}, spec: {{tenant: {}, sloClass: {}, pool: {p}, replicas: {replicas}, minMember: {min}, gpu: {{count: {}}}, cpu: {}, memory: 1Gi, topology: {{sameNvlinkDomain: {topology}}}}}, submittedAt: \"{}\"}}",
            ["a", "b"][rng.range(0, 1) as usize],
            classes[rng.range(0, 2) as usize],
            rng.range(1, *gpus),
            rng.range(1, 2),
            rfc3339(NOW - i64::from(q) * 60)
        );
    }
    y
}

/// How the brute force reads the rules the cycle checks one admission at a time.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// On the decision's final state, as the integer program models them: a lower bound on the
    /// best decision, which the refinement must reach.
    FinalState,
    /// Each admission in the most favourable state any order could give it: an upper bound
    /// that no valid decision exceeds.
    AnyOrder,
}

/// The brute force: the best value over every feasible choice.
struct Brute<'a> {
    p: &'a Problem,
    kept: Vec<bool>,
    within: Vec<bool>,
    /// Value of what no choice changes: preempted over-limit work.
    constant: f64,
    /// Gangs the cycle admitted within their tenant's guarantee, with their replicas: a
    /// guarantee is an entitlement, which a better decision keeps.
    entitled: BTreeMap<usize, u32>,
}

#[derive(Clone, Copy, Default)]
struct Use {
    gpus: i64,
    cpu: u64,
}

fn lost_hours(p: &Problem, w: usize) -> f64 {
    let wl = &p.workloads[w];
    let Phase::Running {
        started_at,
        last_checkpoint_at,
        ..
    } = wl.phase
    else {
        return 0.0;
    };
    let since = last_checkpoint_at.unwrap_or(started_at).max(started_at);
    wl.amount(wl.replicas).gpus.as_f64() * (p.now - since).max(0) as f64 / 3600.0
}

fn prio(p: &Problem, w: usize) -> f64 {
    p.classes[p.workloads[w].class].priority as f64
}

impl<'a> Brute<'a> {
    fn new(p: &'a Problem, heuristic: &Decision) -> Self {
        let n = p.workloads.len();
        let entitled = heuristic
            .workloads
            .iter()
            .filter_map(|w| match &w.outcome {
                Outcome::Admit {
                    bindings, borrowed, ..
                } if *borrowed == Gpus::ZERO => {
                    let i = p.workloads.iter().position(|x| x.key.name == w.name)?;
                    Some((i, bindings.len() as u32))
                }
                _ => None,
            })
            .collect();
        let mut b = Brute {
            p,
            kept: vec![false; n],
            within: vec![false; n],
            constant: 0.0,
            entitled,
        };
        let mut order: Vec<usize> = (0..n).filter(|&w| p.workloads[w].is_running()).collect();
        order.sort_by_key(|&w| {
            let Phase::Running { started_at, .. } = p.workloads[w].phase else {
                unreachable!()
            };
            (
                -p.classes[p.workloads[w].class].priority,
                started_at,
                p.workloads[w].key.name.clone(),
            )
        });
        let mut usage: BTreeMap<(usize, usize), Use> = BTreeMap::new();
        for w in order {
            let wl = &p.workloads[w];
            let pool = wl.pools[0];
            let amount = wl.amount(wl.replicas);
            let before = usage.get(&(wl.tenant, pool)).copied().unwrap_or_default();
            let guarantee = p.tenants[wl.tenant]
                .quota
                .get(&pool)
                .map_or(0, |q| q.guarantee.gpus.units());
            b.within[w] = before.gpus < guarantee;
            let fits = p.tenants[wl.tenant].lineage.iter().all(|&t| {
                let u = usage.get(&(t, pool)).copied().unwrap_or_default();
                p.tenants[t].quota.get(&pool).is_some_and(|q| {
                    u.gpus + amount.gpus.units() <= q.limit.gpus.units()
                        && q.limit
                            .cpu
                            .is_none_or(|c| u.cpu + amount.cpu.unwrap_or_default().0 <= c.0)
                })
            });
            if !fits && p.classes[wl.class].preemptible {
                b.constant -= prio(p, w) * lost_hours(p, w);
                continue;
            }
            b.kept[w] = true;
            for &t in &p.tenants[wl.tenant].lineage {
                let u = usage.entry((t, pool)).or_default();
                u.gpus += amount.gpus.units();
                u.cpu += amount.cpu.unwrap_or_default().0;
            }
        }
        b
    }

    fn optimum(&self, mode: Mode) -> f64 {
        self.constant
            + (0..self.p.pools.len())
                .map(|pool| self.pool_optimum(pool, mode))
                .sum::<f64>()
    }

    fn pool_optimum(&self, pool: usize, mode: Mode) -> f64 {
        let p = self.p;
        let running: Vec<usize> = (0..p.workloads.len())
            .filter(|&w| self.kept[w] && p.workloads[w].pools[0] == pool)
            .collect();
        let victims: Vec<usize> = running
            .iter()
            .copied()
            .filter(|&w| {
                let class = &p.classes[p.workloads[w].class];
                let Phase::Running { started_at, .. } = p.workloads[w].phase else {
                    return false;
                };
                class.preemptible && (p.now - started_at) as u64 >= class.min_runtime_seconds
            })
            .collect();
        let gangs: Vec<usize> = (0..p.workloads.len())
            .filter(|&w| !p.workloads[w].is_running() && p.workloads[w].pools == [pool])
            .collect();
        let mut best = f64::NEG_INFINITY;
        for mask in 0..(1u32 << victims.len()) {
            let preempted: BTreeSet<usize> = victims
                .iter()
                .enumerate()
                .filter(|(i, _)| mask >> i & 1 == 1)
                .map(|(_, &v)| v)
                .collect();
            let mut ks = vec![0u32; gangs.len()];
            loop {
                if let Some(v) = self.value(pool, &running, &preempted, &gangs, &ks, mode) {
                    best = best.max(v);
                }
                // Next replica vector: each gang 0 or minMember..=replicas.
                let mut i = 0;
                loop {
                    if i == gangs.len() {
                        break;
                    }
                    let wl = &p.workloads[gangs[i]];
                    ks[i] = match ks[i] {
                        0 => wl.min_member,
                        k if k < wl.replicas => k + 1,
                        _ => 0,
                    };
                    if ks[i] != 0 {
                        break;
                    }
                    i += 1;
                }
                if i == gangs.len() {
                    break;
                }
            }
        }
        best
    }

    /// The value of a choice, if it is feasible.
    fn value(
        &self,
        pool: usize,
        running: &[usize],
        preempted: &BTreeSet<usize>,
        gangs: &[usize],
        ks: &[u32],
        mode: Mode,
    ) -> Option<f64> {
        let p = self.p;
        let short = gangs
            .iter()
            .zip(ks)
            .any(|(g, &k)| self.entitled.get(g).is_some_and(|&e| k < e));
        if short {
            return None;
        }
        let stays: Vec<usize> = running
            .iter()
            .copied()
            .filter(|w| !preempted.contains(w))
            .collect();
        let admitted: Vec<(usize, u32)> = gangs
            .iter()
            .copied()
            .zip(ks.iter().copied())
            .filter(|&(_, k)| k > 0)
            .collect();
        // Usage of each tenant, descendants included: of the work that stays, of everything
        // the decision places, and of everything that may be there at some point of the cycle.
        let usage_of = |items: &mut dyn Iterator<Item = (usize, u32)>| {
            let mut usage: BTreeMap<usize, Use> = BTreeMap::new();
            for (w, k) in items {
                let wl = &p.workloads[w];
                let a = wl.amount(k);
                for &t in &p.tenants[wl.tenant].lineage {
                    let u = usage.entry(t).or_default();
                    u.gpus += a.gpus.units();
                    u.cpu += a.cpu.unwrap_or_default().0;
                }
            }
            usage
        };
        let whole = |w: usize| (w, p.workloads[w].replicas);
        let staying = usage_of(&mut stays.iter().map(|&w| whole(w)));
        let placed = usage_of(
            &mut stays
                .iter()
                .map(|&w| whole(w))
                .chain(admitted.iter().copied()),
        );
        let most = usage_of(
            &mut running
                .iter()
                .map(|&w| whole(w))
                .chain(admitted.iter().copied()),
        );
        let get = |m: &BTreeMap<usize, Use>, t: usize| m.get(&t).copied().unwrap_or_default();
        let guarantee = |t: usize| {
            p.tenants[t]
                .quota
                .get(&pool)
                .map_or(0, |q| q.guarantee.gpus.units())
        };
        let capacity: i64 = p.pools[pool]
            .nodes
            .iter()
            .map(|&n| p.nodes[n].gpus.len() as i64 * 7000)
            .sum();
        let pool_used = |m: &BTreeMap<usize, Use>| -> i64 {
            p.tenants
                .iter()
                .enumerate()
                .filter(|(_, t)| t.parent.is_none())
                .map(|(t, _)| get(m, t).gpus)
                .sum()
        };
        // What the tenants outside `tenant`'s lineage reserve, at usage `m`.
        let reserved = |tenant: usize, m: &BTreeMap<usize, Use>| -> i64 {
            let lineage = &p.tenants[tenant].lineage;
            p.tenants
                .iter()
                .enumerate()
                .filter(|(o, info)| {
                    !lineage.contains(o) && info.parent.is_none_or(|x| lineage.contains(&x))
                })
                .map(|(o, info)| {
                    info.quota.get(&pool).map_or(0, |q| {
                        (q.guarantee.gpus.units() - q.lending_limit.gpus.units() - get(m, o).gpus)
                            .max(0)
                    })
                })
                .sum()
        };
        // Whether gang `r` counts as admitted within its tenant's guarantee.
        let guaranteed = |r: usize, k: u32| {
            let t = p.workloads[r].tenant;
            match mode {
                Mode::FinalState => get(&placed, t).gpus <= guarantee(t),
                Mode::AnyOrder => {
                    get(&staying, t).gpus + p.workloads[r].amount(k).gpus.units() <= guarantee(t)
                }
            }
        };
        for &(w, k) in &admitted {
            let tenant = p.workloads[w].tenant;
            for &t in &p.tenants[tenant].lineage {
                let q = p.tenants[t].quota.get(&pool)?;
                let u = get(&placed, t);
                if u.gpus > q.limit.gpus.units() || q.limit.cpu.is_some_and(|c| u.cpu > c.0) {
                    return None;
                }
            }
            if guaranteed(w, k) {
                continue;
            }
            let covered = match mode {
                Mode::FinalState => reserved(tenant, &placed) <= capacity - pool_used(&placed),
                // The most room it could find: admitted first, after every preemption, while
                // every other tenant holds the most it may hold.
                Mode::AnyOrder => {
                    p.workloads[w].amount(k).gpus.units() + reserved(tenant, &most)
                        <= capacity - pool_used(&staying)
                }
            };
            if !covered {
                return None;
            }
        }
        for &v in preempted {
            let vl = &p.workloads[v];
            let ok = admitted.iter().any(|&(r, k)| {
                let rl = &p.workloads[r];
                let guaranteed = guaranteed(r, k);
                let higher = prio(p, r) > prio(p, v);
                (higher && (guaranteed || !self.within[v] || rl.tenant == vl.tenant))
                    || (guaranteed && !self.within[v] && rl.tenant != vl.tenant)
            });
            if !ok {
                return None;
            }
        }
        if !self.fits(pool, &stays, &admitted) {
            return None;
        }
        let value: f64 = stays
            .iter()
            .map(|&w| whole(w))
            .chain(admitted.iter().copied())
            .map(|(w, k)| prio(p, w) * p.workloads[w].amount(k).gpus.as_f64())
            .sum();
        let lost: f64 = preempted
            .iter()
            .map(|&v| prio(p, v) * lost_hours(p, v))
            .sum();
        Some(value - lost)
    }

    /// Whether the admitted replicas fit the nodes around the work that stays.
    fn fits(&self, pool: usize, stays: &[usize], admitted: &[(usize, u32)]) -> bool {
        let p = self.p;
        let nodes = &p.pools[pool].nodes;
        let mut gpus: BTreeMap<usize, i64> = nodes
            .iter()
            .map(|&n| (n, p.nodes[n].gpus.len() as i64))
            .collect();
        let mut cpu: BTreeMap<usize, i64> = nodes
            .iter()
            .map(|&n| (n, p.nodes[n].cpu.0 as i64))
            .collect();
        for &w in stays {
            let Phase::Running { slots, .. } = &p.workloads[w].phase else {
                continue;
            };
            for s in slots {
                *gpus.get_mut(&s.node).unwrap() -= s.gpus.len() as i64;
                *cpu.get_mut(&s.node).unwrap() -= p.workloads[w].cpu.0 as i64;
            }
        }
        // One entry per replica: (workload, GPUs, CPU), placed depth-first.
        let mut replicas = Vec::new();
        for &(w, k) in admitted {
            let Demand::Whole { count } = p.workloads[w].demand else {
                return false;
            };
            for _ in 0..k {
                replicas.push((w, i64::from(count), p.workloads[w].cpu.0 as i64));
            }
        }
        let mut domain_of: BTreeMap<usize, String> = BTreeMap::new();
        self.place(&replicas, 0, &mut gpus, &mut cpu, &mut domain_of)
    }

    fn place(
        &self,
        replicas: &[(usize, i64, i64)],
        i: usize,
        gpus: &mut BTreeMap<usize, i64>,
        cpu: &mut BTreeMap<usize, i64>,
        domain_of: &mut BTreeMap<usize, String>,
    ) -> bool {
        let Some(&(w, g, c)) = replicas.get(i) else {
            return true;
        };
        let p = self.p;
        let required = p.workloads[w].topology == TopologyMode::Required;
        let nodes: Vec<usize> = gpus.keys().copied().collect();
        for n in nodes {
            if gpus[&n] < g || cpu[&n] < c {
                continue;
            }
            let domain = &p.nodes[n].domain;
            if required && domain_of.get(&w).is_some_and(|d| d != domain) {
                continue;
            }
            let first = required && !domain_of.contains_key(&w);
            if first {
                domain_of.insert(w, domain.clone());
            }
            *gpus.get_mut(&n).unwrap() -= g;
            *cpu.get_mut(&n).unwrap() -= c;
            let ok = self.place(replicas, i + 1, gpus, cpu, domain_of);
            *gpus.get_mut(&n).unwrap() += g;
            *cpu.get_mut(&n).unwrap() += c;
            if first {
                domain_of.remove(&w);
            }
            if ok {
                return true;
            }
        }
        false
    }
}

struct Case {
    /// Best value under the final-state rules, and under the any-order rules.
    lower: f64,
    upper: f64,
    heuristic: f64,
    refined: Decision,
    /// Every pool's program was solved to optimality.
    exact: bool,
}

fn run(seed: u64) -> Case {
    let yaml = instance(seed);
    let c = compile(&[SourceFile::new("case.yaml", &yaml)]);
    let errors: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error()).collect();
    assert!(errors.is_empty(), "{errors:#?}\n{yaml}");
    let policy = c.policy.expect("policy");
    let state = &c.states[0].1;
    let problem = Problem::new(&policy, state, None).expect("problem");
    let heuristic = heuristic::solve(&problem);
    let refined = solve(&policy, state, &SolveOptions::default()).expect("solves");
    let exact = refined.pools.iter().all(|r| {
        matches!(
            r.refinement.as_ref().map(|x| &x.status),
            Some(RefineStatus::Optimal | RefineStatus::Improved { .. })
                | Some(RefineStatus::Skipped { .. })
        ) && !matches!(
            r.refinement.as_ref().map(|x| &x.status),
            Some(RefineStatus::Skipped { reason })
                if reason != "no gang waits for this pool or was admitted to it"
        )
    });
    let brute = Brute::new(&problem, &heuristic);
    let heuristic = heuristic.objective;
    Case {
        lower: brute.optimum(Mode::FinalState),
        upper: brute.optimum(Mode::AnyOrder),
        heuristic,
        refined,
        exact,
    }
}

const TOLERANCE: f64 = 1e-3;

/// The heuristic and the refinement never exceed the any-order optimum, the refinement never
/// loses value, and where every pool's program was solved to optimality the refinement reaches
/// the final-state optimum.
fn check(seed: u64) -> Result<(), TestCaseError> {
    let case = run(seed);
    let yaml = instance(seed);
    prop_assert!(case.lower <= case.upper + TOLERANCE);
    prop_assert!(
        case.heuristic <= case.upper + TOLERANCE,
        "heuristic {} > any-order optimum {}\n{yaml}",
        case.heuristic,
        case.upper
    );
    prop_assert!(
        case.refined.objective <= case.upper + TOLERANCE,
        "refined {} > any-order optimum {}\n{yaml}",
        case.refined.objective,
        case.upper
    );
    prop_assert!(case.refined.objective >= case.heuristic - TOLERANCE);
    if case.exact {
        prop_assert!(
            case.refined.objective >= case.lower - TOLERANCE,
            "refined {} < final-state optimum {} (heuristic {})\n{:#?}\n{yaml}",
            case.refined.objective,
            case.lower,
            case.heuristic,
            case.refined
                .pools
                .iter()
                .map(|p| &p.refinement)
                .collect::<Vec<_>>()
        );
    }
    Ok(())
}

proptest! {
    // CI fixes the seed (`PROPTEST_RNG_SEED`), so it answers the same on every run; widen
    // the search locally with `PROPTEST_RNG_SEED=random` and more `PROPTEST_CASES`.
    #![proptest_config(common::proptest_config(96))]

    #[test]
    fn refined_reaches_the_optimum_and_never_exceeds_brute_force(seed in any::<u64>()) {
        check(seed)?;
    }
}

/// Cases that once failed: the program's choice not to preempt undone by the queue after it
/// (155); a pool where nothing waits but the heuristic's admission cost more than it gave
/// (162); a gang within guarantee only because it came first, which the final-state reading
/// forbids (7135977390454250868; since a tenant may displace its own lower-priority work within
/// guarantee, the heuristic reaches that optimum itself).
///
/// The rest came from a wide random search (hundreds of thousands of cases, brute force against
/// refinement), each a gap in how far the search looked:
/// - the heuristic gave up when a tenant at its limit could not free enough room from its own
///   work alone; releasing its work for the limit and others' for room (as Kueue combines a
///   queue's and its cohort's candidates) finds the answer (598900698614738963);
/// - a refinement window saw only its own nodes' work, so a gang held back by a quota limit, or
///   that would borrow, could not free quota held by work elsewhere: such work now enters the
///   window as victims (103468736862912884 and the six after it);
/// - one pool's rebuild preempted work to undo another pool's gain: gangs waiting for a pool
///   the cycle already settled are held (4444863081227265833 and the two after it);
/// - a rebuild admitted in a different order than the queue and shrank an entitled gang's
///   guarantee: admissions replay the queue's order (685737174828719897 and the two after it).
#[test]
fn cases_that_once_failed() {
    let earlier = [
        (155, true),
        (162, true),
        (7_135_977_390_454_250_868, false),
        (598_900_698_614_738_963, false),
    ];
    let wide_search = [
        103_468_736_862_912_884,
        3_106_970_109_331_647_238,
        13_616_305_359_679_397_132,
        10_412_203_926_400_031_913,
        14_537_251_144_551_634_342,
        17_656_162_919_930_053_089,
        3_684_725_576_891_805_198,
        4_444_863_081_227_265_833,
        7_037_891_724_066_763_761,
        7_678_650_987_585_638_318,
        685_737_174_828_719_897,
        3_044_098_008_936_562_274,
        13_821_843_281_342_274_649,
    ];
    for (seed, refinement_needed) in earlier
        .into_iter()
        .chain(wide_search.into_iter().map(|seed| (seed, true)))
    {
        let case = run(seed);
        check(seed).unwrap();
        if refinement_needed {
            assert!(case.refined.objective > case.heuristic, "seed {seed}");
        }
    }
}

/// Once a gap, found by a random search on CI (seed 16892630886752692493). Tenant b's critical
/// 2-GPU gang waits; the only node it can take holds b's own batch job r-1 (past its
/// minRuntime, within b's guarantee). The rules used to read "a victim within guarantee needs a
/// beneficiary within guarantee" even when both were the same tenant's, and the brute force
/// found a loophole (preempting b's urgent job r-2 as well, to bring b back within its
/// guarantee) that the refinement's window could not see. Guarantee protection guards against
/// other tenants' borrowing; within one tenant priority decides, so r-1 is displaced directly
/// and the heuristic, the program and the brute force agree on 4,463.33.
#[test]
fn a_tenant_displaces_its_own_lower_priority_work_within_guarantee() {
    let seed = 16_892_630_886_752_692_493;
    check(seed).unwrap();
    let case = run(seed);
    // The optimum is 4,463.33 (the 1/3 comes from lost work's hours); the heuristic reaches it.
    assert!((case.lower - 4_463.333).abs() < 0.01, "{}", case.lower);
    assert!(
        (case.heuristic - case.lower).abs() <= TOLERANCE,
        "{}",
        case.heuristic
    );
    assert!((case.refined.objective - case.lower).abs() <= TOLERANCE);
}

/// The property above says little if few cases are exact, none needs refining, or the two
/// readings of the rules rarely agree: most cases must be exact with both optima equal (the
/// refined objective is then exactly the optimum), and some must improve on the heuristic.
#[test]
fn most_cases_are_exact_and_some_improve() {
    let (mut exact, mut equal, mut improved) = (0, 0, 0);
    let cases = 150;
    for seed in 0..cases {
        let case = run(seed);
        let pinned = (case.upper - case.lower).abs() <= TOLERANCE;
        exact += usize::from(case.exact);
        equal += usize::from(
            case.exact && pinned && (case.refined.objective - case.lower).abs() <= TOLERANCE,
        );
        improved += usize::from(case.refined.objective > case.heuristic + TOLERANCE);
    }
    assert!(exact * 10 >= cases as usize * 9, "{exact} of {cases} exact");
    assert!(
        equal * 10 >= cases as usize * 8,
        "{equal} of {cases} equal to the optimum"
    );
    assert!(improved > 0, "no case improved on the heuristic");
}

/// A cycle out of time keeps the heuristic's decision and says so for every pool.
#[test]
fn a_spent_time_limit_keeps_the_heuristic_decision() {
    let yaml = instance(155);
    let c = compile(&[SourceFile::new("case.yaml", &yaml)]);
    let (policy, state) = (c.policy.expect("policy"), &c.states[0].1);
    let options = SolveOptions {
        time_limit: std::time::Duration::ZERO,
        ..SolveOptions::default()
    };
    let d = solve(&policy, state, &options).expect("solves");
    let h = heuristic::solve(&Problem::new(&policy, state, None).expect("problem"));
    assert_eq!(d.workloads, h.workloads);
    assert_eq!(d.objective, h.objective);
    assert!(d.pools.iter().all(|p| matches!(
        p.refinement.as_ref().map(|r| &r.status),
        Some(RefineStatus::TimeLimit)
    )));
    // With time, the same case is improved (see `cases_that_once_failed`).
    let refined = solve(&policy, state, &SolveOptions::default()).expect("solves");
    assert!(refined.objective > h.objective);
}
