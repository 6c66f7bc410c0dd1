//! Shared helpers: a small fleet in YAML, snapshots written compactly, compile and solve.
#![allow(dead_code)]

pub mod cycles;
pub mod random;

use tessera_compiler::model::ClusterStateSpec;
use tessera_compiler::{CompiledPolicy, SourceFile, compile};
use tessera_solver::decision::{Decision, GeometryPlan, WorkloadDecision};
use tessera_solver::{Listing, Outcome, SolveOptions, solve};

/// The property tests' configuration: `cases` draws, or `PROPTEST_CASES` where it is set (a
/// config that names its cases ignores the variable, so a wider local search needs this), the
/// seed from `PROPTEST_RNG_SEED` as proptest reads it, and no failure files (a failing seed is
/// kept as a named test instead).
pub fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

/// Tiers, classes, layouts, pools and tenants shared by the scenario tests.
///
/// - `train`: exclusive, 2 nodes × 8 GPUs; `infer`: mig, 1 node × 2 GPUs (layouts `balanced`,
///   `two-3g`, `three-2g`, `full`; one geometry change per GPU); `share`: mps, 1 node × 2 GPUs, 4 clients.
/// - tenants `org` → `a` (trust a), `b` (trust b); each child guaranteed 8 train, 1 infer,
///   1 share, limited to 16 train.
pub const FLEET: &str = r#"
apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {name: tiers}
spec:
  tiers:
    - {name: high, value: 1000}
    - {name: low, value: 100}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: critical}
spec: {tier: high, preemptible: false, isolation: {minimum: exclusive}}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: serving}
spec: {tier: high, preemptible: false, isolation: {minimum: mig}}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: batch}
spec:
  tier: low
  preemptible: true
  isolation: {minimum: exclusive}
  preemption: {signal: SIGUSR1, gracePeriod: 5m, minRuntime: 30m}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: notebook}
spec: {tier: low, preemptible: true, isolation: {minimum: timeslice}}
---
apiVersion: tessera/v1alpha1
kind: MigLayout
metadata: {name: balanced}
spec: {gpuModel: H100-SXM5-80GB, instances: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]}
---
apiVersion: tessera/v1alpha1
kind: MigLayout
metadata: {name: two-3g}
spec: {gpuModel: H100-SXM5-80GB, instances: [3g.40gb, 3g.40gb]}
---
apiVersion: tessera/v1alpha1
kind: MigLayout
metadata: {name: three-2g}
spec: {gpuModel: H100-SXM5-80GB, instances: [2g.20gb, 2g.20gb, 2g.20gb, 1g.10gb]}
---
apiVersion: tessera/v1alpha1
kind: MigLayout
metadata: {name: full}
spec: {gpuModel: H100-SXM5-80GB, instances: [7g.80gb]}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: train}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {nodes: 2, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}
  sharing: exclusive
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: infer}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {nodes: 1, gpusPerNode: 2, cpuPerNode: 192, memoryPerNode: 2Ti}
  sharing: mig
  migLayouts: [balanced, two-3g, three-2g, full]
  reconfiguration: {maxPerGpuPerHour: 1}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: share}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {nodes: 1, gpusPerNode: 2, cpuPerNode: 192, memoryPerNode: 2Ti}
  sharing: mps
  maxClientsPerGpu: 4
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: org}
spec:
  guarantee: {train: 16, infer: 2, share: 2}
  sloClasses: [critical, serving, batch, notebook]
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: a}
spec:
  parent: org
  guarantee: {train: 8, infer: 1, share: 1}
  limit: {train: 16}
  trustDomain: a
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: b}
spec:
  parent: org
  guarantee: {train: 8, infer: 1, share: 1}
  limit: {train: 16}
  trustDomain: b
"#;

/// YAML for a node of `pool` with `gpus` plain GPUs.
pub fn node(name: &str, pool: &str, gpus: u32) -> String {
    let mut s = format!(
        "    - name: {name}\n      pool: {pool}\n      cpu: 192\n      memory: 2Ti\n      gpus:\n"
    );
    for i in 0..gpus {
        s += &format!(
            "        - {{index: {i}, uuid: GPU-{:08x}-0000-0000-0000-000000000000, model: H100-SXM5-80GB}}\n",
            uuid(name, i)
        );
    }
    s
}

/// YAML for a MIG node: one entry per GPU, a list of (profile, start).
pub fn mig_node(name: &str, pool: &str, gpus: &[&[(&str, u8)]]) -> String {
    let mut s = format!(
        "    - name: {name}\n      pool: {pool}\n      cpu: 192\n      memory: 2Ti\n      gpus:\n"
    );
    for (i, instances) in gpus.iter().enumerate() {
        s += &format!(
            "        - index: {i}\n          uuid: GPU-{:08x}-0000-0000-0000-000000000000\n          model: H100-SXM5-80GB\n          mig: {{enabled: true}}\n          instances:\n",
            uuid(name, i as u32)
        );
        for (profile, start) in *instances {
            s += &format!("            - {{profile: {profile}, start: {start}}}\n");
        }
        if instances.is_empty() {
            s = s.trim_end_matches("          instances:\n").to_owned() + "\n";
        }
    }
    s
}

