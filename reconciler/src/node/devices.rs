//! Which devices a replica gets, resolved from the observation before anything starts.

use tessera_solver::decision::ReplicaBinding;

use super::NodeError;
use crate::driver::{GpuRef, Observation};
use crate::runtime::GpuDevice;

/// One replica's devices, resolved from the observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaDevices {
    /// What `CUDA_VISIBLE_DEVICES` names.
    pub uuids: Vec<String>,
    /// The GPU instance of a MIG replica.
    pub gi: Option<u32>,
    /// The devices whose nodes its sandbox shows.
    pub gpus: Vec<GpuDevice>,
}

/// One replica ready to launch: its index in the gang, where it is bound, its devices.
#[derive(Debug, Clone)]
pub struct ReplicaPlan {
    pub replica: u32,
    pub binding: ReplicaBinding,
    pub devices: ReplicaDevices,
}

/// Resolves every replica's devices before any starts: a gang starts whole or not at all, so
/// a device that is not there fails the gang here, with nothing started.
pub fn resolve<'a>(
    observation: &Observation,
    replicas: impl IntoIterator<Item = (u32, &'a ReplicaBinding)>,
) -> Result<Vec<ReplicaPlan>, NodeError> {
    replicas
        .into_iter()
        .map(|(replica, b)| {
            Ok(ReplicaPlan {
                replica,
                binding: b.clone(),
                devices: devices(observation, b)?,
            })
        })
        .collect()
}

/// The id of the GPU instance at memory slice `start` of `gpu`, as observed.
pub fn find_gi(observation: &Observation, gpu: &GpuRef, start: u8) -> Option<u32> {
    observation
        .details
        .iter()
        .find(|d| &d.gpu == gpu)?
        .instances
        .iter()
        .find(|gi| gi.start == start)
        .map(|gi| gi.id)
}

fn devices(observation: &Observation, b: &ReplicaBinding) -> Result<ReplicaDevices, NodeError> {
    let node = observation
        .nodes
        .iter()
        .find(|n| n.name == b.node)
        .ok_or_else(|| NodeError::Precondition(format!("node {} is not observed", b.node)))?;
    if let Some(start) = b.mig_start {
        let index = *b.gpus.first().ok_or_else(|| {
            NodeError::Precondition(format!("{}: a MIG binding names no GPU", b.node))
        })?;
        let gpu = GpuRef {
            node: b.node.clone(),
            index,
        };
        let detail = observation
            .details
            .iter()
            .find(|d| d.gpu == gpu)
            .ok_or_else(|| NodeError::Precondition(format!("{gpu} is not observed")))?;
        let gi = detail
            .instances
            .iter()
            .find(|gi| gi.start == start)
            .ok_or_else(|| {
                NodeError::Precondition(format!("{gpu}: no GPU instance at memory slice {start}"))
            })?;
        let ci = gi.compute_instances.first().ok_or_else(|| {
            NodeError::Precondition(format!(
                "{gpu}: the GPU instance at memory slice {start} has no compute instance"
            ))
        })?;
        let device = GpuDevice {
            index,
            mig: Some((gi.id, ci.id)),
        };
        return Ok(ReplicaDevices {
            uuids: vec![ci.uuid.clone()],
            gi: Some(gi.id),
            gpus: vec![device],
        });
    }
    let mut uuids = Vec::with_capacity(b.gpus.len());
    for &index in &b.gpus {
        let gpu = node.gpus.iter().find(|g| g.index == index).ok_or_else(|| {
            NodeError::Precondition(format!("{}/gpu{index} is not observed", b.node))
        })?;
        uuids.push(gpu.uuid.clone());
    }
    let gpus = b
        .gpus
        .iter()
        .map(|&index| GpuDevice { index, mig: None })
        .collect();
    Ok(ReplicaDevices {
        uuids,
        gi: None,
        gpus,
    })
}
