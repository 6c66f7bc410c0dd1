use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::units::Bytes;

/// A GPU model beyond the built-in catalog (`tessera mig layouts` lists the built-in ones).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuModelSpec {
    /// Device memory of one GPU, e.g. `80Gi`.
    pub memory: Bytes,
    /// MIG profiles this model offers; absent for a model without MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<GpuModelMig>,
}

/// The MIG profiles of a custom model. Placement rules are the fixed MIG grid (7 compute and 8
/// memory slices), so a profile is named by its NVIDIA profile ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuModelMig {
    /// At least one profile.
    #[schemars(length(min = 1))]
    pub profiles: Vec<GpuModelProfile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuModelProfile {
    /// NVIDIA GPU instance profile ID, as `nvidia-smi mig -lgip` prints it: 19 (1g), 20 (1g+me),
    /// 15 (1g with 2/8 memory), 14 (2g), 9 (3g), 5 (4g) or 0 (7g).
    pub id: u32,
    /// The name users write in layouts and workloads, e.g. `3g.40gb`.
    pub name: String,
}
