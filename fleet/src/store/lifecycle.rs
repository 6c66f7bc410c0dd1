//! The workload transitions as pure functions on a record: what the SQLite store does with
//! `UPDATE`s, done here to a record read from etcd before it is written back in one fenced
//! transaction. Each returns the event to append (`None`: nothing changed) or the same
//! [`StoreError`] the SQLite store answers with; the contract suite
//! (`tessera_reconciler::store::contract`) holds the two to the same rules and messages.

use std::collections::BTreeSet;

use tessera_compiler::model::Binding;
use tessera_reconciler::store::{EndReason, Phase, ReplicaProcess, StoreError, WorkloadRecord};

/// An event to append: its kind and message.
pub(super) type Draft = (&'static str, String);

const PLACED: [Phase; 3] = [Phase::Starting, Phase::Running, Phase::Checkpointing];

pub(super) fn mark_starting(
    record: &mut WorkloadRecord,
    bindings: &[Binding],
) -> Result<Option<Draft>, StoreError> {
    expect(record, "start", &[Phase::Pending])?;
    record.phase = Phase::Starting;
    record.bindings = bindings.to_vec();
    record.replicas.clear();
    let nodes: BTreeSet<&str> = bindings.iter().map(|b| b.node.as_str()).collect();
    let placed = if nodes.is_empty() {
        "no node".to_string()
    } else {
        nodes.into_iter().collect::<Vec<_>>().join(", ")
    };
    Ok(Some(("starting", format!("placed on {placed}"))))
}

pub(super) fn mark_running(
    record: &mut WorkloadRecord,
    replicas: &[ReplicaProcess],
    now: i64,
) -> Result<Option<Draft>, StoreError> {
    expect(record, "mark running", &[Phase::Starting])?;
    record.phase = Phase::Running;
    record.started_at = Some(now);
    record.replicas = replicas.to_vec();
    record.replicas.sort_by_key(|r| r.replica);
    let pids: Vec<String> = replicas
        .iter()
        .filter_map(|r| r.pid.map(|p| p.to_string()))
        .collect();
    let message = if pids.is_empty() {
        format!("{} replicas, no processes", replicas.len())
    } else {
        format!("{} replicas, pids {}", replicas.len(), pids.join(","))
    };
    Ok(Some(("running", message)))
}

pub(super) fn mark_checkpointing(
    record: &mut WorkloadRecord,
    grace_deadline: i64,
    now: i64,
) -> Result<Option<Draft>, StoreError> {
    expect(record, "checkpoint", &[Phase::Running])?;
    record.phase = Phase::Checkpointing;
    record.signalled_at = Some(now);
    record.grace_deadline = Some(grace_deadline);
    Ok(Some((
        "checkpointing",
        format!("checkpoint signal sent, stop at {grace_deadline}"),
    )))
}

pub(super) fn record_checkpoint(
    record: &mut WorkloadRecord,
    dir: &str,
    now: i64,
) -> Result<Option<Draft>, StoreError> {
    expect(record, "record a checkpoint", &PLACED)?;
    record.checkpoint_dir = Some(dir.to_string());
    record.last_checkpoint_at = Some(now);
    Ok(Some(("checkpointed", format!("checkpoint in {dir}"))))
}

/// Forgets process `pid`; returns the event and how many replicas still have a process.
pub(super) fn replica_exited(
    record: &mut WorkloadRecord,
    pid: u32,
) -> Result<(Draft, usize), StoreError> {
    expect(record, "record a process exit", &PLACED)?;
    let mut exited = None;
    for r in record.replicas.iter_mut().filter(|r| r.pid == Some(pid)) {
        r.pid = None;
        exited.get_or_insert(r.replica);
    }
    let Some(replica) = exited else {
        return Err(StoreError::NotFound(format!(
            "workload `{}` has no process {pid}",
            record.key()
        )));
    };
    let remaining = record.replicas.iter().filter(|r| r.pid.is_some()).count();
    Ok((
        (
            "replica-exited",
            format!("replica {replica} (pid {pid}) exited, {remaining} still running"),
        ),
        remaining,
    ))
}

pub(super) fn requeue(
    record: &mut WorkloadRecord,
    reason: &str,
    now: i64,
) -> Result<Option<Draft>, StoreError> {
    expect(record, "requeue", &PLACED)?;
    if record.cancel_requested_at.is_some() {
        end(record, EndReason::Cancelled, now);
        return Ok(Some((
            "cancelled",
            format!("stopped ({reason}) after a cancel request"),
        )));
    }
    record.phase = Phase::Pending;
    record.started_at = None;
    record.bindings.clear();
    record.signalled_at = None;
    record.grace_deadline = None;
    record.attempts = record.attempts.saturating_add(1);
    record.replicas.clear();
    Ok(Some(("requeued", reason.to_string())))
}

pub(super) fn finish(
    record: &mut WorkloadRecord,
    end_reason: EndReason,
    now: i64,
) -> Result<Option<Draft>, StoreError> {
    if !end_reason.may_end_from(record.phase) {
        return Err(illegal(record, "finish"));
    }
    let draft = (end_reason.phase().as_str(), end_reason.to_string());
    end(record, end_reason, now);
    Ok(Some(draft))
}

pub(super) fn cancel(record: &mut WorkloadRecord, now: i64) -> Result<Option<Draft>, StoreError> {
    match record.phase {
        Phase::Pending => {
            end(record, EndReason::Cancelled, now);
            Ok(Some(("cancelled", "cancelled while pending".to_string())))
        }
        Phase::Cancelled => Ok(None),
        Phase::Starting | Phase::Running | Phase::Checkpointing => {
            if record.cancel_requested_at.is_some() {
                return Ok(None);
            }
            record.cancel_requested_at = Some(now);
            Ok(Some((
                "cancel-requested",
                format!("cancel requested while {}", record.phase),
            )))
        }
        Phase::Succeeded | Phase::Failed => Err(illegal(record, "cancel")),
    }
}

/// The end of a workload; its replicas stay as the record of what ran.
fn end(record: &mut WorkloadRecord, reason: EndReason, now: i64) {
    record.phase = reason.phase();
    record.ended_at = Some(now);
    record.end = Some(reason);
    record.signalled_at = None;
    record.grace_deadline = None;
}

fn expect(record: &WorkloadRecord, action: &'static str, from: &[Phase]) -> Result<(), StoreError> {
    if from.contains(&record.phase) {
        Ok(())
    } else {
        Err(illegal(record, action))
    }
}

fn illegal(record: &WorkloadRecord, action: &'static str) -> StoreError {
    StoreError::IllegalTransition {
        workload: record.key().to_string(),
        action,
        from: record.phase,
    }
}
