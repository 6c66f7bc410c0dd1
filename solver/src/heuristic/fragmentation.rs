//! Fragmentation-aware placement scoring: which node (and GPU) a replica goes to.
//!
//! The score is the one the openb benchmark measured ahead of FGD (`sim/src/openb/tessera.rs`,
//! after Weng et al., "Beware of Fragmentation", ATC '23), computed against the workload mix
//! the fleet runs: every replica of the snapshot's running workloads, by pool. The running set
//! rather than the queue, or a decayed history of shapes, because:
//!
//! - one arrival must not re-score the placements decided before it: a new submission would
//!   otherwise move other workloads' planned places, and a `Session` could no longer
//!   decide it against the standing decision and agree with the full cycle (a finished
//!   workload leaves the mix, and the session measures it again: `Fleet::forget`);
//! - it needs no state carried between decisions, and the same snapshot always gives the same
//!   mix, so the same decision;
//! - over a fleet's life the running set is the demand that comes back: what finishes is
//!   replaced by work of the same tenants, mostly of the same shapes.
//!
//! A pool where nothing runs is scored against the mix of the whole fleet (every pool's
//! running replicas, counted once): the work that comes to an idle pool is the fleet's. A pool
//! with no mix at all would score every placement alike, and so be the best choice for any
//! workload that may use it until the next decision measures it again: it took everything
//! that came first, and a pool that is the only home of a large shape (the openb traces' 8-GPU,
//! 120-core tasks on the one node type with the cores) was broken up by small work before the
//! large work arrived. Shapes no node of the pool can host count all of a node's idle room, as
//! FGD counts a typical shape a node cannot take.
//!
//! A pool where work runs is scored against its own running work and the fleet's running
//! shapes that none of its nodes could host, empty (*foreign* shapes, counted as in the
//! fleet). Their fragment on any node of the pool is all its idle room, so a placement there
//! lowers it: FGD's global mix makes the nodes a large shape cannot use the better home for
//! small work, and the nodes that are the only home of the large shape the worse. With its
//! own work alone, each pool's score was relative to what it had taken, and the pool choice
//! compared scores against different mixes: on the openb traces the `G3` nodes (the only home
//! of the 8-GPU, 120-core tasks, and the most cores and memory per GPU) scored best for small
//! work because small work had gone there. Within a pool the foreign shapes shift every
//! placement of one demand alike and change little; between pools they are the yardstick the
//! own mixes lacked. Measured on the openb traces (BENCHMARKS.md, "Foreign shapes"); the
//! fleet's one mix for every pool instead was worse (BENCHMARKS.md, "The unfed GPUs first").
//! The pools' reports keep measuring a pool against its own running work only, without the
//! foreign shapes ([`Mix::runs_in`], [`Measure::own_fragmentation`]): an idle pool reports no
//! fragmentation. A fleet with nothing running has no mix: every placement scores alike and
//! best fit decides.
//!
//! A *shape* is (GPU demand, CPU, memory) of one replica; its count is how many replicas of the
//! mix have it. Workloads asking no GPU (CPU-only) are not in the mix, as FGD's typical shapes
//! are the GPU tasks': a CPU-only replica is placed by how its CPU changes what the mix's
//! shapes could still use (a node whose CPU it takes may no longer feed a shape's GPUs).
//! `n_k(node)` is how many replicas of shape k the node could still host, the least of what
//! its GPUs, its CPU and its memory allow.
//!
//! A replica's node is chosen by these criteria, in this order:
//!
//! - The GPUs left *unfed*: a node's free GPU units beyond what its CPU left could feed at the
//!   CPU per GPU unit of the fleet's running work (`Σ count × cpu / Σ count × units` over
//!   every pool's running replicas, counted once). A placement that takes more CPU per GPU
//!   than that, on a node whose CPU is already the short resource, leaves GPUs the work cannot
//!   use once the CPU is gone; the replica that leaves the fewest new unfed units wins (a
//!   CPU-light replica on a CPU-starved node leaves fewer than before, and is sent there). On
//!   most nodes, whose CPU can still feed their free GPUs, a placement leaves none, and the
//!   criteria below decide among them. First, before the score, because the score sees the
//!   same loss only once a shape of the mix no longer fits, one whole point at a time, and
//!   best fit on GPU room alone packs the fullest nodes, whose CPU goes first: on the openb
//!   traces most of the GPUs left idle at the end sat on nodes out of CPU. After the score
//!   and the hosting term, the unfed GPUs decided too few placements to keep them; first,
//!   they gained on every seed measured (BENCHMARKS.md, "The unfed GPUs first"). The fleet's
//!   ratio rather than each pool's own, because a pool's own is what was placed there: a pool
//!   that took CPU-heavy work weighs its nodes' CPU by that work and so looks short of CPU
//!   sooner than a pool of the same nodes that took light work, and work that may use either
//!   is then steered by what came before it, not by what its nodes can still feed. One
//!   yardstick for every pool ranks the pools' nodes alike. In a fleet whose pools run
//!   different kinds of work (CPU-light inference next to CPU-heavy training) the yardstick is
//!   their blend. Compared in whole GPUs, a part of one counting as one, away from zero
//!   ([`whole_gpus`]): the yardstick is an average, and a part of a GPU's worth of CPU under
//!   it is not a reason to take a placement that fragments more. In GPU units, on the openb
//!   `default` trace, every `G2` node was short of CPU at the early work's ratio; a 1-GPU,
//!   15-core task left 0.19 GPUs unfed on an empty one against 0.20 on a busy one, and took
//!   the empty node with a tier nine points worse, which also lost `G2` the pool choice
//!   (BENCHMARKS.md, "Unfed GPUs in whole GPUs").
//! - The fragmentation of a node: `F = Σ_k count_k × (idle − n_k × size_k)`, the node's idle GPU
//!   capacity that replicas of each shape could not use, weighted by how common the shape is.
//!   This is FGD's measure with the remainder counted: FGD counts a node that hosts one replica
//!   as wholly usable by the shape (so a 2-GPU task on an 8-GPU node with 4-GPU work running
//!   looks free, and on a node with 4 GPUs left looks like it strands 2, and FGD breaks the
//!   free node); counting what the hosted replicas leave over makes the two equal, and the next
//!   criteria keep the free node free. A placement's score is FGD's, `sigmoid(ΔF / total count,
//!   in GPUs) × 100`, truncated to whole points as FGD's published runs compared it: the openb
//!   benchmark measured that coarseness as worth about a point, because nodes within a few
//!   milli-GPU tie and the next criterion decides among them.
//! - The tie-break, the *hosting capacity* `H = Σ_k w_k × n_k`, `w_k = count_k × size_k ×
//!   nodes / hosts_k` where `hosts_k` is how many nodes of the empty pool could host one
//!   replica: a shape few nodes can take weighs more per replica, so that common shapes do not
//!   use up the only nodes it fits. Among equal scores the placement that destroys the least
//!   `H` wins.
//! - Then best fit (the least free room left), then the node's index.
//!
//! A *share* (an MPS or time-sliced fraction of one GPU) is the exception: its node is chosen
//! by the unfed GPUs, then best fit, then the index, without the score or the hosting term;
//! those still choose its pool and, on the node, its GPU. One share moves a node's `F` by a
//! fraction of a GPU, which the whole-point score turns into ties or single points that say
//! more about the remainder arithmetic of the mix's fractions than about what the node can
//! still host, and the hosting term then steered shares onto the emptiest GPUs, breaking
//! whole GPUs a pool's other nodes could have kept. Packed by best fit, the pool's partly
//! shared GPUs fill first. Measured on the openb traces (BENCHMARKS.md, "A share's node by
//! best fit; an idle pool scored against the fleet's mix"): the share-heavy traces' worst
//! checkpoint against FGD gains up to four points, the whole-GPU traces' a few tenths.
//!
//! Among the pools a workload may use, the solver takes first the one where the placement
//! breaks the fewest *only-home* replicas: a running shape of the fleet that no other pool
//! could host is its only home's to keep, and a placement's loss is how many replicas of such
//! shapes (each weighted by how many run) its nodes could host before and no longer after
//! ([`Measure::only_home`]). Next, the fewest new unfed GPUs (shares and whole GPUs alike, as
//! a share's node is chosen: work that takes more CPU per GPU than the fleet's goes to the
//! pools whose CPU can feed it). Next, a pool with nodes none of the other candidates matches
//! is kept for last, by how many of them it outclasses (`outclass.rs`). Then the least tier
//! summed over the nodes it lands on, then the least *versatile* pool: the one whose nodes,
//! empty, could host the fewest replicas of the fleet's running work ([`Mix::versatility`]),
//! then the first listed (pools are listed by name).
//!
//! The kept-for-last pool comes before the tier because the tier is a bad judge between pools
//! for small work. Small work scores a point better in a pool of large nodes. On the openb
//! traces, small work took the `G3` nodes (the only home of the 8-GPU, 120-core tasks) on
//! such points, one node at a time, and the first such task was refused at 19.5 % allocated.
//! No 120-core task had run by then for the only-home criterion to protect. The unfed GPUs
//! come before it: CPU-heavy work that would leave a less capable pool's GPUs without CPU
//! still goes where the cores are. Measured on the openb traces (BENCHMARKS.md, "The most
//! capable pool kept for last"). A tie that goes by the pools' names goes to whatever nodes the name
//! gives: work with the fewest alternatives should go where it fits, and the nodes most
//! shapes can use should stay for the work only they can host (BENCHMARKS.md, "The least
//! versatile pool").
//!
//! What a GPU can host, as it is laid out now (a layout change is a cost the placement already
//! puts last): an exclusive GPU, or a MIG GPU laid out as one 7g instance, hosts a whole-GPU
//! shape when free; a shared (MPS or time-sliced) GPU hosts as many replicas of a fraction as
//! its room and client slots allow (trust domains belong to tenants, not shapes, and are left
//! to the placement's own checks); a MIG GPU hosts its free instances of a profile.
//!
//! Everything is integer but the sigmoid, which is evaluated the same way on the same inputs:
//! the scoring is deterministic.
//!
//! A node's measure is remembered per decision's mix, keyed by everything it reads (the pool,
//! the CPU and memory left, and each GPU's occupancy, in sorted order since the measure sums
//! over GPUs): placing one replica measures every candidate node before and after, and most
//! nodes are unchanged since the last replica or look exactly like another node, so a fleet of
//! thousands of GPUs would otherwise recompute every shape's offer on every GPU each time.
//! A remembered measure is the measure: decisions are the same with or without it.

