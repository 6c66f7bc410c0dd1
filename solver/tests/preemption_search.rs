//! The preemption search against the search from scratch, on random contended fleets.
//!
//! The search writes its what-ifs on the solver's own fleet and ledger and rolls them back,
//! and its pruning asks a witness before placing the gang again; the search as it was (each
//! candidate set released on a fresh copy of the fleet, each smaller set released again)
//! runs beside it in debug builds, which assert after every search that both left the same
//! outcome, statuses, victims, ledger and fleet (`heuristic/scratch.rs`). These fleets make
//! that comparison bite: one exclusive pool of NVLink racks crowded with small borrowed jobs
//! of many tenants, and gangs within their guarantee (some of several replicas, some bound to
//! one rack) that no single victim makes room for, so that sets are accumulated and pruned.
//! Release builds do not carry the search from scratch: the file is for debug builds.
#![cfg(debug_assertions)]

mod common;

use std::fmt::Write as _;

use common::random::Seeded;
use proptest::prelude::*;
use tessera_compiler::{SourceFile, compile};
use tessera_solver::decision::{Decision, Outcome};
use tessera_solver::{SolveOptions, solve};

/// A contended fleet drawn from `seed`: (policy, snapshot) as YAML.
fn fleet(seed: u64) -> (String, String) {
    let mut rng = Seeded(seed);
    let nodes = rng.range(3, 8);
    let orgs = rng.range(1, 3);
    let projects = rng.range(2, 4);
    let fair = rng.chance(30);
    let h = "apiVersion: tessera/v1alpha1\n";
    let mut policy = format!(
        "{h}kind: PriorityTiers\nmetadata: {{name: tiers}}\nspec: {{tiers: [{{name: high, value: 1000}}, {{name: mid, value: 500}}, {{name: low, value: 100}}]}}\n"
    );
    for (class, tier, preemptible, runtime) in [
        ("critical", "high", false, "0s"),
        ("urgent", "mid", true, "0s"),
        ("batch", "low", true, "30m"),
    ] {
        let _ = write!(
            policy,
            "---\n{h}kind: SloClass\nmetadata: {{name: {class}}}\nspec: {{tier: {tier}, preemptible: {preemptible}, isolation: {{minimum: exclusive}}, preemption: {{gracePeriod: 1m, minRuntime: {runtime}}}}}\n"
        );
    }
    let fair_knob = if fair {
        ", preemption: {borrowers: FairShare}"
    } else {
        ""
    };
    let _ = write!(
        policy,
        "---\n{h}kind: Pool\nmetadata: {{name: train}}\nspec: {{gpuModel: H100-SXM5-80GB, sharing: exclusive, nvlinkDomain: rack{fair_knob}, capacity: {{nodes: {nodes}, gpusPerNode: 8, cpuPerNode: 96, memoryPerNode: 1Ti, nodesPerNvlinkDomain: 2}}}}\n"
    );
    let total = nodes * 8;
    let _ = write!(
        policy,
        "---\n{h}kind: Tenant\nmetadata: {{name: root}}\nspec: {{guarantee: {{train: {total}}}, sloClasses: [critical, urgent, batch]}}\n"
    );
    let mut tenants = Vec::new();
    for o in 0..orgs {
        let org = total / orgs;
        let _ = write!(
            policy,
            "---\n{h}kind: Tenant\nmetadata: {{name: org-{o}}}\nspec: {{parent: root, guarantee: {{train: {org}}}}}\n"
        );
        for j in 0..projects {
            let guarantee = rng.range(0, org / projects);
            let weight = rng.range(1, 3);
            let _ = write!(
                policy,
                "---\n{h}kind: Tenant\nmetadata: {{name: p-{o}-{j}}}\nspec: {{parent: org-{o}, guarantee: {{train: {guarantee}}}, weight: {weight}}}\n"
            );
            tenants.push(format!("p-{o}-{j}"));
        }
    }
    let mut state = format!(
        "{h}kind: ClusterState\nmetadata: {{name: contended}}\nspec:\n  observedAt: \"2026-11-20T08:00:00Z\"\n  nodes:\n"
    );
    for n in 0..nodes {
        let gpus: Vec<String> = (0..8)
            .map(|g| format!("{{index: {g}, uuid: GPU-{n:04x}{g:x}, model: H100-SXM5-80GB}}"))
            .collect();
        let _ = writeln!(
            state,
            "    - {{name: t{n}, pool: train, cpu: 96, memory: 1Ti, nvlinkDomain: rack-{}, gpus: [{}]}}",
            n / 2,
            gpus.join(", ")
        );
    }
    state.push_str("  running:\n");
    let mut running = 0;
    for n in 0..nodes {
        let mut g = 0;
        while g < 8 {
            let size = (*rng.pick(&[1, 1, 1, 1, 2, 2, 4])).min(8 - g);
            if rng.chance(10) {
                g += size; // left free
                continue;
            }
            let gpus: Vec<String> = (g..g + size).map(|x| x.to_string()).collect();
            let class = *rng.pick(&["batch", "batch", "batch", "urgent", "critical"]);
            // Most ran long enough to be preempted; some not yet (`batch` needs 30 minutes).
            let started = if rng.chance(15) { "07:50" } else { "05:00" };
            let _ = writeln!(
                state,
                "    - {{name: run-{running}, spec: {{tenant: {}, sloClass: {class}, gpu: {{count: {size}}}, cpu: 4, memory: 32Gi}}, bindings: [{{node: t{n}, gpus: [{}]}}], startedAt: \"2026-11-20T{started}:00Z\"}}",
                rng.pick(&tenants),
                gpus.join(", ")
            );
            running += 1;
            g += size;
        }
    }
    state.push_str("  pending:\n");
    for i in 0..rng.range(4, 12) {
        let replicas = rng.range(1, 3);
        let min_member = rng.range(1, replicas);
        let topology = *rng.pick(&["none", "preferred", "required"]);
        let class = *rng.pick(&["batch", "urgent", "urgent", "critical"]);
        let _ = writeln!(
            state,
            "    - {{name: gang-{i}, spec: {{tenant: {}, sloClass: {class}, replicas: {replicas}, minMember: {min_member}, gpu: {{count: {}}}, cpu: 4, memory: 32Gi, topology: {{sameNvlinkDomain: {topology}}}}}, submittedAt: \"2026-11-20T07:{:02}:00Z\"}}",
            rng.pick(&tenants),
            rng.pick(&[2, 3, 4, 4, 6, 8]),
            i % 60
        );
    }
    (policy, state)
}

