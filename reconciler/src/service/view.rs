//! Workloads as the API shows them: the stored record with every instant in RFC 3339, and what
//! the last decision said about each (its pool, why it waits, when a reservation expects it to
//! start). `GET /v1/workloads` and `tessera get` list [`WorkloadView`]s; `GET
//! /v1/workloads/{name}` and `tessera describe` add the recent events.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{Binding, WorkloadSpec};
use tessera_solver::Decision;
use tessera_solver::decision::{Outcome, PoolReport, TenantUsage, WorkloadDecision};

use jiff::Timestamp;

use crate::snapshot::unix;
use crate::store::{EndReason, Event, Origin, Phase, ReplicaProcess, WorkloadRecord};

/// What the last decision said about one workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The pool it runs or will run in.
    pub pool: Option<String>,
    /// `keep`, `admit`, `preempt` or `pending`.
    pub outcome: &'static str,
    /// Why it waits or was preempted: the reason's kind (`no_capacity`, `quota_exceeded`, ...).
    pub reason: Option<String>,
    /// The solver's sentence for it.
    pub message: Option<String>,
    /// RFC 3339: when the work in the way of its reservation is declared to end.
    pub expected_start: Option<Timestamp>,
    /// While it waits: its place in line (1 is the head of the line) among the waiting workloads, in the order
    /// the decision considered them.
    pub queue_position: Option<QueuePosition>,
    /// When it was decided, where that is not the decision's instant: a workload the
    /// arrival path decided since.
    pub decided_at: Option<Timestamp>,
}

impl Decided {
    /// What `w` says, without its place in line or expected start (the whole decision's).
    fn of(w: &WorkloadDecision) -> Decided {
        let (outcome, reason, message) = match &w.outcome {
            Outcome::Keep { .. } => ("keep", None, None),
            Outcome::Admit { .. } => ("admit", None, None),
            Outcome::Preempt { reason, .. } => (
                "preempt",
                serde_json::to_value(reason).ok().and_then(|v| tag_of(&v)),
                Some(reason.to_string()),
            ),
            Outcome::Pending { reason } => (
                "pending",
                Some(crate::metrics::reason_kind(reason)),
                Some(reason.to_string()),
            ),
        };
        Decided {
            pool: w.pool.clone(),
            outcome,
            reason,
            message,
            expected_start: None,
            queue_position: None,
            decided_at: None,
        }
    }
}

/// A waiting workload's place in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuePosition {
    /// 1 is the first the next decision considers.
    pub position: u32,
    /// Workloads waiting in all, every tenant's.
    pub of: u32,
}

/// The last decision, by workload name.
///
/// Two layers: the full cycle's entries, shared by every copy of the index, and what the
/// arrival path recorded since. The arrival path records into the index the API reads while
/// API calls hold it (`Arc::make_mut` copies it then), so a copy must cost what the arrivals
/// since the full cycle cost, not what the fleet is; the recorded layer is folded into the
/// shared one once it is an eighth of its size, which keeps a copy's cost amortized per
/// arrival.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecisionIndex {
    /// The decision's instant.
    pub at: Timestamp,
    /// The full cycle's entries (and arrivals folded in since).
    decided: Arc<Entries>,
    /// The arrival path's entries since, in place of `decided`'s.
    recorded: Entries,
    /// Each tenant's GPUs in each pool after the decision, against its guarantee and limit
    /// (the fleet page).
    pub usage: Arc<Vec<TenantUsage>>,
    /// Each pool's capacity and allocation after the decision (the fleet page).
    pub pools: Arc<Vec<PoolReport>>,
}

/// One layer of a [`DecisionIndex`].
#[derive(Debug, Clone, Default, PartialEq)]
struct Entries {
    workloads: BTreeMap<WorkloadKey, Decided>,
    /// Each workload's tenant by its key shown as `tenant/name` (how the solver's sentences
    /// name workloads), to keep other tenants' workloads out of what one tenant reads.
    owners: BTreeMap<String, String>,
}

impl Entries {
    fn insert(&mut self, key: WorkloadKey, decided: Decided) {
        self.owners.insert(key.to_string(), key.tenant.clone());
        self.workloads.insert(key, decided);
    }
}

