//! Kueue objects (v1beta1 or v1beta2) as tessera policy documents.
//!
//! Cohorts and ClusterQueues become the tenant tree (a cohort named by `cohort`/`cohortName` or
//! `parentName` but not defined is an implicit one, as in Kueue); `nvidia.com/gpu` quotas become
//! guarantees, limits and lending limits; ResourceFlavors become pools, their hardware read from
//! the `tessera.dev/*` annotations that `export` writes (Kueue does not know it: add them to a
//! flavor written by hand); WorkloadPriorityClasses become tiers. What has no tessera meaning
//! (MIG counts, CPU and memory quotas, other kinds) is a warning. Every error names the file,
//! line and column and says what to fix; nothing is written when there is one.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use tessera_compiler::units::{Bytes, Gpus, Millicores};
use tessera_compiler::yaml::{self, SpanIndex};

use super::{GPU_RESOURCE, GROUP, MIG_RESOURCE_PREFIX, READ_VERSIONS, annotation};
use crate::fleet::{Fleet, Pool, Quota, Tenant, Tier};
use crate::{Warning, quantity};

/// What `import` produces.
#[derive(Debug, Clone, PartialEq)]
pub struct Import {
    pub fleet: Fleet,
    /// Policy documents (`tessera/v1alpha1`) for the fleet.
    pub documents: Vec<Value>,
    pub warnings: Vec<Warning>,
}

/// One problem with the input, at `file:line:col` when it is about a place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {message}")]
pub struct ImportError {
    pub location: String,
    pub message: String,
}

/// Where an object came from.
struct Source<'a> {
    file: &'a str,
    spans: SpanIndex,
}

impl Source<'_> {
    fn at(&self, pointer: &str, message: impl Into<String>) -> ImportError {
        let pos = self.spans.key_or_value(pointer);
        ImportError {
            location: format!("{}:{}:{}", self.file, pos.line, pos.column),
            message: message.into(),
        }
    }
}

/// A Cohort or ClusterQueue, read.
struct Node<'a> {
    queue: bool,
    parent: Option<String>,
    weight: f64,
    /// Per flavor: nominal quota, borrowing limit, lending limit (GPUs).
    entries: Entries,
    /// `None` for an implicit cohort.
    source: Option<(usize, &'a str)>,
}

struct Flavor {
    name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    at: usize,
}

