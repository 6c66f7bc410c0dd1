//! The replay on a tiny fleet: its report as a snapshot, departures and queueing delay to the
//! second, file:line:col for a bad trace, and determinism.

use std::path::{Path, PathBuf};

use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::Node;
use tessera_sim::openb::PolicyKind;
use tessera_sim::replay::generate::{Generate, generate};
use tessera_sim::replay::openb::{openb_nodes, parse_openb_trace};
use tessera_sim::replay::{
    OpenbBaseline, Placement, ReplayConfig, RunReport, Summary, TraceWorkload, load_tessera_trace,
    parse_tessera_trace, replay,
};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replay")
}

fn fleet() -> (CompiledPolicy, Vec<Node>) {
    let loaded = tessera_compiler::source::discover(&[dir().join("policy")]).unwrap();
    let c = tessera_compiler::compile_loaded(loaded);
    let policy = c.policy.clone().expect("the test policy compiles");
    let nodes = c.states[0].1.nodes.clone();
    (policy, nodes)
}

fn config() -> ReplayConfig {
    ReplayConfig {
        // Generous: a cycle that reached it would make the run depend on the machine.
        time_limit: std::time::Duration::from_secs(60),
        ..ReplayConfig::default()
    }
}

fn run(
    policy: &CompiledPolicy,
    nodes: &[Node],
    trace: &[TraceWorkload],
    kind: Option<PolicyKind>,
) -> RunReport {
    run_with(&config(), policy, nodes, trace, kind)
}

fn run_with(
    config: &ReplayConfig,
    policy: &CompiledPolicy,
    nodes: &[Node],
    trace: &[TraceWorkload],
    kind: Option<PolicyKind>,
) -> RunReport {
    let mut report = match kind {
        None => replay(policy, nodes, trace, config, Placement::Solver, &mut |_| {}).unwrap(),
        Some(k) => {
            let mut b = OpenbBaseline::new(k, 0, trace).unwrap();
            replay(
                policy,
                nodes,
                trace,
                config,
                Placement::Baseline(&mut b),
                &mut |_| {},
            )
            .unwrap()
        }
    };
    report.placement = kind.map_or("Tessera", PolicyKind::name).to_owned();
    report
}

#[test]
fn tiny_replay_report() {
    let (policy, nodes) = fleet();
    let trace = load_tessera_trace(&dir().join("trace.yaml")).unwrap();
    assert_eq!(trace.len(), 50);
    let runs: Vec<RunReport> = [None, Some(PolicyKind::Fgd), Some(PolicyKind::BestFit)]
        .into_iter()
        .map(|k| run(&policy, &nodes, &trace, k))
        .collect();
    for r in &runs {
        assert_eq!(r.cycles_time_limited, 0, "{}", r.placement);
        assert_eq!(r.started + r.never_started, r.workloads);
        assert!(r.mean_allocation > 0.0 && r.mean_allocation <= 1.0);
    }
    let summary = Summary::new(&trace, &nodes, &config(), runs);
    insta::assert_json_snapshot!("tiny_replay", summary);
}

fn one(name: &str, tenant: &str, gpu: &str, replicas: u32, arrival: i64, duration: i64) -> String {
    format!(
        "kind: Workload\nmetadata: {{name: {name}}}\nspec: {{tenant: {tenant}, sloClass: batch, replicas: {replicas}, gpu: {gpu}}}\narrival: {arrival}\nduration: {duration}\n---\n"
    )
}

#[test]
fn a_workload_still_waiting_counts_its_wait_up_to_the_end() {
    let (policy, nodes) = fleet();
    // `fill` holds all 8 training GPUs past the horizon; `next` arrives at 5s and never
    // starts. Its wait, 295s at the 300s horizon, is in `waiting`, not in `queueing_delay`.
    let text = one("fill", "alpha", "{count: 4}", 2, 0, 1_000)
        + &one("next", "alpha", "{count: 1}", 1, 5, 30);
    let trace = parse_tessera_trace("t.yaml", &text).unwrap();
    let config = ReplayConfig {
        horizon: Some(300),
        ..config()
    };
    let r = run_with(&config, &policy, &nodes, &trace, None);
    assert_eq!((r.started, r.never_started), (1, 1));
    assert_eq!(r.queueing_delay.max, Some(0));
    assert_eq!(r.waiting.p50, Some(0));
    assert_eq!(r.waiting.max, Some(295));
    assert_eq!(r.waiting.p99, Some(295));
}