use std::cell::RefCell;

use smallvec::SmallVec;

use super::*;
use crate::problem::{NodeInfo, PoolInfo};

/// Measures remembered per mix before the memo is emptied: bounds its memory on a long
/// decision (an entry is a few hundred bytes).
const REMEMBERED: usize = 1 << 16;

/// One shape of a pool's mix.
#[derive(Debug, Clone)]
struct Shape {
    demand: Demand,
    cpu: u64,
    memory: u64,
    /// Replicas of the mix with this shape.
    count: u64,
    /// The weight of one hostable replica in `H`.
    weight: u64,
    /// No other pool's nodes could host it: the pool is its only home.
    only_home: bool,
}

/// The distinct GPU demands of a pool's shapes: what a GPU can host is computed once per demand
/// and shared by the shapes that differ only in CPU or memory.
#[derive(Debug, Clone, Default)]
struct PoolMix {
    demands: Vec<Demand>,
    /// With the index of their demand in `demands`.
    shapes: Vec<(usize, Shape)>,
    /// Replicas of the mix, the foreign ones included.
    total: u64,
    /// Replicas of the fleet's running shapes that none of the pool's nodes could host,
    /// beyond those the pool runs itself (*foreign*, see the module documentation). None of
    /// them fits any node of the pool, so each one's fragment on a node is all its idle
    /// room: they are counted, not listed among the shapes, and cost the measure one
    /// multiplication.
    foreign: u64,
}