impl DecisionIndex {
    pub fn of(decision: &Decision) -> DecisionIndex {
        let eta: BTreeMap<&str, Timestamp> = decision
            .reservations
            .iter()
            .filter_map(|r| r.eta.map(|eta| (r.workload.as_str(), eta)))
            .collect();
        let of = u32::try_from(decision.queue.len()).unwrap_or(u32::MAX);
        let place: BTreeMap<&str, QueuePosition> = decision
            .queue
            .iter()
            .zip(1u32..)
            .map(|(name, position)| (name.as_str(), QueuePosition { position, of }))
            .collect();
        let mut entries = Entries::default();
        for w in &decision.workloads {
            let key = WorkloadKey::new(&w.tenant, &w.name);
            let shown = key.to_string();
            let mut decided = Decided::of(w);
            decided.expected_start = eta.get(shown.as_str()).copied();
            decided.queue_position = place.get(shown.as_str()).copied();
            entries.insert(key, decided);
        }
        DecisionIndex {
            at: decision.now,
            decided: Arc::new(entries),
            recorded: Entries::default(),
            usage: Arc::new(decision.usage.clone()),
            pools: Arc::new(decision.pools.clone()),
        }
    }

    /// Records what the arrival path decided for `w` at `at`, in place of what the last
    /// decision said. A waiting arrival's place in line and a reservation's expected start
    /// are the full cycle's to give: they are left out until it runs.
    pub fn record(&mut self, w: &WorkloadDecision, at: Timestamp) {
        let mut decided = Decided::of(w);
        decided.decided_at = Some(at);
        self.insert_recorded(WorkloadKey::new(&w.tenant, &w.name), decided);
    }

    fn insert_recorded(&mut self, key: WorkloadKey, decided: Decided) {
        self.recorded.insert(key, decided);
        if self.recorded.workloads.len() * 8 > self.decided.workloads.len().max(64) {
            let recorded = std::mem::take(&mut self.recorded);
            let decided = Arc::make_mut(&mut self.decided);
            decided.workloads.extend(recorded.workloads);
            decided.owners.extend(recorded.owners);
        }
    }

    /// What the index says about `key`.
    pub fn workload(&self, key: &WorkloadKey) -> Option<&Decided> {
        self.recorded
            .workloads
            .get(key)
            .or_else(|| self.decided.workloads.get(key))
    }

    /// Every workload the index speaks of with what it says, in key order.
    pub fn workloads(&self) -> impl Iterator<Item = (&WorkloadKey, &Decided)> {
        let mut decided = self.decided.workloads.iter().peekable();
        let mut recorded = self.recorded.workloads.iter().peekable();
        std::iter::from_fn(move || match (decided.peek(), recorded.peek()) {
            (Some((a, _)), Some((b, _))) => match a.cmp(b) {
                std::cmp::Ordering::Less => decided.next(),
                std::cmp::Ordering::Equal => {
                    decided.next();
                    recorded.next()
                }
                std::cmp::Ordering::Greater => recorded.next(),
            },
            (Some(_), None) => decided.next(),
            (None, _) => recorded.next(),
        })
    }

    /// The tenant of the workload shown as `tenant/name`.
    fn owner(&self, shown: &str) -> Option<&str> {
        self.recorded
            .owners
            .get(shown)
            .or_else(|| self.decided.owners.get(shown))
            .map(String::as_str)
    }

    /// `message` as tenant `viewer` may read it: the solver's sentences name workloads in
    /// backticks (the one preempting, the protected ones, a reservation's gang), and another
    /// tenant's workload is not named to it.
    pub fn redact(&self, message: &str, viewer: &str) -> String {
        let parts: Vec<&str> = message.split('`').collect();
        let mut out = String::with_capacity(message.len());
        for (i, part) in parts.iter().enumerate() {
            // Odd parts are quoted, unless the last backtick is unpaired.
            let quoted = i % 2 == 1;
            let closed = i + 1 < parts.len();
            if !quoted {
                out.push_str(part);
            } else if closed && self.owner(part).is_some_and(|o| o != viewer) {
                out.push_str("(another tenant's workload)");
            } else {
                out.push('`');
                out.push_str(part);
                if closed {
                    out.push('`');
                }
            }
        }
        out
    }
}

