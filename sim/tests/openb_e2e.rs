//! End to end on a slice of the real trace (every 10th node and task, see
//! `data/openb_slice/README.md`): load, scale, run every policy over the 10 seeds (the
//! production solver over the first one only, so that the test stays short), compare.

use std::path::{Path, PathBuf};

use tessera_sim::openb::{
    self, CHECKPOINTS, PaperResults, PolicyKind, SimConfig, TraceResult, Workload,
};

fn slice() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/openb_slice")
}

fn run(trace: &str, config: &SimConfig) -> TraceResult {
    let dir = slice();
    let nodes = openb::load_nodes(dir.join(openb::NODE_LIST)).unwrap();
    let tasks = openb::load_tasks(dir.join(openb::pod_list_file(trace))).unwrap();
    let workload = Workload::new(&nodes, tasks, config.check_memory).unwrap();
    let baselines: Vec<PolicyKind> = PolicyKind::ALL
        .into_iter()
        .filter(|&k| k != PolicyKind::Tessera)
        .collect();
    let mut r = openb::run_trace(trace, &workload, &baselines, config);
    let one = SimConfig {
        seeds: config.seeds[..1].to_vec(),
        ..config.clone()
    };
    r.policies
        .push(openb::run_policy(&workload, PolicyKind::Tessera, &one));
    r
}

fn at(r: &TraceResult, policy: &str, k: u32) -> f64 {
    r.policy(policy).unwrap().at(k).unwrap()
}

fn check(r: &TraceResult) {
    assert_eq!(r.nodes, 122);
    assert_eq!(r.gpu_capacity_milli, 626_000);
    for p in &r.policies {
        let seeds = if p.policy == "Tessera" {
            42..=42
        } else {
            42..=51
        };
        assert_eq!(p.seeds, seeds.collect::<Vec<u64>>());
        assert_eq!(p.checkpoints, CHECKPOINTS.to_vec());
        for s in &p.per_seed {
            // scaled to just under 130 % of capacity
            assert!(s.arrived_pct <= 130.0 && s.arrived_pct > 128.5, "{s:?}");
            assert!(s.final_alloc_pct <= 100.0);
            assert_eq!(s.placed + s.skipped, s.tasks);
        }
        // allocation never exceeds the arrived demand, and grows with it
        let v = &p.mean_alloc_at;
        for (j, &k) in p.checkpoints.iter().enumerate() {
            assert!(v[j].is_finite(), "{} at {k}: {v:?}", p.policy);
            assert!(v[j] <= f64::from(k) + 0.5, "{} at {k}: {v:?}", p.policy);
        }
        assert!(
            v.windows(2).all(|w| w[0] <= w[1] + 1e-9),
            "{}: {v:?}",
            p.policy
        );
    }
    // early on everything fits
    for p in ["FGD", "BestFit", "FirstFit"] {
        assert!((at(r, p, 50) - 50.0).abs() < 0.5, "{p}");
    }
    // the paper's ordering at 130 %: FGD > BestFit > Random
    let (fgd, bf, rnd) = (
        at(r, "FGD", 130),
        at(r, "BestFit", 130),
        at(r, "Random", 130),
    );
    assert!(fgd > bf + 0.5, "FGD {fgd} vs BestFit {bf}");
    assert!(bf > rnd + 2.0, "BestFit {bf} vs Random {rnd}");
}

#[test]
fn slice_of_default_both_configurations() {
    for config in [SimConfig::fgd_md(), SimConfig::published_runs()] {
        let r = run("default", &config);
        check(&r);
        // deterministic: same seeds, same figures
        let again = run("default", &config);
        assert_eq!(format!("{r:?}"), format!("{again:?}"));
    }
}

#[test]
fn slice_of_multigpu50_published() {
    let r = run("multigpu50", &SimConfig::published_runs());
    check(&r);
}

#[test]
fn table_and_json() {
    let r = run("default", &SimConfig::published_runs());
    let paper = PaperResults::load(slice().join(openb::PAPER_RESULTS)).unwrap();
    assert_eq!(paper.at("default", "FGD", 130), Some(95.39));
    let table = openb::comparison_table(&r, &paper);
    // header + FGD/BestFit/Random with paper and diff lines + FirstFit and Tessera alone
    assert_eq!(table.lines().count(), 1 + 3 * 3 + 2, "{table}");
    assert!(table.lines().any(|l| l.starts_with("FirstFit")));
    assert!(table.lines().any(|l| l.starts_with("Tessera")));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["trace"], "default");
    assert_eq!(json["policies"].as_array().unwrap().len(), 5);
    assert_eq!(
        json["policies"][0]["mean_alloc_at"]
            .as_array()
            .unwrap()
            .len(),
        7
    );
    assert_eq!(json["config"]["arrival"], "shuffled");
}

/// The full data set, when this machine has it: every file loads.
#[test]
fn real_data_set_loads_when_present() {
    // `shared/` sits beside the repository on developer machines and in CI.
    let dir = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/data/openb"
    ));
    if !dir.is_dir() {
        eprintln!("skipped: {} is absent", dir.display());
        return;
    }
    let nodes = openb::load_nodes(dir.join(openb::NODE_LIST)).unwrap();
    assert_eq!(nodes.len(), 1213);
    assert_eq!(nodes.iter().map(|n| n.num_gpu).sum::<u32>(), 6212);
    for trace in [
        "default",
        "gpushare20",
        "gpushare40",
        "gpushare60",
        "gpushare80",
        "gpushare100",
        "multigpu20",
        "multigpu30",
        "multigpu40",
        "multigpu50",
    ] {
        let tasks = openb::load_tasks(dir.join(openb::pod_list_file(trace))).unwrap();
        assert!(tasks.len() > 8000, "{trace}");
    }
    let paper = PaperResults::load(dir.join(openb::PAPER_RESULTS)).unwrap();
    assert_eq!(paper.at("default", "BestFit", 130), Some(93.08));
}