/// The workload mix of a decision, per pool.
#[derive(Debug, Default)]
pub(super) struct Mix {
    pools: Vec<PoolMix>,
    /// Per pool: the replicas of the fleet's running work (every pool's, counted once) whose
    /// shape one of the pool's healthy nodes could host, empty (see [`Mix::versatility`]).
    versatility: Vec<u64>,
    /// The CPU and the GPU units the fleet's running work asks, in all (every pool's replicas,
    /// counted once): their ratio is the CPU a GPU unit comes with (see [`Mix::unfed`]).
    cpu_total: u128,
    units_total: u128,
    /// Per pool: whether its mix is its own running work (else the fleet's, or none).
    own: Vec<bool>,
    /// Node measures against this mix, by what they read (see the module documentation).
    remembered: RefCell<HashMap<NodeKey, Measure, foldhash::fast::FixedState>>,
    /// The key of the node being measured, built in place (see [`node_key_into`]).
    key: RefCell<NodeKey>,
}

/// Everything [`Mix::measure`] reads of a node, packed into words: the pool, the CPU and
/// memory left, then each GPU's [`gpu_head`] and [`instance_words`], GPUs in sorted order.
type NodeKey = Vec<u64>;

/// What [`Mix::measure`] reads of one GPU's state: one word (held whole, instance count,
/// share count, share total), then [`instance_words`].
fn gpu_head(s: &GpuState) -> u64 {
    (u64::from(s.whole.is_some()) << 63)
        | ((s.geometry.len().min(0xff) as u64) << 55)
        | ((s.shares.len().min(0x7fff) as u64) << 40)
        | (s.share_total().units().clamp(0, (1 << 40) - 1) as u64)
}

