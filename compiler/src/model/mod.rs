//! The documents of the policy language `tessera/v1alpha1`, as plain serde types.
//!
//! These types are the single source of the language: the JSON Schemas in `schemas/` are
//! generated from them, and their doc comments are the schema's field documentation.

mod cluster_state;
mod gpu_model;
mod mig_layout;
mod pool;
mod slo_class;
mod tenant;
mod tiers;
mod workload;

pub use cluster_state::*;
pub use gpu_model::*;
pub use mig_layout::*;
pub use pool::*;
pub use slo_class::*;
pub use tenant::*;
pub use tiers::*;
pub use workload::*;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The only API version this compiler reads.
pub const API_VERSION: &str = "tessera/v1alpha1";

/// Every kind of document, in the order the schemas and the docs list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Kind {
    GpuModel,
    MigLayout,
    Pool,
    PriorityTiers,
    SloClass,
    Tenant,
    Workload,
    ClusterState,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::GpuModel,
        Kind::MigLayout,
        Kind::Pool,
        Kind::PriorityTiers,
        Kind::SloClass,
        Kind::Tenant,
        Kind::Workload,
        Kind::ClusterState,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::GpuModel => "GpuModel",
            Kind::MigLayout => "MigLayout",
            Kind::Pool => "Pool",
            Kind::PriorityTiers => "PriorityTiers",
            Kind::SloClass => "SloClass",
            Kind::Tenant => "Tenant",
            Kind::Workload => "Workload",
            Kind::ClusterState => "ClusterState",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `metadata` of every document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Metadata {
    /// Unique among documents of this kind. Lowercase letters, digits and `-`, starting with a
    /// letter, at most 63 characters (a DNS label, as in Kubernetes).
    #[schemars(regex(pattern = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"))]
    pub name: String,
    /// Free-form labels, for selection and display.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Free-form annotations (owners, links); never interpreted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The envelope every document shares: `apiVersion`, `kind`, `metadata`, `spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Envelope<S> {
    /// Always `tessera/v1alpha1`.
    pub api_version: String,
    /// The kind of document.
    pub kind: String,
    pub metadata: Metadata,
    pub spec: S,
}

/// One typed document of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    GpuModel(GpuModelSpec),
    MigLayout(MigLayoutSpec),
    Pool(PoolSpec),
    PriorityTiers(PriorityTiersSpec),
    SloClass(SloClassSpec),
    Tenant(TenantSpec),
    Workload(WorkloadSpec),
    ClusterState(Box<ClusterStateSpec>),
}

impl Document {
    pub fn kind(&self) -> Kind {
        match self {
            Document::GpuModel(_) => Kind::GpuModel,
            Document::MigLayout(_) => Kind::MigLayout,
            Document::Pool(_) => Kind::Pool,
            Document::PriorityTiers(_) => Kind::PriorityTiers,
            Document::SloClass(_) => Kind::SloClass,
            Document::Tenant(_) => Kind::Tenant,
            Document::Workload(_) => Kind::Workload,
            Document::ClusterState(_) => Kind::ClusterState,
        }
    }
}
