//! A compiled policy as Kueue objects.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};
use tessera_compiler::CompiledPolicy;
use tessera_compiler::compiled::CompiledPool;
use tessera_compiler::model::Sharing;
use tessera_compiler::units::Gpus;

use super::{API_VERSION, GPU_RESOURCE, MIG_RESOURCE_PREFIX, annotation};
use crate::fleet::{Fleet, Tenant};
use crate::{Warning, quantity};

/// What `export` produces.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// Objects by kind, in the order they should be applied (flavors and priority classes
    /// first, then cohorts from the root down, cluster queues, local queues).
    pub objects: Vec<Value>,
    pub warnings: Vec<Warning>,
}

impl Export {
    /// The objects of one kind.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects.iter().filter(move |o| o["kind"] == kind)
    }
}

/// The policy as Kueue objects, and what Kueue cannot express.
pub fn export(policy: &CompiledPolicy) -> Export {
    let (fleet, mut warnings) = Fleet::from_policy(policy);
    let mig_pools: Vec<&CompiledPool> = policy
        .pools
        .iter()
        .filter(|p| p.sharing == Sharing::Mig)
        .collect();
    let mut objects = export_fleet(&fleet, &mut warnings);
    if !mig_pools.is_empty() {
        add_mig(policy, &mig_pools, &mut objects, &mut warnings);
    }
    warnings.extend(unexpressed(policy));
    warnings.sort();
    warnings.dedup();
    Export { objects, warnings }
}

/// The fleet's objects: what `import` reads back into the same fleet.
pub fn export_fleet(fleet: &Fleet, warnings: &mut Vec<Warning>) -> Vec<Value> {
    let mut objects = Vec::new();
    for pool in &fleet.pools {
        let annotations = json!({
            annotation::GPU_MODEL: pool.gpu_model,
            annotation::NODES: pool.nodes.to_string(),
            annotation::GPUS_PER_NODE: pool.gpus_per_node.to_string(),
            annotation::CPU_PER_NODE: pool.cpu_per_node.to_string(),
            annotation::MEMORY_PER_NODE: pool.memory_per_node.to_string(),
        });
        objects.push(flavor(&pool.name, &pool.node_selector, annotations));
    }
    for tier in &fleet.tiers {
        objects.push(json!({
            "apiVersion": API_VERSION,
            "kind": "WorkloadPriorityClass",
            "metadata": metadata(&tier.name),
            "value": tier.value,
            "description": format!("tessera tier {}", tier.name),
        }));
    }
    let mut queues = Vec::new();
    let mut local = Vec::new();
    for t in &fleet.tenants {
        let has_children = fleet.children(&t.name).next().is_some();
        let group = gpu_group(fleet, t, has_children, warnings);
        let mut spec = Map::new();
        if has_children {
            if let Some(p) = &t.parent {
                spec.insert("parentName".into(), json!(p));
            }
        } else {
            if let Some(p) = &t.parent {
                spec.insert("cohortName".into(), json!(p));
            }
            // Only the tenant's own namespace submits to its queue.
            spec.insert(
                "namespaceSelector".into(),
                json!({ "matchLabels": { "kubernetes.io/metadata.name": t.name } }),
            );
            // Borrowed capacity is reclaimed for its owner; within a tenant, priority decides.
            spec.insert(
                "preemption".into(),
                json!({ "reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority" }),
            );
        }
        spec.insert(
            "fairSharing".into(),
            json!({ "weight": quantity::weight(t.weight) }),
        );
        if let Some(group) = group {
            spec.insert("resourceGroups".into(), json!([group]));
        }
        let object = json!({
            "apiVersion": API_VERSION,
            "kind": if has_children { "Cohort" } else { "ClusterQueue" },
            "metadata": metadata(&t.name),
            "spec": Value::Object(spec),
        });
        if has_children {
            objects.push(object);
        } else {
            queues.push(object);
            local.push(json!({
                "apiVersion": API_VERSION,
                "kind": "LocalQueue",
                "metadata": { "name": t.name, "namespace": t.name, "labels": managed() },
                "spec": { "clusterQueue": t.name },
            }));
        }
    }
    objects.extend(queues);
    objects.extend(local);
    objects
}

fn managed() -> Value {
    json!({ "app.kubernetes.io/managed-by": "tessera" })
}

fn metadata(name: &str) -> Value {
    json!({ "name": name, "labels": managed() })
}

fn flavor(name: &str, labels: &BTreeMap<String, String>, annotations: Value) -> Value {
    let mut spec = Map::new();
    if !labels.is_empty() {
        spec.insert("nodeLabels".into(), json!(labels));
    }
    json!({
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": { "name": name, "labels": managed(), "annotations": annotations },
        "spec": Value::Object(spec),
    })
}

/// The sum of the children's guarantees in `pool`.
fn children_guarantee(fleet: &Fleet, name: &str, pool: &str) -> Gpus {
    fleet
        .children(name)
        .filter_map(|c| c.quota.get(pool))
        .fold(Gpus::ZERO, |sum, q| sum + q.guarantee)
}

