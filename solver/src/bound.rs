//! An upper bound on a decision's objective: the LP relaxation of admitting work into pools.
//!
//! Every workload (running or waiting) may be admitted fractionally into any of its pools; a
//! pool holds at most its GPUs (healthy or not: running work on an unhealthy GPU may be kept),
//! and a tenant and each of its ancestors at most their limit per pool (or what non-preemptible
//! work already holds there, which a decision never takes away). Placement detail, MIG
//! geometry, topology, CPU and memory are relaxed away, and preemption costs nothing. Every
//! decision the solver can return is feasible here at no lower value, so the LP optimum bounds
//! the objective; the gap shows how much a better method could still win, at most.
//!
//! The LP is solved exactly as a flow rather than by a simplex. Counted in GPUs admitted
//! (`f = gpus × share`), it is a maximum-weight flow whose weights sit on the source arcs only:
//! source → workload (its GPUs) → (its tenant, pool) → (the parent, pool) → … → (the root, pool)
//! → pool (its GPUs) → sink, where each (tenant, pool) arc carries that tenant's limit there. A
//! tenant's lineage is a path to its root, so per pool the quota constraints form a tree and
//! every admitted GPU takes one path. The flows a set of sources can send form a polymatroid,
//! so the greedy order is optimal: by priority descending, augment as much flow as possible
//! from that priority's sources while keeping what the earlier ones send (an augmenting path
//! starts at the source and never returns to it, so no earlier source arc loses flow). Amounts
//! are integer quota units ([`Gpus::units`]), so the optimum is exact up to the one division at
//! the end. The simplex this replaced took about a fifth of a cycle's CPU at 12.5× the
//! reference fleet (70,000 workloads); the flow takes a few tens of milliseconds there.

use std::collections::HashMap;

use tessera_compiler::units::Gpus;

use crate::problem::Problem;

/// The network's lookups by small integers, hashed with a fixed fast hasher (nothing here is
/// iterated, and no key comes from outside).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// The relaxation's optimum. Always `Some` (a flow always exists: the empty one); an `Option`
/// because a decision's bound is one.
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
    let units = |w: usize| p.workloads[w].amount(p.workloads[w].replicas).gpus.units();
    // What non-preemptible running work holds per (tenant, pool): a floor under the limit, as
    // a decision never takes it away. Zero-priority work counts here though it adds no value.
    let mut pinned: FastMap<(usize, usize), i64> = FastMap::default();
    let mut weighted: Vec<(i64, usize)> = Vec::new();
    for (w, wl) in p.workloads.iter().enumerate() {
        let gpus = units(w);
        if gpus <= 0 || !live(w) {
            continue;
        }
        if wl.is_running() && !p.classes[wl.class].preemptible {
            for &pool in &wl.pools {
                for &t in &p.tenants[wl.tenant].lineage {
                    let held = pinned.entry((t, pool)).or_default();
                    *held = held.saturating_add(gpus);
                }
            }
        }
        let weight = p.classes[wl.class].priority.max(0);
        // Work of no value never needs flow: dropping a source's flow keeps the rest feasible.
        if weight > 0 {
            weighted.push((weight, w));
        }
    }
    // Priority descending (the greedy order), then what makes two workloads interchangeable:
    // equal tenant and pools make one source of their summed GPUs, which keeps the network
    // small at fleet scale (tens of thousands of workloads, one source per tenant, priority
    // and set of pools).
    weighted.sort_unstable_by(|&(va, a), &(vb, b)| {
        let (x, y) = (&p.workloads[a], &p.workloads[b]);
        vb.cmp(&va)
            .then(x.tenant.cmp(&y.tenant))
            .then_with(|| x.pools.cmp(&y.pools))
    });
    let mut net = Network::new(p, pinned);
    let mut sources: Vec<Source> = Vec::new();
    let mut i = 0;
    while i < weighted.len() {
        let (weight, first) = weighted[i];
        let wl = &p.workloads[first];
        let mut gpus = 0i64;
        while i < weighted.len() && {
            let other = &p.workloads[weighted[i].1];
            weighted[i].0 == weight && other.tenant == wl.tenant && other.pools == wl.pools
        } {
            gpus = gpus.saturating_add(units(weighted[i].1));
            i += 1;
        }
        let mut pools = wl.pools.clone();
        pools.sort_unstable();
        pools.dedup();
        let arc = match pools[..] {
            [] => continue,
            // A single pool needs no node of its own: its source arc enters the tenant's chain.
            [pool] => {
                let entry = net.chain(wl.tenant, pool);
                net.arc(S, entry, 0)
            }
            _ => {
                let node = net.node();
                for &pool in &pools {
                    let entry = net.chain(wl.tenant, pool);
                    net.arc(node, entry, INFINITE);
                }
                net.arc(S, node, 0)
            }
        };
        sources.push(Source { arc, gpus, weight });
    }
    let mut start = 0;
    while start < sources.len() {
        let weight = sources[start].weight;
        let end = start
            + sources[start..]
                .iter()
                .take_while(|s| s.weight == weight)
                .count();
        for s in &sources[start..end] {
            net.residual[s.arc as usize] = s.gpus;
        }
        // Any feasible flow is a valid start for the augmenting search; most of a fleet's flow
        // takes its only path, so the search is left with little to do.
        for s in &sources[start..end] {
            net.push_along_chains(s.arc);
        }
        net.max_flow();
        start = end;
    }
    let value: i128 = sources
        .iter()
        .map(|s| i128::from(s.weight) * i128::from(s.gpus - net.residual[s.arc as usize]))
        .sum();
    Some(value as f64 / Gpus::UNITS_PER_GPU as f64)
}

