//! Which pools outclass which: a criterion of the pool choice (see `fragmentation.rs`, the
//! paragraph on the pools a workload may use).
//!
//! A pool *outclasses* another when each node of the other is matched or exceeded by one of
//! its own in GPUs, cores and memory at once, and not the reverse. Among the pools that could
//! take a workload, a pool with a node that none of the others matches is the only home there
//! of work the size of that node; such a pool is kept for last, by how many of the others it
//! outclasses. All else equal, the work goes to the less capable nodes, and the capable ones
//! stay for the work only they can host. Slurm's node `Weight` exists to give this order by
//! hand.
//!
//! The relation reads the fleet, not the work. The only-home criterion protects a pool's nodes
//! for a shape that runs there. This one also protects them for a shape that has not run yet:
//! on the openb traces the first 8-GPU, 120-core task, which only the `G3` nodes can host,
//! came after small work had broken every `G3` node (BENCHMARKS.md, "The most capable pool
//! kept for last").
//!
//! Only the pool with a node nobody else matches is kept for last, not every pool that
//! outclasses another. Ordering every pool by capability sent the work any pool could take to
//! the smallest nodes first, and the tasks pinned to those nodes' model were then refused
//! early (the openb traces' `gpu_spec` variants; same section).
//!
//! Only healthy nodes count, each with its healthy GPUs. A pool is compared by its *front*:
//! the node capacities that no other node of the pool matches or exceeds in every resource.
//! A fleet of uniform pools has one capacity per pool.

use crate::problem::Problem;

/// A node's healthy GPUs, millicores and bytes of memory.
type Capacity = (usize, u64, u64);

/// The relations the pool choice asks about, worked out once per decision from the pools'
/// fronts: a multi-pool admission asks them of each of its pools, and the fronts do not change
/// within a decision.
#[derive(Debug)]
pub(super) struct Outclass {
    /// `beats[a][b]`: whether pool `a` outclasses pool `b`.
    beats: Vec<Vec<bool>>,
    /// Per pool, per capacity of its front: the other pools with a node that matches or
    /// exceeds it.
    matched_by: Vec<Vec<Vec<usize>>>,
}

impl Outclass {
    pub(super) fn new(p: &Problem) -> Outclass {
        let fronts = p
            .pools
            .iter()
            .map(|pool| {
                front(pool.nodes.iter().filter_map(|&n| {
                    let node = &p.nodes[n];
                    node.healthy.then(|| {
                        let gpus = node.gpus.iter().filter(|&&g| p.gpus[g].healthy).count();
                        (gpus, node.cpu.0, node.memory.0)
                    })
                }))
            })
            .collect();
        Outclass::of_fronts(fronts)
    }

    /// From each pool's front (empty for a pool without a healthy node).
    fn of_fronts(fronts: Vec<Vec<Capacity>>) -> Outclass {
        let pools = 0..fronts.len();
        // Whether each node of `b` is matched or exceeded by one of `a`.
        let covers = |a: usize, b: usize| {
            fronts[b]
                .iter()
                .all(|&c| fronts[a].iter().any(|&d| at_least(d, c)))
        };
        // A pool without a healthy node is outclassed by none: it takes no work, so it is no
        // alternative to keep a capable pool for.
        let beats = pools
            .clone()
            .map(|a| {
                pools
                    .clone()
                    .map(|b| !fronts[b].is_empty() && covers(a, b) && !covers(b, a))
                    .collect()
            })
            .collect();
        let matched_by = pools
            .clone()
            .map(|a| {
                fronts[a]
                    .iter()
                    .map(|&c| {
                        pools
                            .clone()
                            .filter(|&q| q != a && fronts[q].iter().any(|&d| at_least(d, c)))
                            .collect()
                    })
                    .collect()
            })
            .collect();
        Outclass { beats, matched_by }
    }

    /// The pool choice's criterion for `pool` among `pools` (which hold it): how many of them
    /// it outclasses, where it has a node that none of the others matches or exceeds (the
    /// only home, among them, of work the size of that node); 0 elsewhere.
    pub(super) fn rank(&self, pool: usize, pools: &[usize]) -> u64 {
        let alone = self.matched_by[pool]
            .iter()
            .any(|by| !by.iter().any(|q| pools.contains(q)));
        if !alone {
            return 0;
        }
        pools.iter().filter(|&&q| self.beats[pool][q]).count() as u64
    }

