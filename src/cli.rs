//! The command line's shape: flags are parsed here and nowhere else (`reconcile`'s in
//! `tessera-service-cli`, which `tessera-fleet reconcile` shares).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use tessera_service_cli::args::duration;
pub use tessera_service_cli::{DriverKind, ReconcileArgs, SignatureArgs, TextOrJson};

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
    /// What a policy change would do, like `terraform plan`: the semantic diff between two Git
    /// revisions, the head validated with a cluster-state snapshot. Exit 1 when the head is
    /// invalid; with --detailed-exitcode, 0 no changes, 1 error, 2 changes.
    #[command(group(clap::ArgGroup::new("source").required(true).args(["repo", "policy"])))]
    Plan {
        /// A Git repository, bare or with a work tree (nothing is checked out).
        #[arg(long, value_name = "PATH", requires_all = ["base", "head"])]
        repo: Option<PathBuf>,
        /// The revision to compare against (a branch, tag or commit: `origin/main`).
        #[arg(long, value_name = "REV", requires = "repo")]
        base: Option<String>,
        /// The revision to plan (`HEAD`, the pull request's commit).
        #[arg(long, value_name = "REV", requires = "repo")]
        head: Option<String>,
        /// The policy directory inside the repository (default: the whole repository).
        #[arg(long, value_name = "SUBDIR", requires = "repo")]
        path: Option<String>,
        /// Without Git: validate DIR with the state; no diff (there is no base).
        #[arg(long, value_name = "DIR", conflicts_with = "repo")]
        policy: Option<PathBuf>,
        /// A ClusterState snapshot (YAML or JSON); its SHA-256 pins a saved plan.
        #[arg(long, value_name = "FILE")]
        state: PathBuf,
        #[arg(long, value_enum, default_value_t = PlanFormat::Human)]
        output: PlanFormat,
        /// Terraform's exit codes: 0 no changes, 1 error, 2 changes.
        #[arg(long)]
        detailed_exitcode: bool,
        /// Save the plan (JSON, with both commits and the state's digest) to PLAN.json.
        #[arg(long, value_name = "PLAN.json")]
        out: Option<PathBuf>,
        /// With --repo: also report whether `reconcile` would accept the head's signature
        /// (exit 1 when it would not).
        #[command(flatten)]
        signatures: SignatureArgs,
    },
    /// Whether a commit is signed by a trusted key, as `reconcile --verify-signatures` decides.
    /// Exit 0 trusted, 1 refused (unsigned, unknown key, bad signature), 2 usage or I/O error.
    Verify {
        /// The Git repository (bare or with a work tree).
        #[arg(long, value_name = "PATH")]
        repo: PathBuf,
        /// The revision to verify (a branch, tag or commit).
        rev: String,
        /// `allowed_signers` entries and/or armored OpenPGP public keys; repeat for more files.
        #[arg(long, value_name = "FILE", required = true)]
        trusted_signers: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = TextOrJson::Human)]
        output: TextOrJson,
    },
    /// Write the policy in a peer's format.
    #[command(subcommand)]
    Export(ExportCommand),
    /// Read a peer's configuration into policy documents.
    #[command(subcommand)]
    Import(ImportCommand),
    /// MIG geometry of the built-in GPU models.
    #[command(subcommand)]
    Mig(MigCommand),
    /// Decide one cycle: admission, placement, MIG geometry and preemption, with the reason
    /// for everything left waiting.
    Solve {
        /// The policy directory (or files).
        #[arg(long)]
        policy: PathBuf,
        /// A ClusterState snapshot (YAML or JSON). May be omitted when the policy paths hold
        /// exactly one.
        #[arg(long)]
        state: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = TextOrJson::Human)]
        output: TextOrJson,
        /// Budget for refining the decision (the heuristic alone answers at once).
        #[arg(long, default_value = "2s", value_parser = duration)]
        time_limit: Duration,
    },
    /// Replay a workload trace over time through the solver (arrivals, departures, queueing,
    /// preemption, re-layouts), beside baseline placers under the same quota rules.
    Simulate(Box<SimulateArgs>),
    /// Benchmarks that print figures (they never assert).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// The service: follow a branch of the policy repository, observe the nodes, solve each
    /// cycle and drive the fleet toward the decision. Runs until SIGINT or SIGTERM.
    Reconcile(Box<ReconcileArgs>),
    /// Fleet mode's node agent: runs `tessera-fleet agent ARGS…` (the `tessera-fleet` binary
    /// next to this one or on PATH), passing its exit code through. See `tessera-fleet agent
    /// --help` for the arguments.
    #[command(disable_help_flag = true)]
    Agent {
        /// Everything after `agent`, passed on unchanged.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// What a node driver observes, changing nothing (like `nvidia-smi mig -lgi`): nodes, GPUs,
    /// MIG mode, GPU and compute instances, processes.
    Observe(ObserveArgs),
    /// Submit a workload (a `kind: Workload` YAML document) to a running service.
    Submit {
        /// The workload document; checked here first, with errors at file:line:col.
        file: PathBuf,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Cancel a submitted workload (stopping it if it runs).
    Cancel {
        name: String,
        /// Whose workload: names are per tenant. A tenant's token means its own; the operator
        /// names the tenant when several tenants use the name.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// List workloads, like `squeue` or `kubectl get`: name, tenant, class, pool, phase, age,
    /// GPUs and why each waits. A tenant's token lists its own; the operator's every tenant's.
    Get {
        /// What to list; only `workloads` is (the word may be left out).
        #[arg(value_parser = ["workloads", "workload", "wl"], default_value = "workloads")]
        resource: String,
        /// Only this tenant's workloads.
        #[arg(long)]
        tenant: Option<String>,
        #[arg(short, long, value_enum, default_value_t = GetFormat::Human)]
        output: GetFormat,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// One workload in full: spec, bindings, why it waits (from the last decision), a
    /// reservation's expected start, checkpoints and recent events.
    Describe {
        name: String,
        /// Whose workload: names are per tenant. A tenant's token means its own; the operator
        /// names the tenant when several tenants use the name.
        #[arg(long)]
        tenant: Option<String>,
        #[arg(short, long, value_enum, default_value_t = TextOrJson::Human)]
        output: TextOrJson,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// The service's sync and health, revision and last error. Exit 0 when Synced and
    /// Healthy, 1 otherwise (2 when the service cannot be reached). Without a token only sync
    /// and health are shown; a tenant's token adds its own workloads' errors, the operator's
    /// everything.
    Status {
        #[command(flatten)]
        server: ServerArgs,
        #[arg(long, value_enum, default_value_t = TextOrJson::Human)]
        output: TextOrJson,
    },
    /// Reports from the service's records.
    #[command(subcommand)]
    Report(ReportCommand),
}

#[derive(Debug, Subcommand)]
pub enum ReportCommand {
    /// GPU-hours (guaranteed, borrowed, held idle for reservations, lost to preemptions) and
    /// their cost per tenant, rolled up the tenant tree, in [SINCE, UNTIL); or per team, pool
    /// or GPU model. A tenant's token sees its own subtree, the operator's the whole fleet.
    /// Lines of one level add up exactly to the total.
    Usage {
        #[command(flatten)]
        server: ServerArgs,
        /// The first instant counted: a date (2026-11-01, midnight UTC) or an RFC 3339 instant.
        #[arg(long, value_parser = instant)]
        since: jiff::Timestamp,
        /// The first instant not counted, in the same forms.
        #[arg(long, value_parser = instant)]
        until: jiff::Timestamp,
        #[arg(long, value_enum, default_value_t = UsageBy::Tenant)]
        by: UsageBy,
        /// With `--by team`: the depth of the tenant tree whose tenants are the teams (the root
        /// is 0, its children 1). Deeper tenants count under their team; a shallower tenant is
        /// a line of its own with only its own usage.
        #[arg(long, value_name = "DEPTH", default_value_t = 2)]
        team_depth: usize,
        /// Prices per GPU model and MIG profile (YAML: `currency`, `gpuHour`, `migProfileHour`).
        #[arg(long, value_name = "FILE")]
        rates: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = UsageFormat::Human)]
        output: UsageFormat,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UsageBy {
    /// Every tenant, counting its subtree.
    Tenant,
    /// Every team (by default the root's grandchildren, as in root/organisation/team),
    /// counting the projects under it; see --team-depth.
    Team,
    Pool,
    /// GPU model.
    Model,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UsageFormat {
    Human,
    Csv,
    Json,
    Html,
}

#[derive(Debug, Subcommand)]
pub enum ExportCommand {
    /// Kueue objects (v1beta2): ResourceFlavors, Cohorts and ClusterQueues for the tenant tree,
    /// WorkloadPriorityClasses for the tiers, LocalQueues per tenant namespace. What Kueue
    /// cannot express is listed as warnings on stderr.
    Kueue {
        /// The policy directory (or files).
        #[arg(long, required = true)]
        policy: Vec<PathBuf>,
        /// Write one YAML file per kind into DIR.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// NVIDIA mig-parted's config.yaml: one named config per pool layout, with device filters
    /// per GPU model. Written to stdout, or to --out FILE.
    MigParted {
        #[arg(long, required = true)]
        policy: Vec<PathBuf>,
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// Kueue objects (v1beta1 or v1beta2 YAML) into tessera policy documents.
    Kueue {
        /// Files or directories of Kueue objects (*.yaml, *.yml).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Write the policy documents into DIR (created if needed).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// Where the service is, and who is asking.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    #[arg(long, env = "TESSERA_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// A tenant's (or the operator's) bearer token.
    #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct ObserveArgs {
    #[arg(long, value_enum, default_value_t = DriverKind::Nvml)]
    pub driver: DriverKind,
    /// As for `reconcile`: with `--driver sim` the simulated nodes (the service's state in
    /// `--state-dir` wins when there is one); with `--driver nvml` this machine's one node with
    /// `gpus: []`.
    #[arg(long, value_name = "FILE")]
    pub nodes: PathBuf,
    /// With `--driver nvml`: the NVML library to load (default: libnvidia-ml.so.1).
    #[arg(long, env = "TESSERA_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// With `--driver sim`: where `reconcile` keeps the simulated nodes' state.
    #[arg(long, default_value = ".tessera")]
    pub state_dir: PathBuf,
    #[arg(long, value_enum, default_value_t = TextOrJson::Human)]
    pub output: TextOrJson,
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

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The openb GPU-sharing trace under the FGD paper's protocol (arrivals up to 130 % of
    /// capacity, placed in order, never removed), every policy side by side.
    Openb {
        /// A pod list, e.g. ../shared/data/openb/openb_pod_list_default.csv.
        #[arg(long)]
        trace: PathBuf,
        /// A node list, e.g. ../shared/data/openb/openb_node_list_gpu_node.csv.
        #[arg(long)]
        nodes: PathBuf,
        /// Seeds 42, 43, ... (the paper used 10).
        #[arg(long)]
        seeds: Option<u64>,
        #[arg(long, value_enum, default_value_t = OpenbVariant::FgdMd)]
        variant: OpenbVariant,
        /// `online`: one task at a time, as the paper; `cycles`: the arrivals of each cycle are
        /// decided together, largest first, as tessera runs.
        #[arg(long, value_enum, default_value_t = OpenbMode::Online)]
        mode: OpenbMode,
        /// Arrivals per cycle with `--mode cycles`.
        #[arg(long, default_value_t = 100)]
        cycle: usize,
        /// Also compute the LP relaxation's upper bound on allocation at each checkpoint.
        #[arg(long)]
        bound: bool,
        /// Pin this share of the trace's GPU tasks (0 to 1) to one GPU model each, as the FGD
        /// simulator's `gpu_spec` variants do: a model drawn by GPUs per model among those that
        /// can host the task.
        #[arg(long, default_value_t = 0.0, value_parser = share)]
        gpu_spec_share: f64,
        /// Seeds which tasks `--gpu-spec-share` pins, and to which model.
        #[arg(long, default_value_t = 1)]
        spec_seed: u64,
        /// Who places the trace's CPU-only tasks in the Tessera row: the solver, as
        /// workloads asking no GPU (`gpu: {count: 0}`), or a baseline's rule, for comparison.
        #[arg(long, value_enum, default_value_t = OpenbCpuOnly::Solver)]
        cpu_only: OpenbCpuOnly,
        /// Which rows `--cpu-only`'s rule places the CPU-only tasks of: `all` makes the
        /// baselines follow it too, so that the rows differ only in how GPU tasks are placed.
        #[arg(long, value_enum, default_value_t = OpenbCpuOnlyRows::Tessera)]
        cpu_only_rows: OpenbCpuOnlyRows,
        /// Also print, per policy and GPU model, the cluster when the run first refused a GPU
        /// task: idle GPUs, those on nodes out of CPU, and the cores taken by GPU tasks and by
        /// CPU-only tasks (in the JSON output either way).
        #[arg(long)]
        first_refusal: bool,
        /// Policies to run (Tessera, FGD, BestFit, FirstFit, Random); all by default.
        #[arg(long, value_delimiter = ',')]
        policies: Vec<String>,
        /// The paper's results to compare with; by default `fgd-paper-results.csv` beside the
        /// trace, when it is there.
        #[arg(long)]
        paper: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = TextOrJson::Human)]
        output: TextOrJson,
    },
    /// The service end to end: submit -> decided and submit -> running latency (p50, p99)
    /// under a steady rate of submissions over HTTP, and the admissions a second of a burst.
    /// Runs the real service in this process on a generated fleet (the solver benchmark's
    /// reference fleet at 500 nodes) with the `sim` driver and nothing started.
    Service {
        /// Nodes of 8 H100; 64 in 500 of them are a MIG pool cut in 1g instances.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(2..))]
        nodes: u32,
        /// Organisations of 29 project tenants each.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
        orgs: u32,
        /// Workloads submitted in the burst (one GPU or one 1g instance each), all running
        /// before the steady submissions start.
        #[arg(long, default_value_t = 5000)]
        running: u32,
        /// Client threads submitting the burst.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
        clients: u32,
        /// Steady submissions a second.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        rate: u32,
        /// How long the steady submissions go on (e.g. 15s, 1m).
        #[arg(long, default_value = "15s", value_parser = duration)]
        duration: Duration,
        /// Decide every submission with a full cycle, as `tessera reconcile --full-cycles-only`.
        #[arg(long)]
        full_cycles_only: bool,
        #[arg(long, value_enum, default_value_t = TextOrJson::Human)]
        output: TextOrJson,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OpenbMode {
    Online,
    Cycles,
}

/// Who places an openb trace's CPU-only tasks in the Tessera row (and a baseline's rule, in
/// every row with `--cpu-only-rows all`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OpenbCpuOnly {
    /// The solver, as workloads asking no GPU (the Tessera row only: the baselines keep their
    /// own rule).
    Solver,
    /// BestFit's, the baseline's rule.
    BestFit,
    /// FGD's score, as the FGD row places them: the two rows then differ only in how GPU
    /// tasks are placed.
    Fgd,
    /// The Kubernetes scheduler's default scoring (least allocated and balanced CPU and
    /// memory): what places CPU-only pods where nobody reconfigured the scheduler.
    Kube,
}

/// Which rows of `tessera bench openb` follow `--cpu-only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OpenbCpuOnlyRows {
    /// The Tessera row only; each baseline places its CPU-only tasks by its own score.
    Tessera,
    /// Every row.
    All,
}

/// A share in 0..=1.
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("a share from 0 to 1, got `{s}`")),
    }
}

/// Which reading of the paper's protocol to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OpenbVariant {
    /// `shared/reference/fgd.md` to the letter.
    FgdMd,
    /// What the published runs did (shuffled arrivals, integer scores, per-seed node order,
    /// memory checked): reproduces the paper's figures.
    Published,
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
pub enum GetFormat {
    /// A table: name, tenant, class, pool, phase, age, GPUs, reason.
    Human,
    /// The table with origin, nodes, attempts, expected start and the reason's sentence.
    Wide,
    /// The API's JSON.
    Json,
}

/// `tessera simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// The policy directory (or files).
    #[arg(long)]
    pub policy: PathBuf,
    /// The trace: an openb pod list (`.csv`) or a tessera trace (YAML `Workload` documents
    /// with `arrival` and `duration`).
    #[arg(
        long,
        required_unless_present = "generate",
        conflicts_with = "generate"
    )]
    pub trace: Option<PathBuf>,
    /// Generate arrivals from the policy's tenants instead of reading a trace.
    #[arg(long, value_enum)]
    pub generate: Option<Generated>,
    /// Offered load of generated arrivals, over the fleet's GPUs.
    #[arg(long, default_value_t = 0.8, requires = "generate")]
    pub load: f64,
    /// Compress the trace's time: arrival instants are divided by this factor, run times are
    /// kept, so the offered load is this many times the trace's (the report gives it).
    #[arg(long, default_value_t = 1.0, requires = "trace", value_parser = speed)]
    pub speed: f64,
    /// Scale the trace's demand: this many times its workloads, drawn from it with replacement
    /// (seeded by `--seed`), each keeping its shape, arrival instant and run time, as the FGD
    /// protocol inflates a trace's tasks (the report gives what they ask of the fleet).
    #[arg(long, default_value_t = 1.0, requires = "trace", value_parser = demand)]
    pub demand: f64,
    /// The fleet: an openb node list (`.csv`) or a ClusterState snapshot (its nodes, empty).
    /// Default: the policy's own ClusterState snapshot.
    #[arg(long)]
    pub nodes: Option<PathBuf>,
    /// Simulated time between two cycles.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub cycle: Duration,
    /// Stop after this much simulated time (default: when the trace is played out; a
    /// generated day stops at 24h).
    #[arg(long, value_parser = duration)]
    pub horizon: Option<Duration>,
    /// Baselines to replay beside the solver: FGD, BestFit, FirstFit, Random.
    #[arg(long, value_delimiter = ',')]
    pub compare: Vec<String>,
    /// Runs replayed at once, each on a thread (default: the cores the process may use). The
    /// report is the same for any number; each run's wall time is its own only with `-j 1`,
    /// and a run's cycles that reach `--time-limit` depend on the machine's speed.
    #[arg(short, long)]
    pub jobs: Option<std::num::NonZeroUsize>,
    #[arg(long, value_enum, default_value_t = SimulateOutput::Human)]
    pub output: SimulateOutput,
    /// Where `--output html` writes `index.html`.
    #[arg(long, required_if_eq("output", "html"))]
    pub out: Option<PathBuf>,
    /// Seeds the spread of an openb trace over tenants, generated arrivals and random
    /// baselines.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Refinement budget of one cycle's solve (a cycle that reaches it is reported: its
    /// decision depends on the machine's speed).
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub time_limit: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Generated {
    /// 24 hours of Poisson arrivals.
    Day,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SimulateOutput {
    Human,
    Json,
    /// One self-contained page with SVG plots, written to `--out DIR`.
    Html,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlanFormat {
    /// For people, on a terminal.
    Human,
    /// A pull-request comment or `$GITHUB_STEP_SUMMARY`.
    Markdown,
    /// Versioned, stable JSON (the same as --out writes).
    Json,
    /// GitHub Actions annotations (at most 10) and the summary line.
    Github,
}

/// A date (midnight UTC) or an RFC 3339 instant.
fn instant(value: &str) -> Result<jiff::Timestamp, String> {
    let text = if value.len() == 10 {
        format!("{value}T00:00:00Z")
    } else {
        value.to_string()
    };
    tessera_compiler::units::parse_rfc3339(&text).ok_or_else(|| {
        "give a date (2026-11-01, midnight UTC) or an RFC 3339 instant (2026-11-01T08:00:00Z)"
            .to_string()
    })
}

fn demand(value: &str) -> Result<f64, String> {
    factor(value, "a demand factor", "1, 2.5 or 0.5")
}

fn speed(value: &str) -> Result<f64, String> {
    factor(value, "a speed", "1, 100 or 0.5")
}

/// A finite number above 0; `what` and `examples` say what was asked for.
fn factor(value: &str, what: &str, examples: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!(
            "not {what}: a factor greater than 0, e.g. {examples} (got `{value}`)"
        )),
    }
}

#[cfg(test)]
mod instant_tests {
    use clap::Parser;

    use super::{Cli, Command, ReportCommand, instant};

    #[test]
    fn a_date_is_midnight_utc_and_an_instant_keeps_its_offset() {
        assert_eq!(
            instant("2026-11-01").unwrap().to_string(),
            "2026-11-01T00:00:00Z"
        );
        assert_eq!(
            instant("2026-11-01T08:00:00+01:00").unwrap().to_string(),
            "2026-11-01T07:00:00Z"
        );
        for bad in ["2026-02-30", "yesterday", "2026-11-01 08:00", ""] {
            assert!(instant(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bad_instant_is_refused_naming_its_flag() {
        let e = Cli::try_parse_from([
            "tessera",
            "report",
            "usage",
            "--since",
            "2026-11-01",
            "--until",
            "2026-02-30",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("--until"), "{e}");
        assert!(e.contains("RFC 3339"), "{e}");
        let ok = Cli::try_parse_from([
            "tessera",
            "report",
            "usage",
            "--since",
            "2026-11-01",
            "--until",
            "2026-12-01",
        ])
        .unwrap();
        let Command::Report(ReportCommand::Usage { since, until, .. }) = ok.command else {
            panic!("not `report usage`");
        };
        assert!(since < until);
    }
}