/// The variant of a serialised enum: a unit variant's string, or an internally tagged one's
/// `kind`.
fn tag_of(value: &serde_json::Value) -> Option<String> {
    value
        .as_str()
        .or_else(|| value.get("kind").and_then(|k| k.as_str()))
        .map(str::to_string)
}

/// One workload for the API.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadView {
    pub name: String,
    pub tenant: String,
    pub slo_class: String,
    pub origin: Origin,
    pub phase: Phase,
    /// The pool it runs in, will run in, or asked for.
    pub pool: Option<String>,
    /// What it asks for, e.g. `2x4` (replicas × GPUs), `1x1g.10gb`, `1x0.25`.
    pub gpus: String,
    /// While it waits: the kind of reason the last decision gave, and its sentence.
    pub reason: Option<String>,
    pub message: Option<String>,
    /// RFC 3339: a waiting gang's reservation's expected start, when the work in its way
    /// declares when it ends.
    pub expected_start: Option<Timestamp>,
    /// While it waits: its place in line in the last decision.
    pub queue_position: Option<QueuePosition>,
    /// RFC 3339 of the decision `reason` comes from.
    pub decided_at: Option<Timestamp>,
    pub submitted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    pub end: Option<EndReason>,
    /// How it ended, in words.
    pub end_message: Option<String>,
    pub cancel_requested_at: Option<Timestamp>,
    /// When it was sent its checkpoint signal, and when it is stopped (checkpointing only).
    pub signalled_at: Option<Timestamp>,
    pub grace_deadline: Option<Timestamp>,
    pub attempts: u32,
    pub checkpoint_dir: Option<String>,
    pub last_checkpoint_at: Option<Timestamp>,
    pub bindings: Vec<Binding>,
    pub replicas: Vec<ReplicaProcess>,
    pub spec: WorkloadSpec,
    /// The most recent events of workloads of this tenant and name, oldest first (one workload
    /// only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<EventView>>,
}

/// One event for the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    pub id: i64,
    pub at: Timestamp,
    pub kind: String,
    pub message: String,
}

impl From<Event> for EventView {
    fn from(e: Event) -> EventView {
        EventView {
            id: e.id,
            at: unix(e.at),
            kind: e.kind,
            message: e.message,
        }
    }
}

impl WorkloadView {
    /// `record` as shown to `viewer` (a tenant, or `None` for the operator), with what
    /// `decisions` says about it when it has not ended (an ended workload's last decision is
    /// history, not a reason).
    pub fn for_viewer(
        record: WorkloadRecord,
        decisions: Option<&DecisionIndex>,
        viewer: Option<&str>,
    ) -> WorkloadView {
        let mut view = WorkloadView::of(record, decisions);
        if let (Some(d), Some(viewer), Some(message)) = (decisions, viewer, &view.message) {
            view.message = Some(d.redact(message, viewer));
        }
        view
    }

    /// `record` as the operator sees it.
    pub fn of(record: WorkloadRecord, decisions: Option<&DecisionIndex>) -> WorkloadView {
        let decided = decisions
            .filter(|_| !record.phase.is_ended())
            .and_then(|d| d.workload(&record.key()).map(|w| (d, w)));
        let pool = decided
            .and_then(|(_, w)| w.pool.clone())
            .or_else(|| record.spec.pool.clone());
        // The store keeps Unix seconds; the API shows instants.
        let at = |t: Option<i64>| t.map(unix);
        WorkloadView {
            gpus: gpus(&record.spec),
            slo_class: record.spec.slo_class.clone(),
            pool,
            reason: decided.and_then(|(_, w)| w.reason.clone()),
            message: decided.and_then(|(_, w)| w.message.clone()),
            expected_start: decided.and_then(|(_, w)| w.expected_start),
            queue_position: decided.and_then(|(_, w)| w.queue_position),
            decided_at: decided.map(|(d, w)| w.decided_at.unwrap_or(d.at)),
            submitted_at: unix(record.submitted_at),
            started_at: at(record.started_at),
            ended_at: at(record.ended_at),
            end_message: record.end.as_ref().map(ToString::to_string),
            end: record.end,
            cancel_requested_at: at(record.cancel_requested_at),
            signalled_at: at(record.signalled_at),
            grace_deadline: at(record.grace_deadline),
            attempts: record.attempts,
            checkpoint_dir: record.checkpoint_dir,
            last_checkpoint_at: at(record.last_checkpoint_at),
            bindings: record.bindings,
            replicas: record.replicas,
            name: record.name,
            tenant: record.tenant,
            origin: record.origin,
            phase: record.phase,
            spec: record.spec,
            events: None,
        }
    }
}

