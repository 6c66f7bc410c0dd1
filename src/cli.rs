//! The command line's shape: flags are parsed here and nowhere else.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "GitOps control plane for shared GPU fleets",
    long_about = "tessera compiles a Git repository of GPU-sharing policy (tenants, quotas, SLO \
                  classes, pools, MIG layouts), solves placement each cycle, and drives the nodes \
                  toward the decision.\n\nExit codes: 0 success; 1 problems found in the input; \
                  2 usage or I/O error."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check policy files: syntax, schema and meaning. Exit 1 on any error.
    Validate {
        /// Files or directories (searched for *.yaml and *.yml, hidden directories skipped).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = DiagnosticFormat::Human)]
        output: DiagnosticFormat,
        /// Treat warnings as errors (exit 1).
        #[arg(long)]
        deny_warnings: bool,
    },
    /// Print the resolved policy.
    Compile {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = CompileFormat::Json)]
        output: CompileFormat,
    },
    /// Write or check the JSON Schemas of every document kind.
    Schema {
        /// Write one `<Kind>.schema.json` per kind into DIR.
        #[arg(
            long,
            value_name = "DIR",
            conflicts_with = "check",
            required_unless_present = "check"
        )]
        out: Option<PathBuf>,
        /// Exit 1 when the schemas in DIR differ from what this build generates.
        #[arg(long, value_name = "DIR")]
        check: Option<PathBuf>,
    },
    /// MIG geometry of the built-in GPU models.
    #[command(subcommand)]
    Mig(MigCommand),
}

#[derive(Debug, Subcommand)]
pub enum MigCommand {
    /// Every maximal valid layout of a GPU model, with placements.
    Layouts {
        gpu_model: String,
        #[arg(long, value_enum, default_value_t = TextOrJson::Human)]
        output: TextOrJson,
    },
    /// Whether a multiset of profiles fits one GPU; prints a placement (exit 0) or why not (exit 1).
    Check {
        gpu_model: String,
        /// Profile names (`3g.40gb`) or IDs (`9`); repeat one to ask for it twice.
        #[arg(required = true)]
        profiles: Vec<String>,
        #[arg(long, value_enum, default_value_t = TextOrJson::Human)]
        output: TextOrJson,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiagnosticFormat {
    /// For people: the source line with a caret.
    Human,
    /// Versioned, stable JSON.
    Json,
    /// GitHub Actions workflow commands (annotations on the pull request's files).
    Github,
    /// SARIF 2.1.0, for code scanning.
    Sarif,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompileFormat {
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TextOrJson {
    Human,
    Json,
}
