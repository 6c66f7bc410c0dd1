//! What one arrival costs a [`Session`] at the reference fleet, as the service's arrival path
//! (`reconciler/src/service/cycle/arrivals.rs`) drives it: arrivals decided one at a time
//! with `Session::admit`, a pass's admissions then carried out with `Session::carried_out`.
//!
//! The fleet is `tessera bench service`'s (`src/cmd/service_bench/fleet.rs`): 436 training
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

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use tessera_compiler::model::{ClusterStateSpec, GpuRequest, PendingWorkload, RunningWorkload};
use tessera_compiler::model::{Topology, WorkloadSpec};
use tessera_compiler::units::{Bytes, Millicores};
use tessera_compiler::{CompiledPolicy, SourceFile, compile};
use tessera_solver::Solver as _;
use tessera_solver::session::{Admission, FullCycle, Session};
use tessera_solver::{Outcome, SolveOptions};

const PROJECTS_PER_ORG: usize = 29;

struct Shape {
    train_nodes: usize,
    infer_nodes: usize,
    orgs: usize,
}

impl Shape {
    fn new(nodes: usize) -> Shape {
        let infer_nodes = ((nodes * 64) as f64 / 500.0).round().max(1.0) as usize;
        Shape {
            train_nodes: nodes.saturating_sub(infer_nodes).max(1),
            infer_nodes,
            orgs: 10,
        }
    }

    fn projects(&self) -> Vec<String> {
        (0..PROJECTS_PER_ORG)
            .flat_map(|p| (0..self.orgs).map(move |o| format!("p-{o}-{p}")))
            .collect()
    }
}

/// The service benchmark's policy and the nodes as a snapshot with nothing running.
fn sources(shape: &Shape) -> Vec<SourceFile> {
    let train = shape.train_nodes * 8;
    let infer = shape.infer_nodes * 8;
    let org_train = train / shape.orgs;
    let org_slices = infer * 7 / shape.orgs;
    let sevenths = |slices: usize| format!("{:.6}", slices as f64 / 7.0);
    let h = "apiVersion: tessera/v1alpha1\n";
    let mut s = String::new();
    let _ = write!(
        s,
        "{h}kind: PriorityTiers\nmetadata: {{name: tiers}}\nspec: {{tiers: [{{name: serving, value: 1000}}, {{name: batch, value: 100}}]}}\n---\n\
         {h}kind: SloClass\nmetadata: {{name: serving}}\nspec: {{tier: serving, preemptible: false, isolation: {{minimum: mig}}}}\n---\n\
         {h}kind: SloClass\nmetadata: {{name: training}}\nspec: {{tier: batch, preemptible: true, isolation: {{minimum: exclusive}}, preemption: {{signal: SIGUSR1, gracePeriod: 5m, minRuntime: 30m}}}}\n---\n\
         {h}kind: MigLayout\nmetadata: {{name: all-1g}}\nspec: {{gpuModel: H100-SXM5-80GB, instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}}\n---\n\
         {h}kind: Pool\nmetadata: {{name: train}}\nspec: {{gpuModel: H100-SXM5-80GB, sharing: exclusive, capacity: {{nodes: {}, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}}}}\n---\n\
         {h}kind: Pool\nmetadata: {{name: infer}}\nspec: {{gpuModel: H100-SXM5-80GB, sharing: mig, migLayouts: [all-1g], capacity: {{nodes: {}, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}}}}\n---\n\
         {h}kind: Tenant\nmetadata: {{name: root}}\nspec: {{guarantee: {{train: {train}, infer: {infer}}}, sloClasses: [serving, training]}}\n",
        shape.train_nodes, shape.infer_nodes,
    );
    for o in 0..shape.orgs {
        let _ = write!(
            s,
            "---\n{h}kind: Tenant\nmetadata: {{name: org-{o}}}\nspec: {{parent: root, guarantee: {{train: {org_train}, infer: {}}}, trustDomain: org-{o}}}\n",
            sevenths(org_slices)
        );
        for p in 0..PROJECTS_PER_ORG {
            let _ = write!(
                s,
                "---\n{h}kind: Tenant\nmetadata: {{name: p-{o}-{p}}}\nspec: {{parent: org-{o}, guarantee: {{train: {}, infer: {}}}, weight: {}}}\n",
                org_train / PROJECTS_PER_ORG,
                sevenths(org_slices / PROJECTS_PER_ORG),
                1 + p % 3
            );
        }
    }
    let mut st = String::from(
        "apiVersion: tessera/v1alpha1\nkind: ClusterState\nmetadata: {name: fleet}\nspec:\n  observedAt: \"2026-11-20T08:00:00Z\"\n  nodes:\n",
    );
    for n in 0..shape.train_nodes {
        let _ = write!(
            st,
            "    - {{name: t{n}, pool: train, cpu: 192, memory: 2Ti, gpus: ["
        );
        for g in 0..8 {
            let sep = if g > 0 { ", " } else { "" };
            let _ = write!(
                st,
                "{sep}{{index: {g}, uuid: GPU-a{n:05x}{g:x}, model: H100-SXM5-80GB}}"
            );
        }
        st.push_str("]}\n");
    }
    for n in 0..shape.infer_nodes {
        let _ = write!(
            st,
            "    - {{name: m{n}, pool: infer, cpu: 192, memory: 2Ti, gpus: ["
        );
        for g in 0..8 {
            let sep = if g > 0 { ", " } else { "" };
            let _ = write!(
                st,
                "{sep}{{index: {g}, uuid: GPU-b{n:05x}{g:x}, model: H100-SXM5-80GB, mig: {{enabled: true}}, instances: ["
            );
            for i in 0..7 {
                let sep = if i > 0 { ", " } else { "" };
                let _ = write!(st, "{sep}{{profile: 1g.10gb, start: {i}}}");
            }
            st.push_str("]}");
        }
        st.push_str("]}\n");
    }
    st.push_str("  running: []\n  pending: []\n");
    vec![
        SourceFile::new("policy.yaml", s),
        SourceFile::new("state.yaml", st),
    ]
}

