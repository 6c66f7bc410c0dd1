//! Properties of every policy on random small clusters and task streams: no GPU or CPU is ever
//! oversubscribed (checked against an independent ledger of the choices, before the cluster's
//! own checks), the cluster's books balance after every placement, and a task is skipped only
//! when no node can take it.

use proptest::prelude::*;
use tessera_sim::openb::{
    self, Cluster, NodeSpec, PolicyKind, PolicyOptions, ScoreRounding, TaskSpec, TieBreak,
    TypicalConfig, Workload,
};

const MODELS: [&str; 3] = ["A", "B", "C"];

fn node_strategy() -> impl Strategy<Value = NodeSpec> {
    (1u64..=16, 0u32..=8, 0usize..2, 1u64..=8).prop_map(|(cores, gpus, model, mem)| NodeSpec {
        name: String::new(),
        cpu_milli: cores * 4000,
        memory_mib: mem * 8192,
        num_gpu: gpus,
        model: MODELS[model].to_string(),
    })
}

fn task_strategy() -> impl Strategy<Value = TaskSpec> {
    (
        0u64..=24,
        prop_oneof![
            Just(0u32),
            Just(1),
            Just(1),
            Just(1),
            Just(2),
            Just(4),
            Just(8)
        ],
        1u32..=1000,
        any::<bool>(),
        0u8..8,
        0u64..=16,
    )
        .prop_map(|(cores, num_gpu, milli, whole, models, mem)| TaskSpec {
            name: String::new(),
            cpu_milli: cores * 1000,
            memory_mib: mem * 1024,
            num_gpu,
            gpu_milli: match num_gpu {
                0 => 0,
                1 if !whole => milli,
                _ => 1000,
            },
            gpu_spec: MODELS
                .iter()
                .enumerate()
                .filter(|(i, _)| models & (1 << i) != 0)
                .map(|(_, m)| m.to_string())
                .collect(),
            creation_time: None,
        })
}

fn options() -> impl Strategy<Value = (PolicyOptions, bool, bool)> {
    (0usize..2, 0usize..3, any::<bool>(), any::<bool>()).prop_map(|(r, t, typical, memory)| {
        let rounding = [ScoreRounding::Exact, ScoreRounding::Integer][r];
        let tie_break = [TieBreak::NodeOrder, TieBreak::Random, TieBreak::Permuted][t];
        (
            PolicyOptions {
                rounding,
                tie_break,
            },
            typical,
            memory,
        )
    })
}

/// Independent record of what the choices took.
struct Ledger {
    gpu_used: Vec<Vec<u32>>,
    cpu_used: Vec<u64>,
    mem_used: Vec<u64>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn no_policy_oversubscribes(
        mut nodes in prop::collection::vec(node_strategy(), 1..7),
        tasks in prop_oneof![prop::collection::vec(task_strategy(), 1..80), repeating_tasks()],
        (options, published_typical, check_memory) in options(),
        seed in 0u64..1000,
    ) {
        for (i, n) in nodes.iter_mut().enumerate() {
            n.name = format!("n{i}");
        }
        let workload = Workload::new(&nodes, tasks, check_memory).unwrap();
        let typical_config = if published_typical {
            TypicalConfig::published_runs()
        } else {
            TypicalConfig::fgd_md()
        };
        let typical = workload.typical_shapes(&typical_config);
        for kind in PolicyKind::ALL {
            let mut placer = openb::make_placer(kind, &workload, &typical, options, seed);
            let mut cluster: Cluster = workload.cluster().clone();
            let mut ledger = Ledger {
                gpu_used: nodes.iter().map(|n| vec![0; n.num_gpu as usize]).collect(),
                cpu_used: vec![0; nodes.len()],
                mem_used: vec![0; nodes.len()],
            };
            for task in workload.tasks() {
                let Some(choice) = placer.choose(&cluster, task) else {
                    for i in 0..nodes.len() {
                        prop_assert!(!cluster.fits(i, task), "{kind:?} skipped a task node {i} fits");
                    }
                    continue;
                };
                let n = choice.node;
                prop_assert!(n < nodes.len());
                prop_assert!(ledger.cpu_used[n] + task.cpu_milli <= nodes[n].cpu_milli, "{kind:?} CPU");
                if check_memory {
                    prop_assert!(ledger.mem_used[n] + task.memory_mib <= nodes[n].memory_mib);
                }
                prop_assert_eq!(choice.gpus.len(), task.num_gpu as usize);
                if task.num_gpu > 0 {
                    prop_assert!(task.models.allows(cluster.node(n).model), "{kind:?} model");
                }
                for (j, &g) in choice.gpus.iter().enumerate() {
                    prop_assert!(g < ledger.gpu_used[n].len());
                    prop_assert!(!choice.gpus[..j].contains(&g));
                    if task.num_gpu > 1 || task.gpu_milli == 1000 {
                        prop_assert_eq!(ledger.gpu_used[n][g], 0, "{:?} whole GPU not free", kind);
                    }
                    prop_assert!(ledger.gpu_used[n][g] + task.gpu_milli <= 1000, "{kind:?} GPU");
                }
                prop_assert!(cluster.fits(n, task));
                ledger.cpu_used[n] += task.cpu_milli;
                ledger.mem_used[n] += task.memory_mib;
                for &g in &choice.gpus {
                    ledger.gpu_used[n][g] += task.gpu_milli;
                }
                cluster.place(task, &choice).unwrap();
                // the cluster's books match the ledger, everywhere
                let mut used_total = 0u64;
                for (i, node) in cluster.nodes().iter().enumerate() {
                    prop_assert_eq!(node.cpu_left + ledger.cpu_used[i], nodes[i].cpu_milli);
                    if check_memory {
                        prop_assert_eq!(node.memory_left + ledger.mem_used[i], nodes[i].memory_mib);
                    }
                    for (g, &left) in node.gpu_left.iter().enumerate() {
                        prop_assert_eq!(left + ledger.gpu_used[i][g], 1000);
                        used_total += u64::from(ledger.gpu_used[i][g]);
                    }
                    prop_assert_eq!(
                        node.gpu_left_total(),
                        node.gpu_left.iter().map(|&g| u64::from(g)).sum::<u64>()
                    );
                }
                prop_assert_eq!(cluster.allocated_gpu_milli(), used_total);
                prop_assert_eq!(
                    cluster.allocated_gpu_milli() + cluster.nodes().iter().map(|n| n.gpu_left_total()).sum::<u64>(),
                    cluster.total_gpu_milli()
                );
            }
        }
    }
}

