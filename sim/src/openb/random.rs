//! Random: a node drawn uniformly among those that fit (the simulator's `RandomScore` draws one
//! of the filtered nodes in `PreScore`); a sharing task takes a GPU drawn uniformly among those
//! with enough room (its `random` GPU selection), a whole-GPU task the first free GPUs.

use rand::RngExt;
use rand::rngs::ChaCha8Rng;

use super::cluster::{Choice, Cluster, Task};
use super::policy::{Placer, policy_rng};

#[derive(Debug)]
pub struct Random {
    rng: ChaCha8Rng,
    feasible: Vec<usize>,
}

impl Random {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: policy_rng(seed),
            feasible: Vec::new(),
        }
    }
}

impl Placer for Random {
    fn name(&self) -> &str {
        "Random"
    }

    fn choose(&mut self, cluster: &Cluster, task: &Task) -> Option<Choice> {
        self.feasible.clear();
        self.feasible
            .extend((0..cluster.nodes().len()).filter(|&i| cluster.fits(i, task)));
        if self.feasible.is_empty() {
            return None;
        }
        let node = self.feasible[self.rng.random_range(0..self.feasible.len())];
        let gpus = if task.is_fractional() {
            let room: Vec<usize> = cluster
                .node(node)
                .gpu_left
                .iter()
                .enumerate()
                .filter(|(_, g)| **g >= task.gpu_milli)
                .map(|(i, _)| i)
                .collect();
            vec![room[self.rng.random_range(0..room.len())]]
        } else {
            cluster.first_free_gpus(node, task.num_gpu)?
        };
        Some(Choice { node, gpus })
    }
}
