use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::WorkloadSpec;
use jiff::Timestamp;

use crate::units::{Bytes, Gpus, Millicores, Rfc3339};

/// A snapshot of the fleet: nodes and their GPUs as observed, running workloads with their
/// bindings, and the pending queue. The reconciler exports it; `tessera plan` reads it in CI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterStateSpec {
    /// When the snapshot was taken, RFC 3339.
    #[serde(with = "crate::units::rfc3339")]
    #[schemars(with = "Rfc3339")]
    pub observed_at: Timestamp,
    #[serde(default)]
    pub nodes: Vec<Node>,
    /// Workloads running now.
    #[serde(default)]
    pub running: Vec<RunningWorkload>,
    /// Workloads waiting, in submission order.
    #[serde(default)]
    pub pending: Vec<PendingWorkload>,
    /// Each tenant's decayed past usage, kept by the reconciler (fair share over time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageRecord>,
    /// Capacity held for waiting gangs, as the last decision left it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<ReservationRecord>,
    /// Geometry changes that took something away from a GPU in the hour before the snapshot:
    /// what its pool's `reconfiguration.maxPerGpuPerHour` has spent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reconfigurations: Vec<ReconfigurationRecord>,
}

/// Decayed usage per tenant as of one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UsageRecord {
    /// The instant the figures are decayed to, RFC 3339.
    #[serde(with = "crate::units::rfc3339")]
    #[schemars(with = "Rfc3339")]
    pub as_of: Timestamp,
    /// By tenant name; a tenant's figures include its descendants', decayed with its own
    /// half-life.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantUsageRecord>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantUsageRecord {
    /// Everything the tenant ran.
    #[serde(default)]
    pub used: UsageHours,
    /// The part above its guarantee, pool by pool: what fair share weighs.
    #[serde(default)]
    pub borrowed: UsageHours,
}

/// Decayed resource-hours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UsageHours {
    /// GPU-hours, weighted by model.
    #[serde(default)]
    #[schemars(range(min = 0.0))]
    pub gpu_hours: f64,
    /// CPU core-hours.
    #[serde(default)]
    #[schemars(range(min = 0.0))]
    pub cpu_hours: f64,
    /// Memory GiB-hours.
    #[serde(default)]
    #[schemars(range(min = 0.0))]
    pub memory_gib_hours: f64,
}

/// Capacity a waiting gang holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReservationRecord {
    /// The waiting workload (a pending one), as `tenant/name`: workload names are per tenant.
    /// A bare name, as older snapshots have, means the one workload of that name.
    pub workload: String,
    pub pool: String,
    /// The nodes the gang will land on; their GPUs, as they free up, are held for it.
    #[schemars(length(min = 1))]
    pub nodes: Vec<String>,
    /// When the reservation was first made, RFC 3339.
    #[serde(with = "crate::units::rfc3339")]
    #[schemars(with = "Rfc3339")]
    pub since: Timestamp,
}

/// One geometry change of one GPU that destroyed instances or switched its MIG mode. It counts
/// against the GPU's pool budget (`reconfiguration.maxPerGpuPerHour`) for an hour after `at`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReconfigurationRecord {
    /// The node, as listed under `nodes`.
    pub node: String,
    /// The GPU's NVML device index on the node.
    pub gpu: u32,
    /// When the change was made, RFC 3339.
    #[serde(with = "crate::units::rfc3339")]
    #[schemars(with = "Rfc3339")]
    pub at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Node {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The pool the node belongs to.
    pub pool: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// NVLink domain id; defaults to the node itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<String>,
    pub cpu: Millicores,
    pub memory: Bytes,
    #[serde(default)]
    pub health: Health,
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    /// NVML device index on the node.
    pub index: u32,
    /// `GPU-...` as NVML reports it.
    #[schemars(regex(pattern = r"^GPU-[0-9a-fA-F-]+$"))]
    pub uuid: String,
    pub model: String,
    #[serde(default)]
    pub health: Health,
    /// MIG mode now, and the mode pending until the next GPU reset.
    #[serde(default)]
    pub mig: MigState,
    /// GPU instances that exist now, with their placements.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<MigInstance>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    #[default]
    Healthy,
    Degraded,
    Lost,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigState {
    #[serde(default)]
    pub enabled: bool,
    /// The mode a reset would switch to, when it differs from `enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigInstance {
    /// Profile name of the GPU's model (`3g.40gb`) or profile ID.
    pub profile: String,
    /// First memory slice (0-7).
    #[schemars(range(max = 7))]
    pub start: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^MIG-[0-9a-fA-F-]+$"))]
    pub uuid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunningWorkload {
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"))]
    pub name: String,
    pub spec: WorkloadSpec,
    /// One binding per replica.
    pub bindings: Vec<Binding>,
    /// When it started, RFC 3339.
    #[serde(with = "crate::units::rfc3339")]
    #[schemars(with = "Rfc3339")]
    pub started_at: Timestamp,
    /// The last checkpoint, if the workload has taken one; work since then is lost on preemption.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::units::rfc3339::option"
    )]
    #[schemars(with = "Option<Rfc3339>")]
    pub last_checkpoint_at: Option<Timestamp>,
}

/// Where one replica runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Binding {
    pub node: String,
    /// GPU indices on the node: whole GPUs, or the one GPU holding the instance or share.
    pub gpus: Vec<u32>,
    /// For a MIG replica: the first memory slice of its instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_start: Option<u8>,
    /// For an MPS or time-slice replica: its share of the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<Gpus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingWorkload {
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"))]
    pub name: String,
    pub spec: WorkloadSpec,
    /// When it was submitted, RFC 3339: the queue's order among equals.
    #[serde(with = "crate::units::rfc3339")]
    #[schemars(with = "Rfc3339")]
    pub submitted_at: Timestamp,
}
