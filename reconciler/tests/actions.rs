//! The action planner on real decisions: the test fleet's policy compiled, a snapshot solved,
//! and the plan checked for order, drains, grace periods and backoff.

use std::path::PathBuf;

use tessera_compiler::model::{Binding, ClusterStateSpec, Node};
use tessera_compiler::{CompiledPolicy, SourceFile};
use tessera_reconciler::actions::{self, Action, LivePhase, Throttle, Wait, WorkloadView};
use tessera_reconciler::driver::{
    ComputeInstanceInfo, GpuDetail, GpuInstanceInfo, GpuProcess, GpuRef, Observation,
};
use tessera_solver::decision::{Outcome, WorkloadDecision};
use tessera_solver::{Decision, SolveOptions};

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/reconcile")
}

fn read(path: PathBuf) -> SourceFile {
    let text = std::fs::read_to_string(&path).unwrap();
    SourceFile::new(path.display().to_string(), text)
}

/// The test fleet's policy, with `all-1g` allowed on the inference pool when asked.
fn policy(all_1g: bool) -> CompiledPolicy {
    let mut fleet = read(data().join("policy/fleet.yaml"));
    if all_1g {
        fleet.text = fleet
            .text
            .replace("migLayouts: [halves]", "migLayouts: [halves, all-1g]")
            + "---\napiVersion: tessera/v1alpha1\nkind: MigLayout\nmetadata: {name: all-1g}\n\
               spec: {gpuModel: H100-SXM5-80GB, instances: [1g.10gb, 1g.10gb, 1g.10gb, \
               1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}\n";
    }
    let c = tessera_compiler::compile(&[fleet, read(data().join("policy/tenants.yaml"))]);
    assert_eq!(c.errors(), 0, "{:?}", c.diagnostics);
    c.policy.unwrap()
}

fn nodes() -> Vec<Node> {
    let c = tessera_compiler::compile(&[
        read(data().join("policy/fleet.yaml")),
        read(data().join("policy/tenants.yaml")),
        read(data().join("nodes.yaml")),
    ]);
    assert_eq!(c.errors(), 0, "{:?}", c.diagnostics);
    c.states[0].1.nodes.clone()
}

/// What a driver would report for `nodes`: GPU instance ids 1.., one compute instance each.
fn observe(nodes: &[Node], processes: &[(GpuRef, GpuProcess)]) -> Observation {
    let mut details = Vec::new();
    for n in nodes {
        for g in &n.gpus {
            let gpu = GpuRef {
                node: n.name.clone(),
                index: g.index,
            };
            let instances = g
                .instances
                .iter()
                .enumerate()
                .map(|(i, inst)| GpuInstanceInfo {
                    id: i as u32 + 1,
                    profile_id: tessera_compiler::mig::builtin_model(&g.model)
                        .unwrap()
                        .resolve_profile(&inst.profile)
                        .unwrap(),
                    start: inst.start,
                    compute_instances: vec![ComputeInstanceInfo {
                        id: 0,
                        uuid: format!("MIG-{}-{}", g.index, inst.start),
                    }],
                    sm_activity: None,
                })
                .collect();
            let processes = processes
                .iter()
                .filter(|(r, _)| *r == gpu)
                .map(|(_, p)| p.clone())
                .collect();
            details.push(GpuDetail {
                gpu,
                instances,
                processes,
                utilization: None,
                sm_activity: None,
            });
        }
    }
    Observation {
        nodes: nodes.to_vec(),
        details,
    }
}

fn solve(policy: &CompiledPolicy, state: &ClusterStateSpec) -> Decision {
    tessera_solver::solve(policy, state, &SolveOptions::default()).unwrap()
}

fn state(nodes: Vec<Node>, running: &str, pending: &str) -> ClusterStateSpec {
    let yaml = format!(
        "observedAt: \"2026-11-23T12:00:00Z\"\nnodes: []\nrunning: {running}\npending: {pending}\n"
    );
    let mut s: ClusterStateSpec = serde_saphyr::from_str(&yaml).unwrap();
    s.nodes = nodes;
    s
}

const NOW: i64 = 1_795_435_200; // 2026-11-23T12:00:00Z

/// `key` is `tenant/name`, as actions name workloads.
fn view(key: &str, phase: LivePhase, alive: usize, bindings: Vec<Binding>) -> WorkloadView {
    WorkloadView {
        key: key.to_string(),
        phase,
        alive_processes: alive,
        bindings,
        checkpoint_signal: "SIGUSR1".to_string(),
    }
}

fn whole(node: &str, gpus: &[u32]) -> Binding {
    Binding {
        node: node.to_string(),
        gpus: gpus.to_vec(),
        mig_start: None,
        share: None,
    }
}

const TRAINING: &str = "[{name: pretrain, spec: {tenant: research, sloClass: training, pool: train, gpu: {count: 2}}, bindings: [{node: t0, gpus: [0, 1]}], startedAt: \"2026-11-23T10:00:00Z\"}]";
const BURST: &str = "[{name: burst, spec: {tenant: product, sloClass: interactive, pool: train, gpu: {count: 2}}, submittedAt: \"2026-11-23T11:59:00Z\"}]";
const SMALL: &str = "[{name: small, spec: {tenant: product, sloClass: serving, pool: infer, gpu: {migProfile: 1g.10gb}}, submittedAt: \"2026-11-23T11:59:00Z\"}]";

