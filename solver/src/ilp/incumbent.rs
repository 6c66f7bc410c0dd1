//! The incumbent decision read back into the problem's indices: where each workload sits, per
//! node, and what it holds there.

use std::collections::{BTreeMap, HashMap};

use tessera_compiler::units::Gpus;

use crate::decision::{Decision, Outcome, ReplicaBinding};
use crate::heuristic::Admission;
use crate::problem::{Phase, Problem};

/// One workload's place in a pool: replicas and healthy GPUs held, per node.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub pool: usize,
    pub nodes: BTreeMap<usize, Held>,
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
    let node_index: BTreeMap<&str, usize> = p
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    // Hashed, and each workload's state read on the machine's cores (`split`): at 50,000
    // GPUs a tree of 70,000 string pairs cost a tenth of a refinement.
    let by_key: HashMap<(&str, &str), &Outcome, foldhash::fast::FixedState> = d
        .workloads
        .iter()
        .map(|w| ((w.tenant.as_str(), w.name.as_str()), &w.outcome))
        .collect();
    crate::split::map(&p.workloads, |wl| match by_key.get(&wl.key.as_pair()) {
        Some(Outcome::Keep { .. }) => {
            let Phase::Running { slots, .. } = &wl.phase else {
                return State::Pending;
            };
            let mut pl = Placement {
                pool: wl.pools[0],
                nodes: BTreeMap::new(),
            };
            for s in slots {
                let h = pl.nodes.entry(s.node).or_default();
                h.replicas += 1;
                h.healthy_gpus += s.gpus.iter().filter(|&&g| p.gpus[g].healthy).count() as u32;
            }
            State::Kept(pl)
        }
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

fn admitted(
    p: &Problem,
    node_index: &BTreeMap<&str, usize>,
    bindings: &[ReplicaBinding],
) -> Option<Placement> {
    let first = node_index.get(bindings.first()?.node.as_str())?;
    let mut pl = Placement {
        pool: p.nodes[*first].pool?,
        nodes: BTreeMap::new(),
    };
    for b in bindings {
        let n = *node_index.get(b.node.as_str())?;
        let h = pl.nodes.entry(n).or_default();
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
