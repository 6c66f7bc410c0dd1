//! The queue's next pick, without a scan of the whole queue.
//!
//! A queue key (`queue.rs`) is (priority, borrows, share path, submitted, name). Waiting
//! workloads of one tenant with the same pools, priority and smallest gang share the first
//! three whatever the ledger holds: such a *group* orders its members by (submitted, name)
//! once, and only its head competes, in a heap of the groups' heads. The name is a rank: the
//! workload's position in the queue sorted by workload key, so a key is compared without
//! strings.
//!
//! An admission changes the usage of its tenant and of each ancestor in its pool, and a
//! group's key reads two things of the ledger: its tenant's own usage (the guarantee split)
//! and the fair share of each level of its tenant's path. So an admission moves the keys of
//! the groups of the tenants whose own usage it changed (its lineage), and of the tenants below
//! a level whose fair share it changed, nothing else. On the reference fleet every tenant sits
//! under one root that never borrows: an admission moves the keys of its organisation's
//! projects at most, where recomputing every key that reads a changed usage would take the
//! whole pool's queue. A moved group gets a new entry and a new version; its old entry is
//! dropped when it surfaces.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use super::*;

/// A queue key without strings: (priority, borrows, share path, submitted, rank of the
/// workload key). Ranks are distinct, so no two workloads' keys are equal.
pub(crate) type PickKey = (i64, bool, SharePath, i64, u32);

/// A heap entry: a group's head key, the group, and the group's version when it was pushed.
type Entry = Reverse<(PickKey, u32, u32)>;

/// Waiting workloads that share the ledger-dependent part of their keys.
struct Group<'p> {
    tenant: usize,
    pools: &'p [usize],
    priority: i64,
    amount: Gpus,
    /// (submitted, rank, workload), the next pick last.
    members: Vec<(i64, u32, usize)>,
    /// (borrows, share path) under the ledger as it stands.
    key: (bool, SharePath),
    /// Bumped whenever the head or the key changes; an entry of another version is stale.
    version: u32,
}

/// The queue of a cycle, picked in key order (see the module's comment).
pub(crate) struct Picker<'p> {
    groups: Vec<Group<'p>>,
    heap: BinaryHeap<Entry>,
    pools: usize,
    /// The groups of each tenant.
    of_tenant: Vec<Vec<u32>>,
    /// `watchers[a × pools + pool]`: the tenants with a group in `pool` whose lineage holds `a`
    /// (whose share path reads `a`'s fair share there).
    watchers: Vec<Vec<usize>>,
    /// `shares[a × pools + pool]`: the fair share of `a` in the pool in billionths, kept where
    /// someone watches it.
    shares: Vec<u64>,
    /// `paths[t × pools + pool]`: the share path of `t` in the pool, kept where `t` has a group.
    paths: Vec<Option<SharePath>>,
}

