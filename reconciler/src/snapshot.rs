//! The fleet as the solver sees it: what the driver observed plus the workloads the service
//! tracks, as a [`ClusterStateSpec`], the same document `tessera plan` reads in CI (the service
//! exports it at `GET /state`).

use jiff::Timestamp;
use tessera_compiler::model::{
    Binding, ClusterStateSpec, PendingWorkload, RunningWorkload, WorkloadSpec,
};

use crate::driver::Observation;
use crate::store::carried::Carried;

/// One workload the service tracks, as the snapshot needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracked {
    pub name: String,
    pub spec: WorkloadSpec,
    pub submitted_at: Timestamp,
    /// `Some` while it holds devices (running, starting or checkpointing).
    pub running: Option<RunningFacts>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunningFacts {
    pub bindings: Vec<Binding>,
    pub started_at: Timestamp,
    pub last_checkpoint_at: Option<Timestamp>,
}

/// The snapshot at `now`. Running workloads by tenant and name, pending ones in submission order (then by
/// name, so that equal instants still give one order), with what the last decision carried.
pub fn cluster_state(
    observation: &Observation,
    tracked: &[Tracked],
    carried: &Carried,
    now: i64,
) -> ClusterStateSpec {
    let mut running: Vec<RunningWorkload> = tracked
        .iter()
        .filter_map(|t| {
            let r = t.running.as_ref()?;
            Some(RunningWorkload {
                name: t.name.clone(),
                // The service keeps the spec as submitted (a committed workload follows its
                // file); a gang admitted short of its replicas runs, and is exported, as what
                // it holds.
                spec: t.spec.running_as(r.bindings.len() as u32),
                bindings: r.bindings.clone(),
                started_at: r.started_at,
                last_checkpoint_at: r.last_checkpoint_at,
            })
        })
        .collect();
    // By tenant, then name: the order the solver reads running work in (its key), so that its
    // own sort of a cycle's snapshot finds the list ordered (a pass, not a sort of 65,000
    // workloads at 50,000 GPUs).
    running.sort_by(|a, b| (&a.spec.tenant, &a.name).cmp(&(&b.spec.tenant, &b.name)));
    let mut pending: Vec<(&Tracked, PendingWorkload)> = tracked
        .iter()
        .filter(|t| t.running.is_none())
        .map(|t| {
            (
                t,
                PendingWorkload {
                    name: t.name.clone(),
                    spec: t.spec.clone(),
                    submitted_at: t.submitted_at,
                },
            )
        })
        .collect();
    pending.sort_by(|(a, _), (b, _)| (a.submitted_at, &a.name).cmp(&(b.submitted_at, &b.name)));
    ClusterStateSpec {
        observed_at: unix(now),
        nodes: observation.nodes.clone(),
        running,
        pending: pending.into_iter().map(|(_, p)| p).collect(),
        usage: carried.usage.clone(),
        reservations: carried.reservations.clone(),
        reconfigurations: carried.reconfigurations.clone(),
    }
}

/// Unix seconds as RFC 3339 UTC (`2026-11-23T15:04:33Z`), as the compiler writes instants.
pub fn rfc3339(unix: i64) -> String {
    tessera_compiler::units::format_rfc3339(self::unix(unix))
}

/// Unix seconds, as the store keeps instants in its integer columns, as an instant.
pub fn unix(seconds: i64) -> Timestamp {
    tessera_compiler::units::unix(seconds)
}

/// The current instant as Unix seconds: the one clock read of a cycle.
pub fn now() -> i64 {
    tessera_compiler::units::now().as_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_446_273), "2026-11-23T15:04:33Z");
        assert_eq!(rfc3339(-5), "1969-12-31T23:59:55Z");
    }
}

/// `spec` as a whole `ClusterState` document, as `GET /state` writes it and `tessera plan
/// --state` reads it; serialized from the snapshot itself, with no copy of it.
pub fn document(spec: &ClusterStateSpec) -> Document<'_> {
    Document {
        api_version: tessera_compiler::model::API_VERSION,
        kind: "ClusterState",
        metadata: DocumentMetadata { name: "observed" },
        spec,
    }
}

/// See [`document`].
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Document<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: DocumentMetadata,
    spec: &'a ClusterStateSpec,
}

#[derive(Debug, serde::Serialize)]
struct DocumentMetadata {
    name: &'static str,
}
