//! [`StateStore`]: the service's state as one interface, whatever holds it. The SQLite
//! [`Store`] is the embedded default; fleet mode keeps the same state in etcd
//! (`tessera-fleet`'s `EtcdStore`). The service, the API and metering hold a
//! `Box<dyn StateStore>` (the API behind a mutex) and never learn which.
//!
//! Every backend keeps the same contract, which one suite of tests checks against each
//! (`contract`): every write is atomic, checks what it changes (a workload's phase, a journal
//! entry's state) and appends its event in the same commit; ids of events and journal actions
//! only grow; nothing reads a clock (`now` is the caller's). A backend that can lose the right
//! to write (a deposed leader) refuses with [`StoreError::NotLeader`] and writes nothing.
//!
//! The trait is object safe, so the three methods that take any serialisable value (an action,
//! diagnostics) take a `serde_json::Value` here, under a `_value` name; [`StateStoreExt`] gives
//! every store, `dyn StateStore` included, the generic methods callers use.

use serde::Serialize;
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{Binding, WorkloadSpec};
use tessera_compiler::units::Gpus;

use super::carried::Carried;
use super::starts::{StartDone, StartIntent};
use super::submissions::{NewSubmission, Submitted};
use super::usage::{NewRun, ReservedSpell, RunKey, UsageRow};
use super::{
    ActionId, EndReason, Ended, Event, JournalEntry, Origin, ReplicaProcess, RevisionRecord,
    RevisionStatus, Store, StoreError, WorkloadRecord,
};

/// The service's state: workloads and their lifecycle, policy revisions, the action journal,
/// the event log, what one decision hands to the next, and metered usage. See the modules of
/// [`crate::store`] for what each method promises; the SQLite [`Store`] is the reference.
pub trait StateStore: Send {
    // Workloads (`workloads.rs`).

