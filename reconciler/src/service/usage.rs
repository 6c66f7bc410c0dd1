//! Metered usage for the API: the operator sees every tenant, a tenant its own subtree.

use super::{Handle, ServiceError};
use crate::auth::Principal;
use crate::metering::report::{TenantPath, UsageReport};

/// The longest window one request may ask for: a year and a day.
pub const MAX_WINDOW_SECONDS: i64 = 366 * 24 * 3600;

impl Handle {
    /// Usage within `[since, until)` that `who` may see. A tenant's report is its subtree, paths
    /// starting at itself; the operator's also holds usage of tenants no longer in the policy.
    pub fn usage(
        &self,
        who: &Principal,
        since: i64,
        until: i64,
    ) -> Result<UsageReport, ServiceError> {
        if until <= since {
            return Err(ServiceError::Invalid(
                "`until` must be after `since`".to_string(),
            ));
        }
        if until - since > MAX_WINDOW_SECONDS {
            return Err(ServiceError::Invalid(format!(
                "the window is longer than {} days: ask for a year or less at a time",
                MAX_WINDOW_SECONDS / 86_400
            )));
        }
        let tenants: Vec<TenantPath> = self
            .shared
            .tenants
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .ok_or_else(|| {
                ServiceError::NotReady(
                    "no policy revision is in force yet; retry once `tessera status` shows one"
                        .to_string(),
                )
            })?
            .iter()
            .map(|t| TenantPath {
                name: t.name.clone(),
                path: t.path.clone(),
            })
            .collect();
        let rows = self.store().usage(since, until)?;
        let (tenants, rows) = match who {
            Principal::Admin => (tenants, rows),
            Principal::Tenant(own) => {
                let visible: Vec<TenantPath> = tenants
                    .into_iter()
                    .filter_map(|t| {
                        let at = t.path.iter().position(|p| p == own)?;
                        Some(TenantPath {
                            name: t.name,
                            path: t.path[at..].to_vec(),
                        })
                    })
                    .collect();
                let rows = rows
                    .into_iter()
                    .filter(|r| visible.iter().any(|t| t.name == r.tenant))
                    .collect();
                (visible, rows)
            }
        };
        Ok(UsageReport {
            since,
            until,
            tenants,
            rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::service::{Limits, Shared, TenantView};
    use crate::store::usage::{NewRun, RunKey};
    use crate::store::{Origin, Store};

    fn tenant(name: &str, path: &[&str]) -> TenantView {
        TenantView {
            name: name.into(),
            slo_classes: vec![],
            pools: vec![],
            path: path.iter().map(|s| s.to_string()).collect(),
            committed: Default::default(),
        }
    }

    fn handle() -> Handle {
        let store = Store::open_in_memory().unwrap();
        for (i, t) in ["a1", "a2", "b", "gone"].iter().enumerate() {
            let spec = serde_json::from_value(json!({
                "tenant": t, "sloClass": "batch", "gpu": {"count": 1},
            }))
            .unwrap();
            let name = format!("w{i}");
            store.submit(&name, &spec, Origin::Submitted, 0).unwrap();
            let key = RunKey {
                tenant: t.to_string(),
                workload: name,
                submitted_at: 0,
                started_at: 0,
            };
            let run = NewRun {
                key,
                pool: "p".into(),
                model: "m".into(),
                profile: None,
                gpus: tessera_compiler::units::Gpus::whole(1),
                cpu_millicores: 0,
                memory_mib: 0,
            };
            store.meter_runs(&[], &[run], 100).unwrap();
        }
        let (tx, _rx) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared::new("sim", tx));
        *shared.tenants.write().unwrap() = Some(vec![
            tenant("org", &["org"]),
            tenant("a", &["org", "a"]),
            tenant("a1", &["org", "a", "a1"]),
            tenant("a2", &["org", "a", "a2"]),
            tenant("b", &["org", "b"]),
        ]);
        Handle::new(shared, Box::new(store), Limits::default())
    }

    fn tenants_of(report: &UsageReport) -> Vec<&str> {
        report.rows.iter().map(|r| r.tenant.as_str()).collect()
    }

    #[test]
    fn a_tenant_sees_its_subtree_from_itself_down_and_the_operator_everything() {
        let h = handle();
        let all = h.usage(&Principal::Admin, 0, 1000).unwrap();
        assert_eq!(tenants_of(&all), ["a1", "a2", "b", "gone"]);
        let a = h.usage(&Principal::Tenant("a".into()), 0, 1000).unwrap();
        assert_eq!(tenants_of(&a), ["a1", "a2"]);
        let paths: Vec<Vec<String>> = a.tenants.iter().map(|t| t.path.clone()).collect();
        assert_eq!(
            paths,
            [
                vec!["a".to_string()],
                vec!["a".to_string(), "a1".to_string()],
                vec!["a".to_string(), "a2".to_string()]
            ]
        );
        let a2 = h.usage(&Principal::Tenant("a2".into()), 0, 1000).unwrap();
        assert_eq!(tenants_of(&a2), ["a2"]);
        // A tenant no longer in the policy (or a stranger) sees nothing.
        let gone = h.usage(&Principal::Tenant("gone".into()), 0, 1000).unwrap();
        assert!(gone.rows.is_empty() && gone.tenants.is_empty());
    }

    #[test]
    fn an_empty_or_overlong_window_is_refused_with_what_to_ask() {
        let h = handle();
        let e = h.usage(&Principal::Admin, 10, 10).unwrap_err();
        assert!(e.to_string().contains("after `since`"), "{e}");
        let e = h
            .usage(&Principal::Admin, 0, MAX_WINDOW_SECONDS + 1)
            .unwrap_err();
        assert!(e.to_string().contains("a year or less"), "{e}");
    }
}
