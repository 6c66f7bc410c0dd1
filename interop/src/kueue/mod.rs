//! Kueue's objects, both ways.
//!
//! | tessera | Kueue (`kueue.x-k8s.io/v1beta2`) |
//! |---|---|
//! | pool | `ResourceFlavor` named after it, `nodeLabels` = the pool's node selector; the GPU model and capacity in `tessera.dev/*` annotations |
//! | tenant with children | `Cohort` (`parentName`); its nominal quota is its guarantee less its children's |
//! | tenant without children | `ClusterQueue` (`cohortName`), and a `LocalQueue` in the namespace named after it |
//! | guarantee | `nominalQuota` (of the subtree, for a Cohort) |
//! | limit | `borrowingLimit` = limit − guarantee; absent when the limit is the parent's |
//! | lending limit | `lendingLimit`; absent when it is the whole guarantee |
//! | weight | `fairSharing.weight` |
//! | tier | `WorkloadPriorityClass` |
//!
//! GPUs are `nvidia.com/gpu`; a MIG pool's instances are `nvidia.com/mig-<profile>` (the GPU
//! Operator's mixed strategy), in a resource group of their own.

pub mod export;
pub mod import;

pub use export::{Export, export};
pub use import::{Import, ImportError, import};

pub const GROUP: &str = "kueue.x-k8s.io";
/// The version written.
pub const API_VERSION: &str = "kueue.x-k8s.io/v1beta2";
/// The versions read.
pub const READ_VERSIONS: [&str; 2] = ["kueue.x-k8s.io/v1beta1", "kueue.x-k8s.io/v1beta2"];
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// Annotations on a `ResourceFlavor` that carry what Kueue does not know about the hardware.
pub mod annotation {
    pub const GPU_MODEL: &str = "tessera.dev/gpu-model";
    pub const NODES: &str = "tessera.dev/nodes";
    pub const GPUS_PER_NODE: &str = "tessera.dev/gpus-per-node";
    pub const CPU_PER_NODE: &str = "tessera.dev/cpu-per-node";
    pub const MEMORY_PER_NODE: &str = "tessera.dev/memory-per-node";
    pub const SHARING: &str = "tessera.dev/sharing";
}
