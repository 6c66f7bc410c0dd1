//! FGD, fragmentation gradient descent (Weng et al., ATC '23), as fgd.md and the simulator's
//! `utils/frag.go` and `plugin/fgd_score.go` compute it.
//!
//! - Typical task shapes: the trace's tasks grouped by `(cpu, num_gpu, gpu_milli, models)`,
//!   sorted by count (descending; ties as the simulator's `sort.Reverse` of `PodResource.Less`:
//!   larger CPU, then larger milli-GPU, then more GPUs, then the larger model string first),
//!   taken `increase_step` at a time until they cover `popularity_threshold_pct` % of the tasks,
//!   their counts normalised into frequencies `p_k` that sum to 1.
//! - Node fragmentation `F(node) = Σ_k p_k × fragment_k`, where for shape k: a CPU-only shape
//!   counts all the node's idle milli-GPU; no access (model not allowed) counts all of it; if
//!   enough GPUs each have `gpu_left >= gpu_milli` and the CPU fits (satisfied), the idle milli-GPU
//!   on GPUs with `gpu_left < gpu_milli` counts; otherwise (lack CPU, lack GPU) all of it.
//! - Score of a candidate: `sigmoid((F(before) − F(after)) / 1000) × 100`, highest wins. A sharing
//!   task tries each GPU with room (first best GPU kept); a whole-GPU task takes the first free
//!   GPUs.
//!
//! Speed: `F(before)` is cached per node and the best `(score, GPU)` per node and task shape,
//! both keyed by the node's version, which changes only when something is placed on it. So after
//! a placement only that node is scored again, once per shape that asks.

use std::cmp::Reverse;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::cluster::{Choice, Cluster, ModelId, ModelMask, Task};
use super::policy::{ArgMax, Placer, PolicyOptions, ScoreRounding, Ties};
use super::trace::TaskSpec;

/// How the typical task shapes are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TypicalConfig {
    /// Take shapes until they cover at least this percentage of the (counted) tasks.
    pub popularity_threshold_pct: f64,
    /// Shapes are taken this many at a time.
    pub increase_step: usize,
    /// Whether CPU-only tasks count (as shapes with no GPU) too.
    pub include_cpu_tasks: bool,
}

impl TypicalConfig {
    /// fgd.md (the simulator's code defaults): GPU tasks, 60 %, 10 at a time.
    pub fn fgd_md() -> Self {
        Self {
            popularity_threshold_pct: 60.0,
            increase_step: 10,
            include_cpu_tasks: false,
        }
    }

    /// What the published runs passed (`scripts/generate_config_and_run.py` defaults:
    /// `isInvolvedCpuPods: true`, `podPopularityThreshold: 95`, `podIncreaseStep: 1`).
    pub fn published_runs() -> Self {
        Self {
            popularity_threshold_pct: 95.0,
            increase_step: 1,
            include_cpu_tasks: true,
        }
    }
}

impl Default for TypicalConfig {
    fn default() -> Self {
        Self::fgd_md()
    }
}

/// One typical shape and its frequency.
#[derive(Debug, Clone, PartialEq)]
pub struct TypicalShape {
    pub cpu_milli: u64,
    pub num_gpu: u32,
    pub gpu_milli: u32,
    pub models: ModelMask,
    /// The `gpu_spec` as written (parts joined by `|`), the simulator's tie-break key.
    pub spec: String,
    /// Tasks of this shape in the trace.
    pub count: u64,
    /// `p_k`.
    pub freq: f64,
}

/// The typical shapes with their frequencies.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TypicalShapes {
    pub shapes: Vec<TypicalShape>,
}