fn kinds(actions: &[Action]) -> Vec<&'static str> {
    actions
        .iter()
        .map(tessera_reconciler::service::cycle::action_name)
        .collect()
}

#[test]
fn a_preemption_signals_first_and_the_preemptor_waits_for_the_devices() {
    let policy = policy(false);
    let decision = solve(&policy, &state(nodes(), TRAINING, BURST));
    let views = [
        view(
            "research/pretrain",
            LivePhase::Running,
            1,
            vec![whole("t0", &[0, 1])],
        ),
        view("product/burst", LivePhase::Pending, 0, vec![]),
    ];
    let plan = actions::plan(
        &decision,
        &observe(&nodes(), &[]),
        &views,
        &Throttle::default(),
        NOW,
    );
    assert_eq!(kinds(&plan.actions), ["checkpoint"]);
    let Action::Checkpoint {
        signal, deadline, ..
    } = &plan.actions[0]
    else {
        unreachable!()
    };
    assert_eq!(signal, "SIGUSR1");
    assert_eq!(*deadline, NOW + 20, "the class's 20 s grace period");
    assert!(
        matches!(&plan.waits[..], [Wait::Devices { workload, .. }] if workload == "product/burst")
    );
}

#[test]
fn inside_the_grace_period_nothing_moves_and_after_it_the_victim_is_stopped() {
    let policy = policy(false);
    let decision = solve(&policy, &state(nodes(), TRAINING, BURST));
    let checkpointing = |alive| {
        [
            view(
                "research/pretrain",
                LivePhase::Checkpointing { deadline: NOW + 5 },
                alive,
                vec![whole("t0", &[0, 1])],
            ),
            view("product/burst", LivePhase::Pending, 0, vec![]),
        ]
    };
    let observation = observe(&nodes(), &[]);
    let plan = actions::plan(
        &decision,
        &observation,
        &checkpointing(1),
        &Throttle::default(),
        NOW,
    );
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert!(plan.waits.iter().any(|w| matches!(w, Wait::Grace { .. })));

    // Past the deadline: stopped; the burst still waits for the processes to be gone.
    let plan = actions::plan(
        &decision,
        &observation,
        &checkpointing(1),
        &Throttle::default(),
        NOW + 6,
    );
    assert_eq!(kinds(&plan.actions), ["stop"]);

    // The victim exited on its own after checkpointing: stopped (requeued) and the burst starts.
    let plan = actions::plan(
        &decision,
        &observation,
        &checkpointing(0),
        &Throttle::default(),
        NOW,
    );
    assert_eq!(kinds(&plan.actions), ["stop", "start"]);
}

#[test]
fn a_geometry_change_destroys_compute_then_gpu_instances_then_creates_then_starts() {
    let policy = policy(true);
    let decision = solve(&policy, &state(nodes(), "[]", SMALL));
    let views = [view("product/small", LivePhase::Pending, 0, vec![])];
    let plan = actions::plan(
        &decision,
        &observe(&nodes(), &[]),
        &views,
        &Throttle::default(),
        NOW,
    );
    let k = kinds(&plan.actions);
    let last = |name: &str| k.iter().rposition(|x| *x == name).unwrap();
    let first = |name: &str| k.iter().position(|x| *x == name).unwrap();
    assert!(
        last("destroy_compute_instance") < first("destroy_gpu_instance"),
        "{k:?}"
    );
    assert!(
        last("destroy_gpu_instance") < first("create_gpu_instance"),
        "{k:?}"
    );
    assert!(
        last("create_gpu_instance") < first("create_compute_instance"),
        "{k:?}"
    );
    assert_eq!(k.last(), Some(&"start"));
    assert_eq!(k.iter().filter(|x| **x == "create_gpu_instance").count(), 7);
    assert!(plan.waits.is_empty(), "{:?}", plan.waits);
}

#[test]
fn an_instance_in_use_is_never_destroyed() {
    let policy = policy(true);
    let decision = solve(&policy, &state(nodes(), "[]", SMALL));
    let views = [view("product/small", LivePhase::Pending, 0, vec![])];
    let gpu = GpuRef {
        node: "i0".into(),
        index: 0,
    };
    // A process the service does not know holds the 3g instance (id 2).
    let held = [(
        gpu.clone(),
        GpuProcess {
            pid: 4242,
            gpu_instance: Some(2),
        },
    )];
    let plan = actions::plan(
        &decision,
        &observe(&nodes(), &held),
        &views,
        &Throttle::default(),
        NOW,
    );
    assert!(
        plan.actions.iter().all(|a| !a.is_geometry()),
        "{:?}",
        plan.actions
    );
    assert!(plan.waits.iter().any(
        |w| matches!(w, Wait::Drain { gpu: g, holders } if *g == gpu && holders == &["pid 4242"])
    ));
    assert!(
        plan.waits
            .iter()
            .any(|w| matches!(w, Wait::Devices { workload, .. } if workload == "product/small"))
    );
}

