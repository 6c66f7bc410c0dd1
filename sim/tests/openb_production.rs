//! The production solver as the openb "Tessera" policy: its choices by hand on tiny clusters
//! (whole GPUs and shares on one pool, model pins, CPU taken by CPU-only tasks since the session
//! opened), its invariants online and in cycles on random small workloads, CPU-only tasks among
//! them, which the solver places too (never a task that does not fit, every arrival placed or
//! skipped once, skipped only when nothing fits), and determinism for a seed.

use proptest::prelude::*;
use tessera_sim::openb::{
    self, Cluster, CpuOnlyRule, NodeSpec, Placer, PolicyKind, PolicyOptions, SimConfig, Task,
    TaskSpec, TieBreak, TypicalConfig, Workload,
};

fn node(i: usize, cpu_cores: u64, gpus: u32, model: &str) -> NodeSpec {
    NodeSpec {
        name: format!("n{i}"),
        cpu_milli: cpu_cores * 1000,
        memory_mib: 1 << 20,
        num_gpu: gpus,
        model: model.into(),
    }
}

fn spec(cpu_cores: u64, num_gpu: u32, gpu_milli: u32, models: &[&str]) -> TaskSpec {
    TaskSpec {
        name: String::new(),
        cpu_milli: cpu_cores * 1000,
        memory_mib: 1024,
        num_gpu,
        gpu_milli,
        gpu_spec: models.iter().map(|m| m.to_string()).collect(),
        creation_time: None,
    }
}

fn production(w: &Workload, cpu_only: CpuOnlyRule) -> Box<dyn Placer> {
    let typical = w.typical_shapes(&TypicalConfig::fgd_md());
    openb::make_placer_with(
        PolicyKind::Tessera,
        w,
        &typical,
        PolicyOptions::default(),
        cpu_only,
        42,
    )
}

/// Where a task went: its node and GPUs, `None` if skipped.
type Placed = Option<(usize, Vec<usize>)>;

/// Places the workload's tasks in order online; returns where each went.
fn run_online(w: &Workload, order: &[usize]) -> (Cluster, Vec<Placed>) {
    run_online_with(w, order, CpuOnlyRule::Solver)
}

/// [`run_online`], the CPU-only tasks placed by `cpu_only`.
fn run_online_with(w: &Workload, order: &[usize], cpu_only: CpuOnlyRule) -> (Cluster, Vec<Placed>) {
    let mut p = production(w, cpu_only);
    let mut cluster = w.cluster().clone();
    let mut out = Vec::new();
    for &i in order {
        let task = &w.tasks()[i];
        match p.choose(&cluster, task) {
            Some(c) => {
                cluster.place(task, &c).expect("the solver's choice fits");
                out.push(Some((c.node, c.gpus)));
            }
            None => out.push(None),
        }
    }
    (cluster, out)
}

#[test]
fn whole_gpus_and_shares_compete_for_the_same_gpus() {
    // One node, 2 GPUs: a share, then a whole GPU (takes the free one), then a share that fits
    // next to the first, then a whole GPU (none free: skipped).
    let nodes = vec![node(0, 32, 2, "G")];
    let tasks = vec![
        spec(1, 1, 400, &[]),
        spec(1, 1, 1000, &[]),
        spec(1, 1, 500, &[]),
    ];
    let w = Workload::new(&nodes, tasks, false).unwrap();
    let (cluster, out) = run_online(&w, &[0, 1, 2, 1]);
    let share_gpu = out[0].as_ref().unwrap().1[0];
    assert_eq!(out[1].as_ref().unwrap().1, vec![1 - share_gpu]);
    assert_eq!(out[2].as_ref().unwrap().1, vec![share_gpu]);
    assert_eq!(out[3], None);
    assert_eq!(cluster.allocated_gpu_milli(), 1900);
}

#[test]
fn a_pinned_task_goes_to_its_model_only() {
    let nodes = vec![node(0, 32, 4, "A"), node(1, 32, 4, "B")];
    let tasks = vec![spec(1, 2, 1000, &["B"]), spec(1, 1, 300, &["A"])];
    let w = Workload::new(&nodes, tasks, false).unwrap();
    let (_, out) = run_online(&w, &[0, 1, 0, 0]);
    assert_eq!(out[0].as_ref().unwrap().0, 1);
    assert_eq!(out[1].as_ref().unwrap().0, 0);
    assert_eq!(out[2].as_ref().unwrap().0, 1);
    assert_eq!(
        out[3], None,
        "B has no two free GPUs left; A is not allowed"
    );
}

