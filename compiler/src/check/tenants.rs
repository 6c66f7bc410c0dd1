//! The tenant tree: one root, no cycles, quotas that nest, and every inherited value resolved.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

use super::models::{Models, unknown_model};
use super::{Repo, Sink, unknown_reference};
use crate::compiled::{
    Amounts, CompiledFairShare, CompiledPool, CompiledSloClass, CompiledTenant, PoolQuota,
};
use crate::diagnostic::{Code, Diagnostic, did_you_mean};
use crate::load::LoadedDocument;
use crate::model::{Document, FairShare, Kind, Quota, TenantSpec, UsageResource};
use crate::units::{Bytes, Millicores};
use crate::yaml::escape;

struct Node<'a> {
    doc: &'a LoadedDocument,
    spec: &'a TenantSpec,
}

pub(crate) fn resolve(
    repo: &Repo,
    models: &Models,
    pools: &[CompiledPool],
    classes: &[CompiledSloClass],
    sink: &mut Sink,
) -> Vec<CompiledTenant> {
    let nodes: BTreeMap<&str, Node> = repo
        .of(Kind::Tenant)
        .filter_map(|doc| match &doc.document {
            Document::Tenant(spec) => Some((doc.name.as_str(), Node { doc, spec })),
            _ => None,
        })
        .collect();
    if nodes.is_empty() {
        return Vec::new();
    }

    // Parents resolve.
    let mut parent_ok = BTreeMap::new();
    for (name, n) in &nodes {
        if let Some(p) = &n.spec.parent {
            if nodes.contains_key(p.as_str()) {
                parent_ok.insert(*name, p.as_str());
            } else if !repo.defined(Kind::Tenant, p) {
                sink.push(unknown_reference(
                    Code::UnknownParent,
                    "parent tenant",
                    p,
                    nodes.keys().copied(),
                    "name an existing Tenant, or remove `parent` to make this the root",
                    n.doc,
                    "/spec/parent",
                ));
            }
        }
    }

    // Exactly one root.
    let roots: Vec<&str> = nodes
        .iter()
        .filter(|(_, n)| n.spec.parent.is_none())
        .map(|(name, _)| *name)
        .collect();
    match roots.as_slice() {
        [] => {
            let first = nodes.values().next().expect("nodes is not empty");
            sink.push(
                Diagnostic::new(
                    Code::NoRootTenant,
                    "every tenant has a parent, so the tree has no root",
                )
                .at(first.doc.value_loc("/metadata/name"))
                .field("spec.parent")
                .help("remove `parent` from the tenant at the top of the tree (the organisation)"),
            );
        }
        [_] => {}
        [first, rest @ ..] => {
            for r in rest {
                sink.push(
                    Diagnostic::new(
                        Code::MultipleRootTenants,
                        format!("tenant `{r}` has no parent, and neither has `{first}`: the tree has more than one root"),
                    )
                    .at(nodes[r].doc.value_loc("/metadata/name"))
                    .field("spec.parent")
                    .help(format!("give `{r}` a parent (for example `parent: {first}`)")),
                );
            }
        }
    }

    let in_cycle = report_cycles(&nodes, &parent_ok, sink);

    // References inside each tenant.
    let class_names: BTreeSet<&str> = classes.iter().map(|c| c.name.as_str()).collect();
    let pool_names: BTreeSet<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    let mut refs_ok: BTreeSet<&str> = BTreeSet::new();
    for (name, n) in &nodes {
        let mut ok = true;
        for (field, map) in [
            ("guarantee", &n.spec.guarantee),
            ("limit", &n.spec.limit),
            ("lendingLimit", &n.spec.lending_limit),
        ] {
            for key in map.keys() {
                if pool_names.contains(key.as_str()) {
                    continue;
                }
                ok = false;
                if repo.defined(Kind::Pool, key) {
                    continue; // the pool itself is broken and reported there
                }
                let mut help = format!(
                    "quota is keyed by pool name; pools: {}",
                    pool_names.iter().copied().collect::<Vec<_>>().join(", ")
                );
                if let Some(s) = did_you_mean(key, pool_names.iter().copied()) {
                    help = format!("did you mean `{s}`? {help}");
                }
                sink.push(
                    Diagnostic::new(
                        Code::UnknownPool,
                        format!("unknown pool `{key}` in `{field}`"),
                    )
                    .at(n.doc.loc(&format!("/spec/{field}/{}", escape(key))))
                    .field(format!("spec.{field}.{key}"))
                    .help(help),
                );
            }
        }
        if let Some(list) = &n.spec.slo_classes {
            for (i, c) in list.iter().enumerate() {
                if class_names.contains(c.as_str()) {
                    continue;
                }
                ok = false;
                if repo.defined(Kind::SloClass, c) {
                    continue;
                }
                let mut help = format!(
                    "classes: {}",
                    class_names.iter().copied().collect::<Vec<_>>().join(", ")
                );
                if let Some(s) = did_you_mean(c, class_names.iter().copied()) {
                    help = format!("did you mean `{s}`? {help}");
                }
                sink.push(
                    Diagnostic::new(Code::UnknownSloClass, format!("unknown SLO class `{c}`"))
                        .at(n.doc.value_loc(&format!("/spec/sloClasses/{i}")))
                        .field(format!("spec.sloClasses[{i}]"))
                        .help(help),
                );
            }
        }
        if ok {
            refs_ok.insert(*name);
        }
        if let Some(fs) = &n.spec.fair_share {
            check_fair_share(repo, n.doc, fs, models, sink);
        }
    }

    // Walk the tree from the root, resolving inherited values and checking quotas nest.
    let Some(root) = roots.first().copied() else {
        return Vec::new();
    };
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (child, parent) in &parent_ok {
        if !in_cycle.contains(child) {
            children.entry(parent).or_default().push(child);
        }
    }
    let mut out = Vec::new();
    let capacity: BTreeMap<&str, Amounts> = pools
        .iter()
        .map(|p| (p.name.as_str(), p.capacity))
        .collect();
    let all_classes: Vec<String> = classes.iter().map(|c| c.name.clone()).collect();
    let root_node = &nodes[root];
    check_root_capacity(root_node, pools, sink);
    let root_ctx = Inherited {
        path: Vec::new(),
        trust_domain: root.to_owned(),
        classes: all_classes,
        limits: capacity.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        fair_share: None,
    };
    // Depth first with an explicit stack, children in name order: the same order as a
    // recursive walk, without making the tree's depth this thread's stack depth.
    let mut pending: Vec<(&str, Option<&str>, Rc<Inherited>, usize)> =
        vec![(root, None, Rc::new(root_ctx), 1)];
    while let Some((name, parent, inherited, depth)) = pending.pop() {
        if depth > MAX_TENANT_DEPTH {
            sink.push(too_deep(&nodes[name], name, root, depth));
            continue;
        }
        let next = Rc::new(resolve_one(
            name, parent, &inherited, &nodes, &children, &refs_ok, pools, sink, &mut out,
        ));
        if let Some(kids) = children.get(name) {
            for k in kids.iter().rev() {
                pending.push((k, Some(name), Rc::clone(&next), depth + 1));
            }
        }
    }
    out
}