/// Reads `files` (`(path, text)`) and translates every Kueue object in them.
pub fn import(files: &[(String, String)]) -> Result<Import, Vec<ImportError>> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut sources: Vec<Source<'_>> = Vec::new();
    let mut objects: Vec<(usize, Value)> = Vec::new();
    for (path, text) in files {
        match yaml::parse(path, text) {
            Ok(docs) => {
                for doc in docs {
                    sources.push(Source {
                        file: path,
                        spans: doc.spans,
                    });
                    objects.push((sources.len() - 1, doc.value));
                }
            }
            Err(d) => errors.push(ImportError {
                location: d
                    .location
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| path.clone()),
                message: d.message,
            }),
        }
    }

    let mut flavors: Vec<Flavor> = Vec::new();
    let mut nodes: BTreeMap<String, Node<'_>> = BTreeMap::new();
    let mut tiers: Vec<Tier> = Vec::new();
    let mut local_queues: Vec<(usize, String, String)> = Vec::new();
    for (at, object) in &objects {
        let src = &sources[*at];
        if object.is_null() {
            continue;
        }
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let Some(name) = object.pointer("/metadata/name").and_then(Value::as_str) else {
            errors.push(src.at("/metadata", "every object needs metadata.name"));
            continue;
        };
        let subject = format!("{kind} {name}");
        if !api_version.starts_with(&format!("{GROUP}/")) {
            warnings.push(Warning::new(
                subject,
                format!("skipped: {api_version:?} is not a Kueue object"),
            ));
            continue;
        }
        if !READ_VERSIONS.contains(&api_version) {
            errors.push(src.at(
                "/apiVersion",
                format!("{api_version} is not read; export the objects as v1beta1 or v1beta2"),
            ));
            continue;
        }
        if !matches!(
            kind,
            "ResourceFlavor" | "Cohort" | "ClusterQueue" | "WorkloadPriorityClass" | "LocalQueue"
        ) {
            warnings.push(Warning::new(
                subject,
                "skipped: tessera has no counterpart for this kind",
            ));
            continue;
        }
        if let Err(e) = check_name(name) {
            errors.push(src.at("/metadata/name", e));
            continue;
        }
        match kind {
            "ResourceFlavor" => {
                let labels = match string_map(object.pointer("/spec/nodeLabels")) {
                    Ok(m) => m,
                    Err(e) => {
                        errors.push(src.at("/spec/nodeLabels", e));
                        continue;
                    }
                };
                let annotations =
                    string_map(object.pointer("/metadata/annotations")).unwrap_or_default();
                flavors.push(Flavor {
                    name: name.to_string(),
                    labels,
                    annotations,
                    at: *at,
                });
            }
            "WorkloadPriorityClass" => match object["value"].as_i64() {
                Some(v) if (0..=1_000_000_000).contains(&v) => tiers.push(Tier {
                    name: name.to_string(),
                    value: v,
                }),
                Some(v) => errors.push(src.at(
                    "/value",
                    format!("priority {v}: tessera's tiers take values from 0 to 1000000000; shift the classes' values into that range"),
                )),
                None => errors.push(src.at("/value", "a WorkloadPriorityClass needs an integer value")),
            },
            "LocalQueue" => {
                let queue = object
                    .pointer("/spec/clusterQueue")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                local_queues.push((*at, name.to_string(), queue.to_string()));
            }
            _ => {
                let queue = kind == "ClusterQueue";
                let parent_field = if !queue {
                    "/spec/parentName"
                } else if api_version.ends_with("v1beta1") {
                    "/spec/cohort"
                } else {
                    "/spec/cohortName"
                };
                let parent = object.pointer(parent_field).and_then(Value::as_str).map(str::to_string);
                let weight = match object.pointer("/spec/fairSharing/weight") {
                    None | Some(Value::Null) => 1.0,
                    Some(Value::Number(n)) => n.as_f64().unwrap_or(1.0),
                    Some(Value::String(s)) => match quantity::parse_weight(s) {
                        Ok(w) => w,
                        Err(e) => {
                            errors.push(src.at("/spec/fairSharing/weight", e));
                            continue;
                        }
                    },
                    Some(_) => {
                        errors.push(src.at("/spec/fairSharing/weight", "a weight is a quantity such as \"2\""));
                        continue;
                    }
                };
                let entries = match read_groups(object, src, &subject, &mut warnings) {
                    Ok(e) => e,
                    Err(mut e) => {
                        errors.append(&mut e);
                        continue;
                    }
                };
                if let Some(old) = nodes.get(name)
                    && old.source.is_some()
                {
                    errors.push(src.at(
                        "/metadata/name",
                        format!("{name:?} is defined twice (Cohorts and ClusterQueues become tenants, whose names are unique)"),
                    ));
                    continue;
                }
                nodes.insert(
                    name.to_string(),
                    Node {
                        queue,
                        parent,
                        weight,
                        entries,
                        source: Some((*at, kind)),
                    },
                );
            }
        }
    }
    for (at, name, queue) in &local_queues {
        if !nodes.get(queue).is_some_and(|n| n.queue) {
            warnings.push(Warning::new(
                format!("LocalQueue {name}"),
                format!(
                    "points at ClusterQueue {queue:?}, which is not among the objects read ({})",
                    sources[*at].file
                ),
            ));
        }
    }

    // Implicit cohorts: named as a parent, never defined.
    let named: Vec<String> = nodes.values().filter_map(|n| n.parent.clone()).collect();
    for parent in named {
        if nodes.contains_key(&parent) {
            continue;
        }
        if let Err(e) = check_name(&parent) {
            errors.push(ImportError {
                location: parent.clone(),
                message: e,
            });
            continue;
        }
        nodes.entry(parent).or_insert(Node {
            queue: false,
            parent: None,
            weight: 1.0,
            entries: BTreeMap::new(),
            source: None,
        });
    }
    for (name, node) in &nodes {
        if let Some(p) = &node.parent
            && nodes.get(p).is_some_and(|n| n.queue)
            && let Some((at, _)) = node.source
        {
            errors.push(sources[at].at(
                "/spec",
                format!(
                    "{name}: its parent {p:?} is a ClusterQueue; only a Cohort can hold others"
                ),
            ));
        }
    }
    let roots: Vec<&String> = nodes
        .iter()
        .filter(|(_, n)| n.parent.is_none())
        .map(|(k, _)| k)
        .collect();
    if nodes.is_empty() {
        errors.push(ImportError {
            location: files.first().map(|f| f.0.clone()).unwrap_or_default(),
            message: "no Cohort or ClusterQueue found: there is no tenant tree to import".into(),
        });
    } else if roots.len() != 1 {
        errors.push(ImportError {
            location: files.first().map(|f| f.0.clone()).unwrap_or_default(),
            message: format!(
                "tessera has one tenant tree, and these Cohorts or ClusterQueues have no parent: {}; add a Cohort above them (parentName) and import again",
                roots.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", ")
            ),
        });
    }
    // A cycle leaves its members unreachable from the root.
    if roots.len() == 1 {
        let mut reached = BTreeSet::new();
        let mut stack = vec![roots[0].clone()];
        while let Some(n) = stack.pop() {
            if reached.insert(n.clone()) {
                stack.extend(
                    nodes
                        .iter()
                        .filter(|(_, v)| v.parent.as_deref() == Some(&n))
                        .map(|(k, _)| k.clone()),
                );
            }
        }
        for (name, node) in &nodes {
            if !reached.contains(name) {
                let location = node
                    .source
                    .map(|(at, _)| sources[at].at("/spec", "").location)
                    .unwrap_or_else(|| name.clone());
                errors.push(ImportError {
                    location,
                    message: format!("{name}: its parents form a cycle; break it"),
                });
            }
        }
    }

    // Pools: the flavors with GPUs.
    let gpu_flavors: BTreeSet<&str> = nodes
        .values()
        .flat_map(|n| n.entries.keys().map(String::as_str))
        .collect();
    let mut pools = Vec::new();
    for f in &flavors {
        let mig = f
            .annotations
            .get(annotation::SHARING)
            .is_some_and(|s| s == "mig");
        if mig {
            warnings.push(Warning::new(
                format!("ResourceFlavor {}", f.name),
                "skipped: a MIG flavor; declare the pool with its layouts by hand (MIG counts per profile do not say which geometry a GPU takes)",
            ));
            continue;
        }
        match pool_of(f, &sources[f.at]) {
            Ok((pool, nodes_given)) => pools.push((pool, nodes_given)),
            Err(e) => errors.push(e),
        }
    }
    for used in &gpu_flavors {
        if !flavors.iter().any(|f| f.name == *used) {
            errors.push(ImportError {
                location: files.first().map(|f| f.0.clone()).unwrap_or_default(),
                message: format!("ResourceFlavor {used:?} is used by a queue but not among the objects read; add it"),
            });
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }

    let root = roots[0].clone();
    // Guarantees bottom-up: a node's own nominal quota plus its children's guarantees.
    let mut order = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(n) = stack.pop() {
        order.push(n.clone());
        let mut kids: Vec<String> = nodes
            .iter()
            .filter(|(_, v)| v.parent.as_deref() == Some(&n))
            .map(|(k, _)| k.clone())
            .collect();
        kids.sort();
        kids.reverse();
        stack.extend(kids);
    }
    let pool_names: Vec<String> = pools.iter().map(|(p, _)| p.name.clone()).collect();
    let mut guarantee: BTreeMap<(String, String), Gpus> = BTreeMap::new();
    let mut listed: BTreeSet<(String, String)> = BTreeSet::new();
    for name in order.iter().rev() {
        let node = &nodes[name];
        for pool in &pool_names {
            let key = (name.clone(), pool.clone());
            let own = node.entries.get(pool).map(|e| e.0);
            let mut sum = own.unwrap_or(Gpus::ZERO);
            let mut any = own.is_some();
            for (kid, v) in &nodes {
                if v.parent.as_deref() == Some(name) {
                    let k = (kid.clone(), pool.clone());
                    if listed.contains(&k) {
                        any = true;
                        sum += guarantee[&k];
                    }
                }
            }
            if any {
                listed.insert(key.clone());
                guarantee.insert(key, sum);
            }
        }
    }
    // Capacity: given, or the root's guarantee in whole nodes.
    let mut fleet_pools = Vec::new();
    for (mut pool, nodes_given) in pools {
        if !nodes_given {
            let g = guarantee
                .get(&(root.clone(), pool.name.clone()))
                .copied()
                .unwrap_or(Gpus::ZERO);
            let per_node = i64::from(pool.gpus_per_node) * Gpus::UNITS_PER_GPU;
            pool.nodes =
                u32::try_from(((g.units() + per_node - 1) / per_node).max(1)).unwrap_or(u32::MAX);
            warnings.push(Warning::new(
                format!("ResourceFlavor {}", pool.name),
                format!("no {} annotation: capacity taken as {} node(s), the root's quota in whole nodes", annotation::NODES, pool.nodes),
            ));
        }
        fleet_pools.push(pool);
    }
    // Limits top-down.
    let mut tenants = Vec::new();
    let mut limits: BTreeMap<(String, String), Gpus> = BTreeMap::new();
    for name in &order {
        let node = &nodes[name];
        let mut quota = BTreeMap::new();
        for pool in &fleet_pools {
            let key = (name.clone(), pool.name.clone());
            if !listed.contains(&key) {
                continue;
            }
            let g = guarantee[&key];
            let (borrow, lend) = node
                .entries
                .get(&pool.name)
                .map(|e| (e.1, e.2))
                .unwrap_or((None, None));
            let inherited = match &node.parent {
                Some(p) => limits.get(&(p.clone(), pool.name.clone())).copied(),
                None => Some(pool.capacity()),
            };
            let limit = match (borrow, node.parent.is_some()) {
                (Some(b), true) => g + b,
                _ => inherited.unwrap_or(g),
            };
            if limit == Gpus::ZERO {
                continue;
            }
            limits.insert(key, limit);
            quota.insert(
                pool.name.clone(),
                Quota {
                    guarantee: g,
                    limit,
                    lending_limit: lend.unwrap_or(g),
                },
            );
        }
        tenants.push(Tenant {
            name: name.clone(),
            parent: node.parent.clone(),
            weight: node.weight,
            quota,
        });
    }
    if tiers.is_empty() {
        warnings.push(Warning::new(
            "tiers",
            "no WorkloadPriorityClass: one tier `default` (value 0) is written",
        ));
        tiers.push(Tier {
            name: "default".into(),
            value: 0,
        });
    }
    let fleet = Fleet {
        tiers,
        pools: fleet_pools,
        tenants,
    }
    .normalized();
    let documents = fleet.to_documents();
    warnings.sort();
    warnings.dedup();
    Ok(Import {
        fleet,
        documents,
        warnings,
    })
}

