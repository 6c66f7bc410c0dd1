//! The arrival path: the workloads submitted since the standing decision (`standing.rs`),
//! decided by its session and started, at a cost that follows the arrivals rather than the
//! fleet. A full cycle reads every live record, builds the snapshot, plans over every workload
//! and republishes `/state` whole; at 5,000 running workloads that is seconds, during which
//! hundreds of submissions pile up. A pass of this path reads the store's events since the
//! last pass, the arrivals' own records and one observation of the nodes, and writes two
//! commits for all its starts (`store/starts.rs`).
//!
//! It decides only when the full cycle would decide the same: when nothing but submissions
//! changed since the standing decision. That is checked without rebuilding the snapshot:
//!
//! - the store: every change to a workload appends an event in its own transaction, so the
//!   events since the standing decision must all be submissions, or the `starting` and
//!   `running` of workloads the service started itself (an exit, a cancellation, a requeue,
//!   a checkpoint, a revision: a full cycle);
//! - the nodes: the node side's generation ([`NodeSide::generation`]) compared with the one
//!   read before the standing decision's last observation, which then still holds and is
//!   what the pass starts from; where the node side has none (real NVML, fleet mode), the
//!   nodes observed once per pass and compared with that observation's;
//! - what only a full cycle does: a new revision, the period passed, a process that ended, a
//!   committed workload's restart or a run's `maxDuration` due, reconciliation suspended.
//!
//! Each arrival then goes to the session; one it cannot decide alone (it would reorder work
//! already admitted, it needs a geometry change or a preemption, it changes another
//! workload's admission) sends the pass to a full cycle with nothing applied. The arrivals of
//! a pass go to the session in the order the full cycle would pick them (the solver's
//! `ArrivalOrder`), so that none is ordered before an admission of its own pass; one that
//! still is (the order is the session's to check, not assumed) is left to the next pass (run
//! at once), as `standing.rs` describes.
//!
//! What the pass decided is published without rebuilding: each arrival's entry in the API's
//! decision index, its start in the `/state` snapshot. The decision-wide figures (pool reports,
//! utilization gauges, queue positions) are the full cycle's and wait for the next one.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{Binding, ClusterStateSpec, PendingWorkload, RunningWorkload};
use tessera_compiler::units::Gpus;
use tessera_solver::decision::{Outcome, ReplicaBinding, WorkloadDecision};
use tessera_solver::session::{Admission, FullCycle};
use tracing::{info, warn};

use super::{CycleReport, Decided as HowDecided, Reconciler, log_outcome};
use crate::actions::{Action, ActionPlan};
use crate::driver::Observation;
use crate::service::nodes::{LaunchContext, Launched, Launching, NodeSide};
use crate::service::standing::Stale;
use crate::snapshot;
use crate::store::starts::{StartDone, StartIntent};
use crate::store::{Ended, Phase, ReplicaProcess, StateStoreExt, WorkloadRecord};

/// Most events one pass reads; a pass that reads this many runs again at once.
const EVENTS_PER_PASS: u32 = 2_000;

/// Most arrivals one pass decides; the rest are the next pass's, at once. Within a pass each
/// admission adds a pick that every later arrival is placed against, so a pass costs up to
/// the square of its arrivals; between passes the session moves on and starts afresh.
const ARRIVALS_PER_PASS: usize = 256;

/// What the arrival path compares with, set by the full cycle that keeps a standing decision.
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// The last event the standing decision (or a pass since) accounts for.
    seen: i64,
    /// Workloads the service started since the standing snapshot was read: their `starting`
    /// and `running` events are its own.
    own: BTreeSet<WorkloadKey>,
    /// The nodes as the last full cycle left them.
    observed: Arc<Observation>,
    /// The node side's generation read before `observed` was taken.
    generation: Option<u64>,
    /// When the first placed run reaches its `maxDuration`.
    pub(super) next_overdue: Option<i64>,
}

impl Watch {
    /// `generation`: the node side's, read before `observed` was.
    pub(super) fn after_cycle(
        seen: i64,
        own: BTreeSet<WorkloadKey>,
        observed: Observation,
        generation: Option<u64>,
        next_overdue: Option<i64>,
    ) -> Watch {
        Watch {
            seen,
            own,
            observed: Arc::new(observed),
            generation,
            next_overdue,
        }
    }

