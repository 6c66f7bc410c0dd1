//! A batch of starts in two commits, for the service's arrival path: the intents of all the
//! batch's starts with their workloads marked Starting in one commit, before any is launched;
//! then, after the launches, the workloads marked Running, their admissions' split recorded
//! for metering and the intents closed, in another. One start alone costs four commits
//! ([`Store::begin_action`], [`Store::mark_starting`], [`Store::mark_running`],
//! [`Store::close`]); a batch of a hundred costs two. The order a crash can observe is the
//! same as one start at a time: an open intent with its workload Starting, which recovery
//! treats as an interrupted start.
//!
//! Either commit is whole or absent: a workload that is no longer pending (cancelled since it
//! was read) fails the first, and nothing of the batch is written.

use rusqlite::OptionalExtension;
use serde::Serialize;
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::Binding;
use tessera_compiler::units::Gpus;

use super::journal::{close_in, insert_intent};
use super::workloads::{current, set_running, set_starting};
use super::{ActionId, Ended, ReplicaProcess, Store, StoreError, events, to_json, to_sql_int};

/// One start of a batch, before it is launched.
pub struct StartIntent<'a, A: ?Sized> {
    pub workload: &'a WorkloadKey,
    pub bindings: &'a [Binding],
    /// What the journal records as the intent.
    pub action: &'a A,
}

/// One launched start of a batch.
pub struct StartDone<'a> {
    /// Its intent, from [`Store::begin_starts`].
    pub action: ActionId,
    pub workload: &'a WorkloadKey,
    pub replicas: &'a [ReplicaProcess],
    /// The record's submission instant, which names the admission in metering.
    pub submitted_at: i64,
    /// The admission's GPUs within the tenant's guarantee, and borrowed above it.
    pub guaranteed: Gpus,
    pub borrowed: Gpus,
}

impl Store {
    /// The id of the last event, 0 when there is none: [`Store::events`] after it returns
    /// what is recorded from now on.
    pub fn last_event_id(&self) -> Result<i64, StoreError> {
        let id: Option<i64> = self
            .conn
            // The sequence, not the largest id left: retention may have deleted every event,
            // and ids are never reused.
            .prepare_cached("SELECT seq FROM sqlite_sequence WHERE name = 'events'")?
            .query_row([], |r| r.get(0))
            .optional()?;
        Ok(id.unwrap_or(0))
    }

    /// Records the intent of each start and marks its workload Starting with its bindings,
    /// in one commit; the intents' ids in the order given. Nothing is written when any
    /// workload is not pending.
    pub fn begin_starts<A: Serialize + ?Sized>(
        &self,
        cycle: u64,
        starts: &[StartIntent<'_, A>],
        now: i64,
    ) -> Result<Vec<ActionId>, StoreError> {
        let cycle = to_sql_int("cycle", cycle)?;
        let tx = self.write()?;
        let mut ids = Vec::with_capacity(starts.len());
        for s in starts {
            let action = to_json("journal action", s.action)?;
            ids.push(insert_intent(&tx, cycle, &action, now)?);
            let cur = current(&tx, s.workload)?;
            let (kind, message) = set_starting(&tx, &cur, s.bindings)?;
            events::append(&tx, now, kind, Some(s.workload), &message)?;
        }
        tx.commit()?;
        Ok(ids)
    }

    /// Marks each launched workload Running with its processes, records its admission's
    /// split (as [`Store::record_admission`]) and closes its intent done, in one commit.
    /// Nothing is written when any workload is not starting or any intent is closed.
    pub fn finish_starts(&self, started: &[StartDone<'_>], now: i64) -> Result<(), StoreError> {
        let tx = self.write()?;
        for s in started {
            let cur = current(&tx, s.workload)?;
            let (kind, message) = set_running(&tx, &cur, s.replicas, now)?;
            events::append(&tx, now, kind, Some(s.workload), &message)?;
            close_in(&tx, s.action, Ended::Done, now)?;
            // On this connection, so inside the transaction.
            self.record_admission(
                &s.workload.tenant,
                &s.workload.name,
                s.submitted_at,
                s.guaranteed,
                s.borrowed,
            )?;
        }
        tx.commit()?;
        Ok(())
    }
}