/// A running workload on an instance the decision destroys holds the GPU back, named in the
/// drain; stopped by the same plan (checkpointing past its deadline), it holds no instance,
/// and the workload to start there waits, by name, for its processes to be gone.
#[test]
fn a_workload_on_a_destroyed_instance_is_waited_for_until_stopped_and_gone() {
    let policy = policy(true);
    let mut decision = solve(&policy, &state(nodes(), "[]", SMALL));
    let small = decision
        .workloads
        .iter()
        .find_map(|w| match &w.outcome {
            Outcome::Admit { bindings, .. } if w.name == "small" => Some(bindings[0].clone()),
            _ => None,
        })
        .expect("small is admitted");
    let g = decision
        .geometry
        .iter()
        .find(|g| g.node == small.node && g.gpu == small.gpus[0] && !g.destroy.is_empty())
        .expect("its GPU is laid out again");
    let gpu = GpuRef {
        node: g.node.clone(),
        index: g.gpu,
    };
    let on_it = Binding {
        node: g.node.clone(),
        gpus: vec![g.gpu],
        mig_start: Some(g.destroy[0].start),
        share: None,
    };
    // Kept by the decision: only the phase the service records tells it to stop.
    decision.workloads.push(WorkloadDecision {
        name: "old".into(),
        tenant: "research".into(),
        slo_class: "serving".into(),
        priority: 0,
        pool: Some("infer".into()),
        outcome: Outcome::Keep { bindings: vec![] },
    });
    let views = |phase| {
        [
            view("research/old", phase, 1, vec![on_it.clone()]),
            view("product/small", LivePhase::Pending, 0, vec![]),
        ]
    };
    let observation = observe(&nodes(), &[]);
    let waits_for = |plan: &actions::ActionPlan, detail: String| {
        plan.waits.iter().any(|w| {
            matches!(w, Wait::Devices { workload, detail: d }
                if workload == "product/small" && *d == detail)
        })
    };

    let plan = actions::plan(
        &decision,
        &observation,
        &views(LivePhase::Running),
        &Throttle::default(),
        NOW,
    );
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert!(
        plan.waits
            .iter()
            .any(|w| matches!(w, Wait::Drain { gpu: d, holders }
            if *d == gpu && holders == &["research/old"])),
        "{:?}",
        plan.waits
    );
    assert!(
        waits_for(&plan, format!("{gpu}: geometry not ready")),
        "{:?}",
        plan.waits
    );

    let plan = actions::plan(
        &decision,
        &observation,
        &views(LivePhase::Checkpointing { deadline: NOW - 1 }),
        &Throttle::default(),
        NOW,
    );
    assert_eq!(kinds(&plan.actions[..1]), ["stop"]);
    assert!(
        plan.actions.iter().any(Action::is_geometry),
        "{:?}",
        plan.actions
    );
    assert!(
        !plan.waits.iter().any(|w| matches!(w, Wait::Drain { .. })),
        "{:?}",
        plan.waits
    );
    assert!(
        waits_for(&plan, format!("{gpu}: still held by research/old")),
        "{:?}",
        plan.waits
    );
}

#[test]
fn keys_in_backoff_wait_until_the_backoff_ends() {
    let policy = policy(true);
    let decision = solve(&policy, &state(nodes(), "[]", SMALL));
    let views = [view("product/small", LivePhase::Pending, 0, vec![])];
    let gpu = GpuRef {
        node: "i0".into(),
        index: 0,
    };
    let mut throttle = Throttle::default();
    throttle.backoff.insert(format!("gpu/{gpu}"), NOW + 30);
    let plan = actions::plan(&decision, &observe(&nodes(), &[]), &views, &throttle, NOW);
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert!(
        plan.waits
            .iter()
            .any(|w| matches!(w, Wait::Backoff { until, .. } if *until == NOW + 30))
    );

    // Expired entries do not hold anything back.
    let plan = actions::plan(
        &decision,
        &observe(&nodes(), &[]),
        &views,
        &throttle,
        NOW + 30,
    );
    assert!(!plan.actions.is_empty());
}

#[test]
fn a_gpu_instance_left_without_its_compute_instance_is_completed() {
    let policy = policy(false);
    let decision = solve(&policy, &state(nodes(), "[]", "[]"));
    let mut observation = observe(&nodes(), &[]);
    // A cycle was killed between creating the 3g GPU instance and its compute instance.
    let detail = observation
        .details
        .iter_mut()
        .find(|d| d.gpu.node == "i0")
        .unwrap();
    detail.instances[1].compute_instances.clear();
    let plan = actions::plan(&decision, &observation, &[], &Throttle::default(), NOW);
    assert_eq!(
        plan.actions,
        [Action::CreateComputeInstance {
            gpu: GpuRef {
                node: "i0".into(),
                index: 0
            },
            start: 4
        }]
    );
}