fn uuid(name: &str, i: u32) -> u32 {
    name.bytes()
        .fold(17u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        .wrapping_mul(256)
        .wrapping_add(i)
}

/// A ClusterState document observed at 2026-11-20T08:00:00Z.
pub fn state(nodes: &[String], running: &str, pending: &str) -> String {
    let list = |s: &str| {
        if s.trim().is_empty() {
            " []\n".to_owned()
        } else {
            format!("\n{s}")
        }
    };
    let (running, pending) = (list(running), list(pending));
    format!(
        "apiVersion: tessera/v1alpha1\nkind: ClusterState\nmetadata: {{name: snap}}\nspec:\n  observedAt: \"2026-11-20T08:00:00Z\"\n  nodes:\n{}  running:{running}  pending:{pending}",
        nodes.concat()
    )
}

pub fn compile_all(extra: &str) -> (CompiledPolicy, ClusterStateSpec) {
    compile_with(FLEET, extra)
}

pub fn compile_with(fleet: &str, extra: &str) -> (CompiledPolicy, ClusterStateSpec) {
    let c = compile(&[
        SourceFile::new("fleet.yaml", fleet),
        SourceFile::new("state.yaml", extra),
    ]);
    let errors: Vec<String> = c
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("{d:?}"))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let policy = c.policy.expect("policy");
    let state = c.states.into_iter().next().expect("state").1;
    (policy, state)
}

pub fn run(state_yaml: &str) -> Decision {
    run_with(FLEET, state_yaml)
}

/// Solves, and checks on the way that the decision listing only its changes agrees.
pub fn run_with(fleet: &str, state_yaml: &str) -> Decision {
    let (policy, state) = compile_with(fleet, state_yaml);
    let d = solve(&policy, &state, &SolveOptions::default()).expect("solve");
    check_changes_listing(&policy, &state, &d);
    d
}

/// The decision [`Listing::Changes`] gives is `full` with only its admissions, preemptions
/// and geometry changes listed, and the same in everything else, to the byte.
pub fn check_changes_listing(policy: &CompiledPolicy, state: &ClusterStateSpec, full: &Decision) {
    let options = SolveOptions {
        listing: Listing::Changes,
        ..SolveOptions::default()
    };
    let changes = solve(policy, state, &options).expect("solve, listing the changes");
    // A refinement stopped by the clock is the one outcome two runs may differ by.
    if stopped_by_clock(full) || stopped_by_clock(&changes) {
        return;
    }
    let mut expected = full.clone();
    expected
        .workloads
        .retain(|w| matches!(w.outcome, Outcome::Admit { .. } | Outcome::Preempt { .. }));
    expected.geometry.retain(GeometryPlan::changes);
    expected.listing = Listing::Changes;
    assert_eq!(
        serde_json::to_string_pretty(&changes).unwrap(),
        serde_json::to_string_pretty(&expected).unwrap(),
        "the decision listing its changes is not the full one's admissions and preemptions"
    );
    assert_eq!(
        tessera_solver::carry::carry_out(state, &changes),
        tessera_solver::carry::carry_out(state, full),
        "carried out, the decision listing its changes leaves another snapshot"
    );
}

pub fn get<'a>(d: &'a Decision, name: &str) -> &'a WorkloadDecision {
    d.workloads
        .iter()
        .find(|w| w.name == name)
        .unwrap_or_else(|| panic!("no decision for {name}"))
}

pub fn message(d: &Decision, name: &str) -> String {
    let outcome = &get(d, name).outcome;
    outcome
        .message()
        .unwrap_or_else(|| panic!("{name} is not pending or preempted: {outcome:?}"))
}

/// A running workload: `spec` is a YAML flow mapping, each binding a flow mapping.
pub fn running(name: &str, spec: &str, bindings: &[&str], started: &str) -> String {
    let mut s = format!("    - name: {name}\n      spec: {spec}\n      bindings:\n");
    for b in bindings {
        s += &format!("        - {b}\n");
    }
    s + &format!("      startedAt: \"{started}\"\n")
}

/// A pending workload.
pub fn pending(name: &str, spec: &str, submitted: &str) -> String {
    format!("    - name: {name}\n      spec: {spec}\n      submittedAt: \"{submitted}\"\n")
}

/// `{node: N, gpus: [from..to)}`.
pub fn gpus(node: &str, from: u32, to: u32) -> String {
    let list: Vec<String> = (from..to).map(|i| i.to_string()).collect();
    format!("{{node: {node}, gpus: [{}]}}", list.join(", "))
}

/// Whether a pool's refinement in `d` stopped at the cycle's time limit.
pub fn stopped_by_clock(d: &Decision) -> bool {
    d.pools.iter().any(|p| {
        p.refinement
            .as_ref()
            .is_some_and(|r| r.status == tessera_solver::decision::RefineStatus::TimeLimit)
    })
}