/// One word per MIG instance of a GPU (profile, start, held), in the geometry's order.
fn instance_words(s: &GpuState) -> impl Iterator<Item = u64> + '_ {
    // The held starts as a bit set, read once: a lookup in the held map per instance was most
    // of a MIG node's key.
    let mut held = [0u64; 4];
    for &start in s.held.keys() {
        held[usize::from(start >> 6)] |= 1 << (start & 63);
    }
    s.geometry.iter().map(move |pl| {
        let is_held = held[usize::from(pl.start >> 6)] >> (pl.start & 63) & 1;
        (u64::from(pl.profile_id) << 16) | (u64::from(pl.start) << 8) | is_held
    })
}

/// Writes into `key` the key of a node of `pool` with `cpu_left`, `memory_left` and these
/// GPUs. Built in place and looked up as a slice: a pool's every node is measured for each
/// arrival, nearly always a remembered one, and allocating each key was most of the cost.
fn node_key_into<'a>(
    key: &mut Vec<u64>,
    pool: usize,
    cpu_left: u64,
    memory_left: u64,
    gpus: impl Iterator<Item = &'a GpuState>,
) {
    // Each GPU's instance words written once into one buffer and compared as slices: an
    // iterator comparison looked each instance's start up in the GPU's held map at every
    // comparison of the sort, which was most of a MIG pool's measure.
    let mut words: SmallVec<[u64; 64]> = SmallVec::new();
    let mut sorted: SmallVec<[(u64, u32, u32); 16]> = gpus
        .map(|s| {
            let start = words.len() as u32;
            words.extend(instance_words(s));
            (gpu_head(s), start, words.len() as u32)
        })
        .collect();
    let of = |g: &(u64, u32, u32)| &words[g.1 as usize..g.2 as usize];
    // As `(head, instance words)` pairs compare: the head, then the words in order.
    sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| of(a).cmp(of(b))));
    key.clear();
    key.extend([pool as u64, cpu_left, memory_left]);
    for g in &sorted {
        key.push(g.0);
        key.extend_from_slice(of(g));
    }
}

/// A GPU's words in a node's key: its [`gpu_head`], then its [`instance_words`].
pub(super) fn gpu_words(s: &GpuState) -> GpuWords {
    std::iter::once(gpu_head(s))
        .chain(instance_words(s))
        .collect()
}

/// The words of one GPU in a node's key ([`gpu_words`]).
pub(super) type GpuWords = SmallVec<[u64; 8]>;

/// The words of a MIG GPU in state `s` once it holds its instance at `start` too, as
/// [`gpu_words`] gives them for that state: holding an instance sets its word's held bit and
/// nothing else of the GPU's words.
pub(super) fn gpu_words_holding(s: &GpuState, start: u8) -> GpuWords {
    std::iter::once(gpu_head(s))
        .chain(
            instance_words(s)
                .zip(&s.geometry)
                .map(|(word, pl)| word | u64::from(pl.start == start)),
        )
        .collect()
}