/// How deep the tenant tree may be, the root being level 1. Real organisations are a handful
/// of levels deep; the bound keeps compile time and the compiled policy linear in the number
/// of tenants (each tenant carries its path from the root).
pub const MAX_TENANT_DEPTH: usize = 64;

fn too_deep(n: &Node, name: &str, root: &str, depth: usize) -> Diagnostic {
    Diagnostic::new(
        Code::TenantTreeTooDeep,
        format!(
            "tenant `{name}` is at level {depth} below root `{root}` (level 1): the tenant tree may be at most {MAX_TENANT_DEPTH} levels deep"
        ),
    )
    .at(n.doc.value_loc("/spec/parent"))
    .field("spec.parent")
    .help("attach this tenant higher up the tree; it and the tenants below it are not checked until the tree fits")
}

/// Reports every cycle of `parent` links once, at its smallest member, and returns the tenants
/// on cycles. Linear: each tenant is visited by one walk up the tree, which stops at the first
/// tenant an earlier walk has seen.
fn report_cycles<'a>(
    nodes: &BTreeMap<&'a str, Node>,
    parent_ok: &BTreeMap<&'a str, &'a str>,
    sink: &mut Sink,
) -> BTreeSet<&'a str> {
    let mut in_cycle: BTreeSet<&str> = BTreeSet::new();
    // For each tenant seen: the walk that saw it and its index on that walk's path.
    let mut seen: HashMap<&str, (usize, usize)> = HashMap::with_capacity(nodes.len());
    for (walk, start) in nodes.keys().copied().enumerate() {
        let mut path: Vec<&str> = Vec::new();
        let mut cur = start;
        loop {
            if let Some(&(w, at)) = seen.get(cur) {
                if w == walk {
                    report_cycle(&path[at..], nodes, sink);
                    in_cycle.extend(path[at..].iter().copied());
                }
                break;
            }
            seen.insert(cur, (walk, path.len()));
            path.push(cur);
            match parent_ok.get(cur) {
                Some(&p) => cur = p,
                None => break,
            }
        }
    }
    in_cycle
}

