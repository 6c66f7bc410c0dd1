//! Workloads and their lifecycle.
//!
//! | method               | from                              | to                                  |
//! |----------------------|-----------------------------------|-------------------------------------|
//! | `submit`             | (none, or only ended records)     | Pending                             |
//! | `mark_starting`      | Pending                           | Starting                            |
//! | `mark_running`       | Starting                          | Running                             |
//! | `mark_checkpointing` | Running                           | Checkpointing                       |
//! | `requeue`            | Starting, Running, Checkpointing  | Pending, `attempts` + 1             |
//! | `finish`             | Starting, Running, Checkpointing  | Succeeded, Failed or Cancelled      |
//! | `finish` (cancelled or rejected) | Pending               | Cancelled or Failed                 |
//! | `cancel`             | Pending                           | Cancelled                           |
//! | `cancel`             | Starting, Running, Checkpointing  | unchanged, `cancel_requested_at` set|
//!
//! `record_checkpoint` and `replica_exited` record facts without changing the phase.
//!
//! A workload is identified by its [`WorkloadKey`], `(tenant, name)`: names are per tenant, so
//! two tenants may each have a live `train`. A key identifies its *current* record: the live
//! one if any, else the most recent ended one. Ended records stay as history and their key may
//! be submitted again. Cancelling a
//! workload whose processes run only records the request (`cancel_requested_at`): it stays live,
//! holding its GPUs, until the reconciler has stopped it and calls [`Store::finish`] with
//! [`EndReason::Cancelled`] (or [`Store::requeue`], which then ends it as cancelled). Every
//! transition checks the current phase and appends its event in the same transaction.

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{Binding, WorkloadSpec};

use super::{Store, StoreError, events, from_json, to_json};
use crate::runtime::ExitStatus;

/// Where a workload came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Through the API.
    Submitted,
    /// From a `Workload` file of the policy revision in force.
    Committed,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Submitted => "submitted",
            Origin::Committed => "committed",
        }
    }

    fn parse(s: &str) -> Option<Origin> {
        match s {
            "submitted" => Some(Origin::Submitted),
            "committed" => Some(Origin::Committed),
            _ => None,
        }
    }
}

/// Where a workload is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Queued, waiting for a placement (again, after a preemption).
    Pending,
    /// Placed; its processes are being started.
    Starting,
    Running,
    /// Sent its checkpoint signal; stopped at `grace_deadline` if still running.
    Checkpointing,
    Succeeded,
    Failed,
    Cancelled,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Pending,
        Phase::Starting,
        Phase::Running,
        Phase::Checkpointing,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::Checkpointing => "checkpointing",
            Phase::Succeeded => "succeeded",
            Phase::Failed => "failed",
            Phase::Cancelled => "cancelled",
        }
    }

    fn parse(s: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Succeeded, failed or cancelled: nothing more happens to it.
    pub fn is_ended(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Cancelled)
    }

    /// Placed, with processes that may run (or a simulated placement).
    pub fn holds_placement(self) -> bool {
        matches!(
            self,
            Phase::Starting | Phase::Running | Phase::Checkpointing
        )
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a workload ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum EndReason {
    /// Its command exited; code 0 is success, anything else a failure.
    Exited { code: i32 },
    /// Its command was killed by a signal it did not handle.
    Signalled { signal: i32 },
    /// Its processes are gone and how they ended could not be learned (the runtime's wrapper
    /// was killed while the service was down).
    Unknown,
    /// A tenant cancelled it, or its committed file was removed from the repository.
    Cancelled,
    /// The node (or a GPU) it ran on was lost.
    Lost { node: String },
    /// Its processes could not be started.
    StartFailed { error: String },
    /// The policy in force no longer admits it (its tenant or SLO class was removed).
    Rejected { reason: String },
    /// It ran for its whole `maxDuration` and was stopped (Slurm's time limit): the promise
    /// backfill ahead of a reservation is made on.
    TimedOut { limit_seconds: u64 },
}

impl EndReason {
    /// The phase a workload ending this way is left in.
    pub fn phase(&self) -> Phase {
        match self {
            EndReason::Exited { code: 0 } => Phase::Succeeded,
            EndReason::Cancelled => Phase::Cancelled,
            _ => Phase::Failed,
        }
    }

    /// How a workload ended, from how its (last) process ended.
    pub fn from_exit(status: ExitStatus) -> EndReason {
        match status {
            ExitStatus::Code(code) => EndReason::Exited { code },
            ExitStatus::Signal(signal) => EndReason::Signalled { signal },
            ExitStatus::Unknown => EndReason::Unknown,
        }
    }

    /// Phases a workload may end this way from: only a placed workload can exit or be lost,
    /// while a policy change or a tenant can end one that is still queued.
    pub fn may_end_from(&self, phase: Phase) -> bool {
        match self {
            EndReason::Cancelled | EndReason::Rejected { .. } => !phase.is_ended(),
            _ => phase.holds_placement(),
        }
    }
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::Exited { code } => write!(f, "exited with code {code}"),
            EndReason::Signalled { signal } => write!(f, "killed by signal {signal}"),
            EndReason::Unknown => f.write_str("ended, how is unknown"),
            EndReason::Cancelled => f.write_str("cancelled"),
            EndReason::Lost { node } => write!(f, "lost with node {node}"),
            EndReason::StartFailed { error } => write!(f, "could not start: {error}"),
            EndReason::Rejected { reason } => write!(f, "rejected: {reason}"),
            EndReason::TimedOut { limit_seconds } => {
                write!(f, "stopped at its maxDuration of {limit_seconds} s")
            }
        }
    }
}