#[test]
fn a_departure_frees_gpus_for_the_queue() {
    let (policy, nodes) = fleet();
    // `fill` takes all 8 training GPUs from 0s to 95s; `next` arrives at 5s and must wait for
    // them: the cycle at 100s is the first after they are free.
    let text = one("fill", "alpha", "{count: 4}", 2, 0, 95)
        + &one("next", "alpha", "{count: 1}", 1, 5, 30);
    let trace = parse_tessera_trace("t.yaml", &text).unwrap();
    let r = run(&policy, &nodes, &trace, None);
    assert_eq!(r.started, 2);
    let alpha = &r.tenants[0];
    assert_eq!(alpha.tenant, "alpha");
    // Delays: 0s for `fill`, 95s for `next` (arrived at 5s, started at 100s).
    assert_eq!(r.queueing_delay.p50, Some(0));
    assert_eq!(r.queueing_delay.max, Some(95));
    // It ends when `next` has run its 30s.
    assert_eq!(r.duration_seconds, 130);
    // 8 GPUs × 95s + 1 GPU × 30s.
    assert!(
        (r.gpu_hours_used - (8.0 * 95.0 + 30.0) / 3600.0).abs() < 1e-5,
        "{}",
        r.gpu_hours_used
    );
    // Allocation: 8 of 10 GPUs for 95s, 1 for 30s, over 130s.
    let mean = (0.8 * 95.0 + 0.1 * 30.0) / 130.0;
    assert!(
        (r.mean_allocation - mean).abs() < 1e-5,
        "{} vs {mean}",
        r.mean_allocation
    );
    assert_eq!(r.preemptions, 0);
}

#[test]
fn a_bad_trace_line_is_named() {
    let text = one("a", "alpha", "{count: 1}", 1, 0, 10)
        + "kind: Workload\nmetadata: {name: b}\nspec: {tenant: alpha, sloClass: batch, gpu: {count: 1}}\narrival: 3 days\n";
    let e = parse_tessera_trace("bad.yaml", &text)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("bad.yaml:10:1: `arrival`"), "{e}");

    let text = "kind: Workload\nmetadata: {name: b}\nspec: {tenant: alpha, sloClass: batch, gpu: {count: 1}, colour: red}\narrival: 3\n";
    let e = parse_tessera_trace("bad.yaml", text)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("bad.yaml:3:") && e.contains("colour"), "{e}");
}

#[test]
fn the_same_seed_gives_the_same_replay() {
    let (policy, nodes) = fleet();
    let g = |seed| {
        generate(
            &policy,
            &nodes,
            &Generate {
                horizon: 3600,
                load: 0.9,
                seed,
            },
        )
        .unwrap()
    };
    let (a, b, c) = (g(3), g(3), g(4));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(!a.is_empty());
    let (ra, rb) = (
        run(&policy, &nodes, &a, Some(PolicyKind::Random)),
        run(&policy, &nodes, &b, Some(PolicyKind::Random)),
    );
    assert_eq!(
        serde_json::to_string(&ra).unwrap(),
        serde_json::to_string(&rb).unwrap()
    );
    let (sa, sb) = (
        run(&policy, &nodes, &a, None),
        run(&policy, &nodes, &b, None),
    );
    assert_eq!(sa, sb);
}

#[test]
fn openb_rows_become_workloads() {
    let (policy, _) = fleet();
    let csv = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
               p0,4000,1024,1,500,,LS,Running,100,160,100\n\
               p1,4000,1024,0,0,,BE,Running,110,900,110\n\
               p2,8000,2048,2,1000,,BE,Running,130,400,130\n";
    let t = parse_openb_trace("pods.csv", csv, &policy, 1).unwrap();
    // The CPU-only pod is left out; times start at the first arrival.
    assert_eq!(t.len(), 2);
    assert_eq!((t[0].arrival, t[0].duration), (0, Some(60)));
    assert_eq!(t[0].spec.gpu.fraction, Some(0.5));
    assert_eq!(
        t[0].spec.slo_class, "notebook",
        "a share needs a class that allows sharing"
    );
    assert_eq!((t[1].arrival, t[1].duration), (30, Some(270)));
    assert_eq!(t[1].spec.gpu.count, Some(2));
    // Tenants are drawn from the seed: the same seed, the same spread.
    let again = parse_openb_trace("pods.csv", csv, &policy, 1).unwrap();
    assert_eq!(t, again);

    let bad = csv.replace("130,400,130", "130,soon,130");
    let e = parse_openb_trace("pods.csv", &bad, &policy, 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("pods.csv:4:") && e.contains("deletion_time"),
        "{e}"
    );

    let nodes = tessera_sim::openb::parse_nodes(
        Path::new("nodes.csv"),
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,524288,4,H100-SXM5-80GB\nn1,8000,1024,0,\n",
    )
    .unwrap();
    let fleet = openb_nodes("nodes.csv", &nodes, &policy).unwrap();
    assert_eq!(fleet.len(), 1, "a CPU-only node holds no GPU");
    assert_eq!(fleet[0].gpus.len(), 4);
    let e = openb_nodes(
        "nodes.csv",
        &tessera_sim::openb::parse_nodes(
            Path::new("nodes.csv"),
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,524288,4,T4\n",
        )
        .unwrap(),
        &policy,
    )
    .unwrap_err();
    assert!(e.to_string().contains("`T4`"), "{e}");
}

