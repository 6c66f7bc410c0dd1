//! `tessera-fleet agent`: builds the node's driver and runtime from the flags and runs
//! `tessera_fleet::agent` until SIGTERM or SIGINT.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use tessera_fleet::access::Credentials;
use tessera_fleet::agent::{self, AgentConfig, AgentError, NodeState};
use tessera_fleet::keys::Keys;
use tessera_fleet::utilization::Cadence;
use tessera_reconciler::driver::NodeDriver;
use tessera_reconciler::driver::nvml::NvmlDriver;
use tessera_reconciler::driver::sim::{SimDriver, load_nodes};
use tessera_reconciler::runtime::{Confinement, Runtime, SandboxConfig};

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// This node's name, as the control plane knows it (a DNS subdomain name).
    #[arg(long)]
    pub node: String,
    /// etcd's client URLs, comma-separated (`http://10.0.0.1:2379,http://10.0.0.2:2379`).
    #[arg(long, value_delimiter = ',', required = true)]
    pub etcd: Vec<String>,
    /// The cluster: every key lives under `/tessera/<cluster>/`.
    #[arg(long, default_value = "default")]
    pub cluster: String,
    /// `nvml`: this machine's GPUs; `sim`: the simulated node of `--node-file`.
    #[arg(long, value_enum, default_value_t = DriverKind::Nvml)]
    pub driver: DriverKind,
    /// The NVML library to load (default: the system's `libnvidia-ml.so.1`).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// A ClusterState file describing this node: its pool, CPU, memory and labels (with
    /// `gpus: []` under `--driver nvml`, whose GPUs come from NVML), or its simulated GPUs
    /// under `--driver sim`.
    #[arg(long, value_name = "FILE")]
    pub node_file: Option<PathBuf>,
    /// `process`: start each workload's command; `none`: make devices, run nothing.
    #[arg(long, value_enum, default_value_t = RuntimeKind::Process)]
    pub runtime: RuntimeKind,
    /// Run workloads unconfined (as the agent's user with its view of the machine) where
    /// the host cannot sandbox them: never on a fleet shared by tenants who do not trust
    /// each other.
    #[arg(long)]
    pub insecure_runtime: bool,
    /// The agent's private directory (0700): its record of what it started, its workloads'
    /// logs and checkpoints, the simulated GPUs' state.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/tessera-agent")]
    pub state_dir: PathBuf,
    /// The registration lease's TTL: how long after the agent stops answering its node
    /// counts as lost.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub lease_ttl: Duration,
    /// The least time between two writes of the GPUs' utilisation.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub utilization_interval: Duration,
    /// The least move of a utilisation figure, in percentage points, worth writing (a
    /// crossing of the idle threshold always is).
    #[arg(long, default_value_t = 10.0, value_parser = percentage_points)]
    pub utilization_dead_band: f64,
    /// etcd user (with access control on): `tessera.<cluster>.node.<node>`.
    #[arg(long, requires = "password", conflicts_with = "credentials")]
    pub user: Option<String>,
    /// The user's password; better from the environment than on the command line.
    #[arg(
        long,
        env = "TESSERA_ETCD_PASSWORD",
        hide_env_values = true,
        requires = "user"
    )]
    pub password: Option<String>,
    /// A file holding `user:password` on its first line (as `etcdctl --user` takes it).
    #[arg(long, value_name = "FILE")]
    pub credentials: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DriverKind {
    Nvml,
    Sim,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    Process,
    None,
}

fn duration(value: &str) -> Result<Duration, String> {
    tessera_compiler::units::Duration::parse(value)
        .filter(|d| d.seconds() > 0)
        .map(|d| Duration::from_secs(d.seconds()))
        .ok_or_else(|| "not a duration of at least a second: write e.g. 5s, 10s or 1m".to_string())
}

/// Percentage points, 0 to 100.
pub(crate) fn percentage_points(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|p| (0.0..=100.0).contains(p))
        .ok_or_else(|| "not a number of percentage points from 0 to 100: write e.g. 10".to_string())
}