/// One replica's process as the runtime started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaProcess {
    pub replica: u32,
    /// The runtime's pid (its process group); `None` once it has exited, or for a workload
    /// without a command.
    pub pid: Option<u32>,
    /// `GPU-...` or `MIG-...` UUIDs in its `CUDA_VISIBLE_DEVICES`.
    pub devices: Vec<String>,
}

/// A workload as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRecord {
    pub name: String,
    pub tenant: String,
    pub spec: WorkloadSpec,
    pub origin: Origin,
    pub phase: Phase,
    pub submitted_at: i64,
    /// When its current attempt was running; `None` while pending.
    pub started_at: Option<i64>,
    /// One per replica while placed.
    pub bindings: Vec<Binding>,
    pub replicas: Vec<ReplicaProcess>,
    /// Kept across attempts: a requeued workload resumes from it.
    pub checkpoint_dir: Option<String>,
    pub last_checkpoint_at: Option<i64>,
    /// When the checkpoint signal was sent (checkpointing only).
    pub signalled_at: Option<i64>,
    /// When it is stopped if still running (checkpointing only).
    pub grace_deadline: Option<i64>,
    /// A cancel that waits for its processes to be stopped.
    pub cancel_requested_at: Option<i64>,
    /// How many times it was requeued.
    pub attempts: u32,
    pub ended_at: Option<i64>,
    pub end: Option<EndReason>,
}

impl WorkloadRecord {
    /// A workload just submitted, as every store records it: pending, never started, nothing
    /// held or signalled, no attempt yet.
    pub fn submitted(name: &str, spec: &WorkloadSpec, origin: Origin, now: i64) -> WorkloadRecord {
        WorkloadRecord {
            name: name.to_string(),
            tenant: spec.tenant.clone(),
            spec: spec.clone(),
            origin,
            phase: Phase::Pending,
            submitted_at: now,
            started_at: None,
            bindings: Vec::new(),
            replicas: Vec::new(),
            checkpoint_dir: None,
            last_checkpoint_at: None,
            signalled_at: None,
            grace_deadline: None,
            cancel_requested_at: None,
            attempts: 0,
            ended_at: None,
            end: None,
        }
    }

    /// What identifies it: `(tenant, name)`.
    pub fn key(&self) -> WorkloadKey {
        WorkloadKey::new(&self.tenant, &self.name)
    }
}

const COLUMNS: &str = "id, name, tenant, spec, origin, phase, submitted_at, started_at, bindings, \
     checkpoint_dir, last_checkpoint_at, signalled_at, grace_deadline, cancel_requested_at, \
     attempts, ended_at, end_reason";

/// A key's current record: the live one, else the latest.
const CURRENT: &str =
    "WHERE tenant = ?1 AND name = ?2 ORDER BY ended_at IS NULL DESC, id DESC LIMIT 1";

const TABLE: &str = "workloads";

