//! `tessera`: the command line. Parsing and dispatch only; every verb is a thin layer over the
//! library crates.
//!
//! Exit codes (stable, for CI):
//! - 0: success, nothing to report;
//! - 1: the input has problems (diagnostics), a check failed (stale schemas, a MIG layout that
//!   does not fit);
//! - 2: usage or I/O error (bad flags, a path that does not exist, an unwritable file).

// mimalloc rather than the system allocator: at fleet scale the compiler and the solver
// allocate and free millions of small objects a cycle, and glibc's malloc spent about a third
// of the 12.5x reference fleet's compile in freeing and consolidating (BENCHMARKS.md). Set up
// in `alloc/`, as for every bench: what a cycle frees stays committed for the next one.
#[global_allocator]
static ALLOCATOR: tessera_alloc::Allocator = tessera_alloc::Allocator;

mod cli;
mod cmd;
mod git;
mod output;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // Under `--detailed-exitcode` (Terraform's contract) 2 means "changes", so a usage
            // error must read as an error: 1.
            let detailed = std::env::args_os().any(|a| a == "--detailed-exitcode");
            return match e.exit_code() {
                0 => ExitCode::SUCCESS,
                _ if detailed => ExitCode::from(1),
                code => ExitCode::from(u8::try_from(code).unwrap_or(2)),
            };
        }
    };
    match cmd::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
