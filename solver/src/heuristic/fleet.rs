//! The fleet as one cycle sees it: what holds each GPU, copy-on-write (`Rc` per GPU and per
//! workload's placements) so that the preemption search's what-ifs cost pointers; placement
//! of a gang on it (best fit, NVLink domains, MIG instances reused or geometry changed within
//! the budget, shares with trust domains apart), scored against fragmentation (see
//! `fragmentation.rs`).

use super::*;
use std::cell::{Cell, RefCell};
use std::hash::BuildHasherDefault;

use smallvec::SmallVec;

/// What a MIG replica's free-instance choice on a node depends on besides the node's state:
/// its pool (whose mix scores it), profile, CPU and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InstanceShape {
    pool: usize,
    profile_id: u32,
    cpu: u64,
    memory: u64,
}

/// A node's free-instance choices for the last [`REMEMBERED_SHAPES`] replica shapes asked, the
/// newest first (a pool's queue mostly repeats a few shapes).
#[derive(Debug, Clone, Copy, Default)]
struct RememberedInstances([Option<(InstanceShape, InstanceChoice)>; REMEMBERED_SHAPES]);

/// The GPU and the free instance a replica would take on a node, with what taking it costs
/// ([`Fleet::plan_cost`], `(0, 0)` in a pool not scored); `None` where none is free.
type InstanceChoice = Option<(usize, Placement, (u32, u64))>;

const REMEMBERED_SHAPES: usize = 4;

impl RememberedInstances {
    /// The choice remembered for `shape`: `Some(None)` when the node has no free instance
    /// for it.
    fn get(&self, shape: InstanceShape) -> Option<InstanceChoice> {
        self.0
            .iter()
            .flatten()
            .find(|(s, _)| *s == shape)
            .map(|&(_, choice)| choice)
    }

    /// Remembers `choice` for `shape`, forgetting the oldest shape when all are taken.
    fn put(&mut self, shape: InstanceShape, choice: InstanceChoice) {
        self.0.copy_within(..REMEMBERED_SHAPES - 1, 1);
        self.0[0] = Some((shape, choice));
    }
}

thread_local! {
    /// The key a placement leaves a node with, written by `key_after` for each free instance
    /// a MIG replica's search scores (it allocated one per instance scored).
    static KEY_AFTER: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// What the fleet remembers of a node until its state changes (see `Fleet::kept`).
#[derive(Debug, Clone, Default)]
struct Kept {
    /// The node's measure against the mix, with its pool: every gang measures each node with
    /// room before placing on it, and a gang changes a few nodes.
    measured: Cell<Option<(usize, Measure)>>,
    /// The node's measure key (`fragmentation.rs`): a placement's measure is looked up by the
    /// key after it, which [`key_after`] derives from this one and the GPUs the placement
    /// changes without reading the node's other GPUs.
    key: RefCell<Option<Rc<[u64]>>>,
    /// The hash of `key`, for the maps a replica's search keys by node key (an 8-GPU node's
    /// key is tens of words, hashed again for each replica that asked the node).
    key_hash: Cell<Option<u64>>,
    /// The node's best free MIG instance for the last few replica shapes asked: a busy MIG
    /// pool's every node with a free instance was scored again for each replica, where a
    /// gang changes one node per replica.
    instances: Cell<RememberedInstances>,
}

/// What holds a GPU now, in this decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct GpuState {
    /// Held whole (exclusive pool, or the 7g instance of a MIG GPU).
    pub(super) whole: Option<usize>,
    /// MIG geometry after the decision so far, sorted.
    pub(super) geometry: Vec<Placement>,
    /// Instances held, by start.
    pub(super) held: BTreeMap<u8, usize>,
    /// Shares: (workload, fraction, trust domain).
    pub(super) shares: Vec<(usize, Gpus, String)>,
    /// Geometry changes in this decision.
    pub(super) changes: u32,
    /// Placements (or the whole GPU, as start 255) released by preempted workloads.
    pub(super) preempted: BTreeSet<u8>,
    /// What the GPU offers a MIG replica in this state ([`Fleet::offers_of`]), kept by the
    /// fleet for the states it holds (`Fleet::reoffer`); a state [`Fleet::changed_by`] builds
    /// for scoring carries its source's, unread.
    pub(super) offers: Offers,
}

impl GpuState {
    pub(super) fn share_total(&self) -> Gpus {
        self.shares.iter().map(|s| s.1).sum()
    }
    pub(super) fn allocated(&self) -> Gpus {
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
    pub(super) fn is_free(&self) -> bool {
        self.whole.is_none() && self.held.is_empty() && self.shares.is_empty()
    }
    pub(super) fn busy(&self) -> Vec<Placement> {
        self.geometry
            .iter()
            .copied()
            .filter(|p| self.held.contains_key(&p.start))
            .collect()
    }
}

/// A replica's place in this decision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Placed {
    pub(super) node: usize,
    pub(super) gpus: Vec<usize>,
    pub(super) mig: Option<Placement>,
    pub(super) share: Option<Gpus>,
}

/// The fleet's occupancy, cloned for each tentative placement.
#[derive(Debug, Clone)]
pub(crate) struct Fleet {
    /// Shared until written, twice over: the preemption search tries many what-ifs, each a
    /// clone of the fleet that touches a few GPUs, so a clone copies one pointer per chunk of
    /// GPU states (see `cow.rs`), and a write copies a chunk of pointers and the one state.
    pub(super) gpu: CowVec<Rc<GpuState>>,
    pub(super) cpu: CowVec<u64>,
    pub(super) memory: CowVec<u64>,
    /// By workload index; cloned as `gpu` is.
    pub(crate) placed: CowVec<Option<Rc<Vec<Placed>>>>,
    /// Of each node's healthy GPUs: the free units ([`Fleet::node_free`]), how many are free
    /// whole and what they offer a MIG replica, kept as GPU states change: best fit and the
    /// preemption search's bounds ask for them for every node of a pool per gang, and a
    /// replica's search for a place skips the nodes that offer none.
    pub(super) free: CowVec<NodeFree>,
    /// Which nodes have anything free (`open.rs`), kept with `free` ([`Fleet::set_free`]).
    open: OpenNodes,
    /// What is known of each node as it stands ([`Kept`]), once worked out. Set through a
    /// shared chunk (the value is the same for every fleet that shares it: a fleet that
    /// changes a node first clears its entry, which copies the chunk), cleared by every write
    /// to the node's GPUs, CPU or memory ([`Fleet::occupy`], [`Fleet::release`], a rollback)
    /// and by a new mix.
    kept: CowVec<Kept>,
    /// Nodes held by reservations the workload being placed may not use (see `reserve.rs`);
    /// set only while one workload is decided.
    pub(super) barred: Option<Rc<BTreeSet<usize>>>,
    /// The decision's workload mix, which placements are scored against; shared by every clone.
    pub(super) mix: Rc<Mix>,
    /// Which pools outclass which (`outclass.rs`), for the pool choice; shared by every clone.
    pub(super) outclass: Rc<Outclass>,
    /// Per pool, the nodes of each of its NVLink domains (as `PoolInfo::domains` lists
    /// them), in pool order; shared by every clone.
    domains: Rc<Vec<Vec<Vec<usize>>>>,
    /// [`relayout_into`] by (layout, busy instances), computed once: a replica's search
    /// asks it for every GPU of every node of the pool, and busy sets repeat. Shared by every
    /// clone (the answers are the same for all).
    relayouts: Rc<RefCell<HashMap<RelayoutKey, Option<Vec<Placement>>>>>,
    /// [`Fleet::offers_of`]'s re-layout part, remembered; shared by every clone.
    pub(super) relayout_offers: RelayoutOffers,
    /// The values replaced while a what-if's mark is open (see `journal.rs`).
    pub(super) journal: FleetJournalSlot,
    /// Whether `occupy` keeps the offers and free room as it writes: not while
    /// [`Fleet::with`] places a snapshot's running work (it counts them all once after).
    keeping: bool,
}

