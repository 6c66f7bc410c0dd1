use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::units::{Bytes, Duration, Millicores};

/// A set of identical nodes and how their GPUs are shared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolSpec {
    /// The GPU model of every node in the pool.
    pub gpu_model: String,
    /// Node labels that place a node in this pool.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// The declared size of the pool; guarantees are checked against it.
    pub capacity: PoolCapacity,
    /// How a GPU of this pool is shared between workloads.
    pub sharing: Sharing,
    /// For `sharing: mig`, the `MigLayout`s a GPU of this pool may take; the solver chooses
    /// among them per GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_layouts: Vec<String>,
    /// For `sharing: mps` or `timeslice`, how many workloads may share one GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 48))]
    pub max_clients_per_gpu: Option<u32>,
    /// How often and how gently a GPU may be re-partitioned.
    #[serde(default)]
    pub reconfiguration: Reconfiguration,
    /// The extent of one NVLink domain: a `node`, or a `rack` of
    /// `capacity.nodesPerNvlinkDomain` nodes (NVL72-style).
    #[serde(default)]
    pub nvlink_domain: NvlinkDomain,
    /// Capacity held for whole-GPU gangs that cannot start, so that a stream of small jobs
    /// cannot starve them (reservations with backfill, as Slurm does). Absent: none are held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservations: Option<Reservations>,
    /// Who may preempt whom beyond priority and guarantees. Absent: borrowed work yields only to
    /// higher priority and to its owner's guarantee.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<PoolPreemption>,
}

/// Preemption rules of a pool beyond priority and guarantees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolPreemption {
    /// How borrowers compete for capacity that is already borrowed. `FairShare`: a borrower
    /// may preempt another tenant's borrowed work of the same priority when, after the swap,
    /// its side of the tenant tree still holds no more of the pool's borrowed capacity, per
    /// unit of weight, than the other side (Kueue's fair-sharing preemption). `Never` (the
    /// default): whoever borrowed first keeps it until it ends.
    #[serde(default)]
    pub borrowers: BorrowerPreemption,
}

/// See [`PoolPreemption::borrowers`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum BorrowerPreemption {
    #[default]
    Never,
    FairShare,
}

/// How much of a pool may be held for waiting gangs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reservations {
    /// At most this many of the pool's GPUs are held for waiting gangs at once, idle or lent to
    /// backfill. Gangs reserve in queue order while their whole size fits under it.
    #[schemars(range(min = 1))]
    pub max_gpus: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolCapacity {
    /// Number of nodes.
    #[schemars(range(min = 1))]
    pub nodes: u32,
    /// GPUs on each node.
    #[schemars(range(min = 1, max = 72))]
    pub gpus_per_node: u32,
    /// Allocatable CPU of each node.
    pub cpu_per_node: Millicores,
    /// Allocatable memory of each node.
    pub memory_per_node: Bytes,
    /// Nodes in one NVLink domain when `nvlinkDomain: rack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub nodes_per_nvlink_domain: Option<u32>,
}

/// Isolation levels, strongest first: `exclusive > mig > mps > timeslice`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Sharing {
    /// Time-slicing: shares interleave on the whole GPU, no memory or fault isolation.
    Timeslice,
    /// CUDA MPS: shares run concurrently with a thread percentage each; no fault isolation.
    Mps,
    /// MIG: hardware partitions with their own memory and compute.
    Mig,
    /// Whole GPUs, one workload each.
    Exclusive,
}

impl Sharing {
    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::Exclusive => "exclusive",
            Sharing::Mig => "mig",
            Sharing::Mps => "mps",
            Sharing::Timeslice => "timeslice",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reconfiguration {
    /// At most this many geometry changes of one GPU per hour.
    #[serde(default = "default_max_per_gpu_per_hour")]
    pub max_per_gpu_per_hour: u32,
    /// How long to wait for workloads on instances being destroyed to drain.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: Duration,
}

impl Default for Reconfiguration {
    fn default() -> Self {
        Reconfiguration {
            max_per_gpu_per_hour: default_max_per_gpu_per_hour(),
            drain_timeout: default_drain_timeout(),
        }
    }
}

fn default_max_per_gpu_per_hour() -> u32 {
    2
}
fn default_drain_timeout() -> Duration {
    Duration(600)
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NvlinkDomain {
    /// Each node is its own NVLink domain.
    #[default]
    Node,
    /// Racks of `capacity.nodesPerNvlinkDomain` nodes share one NVLink fabric.
    Rack,
}
