//! Workloads: references, a well-formed GPU request, and a shape that fits some pool.

use std::collections::HashMap;

use super::models::{Models, unknown_profile};
use super::{Repo, Sink, unknown_reference};
use crate::compiled::{
    CompiledPool, CompiledSloClass, CompiledTenant, CompiledWorkload, GpuDemand,
};
use crate::diagnostic::{Code, Diagnostic};
use crate::load::LoadedDocument;
use crate::model::{Document, Kind, Sharing, TopologyMode, WorkloadSpec};
use crate::units::Gpus;

/// What resolving a workload needs from the passes before it.
pub(crate) struct Ctx<'a> {
    pub repo: &'a Repo<'a>,
    pub models: &'a Models,
    pub pools: &'a [CompiledPool],
    pub classes: &'a [CompiledSloClass],
    pub tenants: &'a [CompiledTenant],
    /// `tenants` by name: a repository may hold as many workloads as tenants, and a scan per
    /// workload would make compile time their product.
    tenant_by_name: HashMap<&'a str, &'a CompiledTenant>,
}

impl<'a> Ctx<'a> {
    pub fn new(
        repo: &'a Repo<'a>,
        models: &'a Models,
        pools: &'a [CompiledPool],
        classes: &'a [CompiledSloClass],
        tenants: &'a [CompiledTenant],
    ) -> Self {
        Ctx {
            repo,
            models,
            pools,
            classes,
            tenants,
            tenant_by_name: tenants.iter().map(|t| (t.name.as_str(), t)).collect(),
        }
    }

    pub fn tenant(&self, name: &str) -> Option<&'a CompiledTenant> {
        self.tenant_by_name.get(name).copied()
    }
}

pub(crate) fn resolve(
    repo: &Repo,
    models: &Models,
    pools: &[CompiledPool],
    classes: &[CompiledSloClass],
    tenants: &[CompiledTenant],
    sink: &mut Sink,
) -> Vec<CompiledWorkload> {
    let ctx = Ctx::new(repo, models, pools, classes, tenants);
    repo.workloads()
        .into_iter()
        .filter_map(|doc| match &doc.document {
            Document::Workload(spec) => {
                resolve_spec(&ctx, &doc.name, spec, doc, "/spec", true, sink)
            }
            _ => None,
        })
        .collect()
}

