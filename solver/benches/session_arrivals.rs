//! What one arrival costs a [`Session`] at the reference fleet, as the service's arrival path
//! (`reconciler/src/service/cycle/arrivals.rs`) drives it: arrivals decided one at a time
//! with `Session::admit`, a pass's admissions then carried out with `Session::carried_out`.
//!
//! The fleet is `tessera bench service`'s (`tessera_solver::bench_fleet`): 436 training
//! nodes of 8 H100, 64 MIG nodes cut in seven 1g instances per GPU, 290 projects with
//! guarantees that split each pool evenly; submissions are one-GPU training jobs and 1g
//! inference replicas in proportion to each pool's capacity, tenants in turn.
//!
//! - burst: a session opened on the empty fleet takes `--running` arrivals (5,000 by
//!   default) in passes of `--pass` (256, the arrival path's most), each pass carried out;
//!   the admissions a second, and the cost per arrival at the start and end of the burst.
//! - steady: a session opened (one full cycle) on the fleet the burst left, then `--steady`
//!   arrivals (200) in passes of 1, 16 and 100, each pass carried out: the cost per arrival
//!   of `admit` and per pass of `carried_out`, median and 99th percentile.
//! - agreement: every decision of the session after the steady passes against the full
//!   heuristic cycle on the snapshot it stands for.
//!
//! Figures only, no assertion on time. `cargo bench --workspace --bench session_arrivals`;
//! `-- --nodes N --running R` for another size. Profile with `perf record -g` on the built
//! binary (the release profile keeps line tables).

// The production binaries' allocator, so that the figures describe what users run.
#[global_allocator]
static ALLOCATOR: tessera_alloc::Allocator = tessera_alloc::Allocator;

use std::time::Instant;

use tessera_compiler::model::{ClusterStateSpec, PendingWorkload, RunningWorkload};
use tessera_compiler::{CompiledPolicy, SourceFile, compile};
use tessera_solver::Solver as _;
use tessera_solver::bench_fleet::{self, Shape, Submissions};
use tessera_solver::session::{Admission, FullCycle, Session};
use tessera_solver::{Outcome, SolveOptions};

/// The service benchmark's policy, and its nodes as a snapshot with nothing running (as JSON,
/// which is YAML, so that the snapshot is read as any other).
fn sources(shape: Shape) -> Vec<SourceFile> {
    let state = serde_json::json!({
        "apiVersion": "tessera/v1alpha1",
        "kind": "ClusterState",
        "metadata": {"name": "fleet"},
        "spec": {
            "observedAt": "2026-11-20T08:00:00Z",
            "nodes": bench_fleet::nodes(shape),
        },
    });
    vec![
        SourceFile::new("policy.yaml", bench_fleet::policy(shape)),
        SourceFile::new("state.yaml", state.to_string()),
    ]
}

/// The next submission, named by its number, waiting since `at`.
fn arrival(subs: &mut Submissions, at: jiff::Timestamp) -> PendingWorkload {
    let name = format!("w{}", subs.issued());
    PendingWorkload {
        name,
        spec: subs.next_spec(),
        submitted_at: at,
    }
}

/// What one pass cost: each arrival's `admit`, then the pass's `carried_out`, in seconds.
struct Pass {
    admits: Vec<f64>,
    carried: f64,
    admitted: usize,
}

/// Decides `arrivals` one at a time and carries the admitted ones out, as one pass of the
/// arrival path does; the runs started are appended to `runs`. An arrival the session would
/// decide before an admission of this pass, and those after it, are left in `arrivals` for
/// the next pass, as the arrival path leaves them.
fn pass(
    session: &mut Session,
    arrivals: &mut std::collections::VecDeque<PendingWorkload>,
    at: jiff::Timestamp,
    runs: &mut Vec<RunningWorkload>,
) -> Pass {
    let mut admits = Vec::with_capacity(arrivals.len());
    let mut started: Vec<RunningWorkload> = Vec::new();
    while let Some(a) = arrivals.pop_front() {
        let start = Instant::now();
        let answer = session.admit(&a).expect("a valid arrival");
        admits.push(start.elapsed().as_secs_f64());
        match answer {
            Admission::NeedsFullCycle(FullCycle::Reorders { before })
                if started
                    .iter()
                    .any(|r| format!("{}/{}", r.spec.tenant, r.name) == before) =>
            {
                arrivals.push_front(a);
                break;
            }
            Admission::Decided { decision, .. } => {
                if let Outcome::Admit { bindings, .. } = &decision.outcome {
                    started.push(RunningWorkload {
                        name: a.name.clone(),
                        spec: a.spec.running_as(bindings.len() as u32),
                        bindings: bindings.iter().map(|b| b.binding()).collect(),
                        started_at: at,
                        last_checkpoint_at: None,
                    });
                }
            }
            Admission::NeedsFullCycle(why) => panic!("the session asks for a full cycle: {why}"),
        }
    }
    let admitted = started.len();
    let snapshot = ClusterStateSpec {
        observed_at: at,
        nodes: Vec::new(),
        running: started.clone(),
        pending: Vec::new(),
        usage: None,
        reservations: Vec::new(),
        reconfigurations: Vec::new(),
    };
    let start = Instant::now();
    session
        .carried_out(&snapshot)
        .unwrap_or_else(|why| panic!("the pass is not carried out: {why}"));
    let carried = start.elapsed().as_secs_f64();
    runs.extend(started);
    Pass {
        admits,
        carried,
        admitted,
    }
}

