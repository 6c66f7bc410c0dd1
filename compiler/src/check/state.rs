//! A `ClusterState` snapshot: consistent in itself, and with the policy it is read against.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use tessera_mig as mig;

use super::Sink;
use super::models::{unknown_model, unknown_profile};
use super::workloads::{Ctx, resolve_spec};
use crate::compiled::GpuDemand;
use crate::diagnostic::{Code, Diagnostic, did_you_mean};
use crate::key::{WorkloadKey, resolve_reference};
use crate::load::LoadedDocument;
use crate::model::{Binding, ClusterStateSpec, Document, Health, Kind, UsageRecord};
use crate::units::Gpus;
use crate::yaml::escape;

pub(crate) fn check(ctx: &Ctx, sink: &mut Sink) {
    for doc in ctx.repo.of(Kind::ClusterState) {
        if let Document::ClusterState(spec) = &doc.document {
            check_one(ctx, doc, spec, sink);
        }
    }
}

fn bad(doc: &LoadedDocument, pointer: &str, message: String, help: &str) -> Diagnostic {
    Diagnostic::new(Code::InvalidClusterState, message)
        .at(doc.value_loc(pointer))
        .field(crate::schema::dotted(pointer))
        .help(help)
}

/// What occupies one GPU according to the bindings.
#[derive(Default)]
struct Occupancy {
    whole: Option<String>,
    instances: BTreeMap<u8, String>,
    shares: Gpus,
    clients: u32,
}

