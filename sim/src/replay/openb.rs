//! The openb traces and node lists as replay input.
//!
//! A pod list becomes one workload per GPU task: it arrives at its `creation_time` (less the
//! trace's first, so the replay starts at 0) and runs for `deletion_time − creation_time`.
//! `num_gpu` whole GPUs become `gpu: {count}`, a share of one GPU `gpu: {fraction}`
//! (`gpu_milli / 1000`); CPU and memory carry over. A pool has one sharing mode, and whole GPUs
//! need an exclusive one: when the policy has no exclusive pool, a one-GPU task asks
//! `fraction: 1.0` instead, and a task of several GPUs can start nowhere (it is reported as
//! never started). CPU-only pods are left out: the replay measures GPU work over time, and
//! its baselines place GPU work only (tessera itself places a CPU-only pod as a workload of
//! `gpu: {count: 0}`, as the openb benchmark's Tessera row does). A `gpu_spec` naming models
//! pins the workload to the first pool (by name) of one of those models.
//!
//! Tenants: a `tenant` column (with an optional `slo_class` column) is used as it is. Without
//! one, tasks are spread over the policy's leaf tenants, each drawn independently with
//! probability proportional to the tenant's entitlement (its weight over its siblings', down
//! the tree), from a ChaCha8 generator seeded with the replay's seed. A task's SLO class is the
//! tenant's first class (by name) that accepts the shape: a share needs a class whose isolation
//! minimum is `mps` or weaker.
//!
//! A node list becomes one `ClusterState` node per GPU node (CPU-only nodes are left out), in
//! the first pool (by name) of the node's model with its GPUs per node and CPU, else the first
//! pool of its model.

use std::path::Path;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::{
    Gpu, GpuRequest, Health, MigState, Node, Sharing, Topology, WorkloadSpec,
};
use tessera_compiler::units::{Bytes, Millicores};

use super::trace::{TraceError, TraceWorkload};
use crate::openb::{self as harness, NodeSpec, TaskSpec};

const MIB: u64 = 1 << 20;

/// Reads an openb pod list as a replay trace.
pub fn load_openb_trace(
    path: &Path,
    policy: &CompiledPolicy,
    seed: u64,
) -> Result<Vec<TraceWorkload>, TraceError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: file.clone(),
        source,
    })?;
    parse_openb_trace(&file, &text, policy, seed)
}

/// Parses openb pod-list text; `file` names it in errors.
pub fn parse_openb_trace(
    file: &str,
    text: &str,
    policy: &CompiledPolicy,
    seed: u64,
) -> Result<Vec<TraceWorkload>, TraceError> {
    let tasks = harness::parse_tasks(Path::new(file), text).map_err(|e| TraceError::File {
        path: file.to_owned(),
        message: e
            .to_string()
            .trim_start_matches(&format!("{file}:"))
            .to_owned(),
    })?;
    // The columns the harness does not read, by header name, row for row.
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .map(|(_, l)| {
            l.trim_start_matches('\u{feff}')
                .split(',')
                .map(str::trim)
                .collect()
        })
        .unwrap_or_default();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (c_created, c_deleted) = (col("creation_time"), col("deletion_time"));
    let (c_tenant, c_class) = (col("tenant"), col("slo_class"));
    let Some(c_deleted) = c_deleted else {
        return Err(TraceError::At {
            path: file.to_owned(),
            line: 1,
            column: 1,
            message: "missing column `deletion_time`: a replay needs when each task ends".into(),
        });
    };
    if c_created.is_none() {
        return Err(TraceError::At {
            path: file.to_owned(),
            line: 1,
            column: 1,
            message: "missing column `creation_time`: a replay needs when each task arrives".into(),
        });
    }
    let leaves = leaf_tenants(policy);
    let total: f64 = leaves.iter().map(|l| l.1).sum();
    if c_tenant.is_none() && (leaves.is_empty() || total <= 0.0) {
        return Err(TraceError::File {
            path: file.to_owned(),
            message: "the policy has no leaf tenant with an SLO class to spread the tasks over"
                .into(),
        });
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rows = Vec::with_capacity(tasks.len());
    for (task, (i, line)) in tasks.iter().zip(lines) {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let at = |column: usize, message: String| TraceError::At {
            path: file.to_owned(),
            line: (i + 1) as u32,
            column: (fields[..column].iter().map(|f| f.len() + 1).sum::<usize>() + 1) as u32,
            message,
        };
        let created = task.creation_time.ok_or_else(|| {
            at(
                c_created.unwrap_or(0),
                "`creation_time` is empty: a replay needs when each task arrives".into(),
            )
        })?;
        let deleted = parse_time(fields[c_deleted]).ok_or_else(|| {
            at(
                c_deleted,
                format!(
                    "`deletion_time` must be a non-negative integer, found {:?}",
                    fields[c_deleted]
                ),
            )
        })?;
        if deleted < created {
            return Err(at(
                c_deleted,
                format!("`deletion_time` {deleted} is before `creation_time` {created}"),
            ));
        }
        // Drawn for every task, CPU-only ones too, so that the draw of a task does not depend
        // on which tasks before it hold GPUs.
        let x: f64 = rng.random::<f64>() * total;
        if task.num_gpu == 0 {
            continue;
        }
        let (tenant, class) = match c_tenant {
            Some(c) => {
                let tenant = fields[c].to_owned();
                let class = match c_class {
                    Some(k) if !fields[k].is_empty() => fields[k].to_owned(),
                    _ => class_for(policy, &tenant, task).ok_or_else(|| {
                        at(c, format!("tenant `{tenant}` has no SLO class that accepts this task's GPU (give a `slo_class` column)"))
                    })?,
                };
                (tenant, class)
            }
            None => {
                let tenant = draw(&leaves, x);
                let class = class_for(policy, tenant, task).ok_or_else(|| {
                    at(0, format!("tenant `{tenant}` (drawn for this task) has no SLO class that accepts its GPU share"))
                })?;
                (tenant.to_owned(), class)
            }
        };
        rows.push((
            created,
            deleted - created,
            workload(task, tenant, class, policy),
        ));
    }
    let start = rows.iter().map(|r| r.0).min().unwrap_or(0);
    Ok(rows
        .into_iter()
        .map(|(created, duration, (name, spec))| TraceWorkload {
            name,
            spec,
            arrival: (created - start) as i64,
            duration: Some(duration as i64),
        })
        .collect())
}

fn parse_time(raw: &str) -> Option<u64> {
    raw.parse::<u64>().ok().or_else(|| {
        let (int, frac) = raw.split_once('.')?;
        (frac.bytes().all(|b| b == b'0')).then(|| int.parse().ok())?
    })
}

fn workload(
    task: &TaskSpec,
    tenant: String,
    class: String,
    policy: &CompiledPolicy,
) -> (String, WorkloadSpec) {
    // A pool has one sharing mode: where the policy has no exclusive pool, a whole GPU is asked
    // as a share of 1.0 (MPS or time-slicing of one client), as the openb nodes mix both.
    let shares_only = !policy.pools.iter().any(|p| p.sharing == Sharing::Exclusive);
    let gpu = if task.num_gpu == 1 && (task.gpu_milli < 1000 || shares_only) {
        GpuRequest {
            count: None,
            mig_profile: None,
            fraction: Some(f64::from(task.gpu_milli) / 1000.0),
        }
    } else {
        GpuRequest {
            count: Some(task.num_gpu),
            mig_profile: None,
            fraction: None,
        }
    };
    let pool = (!task.gpu_spec.is_empty())
        .then(|| {
            policy
                .pools
                .iter()
                .find(|p| task.gpu_spec.contains(&p.gpu_model))
                .map(|p| p.name.clone())
        })
        .flatten();
    (
        task.name.clone(),
        WorkloadSpec {
            tenant,
            slo_class: class,
            pool,
            replicas: 1,
            min_member: None,
            gpu,
            cpu: Millicores(task.cpu_milli),
            memory: Bytes(task.memory_mib * MIB),
            topology: Topology::default(),
            max_duration: None,
            command: Vec::new(),
            env: Default::default(),
        },
    )
}

/// Leaf tenants with an SLO class, with their entitlements, in pre-order.
fn leaf_tenants(policy: &CompiledPolicy) -> Vec<(&str, f64)> {
    policy
        .tenants
        .iter()
        .filter(|t| t.children.is_empty() && !t.slo_classes.is_empty())
        .map(|t| {
            (
                t.name.as_str(),
                super::generate::entitlement(policy, &t.name),
            )
        })
        .collect()
}

fn draw<'a>(leaves: &[(&'a str, f64)], mut x: f64) -> &'a str {
    for &(name, w) in leaves {
        if x < w {
            return name;
        }
        x -= w;
    }
    leaves.last().map_or("", |l| l.0)
}

