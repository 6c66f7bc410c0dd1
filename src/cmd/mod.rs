//! One module per verb.

mod agent;
mod bench;
mod client;
mod compile;
mod interop;
mod mig;
mod observe;
mod plan;
mod reconcile;
mod report;
mod schema;
mod service_bench;
mod simulate;
mod solve;
mod validate;
mod verify;

use std::process::ExitCode;

use crate::cli::{
    BenchCommand, Cli, Command, ExportCommand, ImportCommand, MigCommand, ReportCommand,
};

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Validate {
            paths,
            output,
            deny_warnings,
        } => validate::run(&paths, output, deny_warnings),
        Command::Compile { paths, output } => compile::run(&paths, output),
        Command::Schema { out, check } => schema::run(out.as_deref(), check.as_deref()),
        Command::Mig(MigCommand::Layouts { gpu_model, output }) => mig::layouts(&gpu_model, output),
        Command::Mig(MigCommand::Check {
            gpu_model,
            profiles,
            output,
        }) => mig::check(&gpu_model, &profiles, output),
        Command::Plan {
            repo,
            base,
            head,
            path,
            policy,
            state,
            output,
            detailed_exitcode,
            out,
            signatures,
        } => plan::run(plan::Args {
            repo,
            base,
            head,
            path,
            policy,
            state,
            output,
            detailed_exitcode,
            out,
            signatures,
        }),
        Command::Verify {
            repo,
            rev,
            trusted_signers,
            output,
        } => verify::run(&repo, &rev, &trusted_signers, output),
        Command::Export(ExportCommand::Kueue { policy, out }) => {
            interop::export_kueue(&policy, &out)
        }
        Command::Export(ExportCommand::MigParted { policy, out }) => {
            interop::export_mig_parted(&policy, out.as_deref())
        }
        Command::Import(ImportCommand::Kueue { paths, out }) => interop::import_kueue(&paths, &out),
        Command::Simulate(args) => simulate::run(&args),
        Command::Solve {
            policy,
            state,
            output,
            time_limit,
        } => solve::run(&policy, state.as_deref(), output, time_limit),
        Command::Bench(BenchCommand::Openb {
            trace,
            nodes,
            seeds,
            variant,
            mode,
            cycle,
            bound,
            gpu_spec_share,
            spec_seed,
            cpu_only,
            cpu_only_rows,
            first_refusal,
            policies,
            paper,
            output,
        }) => bench::openb(bench::OpenbArgs {
            trace: &trace,
            nodes: &nodes,
            seeds,
            variant,
            cycle: (mode == crate::cli::OpenbMode::Cycles).then_some(cycle),
            policies: &policies,
            paper: paper.as_deref(),
            bound,
            gpu_spec: (gpu_spec_share > 0.0).then_some((gpu_spec_share, spec_seed)),
            cpu_only,
            cpu_only_rows,
            first_refusal,
            output,
        }),
        Command::Bench(BenchCommand::Service {
            nodes,
            orgs,
            running,
            clients,
            rate,
            duration,
            full_cycles_only,
            output,
        }) => service_bench::run(service_bench::ServiceBenchArgs {
            nodes: nodes as usize,
            orgs: orgs as usize,
            running: running as usize,
            clients: clients as usize,
            rate,
            duration,
            full_cycles_only,
            output,
        }),
        Command::Reconcile(args) => reconcile::run(*args),
        Command::Agent { args } => agent::run(&args),
        Command::Observe(args) => observe::run(&args),
        Command::Submit { file, server } => client::submit(&file, &server),
        Command::Cancel {
            name,
            tenant,
            server,
        } => client::cancel(&name, tenant.as_deref(), &server),
        Command::Get {
            resource: _,
            tenant,
            output,
            server,
        } => client::get(tenant.as_deref(), output, &server),
        Command::Describe {
            name,
            tenant,
            output,
            server,
        } => client::describe(&name, tenant.as_deref(), output, &server),
        Command::Status { server, output } => client::status(&server, output),
        Command::Report(ReportCommand::Usage {
            server,
            since,
            until,
            by,
            team_depth,
            rates,
            output,
        }) => report::usage(report::UsageArgs {
            server,
            since,
            until,
            by,
            team_depth,
            rates,
            output,
        }),
    }
}

/// Reads and compiles the given paths; I/O failures are usage errors (exit 2).
fn compile_paths(
    paths: &[std::path::PathBuf],
) -> anyhow::Result<(
    tessera_compiler::Compilation,
    Vec<tessera_compiler::SourceFile>,
)> {
    let loaded = tessera_compiler::source::discover(paths)?;
    let sources: Vec<_> = loaded
        .iter()
        .filter_map(|l| match l {
            tessera_compiler::Loaded::File(f) => Some(f.clone()),
            _ => None,
        })
        .collect();
    Ok((tessera_compiler::compile_loaded(loaded), sources))
}
