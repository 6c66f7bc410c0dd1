//! An upper bound on the allocation any placement could reach: the LP relaxation of the
//! arrived tasks over pooled capacity, solved with good_lp (microlp).
//!
//! Nodes are pooled into classes of equal (model, GPU count); a task shape may use a class when
//! its models allow the class's model, a node of the class has as many GPUs as the task asks,
//! and the task's CPU (and memory, when checked) fits one node. Within a class GPU, CPU and
//! memory are pooled, and tasks may be split: every placement any policy can make is feasible
//! here, so the optimum bounds them all. Tasks may be skipped, so CPU-only tasks, which place no
//! GPU, are left out without weakening the bound.
//!
//! Pooling alone lets shares fill GPUs perfectly, so per class it adds the packing cuts of
//! bin-packing lower bounds (Martello and Toth's L2), one per threshold `a` in `1..=500`: a task
//! taking more than `1000 − a` milli of a GPU leaves less than `a` on it, room that no task of
//! `a` milli or more can use, so
//!
//! ```text
//! 1000 × #(tasks above 1000 − a) + Σ milli of the tasks in [a, 1000 − a]  ≤  1000 × GPUs
//! ```
//!
//! (whole GPUs count as above `1000 − a`; tasks under `a` are left out, which only loosens it).
//! Every integral placement satisfies every cut, so the bound stays valid; only the thresholds
//! where a cut changes (a share size `m ≤ 500` or `1001 − m` for a larger one) are added.

use std::collections::BTreeMap;

use good_lp::{Expression, ProblemVariables, Solution, SolverModel, microlp, variable};

use super::cluster::{Cluster, Task};

/// Capacity pooled over the nodes of one (model, GPU count) class.
#[derive(Debug, Clone, Copy)]
struct Class {
    model: u8,
    gpus_per_node: usize,
    max_cpu: u64,
    max_memory: u64,
    gpu_milli: u64,
    cpu: u64,
    memory: u64,
}

/// The largest allocation (percent of GPU capacity) that placing any subset of `tasks` on the
/// empty `cluster` could reach. `None` only when the LP solver fails, which would be a bug.
pub fn allocation_bound<'a>(
    cluster: &Cluster,
    tasks: impl IntoIterator<Item = &'a Task>,
) -> Option<f64> {
    let mut classes: BTreeMap<(u8, usize), Class> = BTreeMap::new();
    for n in cluster.nodes() {
        let c = classes.entry((n.model, n.gpu_left.len())).or_insert(Class {
            model: n.model,
            gpus_per_node: n.gpu_left.len(),
            max_cpu: 0,
            max_memory: 0,
            gpu_milli: 0,
            cpu: 0,
            memory: 0,
        });
        c.max_cpu = c.max_cpu.max(n.cpu_capacity);
        c.max_memory = c.max_memory.max(n.memory_capacity);
        c.gpu_milli += n.gpu_left.len() as u64 * 1000;
        c.cpu += n.cpu_capacity;
        c.memory += n.memory_capacity;
    }
    let classes: Vec<Class> = classes.into_values().collect();

    // Arrived GPU tasks by shape (memory apart: shapes ignore it), with their count.
    let mut shapes: BTreeMap<(u32, u64), (&Task, u64)> = BTreeMap::new();
    for t in tasks {
        if t.num_gpu > 0 {
            shapes.entry((t.shape, t.memory_mib)).or_insert((t, 0)).1 += 1;
        }
    }
    let capacity = cluster.total_gpu_milli().max(1) as f64;
    let check_memory = cluster.check_memory();

    let mut vars = ProblemVariables::new();
    let mut objective = Expression::from(0.0);
    let mut per_shape: Vec<(Expression, f64)> = Vec::new();
    let mut gpu_use: Vec<Expression> = vec![Expression::from(0.0); classes.len()];
    // Per class, (milli per GPU, GPUs, variable) of every GPU task shape placed there, for the cuts.
    let mut gpu_vars: Vec<Vec<(u32, u32, good_lp::Variable)>> = vec![Vec::new(); classes.len()];
    let mut cpu_use: Vec<Expression> = vec![Expression::from(0.0); classes.len()];
    let mut mem_use: Vec<Expression> = vec![Expression::from(0.0); classes.len()];
    for (task, count) in shapes.values() {
        let mut placed = Expression::from(0.0);
        for (k, c) in classes.iter().enumerate() {
            let fits = task.models.allows(c.model)
                && task.num_gpu as usize <= c.gpus_per_node
                && task.cpu_milli <= c.max_cpu
                && (!check_memory || task.memory_mib <= c.max_memory);
            if !fits {
                continue;
            }
            let y = vars.add(variable().min(0.0));
            placed += y;
            let g = task.gpu_request() as f64;
            objective += g * y;
            gpu_use[k] += g * y;
            gpu_vars[k].push((task.gpu_milli, task.num_gpu, y));
            cpu_use[k] += task.cpu_milli as f64 * y;
            mem_use[k] += task.memory_mib as f64 * y;
        }
        per_shape.push((placed, *count as f64));
    }
    let mut model = vars.maximise(objective.clone()).using(microlp);
    for (placed, count) in per_shape {
        model = model.with(placed.leq(count));
    }
    let mut thresholds: Vec<u32> = shapes
        .values()
        .filter(|(t, _)| t.num_gpu == 1 && t.gpu_milli < 1000)
        .map(|(t, _)| {
            if t.gpu_milli <= 500 {
                t.gpu_milli
            } else {
                1001 - t.gpu_milli
            }
        })
        .collect();
    thresholds.sort_unstable();
    thresholds.dedup();
    for (k, c) in classes.iter().enumerate() {
        for &a in &thresholds {
            let mut used = Expression::from(0.0);
            for &(milli, num_gpu, y) in &gpu_vars[k] {
                // `y` counts tasks; a task of several GPUs takes whole ones, each above 1000 − a.
                let per_task = if milli > 1000 - a {
                    1000.0
                } else if milli >= a {
                    f64::from(milli)
                } else {
                    continue;
                };
                used += per_task * f64::from(num_gpu) * y;
            }
            model = model.with(used.leq(c.gpu_milli as f64));
        }
        model = model
            .with(gpu_use[k].clone().leq(c.gpu_milli as f64))
            .with(cpu_use[k].clone().leq(c.cpu as f64));
        if check_memory {
            model = model.with(mem_use[k].clone().leq(c.memory as f64));
        }
    }
    let solution = model.solve().ok()?;
    Some((100.0 * solution.eval(&objective) / capacity).min(100.0))
}

