//! What the service exports at `GET /state`, `tessera plan` must accept: over random fleets and
//! queues, a cycle's decision is carried out the way the service records it (each workload's
//! spec as submitted, with the bindings it was given), exported with `snapshot::cluster_state`
//! as the API writes it, and compiled with the policy and solved again without an error.

use proptest::prelude::*;
use tessera_compiler::model::{ClusterStateSpec, PendingWorkload};
use tessera_compiler::{CompiledPolicy, SourceFile, compile};
use tessera_reconciler::driver::Observation;
use tessera_reconciler::snapshot::{self, RunningFacts, Tracked, cluster_state};
use tessera_reconciler::store::carried::Carried;
use tessera_solver::carry::carry_out;
use tessera_solver::{Outcome, SolveOptions, solve};

const POLICY: &str = r#"
apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {name: tiers}
spec:
  tiers:
    - {name: production, value: 1000}
    - {name: batch, value: 100}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: serving}
spec: {tier: production, preemptible: false, isolation: {minimum: mig}}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: training}
spec:
  tier: batch
  preemptible: true
  isolation: {minimum: exclusive}
  preemption: {signal: SIGUSR1, gracePeriod: 20s, minRuntime: 0s}
---
apiVersion: tessera/v1alpha1
kind: MigLayout
metadata: {name: halves}
spec: {gpuModel: H100-SXM5-80GB, instances: [4g.40gb, 3g.40gb]}
---
apiVersion: tessera/v1alpha1
kind: MigLayout
metadata: {name: sevenths}
spec: {gpuModel: H100-SXM5-80GB, instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: train}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {nodes: 3, gpusPerNode: 4, cpuPerNode: 64, memoryPerNode: 512Gi}
  sharing: exclusive
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: infer}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {nodes: 2, gpusPerNode: 1, cpuPerNode: 64, memoryPerNode: 512Gi}
  sharing: mig
  migLayouts: [halves, sevenths]
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: org}
spec:
  guarantee: {train: 8, infer: 2}
  sloClasses: [serving, training]
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: research}
spec:
  parent: org
  guarantee: {train: 2}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: product}
spec:
  parent: org
  guarantee: {train: 4, infer: 2}
"#;

/// 2026-11-23T00:00:00Z, the snapshots' `observedAt`.
const OBSERVED_AT: i64 = 1_795_392_000;

#[derive(Debug, Clone)]
struct Gang {
    research: bool,
    /// Whole GPUs per replica in `train`, or a MIG profile in `infer`.
    shape: Shape,
    replicas: u32,
    min_member: Option<u32>,
}

#[derive(Debug, Clone)]
enum Shape {
    Gpus(u32),
    Mig(&'static str),
}

fn gang() -> impl Strategy<Value = Gang> {
    let shape = prop_oneof![
        (1u32..=4).prop_map(Shape::Gpus),
        prop::sample::select(vec!["1g.10gb", "3g.40gb", "4g.40gb"]).prop_map(Shape::Mig),
    ];
    (any::<bool>(), shape, 1u32..=6, 0u32..=6).prop_map(|(research, shape, replicas, min)| {
        Gang {
            research,
            shape,
            replicas,
            // 0 draws no minMember at all; anything else is clamped into 1..=replicas.
            min_member: (min > 0).then(|| min.min(replicas)),
        }
    })
}

fn node(name: &str, pool: &str, gpus: u32, mig: bool, seed: u32) -> String {
    let mut text = format!(
        "    - name: {name}\n      pool: {pool}\n      cpu: 64\n      memory: 512Gi\n      gpus:\n"
    );
    for i in 0..gpus {
        text.push_str(&format!(
            "        - {{index: {i}, uuid: GPU-{seed:08x}-0000-0000-0000-{i:012x}, model: H100-SXM5-80GB{}}}\n",
            if mig { ", mig: {enabled: true}" } else { "" }
        ));
    }
    text
}

/// The first snapshot: empty nodes and the gangs waiting, in order.
fn first_snapshot(train: &[u32], infer: u32, gangs: &[Gang]) -> String {
    let mut text = String::from(
        "apiVersion: tessera/v1alpha1\nkind: ClusterState\nmetadata: {name: before}\nspec:\n  observedAt: \"2026-11-23T00:00:00Z\"\n  nodes:\n",
    );
    for (n, gpus) in train.iter().enumerate() {
        text.push_str(&node(&format!("t{n}"), "train", *gpus, false, n as u32));
    }
    for n in 0..infer {
        text.push_str(&node(&format!("i{n}"), "infer", 1, true, 100 + n));
    }
    text.push_str("  pending:\n");
    for (i, g) in gangs.iter().enumerate() {
        let (class, pool, gpu) = match g.shape {
            Shape::Gpus(n) => ("training", "train", format!("{{count: {n}}}")),
            Shape::Mig(p) => ("serving", "infer", format!("{{migProfile: {p}}}")),
        };
        let min = g
            .min_member
            .map(|m| format!(", minMember: {m}"))
            .unwrap_or_default();
        text.push_str(&format!(
            "    - name: w{i}\n      submittedAt: \"2026-11-22T23:{:02}:00Z\"\n      spec: {{tenant: {}, sloClass: {class}, pool: {pool}, replicas: {}{min}, gpu: {gpu}, cpu: 1, memory: 1Gi}}\n",
            i % 60,
            if g.research { "research" } else { "product" },
            g.replicas,
        ));
    }
    text
}

fn compiled(state: &str) -> Result<(CompiledPolicy, ClusterStateSpec), String> {
    let c = compile(&[
        SourceFile::new("policy.yaml", POLICY),
        SourceFile::new("state.yaml", state),
    ]);
    let errors: Vec<String> = c
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("{:?}: {}", d.location, d.message))
        .collect();
    match (c.policy, c.states.into_iter().next()) {
        (Some(p), Some((_, s))) if errors.is_empty() => Ok((p, s)),
        _ => Err(errors.join("\n")),
    }
}

