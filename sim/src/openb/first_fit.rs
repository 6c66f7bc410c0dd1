//! FirstFit: the first node in node-list order that fits; on it, the lowest GPU indices that
//! can take the task (for a sharing task the first GPU with enough room, for a whole-GPU task the
//! first completely free GPUs).

use super::cluster::{Choice, Cluster, Task};
use super::policy::Placer;

#[derive(Debug, Clone, Default)]
pub struct FirstFit;

impl FirstFit {
    pub fn new() -> Self {
        FirstFit
    }
}

impl Placer for FirstFit {
    fn name(&self) -> &str {
        "FirstFit"
    }

    fn choose(&mut self, cluster: &Cluster, task: &Task) -> Option<Choice> {
        let node = (0..cluster.nodes().len()).find(|&i| cluster.fits(i, task))?;
        Some(Choice {
            node,
            gpus: first_gpus(cluster, node, task)?,
        })
    }
}

/// The lowest GPU indices of `node` that can take `task`: for a sharing task the first GPU
/// with enough room, for a whole-GPU task the first completely free GPUs (none for a CPU-only
/// task).
pub(crate) fn first_gpus(cluster: &Cluster, node: usize, task: &Task) -> Option<Vec<usize>> {
    if task.is_fractional() {
        let g = cluster
            .node(node)
            .gpu_left
            .iter()
            .position(|&g| g >= task.gpu_milli)?;
        Some(vec![g])
    } else {
        cluster.first_free_gpus(node, task.num_gpu)
    }
}