/// One cycle, given in parent order, reported at its smallest member and read from there.
fn report_cycle(cycle: &[&str], nodes: &BTreeMap<&str, Node>, sink: &mut Sink) {
    let (first, smallest) = cycle
        .iter()
        .enumerate()
        .min_by_key(|(_, n)| **n)
        .map(|(i, n)| (i, *n))
        .expect("a cycle has a member");
    let mut path: Vec<&str> = cycle[first..]
        .iter()
        .chain(&cycle[..first])
        .copied()
        .collect();
    path.push(smallest);
    sink.push(
        Diagnostic::new(
            Code::TenantCycle,
            format!("tenants form a cycle: {}", path.join(" → ")),
        )
        .at(nodes[smallest].doc.value_loc("/spec/parent"))
        .field("spec.parent")
        .help("a tenant cannot be its own ancestor: point one of these parents up the tree"),
    );
}

/// What a tenant inherits from its parent.
struct Inherited {
    path: Vec<String>,
    trust_domain: String,
    classes: Vec<String>,
    /// Effective limit per pool.
    limits: BTreeMap<String, Amounts>,
    fair_share: Option<CompiledFairShare>,
}

/// A fair-share setting on its own: a half-life that decays, each resource once, and weights
/// of models that exist.
fn check_fair_share(
    repo: &Repo,
    doc: &LoadedDocument,
    fs: &FairShare,
    models: &Models,
    sink: &mut Sink,
) {
    if fs.usage_half_life.seconds() == 0 {
        sink.push(
            Diagnostic::new(
                Code::InvalidFairShare,
                "`usageHalfLife` is 0s: past usage would be forgotten the moment it is recorded",
            )
            .at(doc.value_loc("/spec/fairShare/usageHalfLife"))
            .field("spec.fairShare.usageHalfLife")
            .help("give a half-life such as `24h` or `7d`, or omit `fairShare` to count current usage only"),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, r) in fs.resources.iter().enumerate() {
        if !seen.insert(*r) {
            let name = r.as_str();
            sink.push(
                Diagnostic::new(
                    Code::DuplicateUsageResource,
                    format!("`{name}` is listed more than once in `fairShare.resources`"),
                )
                .at(doc.value_loc(&format!("/spec/fairShare/resources/{i}")))
                .field(format!("spec.fairShare.resources[{i}]"))
                .help("a resource counts once however often it is listed; remove the repetition"),
            );
        }
    }
    for (model, weight) in &fs.gpu_model_weights {
        let pointer = format!("/spec/fairShare/gpuModelWeights/{}", escape(model));
        if !models.contains_key(model) && !repo.defined(Kind::GpuModel, model) {
            // At the key: the name is what is wrong, not the weight.
            sink.push(unknown_model(models, doc, &pointer, model).at(doc.loc(&pointer)));
        }
        if !(weight.is_finite() && *weight > 0.0) {
            sink.push(
                Diagnostic::new(
                    Code::InvalidFairShare,
                    format!("the weight of `{model}` in `gpuModelWeights` is {weight}: it must be a finite number above 0"),
                )
                .at(doc.value_loc(&pointer))
                .field(format!("spec.fairShare.gpuModelWeights.{model}"))
                .help("a GPU-hour of the model counts this many GPU-hours; remove the entry to count it as 1"),
            );
        }
    }
}

/// The fair-share setting as the solver reads it.
fn lower_fair_share(f: &FairShare) -> CompiledFairShare {
    CompiledFairShare {
        usage_half_life_seconds: f.usage_half_life.seconds(),
        gpu: f.resources.contains(&UsageResource::Gpu),
        cpu: f.resources.contains(&UsageResource::Cpu),
        memory: f.resources.contains(&UsageResource::Memory),
        gpu_model_weights: f.gpu_model_weights.clone(),
    }
}

/// Resolves one tenant from what its parent passes down, checks its quotas against the
/// parent's and its children's guarantees against its own, and returns what it passes down.
#[allow(clippy::too_many_arguments)]
fn resolve_one(
    name: &str,
    parent: Option<&str>,
    inherited: &Inherited,
    nodes: &BTreeMap<&str, Node>,
    children: &BTreeMap<&str, Vec<&str>>,
    refs_ok: &BTreeSet<&str>,
    pools: &[CompiledPool],
    sink: &mut Sink,
    out: &mut Vec<CompiledTenant>,
) -> Inherited {
    let n = &nodes[name];
    let spec = n.spec;
    let doc = n.doc;

    // SLO classes: own (a subset of the parent's) or inherited.
    let classes = match &spec.slo_classes {
        Some(own) => {
            for (i, c) in own.iter().enumerate() {
                if parent.is_some() && !inherited.classes.contains(c) && refs_ok.contains(name) {
                    sink.push(
                        Diagnostic::new(
                            Code::SloClassNotInherited,
                            format!("SLO class `{c}` is not allowed for parent `{}`", parent.unwrap_or_default()),
                        )
                        .at(doc.value_loc(&format!("/spec/sloClasses/{i}")))
                        .field(format!("spec.sloClasses[{i}]"))
                        .help(format!(
                            "a tenant may use only its parent's classes ({}); allow `{c}` on the parent first",
                            inherited.classes.join(", ")
                        )),
                    );
                }
            }
            let mut v = own.clone();
            v.sort();
            v.dedup();
            v
        }
        None => inherited.classes.clone(),
    };

    let mut quota = BTreeMap::new();
    let mut limits = BTreeMap::new();
    for pool in pools {
        let p = pool.name.as_str();
        let parent_limit = inherited.limits.get(p).copied().unwrap_or_default();
        let guarantee = amounts_of(spec.guarantee.get(p));
        let own_limit = spec.limit.get(p).map(|q| q.resources());
        let limit = match own_limit {
            Some(l) => Amounts {
                gpus: l.gpus,
                cpu: l.cpu.or(parent_limit.cpu),
                memory: l.memory.or(parent_limit.memory),
            },
            None => parent_limit,
        };
        let pointer = |field: &str| format!("/spec/{field}/{}", escape(p));
        if own_limit.is_some()
            && let Some(what) = exceeds(&limit, &parent_limit, Absent::Unbounded)
        {
            sink.push(
                Diagnostic::new(
                    Code::LimitExceedsParent,
                    format!(
                        "limit in pool `{p}` ({}) is above {} ({})",
                        show(&limit, what),
                        parent.map(|p| format!("parent `{p}`'s limit")).unwrap_or_else(|| "the pool's capacity".to_owned()),
                        show(&parent_limit, what)
                    ),
                )
                .at(doc.value_loc(&pointer("limit")))
                .field(format!("spec.limit.{p}"))
                .help("a tenant can never use more than its parent may; lower the limit or raise the parent's"),
            );
        }
        // At the root without its own limit the limit is the capacity, checked on its own.
        let limit_is_capacity = parent.is_none() && own_limit.is_none();
        if spec.guarantee.contains_key(p)
            && !limit_is_capacity
            && let Some(what) = exceeds(&guarantee, &limit, Absent::Unbounded)
        {
            sink.push(
                Diagnostic::new(
                    Code::GuaranteeExceedsLimit,
                    format!(
                        "guarantee in pool `{p}` ({}) is above the tenant's limit ({})",
                        show(&guarantee, what),
                        show(&limit, what)
                    ),
                )
                .at(doc.value_loc(&pointer("guarantee")))
                .field(format!("spec.guarantee.{p}"))
                .help("a guarantee the tenant may not use is never honoured; lower it to the limit or raise the limit"),
            );
        }
        let lending = match spec.lending_limit.get(p) {
            Some(q) => {
                let l = amounts_of(Some(q));
                if let Some(what) = exceeds(&l, &guarantee, Absent::Zero) {
                    sink.push(
                        Diagnostic::new(
                            Code::LendingLimitExceedsGuarantee,
                            format!(
                                "lending limit in pool `{p}` ({}) is above the guarantee ({})",
                                show(&l, what),
                                show(&guarantee, what)
                            ),
                        )
                        .at(doc.value_loc(&pointer("lendingLimit")))
                        .field(format!("spec.lendingLimit.{p}"))
                        .help("a tenant can lend only what it is guaranteed; lower the lending limit or raise the guarantee"),
                    );
                }
                l
            }
            None => guarantee,
        };

        // Children's guarantees fit in this tenant's.
        if let Some(kids) = children.get(name) {
            let mut sum = Amounts::default();
            let mut any = false;
            for k in kids {
                if let Some(q) = nodes[k].spec.guarantee.get(p) {
                    any = true;
                    let r = q.resources();
                    sum.gpus += r.gpus;
                    sum.cpu = add(sum.cpu.map(|c| c.0), r.cpu.map(|c| c.0)).map(Millicores);
                    sum.memory = add(sum.memory.map(|m| m.0), r.memory.map(|m| m.0)).map(Bytes);
                }
            }
            if any && let Some(what) = exceeds(&sum, &guarantee, Absent::Zero) {
                let names: Vec<&str> = kids
                    .iter()
                    .filter(|k| nodes[*k].spec.guarantee.contains_key(p))
                    .copied()
                    .collect();
                let at = if spec.guarantee.contains_key(p) {
                    doc.value_loc(&pointer("guarantee"))
                } else {
                    doc.value_loc("/metadata/name")
                };
                sink.push(
                    Diagnostic::new(
                        Code::ChildGuaranteesExceedParent,
                        format!(
                            "the guarantees of `{name}`'s children in pool `{p}` add up to {}, more than `{name}`'s own {}",
                            show(&sum, what),
                            show(&guarantee, what)
                        ),
                    )
                    .at(at)
                    .field(format!("spec.guarantee.{p}"))
                    .help(format!(
                        "children ({}) can only split what their parent is guaranteed: raise `{name}`'s guarantee or lower theirs",
                        names.join(", ")
                    )),
                );
            }
        }
        if limit.gpus.units() > 0 {
            quota.insert(
                p.to_owned(),
                PoolQuota {
                    guarantee,
                    limit,
                    lending_limit: lending,
                },
            );
        }
        limits.insert(p.to_owned(), limit);
    }

    let trust_domain = spec
        .trust_domain
        .clone()
        .unwrap_or_else(|| inherited.trust_domain.clone());
    let mut path = inherited.path.clone();
    path.push(name.to_owned());
    let fair_share = spec
        .fair_share
        .as_ref()
        .map(lower_fair_share)
        .or_else(|| inherited.fair_share.clone());
    let kids: Vec<String> = children
        .get(name)
        .map(|k| k.iter().map(|s| s.to_string()).collect())
        .unwrap_or_default();
    out.push(CompiledTenant {
        name: name.to_owned(),
        parent: parent.map(str::to_owned),
        path: path.clone(),
        children: kids,
        trust_domain: trust_domain.clone(),
        weight: spec.weight.unwrap_or(1.0),
        slo_classes: classes.clone(),
        quota,
        fair_share: fair_share.clone(),
    });
    Inherited {
        path,
        trust_domain,
        classes,
        limits,
        fair_share,
    }
}

fn check_root_capacity(root: &Node, pools: &[CompiledPool], sink: &mut Sink) {
    for pool in pools {
        let Some(q) = root.spec.guarantee.get(&pool.name) else {
            continue;
        };
        let g = amounts_of(Some(q));
        if let Some(what) = exceeds(&g, &pool.capacity, Absent::Unbounded) {
            sink.push(
                Diagnostic::new(
                    Code::GuaranteeExceedsCapacity,
                    format!(
                        "the root's guarantee in pool `{}` ({}) is more than the pool holds ({})",
                        pool.name,
                        show(&g, what),
                        show(&pool.capacity, what)
                    ),
                )
                .at(root.doc.value_loc(&format!("/spec/guarantee/{}", escape(&pool.name))))
                .field(format!("spec.guarantee.{}", pool.name))
                .help(format!(
                    "pool `{}` declares {} nodes × {} GPUs; lower the guarantee or grow the pool's capacity",
                    pool.name, pool.nodes, pool.gpus_per_node
                )),
            );
        }
    }
}

fn amounts_of(q: Option<&Quota>) -> Amounts {
    let Some(q) = q else {
        return Amounts::default();
    };
    let r = q.resources();
    Amounts {
        gpus: r.gpus,
        cpu: r.cpu,
        memory: r.memory,
    }
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
    }
}