impl Store {
    /// Queues a new workload. `Conflict` if a live workload of its tenant has that name
    /// (another tenant's is no conflict: names are per tenant).
    pub fn submit(
        &self,
        name: &str,
        spec: &WorkloadSpec,
        origin: Origin,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        let tx = self.write()?;
        let record = insert_submission(&tx, name, spec, origin, now)?;
        tx.commit()?;
        Ok(record)
    }

    /// How many workloads submitted through the API for `tenant` have not ended.
    pub fn live_submitted(&self, tenant: &str) -> Result<usize, StoreError> {
        count_live_submitted(&self.conn, tenant)
    }

    /// The current record of `key`, if any.
    pub fn get(&self, key: &WorkloadKey) -> Result<Option<WorkloadRecord>, StoreError> {
        let tx = self.read()?;
        let id: Option<i64> = tx
            .query_row(
                &format!("SELECT id FROM workloads {CURRENT}"),
                [&key.tenant, &key.name],
                |r| r.get(0),
            )
            .optional()?;
        id.map(|id| load(&tx, id)).transpose()
    }

    /// The current record of `key`; `NotFound` if there is none.
    pub fn workload(&self, key: &WorkloadKey) -> Result<WorkloadRecord, StoreError> {
        self.get(key)?
            .ok_or_else(|| StoreError::NotFound(format!("workload `{key}`")))
    }

