//! The incremental session agrees with the full cycle.
//!
//! Each case builds a random small fleet as `invariants.rs` does (an exclusive, a MIG and an MPS
//! pool, a tenant tree `org → {a → a1, b}` with random quotas), a running state from a first
//! decision and a queue, and opens a [`Session`] on it. Then, three times, one random workload
//! arrives (submitted at a random time, so that it may rank anywhere in the queue), and a random
//! workload finishes. Whenever the session answers (rather than asking for a full cycle), the
//! full cycle is run on the snapshot with every arrival added as pending and every finished
//! workload removed, and:
//!
//! - the arrival's decision is the full cycle's, outcome, bindings, split and reason included;
//! - every workload's standing decision in the session is the full cycle's;
//! - the `changed` list names exactly the other workloads whose decision differs from before.
//!
//! The full cycle's own invariants (no oversubscription, quota, gangs, isolation) are
//! `invariants.rs`'s; equal decisions inherit them.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use tessera_compiler::compiled::CompiledPolicy;
use tessera_compiler::mig;
use tessera_compiler::model::{
    Binding, ClusterStateSpec, Gpu, GpuRequest, Health, MigInstance, MigState, Node,
    PendingWorkload, RunningWorkload, Topology, TopologyMode, WorkloadSpec,
};
use tessera_compiler::units::{Bytes, Millicores};
use tessera_compiler::{SourceFile, compile};
use tessera_solver::decision::{Decision, Outcome, WorkloadDecision};
use tessera_solver::problem::{ProblemError, format_rfc3339, parse_rfc3339};
use tessera_solver::session::{Admission, Removal, Session, SessionError};
use tessera_solver::{SolveOptions, solve};

const NOW: &str = "2026-11-20T08:00:00Z";

/// splitmix64: the case's seed drives every choice.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + self.below(u64::from(hi - lo + 1)) as u32
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