fn check_one(ctx: &Ctx, doc: &LoadedDocument, spec: &ClusterStateSpec, sink: &mut Sink) {
    // GPU (node, index) -> (pool, instances by start -> profile id)
    let mut gpus: GpuTable = BTreeMap::new();
    let mut node_names = BTreeSet::new();
    let mut uuids = BTreeSet::new();
    for (n, node) in spec.nodes.iter().enumerate() {
        let np = format!("/spec/nodes/{n}");
        if !node_names.insert(node.name.as_str()) {
            sink.push(bad(
                doc,
                &format!("{np}/name"),
                format!("node `{}` is listed twice", node.name),
                "list each node once",
            ));
            continue;
        }
        let pool = ctx.pools.iter().find(|p| p.name == node.pool);
        if pool.is_none() && !ctx.repo.defined(Kind::Pool, &node.pool) {
            sink.push(
                Diagnostic::new(
                    Code::UnknownPool,
                    format!("node `{}` is in unknown pool `{}`", node.name, node.pool),
                )
                .at(doc.value_loc(&format!("{np}/pool")))
                .field(crate::schema::dotted(&format!("{np}/pool")))
                .help("every node belongs to a Pool of the policy"),
            );
        }
        let mut indices = BTreeSet::new();
        for (g, gpu) in node.gpus.iter().enumerate() {
            let gp = format!("{np}/gpus/{g}");
            if !indices.insert(gpu.index) {
                sink.push(bad(
                    doc,
                    &format!("{gp}/index"),
                    format!(
                        "GPU index {} appears twice on node `{}`",
                        gpu.index, node.name
                    ),
                    "GPU indices on a node are unique",
                ));
                continue;
            }
            if !uuids.insert(gpu.uuid.as_str()) {
                sink.push(bad(
                    doc,
                    &format!("{gp}/uuid"),
                    format!("GPU UUID {} appears twice", gpu.uuid),
                    "a UUID names one GPU",
                ));
            }
            let Some(model) = ctx.models.get(&gpu.model) else {
                if !ctx.repo.defined(Kind::GpuModel, &gpu.model) {
                    sink.push(unknown_model(
                        ctx.models,
                        doc,
                        &format!("{gp}/model"),
                        &gpu.model,
                    ));
                }
                continue;
            };
            if let Some(p) = pool
                && p.gpu_model != gpu.model
            {
                sink.push(bad(
                    doc,
                    &format!("{gp}/model"),
                    format!(
                        "GPU model {} on node `{}`, but pool `{}` is {}",
                        gpu.model, node.name, p.name, p.gpu_model
                    ),
                    "a pool's nodes all have the pool's GPU model: move the node to another pool",
                ));
            }
            let mut placements = Vec::new();
            let mut by_start = BTreeMap::new();
            if !gpu.instances.is_empty() && !gpu.mig.enabled {
                sink.push(bad(
                    doc,
                    &format!("{gp}/instances"),
                    format!("GPU {} has MIG instances but MIG is not enabled", gpu.uuid),
                    "set `mig: {enabled: true}` or remove the instances",
                ));
            }
            let mut resolved = true;
            for (i, inst) in gpu.instances.iter().enumerate() {
                let ip = format!("{gp}/instances/{i}");
                match model.info.resolve_profile(&inst.profile) {
                    Some(id) => {
                        placements.push(mig::Placement {
                            profile_id: id,
                            start: inst.start,
                        });
                        by_start.insert(inst.start, id);
                    }
                    None if gpu.health != Health::Healthy => {
                        // What the reconciler writes for an instance made by hand in a
                        // profile the catalog lacks: the GPU is reported unhealthy, and kept
                        // out of placement and re-partitioning rather than failing the fleet.
                        resolved = false;
                        sink.push(
                            Diagnostic::new(
                                Code::IgnoredClusterState,
                                format!(
                                    "GPU {} holds an instance of `{}`, a profile {} does not offer: the GPU is kept as it is, out of placement",
                                    gpu.uuid, inst.profile, model.info.name
                                ),
                            )
                            .at(doc.value_loc(&format!("{ip}/profile")))
                            .field(crate::schema::dotted(&format!("{ip}/profile")))
                            .help("destroy the instance by hand (nvidia-smi mig -dgi) to give the GPU back to tessera"),
                        );
                    }
                    None => {
                        resolved = false;
                        sink.push(unknown_profile(
                            &model.info,
                            doc,
                            &format!("{ip}/profile"),
                            &inst.profile,
                        ));
                    }
                }
                if let Some(u) = &inst.uuid
                    && !uuids.insert(u.as_str())
                {
                    sink.push(bad(
                        doc,
                        &format!("{ip}/uuid"),
                        format!("MIG UUID {u} appears twice"),
                        "a UUID names one instance",
                    ));
                }
            }
            if resolved && let Err(e) = mig::validate(&placements) {
                sink.push(
                    Diagnostic::new(Code::InvalidMigGeometry, format!("GPU {} has an impossible MIG geometry: {e}", gpu.uuid))
                        .at(doc.loc(&format!("{gp}/instances")))
                        .field(crate::schema::dotted(&format!("{gp}/instances")))
                        .help("a snapshot must describe what NVML can report; check each instance's profile and start"),
                );
            }
            gpus.insert(
                (node.name.as_str(), gpu.index),
                (pool.map(|p| p.name.as_str()), by_start),
            );
        }
    }

    let mut names = BTreeSet::new();
    let mut occupancy: BTreeMap<(&str, u32), Occupancy> = BTreeMap::new();
    for (w, run) in spec.running.iter().enumerate() {
        let wp = format!("/spec/running/{w}");
        if !names.insert((run.spec.tenant.as_str(), run.name.as_str())) {
            sink.push(bad(
                doc,
                &format!("{wp}/name"),
                format!(
                    "workload `{}/{}` is listed twice",
                    run.spec.tenant, run.name
                ),
                "workload names are unique per tenant in a snapshot",
            ));
            continue;
        }
        let Some(compiled) = resolve_spec(
            ctx,
            &run.name,
            &run.spec,
            doc,
            &format!("{wp}/spec"),
            false,
            sink,
        ) else {
            continue;
        };
        if run.bindings.len() != run.spec.replicas as usize {
            sink.push(bad(
                doc,
                &format!("{wp}/bindings"),
                format!(
                    "workload `{}` has {} replicas but {} bindings",
                    run.name,
                    run.spec.replicas,
                    run.bindings.len()
                ),
                "a running workload has one binding per replica",
            ));
            continue;
        }
        for (b, binding) in run.bindings.iter().enumerate() {
            let bp = format!("{wp}/bindings/{b}");
            if let Err(message) = check_binding(
                binding,
                &compiled.gpu,
                &gpus,
                &mut occupancy,
                &run.name,
                ctx,
            ) {
                sink.push(bad(doc, &bp, message, "a binding names GPUs of its node that the replica really holds, and nothing is held twice"));
            }
        }
    }
    for (w, pending) in spec.pending.iter().enumerate() {
        let wp = format!("/spec/pending/{w}");
        if !names.insert((pending.spec.tenant.as_str(), pending.name.as_str())) {
            sink.push(bad(
                doc,
                &format!("{wp}/name"),
                format!(
                    "workload `{}/{}` is listed twice",
                    pending.spec.tenant, pending.name
                ),
                "workload names are unique per tenant in a snapshot",
            ));
            continue;
        }
        resolve_spec(
            ctx,
            &pending.name,
            &pending.spec,
            doc,
            &format!("{wp}/spec"),
            false,
            sink,
        );
    }

    let observed_at = spec.observed_at;
    if let Some(usage) = &spec.usage {
        check_usage(ctx, doc, usage, observed_at, sink);
    }
    check_reservations(ctx, doc, spec, sink);
    check_reconfigurations(doc, spec, observed_at, sink);
}

