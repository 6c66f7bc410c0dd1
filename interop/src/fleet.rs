//! [`Fleet`]: the part of a policy that both tessera and Kueue express — tiers, pools as GPU
//! capacity behind node labels, and the tenant tree with guarantees, limits, lending limits and
//! weights in whole or thousandths of GPUs. Export and import both pass through it, so the
//! round trip is checked on it (`tests/round_trip.rs`).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::Sharing;
use tessera_compiler::units::{Bytes, Gpus, Millicores};

use crate::Warning;

#[derive(Debug, Clone, PartialEq)]
pub struct Fleet {
    /// Highest value first, then by name.
    pub tiers: Vec<Tier>,
    /// By name.
    pub pools: Vec<Pool>,
    /// The tree in pre-order, children by name: a parent precedes its children.
    pub tenants: Vec<Tenant>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub name: String,
    pub value: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub name: String,
    pub gpu_model: String,
    pub node_selector: BTreeMap<String, String>,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub cpu_per_node: Millicores,
    pub memory_per_node: Bytes,
}

impl Pool {
    pub fn capacity(&self) -> Gpus {
        Gpus::whole(i64::from(self.nodes) * i64::from(self.gpus_per_node))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub name: String,
    pub parent: Option<String>,
    pub weight: f64,
    /// Per pool the tenant may use (limit above zero).
    pub quota: BTreeMap<String, Quota>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub guarantee: Gpus,
    pub limit: Gpus,
    pub lending_limit: Gpus,
}

impl Fleet {
    /// The fleet of a compiled policy, and what of the policy it leaves out. MIG pools are not
    /// in it (Kueue counts MIG instances per profile, not GPUs: `kueue::export` writes them
    /// separately).
    pub fn from_policy(policy: &CompiledPolicy) -> (Fleet, Vec<Warning>) {
        let mut warnings = Vec::new();
        let mut tiers: Vec<Tier> = policy
            .tiers
            .iter()
            .map(|t| Tier {
                name: t.name.clone(),
                value: t.value,
            })
            .collect();
        tiers.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.name.cmp(&b.name)));
        let mut pools = Vec::new();
        for p in &policy.pools {
            if p.sharing == Sharing::Mig {
                continue;
            }
            if p.sharing != Sharing::Exclusive {
                warnings.push(Warning::new(
                    format!("pool {}", p.name),
                    format!(
                        "{} sharing is not expressed: Kueue counts the pool's nvidia.com/gpu as the \
                         device plugin advertises it",
                        p.sharing.as_str()
                    ),
                ));
            }
            pools.push(Pool {
                name: p.name.clone(),
                gpu_model: p.gpu_model.clone(),
                node_selector: p.node_selector.clone(),
                nodes: p.nodes,
                gpus_per_node: p.gpus_per_node,
                cpu_per_node: p.cpu_per_node,
                memory_per_node: p.memory_per_node,
            });
        }
        pools.sort_by(|a, b| a.name.cmp(&b.name));
        let in_fleet = |pool: &str| pools.iter().any(|p| p.name == pool);
        let tenants: Vec<Tenant> = policy
            .tenants
            .iter()
            .map(|t| Tenant {
                name: t.name.clone(),
                parent: t.parent.clone(),
                weight: t.weight,
                quota: t
                    .quota
                    .iter()
                    .filter(|(pool, _)| in_fleet(pool))
                    .map(|(pool, q)| {
                        (
                            pool.clone(),
                            Quota {
                                guarantee: q.guarantee.gpus,
                                limit: q.limit.gpus,
                                lending_limit: q.lending_limit.gpus,
                            },
                        )
                    })
                    .collect(),
            })
            .collect();
        for t in &policy.tenants {
            // A limit of the pool's whole CPU or memory (what the root inherits) constrains
            // nothing; anything else is a quota Kueue would need `cpu`/`memory` for.
            let constrained = t.quota.iter().any(|(pool, q)| {
                let capacity = policy.pool(pool).map(|p| p.capacity);
                q.guarantee.cpu.is_some()
                    || q.guarantee.memory.is_some()
                    || capacity.is_some_and(|c| q.limit.cpu != c.cpu || q.limit.memory != c.memory)
            });
            if constrained {
                warnings.push(Warning::new(
                    format!("tenant {}", t.name),
                    "CPU and memory quotas are not exported: only nvidia.com/gpu is covered",
                ));
            }
        }
        let fleet = Fleet {
            tiers,
            pools,
            tenants,
        }
        .normalized();
        (fleet, warnings)
    }

    /// Tiers by value then name, pools by name, tenants in pre-order with children by name.
    pub fn normalized(mut self) -> Fleet {
        self.tiers
            .sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.name.cmp(&b.name)));
        self.pools.sort_by(|a, b| a.name.cmp(&b.name));
        let mut by_parent: BTreeMap<Option<String>, Vec<Tenant>> = BTreeMap::new();
        for t in self.tenants {
            by_parent.entry(t.parent.clone()).or_default().push(t);
        }
        for kids in by_parent.values_mut() {
            kids.sort_by(|a, b| a.name.cmp(&b.name));
        }
        let mut ordered = Vec::new();
        fn visit(
            parent: Option<String>,
            by_parent: &mut BTreeMap<Option<String>, Vec<Tenant>>,
            out: &mut Vec<Tenant>,
        ) {
            for t in by_parent.remove(&parent).unwrap_or_default() {
                let name = t.name.clone();
                out.push(t);
                visit(Some(name), by_parent, out);
            }
        }
        visit(None, &mut by_parent, &mut ordered);
        // Tenants under a missing parent are kept (after the tree) for the caller to report.
        for (_, rest) in by_parent {
            ordered.extend(rest);
        }
        self.tenants = ordered;
        self
    }

    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.name == name)
    }

    pub fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Tenant> + 'a {
        self.tenants
            .iter()
            .filter(move |t| t.parent.as_deref() == Some(name))
    }

    /// The fleet as tessera policy documents (JSON values in the `tessera/v1alpha1` envelope),
    /// with one SLO class per tier (Kueue has none: preemptible, exclusive GPUs) so that the
    /// documents compile as they are.
    pub fn to_documents(&self) -> Vec<Value> {
        let doc = |kind: &str, name: &str, spec: Value| {
            json!({
                "apiVersion": tessera_compiler::model::API_VERSION,
                "kind": kind,
                "metadata": { "name": name },
                "spec": spec,
            })
        };
        let mut docs = Vec::new();
        docs.push(doc(
            "PriorityTiers",
            "tiers",
            json!({ "tiers": self.tiers.iter().map(|t| json!({"name": t.name, "value": t.value})).collect::<Vec<_>>() }),
        ));
        for t in &self.tiers {
            docs.push(doc(
                "SloClass",
                &t.name,
                json!({ "tier": t.name, "preemptible": true, "isolation": { "minimum": "exclusive" } }),
            ));
        }
        for p in &self.pools {
            docs.push(doc(
                "Pool",
                &p.name,
                json!({
                    "gpuModel": p.gpu_model,
                    "nodeSelector": p.node_selector,
                    "capacity": {
                        "nodes": p.nodes,
                        "gpusPerNode": p.gpus_per_node,
                        "cpuPerNode": p.cpu_per_node.to_string(),
                        "memoryPerNode": p.memory_per_node.to_string(),
                    },
                    "sharing": "exclusive",
                }),
            ));
        }
        for t in &self.tenants {
            let parent = t.parent.as_deref().and_then(|p| self.tenant(p));
            let mut guarantee = serde_json::Map::new();
            let mut limit = serde_json::Map::new();
            let mut lending = serde_json::Map::new();
            for pool in &self.pools {
                let inherited = match parent {
                    Some(p) => p.quota.get(&pool.name).map(|q| q.limit),
                    None => Some(pool.capacity()),
                }
                .unwrap_or(Gpus::ZERO);
                match t.quota.get(&pool.name) {
                    Some(q) => {
                        if q.guarantee != Gpus::ZERO {
                            guarantee.insert(pool.name.clone(), gpus_json(q.guarantee));
                        }
                        if q.limit != inherited {
                            limit.insert(pool.name.clone(), gpus_json(q.limit));
                        }
                        if q.lending_limit != q.guarantee {
                            lending.insert(pool.name.clone(), gpus_json(q.lending_limit));
                        }
                    }
                    None if inherited != Gpus::ZERO => {
                        limit.insert(pool.name.clone(), json!(0));
                    }
                    None => {}
                }
            }
            let mut spec = serde_json::Map::new();
            if let Some(p) = &t.parent {
                spec.insert("parent".into(), json!(p));
            }
            for (field, map) in [
                ("guarantee", guarantee),
                ("limit", limit),
                ("lendingLimit", lending),
            ] {
                if !map.is_empty() {
                    spec.insert(field.into(), Value::Object(map));
                }
            }
            if t.weight != 1.0 {
                spec.insert("weight".into(), json!(t.weight));
            }
            if t.parent.is_none() {
                spec.insert(
                    "sloClasses".into(),
                    json!(self.tiers.iter().map(|t| &t.name).collect::<Vec<_>>()),
                );
            }
            docs.push(doc("Tenant", &t.name, Value::Object(spec)));
        }
        docs
    }
}

/// GPUs as the policy language writes them: an integer when whole, else a decimal.
fn gpus_json(g: Gpus) -> Value {
    if g.units() % Gpus::UNITS_PER_GPU == 0 {
        json!(g.units() / Gpus::UNITS_PER_GPU)
    } else {
        json!(g.as_f64())
    }
}
