//! A day of arrivals drawn from a policy's tenants (`tessera simulate --generate day`).
//!
//! The rule, so that a figure can be reproduced and argued with:
//!
//! - Who: every leaf tenant with an SLO class and a pool it may use. Its arrival rate is the
//!   total rate times its *entitlement*: down the tenant tree, its weight over its siblings'.
//! - What: per arrival, one of the tenant's (SLO class, pool) pairs, uniformly, where the pool's
//!   sharing is at least the class's isolation minimum and the fleet has nodes in the pool. The
//!   shape follows the pool's sharing: `exclusive`, whole GPUs, 1, 2, 4 or 8 with probabilities
//!   0.4, 0.2, 0.2, 0.2 (sizes above the pool's GPUs per node dropped); `mig`, one instance of a
//!   profile drawn uniformly from the pool's layouts; `mps` or `timeslice`, a share of 0.25 or
//!   0.5, equally likely. CPU and memory: half a node's per-GPU part, per GPU (a share: of one).
//! - When: a Poisson process per tenant (exponential gaps) over the horizon.
//! - How long: log-uniform between 10 minutes and 8 hours (mean about 2.2 hours).
//! - How many: the total rate makes the offered load (mean GPUs × mean duration × rate) the
//!   requested share of the fleet's GPUs.
//!
//! Everything is drawn from one ChaCha8 generator seeded with `seed`, tenants in pre-order.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use tessera_compiler::CompiledPolicy;
use tessera_compiler::compiled::CompiledPool;
use tessera_compiler::model::{GpuRequest, Node, Sharing, Topology, WorkloadSpec};
use tessera_compiler::units::{Bytes, Millicores};

use super::trace::TraceWorkload;

const MIN_DURATION: f64 = 600.0;
const MAX_DURATION: f64 = 8.0 * 3600.0;
const WHOLE: [(u32, f64); 4] = [(1, 0.4), (2, 0.2), (4, 0.2), (8, 0.2)];
const SHARES: [f64; 2] = [0.25, 0.5];

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct Generate {
    /// Seconds of arrivals.
    pub horizon: i64,
    /// Offered load over the fleet's GPUs (0.8: on average 80 % of the GPUs asked for).
    pub load: f64,
    pub seed: u64,
}

/// Why nothing could be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    #[error(
        "no leaf tenant has an SLO class and a pool (with nodes in the fleet) that the class may use"
    )]
    NoTenant,
    #[error("the fleet has no GPUs")]
    NoGpus,
}

#[derive(Debug, Clone)]
enum Shape {
    Whole(Vec<(u32, f64)>),
    Mig(Vec<String>),
    Share,
}

struct Choice<'p> {
    class: String,
    pool: &'p CompiledPool,
    shape: Shape,
}

