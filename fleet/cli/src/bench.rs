//! `tessera-fleet bench agents`: many simulated agents in this one process against a real etcd
//! (each with its own lease, watch and journal, sharing one gRPC connection), and a leader
//! that gives every node the same MIG layout. It prints figures and asserts nothing.
//!
//! Measured: registration of every node; from the first action written to every action
//! journaled done; etcd's puts and the bytes its clients sent, for the convergence and for an
//! idle window after it (what a steady fleet costs with nothing changing).

use std::fmt::Write as _;
use std::io::{Read, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use etcd_client::{Client, GetOptions, WatchOptions};
use tessera_fleet::actions::JournalRecord;
use tessera_fleet::agent::{self, AgentConfig, NodeState};
use tessera_fleet::dispatch::{DEFAULT_MAX_TXN_OPS, Dispatcher, NodeAction, Plan};
use tessera_fleet::election::{Candidate, LeaderInfo};
use tessera_fleet::keys::{Keys, NodeKey};
use tessera_fleet::protocol::{ActionMessage, VERSION};
use tessera_fleet::testing::TestEtcd;
use tessera_fleet::utilization::Cadence;
use tessera_fleet::view::FleetView;
use tessera_reconciler::actions::Action;
use tessera_reconciler::driver::observe_hook::ObserveHook;
use tessera_reconciler::driver::sim::{SimDriver, load_nodes};
use tessera_reconciler::driver::{GpuRef, GpuUtilization, NodeDriver, Observation, SmActivity};
use tessera_reconciler::runtime::{Confinement, Runtime};

#[derive(Debug, Args)]
pub struct BenchAgentsArgs {
    /// Simulated nodes, one agent each.
    #[arg(long, default_value_t = 500)]
    pub nodes: usize,
    /// H100 80GB GPUs per node.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub gpus: u32,
    /// An etcd to use (its keys under `/tessera/bench/` are replaced); by default one is
    /// started on loopback ports in a temporary directory (Debian's etcd-server).
    #[arg(long)]
    pub etcd: Option<String>,
    /// The agents' registration lease.
    #[arg(long, default_value_t = 10)]
    pub lease_ttl_secs: i64,
    /// How long to watch the converged fleet for the idle figures.
    #[arg(long, default_value_t = 5)]
    pub idle_secs: u64,
    /// How far each GPU's utilisation strays from its steady level at every observation, in
    /// percentage points (a fleet whose load does not change, measured with noise); 0: the
    /// simulated GPUs report none.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub utilization_noise: u32,
    /// The agents' least time between two utilisation writes (`0s`: no bound).
    #[arg(long, default_value = "30s", value_parser = interval)]
    pub utilization_interval: Duration,
    /// The agents' dead band in percentage points (0: every change is written).
    #[arg(long, default_value_t = 10.0, value_parser = crate::agent::percentage_points)]
    pub utilization_dead_band: f64,
}

/// A duration, zero allowed.
fn interval(value: &str) -> Result<Duration, String> {
    tessera_compiler::units::Duration::parse(value)
        .map(|d| Duration::from_secs(d.seconds()))
        .ok_or_else(|| "not a duration: write e.g. 0s, 30s or 1m".to_string())
}

pub fn run(args: BenchAgentsArgs) -> anyhow::Result<()> {
    // The agents' own lines (two per action) would drown the figures: warnings only, unless
    // RUST_LOG says otherwise.
    crate::agent::init_logging("warn");
    let started = match &args.etcd {
        Some(_) => None,
        None => Some(TestEtcd::start()?),
    };
    let endpoint = match (&args.etcd, &started) {
        (Some(url), _) => url.clone(),
        (None, Some(etcd)) => etcd.endpoint(),
        (None, None) => bail!("no etcd"),
    };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    tokio.block_on(bench(&args, &endpoint))
}

async fn bench(args: &BenchAgentsArgs, endpoint: &str) -> anyhow::Result<()> {
    let keys = Keys::new("bench")?;
    let client = Client::connect([endpoint], None)
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))?;
    client
        .clone()
        .delete(
            keys.root(),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await?;
    let dir = tempfile::Builder::new()
        .prefix("tessera-bench-agents-")
        .tempdir()?;
    let nodes = fleet(dir.path(), args.nodes, args.gpus, "")?;
    let config = AgentConfig {
        keys: keys.clone(),
        endpoints: vec![endpoint.to_string()],
        credentials: None,
        lease_ttl_secs: args.lease_ttl_secs,
        observe_every: Duration::from_secs(1),
        utilization: Cadence {
            interval: args.utilization_interval,
            dead_band: args.utilization_dead_band,
        },
    };
    let at_start = Metrics::read(endpoint)?;
    let t0 = Instant::now();
    let agents = SimAgents::spawn(
        &config,
        nodes,
        dir.path(),
        args.gpus,
        args.utilization_noise,
    )?;
    wait_joined(&client, &keys, args.nodes).await?;
    let registered_in = t0.elapsed();
    let after_join = Metrics::read(endpoint)?;

    let leader = Candidate::new(
        client.clone(),
        keys.clone(),
        LeaderInfo {
            id: "bench".into(),
            advertise: None,
        },
        30,
    )
    .campaign()
    .await?;
    let journal_prefix = keys.nodes_prefix();
    let revision = client
        .clone()
        .get(keys.root(), Some(GetOptions::new().with_count_only()))
        .await?
        .header()
        .map_or(0, |h| h.revision());
    let mut stream = client
        .clone()
        .watch(
            journal_prefix.as_str(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1),
            ),
        )
        .await?;
    let per_node = 4 * args.gpus as usize;
    let total = per_node * args.nodes;
    let t1 = Instant::now();
    // The leader's dispatcher: the ids reserved, then the whole plan in fenced transactions of
    // etcd's default `--max-txn-ops`, eight in flight at once.
    let mut dispatcher =
        Dispatcher::start(&client, &keys, leader.fence().clone(), DEFAULT_MAX_TXN_OPS).await?;
    let mut plan = Plan::default();
    for n in 0..args.nodes {
        let node = node_name(n);
        for action in layout(&node, args.gpus) {
            plan.actions.push(NodeAction {
                node: node.clone(),
                message: ActionMessage {
                    version: VERSION,
                    action,
                    launch: None,
                },
            });
        }
    }
    let dispatched = dispatcher.dispatch(&plan).await?;
    let written_in = t1.elapsed();
    let mut done = 0usize;
    let mut failed = Vec::new();
    while done + failed.len() < total {
        let Some(answer) = stream.message().await? else {
            bail!("etcd ended the watch");
        };
        for event in answer.events() {
            let Some(kv) = event.kv() else { continue };
            if !matches!(keys.parse_node_key(kv.key()), Some(NodeKey::Journal { .. })) {
                continue;
            }
            match serde_json::from_slice::<JournalRecord>(kv.value())? {
                JournalRecord::Done => done += 1,
                JournalRecord::Failed { error } => failed.push(error),
                JournalRecord::Intent => {}
            }
        }
    }
    let converged_in = t1.elapsed();
    let after_converge = Metrics::read(endpoint)?;
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let after_idle = Metrics::read(endpoint)?;

    // The control plane's view of this fleet: how long building it takes, what it costs in
    // memory (this process's resident set before and after, agents included, so approximate)
    // and what one cycle's observation from a snapshot costs.
    let rss_before = resident_bytes(None);
    let t2 = Instant::now();
    let mut view = FleetView::start(&client, &keys, Duration::from_secs(30), Vec::new()).await?;
    let full = view
        .wait_for(|s| {
            s.nodes()
                .filter(|n| n.observed.is_some() && n.utilization.is_some())
                .count()
                >= args.nodes
        })
        .await;
    let view_in = t2.elapsed();
    let rss_after = resident_bytes(None);
    let t3 = Instant::now();
    let observation = full.observation();
    let observation_in = t3.elapsed();
    drop(full);
    drop(view);
    agents.stop().await?;

    let mut out = String::new();
    writeln!(
        out,
        "tessera-fleet bench agents: {} nodes x {} GPUs, one process, etcd at {endpoint}",
        args.nodes, args.gpus
    )?;
    writeln!(
        out,
        "  registered (registration, observed, utilization) {:>8.2} s   etcd puts {:>7}   client bytes {:>11}",
        registered_in.as_secs_f64(),
        after_join.puts - at_start.puts,
        after_join.received_bytes - at_start.received_bytes
    )?;
    writeln!(
        out,
        "  {total} actions written ({} fenced txns, in waves of up to 8 at once) {:>8.2} s",
        dispatched.transactions,
        written_in.as_secs_f64()
    )?;
    writeln!(
        out,
        "  all journaled ({done} done, {} failed)      {:>8.2} s   etcd puts {:>7}   client bytes {:>11}",
        failed.len(),
        converged_in.as_secs_f64(),
        after_converge.puts - after_join.puts,
        after_converge.received_bytes - after_join.received_bytes
    )?;
    let idle_puts = after_idle.puts - after_converge.puts;
    writeln!(
        out,
        "  idle {} s after convergence                       etcd puts {:>7}   client bytes {:>11}   ({:.0} puts a minute)",
        args.idle_secs,
        idle_puts,
        after_idle.received_bytes - after_converge.received_bytes,
        idle_puts as f64 * 60.0 / args.idle_secs.max(1) as f64
    )?;
    writeln!(
        out,
        "  utilisation: noise {} points, written at most every {:?} beyond a dead band of {} points",
        args.utilization_noise, args.utilization_interval, args.utilization_dead_band
    )?;
    writeln!(
        out,
        "  fleet view: {} nodes, {} GPUs read and watched in {:.2} s; resident memory {} -> {} ({:+.1} MiB); an observation from a snapshot {:.1} ms",
        observation.nodes.len(),
        observation.details.len(),
        view_in.as_secs_f64(),
        mib(rss_before),
        mib(rss_after),
        (rss_after as f64 - rss_before as f64) / 1048576.0,
        observation_in.as_secs_f64() * 1000.0
    )?;
    if let Some(first) = failed.first() {
        writeln!(out, "  first failure: {first}")?;
    }
    print!("{out}");
    Ok(())
}