    /// Queues a new workload; `Conflict` if a live one of its tenant has that name.
    fn submit(
        &self,
        name: &str,
        spec: &WorkloadSpec,
        origin: Origin,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError>;
    /// Queues a batch of workloads, in one commit where the backend can; one answer per
    /// submission, in order (`submissions.rs`). By default one commit each.
    fn submit_many(
        &self,
        batch: &[NewSubmission<'_>],
        now: i64,
    ) -> Result<Vec<Submitted>, StoreError> {
        super::submissions::submit_each(self, batch, now)
    }
    /// The current record of `key` (the live one, else the latest ended one), if any.
    fn get(&self, key: &WorkloadKey) -> Result<Option<WorkloadRecord>, StoreError>;
    /// The current record of `key`; `NotFound` if there is none.
    fn workload(&self, key: &WorkloadKey) -> Result<WorkloadRecord, StoreError> {
        self.get(key)?
            .ok_or_else(|| StoreError::NotFound(format!("workload `{key}`")))
    }
    /// The tenants with a record of a workload named `name`, in name order.
    fn tenants_with(&self, name: &str) -> Result<Vec<String>, StoreError>;
    /// Every record, ended ones included, in submission order; only `tenant`'s if given.
    fn list(&self, tenant: Option<&str>) -> Result<Vec<WorkloadRecord>, StoreError>;
    /// How many workloads submitted through the API for `tenant` have not ended.
    fn live_submitted(&self, tenant: &str) -> Result<usize, StoreError>;
    /// The workloads that have not ended, in submission order.
    fn live(&self) -> Result<Vec<WorkloadRecord>, StoreError>;
    /// The live workloads that have started and declare a `maxDuration`, in submission order.
    fn live_with_max_duration(&self) -> Result<Vec<WorkloadRecord>, StoreError>;
    /// The current record of every key ever committed, ended ones included.
    fn committed(&self) -> Result<Vec<WorkloadRecord>, StoreError>;
    /// The ended records of `key`, most recent first, at most `limit`.
    fn ended(&self, key: &WorkloadKey, limit: u32) -> Result<Vec<WorkloadRecord>, StoreError>;
    /// Live workloads whose cancel waits for their processes to be stopped.
    fn cancel_requested(&self) -> Result<Vec<WorkloadRecord>, StoreError>;
    /// The live workload one of whose replicas has process `pid`.
    fn workload_by_pid(&self, pid: u32) -> Result<Option<WorkloadRecord>, StoreError>;
    /// Pending → Starting.
    fn mark_starting(
        &self,
        key: &WorkloadKey,
        bindings: &[Binding],
        now: i64,
    ) -> Result<WorkloadRecord, StoreError>;
    /// Starting → Running.
    fn mark_running(
        &self,
        key: &WorkloadKey,
        replicas: &[ReplicaProcess],
        now: i64,
    ) -> Result<WorkloadRecord, StoreError>;
    /// Running → Checkpointing.
    fn mark_checkpointing(
        &self,
        key: &WorkloadKey,
        grace_deadline: i64,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError>;
    /// Records a saved checkpoint in `dir`.
    fn record_checkpoint(
        &self,
        key: &WorkloadKey,
        dir: &str,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError>;
    /// Forgets the exited process `pid`; returns how many replicas still have a process.
    fn replica_exited(&self, key: &WorkloadKey, pid: u32, now: i64) -> Result<usize, StoreError>;
    /// Back to Pending (or Cancelled, after a cancel request).
    fn requeue(
        &self,
        key: &WorkloadKey,
        reason: &str,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError>;
    /// Ends a workload as `end_reason` says.
    fn finish(
        &self,
        key: &WorkloadKey,
        end_reason: EndReason,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError>;
    /// Cancels a workload (at once when queued, by request when it has processes).
    fn cancel(&self, key: &WorkloadKey, now: i64) -> Result<WorkloadRecord, StoreError>;

    // Batches of starts (`starts.rs`).

    /// The id of the last event, 0 when there is none: [`StateStore::events`] after it
    /// returns what is recorded from now on.
    fn last_event_id(&self) -> Result<i64, StoreError>;
    /// The most starts one [`StateStoreExt::begin_starts`] or [`StateStore::finish_starts`]
    /// may carry: each is one commit, and a backend whose commits are bounded (etcd's
    /// operations per transaction) says so here; callers cut their batches to it.
    fn max_start_batch(&self) -> usize {
        usize::MAX
    }
    /// Records each start's intent and marks its workload Starting, in one commit; see
    /// [`StateStoreExt::begin_starts`].
    fn begin_starts_value(
        &self,
        cycle: u64,
        starts: &[StartIntent<'_, serde_json::Value>],
        now: i64,
    ) -> Result<Vec<ActionId>, StoreError>;
    /// Marks each launched workload Running, records its admission's split and closes its
    /// intent done, in one commit; nothing is written when any of them cannot be.
    fn finish_starts(&self, started: &[StartDone<'_>], now: i64) -> Result<(), StoreError>;

    // The action journal (`journal.rs`).

    /// Records the intent to perform `action` in `cycle`; see [`StateStoreExt::begin_action`].
    fn begin_action_value(
        &self,
        cycle: u64,
        action: &serde_json::Value,
        now: i64,
    ) -> Result<ActionId, StoreError>;
    /// Closes one action and records the next one's intent in one commit; see
    /// [`StateStoreExt::close_and_begin`].
    fn close_and_begin_value(
        &self,
        ended: (ActionId, Ended<'_>),
        cycle: u64,
        action: &serde_json::Value,
        now: i64,
    ) -> Result<ActionId, StoreError>;
    /// Records how action `id` ended; `ActionClosed` if it already was.
    fn close(&self, id: ActionId, how: Ended<'_>, now: i64) -> Result<(), StoreError>;
    /// Records the intent of each of `actions` in `cycle`, their ids in the order given: what
    /// [`StateStore::begin_action_value`] does for each, in as few commits as the backend
    /// allows (every store commits each intent before it returns its id). Where it fails,
    /// the intents of a prefix may be recorded, as with the same calls one by one.
    fn begin_actions_value(
        &self,
        cycle: u64,
        actions: &[serde_json::Value],
        now: i64,
    ) -> Result<Vec<ActionId>, StoreError> {
        actions
            .iter()
            .map(|action| self.begin_action_value(cycle, action, now))
            .collect()
    }
    /// Closes each action as [`StateStore::close`] does, in as few commits as the backend
    /// allows. Where it fails, a prefix may be closed; `ActionClosed` where one already was.
    fn close_all(&self, ended: &[(ActionId, Ended<'_>)], now: i64) -> Result<(), StoreError> {
        for &(id, how) in ended {
            self.close(id, how, now)?;
        }
        Ok(())
    }
    /// Records that action `id` completed.
    fn complete_action(&self, id: ActionId, now: i64) -> Result<(), StoreError> {
        self.close(id, Ended::Done, now)
    }
    /// Records that action `id` failed with `error`.
    fn fail_action(&self, id: ActionId, error: &str, now: i64) -> Result<(), StoreError> {
        self.close(id, Ended::Failed(error), now)
    }
    /// Intents with no outcome, oldest first.
    fn open_actions(&self) -> Result<Vec<JournalEntry>, StoreError>;
    /// How many starts of `workload` begun at or after `since` were closed as interrupted.
    fn interrupted_starts(
        &self,
        workload: &WorkloadKey,
        since: i64,
        interrupted_prefix: &str,
    ) -> Result<u32, StoreError>;

    // Retention (`retention.rs`): each deletes at most `limit` of its kind that ended before
    // `before` and returns how many; what each must keep is listed there.

    /// Deletes closed entries that ended before `before`; open intents are always kept.
    fn prune_journal(&self, before: i64, limit: usize) -> Result<usize, StoreError>;
    /// Deletes events recorded before `before`; ids are never reused after.
    fn prune_events(&self, before: i64, limit: usize) -> Result<usize, StoreError>;
    /// Deletes workload records that ended before `before`, and what only they used.
    fn prune_workloads(&self, before: i64, limit: usize) -> Result<usize, StoreError>;
    /// Deletes metered usage that ends before `before` and is no longer metered; the usage
    /// of every window that starts at or after `before` is unchanged.
    fn prune_usage(&self, before: i64, limit: usize) -> Result<usize, StoreError>;

    // The event log (`events.rs`).

    /// Appends an event that no transition records itself.
    fn record_event(
        &self,
        kind: &str,
        workload: Option<&WorkloadKey>,
        message: &str,
        now: i64,
    ) -> Result<i64, StoreError>;
    /// Up to `limit` (at most `events::MAX_LIMIT`) events after `since_id`, oldest first.
    fn events(&self, since_id: i64, limit: u32) -> Result<Vec<Event>, StoreError>;
    /// Like [`StateStore::events`], only those of `workload`.
    fn workload_events(
        &self,
        workload: &WorkloadKey,
        since_id: i64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError>;
    /// The last `limit` events of `workload`, oldest first.
    fn recent_workload_events(
        &self,
        workload: &WorkloadKey,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError>;

    // Policy revisions (`revisions.rs`).

    /// Records an evaluation of `commit`, with its event; see
    /// [`StateStoreExt::record_revision`].
    fn record_revision_value(
        &self,
        commit: &str,
        status: RevisionStatus,
        diagnostics: serde_json::Value,
        now: i64,
    ) -> Result<RevisionRecord, StoreError>;
    /// The revision in force: the last one applied.
    fn last_applied(&self) -> Result<Option<RevisionRecord>, StoreError>;
    /// The `limit` latest evaluations, newest first.
    fn revisions(&self, limit: u32) -> Result<Vec<RevisionRecord>, StoreError>;

    // What one decision hands to the next (`carried.rs`).

    fn carried(&self) -> Result<Carried, StoreError>;
    fn set_carried(&self, carried: &Carried, now: i64) -> Result<(), StoreError>;

    // Metering (`usage.rs`).

    /// The run of every live workload that holds a placement.
    fn placed_runs(&self) -> Result<Vec<RunKey>, StoreError>;
    /// The runs among `keys` that have no row yet.
    fn unmetered_runs(&self, keys: &[RunKey]) -> Result<Vec<RunKey>, StoreError>;
    /// Meters placed runs up to `now` in one commit.
    fn meter_runs(&self, extend: &[RunKey], create: &[NewRun], now: i64) -> Result<(), StoreError>;
    /// Keeps the solver's split of an admission for the run it starts.
    fn record_admission(
        &self,
        tenant: &str,
        workload: &str,
        submitted_at: i64,
        guaranteed: Gpus,
        borrowed: Gpus,
    ) -> Result<(), StoreError>;
    /// Records the work a preemption of `run` loses, once per run.
    fn record_preemption(
        &self,
        run: &RunKey,
        pool: &str,
        lost_unit_seconds: i64,
        at: i64,
    ) -> Result<(), StoreError>;
    /// Charges reserved-idle `spells` up to `now` and moves the watermark, in one commit.
    fn meter_reserved(
        &self,
        spells: &[ReservedSpell],
        decided_at: i64,
        now: i64,
    ) -> Result<(), StoreError>;
    /// Usage within `[since, until)`, per tenant, pool, model and profile.
    fn usage(&self, since: i64, until: i64) -> Result<Vec<UsageRow>, StoreError>;
}

/// The generic forms of the methods [`StateStore`] takes a JSON value for, on every store.
pub trait StateStoreExt: StateStore {
    /// Records the intent to perform `action` in `cycle`, before performing it.
    fn begin_action<A: Serialize + ?Sized>(
        &self,
        cycle: u64,
        action: &A,
        now: i64,
    ) -> Result<ActionId, StoreError> {
        self.begin_action_value(cycle, &to_value("journal action", action)?, now)
    }

    /// [`StateStore::begin_actions_value`] for any serializable actions.
    fn begin_actions<A: Serialize>(
        &self,
        cycle: u64,
        actions: &[&A],
        now: i64,
    ) -> Result<Vec<ActionId>, StoreError> {
        let values = actions
            .iter()
            .map(|a| to_value("journal action", a))
            .collect::<Result<Vec<_>, _>>()?;
        self.begin_actions_value(cycle, &values, now)
    }

    /// Records how action `ended` ended and the intent of the next action in one commit.
    fn close_and_begin<A: Serialize + ?Sized>(
        &self,
        ended: (ActionId, Ended<'_>),
        cycle: u64,
        action: &A,
        now: i64,
    ) -> Result<ActionId, StoreError> {
        self.close_and_begin_value(ended, cycle, &to_value("journal action", action)?, now)
    }

    /// Records the intent of each start and marks its workload Starting with its bindings, in
    /// one commit; the intents' ids in the order given. Nothing is written when any workload
    /// is not pending.
    fn begin_starts<A: Serialize + ?Sized>(
        &self,
        cycle: u64,
        starts: &[StartIntent<'_, A>],
        now: i64,
    ) -> Result<Vec<ActionId>, StoreError> {
        let actions = starts
            .iter()
            .map(|s| to_value("journal action", s.action))
            .collect::<Result<Vec<_>, _>>()?;
        let starts: Vec<StartIntent<'_, serde_json::Value>> = starts
            .iter()
            .zip(&actions)
            .map(|(s, action)| StartIntent {
                workload: s.workload,
                bindings: s.bindings,
                action,
            })
            .collect();
        self.begin_starts_value(cycle, &starts, now)
    }

    /// Records that `commit` was evaluated, with an event.
    fn record_revision<D: Serialize + ?Sized>(
        &self,
        commit: &str,
        status: RevisionStatus,
        diagnostics: &D,
        now: i64,
    ) -> Result<RevisionRecord, StoreError> {
        self.record_revision_value(commit, status, to_value("diagnostics", diagnostics)?, now)
    }
}

impl<S: StateStore + ?Sized> StateStoreExt for S {}

fn to_value<T: Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(value).map_err(|source| StoreError::Encode { what, source })
}

/// The SQLite store answers every call with its own method of the same name.
impl StateStore for Store {
    fn submit(
        &self,
        name: &str,
        spec: &WorkloadSpec,
        origin: Origin,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        Store::submit(self, name, spec, origin, now)
    }
    fn submit_many(
        &self,
        batch: &[NewSubmission<'_>],
        now: i64,
    ) -> Result<Vec<Submitted>, StoreError> {
        Store::submit_many(self, batch, now)
    }
    fn get(&self, key: &WorkloadKey) -> Result<Option<WorkloadRecord>, StoreError> {
        Store::get(self, key)
    }
    fn workload(&self, key: &WorkloadKey) -> Result<WorkloadRecord, StoreError> {
        Store::workload(self, key)
    }
    fn tenants_with(&self, name: &str) -> Result<Vec<String>, StoreError> {
        Store::tenants_with(self, name)
    }
    fn list(&self, tenant: Option<&str>) -> Result<Vec<WorkloadRecord>, StoreError> {
        Store::list(self, tenant)
    }
    fn live_submitted(&self, tenant: &str) -> Result<usize, StoreError> {
        Store::live_submitted(self, tenant)
    }
    fn live(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        Store::live(self)
    }
    fn live_with_max_duration(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        Store::live_with_max_duration(self)
    }
    fn committed(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        Store::committed(self)
    }
    fn ended(&self, key: &WorkloadKey, limit: u32) -> Result<Vec<WorkloadRecord>, StoreError> {
        Store::ended(self, key, limit)
    }
    fn cancel_requested(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        Store::cancel_requested(self)
    }
    fn workload_by_pid(&self, pid: u32) -> Result<Option<WorkloadRecord>, StoreError> {
        Store::workload_by_pid(self, pid)
    }
    fn mark_starting(
        &self,
        key: &WorkloadKey,
        bindings: &[Binding],
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        Store::mark_starting(self, key, bindings, now)
    }
    fn mark_running(
        &self,
        key: &WorkloadKey,
        replicas: &[ReplicaProcess],
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        Store::mark_running(self, key, replicas, now)
    }
    fn mark_checkpointing(
        &self,
        key: &WorkloadKey,
        grace_deadline: i64,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        Store::mark_checkpointing(self, key, grace_deadline, now)
    }
    fn record_checkpoint(
        &self,
        key: &WorkloadKey,
        dir: &str,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        Store::record_checkpoint(self, key, dir, now)
    }
    fn replica_exited(&self, key: &WorkloadKey, pid: u32, now: i64) -> Result<usize, StoreError> {
        Store::replica_exited(self, key, pid, now)
    }
    fn requeue(
        &self,
        key: &WorkloadKey,
        reason: &str,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        Store::requeue(self, key, reason, now)
    }
    fn finish(
        &self,
        key: &WorkloadKey,
        end_reason: EndReason,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        Store::finish(self, key, end_reason, now)
    }
    fn cancel(&self, key: &WorkloadKey, now: i64) -> Result<WorkloadRecord, StoreError> {
        Store::cancel(self, key, now)
    }

    fn last_event_id(&self) -> Result<i64, StoreError> {
        Store::last_event_id(self)
    }

    fn begin_starts_value(
        &self,
        cycle: u64,
        starts: &[StartIntent<'_, serde_json::Value>],
        now: i64,
    ) -> Result<Vec<ActionId>, StoreError> {
        Store::begin_starts(self, cycle, starts, now)
    }

    fn finish_starts(&self, started: &[StartDone<'_>], now: i64) -> Result<(), StoreError> {
        Store::finish_starts(self, started, now)
    }

    fn begin_action_value(
        &self,
        cycle: u64,
        action: &serde_json::Value,
        now: i64,
    ) -> Result<ActionId, StoreError> {
        Store::begin_action(self, cycle, action, now)
    }
    fn close_and_begin_value(
        &self,
        ended: (ActionId, Ended<'_>),
        cycle: u64,
        action: &serde_json::Value,
        now: i64,
    ) -> Result<ActionId, StoreError> {
        Store::close_and_begin(self, ended, cycle, action, now)
    }
    fn close(&self, id: ActionId, how: Ended<'_>, now: i64) -> Result<(), StoreError> {
        Store::close(self, id, how, now)
    }
    fn open_actions(&self) -> Result<Vec<JournalEntry>, StoreError> {
        Store::open_actions(self)
    }
    fn interrupted_starts(
        &self,
        workload: &WorkloadKey,
        since: i64,
        interrupted_prefix: &str,
    ) -> Result<u32, StoreError> {
        Store::interrupted_starts(self, workload, since, interrupted_prefix)
    }
    fn prune_journal(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        Store::prune_journal(self, before, limit)
    }
    fn prune_events(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        Store::prune_events(self, before, limit)
    }
    fn prune_workloads(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        Store::prune_workloads(self, before, limit)
    }
    fn prune_usage(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        Store::prune_usage(self, before, limit)
    }

    fn record_event(
        &self,
        kind: &str,
        workload: Option<&WorkloadKey>,
        message: &str,
        now: i64,
    ) -> Result<i64, StoreError> {
        Store::record_event(self, kind, workload, message, now)
    }
    fn events(&self, since_id: i64, limit: u32) -> Result<Vec<Event>, StoreError> {
        Store::events(self, since_id, limit)
    }
    fn workload_events(
        &self,
        workload: &WorkloadKey,
        since_id: i64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        Store::workload_events(self, workload, since_id, limit)
    }
    fn recent_workload_events(
        &self,
        workload: &WorkloadKey,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        Store::recent_workload_events(self, workload, limit)
    }

    fn record_revision_value(
        &self,
        commit: &str,
        status: RevisionStatus,
        diagnostics: serde_json::Value,
        now: i64,
    ) -> Result<RevisionRecord, StoreError> {
        Store::record_revision(self, commit, status, &diagnostics, now)
    }
    fn last_applied(&self) -> Result<Option<RevisionRecord>, StoreError> {
        Store::last_applied(self)
    }
    fn revisions(&self, limit: u32) -> Result<Vec<RevisionRecord>, StoreError> {
        Store::revisions(self, limit)
    }

    fn carried(&self) -> Result<Carried, StoreError> {
        Store::carried(self)
    }
    fn set_carried(&self, carried: &Carried, now: i64) -> Result<(), StoreError> {
        Store::set_carried(self, carried, now)
    }

    fn placed_runs(&self) -> Result<Vec<RunKey>, StoreError> {
        Store::placed_runs(self)
    }
    fn unmetered_runs(&self, keys: &[RunKey]) -> Result<Vec<RunKey>, StoreError> {
        Store::unmetered_runs(self, keys)
    }
    fn meter_runs(&self, extend: &[RunKey], create: &[NewRun], now: i64) -> Result<(), StoreError> {
        Store::meter_runs(self, extend, create, now)
    }
    fn record_admission(
        &self,
        tenant: &str,
        workload: &str,
        submitted_at: i64,
        guaranteed: Gpus,
        borrowed: Gpus,
    ) -> Result<(), StoreError> {
        Store::record_admission(self, tenant, workload, submitted_at, guaranteed, borrowed)
    }
    fn record_preemption(
        &self,
        run: &RunKey,
        pool: &str,
        lost_unit_seconds: i64,
        at: i64,
    ) -> Result<(), StoreError> {
        Store::record_preemption(self, run, pool, lost_unit_seconds, at)
    }
    fn meter_reserved(
        &self,
        spells: &[ReservedSpell],
        decided_at: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        Store::meter_reserved(self, spells, decided_at, now)
    }
    fn usage(&self, since: i64, until: i64) -> Result<Vec<UsageRow>, StoreError> {
        Store::usage(self, since, until)
    }
}
