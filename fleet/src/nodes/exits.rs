//! Which workloads ended, from what the agents report in `observed`: pure, so that the rule is
//! tested without etcd.
//!
//! A workload ended when every replica of its current attempt that it is bound to has been
//! reported `Exited` by the nodes it runs on. A report is matched to the store's record by
//! workload and attempt, so an exit of an earlier attempt (a node that was away, a report the
//! view still holds) is never taken for the current run's; a record that ended or was requeued
//! no longer matches, so a report read twice ends nothing twice.

use std::collections::{BTreeMap, BTreeSet};

use tessera_reconciler::runtime::ExitStatus;
use tessera_reconciler::store::WorkloadRecord;

use crate::protocol::{ReplicaState, RunState};

/// One workload the nodes report ended, with how.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    pub record: WorkloadRecord,
    pub status: ExitStatus,
    /// The nodes that report it, whose agents are told to forget it.
    pub nodes: Vec<String>,
}

/// Per replica of one (workload, attempt): the node reporting it, and how it ended (`None`
/// while it runs).
type Replicas<'a> = BTreeMap<u32, (&'a str, Option<&'a str>)>;

/// The records of `live` whose every replica the nodes (`reports`: node, replica state)
/// report exited at the record's attempt. The status is the first failure's (by replica), or
/// success when every replica succeeded.
pub fn ended<'a>(
    live: &[WorkloadRecord],
    reports: impl IntoIterator<Item = (&'a str, &'a ReplicaState)>,
) -> Vec<Ended> {
    let mut seen: BTreeMap<(&str, u32), Replicas<'_>> = BTreeMap::new();
    for (node, state) in reports {
        let how = match &state.state {
            RunState::Running => None,
            RunState::Exited { status } => Some(status.as_str()),
        };
        seen.entry((state.workload.as_str(), state.attempt))
            .or_default()
            .insert(state.replica, (node, how));
    }
    let mut out = Vec::new();
    for record in live {
        if !record.phase.holds_placement() || record.bindings.is_empty() {
            continue;
        }
        let key = record.key().to_string();
        let Some(replicas) = seen.get(&(key.as_str(), record.attempts)) else {
            continue;
        };
        let all = (0..record.bindings.len() as u32).all(|r| {
            replicas.get(&r).is_some_and(|(node, how)| {
                how.is_some() && *node == record.bindings[r as usize].node
            })
        });
        if !all {
            continue;
        }
        let statuses: Vec<ExitStatus> = replicas
            .values()
            .filter_map(|(_, how)| *how)
            .map(|how| how.parse().unwrap_or(ExitStatus::Unknown))
            .collect();
        let status = statuses
            .iter()
            .copied()
            .find(|s| *s != ExitStatus::Code(0))
            .unwrap_or(ExitStatus::Code(0));
        let nodes: BTreeSet<String> = replicas.values().map(|(n, _)| n.to_string()).collect();
        out.push(Ended {
            record: record.clone(),
            status,
            nodes: nodes.into_iter().collect(),
        });
    }
    out
}

/// How many replicas of `record`'s current attempt the nodes (`reports`) report running on
/// the nodes it is bound to.
pub fn alive<'a>(
    record: &WorkloadRecord,
    reports: impl IntoIterator<Item = (&'a str, &'a ReplicaState)>,
) -> usize {
    let key = record.key().to_string();
    reports
        .into_iter()
        .filter(|(node, s)| {
            s.workload == key
                && s.attempt == record.attempts
                && s.state == RunState::Running
                && record
                    .bindings
                    .get(s.replica as usize)
                    .is_some_and(|b| b.node == *node)
        })
        .count()
}

/// Every (workload, attempt) some node reports exited: what [`ended`] has looked at.
pub fn exited<'a>(
    reports: impl IntoIterator<Item = (&'a str, &'a ReplicaState)>,
) -> BTreeSet<(String, u32)> {
    reports
        .into_iter()
        .filter(|(_, s)| matches!(s.state, RunState::Exited { .. }))
        .map(|(_, s)| (s.workload.clone(), s.attempt))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_compiler::model::Binding;
    use tessera_reconciler::store::Phase;

    fn record(name: &str, phase: Phase, attempts: u32, nodes: &[&str]) -> WorkloadRecord {
        let spec: tessera_compiler::model::WorkloadSpec =
            serde_json::from_value(serde_json::json!({
                "tenant": "t", "sloClass": "batch", "gpu": {"migProfile": "1g.10gb"}
            }))
            .unwrap_or_else(|e| panic!("spec: {e}"));
        WorkloadRecord {
            phase,
            started_at: Some(2),
            bindings: nodes
                .iter()
                .map(|n| Binding {
                    node: (*n).into(),
                    gpus: vec![0],
                    mig_start: None,
                    share: None,
                })
                .collect(),
            attempts,
            ..WorkloadRecord::submitted(
                name,
                &spec,
                tessera_reconciler::store::Origin::Submitted,
                1,
            )
        }
    }

    fn state(workload: &str, attempt: u32, replica: u32, exited: Option<&str>) -> ReplicaState {
        ReplicaState {
            workload: workload.into(),
            attempt,
            replica,
            pid: Some(100 + replica),
            state: match exited {
                None => RunState::Running,
                Some(s) => RunState::Exited { status: s.into() },
            },
        }
    }

    #[test]
    fn a_workload_ends_when_every_replica_of_its_attempt_has() {
        let live = [
            record("done", Phase::Running, 0, &["a"]),
            record("gang", Phase::Running, 1, &["a", "b"]),
            record("half", Phase::Running, 0, &["a", "b"]),
            record("old", Phase::Running, 2, &["a"]),
            record("queued", Phase::Pending, 0, &[]),
            record("moved", Phase::Running, 0, &["b"]),
        ];
        let reports = [
            ("a", state("t/done", 0, 0, Some("exit code 0"))),
            ("a", state("t/gang", 1, 0, Some("exit code 0"))),
            ("b", state("t/gang", 1, 1, Some("signal 9"))),
            ("a", state("t/half", 0, 0, Some("exit code 0"))),
            ("b", state("t/half", 0, 1, None)),
            // An earlier attempt's exit is not the current run's.
            ("a", state("t/old", 1, 0, Some("exit code 1"))),
            ("a", state("t/queued", 0, 0, Some("exit code 0"))),
            // Reported by a node the run is not bound to (it ran there before it moved).
            ("a", state("t/moved", 0, 0, Some("exit code 0"))),
        ];
        let found: Vec<(String, ExitStatus, Vec<String>)> =
            ended(&live, reports.iter().map(|(n, s)| (*n, s)))
                .into_iter()
                .map(|e| (e.record.name, e.status, e.nodes))
                .collect();
        assert_eq!(
            found,
            [
                (
                    "done".to_string(),
                    ExitStatus::Code(0),
                    vec!["a".to_string()]
                ),
                (
                    "gang".to_string(),
                    ExitStatus::Signal(9),
                    vec!["a".to_string(), "b".to_string()]
                ),
            ]
        );
    }

    #[test]
    fn the_replicas_alive_are_those_of_the_attempt_on_its_nodes() {
        let gang = record("gang", Phase::Running, 1, &["a", "b"]);
        let reports = [
            ("a", state("t/gang", 1, 0, None)),
            ("b", state("t/gang", 1, 1, Some("exit code 0"))),
            // An earlier attempt, and a replica reported by a node it is not bound to.
            ("a", state("t/gang", 0, 1, None)),
            ("c", state("t/gang", 1, 1, None)),
        ];
        assert_eq!(alive(&gang, reports.iter().map(|(n, s)| (*n, s))), 1);
    }
}
