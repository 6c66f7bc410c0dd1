use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::units::{Bytes, Duration, Gpus, Millicores};

/// One node of the quota tree: an organisation, a team or a project.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantSpec {
    /// The parent tenant; exactly one tenant (the root) has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Capacity reserved for this tenant, per pool: a number of GPUs, or
    /// `{gpus, cpu, memory}`. Children's guarantees add up to at most their parent's.
    #[serde(default)]
    pub guarantee: BTreeMap<String, Quota>,
    /// Ceiling per pool, borrowed capacity included. Defaults to the parent's limit (the pool's
    /// capacity at the root).
    #[serde(default)]
    pub limit: BTreeMap<String, Quota>,
    /// How much of the guarantee, per pool, others may borrow while it is idle. Defaults to the
    /// whole guarantee.
    #[serde(default)]
    pub lending_limit: BTreeMap<String, Quota>,
    /// Share of idle capacity when borrowing, relative to siblings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 1000.0))]
    pub weight: Option<f64>,
    /// Workloads of different trust domains never share a GPU through MPS or time-slicing.
    /// Inherited from the parent; the root's default is its own name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"))]
    pub trust_domain: Option<String>,
    /// The SLO classes this tenant's workloads may use; inherited from the parent when absent,
    /// and never more than the parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_classes: Option<Vec<String>>,
    /// Fair share over time: how past borrowing lowers this subtree's claim on idle capacity.
    /// Set at the root for the whole tree; a tenant that sets it replaces its parent's setting
    /// for its whole subtree. Absent everywhere: only current usage counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_share: Option<FairShare>,
}

/// Fair share over time (as Slurm's `PriorityDecayHalfLife`, Kueue's `usageHalfLifeTime`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FairShare {
    /// Past usage counts half as much after this long (`24h`). Decay is continuous.
    pub usage_half_life: Duration,
    /// The resources that count toward usage; a tenant's usage is its dominant one, relative
    /// to the fleet. Defaults to all three.
    #[serde(default = "all_usage_resources")]
    #[schemars(length(min = 1))]
    pub resources: Vec<UsageResource>,
    /// What one GPU-hour of a model counts, by model name (default 1): an H100-hour may count
    /// more than an A100-hour.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_model_weights: BTreeMap<String, f64>,
}

fn all_usage_resources() -> Vec<UsageResource> {
    vec![
        UsageResource::Gpu,
        UsageResource::Cpu,
        UsageResource::Memory,
    ]
}

/// A resource that counts toward fair-share usage.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum UsageResource {
    /// GPU-hours, weighted by model.
    Gpu,
    /// CPU core-hours.
    Cpu,
    /// Memory GiB-hours.
    Memory,
}

impl UsageResource {
    pub fn as_str(self) -> &'static str {
        match self {
            UsageResource::Gpu => "gpu",
            UsageResource::Cpu => "cpu",
            UsageResource::Memory => "memory",
        }
    }
}

/// An amount of one pool: GPUs alone (`64`), or GPUs with CPU and memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Quota {
    Gpus(Gpus),
    Resources(Resources),
}

// By hand rather than `untagged`: an untagged enum replaces the reason a number was refused
// ("finer than a thousandth") with "did not match any variant".
impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{self, IntoDeserializer, MapAccess, Visitor};
        struct QuotaVisitor;
        impl<'de> Visitor<'de> for QuotaVisitor {
            type Value = Quota;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number of GPUs or a mapping {gpus, cpu, memory}")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quota, E> {
                Gpus::deserialize(v.into_deserializer()).map(Quota::Gpus)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quota, E> {
                self.visit_f64(v as f64)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quota, E> {
                self.visit_f64(v as f64)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Quota, A::Error> {
                Resources::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(Quota::Resources)
            }
        }
        d.deserialize_any(QuotaVisitor)
    }
}

impl Quota {
    pub fn resources(self) -> Resources {
        match self {
            Quota::Gpus(gpus) => Resources {
                gpus,
                cpu: None,
                memory: None,
            },
            Quota::Resources(r) => r,
        }
    }
}

/// GPUs, CPU and memory of one pool. An absent CPU or memory is not constrained.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    pub gpus: Gpus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Millicores>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Bytes>,
}
