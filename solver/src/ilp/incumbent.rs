//! The incumbent decision read back into the problem's indices: where each workload sits, per
//! node, and what it holds there.

use std::cmp::Ordering;

use tessera_compiler::units::Gpus;

use crate::decision::{Decision, Outcome, ReplicaBinding};
use crate::heuristic::Admission;
use crate::problem::{NodeIndex, Phase, Problem, WorkloadInfo};

/// One workload's place in a pool: replicas and healthy GPUs held, per node.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub pool: usize,
    pub nodes: PerNode,
}

impl Placement {
    /// Where a running workload runs, from the snapshot.
    pub fn running(p: &Problem, wl: &WorkloadInfo) -> Option<Placement> {
        let Phase::Running { slots, .. } = &wl.phase else {
            return None;
        };
        let mut pl = Placement {
            pool: wl.pools[0],
            nodes: PerNode(Vec::with_capacity(1)),
        };
        for s in slots {
            let h = pl.nodes.entry(s.node);
            h.replicas += 1;
            h.healthy_gpus += s.gpus.iter().filter(|&&g| p.gpus[g].healthy).count() as u32;
        }
        Some(pl)
    }
}

/// What a workload holds per node, by node: a sorted list, since a workload is on one node
/// or a few. Read for every workload of the incumbent, where a tree per workload cost an
/// allocation of a whole tree node each (65,000 at 50,000 GPUs).
#[derive(Debug, Clone, Default)]
pub struct PerNode(Vec<(usize, Held)>);

impl PerNode {
    /// Node `n`'s entry, added empty if it has none.
    pub fn entry(&mut self, n: usize) -> &mut Held {
        let i = match self.0.binary_search_by_key(&n, |&(m, _)| m) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, (n, Held::default()));
                i
            }
        };
        &mut self.0[i].1
    }

    pub fn get(&self, n: &usize) -> Option<&Held> {
        self.0
            .binary_search_by_key(n, |&(m, _)| m)
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// (node, held) in node order.
    pub fn iter(&self) -> impl Iterator<Item = (&usize, &Held)> {
        self.0.iter().map(|(n, h)| (n, h))
    }

    pub fn keys(&self) -> impl Iterator<Item = &usize> {
        self.0.iter().map(|(n, _)| n)
    }

    pub fn values(&self) -> impl Iterator<Item = &Held> {
        self.0.iter().map(|(_, h)| h)
    }
}

impl<'a> IntoIterator for &'a PerNode {
    type Item = (&'a usize, &'a Held);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (usize, Held)>,
        fn(&'a (usize, Held)) -> (&'a usize, &'a Held),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(n, h)| (n, h))
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Held {
    pub replicas: u32,
    /// GPUs that new work could use once this one leaves.
    pub healthy_gpus: u32,
}

#[derive(Debug, Clone)]
pub enum State {
    Kept(Placement),
    /// Admitted; `true` when entirely within its tenant's guarantee.
    Admitted(Placement, bool),
    Preempted,
    Pending,
}

impl State {
    pub fn placement(&self) -> Option<&Placement> {
        match self {
            State::Kept(pl) | State::Admitted(pl, _) => Some(pl),
            _ => None,
        }
    }
}

/// The state of every workload of the problem, by index.
pub fn read(p: &Problem, d: &Decision) -> Vec<State> {
    let node_index = p.node_index();
    let listed = &d.workloads;
    let found = find_in_order(
        listed.len(),
        |i| (listed[i].tenant.as_str(), listed[i].name.as_str()),
        p.workloads.iter().map(|wl| wl.key.as_pair()),
    );
    // Each workload's state read on the machine's cores (`split`).
    crate::split::map(&found, |&(w, i)| {
        match i.map(|i| &listed[i].outcome) {
            Some(Outcome::Keep { .. }) => match Placement::running(p, &p.workloads[w]) {
                Some(pl) => State::Kept(pl),
                None => State::Pending,
            },
            Some(Outcome::Admit {
                bindings, borrowed, ..
            }) => {
                match admitted(p, &node_index, bindings) {
                    Some(pl) => State::Admitted(pl, *borrowed == Gpus::ZERO),
                    // Bindings the problem cannot resolve would be a bug of the cycle; such a
                    // workload is simply not refined (its pool is left as it is).
                    None => State::Pending,
                }
            }
            Some(Outcome::Preempt { .. }) => State::Preempted,
            // Not listed ([`crate::decision::Listing::Changes`]): kept if running, else
            // still waiting.
            None => match Placement::running(p, &p.workloads[w]) {
                Some(pl) => State::Kept(pl),
                None => State::Pending,
            },
            Some(Outcome::Pending { .. }) => State::Pending,
        }
    })
}

/// Each of `keys`, numbered, with its position among `len` keys listed in ascending order
/// (`listed(i)`), if there: found by walking both lists forward while `keys` ascend, and by
/// halving for a key out of that order. The decision lists its workloads by (tenant, name),
/// and the problem its running work so, then its queue in submission order. At 50,000 GPUs a
/// hashed index of the decision's 70,000 names, built and probed at random, took 6 % of a
/// cycle's time on one thread; the walk reads both lists in order (more instructions, fewer
/// stalls: BENCHMARKS.md).
fn find_in_order<'k>(
    len: usize,
    listed: impl Fn(usize) -> (&'k str, &'k str),
    keys: impl Iterator<Item = (&'k str, &'k str)>,
) -> Vec<(usize, Option<usize>)> {
    debug_assert!(
        (1..len).all(|i| listed(i - 1) < listed(i)),
        "the listed keys are not in ascending order"
    );
    let mut next = 0;
    let mut last: Option<(&str, &str)> = None;
    keys.enumerate()
        .map(|(w, key)| {
            if last.is_none_or(|l| l < key) {
                last = Some(key);
                // Every listed key before `next` is before `last`, so before `key`: one
                // comparison per step tells passing, finding and stopping apart.
                while next < len {
                    match listed(next).cmp(&key) {
                        Ordering::Less => next += 1,
                        Ordering::Equal => return (w, Some(next)),
                        Ordering::Greater => break,
                    }
                }
                return (w, None);
            }
            let (mut lo, mut hi) = (0, len);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                match listed(mid).cmp(&key) {
                    Ordering::Less => lo = mid + 1,
                    Ordering::Equal => return (w, Some(mid)),
                    Ordering::Greater => hi = mid,
                }
            }
            (w, None)
        })
        .collect()
}

