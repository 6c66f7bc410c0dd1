//! The candidates a preemption search found protected, counted and listed by name for the
//! waiting workload's reason.

use super::*;

/// Why a candidate victim is protected, before its name is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Blocked {
    NonPreemptible,
    MinRuntime(u64),
    WithinGuarantee,
    NotLowerPriority,
    /// Borrowed work of the requester's priority whose side would hold less than the
    /// requester's after the swap.
    FairShare,
}

/// The protected candidates of one preemption search: all counted, the first
/// [`crate::decision::PROTECTED_LISTED`] by key kept (a borrower refused on a large fleet
/// has thousands, and a queue has thousands of borrowers).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Blocking {
    /// By (tenant, name). A snapshot's running workloads are numbered in that order, but a
    /// session's carried-out admissions run under the numbers they arrived with.
    pub(super) first: Vec<(usize, Blocked)>,
    pub(super) total: usize,
    /// Each tenant's rank by name ([`Solver::tenant_ranks`]): candidates are ordered by
    /// (rank, name), which is their key's order without comparing tenant names.
    pub(super) ranks: Rc<[u32]>,
}

impl Blocking {
    pub(super) fn new(ranks: Rc<[u32]>) -> Blocking {
        Blocking {
            first: Vec::new(),
            total: 0,
            ranks,
        }
    }

    /// Counts candidate `v`, and lists it while fewer than the listed number are. Candidates
    /// come in key order (a pool's running workloads are kept by tenant and name, see
    /// `Solver::running_by_pool`), so the first ones pushed are the first by key; a scan of
    /// tens of thousands of protected candidates compares no names.
    pub(super) fn push(&mut self, p: &Problem, v: usize, why: Blocked) {
        self.total += 1;
        let ranks = &self.ranks;
        let key = |u: usize| {
            let wl = &p.workloads[u];
            debug_assert_eq!(wl.key.tenant, p.tenants[wl.tenant].name);
            (ranks[wl.tenant], wl.key.name.as_str())
        };
        debug_assert!(
            self.first
                .last()
                .is_none_or(|&(last, _)| key(last) < key(v)),
            "protected candidates pushed out of key order"
        );
        if self.first.len() < crate::decision::PROTECTED_LISTED {
            self.first.push((v, why));
        }
    }
}

impl Blocking {
    /// These candidates and `more` (in key order; `count` of them in all, the first listed
    /// ones given) counted and listed together.
    pub(super) fn with(
        &self,
        p: &Problem,
        more: impl Iterator<Item = (usize, Blocked)>,
        count: usize,
    ) -> Blocking {
        let key = |u: usize| {
            let wl = &p.workloads[u];
            (self.ranks[wl.tenant], wl.key.name.as_str())
        };
        let mut first = Vec::with_capacity(crate::decision::PROTECTED_LISTED);
        let mut mine = self.first.iter().copied().peekable();
        let mut more = more.peekable();
        while first.len() < crate::decision::PROTECTED_LISTED {
            let next = match (mine.peek(), more.peek()) {
                (Some(a), Some(b)) if key(b.0) < key(a.0) => more.next(),
                (Some(_), _) => mine.next(),
                (None, _) => more.next(),
            };
            let Some(next) = next else { break };
            first.push(next);
        }
        Blocking {
            first,
            total: self.total + count,
            ranks: Rc::clone(&self.ranks),
        }
    }
}

/// The protected lists a decision has written, by the candidates they list: the waiting
/// workloads refused behind the same protected work list the same names, and writing each
/// one's keys again was 2.5 % of a simulated day on the acme fleet.
pub(super) type Listed =
    HashMap<Vec<(usize, Blocked)>, Arc<[Protected]>, foldhash::fast::FixedState>;

impl Solver<'_> {
    /// The protected candidates a reason lists, by key (`tenant/name`), and how many there
    /// were in all. Keys are shown for the listed ones only.
    pub(super) fn listed(&mut self, blocked: Blocking) -> (Arc<[Protected]>, usize) {
        let p = self.p;
        let Blocking { first, total, .. } = blocked;
        debug_assert!(
            first
                .windows(2)
                .all(|x| p.workloads[x[0].0].key < p.workloads[x[1].0].key)
        );
        let list = self.listed.entry(first).or_insert_with_key(|first| {
            first
                .iter()
                .map(|&(v, why)| {
                    let workload = p.workloads[v].key.to_string();
                    match why {
                        Blocked::NonPreemptible => Protected::NonPreemptible { workload },
                        Blocked::MinRuntime(remaining_seconds) => Protected::MinRuntime {
                            workload,
                            remaining_seconds,
                        },
                        Blocked::WithinGuarantee => Protected::WithinGuarantee { workload },
                        Blocked::NotLowerPriority => Protected::NotLowerPriority { workload },
                        Blocked::FairShare => Protected::FairShare { workload },
                    }
                })
                .collect()
        });
        (Arc::clone(list), total)
    }
}
