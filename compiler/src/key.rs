//! [`WorkloadKey`]: what identifies a workload everywhere (its tenant and its name).
//!
//! Workload names are per tenant, as Kubernetes names are per namespace: two tenants may each
//! have a `train`. Everything that stores, orders or looks up workloads uses the key, never
//! the bare name.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A workload's identity: `(tenant, name)`, ordered by tenant, then name; shown `tenant/name`.
///
/// Neither part may contain `/` (tenant and workload names are DNS-like), so the shown form
/// parses back unambiguously.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkloadKey {
    pub tenant: String,
    pub name: String,
}

impl WorkloadKey {
    pub fn new(tenant: impl Into<String>, name: impl Into<String>) -> WorkloadKey {
        WorkloadKey {
            tenant: tenant.into(),
            name: name.into(),
        }
    }

    /// Parses the shown form `tenant/name`; `None` when there is not exactly one `/` with text
    /// on both sides.
    pub fn parse(text: &str) -> Option<WorkloadKey> {
        let (tenant, name) = text.split_once('/')?;
        if tenant.is_empty() || name.is_empty() || name.contains('/') {
            return None;
        }
        Some(WorkloadKey::new(tenant, name))
    }

    /// Borrowed form, for lookups in maps keyed by `(tenant, name)` without cloning.
    pub fn as_pair(&self) -> (&str, &str) {
        (&self.tenant, &self.name)
    }
}

/// The workload a snapshot's reservation names: `tenant/name`, or a bare name as snapshots
/// written before names were per tenant have it, which means the one workload of that name
/// among `known` when there is exactly one.
pub fn resolve_reference<'a>(
    text: &str,
    known: impl IntoIterator<Item = &'a WorkloadKey>,
) -> Option<WorkloadKey> {
    if let Some(key) = WorkloadKey::parse(text) {
        return Some(key);
    }
    let mut named = known.into_iter().filter(|k| k.name == text);
    match (named.next(), named.next()) {
        (Some(only), None) => Some(only.clone()),
        _ => None,
    }
}

impl fmt::Display for WorkloadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Written piece by piece rather than through `write!`: a decision writes thousands of
        // keys per cycle (its queue, its protected lists).
        f.write_str(&self.tenant)?;
        f.write_str("/")?;
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::WorkloadKey;

    #[test]
    fn shown_form_parses_back() {
        let key = WorkloadKey::new("team-a", "train");
        assert_eq!(key.to_string(), "team-a/train");
        assert_eq!(WorkloadKey::parse("team-a/train"), Some(key));
        for bad in ["train", "/train", "team-a/", "a/b/c", ""] {
            assert_eq!(WorkloadKey::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_bare_name_is_resolved_only_when_one_tenant_has_it() {
        use super::resolve_reference;
        let known = [
            WorkloadKey::new("a", "train"),
            WorkloadKey::new("b", "train"),
            WorkloadKey::new("b", "solo"),
        ];
        let b_train = Some(WorkloadKey::new("b", "train"));
        assert_eq!(resolve_reference("b/train", &known), b_train);
        assert_eq!(
            resolve_reference("solo", &known),
            Some(WorkloadKey::new("b", "solo"))
        );
        assert_eq!(resolve_reference("train", &known), None, "ambiguous");
        assert_eq!(resolve_reference("nothing", &known), None);
    }

    #[test]
    fn orders_by_tenant_then_name() {
        // Tuple order, not the order of the shown strings (`a-b/x` < `a/x` as text).
        let mut keys = [
            WorkloadKey::new("a-b", "x"),
            WorkloadKey::new("a", "y"),
            WorkloadKey::new("a", "x"),
        ];
        keys.sort();
        let shown: Vec<String> = keys.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["a/x", "a/y", "a-b/x"]);
    }
}