/// This process's (`None`) or process `pid`'s resident set (`VmRSS` in `/proc/PID/status`), in
/// bytes; 0 where it cannot be read.
pub(crate) fn resident_bytes(pid: Option<u32>) -> u64 {
    proc_status_bytes(pid, "VmRSS:")
}

/// A size field of `/proc/PID/status` (`VmRSS:`, `VmHWM:`), in bytes; 0 where it cannot be
/// read.
pub(crate) fn proc_status_bytes(pid: Option<u32>, field: &str) -> u64 {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    std::fs::read_to_string(path)
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with(field))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

/// The agents of a simulated fleet, each an `agent::run` loop on this process's runtime with
/// its own `sim` node, state directory, lease and watch.
pub(crate) struct SimAgents {
    stop: tokio::sync::watch::Sender<bool>,
    running: Vec<tokio::task::JoinHandle<Result<(), agent::AgentError>>>,
}

impl SimAgents {
    /// Starts one agent per node of `nodes`, their state under `dir/<node>`. With `noise`
    /// above 0 each GPU reports a steady utilisation with that much noise ([`Busy`]).
    pub(crate) fn spawn(
        config: &AgentConfig,
        nodes: Vec<tessera_compiler::model::Node>,
        dir: &std::path::Path,
        gpus: u32,
        noise: u32,
    ) -> anyhow::Result<SimAgents> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut running = Vec::with_capacity(nodes.len());
        for (n, node) in nodes.into_iter().enumerate() {
            let state = dir.join(&node.name);
            std::fs::create_dir_all(&state)?;
            let sim = SimDriver::from_nodes(std::slice::from_ref(&node), &state.join("sim.json"))?;
            let driver: Box<dyn NodeDriver> = if noise == 0 {
                Box::new(sim)
            } else {
                let mut busy = Busy::new(n as u64, gpus, noise);
                Box::new(ObserveHook::new(sim, move |o: &mut Observation| {
                    busy.report(o)
                }))
            };
            let runtime = Runtime::new(state.join("runtime"), Confinement::Insecure)?;
            let mut node = NodeState::open(&node.name, driver, runtime, &state, false)?;
            let config = config.clone();
            let mut stopped = stopped.clone();
            running.push(tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stopped.wait_for(|s| *s).await;
                };
                agent::run(&config, &mut node, shutdown).await
            }));
        }
        Ok(SimAgents { stop, running })
    }

    /// Stops every agent and waits for each; the first failure of one.
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        for agent in self.running {
            agent.await??;
        }
        Ok(())
    }
}

