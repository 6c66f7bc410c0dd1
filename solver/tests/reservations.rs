//! Reservations with backfill, over many cycles (see `solver/src/heuristic/reserve.rs`).
//!
//! The fleet: one exclusive pool `train` of 40 nodes × 8 GPUs, one priority, a root tenant and
//! two children with no guarantee: `lab` runs the small jobs, `hpc` the gang (which comes first
//! in the queue: it has borrowed less). At t0 the pool is filled with 320 one-GPU jobs of 10 to 50
//! minutes; a minute later a 256-GPU gang (32 × 8) arrives, and every minute 12 more one-GPU
//! jobs arrive, more than the jobs that end.

mod common;

use std::collections::BTreeMap;

use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::{
    ClusterStateSpec, GpuRequest, PendingWorkload, Topology, TopologyMode, WorkloadSpec,
};
use tessera_compiler::units::{Bytes, Duration, Gpus, Millicores};
use tessera_solver::decision::{Decision, Outcome, PreemptReason, Reason};
use tessera_solver::{SolveOptions, solve};

use common::cycles::Cycles;
use common::{compile_with, node, state};

const NODES: u32 = 40;
/// Seconds between cycles.
const TICK: i64 = 60;
/// Run times of the one-GPU jobs: 10 to 50 minutes.
const MIN_RUN: i64 = 600;
const MAX_RUN: i64 = 3000;
/// One-GPU jobs arriving per cycle (about 10.7 end per cycle on average).
const ARRIVALS: u32 = 12;

fn policy(max_gpus: Option<u32>) -> String {
    let reservations = max_gpus.map_or(String::new(), |m| {
        format!("  reservations: {{maxGpus: {m}}}\n")
    });
    format!(
        r#"apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {{name: tiers}}
spec:
  tiers:
    - {{name: normal, value: 100}}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {{name: batch}}
spec: {{tier: normal, preemptible: false, isolation: {{minimum: exclusive}}}}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {{name: scavenger}}
spec:
  tier: normal
  preemptible: true
  isolation: {{minimum: exclusive}}
  preemption: {{gracePeriod: 1m, minRuntime: 0s}}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {{name: train}}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {{nodes: {NODES}, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}}
  sharing: exclusive
{reservations}---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: org}}
spec:
  sloClasses: [batch, scavenger]
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: lab}}
spec: {{parent: org}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: hpc}}
spec: {{parent: org}}
"#
    )
}

fn fleet(max_gpus: Option<u32>) -> (CompiledPolicy, ClusterStateSpec) {
    let nodes: Vec<String> = (0..NODES)
        .map(|i| node(&format!("n{i:02}"), "train", 8))
        .collect();
    compile_with(&policy(max_gpus), &state(&nodes, "", ""))
}

fn spec(class: &str, replicas: u32, count: u32, max_duration: Option<i64>) -> WorkloadSpec {
    WorkloadSpec {
        tenant: "lab".into(),
        slo_class: class.into(),
        pool: None,
        replicas,
        min_member: None,
        gpu: GpuRequest {
            count: Some(count),
            mig_profile: None,
            fraction: None,
        },
        cpu: Millicores(1000),
        memory: Bytes(1 << 30),
        topology: Topology {
            same_nvlink_domain: TopologyMode::None,
        },
        max_duration: max_duration.map(|d| Duration(d as u64)),
        command: Vec::new(),
        env: BTreeMap::new(),
    }
}

/// A gang of `replicas` × 8 GPUs of tenant `hpc`.
fn gang_spec(replicas: u32) -> WorkloadSpec {
    WorkloadSpec {
        tenant: "hpc".into(),
        ..spec("batch", replicas, 8, None)
    }
}

fn job(name: String, spec: WorkloadSpec) -> PendingWorkload {
    PendingWorkload {
        name,
        spec,
        // Set when the cycle submits it.
        submitted_at: jiff::Timestamp::UNIX_EPOCH,
    }
}

/// A run time of 10 to 50 minutes, spread deterministically.
fn run_time(i: u32) -> i64 {
    MIN_RUN + i64::from(i.wrapping_mul(7919) % (MAX_RUN - MIN_RUN + 1) as u32)
}

