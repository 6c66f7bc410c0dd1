//! What the flags make: the service's [`Config`] and its node driver.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tessera_reconciler::driver::faults::{FaultPlan, FaultPlanError};
use tessera_reconciler::driver::nvml::NvmlDriver;
use tessera_reconciler::driver::sim::{SimDriver, SimError, load_nodes};
use tessera_reconciler::driver::{DriverError, NodeDriver};
use tessera_reconciler::repo::{Source, TrustError, TrustedSigners};
use tessera_reconciler::runtime::{Confinement, SandboxConfig};
use tessera_reconciler::service::Config;
use tessera_reconciler::service::retention::Retention;

use crate::args::{DriverKind, ReconcileArgs, RuntimeKind};

/// Why the flags do not make a service.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("--cycle-period must be at least 1s")]
    CyclePeriod,
    #[error("--prune-interval must be at least 1m")]
    PruneInterval,
    #[error(
        "--retain-workloads ({keep}s) is shorter than --restart-backoff-max ({backoff}s): a \
         crash-looping committed workload's history would be deleted while it waits; keep \
         ended workloads longer"
    )]
    RetentionBelowBackoff { keep: u64, backoff: u64 },
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot prepare the state directory {path}: {source}")]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Trust(#[from] TrustError),
    #[error("--driver sim needs --nodes FILE: a ClusterState file describing the nodes")]
    SimNeedsNodes,
    #[error(
        "--driver nvml needs --nodes FILE: a ClusterState file with this machine's node (name, \
         pool, cpu, memory, labels) and `gpus: []`; the GPUs come from NVML"
    )]
    NvmlNeedsNodes,
    #[error(
        "{path}: --driver nvml drives this machine only: describe exactly one node (found {found})"
    )]
    NvmlOneNode { path: PathBuf, found: usize },
    #[error(
        "--faults is for --driver sim; under --driver nvml faults come from the GPUs (or from \
         the stand-in library's state file in tests)"
    )]
    FaultsNeedSim,
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error(transparent)]
    Faults(#[from] FaultPlanError),
    #[error(transparent)]
    Driver(#[from] DriverError),
}

/// The service's configuration from its flags (the trusted signers read from their files).
pub fn config(args: &ReconcileArgs) -> Result<Config, SetupError> {
    let source = Source {
        url: args.repo.clone(),
        branch: args.branch.clone(),
        subdir: args.path.clone(),
    };
    let mut config = Config::new(source, args.state_dir.clone());
    config.cycle_period = args.cycle_period;
    config.fetch_interval = args.fetch_interval;
    config.solve_time_limit = args.time_limit;
    config.restart_backoff_base = args.restart_backoff;
    config.restart_backoff_max = args.restart_backoff_max;
    config.incremental = !args.full_cycles_only;
    config.limits.max_live_submitted_per_tenant =
        usize::try_from(args.max_submitted_per_tenant).unwrap_or(usize::MAX);
    config.run_commands = args.runtime == RuntimeKind::Process;
    config.confinement = if args.insecure_runtime {
        Confinement::Insecure
    } else {
        let mut sandbox = SandboxConfig::default();
        // The service hides the state directory and the store itself; here, the secrets it
        // was handed (the tokens and the webhook secret).
        sandbox.hidden.extend(args.tokens.iter().cloned());
        sandbox
            .hidden
            .extend(args.webhook_secret_file.iter().cloned());
        Confinement::Sandbox(sandbox)
    };
    if args.signatures.verify_signatures {
        config.trusted_signers = Some(load_trust(&args.signatures.trusted_signers)?);
    }
    if config.cycle_period.is_zero() {
        return Err(SetupError::CyclePeriod);
    }
    let keep = &args.retention;
    config.retention = Retention {
        journal: keep.retain_journal.duration(),
        events: keep.retain_events.duration(),
        workloads: keep.retain_workloads.duration(),
        usage: keep.retain_usage.duration(),
        interval: keep.prune_interval,
    };
    if keep.prune_interval < Duration::from_secs(60) {
        return Err(SetupError::PruneInterval);
    }
    if let Some(workloads) = config.retention.workloads
        && workloads <= config.restart_backoff_max
    {
        return Err(SetupError::RetentionBelowBackoff {
            keep: workloads.as_secs(),
            backoff: config.restart_backoff_max.as_secs(),
        });
    }
    Ok(config)
}

/// Creates the state directory with a `.gitignore` that ignores everything in it: the default
/// lies in the working directory, often a clone of the policy repository, and what the service
/// keeps there (a database, a mirror, logs) must never be committed with the policy.
pub fn prepare_state_dir(dir: &Path) -> Result<(), SetupError> {
    let io = |source| SetupError::StateDir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let ignore = dir.join(".gitignore");
    if !ignore.exists() {
        std::fs::write(
            &ignore,
            "# Written by tessera reconcile: the service's state, never part of a repository.\n*\n",
        )
        .map_err(io)?;
    }
    Ok(())
}

/// The trusted signers in these files (`allowed_signers` entries, armored OpenPGP keys).
pub fn load_trust(paths: &[PathBuf]) -> Result<TrustedSigners, SetupError> {
    let mut trusted = TrustedSigners::default();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| SetupError::Read {
            path: path.clone(),
            source,
        })?;
        trusted.add(&path.display().to_string(), &text)?;
    }
    Ok(trusted)
}

/// The node driver the flags name; the simulated nodes keep their state in the state
/// directory (`sim-nodes.json`).
pub fn driver(args: &ReconcileArgs) -> Result<Box<dyn NodeDriver>, SetupError> {
    Ok(match args.driver {
        DriverKind::Sim => {
            let Some(nodes) = &args.nodes else {
                return Err(SetupError::SimNeedsNodes);
            };
            let mut sim = SimDriver::open(nodes, &args.state_dir.join("sim-nodes.json"))?;
            if let Some(faults) = &args.faults {
                sim.set_faults(FaultPlan::load(faults)?);
            }
            Box::new(sim)
        }
        DriverKind::Nvml => {
            if args.faults.is_some() {
                return Err(SetupError::FaultsNeedSim);
            }
            Box::new(nvml_driver(
                args.nodes.as_deref(),
                args.nvml_lib.as_deref(),
            )?)
        }
    })
}

/// The `nvml` driver for this machine, described by the one-node `descriptor` file.
pub fn nvml_driver(
    descriptor: Option<&Path>,
    lib: Option<&Path>,
) -> Result<NvmlDriver, SetupError> {
    let Some(descriptor) = descriptor else {
        return Err(SetupError::NvmlNeedsNodes);
    };
    let mut nodes = load_nodes(descriptor)?;
    if nodes.len() != 1 {
        return Err(SetupError::NvmlOneNode {
            path: descriptor.to_path_buf(),
            found: nodes.len(),
        });
    }
    Ok(NvmlDriver::open(lib, nodes.remove(0))?)
}