#[test]
fn cpu_taken_by_cpu_only_tasks_since_the_session_opened_is_respected() {
    // Two nodes of 8 cores. A GPU task opens the session; CPU-only tasks then take most of the
    // CPU behind its back (placed by BestFit's rule, not the solver); every later GPU choice
    // must still fit the cluster as it is. With the solver placing them too, the same.
    let nodes = vec![node(0, 8, 2, "G"), node(1, 8, 2, "G")];
    let tasks = vec![
        spec(1, 1, 500, &[]),
        spec(6, 0, 0, &[]),
        spec(2, 1, 500, &[]),
    ];
    let w = Workload::new(&nodes, tasks, false).unwrap();
    for rule in [CpuOnlyRule::BestFit, CpuOnlyRule::Solver] {
        let (cluster, out) = run_online_with(&w, &[0, 1, 1, 2, 2, 2], rule);
        assert!(out[1].is_some() && out[2].is_some(), "{rule:?}");
        // 16 cores: 1 + 12 taken, 3 left over two nodes of which at most one takes a 2-core
        // task.
        let placed_late = out[3..].iter().filter(|o| o.is_some()).count();
        assert_eq!(placed_late, 1, "{rule:?}");
        let cpu_left: u64 = cluster.nodes().iter().map(|n| n.cpu_left).sum();
        assert_eq!(cpu_left, 1000, "{rule:?}");
    }
}

#[test]
fn a_task_goes_to_the_pool_where_it_fragments_least_not_the_first() {
    // a0 (model A, listed first): 2 GPUs, 4 cores; b0 (model B): 2 GPUs, 64 cores. A first
    // cycle runs a 500-milli share of 1 core in each pool (the mix). A whole GPU of 3 cores fits
    // both; on a0 it takes the last cores and strands the 500 milli next to the share, on b0 it
    // strands nothing.
    let nodes = vec![node(0, 4, 2, "A"), node(1, 64, 2, "B")];
    let tasks = vec![
        spec(1, 1, 500, &["A"]),
        spec(1, 1, 500, &["B"]),
        spec(3, 1, 1000, &[]),
    ];
    let w = Workload::new(&nodes, tasks, false).unwrap();
    let mut p = production(&w, CpuOnlyRule::Solver);
    let mut cluster = w.cluster().clone();
    let t = w.tasks();
    assert_eq!(
        p.place_cycle(&mut cluster, &[&t[0], &t[1]]).unwrap(),
        vec![true, true]
    );
    assert_eq!(p.place_cycle(&mut cluster, &[&t[2]]).unwrap(), vec![true]);
    assert_eq!(cluster.node(0).cpu_left, 3000, "a0 keeps its cores");
    assert_eq!(cluster.node(1).cpu_left, 60_000);
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

/// Shares of at least 1000/48 milli: a shared GPU holds at most 48 clients (the most a pool may
/// set), so smaller shares could be refused by slots on a GPU with room.
fn task_strategy() -> impl Strategy<Value = TaskSpec> {
    (
        0u64..=24,
        prop_oneof![Just(0u32), Just(1), Just(1), Just(1), Just(2), Just(8)],
        21u32..=1000,
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
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Online and in cycles: every task is placed or skipped once, a placed task fit the
    /// cluster as it was (`Cluster::place` checks, and the books balance), and a skipped one
    /// fits nowhere once it (or its cycle) is decided.
    #[test]
    fn places_only_what_fits_and_skips_only_what_cannot(
        mut nodes in prop::collection::vec(node_strategy(), 1..6),
        tasks in prop::collection::vec(task_strategy(), 1..50),
        cycle in prop_oneof![Just(None), (1usize..20).prop_map(Some)],
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
        let typical = w.typical_shapes(&TypicalConfig::fgd_md());
        let mut p = openb::make_placer(PolicyKind::Tessera, &w, &typical, options, seed);
        let mut cluster = w.cluster().clone();
        let all: Vec<&Task> = w.tasks().iter().collect();
        for batch in all.chunks(cycle.unwrap_or(1)) {
            let placed = match cycle {
                Some(_) => p.place_cycle(&mut cluster, batch).unwrap(),
                None => {
                    let t = batch[0];
                    match p.choose(&cluster, t) {
                        Some(c) => {
                            cluster.place(t, &c).unwrap();
                            vec![true]
                        }
                        None => vec![false],
                    }
                }
            };
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
    let nodes: Vec<NodeSpec> = (0..6).map(|i| node(i, 32, 4, "G")).collect();
    let tasks: Vec<TaskSpec> = (0..60u32)
        .map(|i| match i % 5 {
            0 => spec(2, 1, 810, &[]),
            1 => spec(4, 1, 1000, &[]),
            2 => spec(1, 0, 0, &[]),
            3 => spec(8, 2, 1000, &[]),
            _ => spec(2, 1, 150 + (i * 37) % 500, &[]),
        })
        .collect();
    for mut config in [SimConfig::fgd_md(), SimConfig::published_runs()] {
        config.seeds = vec![42, 43];
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