impl TypicalShapes {
    /// From the trace's tasks (before any scaling), resolved against `cluster` for the models.
    pub fn from_tasks(cluster: &Cluster, tasks: &[TaskSpec], config: &TypicalConfig) -> Self {
        type Key = (u64, u32, u32, String);
        let mut counts: HashMap<Key, u64> = HashMap::new();
        let mut total = 0u64;
        for t in tasks {
            if t.num_gpu == 0 && !config.include_cpu_tasks {
                continue;
            }
            let (milli, spec) = if t.num_gpu == 0 {
                (0, String::new())
            } else {
                (t.gpu_milli, t.gpu_spec.join("|"))
            };
            *counts
                .entry((t.cpu_milli, t.num_gpu, milli, spec))
                .or_default() += 1;
            total += 1;
        }
        let mut list: Vec<(Key, u64)> = counts.into_iter().collect();
        list.sort_by(|(a, ca), (b, cb)| {
            let ka = (
                Reverse(*ca),
                Reverse(a.0),
                Reverse(a.2),
                Reverse(a.1),
                Reverse(&a.3),
            );
            let kb = (
                Reverse(*cb),
                Reverse(b.0),
                Reverse(b.2),
                Reverse(b.1),
                Reverse(&b.3),
            );
            ka.cmp(&kb)
        });
        let total_f = total as f64;
        let expected = config.popularity_threshold_pct * total_f / 100.0;
        let step = config.increase_step.max(1);
        let (mut taken, mut cum) = (0usize, 0.0f64);
        let mut upto = 0usize;
        while cum < expected && taken < list.len() {
            upto += step;
            while taken < upto && taken < list.len() {
                cum += list[taken].1 as f64;
                taken += 1;
            }
        }
        // As the simulator: counts / total, renormalised by the covered share unless every
        // shape was taken.
        let renorm = if taken < list.len() {
            cum / total_f
        } else {
            1.0
        };
        let shapes = list
            .into_iter()
            .take(taken)
            .map(|((cpu, num_gpu, milli, spec), count)| {
                let parts: Vec<String> = if spec.is_empty() {
                    Vec::new()
                } else {
                    spec.split('|').map(str::to_string).collect()
                };
                TypicalShape {
                    cpu_milli: cpu,
                    num_gpu,
                    gpu_milli: milli,
                    models: cluster.model_mask(&parts),
                    spec,
                    count,
                    freq: count as f64 / total_f / renorm,
                }
            })
            .collect();
        Self { shapes }
    }

    /// Hand-made shapes (tests, experiments): `(cpu, num_gpu, gpu_milli, models, p)`.
    pub fn from_parts(parts: &[(u64, u32, u32, ModelMask, f64)]) -> Self {
        Self {
            shapes: parts
                .iter()
                .map(|&(cpu, num_gpu, gpu_milli, models, freq)| TypicalShape {
                    cpu_milli: cpu,
                    num_gpu,
                    gpu_milli,
                    models,
                    spec: String::new(),
                    count: 0,
                    freq,
                })
                .collect(),
        }
    }

    /// `F(node)` for a node state. Sums in the simulator's order (per fragment category, then
    /// the categories), so integer-truncated scores agree with it to the last bit as often as
    /// possible.
    pub fn node_fragmentation(&self, cpu_left: u64, gpu_left: &[u32], model: ModelId) -> f64 {
        // q1 lack both, q2 lack GPU, q4 lack CPU, xl/xr CPU-only shape, na no access
        let (mut q1, mut q2, mut q4, mut xl, mut xr, mut na) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        let total: u64 = gpu_left.iter().map(|&g| u64::from(g)).sum();
        let total_f = total as f64;
        for s in &self.shapes {
            let cpu_ok = cpu_left >= s.cpu_milli;
            if s.gpu_milli == 0 {
                if cpu_ok {
                    xl += s.freq * total_f;
                } else {
                    xr += s.freq * total_f;
                }
                continue;
            }
            if !s.models.allows(model) {
                na += s.freq * total_f;
                continue;
            }
            let mut room = 0u32;
            let mut small = 0u64;
            for &g in gpu_left {
                if g >= s.gpu_milli {
                    room += 1;
                } else {
                    small += u64::from(g);
                }
            }
            match (room >= s.num_gpu, cpu_ok) {
                (true, true) => q2 += s.freq * small as f64,
                (true, false) => q4 += s.freq * total_f,
                (false, true) => q2 += s.freq * total_f,
                (false, false) => q1 += s.freq * total_f,
            }
        }
        q1 + q2 + q4 + xl + xr + na
    }
}

/// The logistic function, as the simulator's `sigmoid`.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// FGD's score for a move from fragmentation `before` to `after`: `sigmoid(Δ/1000) × 100`.
pub fn fgd_score(before: f64, after: f64, rounding: ScoreRounding) -> f64 {
    rounding.apply(sigmoid((before - after) / 1000.0) * 100.0)
}

#[derive(Debug, Clone, Copy)]
struct Cached {
    version: u64,
    score: f64,
    gpu: u32,
}

const INVALID: Cached = Cached {
    version: u64::MAX,
    score: 0.0,
    gpu: 0,
};

/// The FGD placer.
#[derive(Debug)]
pub struct Fgd {
    typical: TypicalShapes,
    rounding: ScoreRounding,
    ties: Ties,
    num_shapes: usize,
    /// Per node: `(version, F)`.
    before: Vec<(u64, f64)>,
    /// Per node × shape: best `(score, GPU)`.
    cache: Vec<Cached>,
    scratch: Vec<u32>,
}

