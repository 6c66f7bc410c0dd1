//! The cycles mode of the openb protocol against the online mode, on the trace slice.

use std::path::Path;

use tessera_sim::openb::{self, PolicyKind, SimConfig, Workload};

fn workload(config: &SimConfig) -> Workload {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/openb_slice");
    let nodes = openb::load_nodes(dir.join(openb::NODE_LIST)).unwrap();
    let tasks = openb::load_tasks(dir.join(openb::pod_list_file("default"))).unwrap();
    Workload::new(&nodes, tasks, config.check_memory).unwrap()
}

#[test]
fn cycles_of_one_arrival_are_the_online_protocol() {
    let online = SimConfig::published_runs();
    let cycles = SimConfig {
        cycle: Some(1),
        ..online.clone()
    };
    let w = workload(&online);
    for kind in [PolicyKind::Fgd, PolicyKind::BestFit, PolicyKind::Tessera] {
        let a = openb::run_policy(&w, kind, &online);
        let b = openb::run_policy(&w, kind, &cycles);
        assert_eq!(a.mean_alloc_at, b.mean_alloc_at, "{}", kind.name());
    }
}

#[test]
fn cycles_place_every_arrival_once_and_never_oversubscribe() {
    let config = SimConfig {
        cycle: Some(37),
        ..SimConfig::fgd_md()
    };
    let w = workload(&config);
    let r = openb::run_policy(&w, PolicyKind::Fgd, &config);
    for s in &r.per_seed {
        assert_eq!(s.placed + s.skipped, s.tasks);
        assert!(s.final_alloc_pct <= 100.0);
        assert!(s.final_alloc_pct > 50.0, "{s:?}");
    }
}