    /// The tenants that have a record (live or ended) of a workload named `name`, in name
    /// order: how an operator's bare name is resolved, or found ambiguous.
    pub fn tenants_with(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT DISTINCT tenant FROM workloads WHERE name = ?1 ORDER BY tenant",
        )?;
        let rows = stmt.query_map([name], |r| r.get(0))?;
        Ok(rows.collect::<Result<Vec<String>, _>>()?)
    }

    /// Every record, ended ones included, in submission order; only `tenant`'s if given.
    pub fn list(&self, tenant: Option<&str>) -> Result<Vec<WorkloadRecord>, StoreError> {
        match tenant {
            Some(t) => self.select("WHERE tenant = ?1 ORDER BY id", [t]),
            None => self.select("ORDER BY id", []),
        }
    }

    /// The workloads that have not ended, in submission order.
    pub fn live(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.select("WHERE ended_at IS NULL ORDER BY id", [])
    }

    /// The workloads that have not ended, have started and declare a `maxDuration`, in
    /// submission order: the ones a cycle checks against their limit. The filter is SQLite's,
    /// so a cycle does not read every live record for the few that declare one.
    pub fn live_with_max_duration(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.select(
            "WHERE ended_at IS NULL AND started_at IS NOT NULL
               AND json_extract(spec, '$.maxDuration') IS NOT NULL
             ORDER BY id",
            [],
        )
    }

    /// The current record of every key that was ever committed, ended ones included: a
    /// committed workload that has finished is not queued again while its file stays.
    pub fn committed(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.select(
            "WHERE origin = 'committed' AND id IN (
                 SELECT (SELECT id FROM workloads c
                         WHERE c.tenant = n.tenant AND c.name = n.name
                         ORDER BY ended_at IS NULL DESC, id DESC LIMIT 1)
                 FROM (SELECT DISTINCT tenant, name FROM workloads WHERE origin = 'committed') n)
             ORDER BY id",
            [],
        )
    }

    /// The ended records of `key`, most recent first, at most `limit`.
    pub fn ended(&self, key: &WorkloadKey, limit: u32) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.select(
            "WHERE tenant = ?1 AND name = ?2 AND ended_at IS NOT NULL ORDER BY id DESC LIMIT ?3",
            rusqlite::params![key.tenant, key.name, limit],
        )
    }

    /// Live workloads whose cancel waits for their processes to be stopped.
    pub fn cancel_requested(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.select(
            "WHERE ended_at IS NULL AND cancel_requested_at IS NOT NULL ORDER BY id",
            [],
        )
    }

    /// The live workload one of whose replicas has process `pid`.
    pub fn workload_by_pid(&self, pid: u32) -> Result<Option<WorkloadRecord>, StoreError> {
        let tx = self.read()?;
        let id: Option<i64> = tx
            .prepare_cached(
                "SELECT w.id FROM replicas r JOIN workloads w ON w.id = r.workload_id
                 WHERE r.pid = ?1 AND w.ended_at IS NULL ORDER BY w.id DESC LIMIT 1",
            )?
            .query_row([pid], |r| r.get(0))
            .optional()?;
        id.map(|id| load(&tx, id)).transpose()
    }

    /// Pending → Starting: placed with one binding per replica.
    pub fn mark_starting(
        &self,
        key: &WorkloadKey,
        bindings: &[Binding],
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.transition(key, now, |tx, cur| {
            set_starting(tx, cur, bindings).map(Some)
        })
    }

    /// Starting → Running, with the replicas' processes.
    pub fn mark_running(
        &self,
        key: &WorkloadKey,
        replicas: &[ReplicaProcess],
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.transition(key, now, |tx, cur| {
            set_running(tx, cur, replicas, now).map(Some)
        })
    }

    /// Running → Checkpointing: the checkpoint signal was sent; stop at `grace_deadline`.
    pub fn mark_checkpointing(
        &self,
        key: &WorkloadKey,
        grace_deadline: i64,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.transition(key, now, |tx, cur| {
            expect(cur, "checkpoint", &[Phase::Running])?;
            tx.prepare_cached(
                "UPDATE workloads SET phase = 'checkpointing', signalled_at = ?2,
                 grace_deadline = ?3 WHERE id = ?1",
            )?
            .execute(params![cur.id, now, grace_deadline])?;
            Ok(Some((
                "checkpointing",
                format!("checkpoint signal sent, stop at {grace_deadline}"),
            )))
        })
    }

    /// Records that the workload saved a checkpoint in `dir`, which its next attempt resumes
    /// from.
    pub fn record_checkpoint(
        &self,
        key: &WorkloadKey,
        dir: &str,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.transition(key, now, |tx, cur| {
            expect(
                cur,
                "record a checkpoint",
                &[Phase::Starting, Phase::Running, Phase::Checkpointing],
            )?;
            tx.prepare_cached(
                "UPDATE workloads SET checkpoint_dir = ?2, last_checkpoint_at = ?3 WHERE id = ?1",
            )?
            .execute(params![cur.id, dir, now])?;
            Ok(Some(("checkpointed", format!("checkpoint in {dir}"))))
        })
    }

    /// Forgets the process `pid` of one of `name`'s replicas, which has exited; returns how
    /// many of its replicas still have a process.
    pub fn replica_exited(
        &self,
        key: &WorkloadKey,
        pid: u32,
        now: i64,
    ) -> Result<usize, StoreError> {
        let tx = self.write()?;
        let cur = current(&tx, key)?;
        expect(
            &cur,
            "record a process exit",
            &[Phase::Starting, Phase::Running, Phase::Checkpointing],
        )?;
        let replica: Option<u32> = tx
            .prepare_cached(
                "UPDATE replicas SET pid = NULL WHERE workload_id = ?1 AND pid = ?2
                 RETURNING replica",
            )?
            .query_row(params![cur.id, pid], |r| r.get(0))
            .optional()?;
        let Some(replica) = replica else {
            return Err(StoreError::NotFound(format!(
                "workload `{key}` has no process {pid}"
            )));
        };
        let remaining: i64 = tx
            .prepare_cached(
                "SELECT count(*) FROM replicas WHERE workload_id = ?1 AND pid IS NOT NULL",
            )?
            .query_row([cur.id], |r| r.get(0))?;
        events::append(
            &tx,
            now,
            "replica-exited",
            Some(key),
            &format!("replica {replica} (pid {pid}) exited, {remaining} still running"),
        )?;
        tx.commit()?;
        // A count of rows fits usize.
        Ok(usize::try_from(remaining).unwrap_or(usize::MAX))
    }

    /// Back to Pending after a preemption, a lost node or a failed start, keeping its
    /// checkpoint; `attempts` counts it. A workload whose cancel was requested ends as
    /// cancelled instead: it is stopped, which is all the cancel waited for.
    pub fn requeue(
        &self,
        key: &WorkloadKey,
        reason: &str,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.transition(key, now, |tx, cur| {
            expect(
                cur,
                "requeue",
                &[Phase::Starting, Phase::Running, Phase::Checkpointing],
            )?;
            if cur.record.cancel_requested_at.is_some() {
                end(tx, cur.id, &EndReason::Cancelled, now)?;
                return Ok(Some((
                    "cancelled",
                    format!("stopped ({reason}) after a cancel request"),
                )));
            }
            tx.prepare_cached(
                "UPDATE workloads SET phase = 'pending', started_at = NULL, bindings = '[]',
                 signalled_at = NULL, grace_deadline = NULL, attempts = attempts + 1
                 WHERE id = ?1",
            )?
            .execute([cur.id])?;
            tx.prepare_cached("DELETE FROM replicas WHERE workload_id = ?1")?
                .execute([cur.id])?;
            Ok(Some(("requeued", reason.to_string())))
        })
    }

    /// Ends a workload: succeeded, failed or cancelled according to `end`. Only a placed
    /// workload can exit or be lost; a queued one can only be cancelled or rejected.
    pub fn finish(
        &self,
        key: &WorkloadKey,
        end_reason: EndReason,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.transition(key, now, |tx, cur| {
            if !end_reason.may_end_from(cur.record.phase) {
                return Err(illegal(cur, "finish"));
            }
            end(tx, cur.id, &end_reason, now)?;
            Ok(Some((end_reason.phase().as_str(), end_reason.to_string())))
        })
    }

    /// Cancels a workload. A queued one ends at once; one with processes records the request
    /// and stays live until the reconciler has stopped it. Cancelling a cancelled workload
    /// (or one whose cancel is already requested) changes nothing.
    pub fn cancel(&self, key: &WorkloadKey, now: i64) -> Result<WorkloadRecord, StoreError> {
        self.transition(key, now, |tx, cur| match cur.record.phase {
            Phase::Pending => {
                end(tx, cur.id, &EndReason::Cancelled, now)?;
                Ok(Some(("cancelled", "cancelled while pending".to_string())))
            }
            Phase::Cancelled => Ok(None),
            Phase::Starting | Phase::Running | Phase::Checkpointing => {
                if cur.record.cancel_requested_at.is_some() {
                    return Ok(None);
                }
                tx.prepare_cached("UPDATE workloads SET cancel_requested_at = ?2 WHERE id = ?1")?
                    .execute(params![cur.id, now])?;
                Ok(Some((
                    "cancel-requested",
                    format!("cancel requested while {}", cur.record.phase),
                )))
            }
            Phase::Succeeded | Phase::Failed => Err(illegal(cur, "cancel")),
        })
    }

    /// Runs one checked change on `key`'s current record: `change` returns the event to
    /// append (`None` when nothing changed), and the updated record is returned.
    fn transition(
        &self,
        key: &WorkloadKey,
        now: i64,
        change: impl FnOnce(&Connection, &Current) -> Result<Option<(&'static str, String)>, StoreError>,
    ) -> Result<WorkloadRecord, StoreError> {
        let tx = self.write()?;
        let cur = current(&tx, key)?;
        let event = change(&tx, &cur)?;
        if let Some((kind, message)) = event {
            events::append(&tx, now, kind, Some(key), &message)?;
        }
        let record = load(&tx, cur.id)?;
        tx.commit()?;
        Ok(record)
    }

    fn select<P: rusqlite::Params>(
        &self,
        clause: &str,
        params: P,
    ) -> Result<Vec<WorkloadRecord>, StoreError> {
        let tx = self.read()?;
        let mut stmt = tx.prepare_cached(&format!("SELECT {COLUMNS} FROM workloads {clause}"))?;
        let raws = stmt
            .query_map(params, RawRow::read)?
            .collect::<Result<Vec<_>, _>>()?;
        raws.into_iter().map(|raw| raw.decode(&tx)).collect()
    }
}