/// The key of a node whose key is `before` (see [`node_key_into`]) once it has `cpu_left` and
/// `memory_left` and each GPU of `changes` goes from its state to the words given
/// ([`gpu_words`] of its state after), written into `out`: the words `node_key_into` writes
/// for that node, built from the changed GPUs alone (a key is its GPUs' words in sorted
/// order, so the changed ones' words are taken out and theirs after put in). `false` when
/// `before` does not hold a changed GPU's words (it is not that node's key). A GPU's head
/// counts its instances (at most 7 on any MIG GPU; the head holds up to 255), which is how the
/// key is cut into GPUs.
pub(super) fn key_after(
    before: &[u64],
    cpu_left: u64,
    memory_left: u64,
    changes: &[(&GpuState, GpuWords)],
    out: &mut Vec<u64>,
) -> bool {
    // Declared first: the key's GPUs borrow the changed ones' words from it.
    let mut added: SmallVec<[u64; 16]> = SmallVec::new();
    let mut spans: SmallVec<[(usize, usize); 8]> = SmallVec::new();
    let mut gpus: SmallVec<[&[u64]; 16]> = SmallVec::new();
    let mut i = 3;
    while i < before.len() {
        // A GPU's words are its head, then one word per instance: the head counts them.
        let end = i + 1 + ((before[i] >> 55) & 0xff) as usize;
        let Some(words) = before.get(i..end) else {
            return false;
        };
        gpus.push(words);
        i = end;
    }
    for (old, new) in changes {
        let was = gpu_words(old);
        let Some(at) = gpus.iter().position(|g| **g == was[..]) else {
            return false;
        };
        gpus.swap_remove(at);
        let start = added.len();
        added.extend_from_slice(new);
        spans.push((start, added.len()));
    }
    gpus.extend(spans.iter().map(|&(a, b)| &added[a..b]));
    // As `node_key_into` orders them: the head, then the instance words (a slice's order).
    gpus.sort_unstable();
    out.clear();
    out.extend([before[0], cpu_left, memory_left]);
    for g in gpus {
        out.extend_from_slice(g);
    }
    true
}

/// How one node measures, before or after a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Measure {
    /// `F`, in GPU units × replicas.
    pub(super) fragmentation: u64,
    /// `F` over the shapes of the pool's own mix only, without the foreign ones: what the
    /// pool's report measures.
    pub(super) own_fragmentation: u64,
    /// `H`.
    pub(super) hosting: u64,
    /// The replicas of the pool's only-home shapes the node could host, each weighted by how
    /// many of its shape run (see the module documentation).
    pub(super) only_home: u64,
}

/// A shape's sort key: its demand's, then CPU, then memory.
type ShapeKey = ((u8, i64), u64, u64);

/// A demand's sort key: kind, then size.
fn demand_key(d: Demand) -> (u8, i64) {
    match d {
        Demand::Whole { count } => (0, i64::from(count)),
        Demand::Mig { profile_id } => (1, i64::from(profile_id)),
        Demand::Share { fraction } => (2, fraction.units()),
    }
}

