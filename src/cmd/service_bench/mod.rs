//! `tessera bench service`: the service's latency from submission to decision and to running,
//! and its sustained admissions, measured end to end. It starts the real service in this
//! process (the `sim` driver, no runtime, a temporary state directory and policy repository)
//! on a generated fleet, loads it with a burst of submissions (the burst's rate is the
//! sustained admissions a second), then submits at a steady rate from every project's token
//! over HTTP on loopback. It prints figures; it never judges them.

mod load;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use tessera_reconciler::auth::Tokens;
use tessera_reconciler::driver::sim::SimDriver;
use tessera_reconciler::repo::Source;
use tessera_reconciler::runtime::Confinement;
use tessera_reconciler::service::{Config, NodeSource, ServeOptions, StoreSource, serve};
use tessera_solver::bench_fleet::{self as fleet, Shape, Submissions};

use crate::cli::TextOrJson;
use crate::output::emit;
use load::{Client, Sample, metric, quantile};

pub struct ServiceBenchArgs {
    pub nodes: usize,
    pub orgs: usize,
    /// Workloads submitted in the burst, and running when the steady run starts.
    pub running: usize,
    /// Client threads of the burst.
    pub clients: usize,
    /// Steady submissions a second, and for how long.
    pub rate: u32,
    pub duration: Duration,
    /// Decide every event with a full cycle (`--full-cycles-only`), for comparison.
    pub full_cycles_only: bool,
    pub output: TextOrJson,
}

const ADMIN: &str = "bench-admin-token-0123456789";