/// What a node's healthy GPUs hold free, kept by the fleet (see [`Fleet::recount`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct NodeFree {
    units: i64,
    whole: u32,
    offers: Offers,
}

impl NodeFree {
    /// Whether anything is free: a GPU unit, or an instance a MIG replica could be offered.
    pub(super) fn is_open(&self) -> bool {
        self.units > 0 || self.whole > 0 || self.offers != Offers::default()
    }
}

type RelayoutKey = (Vec<Placement>, Vec<Placement>);

/// `fill`'s order of places, lowest first: no re-layout first, then the GPU units the place
/// leaves unfed for CPU ([`Fleet::unfed_by`]), then FGD's tier and the hosting capacity lost,
/// then best fit (the node's free units), then the node.
type FillKey = (bool, i64, u32, u64, i64, usize);

/// Why one replica does not fit on one node.
#[derive(Debug, Clone, Default)]
pub(super) struct Misses {
    pub(super) node_resources: Option<Resource>,
    pub(super) trust: bool,
    pub(super) budget: BTreeSet<usize>,
}

/// How to place one replica on a node.
#[derive(Debug, Clone)]
pub(super) enum Plan {
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
    #[cfg(test)]
    pub(super) fn new(p: &Problem) -> Fleet {
        Fleet::with(p, |_| {})
    }

    /// The fleet with what `occupy` places on it ([`Fleet::occupy`]'s writes without its
    /// bookkeeping), each GPU's offers and each node's free room then counted once: a snapshot
    /// of 65,000 running workloads recounted a node for every replica it holds.
    pub(super) fn with(p: &Problem, occupy: impl FnOnce(&mut Fleet)) -> Fleet {
        let mut fleet = Fleet {
            gpu: p
                .gpus
                .iter()
                .map(|g| {
                    Rc::new(GpuState {
                        geometry: g.instances.clone(),
                        ..GpuState::default()
                    })
                })
                .collect::<Vec<_>>()
                .into(),
            cpu: vec![0; p.nodes.len()].into(),
            memory: vec![0; p.nodes.len()].into(),
            placed: vec![None; p.workloads.len()].into(),
            free: vec![NodeFree::default(); p.nodes.len()].into(),
            open: OpenNodes::new(p),
            kept: vec![Kept::default(); p.nodes.len()].into(),
            barred: None,
            mix: Rc::new(Mix::new(p, |_| true)),
            outclass: Rc::new(Outclass::new(p)),
            domains: Rc::new(p.pools.iter().map(|info| domain_members(p, info)).collect()),
            relayouts: Rc::default(),
            relayout_offers: Rc::default(),
            journal: FleetJournalSlot::default(),
            keeping: true,
        };
        fleet.keeping = false;
        occupy(&mut fleet);
        fleet.keeping = true;
        for g in 0..p.gpus.len() {
            fleet.reoffer(p, g);
        }
        for n in 0..p.nodes.len() {
            fleet.recount(p, n);
        }
        fleet
    }

    /// [`relayout_into`] of `busy` and `layout`, remembered.
    pub(super) fn relayout(
        &self,
        layout: &[Placement],
        busy: &[Placement],
    ) -> Option<Vec<Placement>> {
        let key = (layout.to_vec(), busy.to_vec());
        if let Some(known) = self.relayouts.borrow().get(&key) {
            return known.clone();
        }
        let geometry = relayout_into(busy, layout);
        self.relayouts.borrow_mut().insert(key, geometry.clone());
        geometry
    }

