//! The openb benchmark: every baseline policy on an openb trace over the paper's 10 seeds,
//! printed next to the published figures. It prints; it asserts nothing.
//!
//! ```text
//! cargo bench -p tessera-sim --bench openb -- [--trace NAME]... [--variant fgd-md|published|both]
//!     [--policies FGD,BestFit,...] [--seeds N] [--first-seed S] [--data DIR] [--json FILE] [--cycle N] [--bound]
//!     [--arrival creation|shuffled] [--rounding exact|integer] [--ties node-order|random|permuted]
//!     [--typical fgd-md|published] [--memory on|off] [--checkpoints window|crossing]
//!     [--gpu-spec-share S,...] [--seed N] [--cpu-only solver|best-fit|fgd|kube]
//!     [--cpu-only-rows tessera|all] [--first-refusal]
//! ```
//!
//! `--gpu-spec-share 0,0.1,0.33` runs each trace as given (0) and as `gpu_spec` variants with
//! that share of GPU tasks pinned to one model (`openb::pin_gpu_spec`, drawn with `--seed N`,
//! 1 by default); a variant's trace is named `TRACE+specPCT`.
//!
//! The single-knob options override that one setting of the chosen variant(s), to see what it
//! changes. `--cpu-only` says who places the trace's CPU-only tasks in the Tessera row
//! (`openb::CpuOnlyRule`): the solver by default, as workloads asking no GPU, or a baseline's
//! rule; with `--cpu-only-rows all` the baselines' CPU-only tasks follow a baseline's rule
//! too, so that the rows differ only in how GPU tasks are placed (`openb::CpuOnlyRows`).
//! `--first-refusal` also prints, per policy and GPU model, the cluster when the run first
//! refused a GPU task: idle GPUs, those on nodes out of CPU, and the cores taken by GPU tasks
//! and by CPU-only tasks (`openb::FirstRefusal`, in the JSON whether or not it is printed).
//!
//! Defaults: trace `default`, both variants, all policies, seeds 42..=51 (`--first-seed S`: N seeds
//! from S instead), data from
//! `$OPENB_DATA_DIR` or `shared/data/openb` beside the repository (where CI and developers have it).
//!
//! Variants: `fgd-md` is `SimConfig::fgd_md()` (the protocol document to the letter);
//! `published` is `SimConfig::published_runs()` (what the paper's simulator and run scripts did,
//! which reproduces the published figures).

// The production binaries' allocator, so that the figures describe what users run.
#[global_allocator]
static ALLOCATOR: tessera_alloc::Allocator = tessera_alloc::Allocator;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use tessera_sim::openb::{
    self, ArrivalOrder, Checkpointing, CpuOnlyRows, CpuOnlyRule, PaperResults, PolicyKind,
    ScoreRounding, SimConfig, TieBreak, TraceResult, TypicalConfig, Workload,
};

