//! BestFit, as the simulator's `BestFitScore`: the node whose leftover after placing,
//!
//! ```text
//! leftover = 0.5 × (cpu_left − cpu) / 128,000 + 0.5 × (gpu_left_total − gpu) / 8,000
//! ```
//!
//! is lowest (score `(1 − leftover) × 100`, highest wins). With [`ScoreRounding::Exact`] the
//! comparison is done exactly on the integer `(cpu_left − cpu) + 16 × (gpu_left_total − gpu)`
//! (the leftover times 256,000); with [`ScoreRounding::Integer`] on the simulator's truncated
//! integer score.
//!
//! GPU inside the chosen node (the simulator's default `best` GPU selection): a sharing task
//! takes the GPU with the least room that still fits (lowest index among equals); a whole-GPU
//! task the first completely free GPUs.

use super::cluster::{Choice, Cluster, Node, Task};
use super::policy::{ArgMax, Placer, PolicyOptions, ScoreRounding, Ties};

/// The simulator's normalisers (`MaxSpecCpu`, `MaxSpecGpu`).
pub const MAX_SPEC_CPU: f64 = 128_000.0;
pub const MAX_SPEC_GPU: f64 = 8_000.0;

#[derive(Debug)]
pub struct BestFit {
    rounding: ScoreRounding,
    ties: Ties,
}

impl BestFit {
    pub fn new(options: PolicyOptions, seed: u64) -> Self {
        Self {
            rounding: options.rounding,
            ties: Ties::new(options.tie_break, seed),
        }
    }
}

/// The leftover fraction after placing `task` on `node` (lower is better), as fgd.md writes it.
/// The task must fit.
pub fn leftover(node: &Node, task: &Task) -> f64 {
    let cpu = node.cpu_left.saturating_sub(task.cpu_milli) as f64;
    let gpu = node.gpu_left_total().saturating_sub(task.gpu_request()) as f64;
    0.5 * cpu / MAX_SPEC_CPU + 0.5 * gpu / MAX_SPEC_GPU
}

/// The score of `task` on `node` (higher is better). Exact: minus the leftover times 256,000, an
/// integer, so equal leftovers compare equal. Integer: the simulator's `int64((1 − leftover) ×
/// 100)`, computed in the same order of floating-point operations.
pub fn score(node: &Node, task: &Task, rounding: ScoreRounding) -> f64 {
    match rounding {
        ScoreRounding::Exact => {
            let cpu = node.cpu_left.saturating_sub(task.cpu_milli);
            let gpu = node.gpu_left_total().saturating_sub(task.gpu_request());
            -((cpu + 16 * gpu) as f64)
        }
        ScoreRounding::Integer => {
            let mut s = 0.0;
            s += (node.cpu_left as f64 - task.cpu_milli as f64) / MAX_SPEC_CPU * 0.5;
            s += (node.gpu_left_total() as f64 - task.gpu_request() as f64) / MAX_SPEC_GPU * 0.5;
            rounding.apply((1.0 - s) * 100.0)
        }
    }
}

/// The tightest GPU for a sharing task: least `gpu_left` that is still `>= gpu_milli`, lowest
/// index among equals.
pub fn tightest_gpu(node: &Node, gpu_milli: u32) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &g) in node.gpu_left.iter().enumerate() {
        if g >= gpu_milli && best.is_none_or(|b| g < node.gpu_left[b]) {
            best = Some(i);
        }
    }
    best
}

impl Placer for BestFit {
    fn name(&self) -> &str {
        "BestFit"
    }

