//! `tessera simulate`: a trace replayed over time through the solver, beside baselines. The
//! replay itself is `tessera_sim::replay`; this reads the inputs, shows progress and writes
//! the report.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::Node;
use tessera_sim::openb::PolicyKind;
use tessera_sim::replay::generate::{Generate, generate};
use tessera_sim::replay::openb::{load_openb_trace, openb_nodes};
use tessera_sim::replay::{
    OpenbBaseline, Placement, ReplayConfig, RunReport, TraceError, load_tessera_trace, replay,
};

use crate::cli::{Generated, SimulateArgs, SimulateOutput};
use crate::output::{self, emit};

const DAY: i64 = 24 * 3600;

pub fn run(args: &SimulateArgs) -> anyhow::Result<ExitCode> {
    let mut paths: Vec<PathBuf> = vec![args.policy.clone()];
    let nodes_yaml = args.nodes.as_ref().filter(|p| !is_csv(p));
    paths.extend(nodes_yaml.cloned());
    let (compilation, sources) = super::compile_paths(&paths)?;
    let Some(policy) = &compilation.policy else {
        eprint!(
            "{}",
            output::human::render(&compilation, &sources, output::color_stderr())
        );
        return Ok(ExitCode::from(1));
    };
    let nodes = fleet(args, policy, &compilation.states)?;
    let read = |path: &Path| {
        if is_csv(path) {
            load_openb_trace(path, policy, args.seed)
        } else {
            load_tessera_trace(path)
        }
    };
    let (trace, horizon) = match (&args.trace, args.generate) {
        (Some(path), _) => match read(path) {
            Ok(t) => (t, None),
            // A mistake in the trace is a problem in the input (exit 1), named at its place.
            Err(e @ TraceError::At { .. }) | Err(e @ TraceError::File { .. }) => {
                eprintln!("error: {e}");
                return Ok(ExitCode::from(1));
            }
            Err(e) => return Err(e.into()),
        },
        (None, Some(Generated::Day)) => {
            let g = Generate {
                horizon: DAY,
                load: args.load,
                seed: args.seed,
            };
            (generate(policy, &nodes, &g)?, Some(DAY))
        }
        (None, None) => bail!("pass --trace FILE or --generate day"),
    };
    let mut trace = tessera_sim::replay::demand::scale(&trace, args.demand, args.seed);
    tessera_sim::replay::speed::compress(&mut trace, args.speed);
    let config = ReplayConfig {
        cycle: i64::try_from(args.cycle.as_secs()).unwrap_or(i64::MAX),
        time_limit: args.time_limit,
        horizon: args
            .horizon
            .map(|h| i64::try_from(h.as_secs()).unwrap_or(i64::MAX))
            .or(horizon),
        ..ReplayConfig::default()
    };
    let mut baselines = Vec::new();
    for name in &args.compare {
        let kind = PolicyKind::from_name(name.trim())
            .filter(|k| *k != PolicyKind::Tessera)
            .with_context(|| {
                format!("--compare: unknown baseline `{name}` (FGD, BestFit, FirstFit, Random)")
            })?;
        baselines.push(kind);
    }
    let end_hint = config
        .horizon
        .unwrap_or_else(|| trace.iter().map(|w| w.arrival).max().unwrap_or(0));
    let kinds: Vec<Option<PolicyKind>> = std::iter::once(None)
        .chain(baselines.into_iter().map(Some))
        .collect();
    let bars = std::io::stderr()
        .is_terminal()
        .then(indicatif::MultiProgress::new);
    let one_run = |kind: &Option<PolicyKind>| -> anyhow::Result<(RunReport, f64)> {
        let label = kind.map_or("Tessera", PolicyKind::name);
        let bar = bars.as_ref().map(|m| m.add(progress_bar(label, end_hint)));
        let mut tick = |t: i64| {
            if let Some(b) = &bar {
                b.set_position(u64::try_from(t.min(end_hint)).unwrap_or(0));
            }
        };
        let started = Instant::now();
        let mut report = match kind {
            None => replay(
                policy,
                &nodes,
                &trace,
                &config,
                Placement::Solver,
                &mut tick,
            )?,
            Some(k) => {
                let mut b = OpenbBaseline::new(*k, args.seed, &trace)
                    .context("the Tessera row is the solver's own run")?;
                replay(
                    policy,
                    &nodes,
                    &trace,
                    &config,
                    Placement::Baseline(&mut b),
                    &mut tick,
                )?
            }
        };
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        report.placement = label.to_owned();
        Ok((report, started.elapsed().as_secs_f64()))
    };
    let jobs = args.jobs.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |j| j.get(),
    );
    // A failed run stops the rest, as a loop with `?` would: the runs not yet started are not
    // replayed, and the first error in `--compare`'s order is the one reported.
    let runs = each_on_threads(&kinds, jobs, one_run, Result::is_err)
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (r, wall) in &runs {
        eprintln!(
            "{}: {} cycles solved in {wall:.1}s wall time",
            r.placement, r.cycles
        );
    }
    let reports: Vec<RunReport> = runs.into_iter().map(|r| r.0).collect();
    let mut summary = tessera_sim::replay::Summary::new(&trace, &nodes, &config, reports);
    summary.speed = args.speed;
    summary.demand = args.demand;
    match args.output {
        SimulateOutput::Json => emit(&(serde_json::to_string_pretty(&summary)? + "\n"))?,
        SimulateOutput::Human => emit(&tessera_sim::replay::report::human(&summary))?,
        SimulateOutput::Html => {
            let dir = args
                .out
                .as_deref()
                .context("--output html needs --out DIR")?;
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let file = dir.join("index.html");
            std::fs::write(&file, tessera_sim::replay::html::page(&summary))
                .with_context(|| format!("cannot write {}", file.display()))?;
            eprintln!("wrote {}", file.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn is_csv(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
}

/// The fleet the replay runs on: an openb node list, or a snapshot's nodes with no work.
fn fleet(
    args: &SimulateArgs,
    policy: &CompiledPolicy,
    states: &[(String, tessera_compiler::model::ClusterStateSpec)],
) -> anyhow::Result<Vec<Node>> {
    if let Some(path) = args.nodes.as_ref().filter(|p| is_csv(p)) {
        let specs = tessera_sim::openb::load_nodes(path)?;
        return Ok(openb_nodes(&path.display().to_string(), &specs, policy)?);
    }
    match states {
        [(_, s)] => Ok(s.nodes.clone()),
        [] => bail!(
            "no fleet: pass --nodes FILE (an openb node list or a ClusterState snapshot), or keep one ClusterState in the policy directory"
        ),
        many => bail!(
            "{} ClusterState documents ({}): pass the fleet with --nodes FILE",
            many.len(),
            many.iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `items.iter().map(f).collect()`, at most `jobs` items at a time, each on a thread of its
/// own: the replays share nothing, so several cores finish a `--compare` in the time of its
/// longest run. The results are in `items`' order, whatever order the runs end in. Once a
/// result meets `stop`, no item is started: the results then end with the items that were
/// already started (on one thread, with that result).
fn each_on_threads<T, R, F, S>(items: &[T], jobs: usize, f: F, stop: S) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
    S: Fn(&R) -> bool + Sync,
{
    let jobs = jobs.clamp(1, items.len().max(1));
    if jobs == 1 {
        let mut done = Vec::with_capacity(items.len());
        for item in items {
            let r = f(item);
            let stopping = stop(&r);
            done.push(r);
            if stopping {
                break;
            }
        }
        return done;
    }
    let next = AtomicUsize::new(0);
    let stopped = AtomicBool::new(false);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..jobs)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    while !stopped.load(Ordering::Acquire) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            break;
                        };
                        let r = f(item);
                        if stop(&r) {
                            stopped.store(true, Ordering::Release);
                        }
                        mine.push((i, r));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| match w.join() {
                Ok(mine) => mine,
                // A run that panicked is a bug: its panic goes on, not a report short a run.
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    done.sort_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// A bar over simulated time, for stderr's [`indicatif::MultiProgress`].
fn progress_bar(label: &str, end: i64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(u64::try_from(end.max(1)).unwrap_or(1));
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{prefix:>8} [{bar:40}] {percent:>3}% of simulated time, {elapsed} elapsed",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_owned());
    bar
}

#[cfg(test)]
mod tests {
    use super::each_on_threads;

    #[test]
    fn results_come_in_order_and_a_stop_starts_nothing_more() {
        let items: Vec<u32> = (0..40).collect();
        for jobs in [1, 3, 64] {
            let all = each_on_threads(&items, jobs, |&i| i * 2, |_| false);
            assert_eq!(all, items.iter().map(|i| i * 2).collect::<Vec<_>>());
        }
        // On one thread, nothing after the stopping result runs.
        let calls = std::sync::Mutex::new(Vec::new());
        let first = each_on_threads(
            &items,
            1,
            |&i| {
                calls.lock().unwrap().push(i);
                i
            },
            |&r| r == 5,
        );
        assert_eq!(first, [0, 1, 2, 3, 4, 5]);
        assert_eq!(*calls.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
        // On several, the items started before the stop are kept, in order, up to it.
        let some = each_on_threads(&items, 3, |&i| i, |&r| r == 5);
        assert_eq!(some[..6], [0, 1, 2, 3, 4, 5]);
        assert!(some.windows(2).all(|w| w[0] < w[1]));
    }
}