/// The usage record: an instant no later than the snapshot, and tenants of the policy. Amounts
/// need no check here: the schema refuses negative ones and the YAML reader non-finite ones.
fn check_usage(
    ctx: &Ctx,
    doc: &LoadedDocument,
    usage: &UsageRecord,
    observed_at: Timestamp,
    sink: &mut Sink,
) {
    if usage.as_of > observed_at {
        sink.push(
            Diagnostic::new(
                Code::IgnoredClusterState,
                format!(
                    "the usage record is as of {}, after the snapshot was observed: it is ignored and usage is counted afresh",
                    usage.as_of
                ),
            )
            .at(doc.value_loc("/spec/usage/asOf"))
            .field("spec.usage.asOf")
            .help("a record cannot describe the future: set asOf at or before observedAt, as the reconciler writes it"),
        );
    }
    for tenant in usage.tenants.keys() {
        let tp = format!("/spec/usage/tenants/{}", escape(tenant));
        if !ctx.repo.defined(Kind::Tenant, tenant) {
            let help = match did_you_mean(tenant, ctx.repo.names(Kind::Tenant)) {
                Some(s) => format!("did you mean `{s}`?"),
                None => "remove the entry: a removed tenant's history no longer counts".to_owned(),
            };
            sink.push(
                Diagnostic::new(
                    Code::IgnoredClusterState,
                    format!("usage of unknown tenant `{tenant}`: its history is ignored"),
                )
                .at(doc.loc(&tp))
                .field(crate::schema::dotted(&tp))
                .help(help),
            );
        }
    }
}

