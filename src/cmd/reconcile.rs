//! `tessera reconcile`: flags to the service's options, then the service runs until stopped
//! (or, with `--once`, until a cycle has nothing left to do).

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use tessera_reconciler::actions::Action;
use tessera_reconciler::auth::Tokens;
use tessera_reconciler::service::{
    CycleReport, NodeSource, OnceOptions, ServeOptions, Status, StoreSource, run_once, serve,
};
use tessera_service_cli::{StoreArg, setup};

use crate::cli::{DriverKind, ReconcileArgs, TextOrJson};
use crate::output::count::count;
use crate::output::emit;

pub fn run(args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let db = match args.store() {
        StoreArg::Sqlite(db) => db,
        // Fleet mode is another binary's (etcd's client needs protoc to build); the flags are
        // the same, so they are passed on as given.
        StoreArg::Etcd(_) => {
            if args.once {
                bail!("--once runs without replicas: use --store sqlite:PATH (the default)");
            }
            let rest: Vec<_> = std::env::args_os()
                .skip_while(|a| a != "reconcile")
                .skip(1)
                .collect();
            return super::agent::exec("reconcile", &rest);
        }
    };
    init_logging();
    let config = setup::config(&args)?;
    if let Some(trusted) = &config.trusted_signers {
        eprintln!(
            "tessera reconcile: applying only commits signed by {} trusted key(s)",
            trusted.len()
        );
    }
    let hooks = match &args.webhook_secret_file {
        Some(path) if args.once => {
            bail!(
                "--webhook-secret-file serves a route; it has no use with --once ({})",
                path.display()
            )
        }
        Some(path) => Some(tessera_reconciler::api::hooks::HookSecret::load(path)?),
        None => None,
    };
    setup::prepare_state_dir(&args.state_dir)?;
    let driver = setup::driver(&args)?;

    if args.once {
        let (status, reports) = run_once(OnceOptions {
            config,
            db: db.clone(),
            driver,
            max_cycles: 20,
        })?;
        match args.output {
            TextOrJson::Json => {
                let reports: Vec<_> = reports.iter().map(report_json).collect();
                let value = serde_json::json!({ "status": status, "cycles": reports });
                emit(&(serde_json::to_string_pretty(&value)? + "\n"))?;
            }
            TextOrJson::Human => {
                let mut text = human(&status, &reports);
                text.push_str(&summary(&reports));
                text.push_str(&where_next(&args, &db));
                emit(&text)?
            }
        }
        let good = status.sync == tessera_reconciler::service::Sync::Synced
            && status.health == tessera_reconciler::service::Health::Healthy;
        return Ok(if good {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }

    let tokens = match &args.tokens {
        Some(path) => Tokens::load(path)?,
        None => Tokens::default(),
    };
    eprintln!(
        "tessera reconcile: following {} ({}), driver {}",
        args.repo,
        args.branch,
        driver.kind()
    );
    serve(ServeOptions {
        config,
        store: StoreSource::Sqlite(db),
        listen: args.listen,
        tokens,
        nodes: NodeSource::Local(driver),
        hooks,
        on_listen: Some(Box::new(|addr| {
            // Tests and scripts read this line to find a port chosen with :0.
            println!("tessera reconcile: API listening on http://{addr}");
        })),
        stop: None,
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Logs to stderr, filtered by `RUST_LOG` (`info` when unset or unreadable): one line per
/// cycle that changed something and per action, with the cycle's number and revision, and the
/// action's journal id, node and workload.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Fails only when a subscriber is already set, which leaves that one in force.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// The `nvml` driver for this machine (`tessera observe` uses it too).
pub(super) use tessera_service_cli::setup::nvml_driver;

fn report_json(r: &CycleReport) -> serde_json::Value {
    serde_json::json!({
        "cycle": r.cycle,
        "revision": r.revision,
        "actions": r.plan.actions,
        "waits": r.plan.waits,
        "failed": r.failed.iter().map(|(a, e)| serde_json::json!({"action": a, "error": e})).collect::<Vec<_>>(),
        "exits": r.exits,
        "error": r.error,
    })
}

fn human(status: &Status, reports: &[CycleReport]) -> String {
    let mut out = String::new();
    for r in reports {
        out.push_str(&format!(
            "cycle {}: {} actions, {} waiting, {} failed{}\n",
            r.cycle,
            r.plan.actions.len(),
            r.plan.waits.len(),
            r.failed.len(),
            r.error
                .as_ref()
                .map(|e| format!(" (error: {e})"))
                .unwrap_or_default()
        ));
        for a in &r.plan.actions {
            out.push_str(&format!("  {a}\n"));
        }
        for (a, e) in &r.failed {
            out.push_str(&format!("  failed: {a}: {e}\n"));
        }
        for w in &r.plan.waits {
            out.push_str(&format!("  waiting: {w}\n"));
        }
        for (name, how) in &r.exits {
            out.push_str(&format!("  ended: {name} {how}\n"));
        }
    }
    out.push_str(&format!(
        "{} {} at revision {}{}\n",
        status.sync_label(),
        status.health_label(),
        status.revision.as_deref().unwrap_or("none"),
        status
            .last_error
            .as_ref()
            .map(|e| format!("; {e}"))
            .unwrap_or_default()
    ));
    for d in &status.diagnostics {
        out.push_str(&format!("  {d}\n"));
    }
    out
}

/// What the cycles changed, in a newcomer's terms: geometry made and workloads started.
fn summary(reports: &[CycleReport]) -> String {
    let mut modes = 0;
    let mut instances = 0;
    let mut started = Vec::new();
    for r in reports {
        let failed = |a: &Action| r.failed.iter().any(|(f, _)| f == a) || r.skipped.contains(a);
        for a in r.plan.actions.iter().filter(|a| !failed(a)) {
            match a {
                Action::SetMigMode { enabled: true, .. } => modes += 1,
                Action::CreateGpuInstance { .. } => instances += 1,
                Action::Start { workload, bindings } => started.push(format!(
                    "{workload} ({})",
                    count(bindings.len(), "replica", "replicas")
                )),
                _ => {}
            }
        }
    }
    let waiting = reports
        .last()
        .and_then(|r| r.decision.as_ref())
        .map_or(0, |d| {
            d.workloads
                .iter()
                .filter(|w| matches!(w.outcome, tessera_solver::Outcome::Pending { .. }))
                .count()
        });
    let mut out =
        format!("geometry: MIG mode enabled on {modes} GPUs, {instances} GPU instances created\n");
    if started.is_empty() {
        out.push_str("started: no workload\n");
    } else {
        out.push_str(&format!(
            "started: {}: {}\n",
            count(started.len(), "workload", "workloads"),
            started.join(", ")
        ));
    }
    if waiting > 0 {
        out.push_str(&format!(
            "waiting: {}, each with its reason in `tessera solve`\n",
            count(waiting, "workload", "workloads")
        ));
    }
    out
}

/// Where a newcomer looks next: the state the run left and the commands that read it.
fn where_next(args: &ReconcileArgs, db: &Path) -> String {
    let dir = args.state_dir.display();
    let mut out = format!("\nstate kept in {dir}/ (database {}", db.display());
    if args.driver == DriverKind::Sim {
        out.push_str(&format!(", simulated GPUs {dir}/sim-nodes.json"));
    }
    out.push_str(&format!(
        "); a second run finds the fleet as this one left it, `rm -rf {dir}` starts over\n\
         next: drop --once to serve the API on {listen} (`tessera status`, `tessera submit FILE`, \
         `curl {listen}/metrics`), or see one decision with `tessera solve --policy DIR --state FILE`\n",
        listen = args.listen,
    ));
    out
}