/// What each scenario adds every cycle.
#[derive(Clone, Copy)]
struct Streams {
    /// One-GPU jobs that declare their run time as `maxDuration` (the fill included).
    declared: bool,
    /// The stream's class.
    class: &'static str,
    /// Short jobs (2 minutes, declared) arriving per cycle besides the stream.
    short: u32,
}

const PLAIN: Streams = Streams {
    declared: false,
    class: "batch",
    short: 0,
};

/// The fill, the gang a cycle later, then `cycles` cycles of arrivals. Returns the driver; the
/// gang is `gang`.
fn drive(max_gpus: Option<u32>, streams: Streams, cycles: u32) -> Cycles {
    let (policy, state) = fleet(max_gpus);
    let mut c = Cycles::new(policy, state);
    let declared = |run: i64| streams.declared.then_some(run);
    for i in 0..NODES * 8 {
        let run = run_time(i);
        c.submit(
            job(format!("fill-{i:03}"), spec("batch", 1, 1, declared(run))),
            Some(run),
        );
    }
    let d = c.cycle();
    assert!(
        d.workloads
            .iter()
            .all(|w| matches!(w.outcome, Outcome::Admit { .. })),
        "the fill takes the whole pool"
    );
    let mut n = 0u32;
    for k in 0..cycles {
        c.advance(TICK);
        if k == 0 {
            c.submit(job("gang".into(), gang_spec(32)), None);
        }
        for _ in 0..ARRIVALS {
            let run = run_time(NODES * 8 + n);
            c.submit(
                job(
                    format!("s-{n:05}"),
                    spec(streams.class, 1, 1, declared(run)),
                ),
                Some(run),
            );
            n += 1;
        }
        for j in 0..streams.short {
            c.submit(
                job(format!("t-{k:03}-{j}"), spec("batch", 1, 1, Some(2 * TICK))),
                Some(2 * TICK),
            );
        }
        c.cycle();
        if started(c.decisions.last().expect("decided")) {
            break;
        }
    }
    c
}

fn gang(d: &Decision) -> &Outcome {
    &d.workloads
        .iter()
        .find(|w| w.name == "gang")
        .expect("the gang is decided")
        .outcome
}

fn started(d: &Decision) -> bool {
    d.workloads
        .iter()
        .any(|w| w.name == "gang" && matches!(w.outcome, Outcome::Admit { .. }))
}

/// The cycle (index into `decisions`) where the gang started.
fn start_cycle(c: &Cycles) -> Option<usize> {
    c.decisions.iter().position(started)
}

/// Prints the scenario's figures (BENCHMARKS.md records them: run with `--nocapture`): the
/// cycle the gang started, the GPU-minutes held idle until then, the pool's mean allocation
/// over those cycles and the backfill preempted for the gang.
fn report(scenario: &str, c: &Cycles) {
    let until = start_cycle(c).unwrap_or(c.decisions.len());
    let waiting = &c.decisions[1..until.max(1)];
    let idle: f64 = waiting
        .iter()
        .flat_map(|d| &d.pools)
        .map(|p| p.reserved_idle.as_f64() * TICK as f64 / 60.0)
        .sum();
    let allocation = if waiting.is_empty() {
        0.0
    } else {
        waiting
            .iter()
            .flat_map(|d| &d.pools)
            .map(|p| p.allocation)
            .sum::<f64>()
            / waiting.len() as f64
    };
    let preempted = c
        .decisions
        .iter()
        .flat_map(|d| &d.workloads)
        .filter(|w| {
            matches!(
                &w.outcome,
                Outcome::Preempt {
                    reason: PreemptReason::Reservation { .. },
                    ..
                }
            )
        })
        .count();
    let start = start_cycle(c).map_or_else(|| "never".to_owned(), |k| format!("cycle {k}"));
    eprintln!(
        "| {scenario} | {start} | {idle:.0} | {:.1} % | {preempted} |",
        allocation * 100.0
    );
}

#[test]
fn without_reservations_the_gang_starves() {
    let c = drive(None, PLAIN, 55);
    report("no `reservations` knob (55 cycles)", &c);
    assert_eq!(start_cycle(&c), None, "a gang starts without reservations");
    for d in &c.decisions {
        assert!(d.reservations.is_empty());
        assert!(d.pools.iter().all(|p| p.reserved_idle == Gpus::ZERO));
    }
    for d in &c.decisions[1..] {
        assert!(
            matches!(gang(d), Outcome::Pending { reason, .. } if !matches!(reason, Reason::Reserving { .. })),
            "{:?}",
            gang(d)
        );
    }
}