impl Mix {
    /// The mix of the running workloads of `p` for which `runs` holds.
    pub(super) fn new(p: &Problem, runs: impl Fn(usize) -> bool) -> Mix {
        let mut counts: Vec<BTreeMap<ShapeKey, (Demand, u64)>> =
            vec![BTreeMap::new(); p.pools.len()];
        for (w, wl) in p.workloads.iter().enumerate() {
            let Phase::Running { slots, .. } = &wl.phase else {
                continue;
            };
            // A CPU-only workload is not a shape of the mix: it can use no GPU, so every idle
            // GPU would be its fragment alike (FGD's typical shapes are the GPU tasks'), and
            // its CPU is no measure of the CPU a GPU comes with. Its CPU still counts where
            // it runs, as the node's CPU left.
            if !runs(w) || wl.demand.gpus() == Gpus::ZERO {
                continue;
            }
            let Some(&pool) = wl.pools.first() else {
                continue;
            };
            let e = counts[pool]
                .entry((demand_key(wl.demand), wl.cpu.0, wl.memory.0))
                .or_insert((wl.demand, 0));
            e.1 += slots.len() as u64;
        }
        let own: Vec<bool> = counts.iter().map(|c| !c.is_empty()).collect();
        let mut fleet: BTreeMap<ShapeKey, (Demand, u64)> = BTreeMap::new();
        for shapes in &counts {
            for (&key, &(demand, count)) in shapes {
                fleet.entry(key).or_insert((demand, 0)).1 += count;
            }
        }
        let (mut cpu_total, mut units_total) = (0u128, 0u128);
        for (&(_, cpu, _), &(demand, count)) in &fleet {
            cpu_total += u128::from(count) * u128::from(cpu);
            units_total += u128::from(count) * demand.gpus().units().max(0) as u128;
        }
        // One pass asks each pool which of the fleet's shapes it could host: the hosted count
        // toward its versatility, the rest are a busy pool's foreign shapes; an idle pool's mix
        // is the fleet's (see the module documentation).
        let mut versatility = vec![0u64; p.pools.len()];
        let mut foreign = vec![0u64; p.pools.len()];
        // Per shape: how many pools could host it, and the last of them (the only one when
        // there is one).
        let mut homes: BTreeMap<ShapeKey, (usize, usize)> = BTreeMap::new();
        for (pool, (info, shapes)) in p.pools.iter().zip(counts.iter_mut()).enumerate() {
            let busy = !shapes.is_empty();
            for (key, &(demand, count)) in &fleet {
                let &(_, cpu, memory) = key;
                if can_host(p, info, demand, cpu, memory) {
                    let home = homes.entry(*key).or_insert((0, pool));
                    *home = (home.0 + 1, pool);
                    versatility[pool] += count;
                } else if busy {
                    foreign[pool] += count - shapes.get(key).map_or(0, |&(_, own)| own);
                }
            }
            if !busy {
                shapes.clone_from(&fleet);
            }
        }
        let pools = counts
            .into_iter()
            .enumerate()
            .map(|(pool, shapes)| {
                let info = &p.pools[pool];
                let nodes: Vec<&NodeInfo> = info
                    .nodes
                    .iter()
                    .map(|&n| &p.nodes[n])
                    .filter(|n| n.healthy)
                    .collect();
                let mut mix = PoolMix::default();
                for (key, (demand, count)) in shapes {
                    let (_, cpu, memory) = key;
                    if count == 0 {
                        continue;
                    }
                    let hosts = nodes
                        .iter()
                        .filter(|n| empty_node_fits(p, n, demand, cpu, memory))
                        .count() as u64;
                    let weight = (count.saturating_mul(demand.gpus().units().max(0) as u64))
                        .saturating_mul(nodes.len() as u64)
                        .checked_div(hosts)
                        .unwrap_or(0);
                    let d = match mix.demands.iter().position(|&x| x == demand) {
                        Some(d) => d,
                        None => {
                            mix.demands.push(demand);
                            mix.demands.len() - 1
                        }
                    };
                    mix.total += count;
                    mix.shapes.push((
                        d,
                        Shape {
                            demand,
                            cpu,
                            memory,
                            count,
                            weight,
                            only_home: homes.get(&key) == Some(&(1, pool)),
                        },
                    ));
                }
                mix.foreign = foreign[pool];
                mix.total += mix.foreign;
                mix
            })
            .collect();
        Mix {
            pools,
            versatility,
            cpu_total,
            units_total,
            own,
            remembered: RefCell::default(),
            key: RefCell::default(),
        }
    }

    /// How many replicas of the fleet's running work `pool` could host, each on one of its
    /// healthy nodes, empty: the pool choice's last criterion before the order the pools are
    /// listed in (see the module documentation). 0 when nothing runs.
    pub(super) fn versatility(&self, pool: usize) -> u64 {
        self.versatility.get(pool).copied().unwrap_or(0)
    }

    /// Whether the pool has a mix to score against: its own running work's, or the fleet's.
    pub(super) fn scores(&self, pool: usize) -> bool {
        self.pools.get(pool).is_some_and(|m| m.total > 0)
    }

    /// Whether the pool's mix is its own running work's (not the fleet's, lent to an idle
    /// pool): what the pool's report measures its fragmentation against.
    pub(super) fn runs_in(&self, pool: usize) -> bool {
        self.own.get(pool).copied().unwrap_or(false) && self.scores(pool)
    }

    /// `F` summed over nodes, divided by the pool's replica count: the GPUs a replica drawn
    /// from the mix could not use, in expectation (FGD's fragmentation of the pool). Rounded
    /// down to whole GPU units, so that the figure is exact and the same on every machine.
    pub(super) fn expected(&self, pool: usize, fragmentation: u128) -> Gpus {
        let total = self.pools.get(pool).map_or(0, |m| m.total - m.foreign);
        match fragmentation.checked_div(u128::from(total)) {
            Some(units) => Gpus::from_units(i64::try_from(units).unwrap_or(i64::MAX)),
            None => Gpus::ZERO,
        }
    }

    /// The free GPU units of a node with `cpu_left` and `free` units that its CPU could not
    /// feed at the fleet's running work's CPU per GPU unit (0 when nothing runs, or what runs
    /// asks no CPU). Integer: the same on every machine.
    pub(super) fn unfed(&self, cpu_left: u64, free: i64) -> i64 {
        if self.cpu_total == 0 {
            return 0;
        }
        let fed = u128::from(cpu_left).saturating_mul(self.units_total) / self.cpu_total;
        i64::try_from((free.max(0) as u128).saturating_sub(fed)).unwrap_or(i64::MAX)
    }