impl<'p> Picker<'p> {
    pub(crate) fn new(p: &'p Problem, ledger: &Ledger, queue: &[usize]) -> Self {
        let pools = p.pools.len();
        // Stable, so that workloads with equal keys keep the queue's order, as the scan that
        // took the first least key did. A workload's rank is its place in this order; groups
        // are gathered in it (their members are ordered by (submitted, rank) below, and a
        // group's number only names it).
        let mut by_name = queue.to_vec();
        by_name.sort_by(|&a, &b| p.workloads[a].key.cmp(&p.workloads[b].key));
        let mut groups: Vec<Group<'p>> = Vec::new();
        let mut index: HashMap<(usize, &'p [usize], i64, Gpus), usize, foldhash::fast::FixedState> =
            HashMap::default();
        for (rank, &w) in by_name.iter().enumerate() {
            let rank = u32::try_from(rank).expect("a queue of fewer than 2³² workloads");
            let wl = &p.workloads[w];
            let (priority, amount) = (priority_key(p, w), gang_gpus(p, w));
            let g = *index
                .entry((wl.tenant, &wl.pools[..], priority, amount))
                .or_insert_with(|| {
                    groups.push(Group {
                        tenant: wl.tenant,
                        pools: &wl.pools,
                        priority,
                        amount,
                        members: Vec::new(),
                        key: (true, Rc::from([])),
                        version: 0,
                    });
                    groups.len() - 1
                });
            let submitted = match wl.phase {
                Phase::Pending { submitted_at } => submitted_at,
                Phase::Running { .. } => 0,
            };
            groups[g].members.push((submitted, rank, w));
        }
        let mut picker = Picker {
            groups,
            heap: BinaryHeap::new(),
            pools,
            of_tenant: vec![Vec::new(); p.tenants.len()],
            watchers: vec![Vec::new(); p.tenants.len() * pools],
            shares: vec![0; p.tenants.len() * pools],
            paths: vec![None; p.tenants.len() * pools],
        };
        let mut watched = BTreeSet::new();
        for (g, group) in picker.groups.iter_mut().enumerate() {
            group.members.sort_unstable_by(|a, b| b.cmp(a));
            picker.of_tenant[group.tenant].push(g as u32);
            for &pool in group.pools {
                for &a in &p.tenants[group.tenant].lineage {
                    watched.insert((a, pool, group.tenant));
                }
            }
        }
        for (a, pool, t) in watched {
            let i = a * pools + pool;
            if picker.watchers[i].is_empty() {
                picker.shares[i] = ledger.fair_share_billionths(p, a, pool);
            }
            picker.watchers[i].push(t);
            // Each tenant watches itself first (its own level is on its lineage).
            if a == t {
                picker.paths[i] = Some(Rc::from([]));
            }
        }
        for i in 0..picker.paths.len() {
            if picker.paths[i].is_some() {
                picker.paths[i] = Some(picker.path(p, ledger, i / pools, i % pools));
            }
        }
        for g in 0..picker.groups.len() {
            picker.groups[g].key = picker.class_key(p, ledger, g);
            picker.push_head(g);
        }
        picker
    }

    /// Takes the least key's workload off the queue: the workload and its key without the
    /// rank.
    pub(crate) fn pop(&mut self) -> Option<(usize, Key)> {
        while let Some(Reverse((key, g, version))) = self.heap.pop() {
            let g = g as usize;
            if self.groups[g].version != version {
                continue;
            }
            let (_, _, w) = self.groups[g]
                .members
                .pop()
                .expect("a live entry has a head");
            self.push_head(g);
            let (priority, borrows, share, submitted, _) = key;
            return Some((w, (priority, borrows, share, submitted)));
        }
        None
    }

    /// Keys again the groups an admission moved, its ledger changes being `deltas` (`ledger`
    /// is the ledger after them).
    pub(crate) fn rekey(&mut self, p: &Problem, ledger: &Ledger, deltas: &[Delta]) {
        let pools = self.pools;
        // (tenant, pool) whose own usage or share path moved, for tenants with a group there.
        let mut moved: BTreeSet<(usize, usize)> = BTreeSet::new();
        for &(t, pool, _, _) in deltas {
            for &a in &p.tenants[t].lineage {
                let i = a * pools + pool;
                if self.watchers[i].is_empty() {
                    continue;
                }
                if self.paths[i].is_some() {
                    moved.insert((a, pool));
                }
                let share = ledger.fair_share_billionths(p, a, pool);
                if share != self.shares[i] {
                    self.shares[i] = share;
                    moved.extend(self.watchers[i].iter().map(|&u| (u, pool)));
                }
            }
        }
        let mut tenants = BTreeSet::new();
        for (t, pool) in moved {
            self.paths[t * pools + pool] = Some(self.path(p, ledger, t, pool));
            tenants.insert(t);
        }
        for t in tenants {
            for i in 0..self.of_tenant[t].len() {
                let g = self.of_tenant[t][i] as usize;
                if self.groups[g].members.is_empty() {
                    continue;
                }
                let key = self.class_key(p, ledger, g);
                if key != self.groups[g].key {
                    self.groups[g].key = key;
                    self.push_head(g);
                }
            }
        }
    }

    /// The share path of `t` in `pool` from the shares kept.
    fn path(&self, p: &Problem, ledger: &Ledger, t: usize, pool: usize) -> SharePath {
        ledger
            .share_path(p, t, |a| self.shares[a * self.pools + pool])
            .into()
    }

    /// The (borrows, share path) of group `g` under `ledger`, from the paths kept.
    fn class_key(&self, p: &Problem, ledger: &Ledger, g: usize) -> (bool, SharePath) {
        let group = &self.groups[g];
        class_key(
            p,
            group.tenant,
            group.pools,
            group.amount,
            |pool| ledger.usage(group.tenant, pool).gpus,
            |pool| {
                self.paths[group.tenant * self.pools + pool]
                    .clone()
                    .expect("a path is kept for each pool of each group's tenant")
            },
        )
    }

    /// Pushes group `g`'s head under a new version (any entry pushed before is stale).
    fn push_head(&mut self, g: usize) {
        let group = &mut self.groups[g];
        group.version = group.version.wrapping_add(1);
        if let Some(&(submitted, rank, _)) = group.members.last() {
            let (borrows, share) = group.key.clone();
            let key = (group.priority, borrows, share, submitted, rank);
            self.heap.push(Reverse((key, g as u32, group.version)));
        }
        // Stale entries are dropped as they surface; past twice the live ones, all at once, so
        // that the heap stays the size of the queue's groups.
        if self.heap.len() > 2 * self.groups.len() + 64 {
            let groups = &self.groups;
            self.heap
                .retain(|Reverse((_, g, v))| groups[*g as usize].version == *v);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tessera_compiler::{SourceFile, compile};

    use super::*;

    /// A small deterministic generator (the property draws a seed).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % n
        }
    }

    /// Two pools of 16 GPUs, a root over two or three organisations of two to four projects
    /// each (random nesting guarantees and weights), two priorities, and a queue of 10 to 60 workloads
    /// of random tenants, sizes, pools (one, or both) and submission times (many equal), named
    /// so that the queue's order is not the names'.
    fn problem(rng: &mut Rng) -> Problem {
        let h = "apiVersion: tessera/v1alpha1\n";
        let mut s = format!(
            "{h}kind: PriorityTiers\nmetadata: {{name: tiers}}\nspec: {{tiers: [{{name: high, value: 100}}, {{name: low, value: 1}}]}}\n---\n\
             {h}kind: SloClass\nmetadata: {{name: urgent}}\nspec: {{tier: high, preemptible: true}}\n---\n\
             {h}kind: SloClass\nmetadata: {{name: batch}}\nspec: {{tier: low, preemptible: true}}\n"
        );
        let mut nodes = String::new();
        for pool in ["a", "b"] {
            s += &format!(
                "---\n{h}kind: Pool\nmetadata: {{name: {pool}}}\nspec: {{gpuModel: H100-SXM5-80GB, sharing: exclusive, capacity: {{nodes: 2, gpusPerNode: 8, cpuPerNode: 64, memoryPerNode: 1Ti}}}}\n"
            );
            for n in 0..2 {
                nodes += &format!(
                    "    - {{name: {pool}{n}, pool: {pool}, cpu: 64, memory: 1Ti, gpus: ["
                );
                for g in 0..8 {
                    let sep = if g > 0 { ", " } else { "" };
                    nodes += &format!(
                        "{sep}{{index: {g}, uuid: GPU-{pool}{n}{g}, model: H100-SXM5-80GB}}"
                    );
                }
                nodes += "]}\n";
            }
        }
        s += &format!(
            "---\n{h}kind: Tenant\nmetadata: {{name: root}}\nspec: {{guarantee: {{a: 16, b: 16}}, sloClasses: [urgent, batch]}}\n"
        );
        let mut projects = Vec::new();
        // Guarantees nest: a project's 0 or 1 GPU, an organisation's its projects' and up to
        // one more (at most 15 of the root's 16).
        for o in 0..2 + rng.below(2) {
            let (mut children, mut sums) = (String::new(), [0, 0]);
            for j in 0..2 + rng.below(3) {
                let g = [rng.below(2), rng.below(2)];
                sums = [sums[0] + g[0], sums[1] + g[1]];
                children += &format!(
                    "---\n{h}kind: Tenant\nmetadata: {{name: p{o}{j}}}\nspec: {{parent: org{o}, guarantee: {{a: {}, b: {}}}, weight: {}}}\n",
                    g[0],
                    g[1],
                    1 + rng.below(3)
                );
                projects.push(format!("p{o}{j}"));
            }
            s += &format!(
                "---\n{h}kind: Tenant\nmetadata: {{name: org{o}}}\nspec: {{parent: root, guarantee: {{a: {}, b: {}}}, weight: {}}}\n{children}",
                sums[0] + rng.below(2),
                sums[1] + rng.below(2),
                1 + rng.below(3)
            );
        }
        let mut pending = String::new();
        for i in 0..10 + rng.below(51) {
            let tenant = &projects[rng.below(projects.len() as u64) as usize];
            let class = ["urgent", "batch", "batch"][rng.below(3) as usize];
            let pool = ["", ", pool: a", ", pool: b"][rng.below(3) as usize];
            pending += &format!(
                "    - {{name: w{}-{i}, spec: {{tenant: {tenant}, sloClass: {class}, gpu: {{count: {}}}{pool}}}, submittedAt: \"2026-11-20T07:0{}:00Z\"}}\n",
                rng.below(100),
                [1, 1, 2, 4][rng.below(4) as usize],
                rng.below(3)
            );
        }
        s += &format!(
            "---\n{h}kind: ClusterState\nmetadata: {{name: s}}\nspec:\n  observedAt: \"2026-11-20T08:00:00Z\"\n  nodes:\n{nodes}  running: []\n  pending:\n{pending}"
        );
        let c = compile(&[SourceFile::new("p.yaml", s)]);
        assert_eq!(c.errors(), 0, "{:#?}", c.diagnostics);
        Problem::new(c.policy.as_ref().unwrap(), &c.states[0].1, None).unwrap()
    }

    /// Picks the whole queue as the picker does and as a scan of every key computed afresh
    /// does, admitting some picks (and releasing some earlier admissions with them, as a
    /// preemption does) in between; the two must agree at every pick.
    fn picks_agree_with_the_scan(seed: u64) {
        let mut rng = Rng(seed);
        let p = problem(&mut rng);
        let mut ledger = Ledger::new(&p);
        let mut waiting: Vec<usize> = (0..p.workloads.len()).collect();
        let mut picker = Picker::new(&p, &ledger, &waiting);
        let mut admitted: Vec<Delta> = Vec::new();
        while let Some((w, key)) = picker.pop() {
            let keys = queue_keys(&p, &ledger, &waiting);
            let (i, least) = keys
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.cmp(b.1))
                .expect("the scan's queue is not empty");
            let (priority, borrows, share, submitted, _) = least.clone();
            assert_eq!(
                (w, key),
                (waiting[i], (priority, borrows, share, submitted))
            );
            waiting.remove(i);
            let wl = &p.workloads[w];
            if wl.pools.is_empty() || rng.below(3) == 0 {
                continue;
            }
            let pool = wl.pools[rng.below(wl.pools.len() as u64) as usize];
            let mut deltas = vec![(wl.tenant, pool, wl.amount(wl.min_member), true)];
            if !admitted.is_empty() && rng.below(4) == 0 {
                let (t, pool, amount, _) =
                    admitted.swap_remove(rng.below(admitted.len() as u64) as usize);
                deltas.push((t, pool, amount, false));
            }
            for &(t, pool, amount, added) in &deltas {
                if added {
                    ledger.add(&p, t, pool, amount);
                    admitted.push((t, pool, amount, true));
                } else {
                    ledger.remove(&p, t, pool, amount);
                }
            }
            picker.rekey(&p, &ledger, &deltas);
        }
        assert!(waiting.is_empty(), "the picker dropped {waiting:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn the_pick_is_the_scans(seed in any::<u64>()) {
            picks_agree_with_the_scan(seed);
        }
    }
}