/// A workload group's arc from the source: `gpus` of value `weight` each (per GPU).
struct Source {
    arc: u32,
    gpus: i64,
    weight: i64,
}

const S: u32 = 0;
const T: u32 = 1;
const NONE: u32 = u32::MAX;
/// Larger than any flow (GPUs of a fleet in units), and far from overflow when added to.
const INFINITE: i64 = i64::MAX / 4;

/// A residual network: arc `e`'s reverse is `e ^ 1`.
struct Network<'a> {
    p: &'a Problem,
    pinned: FastMap<(usize, usize), i64>,
    head: Vec<u32>,
    residual: Vec<i64>,
    out: Vec<Vec<u32>>,
    /// A chain node's arc toward the sink (NONE for the source, the sink and workload nodes).
    up: Vec<u32>,
    chain: FastMap<(usize, usize), u32>,
    pool: FastMap<usize, u32>,
}

impl<'a> Network<'a> {
    fn new(p: &'a Problem, pinned: FastMap<(usize, usize), i64>) -> Self {
        let mut net = Network {
            p,
            pinned,
            head: Vec::new(),
            residual: Vec::new(),
            out: Vec::new(),
            up: Vec::new(),
            chain: FastMap::default(),
            pool: FastMap::default(),
        };
        net.node();
        net.node();
        net
    }

    fn node(&mut self) -> u32 {
        self.out.push(Vec::new());
        self.up.push(NONE);
        (self.out.len() - 1) as u32
    }

    fn arc(&mut self, from: u32, to: u32, capacity: i64) -> u32 {
        let e = self.head.len() as u32;
        self.head.extend([to, from]);
        self.residual.extend([capacity, 0]);
        self.out[from as usize].push(e);
        self.out[to as usize].push(e ^ 1);
        e
    }

    /// The node of `pool`, its arc to the sink carrying all its nodes' GPUs.
    fn pool_node(&mut self, pool: usize) -> u32 {
        if let Some(&n) = self.pool.get(&pool) {
            return n;
        }
        let p = self.p;
        let gpus: usize = p.pools.get(pool).map_or(0, |info| {
            info.nodes
                .iter()
                .map(|&n| p.nodes.get(n).map_or(0, |node| node.gpus.len()))
                .sum()
        });
        let capacity = (gpus as i64).saturating_mul(Gpus::UNITS_PER_GPU);
        let n = self.node();
        self.up[n as usize] = self.arc(n, T, capacity);
        self.pool.insert(pool, n);
        n
    }

    /// The node of (`tenant`, `pool`), built with its ancestors' down from the root: each one's
    /// arc up carries the tenant's limit in the pool, or what non-preemptible work holds there
    /// when that is more. Only (tenant, pool) pairs some valued workload reaches are built, as
    /// only they constrain the flow.
    fn chain(&mut self, tenant: usize, pool: usize) -> u32 {
        let p = self.p;
        let mut above = self.pool_node(pool);
        for &t in p.tenants[tenant].lineage.iter().rev() {
            above = match self.chain.get(&(t, pool)) {
                Some(&n) => n,
                None => {
                    let limit = p.tenants[t]
                        .quota
                        .get(&pool)
                        .map_or(0, |q| q.limit.gpus.units());
                    let floor = self.pinned.get(&(t, pool)).copied().unwrap_or(0);
                    let n = self.node();
                    self.up[n as usize] = self.arc(n, above, limit.max(floor).max(0));
                    self.chain.insert((t, pool), n);
                    n
                }
            };
        }
        above
    }