/// A key's current record with its row id, read inside a transition's transaction.
pub(super) struct Current {
    pub(super) id: i64,
    pub(super) record: WorkloadRecord,
}

pub(super) fn current(conn: &Connection, key: &WorkloadKey) -> Result<Current, StoreError> {
    let raw = conn
        .query_row(
            &format!("SELECT {COLUMNS} FROM workloads {CURRENT}"),
            [&key.tenant, &key.name],
            RawRow::read,
        )
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("workload `{key}`")))?;
    let id = raw.id;
    Ok(Current {
        id,
        record: raw.decode(conn)?,
    })
}

/// Pending → Starting on `cur` within the caller's transaction; returns the event to append.
pub(super) fn set_starting(
    tx: &Connection,
    cur: &Current,
    bindings: &[Binding],
) -> Result<(&'static str, String), StoreError> {
    expect(cur, "start", &[Phase::Pending])?;
    tx.prepare_cached("UPDATE workloads SET phase = 'starting', bindings = ?2 WHERE id = ?1")?
        .execute(params![cur.id, to_json("bindings", bindings)?])?;
    tx.prepare_cached("DELETE FROM replicas WHERE workload_id = ?1")?
        .execute([cur.id])?;
    let nodes = bindings.iter().map(|b| b.node.as_str());
    Ok(("starting", format!("placed on {}", join_unique(nodes))))
}