/// Checks one workload spec found at `base` in `doc`. With `check_fit`, also proves that some
/// pool can hold it; a running workload in a snapshot is checked for references only, since a
/// policy change may leave it where it no longer fits (that is what a plan shows).
pub(crate) fn resolve_spec(
    ctx: &Ctx,
    name: &str,
    spec: &WorkloadSpec,
    doc: &LoadedDocument,
    base: &str,
    check_fit: bool,
    sink: &mut Sink,
) -> Option<CompiledWorkload> {
    let field = |p: &str| crate::schema::dotted(&format!("{base}{p}"));
    let ptr = |p: &str| format!("{base}{p}");
    let mut ok = true;

    let tenant = ctx.tenant(&spec.tenant);
    if tenant.is_none() {
        ok = false;
        if !ctx.repo.defined(Kind::Tenant, &spec.tenant) {
            sink.push(unknown_reference(
                Code::UnknownTenant,
                "tenant",
                &spec.tenant,
                ctx.tenants.iter().map(|t| t.name.as_str()),
                "name an existing Tenant",
                doc,
                &ptr("/tenant"),
            ));
        }
    }
    let class = ctx.classes.iter().find(|c| c.name == spec.slo_class);
    if class.is_none() {
        ok = false;
        if !ctx.repo.defined(Kind::SloClass, &spec.slo_class) {
            sink.push(unknown_reference(
                Code::UnknownSloClass,
                "SLO class",
                &spec.slo_class,
                ctx.classes.iter().map(|c| c.name.as_str()),
                "name an existing SloClass",
                doc,
                &ptr("/sloClass"),
            ));
        }
    }
    if let (Some(t), Some(c)) = (tenant, class)
        && !t.slo_classes.contains(&c.name)
    {
        ok = false;
        sink.push(
            Diagnostic::new(
                Code::SloClassNotAllowed,
                format!("tenant `{}` may not use SLO class `{}`", t.name, c.name),
            )
            .at(doc.value_loc(&ptr("/sloClass")))
            .field(field("/sloClass"))
            .help(format!(
                "its classes are: {}; or add `{}` to the tenant's `sloClasses`",
                t.slo_classes.join(", "),
                c.name
            )),
        );
    }
    let pinned = match &spec.pool {
        Some(p) => match ctx.pools.iter().find(|x| &x.name == p) {
            Some(pool) => Some(pool),
            None => {
                ok = false;
                if !ctx.repo.defined(Kind::Pool, p) {
                    sink.push(unknown_reference(
                        Code::UnknownPool,
                        "pool",
                        p,
                        ctx.pools.iter().map(|x| x.name.as_str()),
                        "name an existing Pool, or remove `pool` to let the solver choose",
                        doc,
                        &ptr("/pool"),
                    ));
                }
                None
            }
        },
        None => None,
    };
    let g = &spec.gpu;
    let set = g.kinds_set();
    if set != 1 {
        ok = false;
        sink.push(
            Diagnostic::new(
                Code::InvalidGpuRequest,
                if set == 0 {
                    "`gpu` asks for nothing".to_owned()
                } else {
                    "`gpu` sets more than one of `count`, `migProfile`, `fraction`".to_owned()
                },
            )
            .at(doc.loc(&ptr("/gpu")))
            .field(field("/gpu"))
            .help("set exactly one: `{count: 2}` whole GPUs, `{migProfile: 1g.10gb}` a MIG instance, `{fraction: 0.25}` a shared GPU, or `{count: 0}` no GPU (a CPU-only workload)"),
        );
    } else if g.count == Some(0) && spec.cpu.0 == 0 && spec.memory.0 == 0 {
        ok = false;
        sink.push(
            Diagnostic::new(
                Code::InvalidGpuRequest,
                "`gpu: {count: 0}` asks for no GPU, and the workload asks no cpu or memory either",
            )
            .at(doc.value_loc(&ptr("/gpu/count")))
            .field(field("/gpu/count"))
            .help("a CPU-only workload sets `cpu` or `memory`; otherwise ask for a GPU"),
        );
    }
    let share = match g.fraction {
        Some(f) => match Gpus::from_f64(f).filter(|s| s.units() % 7 == 0 && s.units() > 0) {
            Some(s) => Some(s),
            None => {
                ok = false;
                sink.push(
                    Diagnostic::new(
                        Code::InvalidGpuRequest,
                        format!("fraction {f} is not a whole number of thousandths of a GPU"),
                    )
                    .at(doc.value_loc(&ptr("/gpu/fraction")))
                    .field(field("/gpu/fraction"))
                    .help("write the share with at most three decimals, e.g. 0.25"),
                );
                None
            }
        },
        None => None,
    };
    let min_member = spec.min_member.unwrap_or(spec.replicas);
    if min_member > spec.replicas {
        ok = false;
        sink.push(
            Diagnostic::new(
                Code::InvalidMinMember,
                format!("minMember {min_member} is above replicas {}", spec.replicas),
            )
            .at(doc.value_loc(&ptr("/minMember")))
            .field(field("/minMember"))
            .help("minMember is how many of the replicas must start together; it cannot exceed replicas"),
        );
    }
    for (pointer, message) in spec.unrepresentable() {
        ok = false;
        sink.push(
            Diagnostic::new(Code::InvalidValue, message)
                .at(doc.value_loc(&ptr(&pointer)))
                .field(field(&pointer))
                .help("a process's arguments and environment cannot hold a NUL byte, nor a variable's name `=`; remove it"),
        );
    }
    // A MIG profile named on a pinned pool must be one of that pool's model.
    if let (Some(pool), Some(profile)) = (pinned, &g.mig_profile)
        && let Some(model) = ctx.models.get(&pool.gpu_model)
        && model.info.is_mig_capable()
        && model.info.resolve_profile(profile).is_none()
    {
        sink.push(unknown_profile(
            &model.info,
            doc,
            &ptr("/gpu/migProfile"),
            profile,
        ));
        return None;
    }
    if !ok {
        return None;
    }
    let (tenant, class) = (tenant?, class?);

    let candidates: Vec<&CompiledPool> = match pinned {
        Some(p) => vec![p],
        None => ctx.pools.iter().collect(),
    };
    let mut fits = Vec::new();
    let mut reasons = Vec::new();
    let mut demand = None;
    for pool in &candidates {
        match fit(ctx, spec, share, min_member, tenant, class, pool) {
            Ok(d) => {
                demand.get_or_insert(d);
                fits.push(pool.name.clone());
            }
            Err(reason) => reasons.push(format!("{}: {reason}", pool.name)),
        }
    }
    let demand = match demand {
        Some(d) => d,
        None if !check_fit => fallback_demand(spec, share)?,
        None => {
            sink.push(
                Diagnostic::new(
                    Code::WorkloadDoesNotFit,
                    format!("workload `{name}` fits no pool it may use"),
                )
                .at(doc.loc(&ptr("/gpu")))
                .field(field("/gpu"))
                .help(if reasons.is_empty() {
                    "there is no pool".to_owned()
                } else {
                    reasons.join("; ")
                }),
            );
            return None;
        }
    };
    let gpus_per_replica = demand.gpus();
    Some(CompiledWorkload {
        name: name.to_owned(),
        tenant: tenant.name.clone(),
        slo_class: class.name.clone(),
        priority: class.priority,
        pools: fits,
        replicas: spec.replicas,
        min_member,
        gpu: demand,
        gpus_per_replica,
        cpu: spec.cpu,
        memory: spec.memory,
        topology: spec.topology.same_nvlink_domain,
        max_duration_seconds: spec.max_duration.map(|d| d.seconds()),
        command: spec.command.clone(),
        env: spec.env.clone(),
    })
}

