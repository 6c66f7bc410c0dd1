use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::Sharing;
use crate::units::Duration;

/// A service-level class: its priority tier, whether it may be preempted, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SloClassSpec {
    /// A tier of the `PriorityTiers` document.
    pub tier: String,
    /// May the solver preempt this class's workloads (after checkpoint) to admit others?
    pub preemptible: bool,
    /// The weakest sharing this class accepts.
    #[serde(default)]
    pub isolation: Isolation,
    /// How a preemption is carried out.
    #[serde(default)]
    pub preemption: Preemption,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Isolation {
    /// `exclusive > mig > mps > timeslice`: a workload of this class runs only on a GPU shared
    /// this way or more strictly.
    pub minimum: Sharing,
}

impl Default for Isolation {
    fn default() -> Self {
        Isolation {
            minimum: Sharing::Timeslice,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Preemption {
    /// The signal sent to ask for a checkpoint before the workload is stopped.
    #[serde(default = "default_signal")]
    #[schemars(regex(pattern = r"^SIG[A-Z0-9]+$"))]
    pub signal: String,
    /// Time between the checkpoint signal and the stop.
    #[serde(default = "default_grace")]
    pub grace_period: Duration,
    /// A workload that has run less than this is not preempted (no oscillation).
    #[serde(default)]
    pub min_runtime: Duration,
}

impl Default for Preemption {
    fn default() -> Self {
        Preemption {
            signal: default_signal(),
            grace_period: default_grace(),
            min_runtime: Duration(0),
        }
    }
}

fn default_signal() -> String {
    "SIGTERM".to_owned()
}
fn default_grace() -> Duration {
    Duration(30)
}