/// Reservations: each for a pending gang of this snapshot, in a pool that holds reservations,
/// on nodes of that pool.
fn check_reservations(ctx: &Ctx, doc: &LoadedDocument, spec: &ClusterStateSpec, sink: &mut Sink) {
    let mut node_pool: BTreeMap<&str, &str> = BTreeMap::new();
    for node in &spec.nodes {
        node_pool
            .entry(node.name.as_str())
            .or_insert(node.pool.as_str());
    }
    // A reservation names its gang by key, `tenant/name` (names are per tenant), or by a bare
    // name that one workload of the snapshot has, as older snapshots do.
    let pending: Vec<WorkloadKey> = spec
        .pending
        .iter()
        .map(|p| WorkloadKey::new(&p.spec.tenant, &p.name))
        .collect();
    let running: Vec<WorkloadKey> = spec
        .running
        .iter()
        .map(|r| WorkloadKey::new(&r.spec.tenant, &r.name))
        .collect();
    // What a misspelt reference is compared with: keys, or names for a bare name.
    let shown: Vec<String> = pending.iter().map(ToString::to_string).collect();
    let names: Vec<&str> = pending.iter().map(|k| k.name.as_str()).collect();
    let mut reserved = BTreeSet::new();
    for (r, res) in spec.reservations.iter().enumerate() {
        let rp = format!("/spec/reservations/{r}");
        let gang = resolve_reference(&res.workload, pending.iter().chain(&running));
        let gang_text = gang
            .as_ref()
            .map_or_else(|| res.workload.clone(), ToString::to_string);
        if !reserved.insert(gang_text) {
            sink.push(bad(
                doc,
                &format!("{rp}/workload"),
                format!("workload `{}` has more than one reservation", res.workload),
                "a gang holds one reservation: merge its nodes into one entry",
            ));
            continue;
        }
        if !gang.as_ref().is_some_and(|g| pending.contains(g)) {
            let candidates: Vec<&str> = if res.workload.contains('/') {
                shown.iter().map(String::as_str).collect()
            } else {
                names.clone()
            };
            let (message, help) = if gang.as_ref().is_some_and(|g| running.contains(g)) {
                (
                    format!(
                        "reservation for `{}`, which is already running: it is stale and ignored",
                        res.workload
                    ),
                    "a gang's reservation ends when it starts; remove the entry".to_owned(),
                )
            } else {
                (
                    format!(
                        "reservation for `{}`, which is not pending in this snapshot: it is stale and ignored",
                        res.workload
                    ),
                    match did_you_mean(&res.workload, candidates) {
                        Some(s) => format!("did you mean `{s}`?"),
                        None => {
                            "a reservation holds capacity for a pending workload; remove the entry"
                                .to_owned()
                        }
                    },
                )
            };
            sink.push(
                Diagnostic::new(Code::IgnoredClusterState, message)
                    .at(doc.value_loc(&format!("{rp}/workload")))
                    .field(format!("spec.reservations[{r}].workload"))
                    .help(help),
            );
        }
        let pool_exists = ctx.repo.defined(Kind::Pool, &res.pool);
        match ctx.pools.iter().find(|p| p.name == res.pool) {
            Some(p) if p.reservation_max_gpus.is_none() => sink.push(
                Diagnostic::new(
                    Code::IgnoredClusterState,
                    format!(
                        "pool `{}` holds no reservations: this one is ignored",
                        res.pool
                    ),
                )
                .at(doc.value_loc(&format!("{rp}/pool")))
                .field(format!("spec.reservations[{r}].pool"))
                .help(format!(
                    "set `reservations: {{maxGpus: N}}` on pool `{}`, or remove the entry",
                    res.pool
                )),
            ),
            Some(_) => {}
            // A pool that exists but is broken is reported where it is defined.
            None if pool_exists => {}
            None => {
                let help = match did_you_mean(&res.pool, ctx.repo.names(Kind::Pool)) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => "name a Pool of the policy, or remove the entry".to_owned(),
                };
                sink.push(
                    Diagnostic::new(
                        Code::IgnoredClusterState,
                        format!("reservation in unknown pool `{}`: it is ignored", res.pool),
                    )
                    .at(doc.value_loc(&format!("{rp}/pool")))
                    .field(format!("spec.reservations[{r}].pool"))
                    .help(help),
                );
            }
        }
        for (n, node) in res.nodes.iter().enumerate() {
            let np = format!("{rp}/nodes/{n}");
            match node_pool.get(node.as_str()) {
                None => sink.push(bad(
                    doc,
                    &np,
                    format!("reserved node `{node}` is not in the snapshot"),
                    "a reservation names nodes listed under `nodes`; remove it or fix the name",
                )),
                // Against an unknown pool every node would differ: that is one mistake, above.
                Some(pool) if pool_exists && *pool != res.pool => sink.push(bad(
                    doc,
                    &np,
                    format!(
                        "reserved node `{node}` is in pool `{pool}`, not the reservation's pool `{}`",
                        res.pool
                    ),
                    "a gang lands in one pool: reserve nodes of that pool only",
                )),
                Some(_) => {}
            }
        }
    }
}

/// Reconfiguration records: an instant each, no later than the snapshot, of a GPU the snapshot
/// lists. A record the solver would not count is a warning, not an error: the budget it spent
/// is simply not held against any GPU.
fn check_reconfigurations(
    doc: &LoadedDocument,
    spec: &ClusterStateSpec,
    observed_at: Timestamp,
    sink: &mut Sink,
) {
    let gpus: BTreeSet<(&str, u32)> = spec
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(move |g| (n.name.as_str(), g.index)))
        .collect();
    for (r, rec) in spec.reconfigurations.iter().enumerate() {
        let rp = format!("/spec/reconfigurations/{r}");
        let ignored = |pointer: &str, message: String, help: &str| {
            Diagnostic::new(Code::IgnoredClusterState, message)
                .at(doc.value_loc(pointer))
                .field(crate::schema::dotted(pointer))
                .help(help)
        };
        if rec.at > observed_at {
            sink.push(ignored(
                &format!("{rp}/at"),
                format!(
                    "GPU {} of node `{}` was reconfigured at {}, after the snapshot was observed: the record is ignored",
                    rec.gpu, rec.node, rec.at
                ),
                "a record cannot describe the future: set `at` at or before observedAt",
            ));
        }
        if !gpus.contains(&(rec.node.as_str(), rec.gpu)) {
            sink.push(ignored(
                &format!("{rp}/gpu"),
                format!(
                    "reconfiguration of GPU {} of node `{}`, which the snapshot does not list: the record is ignored",
                    rec.gpu, rec.node
                ),
                "a record names a GPU listed under `nodes`; remove it or fix the node and index",
            ));
        }
    }
}