/// `replicas x per-replica request`.
fn gpus(spec: &WorkloadSpec) -> String {
    let each = if let Some(n) = spec.gpu.count {
        n.to_string()
    } else if let Some(p) = &spec.gpu.mig_profile {
        p.clone()
    } else if let Some(f) = spec.gpu.fraction {
        format!("{f}")
    } else {
        "-".to_string()
    };
    format!("{}x{each}", spec.replicas)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> DecisionIndex {
        DecisionIndex {
            decided: Arc::new(Entries {
                owners: [("a/mine", "a"), ("b/theirs", "b")]
                    .into_iter()
                    .map(|(w, t)| (w.to_string(), t.to_string()))
                    .collect(),
                ..Entries::default()
            }),
            ..DecisionIndex::default()
        }
    }

    fn decided(outcome: &'static str, n: u16) -> Decided {
        Decided {
            pool: None,
            outcome,
            reason: None,
            message: Some(n.to_string()),
            expected_start: None,
            queue_position: None,
            decided_at: None,
        }
    }

    proptest::proptest! {
        /// The two layers read as one map with the arrival path's entries written over the
        /// full cycle's, however many are folded in, and a copy taken between records keeps
        /// what it read.
        #[test]
        fn the_recorded_layer_reads_as_entries_written_over_the_decision(
            full in proptest::collection::btree_set((0u8..4, 0u16..200), 0..150),
            recorded in proptest::collection::vec((0u8..4, 0u16..300), 0..200),
        ) {
            let key = |(t, n): (u8, u16)| WorkloadKey::new(format!("t{t}"), format!("w{n}"));
            let mut expected: BTreeMap<WorkloadKey, Decided> = full
                .iter()
                .map(|&(t, n)| (key((t, n)), decided("keep", n)))
                .collect();
            let mut index = DecisionIndex::default();
            for (k, d) in &expected {
                Arc::make_mut(&mut index.decided).insert(k.clone(), d.clone());
            }
            let mut copies = Vec::new();
            for (i, &(t, n)) in recorded.iter().enumerate() {
                let d = decided("admit", n.wrapping_add(i as u16));
                index.insert_recorded(key((t, n)), d.clone());
                expected.insert(key((t, n)), d);
                if i % 37 == 0 {
                    copies.push((index.clone(), expected.clone()));
                }
            }
            copies.push((index, expected));
            for (index, expected) in &copies {
                let read: Vec<(&WorkloadKey, &Decided)> = index.workloads().collect();
                let want: Vec<(&WorkloadKey, &Decided)> = expected.iter().collect();
                proptest::prop_assert_eq!(read, want);
                for (k, d) in expected {
                    proptest::prop_assert_eq!(index.workload(k), Some(d));
                    proptest::prop_assert_eq!(index.owner(&k.to_string()), Some(k.tenant.as_str()));
                }
                proptest::prop_assert_eq!(index.workload(&key((9, 0))), None);
            }
        }
    }

    #[test]
    fn another_tenants_workload_is_not_named_to_a_tenant() {
        let d = index();
        assert_eq!(
            d.redact("preempted for `b/theirs` of higher priority 5", "a"),
            "preempted for (another tenant's workload) of higher priority 5"
        );
        assert_eq!(
            d.redact("`a/mine` and `b/theirs` in pool `train`", "a"),
            "`a/mine` and (another tenant's workload) in pool `train`"
        );
        assert_eq!(
            d.redact("`a/mine` and `b/theirs` in pool `train`", "b"),
            "(another tenant's workload) and `b/theirs` in pool `train`"
        );
        assert_eq!(d.redact("unpaired `b/theirs", "a"), "unpaired `b/theirs");
        assert_eq!(d.redact("no quotes", "a"), "no quotes");
        assert_eq!(d.redact("", "a"), "");
    }
}
