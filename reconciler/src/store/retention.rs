//! Retention: deleting what has aged past its keeping time, a bounded batch per call, so that
//! the journal, the event log, ended workloads and metered usage do not grow without limit.
//!
//! Each call deletes at most `limit` rows of one kind that ended before `before` (the caller's
//! cutoff, `now` minus the retention) and returns how many; a caller that gets `limit` back
//! calls again later for the rest. What a call may never delete:
//!
//! - an open journal intent (recovery reads it after a restart);
//! - a live workload's record, or anything of a record that has not ended;
//! - usage that windows after the cutoff still count: a run's row while its workload holds
//!   the placement (its interval is still being metered, and deleting it would make the next
//!   metering count the run again from its start), a run or reserved-idle spell that ends at
//!   or after the cutoff, a preemption at or after it.
//!
//! So pruning usage before `T` leaves the usage of every window that starts at or after `T`
//! exactly as it was. The event log, in time order, is read from its oldest event only: a
//! step reads a batch of rows, never the whole log. Every store keeps the same rules
//! (`contract`).

use rusqlite::params;

use super::{Store, StoreError};

/// The closed journal entries that ended before `?1`, the first ended first, at most `?2`
/// (through the `journal_closed` index).
const OLD_ENTRIES: &str = "SELECT id FROM journal WHERE state != 'intent' AND ended_at < ?1
     ORDER BY ended_at, id LIMIT ?2";

/// The workload records that ended before `?1`, the first ended first, at most `?2` (through
/// the `workloads_ended` index).
const OLD_RECORDS: &str =
    "SELECT id FROM workloads WHERE ended_at < ?1 ORDER BY ended_at, id LIMIT ?2";

/// A `limit` as SQLite's integer (a limit past `i64::MAX` is no limit).
fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl Store {
    /// Deletes at most `limit` closed journal entries that ended before `before`, the first
    /// ended first; returns how many. Open intents are always kept.
    pub fn prune_journal(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        Ok(self
            .conn
            .prepare_cached(&format!("DELETE FROM journal WHERE id IN ({OLD_ENTRIES})"))?
            .execute(params![before, sql_limit(limit)])?)
    }

    /// Deletes, of the `limit` oldest events, those recorded before `before`; returns how
    /// many. The log is in time order, so the oldest are the first to age, and a step reads
    /// `limit` rows however long the log is. Event ids are never reused
    /// ([`Store::last_event_id`] stays where it was).
    pub fn prune_events(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        Ok(self
            .conn
            .prepare_cached(
                "DELETE FROM events WHERE id IN (
                     SELECT id FROM (SELECT id, at FROM events ORDER BY id LIMIT ?2)
                     WHERE at < ?1)",
            )?
            .execute(params![before, sql_limit(limit)])?)
    }

    /// Deletes at most `limit` workload records that ended before `before`, the first ended
    /// first, with
    /// their replicas and the admission split kept for their runs (unless a record of the
    /// same key and submission instant still uses it); returns how many. Live records are
    /// always kept.
    pub fn prune_workloads(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        let tx = self.write()?;
        tx.prepare_cached(&format!(
            "DELETE FROM usage_admissions WHERE EXISTS (
                 SELECT 1 FROM workloads w
                 WHERE w.id IN ({OLD_RECORDS})
                   AND w.tenant = usage_admissions.tenant AND w.name = usage_admissions.workload
                   AND w.submitted_at = usage_admissions.submitted_at)
             AND NOT EXISTS (
                 SELECT 1 FROM workloads k
                 WHERE k.tenant = usage_admissions.tenant AND k.name = usage_admissions.workload
                   AND k.submitted_at = usage_admissions.submitted_at
                   AND (k.ended_at IS NULL OR k.ended_at >= ?1))"
        ))?
        .execute(params![before, sql_limit(limit)])?;
        // `ended_at < ?1` is never true of a live record (its `ended_at` is NULL); replicas
        // go with their record (`ON DELETE CASCADE`).
        let pruned = tx
            .prepare_cached(&format!(
                "DELETE FROM workloads WHERE id IN ({OLD_RECORDS})"
            ))?
            .execute(params![before, sql_limit(limit)])?;
        tx.commit()?;
        Ok(pruned)
    }

    /// Deletes at most `limit` rows of metered usage that end before `before`: runs metered
    /// up to before it whose workload no longer holds that placement, reserved-idle spells
    /// that ended before it, preemptions before it; returns how many rows.
    pub fn prune_usage(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        let tx = self.write()?;
        let mut left = limit;
        let runs = tx
            .prepare_cached(
                "DELETE FROM usage_runs WHERE id IN (
                     SELECT u.id FROM usage_runs u
                     WHERE u.metered_until < ?1 AND NOT EXISTS (
                         SELECT 1 FROM workloads w
                         WHERE w.ended_at IS NULL AND w.tenant = u.tenant AND w.name = u.workload
                           AND w.submitted_at = u.submitted_at AND w.started_at = u.started_at)
                     ORDER BY u.id LIMIT ?2)",
            )?
            .execute(params![before, sql_limit(left)])?;
        left -= runs;
        let spells = tx
            .prepare_cached(
                "DELETE FROM usage_reserved WHERE id IN (
                     SELECT id FROM usage_reserved WHERE until < ?1 ORDER BY id LIMIT ?2)",
            )?
            .execute(params![before, sql_limit(left)])?;
        left -= spells;
        let preemptions = tx
            .prepare_cached(
                "DELETE FROM usage_preemptions
                 WHERE (tenant, workload, submitted_at, started_at) IN (
                     SELECT tenant, workload, submitted_at, started_at FROM usage_preemptions
                     WHERE at < ?1 ORDER BY at LIMIT ?2)",
            )?
            .execute(params![before, sql_limit(left)])?;
        tx.commit()?;
        Ok(runs + spells + preemptions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step finds what ended through an index, not by reading every record or entry: a
    /// store of a month of history answers in the time of what it deletes.
    #[test]
    fn what_ended_is_found_through_an_index() {
        let store = Store::open_in_memory().unwrap();
        for (query, index) in [
            (OLD_RECORDS, "workloads_ended"),
            (OLD_ENTRIES, "journal_closed"),
        ] {
            let plan: Vec<String> = store
                .conn
                .prepare(&format!("EXPLAIN QUERY PLAN {query}"))
                .unwrap()
                .query_map(params![0, 10], |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(
                plan.iter()
                    .any(|step| step.contains(&format!("INDEX {index}"))),
                "{query}: {plan:?}"
            );
        }
    }
}