struct Fleet {
    policy_yaml: String,
    /// (pool, nodes, gpus per node)
    pools: Vec<(&'static str, u32, u32)>,
    node_cpu: u32,
}

const LAYOUTS: [&[&str]; 4] = [
    &["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
    &["3g.40gb", "3g.40gb"],
    &["7g.80gb"],
    &[
        "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb",
    ],
];

fn fleet(rng: &mut Rng) -> Fleet {
    let pools = vec![
        ("train", rng.range(1, 3), rng.range(2, 8)),
        ("infer", rng.range(1, 2), rng.range(2, 4)),
        ("share", rng.range(1, 2), rng.range(2, 4)),
    ];
    let node_cpu = rng.range(6, 32);
    let mut y = String::from(
        "apiVersion: tessera/v1alpha1\nkind: PriorityTiers\nmetadata: {name: tiers}\nspec:\n  tiers:\n    - {name: high, value: 1000}\n    - {name: mid, value: 500}\n    - {name: low, value: 100}\n",
    );
    for (name, tier, preemptible, min, grace, runtime) in [
        ("critical", "high", false, "exclusive", "1m", "0s"),
        ("serving", "high", false, "mig", "1m", "0s"),
        ("urgent", "mid", true, "timeslice", "2m", "0s"),
        ("batch", "low", true, "exclusive", "5m", "30m"),
        ("notebook", "low", true, "timeslice", "30s", "10m"),
    ] {
        y += &format!(
            "---\napiVersion: tessera/v1alpha1\nkind: SloClass\nmetadata: {{name: {name}}}\nspec: {{tier: {tier}, preemptible: {preemptible}, isolation: {{minimum: {min}}}, preemption: {{gracePeriod: {grace}, minRuntime: {runtime}}}}}\n"
        );
    }
    for (i, l) in LAYOUTS.iter().enumerate() {
        y += &format!(
            "---\napiVersion: tessera/v1alpha1\nkind: MigLayout\nmetadata: {{name: layout-{i}}}\nspec: {{gpuModel: H100-SXM5-80GB, instances: [{}]}}\n",
            l.join(", ")
        );
    }
    for &(name, nodes, gpus) in &pools {
        let extra = match name {
            "train" if nodes >= 2 => "  sharing: exclusive\n  nvlinkDomain: rack\n".to_owned(),
            "train" => "  sharing: exclusive\n".to_owned(),
            "infer" => format!(
                "  sharing: mig\n  migLayouts: [layout-0, layout-1, layout-2, layout-3]\n  reconfiguration: {{maxPerGpuPerHour: {}}}\n",
                rng.range(1, 2)
            ),
            _ => "  sharing: mps\n  maxClientsPerGpu: 3\n".to_owned(),
        };
        let rack = if name == "train" && nodes >= 2 {
            ", nodesPerNvlinkDomain: 2"
        } else {
            ""
        };
        y += &format!(
            "---\napiVersion: tessera/v1alpha1\nkind: Pool\nmetadata: {{name: {name}}}\nspec:\n  gpuModel: H100-SXM5-80GB\n  capacity: {{nodes: {nodes}, gpusPerNode: {gpus}, cpuPerNode: {node_cpu}, memoryPerNode: 1Ti{rack}}}\n{extra}"
        );
    }
    // Guarantees in whole GPUs: a + b ≤ capacity, a1 ≤ a; limits between guarantee and capacity.
    let quota = |rng: &mut Rng| {
        let mut a = BTreeMap::new();
        let mut a1 = BTreeMap::new();
        let mut b = BTreeMap::new();
        for &(name, nodes, gpus) in &pools {
            let cap = nodes * gpus;
            let ga = rng.range(0, cap / 2);
            let gb = rng.range(0, cap - ga);
            let ga1 = rng.range(0, ga);
            let la = rng.range(ga.max(1), cap);
            let la1 = rng.range(ga1.max(1), la);
            let lb = rng.range(gb.max(1), cap);
            // Some CPU limits (cores), below the pool's: a1's within a's.
            let cores = node_cpu * nodes;
            let ca = rng.chance(50).then(|| rng.range(2, cores));
            let ca1 = match ca {
                Some(c) => rng.chance(50).then(|| rng.range(1, c)),
                None => rng.chance(50).then(|| rng.range(2, cores)),
            };
            let cb = rng.chance(50).then(|| rng.range(2, cores));
            a.insert(name, (ga, la, rng.range(0, ga), ca));
            a1.insert(name, (ga1, la1, rng.range(0, ga1), ca1));
            b.insert(name, (gb, lb, rng.range(0, gb), cb));
        }
        (a, a1, b)
    };
    let (a, a1, b) = quota(rng);
    let root_guarantee: Vec<String> = pools
        .iter()
        .map(|&(n, nodes, gpus)| format!("{n}: {}", nodes * gpus))
        .collect();
    y += &format!(
        "---\napiVersion: tessera/v1alpha1\nkind: Tenant\nmetadata: {{name: org}}\nspec:\n  guarantee: {{{}}}\n  sloClasses: [critical, serving, urgent, batch, notebook]\n",
        root_guarantee.join(", ")
    );
    for (name, parent, q, trust) in [
        ("a", "org", &a, "ta"),
        ("a1", "a", &a1, "ta1"),
        ("b", "org", &b, "tb"),
    ] {
        let g: Vec<String> = q.iter().map(|(p, v)| format!("{p}: {}", v.0)).collect();
        let l: Vec<String> = q
            .iter()
            .map(|(p, v)| match v.3 {
                Some(cpu) => format!("{p}: {{gpus: {}, cpu: {cpu}}}", v.1),
                None => format!("{p}: {}", v.1),
            })
            .collect();
        let ll: Vec<String> = q.iter().map(|(p, v)| format!("{p}: {}", v.2)).collect();
        y += &format!(
            "---\napiVersion: tessera/v1alpha1\nkind: Tenant\nmetadata: {{name: {name}}}\nspec:\n  parent: {parent}\n  guarantee: {{{}}}\n  limit: {{{}}}\n  lendingLimit: {{{}}}\n  weight: {}\n  trustDomain: {trust}\n",
            g.join(", "),
            l.join(", "),
            ll.join(", "),
            rng.range(1, 3)
        );
    }
    Fleet {
        policy_yaml: y,
        pools,
        node_cpu,
    }
}

fn nodes(rng: &mut Rng, f: &Fleet) -> Vec<Node> {
    let mut out = Vec::new();
    let mut uuid = 0u32;
    for &(pool, count, gpus) in &f.pools {
        for n in 0..count {
            let name = format!("{pool}-{n}");
            let mut list = Vec::new();
            for i in 0..gpus {
                uuid += 1;
                let mig = pool == "infer";
                let instances = if mig && rng.chance(60) {
                    let layout = rng.pick(&LAYOUTS);
                    let ids: Vec<u32> = layout
                        .iter()
                        .map(|p| {
                            mig::builtin_model("H100-SXM5-80GB")
                                .unwrap()
                                .resolve_profile(p)
                                .unwrap()
                        })
                        .collect();
                    mig::place(&ids)
                        .unwrap()
                        .into_iter()
                        .map(|p| MigInstance {
                            profile: p.profile_id.to_string(),
                            start: p.start,
                            uuid: None,
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                list.push(Gpu {
                    index: i,
                    uuid: format!("GPU-{uuid:08x}-0000-0000-0000-000000000000"),
                    model: "H100-SXM5-80GB".into(),
                    health: if rng.chance(5) {
                        Health::Degraded
                    } else {
                        Health::Healthy
                    },
                    mig: MigState {
                        enabled: mig,
                        pending: None,
                    },
                    instances,
                });
            }
            out.push(Node {
                name,
                pool: pool.into(),
                labels: BTreeMap::new(),
                rack: None,
                nvlink_domain: (pool == "train" && count >= 2).then(|| format!("rack-{}", n / 2)),
                cpu: Millicores(u64::from(f.node_cpu) * 1000),
                memory: Bytes(1 << 40),
                health: Health::Healthy,
                gpus: list,
            });
        }
    }
    out
}

fn workload(rng: &mut Rng) -> WorkloadSpec {
    let tenant = rng.pick(&["a", "a1", "b"]).to_string();
    let replicas = rng.range(1, 3);
    let min_member = rng.chance(30).then(|| rng.range(1, replicas));
    let (class, gpu) = match rng.below(3) {
        0 => (
            *rng.pick(&["critical", "batch", "urgent"]),
            GpuRequest {
                count: Some(rng.range(1, 4)),
                mig_profile: None,
                fraction: None,
            },
        ),
        1 => (
            *rng.pick(&["serving", "urgent", "notebook"]),
            GpuRequest {
                count: None,
                mig_profile: Some(
                    rng.pick(&["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"])
                        .to_string(),
                ),
                fraction: None,
            },
        ),
        _ => (
            *rng.pick(&["urgent", "notebook"]),
            GpuRequest {
                count: None,
                mig_profile: None,
                fraction: Some(*rng.pick(&[0.1, 0.25, 0.5])),
            },
        ),
    };
    WorkloadSpec {
        tenant,
        slo_class: class.into(),
        pool: None,
        replicas,
        min_member,
        gpu,
        cpu: Millicores(u64::from(rng.range(1, 4)) * 1000),
        memory: Bytes(u64::from(rng.range(1, 64)) << 30),
        topology: Topology {
            same_nvlink_domain: *rng.pick(&[
                TopologyMode::None,
                TopologyMode::Preferred,
                TopologyMode::Required,
            ]),
        },
        max_duration: None,
        command: Vec::new(),
        env: BTreeMap::new(),
    }
}

fn pending(rng: &mut Rng, prefix: &str, n: u32, now: i64) -> Vec<PendingWorkload> {
    (0..n)
        .map(|i| PendingWorkload {
            name: format!("{prefix}-{i}"),
            spec: workload(rng),
            submitted_at: format_rfc3339(now - i64::from(rng.range(0, 30)) * 60),
        })
        .collect()
}

fn document(state: &ClusterStateSpec) -> String {
    serde_json::json!({
        "apiVersion": "tessera/v1alpha1",
        "kind": "ClusterState",
        "metadata": {"name": "snap"},
        "spec": state,
    })
    .to_string()
}

/// Compiles the policy with the snapshot; panics on any error (the compiler's state checks are
/// the oversubscription oracle).
fn checked(
    policy_yaml: &str,
    state: &ClusterStateSpec,
    what: &str,
) -> (CompiledPolicy, ClusterStateSpec) {
    let c = compile(&[
        SourceFile::new("policy.yaml", policy_yaml),
        SourceFile::new("state.json", document(state)),
    ]);
    let errors: Vec<String> = c
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("{d:?}"))
        .collect();
    assert!(errors.is_empty(), "{what}: {errors:#?}");
    (
        c.policy.expect("policy"),
        c.states.into_iter().next().expect("state").1,
    )
}

/// The snapshot after applying a decision: admitted and kept workloads run on their bindings,
/// GPUs take their target geometry.
fn apply(before: &ClusterStateSpec, d: &Decision, rng: &mut Rng, now: i64) -> ClusterStateSpec {
    let mut nodes = before.nodes.clone();
    for g in &d.geometry {
        let node = nodes.iter_mut().find(|n| n.name == g.node).unwrap();
        let gpu = node.gpus.iter_mut().find(|x| x.index == g.gpu).unwrap();
        gpu.instances = g
            .target
            .iter()
            .map(|i| MigInstance {
                profile: i.profile.clone(),
                start: i.start,
                uuid: None,
            })
            .collect();
        gpu.mig.enabled = true;
    }
    let specs: BTreeMap<&str, &WorkloadSpec> = before
        .running
        .iter()
        .map(|r| (r.name.as_str(), &r.spec))
        .chain(before.pending.iter().map(|p| (p.name.as_str(), &p.spec)))
        .collect();
    let old: BTreeMap<&str, &RunningWorkload> = before
        .running
        .iter()
        .map(|r| (r.name.as_str(), r))
        .collect();
    let mut running = Vec::new();
    for w in &d.workloads {
        let bindings = match &w.outcome {
            Outcome::Keep { bindings } | Outcome::Admit { bindings, .. } => bindings,
            _ => continue,
        };
        if let Some(r) = old.get(w.name.as_str()) {
            running.push((*r).clone());
            continue;
        }
        let mut spec = specs[w.name.as_str()].clone();
        spec.replicas = bindings.len() as u32;
        spec.min_member = spec.min_member.map(|m| m.min(spec.replicas));
        let started = now - i64::from(rng.range(0, 240)) * 60;
        running.push(RunningWorkload {
            name: w.name.clone(),
            spec,
            bindings: bindings
                .iter()
                .map(|b| Binding {
                    node: b.node.clone(),
                    gpus: b.gpus.clone(),
                    mig_start: b.mig_start,
                    share: b.share,
                })
                .collect(),
            started_at: format_rfc3339(started),
            last_checkpoint_at: rng
                .chance(50)
                .then(|| format_rfc3339(started + (now - started) / 2)),
        });
    }
    ClusterStateSpec {
        observed_at: format_rfc3339(now),
        nodes,
        running,
        pending: Vec::new(),
    }
}

fn full(policy: &CompiledPolicy, state: &ClusterStateSpec) -> Decision {
    solve(policy, state, &SolveOptions::default()).expect("the snapshot solves")
}

fn by_name(d: &[WorkloadDecision]) -> BTreeMap<String, WorkloadDecision> {
    d.iter().map(|w| (w.name.clone(), w.clone())).collect()
}

/// How often each path was taken, so that the tests can tell they exercised it.
#[derive(Debug, Default)]
struct Tally {
    decided: u32,
    admitted: u32,
    reordered: u32,
    relaid_out: u32,
    deferred: u32,
    removed: u32,
    removed_running: u32,
    removal_deferred: u32,
}

fn case(seed: u64, tally: &mut Tally) {
    let mut rng = Rng(seed);
    let now = parse_rfc3339(NOW).unwrap();
    let f = fleet(&mut rng);
    let first_queue = rng.range(3, 10);
    let state0 = ClusterStateSpec {
        observed_at: format_rfc3339(now - 4 * 3600),
        nodes: nodes(&mut rng, &f),
        running: Vec::new(),
        pending: pending(&mut rng, "w", first_queue, now - 4 * 3600),
    };
    let (policy, state0) = checked(&f.policy_yaml, &state0, "initial snapshot");
    let d1 = full(&policy, &state0);
    let mut state = apply(&state0, &d1, &mut rng, now);
    let queue = rng.range(0, 6);
    state.pending = pending(&mut rng, "p", queue, now);
    let (policy, mut state) = checked(&f.policy_yaml, &state, "state after the first decision");

    let options = SolveOptions::default();
    let (mut session, d) = Session::new(&policy, &state, &options).unwrap();
    assert_eq!(
        d,
        full(&policy, &state),
        "a session's first decision is the cycle's"
    );
    assert_eq!(session.decisions(), d.workloads);
    // The standing decision's geometry plans, to tell which an event changed.
    let mut before_geometry = d.geometry;

    for k in 0..3 {
        let arrival = PendingWorkload {
            name: format!("x-{k}"),
            spec: workload(&mut rng),
            submitted_at: format_rfc3339(now - i64::from(rng.range(0, 40)) * 60),
        };
        state.pending.push(arrival.clone());
        let before = by_name(&session.decisions());
        match session.admit(&arrival).unwrap() {
            Admission::Decided {
                decision,
                changed,
                geometry,
            } => {
                let d = full(&policy, &state);
                // Each changed plan is the full cycle's for that GPU, and every GPU whose
                // target differs from the standing one is listed.
                for plan in &geometry {
                    let theirs = d
                        .geometry
                        .iter()
                        .find(|g| g.node == plan.node && g.gpu == plan.gpu);
                    assert_eq!(Some(plan), theirs, "seed {seed}: arrival {k}");
                }
                for g in &d.geometry {
                    let moved = before_geometry
                        .iter()
                        .find(|x| x.node == g.node && x.gpu == g.gpu)
                        .is_none_or(|x| x != g);
                    if moved {
                        assert!(
                            geometry.iter().any(|x| x.node == g.node && x.gpu == g.gpu),
                            "seed {seed}: arrival {k}: {g:?} not reported"
                        );
                    }
                }
                before_geometry = d.geometry.clone();
                tally.relaid_out += u32::from(!geometry.is_empty());
                let expected = by_name(&d.workloads);
                assert_eq!(
                    *decision, expected[&arrival.name],
                    "seed {seed}: arrival {k}"
                );
                assert_eq!(session.decisions(), d.workloads, "seed {seed}: arrival {k}");
                let differ: Vec<&WorkloadDecision> = d
                    .workloads
                    .iter()
                    .filter(|w| w.name != arrival.name && before.get(&w.name) != Some(*w))
                    .collect();
                assert_eq!(
                    changed.iter().collect::<Vec<_>>(),
                    differ,
                    "seed {seed}: arrival {k}"
                );
                tally.decided += 1;
                if matches!(decision.outcome, Outcome::Admit { .. }) {
                    tally.admitted += 1;
                }
                if !changed.is_empty() {
                    tally.reordered += 1;
                }
            }
            Admission::NeedsFullCycle(_) => {
                // Nothing changed: the session still stands for the snapshot without it.
                assert_eq!(session.decisions().len(), before.len());
                tally.deferred += 1;
                let (s, d) = Session::new(&policy, &state, &options).unwrap();
                session = s;
                before_geometry = d.geometry;
            }
        }

        // One workload of the snapshot finishes (or is cancelled).
        let names: Vec<String> = state
            .running
            .iter()
            .map(|r| r.name.clone())
            .chain(state.pending.iter().map(|p| p.name.clone()))
            .collect();
        if names.is_empty() {
            continue;
        }
        let gone = rng.pick(&names).clone();
        let was_running = state.running.iter().any(|r| r.name == gone);
        state.running.retain(|r| r.name != gone);
        state.pending.retain(|p| p.name != gone);
        match session.finish(&gone).unwrap() {
            Removal::Removed => {
                let d = full(&policy, &state);
                assert_eq!(
                    session.decisions(),
                    d.workloads,
                    "seed {seed}: {gone} finished"
                );
                before_geometry = d.geometry;
                tally.removed += 1;
                tally.removed_running += u32::from(was_running);
            }
            Removal::NeedsFullCycle(_) => {
                tally.removal_deferred += 1;
                let (s, d) = Session::new(&policy, &state, &options).unwrap();
                session = s;
                before_geometry = d.geometry;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_session_agrees_with_the_full_cycle(seed in any::<u64>()) {
        case(seed, &mut Tally::default());
    }
}

/// Fixed seeds, and proof that every path is exercised: answers, admissions ahead of waiting
/// work that is decided again, MIG re-layouts, deferrals, and removals (of running work too)
/// both ways.
#[test]
fn fixed_seeds_agree_and_exercise_every_path() {
    let mut tally = Tally::default();
    for seed in 0..200 {
        case(seed, &mut tally);
    }
    assert!(tally.decided > 100, "{tally:?}");
    assert!(tally.admitted > 30, "{tally:?}");
    assert!(tally.reordered > 0, "{tally:?}");
    assert!(tally.relaid_out > 0, "{tally:?}");
    assert!(tally.deferred > 0, "{tally:?}");
    assert!(tally.removed > 0, "{tally:?}");
    assert!(tally.removed_running > 0, "{tally:?}");
    assert!(tally.removal_deferred > 0, "{tally:?}");
}

#[test]
fn a_taken_name_and_an_unknown_workload_are_errors() {
    let mut rng = Rng(7);
    let now = parse_rfc3339(NOW).unwrap();
    let f = fleet(&mut rng);
    let state = ClusterStateSpec {
        observed_at: NOW.into(),
        nodes: nodes(&mut rng, &f),
        running: Vec::new(),
        pending: pending(&mut rng, "p", 2, now),
    };
    let (policy, state) = checked(&f.policy_yaml, &state, "snapshot");
    let (mut session, _) = Session::new(&policy, &state, &SolveOptions::default()).unwrap();
    let again = state.pending[0].clone();
    assert_eq!(
        session.admit(&again),
        Err(SessionError::Problem(ProblemError::DuplicateWorkload(
            again.name.clone()
        )))
    );
    let mut late = again.clone();
    late.name = "late".into();
    late.submitted_at = "yesterday".into();
    assert!(matches!(
        session.admit(&late),
        Err(SessionError::Problem(ProblemError::Timestamp { .. }))
    ));
    assert_eq!(
        session.finish("nobody"),
        Err(SessionError::Unknown("nobody".into()))
    );
}

fn training(tenant: &str, count: u32) -> WorkloadSpec {
    WorkloadSpec {
        tenant: tenant.into(),
        slo_class: "batch".into(),
        pool: None,
        replicas: 1,
        min_member: None,
        gpu: GpuRequest {
            count: Some(count),
            mig_profile: None,
            fraction: None,
        },
        cpu: Millicores(8000),
        memory: Bytes(64 << 30),
        topology: Topology::default(),
        max_duration: None,
        command: Vec::new(),
        env: BTreeMap::new(),
    }
}

/// `a`'s guarantee (8 training GPUs) covers its two oldest jobs (4 GPUs each, on `t0`); its
/// third (8 GPUs, on `t1`) is borrowed, so `b`, within its own guarantee, reclaims it for an
/// 8-GPU job. Once one of the old jobs finishes, the third straddles the guarantee and is
/// protected: the same arrival waits. The session must have moved the guarantee line.
#[test]
fn a_finished_workload_moves_the_guarantee_line() {
    let nodes = [
        common::node("t0", "train", 8),
        common::node("t1", "train", 8),
    ];
    let job = |name: &str, count: u32, node: &str, gpus: &str, started: &str| {
        format!(
            "    - {{name: {name}, spec: {{tenant: a, sloClass: batch, gpu: {{count: {count}}}, cpu: 8, memory: 64Gi}}, bindings: [{{node: {node}, gpus: [{gpus}]}}], startedAt: \"{started}\"}}\n"
        )
    };
    let running = [
        job("old-1", 4, "t0", "0, 1, 2, 3", "2026-11-20T00:00:00Z"),
        job("old-2", 4, "t0", "4, 5, 6, 7", "2026-11-20T00:00:00Z"),
        job(
            "recent",
            8,
            "t1",
            "0, 1, 2, 3, 4, 5, 6, 7",
            "2026-11-20T01:00:00Z",
        ),
    ]
    .concat();
    let (policy, mut state) = common::compile_all(&common::state(&nodes, &running, ""));
    let options = SolveOptions::default();
    let (mut session, _) = Session::new(&policy, &state, &options).unwrap();
    let arrival = PendingWorkload {
        name: "b-job".into(),
        spec: training("b", 8),
        submitted_at: NOW.into(),
    };

    let mut before = session.clone();
    let Ok(Admission::Decided {
        decision, changed, ..
    }) = before.admit(&arrival)
    else {
        panic!("decided");
    };
    assert!(
        matches!(decision.outcome, Outcome::Admit { .. }),
        "{decision:?}"
    );
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].name, "recent");
    assert!(matches!(changed[0].outcome, Outcome::Preempt { .. }));

    assert_eq!(session.finish("old-1"), Ok(Removal::Removed));
    state.running.retain(|r| r.name != "old-1");
    let Ok(Admission::Decided {
        decision, changed, ..
    }) = session.admit(&arrival)
    else {
        panic!("decided");
    };
    assert!(
        matches!(decision.outcome, Outcome::Pending { .. }),
        "{decision:?}"
    );
    assert!(changed.is_empty());
    state.pending.push(arrival);
    assert_eq!(session.decisions(), full(&policy, &state).workloads);
}
