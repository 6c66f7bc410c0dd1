//! The reference fleet: 500 nodes × 8 H100 (64 of them MIG), 300 tenants, 5,000 running
//! and 2,000 pending workloads, generated deterministically. Prints the cold cycle (compile the
//! YAML, resolve, solve), the warm cycle (solve from the compiled policy and parsed snapshot),
//! one inference admission as a full cycle, the same arrivals decided incrementally by a
//! [`Session`] held on the steady fleet (the first decision applied), and peak memory. Figures
//! only; no assertion on time. `cargo bench -p tessera-solver --bench reference_fleet`
//!
//! `-- --scale X` grows the fleet X times (nodes × X in the same training/MIG proportion,
//! organisations × √X, so tenants grow slower than nodes as they do in a real company; the
//! queue max(2,000, 400·X)); `--nodes N`, `--orgs K` and `--pending P` set one dimension
//! exactly. At 12.5 it is the 50,000-GPU fleet: 6,250 nodes, 35 organisations (1,051 tenants),
//! about 64,000 running and 5,000 pending. `--runs N` measures each figure N times (3 by
//! default).

// The production binaries' allocator, so that the figures describe what users run.
#[global_allocator]
static ALLOCATOR: tessera_alloc::Allocator = tessera_alloc::Allocator;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use tessera_compiler::model::{
    ClusterStateSpec, GpuRequest, PendingWorkload, Topology, WorkloadSpec,
};
use tessera_compiler::units::{Bytes, Millicores};
use tessera_compiler::{SourceFile, compile};
use tessera_solver::Solver as _;
use tessera_solver::carry::carry_out;
use tessera_solver::decision::Decision;
use tessera_solver::session::{Admission, Session};
use tessera_solver::{Outcome, SolveOptions, solve};

const PROJECTS_PER_ORG: usize = 29;

/// The fleet's dimensions; `Shape::default()` is the reference fleet.
#[derive(Clone, Copy, Debug)]
struct Shape {
    train_nodes: usize,
    infer_nodes: usize,
    orgs: usize,
    pending: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            train_nodes: 436,
            infer_nodes: 64,
            orgs: 10,
            pending: 2000,
        }
    }
}

impl Shape {
    fn scaled(x: f64) -> Shape {
        let nodes = (500.0 * x).round() as usize;
        let infer_nodes = ((nodes * 64) as f64 / 500.0).round() as usize;
        Shape {
            train_nodes: nodes - infer_nodes,
            infer_nodes,
            orgs: ((10.0 * x.sqrt()).round() as usize).max(1),
            pending: (400.0 * x).round().max(2000.0) as usize,
        }
    }

    fn nodes(&self) -> usize {
        self.train_nodes + self.infer_nodes
    }

    /// Reads `--scale X`, then any of `--nodes N`, `--orgs K`, `--pending P` on top.
    fn from_args(args: &[String]) -> Shape {
        let value = |flag: &str| {
            args.iter().position(|a| a == flag).map(|i| {
                match args.get(i + 1).map(|v| v.parse::<f64>()) {
                    Some(Ok(v)) if v > 0.0 => v,
                    _ => {
                        eprintln!("{flag} takes a positive number");
                        std::process::exit(2)
                    }
                }
            })
        };
        let mut shape = value("--scale").map_or_else(Shape::default, Shape::scaled);
        if let Some(n) = value("--nodes") {
            let n = n as usize;
            shape.infer_nodes = ((n * 64) as f64 / 500.0).round() as usize;
            shape.train_nodes = n - shape.infer_nodes;
        }
        if let Some(k) = value("--orgs") {
            shape.orgs = k as usize;
        }
        if let Some(p) = value("--pending") {
            shape.pending = p as usize;
        }
        shape
    }
}