    /// Whether `a` outclasses `b`.
    #[cfg(test)]
    fn outclasses(&self, a: usize, b: usize) -> bool {
        self.beats[a][b]
    }
}

/// Whether `a` matches or exceeds `b` in every resource.
fn at_least(a: Capacity, b: Capacity) -> bool {
    a.0 >= b.0 && a.1 >= b.1 && a.2 >= b.2
}

/// The capacities of `nodes` that none of the others matches or exceeds in every resource (one
/// of equal ones), sorted. One pass keeping the front so far: a pool has thousands of nodes of
/// a few kinds.
fn front(nodes: impl Iterator<Item = Capacity>) -> Vec<Capacity> {
    let mut front: Vec<Capacity> = Vec::new();
    for c in nodes {
        if front.iter().any(|&f| at_least(f, c)) {
            continue;
        }
        front.retain(|&f| !at_least(c, f));
        front.push(c);
    }
    front.sort_unstable();
    front
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(fronts: &[&[Capacity]]) -> Outclass {
        Outclass::of_fronts(fronts.iter().map(|f| front(f.iter().copied())).collect())
    }

    #[test]
    fn a_front_keeps_the_capacities_nothing_else_matches() {
        let nodes = [
            (8, 96, 384),
            (8, 128, 768),
            (1, 128, 1024),
            (8, 128, 768),
            (2, 104, 512),
        ];
        assert_eq!(
            front(nodes.into_iter()),
            [(1, 128, 1024), (8, 128, 768)].to_vec()
        );
        assert_eq!(front(std::iter::empty()), Vec::<Capacity>::new());
    }

    #[test]
    fn a_pool_outclasses_one_whose_every_node_it_matches_and_more() {
        // 0: `G3`-like; 1: `G2`-like; 2: more cores and memory a node than `G2`, fewer GPUs;
        // 3: no healthy node; 4: `G2` again.
        let o = of(&[
            &[(8, 128, 768)],
            &[(8, 96, 384)],
            &[(2, 104, 512)],
            &[],
            &[(8, 96, 384)],
        ]);
        assert!(o.outclasses(0, 1));
        assert!(!o.outclasses(1, 0));
        assert!(o.outclasses(0, 2));
        // Neither has all the other has: no order between them.
        assert!(!o.outclasses(1, 2) && !o.outclasses(2, 1));
        // Equal pools, and a pool and itself, do not outclass each other.
        assert!(!o.outclasses(1, 4) && !o.outclasses(4, 1) && !o.outclasses(0, 0));
        assert!(!o.outclasses(0, 3) && !o.outclasses(3, 0));
        assert_eq!(o.rank(0, &[0, 1, 2, 3, 4]), 3);
        assert_eq!(o.rank(1, &[0, 1, 2, 3, 4]), 0);
    }

    #[test]
    fn only_a_pool_with_a_node_no_other_matches_is_kept_for_last() {
        // 0: `G3`-like; 1: `G2`-like; 2: small nodes `G2` outclasses; 3: more memory than
        // `G3`, as many cores.
        let o = of(&[
            &[(8, 128, 768)],
            &[(8, 96, 384)],
            &[(2, 16, 120)],
            &[(8, 128, 1024)],
        ]);
        assert!(o.outclasses(1, 2));
        // `G2` outclasses the small pool, but `G3` matches each of its nodes: small work is
        // not sent to the small nodes for it.
        assert_eq!(o.rank(1, &[0, 1, 2]), 0);
        assert_eq!(o.rank(0, &[0, 1, 2]), 2);
        // Beside a pool that matches its every node, `G3` is not alone either.
        assert_eq!(o.rank(0, &[0, 1, 2, 3]), 0);
        assert_eq!(o.rank(3, &[0, 1, 2, 3]), 3);
        assert_eq!(o.rank(1, &[1, 2]), 1);
    }

    #[test]
    fn a_pool_of_two_kinds_is_covered_only_where_both_are() {
        // 0 has a big node and a small one; 1 only nodes like the big one; 2 only the small.
        let o = of(&[
            &[(8, 128, 768), (1, 128, 1024)],
            &[(8, 128, 768)],
            &[(1, 128, 1024)],
        ]);
        assert!(o.outclasses(0, 1) && o.outclasses(0, 2));
        assert!(!o.outclasses(1, 0) && !o.outclasses(2, 0));
        assert!(!o.outclasses(1, 2) && !o.outclasses(2, 1));
    }
}