#[derive(Clone, Copy)]
enum Resource {
    Gpus,
    Cpu,
    Memory,
}

/// How an absent CPU or memory reads on the right-hand side of a comparison.
#[derive(Clone, Copy)]
enum Absent {
    /// In a limit: no ceiling.
    Unbounded,
    /// In a guarantee: nothing guaranteed.
    Zero,
}

/// The first resource in which `a` exceeds `b`. Absent CPU or memory in `a` counts as zero.
fn exceeds(a: &Amounts, b: &Amounts, absent: Absent) -> Option<Resource> {
    if a.gpus > b.gpus {
        return Some(Resource::Gpus);
    }
    let over = |x: Option<u64>, y: Option<u64>| match (x, y, absent) {
        (Some(x), Some(y), _) => x > y,
        (Some(x), None, Absent::Zero) => x > 0,
        _ => false,
    };
    if over(a.cpu.map(|c| c.0), b.cpu.map(|c| c.0)) {
        return Some(Resource::Cpu);
    }
    if over(a.memory.map(|m| m.0), b.memory.map(|m| m.0)) {
        return Some(Resource::Memory);
    }
    None
}

fn show(a: &Amounts, what: Resource) -> String {
    match what {
        Resource::Gpus => format!("{} GPUs", a.gpus),
        Resource::Cpu => format!("cpu {}", a.cpu.map(|c| c.to_string()).unwrap_or("0".into())),
        Resource::Memory => format!(
            "memory {}",
            a.memory.map(|m| m.to_string()).unwrap_or("0".into())
        ),
    }
}
