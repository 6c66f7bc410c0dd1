//! The Kubernetes scheduler's default scoring, for the pods that no GPU scheduler places: the
//! node with the highest sum of two scores, each an integer from 0 to 100 (kube-scheduler's
//! `NodeResourcesFit` plugin with its default `LeastAllocated` strategy, and
//! `NodeResourcesBalancedAllocation`, both of weight 1, over CPU and memory at weight 1 each):
//!
//! ```text
//! least    = (cpu_free_after × 100 / cpu_capacity + memory_free_after × 100 / memory_capacity) / 2
//! balanced = (1 − |cpu_used_after / cpu_capacity − memory_used_after / memory_capacity| / 2) × 100
//! ```
//!
//! each division an integer one as the scheduler's Go code does it, "after" counting the pod
//! being placed. It spreads: a pod goes where the most of the node is still free. Memory counts
//! only when the cluster tracks it (the run checks memory); otherwise CPU alone, as the
//! scheduler scores a resource list of one.
//!
//! GPUs are not scored (the default profile scores CPU and memory only; a device plugin's GPUs
//! are filtered, not weighed): a GPU task, if given, takes the first GPUs that fit, as
//! [`super::FirstFit`] does on the node.
//!
//! Left out: the scheduler scores a sample of the feasible nodes on large clusters
//! (`percentageOfNodesToScore`, about 40 % of openb's 1,213 nodes); here every feasible node is
//! scored, ties broken as the other baselines break them.

use super::cluster::{Choice, Cluster, Node, Task};
use super::first_fit::first_gpus;
use super::policy::{ArgMax, Placer, PolicyOptions, Ties};

/// The scheduler's `MaxNodeScore`.
const MAX_NODE_SCORE: u64 = 100;

#[derive(Debug)]
pub struct KubeDefault {
    ties: Ties,
}

impl KubeDefault {
    pub fn new(options: PolicyOptions, seed: u64) -> Self {
        Self {
            ties: Ties::new(options.tie_break, seed),
        }
    }
}

/// `leastRequestedScore`: the unused share of `capacity` once `requested` is taken, 0 to 100.
fn least_requested(requested: u64, capacity: u64) -> u64 {
    if capacity == 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_NODE_SCORE / capacity
}

/// The two plugins' scores summed for `task` on `node`, which it must fit; `memory`: whether
/// the cluster tracks memory.
pub fn score(node: &Node, task: &Task, memory: bool) -> u64 {
    // (requested, capacity) per resource scored: CPU, and memory where the cluster checks it.
    // A slice of a local, not a list: every node is scored for every CPU-only task.
    let cpu = (
        node.cpu_capacity - node.cpu_left + task.cpu_milli,
        node.cpu_capacity,
    );
    let both;
    let resources: &[(u64, u64)] = if memory {
        both = [
            cpu,
            (
                node.memory_capacity - node.memory_left + task.memory_mib,
                node.memory_capacity,
            ),
        ];
        &both
    } else {
        std::slice::from_ref(&cpu)
    };
    let least = resources
        .iter()
        .map(|&(r, c)| least_requested(r, c))
        .sum::<u64>()
        / resources.len() as u64;
    // `balancedResourceScorer`: resources of no capacity are skipped, a fraction is capped at 1,
    // and two fractions' standard deviation is half their difference (one has none).
    let mut fractions = resources
        .iter()
        .filter(|&&(_, c)| c > 0)
        .map(|&(r, c)| (r as f64 / c as f64).min(1.0));
    let std = match (fractions.next(), fractions.next()) {
        (Some(a), Some(b)) => ((a - b) / 2.0).abs(),
        _ => 0.0,
    };
    let balanced = ((1.0 - std) * MAX_NODE_SCORE as f64) as u64;
    least + balanced
}

impl Placer for KubeDefault {
    fn name(&self) -> &str {
        "KubeDefault"
    }

    fn choose(&mut self, cluster: &Cluster, task: &Task) -> Option<Choice> {
        self.ties.prepare(cluster.nodes().len());
        let memory = cluster.check_memory();
        let mut best = ArgMax::new();
        for (i, node) in cluster.nodes().iter().enumerate() {
            if cluster.fits(i, task) {
                best.offer(score(node, task, memory) as f64, i, (), &mut self.ties);
            }
        }
        let (node, ()) = best.best()?;
        Some(Choice {
            node,
            gpus: first_gpus(cluster, node, task)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openb::cluster::ModelMask;
    use crate::openb::policy::TieBreak;
    use crate::openb::trace::NodeSpec;

    fn spec(name: &str, cpu: u64, memory: u64, gpus: u32) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            cpu_milli: cpu,
            memory_mib: memory,
            num_gpu: gpus,
            model: "G".into(),
        }
    }

    fn cpu_task(cpu: u64, memory: u64) -> Task {
        Task {
            cpu_milli: cpu,
            memory_mib: memory,
            num_gpu: 0,
            gpu_milli: 0,
            models: ModelMask::ANY,
            shape: 0,
        }
    }

    fn options() -> PolicyOptions {
        PolicyOptions {
            tie_break: TieBreak::NodeOrder,
            ..PolicyOptions::default()
        }
    }

    #[test]
    fn scores_as_the_scheduler_computes_them() {
        let c = Cluster::new(&[spec("a", 64_000, 256_000, 8)], true).unwrap();
        let n = c.node(0);
        // CPU 16 of 64 cores asked, memory 64 of 256 GiB: least (75 + 75) / 2, balanced 100.
        assert_eq!(score(n, &cpu_task(16_000, 64_000), true), 75 + 100);
        // CPU 32 of 64, memory 0: least (50 + 100) / 2, balanced (1 - 0.25) × 100.
        assert_eq!(score(n, &cpu_task(32_000, 0), true), 75 + 75);
        // Memory not tracked: CPU alone, nothing to balance.
        assert_eq!(score(n, &cpu_task(32_000, 0), false), 50 + 100);
        // Integer division, as in Go: 63 of 64 cores free is 98.4 %.
        assert_eq!(score(n, &cpu_task(1_000, 0), false), 98 + 100);
    }

    #[test]
    fn a_cpu_pod_goes_where_the_most_is_left() {
        let mut c = Cluster::new(
            &[
                spec("small", 32_000, 1 << 20, 2),
                spec("large", 96_000, 1 << 20, 8),
            ],
            false,
        )
        .unwrap();
        let mut k = KubeDefault::new(options(), 0);
        let t = cpu_task(8_000, 1);
        assert!(k.choose(&c, &t).unwrap().gpus.is_empty());
        // Free CPU after each pod, in whole per cent: the large node until its share left falls
        // to the small node's 75 % (a tie, which node order gives to the small one), then the
        // large again until 50 %.
        let mut on = Vec::new();
        for _ in 0..6 {
            let ch = k.choose(&c, &t).unwrap();
            c.place(&t, &ch).unwrap();
            on.push(ch.node);
        }
        assert_eq!(on, [1, 1, 0, 1, 1, 1]);
        assert_eq!((c.node(0).cpu_left, c.node(1).cpu_left), (24_000, 56_000));
    }

    #[test]
    fn nothing_fits_nothing_chosen() {
        let c = Cluster::new(&[spec("a", 4_000, 1 << 20, 1)], false).unwrap();
        let mut k = KubeDefault::new(options(), 0);
        assert!(k.choose(&c, &cpu_task(8_000, 1)).is_none());
    }
}