    fn healthy_gpus(p: &Problem, n: usize) -> impl Iterator<Item = usize> + '_ {
        p.nodes[n]
            .gpus
            .iter()
            .copied()
            .filter(|&g| p.gpus[g].healthy)
    }

    /// Measures node `n`'s free units and offers again after its GPU states changed (each
    /// changed GPU's offers stored first, [`Fleet::reoffer`]).
    fn recount(&mut self, p: &Problem, n: usize) {
        let free = self.count_free(p, n);
        if self.free[n] != free {
            self.save_free(n);
            self.set_free(n, free);
        }
    }

    /// Writes node `n`'s free room, and whether it is open with it (the one place both are
    /// written: a recount and a rollback).
    pub(super) fn set_free(&mut self, n: usize, free: NodeFree) {
        self.free[n] = free;
        self.open.set(n, free.is_open());
    }

    /// The nodes among `nodes` of `pool` a replica of `demand` may go to by their free room
    /// alone: the open ones ([`needs_open`]), else all.
    fn candidates<'a>(
        &self,
        p: &Problem,
        pool: usize,
        nodes: &'a [usize],
        demand: Demand,
    ) -> std::borrow::Cow<'a, [usize]> {
        if !needs_open(demand) {
            return std::borrow::Cow::Borrowed(nodes);
        }
        debug_assert!(
            nodes
                .iter()
                .all(|&n| self.open.is_open(n) == self.free[n].is_open()
                    || p.nodes[n].pool.is_none()),
            "a node's open bit differs from its free room"
        );
        std::borrow::Cow::Owned(self.open.among(p, pool, nodes))
    }

    /// The open nodes of `pool` (see `open.rs`), in the pool's order.
    pub(super) fn open_in(&self, p: &Problem, pool: usize) -> Vec<usize> {
        self.open.among(p, pool, &p.pools[pool].nodes)
    }

    fn count_free(&self, p: &Problem, n: usize) -> NodeFree {
        Fleet::healthy_gpus(p, n).fold(NodeFree::default(), |free, g| {
            let s = &self.gpu[g];
            NodeFree {
                units: free.units + Gpus::whole(1).units() - s.allocated().units(),
                whole: free.whole + u32::from(s.is_free()),
                offers: free.offers.union(s.offers),
            }
        })
    }

    /// Node `n`'s offers to a MIG replica (see `offers.rs`).
    pub(super) fn node_offers(&self, p: &Problem, n: usize) -> Offers {
        debug_assert!(
            Fleet::healthy_gpus(p, n)
                .all(|g| self.gpu[g].offers == self.offers_of(p, g, &self.gpu[g])),
            "the offers kept for a GPU of node {n} are stale"
        );
        debug_assert_eq!(
            self.free[n],
            self.count_free(p, n),
            "the free units kept for node {n} are stale"
        );
        self.free[n].offers
    }

    /// Measures the workload mix again without the running workloads for which `gone` holds
    /// (a session's finished work), as a cycle on the snapshot without them would.
    pub(crate) fn forget(&mut self, p: &Problem, gone: impl Fn(usize) -> bool) {
        self.mix = Rc::new(Mix::new(p, |w| !gone(w)));
        self.kept = vec![Kept::default(); p.nodes.len()].into();
    }

    pub(super) fn occupy(&mut self, p: &Problem, w: usize, slot: Placed) {
        let wl = &p.workloads[w];
        self.save_node(slot.node);
        // While `Fleet::with` places the snapshot's work, nothing has been measured and no
        // clone shares the fleet's chunks: there is nothing to forget, and the write per
        // placement (65,000 at 50,000 GPUs) is skipped.
        if self.keeping {
            self.unmeasure(slot.node);
        }
        self.cpu[slot.node] += wl.cpu.0;
        self.memory[slot.node] += wl.memory.0;
        for &g in &slot.gpus {
            self.save_gpu(g);
        }
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
        let node = slot.node;
        if self.keeping {
            for &g in &slot.gpus {
                self.reoffer(p, g);
            }
        }
        self.save_placed(w);
        Rc::make_mut(self.placed[w].get_or_insert_with(Rc::default)).push(slot);
        if self.keeping {
            self.recount(p, node);
        }
    }

    /// Frees everything `w` holds; `preempted` marks it for drains.
    pub(crate) fn release(&mut self, p: &Problem, w: usize, preempted: bool) {
        let wl = &p.workloads[w];
        self.save_placed(w);
        for slot in self.placed[w].take().unwrap_or_default().iter() {
            self.save_node(slot.node);
            self.unmeasure(slot.node);
            for &g in &slot.gpus {
                self.save_gpu(g);
            }
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
            for &g in &slot.gpus {
                self.reoffer(p, g);
            }
            self.recount(p, slot.node);
        }
    }

    pub(super) fn usable(&self, p: &Problem, g: usize) -> bool {
        p.gpus[g].healthy
    }

    /// The GPUs of node `n` that its CPU could not feed at the fleet's running work's ratio
    /// once it holds a replica of `w`, less those unfed now ([`Mix::unfed`]), in whole GPUs
    /// ([`whole_gpus`]): negative where the replica asks less CPU per GPU than that on a node
    /// already short of CPU. A function of what the node's measure key holds, like the rest
    /// of `fill`'s key but the node.
    fn unfed_by(&self, p: &Problem, w: usize, n: usize) -> i64 {
        let wl = &p.workloads[w];
        let cpu = self.cpu_left(p, n);
        let free = self.node_free(p, n);
        let after = self.mix.unfed(
            cpu.saturating_sub(wl.cpu.0),
            free - wl.demand.gpus().units(),
        );
        whole_gpus(after - self.unfed_at(p, n))
    }

    /// The GPU units of node `n` that its CPU left could not feed at the fleet's running
    /// work's ratio ([`Mix::unfed`]).
    pub(super) fn unfed_at(&self, p: &Problem, n: usize) -> i64 {
        self.mix.unfed(self.cpu_left(p, n), self.node_free(p, n))
    }

    /// Free GPU units on a node (healthy GPUs).
    pub(super) fn node_free(&self, p: &Problem, n: usize) -> i64 {
        debug_assert_eq!(
            self.free[n],
            self.count_free(p, n),
            "the free units kept for node {n} are stale"
        );
        self.free[n].units
    }

    /// Whether node `n`'s free GPUs, as [`Fleet::recount`] keeps them, could take a replica of
    /// `demand`: `false` only where [`Fleet::option`] finds no place (it asks for that many
    /// GPUs free whole, a free or re-laid-out instance, or a GPU with the fraction's room).
    fn may_host(&self, n: usize, demand: Demand) -> bool {
        let free = &self.free[n];
        match demand {
            Demand::Whole { count } => free.whole >= count,
            Demand::Mig { .. } => free.offers.may_offer(demand),
            Demand::Share { fraction } => free.units >= fraction.units(),
        }
    }

    /// `F` and `H` of node `n` (see `fragmentation.rs`) as it is, or, with `after`, once a
    /// replica of that workload takes its CPU and memory and these GPU states replace the node's.
    pub(super) fn measure(
        &self,
        p: &Problem,
        pool: usize,
        n: usize,
        after: Option<(usize, &[(usize, GpuState)])>,
    ) -> Measure {
        if after.is_none()
            && let Some((at, m)) = self.kept[n].measured.get()
            && at == pool
        {
            debug_assert_eq!(
                m,
                self.mix.measure(
                    p,
                    pool,
                    self.cpu_left(p, n),
                    self.memory_left(p, n),
                    self.states(p, n)
                ),
                "the measure kept for node {n} is stale"
            );
            return m;
        }
        let node = &p.nodes[n];
        let mut cpu = self.cpu_left(p, n);
        let mut memory = self.memory_left(p, n);
        let changed: &[(usize, GpuState)] = match after {
            Some((w, changed)) => {
                cpu = cpu.saturating_sub(p.workloads[w].cpu.0);
                memory = memory.saturating_sub(p.workloads[w].memory.0);
                changed
            }
            None => &[],
        };
        let gpus = node.gpus.iter().filter(|&&g| self.usable(p, g)).map(|&g| {
            changed
                .iter()
                .find(|c| c.0 == g)
                .map_or(&*self.gpu[g], |c| &c.1)
        });
        if after.is_some() && self.mix.scores(pool) {
            let changes: SmallVec<[(&GpuState, GpuWords); 8]> = changed
                .iter()
                .filter(|c| self.usable(p, c.0))
                .map(|c| (&*self.gpu[c.0], gpu_words(&c.1)))
                .collect();
            let mut key = Vec::new();
            if key_after(&self.node_key(p, pool, n), cpu, memory, &changes, &mut key)
                && let Some(m) = self.mix.remembered(&key)
            {
                debug_assert_eq!(
                    key,
                    Mix::key(pool, cpu, memory, gpus.clone()),
                    "the key derived after a placement differs from the one built"
                );
                return m;
            }
        }
        let m = self.mix.measure(p, pool, cpu, memory, gpus);
        if after.is_none() {
            self.kept[n].measured.set(Some((pool, m)));
        }
        m
    }

    /// Forgets node `n`'s kept measure, key and instance choices: its state is being written,
    /// or put back by a rollback.
    pub(super) fn unmeasure(&mut self, n: usize) {
        // Written even when nothing is kept: the write gives this fleet its own copy of the
        // node's chunk, whose cells a clone sharing it would otherwise fill from its state.
        self.kept[n] = Kept::default();
    }

    /// The states of node `n`'s healthy GPUs, in the node's order.
    fn states<'a>(
        &'a self,
        p: &'a Problem,
        n: usize,
    ) -> impl Iterator<Item = &'a GpuState> + Clone {
        p.nodes[n]
            .gpus
            .iter()
            .filter(move |&&g| self.usable(p, g))
            .map(|&g| &*self.gpu[g])
    }

    /// Node `n`'s CPU left unused.
    fn cpu_left(&self, p: &Problem, n: usize) -> u64 {
        p.nodes[n].cpu.0.saturating_sub(self.cpu[n])
    }

    /// Node `n`'s memory left unused.
    fn memory_left(&self, p: &Problem, n: usize) -> u64 {
        p.nodes[n].memory.0.saturating_sub(self.memory[n])
    }

    /// Node `n`'s measure key as it stands (see [`Kept::key`]).
    fn node_key(&self, p: &Problem, pool: usize, n: usize) -> Rc<[u64]> {
        if let Some(key) = self.kept[n].key.borrow().as_ref()
            && key.first() == Some(&(pool as u64))
        {
            debug_assert_eq!(
                key[..],
                Mix::key(
                    pool,
                    self.cpu_left(p, n),
                    self.memory_left(p, n),
                    self.states(p, n)
                )[..],
                "the key kept for node {n} is stale"
            );
            return Rc::clone(key);
        }
        let key: Rc<[u64]> = Mix::key(
            pool,
            self.cpu_left(p, n),
            self.memory_left(p, n),
            self.states(p, n),
        )
        .into();
        *self.kept[n].key.borrow_mut() = Some(Rc::clone(&key));
        self.kept[n].key_hash.set(None);
        key
    }

    /// [`Fleet::node_key`] with its hash, kept with it.
    fn node_key_hashed(&self, p: &Problem, pool: usize, n: usize) -> HashedKey {
        let key = self.node_key(p, pool, n);
        let hash = match self.kept[n].key_hash.get() {
            Some(h) => {
                debug_assert_eq!(h, hash_key(&key), "the key hash kept for node {n} is stale");
                h
            }
            None => {
                let h = hash_key(&key);
                self.kept[n].key_hash.set(Some(h));
                h
            }
        };
        HashedKey(hash, key)
    }

    /// The GPU states `plan` leaves behind for a replica of `w`, as [`Fleet::apply`] writes them.
    pub(super) fn changed_by(&self, p: &Problem, w: usize, plan: &Plan) -> Vec<(usize, GpuState)> {
        match plan {
            Plan::Whole { gpus, relayout } => gpus
                .iter()
                .map(|&g| {
                    let mut s = (*self.gpu[g]).clone();
                    if relayout.contains(&g) {
                        s.geometry = vec![Placement::new(mig::PROFILE_7G, 0)];
                        s.changes += 1;
                    }
                    s.whole = Some(w);
                    (g, s)
                })
                .collect(),
            Plan::Instance {
                gpu,
                placement,
                geometry,
            } => {
                let mut s = (*self.gpu[*gpu]).clone();
                if let Some(geometry) = geometry {
                    s.geometry = geometry.clone();
                    s.changes += 1;
                }
                s.held.insert(placement.start, w);
                vec![(*gpu, s)]
            }
            Plan::Share { gpu } => {
                let mut s = (*self.gpu[*gpu]).clone();
                if let Demand::Share { fraction } = p.workloads[w].demand {
                    let td = p.tenants[p.workloads[w].tenant].trust_domain.clone();
                    s.shares.push((w, fraction, td));
                }
                vec![(*gpu, s)]
            }
        }
    }

    /// The cost of `plan` on node `n`, lower is better: (`100 −` FGD's truncated score, hosting
    /// capacity destroyed); `before` is the node's measure as it is.
    pub(super) fn plan_cost(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        n: usize,
        before: Measure,
        plan: &Plan,
    ) -> (u32, u64) {
        // A free instance taken changes one word of the node's key: the measure after is
        // looked up without building the GPU's state after (a MIG replica's search scores
        // every GPU of every node that offers the instance).
        if let Plan::Instance {
            gpu,
            placement,
            geometry: None,
        } = plan
            && self.usable(p, *gpu)
            && self.mix.scores(pool)
        {
            let wl = &p.workloads[w];
            let cpu = self.cpu_left(p, n).saturating_sub(wl.cpu.0);
            let memory = self.memory_left(p, n).saturating_sub(wl.memory.0);
            let s = &*self.gpu[*gpu];
            let changes = [(s, gpu_words_holding(s, placement.start))];
            let after = KEY_AFTER.with_borrow_mut(|key| {
                key_after(&self.node_key(p, pool, n), cpu, memory, &changes, key)
                    .then(|| self.mix.remembered(key))
                    .flatten()
            });
            if let Some(after) = after {
                debug_assert_eq!(
                    after,
                    self.measure(p, pool, n, Some((w, &self.changed_by(p, w, plan)))),
                    "the measure looked up after a placement differs from the one built"
                );
                return self.mix.cost(pool, before, after);
            }
        }
        let changed = self.changed_by(p, w, plan);
        let after = self.measure(p, pool, n, Some((w, &changed)));
        self.mix.cost(pool, before, after)
    }

    /// Whether node `n` of `pool` may take a replica of `w` before its GPUs are looked at:
    /// healthy, in the pool, not barred, with the CPU and memory; `Err` with the resource
    /// short when that is why not.
    fn admits(&self, p: &Problem, w: usize, pool: usize, n: usize) -> Result<(), Option<Resource>> {
        let wl = &p.workloads[w];
        let node = &p.nodes[n];
        if !node.healthy || node.pool != Some(pool) {
            return Err(None);
        }
        if self.barred.as_ref().is_some_and(|b| b.contains(&n)) {
            return Err(None);
        }
        if self.cpu[n] + wl.cpu.0 > node.cpu.0 {
            return Err(Some(Resource::Cpu));
        }
        if self.memory[n] + wl.memory.0 > node.memory.0 {
            return Err(Some(Resource::Memory));
        }
        Ok(())
    }

    /// [`Fleet::option`], with the same answer and the same misses, without looking at the GPUs
    /// of a node whose offers show no place for a MIG replica (see `offers.rs`).
    pub(super) fn option_indexed(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        n: usize,
        miss: &mut Misses,
    ) -> Option<Plan> {
        if self.node_offers(p, n).may_offer(p.workloads[w].demand) {
            return self.option(p, w, pool, n, miss);
        }
        // What `option` records of such a node: why it cannot take a replica at all.
        if let Err(Some(resource)) = self.admits(p, w, pool, n) {
            miss.node_resources.get_or_insert(resource);
        }
        None
    }

    /// The free instance of `profile_id` on node `n`'s `gpus` a replica of `w` would take:
    /// on the GPU that fragments the node least, then the tightest. A function of the node's
    /// state and of the replica's shape ([`InstanceShape`]) alone.
    fn free_instance(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        n: usize,
        profile_id: u32,
        gpus: &[usize],
    ) -> InstanceChoice {
        let scored = self.mix.scores(pool);
        // Measured when a GPU first offers a place: most nodes of a busy pool offer none.
        let before = std::cell::OnceCell::new();
        let before = || scored.then(|| *before.get_or_init(|| self.measure(p, pool, n, None)));
        let mut best: Option<((u32, u64, i64), usize, Placement)> = None;
        // A GPU laid out and held as one scored before scores as it did (the node's GPUs are a
        // multiset to the measure) and loses the tie to it: a node's GPUs mostly share a
        // layout, and each score measures the whole node.
        let mut scored_states: SmallVec<[&GpuState; 8]> = SmallVec::new();
        for &g in gpus {
            let s = &self.gpu[g];
            if s.whole.is_some() || scored_states.iter().any(|t| same_mig_state(s, t)) {
                continue;
            }
            if let Some(pl) = s
                .geometry
                .iter()
                .find(|pl| pl.profile_id == profile_id && !s.held.contains_key(&pl.start))
            {
                let free = Gpus::whole(1).units() - s.allocated().units();
                let (tier, loss) = match before() {
                    Some(before) => {
                        let plan = Plan::Instance {
                            gpu: g,
                            placement: *pl,
                            geometry: None,
                        };
                        self.plan_cost(p, w, pool, n, before, &plan)
                    }
                    None => (0, 0),
                };
                let key = (tier, loss, free);
                if best.as_ref().is_none_or(|b| key < b.0) {
                    best = Some((key, g, *pl));
                }
                scored_states.push(s);
            }
        }
        best.map(|((tier, loss, _), gpu, placement)| (gpu, placement, (tier, loss)))
    }

    /// How a replica of `w` could go on node `n` of `pool`; with its cost (re-layouts first).
    pub(super) fn option(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        n: usize,
        miss: &mut Misses,
    ) -> Option<Plan> {
        let wl = &p.workloads[w];
        let node = &p.nodes[n];
        if let Err(short) = self.admits(p, w, pool, n) {
            if let Some(resource) = short {
                miss.node_resources.get_or_insert(resource);
            }
            return None;
        }
        // No GPU free whole: a whole-GPU replica finds nothing below and records no miss.
        if matches!(wl.demand, Demand::Whole { count } if count > 0) && self.free[n].whole == 0 {
            return None;
        }
        let info = &p.pools[pool];
        // A node's GPUs fit inline: asked per open node per replica, the heap was a third of
        // this function's cost.
        let gpus: SmallVec<[usize; 8]> = node
            .gpus
            .iter()
            .copied()
            .filter(|&g| self.usable(p, g))
            .collect();
        match wl.demand {
            Demand::Whole { count } => {
                let mut ready: SmallVec<[usize; 8]> = SmallVec::new();
                let mut relayout: SmallVec<[usize; 8]> = SmallVec::new();
                for &g in &gpus {
                    let s = &self.gpu[g];
                    if !s.is_free() {
                        continue;
                    }
                    if info.sharing != Sharing::Mig
                        || s.geometry == [Placement::new(mig::PROFILE_7G, 0)]
                    {
                        ready.push(g);
                    } else if within_budget(p, info, g, s, &[Placement::new(mig::PROFILE_7G, 0)]) {
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
                // A free existing instance first: remembered per node and replica shape until
                // the node changes (debug builds check it against the scan of the GPUs).
                let shape = InstanceShape {
                    pool,
                    profile_id,
                    cpu: wl.cpu.0,
                    memory: wl.memory.0,
                };
                let free = match self.kept[n].instances.get().get(shape) {
                    Some(choice) => {
                        debug_assert_eq!(
                            choice,
                            self.free_instance(p, w, pool, n, profile_id, &gpus),
                            "the free instance remembered for node {n} is stale"
                        );
                        choice
                    }
                    None => {
                        let choice = self.free_instance(p, w, pool, n, profile_id, &gpus);
                        let mut kept = self.kept[n].instances.get();
                        kept.put(shape, choice);
                        self.kept[n].instances.set(kept);
                        choice
                    }
                };
                if let Some((gpu, placement, _)) = free {
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
                        let Some(geometry) = self.relayout(layout, &busy) else {
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
                        if !within_budget(p, info, g, s, &geometry) {
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
                let scored = self.mix.scores(pool);
                // Measured when a GPU first offers a place: most nodes of a busy pool offer none.
                let before = std::cell::OnceCell::new();
                let before =
                    || scored.then(|| *before.get_or_init(|| self.measure(p, pool, n, None)));
                let mut best: Option<((u32, u64, i64), usize)> = None;
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
                    // The GPU that fragments the node least, then the most loaded that fits.
                    let (tier, loss) = match before() {
                        Some(before) => {
                            self.plan_cost(p, w, pool, n, before, &Plan::Share { gpu: g })
                        }
                        None => (0, 0),
                    };
                    let key = (tier, loss, -total.units());
                    if best.as_ref().is_none_or(|b| key < b.0) {
                        best = Some((key, g));
                    }
                }
                best.map(|(_, gpu)| Plan::Share { gpu })
            }
        }
    }

    pub(super) fn apply(&mut self, p: &Problem, w: usize, n: usize, plan: Plan) {
        let slot = match plan {
            Plan::Whole { gpus, relayout } => {
                for g in relayout {
                    self.save_gpu(g);
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
                    self.save_gpu(gpu);
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
    /// fragments the pool least (re-layouts last; see `fragmentation.rs`), then where it fits
    /// with the least room left. Returns how many were placed.
    pub(super) fn fill(
        &mut self,
        p: &Problem,
        w: usize,
        pool: usize,
        nodes: &[usize],
        want: u32,
        miss: &mut Misses,
    ) -> u32 {
        let scored = self.mix.scores(pool);
        // Each node's measure as it is; only the node a replica went to changes.
        let mut before: HashMap<usize, Measure, foldhash::fast::FixedState> = HashMap::default();
        let demand = p.workloads[w].demand;
        let mut placed = 0;
        while placed < want {
            // Only the nodes with anything free, found from the kept bits: in a busy pool a
            // few in a hundred, and the pool is asked once per replica.
            let open = self.candidates(p, pool, nodes, demand);
            // A free instance always beats a re-layout (the key's first field): where any node
            // offers one that takes the replica, the best of those is the best of all, and the
            // nodes without one need not be asked. The misses recorded there are not the whole
            // scan's; they are read only when nothing is placed, and then the scan below runs.
            let mut best = None;
            if let Demand::Mig { profile_id } = demand {
                let free = open
                    .iter()
                    .copied()
                    .filter(|&n| self.node_offers(p, n).has_free(profile_id));
                best = self.best_option(
                    p,
                    w,
                    pool,
                    free,
                    scored,
                    &mut before,
                    &mut Misses::default(),
                );
            }
            // The nodes whose free room, as kept, could take a replica: of the open ones,
            // those with enough, told by one read of what is kept per node.
            if best.is_none() {
                let roomy = open.iter().copied().filter(|&n| self.may_host(n, demand));
                best = self.best_option(
                    p,
                    w,
                    pool,
                    roomy,
                    scored,
                    &mut before,
                    &mut Misses::default(),
                );
            }
            // Why nothing fits is read only when no replica was placed (`capacity_reason`),
            // and it names what the first nodes scanned lack: then every node is asked.
            if best.is_none() && placed == 0 {
                best =
                    self.best_option(p, w, pool, nodes.iter().copied(), scored, &mut before, miss);
                debug_assert!(
                    best.is_none(),
                    "a node the free room left out took a replica"
                );
            }
            // The choice is the whole scan's, node by node (`option` on every node).
            debug_assert_eq!(
                best.as_ref().map(|b| b.0),
                self.scan_key(p, w, pool, nodes, scored),
                "the offers index chose another node than the scan of every node"
            );
            let Some((_, n, plan)) = best else { break };
            let predicted = cfg!(debug_assertions).then(|| {
                let changed = self.changed_by(p, w, &plan);
                self.measure(p, pool, n, Some((w, &changed)))
            });
            self.apply(p, w, n, plan);
            // The scoring's view of a placement is the placement: `changed_by` mirrors `apply`.
            debug_assert!(predicted.is_none_or(|m| m == self.measure(p, pool, n, None)));
            before.remove(&n);
            placed += 1;
        }
        placed
    }

    /// The best place for a replica of `w` among `nodes` by `fill`'s key, `option` asked only
    /// where the offers index shows a place could be (see [`Fleet::option_indexed`]).
    #[allow(clippy::too_many_arguments)]
    fn best_option(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        nodes: impl Iterator<Item = usize>,
        scored: bool,
        before: &mut HashMap<usize, Measure, foldhash::fast::FixedState>,
        miss: &mut Misses,
    ) -> Option<(FillKey, usize, Plan)> {
        let mut best: Option<(FillKey, usize, Plan)> = None;
        // A place that changes no layout (whole GPUs on free GPUs as they are laid out, a free
        // MIG instance) is chosen among a node's GPUs by what the node's measure key holds, and
        // everything the place's key reads but the node's number (the measures before and
        // after, the free room) is a function of that key too. Of nodes with equal keys where
        // such a place is found, the lowest-numbered wins, and the others need not be asked:
        // in a busy pool the nodes with room are mostly a few states repeated. (A re-layout
        // depends on each GPU's reconfiguration budget, and a share on the tenants already on
        // the GPU: neither is in the key.)
        let by_key = matches!(
            p.workloads[w].demand,
            Demand::Whole { .. } | Demand::Mig { .. }
        );
        let share = matches!(p.workloads[w].demand, Demand::Share { .. });
        let mut taken: HashMap<HashedKey, usize, BuildHasherDefault<KeptHash>> = HashMap::default();
        for n in nodes {
            let key = by_key.then(|| self.node_key_hashed(p, pool, n));
            if let Some(key) = &key
                && taken.get(key).is_some_and(|&m| m < n)
            {
                continue;
            }
            let Some(plan) = self.option_indexed(p, w, pool, n, miss) else {
                continue;
            };
            let relayout = match &plan {
                Plan::Whole { relayout, .. } => !relayout.is_empty(),
                Plan::Instance { geometry, .. } => geometry.is_some(),
                Plan::Share { .. } => false,
            };
            if let Some(key) = key
                && !relayout
            {
                taken.insert(key, n);
            }
            // A share's node is chosen by the unfed GPUs and best fit alone (`fragmentation.rs`).
            let (tier, loss) = match self.remembered_cost(p, w, pool, n, &plan) {
                _ if share => (0, 0),
                // The free instance's cost, scored when the node's instances were (the same
                // plan on the same measure): a busy MIG pool's nodes are asked again for each
                // replica of each gang of a shape, and each scoring builds the node's key after.
                Some(cost) => {
                    debug_assert_eq!(
                        Some(cost),
                        scored
                            .then(|| {
                                let b = self.measure(p, pool, n, None);
                                self.plan_cost(p, w, pool, n, b, &plan)
                            })
                            .or(Some((0, 0))),
                        "the cost remembered for node {n}'s free instance is stale"
                    );
                    cost
                }
                None if scored => {
                    let b = *before
                        .entry(n)
                        .or_insert_with(|| self.measure(p, pool, n, None));
                    self.plan_cost(p, w, pool, n, b, &plan)
                }
                None => (0, 0),
            };
            let unfed = if scored { self.unfed_by(p, w, n) } else { 0 };
            let key = (relayout, unfed, tier, loss, self.node_free(p, n), n);
            if best.as_ref().is_none_or(|b| key < b.0) {
                best = Some((key, n, plan));
            }
        }
        best
    }

    /// The cost of `plan` on node `n` remembered with the node's free instance for `w`'s
    /// shape, when `plan` takes that instance.
    fn remembered_cost(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        n: usize,
        plan: &Plan,
    ) -> Option<(u32, u64)> {
        let Plan::Instance {
            gpu,
            placement,
            geometry: None,
        } = plan
        else {
            return None;
        };
        let wl = &p.workloads[w];
        let Demand::Mig { profile_id } = wl.demand else {
            return None;
        };
        let shape = InstanceShape {
            pool,
            profile_id,
            cpu: wl.cpu.0,
            memory: wl.memory.0,
        };
        match self.kept[n].instances.get().get(shape) {
            Some(Some((g, pl, cost))) if g == *gpu && pl == *placement => Some(cost),
            _ => None,
        }
    }

    /// The key of the best place among `nodes` by asking `option` of every node: what `fill`
    /// chose before the offers index, kept to check it in debug builds.
    fn scan_key(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        nodes: &[usize],
        scored: bool,
    ) -> Option<FillKey> {
        let mut best: Option<FillKey> = None;
        for &n in nodes {
            let Some(plan) = self.option(p, w, pool, n, &mut Misses::default()) else {
                continue;
            };
            let relayout = match &plan {
                Plan::Whole { relayout, .. } => !relayout.is_empty(),
                Plan::Instance { geometry, .. } => geometry.is_some(),
                Plan::Share { .. } => false,
            };
            let share = matches!(plan, Plan::Share { .. });
            let (tier, loss) = if scored && !share {
                self.plan_cost(p, w, pool, n, self.measure(p, pool, n, None), &plan)
            } else {
                (0, 0)
            };
            let unfed = if scored { self.unfed_by(p, w, n) } else { 0 };
            let key = (relayout, unfed, tier, loss, self.node_free(p, n), n);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        best
    }

    /// Places the gang on `pool` honouring its topology: at least `min`, up to `want` replicas,
    /// written on this fleet. On `Err` the fleet is as it was: each tentative placement is made
    /// under a journal mark (`journal.rs`) and rolled back when it falls short, where a clone of
    /// the whole fleet per attempt cost the fleet's size each time (a pointer per chunk, then
    /// all dropped), per admission.
    pub(super) fn place_gang(
        &mut self,
        p: &Problem,
        w: usize,
        pool: usize,
        want: u32,
        min: u32,
    ) -> Result<(), Reason> {
        let wl = &p.workloads[w];
        let info = &p.pools[pool];
        let mut miss = Misses::default();
        let all: &[usize] = &info.nodes;
        // Each domain's nodes, in pool order, gathered once a cycle (see `Fleet::new`); sets
        // of nodes are borrowed, not copied, per gang (a pool has thousands of nodes).
        let members = Rc::clone(&self.domains);
        let members = &members[pool];
        let domain_free =
            |f: &Fleet, d: usize| -> i64 { members[d].iter().map(|&n| f.node_free(p, n)).sum() };
        // A set where not even one replica has a place cannot take the gang: `fill` would ask
        // each node for a place first, as this does, and stop when none has one (most nodes of
        // a busy pool). The misses recorded are not the reason given.
        let attempt = |f: &mut Fleet, set: &[usize], at_least: u32| {
            let mut miss = Misses::default();
            if at_least > 0
                && !set
                    .iter()
                    .any(|&n| f.option_indexed(p, w, pool, n, &mut miss).is_some())
            {
                return false;
            }
            f.fill_at_least(p, w, pool, set, want, at_least, &mut miss)
                .is_ok()
        };
        // Domains and nodes best-fit: the smallest free room first, so large ones stay free;
        // then by name (the pool's domains are sorted by name, so by index). Ordered only for
        // a gang with a topology: the free room of every node of the pool is summed for it.
        let domain_sets = |f: &Fleet| -> Vec<&[usize]> {
            let mut domains: Vec<usize> = (0..info.domains.len()).collect();
            domains.sort_by_cached_key(|&d| (domain_free(f, d), d));
            domains.iter().map(|&d| members[d].as_slice()).collect()
        };
        match wl.topology {
            TopologyMode::Required => {
                // A domain that takes every replica, else one that takes at least `min`.
                let domain_sets = domain_sets(self);
                let tries: &[u32] = if want == min { &[want] } else { &[want, min] };
                for &at_least in tries {
                    for &set in &domain_sets {
                        if attempt(self, set, at_least) {
                            return Ok(());
                        }
                    }
                }
                // Would it fit split? Then the domain is the reason; otherwise the capacity.
                let fit = self.fit_count(p, w, pool, all, want, &mut miss);
                if fit >= min {
                    let best = (0..info.domains.len())
                        .map(|d| domain_free(self, d))
                        .max()
                        .unwrap_or(0);
                    return Err(Reason::NoNvlinkDomain {
                        pool: info.name.clone(),
                        needed_gpus: wl.demand.gpus() * i64::from(min),
                        best_free: Gpus::from_units(best),
                    });
                }
                Err(self.capacity_reason(p, w, pool, min, fit, &miss))
            }
            TopologyMode::Preferred => {
                let mut nodes = all.to_vec();
                nodes.sort_by_cached_key(|&n| (self.node_free(p, n), n));
                let node_sets: Vec<&[usize]> = nodes.iter().map(std::slice::from_ref).collect();
                // A one-node, then one-domain placement, if it takes the whole gang.
                for sets in [node_sets, domain_sets(self)] {
                    for set in sets {
                        if attempt(self, set, want) {
                            return Ok(());
                        }
                    }
                }
                self.fill_at_least(p, w, pool, all, want, min, &mut miss)
                    .map_err(|fit| self.capacity_reason(p, w, pool, min, fit, &miss))
            }
            TopologyMode::None => self
                .fill_at_least(p, w, pool, all, want, min, &mut miss)
                .map_err(|fit| self.capacity_reason(p, w, pool, min, fit, &miss)),
        }
    }

    /// How many replicas of `w` (up to `want`) [`Fleet::fill`] places on `nodes`; the fleet is
    /// left as it is.
    fn fit_count(
        &mut self,
        p: &Problem,
        w: usize,
        pool: usize,
        nodes: &[usize],
        want: u32,
        miss: &mut Misses,
    ) -> u32 {
        let mark = self.mark();
        let fit = self.fill(p, w, pool, nodes, want, miss);
        self.rollback(mark);
        fit
    }

    /// [`Fleet::fill`] under a journal mark: kept when at least `at_least` replicas fit,
    /// otherwise undone and how many fitted.
    #[allow(clippy::too_many_arguments)]
    fn fill_at_least(
        &mut self,
        p: &Problem,
        w: usize,
        pool: usize,
        nodes: &[usize],
        want: u32,
        at_least: u32,
        miss: &mut Misses,
    ) -> Result<(), u32> {
        let mark = self.mark();
        let fit = self.fill(p, w, pool, nodes, want, miss);
        if fit >= at_least {
            self.commit(mark);
            Ok(())
        } else {
            self.rollback(mark);
            Err(fit)
        }
    }

    pub(super) fn capacity_reason(
        &self,
        p: &Problem,
        w: usize,
        pool: usize,
        min: u32,
        fit: u32,
        miss: &Misses,
    ) -> Reason {
        let wl = &p.workloads[w];
        let info = &p.pools[pool];
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

/// A node key with its hash, kept with the node (`Kept::key_hash`): hashed once per node
/// state rather than once per map it enters.
#[derive(Debug, Clone)]
struct HashedKey(u64, Rc<[u64]>);

impl PartialEq for HashedKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0 && self.1 == other.1
    }
}

impl Eq for HashedKey {}

impl std::hash::Hash for HashedKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.0);
    }
}

fn hash_key(key: &[u64]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(key)
}

/// The hasher of maps keyed by [`HashedKey`]: the hash kept, passed through.
#[derive(Default)]
struct KeptHash(u64);

impl std::hash::Hasher for KeptHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is called (`HashedKey`); anything else is folded in, never lost.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Whether two MIG GPUs' states offer a replica the same places at the same cost: the same
/// instances laid out, the same ones held (by whom does not matter), nothing else on them.
fn same_mig_state(a: &GpuState, b: &GpuState) -> bool {
    a.whole.is_none()
        && b.whole.is_none()
        && a.shares.is_empty()
        && b.shares.is_empty()
        && a.geometry == b.geometry
        && a.held.keys().eq(b.held.keys())
}

/// The nodes of each of `info`'s domains, in pool order.
fn domain_members(p: &Problem, info: &crate::problem::PoolInfo) -> Vec<Vec<usize>> {
    let mut by_name: HashMap<&str, Vec<usize>> = HashMap::new();
    for &n in &info.nodes {
        by_name
            .entry(p.nodes[n].domain.as_str())
            .or_default()
            .push(n);
    }
    info.domains
        .iter()
        .map(|d| by_name.get(d.as_str()).cloned().unwrap_or_default())
        .collect()
}

/// Whether GPU `g` may change from its geometry so far to `target`: this decision's changes
/// count against its pool's budget, and so do the snapshot's records of the last hour when
/// the change takes something away (destroys an instance, or resets the GPU into MIG mode),
/// as only such changes are recorded. Laying out instances on free slices is never barred by
/// the past.
fn within_budget(
    p: &Problem,
    pool: &crate::problem::PoolInfo,
    g: usize,
    s: &GpuState,
    target: &[Placement],
) -> bool {
    let info = &p.gpus[g];
    let takes_away = !info.mig_enabled || s.geometry.iter().any(|x| !target.contains(x));
    let spent = if takes_away { info.spent } else { 0 };
    s.changes + spent < pool.max_changes_per_gpu
}

/// A GPU left with part of a layout (a reconfiguration interrupted between destroying and
/// creating, or a node set up by hand) is completed to an allowed layout that keeps every
/// instance it has: only instances are added, on free memory slices, so nothing running is
/// disturbed. `None` when the geometry is empty, already a layout of the pool, cannot be
/// completed without destroying something, or this decision's changes of the GPU used its
/// budget (changes recorded before this decision do not bar adding instances).
pub(super) fn complete_layout(
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
pub(super) fn relayout_into(busy: &[Placement], layout: &[Placement]) -> Option<Vec<Placement>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tessera_compiler::{SourceFile, compile};

    /// One tier, which every test policy here starts with.
    const TIERS: &str = r#"
apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {name: tiers}
spec:
  tiers:
    - {name: high, value: 1000}
---"#;

    const POLICY: &str = r#"
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: serving}
spec: {tier: high, preemptible: true, isolation: {minimum: mig}}
---
apiVersion: tessera/v1alpha1
kind: MigLayout
metadata: {name: balanced}
spec: {gpuModel: H100-SXM5-80GB, instances: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]}
---
apiVersion: tessera/v1alpha1
kind: MigLayout
metadata: {name: two-3g}
spec: {gpuModel: H100-SXM5-80GB, instances: [3g.40gb, 3g.40gb]}
---
apiVersion: tessera/v1alpha1
kind: MigLayout
metadata: {name: three-2g}
spec: {gpuModel: H100-SXM5-80GB, instances: [2g.20gb, 2g.20gb, 2g.20gb, 1g.10gb]}
---
apiVersion: tessera/v1alpha1
kind: MigLayout
metadata: {name: full}
spec: {gpuModel: H100-SXM5-80GB, instances: [7g.80gb]}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: infer}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {nodes: 3, gpusPerNode: 2, cpuPerNode: 192, memoryPerNode: 2Ti}
  sharing: mig
  migLayouts: [balanced, two-3g, three-2g, full]
  reconfiguration: {maxPerGpuPerHour: 2}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: a}
spec:
  guarantee: {infer: 6}
  sloClasses: [serving]
"#;

    const PROFILES: [&str; 4] = ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"];

    /// Three MIG nodes of two GPUs (one laid out `three-2g`, one `two-3g`, the rest empty)
    /// and twelve pending single replicas, three of each profile.
    fn problem() -> Problem {
        let mut nodes = String::new();
        for n in 0..3 {
            nodes += &format!(
                "    - name: m{n}\n      pool: infer\n      cpu: 192\n      memory: 2Ti\n      gpus:\n"
            );
            for i in 0..2 {
                let instances = match (n, i) {
                    (0, 0) => {
                        "[{profile: 2g.20gb, start: 0}, {profile: 2g.20gb, start: 2}, {profile: 2g.20gb, start: 4}, {profile: 1g.10gb, start: 6}]"
                    }
                    (1, 1) => "[{profile: 3g.40gb, start: 0}, {profile: 3g.40gb, start: 4}]",
                    _ => "[]",
                };
                nodes += &format!(
                    "        - {{index: {i}, uuid: GPU-{:08x}-0000-0000-0000-000000000000, model: H100-SXM5-80GB, mig: {{enabled: true}}, instances: {instances}}}\n",
                    n * 2 + i
                );
            }
        }
        let mut pending = String::new();
        for w in 0..12 {
            pending += &format!(
                "    - name: w{w:02}\n      spec: {{tenant: a, sloClass: serving, gpu: {{migProfile: {}}}}}\n      submittedAt: \"2026-11-20T07:00:00Z\"\n",
                PROFILES[w % PROFILES.len()]
            );
        }
        problem_of(POLICY, &nodes, &pending)
    }

    /// The problem of `policy` (after [`TIERS`]) and a snapshot of these nodes and pending
    /// workloads (YAML list items), nothing running.
    fn problem_of(policy: &str, nodes: &str, pending: &str) -> Problem {
        let state = format!(
            "---\napiVersion: tessera/v1alpha1\nkind: ClusterState\nmetadata: {{name: snap}}\nspec:\n  observedAt: \"2026-11-20T08:00:00Z\"\n  nodes:\n{nodes}  running: []\n  pending:\n{pending}"
        );
        let c = compile(&[SourceFile::new("p.yaml", format!("{TIERS}{policy}{state}"))]);
        assert_eq!(c.errors(), 0, "{:#?}", c.diagnostics);
        Problem::new(c.policy.as_ref().unwrap(), &c.states[0].1, None).unwrap()
    }

    /// A pool of whole GPUs over three words of open bits: 150 nodes of two GPUs, and 200
    /// pending workloads asking one or two GPUs.
    fn whole_gpu_problem() -> Problem {
        let policy = r#"
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: batch}
spec: {tier: high, preemptible: true, isolation: {minimum: exclusive}}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: train}
spec:
  gpuModel: H100-SXM5-80GB
  sharing: exclusive
  capacity: {nodes: 150, gpusPerNode: 2, cpuPerNode: 192, memoryPerNode: 2Ti}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: a}