/// A small deterministic generator (SplitMix64): the fleet is the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn policy(shape: Shape) -> String {
    let Shape {
        train_nodes,
        infer_nodes,
        orgs,
        ..
    } = shape;
    // Guarantees split the pools evenly, org by org and project by project, as at 1×.
    let org_train = train_nodes * 8 / orgs;
    let org_infer = infer_nodes * 8 / orgs;
    let project_train = org_train / PROJECTS_PER_ORG;
    let project_infer = (org_infer / PROJECTS_PER_ORG).max(1);
    let h = "apiVersion: tessera/v1alpha1\n";
    let mut s = String::new();
    let _ = write!(
        s,
        "{h}kind: PriorityTiers\nmetadata: {{name: tiers}}\nspec: {{tiers: [{{name: serving, value: 1000}}, {{name: batch, value: 100}}]}}\n---\n\
         {h}kind: SloClass\nmetadata: {{name: serving}}\nspec: {{tier: serving, preemptible: false, isolation: {{minimum: mig}}}}\n---\n\
         {h}kind: SloClass\nmetadata: {{name: training}}\nspec: {{tier: batch, preemptible: true, isolation: {{minimum: exclusive}}, preemption: {{signal: SIGUSR1, gracePeriod: 5m, minRuntime: 30m}}}}\n---\n\
         {h}kind: MigLayout\nmetadata: {{name: all-1g}}\nspec: {{gpuModel: H100-SXM5-80GB, instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}}\n---\n\
         {h}kind: MigLayout\nmetadata: {{name: halves}}\nspec: {{gpuModel: H100-SXM5-80GB, instances: [4g.40gb, 3g.40gb]}}\n---\n\
         {h}kind: Pool\nmetadata: {{name: train}}\nspec: {{gpuModel: H100-SXM5-80GB, sharing: exclusive, capacity: {{nodes: {train_nodes}, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}}}}\n---\n\
         {h}kind: Pool\nmetadata: {{name: infer}}\nspec: {{gpuModel: H100-SXM5-80GB, sharing: mig, migLayouts: [all-1g, halves], capacity: {{nodes: {infer_nodes}, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}}}}\n---\n\
         {h}kind: Tenant\nmetadata: {{name: root}}\nspec: {{guarantee: {{train: {}, infer: {}}}, sloClasses: [serving, training]}}\n",
        train_nodes * 8,
        infer_nodes * 8
    );
    for o in 0..orgs {
        let _ = write!(
            s,
            "---\n{h}kind: Tenant\nmetadata: {{name: org-{o}}}\nspec: {{parent: root, guarantee: {{train: {org_train}, infer: {org_infer}}}, trustDomain: org-{o}}}\n"
        );
        for p in 0..PROJECTS_PER_ORG {
            let _ = write!(
                s,
                "---\n{h}kind: Tenant\nmetadata: {{name: p-{o}-{p}}}\nspec: {{parent: org-{o}, guarantee: {{train: {project_train}, infer: {project_infer}}}, weight: {}}}\n",
                1 + p % 3
            );
        }
    }
    s
}

fn project(rng: &mut Rng, orgs: usize) -> String {
    format!("p-{}-{}", rng.below(orgs), rng.below(PROJECTS_PER_ORG))
}