/// Every GPU of the snapshot by (node, index): its pool and its MIG instances (start → profile).
type GpuTable<'a> = BTreeMap<(&'a str, u32), (Option<&'a str>, BTreeMap<u8, u32>)>;

fn check_binding<'a>(
    binding: &'a Binding,
    demand: &GpuDemand,
    gpus: &GpuTable<'a>,
    occupancy: &mut BTreeMap<(&'a str, u32), Occupancy>,
    workload: &str,
    ctx: &Ctx,
) -> Result<(), String> {
    let node = binding.node.as_str();
    for g in &binding.gpus {
        if !gpus.contains_key(&(node, *g)) {
            return Err(format!("GPU {g} of node `{node}` does not exist"));
        }
    }
    match demand {
        GpuDemand::Whole { count: 0 } => {
            if !binding.gpus.is_empty() || binding.mig_start.is_some() || binding.share.is_some() {
                return Err(format!(
                    "a replica of `{workload}` asks no GPU: list `gpus: []` and no migStart or share"
                ));
            }
        }
        GpuDemand::Whole { count } => {
            if binding.gpus.len() != *count as usize
                || binding.mig_start.is_some()
                || binding.share.is_some()
            {
                return Err(format!(
                    "a replica of `{workload}` holds {count} whole GPUs: list {count} GPU indices and no migStart or share"
                ));
            }
            for g in &binding.gpus {
                let o = occupancy.entry((node, *g)).or_default();
                if let Some(other) = &o.whole {
                    return Err(format!(
                        "GPU {g} of node `{node}` is already held by `{other}`"
                    ));
                }
                if !o.instances.is_empty() || o.clients > 0 {
                    return Err(format!("GPU {g} of node `{node}` is already shared"));
                }
                o.whole = Some(workload.to_owned());
            }
        }
        GpuDemand::Mig { profile_id } => {
            let ([g], Some(start)) = (binding.gpus.as_slice(), binding.mig_start) else {
                return Err(format!(
                    "a MIG replica of `{workload}` names one GPU and its instance's migStart"
                ));
            };
            let (_, instances) = &gpus[&(node, *g)];
            if instances.get(&start) != Some(profile_id) {
                return Err(format!(
                    "GPU {g} of node `{node}` has no instance of the requested profile at start {start}"
                ));
            }
            let o = occupancy.entry((node, *g)).or_default();
            if let Some(other) = o.instances.get(&start) {
                return Err(format!(
                    "the instance at start {start} of GPU {g} on `{node}` is already held by `{other}`"
                ));
            }
            o.instances.insert(start, workload.to_owned());
        }
        GpuDemand::Share { fraction } => {
            let ([g], Some(share)) = (binding.gpus.as_slice(), binding.share) else {
                return Err(format!(
                    "a shared replica of `{workload}` names one GPU and its share"
                ));
            };
            if share != *fraction {
                return Err(format!(
                    "the binding's share {share} differs from the workload's fraction {fraction}"
                ));
            }
            let (pool, _) = &gpus[&(node, *g)];
            let max_clients = pool
                .and_then(|p| ctx.pools.iter().find(|x| x.name == p))
                .and_then(|p| p.max_clients_per_gpu)
                .unwrap_or(u32::MAX);
            let o = occupancy.entry((node, *g)).or_default();
            if o.whole.is_some() || !o.instances.is_empty() {
                return Err(format!(
                    "GPU {g} of node `{node}` is held whole or partitioned"
                ));
            }
            o.shares += share;
            o.clients += 1;
            if o.shares > Gpus::whole(1) || o.clients > max_clients {
                return Err(format!(
                    "GPU {g} of node `{node}` is oversubscribed: shares add up to {} over {} clients",
                    o.shares, o.clients
                ));
            }
        }
    }
    Ok(())
}
