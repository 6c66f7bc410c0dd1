//! tessera's own openb policy: its choices by hand on tiny clusters, its invariants online and
//! in cycles on random small workloads (never a task that does not fit, every arrival placed or
//! skipped once, skipped only when nothing fits), and determinism for a seed.

use proptest::prelude::*;
use tessera_sim::openb::{
    self, Choice, Cluster, NodeSpec, Placer, PolicyKind, PolicyOptions, SimConfig, Task, TaskSpec,
    TieBreak, Workload,
};

fn node(i: usize, cpu_cores: u64, gpus: u32) -> NodeSpec {
    NodeSpec {
        name: format!("n{i}"),
        cpu_milli: cpu_cores * 1000,
        memory_mib: 1 << 20,
        num_gpu: gpus,
        model: "G".into(),
    }
}

fn spec(cpu_cores: u64, num_gpu: u32, gpu_milli: u32) -> TaskSpec {
    TaskSpec {
        name: String::new(),
        cpu_milli: cpu_cores * 1000,
        memory_mib: 1024,
        num_gpu,
        gpu_milli,
        gpu_spec: vec![],
        creation_time: None,
    }
}

/// The workload's task with this `(cpu, num_gpu, gpu_milli)`.
fn find(w: &Workload, cpu_cores: u64, num_gpu: u32, gpu_milli: u32) -> Task {
    w.tasks()
        .iter()
        .find(|t| {
            t.cpu_milli == cpu_cores * 1000 && t.num_gpu == num_gpu && t.gpu_milli == gpu_milli
        })
        .cloned()
        .unwrap()
}

fn tessera(w: &Workload) -> Box<dyn Placer> {
    let typical = w.typical_shapes(&openb::tessera_typical());
    openb::make_placer(
        PolicyKind::Tessera,
        w,
        &typical,
        PolicyOptions::default(),
        42,
    )
}

#[test]
fn hosting_capacity_by_hand() {
    // One node, 2 GPUs, 8 cores. Shapes: a 500-milli share of 2 cores (2 tasks) and a whole GPU
    // of 1 core (1 task). One node in all and one host each, so w = count × milli:
    // w_500 = 1000, w_1000 = 1000.
    let tasks = vec![spec(2, 1, 500), spec(2, 1, 500), spec(1, 1, 1000)];
    let w = Workload::new(&[node(0, 8, 2)], tasks, false).unwrap();
    let mut c: Cluster = w.cluster().clone();
    let mut t = openb::Tessera::for_workload(&w, PolicyOptions::default(), 42);
    // Empty: 500s: min(2 + 2 by GPU, 8 / 2 by CPU) = 4; whole GPUs: min(2, 8) = 2.
    assert_eq!(t.hosting_capacity(&c, 0), 4 * 1000 + 2 * 1000);
    // A share on GPU 0: GPUs [500, 1000], 6 cores: 500s min(1 + 2, 3) = 3; whole GPUs 1.
    let share = find(&w, 2, 1, 500);
    let choice = t.choose(&c, &share).unwrap();
    c.place(&share, &choice).unwrap();
    assert_eq!(t.hosting_capacity(&c, 0), 3 * 1000 + 1000);
    // CPU binds: a second share leaves 4 cores and [0, 1000] or [500, 500]; Tessera keeps the
    // whole GPU (500s: min(2, 2) = 2, whole 1: 3000 against 2000 for [500, 500]).
    let second = t.choose(&c, &share).unwrap();
    assert_eq!(second, choice, "the second share pairs with the first");
    c.place(&share, &second).unwrap();
    assert_eq!(t.hosting_capacity(&c, 0), 2 * 1000 + 1000);
}

#[test]
fn a_small_share_fills_the_room_an_810_left() {
    // Typical shapes: 810-milli and 160-milli shares and whole GPUs, 1 core each.
    let mut tasks: Vec<TaskSpec> = (0..10).map(|_| spec(1, 1, 810)).collect();
    tasks.extend((0..5).map(|_| spec(1, 1, 160)));
    tasks.extend((0..10).map(|_| spec(1, 1, 1000)));
    let w = Workload::new(&[node(0, 32, 2), node(1, 32, 2)], tasks, false).unwrap();
    let mut c: Cluster = w.cluster().clone();
    let mut p = tessera(&w);
    let big = find(&w, 1, 1, 810);
    let first = p.choose(&c, &big).unwrap();
    c.place(&big, &first).unwrap();
    // The 160 goes onto the 190 left beside the 810: it costs no other shape anything there,
    // while on a free GPU it would take a whole-GPU and an 810 slot away.
    let small = find(&w, 1, 1, 160);
    assert_eq!(p.choose(&c, &small).unwrap(), first);
}

#[test]
fn a_single_gpu_task_keeps_an_empty_node_whole() {
    // 4-GPU tasks are typical; node 0 already runs one whole GPU, node 1 is empty.
    let mut tasks: Vec<TaskSpec> = (0..10).map(|_| spec(1, 4, 1000)).collect();
    tasks.extend((0..10).map(|_| spec(1, 1, 1000)));
    let w = Workload::new(&[node(0, 64, 4), node(1, 64, 4)], tasks, false).unwrap();
    let mut c: Cluster = w.cluster().clone();
    let one = find(&w, 1, 1, 1000);
    c.place(
        &one,
        &Choice {
            node: 0,
            gpus: vec![0],
        },
    )
    .unwrap();
    let mut p = tessera(&w);
    assert_eq!(p.choose(&c, &one).unwrap().node, 0);
    // And a 4-GPU task takes the empty node.
    let four = find(&w, 1, 4, 1000);
    assert_eq!(
        p.choose(&c, &four).unwrap(),
        Choice {
            node: 1,
            gpus: vec![0, 1, 2, 3]
        }
    );
}