/// The snapshot: training nodes filled with gangs of 1-8 GPUs (a few nodes left free), MIG
/// GPUs cut in seven 1g instances each held by an inference replica, and a queue.
fn state(shape: Shape, pending_extra: Option<&str>) -> (String, usize, usize) {
    let Shape {
        train_nodes,
        infer_nodes,
        orgs,
        pending: queued,
    } = shape;
    let mut rng = Rng(20_261_122);
    let mut s = String::from(
        "apiVersion: tessera/v1alpha1\nkind: ClusterState\nmetadata: {name: reference}\nspec:\n  observedAt: \"2026-11-20T08:00:00Z\"\n  nodes:\n",
    );
    for n in 0..train_nodes {
        let _ = write!(
            s,
            "    - {{name: t{n}, pool: train, cpu: 192, memory: 2Ti, gpus: ["
        );
        for g in 0..8 {
            let sep = if g > 0 { ", " } else { "" };
            let _ = write!(
                s,
                "{sep}{{index: {g}, uuid: GPU-a{n:04x}{g:x}, model: H100-SXM5-80GB}}"
            );
        }
        s.push_str("]}\n");
    }
    for n in 0..infer_nodes {
        let _ = writeln!(
            s,
            "    - name: m{n}\n      pool: infer\n      cpu: 192\n      memory: 2Ti\n      gpus:"
        );
        for g in 0..8 {
            let _ = write!(
                s,
                "        - {{index: {g}, uuid: GPU-b{n:04x}{g:x}, model: H100-SXM5-80GB, mig: {{enabled: true}}, instances: ["
            );
            for i in 0..7 {
                let sep = if i > 0 { ", " } else { "" };
                let _ = write!(s, "{sep}{{profile: 1g.10gb, start: {i}}}");
            }
            s.push_str("]}\n");
        }
    }
    s.push_str("  running:\n");
    let mut running = 0;
    for n in 0..train_nodes {
        if n % 20 == 19 {
            continue; // a free node now and then
        }
        let mut g = 0;
        while g < 8 {
            let size = [1, 1, 1, 1, 2, 2, 4, 8][rng.below(8)].min(8 - g);
            let gpus: Vec<String> = (g..g + size).map(|x| x.to_string()).collect();
            let _ = writeln!(
                s,
                "    - {{name: train-{running}, spec: {{tenant: {}, sloClass: training, gpu: {{count: {size}}}, cpu: 8, memory: 64Gi}}, bindings: [{{node: t{n}, gpus: [{}]}}], startedAt: \"2026-11-20T0{}:00:00Z\"}}",
                project(&mut rng, orgs),
                gpus.join(", "),
                rng.below(7)
            );
            running += 1;
            g += size;
        }
    }
    for n in 0..infer_nodes {
        for g in 0..8 {
            for i in 0..7 {
                if rng.below(50) == 0 {
                    continue; // some instances idle
                }
                let _ = writeln!(
                    s,
                    "    - {{name: serve-{running}, spec: {{tenant: {}, sloClass: serving, gpu: {{migProfile: 1g.10gb}}, cpu: 2, memory: 16Gi}}, bindings: [{{node: m{n}, gpus: [{g}], migStart: {i}}}], startedAt: \"2026-11-20T06:00:00Z\"}}",
                    project(&mut rng, orgs),
                );
                running += 1;
            }
        }
    }
    s.push_str("  pending:\n");
    let mut pending = 0;
    for i in 0..queued {
        let (class, gpu) = if i % 4 == 0 {
            ("serving", "{migProfile: 1g.10gb}".to_owned())
        } else {
            (
                "training",
                format!("{{count: {}}}", [1, 2, 4, 8][rng.below(4)]),
            )
        };
        let _ = writeln!(
            s,
            "    - {{name: queued-{i}, spec: {{tenant: {}, sloClass: {class}, gpu: {gpu}, cpu: 4, memory: 32Gi}}, submittedAt: \"2026-11-20T07:{:02}:00Z\"}}",
            project(&mut rng, orgs),
            i % 60
        );
        pending += 1;
    }
    if let Some(extra) = pending_extra {
        s.push_str(extra);
        pending += 1;
    }
    (s, running, pending)
}

/// Sorts `times` and gives its median, minimum and maximum.
fn spread(times: &mut [f64]) -> (f64, f64, f64) {
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[0], times[times.len() - 1])
}

fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l.trim_start_matches("VmHWM:").trim().to_owned())
        })
        .unwrap_or_else(|| "unavailable".to_owned())
}

/// Puts `state`'s running work in the order the service's snapshot gives it: by tenant,
/// then name. The pending queue keeps its order (its ties are broken by place in the list).
fn in_service_order(state: &mut ClusterStateSpec) {
    state
        .running
        .sort_by(|a, b| (&a.spec.tenant, &a.name).cmp(&(&b.spec.tenant, &b.name)));
}

/// The snapshot once `d` is carried out, preempted work gone rather than queued again (the
/// benchmark's arrivals come into a fleet at rest).
fn steady(before: &ClusterStateSpec, d: &Decision) -> ClusterStateSpec {
    let mut after = carry_out(before, d);
    let preempted: std::collections::BTreeSet<&str> = d
        .workloads
        .iter()
        .filter(|w| matches!(w.outcome, Outcome::Preempt { .. }))
        .map(|w| w.name.as_str())
        .collect();
    after
        .pending
        .retain(|p| !preempted.contains(p.name.as_str()));
    after.observed_at = before.observed_at;
    after
}

/// An arrival submitted at the snapshot's instant: `count` whole GPUs, or one 1g instance.
fn arrival(name: &str, tenant: &str, class: &str, count: Option<u32>, cpu: u64) -> PendingWorkload {
    PendingWorkload {
        name: name.to_owned(),
        spec: WorkloadSpec {
            tenant: tenant.to_owned(),
            slo_class: class.to_owned(),
            pool: None,
            replicas: 1,
            min_member: None,
            gpu: GpuRequest {
                count,
                mig_profile: count.is_none().then(|| "1g.10gb".to_owned()),
                fraction: None,
            },
            cpu: Millicores(cpu * 1000),
            memory: Bytes(16 << 30),
            topology: Topology::default(),
            max_duration: None,
            command: Vec::new(),
            env: BTreeMap::new(),
        },
        submitted_at: "2026-11-20T08:00:00Z".parse().expect("an instant"),
    }
}

