//! The write-ahead action journal. Before the reconciler changes the world (creates a MIG
//! instance, starts or signals a process) it records the intent; after, the outcome. A service
//! killed in between finds the intent still open at restart ([`Store::open_actions`]) and knows
//! which step may be half-done, so it can look at the nodes before planning again.

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use tessera_compiler::WorkloadKey;

use super::{Store, StoreError, from_json, to_json, to_sql_int};

/// A journal entry's id: increasing, never reused.
pub type ActionId = i64;

/// How an action ended, for the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended<'a> {
    Done,
    Failed(&'a str),
}

/// Closes action `id` within `tx`: it must be open (an intent).
pub(super) fn close_in(
    tx: &rusqlite::Transaction<'_>,
    id: ActionId,
    how: Ended<'_>,
    now: i64,
) -> Result<(), StoreError> {
    let found: Option<String> = tx
        .prepare_cached("SELECT state FROM journal WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    let Some(found) = found else {
        return Err(StoreError::NotFound(format!("journal action {id}")));
    };
    match ActionState::parse(&found) {
        Some(ActionState::Intent) => {}
        Some(closed) => return Err(StoreError::ActionClosed { id, state: closed }),
        None => {
            return Err(StoreError::CorruptValue {
                table: "journal",
                column: "state",
                row: id,
                value: found,
            });
        }
    }
    let (state, error) = match how {
        Ended::Done => (ActionState::Done, None),
        Ended::Failed(error) => (ActionState::Failed, Some(error)),
    };
    tx.prepare_cached("UPDATE journal SET state = ?2, ended_at = ?3, error = ?4 WHERE id = ?1")?
        .execute(params![id, state.as_str(), now, error])?;
    Ok(())
}

/// Records the intent of `action` (serialised) within the caller's transaction.
pub(super) fn insert_intent(
    conn: &rusqlite::Connection,
    cycle: i64,
    action: &str,
    now: i64,
) -> Result<ActionId, StoreError> {
    conn.prepare_cached(
        "INSERT INTO journal (cycle, action, state, begun_at) VALUES (?1, ?2, 'intent', ?3)",
    )?
    .execute(params![cycle, action, now])?;
    Ok(conn.last_insert_rowid())
}

/// Where an action stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionState {
    /// Recorded before it ran; no outcome yet.
    Intent,
    Done,
    Failed,
}

impl ActionState {
    fn as_str(self) -> &'static str {
        match self {
            ActionState::Intent => "intent",
            ActionState::Done => "done",
            ActionState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<ActionState> {
        match s {
            "intent" => Some(ActionState::Intent),
            "done" => Some(ActionState::Done),
            "failed" => Some(ActionState::Failed),
            _ => None,
        }
    }
}

impl std::fmt::Display for ActionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An action whose outcome was never recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalEntry {
    pub id: ActionId,
    pub cycle: u64,
    /// The action as the caller serialised it.
    pub action: serde_json::Value,
    pub begun_at: i64,
}

impl Store {
    /// Records the intent to perform `action` in `cycle`, before performing it.
    pub fn begin_action<A: Serialize + ?Sized>(
        &self,
        cycle: u64,
        action: &A,
        now: i64,
    ) -> Result<ActionId, StoreError> {
        let cycle = to_sql_int("cycle", cycle)?;
        let action = to_json("journal action", action)?;
        self.conn
            .prepare_cached(
                "INSERT INTO journal (cycle, action, state, begun_at) VALUES (?1, ?2, 'intent', ?3)",
            )?
            .execute(params![cycle, action, now])?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Records that action `id` completed.
    /// Records how action `ended` ended and the intent of the next action in one commit (one
    /// fsync where there would be two): the ended action's effect came before this commit,
    /// the next one's comes after it, as [`Store::begin_action`] and the closing calls would
    /// order them.
    pub fn close_and_begin<A: Serialize + ?Sized>(
        &self,
        ended: (ActionId, Ended<'_>),
        cycle: u64,
        action: &A,
        now: i64,
    ) -> Result<ActionId, StoreError> {
        let cycle = to_sql_int("cycle", cycle)?;
        let action = to_json("journal action", action)?;
        let tx = self.write()?;
        let (id, how) = ended;
        close_in(&tx, id, how, now)?;
        tx.prepare_cached(
            "INSERT INTO journal (cycle, action, state, begun_at) VALUES (?1, ?2, 'intent', ?3)",
        )?
        .execute(params![cycle, action, now])?;
        let next = tx.last_insert_rowid();
        tx.commit()?;
        Ok(next)
    }

    /// Records how action `id` ended.
    pub fn close(&self, id: ActionId, how: Ended<'_>, now: i64) -> Result<(), StoreError> {
        let tx = self.write()?;
        close_in(&tx, id, how, now)?;
        tx.commit()?;
        Ok(())
    }

    pub fn complete_action(&self, id: ActionId, now: i64) -> Result<(), StoreError> {
        self.close_action(id, ActionState::Done, None, now)
    }

    /// Records that action `id` failed with `error`.
    pub fn fail_action(&self, id: ActionId, error: &str, now: i64) -> Result<(), StoreError> {
        self.close_action(id, ActionState::Failed, Some(error), now)
    }

    /// Intents with no outcome, oldest first: what was in flight when the service stopped.
    pub fn open_actions(&self) -> Result<Vec<JournalEntry>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, cycle, action, begun_at FROM journal WHERE state = 'intent' ORDER BY id",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(id, cycle, action, begun_at)| {
                Ok(JournalEntry {
                    id,
                    cycle: u64::try_from(cycle).map_err(|_| StoreError::CorruptValue {
                        table: "journal",
                        column: "cycle",
                        row: id,
                        value: cycle.to_string(),
                    })?,
                    action: from_json("journal", "action", id, &action)?,
                    begun_at,
                })
            })
            .collect()
    }

    /// How many starts of `workload` begun at or after `since` were cut short by the service
    /// stopping (closed with an error starting `interrupted_prefix` at recovery): a start that
    /// keeps killing the service shows here however often the service restarts.
    ///
    /// Actions name a workload by key, `tenant/name`; one journaled before names were per
    /// tenant names it alone, which then named one live workload (and `since` keeps to this
    /// one's lifetime).
    pub fn interrupted_starts(
        &self,
        workload: &WorkloadKey,
        since: i64,
        interrupted_prefix: &str,
    ) -> Result<u32, StoreError> {
        let count: i64 = self
            .conn
            .prepare_cached(
                "SELECT COUNT(*) FROM journal WHERE state = 'failed' AND begun_at >= ?1 \
             AND substr(error, 1, length(?2)) = ?2 \
             AND json_extract(action, '$.action') = 'start' \
             AND json_extract(action, '$.workload') IN (?3, ?4)",
            )?
            .query_row(
                params![
                    since,
                    interrupted_prefix,
                    workload.to_string(),
                    workload.name
                ],
                |r| r.get(0),
            )?;
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    fn close_action(
        &self,
        id: ActionId,
        state: ActionState,
        error: Option<&str>,
        now: i64,
    ) -> Result<(), StoreError> {
        let how = match (state, error) {
            (ActionState::Failed, error) => Ended::Failed(error.unwrap_or_default()),
            _ => Ended::Done,
        };
        self.close(id, how, now)
    }
}