#[test]
fn the_html_page_is_self_contained() {
    let (policy, nodes) = fleet();
    let text =
        one("fill", "alpha", "{count: 4}", 2, 0, 95) + &one("next", "beta", "{count: 1}", 1, 5, 30);
    let trace = parse_tessera_trace("t.yaml", &text).unwrap();
    let runs = vec![
        run(&policy, &nodes, &trace, None),
        run(&policy, &nodes, &trace, Some(PolicyKind::BestFit)),
    ];
    let page = tessera_sim::replay::html::page(&Summary::new(&trace, &nodes, &config(), runs));
    // The allocation plot and one fair-share plot per run, inline.
    assert_eq!(page.matches("<svg").count(), 3, "{page}");
    assert!(!page.contains("<script") && !page.contains("src=\"http"));
    assert!(page.contains("<th>BestFit</th>"));
}

/// The test fleet with one committed workload in the repository: `serve`, 2 whole training
/// GPUs, not preemptible.
fn fleet_with_committed() -> (CompiledPolicy, Vec<Node>) {
    let mut loaded = tessera_compiler::source::discover(&[dir().join("policy")]).unwrap();
    loaded.push(tessera_compiler::Loaded::File(tessera_compiler::SourceFile::new(
        "workloads.yaml",
        "apiVersion: tessera/v1alpha1\nkind: Workload\nmetadata: {name: serve}\nspec: {tenant: alpha, sloClass: urgent, pool: train, gpu: {count: 2}}\n",
    )));
    let c = tessera_compiler::compile_loaded(loaded);
    let policy = c.policy.clone().expect("the test policy compiles");
    assert_eq!(policy.workloads.len(), 1);
    let nodes = c.states[0].1.nodes.clone();
    (policy, nodes)
}

/// `text`, a tessera trace, replayed to the 300s horizon on [`fleet_with_committed`].
fn run_beside_committed(text: &str) -> RunReport {
    let (policy, nodes) = fleet_with_committed();
    let trace = parse_tessera_trace("t.yaml", text).unwrap();
    let config = ReplayConfig {
        horizon: Some(300),
        ..config()
    };
    run_with(&config, &policy, &nodes, &trace, None)
}

/// The report's GPU-hours are these GPU-seconds (to its six decimals).
fn assert_gpu_seconds(r: &RunReport, gpu_seconds: f64) {
    assert!(
        (r.gpu_hours_used - gpu_seconds / 3600.0).abs() < 1e-6,
        "{} GPU-hours, expected {gpu_seconds} GPU-seconds",
        r.gpu_hours_used
    );
}

#[test]
fn a_committed_workload_starts_once_and_holds_its_gpus() {
    // `serve` (committed, 2 GPUs) runs from 0s to the 300s horizon; `fill` (4 GPUs) from 10s
    // to 110s. Had the replay left `serve` out, every decision would admit it again and
    // nothing would run it: 4 × 100 GPU-seconds used instead of 2 × 300 more.
    let r = run_beside_committed(&one("fill", "alpha", "{count: 4}", 1, 5, 100));
    assert_eq!((r.workloads, r.started, r.never_started), (2, 2, 0));
    assert_eq!(r.queueing_delay.max, Some(5));
    assert_gpu_seconds(&r, 2.0 * 300.0 + 4.0 * 100.0);
}

#[test]
fn a_trace_that_names_a_committed_workload_replays_it_as_written() {
    // The trace's `alpha/serve` arrives at 20s and runs 30s: it is that workload, not a
    // second one.
    let r = run_beside_committed(&one("serve", "alpha", "{count: 2}", 1, 20, 30));
    assert_eq!((r.workloads, r.started), (1, 1));
    assert_gpu_seconds(&r, 2.0 * 30.0);
}