/// Tenant, pool and tier names are DNS labels in tessera; Kueue allows dots.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_lowercase()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a tessera name (a DNS label: lower-case letters, digits and '-', starting with a letter, at most 63); rename the object"
        ))
    }
}

fn string_map(value: Option<&Value>) -> Result<BTreeMap<String, String>, String> {
    match value {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Ok((k.clone(), other.to_string())),
            })
            .collect(),
        Some(_) => Err("expected a mapping of strings".into()),
    }
}

type Entries = BTreeMap<String, (Gpus, Option<Gpus>, Option<Gpus>)>;

fn read_groups(
    object: &Value,
    src: &Source<'_>,
    subject: &str,
    warnings: &mut Vec<Warning>,
) -> Result<Entries, Vec<ImportError>> {
    let mut entries = BTreeMap::new();
    let mut errors = Vec::new();
    let Some(groups) = object.pointer("/spec/resourceGroups") else {
        return Ok(entries);
    };
    let Some(groups) = groups.as_array() else {
        return Err(vec![
            src.at("/spec/resourceGroups", "expected a list of resource groups"),
        ]);
    };
    for (g, group) in groups.iter().enumerate() {
        let flavors = group["flavors"].as_array().cloned().unwrap_or_default();
        for (f, flavor) in flavors.iter().enumerate() {
            let base = format!("/spec/resourceGroups/{g}/flavors/{f}");
            let Some(flavor_name) = flavor["name"].as_str() else {
                errors.push(src.at(&base, "a flavor entry needs a name"));
                continue;
            };
            let resources = flavor["resources"].as_array().cloned().unwrap_or_default();
            for (r, resource) in resources.iter().enumerate() {
                let at = format!("{base}/resources/{r}");
                let name = resource["name"].as_str().unwrap_or_default();
                if name == GPU_RESOURCE {
                    let amount = |field: &str| -> Result<Option<Gpus>, ImportError> {
                        let pointer = format!("{at}/{field}");
                        match &resource[field] {
                            Value::Null => Ok(None),
                            Value::Number(n) => n
                                .as_u64()
                                .map(|v| Some(Gpus::whole(v as i64)))
                                .ok_or_else(|| src.at(&pointer, format!("{n}: a GPU quota is a whole number or a quantity string"))),
                            Value::String(s) => quantity::parse_gpus(s).map(Some).map_err(|e| src.at(&pointer, e)),
                            _ => Err(src.at(&pointer, "expected a quantity")),
                        }
                    };
                    match (
                        amount("nominalQuota"),
                        amount("borrowingLimit"),
                        amount("lendingLimit"),
                    ) {
                        (Ok(n), Ok(b), Ok(l)) => {
                            let n = n.unwrap_or(Gpus::ZERO);
                            if let Some(l) = l
                                && l > n
                            {
                                warnings.push(Warning::new(
                                    subject,
                                    format!("flavor {flavor_name}: lendingLimit above nominalQuota; tessera lends at most the guarantee"),
                                ));
                            }
                            if entries.insert(flavor_name.to_string(), (n, b, l)).is_some() {
                                errors.push(
                                    src.at(&at, format!("flavor {flavor_name:?} is listed twice")),
                                );
                            }
                        }
                        (n, b, l) => {
                            errors.extend([n.err(), b.err(), l.err()].into_iter().flatten())
                        }
                    }
                } else if name.starts_with(MIG_RESOURCE_PREFIX) {
                    warnings.push(Warning::new(
                        subject,
                        format!("MIG quotas ({MIG_RESOURCE_PREFIX}*) are not imported: tessera counts a MIG pool's quota in GPUs; set it by hand"),
                    ));
                } else {
                    warnings.push(Warning::new(
                        subject,
                        format!("quota of {name:?} is not imported: only {GPU_RESOURCE} is"),
                    ));
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(entries)
    } else {
        Err(errors)
    }
}

/// A pool from a flavor's annotations; `bool`: whether the node count was given.
fn pool_of(f: &Flavor, src: &Source<'_>) -> Result<(Pool, bool), ImportError> {
    let at = "/metadata/annotations";
    let need = |key: &str, example: &str| -> Result<&String, ImportError> {
        f.annotations.get(key).ok_or_else(|| {
            src.at(
                if f.annotations.is_empty() { "/metadata" } else { at },
                format!(
                    "ResourceFlavor {}: Kueue does not know the hardware; add the annotation `{key}: \"{example}\"` (also {}, {}, {} and optionally {})",
                    f.name,
                    annotation::GPU_MODEL,
                    annotation::GPUS_PER_NODE,
                    annotation::CPU_PER_NODE,
                    annotation::NODES
                ),
            )
        })
    };
    let gpu_model = need(annotation::GPU_MODEL, "H100-SXM5-80GB")?.clone();
    let per_node = need(annotation::GPUS_PER_NODE, "8")?;
    let gpus_per_node: u32 = per_node
        .parse()
        .ok()
        .filter(|n| (1..=72).contains(n))
        .ok_or_else(|| {
            src.at(
                at,
                format!(
                    "{}: {per_node:?} is not a GPU count from 1 to 72",
                    annotation::GPUS_PER_NODE
                ),
            )
        })?;
    let cpu_text = need(annotation::CPU_PER_NODE, "200")?;
    let cpu_per_node = Millicores::parse(cpu_text).ok_or_else(|| {
        src.at(
            at,
            format!(
                "{}: {cpu_text:?} is not a CPU amount (200, 500m)",
                annotation::CPU_PER_NODE
            ),
        )
    })?;
    let memory_text = need(annotation::MEMORY_PER_NODE, "1800Gi")?;
    let memory_per_node = Bytes::parse(memory_text).ok_or_else(|| {
        src.at(
            at,
            format!(
                "{}: {memory_text:?} is not a memory amount (1800Gi)",
                annotation::MEMORY_PER_NODE
            ),
        )
    })?;
    let (nodes, given) = match f.annotations.get(annotation::NODES) {
        Some(n) => (
            n.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                src.at(
                    at,
                    format!("{}: {n:?} is not a node count", annotation::NODES),
                )
            })?,
            true,
        ),
        None => (1, false),
    };
    Ok((
        Pool {
            name: f.name.clone(),
            gpu_model,
            node_selector: f.labels.clone(),
            nodes,
            gpus_per_node,
            cpu_per_node,
            memory_per_node,
        },
        given,
    ))
}