/// Starting → Running on `cur` with its replicas' processes, within the caller's
/// transaction; returns the event to append.
pub(super) fn set_running(
    tx: &Connection,
    cur: &Current,
    replicas: &[ReplicaProcess],
    now: i64,
) -> Result<(&'static str, String), StoreError> {
    expect(cur, "mark running", &[Phase::Starting])?;
    tx.prepare_cached("UPDATE workloads SET phase = 'running', started_at = ?2 WHERE id = ?1")?
        .execute(params![cur.id, now])?;
    tx.prepare_cached("DELETE FROM replicas WHERE workload_id = ?1")?
        .execute([cur.id])?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO replicas (workload_id, replica, pid, devices) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for r in replicas {
        insert.execute(params![
            cur.id,
            r.replica,
            r.pid,
            to_json("replica devices", &r.devices)?
        ])?;
    }
    let pids: Vec<String> = replicas
        .iter()
        .filter_map(|r| r.pid.map(|p| p.to_string()))
        .collect();
    let message = if pids.is_empty() {
        format!("{} replicas, no processes", replicas.len())
    } else {
        format!("{} replicas, pids {}", replicas.len(), pids.join(","))
    };
    Ok(("running", message))
}

fn load(conn: &Connection, id: i64) -> Result<WorkloadRecord, StoreError> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM workloads WHERE id = ?1"),
        [id],
        RawRow::read,
    )?
    .decode(conn)
}

fn expect(cur: &Current, action: &'static str, from: &[Phase]) -> Result<(), StoreError> {
    if from.contains(&cur.record.phase) {
        Ok(())
    } else {
        Err(illegal(cur, action))
    }
}

fn illegal(cur: &Current, action: &'static str) -> StoreError {
    StoreError::IllegalTransition {
        workload: cur.record.key().to_string(),
        action,
        from: cur.record.phase,
    }
}

/// Writes the end of a workload; the replicas stay as the record of what ran.
fn end(conn: &Connection, id: i64, reason: &EndReason, now: i64) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE workloads SET phase = ?2, ended_at = ?3, end_reason = ?4,
         signalled_at = NULL, grace_deadline = NULL WHERE id = ?1",
    )?
    .execute(params![
        id,
        reason.phase().as_str(),
        now,
        to_json("end reason", reason)?
    ])?;
    Ok(())
}

fn join_unique<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let set: std::collections::BTreeSet<&str> = items.collect();
    if set.is_empty() {
        return "no node".to_string();
    }
    set.into_iter().collect::<Vec<_>>().join(", ")
}

/// A row as SQLite returns it, before the JSON and enumerations are checked.
struct RawRow {
    id: i64,
    name: String,
    tenant: String,
    spec: String,
    origin: String,
    phase: String,
    submitted_at: i64,
    started_at: Option<i64>,
    bindings: String,
    checkpoint_dir: Option<String>,
    last_checkpoint_at: Option<i64>,
    signalled_at: Option<i64>,
    grace_deadline: Option<i64>,
    cancel_requested_at: Option<i64>,
    attempts: i64,
    ended_at: Option<i64>,
    end_reason: Option<String>,
}