/// FGD from scratch, no caches: every fitting node, every GPU with room, first best kept.
fn reference_fgd(
    cluster: &Cluster,
    typical: &openb::TypicalShapes,
    task: &openb::Task,
    rounding: ScoreRounding,
) -> Option<openb::Choice> {
    let mut best: Option<(f64, usize, usize)> = None;
    for (i, node) in cluster.nodes().iter().enumerate() {
        if !cluster.fits(i, task) {
            continue;
        }
        let before = typical.node_fragmentation(node.cpu_left, &node.gpu_left, node.model);
        let cpu = node.cpu_left - task.cpu_milli;
        let mut node_best: Option<(f64, usize)> = None;
        if task.is_fractional() {
            for g in 0..node.gpu_left.len() {
                if node.gpu_left[g] < task.gpu_milli {
                    continue;
                }
                let mut after = node.gpu_left.clone();
                after[g] -= task.gpu_milli;
                let s = openb::fgd_score(
                    before,
                    typical.node_fragmentation(cpu, &after, node.model),
                    rounding,
                );
                if node_best.is_none_or(|(b, _)| s > b) {
                    node_best = Some((s, g));
                }
            }
        } else {
            let mut after = node.gpu_left.clone();
            for g in cluster.first_free_gpus(i, task.num_gpu).unwrap() {
                after[g] = 0;
            }
            let s = openb::fgd_score(
                before,
                typical.node_fragmentation(cpu, &after, node.model),
                rounding,
            );
            node_best = Some((s, 0));
        }
        let (s, g) = node_best.unwrap();
        if best.is_none_or(|(b, _, _)| s > b) {
            best = Some((s, i, g));
        }
    }
    let (_, node, g) = best?;
    let gpus = if task.is_fractional() {
        vec![g]
    } else {
        cluster.first_free_gpus(node, task.num_gpu).unwrap()
    };
    Some(openb::Choice { node, gpus })
}

/// Tasks drawn from a few shapes, so that shapes repeat (and FGD's per-shape cache is used).
fn repeating_tasks() -> impl Strategy<Value = Vec<TaskSpec>> {
    prop::collection::vec(task_strategy(), 1..6)
        .prop_flat_map(|shapes| prop::collection::vec(prop::sample::select(shapes), 1..100))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// The cached, incremental FGD chooses exactly what a from-scratch FGD chooses.
    #[test]
    fn incremental_fgd_matches_from_scratch(
        mut nodes in prop::collection::vec(node_strategy(), 1..7),
        tasks in repeating_tasks(),
        integer in any::<bool>(),
        published_typical in any::<bool>(),
    ) {
        for (i, n) in nodes.iter_mut().enumerate() {
            n.name = format!("n{i}");
        }
        let workload = Workload::new(&nodes, tasks, false).unwrap();
        let typical = workload.typical_shapes(&if published_typical {
            TypicalConfig::published_runs()
        } else {
            TypicalConfig::fgd_md()
        });
        let rounding = if integer { ScoreRounding::Integer } else { ScoreRounding::Exact };
        let options = PolicyOptions { rounding, tie_break: TieBreak::NodeOrder };
        let mut fgd = openb::make_placer(PolicyKind::Fgd, &workload, &typical, options, 1);
        let mut cluster = workload.cluster().clone();
        for task in workload.tasks() {
            let got = fgd.choose(&cluster, task);
            let want = reference_fgd(&cluster, &typical, task, rounding);
            prop_assert_eq!(&got, &want);
            if let Some(c) = got {
                cluster.place(task, &c).unwrap();
            }
        }
    }
}