/// Solves the fleet of `seed`; every search in it is compared with the search from scratch.
fn decide(seed: u64) -> Decision {
    let (policy, state) = fleet(seed);
    let c = compile(&[
        SourceFile::new("policy.yaml", policy),
        SourceFile::new("state.yaml", state),
    ]);
    assert_eq!(c.errors(), 0, "{:#?}", c.diagnostics);
    let policy = c.policy.as_ref().expect("compiles");
    solve(policy, &c.states[0].1, &SolveOptions::default()).expect("solves")
}

/// How many workloads each admission preempted, per admission that preempted any.
fn victims_per_admission(d: &Decision) -> Vec<usize> {
    let mut by_requester = std::collections::BTreeMap::<String, usize>::new();
    for w in &d.workloads {
        if let Outcome::Preempt { reason, .. } = &w.outcome {
            let requester = match reason {
                tessera_solver::decision::PreemptReason::Reclaim { for_workload, .. }
                | tessera_solver::decision::PreemptReason::Priority { for_workload, .. }
                | tessera_solver::decision::PreemptReason::FairShare { for_workload, .. } => {
                    for_workload.clone()
                }
                _ => continue,
            };
            *by_requester.entry(requester).or_default() += 1;
        }
    }
    by_requester.into_values().collect()
}

/// The generator reaches what the comparison is for: preemptions, and among them sets of
/// several victims (accumulated, then pruned).
#[test]
fn the_fleets_accumulate_and_prune_victim_sets() {
    let counts: Vec<usize> = (0..24)
        .flat_map(|seed| victims_per_admission(&decide(seed)))
        .collect();
    assert!(counts.len() >= 10, "too few preemptions: {counts:?}");
    assert!(
        counts.iter().filter(|&&c| c >= 2).count() >= 3,
        "too few sets of several victims: {counts:?}"
    );
}

proptest! {
    #![proptest_config(common::proptest_config(16))]

    /// Every search on a random contended fleet ends as the search from scratch does (the
    /// debug assertions of `heuristic/scratch.rs` fire otherwise), and the cycle is the same
    /// solved twice.
    #[test]
    fn the_search_equals_the_search_from_scratch(seed in any::<u64>()) {
        let d = decide(seed);
        prop_assert_eq!(&d, &decide(seed));
    }
}
