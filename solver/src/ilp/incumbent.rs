//! The incumbent decision read back into the problem's indices: where each workload sits, per
//! node, and what it holds there.

use std::collections::HashMap;

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
    // Hashed, and each workload's state read on the machine's cores (`split`): at 50,000
    // GPUs a tree of 70,000 string pairs cost a tenth of a refinement.
    let by_key: HashMap<(&str, &str), &Outcome, foldhash::fast::FixedState> = d
        .workloads
        .iter()
        .map(|w| ((w.tenant.as_str(), w.name.as_str()), &w.outcome))
        .collect();
    crate::split::map(&p.workloads, |wl| match by_key.get(&wl.key.as_pair()) {
        Some(Outcome::Keep { .. }) => match Placement::running(p, wl) {
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
        _ => State::Pending,
    })
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