    fn choose(&mut self, cluster: &Cluster, task: &Task) -> Option<Choice> {
        self.ties.prepare(cluster.nodes().len());
        let mut best = ArgMax::new();
        for (i, node) in cluster.nodes().iter().enumerate() {
            if cluster.fits(i, task) {
                best.offer(score(node, task, self.rounding), i, (), &mut self.ties);
            }
        }
        let (node, ()) = best.best()?;
        let gpus = if task.is_fractional() {
            vec![tightest_gpu(cluster.node(node), task.gpu_milli)?]
        } else {
            cluster.first_free_gpus(node, task.num_gpu)?
        };
        Some(Choice { node, gpus })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openb::cluster::{Cluster, ModelMask};
    use crate::openb::policy::TieBreak;
    use crate::openb::trace::NodeSpec;

    fn cluster() -> Cluster {
        let spec = |name: &str, cpu, gpus| NodeSpec {
            name: name.into(),
            cpu_milli: cpu,
            memory_mib: 1 << 20,
            num_gpu: gpus,
            model: "G".into(),
        };
        // a: 96 cores, 8 GPUs; b: 32 cores, 2 GPUs; c: 32 cores, 2 GPUs
        Cluster::new(
            &[
                spec("a", 96_000, 8),
                spec("b", 32_000, 2),
                spec("c", 32_000, 2),
            ],
            false,
        )
        .unwrap()
    }

    fn task(cpu: u64, num_gpu: u32, gpu_milli: u32) -> Task {
        Task {
            cpu_milli: cpu,
            memory_mib: 1,
            num_gpu,
            gpu_milli,
            models: ModelMask::ANY,
            shape: 0,
        }
    }

    #[test]
    fn leftover_and_score_by_hand() {
        let c = cluster();
        let t = task(8_000, 1, 500);
        // node a: 0.5 × 88,000 / 128,000 + 0.5 × 7,500 / 8,000 = 0.34375 + 0.46875 = 0.8125
        assert!((leftover(c.node(0), &t) - 0.8125).abs() < 1e-12);
        // node b: 0.5 × 24,000 / 128,000 + 0.5 × 1,500 / 8,000 = 0.09375 + 0.09375 = 0.1875
        assert!((leftover(c.node(1), &t) - 0.1875).abs() < 1e-12);
        // integer score: (1 − 0.1875) × 100 = 81.25 -> 81; (1 − 0.8125) × 100 = 18.75 -> 18
        assert_eq!(score(c.node(1), &t, ScoreRounding::Integer), 81.0);
        assert_eq!(score(c.node(0), &t, ScoreRounding::Integer), 18.0);
        // exact: −(cpu + 16 × gpu) = −(24,000 + 16 × 1,500) = −48,000 = −0.1875 × 256,000
        assert_eq!(score(c.node(1), &t, ScoreRounding::Exact), -48_000.0);
        assert_eq!(
            score(c.node(0), &t, ScoreRounding::Exact),
            -0.8125 * 256_000.0
        );
    }

    #[test]
    fn best_fit_picks_the_tightest_node_and_gpu() {
        let mut c = cluster();
        let opts = PolicyOptions {
            rounding: ScoreRounding::Exact,
            tie_break: TieBreak::NodeOrder,
        };
        let mut bf = BestFit::new(opts, 42);
        // b and c tie; node order takes b
        let half = task(4_000, 1, 500);
        let first = bf.choose(&c, &half).unwrap();
        assert_eq!(
            first,
            Choice {
                node: 1,
                gpus: vec![0]
            }
        );
        c.place(&half, &first).unwrap();
        // b = [500, 1000]: a 400-milli task goes to b's GPU 0 (least room that fits)
        let small = task(4_000, 1, 400);
        assert_eq!(
            bf.choose(&c, &small).unwrap(),
            Choice {
                node: 1,
                gpus: vec![0]
            }
        );
        // 2 whole GPUs: b has only one free GPU; c is the tightest that fits
        let two = task(4_000, 2, 1000);
        assert_eq!(
            bf.choose(&c, &two).unwrap(),
            Choice {
                node: 2,
                gpus: vec![0, 1]
            }
        );
        assert_eq!(tightest_gpu(c.node(1), 600), Some(1));
        assert_eq!(tightest_gpu(c.node(1), 1001), None);
    }
}