impl Fgd {
    /// `num_shapes`: how many task shape ids ([`Task::shape`]) the run uses; tasks with a
    /// larger id are scored without the cache.
    pub fn new(
        typical: TypicalShapes,
        num_shapes: usize,
        options: PolicyOptions,
        seed: u64,
    ) -> Self {
        Self {
            typical,
            rounding: options.rounding,
            ties: Ties::new(options.tie_break, seed),
            num_shapes,
            before: Vec::new(),
            cache: Vec::new(),
            scratch: Vec::new(),
        }
    }

    pub fn typical(&self) -> &TypicalShapes {
        &self.typical
    }

    fn fragmentation_before(&mut self, cluster: &Cluster, i: usize) -> f64 {
        let node = cluster.node(i);
        let (v, f) = self.before[i];
        if v == node.version() {
            return f;
        }
        let f = self
            .typical
            .node_fragmentation(node.cpu_left, &node.gpu_left, node.model);
        self.before[i] = (node.version(), f);
        f
    }

    /// Best `(score, GPU)` for the task on node `i`, which must fit it (if its CPU does not, the
    /// score is −∞). The GPU is meaningful for a sharing task only.
    pub fn node_score(&mut self, cluster: &Cluster, i: usize, task: &Task) -> (f64, usize) {
        if self.before.len() != cluster.nodes().len() {
            self.before = vec![(u64::MAX, 0.0); cluster.nodes().len()];
            self.cache = vec![INVALID; cluster.nodes().len() * self.num_shapes];
        }
        let shape = task.shape as usize;
        let slot = (shape < self.num_shapes).then(|| i * self.num_shapes + shape);
        let version = cluster.node(i).version();
        if let Some(s) = slot {
            let c = self.cache[s];
            if c.version == version {
                return (c.score, c.gpu as usize);
            }
        }
        let Some(cpu_after) = cluster.node(i).cpu_left.checked_sub(task.cpu_milli) else {
            return (f64::NEG_INFINITY, 0);
        };
        let before = self.fragmentation_before(cluster, i);
        let node = cluster.node(i);
        let mut best: Option<(f64, usize)> = None;
        if task.is_fractional() {
            for (g, &left) in node.gpu_left.iter().enumerate() {
                // GPUs with equal room give equal scores; the first of them is kept anyway.
                if left < task.gpu_milli || node.gpu_left[..g].contains(&left) {
                    continue;
                }
                self.scratch.clear();
                self.scratch.extend_from_slice(&node.gpu_left);
                self.scratch[g] -= task.gpu_milli;
                let after = self
                    .typical
                    .node_fragmentation(cpu_after, &self.scratch, node.model);
                let score = fgd_score(before, after, self.rounding);
                if best.is_none_or(|(b, _)| score > b) {
                    best = Some((score, g));
                }
            }
        } else {
            self.scratch.clear();
            self.scratch.extend_from_slice(&node.gpu_left);
            let mut need = task.num_gpu;
            for g in self.scratch.iter_mut() {
                if need == 0 {
                    break;
                }
                if *g == super::trace::MILLI {
                    *g = 0;
                    need -= 1;
                }
            }
            let after = self
                .typical
                .node_fragmentation(cpu_after, &self.scratch, node.model);
            best = Some((fgd_score(before, after, self.rounding), 0));
        }
        let (score, gpu) = best.unwrap_or((f64::NEG_INFINITY, 0));
        if let Some(s) = slot {
            self.cache[s] = Cached {
                version,
                score,
                gpu: gpu as u32,
            };
        }
        (score, gpu)
    }
}

impl Placer for Fgd {
    fn name(&self) -> &str {
        "FGD"
    }