pub fn run(args: ServiceBenchArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let shape = Shape::new(args.nodes, args.orgs);
    let steady_count = (f64::from(args.rate) * args.duration.as_secs_f64()).round() as usize;
    let capacity = shape.train_gpus() + shape.infer_slices();
    if args.rate == 0 || steady_count == 0 {
        bail!("--rate and --duration must give at least one steady submission");
    }
    if args.running + steady_count > capacity {
        bail!(
            "{} running plus {steady_count} steady submissions need more than the fleet's {capacity} \
             places (GPUs and 1g instances): lower --running, --rate or --duration, or raise --nodes",
            args.running
        );
    }
    let work = tempfile::Builder::new()
        .prefix("tessera-bench-service-")
        .tempdir()
        .context("creating a temporary directory")?;
    let repo = work.path().join("policy");
    commit_policy(&repo, &fleet::policy(shape))?;

    let projects = shape.projects();
    let tokens: BTreeMap<String, String> = projects
        .iter()
        .map(|p| (p.clone(), format!("bench-token-{p}-0123456789")))
        .collect();
    let mut tokens_yaml = format!("admin: {ADMIN}\ntenants:\n");
    for (tenant, token) in &tokens {
        tokens_yaml.push_str(&format!("  {tenant}: {token}\n"));
    }
    let service_tokens = Tokens::parse(&tokens_yaml).map_err(anyhow::Error::msg)?;

    let state_dir = work.path().join("state");
    let driver = SimDriver::from_nodes(&fleet::nodes(shape), &work.path().join("sim-nodes.json"))?;
    let mut config = Config::new(
        Source {
            url: repo.display().to_string(),
            branch: "main".to_owned(),
            subdir: None,
        },
        state_dir.clone(),
    );
    // Only submissions wake a cycle: the period and the fetch interval lie past the run.
    config.cycle_period = Duration::from_secs(3600);
    config.fetch_interval = Duration::from_secs(3600);
    // Nothing is run (no commands are started), so there is nothing to confine.
    config.run_commands = false;
    config.confinement = Confinement::Insecure;
    config.incremental = !args.full_cycles_only;
    config.limits.max_live_submitted_per_tenant = usize::MAX;

    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let options = ServeOptions {
        config,
        store: StoreSource::Sqlite(state_dir.join("tessera.db")),
        listen: "127.0.0.1:0".parse()?,
        tokens: service_tokens,
        nodes: NodeSource::Local(Box::new(driver)),
        hooks: None,
        on_listen: Some(Box::new(move |addr| {
            let _ = addr_tx.send(addr);
        })),
        stop: Some(stop_rx),
    };
    let started = Instant::now();
    let service = std::thread::Builder::new()
        .name("service".into())
        .spawn(move || serve(options))?;
    let Ok(addr) = addr_rx.recv_timeout(Duration::from_secs(60)) else {
        let outcome = service.join();
        bail!("the service did not start: {outcome:?}");
    };
    let client = Client::new(format!("http://{addr}"), ADMIN.to_owned(), tokens);

    let measured = measure(&client, shape, &args, started);
    let _ = stop_tx.send(());
    match service.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => bail!("the service failed: {e}"),
        Err(_) => bail!("the service panicked"),
    }
    let report = measured?;
    match args.output {
        TextOrJson::Json => emit(&(serde_json::to_string_pretty(&report.json())? + "\n"))?,
        TextOrJson::Human => emit(&report.human())?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The service's log on stderr when `RUST_LOG` asks for it (e.g. `RUST_LOG=info` shows each
/// cycle and how it decided); silent otherwise, so that the figures stand alone.
fn init_logging() {
    let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() else {
        return;
    };
    // Fails only when a subscriber is already set, which leaves that one in force.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// A Git repository at `dir` whose branch `main` holds `policy` as `fleet.yaml`.
fn commit_policy(dir: &Path, policy: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("fleet.yaml"), policy)?;
    let repo =
        git2::Repository::init_opts(dir, git2::RepositoryInitOptions::new().initial_head("main"))?;
    let mut index = repo.index()?;
    index.add_path(Path::new("fleet.yaml"))?;
    index.write()?;
    let tree = repo.find_tree(index.write_tree()?)?;
    let who = git2::Signature::now("tessera bench", "bench@tessera.invalid")?;
    repo.commit(Some("HEAD"), &who, &who, "the generated fleet", &tree, &[])?;
    Ok(())
}

struct Report {
    shape: Shape,
    tenants: usize,
    ready: Duration,
    burst: load::Burst,
    rate: u32,
    duration: Duration,
    samples: Vec<Sample>,
    cycles: f64,
    session_decisions: f64,
    /// Full solves during the steady run, by why the standing decision was not used.
    full_solves: BTreeMap<String, f64>,
    solve_seconds: f64,
    solves: f64,
    cycle_seconds: f64,
}

fn measure(
    client: &Client,
    shape: Shape,
    args: &ServiceBenchArgs,
    started: Instant,
) -> anyhow::Result<Report> {
    wait_ready(client)?;
    let ready = started.elapsed();
    let mut submissions = Submissions::new(shape);
    let burst = load::burst(client, &mut submissions, "load", args.running, args.clients)?;
    let before = client.get(None, "/metrics")?.1;
    let samples = load::steady(client, &mut submissions, args.rate, args.duration)?;
    let after = client.get(None, "/metrics")?.1;
    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    Ok(Report {
        shape,
        tenants: shape.projects().len(),
        ready,
        burst,
        rate: args.rate,
        duration: args.duration,
        samples,
        cycles: delta("tessera_cycles_total"),
        session_decisions: delta("tessera_session_decisions_total"),
        full_solves: {
            let name = "tessera_full_solves_total";
            let earlier = load::metric_by_label(&before, name);
            load::metric_by_label(&after, name)
                .into_iter()
                .map(|(why, n)| {
                    let n = n - earlier.get(&why).copied().unwrap_or(0.0);
                    (why, n)
                })
                .filter(|(_, n)| *n > 0.0)
                .collect()
        },
        solve_seconds: delta("tessera_solve_duration_seconds_sum"),
        solves: delta("tessera_solve_duration_seconds_count"),
        cycle_seconds: delta("tessera_cycle_duration_seconds_sum"),
    })
}

/// Waits until the policy is in force: the revision fetched, compiled and a cycle run.
fn wait_ready(client: &Client) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let status = client.get_json(None, "/status")?;
        if !status["revision"].is_null() && status["cycles"].as_u64().unwrap_or(0) >= 1 {
            if let Some(problem) = status["lastError"].as_str() {
                bail!("the service is not healthy: {problem}");
            }
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(300) {
            bail!("the service did not put the policy in force within 5 minutes: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| (d.as_secs_f64() * 1e4).round() / 10.0)
}

struct Spread {
    count: usize,
    p50: Option<f64>,
    p99: Option<f64>,
    max: Option<f64>,
}

fn spread(values: &[Duration]) -> Spread {
    Spread {
        count: values.len(),
        p50: ms(quantile(values, 0.5)),
        p99: ms(quantile(values, 0.99)),
        max: ms(quantile(values, 1.0)),
    }
}

impl Spread {
    fn json(&self) -> serde_json::Value {
        json!({"count": self.count, "p50Ms": self.p50, "p99Ms": self.p99, "maxMs": self.max})
    }
    fn human(&self) -> String {
        let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} ms"));
        format!(
            "p50 {}, p99 {}, max {} ({} workloads)",
            f(self.p50),
            f(self.p99),
            f(self.max),
            self.count
        )
    }
}

impl Report {
    fn admissions_per_second(&self) -> f64 {
        self.burst.running as f64 / self.burst.settled.as_secs_f64().max(1e-9)
    }
    fn decided(&self) -> Spread {
        let v: Vec<Duration> = self.samples.iter().filter_map(|s| s.decided).collect();
        spread(&v)
    }
    fn running(&self) -> Spread {
        let v: Vec<Duration> = self.samples.iter().filter_map(|s| s.running).collect();
        spread(&v)
    }
    fn post(&self) -> Spread {
        let v: Vec<Duration> = self.samples.iter().map(|s| s.post).collect();
        spread(&v)
    }
    fn waiting(&self) -> BTreeMap<&str, usize> {
        let mut by_reason = BTreeMap::new();
        for s in &self.samples {
            if let Some(r) = &s.waiting {
                *by_reason.entry(r.as_str()).or_default() += 1;
            }
        }
        by_reason
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "fleet": {
                "trainingNodes": self.shape.train_nodes,
                "migNodes": self.shape.infer_nodes,
                "gpus": self.shape.train_gpus(),
                "migInstances": self.shape.infer_slices(),
                "tenants": self.tenants,
            },
            "readySeconds": self.ready.as_secs_f64(),
            "burst": {
                "submitted": self.burst.submitted,
                "submittingSeconds": self.burst.submitting.as_secs_f64(),
                "settledSeconds": self.burst.settled.as_secs_f64(),
                "running": self.burst.running,
                "waiting": self.burst.waiting,
                "admissionsPerSecond": self.admissions_per_second(),
                "pollMs": load::BURST_POLL.as_millis() as u64,
            },
            "steady": {
                "ratePerSecond": self.rate,
                "seconds": self.duration.as_secs_f64(),
                "submitted": self.samples.len(),
                "post": self.post().json(),
                "decided": self.decided().json(),
                "running": self.running().json(),
                "waiting": self.waiting(),
                "pollMs": load::POLL.as_millis() as u64,
                "cycles": self.cycles,
                "sessionDecisions": self.session_decisions,
                "fullSolves": self.full_solves,
                "solverSecondsPerCycle": self.solve_seconds / self.solves.max(1.0),
                "cycleSecondsPerCycle": self.cycle_seconds / self.cycles.max(1.0),
            },
        })
    }

    fn human(&self) -> String {
        let mut s = format!(
            "fleet: {} training nodes ({} GPUs) and {} MIG nodes ({} 1g instances), {} project tenants\n\
             service ready in {:.1} s (policy fetched and compiled, first cycle run)\n",
            self.shape.train_nodes,
            self.shape.train_gpus(),
            self.shape.infer_nodes,
            self.shape.infer_slices(),
            self.tenants,
            self.ready.as_secs_f64()
        );
        s.push_str(&format!(
            "burst: {} submitted in {:.1} s; {} running after {:.1} s (counted every {} ms): {:.0} admissions/s\n",
            self.burst.submitted,
            self.burst.submitting.as_secs_f64(),
            self.burst.running,
            self.burst.settled.as_secs_f64(),
            load::BURST_POLL.as_millis(),
            self.admissions_per_second()
        ));
        for (reason, n) in &self.burst.waiting {
            s.push_str(&format!("  left waiting: {n} ({reason})\n"));
        }
        s.push_str(&format!(
            "steady: {} submitted at {}/s over {:.0} s (polled every {} ms)\n  \
             POST:              {}\n  submit -> decided: {}\n  submit -> running: {}\n",
            self.samples.len(),
            self.rate,
            self.duration.as_secs_f64(),
            load::POLL.as_millis(),
            self.post().human(),
            self.decided().human(),
            self.running().human()
        ));
        for (reason, n) in self.waiting() {
            s.push_str(&format!("  left waiting: {n} ({reason})\n"));
        }
        s.push_str(&format!(
            "  service: {:.0} cycles ({:.0} decided by the session), solver {:.1} ms and cycle {:.1} ms on average\n",
            self.cycles,
            self.session_decisions,
            1e3 * self.solve_seconds / self.solves.max(1.0),
            1e3 * self.cycle_seconds / self.cycles.max(1.0)
        ));
        if !self.full_solves.is_empty() {
            let why: Vec<String> = self
                .full_solves
                .iter()
                .map(|(why, n)| format!("{n:.0} {why}"))
                .collect();
            s.push_str(&format!(
                "  full solves, by why the standing decision was not used: {}\n",
                why.join(", ")
            ));
        }
        s
    }
}
