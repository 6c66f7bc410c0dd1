//! `tessera solve`: one decision cycle for a policy directory and a cluster-state snapshot.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessera_solver::decision::{FairShareReport, Method, PoolRefinement, RefineStatus};
use tessera_solver::{Decision, Outcome, SolveOptions};

use crate::cli::TextOrJson;
use crate::output::{self, emit};

pub fn run(
    policy: &Path,
    state: Option<&Path>,
    output: TextOrJson,
    time_limit: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    let mut paths: Vec<PathBuf> = vec![policy.to_path_buf()];
    paths.extend(state.map(Path::to_path_buf));
    let (compilation, sources) = super::compile_paths(&paths)?;
    let Some(compiled) = &compilation.policy else {
        eprint!(
            "{}",
            output::human::render(&compilation, &sources, output::color_stderr())
        );
        return Ok(ExitCode::from(1));
    };
    let snapshot = match compilation.states.as_slice() {
        [(_, s)] => s,
        [] => anyhow::bail!(
            "no ClusterState snapshot: pass one with --state FILE (`tessera reconcile` exports it)"
        ),
        many => anyhow::bail!(
            "{} ClusterState documents ({}): keep one snapshot, passed with --state",
            many.len(),
            many.iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if compilation.warnings() > 0 {
        eprint!(
            "{}",
            output::human::render(&compilation, &sources, output::color_stderr())
        );
    }
    let options = SolveOptions {
        time_limit,
        ..SolveOptions::default()
    };
    let decision = tessera_solver::solve(compiled, snapshot, &options)?;
    match output {
        TextOrJson::Json => emit(&(serde_json::to_string_pretty(&decision)? + "\n"))?,
        TextOrJson::Human => emit(&human(&decision))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// A terminal view: what changes first, then what waits and why, then the pools.
fn human(d: &Decision) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let count = |f: fn(&Outcome) -> bool| d.workloads.iter().filter(|w| f(&w.outcome)).count();
    let keep = count(|o| matches!(o, Outcome::Keep { .. }));
    let admit = count(|o| matches!(o, Outcome::Admit { .. }));
    let preempt = count(|o| matches!(o, Outcome::Preempt { .. }));
    let pending = count(|o| matches!(o, Outcome::Pending { .. }));
    let reconfigure = d.geometry.iter().filter(|g| g.changes()).count();
    let _ = writeln!(
        out,
        "Decision at {}: {admit} admitted, {preempt} preempted, {pending} pending, {keep} kept; {reconfigure} GPUs re-partitioned",
        d.now
    );
    let bound = match (d.bound, d.gap) {
        (Some(b), Some(g)) => format!("bound {b:.1}, gap {:.2} %", g * 100.0),
        _ => "no bound (heuristic only)".to_owned(),
    };
    let method = match d.method {
        Method::Heuristic => "heuristic",
        Method::Refined => "heuristic refined by integer programs",
    };
    let _ = writeln!(out, "objective {:.1} ({method}), {bound}\n", d.objective);
    for w in &d.workloads {
        match &w.outcome {
            Outcome::Admit {
                bindings,
                guaranteed,
                borrowed,
            } => {
                let _ = writeln!(
                    out,
                    "  + admit    {} ({}, {}) on {}: {}, {guaranteed} GPUs guaranteed, {borrowed} borrowed",
                    w.name,
                    w.tenant,
                    w.slo_class,
                    w.pool.as_deref().unwrap_or("?"),
                    output::count::count(bindings.len(), "replica", "replicas")
                );
            }
            Outcome::Preempt {
                grace_seconds,
                lost_gpu_seconds,
                reason,
            } => {
                let _ = writeln!(
                    out,
                    "  - preempt  {} ({}): {reason}; checkpoint grace {grace_seconds}s, {:.1} GPU-hours lost since its last checkpoint",
                    w.name,
                    w.tenant,
                    lost_gpu_seconds / 3600.0
                );
            }
            _ => {}
        }
    }
    for g in d.geometry.iter().filter(|g| g.changes()) {
        let show = |v: &[tessera_solver::decision::Instance]| {
            v.iter()
                .map(|i| format!("{}@{}", i.profile, i.start))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            out,
            "  ~ mig      {} GPU {}: [{}] -> [{}]{}",
            g.node,
            g.gpu,
            show(&g.current),
            show(&g.target),
            if g.drain { " (drain first)" } else { "" }
        );
    }
    if pending > 0 {
        let _ = writeln!(out, "\nWaiting:");
        for w in &d.workloads {
            if let Outcome::Pending { reason } = &w.outcome {
                let _ = writeln!(
                    out,
                    "  . {} ({}, {}): {reason}",
                    w.name, w.tenant, w.slo_class
                );
            }
        }
    }
    let _ = writeln!(out, "\nPools:");
    for p in &d.pools {
        let _ = writeln!(
            out,
            "  {:<16} {:>9} sharing  {:>6.2} % allocated ({} of {} GPUs), {} stranded, {} free nodes",
            p.pool,
            p.sharing.as_str(),
            p.allocation * 100.0,
            p.allocated,
            p.capacity,
            p.stranded,
            p.free_nodes
        );
        if let Some(r) = &p.refinement {
            let _ = writeln!(out, "  {:<16} refinement: {}", "", refinement(r));
        }
    }
    if let Some(f) = &d.fair_share {
        out.push_str(&fair_share(f));
    }
    out
}

/// Each tenant's decayed usage and the share of idle capacity it leads to.
fn fair_share(f: &FairShareReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nFair share (usage decayed to {}; share: of idle capacity among siblings):",
        f.record.as_of
    );
    let _ = writeln!(
        out,
        "  {:<16} {:>6} {:>14} {:>18} {:>8} {:>8}",
        "tenant", "weight", "GPU-hours used", "GPU-hours borrowed", "history", "share"
    );
    for t in &f.tenants {
        let r = f.record.tenants.get(&t.tenant).copied().unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:<16} {:>6} {:>14.1} {:>18.1} {:>8.3} {:>6.1} %",
            t.tenant,
            t.weight,
            r.used.gpu_hours,
            r.borrowed.gpu_hours,
            t.history,
            t.share * 100.0
        );
    }
    out
}

/// One line on what the integer program did with a pool.
fn refinement(r: &PoolRefinement) -> String {
    let count = |n: u32, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let size = format!(
        "{}, {}, {}: {}, {}",
        count(r.gangs, "gang"),
        count(r.running, "running workload"),
        count(r.nodes, "node"),
        count(r.variables, "variable"),
        count(r.constraints, "constraint")
    );
    match &r.status {
        RefineStatus::Improved { gain } => format!("improved by {gain:.1} ({size})"),
        RefineStatus::Optimal => format!("the heuristic's decision is optimal ({size})"),
        RefineStatus::NodeLimit => format!("nothing better within the node limit ({size})"),
        RefineStatus::TimeLimit => "stopped at --time-limit, the heuristic's decision kept".into(),
        RefineStatus::Skipped { reason } => format!("skipped: {reason}"),
        RefineStatus::Rejected { reason } => format!("answer rejected on rebuild: {reason}"),
    }
}