fn admitted(p: &Problem, node_index: &NodeIndex, bindings: &[ReplicaBinding]) -> Option<Placement> {
    let first = node_index.get(bindings.first()?.node.as_str())?;
    let mut pl = Placement {
        pool: p.nodes[*first].pool?,
        nodes: PerNode::default(),
    };
    for b in bindings {
        let n = *node_index.get(b.node.as_str())?;
        let h = pl.nodes.entry(n);
        h.replicas += 1;
        h.healthy_gpus += b.gpus.len() as u32;
    }
    Some(pl)
}

/// The admission that reproduces an admitted workload where it is.
pub fn admission(w: usize, pl: &Placement) -> Admission {
    Admission {
        workload: w,
        pool: pl.pool,
        nodes: pl.nodes.iter().map(|(&n, h)| (n, h.replicas)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Keys in any order, some listed and some not, are found where a hashed index of
        /// the listed keys finds them.
        #[test]
        fn keys_are_found_as_a_hashed_index_finds_them(
            listed in proptest::collection::btree_set((0u8..6, 0u8..40), 0..120),
            keys in proptest::collection::vec((0u8..7, 0u8..45), 0..150),
            sorted_first in 0usize..150,
        ) {
            let text = |(t, n): (u8, u8)| (format!("t{t}"), format!("w{n:02}"));
            let listed: Vec<(String, String)> = listed.into_iter().map(text).collect();
            // A sorted run first, as the problem's running work, then any order.
            let mut keys: Vec<(String, String)> = keys.into_iter().map(text).collect();
            keys.dedup();
            let run = sorted_first.min(keys.len());
            keys[..run].sort();
            let index: std::collections::HashMap<(&str, &str), usize> = listed
                .iter()
                .enumerate()
                .map(|(i, (t, n))| ((t.as_str(), n.as_str()), i))
                .collect();
            let found = find_in_order(
                listed.len(),
                |i| (listed[i].0.as_str(), listed[i].1.as_str()),
                keys.iter().map(|(t, n)| (t.as_str(), n.as_str())),
            );
            for (w, (t, n)) in keys.iter().enumerate() {
                proptest::prop_assert_eq!(found[w], (w, index.get(&(t.as_str(), n.as_str())).copied()));
            }
        }
    }

    #[test]
    fn a_workload_s_nodes_are_kept_in_node_order_one_entry_each() {
        let mut nodes = PerNode::default();
        for n in [7, 2, 7, 5, 2, 7] {
            let h = nodes.entry(n);
            h.replicas += 1;
            h.healthy_gpus += 2;
        }
        let listed: Vec<(usize, u32, u32)> = nodes
            .iter()
            .map(|(&n, h)| (n, h.replicas, h.healthy_gpus))
            .collect();
        assert_eq!(listed, [(2, 2, 4), (5, 1, 2), (7, 3, 6)]);
        assert_eq!(nodes.get(&5).map(|h| h.replicas), Some(1));
        assert!(nodes.get(&6).is_none());
        assert_eq!(nodes.keys().copied().collect::<Vec<_>>(), [2, 5, 7]);
        assert_eq!(nodes.values().map(|h| h.replicas).sum::<u32>(), 6);
    }
}