/// The service's records after carrying the decision out: the spec as submitted, the bindings
/// each admitted workload was given.
fn tracked(before: &ClusterStateSpec, after: &ClusterStateSpec) -> Vec<Tracked> {
    let submitted = |name: &str| -> &PendingWorkload {
        before.pending.iter().find(|p| p.name == name).unwrap()
    };
    let mut out: Vec<Tracked> = after
        .running
        .iter()
        .map(|r| Tracked {
            name: r.name.clone(),
            spec: submitted(&r.name).spec.clone(),
            submitted_at: tessera_reconciler::snapshot::unix(OBSERVED_AT - 60),
            running: Some(RunningFacts {
                bindings: r.bindings.clone(),
                started_at: tessera_reconciler::snapshot::unix(OBSERVED_AT),
                last_checkpoint_at: None,
            }),
        })
        .collect();
    out.extend(after.pending.iter().map(|p| Tracked {
        name: p.name.clone(),
        spec: submitted(&p.name).spec.clone(),
        submitted_at: tessera_reconciler::snapshot::unix(OBSERVED_AT - 60),
        running: None,
    }));
    out
}

/// One cycle, then the snapshot the service would export; how many gangs were admitted short
/// of their replicas.
fn round_trip(train: &[u32], infer: u32, gangs: &[Gang]) -> Result<usize, String> {
    let (policy, before) = compiled(&first_snapshot(train, infer, gangs))
        .map_err(|e| format!("the generated snapshot is invalid:\n{e}"))?;
    let decision = solve(&policy, &before, &SolveOptions::default()).map_err(|e| e.to_string())?;
    let short = decision
        .workloads
        .iter()
        .filter(|w| {
            let asked = before.pending.iter().find(|p| p.name == w.name);
            matches!((&w.outcome, asked), (Outcome::Admit { bindings, .. }, Some(p))
                if bindings.len() < p.spec.replicas as usize)
        })
        .count();
    let after = carry_out(&before, &decision);
    let observation = Observation {
        nodes: after.nodes.clone(),
        details: Vec::new(),
    };
    let carried = Carried {
        usage: after.usage.clone(),
        reservations: after.reservations.clone(),
        reconfigurations: after.reconfigurations.clone(),
    };
    let exported = cluster_state(
        &observation,
        &tracked(&before, &after),
        &carried,
        OBSERVED_AT + 60,
    );
    // As `GET /state` writes it and `tessera plan --state` reads it.
    let document = serde_json::to_string_pretty(&snapshot::document(&exported)).unwrap();
    let (policy, state) = compiled(&document)
        .map_err(|e| format!("plan refuses the exported snapshot:\n{e}\n{document}"))?;
    solve(&policy, &state, &SolveOptions::default())
        .map_err(|e| format!("the solver refuses the exported snapshot: {e}\n{document}"))?;
    Ok(short)
}

#[test]
fn a_gang_admitted_short_of_its_replicas_is_exported_as_it_runs() {
    // Two free GPUs for a gang of four that may start with two.
    let gangs = [Gang {
        research: true,
        shape: Shape::Gpus(1),
        replicas: 4,
        min_member: Some(2),
    }];
    assert_eq!(round_trip(&[2], 0, &gangs), Ok(1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn what_the_service_exports_plan_accepts(
        train in prop::collection::vec(1u32..=4, 1..=3),
        infer in 0u32..=2,
        gangs in prop::collection::vec(gang(), 1..=8),
    ) {
        if let Err(e) = round_trip(&train, infer, &gangs) {
            prop_assert!(false, "{}", e);
        }
    }
}