    /// The nodes as they are now, if nothing in their geometry or health changed since the
    /// last full cycle (`Err` if something did): the generation compared where the node side
    /// keeps one, else one observation compared. An observation whose other parts changed
    /// (processes, utilization) is the one returned, so that what the pass starts from is
    /// never older than the check.
    fn unchanged_nodes(&self, nodes: &mut dyn NodeSide) -> Result<Arc<Observation>, Stale> {
        if let (Some(then), Some(now)) = (self.generation, nodes.generation()) {
            return if then == now {
                Ok(self.observed.clone())
            } else {
                Err(Stale::Changed("nodes"))
            };
        }
        let observation = nodes
            .observe()
            .map_err(|e| Stale::Apply(format!("observing the nodes: {e}")))?;
        if observation.nodes != self.observed.nodes {
            return Err(Stale::Changed("nodes"));
        }
        Ok(Arc::new(observation))
    }
}

/// What one pass of the arrival path did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Arrivals {
    /// Submissions decided.
    pub decided: usize,
    /// Of them, admitted and started.
    pub started: usize,
    /// Submissions are left for another pass, which should run at once.
    pub more: bool,
}

/// An admission of the pass, to be started.
struct Start {
    /// Index into the pass's records.
    record: usize,
    bindings: Vec<ReplicaBinding>,
    guaranteed: Gpus,
    borrowed: Gpus,
}

/// The events a pass read.
struct Read {
    /// The submissions to decide, with their events' ids, in order.
    arrivals: Vec<(i64, WorkloadKey)>,
    /// The last event read.
    last: i64,
    /// More events remain.
    more: bool,
}

/// What a pass decided, before it is applied.
struct Decided {
    starts: Vec<Start>,
    /// Arrivals left waiting.
    waiting: Vec<PendingWorkload>,
    /// Every decision the pass made or changed, for the API.
    decisions: Vec<WorkloadDecision>,
    /// The last event the decided arrivals account for.
    seen: i64,
    more: bool,
}

impl Reconciler {
    /// One pass of the arrival path at `now` (see the module documentation). `None`: a full
    /// cycle must decide instead, now; why is kept for its report.
    pub fn arrivals(&mut self, now: i64) -> Option<Arrivals> {
        let began = Instant::now();
        match self.arrivals_inner(now) {
            Ok(Some((done, started))) => {
                if done.decided > 0 {
                    // A pass that decided is a cycle to the status and the metrics: what it
                    // started, no waits (a pass leaves none).
                    let report = CycleReport {
                        cycle: self.cycle,
                        revision: self.tracker.applied().map(|a| a.commit.clone()),
                        plan: ActionPlan {
                            actions: started,
                            waits: Vec::new(),
                        },
                        decided: HowDecided::Session {
                            arrivals: done.decided,
                        },
                        ..CycleReport::default()
                    };
                    self.publish(now, &report, began.elapsed().as_secs_f64());
                    log_outcome(&report);
                }
                Some(done)
            }
            Ok(None) => None,
            Err(why) => {
                info!("arrival path: a full cycle decides ({why})");
                self.standing = None;
                self.dropped = Some(why);
                None
            }
        }
    }

