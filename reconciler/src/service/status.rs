//! The service's status, in Argo CD's terms: sync (does the fleet match the branch's head?) and
//! health (is the service able to get it there?), with the conditions that explain it.
//!
//! Who sees what: anyone sees sync and health ([`PublicStatus`]); a tenant's token adds the
//! conditions about its own workloads; the operator's token shows everything, the service's own
//! conditions (fetches, hardware, revisions) and the rejected revision's diagnostics included.
//! A condition's message can carry a workload's command error, a path or a URL, so it is never
//! shown to someone it does not concern.

use serde::{Deserialize, Serialize};

use crate::auth::Principal;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Sync {
    /// The branch's head is in force and the fleet matches its decision.
    Synced,
    /// A newer revision is not in force, the branch is gone, or actions toward the decision
    /// remain.
    OutOfSync,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Health {
    Healthy,
    /// Moving toward the decision (actions applied or waiting on a grace period or a drain).
    Progressing,
    /// A revision was rejected, the repository cannot be fetched, the nodes cannot be observed,
    /// hardware is lost, or actions keep failing.
    Degraded,
}

/// One reason the service is Degraded, and whom it concerns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The tenant whose workload it is about; `None` for the service's own conditions, which
    /// only the operator sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub message: String,
}

impl Condition {
    pub fn service(message: impl Into<String>) -> Condition {
        Condition {
            tenant: None,
            message: message.into(),
        }
    }

    pub fn tenant(tenant: impl Into<String>, message: impl Into<String>) -> Condition {
        Condition {
            tenant: Some(tenant.into()),
            message: message.into(),
        }
    }
}

/// The whole status, as the operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub sync: Sync,
    pub health: Health,
    pub suspended: bool,
    /// The commit in force.
    pub revision: Option<String>,
    /// The branch's head as last fetched; `None` while it cannot be (the branch was deleted).
    pub head: Option<String>,
    /// With `--verify-signatures`: the verdict on the head's signature (which commit, which
    /// key, trusted or why not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_signature: Option<String>,
    /// Every condition's message, joined; `None` when there is none.
    pub last_error: Option<String>,
    /// What keeps the service Degraded, each held until what caused it is overcome.
    pub conditions: Vec<Condition>,
    /// The rejected revision's diagnostics (`file:line:col: ...`).
    pub diagnostics: Vec<String>,
    pub cycles: u64,
    /// RFC 3339 of the last cycle.
    pub last_cycle_at: Option<String>,
    /// Actions applied by the last cycle, and steps it is waiting on.
    pub last_actions: usize,
    pub waiting: usize,
    /// GPUs the last observation reported lost, as `node/index`.
    pub lost_gpus: Vec<String>,
    pub driver: String,
}

/// What anyone may read: sync and health, no details.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicStatus {
    pub sync: Sync,
    pub health: Health,
    pub suspended: bool,
    pub revision: Option<String>,
    pub head: Option<String>,
    pub cycles: u64,
    pub last_cycle_at: Option<String>,
}

/// What a tenant reads: the public status and the conditions about its own workloads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantStatus {
    #[serde(flatten)]
    pub public: PublicStatus,
    pub last_error: Option<String>,
    pub conditions: Vec<Condition>,
}