/// The limit `t` inherits in `pool`: its parent's, or the pool's capacity at the root.
fn inherited_limit(fleet: &Fleet, t: &Tenant, pool: &str) -> Option<Gpus> {
    match &t.parent {
        Some(p) => fleet.tenant(p)?.quota.get(pool).map(|q| q.limit),
        None => fleet
            .pools
            .iter()
            .find(|p| p.name == pool)
            .map(|p| p.capacity()),
    }
}

fn gpu_group(
    fleet: &Fleet,
    t: &Tenant,
    has_children: bool,
    warnings: &mut Vec<Warning>,
) -> Option<Value> {
    let mut flavors = Vec::new();
    for (pool, q) in &t.quota {
        let nominal = if has_children {
            q.guarantee
                .saturating_sub(children_guarantee(fleet, &t.name, pool))
        } else {
            q.guarantee
        };
        let subject = format!("tenant {} pool {pool}", t.name);
        let mut resource = Map::new();
        resource.insert("name".into(), json!(GPU_RESOURCE));
        resource.insert(
            "nominalQuota".into(),
            json!(gpus(nominal, &subject, warnings)),
        );
        let inherited = inherited_limit(fleet, t, pool);
        if t.parent.is_some() && Some(q.limit) != inherited {
            let borrowing = q.limit.saturating_sub(q.guarantee);
            resource.insert(
                "borrowingLimit".into(),
                json!(gpus(borrowing, &subject, warnings)),
            );
        }
        if t.parent.is_none() && Some(q.limit) != inherited {
            warnings.push(Warning::new(
                subject.clone(),
                "the root's limit below the pool's capacity is not expressed: a Kueue cohort at \
                 the root has nothing to borrow from",
            ));
        }
        if q.lending_limit != q.guarantee {
            resource.insert(
                "lendingLimit".into(),
                json!(gpus(q.lending_limit, &subject, warnings)),
            );
        }
        flavors.push(json!({ "name": pool, "resources": [Value::Object(resource)] }));
    }
    (!flavors.is_empty()).then(|| json!({ "coveredResources": [GPU_RESOURCE], "flavors": flavors }))
}

fn gpus(g: Gpus, subject: &str, warnings: &mut Vec<Warning>) -> String {
    match quantity::gpus(g) {
        Some(q) => q,
        None => {
            let rounded = quantity::gpus_rounded_down(g);
            warnings.push(Warning::new(
                subject,
                format!("{g} GPUs written as {rounded}: Kueue quantities hold thousandths"),
            ));
            rounded
        }
    }
}