    /// The pass, with the starts it applied.
    fn arrivals_inner(&mut self, now: i64) -> Result<Option<(Arrivals, Vec<Action>)>, Stale> {
        let Some(standing) = self.standing.as_ref() else {
            return Ok(None);
        };
        if !self.config.incremental {
            return Ok(None);
        }
        if self.shared.suspended.load(Ordering::SeqCst) {
            return Err(Stale::Suspended);
        }
        if self.tracker.applied().map(|a| a.commit.as_str()) != Some(standing.revision()) {
            return Err(Stale::Revision);
        }
        let period = i64::try_from(self.config.cycle_period.as_secs()).unwrap_or(i64::MAX);
        if standing.expired(now, period) {
            return Err(Stale::Expired);
        }
        if self.has_exits() {
            return Err(Stale::Exited);
        }
        if self.restarts.values().any(|(at, ..)| *at <= now) {
            return Err(Stale::Due("a committed workload's restart"));
        }
        if self.watch.next_overdue.is_some_and(|at| at <= now) {
            return Err(Stale::Due("a run's maxDuration"));
        }

        let Read {
            arrivals,
            last,
            more,
        } = self.read_arrivals()?;
        if arrivals.is_empty() {
            self.watch.seen = last;
            return Ok(Some((
                Arrivals {
                    more,
                    ..Arrivals::default()
                },
                Vec::new(),
            )));
        }
        let observation = self.watch.unchanged_nodes(self.nodes.as_mut())?;
        let mut records = Vec::with_capacity(arrivals.len());
        for (_, key) in &arrivals {
            match self
                .store
                .get(key)
                .map_err(|e| Stale::Apply(e.to_string()))?
            {
                Some(r) if r.phase == Phase::Pending && r.cancel_requested_at.is_none() => {
                    records.push(r)
                }
                other => {
                    return Err(Stale::Event {
                        kind: other.map_or_else(|| "gone".to_owned(), |r| r.phase.to_string()),
                        workload: Some(key.to_string()),
                    });
                }
            }
        }

        let solve_started = Instant::now();
        let mut decided = self.decide_arrivals(&arrivals, &records, last, more)?;
        let count = decided.starts.len() + decided.waiting.len();
        self.shared
            .metrics
            .record_solve(solve_started.elapsed().as_secs_f64(), None);

        // The pass is a cycle of its own: its intents are journaled under its number.
        self.cycle += 1;
        let (runs, actions) = self.start_all(&records, &decided.starts, &observation, now)?;
        let started = runs.len();
        for (start, run) in decided.starts.iter().zip(&runs) {
            self.watch
                .own
                .insert(WorkloadKey::new(&run.spec.tenant, &run.name));
            if let Some(limit) = records[start.record].spec.max_duration {
                let at = now.saturating_add(i64::try_from(limit.seconds()).unwrap_or(i64::MAX));
                self.watch.next_overdue = Some(self.watch.next_overdue.map_or(at, |t| t.min(at)));
            }
        }
        self.watch.seen = decided.seen;
        if let Some(standing) = self.standing.as_mut() {
            standing.started(runs.clone());
        }
        self.shared
            .publish_arrivals(&decided.decisions, snapshot::unix(now));
        if let Some(state) = self
            .shared
            .state
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            fold(
                std::sync::Arc::make_mut(state),
                runs,
                std::mem::take(&mut decided.waiting),
                now,
            );
        }
        Ok(Some((
            Arrivals {
                decided: count,
                started,
                more: decided.more,
            },
            actions,
        )))
    }

    /// The submissions recorded since the last pass, with their events' ids, in order; the
    /// last event read; whether more remain. `Err` when anything else was recorded.
    fn read_arrivals(&self) -> Result<Read, Stale> {
        let standing = self.standing.as_ref().expect("checked by the caller");
        let events = self
            .store
            .events(self.watch.seen, EVENTS_PER_PASS)
            .map_err(|e| Stale::Apply(e.to_string()))?;
        let mut more = events.len() >= EVENTS_PER_PASS as usize;
        let mut last = self.watch.seen;
        let mut arrivals = Vec::new();
        for e in events {
            if arrivals.len() == ARRIVALS_PER_PASS {
                more = true;
                break;
            }
            last = e.id;
            let key = match (&e.tenant, &e.workload) {
                (Some(t), Some(n)) => Some(WorkloadKey::new(t, n)),
                _ => None,
            };
            match (e.kind.as_str(), key) {
                // Recorded while the full cycle read its snapshot, or decided by an earlier
                // pass that stopped before it: decided already.
                ("submitted", Some(key)) if standing.knows(&key) => {}
                ("submitted", Some(key)) => arrivals.push((e.id, key)),
                ("starting" | "running", Some(key)) if self.watch.own.contains(&key) => {}
                (_, key) => {
                    return Err(Stale::Event {
                        kind: e.kind,
                        workload: key.map(|k| k.to_string()),
                    });
                }
            }
        }
        Ok(Read {
            arrivals,
            last,
            more,
        })
    }

    /// Decides the arrivals against the standing decision, in the order the full cycle would
    /// pick them (`ArrivalOrder`). Submission order would stop most passes after a few
    /// arrivals: under fair share, an arrival whose tenant uses less than the tenant of one
    /// admitted before it is picked first by the full cycle, and the session cannot decide it
    /// after that admission.
    fn decide_arrivals(
        &mut self,
        arrivals: &[(i64, WorkloadKey)],
        records: &[WorkloadRecord],
        last: i64,
        more: bool,
    ) -> Result<Decided, Stale> {
        let standing = self.standing.as_mut().expect("checked by the caller");
        let mut out = Decided {
            starts: Vec::new(),
            waiting: Vec::new(),
            decisions: Vec::new(),
            seen: last,
            more,
        };
        let pending: Vec<PendingWorkload> = records
            .iter()
            .map(|record| PendingWorkload {
                name: record.name.clone(),
                spec: record.spec.clone(),
                submitted_at: snapshot::unix(record.submitted_at),
            })
            .collect();
        let mut order = standing.arrival_order(&pending);
        let mut admitted: BTreeSet<String> = BTreeSet::new();
        let mut decided = vec![false; pending.len()];
        while let Some(i) = standing.next_arrival(&mut order, &pending) {
            let key = &arrivals[i].1;
            match standing.decide(&pending[i]) {
                Ok(Admission::Decided {
                    decision,
                    changed,
                    geometry,
                }) => {
                    if !geometry.is_empty() {
                        return Err(Stale::Session(format!(
                            "`{key}` changes the geometry of a GPU"
                        )));
                    }
                    if let Some(w) = changed
                        .iter()
                        .find(|w| !matches!(w.outcome, Outcome::Pending { .. }))
                    {
                        return Err(Stale::Session(format!(
                            "deciding `{key}` changes what `{}/{}` does",
                            w.tenant, w.name
                        )));
                    }
                    match &decision.outcome {
                        Outcome::Admit {
                            bindings,
                            guaranteed,
                            borrowed,
                        } => {
                            out.starts.push(Start {
                                record: i,
                                bindings: bindings.clone(),
                                guaranteed: *guaranteed,
                                borrowed: *borrowed,
                            });
                            admitted.insert(key.to_string());
                        }
                        Outcome::Pending { .. } => out.waiting.push(pending[i].clone()),
                        Outcome::Keep { .. } | Outcome::Preempt { .. } => {
                            return Err(Stale::Session(format!(
                                "`{key}` was decided as if it ran"
                            )));
                        }
                    }
                    decided[i] = true;
                    out.decisions.push(*decision);
                    out.decisions.extend(changed);
                }
                // Decided by the next pass (at once), after this pass's admissions run, as a
                // full cycle on that fleet would. That pass reads the events again from the
                // first arrival left, and passes over those decided here (the session knows
                // them).
                Ok(Admission::NeedsFullCycle(FullCycle::Reorders { before }))
                    if admitted.contains(&before) =>
                {
                    let first_left = arrivals
                        .iter()
                        .zip(&decided)
                        .find(|(_, done)| !**done)
                        .map(|((event, _), _)| *event)
                        .expect("the arrival just declined is left");
                    out.seen = first_left - 1;
                    out.more = true;
                    break;
                }
                Ok(Admission::NeedsFullCycle(why)) => return Err(Stale::Session(why.to_string())),
                Err(e) => return Err(Stale::Session(e.to_string())),
            }
        }
        Ok(out)
    }

    /// Starts the pass's admissions in batches as large as one commit of the store may carry
    /// (`max_start_batch`: unbounded on SQLite, a few on etcd). The runs as a snapshot reads
    /// them. A batch that fails stops the pass; a full cycle follows and finds what the
    /// batches before it started.
    fn start_all(
        &mut self,
        records: &[WorkloadRecord],
        starts: &[Start],
        observation: &crate::driver::Observation,
        now: i64,
    ) -> Result<(Vec<RunningWorkload>, Vec<Action>), Stale> {
        let size = self.store.max_start_batch().max(1);
        let (mut runs, mut applied) = (Vec::new(), Vec::new());
        for batch in starts.chunks(size) {
            let (r, a) = self.start_batch(records, batch, observation, now)?;
            runs.extend(r);
            applied.extend(a);
        }
        Ok((runs, applied))
    }

    /// Starts one batch: every gang's devices resolved first (nothing is written when one is
    /// missing), the intents and Starting in one commit, the launches, then Running, the
    /// metering split and the outcomes in another. A launch that fails is requeued and backed
    /// off as the full cycle does, and a full cycle follows.
    fn start_batch(
        &mut self,
        records: &[WorkloadRecord],
        starts: &[Start],
        observation: &crate::driver::Observation,
        now: i64,
    ) -> Result<(Vec<RunningWorkload>, Vec<Action>), Stale> {
        if starts.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let keys: Vec<WorkloadKey> = starts.iter().map(|s| records[s.record].key()).collect();
        let actions: Vec<Action> = starts
            .iter()
            .zip(&keys)
            .map(|(s, key)| Action::Start {
                workload: key.to_string(),
                bindings: s.bindings.clone(),
            })
            .collect();
        let mut plans = Vec::with_capacity(starts.len());
        for (s, action) in starts.iter().zip(&actions) {
            let replicas = s.bindings.iter().enumerate().map(|(i, b)| (i as u32, b));
            plans.push(
                crate::node::resolve(observation, replicas)
                    .map_err(|e| Stale::Apply(format!("{action}: {e}")))?,
            );
        }
        let plain: Vec<Vec<Binding>> = starts
            .iter()
            .map(|s| s.bindings.iter().map(ReplicaBinding::binding).collect())
            .collect();
        let intents: Vec<StartIntent<'_, Action>> = keys
            .iter()
            .zip(&plain)
            .zip(&actions)
            .map(|((workload, bindings), action)| StartIntent {
                workload,
                bindings,
                action,
            })
            .collect();
        let ids = self
            .store
            .begin_starts(self.cycle, &intents, now)
            .map_err(|e| Stale::Apply(format!("recording the starts: {e}")))?;

        let launching: Vec<Launching<'_>> = plans
            .into_iter()
            .enumerate()
            .map(|(k, plans)| Launching {
                id: ids[k],
                key: &keys[k],
                record: &records[starts[k].record],
                action: &actions[k],
                plans,
            })
            .collect();
        let cx = LaunchContext {
            store: &*self.store,
            cycle: self.cycle,
            now,
            run_commands: self.config.run_commands,
        };
        let outcomes = self.nodes.launch(&launching, &cx);
        drop(launching);
        let mut launched: Vec<(usize, Vec<ReplicaProcess>)> = Vec::with_capacity(starts.len());
        let mut failed = false;
        for (k, outcome) in outcomes.into_iter().enumerate() {
            let record = &records[starts[k].record];
            match outcome {
                Launched::Started(replicas) => launched.push((k, replicas)),
                Launched::InFlight => {
                    // Recorded by the node side once it settles; a full cycle follows, which
                    // finds the workload starting.
                    failed = true;
                    info!("sent: {}; not settled yet", actions[k]);
                }
                Launched::Failed(message) => {
                    failed = true;
                    warn!("failed: {}: {message}", actions[k]);
                    let requeued =
                        self.store
                            .requeue(&keys[k], &format!("start failed: {message}"), now);
                    let closed = self.store.close(ids[k], Ended::Failed(&message), now);
                    if let Err(e) = requeued.and(closed) {
                        warn!("recording the failed start of {}: {e}", keys[k]);
                    }
                    self.back_off(&actions[k], &message, Some(record.tenant.clone()), now);
                    self.shared.metrics.record_action("start", false, false);
                }
            }
        }
        let done: Vec<StartDone<'_>> = launched
            .iter()
            .map(|(k, replicas)| StartDone {
                action: ids[*k],
                workload: &keys[*k],
                replicas,
                submitted_at: records[starts[*k].record].submitted_at,
                guaranteed: starts[*k].guaranteed,
                borrowed: starts[*k].borrowed,
            })
            .collect();
        if let Err(e) = self.store.finish_starts(&done, now) {
            let message = format!("recording the started workloads: {e}");
            // Not recorded as running: stopped, so that what runs is what the store says.
            for (k, replicas) in &launched {
                self.nodes.stop(&keys[*k], &plain[*k], replicas);
                let _ = self.store.requeue(&keys[*k], &message, now);
                let _ = self.store.close(ids[*k], Ended::Failed(&message), now);
            }
            return Err(Stale::Apply(message));
        }
        for _ in &launched {
            self.shared.metrics.record_action("start", true, false);
        }
        for (k, _) in &launched {
            info!("applied: {}", actions[*k]);
        }
        if failed {
            return Err(Stale::Unfinished);
        }
        let applied = launched.iter().map(|(k, _)| actions[*k].clone()).collect();
        let runs = launched
            .into_iter()
            .map(|(k, _)| {
                let record = &records[starts[k].record];
                RunningWorkload {
                    name: record.name.clone(),
                    spec: record.spec.running_as(plain[k].len() as u32),
                    bindings: plain[k].clone(),
                    started_at: snapshot::unix(now),
                    last_checkpoint_at: record.last_checkpoint_at.map(snapshot::unix),
                }
            })
            .collect();
        Ok((runs, applied))
    }
}