/// The status as one caller may see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StatusView {
    Public(PublicStatus),
    Tenant(TenantStatus),
    Operator(Box<Status>),
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
            conditions: Vec::new(),
            diagnostics: Vec::new(),
            cycles: 0,
            last_cycle_at: None,
            last_actions: 0,
            waiting: 0,
            lost_gpus: Vec::new(),
            driver: driver.to_string(),
        }
    }

    /// Replaces the conditions (and `last_error`, which joins them).
    pub fn set_conditions(&mut self, conditions: Vec<Condition>) {
        self.last_error = join(&conditions);
        self.conditions = conditions;
    }

    pub fn public(&self) -> PublicStatus {
        PublicStatus {
            sync: self.sync,
            health: self.health,
            suspended: self.suspended,
            revision: self.revision.clone(),
            head: self.head.clone(),
            cycles: self.cycles,
            last_cycle_at: self.last_cycle_at.clone(),
        }
    }

    /// What `who` may see (`None`: a caller without a token).
    pub fn view_for(&self, who: Option<&Principal>) -> StatusView {
        match who {
            None => StatusView::Public(self.public()),
            Some(Principal::Admin) => StatusView::Operator(Box::new(self.clone())),
            Some(Principal::Tenant(tenant)) => {
                let conditions: Vec<Condition> = self
                    .conditions
                    .iter()
                    .filter(|c| c.tenant.as_deref() == Some(tenant.as_str()))
                    .cloned()
                    .collect();
                StatusView::Tenant(TenantStatus {
                    public: self.public(),
                    last_error: join(&conditions),
                    conditions,
                })
            }
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

fn join(conditions: &[Condition]) -> Option<String> {
    (!conditions.is_empty()).then(|| {
        conditions
            .iter()
            .map(|c| c.message.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn degraded() -> Status {
        let mut s = Status::starting("sim");
        s.health = Health::Degraded;
        s.diagnostics = vec!["policy/t.yaml:1:1: error".into()];
        s.set_conditions(vec![
            Condition::service("fetch: /srv/policy does not exist"),
            Condition::tenant("a", "workload/a-job: start: PATH=/usr/bin: not found"),
            Condition::tenant("b", "workload/b-job: start: exit 1"),
        ]);
        s
    }

    #[test]
    fn anyone_sees_sync_and_health_only() {
        let view = serde_json::to_value(degraded().view_for(None)).unwrap();
        assert_eq!(view["health"], "Degraded");
        for hidden in [
            "lastError",
            "conditions",
            "diagnostics",
            "driver",
            "lostGpus",
        ] {
            assert!(view.get(hidden).is_none(), "{hidden} shown: {view}");
        }
    }

    #[test]
    fn a_tenant_sees_its_own_conditions_and_the_operator_all() {
        let s = degraded();
        let a = serde_json::to_value(s.view_for(Some(&Principal::Tenant("a".into())))).unwrap();
        assert_eq!(
            a["lastError"],
            "workload/a-job: start: PATH=/usr/bin: not found"
        );
        assert_eq!(a["conditions"].as_array().unwrap().len(), 1);
        assert!(a.get("diagnostics").is_none(), "{a}");
        let admin = serde_json::to_value(s.view_for(Some(&Principal::Admin))).unwrap();
        assert_eq!(admin["conditions"].as_array().unwrap().len(), 3);
        assert!(admin["lastError"].as_str().unwrap().contains("fetch:"));
        assert_eq!(admin["diagnostics"][0], "policy/t.yaml:1:1: error");
    }

    proptest::proptest! {
        /// Whatever the conditions, a tenant sees exactly those marked with its name, in order,
        /// and the public view none.
        #[test]
        fn a_tenant_sees_exactly_its_own_conditions(
            marks in proptest::collection::vec(proptest::option::of(0usize..3), 0..8),
            who in 0usize..3,
        ) {
            let tenants = ["a", "b", "c"];
            let conditions: Vec<Condition> = marks
                .iter()
                .enumerate()
                .map(|(i, m)| match m {
                    Some(t) => Condition::tenant(tenants[*t], format!("c{i}")),
                    None => Condition::service(format!("c{i}")),
                })
                .collect();
            let mut s = Status::starting("sim");
            s.set_conditions(conditions.clone());
            let StatusView::Tenant(view) =
                s.view_for(Some(&Principal::Tenant(tenants[who].to_string())))
            else {
                panic!("a tenant's view");
            };
            let expected: Vec<Condition> = conditions
                .into_iter()
                .filter(|c| c.tenant.as_deref() == Some(tenants[who]))
                .collect();
            proptest::prop_assert_eq!(&view.conditions, &expected);
            proptest::prop_assert_eq!(view.last_error.is_none(), expected.is_empty());
            proptest::prop_assert!(matches!(s.view_for(None), StatusView::Public(_)));
        }
    }
}