/// Waits until each of the `nodes` agents has joined: its registration, its first `observed`
/// and its first utilisation are in etcd.
pub(crate) async fn wait_joined(client: &Client, keys: &Keys, nodes: usize) -> anyhow::Result<()> {
    let count = |prefix: String| {
        let client = client.clone();
        async move {
            let answer = client
                .clone()
                .get(
                    prefix,
                    Some(GetOptions::new().with_prefix().with_count_only()),
                )
                .await?;
            anyhow::Ok(answer.count() as usize)
        }
    };
    loop {
        let registered = count(keys.registrations_prefix()).await?;
        let observed = count(keys.nodes_prefix()).await?;
        if registered + observed >= 3 * nodes {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

pub(crate) fn node_name(n: usize) -> String {
    format!("gpu-{n:04}")
}

/// The nodes `gpu-0000`… of pool `h100`, each with `gpus` H100 80GB, as a ClusterState file
/// (`dir/nodes.yaml`) read through the compiler like any other. `gpu_fields` is added to each
/// GPU's mapping as written (e.g. `, mig: {enabled: true}`), or empty.
pub(crate) fn fleet(
    dir: &std::path::Path,
    nodes: usize,
    gpus: u32,
    gpu_fields: &str,
) -> anyhow::Result<Vec<tessera_compiler::model::Node>> {
    let mut yaml = String::from(
        "apiVersion: tessera/v1alpha1\nkind: ClusterState\nmetadata: {name: bench}\nspec:\n  \
         observedAt: \"2026-11-26T00:00:00Z\"\n  nodes:\n",
    );
    for n in 0..nodes {
        writeln!(
            yaml,
            "    - {{name: {}, pool: h100, cpu: 200, memory: 1800Gi, gpus: [",
            node_name(n)
        )?;
        for g in 0..gpus {
            writeln!(
                yaml,
                "        {{index: {g}, uuid: GPU-{n:08x}-0000-0000-0000-{g:012x}, model: H100-SXM5-80GB{gpu_fields}}},"
            )?;
        }
        yaml.push_str("      ]}\n");
    }
    let path = dir.join("nodes.yaml");
    std::fs::write(&path, yaml)?;
    Ok(load_nodes(&path)?)
}

/// Every GPU: MIG on, reset, one 3g.40gb instance (profile 9) at slice 0 and its compute
/// instance.
fn layout(node: &str, gpus: u32) -> Vec<Action> {
    (0..gpus)
        .flat_map(|index| {
            let gpu = GpuRef {
                node: node.to_string(),
                index,
            };
            [
                Action::SetMigMode {
                    gpu: gpu.clone(),
                    enabled: true,
                },
                Action::ResetGpu { gpu: gpu.clone() },
                Action::CreateGpuInstance {
                    gpu: gpu.clone(),
                    profile_id: 9,
                    start: 0,
                },
                Action::CreateComputeInstance { gpu, start: 0 },
            ]
        })
        .collect()
}

/// What etcd's `/metrics` counts: puts and deletes applied, and bytes received from clients
/// over gRPC.
pub(crate) struct Metrics {
    pub(crate) puts: u64,
    pub(crate) deletes: u64,
    pub(crate) received_bytes: u64,
}

impl Metrics {
    pub(crate) fn read(endpoint: &str) -> anyhow::Result<Metrics> {
        let address = endpoint
            .strip_prefix("http://")
            .with_context(|| format!("{endpoint}: only http:// etcd URLs are measured"))?;
        let text = http_get(address, "/metrics")?;
        let value = |name: &str| metric(&text, name) as u64;
        Ok(Metrics {
            puts: value("etcd_mvcc_put_total"),
            deletes: value("etcd_mvcc_delete_total"),
            received_bytes: value("etcd_network_client_grpc_received_bytes_total"),
        })
    }
}

/// The sum of every sample of `name` (all its labels) in a Prometheus text exposition; 0 where
/// there is none.
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The body of a plain HTTP/1.0 GET of `path` from `address` (`host:port`); the status line
/// must say 200.
pub(crate) fn http_get(address: &str, path: &str) -> anyhow::Result<String> {
    let mut stream =
        TcpStream::connect(address).with_context(|| format!("cannot connect to {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {address}{path}: not an HTTP answer"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("GET {address}{path}: {status}");
    }
    Ok(body.to_string())
}

/// Steady GPU loads, reported with noise at every observation (through the sim driver's
/// observe hook): the utilisation a fleet that changes nothing shows. The levels and the noise
/// come from a generator seeded by the node's number, so a run is repeatable.
struct Busy {
    state: u64,
    levels: Vec<u32>,
    noise: u32,
}

impl Busy {
    fn new(seed: u64, gpus: u32, noise: u32) -> Busy {
        let mut busy = Busy {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            levels: Vec::new(),
            noise,
        };
        busy.levels = (0..gpus).map(|_| 30 + (busy.next() % 50) as u32).collect();
        busy
    }

    /// xorshift64*: enough for noise, and no dependency.
    fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Every GPU of `observation` at its level, give or take the noise.
    fn report(&mut self, observation: &mut Observation) {
        for detail in &mut observation.details {
            let level = self.levels[detail.gpu.index as usize];
            let spread = u64::from(2 * self.noise + 1);
            let percent = (level + (self.next() % spread) as u32).saturating_sub(self.noise);
            detail.utilization = Some(GpuUtilization {
                gpu_percent: percent,
                memory_percent: percent / 2,
            });
            detail.sm_activity = SmActivity::checked(percent.into(), f64::from(percent) / 2.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn a_metric_sums_its_samples_and_no_longer_name() {
        let text = "# HELP etcd_mvcc_put_total Puts.\n\
                    etcd_mvcc_put_total 7\n\
                    etcd_mvcc_put_total_extra 100\n\
                    grpc_received_bytes_total{type=\"unary\"} 1.5e3\n\
                    grpc_received_bytes_total{type=\"stream\"} 500\n";
        assert_eq!(metric(text, "etcd_mvcc_put_total"), 7.0);
        assert_eq!(metric(text, "grpc_received_bytes_total"), 2000.0);
        assert_eq!(metric(text, "etcd_mvcc_delete_total"), 0.0);
    }
}
