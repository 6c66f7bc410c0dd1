//! The service's status, in Argo CD's terms: sync (does the fleet match the branch's head?) and
//! health (is the service able to get it there?).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Sync {
    /// The branch's head is in force and the fleet matches its decision.
    Synced,
    /// A newer revision is not in force, or actions toward the decision remain.
    OutOfSync,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Health {
    Healthy,
    /// Moving toward the decision (actions applied or waiting on a grace period or a drain).
    Progressing,
    /// A revision was rejected, the nodes cannot be observed, or actions keep failing.
    Degraded,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub sync: Sync,
    pub health: Health,
    pub suspended: bool,
    /// The commit in force.
    pub revision: Option<String>,
    /// The branch's head as last fetched.
    pub head: Option<String>,
    /// With `--verify-signatures`: the verdict on the head's signature (which commit, which
    /// key, trusted or why not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_signature: Option<String>,
    /// What went wrong most recently, while it still holds.
    pub last_error: Option<String>,
    /// The rejected revision's diagnostics (`file:line:col: ...`).
    pub diagnostics: Vec<String>,
    pub cycles: u64,
    /// RFC 3339 of the last cycle.
    pub last_cycle_at: Option<String>,
    /// Actions applied by the last cycle, and steps it is waiting on.
    pub last_actions: usize,
    pub waiting: usize,
    pub driver: String,
}

impl Status {
    pub fn starting(driver: &str) -> Status {
        Status {
            sync: Sync::OutOfSync,
            health: Health::Progressing,
            suspended: false,
            revision: None,
            head: None,
            head_signature: None,
            last_error: None,
            diagnostics: Vec::new(),
            cycles: 0,
            last_cycle_at: None,
            last_actions: 0,
            waiting: 0,
            driver: driver.to_string(),
        }
    }

    pub fn sync_label(&self) -> &'static str {
        match self.sync {
            Sync::Synced => "Synced",
            Sync::OutOfSync => "OutOfSync",
        }
    }

    pub fn health_label(&self) -> &'static str {
        match self.health {
            Health::Healthy => "Healthy",
            Health::Progressing => "Progressing",
            Health::Degraded => "Degraded",
        }
    }
}