/// MIG pools: a flavor each and, on every tenant's object, a second resource group of
/// `nvidia.com/mig-<profile>` counts. A tessera quota is a share of GPUs that the solver cuts
/// into instances as demand asks; Kueue counts each profile on its own. Each profile's count is
/// what the quota would hold of that profile alone, so the counts together can exceed it.
fn add_mig(
    policy: &CompiledPolicy,
    pools: &[&CompiledPool],
    objects: &mut Vec<Value>,
    warnings: &mut Vec<Warning>,
) {
    // Profiles per pool: every profile of its layouts, by name, with compute slices and how
    // many fit one GPU.
    let mut profiles: BTreeMap<&str, BTreeMap<String, (u8, u8)>> = BTreeMap::new();
    for pool in pools {
        let entry = profiles.entry(pool.name.as_str()).or_default();
        for layout in &pool.layouts {
            for i in &layout.instances {
                let per_gpu =
                    tessera_compiler::mig::shape(i.profile_id).map_or(1, |s| s.max_per_gpu);
                entry.insert(i.profile.clone(), (i.compute_slices, per_gpu));
            }
        }
        warnings.push(Warning::new(
            format!("pool {}", pool.name),
            format!(
                "scheduler-chosen MIG geometry is not expressed: tessera picks among {} layout(s) \
                 per GPU as demand asks; Kueue takes the geometry as given (apply it with \
                 `tessera export mig-parted`) and counts each profile on its own, each count the \
                 most the quota holds of that profile alone",
                pool.layouts.len()
            ),
        ));
    }
    let covered: BTreeSet<String> = profiles
        .values()
        .flat_map(|p| p.keys().map(|n| format!("{MIG_RESOURCE_PREFIX}{n}")))
        .collect();
    let mut flavors = Vec::new();
    for pool in pools {
        flavors.push(flavor(
            &pool.name,
            &pool.node_selector,
            json!({
                annotation::GPU_MODEL: pool.gpu_model,
                annotation::NODES: pool.nodes.to_string(),
                annotation::GPUS_PER_NODE: pool.gpus_per_node.to_string(),
                annotation::SHARING: "mig",
            }),
        ));
    }
    let count = |g: Gpus, (slices, per_gpu): (u8, u8)| -> i64 {
        // Whole GPUs hold `per_gpu` each (two 3g, not 7/3); the rest, in sevenths, what fits.
        let whole = g.units() / Gpus::UNITS_PER_GPU;
        let sevenths = (g.units() % Gpus::UNITS_PER_GPU) * 7 / Gpus::UNITS_PER_GPU;
        let per_gpu = i64::from(per_gpu);
        whole * per_gpu + (sevenths / i64::from(slices.max(1))).min(per_gpu)
    };
    for object in objects.iter_mut() {
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        if kind != "Cohort" && kind != "ClusterQueue" {
            continue;
        }
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let Some(tenant) = policy.tenant(&name) else {
            continue;
        };
        let children: Vec<_> = tenant
            .children
            .iter()
            .filter_map(|c| policy.tenant(c))
            .collect();
        let inherited = |pool: &str| -> Option<Gpus> {
            match &tenant.parent {
                Some(p) => policy.tenant(p)?.quota.get(pool).map(|q| q.limit.gpus),
                None => policy.pool(pool).map(|p| p.capacity.gpus),
            }
        };
        let mut group_flavors = Vec::new();
        for pool in pools {
            let Some(q) = tenant.quota.get(&pool.name) else {
                continue;
            };
            let own = profiles
                .get(pool.name.as_str())
                .cloned()
                .unwrap_or_default();
            let mut resources = Vec::new();
            for resource in &covered {
                let profile = &resource[MIG_RESOURCE_PREFIX.len()..];
                let Some(&fit) = own.get(profile) else {
                    resources.push(json!({ "name": resource, "nominalQuota": "0" }));
                    continue;
                };
                let held = count(q.guarantee.gpus, fit);
                let kids: i64 = children
                    .iter()
                    .filter_map(|c| c.quota.get(&pool.name))
                    .map(|cq| count(cq.guarantee.gpus, fit))
                    .sum();
                let nominal = if kind == "Cohort" { held - kids } else { held };
                let mut r = Map::new();
                r.insert("name".into(), json!(resource));
                r.insert("nominalQuota".into(), json!(nominal.max(0).to_string()));
                if tenant.parent.is_some() && Some(q.limit.gpus) != inherited(&pool.name) {
                    let borrow = count(q.limit.gpus, fit) - held;
                    r.insert("borrowingLimit".into(), json!(borrow.max(0).to_string()));
                }
                if q.lending_limit.gpus != q.guarantee.gpus {
                    r.insert(
                        "lendingLimit".into(),
                        json!(count(q.lending_limit.gpus, fit).to_string()),
                    );
                }
                resources.push(Value::Object(r));
            }
            group_flavors.push(json!({ "name": pool.name, "resources": resources }));
        }
        if group_flavors.is_empty() {
            continue;
        }
        let group = json!({ "coveredResources": covered.iter().collect::<Vec<_>>(), "flavors": group_flavors });
        let spec = object["spec"].as_object_mut().expect("objects have a spec");
        match spec.get_mut("resourceGroups").and_then(Value::as_array_mut) {
            Some(groups) => groups.push(group),
            None => {
                spec.insert("resourceGroups".into(), json!([group]));
            }
        }
    }
    // After the other flavors, before the priority classes and queues.
    let at = objects
        .iter()
        .take_while(|o| o["kind"] == "ResourceFlavor")
        .count();
    objects.splice(at..at, flavors);
}

/// Everything in the policy Kueue has no field for.
fn unexpressed(policy: &CompiledPolicy) -> Vec<Warning> {
    let mut w = Vec::new();
    let domains: BTreeSet<&str> = policy
        .tenants
        .iter()
        .map(|t| t.trust_domain.as_str())
        .collect();
    if domains.len() > 1 {
        w.push(Warning::new(
            "tenants",
            format!(
                "trust domains ({}) are not expressed: Kueue does not keep tenants apart on a shared GPU",
                domains.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    for pool in &policy.pools {
        if let Some(max) = pool.reservation_max_gpus {
            w.push(Warning::new(
                format!("pool {}", pool.name),
                format!("reservations (up to {max} GPUs held for waiting gangs, with backfill) are not expressed"),
            ));
        }
        if pool.fair_share_preemption {
            w.push(Warning::new(
                format!("pool {}", pool.name),
                "fair-share preemption between borrowers is not expressed per pool: Kueue sets it for the whole installation",
            ));
        }
    }
    for t in &policy.tenants {
        if let Some(fs) = &t.fair_share
            && t.parent.is_none()
        {
            w.push(Warning::new(
                format!("tenant {}", t.name),
                format!(
                    "decayed fair share (usage half-life {}s) is not expressed: Kueue's admission fair sharing takes its half-life from the installation's configuration",
                    fs.usage_half_life_seconds
                ),
            ));
        }
    }
    for c in &policy.slo_classes {
        if !c.preemptible || c.min_runtime_seconds > 0 || c.checkpoint_signal != "SIGTERM" {
            w.push(Warning::new(
                format!("SLO class {}", c.name),
                "preemptibility, checkpoint signal, grace period and minimum runtime are not expressed: Kueue preempts by priority alone",
            ));
        }
    }
    if !policy.workloads.is_empty() {
        w.push(Warning::new(
            "workloads",
            format!("{} committed workload(s) are not exported: submit them as Jobs to the tenants' LocalQueues", policy.workloads.len()),
        ));
    }
    w
}