#[test]
fn a_reservation_starts_the_gang_within_the_longest_run() {
    let c = drive(Some(256), PLAIN, 60);
    report("`maxGpus: 256`, no run time declared", &c);
    let k = start_cycle(&c).expect("the gang starts");
    // Decision 0 is the fill, 1 the gang's first cycle. Once it holds its nodes no new work
    // lands there, so it starts as soon as the longest job it waits for ends.
    let arrived = c.decisions[1].now.as_second();
    let start = c.decisions[k].now.as_second();
    assert!(
        start - arrived <= MAX_RUN,
        "the gang waited {} s, more than the longest run",
        start - arrived
    );
    let mut held = 0;
    let mut reserved_for = false;
    for d in &c.decisions[1..k] {
        let Outcome::Pending { reason } = gang(d) else {
            panic!("the gang neither waits nor starts");
        };
        let Reason::Reserving {
            held: now_held,
            needed,
            nodes,
            eta,
            ..
        } = reason
        else {
            panic!("the gang waits without reserving: {reason}");
        };
        assert_eq!(*needed, 256);
        assert_eq!(nodes.len(), 32);
        // Nobody in the way declares an end.
        assert_eq!(*eta, None);
        assert!(
            reason
                .to_string()
                .starts_with(&format!("reserving {now_held}/256 GPUs in pool `train`"))
        );
        assert!(*now_held >= held, "the reservation shrank");
        held = *now_held;
        // The reservation is the decision's, with its nodes, and its idle GPUs are reported.
        assert_eq!(d.reservations.len(), 1);
        let r = &d.reservations[0];
        assert_eq!(&r.nodes, nodes);
        assert_eq!(r.since, c.decisions[1].now, "the reservation moved");
        assert_eq!(r.backfilled, 0);
        let train = d.pools.iter().find(|p| p.pool == "train").unwrap();
        assert_eq!(train.reserved_idle, Gpus::whole(i64::from(r.held_idle)));
        // Nothing but the fill runs on the held nodes.
        for w in &d.workloads {
            if let Outcome::Admit { bindings, .. } = &w.outcome {
                assert!(
                    bindings.iter().all(|b| !r.nodes.contains(&b.node)),
                    "{} admitted on a held node",
                    w.name
                );
            }
            if let Outcome::Pending {
                reason: Reason::ReservedFor { gang, .. },
                ..
            } = &w.outcome
            {
                assert_eq!(gang, "hpc/gang");
                reserved_for = true;
            }
        }
    }
    assert!(held > 0, "the reservation never held anything");
    assert!(reserved_for, "no job was told that capacity is reserved");
    assert!(c.decisions[k].reservations.is_empty());
}

/// The jobs whose `maxDuration` ends before the eta run in the held capacity, and the gang
/// starts in the same cycle as without them.
#[test]
fn backfill_never_delays_the_gang() {
    let declared = Streams {
        declared: true,
        ..PLAIN
    };
    let base = drive(Some(256), declared, 60);
    let with = drive(
        Some(256),
        Streams {
            short: 4,
            ..declared
        },
        60,
    );
    report("same, every job declares `maxDuration`", &base);
    report("same, plus 4 two-minute jobs per cycle", &with);
    let k = start_cycle(&base).expect("the gang starts");
    assert_eq!(
        start_cycle(&with),
        Some(k),
        "backfill moved the gang's start"
    );
    // Every run is declared: the eta is known, and the gang starts at the first cycle after it.
    let eta = base.decisions[1].reservations[0]
        .eta
        .map(|e| e.as_second())
        .expect("an eta");
    let start = base.decisions[k].now.as_second();
    assert!(
        start >= eta && start < eta + TICK,
        "start {start}, eta {eta}"
    );
    // Only work declared to end before the eta ran on the held nodes meanwhile, short jobs
    // among it.
    let mut short = 0;
    for d in &with.decisions[1..k] {
        let r = &d.reservations[0];
        let eta = r.eta.unwrap().as_second();
        for w in &d.workloads {
            if let Outcome::Admit { bindings, .. } = &w.outcome
                && bindings.iter().any(|b| r.nodes.contains(&b.node))
            {
                let declared = match w.name.strip_prefix("s-") {
                    Some(n) => run_time(NODES * 8 + n.parse::<u32>().unwrap()),
                    None => 2 * TICK,
                };
                assert!(
                    d.now.as_second() + declared <= eta,
                    "{} ends after the eta",
                    w.name
                );
                short += u32::from(w.name.starts_with("t-"));
            }
        }
    }
    assert!(short > 0, "no short job ran in the held capacity");
}

