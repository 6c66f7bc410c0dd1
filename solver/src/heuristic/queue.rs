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

/// The keys of `queue` under `ledger`, each tenant's share path computed once per pool (a
/// queue has many workloads per tenant, and is keyed again after every admission).
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
    mut path: impl FnMut(usize) -> SharePath,
) -> FullKey<'p> {
    let wl = &p.workloads[w];
    let amount = wl.demand.gpus() * i64::from(wl.min_member);
    let guaranteed = wl.pools.iter().any(|&pool| {
        Ledger::split_with(p, wl.tenant, pool, amount, own_gpus(pool)).1 == Gpus::ZERO
    });
    // The pool where the workload's tenant stands best.
    let share = wl
        .pools
        .iter()
        .map(|&pool| path(pool))
        .min()
        .unwrap_or_else(|| Rc::from([]));
    let submitted = match wl.phase {
        Phase::Pending { submitted_at } => submitted_at,
        Phase::Running { .. } => 0,
    };
    (
        -p.classes[wl.class].priority,
        !guaranteed,
        share,
        submitted,
        &wl.key,
    )
}