    /// Pushes what source arc `source` still allows down each of its pools' chains in turn.
    fn push_along_chains(&mut self, source: u32) {
        let entry = self.head[source as usize];
        let mut path = Vec::new();
        if self.up[entry as usize] != NONE {
            path.push(source);
            self.push(&mut path, entry);
            return;
        }
        for i in 0..self.out[entry as usize].len() {
            let e = self.out[entry as usize][i];
            if e & 1 == 0 {
                path.clear();
                path.extend([source, e]);
                self.push(&mut path, self.head[e as usize]);
            }
        }
    }

    /// Extends `path` from `node` up its chain to the sink and pushes its bottleneck.
    fn push(&mut self, path: &mut Vec<u32>, mut node: u32) {
        while node != T {
            let e = self.up[node as usize];
            if e == NONE {
                return;
            }
            path.push(e);
            node = self.head[e as usize];
        }
        self.augment(path);
    }

    fn augment(&mut self, path: &[u32]) -> i64 {
        let flow = path
            .iter()
            .map(|&e| self.residual[e as usize])
            .min()
            .unwrap_or(0);
        for &e in path {
            self.residual[e as usize] -= flow;
            self.residual[(e ^ 1) as usize] += flow;
        }
        flow
    }

    /// Dinic's: blocking flows along shortest augmenting paths until the sink is cut off.
    fn max_flow(&mut self) {
        let n = self.out.len();
        let mut level = vec![u32::MAX; n];
        let mut next = vec![0usize; n];
        let mut queue: Vec<u32> = Vec::with_capacity(n);
        let mut path: Vec<u32> = Vec::new();
        loop {
            level.fill(u32::MAX);
            level[S as usize] = 0;
            queue.clear();
            queue.push(S);
            let mut i = 0;
            while i < queue.len() {
                let u = queue[i];
                i += 1;
                for &e in &self.out[u as usize] {
                    let v = self.head[e as usize];
                    if self.residual[e as usize] > 0 && level[v as usize] == u32::MAX {
                        level[v as usize] = level[u as usize] + 1;
                        queue.push(v);
                    }
                }
            }
            if level[T as usize] == u32::MAX {
                return;
            }
            next.fill(0);
            while self.blocking_path(&mut level, &mut next, &mut path) > 0 {}
        }
    }

