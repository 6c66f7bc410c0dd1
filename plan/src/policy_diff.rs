//! A semantic diff of two compiled policies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_compiler::{CompiledPolicy, WorkloadKey};

/// Every change between two policies, grouped by what changed, each group sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyDiff {
    pub tenants: Vec<ItemChange>,
    pub pools: Vec<ItemChange>,
    pub slo_classes: Vec<ItemChange>,
    pub tiers: Vec<ItemChange>,
    pub workloads: Vec<ItemChange>,
}

impl PolicyDiff {
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
            && self.pools.is_empty()
            && self.slo_classes.is_empty()
            && self.tiers.is_empty()
            && self.workloads.is_empty()
    }
}

/// What happened to one named item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum ItemChange {
    Added {
        name: String,
    },
    Removed {
        name: String,
    },
    /// Same content under another name (a tenant renamed, say): shown as one change, not as a
    /// removal and an unrelated addition.
    Renamed {
        from: String,
        to: String,
    },
    /// A tenant whose parent changed; other field changes are listed with it.
    Moved {
        name: String,
        from_parent: Option<String>,
        to_parent: Option<String>,
        fields: Vec<FieldChange>,
    },
    Changed {
        name: String,
        fields: Vec<FieldChange>,
    },
}

/// One field, in dotted form (`quota.h100-train.guarantee.gpus`), before and after as compact
/// JSON (`null` when absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldChange {
    pub field: String,
    pub before: String,
    pub after: String,
}

pub fn policy_diff(before: &CompiledPolicy, after: &CompiledPolicy) -> PolicyDiff {
    PolicyDiff {
        tenants: diff_items(&before.tenants, &after.tenants, |t| t.name.clone()),
        pools: diff_items(&before.pools, &after.pools, |p| p.name.clone()),
        slo_classes: diff_items(&before.slo_classes, &after.slo_classes, |c| c.name.clone()),
        tiers: diff_items(&before.tiers, &after.tiers, |t| t.name.clone()),
        // A workload is named by its key, `tenant/name`: names are per tenant.
        workloads: diff_items(&before.workloads, &after.workloads, |w| {
            WorkloadKey::new(&w.tenant, &w.name).to_string()
        }),
    }
}

/// Fields that restate the name or the tree position: a rename or a move changes them without
/// changing what the item is.
const IDENTITY_FIELDS: [&str; 3] = ["name", "path", "children"];

fn diff_items<T: Serialize>(
    before: &[T],
    after: &[T],
    name: impl Fn(&T) -> String,
) -> Vec<ItemChange> {
    let as_map = |items: &[T]| -> BTreeMap<String, Value> {
        items
            .iter()
            .map(|i| {
                (
                    name(i),
                    serde_json::to_value(i).expect("policy types serialize"),
                )
            })
            .collect()
    };
    let (old, new) = (as_map(before), as_map(after));
    let mut removed: Vec<&String> = old.keys().filter(|k| !new.contains_key(*k)).collect();
    let mut added: Vec<&String> = new.keys().filter(|k| !old.contains_key(*k)).collect();
    let mut changes = Vec::new();

    // A removed and an added item with the same content are one rename. Pair them in name
    // order so that the result does not depend on anything but the two policies.
    let mut renames = Vec::new();
    for r in removed.clone() {
        let body = identity_free(&old[r]);
        if let Some(pos) = added.iter().position(|a| identity_free(&new[*a]) == body) {
            renames.push((r, added.remove(pos)));
        }
    }
    removed.retain(|r| !renames.iter().any(|(from, _)| from == r));
    for (from, to) in renames {
        changes.push(ItemChange::Renamed {
            from: from.clone(),
            to: to.clone(),
        });
    }
    changes.extend(
        removed
            .into_iter()
            .map(|n| ItemChange::Removed { name: n.clone() }),
    );
    changes.extend(
        added
            .into_iter()
            .map(|n| ItemChange::Added { name: n.clone() }),
    );

    for (n, a) in &old {
        let Some(b) = new.get(n) else { continue };
        let mut fields = Vec::new();
        diff_values("", &identity_free(a), &identity_free(b), &mut fields);
        let parent = |v: &Value| v.get("parent").and_then(Value::as_str).map(str::to_owned);
        let (pa, pb) = (parent(a), parent(b));
        if pa != pb && a.get("parent").is_some() {
            fields.retain(|f| f.field != "parent");
            changes.push(ItemChange::Moved {
                name: n.clone(),
                from_parent: pa,
                to_parent: pb,
                fields,
            });
        } else if !fields.is_empty() {
            changes.push(ItemChange::Changed {
                name: n.clone(),
                fields,
            });
        }
    }
    changes.sort_by(|x, y| sort_key(x).cmp(&sort_key(y)));
    changes
}

fn sort_key(c: &ItemChange) -> (&str, u8) {
    match c {
        ItemChange::Added { name } => (name, 0),
        ItemChange::Removed { name } => (name, 1),
        ItemChange::Renamed { to, .. } => (to, 2),
        ItemChange::Moved { name, .. } => (name, 3),
        ItemChange::Changed { name, .. } => (name, 4),
    }
}

fn identity_free(v: &Value) -> Value {
    let mut v = v.clone();
    if let Value::Object(m) = &mut v {
        for f in IDENTITY_FIELDS {
            m.remove(f);
        }
    }
    v
}

