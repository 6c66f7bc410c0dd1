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
