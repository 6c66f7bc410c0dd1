//! The event log: what happened, in order, for `tessera events` and the API. Transitions append
//! their event in their own transaction; [`Store::record_event`] is for the rest (a revision
//! applied, a node lost).

use rusqlite::{Connection, params};
use serde::{Deserialize, Serialize};

use tessera_compiler::WorkloadKey;

use super::{Store, StoreError};

/// One entry of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Increasing, never reused: a reader resumes after the last id it saw.
    pub id: i64,
    /// Unix seconds.
    pub at: i64,
    /// A short fixed word: `submitted`, `running`, `requeued`, `revision-applied`, ...
    pub kind: String,
    /// The workload's name and tenant: names are per tenant. An event written before names
    /// were per tenant whose workload record was pruned has no tenant.
    pub workload: Option<String>,
    pub tenant: Option<String>,
    pub message: String,
}

/// Most events a single read returns, whatever the caller asks.
pub const MAX_LIMIT: u32 = 10_000;

impl Store {
    /// Appends an event (one that no transition records itself).
    pub fn record_event(
        &self,
        kind: &str,
        workload: Option<&WorkloadKey>,
        message: &str,
        now: i64,
    ) -> Result<i64, StoreError> {
        append(&self.conn, now, kind, workload, message)
    }

    /// Up to `limit` (at most [`MAX_LIMIT`]) events with an id above `since_id`, oldest first.
    pub fn events(&self, since_id: i64, limit: u32) -> Result<Vec<Event>, StoreError> {
        self.read_events(
            "SELECT id, at, kind, workload, tenant, message FROM events
             WHERE id > ?1 ORDER BY id LIMIT ?2",
            params![since_id, limit.min(MAX_LIMIT)],
        )
    }

    /// Like [`Store::events`], only those of workloads with key `workload`.
    pub fn workload_events(
        &self,
        workload: &WorkloadKey,
        since_id: i64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        self.read_events(
            "SELECT id, at, kind, workload, tenant, message FROM events
             WHERE tenant = ?3 AND workload = ?4 AND id > ?1 ORDER BY id LIMIT ?2",
            params![
                since_id,
                limit.min(MAX_LIMIT),
                workload.tenant,
                workload.name
            ],
        )
    }

    /// The last `limit` (at most [`MAX_LIMIT`]) events of workloads with key `workload`,
    /// oldest first.
    pub fn recent_workload_events(
        &self,
        workload: &WorkloadKey,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        let mut events = self.read_events(
            "SELECT id, at, kind, workload, tenant, message FROM events
             WHERE tenant = ?1 AND workload = ?2 ORDER BY id DESC LIMIT ?3",
            params![workload.tenant, workload.name, limit.min(MAX_LIMIT)],
        )?;
        events.reverse();
        Ok(events)
    }

    fn read_events(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<Event>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let rows = stmt.query_map(params, |r| {
            Ok(Event {
                id: r.get(0)?,
                at: r.get(1)?,
                kind: r.get(2)?,
                workload: r.get(3)?,
                tenant: r.get(4)?,
                message: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}

/// Appends an event inside the caller's transaction (or alone).
pub(super) fn append(
    conn: &Connection,
    now: i64,
    kind: &str,
    workload: Option<&WorkloadKey>,
    message: &str,
) -> Result<i64, StoreError> {
    conn.prepare_cached(
        "INSERT INTO events (at, kind, workload, tenant, message) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        now,
        kind,
        workload.map(|k| &k.name),
        workload.map(|k| &k.tenant),
        message
    ])?;
    Ok(conn.last_insert_rowid())
}
