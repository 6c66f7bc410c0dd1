//! The cycles mode of the openb protocol against the online mode, on the trace slice.

use std::path::Path;

use tessera_sim::openb::{self, PolicyKind, SimConfig, Workload};

fn workload(config: &SimConfig) -> Workload {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/openb_slice");
    let nodes = openb::load_nodes(dir.join(openb::NODE_LIST)).unwrap();
    let tasks = openb::load_tasks(dir.join(openb::pod_list_file("default"))).unwrap();
    Workload::new(&nodes, tasks, config.check_memory).unwrap()
}

/// Not for Tessera: online, the production solver decides an arrival on a session that measures
/// fragmentation against the mix of its last full cycle, while a cycle of one is a full cycle of
/// its own, so the two see different mixes by design.
#[test]
fn cycles_of_one_arrival_are_the_online_protocol() {
    let online = SimConfig::published_runs();
    let cycles = SimConfig {
        cycle: Some(1),
        ..online.clone()
    };
    let w = workload(&online);
    for kind in [PolicyKind::Fgd, PolicyKind::BestFit] {
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
    for (kind, seeds) in [(PolicyKind::Fgd, 10), (PolicyKind::Tessera, 2)] {
        // (the production solver runs a full cycle per cycle: two seeds keep the test short)
        let config = SimConfig {
            seeds: config.seeds.iter().copied().take(seeds).collect(),
            ..config.clone()
        };
        let r = openb::run_policy(&w, kind, &config);
        for s in &r.per_seed {
            assert_eq!(s.placed + s.skipped, s.tasks, "{}", kind.name());
            assert!(s.final_alloc_pct <= 100.0);
            assert!(s.final_alloc_pct > 50.0, "{} {s:?}", kind.name());
        }
    }
}