/// The mean bound over the configured seeds at each checkpoint: for seed and checkpoint k, the
/// bound on the arrivals up to the one that brings arrived demand to k % of capacity.
pub fn mean_bound_at(workload: &super::Workload, config: &super::SimConfig) -> Vec<f64> {
    let capacity = workload.cluster().total_gpu_milli().max(1) as f64;
    let mut sums = vec![0.0; config.checkpoints.len()];
    for &seed in &config.seeds {
        let arrivals = super::scale(workload, seed, config.target_ratio, config.arrival);
        let tasks = workload.tasks();
        for (j, &k) in config.checkpoints.iter().enumerate() {
            let mut arrived = 0u64;
            let mut end = arrivals.order.len();
            for (n, &i) in arrivals.order.iter().enumerate() {
                arrived += tasks[i].gpu_request();
                if 100.0 * arrived as f64 / capacity >= f64::from(k) {
                    end = n + 1;
                    break;
                }
            }
            let prefix = arrivals.order[..end].iter().map(|&i| &tasks[i]);
            sums[j] += allocation_bound(workload.cluster(), prefix).unwrap_or(100.0);
        }
    }
    sums.iter()
        .map(|s| s / config.seeds.len().max(1) as f64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openb::{NodeSpec, TaskSpec};

    fn node(name: &str, gpus: u32, model: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            cpu_milli: 64_000,
            memory_mib: 1 << 18,
            num_gpu: gpus,
            model: model.into(),
        }
    }

    fn task(num_gpu: u32, gpu_milli: u32, cpu_milli: u64, spec: &[&str]) -> TaskSpec {
        TaskSpec {
            name: "t".into(),
            cpu_milli,
            memory_mib: 1024,
            num_gpu,
            gpu_milli,
            gpu_spec: spec.iter().map(|s| s.to_string()).collect(),
            creation_time: None,
        }
    }

    fn bound(nodes: &[NodeSpec], tasks: &[TaskSpec]) -> f64 {
        let w = super::super::Workload::new(nodes, tasks.to_vec(), false).unwrap();
        allocation_bound(w.cluster(), w.tasks()).unwrap()
    }

    #[test]
    fn demand_below_capacity_bounds_at_the_demand() {
        // 2 nodes × 4 GPUs; 3 whole GPUs and a half asked: at most 3.5 / 8.
        let nodes = [node("a", 4, "A"), node("b", 4, "A")];
        let tasks = [
            task(1, 1000, 1000, &[]),
            task(2, 1000, 1000, &[]),
            task(1, 500, 1000, &[]),
        ];
        assert!((bound(&nodes, &tasks) - 43.75).abs() < 1e-6);
    }

    #[test]
    fn model_constraints_and_node_size_limit_the_bound() {
        // Only model B (1 node of 2 GPUs) is allowed, and 8-GPU tasks fit no node.
        let nodes = [node("a", 4, "A"), node("b", 2, "B")];
        let tasks = [
            task(1, 1000, 1000, &["B"]),
            task(1, 1000, 1000, &["B"]),
            task(1, 1000, 1000, &["B"]),
            task(8, 1000, 1000, &[]),
        ];
        assert!((bound(&nodes, &tasks) - 100.0 * 2.0 / 6.0).abs() < 1e-6);
    }

    #[test]
    fn cpu_caps_the_bound() {
        // 64 cores per node; tasks of 40 cores each: one per node by CPU, pooled 128 cores fit 3.2.
        let nodes = [node("a", 4, "A"), node("b", 4, "A")];
        let tasks: Vec<TaskSpec> = (0..8).map(|_| task(1, 1000, 40_000, &[])).collect();
        assert!((bound(&nodes, &tasks) - 100.0 * 3.2 / 8.0).abs() < 1e-6);
    }

    #[test]
    fn packing_cuts_see_shares_that_cannot_pair() {
        // 2 nodes × 1 GPU; two 810-milli and two 300-milli shares. No 300 fits beside an 810,
        // so the best placement is 810 + 810 (81 %); pooled capacity alone would say 100 %.
        // The cut at a = 191 (810s count as whole GPUs) gives 300 + 300 + 1.4 × 810: 86.7 %.
        let nodes = [node("a", 1, "A"), node("b", 1, "A")];
        let tasks = [
            task(1, 810, 1000, &[]),
            task(1, 810, 1000, &[]),
            task(1, 300, 1000, &[]),
            task(1, 300, 1000, &[]),
        ];
        let b = bound(&nodes, &tasks);
        assert!((b - 86.7).abs() < 1e-6, "{b}");
    }
}
