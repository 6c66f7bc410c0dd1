//! From the workloads the service tracks and the fleet it observed to what the store meters:
//! which runs are placed now, and what a run holds.

use std::collections::BTreeMap;

use tessera_compiler::mig::{builtin_model, shape::shape};
use tessera_compiler::model::{Binding, Node};
use tessera_compiler::units::Gpus;

use crate::store::WorkloadRecord;
use crate::store::usage::{NewRun, RunKey};

/// The run a record is in, while it holds a placement.
pub fn run_key(record: &WorkloadRecord) -> Option<RunKey> {
    if !record.phase.holds_placement() {
        return None;
    }
    Some(RunKey {
        tenant: record.tenant.clone(),
        workload: record.name.clone(),
        submitted_at: record.submitted_at,
        started_at: record.started_at?,
    })
}

/// Why a run could not be described: it is left unmetered this time, and said so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("workload {workload:?}: node {node:?} of its binding is not observed")]
    UnknownNode { workload: String, node: String },
    #[error("workload {workload:?}: GPU {node}/{gpu} of its binding is not observed")]
    UnknownGpu {
        workload: String,
        node: String,
        gpu: u32,
    },
    #[error(
        "workload {workload:?}: the MIG instance at slice {start} of {node}/{gpu} has no \
         profile known for model {model:?}"
    )]
    UnknownProfile {
        workload: String,
        node: String,
        gpu: u32,
        start: u8,
        model: String,
    },
    #[error("workload {workload:?} holds no binding")]
    NoBinding { workload: String },
}

/// What `record`'s run holds, from its bindings and the observed nodes: GPUs exactly (whole
/// GPUs, a MIG instance's compute slices in sevenths, a share's fraction), the pool and model
/// of its first binding (a pool has one model), and CPU and memory per replica.
pub fn describe(
    record: &WorkloadRecord,
    key: RunKey,
    by_name: &BTreeMap<&str, &Node>,
) -> Result<NewRun, RunError> {
    let workload = || record.name.clone();
    let first = record.bindings.first().ok_or_else(|| RunError::NoBinding {
        workload: workload(),
    })?;
    let node_of = |b: &Binding| {
        by_name
            .get(b.node.as_str())
            .copied()
            .ok_or_else(|| RunError::UnknownNode {
                workload: workload(),
                node: b.node.clone(),
            })
    };
    let first_node = node_of(first)?;
    let model = first
        .gpus
        .first()
        .map(|&i| gpu_of(&record.name, first_node, i).map(|g| g.model.clone()))
        .transpose()?
        .unwrap_or_default();
    let mut gpus = Gpus::ZERO;
    let mut profile = None;
    for b in &record.bindings {
        let node = node_of(b)?;
        gpus += match (b.share, b.mig_start) {
            (Some(share), _) => share,
            (None, Some(start)) => {
                let index = b.gpus.first().copied().unwrap_or_default();
                let gpu = gpu_of(&record.name, node, index)?;
                let unknown = || RunError::UnknownProfile {
                    workload: workload(),
                    node: node.name.clone(),
                    gpu: index,
                    start,
                    model: gpu.model.clone(),
                };
                let catalog = builtin_model(&gpu.model).ok_or_else(unknown)?;
                // The instance as observed; the spec's profile if it is gone already.
                let named = gpu
                    .instances
                    .iter()
                    .find(|i| i.start == start)
                    .map(|i| i.profile.clone())
                    .or_else(|| record.spec.gpu.mig_profile.clone())
                    .ok_or_else(unknown)?;
                let id = catalog.resolve_profile(&named).ok_or_else(unknown)?;
                let slices = shape(id).ok_or_else(unknown)?.compute_slices;
                profile = catalog.profile_name(id).map(str::to_owned).or(Some(named));
                Gpus::sevenths(i64::from(slices))
            }
            (None, None) => Gpus::whole(b.gpus.len() as i64),
        };
    }
    let replicas = record.bindings.len() as u64;
    Ok(NewRun {
        key,
        pool: first_node.pool.clone(),
        model,
        profile,
        gpus,
        cpu_millicores: record.spec.cpu.0.saturating_mul(replicas),
        memory_mib: (record.spec.memory.0 >> 20).saturating_mul(replicas),
    })
}

fn gpu_of<'n>(
    workload: &str,
    node: &'n Node,
    index: u32,
) -> Result<&'n tessera_compiler::model::Gpu, RunError> {
    node.gpus
        .iter()
        .find(|g| g.index == index)
        .ok_or_else(|| RunError::UnknownGpu {
            workload: workload.to_owned(),
            node: node.name.clone(),
            gpu: index,
        })
}