/// Preemptible jobs run in the held capacity and are preempted when the gang can start.
#[test]
fn preemptible_backfill_yields() {
    let c = drive(
        Some(256),
        Streams {
            class: "scavenger",
            ..PLAIN
        },
        60,
    );
    report("`maxGpus: 256`, the stream preemptible", &c);
    let k = start_cycle(&c).expect("the gang starts");
    let arrived = c.decisions[1].now.as_second();
    let start = c.decisions[k].now.as_second();
    assert!(start - arrived <= MAX_RUN, "waited {} s", start - arrived);
    assert!(
        c.decisions[1..k]
            .iter()
            .any(|d| d.reservations[0].backfilled > 0),
        "nothing backfilled"
    );
    let d = &c.decisions[k];
    let Outcome::Admit { bindings, .. } = gang(d) else {
        unreachable!()
    };
    let gang_nodes: Vec<&str> = bindings.iter().map(|b| b.node.as_str()).collect();
    let before = &c.decisions[k - 1];
    let mut yielded = 0;
    for w in &d.workloads {
        if let Outcome::Preempt { reason, .. } = &w.outcome {
            assert_eq!(
                reason,
                &PreemptReason::Reservation {
                    for_workload: "hpc/gang".into()
                }
            );
            assert!(w.name.starts_with("s-"), "{} yielded", w.name);
            let was = before
                .workloads
                .iter()
                .find(|x| x.name == w.name)
                .map(|x| &x.outcome);
            let bound: Vec<&str> = match was {
                Some(Outcome::Admit { bindings, .. } | Outcome::Keep { bindings }) => {
                    bindings.iter().map(|b| b.node.as_str()).collect()
                }
                other => panic!("{} was not running: {other:?}", w.name),
            };
            assert!(bound.iter().all(|n| gang_nodes.contains(n)));
            yielded += 1;
        }
    }
    assert!(yielded > 0, "no backfill yielded");
}

/// At most `maxGpus` are held: a gang (here of 128 GPUs) that would exceed it waits without
/// reserving; without the knob nothing is held.
#[test]
fn max_gpus_bounds_what_is_held() {
    let cases = [
        (None, 0),
        (Some(127), 0),
        (Some(128), 1),
        (Some(255), 1),
        (Some(256), 2),
    ];
    for (max, reserving) in cases {
        let (policy, mut state) = fleet(max);
        let now = state.observed_at.as_second();
        let mut c = Cycles::new(policy.clone(), state.clone());
        for i in 0..NODES * 8 {
            c.submit(job(format!("fill-{i:03}"), spec("batch", 1, 1, None)), None);
        }
        c.cycle();
        state = c.state.clone();
        for g in ["gang-a", "gang-b"] {
            let mut w = job(g.into(), gang_spec(16));
            w.submitted_at = tessera_solver::problem::unix(now);
            state.pending.push(w);
        }
        let d = solve(&policy, &state, &SolveOptions::default()).unwrap();
        assert_eq!(d.reservations.len(), reserving, "maxGpus {max:?}");
        let total: u32 = d.reservations.iter().map(|r| r.needed).sum();
        assert!(total <= max.unwrap_or(0));
        let waiting_reserving = d
            .workloads
            .iter()
            .filter(|w| {
                matches!(
                    w.outcome,
                    Outcome::Pending {
                        reason: Reason::Reserving { .. },
                        ..
                    }
                )
            })
            .count();
        assert_eq!(waiting_reserving, reserving);
        // Two reservations never share a node.
        if let [a, b] = &d.reservations[..] {
            assert!(a.nodes.iter().all(|n| !b.nodes.contains(n)));
        }
    }
}