    /// The key [`Mix::measure`] remembers a node of `pool` with `cpu_left`, `memory_left` and
    /// these (healthy) GPUs by.
    pub(super) fn key<'a>(
        pool: usize,
        cpu_left: u64,
        memory_left: u64,
        gpus: impl Iterator<Item = &'a GpuState>,
    ) -> Vec<u64> {
        let mut key = Vec::new();
        node_key_into(&mut key, pool, cpu_left, memory_left, gpus);
        key
    }

    /// The measure remembered for a node with key `key`, if any, as [`Mix::measure`] gives
    /// it.
    pub(super) fn remembered(&self, key: &[u64]) -> Option<Measure> {
        self.remembered.borrow().get(key).copied()
    }

    /// `F` and `H` of a node with `cpu_left` and `memory_left` and these (healthy) GPUs,
    /// remembered.
    pub(super) fn measure<'a>(
        &self,
        p: &Problem,
        pool: usize,
        cpu_left: u64,
        memory_left: u64,
        gpus: impl Iterator<Item = &'a GpuState> + Clone,
    ) -> Measure {
        let Some(mix) = self.pools.get(pool) else {
            return Measure {
                fragmentation: 0,
                own_fragmentation: 0,
                hosting: 0,
                only_home: 0,
            };
        };
        let key = {
            let mut key = self.key.borrow_mut();
            node_key_into(&mut key, pool, cpu_left, memory_left, gpus.clone());
            if let Some(&m) = self.remembered.borrow().get(key.as_slice()) {
                return m;
            }
            key.clone()
        };
        let m = Self::compute(p, pool, mix, cpu_left, memory_left, gpus);
        let mut remembered = self.remembered.borrow_mut();
        if remembered.len() >= REMEMBERED {
            remembered.clear();
        }
        remembered.insert(key, m);
        m
    }

    /// `F` and `H` of a node of `pool`, computed.
    fn compute<'a>(
        p: &Problem,
        pool: usize,
        mix: &PoolMix,
        cpu_left: u64,
        memory_left: u64,
        gpus: impl Iterator<Item = &'a GpuState>,
    ) -> Measure {
        let (idle, offers) = offers(&p.pools[pool], &mix.demands, gpus);
        let mut fragmentation = 0u64;
        let mut hosting = 0u64;
        let mut only_home = 0u64;
        for (d, shape) in &mix.shapes {
            let by_gpu = offers[*d];
            let by_cpu = cpu_left.checked_div(shape.cpu).unwrap_or(u64::MAX);
            let by_memory = memory_left.checked_div(shape.memory).unwrap_or(u64::MAX);
            let replicas = by_gpu.min(by_cpu).min(by_memory);
            let used = (replicas as i64).saturating_mul(shape.demand.gpus().units());
            let fragment = (idle - used).max(0) as u64;
            fragmentation = fragmentation.saturating_add(shape.count.saturating_mul(fragment));
            hosting = hosting.saturating_add(shape.weight.saturating_mul(replicas));
            if shape.only_home {
                only_home = only_home.saturating_add(shape.count.saturating_mul(replicas));
            }
        }
        Measure {
            fragmentation: fragmentation
                .saturating_add(mix.foreign.saturating_mul(idle.max(0) as u64)),
            own_fragmentation: fragmentation,
            hosting,
            only_home,
        }
    }

    /// The cost of moving a node from `before` to `after`, lower is better: (`100 −` FGD's
    /// truncated score, hosting capacity destroyed).
    pub(super) fn cost(&self, pool: usize, before: Measure, after: Measure) -> (u32, u64) {
        let total = self.pools.get(pool).map_or(0, |m| m.total);
        if total == 0 {
            return (0, 0);
        }
        let delta = (before.fragmentation as f64 - after.fragmentation as f64)
            / total as f64
            / Gpus::whole(1).units() as f64;
        let score = 100.0 / (1.0 + (-delta).exp());
        let tier = 100u32.saturating_sub(score.floor().clamp(0.0, 100.0) as u32);
        (tier, before.hosting.saturating_sub(after.hosting))
    }
}