impl RawRow {
    fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
        Ok(RawRow {
            id: r.get(0)?,
            name: r.get(1)?,
            tenant: r.get(2)?,
            spec: r.get(3)?,
            origin: r.get(4)?,
            phase: r.get(5)?,
            submitted_at: r.get(6)?,
            started_at: r.get(7)?,
            bindings: r.get(8)?,
            checkpoint_dir: r.get(9)?,
            last_checkpoint_at: r.get(10)?,
            signalled_at: r.get(11)?,
            grace_deadline: r.get(12)?,
            cancel_requested_at: r.get(13)?,
            attempts: r.get(14)?,
            ended_at: r.get(15)?,
            end_reason: r.get(16)?,
        })
    }

    fn decode(self, conn: &Connection) -> Result<WorkloadRecord, StoreError> {
        let id = self.id;
        let corrupt = |column: &'static str, value: String| StoreError::CorruptValue {
            table: TABLE,
            column,
            row: id,
            value,
        };
        let origin = Origin::parse(&self.origin).ok_or_else(|| corrupt("origin", self.origin))?;
        let phase = Phase::parse(&self.phase).ok_or_else(|| corrupt("phase", self.phase))?;
        let attempts = u32::try_from(self.attempts)
            .map_err(|_| corrupt("attempts", self.attempts.to_string()))?;
        let end = self
            .end_reason
            .map(|text| from_json(TABLE, "end_reason", id, &text))
            .transpose()?;
        Ok(WorkloadRecord {
            name: self.name,
            tenant: self.tenant,
            spec: from_json(TABLE, "spec", id, &self.spec)?,
            origin,
            phase,
            submitted_at: self.submitted_at,
            started_at: self.started_at,
            bindings: from_json(TABLE, "bindings", id, &self.bindings)?,
            replicas: replicas(conn, id)?,
            checkpoint_dir: self.checkpoint_dir,
            last_checkpoint_at: self.last_checkpoint_at,
            signalled_at: self.signalled_at,
            grace_deadline: self.grace_deadline,
            cancel_requested_at: self.cancel_requested_at,
            attempts,
            ended_at: self.ended_at,
            end,
        })
    }
}

fn replicas(conn: &Connection, workload_id: i64) -> Result<Vec<ReplicaProcess>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT replica, pid, devices FROM replicas WHERE workload_id = ?1 ORDER BY replica",
    )?;
    let rows = stmt
        .query_map([workload_id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, Option<i64>>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|(replica, pid, devices)| {
            let corrupt = |column: &'static str, value: i64| StoreError::CorruptValue {
                table: "replicas",
                column,
                row: workload_id,
                value: value.to_string(),
            };
            Ok(ReplicaProcess {
                replica: u32::try_from(replica).map_err(|_| corrupt("replica", replica))?,
                pid: pid
                    .map(|p| u32::try_from(p).map_err(|_| corrupt("pid", p)))
                    .transpose()?,
                devices: from_json("replicas", "devices", workload_id, &devices)?,
            })
        })
        .collect()
}

/// Inserts a submitted workload and its `submitted` event inside `conn`'s transaction.
/// `Conflict` if a live workload of its tenant has that name; nothing is written then.
pub(super) fn insert_submission(
    conn: &Connection,
    name: &str,
    spec: &WorkloadSpec,
    origin: Origin,
    now: i64,
) -> Result<WorkloadRecord, StoreError> {
    let live: Option<i64> = conn
        .prepare_cached(
            "SELECT id FROM workloads WHERE tenant = ?1 AND name = ?2 AND ended_at IS NULL",
        )?
        .query_row([spec.tenant.as_str(), name], |r| r.get(0))
        .optional()?;
    if live.is_some() {
        return Err(StoreError::Conflict(format!(
            "workload {name:?} of tenant {:?} exists and has not ended",
            spec.tenant
        )));
    }
    let key = WorkloadKey::new(&spec.tenant, name);
    conn.prepare_cached(
        "INSERT INTO workloads (name, tenant, spec, origin, phase, submitted_at)
         VALUES (?1, ?2, ?3, ?4, 'pending', ?5)",
    )?
    .execute(params![
        name,
        spec.tenant,
        to_json("workload spec", spec)?,
        origin.as_str(),
        now
    ])?;
    let id = conn.last_insert_rowid();
    events::append(
        conn,
        now,
        "submitted",
        Some(&key),
        &format!("{} by tenant {}", origin.as_str(), spec.tenant),
    )?;
    load(conn, id)
}

/// How many workloads submitted through the API for `tenant` have not ended.
pub(super) fn count_live_submitted(conn: &Connection, tenant: &str) -> Result<usize, StoreError> {
    let n: i64 = conn
        .prepare_cached(
            "SELECT count(*) FROM workloads
             WHERE tenant = ?1 AND origin = 'submitted' AND ended_at IS NULL",
        )?
        .query_row([tenant], |r| r.get(0))?;
    // A count of rows fits usize.
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}
