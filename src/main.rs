//! `tessera`: the command line. Parsing and dispatch only; every verb is a thin layer over the
//! library crates.
//!
//! Exit codes (stable, for CI):
//! - 0: success, nothing to report;
//! - 1: the input has problems (diagnostics), a check failed (stale schemas, a MIG layout that
//!   does not fit);
//! - 2: usage or I/O error (bad flags, a path that does not exist, an unwritable file).

mod cli;
mod cmd;
mod output;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cmd::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
