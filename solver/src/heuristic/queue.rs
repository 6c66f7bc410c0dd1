//! The queue's order: priority, guaranteed before borrowing, fair share down the tenant tree
//! ([`Ledger::fair_share_path`]), submission, name.

use super::*;
use tessera_compiler::WorkloadKey;

/// `a ≤ b` up to rounding: shares are ratios of integers divided by weights, and an exact tie
/// (an even split) must count as a tie.
pub(super) fn at_most(a: f64, b: f64) -> bool {
    a <= b + 1e-9 * b.abs().max(1.0)
}

/// Sort key of a pending workload under `ledger`: priority desc, guaranteed first, fair share
/// down the tenant tree (see [`Ledger::fair_share_path`]), time, name.
pub(crate) fn queue_key<'p>(p: &'p Problem, ledger: &Ledger, w: usize) -> FullKey<'p> {
    let tenant = p.workloads[w].tenant;
    queue_key_from(
        p,
        w,
        |pool| ledger.usage(tenant, pool).gpus,
        |pool| {
            ledger
                .fair_share_path(p, tenant, pool, |t| ledger.usage(t, pool))
                .into()
        },
    )
}

/// A queue key with the workload's name, the last tie-break.
pub(crate) type FullKey<'p> = (i64, bool, SharePath, i64, &'p WorkloadKey);

/// The keys of `queue` under `ledger`, each tenant's share path computed once per pool: what
/// the queue's pick (`pick.rs`) is checked against, in debug builds and tests.
#[cfg(any(test, debug_assertions))]
pub(crate) fn queue_keys<'p>(p: &'p Problem, ledger: &Ledger, queue: &[usize]) -> Vec<FullKey<'p>> {
    let mut paths: HashMap<(usize, usize), SharePath> = HashMap::new();
    queue
        .iter()
        .map(|&w| {
            let tenant = p.workloads[w].tenant;
            queue_key_from(
                p,
                w,
                |pool| ledger.usage(tenant, pool).gpus,
                |pool| {
                    paths
                        .entry((tenant, pool))
                        .or_insert_with(|| {
                            ledger
                                .fair_share_path(p, tenant, pool, |t| ledger.usage(t, pool))
                                .into()
                        })
                        .clone()
                },
            )
        })
        .collect()
}

/// [`queue_key`] from the GPUs the workload's tenant uses in each of its pools (`own_gpus`)
/// and the tenant's share path in each (`path`).
pub(crate) fn queue_key_from<'p>(
    p: &'p Problem,
    w: usize,
    own_gpus: impl Fn(usize) -> Gpus,
    path: impl FnMut(usize) -> SharePath,
) -> FullKey<'p> {
    let wl = &p.workloads[w];
    let (borrows, share) = class_key(p, wl.tenant, &wl.pools, gang_gpus(p, w), own_gpus, path);
    let submitted = match wl.phase {
        Phase::Pending { submitted_at } => submitted_at,
        Phase::Running { .. } => 0,
    };
    (priority_key(p, w), borrows, share, submitted, &wl.key)
}

/// The first part of a queue key: priority, descending.
pub(crate) fn priority_key(p: &Problem, w: usize) -> i64 {
    -p.classes[p.workloads[w].class].priority
}

/// The GPUs of the smallest gang `w` may start with: what the guarantee split weighs.
pub(crate) fn gang_gpus(p: &Problem, w: usize) -> Gpus {
    let wl = &p.workloads[w];
    wl.demand.gpus() * i64::from(wl.min_member)
}

/// The part of a queue key that the ledger moves: whether a gang of `amount` GPUs of `tenant`
/// would borrow in every one of `pools` (from the tenant's own usage in each, `own_gpus`), and
/// the tenant's share path in the pool where it stands best (`path` of each pool). The same for
/// every waiting workload of one tenant with the same pools and gang size.
pub(crate) fn class_key(
    p: &Problem,
    tenant: usize,
    pools: &[usize],
    amount: Gpus,
    own_gpus: impl Fn(usize) -> Gpus,
    mut path: impl FnMut(usize) -> SharePath,
) -> (bool, SharePath) {
    let guaranteed = pools
        .iter()
        .any(|&pool| Ledger::split_with(p, tenant, pool, amount, own_gpus(pool)).1 == Gpus::ZERO);
    // The pool where the workload's tenant stands best.
    let share = pools
        .iter()
        .map(|&pool| path(pool))
        .min()
        .unwrap_or_else(|| Rc::from([]));
    (!guaranteed, share)
}