/// A day (or any horizon) of arrivals for `policy`'s tenants on `nodes`.
pub fn generate(
    policy: &CompiledPolicy,
    nodes: &[Node],
    g: &Generate,
) -> Result<Vec<TraceWorkload>, GenerateError> {
    let capacity: usize = nodes.iter().map(|n| n.gpus.len()).sum();
    if capacity == 0 {
        return Err(GenerateError::NoGpus);
    }
    let mut tenants: Vec<(&str, f64, Vec<Choice<'_>>)> = Vec::new();
    for t in policy.tenants.iter().filter(|t| t.children.is_empty()) {
        let mut choices = Vec::new();
        for class in &t.slo_classes {
            let Some(c) = policy.slo_class(class) else {
                continue;
            };
            for pool_name in t.quota.keys() {
                let Some(pool) = policy.pool(pool_name) else {
                    continue;
                };
                if pool.sharing < c.isolation_minimum || !nodes.iter().any(|n| n.pool == pool.name)
                {
                    continue;
                }
                let shape = match pool.sharing {
                    Sharing::Exclusive => Shape::Whole(
                        WHOLE
                            .iter()
                            .copied()
                            .filter(|(n, _)| *n <= pool.gpus_per_node)
                            .collect(),
                    ),
                    Sharing::Mig => {
                        let mut names: Vec<String> = pool
                            .layouts
                            .iter()
                            .flat_map(|l| l.instances.iter().map(|i| i.profile.clone()))
                            .collect();
                        names.sort();
                        names.dedup();
                        if names.is_empty() {
                            continue;
                        }
                        Shape::Mig(names)
                    }
                    Sharing::Mps | Sharing::Timeslice => Shape::Share,
                };
                choices.push(Choice {
                    class: class.clone(),
                    pool,
                    shape,
                });
            }
        }
        if !choices.is_empty() {
            tenants.push((t.name.as_str(), entitlement(policy, &t.name), choices));
        }
    }
    let total_weight: f64 = tenants.iter().map(|t| t.1).sum();
    if tenants.is_empty() || total_weight <= 0.0 {
        return Err(GenerateError::NoTenant);
    }
    // Mean GPUs of one arrival, over the tenants' mix.
    let mean_gpus: f64 = tenants
        .iter()
        .map(|(_, w, choices)| {
            w / total_weight * choices.iter().map(mean_gpus_of).sum::<f64>() / choices.len() as f64
        })
        .sum();
    let mean_duration = (MAX_DURATION - MIN_DURATION) / (MAX_DURATION / MIN_DURATION).ln();
    let rate = g.load.max(0.0) * capacity as f64 / (mean_gpus.max(1e-9) * mean_duration);
    let mut rng = ChaCha8Rng::seed_from_u64(g.seed);
    let mut out = Vec::new();
    for (tenant, w, choices) in &tenants {
        let lambda = rate * w / total_weight;
        if lambda <= 0.0 {
            continue;
        }
        let mut t = 0.0f64;
        let mut n = 0usize;
        loop {
            t += -(1.0 - rng.random::<f64>()).ln() / lambda;
            if t >= g.horizon as f64 {
                break;
            }
            let c = &choices[rng.random_range(0..choices.len())];
            let gpu = match &c.shape {
                Shape::Whole(sizes) => GpuRequest {
                    count: Some(pick(&mut rng, sizes)),
                    mig_profile: None,
                    fraction: None,
                },
                Shape::Mig(names) => GpuRequest {
                    count: None,
                    mig_profile: Some(names[rng.random_range(0..names.len())].clone()),
                    fraction: None,
                },
                Shape::Share => GpuRequest {
                    count: None,
                    mig_profile: None,
                    fraction: Some(SHARES[rng.random_range(0..SHARES.len())]),
                },
            };
            let per_gpu = gpu.count.map_or(1, u64::from);
            let gpus_per_node = u64::from(c.pool.gpus_per_node.max(1));
            let cpu = c.pool.cpu_per_node.0 / gpus_per_node / 2 * per_gpu;
            let memory = c.pool.memory_per_node.0 / gpus_per_node / 2 * per_gpu;
            let u: f64 = rng.random();
            let duration = (MIN_DURATION * (MAX_DURATION / MIN_DURATION).powf(u)).round() as i64;
            n += 1;
            out.push(TraceWorkload {
                name: format!("{tenant}-{n}"),
                spec: WorkloadSpec {
                    tenant: (*tenant).to_owned(),
                    slo_class: c.class.clone(),
                    pool: None,
                    replicas: 1,
                    min_member: None,
                    gpu,
                    cpu: Millicores(cpu),
                    memory: Bytes(memory),
                    topology: Topology::default(),
                    max_duration: None,
                    command: Vec::new(),
                    env: Default::default(),
                },
                arrival: t.floor() as i64,
                duration: Some(duration),
            });
        }
    }
    out.sort_by_key(|w| w.arrival);
    Ok(out)
}

fn pick(rng: &mut ChaCha8Rng, sizes: &[(u32, f64)]) -> u32 {
    let total: f64 = sizes.iter().map(|s| s.1).sum();
    let mut x = rng.random::<f64>() * total;
    for &(n, p) in sizes {
        if x < p {
            return n;
        }
        x -= p;
    }
    sizes.last().map_or(1, |s| s.0)
}

fn mean_gpus_of(c: &Choice<'_>) -> f64 {
    match &c.shape {
        Shape::Whole(sizes) => {
            let total: f64 = sizes.iter().map(|s| s.1).sum();
            sizes.iter().map(|&(n, p)| f64::from(n) * p).sum::<f64>() / total.max(1e-9)
        }
        // A MIG instance holds part of a GPU; a seventh to a whole, counted as half.
        Shape::Mig(_) => 0.5,
        Shape::Share => SHARES.iter().sum::<f64>() / SHARES.len() as f64,
    }
}

/// Down the tree, the tenant's weight over its siblings'.
pub(crate) fn entitlement(policy: &CompiledPolicy, tenant: &str) -> f64 {
    let Some(t) = policy.tenant(tenant) else {
        return 0.0;
    };
    let mut share = 1.0;
    for pair in t.path.windows(2) {
        let Some(parent) = policy.tenant(&pair[0]) else {
            return 0.0;
        };
        let total: f64 = parent
            .children
            .iter()
            .filter_map(|c| policy.tenant(c))
            .map(|c| c.weight)
            .sum();
        let w = policy.tenant(&pair[1]).map_or(0.0, |c| c.weight);
        share *= if total > 0.0 { w / total } else { 0.0 };
    }
    share
}