/// `state` (the published snapshot) with the pass's `runs` started and its `waiting`
/// arrivals queued, ordered as the snapshot orders them (running by name, pending by
/// submission then name). Each goes to its place in lists already in that order: a pass
/// costs what it adds, not a sort of the whole fleet under the lock the API reads through.
fn fold(
    state: &mut ClusterStateSpec,
    runs: Vec<RunningWorkload>,
    waiting: Vec<PendingWorkload>,
    now: i64,
) {
    if !runs.is_empty() {
        let started: BTreeSet<(&str, &str)> = runs
            .iter()
            .map(|r| (r.spec.tenant.as_str(), r.name.as_str()))
            .collect();
        state
            .pending
            .retain(|p| !started.contains(&(p.spec.tenant.as_str(), p.name.as_str())));
    }
    let waiting: Vec<PendingWorkload> = waiting
        .into_iter()
        .filter(|w| {
            !state
                .pending
                .iter()
                .any(|p| p.name == w.name && p.spec.tenant == w.spec.tenant)
        })
        .collect();
    merge_sorted(&mut state.pending, waiting, |a, b| {
        (a.submitted_at, &a.name).cmp(&(b.submitted_at, &b.name))
    });
    merge_sorted(&mut state.running, runs, |a, b| a.name.cmp(&b.name));
    state.observed_at = snapshot::unix(now);
}