/// The tenant's first class (by name) that accepts the task: a share needs one whose isolation
/// minimum allows MPS.
fn class_for(policy: &CompiledPolicy, tenant: &str, task: &TaskSpec) -> Option<String> {
    let t = policy.tenant(tenant)?;
    let share = task.num_gpu == 1 && task.gpu_milli < 1000;
    let mut classes: Vec<&String> = t.slo_classes.iter().collect();
    classes.sort();
    classes
        .into_iter()
        .find(|c| {
            policy
                .slo_class(c)
                .is_some_and(|c| !share || c.isolation_minimum <= Sharing::Mps)
        })
        .cloned()
}

/// Why an openb node list cannot be placed in the policy's pools.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodesError {
    #[error("{path}: node `{node}` has GPU model `{model}`, and no pool of the policy has it")]
    NoPool {
        path: String,
        node: String,
        model: String,
    },
}

/// An openb node list as `ClusterState` nodes of `policy`'s pools.
pub fn openb_nodes(
    path: &str,
    specs: &[NodeSpec],
    policy: &CompiledPolicy,
) -> Result<Vec<Node>, NodesError> {
    let mut out = Vec::new();
    for (n, spec) in specs.iter().enumerate().filter(|(_, s)| s.num_gpu > 0) {
        let mut pools = policy.pools.iter().filter(|p| p.gpu_model == spec.model);
        let exact = policy.pools.iter().find(|p| {
            p.gpu_model == spec.model
                && p.gpus_per_node == spec.num_gpu
                && p.cpu_per_node.0 == spec.cpu_milli
        });
        let Some(pool) = exact.or_else(|| pools.next()) else {
            return Err(NodesError::NoPool {
                path: path.to_owned(),
                node: spec.name.clone(),
                model: spec.model.clone(),
            });
        };
        out.push(Node {
            name: spec.name.clone(),
            pool: pool.name.clone(),
            labels: Default::default(),
            rack: None,
            nvlink_domain: None,
            cpu: Millicores(spec.cpu_milli),
            memory: Bytes(spec.memory_mib * MIB),
            health: Health::Healthy,
            gpus: (0..spec.num_gpu)
                .map(|g| Gpu {
                    index: g,
                    uuid: format!("GPU-{n:08x}-{g:04x}"),
                    model: spec.model.clone(),
                    health: Health::Healthy,
                    mig: MigState::default(),
                    instances: Vec::new(),
                })
                .collect(),
        });
    }
    Ok(out)
}
