//! `tessera-fleet`: fleet mode's processes. `tessera agent ARGS…` runs `tessera-fleet agent
//! ARGS…`, so that the `tessera` binary builds without fleet mode's dependencies (etcd's
//! client needs `protoc`).
//!
//! `tessera reconcile --store etcd://…` runs `tessera-fleet reconcile ARGS…` the same way.
//!
//! Exit codes: 0 after a clean shutdown (SIGTERM or SIGINT); 2 for a usage or start-up error;
//! 3 when etcd refuses the agent (its credentials may not act for this node).

// mimalloc rather than the system allocator: at fleet scale the compiler and the solver
// allocate and free millions of small objects a cycle, and glibc's malloc spent about a third
// of the 12.5x reference fleet's compile in freeing and consolidating (BENCHMARKS.md). Set up
// in `alloc/`, as for every bench: what a cycle frees stays committed for the next one.
#[global_allocator]
static ALLOCATOR: tessera_alloc::Allocator = tessera_alloc::Allocator;

mod access;
mod agent;
mod bench;
mod bench_converge;
mod bench_metering;
mod forward;
mod reconcile;
mod secret;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tessera-fleet",
    version,
    about = "tessera's fleet mode on etcd"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent on a GPU machine: register the node in etcd, apply the actions the
    /// control plane addresses to it, run its workloads, report what it observes.
    Agent(Box<agent::AgentArgs>),
    /// Run one control-plane replica on etcd (`--store etcd://HOST:PORT[,...]`): it leads, or
    /// stands by serving reads until it does. The flags are `tessera reconcile`'s.
    Reconcile(Box<tessera_service_cli::ReconcileArgs>),
    /// etcd's users and roles for fleet mode (access control on, the control plane's user,
    /// one user per node), made with etcd's `root`.
    #[command(subcommand)]
    Access(access::AccessCommand),
    /// Benchmarks that print figures (they never assert).
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Many simulated agents in this process against a real etcd, each with its own lease
    /// and watch: registration, a MIG layout on every GPU, time until all is journaled, and
    /// etcd's writes and bytes.
    Agents(bench::BenchAgentsArgs),
    /// Issue 17's scale figures on the control plane users run: simulated agents in this
    /// process, a real `tessera-fleet reconcile` replica (a child process) leading them, a
    /// policy commit that re-partitions every GPU; time from the commit until every node shows
    /// the new geometry, etcd's writes, the replica's memory, and (`--failover`) the time a
    /// standby takes to lead once the leader is SIGKILLed.
    Converge(bench_converge::BenchConvergeArgs),
    /// The control plane's metering of a steady fleet on a real etcd: puts per steady cycle.
    Metering(bench_metering::BenchMeteringArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Agent(args) => match agent::run(*args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Reconcile(args) => match reconcile::run(*args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Access(command) => match access::run(command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Bench(BenchCommand::Metering(args)) => match bench_metering::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Bench(BenchCommand::Converge(args)) => match bench_converge::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Bench(BenchCommand::Agents(args)) => match bench::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}