    /// One augmenting path of the level graph, found without recursion (paths may be long),
    /// pushed; 0 once there is none. Dead ends leave the level graph for the phase.
    fn blocking_path(&mut self, level: &mut [u32], next: &mut [usize], path: &mut Vec<u32>) -> i64 {
        path.clear();
        let mut u = S;
        loop {
            if u == T {
                return self.augment(path);
            }
            let arcs = &self.out[u as usize];
            let mut advanced = false;
            while next[u as usize] < arcs.len() {
                let e = arcs[next[u as usize]];
                let v = self.head[e as usize];
                if self.residual[e as usize] > 0
                    && level[v as usize] == level[u as usize].wrapping_add(1)
                {
                    path.push(e);
                    u = v;
                    advanced = true;
                    break;
                }
                next[u as usize] += 1;
            }
            if !advanced {
                let Some(e) = path.pop() else {
                    return 0;
                };
                level[u as usize] = u32::MAX;
                u = self.head[(e ^ 1) as usize];
                next[u as usize] += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use good_lp::{Expression, ProblemVariables, Solution, SolverModel, microlp, variable};
    use proptest::prelude::*;
    use tessera_compiler::compiled::{Amounts, PoolQuota};
    use tessera_compiler::{SourceFile, compile};

    use super::*;
    use crate::problem::{Demand, Phase};

    /// The relaxation as an LP, solved by microlp's simplex: what the flow replaced, kept as
    /// the oracle it must agree with.
    fn lp_oracle(p: &Problem, live: impl Fn(usize) -> bool) -> Option<f64> {
        let mut vars = ProblemVariables::new();
        let mut objective = Expression::from(0.0);
        let mut per_workload: Vec<Expression> = Vec::new();
        let mut pool_use: BTreeMap<usize, Expression> = BTreeMap::new();
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

    /// splitmix64: the case's seed drives every choice.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) % n
        }
        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
    }

    /// A compiled problem of one pool, tenant, class and waiting workload: the records the
    /// random problems are cloned from (the bound reads only the fields they set).
    fn base() -> Problem {
        let h = "apiVersion: tessera/v1alpha1\n";
        let s = format!(
            "{h}kind: PriorityTiers\nmetadata: {{name: tiers}}\nspec: {{tiers: [{{name: high, value: 100}}]}}\n---\n\
             {h}kind: SloClass\nmetadata: {{name: urgent}}\nspec: {{tier: high, preemptible: true}}\n---\n\
             {h}kind: Pool\nmetadata: {{name: a}}\nspec: {{gpuModel: H100-SXM5-80GB, sharing: exclusive, capacity: {{nodes: 1, gpusPerNode: 1, cpuPerNode: 64, memoryPerNode: 1Ti}}}}\n---\n\
             {h}kind: Tenant\nmetadata: {{name: root}}\nspec: {{guarantee: {{a: 1}}, sloClasses: [urgent]}}\n---\n\
             {h}kind: ClusterState\nmetadata: {{name: s}}\nspec:\n  observedAt: \"2026-11-20T08:00:00Z\"\n  nodes:\n\
             \x20   - {{name: a0, pool: a, cpu: 64, memory: 1Ti, gpus: [{{index: 0, uuid: GPU-a00, model: H100-SXM5-80GB}}]}}\n\
             \x20 running: []\n  pending:\n\
             \x20   - {{name: w, spec: {{tenant: root, sloClass: urgent, gpu: {{count: 1}}}}, submittedAt: \"2026-11-20T07:00:00Z\"}}\n"
        );
        let c = compile(&[SourceFile::new("p.yaml", s)]);
        assert_eq!(c.errors(), 0, "{:#?}", c.diagnostics);
        Problem::new(c.policy.as_ref().unwrap(), &c.states[0].1, None).unwrap()
    }

    fn quota(limit: Gpus) -> PoolQuota {
        let gpus = |gpus| Amounts {
            gpus,
            cpu: None,
            memory: None,
        };
        PoolQuota {
            guarantee: gpus(Gpus::ZERO),
            limit: gpus(limit),
            lending_limit: gpus(Gpus::ZERO),
        }
    }

    fn running() -> Phase {
        Phase::Running {
            slots: Vec::new(),
            started_at: 0,
            last_checkpoint_at: None,
        }
    }

    /// One to three pools of up to three nodes of up to eight GPUs (some none); a random
    /// forest of up to seven tenants, each with a limit (whole or fractional, often below its
    /// parent's, sometimes none) per pool; up to four classes of priorities among negative,
    /// zero and positive, preemptible or not; up to 25 workloads of random tenants, classes,
    /// sizes (whole, shares in thousandths or sevenths, zero replicas), one to three pools (or
    /// none, in any order), running or waiting.
    fn random(rng: &mut Rng) -> Problem {
        let mut p = base();
        let (pool, node, tenant, class, workload) = (
            p.pools[0].clone(),
            p.nodes[0].clone(),
            p.tenants[0].clone(),
            p.classes[0].clone(),
            p.workloads[0].clone(),
        );
        let pools = 1 + rng.below(3) as usize;
        p.pools.clear();
        p.nodes.clear();
        for _ in 0..pools {
            let mut info = pool.clone();
            info.nodes.clear();
            for _ in 0..rng.below(4) {
                let mut n = node.clone();
                n.gpus = vec![0; rng.below(9) as usize];
                info.nodes.push(p.nodes.len());
                p.nodes.push(n);
            }
            p.pools.push(info);
        }
        p.classes = (0..1 + rng.below(4))
            .map(|_| {
                let mut c = class.clone();
                c.priority = [-5, 0, 1, 3, 10, 100][rng.below(6) as usize];
                c.preemptible = rng.chance(50);
                c
            })
            .collect();
        p.tenants.clear();
        for t in 0..1 + rng.below(7) as usize {
            let mut info = tenant.clone();
            info.parent = (t > 0 && rng.chance(80)).then(|| rng.below(t as u64) as usize);
            info.lineage = vec![t];
            if let Some(parent) = info.parent {
                info.lineage
                    .extend(p.tenants[parent].lineage.iter().copied());
            }
            info.quota.clear();
            for pool in 0..pools {
                if rng.chance(85) {
                    let units = if rng.chance(50) {
                        Gpus::whole(rng.below(12) as i64)
                    } else {
                        Gpus::milli(rng.below(12_000) as i64)
                    };
                    info.quota.insert(pool, quota(units));
                }
            }
            p.tenants.push(info);
        }
        p.workloads = (0..rng.below(26))
            .map(|_| {
                let mut w = workload.clone();
                w.tenant = rng.below(p.tenants.len() as u64) as usize;
                w.class = rng.below(p.classes.len() as u64) as usize;
                w.demand = match rng.below(3) {
                    0 => Demand::Whole {
                        count: rng.below(5) as u32,
                    },
                    1 => Demand::Share {
                        fraction: Gpus::milli(1 + rng.below(999) as i64),
                    },
                    _ => Demand::Share {
                        fraction: Gpus::sevenths(1 + rng.below(6) as i64),
                    },
                };
                w.replicas = rng.below(4) as u32;
                w.pools = (0..pools).filter(|_| rng.chance(60)).collect();
                if rng.chance(30) {
                    w.pools.reverse();
                }
                if rng.chance(40) {
                    w.phase = running();
                    w.pools.truncate(1);
                }
                w
            })
            .collect();
        p
    }

    /// The flow's optimum is the LP's, on random problems and random sets of live workloads.
    fn agrees_with_the_lp(seed: u64) {
        let mut rng = Rng(seed);
        let p = random(&mut rng);
        let dead: Vec<bool> = p.workloads.iter().map(|_| rng.chance(15)).collect();
        let live = |w: usize| !dead[w];
        let flow = lp_bound_of(&p, live).expect("a flow always exists");
        let lp = lp_oracle(&p, live).expect("the all-zero admission is feasible");
        // microlp works in floating point: its optimum is off the exact one (the flow's, in
        // integer units) by rounding, in either direction.
        let tolerance = 1e-6 * lp.abs().max(1.0);
        assert!(
            (flow - lp).abs() <= tolerance,
            "seed {seed}: flow {flow}, LP {lp}\n{p:#?}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn the_flow_is_the_lp_optimum(seed in any::<u64>()) {
            agrees_with_the_lp(seed);
        }
    }

    /// Two pools of one GPU; a two-pool workload of the higher priority and, after it, a
    /// one-pool workload for the pool the first took: the optimum moves the first to the other
    /// pool, which only an augmenting path through the first's flow finds.
    #[test]
    fn later_work_reroutes_earlier_flow() {
        let mut p = base();
        p.pools.push(p.pools[0].clone());
        p.nodes.push(p.nodes[0].clone());
        p.pools[1].nodes = vec![1];
        p.tenants[0].quota =
            BTreeMap::from([(0, quota(Gpus::whole(1))), (1, quota(Gpus::whole(1)))]);
        let mut low = p.classes[0].clone();
        low.priority = 5;
        p.classes.push(low);
        let mut first = p.workloads[0].clone();
        first.pools = vec![0, 1];
        let mut second = p.workloads[0].clone();
        second.class = 1;
        second.pools = vec![0];
        p.workloads = vec![first, second];
        assert_eq!(lp_bound(&p), Some(105.0));
        assert_eq!(lp_oracle(&p, |_| true).map(f64::round), Some(105.0));
    }

    /// Non-preemptible running work above its tenant's limit raises the limit to what it holds;
    /// waiting work fills the rest of the pool only under the limit.
    #[test]
    fn pinned_work_is_a_floor_under_the_limit() {
        let mut p = base();
        p.nodes[0].gpus = vec![0; 8];
        p.tenants[0].quota = BTreeMap::from([(0, quota(Gpus::whole(1)))]);
        p.classes[0].preemptible = false;
        let mut held = p.workloads[0].clone();
        held.demand = Demand::Whole { count: 3 };
        held.phase = running();
        let waiting = p.workloads[0].clone();
        p.workloads = vec![held, waiting];
        // 3 GPUs held make the limit 3: all of them, and none of the waiting GPU.
        assert_eq!(lp_bound(&p), Some(300.0));
        p.tenants[0].quota = BTreeMap::from([(0, quota(Gpus::whole(5)))]);
        assert_eq!(lp_bound(&p), Some(400.0));
    }
}
