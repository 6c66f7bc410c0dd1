//! `tessera-fleet`: fleet mode's processes. `tessera agent ARGS…` runs `tessera-fleet agent
//! ARGS…`, so that the `tessera` binary builds without fleet mode's dependencies (etcd's
//! client needs `protoc`).
//!
//! Exit codes: 0 after a clean shutdown (SIGTERM or SIGINT); 2 for a usage or start-up error;
//! 3 when etcd refuses the agent (its credentials may not act for this node).

mod agent;

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
    }
}