fn main() {
    // `-- --fair-preemption`: the training pool lets borrowers preempt each other by fair share.
    let args: Vec<String> = std::env::args().collect();
    let fair = args.iter().any(|a| a == "--fair-preemption");
    let shape = Shape::from_args(&args);
    // `--runs N`: how many times each figure is measured (3 by default; 1 at the largest scales).
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1)?.parse::<usize>().ok())
        .unwrap_or(3)
        .max(1);
    let mut policy_text = policy(shape);
    if fair {
        policy_text = policy_text.replace(
            "sharing: exclusive,",
            "sharing: exclusive, preemption: {borrowers: FairShare},",
        );
    }
    let (state_text, running, pending) = state(shape, None);
    let sources = [
        SourceFile::new("policy.yaml", policy_text.clone()),
        SourceFile::new("state.yaml", state_text),
    ];
    let options = SolveOptions::default();

    let start = Instant::now();
    let mut c = compile(&sources);
    let compiling = start.elapsed().as_secs_f64();
    let compiled = c
        .policy
        .as_ref()
        .unwrap_or_else(|| panic!("{:#?}", &c.diagnostics[..c.diagnostics.len().min(5)]));
    let snapshot = &c.states[0].1;
    // Each figure is printed as soon as it is measured: at the largest scales a cycle is long.
    println!(
        "reference fleet: {} nodes ({} MIG, {} GPUs), {} tenants, {running} running, {pending} pending",
        shape.nodes(),
        shape.infer_nodes,
        shape.nodes() * 8,
        compiled.tenants.len()
    );
    let decision = solve(compiled, snapshot, &options).expect("the fleet solves");
    let cold = start.elapsed().as_secs_f64();
    let admitted = decision
        .workloads
        .iter()
        .filter(|w| matches!(w.outcome, tessera_solver::Outcome::Admit { .. }))
        .count();
    println!(
        "  decision: {admitted} admitted, objective {:.1}, bound {:.1}, gap {:.3} %",
        decision.objective,
        decision.bound.unwrap_or(f64::NAN),
        decision.gap.unwrap_or(f64::NAN) * 100.0
    );
    println!(
        "  cold cycle (compile YAML + resolve + solve): {cold:.2} s (compiling {compiling:.2} s)"
    );

    // The service's snapshot lists running work by tenant and name
    // (`tessera_reconciler::snapshot::cluster_state`), the order the solver reads it in; the
    // cold cycle above read the YAML's order, as `tessera solve` reads a file.
    in_service_order(&mut c.states[0].1);
    let snapshot = &c.states[0].1;
    let mut warm = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let d = solve(compiled, snapshot, &options).expect("the fleet solves");
        warm.push(start.elapsed().as_secs_f64());
        assert_eq!(d, decision, "deterministic");
    }
    let (median, min, max) = spread(&mut warm);
    println!(
        "  warm cycle (solve from compiled policy and snapshot): median {median:.3} s (min {min:.3}, max {max:.3})"
    );

    // One inference replica arriving into the fleet as decided (the queue emptied of what was
    // admitted): a cycle with the steady fleet plus one pending workload.
    let extra = "    - {name: one-more, spec: {tenant: p-0-0, sloClass: serving, gpu: {migProfile: 1g.10gb}, cpu: 2, memory: 16Gi}, submittedAt: \"2026-11-20T07:59:00Z\"}\n";
    let (one_text, _, _) = state(shape, Some(extra));
    let mut c1 = compile(&[
        SourceFile::new("policy.yaml", policy_text),
        SourceFile::new("state.yaml", one_text),
    ]);
    in_service_order(&mut c1.states[0].1);
    let one_state = &c1.states[0].1;
    let mut single = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let _ = solve(compiled, one_state, &options).expect("solves");
        single.push(start.elapsed().as_secs_f64());
    }
    let (median, _, _) = spread(&mut single);
    println!("  one inference admission (a full cycle with it queued): median {median:.3} s");

    // The steady fleet: the decision carried out. A session holds its cycle; arrivals are then
    // decided against it.
    let steady_state = steady(snapshot, &decision);
    let start = Instant::now();
    let (session, steady_decision) =
        Session::new(compiled, &steady_state, &options).expect("the steady fleet solves");
    let open = start.elapsed().as_secs_f64();
    let steady_admitted = steady_decision
        .workloads
        .iter()
        .filter(|w| matches!(w.outcome, Outcome::Admit { .. }))
        .count();
    println!(
        "  steady fleet ({} running, {} pending): session opened (one full cycle) in {open:.2} s; that cycle admits {steady_admitted}",
        steady_state.running.len(),
        steady_state.pending.len()
    );
    // A project at least a GPU under its training guarantee on the steady fleet (the last by
    // name, so that the arrival is decided behind most of the queue).
    let reclaimer = steady_decision
        .usage
        .iter()
        .filter(|u| u.pool == "train" && u.tenant.starts_with("p-"))
        .filter(|u| u.total + tessera_compiler::units::Gpus::whole(1) <= u.guarantee)
        .map(|u| u.tenant.clone())
        .max()
        .expect("a project under its guarantee");
    println!("  the within-guarantee arrival is {reclaimer}'s");
    let arrivals = [
        (
            "inference 1g MIG",
            arrival(
                "new-serve",
                &format!("p-{}-7", 3 % shape.orgs),
                "serving",
                None,
                2,
            ),
        ),
        (
            "training 1 GPU",
            arrival(
                "new-train-1",
                &format!("p-{}-2", 5 % shape.orgs),
                "training",
                Some(1),
                8,
            ),
        ),
        (
            "training 8-GPU gang",
            arrival(
                "new-train-8",
                &format!("p-{}-11", 8 % shape.orgs),
                "training",
                Some(8),
                32,
            ),
        ),
        // A project well under its guarantee: it reclaims borrowed work, ahead of the waiting
        // borrowers, which are then decided again.
        (
            "training 1 GPU, within guarantee",
            arrival("new-reclaim", &reclaimer, "training", Some(1), 8),
        ),
    ];
    for (what, a) in &arrivals {
        let mut times = Vec::new();
        let mut answer = None;
        for _ in 0..5 {
            let mut s = session.clone();
            // The service's session has the room it reserved when it opened; a clone has
            // none, and its first arrival would copy every per-workload table to grow it.
            s.reserve(tessera_solver::session::ARRIVAL_ROOM);
            let start = Instant::now();
            let r = s.admit(a).expect("a valid arrival");
            times.push(start.elapsed().as_secs_f64());
            answer = Some((r, s));
        }
        times.sort_by(f64::total_cmp);
        let (answer, mut after) = answer.expect("measured");
        // What the service asks next: the standing decision whole, for its planner.
        let start = Instant::now();
        let whole = after.decision();
        let whole_ms = start.elapsed().as_secs_f64() * 1e3;
        let mut with = steady_state.clone();
        with.pending.push(a.clone());
        // The session stands for the heuristic cycle; the integer program refines full cycles.
        let problem = tessera_solver::Problem::new(compiled, &with, None).expect("solves");
        let full = tessera_solver::Heuristic.solve(&problem, std::time::Duration::ZERO);
        // Every workload's decision, the arrival's and the others', against the full cycle's.
        let agrees = if after.decisions() == full.workloads && whole.workloads == full.workloads {
            "every decision agrees with the full cycle"
        } else {
            "DIFFERS from the full cycle"
        };
        let (outcome, changed, preempted) = match &answer {
            Admission::Decided {
                decision, changed, ..
            } => (
                match decision.outcome {
                    Outcome::Admit { .. } => "admitted",
                    Outcome::Pending { .. } => "pending",
                    _ => "other",
                },
                changed.len(),
                changed
                    .iter()
                    .filter(|w| matches!(w.outcome, Outcome::Preempt { .. }))
                    .count(),
            ),
            Admission::NeedsFullCycle(_) => ("needs a full cycle", 0, 0),
        };
        println!(
            "  incremental admission, {what}: median {:.2} ms (min {:.2}, max {:.2}); {outcome}, {changed} others changed ({preempted} preempted), {agrees}; the decision whole then {whole_ms:.1} ms",
            times[2] * 1e3,
            times[0] * 1e3,
            times[4] * 1e3
        );
    }
    println!("  peak resident memory: {}", peak_rss());
}
