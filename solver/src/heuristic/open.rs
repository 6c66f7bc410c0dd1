//! Which nodes have anything free at all, one bit per node, kept by the fleet as each node's
//! free room changes (`Fleet::set_free`). A replica's search for a place and the preemption
//! search's bound read only the nodes of their pool whose bit is set: in a busy pool most
//! nodes are full, and telling them apart by their kept free room read a record per node of
//! the pool for every replica (the pool's size times the queue's length, the part of a cycle
//! that grew fastest with the fleet).
//!
//! A pool's bits lie in words of their own, in the pool's node order, so that its open nodes
//! are found a word (64 nodes) at a time.

use super::*;

/// The bits, and where each node's lies; cloned with the fleet (copy-on-write, as its other
/// per-node state).
#[derive(Debug, Clone)]
pub(super) struct OpenNodes {
    /// Per node, its bit's index: its pool's first word × 64 plus its position in the pool's
    /// node list; `None` for a node without a pool. Shared by every clone.
    bit: Rc<[Option<u32>]>,
    /// Per pool, its first word; the last entry is one past the last pool's words. Shared.
    first_word: Rc<[usize]>,
    words: CowVec<u64>,
}

impl OpenNodes {
    /// Every node closed (as a node's default free room is).
    pub(super) fn new(p: &Problem) -> OpenNodes {
        let mut bit = vec![None; p.nodes.len()];
        let mut first_word = Vec::with_capacity(p.pools.len() + 1);
        let mut word = 0usize;
        for info in &p.pools {
            first_word.push(word);
            for (i, &n) in info.nodes.iter().enumerate() {
                bit[n] = u32::try_from(word * 64 + i).ok();
            }
            word += info.nodes.len().div_ceil(64);
        }
        first_word.push(word);
        OpenNodes {
            bit: bit.into(),
            first_word: first_word.into(),
            words: vec![0u64; word].into(),
        }
    }

    /// Marks node `n` open or closed.
    pub(super) fn set(&mut self, n: usize, open: bool) {
        let Some(b) = self.bit[n] else { return };
        let (word, mask) = (b as usize / 64, 1u64 << (b % 64));
        let was = self.words[word] & mask != 0;
        if was != open {
            self.words[word] ^= mask;
        }
    }

    /// Whether node `n` is open; `true` for a node without a pool (it is never left out).
    pub(super) fn is_open(&self, n: usize) -> bool {
        self.bit[n].is_none_or(|b| self.words[b as usize / 64] & (1u64 << (b % 64)) != 0)
    }

    /// The open nodes among `nodes` of `pool`, in `nodes`' order: a word at a time when `nodes`
    /// is the pool's own list, else a bit per node.
    pub(super) fn among(&self, p: &Problem, pool: usize, nodes: &[usize]) -> Vec<usize> {
        let all = p.pools[pool].nodes.as_slice();
        if !std::ptr::eq(nodes, all) {
            return nodes.iter().copied().filter(|&n| self.is_open(n)).collect();
        }
        let mut open = Vec::new();
        for (k, word) in (self.first_word[pool]..self.first_word[pool + 1]).enumerate() {
            let mut bits = self.words[word];
            while bits != 0 {
                open.push(all[k * 64 + bits.trailing_zeros() as usize]);
                bits &= bits - 1;
            }
        }
        open
    }
}

/// Whether `demand` can only be placed on an open node: a node with nothing free takes no
/// whole GPU, no share and no indexed MIG instance (see `Fleet::may_host`). A demand of
/// nothing, or of a profile the offers index does not know, may go anywhere.
pub(super) fn needs_open(demand: Demand) -> bool {
    match demand {
        Demand::Whole { count } => count > 0,
        Demand::Mig { profile_id } => profile_bit(profile_id).is_some(),
        Demand::Share { fraction } => fraction.units() > 0,
    }
}