/// `list` with `items` added, as a stable sort of `list` followed by `items` orders them: one
/// merge of the two in order, rather than a sort of the whole list (a list not in order is
/// sorted first).
fn merge_sorted<T>(
    list: &mut Vec<T>,
    mut items: Vec<T>,
    order: impl Fn(&T, &T) -> std::cmp::Ordering,
) {
    if !list.is_sorted_by(|a, b| order(a, b).is_le()) {
        list.sort_by(&order);
    }
    if items.is_empty() {
        return;
    }
    items.sort_by(&order);
    let mut merged = Vec::with_capacity(list.len() + items.len());
    let mut old = std::mem::take(list).into_iter().peekable();
    for item in items {
        while let Some(x) = old.next_if(|x| order(x, &item).is_le()) {
            merged.push(x);
        }
        merged.push(item);
    }
    merged.extend(old);
    *list = merged;
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::merge_sorted;

    proptest! {
        /// The merge orders as a stable sort of the list followed by the new items does, ties
        /// included (the key is the first field; the second tells equal keys apart).
        #[test]
        fn merging_is_a_stable_sort_of_the_whole(
            mut list in proptest::collection::vec((0..20u8, any::<u16>()), 0..40),
            items in proptest::collection::vec((0..20u8, any::<u16>()), 0..20),
            sorted in any::<bool>(),
        ) {
            let order = |a: &(u8, u16), b: &(u8, u16)| a.0.cmp(&b.0);
            if sorted {
                list.sort_by(order);
            }
            let mut expected: Vec<(u8, u16)> = list.iter().chain(&items).copied().collect();
            expected.sort_by(order);
            merge_sorted(&mut list, items, order);
            prop_assert_eq!(list, expected);
        }
    }
}