/// The demand of a workload that fits nowhere, when only references are checked.
fn fallback_demand(spec: &WorkloadSpec, share: Option<Gpus>) -> Option<GpuDemand> {
    if let Some(count) = spec.gpu.count {
        return Some(GpuDemand::Whole { count });
    }
    if let Some(fraction) = share {
        return Some(GpuDemand::Share { fraction });
    }
    let p = spec.gpu.mig_profile.as_deref()?;
    let id = p.parse().ok().or_else(|| {
        tessera_mig::builtins()
            .iter()
            .find_map(|m| m.resolve_profile(p))
    })?;
    Some(GpuDemand::Mig { profile_id: id })
}

/// How many replicas of a CPU-only workload (`gpu: {count: 0}`) one node of `pool` holds, by
/// its CPU and memory (a workload asking neither is refused before).
fn cpu_only_per_node(spec: &WorkloadSpec, pool: &CompiledPool) -> i64 {
    let by = |per_node: u64, each: u64| (each > 0).then(|| per_node / each);
    let n = [
        by(pool.cpu_per_node.0, spec.cpu.0),
        by(pool.memory_per_node.0, spec.memory.0),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(0);
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Whether `pool` can ever hold the workload; the reason when it cannot.
fn fit(
    ctx: &Ctx,
    spec: &WorkloadSpec,
    share: Option<Gpus>,
    min_member: u32,
    tenant: &CompiledTenant,
    class: &crate::compiled::CompiledSloClass,
    pool: &CompiledPool,
) -> Result<GpuDemand, String> {
    if pool.sharing < class.isolation_minimum {
        return Err(format!(
            "its `{}` sharing is below class `{}`'s minimum `{}`",
            pool.sharing.as_str(),
            class.name,
            class.isolation_minimum.as_str()
        ));
    }
    let Some(quota) = tenant.quota.get(&pool.name) else {
        return Err(format!("tenant `{}` has no quota there", tenant.name));
    };
    let domain = i64::from(pool.nvlink_domain.gpus_per_domain);
    let total_gpus = i64::from(pool.nodes) * i64::from(pool.gpus_per_node);
    // How many replicas one GPU can hold, and the demand.
    let (demand, per_gpu) = if let Some(count) = spec.gpu.count {
        let has_7g = pool
            .layouts
            .iter()
            .any(|l| l.instances.iter().any(|i| i.compute_slices == 7));
        // An MPS or time-sliced GPU with no share on it may be held whole (see the solver's
        // `demand_on`).
        match pool.sharing {
            Sharing::Exclusive | Sharing::Mps | Sharing::Timeslice => {}
            // A CPU-only replica holds no GPU, so no instance shape matters.
            Sharing::Mig if has_7g || count == 0 => {}
            Sharing::Mig => {
                return Err("whole GPUs on a MIG pool need a layout with a 7g instance".into());
            }
        }
        if count > pool.gpus_per_node {
            return Err(format!(
                "a replica asks {count} GPUs on one node, a node has {}",
                pool.gpus_per_node
            ));
        }
        (GpuDemand::Whole { count }, 0)
    } else if let Some(profile) = &spec.gpu.mig_profile {
        if pool.sharing != Sharing::Mig {
            return Err(format!(
                "MIG instances need a mig pool, not `{}`",
                pool.sharing.as_str()
            ));
        }
        let model = ctx
            .models
            .get(&pool.gpu_model)
            .ok_or_else(|| format!("unknown model {}", pool.gpu_model))?;
        let id = model
            .info
            .resolve_profile(profile)
            .ok_or_else(|| format!("`{profile}` is not a MIG profile of {}", pool.gpu_model))?;
        let per_gpu = pool
            .layouts
            .iter()
            .map(|l| l.instances.iter().filter(|i| i.profile_id == id).count())
            .max()
            .unwrap_or(0);
        if per_gpu == 0 {
            return Err(format!("none of its layouts has a `{profile}` instance"));
        }
        (GpuDemand::Mig { profile_id: id }, per_gpu as i64)
    } else if let Some(fraction) = share {
        if !matches!(pool.sharing, Sharing::Mps | Sharing::Timeslice) {
            return Err(format!(
                "a GPU fraction needs an mps or timeslice pool, not `{}`",
                pool.sharing.as_str()
            ));
        }
        let clients = i64::from(pool.max_clients_per_gpu.unwrap_or(1));
        let by_size = Gpus::UNITS_PER_GPU / fraction.units().max(1);
        (GpuDemand::Share { fraction }, clients.min(by_size))
    } else {
        return Err("no GPU request".into());
    };
    if spec.cpu > pool.cpu_per_node {
        return Err(format!(
            "a replica asks cpu {}, a node has {}",
            spec.cpu, pool.cpu_per_node
        ));
    }
    if spec.memory > pool.memory_per_node {
        return Err(format!(
            "a replica asks memory {}, a node has {}",
            spec.memory, pool.memory_per_node
        ));
    }
    let gang = i64::from(min_member);
    // Replicas that fit in a set of `gpus` GPUs; a CPU-only replica's in that many GPUs'
    // nodes, by their CPU and memory.
    let gpus_per_node = i64::from(pool.gpus_per_node.max(1));
    let capacity_of = |gpus: i64| match &demand {
        GpuDemand::Whole { count: 0 } => (gpus / gpus_per_node) * cpu_only_per_node(spec, pool),
        GpuDemand::Whole { count } => gpus / i64::from(*count),
        _ => gpus * per_gpu,
    };
    if spec.topology.same_nvlink_domain == TopologyMode::Required && gang > capacity_of(domain) {
        return Err(format!(
            "{gang} replicas must share one NVLink domain, which holds at most {}",
            capacity_of(domain)
        ));
    }
    if gang > capacity_of(total_gpus) {
        return Err(format!(
            "the pool holds at most {} replicas of this shape",
            capacity_of(total_gpus)
        ));
    }
    let needed = demand.gpus() * gang;
    if needed > quota.limit.gpus {
        return Err(format!(
            "the gang needs {needed} GPUs, above tenant `{}`'s limit of {}",
            tenant.name, quota.limit.gpus
        ));
    }
    Ok(demand)
}