/// Whether one of `info`'s healthy nodes, empty, could host a replica of `demand` asking `cpu`
/// and `memory`: the pool takes the demand's kind ([`PoolInfo::takes`]) and the node has the
/// CPU, the memory and the healthy GPUs.
fn can_host(p: &Problem, info: &PoolInfo, demand: Demand, cpu: u64, memory: u64) -> bool {
    info.takes(demand)
        && info
            .nodes
            .iter()
            .map(|&n| &p.nodes[n])
            .any(|n| n.healthy && empty_node_fits(p, n, demand, cpu, memory))
}

/// Whether node `n`, empty, has the CPU, the memory and the healthy GPUs for a replica of
/// `demand` asking `cpu` and `memory` (one GPU for an instance or a share).
fn empty_node_fits(p: &Problem, n: &NodeInfo, demand: Demand, cpu: u64, memory: u64) -> bool {
    let need = match demand {
        Demand::Whole { count } => count as usize,
        _ => 1,
    };
    n.cpu.0 >= cpu
        && n.memory.0 >= memory
        && n.gpus.iter().filter(|&&g| p.gpus[g].healthy).count() >= need
}

/// What one GPU, as it is laid out now, offers every demand: read once per GPU, since a node
/// is measured against each of its pool's demands (a MIG pool has one per profile).
struct GpuOffer {
    /// Hosts a whole-GPU replica.
    whole: bool,
    /// Room and client slots for shares, when the GPU takes shares.
    share: Option<(i64, u32)>,
    /// The profiles of its free MIG instances, when it takes instances.
    free_instances: SmallVec<[u32; 8]>,
}

impl GpuOffer {
    fn of(info: &PoolInfo, s: &GpuState) -> GpuOffer {
        let whole = s.is_free()
            && (info.sharing != Sharing::Mig || s.geometry == [Placement::new(mig::PROFILE_7G, 0)]);
        let share = (s.whole.is_none() && s.held.is_empty()).then(|| {
            let room = Gpus::whole(1).units() - s.share_total().units();
            let slots = info
                .max_clients_per_gpu
                .saturating_sub(s.shares.len() as u32);
            (room, slots)
        });
        let free_instances = if s.whole.is_none() {
            s.geometry
                .iter()
                .filter(|pl| !s.held.contains_key(&pl.start))
                .map(|pl| pl.profile_id)
                .collect()
        } else {
            SmallVec::new()
        };
        GpuOffer {
            whole,
            share,
            free_instances,
        }
    }

    /// Replicas of `demand` this GPU hosts; for a whole-GPU demand, whether it is one of the
    /// free GPUs a replica needs `count` of.
    fn replicas(&self, demand: Demand) -> u64 {
        match demand {
            Demand::Whole { .. } => u64::from(self.whole),
            Demand::Share { fraction } => match self.share {
                Some((room, slots)) if fraction.units() > 0 => {
                    ((room.max(0) / fraction.units()) as u64).min(u64::from(slots))
                }
                _ => 0,
            },
            Demand::Mig { profile_id } => self
                .free_instances
                .iter()
                .filter(|&&p| p == profile_id)
                .count() as u64,
        }
    }
}

/// The idle GPU units of these GPUs, and how many replicas of each of `demands` they could
/// host as they are laid out now: one pass over the GPUs for both.
fn offers<'a>(
    info: &PoolInfo,
    demands: &[Demand],
    gpus: impl Iterator<Item = &'a GpuState>,
) -> (i64, SmallVec<[u64; 8]>) {
    let mut idle = 0;
    let mut sums: SmallVec<[u64; 8]> = SmallVec::from_elem(0, demands.len());
    for s in gpus {
        idle += Gpus::whole(1).units() - s.allocated().units();
        let gpu = GpuOffer::of(info, s);
        for (sum, &d) in sums.iter_mut().zip(demands) {
            *sum += gpu.replicas(d);
        }
    }
    for (sum, &d) in sums.iter_mut().zip(demands) {
        if let Demand::Whole { count } = d {
            *sum /= u64::from(count.max(1));
        }
    }
    (idle, sums)
}

/// A number of GPU units as whole GPUs, a part of one counting as one, away from zero: how the
/// unfed GPUs are compared (see the module documentation).
pub(super) fn whole_gpus(units: i64) -> i64 {
    let whole = units
        .unsigned_abs()
        .div_ceil(Gpus::UNITS_PER_GPU.unsigned_abs());
    i64::try_from(whole).unwrap_or(i64::MAX) * units.signum()
}