struct Args {
    traces: Vec<String>,
    variants: Vec<(&'static str, SimConfig)>,
    policies: Vec<PolicyKind>,
    seeds: Option<usize>,
    first_seed: Option<u64>,
    data: PathBuf,
    json: Option<PathBuf>,
    bound: bool,
    first_refusal: bool,
    gpu_spec_shares: Vec<f64>,
    spec_seed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        traces: Vec::new(),
        variants: vec![
            ("fgd-md", SimConfig::fgd_md()),
            ("published", SimConfig::published_runs()),
        ],
        policies: vec![
            PolicyKind::Tessera,
            PolicyKind::Fgd,
            PolicyKind::BestFit,
            PolicyKind::FirstFit,
            PolicyKind::Random,
        ],
        seeds: None,
        first_seed: None,
        data: std::env::var_os("OPENB_DATA_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../shared/data/openb"
                ))
            }),
        json: None,
        bound: false,
        first_refusal: false,
        gpu_spec_shares: vec![0.0],
        spec_seed: 1,
    };
    type Override = Box<dyn Fn(&mut SimConfig)>;
    let mut overrides: Vec<Override> = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--trace" => args.traces.push(value("--trace")?),
            "--variant" => {
                args.variants = match value("--variant")?.as_str() {
                    "fgd-md" => vec![("fgd-md", SimConfig::fgd_md())],
                    "published" => vec![("published", SimConfig::published_runs())],
                    "both" => vec![
                        ("fgd-md", SimConfig::fgd_md()),
                        ("published", SimConfig::published_runs()),
                    ],
                    v => return Err(format!("unknown variant {v:?} (fgd-md, published, both)")),
                }
            }
            "--policies" => {
                args.policies = value("--policies")?
                    .split(',')
                    .map(|p| PolicyKind::from_name(p.trim()).ok_or(format!("unknown policy {p:?}")))
                    .collect::<Result<_, _>>()?
            }
            "--seeds" => {
                let n: usize = value("--seeds")?
                    .parse()
                    .map_err(|_| "--seeds needs a number")?;
                args.seeds = Some(n);
            }
            "--first-seed" => {
                let s: u64 = value("--first-seed")?
                    .parse()
                    .map_err(|_| "--first-seed needs a number")?;
                args.first_seed = Some(s);
            }
            "--data" => args.data = PathBuf::from(value("--data")?),
            // Single knobs over the chosen variant(s), to see what each one changes.
            "--arrival" => {
                let v = match value("--arrival")?.as_str() {
                    "creation" => ArrivalOrder::CreationTime,
                    "shuffled" => ArrivalOrder::Shuffled,
                    v => return Err(format!("unknown arrival {v:?} (creation, shuffled)")),
                };
                overrides.push(Box::new(move |c: &mut SimConfig| c.arrival = v));
            }
            "--rounding" => {
                let v = match value("--rounding")?.as_str() {
                    "exact" => ScoreRounding::Exact,
                    "integer" => ScoreRounding::Integer,
                    v => return Err(format!("unknown rounding {v:?} (exact, integer)")),
                };
                overrides.push(Box::new(move |c: &mut SimConfig| c.policy.rounding = v));
            }
            "--ties" => {
                let v = match value("--ties")?.as_str() {
                    "node-order" => TieBreak::NodeOrder,
                    "random" => TieBreak::Random,
                    "permuted" => TieBreak::Permuted,
                    v => {
                        return Err(format!(
                            "unknown tie-break {v:?} (node-order, random, permuted)"
                        ));
                    }
                };
                overrides.push(Box::new(move |c: &mut SimConfig| c.policy.tie_break = v));
            }
            "--typical" => {
                let v = match value("--typical")?.as_str() {
                    "fgd-md" => TypicalConfig::fgd_md(),
                    "published" => TypicalConfig::published_runs(),
                    v => return Err(format!("unknown typical {v:?} (fgd-md, published)")),
                };
                overrides.push(Box::new(move |c: &mut SimConfig| c.typical = v));
            }
            "--memory" => {
                let v = match value("--memory")?.as_str() {
                    "on" => true,
                    "off" => false,
                    v => return Err(format!("unknown memory {v:?} (on, off)")),
                };
                overrides.push(Box::new(move |c: &mut SimConfig| c.check_memory = v));
            }
            "--cpu-only" => {
                let v = match value("--cpu-only")?.as_str() {
                    "solver" => CpuOnlyRule::Solver,
                    "best-fit" => CpuOnlyRule::BestFit,
                    "fgd" => CpuOnlyRule::Fgd,
                    "kube" => CpuOnlyRule::Kube,
                    v => {
                        return Err(format!(
                            "unknown CPU-only rule {v:?} (solver, best-fit, fgd, kube)"
                        ));
                    }
                };
                overrides.push(Box::new(move |c: &mut SimConfig| c.cpu_only = v));
            }
            "--cpu-only-rows" => {
                let v = match value("--cpu-only-rows")?.as_str() {
                    "tessera" => CpuOnlyRows::Tessera,
                    "all" => CpuOnlyRows::All,
                    v => return Err(format!("unknown rows {v:?} (tessera, all)")),
                };
                overrides.push(Box::new(move |c: &mut SimConfig| c.cpu_only_rows = v));
            }
            "--checkpoints" => {
                let v = match value("--checkpoints")?.as_str() {
                    "window" => Checkpointing::WindowMean,
                    "crossing" => Checkpointing::Crossing,
                    v => return Err(format!("unknown checkpoints {v:?} (window, crossing)")),
                };
                overrides.push(Box::new(move |c: &mut SimConfig| c.checkpointing = v));
            }
            "--cycle" => {
                let n: usize = value("--cycle")?
                    .parse()
                    .map_err(|_| "--cycle needs a number")?;
                if n == 0 {
                    return Err("--cycle must be at least 1".into());
                }
                overrides.push(Box::new(move |c: &mut SimConfig| c.cycle = Some(n)));
            }
            "--gpu-spec-share" => {
                args.gpu_spec_shares = value("--gpu-spec-share")?
                    .split(',')
                    .map(|v| match v.trim().parse::<f64>() {
                        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
                        _ => Err(format!("--gpu-spec-share takes shares in 0..=1, got {v:?}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--seed" => {
                args.spec_seed = value("--seed")?
                    .parse()
                    .map_err(|_| "--seed needs a number")?
            }
            "--bound" => args.bound = true,
            "--first-refusal" => args.first_refusal = true,
            "--json" => args.json = Some(PathBuf::from(value("--json")?)),
            // passed by `cargo bench` to every bench target
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.traces.is_empty() {
        args.traces.push("default".to_string());
    }
    for (_, c) in &mut args.variants {
        // Seeds other than the paper's check that a difference is not one of those ten draws.
        if let Some(first) = args.first_seed {
            let n = args.seeds.unwrap_or(c.seeds.len()) as u64;
            c.seeds = (first..first + n).collect();
        }
        if let Some(n) = args.seeds {
            c.seeds.truncate(n);
        }
        for o in &overrides {
            o(c);
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("openb: {e}");
            return ExitCode::FAILURE;
        }
    };
    let nodes = match openb::load_nodes(args.data.join(openb::NODE_LIST)) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("openb: {e}");
            return ExitCode::FAILURE;
        }
    };
    let paper = PaperResults::load(args.data.join(openb::PAPER_RESULTS)).unwrap_or_else(|e| {
        eprintln!("openb: no published figures ({e})");
        PaperResults::default()
    });
    let mut results: Vec<TraceResult> = Vec::new();
    let all = Instant::now();
    let mut runs: Vec<(String, Vec<openb::TaskSpec>)> = Vec::new();
    for trace in &args.traces {
        let tasks = match openb::load_tasks(args.data.join(openb::pod_list_file(trace))) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("openb: {e}");
                return ExitCode::FAILURE;
            }
        };
        for &share in &args.gpu_spec_shares {
            if share == 0.0 {
                runs.push((trace.clone(), tasks.clone()));
                continue;
            }
            let mut pinned = tasks.clone();
            match openb::pin_gpu_spec(&nodes, &mut pinned, share, args.spec_seed) {
                Ok(n) => println!(
                    "`{trace}`: {n} GPU tasks pinned to one model (share {share}, seed {})",
                    args.spec_seed
                ),
                Err(e) => {
                    eprintln!("openb: {e}");
                    return ExitCode::FAILURE;
                }
            }
            runs.push((format!("{trace}+spec{}", (share * 100.0).round()), pinned));
        }
    }
    for (trace, tasks) in &runs {
        for (variant, config) in &args.variants {
            let workload = match Workload::new(&nodes, tasks.clone(), config.check_memory) {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("openb: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let seeds = match (config.seeds.first(), config.seeds.last()) {
                (Some(a), Some(b)) => format!("{} seeds, {a}..={b}", config.seeds.len()),
                _ => "no seeds".to_string(),
            };
            println!(
                "\n== openb trace `{trace}`, variant {variant} ({seeds}): {} nodes, {} GPUs, {} tasks asking {:.2} % of GPU capacity, {} typical shapes",
                workload.cluster().nodes().len(),
                workload.cluster().total_gpu_milli() / 1000,
                workload.tasks().len(),
                100.0 * workload.total_gpu_request() as f64
                    / workload.cluster().total_gpu_milli() as f64,
                workload.typical_shapes(&config.typical).shapes.len(),
            );
            let start = Instant::now();
            let mut result = openb::run_trace(trace, &workload, &[], config);
            for &kind in &args.policies {
                let t = Instant::now();
                result
                    .policies
                    .push(openb::run_policy(&workload, kind, config));
                println!(
                    "   {:<9} {:>6.2} s  ({} seeds)",
                    kind.name(),
                    t.elapsed().as_secs_f64(),
                    config.seeds.len()
                );
            }
            println!("   all policies: {:.2} s", start.elapsed().as_secs_f64());
            if args.bound {
                let t = Instant::now();
                result.bound = Some(openb::mean_bound_at(&workload, config));
                println!("   LP bound  {:>6.2} s", t.elapsed().as_secs_f64());
            }
            println!();
            print!("{}", openb::comparison_table(&result, &paper));
            print!("{}", openb::idle_table(&result));
            if args.first_refusal {
                print!("{}", openb::first_refusal_table(&result));
            }
            results.push(result);
        }
    }
    println!("\ntotal: {:.2} s", all.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&results).expect("results serialise");
        if let Err(e) = std::fs::write(path, json) {
            eprintln!("openb: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("results written to {}", path.display());
    }
    ExitCode::SUCCESS
}