#[test]
fn cpu_only_tasks_go_where_cpu_strands_no_gpu() {
    // Node 0: 8 cores for 2 GPUs (4 per GPU, what the typical task needs); node 1: 64 cores.
    let mut tasks: Vec<TaskSpec> = (0..10).map(|_| spec(4, 1, 1000)).collect();
    tasks.push(spec(4, 0, 0));
    let w = Workload::new(&[node(0, 8, 2), node(1, 64, 2)], tasks, false).unwrap();
    let c: Cluster = w.cluster().clone();
    let cpu = find(&w, 4, 0, 0);
    assert_eq!(tessera(&w).choose(&c, &cpu).unwrap().node, 1);
}

#[test]
fn a_cycle_gives_the_last_free_gpu_to_the_task_that_fills_it() {
    // One GPU; the cycle brings an 810 share, then a whole-GPU task. One at a time, the share
    // arrives first and takes the GPU (81 %); deciding the cycle together places the whole GPU.
    let tasks = vec![spec(1, 1, 810), spec(1, 1, 1000)];
    let w = Workload::new(&[node(0, 8, 1)], tasks, false).unwrap();
    let order = [0usize, 1];
    let mut p = tessera(&w);
    let online = openb::simulate(&w, p.as_mut(), &order);
    assert_eq!(online.cluster.allocated_gpu_milli(), 810);
    let mut p = tessera(&w);
    let cycle = openb::simulate_cycles(&w, p.as_mut(), &order, 2);
    assert_eq!(cycle.cluster.allocated_gpu_milli(), 1000);
    assert_eq!((cycle.placed, cycle.skipped), (1, 1));
}

fn node_strategy() -> impl Strategy<Value = NodeSpec> {
    (1u64..=16, 0u32..=8, 0usize..2).prop_map(|(cores, gpus, model)| NodeSpec {
        name: String::new(),
        cpu_milli: cores * 4000,
        memory_mib: 64 * 1024,
        num_gpu: gpus,
        model: ["A", "B"][model].to_string(),
    })
}

fn task_strategy() -> impl Strategy<Value = TaskSpec> {
    (
        0u64..=24,
        prop_oneof![Just(0u32), Just(1), Just(1), Just(1), Just(2), Just(8)],
        1u32..=1000,
        any::<bool>(),
        0u8..4,
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
            gpu_spec: ["A", "B"]
                .iter()
                .enumerate()
                .filter(|(i, _)| models & (1 << i) != 0)
                .map(|(_, m)| m.to_string())
                .collect(),
            creation_time: None,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// In cycles: every task of a cycle is placed or skipped once, a placed task fit the cluster
    /// as it was when it was placed (`Cluster::place` checks, and the books balance), and a
    /// skipped one fits nowhere once the cycle is decided.
    #[test]
    fn cycles_place_only_what_fits_and_skip_only_what_cannot(
        mut nodes in prop::collection::vec(node_strategy(), 1..6),
        tasks in prop::collection::vec(task_strategy(), 1..60),
        cycle in 1usize..20,
        check_memory in any::<bool>(),
        ties in 0usize..3,
        seed in 0u64..100,
    ) {
        for (i, n) in nodes.iter_mut().enumerate() {
            n.name = format!("n{i}");
        }
        let w = Workload::new(&nodes, tasks, check_memory).unwrap();
        let options = PolicyOptions {
            tie_break: [TieBreak::NodeOrder, TieBreak::Random, TieBreak::Permuted][ties],
            ..PolicyOptions::default()
        };
        let typical = w.typical_shapes(&openb::tessera_typical());
        let mut p = openb::make_placer(PolicyKind::Tessera, &w, &typical, options, seed);
        let mut cluster = w.cluster().clone();
        let all: Vec<&Task> = w.tasks().iter().collect();
        for batch in all.chunks(cycle) {
            let placed = p.place_cycle(&mut cluster, batch).unwrap();
            prop_assert_eq!(placed.len(), batch.len());
            for (t, &ok) in batch.iter().zip(&placed) {
                if !ok {
                    for i in 0..nodes.len() {
                        prop_assert!(!cluster.fits(i, t), "skipped a task node {} fits", i);
                    }
                }
            }
            let used: u64 = cluster
                .nodes()
                .iter()
                .map(|n| n.gpu_left.len() as u64 * 1000 - n.gpu_left_total())
                .sum();
            prop_assert_eq!(used, cluster.allocated_gpu_milli());
        }
    }
}

#[test]
fn deterministic_for_a_seed_online_and_in_cycles() {
    let nodes: Vec<NodeSpec> = (0..6).map(|i| node(i, 32, 4)).collect();
    let tasks: Vec<TaskSpec> = (0..60u32)
        .map(|i| match i % 5 {
            0 => spec(2, 1, 810),
            1 => spec(4, 1, 1000),
            2 => spec(1, 0, 0),
            3 => spec(8, 2, 1000),
            _ => spec(2, 1, 150 + (i * 37) % 500),
        })
        .collect();
    for mut config in [SimConfig::fgd_md(), SimConfig::published_runs()] {
        config.seeds = vec![42, 43, 44];
        let w = Workload::new(&nodes, tasks.clone(), config.check_memory).unwrap();
        for cycle in [None, Some(7)] {
            config.cycle = cycle;
            let a = openb::run_policy(&w, PolicyKind::Tessera, &config);
            let b = openb::run_policy(&w, PolicyKind::Tessera, &config);
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
            for s in &a.per_seed {
                assert_eq!(s.placed + s.skipped, s.tasks);
                assert!(s.final_alloc_pct > 50.0, "{s:?}");
            }
        }
    }
}
