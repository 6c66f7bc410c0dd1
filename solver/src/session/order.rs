//! The order in which a session decides a batch of arrivals: the order the full cycle would
//! pick them in.
//!
//! A session decides an arrival at the place the full cycle would pick it. One the cycle would
//! pick before another arrival already admitted from the same batch cannot be decided
//! ([`FullCycle::Reorders`](super::FullCycle::Reorders)): the fleet it would have seen is gone.
//! Decided in submission order, a batch from many tenants stops at the first arrival whose
//! tenant uses less than the tenant of one admitted before it, which under fair share is
//! most of them. Decided in pick order, an arrival comes after every admission of its batch
//! with a smaller key. One case remains: the session places an admission after the picks of
//! its own component only, so an arrival whose pools join two components can still find a
//! waiting pick of one placed before an admission of the other, and be answered `Reorders`
//! (rare: none in the hundred fixed seeds of `solver/tests/incremental.rs`, where submission
//! order stopped 32 batches).
//!
//! Keys only grow while work is admitted: an admission adds usage to its tenant and to its
//! ancestors, which raises their shares and may use up a guarantee (a borrower is ordered
//! after work within its guarantee), and lowers nobody's. A key taken earlier is therefore a
//! lower bound of the same arrival's key now, and a lazy heap gives the least key of all
//! without keying the whole batch again after each admission: the least stored key is taken
//! again, and it is the least of all when it is still no larger than the next stored one;
//! otherwise it goes back with its new key. Were that premise ever false, the session would
//! answer `Reorders` for the arrival handed out too late, never decide it wrongly: the order
//! only decides how much of a batch one pass gets through.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use tessera_compiler::WorkloadKey;
use tessera_compiler::model::PendingWorkload;

use super::Session;
use crate::heuristic::Key;

/// Where the full cycle would pick a workload: its queue key, then its workload key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PickKey {
    key: Key,
    name: WorkloadKey,
}

impl PickKey {
    pub(crate) fn new(key: Key, name: WorkloadKey) -> PickKey {
        PickKey { key, name }
    }
}

/// A batch of arrivals handed out one at a time in pick order (see the module
/// documentation). It holds indices into the batch the caller keeps; every call takes the
/// same batch.
#[derive(Debug)]
pub struct ArrivalOrder {
    /// Arrivals whose place changes nothing ([`Session::pick_key`] is `None`), handed out
    /// first, in the batch's order.
    unkeyed: VecDeque<usize>,
    heap: BinaryHeap<Reverse<(PickKey, usize)>>,
}

impl ArrivalOrder {
    /// Keys `arrivals` against `session` as it stands.
    pub fn new(session: &mut Session, arrivals: &[PendingWorkload]) -> ArrivalOrder {
        let mut order = ArrivalOrder {
            unkeyed: VecDeque::new(),
            heap: BinaryHeap::with_capacity(arrivals.len()),
        };
        for (i, arrival) in arrivals.iter().enumerate() {
            match session.pick_key(arrival) {
                Some(key) => order.heap.push(Reverse((key, i))),
                None => order.unkeyed.push_back(i),
            }
        }
        order
    }

    /// The next arrival to decide: the one the full cycle would pick first, against
    /// `session` as the arrivals handed out before left it. `None` once every arrival was
    /// handed out.
    pub fn next(&mut self, session: &mut Session, arrivals: &[PendingWorkload]) -> Option<usize> {
        if let Some(i) = self.unkeyed.pop_front() {
            return Some(i);
        }
        loop {
            let Reverse((_, i)) = self.heap.pop()?;
            let Some(now) = session.pick_key(&arrivals[i]) else {
                return Some(i);
            };
            match self.heap.peek() {
                Some(Reverse((next, _))) if *next < now => self.heap.push(Reverse((now, i))),
                _ => return Some(i),
            }
        }
    }

    /// Arrivals not handed out yet.
    pub fn len(&self) -> usize {
        self.unkeyed.len() + self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
