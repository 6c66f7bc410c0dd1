use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::units::{Bytes, Duration, Millicores};

/// Demand: a gang of identical replicas. Committed to the repository (inference services) or
/// submitted at run time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadSpec {
    /// The tenant whose quota pays for it.
    pub tenant: String,
    /// One of the tenant's SLO classes.
    pub slo_class: String,
    /// Restrict to one pool; by default any pool the tenant may use that fits the shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Number of replicas, placed all together or not at all.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 4096))]
    pub replicas: u32,
    /// The gang may start once this many replicas are placed (defaults to `replicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub min_member: Option<u32>,
    /// The GPU of one replica: exactly one of `count`, `migProfile`, `fraction`.
    pub gpu: GpuRequest,
    /// CPU of one replica.
    #[serde(default)]
    pub cpu: Millicores,
    /// Memory of one replica.
    #[serde(default)]
    pub memory: Bytes,
    #[serde(default)]
    pub topology: Topology,
    /// Upper bound on run time; lets the solver backfill it ahead of a reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration: Option<Duration>,
    /// The command the embedded runtime starts for each replica.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Extra environment for the command.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

impl WorkloadSpec {
    /// What the command and environment hold that no process can be given: a NUL byte (argv
    /// and environ are NUL-terminated strings, so the rest would be cut off or the start
    /// refused), or an empty name or one with `=` in the environment. Each as the JSON pointer
    /// below the spec and what is wrong, so that a submission can be refused with a reason.
    pub fn unrepresentable(&self) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for (i, arg) in self.command.iter().enumerate() {
            if arg.contains('\0') {
                found.push((
                    format!("/command/{i}"),
                    format!("command argument {i} holds a NUL byte"),
                ));
            }
        }
        for (key, value) in &self.env {
            let pointer = format!("/env/{}", crate::yaml::escape(key));
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                found.push((
                    pointer.clone(),
                    format!(
                        "environment variable name {key:?} is empty or holds `=` or a NUL byte"
                    ),
                ));
            }
            if value.contains('\0') {
                found.push((
                    pointer,
                    format!("the value of environment variable {key:?} holds a NUL byte"),
                ));
            }
        }
        found
    }
}

fn one() -> u32 {
    1
}

impl WorkloadSpec {
    /// This spec as a snapshot records the workload running `replicas` replicas. A gang admitted
    /// with fewer replicas than it asked for (down to `minMember`) runs as that many, and a
    /// running workload has one binding per replica: the solver carries a decision out this
    /// way, and the service exports what it runs this way, so that `plan` accepts both.
    pub fn running_as(&self, replicas: u32) -> WorkloadSpec {
        let mut spec = self.clone();
        spec.replicas = replicas;
        spec.min_member = spec.min_member.map(|m| m.min(replicas));
        spec
    }
}

/// The GPU of one replica.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuRequest {
    /// Whole GPUs on one node; 0 for a CPU-only workload, placed on a node of a pool for its
    /// CPU and memory alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 72))]
    pub count: Option<u32>,
    /// One MIG instance of this profile (name such as `1g.10gb`, or profile ID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// A share of one GPU through MPS or time-slicing, in thousandths (0.25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.001, max = 1.0))]
    pub fraction: Option<f64>,
}

impl GpuRequest {
    /// How many of `count`, `migProfile` and `fraction` are set; a valid request sets one.
    pub fn kinds_set(&self) -> usize {
        usize::from(self.count.is_some())
            + usize::from(self.mig_profile.is_some())
            + usize::from(self.fraction.is_some())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Topology {
    /// `required`: the whole gang inside one NVLink domain; `preferred`: one node, then one
    /// rack, when possible.
    #[serde(default)]
    pub same_nvlink_domain: TopologyMode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TopologyMode {
    #[default]
    None,
    Preferred,
    Required,
}
