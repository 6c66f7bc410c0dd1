//! Metering and chargeback: what each workload held, for how long and on what terms, recorded
//! as it happens by the reconcile loop ([`meter_placed`], [`record_applied`],
//! [`reserved_spells`]) into the store (`store/usage.rs`), and reported per tenant with costs
//! ([`report`], [`rates`]).
//!
//! When usage is counted: the loop meters every placed run up to `now` at the start of each
//! cycle, before it reaps exits, and once more after it applied the cycle's actions (which
//! creates the rows of runs it just started). Every end of a run (an exit reaped, a preemption,
//! a cancel, a `maxDuration` stop) is recorded at a cycle's `now`, after that cycle's metering,
//! so a run is counted up to the cycle that saw it end: usage is exact to the cycle period.
//! Across a restart, recovery meters the runs the store still holds up to its own `now` before
//! it closes anything: the GPUs stayed claimed while the service was down.

pub mod rates;
pub mod report;
pub mod runs;

use std::collections::{BTreeMap, BTreeSet};

use tessera_compiler::WorkloadKey;
use tessera_compiler::model::Node;
use tessera_compiler::units::Gpus;
use tessera_solver::{Decision, Outcome};
use tracing::warn;

use crate::actions::Action;
use crate::store::usage::{NewRun, ReservedSpell, RunKey};
use crate::store::{StateStore, StoreError, WorkloadRecord};

/// Meters the placed runs among `records` up to `now`. Runs seen for the first time are
/// described from the observed nodes, which `observe` is asked for only then. A run that cannot
/// be described is logged and left for the next call (its interval is counted from its start
/// whenever it is described).
pub fn meter_placed<E: std::fmt::Display>(
    store: &dyn StateStore,
    records: &[WorkloadRecord],
    observe: impl FnOnce() -> Result<Vec<Node>, E>,
    now: i64,
) -> Result<(), StoreError> {
    let placed: BTreeMap<RunKey, &WorkloadRecord> = records
        .iter()
        .filter_map(|r| runs::run_key(r).map(|k| (k, r)))
        .collect();
    let keys: Vec<RunKey> = placed.keys().cloned().collect();
    let missing = store.unmetered_runs(&keys)?;
    meter(store, keys, missing, &placed, observe, now)
}

/// Meters every placed run in the store up to `now`, as [`meter_placed`] does with the live
/// workloads, but reads those workloads whole only when some run is new (it must be
/// described): a steady cycle reads four columns of each placed workload instead.
pub fn meter_store<E: std::fmt::Display>(
    store: &dyn StateStore,
    observe: impl FnOnce() -> Result<Vec<Node>, E>,
    now: i64,
) -> Result<(), StoreError> {
    let keys = store.placed_runs()?;
    let missing = store.unmetered_runs(&keys)?;
    let records = if missing.is_empty() {
        Vec::new()
    } else {
        store.live()?
    };
    let placed: BTreeMap<RunKey, &WorkloadRecord> = records
        .iter()
        .filter_map(|r| runs::run_key(r).map(|k| (k, r)))
        .collect();
    meter(store, keys, missing, &placed, observe, now)
}

/// Extends the runs of `keys` not `missing`, and creates those of `missing` that `placed`
/// describes.
fn meter<E: std::fmt::Display>(
    store: &dyn StateStore,
    keys: Vec<RunKey>,
    missing: Vec<RunKey>,
    placed: &BTreeMap<RunKey, &WorkloadRecord>,
    observe: impl FnOnce() -> Result<Vec<Node>, E>,
    now: i64,
) -> Result<(), StoreError> {
    let mut create: Vec<NewRun> = Vec::new();
    if !missing.is_empty() {
        match observe() {
            Ok(nodes) => {
                let by_name: BTreeMap<&str, &Node> =
                    nodes.iter().map(|n| (n.name.as_str(), n)).collect();
                for key in &missing {
                    let Some(record) = placed.get(key) else {
                        continue;
                    };
                    match runs::describe(record, key.clone(), &by_name) {
                        Ok(run) => create.push(run),
                        Err(e) => warn!("metering: {e}; retried next cycle"),
                    }
                }
            }
            Err(e) => warn!("metering: cannot observe the nodes to describe new runs: {e}"),
        }
    }
    let missing: BTreeSet<RunKey> = missing.into_iter().collect();
    let extend: Vec<RunKey> = keys.into_iter().filter(|k| !missing.contains(k)).collect();
    store.meter_runs(&extend, &create, now)
}

/// Records what the applied `actions` of `decision` mean for metering: the guaranteed and
/// borrowed split of each admission that started, and the work lost by each preemption that
/// began (a checkpoint signal or a stop of a workload the decision preempts). `records` are the
/// live workloads as they were before the actions.
pub fn record_applied(
    store: &dyn StateStore,
    decision: &Decision,
    actions: &[&Action],
    records: &[WorkloadRecord],
    now: i64,
) -> Result<(), StoreError> {
    // Looked up once per action: a cycle may act on thousands of workloads.
    let decided: BTreeMap<(&str, &str), _> = decision
        .workloads
        .iter()
        .map(|w| ((w.tenant.as_str(), w.name.as_str()), w))
        .collect();
    let live: BTreeMap<(&str, &str), &WorkloadRecord> = records
        .iter()
        .map(|r| ((r.tenant.as_str(), r.name.as_str()), r))
        .collect();
    for action in actions {
        let (name, starts) = match action {
            Action::Start { workload, .. } => (workload, true),
            Action::Checkpoint { workload, .. } | Action::Stop { workload, .. } => {
                (workload, false)
            }
            _ => continue,
        };
        // Actions name workloads by key (`tenant/name`).
        let Some(key) = WorkloadKey::parse(name) else {
            continue;
        };
        let (Some(wd), Some(record)) = (decided.get(&key.as_pair()), live.get(&key.as_pair()))
        else {
            continue;
        };
        match (&wd.outcome, starts) {
            (
                Outcome::Admit {
                    guaranteed,
                    borrowed,
                    ..
                },
                true,
            ) => store.record_admission(
                &record.tenant,
                &record.name,
                record.submitted_at,
                *guaranteed,
                *borrowed,
            )?,
            (
                Outcome::Preempt {
                    lost_gpu_seconds, ..
                },
                false,
            ) => {
                if let Some(key) = runs::run_key(record) {
                    let lost = lost_units(*lost_gpu_seconds);
                    let pool = wd.pool.clone().unwrap_or_default();
                    store.record_preemption(&key, &pool, lost, now)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The solver reports lost work in GPU-seconds as a float; metering keeps exact units, rounded
/// once here (a negative or non-finite figure is no loss).
fn lost_units(gpu_seconds: f64) -> i64 {
    let units = gpu_seconds * Gpus::UNITS_PER_GPU as f64;
    if units.is_finite() && units > 0.0 {
        units.round().min(i64::MAX as f64) as i64
    } else {
        0
    }
}

/// The free GPUs `decision` holds idle for waiting gangs, charged to each gang's tenant until
/// the next decision.
pub fn reserved_spells(decision: &Decision) -> Vec<ReservedSpell> {
    decision
        .reservations
        .iter()
        .filter(|r| r.held_idle > 0)
        .filter_map(|r| {
            // A reservation names its gang by key (`tenant/name`).
            let key = WorkloadKey::parse(&r.workload)?;
            decision
                .workloads
                .iter()
                .any(|w| w.tenant == key.tenant && w.name == key.name)
                .then(|| ReservedSpell {
                    tenant: key.tenant,
                    workload: key.name,
                    pool: r.pool.clone(),
                    gpus: r.held_idle,
                })
        })
        .collect()
}