spec:
  guarantee: {train: 300}
  sloClasses: [batch]
"#;
        let mut nodes = String::new();
        for n in 0..150 {
            nodes += &format!(
                "    - name: t{n:03}\n      pool: train\n      cpu: 192\n      memory: 2Ti\n      gpus:\n"
            );
            for i in 0..2 {
                nodes += &format!(
                    "        - {{index: {i}, uuid: GPU-{:08x}-0000-0000-0000-000000000001, model: H100-SXM5-80GB}}\n",
                    n * 2 + i
                );
            }
        }
        let mut pending = String::new();
        for w in 0..200 {
            pending += &format!(
                "    - name: w{w:03}\n      spec: {{tenant: a, sloClass: batch, gpu: {{count: {}}}}}\n      submittedAt: \"2026-11-20T07:00:00Z\"\n",
                1 + w % 2
            );
        }
        problem_of(policy, &nodes, &pending)
    }

    /// The nodes and GPUs whose kept free units or offers differ from a recount.
    fn stale(p: &Problem, f: &Fleet) -> Vec<String> {
        let gpus = (0..p.gpus.len())
            .filter(|&g| f.gpu[g].offers != f.offers_of(p, g, &f.gpu[g]))
            .map(|g| format!("GPU {g}"));
        let nodes = (0..p.nodes.len())
            .filter(|&n| f.free[n] != f.count_free(p, n))
            .map(|n| format!("node {n}"));
        // The open nodes, read a word at a time and a node at a time, are those a recount
        // finds anything free on.
        let open = (0..p.pools.len()).filter_map(|pool| {
            let all = &p.pools[pool].nodes;
            let recounted: Vec<usize> = all
                .iter()
                .copied()
                .filter(|&n| f.count_free(p, n).is_open())
                .collect();
            let by_word = f.open.among(p, pool, all);
            let by_node = f.open.among(p, pool, &all.clone());
            (by_word != recounted || by_node != recounted).then(|| {
                format!("pool {pool}'s open nodes {by_word:?} {by_node:?}, not {recounted:?}")
            })
        });
        gpus.chain(nodes).chain(open).collect()
    }

    /// Whether two fleets hold the very same GPU states and placements (the same `Rc`s) and
    /// the same node figures.
    fn identical(p: &Problem, a: &Fleet, b: &Fleet) -> bool {
        (0..p.gpus.len()).all(|g| Rc::ptr_eq(&a.gpu[g], &b.gpu[g]))
            && (0..p.nodes.len())
                .all(|n| (a.cpu[n], a.memory[n], a.free[n]) == (b.cpu[n], b.memory[n], b.free[n]))
            && (0..p.nodes.len()).all(|n| a.open.is_open(n) == b.open.is_open(n))
            && (0..p.workloads.len()).all(|w| match (&a.placed[w], &b.placed[w]) {
                (Some(x), Some(y)) => Rc::ptr_eq(x, y),
                (None, None) => true,
                _ => false,
            })
    }

    proptest! {
        /// Marks opened, replicas placed and released (drains marked or not) under them, and
        /// rollbacks to any open mark: a rollback leaves the fleet holding the very values it
        /// held when the mark opened (the same `Rc` per GPU state and per placement list), and
        /// the offers and free units kept equal a recount throughout. A rollback that keeps
        /// what it undid, then its redo, leaves the fleet as it was before the rollback, and
        /// the marks opened before still undo the redone writes; so do they a committed
        /// mark's writes.
        #[test]
        fn rollback_restores_the_very_values(
            ops in proptest::collection::vec((0usize..12, any::<bool>(), 0u8..9), 1..60)
        ) {
            let p = problem();
            let pool = 0;
            // The pool's own list: `fill` reads its open nodes a word at a time.
            let nodes = &p.pools[pool].nodes;
            let mut fleet = Fleet::new(&p);
            // Some work placed before any mark, so that releases have something to undo.
            for w in 0..6 {
                fleet.fill(&p, w, pool, nodes, 1, &mut Misses::default());
            }
            // Each open mark, with a copy of the fleet as it was when it opened.
            let mut open: Vec<(crate::undo::Mark, Fleet)> = Vec::new();
            for (w, preempted, action) in ops {
                match action {
                    0 => {
                        let copy = fleet.clone();
                        open.push((fleet.mark(), copy));
                    }
                    1 if !open.is_empty() => {
                        let i = w % open.len();
                        let (mark, copy) = open[i].clone();
                        fleet.rollback(mark);
                        open.truncate(i);
                        prop_assert!(identical(&p, &fleet, &copy));
                        prop_assert_eq!(fleet.journaling(), !open.is_empty());
                    }
                    2 if !open.is_empty() => {
                        let i = w % open.len();
                        let (mark, copy) = open[i].clone();
                        let written = fleet.clone();
                        let redo = fleet.rollback_keeping(mark);
                        open.truncate(i);
                        prop_assert!(identical(&p, &fleet, &copy));
                        prop_assert_eq!(stale(&p, &fleet), Vec::<String>::new());
                        fleet.redo(redo);
                        prop_assert!(identical(&p, &fleet, &written));
                        prop_assert_eq!(fleet.journaling(), !open.is_empty());
                    }
                    3 if !open.is_empty() => {
                        let i = w % open.len();
                        fleet.commit(open[i].0);
                        open.truncate(i);
                        prop_assert_eq!(fleet.journaling(), !open.is_empty());
                    }
                    _ => {
                        if fleet.placed[w].is_some() {
                            fleet.release(&p, w, preempted);
                        } else {
                            fleet.fill(&p, w, pool, nodes, 1, &mut Misses::default());
                        }
                    }
                }
                prop_assert_eq!(stale(&p, &fleet), Vec::<String>::new());
            }
            if let Some((mark, copy)) = open.first().cloned() {
                fleet.rollback(mark);
                prop_assert!(identical(&p, &fleet, &copy));
                prop_assert!(!fleet.journaling());
            }
        }

        /// Whole GPUs placed and released in any order on a pool of three words of open
        /// bits: the open nodes read a word at a time are those a recount finds room on, in a
        /// clone too, and a rollback puts the bits back with the free room.
        #[test]
        fn open_nodes_follow_the_free_room_across_words(
            ops in proptest::collection::vec((0usize..200, any::<bool>()), 1..120)
        ) {
            let p = whole_gpu_problem();
            let pool = 0;
            let nodes = &p.pools[pool].nodes;
            let mut fleet = Fleet::new(&p);
            let start = fleet.clone();
            let mark = fleet.mark();
            for (w, preempted) in ops {
                let before = fleet.clone();
                if fleet.placed[w].is_some() {
                    fleet.release(&p, w, preempted);
                } else {
                    fleet.fill(&p, w, pool, nodes, 1, &mut Misses::default());
                }
                prop_assert_eq!(stale(&p, &fleet), Vec::<String>::new());
                prop_assert_eq!(stale(&p, &before), Vec::<String>::new());
            }
            fleet.rollback(mark);
            prop_assert!(identical(&p, &fleet, &start));
        }

        /// Placing and releasing replicas in any order (the placement checked against the
        /// scan of every node in debug builds), the offers and free units kept equal a
        /// recount, in the fleet and in a clone taken before each change.
        #[test]
        fn kept_offers_equal_a_recount(ops in proptest::collection::vec((0usize..12, any::<bool>()), 1..40)) {
            let p = problem();
            let pool = 0;
            // The pool's own list: `fill` reads its open nodes a word at a time.
            let nodes = &p.pools[pool].nodes;
            let mut fleet = Fleet::new(&p);
            prop_assert!(stale(&p, &fleet).is_empty());
            for (w, preempted) in ops {
                let before = fleet.clone();
                if fleet.placed[w].is_some() {
                    fleet.release(&p, w, preempted);
                } else {
                    fleet.fill(&p, w, pool, nodes, 1, &mut Misses::default());
                }
                prop_assert_eq!(stale(&p, &fleet), Vec::<String>::new());
                prop_assert_eq!(stale(&p, &before), Vec::<String>::new());
            }
        }
    }
}