    fn choose(&mut self, cluster: &Cluster, task: &Task) -> Option<Choice> {
        self.ties.prepare(cluster.nodes().len());
        let mut best = ArgMax::new();
        for i in 0..cluster.nodes().len() {
            if cluster.fits(i, task) {
                let (score, gpu) = self.node_score(cluster, i, task);
                best.offer(score, i, gpu, &mut self.ties);
            }
        }
        let (node, gpu) = best.best()?;
        let gpus = if task.is_fractional() {
            vec![gpu]
        } else {
            cluster.first_free_gpus(node, task.num_gpu)?
        };
        Some(Choice { node, gpus })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openb::policy::TieBreak;
    use crate::openb::trace::NodeSpec;

    const ANY: ModelMask = ModelMask::ANY;

    /// Two typical shapes: A = 1 GPU × 600 milli, 4 cores (p = 0.75);
    /// B = 2 whole GPUs, 8 cores (p = 0.25).
    fn two_shapes() -> TypicalShapes {
        TypicalShapes::from_parts(&[(4000, 1, 600, ANY, 0.75), (8000, 2, 1000, ANY, 0.25)])
    }

    #[test]
    fn fragmentation_of_a_hand_computed_node() {
        let t = two_shapes();
        // Node: GPUs [1000, 500, 0], 16 cores left; idle = 1500.
        // A (600): GPUs with room >= 600: {1000} -> 1 >= 1, CPU 16 >= 4: satisfied;
        //          fragment = idle on GPUs below 600 = 500 + 0 = 500.
        // B (2 x 1000): GPUs with room >= 1000: {1000} -> 1 < 2: lack GPU; fragment = 1500.
        // F = 0.75 × 500 + 0.25 × 1500 = 375 + 375 = 750.
        let f = t.node_fragmentation(16_000, &[1000, 500, 0], 0);
        assert!((f - 750.0).abs() < 1e-9, "{f}");

        // Same GPUs, 2 cores left: A lacks CPU (1500), B lacks both (1500): F = 1500.
        let f = t.node_fragmentation(2_000, &[1000, 500, 0], 0);
        assert!((f - 1500.0).abs() < 1e-9, "{f}");

        // Two free GPUs, 8 cores: A satisfied, fragment 0 (no GPU below 600);
        // B satisfied, fragment 0. F = 0.
        assert_eq!(t.node_fragmentation(8_000, &[1000, 1000], 0), 0.0);

        // No access: shape A only on model 1; node is model 0 -> A counts all idle (1500);
        // B as in the first case (1500). F = 0.75 × 1500 + 0.25 × 1500 = 1500.
        let t = TypicalShapes::from_parts(&[
            (4000, 1, 600, ModelMask(0b10), 0.75),
            (8000, 2, 1000, ANY, 0.25),
        ]);
        let f = t.node_fragmentation(16_000, &[1000, 500, 0], 0);
        assert!((f - 1500.0).abs() < 1e-9, "{f}");

        // A CPU-only shape counts all idle milli-GPU whether or not its CPU fits.
        let t = TypicalShapes::from_parts(&[(4000, 0, 0, ANY, 1.0)]);
        assert_eq!(t.node_fragmentation(16_000, &[1000, 500, 0], 0), 1500.0);
        assert_eq!(t.node_fragmentation(0, &[1000, 500, 0], 0), 1500.0);
    }

    #[test]
    fn score_is_the_sigmoid_of_the_fragmentation_drop() {
        let t = two_shapes();
        // Place a 500-milli task (2 cores) on GPU 0 of [1000, 500, 0], 16 cores:
        // after: [500, 500, 0], 14 cores: A lacks GPU (1000), B lacks GPU (1000): F = 1000.
        // Δ = 750 − 1000 = −250; score = 100 / (1 + e^0.25) = 43.78...
        let before = t.node_fragmentation(16_000, &[1000, 500, 0], 0);
        let after = t.node_fragmentation(14_000, &[500, 500, 0], 0);
        assert!((after - 1000.0).abs() < 1e-9);
        let s = fgd_score(before, after, ScoreRounding::Exact);
        assert!((s - 100.0 / (1.0 + 0.25f64.exp())).abs() < 1e-9, "{s}");
        assert_eq!(fgd_score(before, after, ScoreRounding::Integer), 43.0);
        // On GPU 1 instead: after [1000, 0, 0]: A satisfied, fragment 0; B lacks GPU, 1000.
        // F = 250, Δ = +500, score = 100 / (1 + e^-0.5) = 62.2...
        let after = t.node_fragmentation(14_000, &[1000, 0, 0], 0);
        assert!((after - 250.0).abs() < 1e-9);
        assert!(fgd_score(before, after, ScoreRounding::Exact) > 62.0);
    }

    fn cluster(nodes: &[(u64, u32)]) -> Cluster {
        let specs: Vec<NodeSpec> = nodes
            .iter()
            .enumerate()
            .map(|(i, &(cpu, gpus))| NodeSpec {
                name: format!("n{i}"),
                cpu_milli: cpu,
                memory_mib: 1 << 20,
                num_gpu: gpus,
                model: "G".into(),
            })
            .collect();
        Cluster::new(&specs, false).unwrap()
    }

    #[test]
    fn fgd_prefers_the_gpu_that_keeps_room_for_typical_shapes() {
        let mut c = cluster(&[(32_000, 2), (32_000, 2)]);
        let task = |milli, shape| Task {
            cpu_milli: 1000,
            memory_mib: 1,
            num_gpu: 1,
            gpu_milli: milli,
            models: ANY,
            shape,
        };
        // Make node 0 = [1000, 500].
        c.place(
            &task(500, 0),
            &Choice {
                node: 0,
                gpus: vec![1],
            },
        )
        .unwrap();
        let t = two_shapes();
        let mut fgd = Fgd::new(t, 2, PolicyOptions::default(), 1);
        // A 400-milli task: on node 0 GPU 1 (500 -> 100) keeps GPU 0 whole for A and costs
        // F: before 0.75×500 + 0.25×1500 = 750; after [1000, 100]: 0.75×100 + 0.25×1100 = 350.
        // Δ = +400: best. Node 1 [1000, 1000] -> [600, 1000] or [1000, 600]: before 0; after:
        // A satisfied (fragment 0), B lacks GPU (1600 × 0.25 = 400), Δ = −400.
        let choice = fgd.choose(&c, &task(400, 1)).unwrap();
        assert_eq!(
            choice,
            Choice {
                node: 0,
                gpus: vec![1]
            }
        );
        let (s, g) = fgd.node_score(&c, 0, &task(400, 1));
        assert_eq!(g, 1);
        assert!((s - 100.0 * sigmoid(0.4)).abs() < 1e-9);
        // Cached values are invalidated by a placement on the node.
        c.place(
            &task(400, 1),
            &Choice {
                node: 0,
                gpus: vec![1],
            },
        )
        .unwrap();
        // Now node 0 = [1000, 100]: only GPU 0 has room for 400.
        let (_, g) = fgd.node_score(&c, 0, &task(400, 1));
        assert_eq!(g, 0);
    }

    #[test]
    fn typical_shapes_take_ten_at_a_time_and_normalise() {
        let c = cluster(&[(1000, 1)]);
        let mk = |cpu: u64, n: usize| {
            (0..n).map(move |_| TaskSpec {
                name: String::new(),
                cpu_milli: cpu,
                memory_mib: 0,
                num_gpu: 1,
                gpu_milli: 500,
                gpu_spec: vec![],
                creation_time: None,
            })
        };
        // 12 shapes: counts 30, 20, then ten shapes of 5; 2 CPU-only tasks.
        let mut tasks: Vec<TaskSpec> = mk(1, 30).chain(mk(2, 20)).collect();
        for s in 0..10 {
            tasks.extend(mk(100 + s, 5));
        }
        tasks.extend((0..2).map(|_| TaskSpec {
            name: String::new(),
            cpu_milli: 7,
            memory_mib: 0,
            num_gpu: 0,
            gpu_milli: 0,
            gpu_spec: vec![],
            creation_time: None,
        }));
        // GPU tasks: 100. 60 % -> the first 10 shapes (cover 30 + 20 + 8 × 5 = 90 >= 60).
        let t = TypicalShapes::from_tasks(&c, &tasks, &TypicalConfig::fgd_md());
        assert_eq!(t.shapes.len(), 10);
        assert_eq!(t.shapes[0].cpu_milli, 1);
        assert!((t.shapes[0].freq - 30.0 / 90.0).abs() < 1e-12);
        // ties (count 5) go to the larger CPU first
        assert_eq!(t.shapes[2].cpu_milli, 109);
        let sum: f64 = t.shapes.iter().map(|s| s.freq).sum();
        assert!((sum - 1.0).abs() < 1e-12);
        // One at a time, 95 %, CPU tasks counted: total 102, need 96.9: 30+20+5×10 = 100 -> all
        // 12 GPU shapes; the CPU shape (count 2) is last and not needed.
        let cfg = TypicalConfig::published_runs();
        let t = TypicalShapes::from_tasks(&c, &tasks, &cfg);
        assert_eq!(t.shapes.len(), 12);
        assert!(t.shapes.iter().all(|s| s.num_gpu == 1));
        assert!((t.shapes[0].freq - 30.0 / 100.0).abs() < 1e-12);
    }

    #[test]
    fn random_ties_still_choose_a_best_node() {
        let c = cluster(&[(32_000, 2), (32_000, 2), (32_000, 2)]);
        let opts = PolicyOptions {
            rounding: ScoreRounding::Integer,
            tie_break: TieBreak::Random,
        };
        let mut fgd = Fgd::new(two_shapes(), 1, opts, 3);
        let task = Task {
            cpu_milli: 1000,
            memory_mib: 1,
            num_gpu: 1,
            gpu_milli: 300,
            models: ANY,
            shape: 0,
        };
        let mut seen = [false; 3];
        for _ in 0..50 {
            seen[fgd.choose(&c, &task).unwrap().node] = true;
        }
        assert_eq!(seen, [true, true, true], "identical nodes tie");
    }
}
