//! `gpu_spec` variants of a trace, the FGD simulator's way: a seeded random share of the GPU
//! tasks pinned to one GPU model each.
//!
//! The held-out traces the engine must generalise to constrain 10 % to 33 % of their tasks to one
//! model. Each GPU task is pinned with probability `share`; a pinned task gets one model, drawn
//! with probability proportional to that model's GPUs in the cluster (the model mix), among the
//! models with a node that could host the task on an empty cluster (enough GPUs and CPU, and
//! memory): a pin to a model no node of which can ever host the task would only measure that the
//! task is skipped. CPU-only tasks ask no GPU and stay as they are; a task already pinned keeps
//! its pin. The same trace, share and seed always give the same variant.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::trace::{NodeSpec, TaskSpec};

/// Why a variant cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GpuSpecError {
    #[error("the pinned share must be between 0 and 1, got {0}")]
    Share(f64),
}

/// One model of the node list: its name, its GPUs in all, and each node's (GPUs, CPU, memory).
type Model = (String, u64, Vec<(u32, u64, u64)>);

/// The models of the node list, in order of first appearance.
fn models(nodes: &[NodeSpec]) -> Vec<Model> {
    let mut out: Vec<Model> = Vec::new();
    for n in nodes {
        let i = match out.iter().position(|m| m.0 == n.model) {
            Some(i) => i,
            None => {
                out.push((n.model.clone(), 0, Vec::new()));
                out.len() - 1
            }
        };
        out[i].1 += u64::from(n.num_gpu);
        out[i].2.push((n.num_gpu, n.cpu_milli, n.memory_mib));
    }
    out
}

/// Pins a seeded random `share` of the GPU tasks to one model each (see the module
/// documentation); returns how many tasks were pinned.
pub fn pin_gpu_spec(
    nodes: &[NodeSpec],
    tasks: &mut [TaskSpec],
    share: f64,
    seed: u64,
) -> Result<usize, GpuSpecError> {
    if !(0.0..=1.0).contains(&share) {
        return Err(GpuSpecError::Share(share));
    }
    let models = models(nodes);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6770_755f_7370_6563);
    let mut pinned = 0;
    for t in tasks.iter_mut() {
        if t.num_gpu == 0 || !t.gpu_spec.is_empty() {
            continue;
        }
        // Drawn for every GPU task, pinned or not, so that a task's fate does not depend on
        // which models earlier tasks could use.
        let pin = rng.random::<f64>() < share;
        let pick = rng.random::<f64>();
        if !pin {
            continue;
        }
        let hosts = |m: &Model| {
            m.2.iter().any(|&(gpus, cpu, memory)| {
                gpus >= t.num_gpu && cpu >= t.cpu_milli && memory >= t.memory_mib
            })
        };
        let total: u64 = models.iter().filter(|m| hosts(m)).map(|m| m.1).sum();
        if total == 0 {
            continue;
        }
        let mut target = pick * total as f64;
        for m in models.iter().filter(|m| hosts(m)) {
            target -= m.1 as f64;
            if target < 0.0 {
                t.gpu_spec = vec![m.0.clone()];
                break;
            }
        }
        if t.gpu_spec.is_empty() {
            // (rounding at the very end of the range)
            if let Some(m) = models.iter().rev().find(|m| hosts(m)) {
                t.gpu_spec = vec![m.0.clone()];
            }
        }
        pinned += 1;
    }
    Ok(pinned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: usize, gpus: u32, cpu: u64, model: &str) -> NodeSpec {
        NodeSpec {
            name: format!("n{i}"),
            cpu_milli: cpu,
            memory_mib: 1 << 18,
            num_gpu: gpus,
            model: model.into(),
        }
    }

    fn task(num_gpu: u32, cpu: u64) -> TaskSpec {
        TaskSpec {
            name: String::new(),
            cpu_milli: cpu,
            memory_mib: 1024,
            num_gpu,
            gpu_milli: if num_gpu == 0 { 0 } else { 1000 },
            gpu_spec: vec![],
            creation_time: None,
        }
    }

    #[test]
    fn pins_the_share_by_the_model_mix_and_only_where_a_node_fits() {
        // A: 3 nodes × 8 GPUs (24), B: 8 nodes × 1 GPU (8): a 1-GPU task goes to A 3 times in 4.
        let mut nodes: Vec<NodeSpec> = (0..3).map(|i| node(i, 8, 64_000, "A")).collect();
        nodes.extend((3..11).map(|i| node(i, 1, 8_000, "B")));
        let mut tasks: Vec<TaskSpec> = (0..20_000)
            .map(|i| match i % 4 {
                0 => task(0, 1000),
                1 => task(4, 1000),   // only A has 4 GPUs
                2 => task(1, 16_000), // only A has the CPU
                _ => task(1, 1000),
            })
            .collect();
        let pinned = pin_gpu_spec(&nodes, &mut tasks, 0.2, 7).unwrap();
        let gpu_tasks = 15_000.0;
        assert!((pinned as f64 / gpu_tasks - 0.2).abs() < 0.015, "{pinned}");
        let (mut a, mut b) = (0, 0);
        for (i, t) in tasks.iter().enumerate() {
            match i % 4 {
                0 => assert!(t.gpu_spec.is_empty()),
                1 | 2 => assert!(t.gpu_spec.is_empty() || t.gpu_spec == ["A"]),
                _ => match t.gpu_spec.first().map(String::as_str) {
                    Some("A") => a += 1,
                    Some("B") => b += 1,
                    _ => {}
                },
            }
        }
        let share_a = f64::from(a) / f64::from(a + b);
        assert!((share_a - 0.75).abs() < 0.04, "{a} {b}");
    }

    #[test]
    fn same_seed_same_variant_and_bad_share_refused() {
        let nodes = vec![node(0, 8, 64_000, "A"), node(1, 2, 64_000, "B")];
        let base: Vec<TaskSpec> = (0..500).map(|_| task(1, 1000)).collect();
        let (mut x, mut y, mut z) = (base.clone(), base.clone(), base);
        pin_gpu_spec(&nodes, &mut x, 0.33, 1).unwrap();
        pin_gpu_spec(&nodes, &mut y, 0.33, 1).unwrap();
        pin_gpu_spec(&nodes, &mut z, 0.33, 2).unwrap();
        assert_eq!(x, y);
        assert_ne!(x, z);
        assert_eq!(
            pin_gpu_spec(&nodes, &mut x, 1.5, 1),
            Err(GpuSpecError::Share(1.5))
        );
    }
}
