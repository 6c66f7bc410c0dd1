//! `CompiledPolicy`: the whole repository resolved into one plain value, what the solver reads.
//!
//! Every default is applied, every inherited value is written out per tenant, every layout is
//! expanded to explicit placements. Field order and collection order are fixed so that
//! `tessera compile --output json` is byte-for-byte stable.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{GpuRequest, Sharing, Topology, TopologyMode, WorkloadSpec};
use crate::units::{Bytes, Gpus, Millicores};

/// Bumped on any change a consumer of the JSON could notice.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledPolicy {
    pub format_version: u32,
    pub api_version: String,
    /// The GPU models the pools use.
    pub gpu_models: Vec<CompiledGpuModel>,
    /// By name.
    pub pools: Vec<CompiledPool>,
    /// Highest value first.
    pub tiers: Vec<CompiledTier>,
    /// By name.
    pub slo_classes: Vec<CompiledSloClass>,
    /// The tree in pre-order, children by name: a parent always precedes its children.
    pub tenants: Vec<CompiledTenant>,
    /// By name.
    pub workloads: Vec<CompiledWorkload>,
}

impl CompiledPolicy {
    pub fn pool(&self, name: &str) -> Option<&CompiledPool> {
        self.pools.iter().find(|p| p.name == name)
    }
    pub fn tenant(&self, name: &str) -> Option<&CompiledTenant> {
        self.tenants.iter().find(|t| t.name == name)
    }
    pub fn slo_class(&self, name: &str) -> Option<&CompiledSloClass> {
        self.slo_classes.iter().find(|c| c.name == name)
    }
    pub fn gpu_model(&self, name: &str) -> Option<&CompiledGpuModel> {
        self.gpu_models.iter().find(|m| m.name == name)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledGpuModel {
    pub name: String,
    pub memory: Bytes,
    pub builtin: bool,
    /// MIG profiles by profile ID; empty for a model without MIG.
    pub mig_profiles: Vec<CompiledMigProfile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledMigProfile {
    pub id: u32,
    pub name: String,
    pub compute_slices: u8,
    pub memory_slices: u8,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledPool {
    pub name: String,
    pub gpu_model: String,
    pub sharing: Sharing,
    pub node_selector: BTreeMap<String, String>,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub cpu_per_node: Millicores,
    pub memory_per_node: Bytes,
    /// `nodes × gpusPerNode`, CPU and memory likewise: what guarantees are checked against.
    pub capacity: Amounts,
    pub nvlink_domain: CompiledNvlinkDomain,
    /// For mps and timeslice pools.
    pub max_clients_per_gpu: Option<u32>,
    pub reconfiguration: CompiledReconfiguration,
    /// For mig pools: the geometries a GPU may take, with explicit placements.
    pub layouts: Vec<CompiledLayout>,
    /// At most this many GPUs held for waiting gangs; `None`: no reservations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_max_gpus: Option<u32>,
    /// Borrowers may preempt other tenants' borrowed work of their priority to even out the
    /// weighted borrowed shares (`preemption.borrowers: FairShare`).
    #[serde(default)]
    pub fair_share_preemption: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledNvlinkDomain {
    pub nodes_per_domain: u32,
    pub gpus_per_domain: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledReconfiguration {
    pub max_per_gpu_per_hour: u32,
    pub drain_timeout_seconds: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledLayout {
    pub name: String,
    /// Sorted by start.
    pub instances: Vec<CompiledInstance>,
    /// Compute slices in use, out of 7.
    pub compute_slices: u8,
}

impl CompiledLayout {
    /// A geometry of `model`'s GPU from placements the MIG engine produced.
    pub fn from_placements(
        name: &str,
        model: &tessera_mig::GpuModel,
        placements: &[tessera_mig::Placement],
    ) -> CompiledLayout {
        let mut instances: Vec<CompiledInstance> = placements
            .iter()
            .map(|p| {
                let shape = tessera_mig::shape(p.profile_id).expect("placed profiles are known");
                CompiledInstance {
                    profile_id: p.profile_id,
                    profile: model
                        .profile_name(p.profile_id)
                        .unwrap_or_default()
                        .to_owned(),
                    start: p.start,
                    size: shape.memory_slices,
                    compute_slices: shape.compute_slices,
                }
            })
            .collect();
        instances.sort_by_key(|i| (i.start, i.profile_id));
        CompiledLayout {
            name: name.to_owned(),
            compute_slices: instances.iter().map(|i| i.compute_slices).sum(),
            instances,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledInstance {
    pub profile_id: u32,
    pub profile: String,
    /// First memory slice.
    pub start: u8,
    /// Memory slices.
    pub size: u8,
    pub compute_slices: u8,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledTier {
    pub name: String,
    pub value: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledSloClass {
    pub name: String,
    pub tier: String,
    /// The tier's value: admission order, higher first.
    pub priority: i64,
    pub preemptible: bool,
    pub isolation_minimum: Sharing,
    pub checkpoint_signal: String,
    pub grace_period_seconds: u64,
    pub min_runtime_seconds: u64,
}

/// GPUs, CPU and memory. `None` for CPU or memory: not constrained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Amounts {
    pub gpus: Gpus,
    pub cpu: Option<Millicores>,
    pub memory: Option<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledTenant {
    pub name: String,
    pub parent: Option<String>,
    /// Names from the root down to this tenant.
    pub path: Vec<String>,
    pub children: Vec<String>,
    pub trust_domain: String,
    pub weight: f64,
    pub slo_classes: Vec<String>,
    /// Effective quota per pool, for every pool the tenant may use (limit above zero).
    pub quota: BTreeMap<String, PoolQuota>,
    /// The fair-share setting in force for this tenant (its own or its nearest ancestor's);
    /// `None`: past usage does not count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_share: Option<CompiledFairShare>,
}

/// Fair share over time, resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledFairShare {
    pub usage_half_life_seconds: u64,
    pub gpu: bool,
    pub cpu: bool,
    pub memory: bool,
    /// Weight of one GPU-hour per model; models absent weigh 1.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_model_weights: BTreeMap<String, f64>,
}

impl CompiledFairShare {
    /// What one GPU-hour of `model` counts.
    pub fn gpu_weight(&self, model: &str) -> f64 {
        self.gpu_model_weights.get(model).copied().unwrap_or(1.0)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolQuota {
    pub guarantee: Amounts,
    pub limit: Amounts,
    pub lending_limit: Amounts,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledWorkload {
    pub name: String,
    pub tenant: String,
    pub slo_class: String,
    pub priority: i64,
    /// Pools that can hold the workload's shape and that its tenant and class may use.
    pub pools: Vec<String>,
    pub replicas: u32,
    pub min_member: u32,
    pub gpu: GpuDemand,
    /// GPUs one replica counts against quota.
    pub gpus_per_replica: Gpus,
    pub cpu: Millicores,
    pub memory: Bytes,
    pub topology: TopologyMode,
    pub max_duration_seconds: Option<u64>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
}

impl CompiledWorkload {
    /// The workload as the spec a snapshot's running or waiting workload carries: what the
    /// service submits for a committed workload, and what a replay starts for one.
    pub fn spec(&self) -> WorkloadSpec {
        let gpu = match &self.gpu {
            GpuDemand::Whole { count } => GpuRequest {
                count: Some(*count),
                mig_profile: None,
                fraction: None,
            },
            GpuDemand::Mig { profile_id } => GpuRequest {
                count: None,
                mig_profile: Some(profile_id.to_string()),
                fraction: None,
            },
            GpuDemand::Share { fraction } => GpuRequest {
                count: None,
                mig_profile: None,
                fraction: Some(fraction.as_f64()),
            },
        };
        WorkloadSpec {
            tenant: self.tenant.clone(),
            slo_class: self.slo_class.clone(),
            pool: match self.pools.as_slice() {
                [only] => Some(only.clone()),
                _ => None,
            },
            replicas: self.replicas,
            min_member: (self.min_member != self.replicas).then_some(self.min_member),
            gpu,
            cpu: self.cpu,
            memory: self.memory,
            topology: Topology {
                same_nvlink_domain: self.topology,
            },
            max_duration: self.max_duration_seconds.map(crate::units::Duration),
            command: self.command.clone(),
            env: self.env.clone(),
        }
    }
}

/// What one replica asks of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum GpuDemand {
    Whole { count: u32 },
    Mig { profile_id: u32 },
    Share { fraction: Gpus },
}

impl GpuDemand {
    /// What one replica counts against quota: whole GPUs, compute slices / 7, or the share.
    pub fn gpus(&self) -> Gpus {
        match self {
            GpuDemand::Whole { count } => Gpus::whole(i64::from(*count)),
            GpuDemand::Mig { profile_id } => Gpus::sevenths(i64::from(
                tessera_mig::shape(*profile_id).map_or(7, |s| s.compute_slices),
            )),
            GpuDemand::Share { fraction } => *fraction,
        }
    }
}
