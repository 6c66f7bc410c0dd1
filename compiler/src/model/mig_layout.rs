use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A named MIG geometry for one GPU. The compiler proves that the instances have a real placement
/// on the grid and expands it to explicit placements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigLayoutSpec {
    /// The GPU model the layout is for (built-in or a `GpuModel` document).
    pub gpu_model: String,
    /// MIG profiles by name (`3g.40gb`) or profile ID (`"9"`); repeat a profile to have it twice.
    #[schemars(length(min = 1, max = 7))]
    pub instances: Vec<String>,
}