fn quantile(times: &mut [f64], q: f64) -> f64 {
    times.sort_by(f64::total_cmp);
    times[((times.len() as f64 - 1.0) * q).round() as usize]
}

fn arg(args: &[String], flag: &str, default: usize) -> usize {
    match args.iter().position(|a| a == flag) {
        None => default,
        Some(i) => match args.get(i + 1).map(|v| v.parse::<usize>()) {
            Some(Ok(v)) if v > 0 => v,
            _ => {
                eprintln!("{flag} takes a positive integer");
                std::process::exit(2)
            }
        },
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let shape = Shape::new(arg(&args, "--nodes", 500), 10);
    let running = arg(&args, "--running", 5_000);
    let per_pass = arg(&args, "--pass", 256);
    let steady = arg(&args, "--steady", 200);
    let c = compile(&sources(shape));
    let policy: &CompiledPolicy = c
        .policy
        .as_ref()
        .unwrap_or_else(|| panic!("{:#?}", &c.diagnostics[..c.diagnostics.len().min(5)]));
    let empty = c.states[0].1.clone();
    let at = empty.observed_at;
    let options = SolveOptions::default();
    println!(
        "fleet: {} training nodes, {} MIG nodes, {} tenants",
        shape.train_nodes,
        shape.infer_nodes,
        policy.tenants.len()
    );

    // The burst, on a session opened on the empty fleet.
    let (mut session, _) = Session::new(policy, &empty, &options).expect("the fleet solves");
    let mut subs = Submissions::new(shape);
    let mut runs = Vec::new();
    let started = Instant::now();
    let (mut first, mut last) = (None, None);
    let mut carried = 0.0;
    let mut queue = std::collections::VecDeque::new();
    let mut passes = 0;
    while runs.len() < running {
        // As the arrival path reads them: what waits, up to a pass's most.
        while queue.len() < per_pass && runs.len() + queue.len() < running {
            queue.push_back(arrival(&mut subs, at));
        }
        let mut p = pass(&mut session, &mut queue, at, &mut runs);
        assert!(p.admitted > 0, "the burst fits the fleet");
        passes += 1;
        carried += p.carried;
        let median = quantile(&mut p.admits, 0.5);
        first.get_or_insert(median);
        last = Some(median);
    }
    let burst = started.elapsed().as_secs_f64();
    println!(
        "burst: {running} arrivals in {passes} passes of at most {per_pass}: {burst:.2} s, {:.0} admissions/s; admit median {:.3} ms in the first pass, {:.3} ms in the last; carried_out {:.1} ms a pass on average",
        running as f64 / burst,
        first.unwrap_or(0.0) * 1e3,
        last.unwrap_or(0.0) * 1e3,
        carried * 1e3 / passes as f64,
    );

    // Steady: a full cycle on the fleet the burst left, then passes of a few arrivals.
    let mut fleet = empty.clone();
    fleet.running = runs;
    fleet.running.sort_by(|a, b| a.name.cmp(&b.name));
    let start = Instant::now();
    let (mut session, _) = Session::new(policy, &fleet, &options).expect("the fleet solves");
    println!(
        "steady: a session opened on {} running in {:.1} ms",
        fleet.running.len(),
        start.elapsed().as_secs_f64() * 1e3
    );
    for size in [1, 16, 100] {
        let mut admits = Vec::new();
        let mut carried = Vec::new();
        let start = Instant::now();
        let mut decided = 0;
        let mut queue = std::collections::VecDeque::new();
        while decided < steady {
            while queue.len() < size {
                queue.push_back(arrival(&mut subs, at));
            }
            let before = queue.len();
            let p = pass(&mut session, &mut queue, at, &mut fleet.running);
            decided += before - queue.len();
            admits.extend(p.admits);
            carried.push(p.carried);
        }
        let total = start.elapsed().as_secs_f64();
        println!(
            "  passes of {size:>3}: {decided} arrivals in {:.1} ms ({:.0} a second); admit median {:.3} ms, p99 {:.3} ms; carried_out median {:.3} ms, p99 {:.3} ms a pass",
            total * 1e3,
            decided as f64 / total,
            quantile(&mut admits, 0.5) * 1e3,
            quantile(&mut admits, 0.99) * 1e3,
            quantile(&mut carried, 0.5) * 1e3,
            quantile(&mut carried, 0.99) * 1e3,
        );
    }

    // What the session stands for at the end: the fleet with every run, nothing waiting.
    fleet.running.sort_by(|a, b| a.name.cmp(&b.name));
    let problem = tessera_solver::Problem::new(policy, &fleet, None).expect("the fleet solves");
    let full = tessera_solver::Heuristic.solve(&problem, std::time::Duration::ZERO);
    if session.decisions() == full.workloads {
        println!(
            "agreement: every one of {} decisions agrees with the full cycle",
            full.workloads.len()
        );
    } else {
        println!("agreement: the session DIFFERS from the full cycle");
        std::process::exit(1);
    }
}