/// Submissions as the service benchmark makes them: kinds in proportion to each pool's
/// capacity, tenants in turn within each kind.
struct Submissions {
    projects: Vec<String>,
    train_share: f64,
    issued: usize,
    training: usize,
    serving: usize,
}

impl Submissions {
    fn new(shape: &Shape) -> Submissions {
        let train = (shape.train_nodes * 8) as f64;
        let slices = (shape.infer_nodes * 56) as f64;
        Submissions {
            projects: shape.projects(),
            train_share: train / (train + slices),
            issued: 0,
            training: 0,
            serving: 0,
        }
    }

    fn next(&mut self, at: jiff::Timestamp) -> PendingWorkload {
        let training = (self.training as f64) <= self.train_share * self.issued as f64;
        let name = format!("w{}", self.issued);
        self.issued += 1;
        let turn = if training {
            &mut self.training
        } else {
            &mut self.serving
        };
        let tenant = self.projects[*turn % self.projects.len()].clone();
        *turn += 1;
        PendingWorkload {
            name,
            spec: WorkloadSpec {
                tenant,
                slo_class: if training { "training" } else { "serving" }.to_owned(),
                pool: Some(if training { "train" } else { "infer" }.to_owned()),
                replicas: 1,
                min_member: None,
                gpu: GpuRequest {
                    count: training.then_some(1),
                    mig_profile: (!training).then(|| "1g.10gb".to_owned()),
                    fraction: None,
                },
                cpu: Millicores(if training { 8_000 } else { 2_000 }),
                memory: Bytes(if training { 64 << 30 } else { 16 << 30 }),
                topology: Topology::default(),
                max_duration: None,
                command: Vec::new(),
                env: BTreeMap::new(),
            },
            submitted_at: at,
        }
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
    let shape = Shape::new(arg(&args, "--nodes", 500));
    let running = arg(&args, "--running", 5_000);
    let per_pass = arg(&args, "--pass", 256);
    let steady = arg(&args, "--steady", 200);
    let c = compile(&sources(&shape));
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
    let mut subs = Submissions::new(&shape);
    let mut runs = Vec::new();
    let started = Instant::now();
    let (mut first, mut last) = (None, None);
    let mut carried = 0.0;
    let mut queue = std::collections::VecDeque::new();
    let mut passes = 0;
    while runs.len() < running {
        // As the arrival path reads them: what waits, up to a pass's most.
        while queue.len() < per_pass && runs.len() + queue.len() < running {
            queue.push_back(subs.next(at));
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
                queue.push_back(subs.next(at));
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
