//! `tessera observe`: one observation through a node driver, printed; nothing is changed.
//!
//! Under `--driver nvml` it is what the service would see on this machine: the quickest check
//! that a node's driver, permissions and GPU models are what tessera expects, before
//! `reconcile` is let loose on it.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use tessera_compiler::model::Health;
use tessera_reconciler::driver::sim::SimDriver;
use tessera_reconciler::driver::{NodeDriver, Observation};

use super::reconcile::nvml_driver;
use crate::cli::{DriverKind, ObserveArgs, TextOrJson};
use crate::output::emit;

pub fn run(args: &ObserveArgs) -> anyhow::Result<ExitCode> {
    let (observation, about) = match args.driver {
        DriverKind::Nvml => {
            let mut nvml = nvml_driver(Some(&args.nodes), args.nvml_lib.as_deref())?;
            let about = format!(
                "nvml: {} (NVIDIA driver {})",
                nvml.library(),
                nvml.driver_version()
            );
            (nvml.observe()?, about)
        }
        DriverKind::Sim => {
            let state = args.state_dir.join("sim-nodes.json");
            if state.exists() {
                let mut sim = SimDriver::open(&args.nodes, &state)?;
                (sim.observe()?, format!("sim: {}", state.display()))
            } else {
                // No service state yet: the nodes as the file describes them, from a state kept
                // only for this command, so that observing writes nothing of the service's.
                let scratch = std::env::temp_dir()
                    .join(format!("tessera-observe-{}.json", std::process::id()));
                let observed = (|| -> anyhow::Result<Observation> {
                    let mut sim = SimDriver::open(&args.nodes, &scratch)?;
                    Ok(sim.observe()?)
                })();
                let _ = std::fs::remove_file(&scratch);
                (observed?, format!("sim: {}", args.nodes.display()))
            }
        }
    };
    match args.output {
        TextOrJson::Human => emit(&human(&observation, &about))?,
        TextOrJson::Json => {
            let json = serde_json::json!({ "driver": about, "observation": observation });
            emit(&(serde_json::to_string_pretty(&json).context("JSON output")? + "\n"))?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One block per node: each GPU with its MIG mode, then its GPU instances (profile, placement,
/// compute instances) and the processes holding it.
fn human(o: &Observation, about: &str) -> String {
    let mut out = format!("{about}\n");
    for node in &o.nodes {
        let _ = writeln!(out, "node {} (pool {})", node.name, node.pool);
        for gpu in &node.gpus {
            let mig = match (gpu.mig.enabled, gpu.mig.pending) {
                (now, Some(next)) => format!("MIG {} (pending {})", on(now), on(next)),
                (now, None) => format!("MIG {}", on(now)),
            };
            let health = match gpu.health {
                Health::Healthy => "healthy",
                Health::Degraded => "degraded",
                Health::Lost => "lost",
            };
            let _ = writeln!(
                out,
                "  GPU {}  {}  {}  {health}  {mig}",
                gpu.index, gpu.model, gpu.uuid
            );
            let detail = o
                .details
                .iter()
                .find(|d| d.gpu.node == node.name && d.gpu.index == gpu.index);
            let Some(detail) = detail else { continue };
            for gi in &detail.instances {
                let shown = gpu.instances.iter().find(|i| i.start == gi.start);
                let profile = shown.map_or(gi.profile_id.to_string(), |i| i.profile.clone());
                let _ = writeln!(
                    out,
                    "    GI {:<2} {:<12} profile ID {:<2} start {}",
                    gi.id, profile, gi.profile_id, gi.start
                );
                for ci in &gi.compute_instances {
                    let _ = writeln!(out, "      CI {}  {}", ci.id, ci.uuid);
                }
            }
            for p in &detail.processes {
                let on_gi = p
                    .gpu_instance
                    .map_or_else(|| "the whole GPU".to_owned(), |g| format!("GI {g}"));
                let _ = writeln!(out, "    process {} on {on_gi}", p.pid);
            }
        }
    }
    out
}

fn on(enabled: bool) -> &'static str {
    if enabled { "enabled" } else { "disabled" }
}