pub fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    init_logging("info");
    let keys = Keys::new(&args.cluster)?;
    tessera_fleet::keys::check_name("node", &args.node)?;
    let credentials = credentials(&args)?;
    private_dir(&args.state_dir)?;
    let driver = driver(&args)?;
    let confinement = if args.insecure_runtime {
        Confinement::Insecure
    } else {
        Confinement::Sandbox(SandboxConfig::default())
    };
    let runtime = Runtime::new(args.state_dir.join("runtime"), confinement)
        .context("cannot prepare the workload runtime")?;
    if let Some(why) = runtime.refusal()
        && args.runtime == RuntimeKind::Process
    {
        tracing::warn!("workloads cannot be sandboxed on this host, so starts will fail: {why}");
    }
    let mut node = NodeState::open(
        &args.node,
        driver,
        runtime,
        &args.state_dir,
        args.runtime == RuntimeKind::Process,
    )?;
    let config = AgentConfig {
        keys,
        endpoints: args.etcd.clone(),
        credentials,
        lease_ttl_secs: i64::try_from(args.lease_ttl.as_secs()).unwrap_or(i64::MAX),
        observe_every: Duration::from_secs(1),
        utilization: Cadence {
            interval: args.utilization_interval,
            dead_band: args.utilization_dead_band,
        },
    };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = tokio.block_on(agent::run(&config, &mut node, shutdown()));
    match result {
        Ok(()) => {
            tracing::info!("stopped; the node's workloads keep running");
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ AgentError::Refused(_)) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(3))
        }
        Err(e) => Err(e.into()),
    }
}

/// Resolves at SIGTERM or SIGINT.
async fn shutdown() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handling the agent runs until killed, which it survives anyway.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn credentials(args: &AgentArgs) -> anyhow::Result<Option<Credentials>> {
    if let (Some(user), Some(password)) = (&args.user, &args.password) {
        return Ok(Some(Credentials {
            user: user.clone(),
            password: password.clone(),
        }));
    }
    let Some(path) = &args.credentials else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the credentials file {}", path.display()))?;
    let line = text.lines().next().unwrap_or_default();
    let Some((user, password)) = line.split_once(':') else {
        bail!(
            "{}:1: write the credentials as `user:password` on the first line",
            path.display()
        );
    };
    if user.is_empty() || password.is_empty() {
        bail!(
            "{}:1: the user and the password must not be empty",
            path.display()
        );
    }
    Ok(Some(Credentials {
        user: user.to_string(),
        password: password.to_string(),
    }))
}

fn driver(args: &AgentArgs) -> anyhow::Result<Box<dyn NodeDriver>> {
    let Some(file) = &args.node_file else {
        bail!(
            "--node-file FILE is needed: a ClusterState file describing node {} (its pool, \
             CPU, memory and labels{})",
            args.node,
            match args.driver {
                DriverKind::Nvml => ", with `gpus: []`",
                DriverKind::Sim => ", and its simulated GPUs",
            }
        );
    };
    Ok(match args.driver {
        DriverKind::Sim => {
            let nodes = load_nodes(file)?;
            let mine: Vec<_> = nodes.into_iter().filter(|n| n.name == args.node).collect();
            if mine.is_empty() {
                bail!("{}: describes no node named {}", file.display(), args.node);
            }
            Box::new(SimDriver::from_nodes(&mine, &sim_state(&args.state_dir))?)
        }
        DriverKind::Nvml => {
            let mut nodes = load_nodes(file)?;
            if nodes.len() != 1 || nodes[0].name != args.node {
                bail!(
                    "{}: --driver nvml drives this machine only: describe exactly node {} \
                     (found {})",
                    file.display(),
                    args.node,
                    nodes
                        .iter()
                        .map(|n| n.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            Box::new(NvmlDriver::open(args.nvml_lib.as_deref(), nodes.remove(0))?)
        }
    })
}

/// Creates the state directory, or narrows an existing one, to its owner alone (0700): it
/// holds the agent's record, its workloads' logs and checkpoints.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot make {} private (0700)", dir.display()))
}

/// Where the simulated GPUs keep their geometry across restarts of the agent.
fn sim_state(state_dir: &Path) -> PathBuf {
    state_dir.join("sim-node.json")
}

/// Logs to stderr, filtered by `RUST_LOG` (`default` when unset): one line per action, inside
/// its span (the journal id).
pub fn init_logging(default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
