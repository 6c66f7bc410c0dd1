//! `tessera bench openb`: the openb protocol on any trace in its CSV format, every policy side by
//! side in one process (tessera's own first, then the baselines). It prints figures; it never judges them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use tessera_sim::openb::{
    self, CpuOnlyRows, CpuOnlyRule, PaperResults, PolicyKind, SimConfig, Workload,
};

use crate::cli::{OpenbCpuOnly, OpenbCpuOnlyRows, OpenbVariant, TextOrJson};
use crate::output::emit;

pub struct OpenbArgs<'a> {
    pub trace: &'a Path,
    pub nodes: &'a Path,
    pub seeds: Option<u64>,
    pub variant: OpenbVariant,
    /// Arrivals per cycle; `None` is online.
    pub cycle: Option<usize>,
    pub policies: &'a [String],
    pub paper: Option<&'a Path>,
    /// Also compute the LP upper bound at each checkpoint.
    pub bound: bool,
    /// Pin this share of the GPU tasks to one model each, with this seed.
    pub gpu_spec: Option<(f64, u64)>,
    pub cpu_only: OpenbCpuOnly,
    pub cpu_only_rows: OpenbCpuOnlyRows,
    /// Also print the cluster at each policy's first refused GPU task.
    pub first_refusal: bool,
    pub output: TextOrJson,
}

/// `openb_pod_list_default.csv` is trace `default`, as the paper's results name it.
fn trace_name(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    stem.strip_prefix("openb_pod_list_")
        .map(str::to_owned)
        .unwrap_or(stem)
}

pub fn openb(args: OpenbArgs) -> anyhow::Result<ExitCode> {
    let mut config = match args.variant {
        OpenbVariant::FgdMd => SimConfig::fgd_md(),
        OpenbVariant::Published => SimConfig::published_runs(),
    };
    if let Some(c) = args.cycle {
        anyhow::ensure!(c > 0, "--cycle must be at least 1");
    }
    config.cycle = args.cycle;
    config.cpu_only = match args.cpu_only {
        OpenbCpuOnly::Solver => CpuOnlyRule::Solver,
        OpenbCpuOnly::BestFit => CpuOnlyRule::BestFit,
        OpenbCpuOnly::Fgd => CpuOnlyRule::Fgd,
        OpenbCpuOnly::Kube => CpuOnlyRule::Kube,
    };
    config.cpu_only_rows = match args.cpu_only_rows {
        OpenbCpuOnlyRows::Tessera => CpuOnlyRows::Tessera,
        OpenbCpuOnlyRows::All => CpuOnlyRows::All,
    };
    if let Some(n) = args.seeds {
        anyhow::ensure!(n > 0, "--seeds must be at least 1");
        config.seeds = (42..42 + n).collect();
    }
    let kinds: Vec<PolicyKind> = if args.policies.is_empty() {
        vec![
            PolicyKind::Tessera,
            PolicyKind::Fgd,
            PolicyKind::BestFit,
            PolicyKind::FirstFit,
            PolicyKind::Random,
        ]
    } else {
        args.policies
            .iter()
            .map(|p| {
                PolicyKind::from_name(p).with_context(|| {
                    let names: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
                    format!("unknown policy `{p}`; policies: {}", names.join(", "))
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    let nodes = openb::load_nodes(args.nodes)?;
    let mut tasks = openb::load_tasks(args.trace)?;
    let mut name = trace_name(args.trace);
    let mut pinned = None;
    if let Some((share, seed)) = args.gpu_spec {
        pinned = Some(openb::pin_gpu_spec(&nodes, &mut tasks, share, seed)?);
        // As the cargo bench names its variants: `default+spec10`.
        name = format!("{name}+spec{}", (share * 100.0).round());
    }
    let workload = Workload::new(&nodes, tasks, config.check_memory)?;

    let start = Instant::now();
    let mut result = openb::run_trace(&name, &workload, &kinds, &config);
    if args.bound {
        result.bound = Some(openb::mean_bound_at(&workload, &config));
    }
    let elapsed = start.elapsed().as_secs_f64();

    match args.output {
        TextOrJson::Json => emit(&(serde_json::to_string_pretty(&result)? + "\n"))?,
        TextOrJson::Human => {
            // The paper's figures sit beside the trace in the openb data set.
            let paper_path: Option<PathBuf> = args.paper.map(Path::to_path_buf).or_else(|| {
                let p = args.trace.with_file_name("fgd-paper-results.csv");
                p.exists().then_some(p)
            });
            let paper = match paper_path {
                Some(p) => PaperResults::load(&p)?,
                None => PaperResults::default(),
            };
            let mut text = format!(
                "openb trace `{name}`: {} nodes, {} GPUs, {} tasks; {} seeds ({}..={}); {:.2} s\n\n",
                result.nodes,
                result.gpu_capacity_milli / 1000,
                result.tasks_in_trace,
                config.seeds.len(),
                config.seeds.first().copied().unwrap_or_default(),
                config.seeds.last().copied().unwrap_or_default(),
                elapsed
            );
            if let (Some(n), Some((share, seed))) = (pinned, args.gpu_spec) {
                text.push_str(&format!(
                    "{n} GPU tasks pinned to one model (share {share}, seed {seed})\n\n"
                ));
            }
            text.push_str(&openb::comparison_table(&result, &paper));
            text.push_str(&openb::idle_table(&result));
            if args.first_refusal {
                text.push_str(&openb::first_refusal_table(&result));
            }
            emit(&text)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