/// Field-level differences; objects recurse, and so do lists of uniquely named objects (a pool's
/// MIG layouts: `layouts[balanced].instances`), element by name; anything else (other lists
/// included) compares whole.
fn diff_values(path: &str, a: &Value, b: &Value, out: &mut Vec<FieldChange>) {
    if a == b {
        return;
    }
    if let (Some(x), Some(y)) = (by_name(a), by_name(b)) {
        let mut names: Vec<&str> = x.keys().chain(y.keys()).copied().collect();
        names.sort_unstable();
        names.dedup();
        for n in names {
            diff_values(
                &format!("{path}[{n}]"),
                x.get(n).copied().unwrap_or(&Value::Null),
                y.get(n).copied().unwrap_or(&Value::Null),
                out,
            );
        }
        return;
    }
    if let (Value::Object(x), Value::Object(y)) = (a, b) {
        let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            let child = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            diff_values(
                &child,
                x.get(k).unwrap_or(&Value::Null),
                y.get(k).unwrap_or(&Value::Null),
                out,
            );
        }
        return;
    }
    out.push(FieldChange {
        field: path.to_owned(),
        before: a.to_string(),
        after: b.to_string(),
    });
}

/// A list whose elements are all objects with distinct `name` strings, by name; `None` for any
/// other value. An empty list is an empty map: a pool's first layout is `layouts[x]` added.
fn by_name(v: &Value) -> Option<BTreeMap<&str, &Value>> {
    let items = v.as_array()?;
    let mut map = BTreeMap::new();
    for item in items {
        let name = item.get("name")?.as_str()?;
        if map.insert(name, item).is_some() {
            return None;
        }
    }
    Some(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_compiler::{SourceFile, compile};

    const FLEET: &str = "apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {name: tiers}
spec: {tiers: [{name: batch, value: 100}]}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: training}
spec: {tier: batch, preemptible: true, isolation: {minimum: exclusive}}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: train}
spec:
  gpuModel: H100-SXM5-80GB
  sharing: exclusive
  capacity: {nodes: 8, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}
";

    fn policy(tenants: &str) -> CompiledPolicy {
        let c = compile(&[
            SourceFile::new("fleet.yaml", FLEET),
            SourceFile::new("tenants.yaml", tenants),
        ]);
        c.policy.unwrap_or_else(|| panic!("{:#?}", c.diagnostics))
    }

    fn tenant(name: &str, parent: Option<&str>, guarantee: u32) -> String {
        let parent = parent
            .map(|p| format!("  parent: {p}\n"))
            .unwrap_or_default();
        format!(
            "apiVersion: tessera/v1alpha1\nkind: Tenant\nmetadata: {{name: {name}}}\nspec:\n{parent}  guarantee: {{train: {guarantee}}}\n---\n"
        )
    }

    #[test]
    fn same_policy_in_another_order_is_no_change() {
        let a = policy(
            &(tenant("org", None, 64)
                + &tenant("a", Some("org"), 8)
                + &tenant("b", Some("org"), 8)),
        );
        let b = policy(
            &(tenant("b", Some("org"), 8)
                + &tenant("org", None, 64)
                + &tenant("a", Some("org"), 8)),
        );
        assert!(policy_diff(&a, &b).is_empty());
    }

    #[test]
    fn a_raised_guarantee_is_one_field_change() {
        let a = policy(&(tenant("org", None, 64) + &tenant("a", Some("org"), 8)));
        let b = policy(&(tenant("org", None, 64) + &tenant("a", Some("org"), 16)));
        let d = policy_diff(&a, &b);
        assert_eq!(
            d.tenants,
            vec![ItemChange::Changed {
                name: "a".into(),
                fields: vec![
                    FieldChange {
                        field: "quota.train.guarantee.gpus".into(),
                        before: "8.0".into(),
                        after: "16.0".into()
                    },
                    FieldChange {
                        field: "quota.train.lending_limit.gpus".into(),
                        before: "8.0".into(),
                        after: "16.0".into()
                    },
                ]
            }]
        );
    }

    #[test]
    fn renames_moves_additions_and_removals() {
        let a = policy(
            &(tenant("org", None, 64)
                + &tenant("x", Some("org"), 16)
                + &tenant("a", Some("x"), 8)
                + &tenant("old", Some("org"), 4)
                + &tenant("gone", Some("org"), 2)),
        );
        let b = policy(
            &(tenant("org", None, 64)
                + &tenant("x", Some("org"), 16)
                + &tenant("a", Some("org"), 8)
                + &tenant("new", Some("org"), 4)
                + &tenant("fresh", Some("org"), 1)),
        );
        let d = policy_diff(&a, &b);
        insta::assert_json_snapshot!(d.tenants);
    }

    #[test]
    fn named_lists_diff_element_by_element() {
        let a =
            serde_json::json!({"layouts": [{"name": "x", "size": 1}, {"name": "y", "size": 2}]});
        let b =
            serde_json::json!({"layouts": [{"name": "y", "size": 3}, {"name": "z", "size": 1}]});
        let mut out = Vec::new();
        diff_values("", &a, &b, &mut out);
        let fields: Vec<&str> = out.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["layouts[x]", "layouts[y].size", "layouts[z]"]);
        // Lists of anything else compare whole.
        let mut out = Vec::new();
        diff_values(
            "",
            &serde_json::json!({"l": ["a"]}),
            &serde_json::json!({"l": ["b"]}),
            &mut out,
        );
        assert_eq!(out[0].field, "l");
    }
}
