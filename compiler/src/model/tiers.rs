use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The priority tiers of the fleet; one such document per repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityTiersSpec {
    /// Tiers with unique names and unique values; higher values are admitted first.
    #[schemars(length(min = 1))]
    pub tiers: Vec<Tier>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tier {
    #[schemars(regex(pattern = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"))]
    pub name: String,
    /// Admission order: higher first.
    #[schemars(range(min = 0, max = 1_000_000_000))]
    pub value: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}
