//! Starting a gang's replicas, all or nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tessera_compiler::WorkloadKey;

use super::{NodeError, ReplicaPlan};
use crate::driver::{GpuRef, NodeDriver};
use crate::runtime::{LaunchSpec, Runtime};

/// What every replica of a workload is launched with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangSpec {
    pub workload: WorkloadKey,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Thousandths of a core; 0: no limit.
    pub cpu_millis: u64,
    /// Bytes; 0: no limit.
    pub memory_bytes: u64,
    pub work_dir: PathBuf,
    pub checkpoint_dir: PathBuf,
    /// The checkpoint a requeued workload resumes from.
    pub resume_from: Option<PathBuf>,
}

/// A replica the runtime started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedReplica {
    pub replica: u32,
    pub pid: u32,
    /// What its `CUDA_VISIBLE_DEVICES` names.
    pub devices: Vec<String>,
}

/// Starts each planned replica and tells the driver which devices its process holds. If one
/// fails to start, the ones already started are killed again and the error is returned:
/// a gang never runs in part.
pub fn launch(
    driver: &mut dyn NodeDriver,
    runtime: &mut Runtime,
    gang: &GangSpec,
    replicas: &[ReplicaPlan],
) -> Result<Vec<StartedReplica>, NodeError> {
    let mut started: Vec<StartedReplica> = Vec::with_capacity(replicas.len());
    for plan in replicas {
        let b = &plan.binding;
        let spec = LaunchSpec {
            tenant: gang.workload.tenant.clone(),
            workload: gang.workload.name.clone(),
            replica: plan.replica,
            command: gang.command.clone(),
            env: gang.env.clone(),
            devices: plan.devices.uuids.clone(),
            gpus: plan.devices.gpus.clone(),
            cpu_millis: gang.cpu_millis,
            memory_bytes: gang.memory_bytes,
            mps_thread_percentage: b.share.map(|s| {
                // MPS takes a whole percentage; a share never rounds to 0.
                ((s.as_f64() * 100.0).round() as u32).clamp(1, 100)
            }),
            work_dir: gang.work_dir.clone(),
            checkpoint_dir: gang.checkpoint_dir.clone(),
            resume_from: gang.resume_from.clone(),
        };
        match runtime.start(&spec) {
            Ok(process) => {
                for &index in &b.gpus {
                    let gpu = GpuRef {
                        node: b.node.clone(),
                        index,
                    };
                    driver.process_started(process.pid, &gpu, plan.devices.gi);
                }
                started.push(StartedReplica {
                    replica: plan.replica,
                    pid: process.pid,
                    devices: plan.devices.uuids.clone(),
                });
            }
            Err(e) => {
                for r in &started {
                    let _ = runtime.kill(r.pid);
                    driver.process_ended(r.pid);
                }
                return Err(e.into());
            }
        }
    }
    Ok(started)
}
