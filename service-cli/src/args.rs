//! The flags themselves (clap).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;

use crate::store::StoreArg;

#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    /// The policy repository: a URL (file://, https://, ssh://) or a local path.
    #[arg(long)]
    pub repo: String,
    #[arg(long, default_value = "main")]
    pub branch: String,
    /// The policy directory inside the repository (default: the whole repository).
    #[arg(long, value_name = "SUBDIR")]
    pub path: Option<String>,
    #[arg(long, value_enum, default_value_t = DriverKind::Sim)]
    pub driver: DriverKind,
    /// A ClusterState file. With `--driver sim`: the simulated nodes to start from. With
    /// `--driver nvml`: this machine's one node (name, pool, labels, cpu, memory) with
    /// `gpus: []`, the GPUs being discovered through NVML.
    #[arg(long, value_name = "FILE")]
    pub nodes: Option<PathBuf>,
    /// With `--driver sim`: NVML faults to inject (YAML), for tests and drills.
    #[arg(long, value_name = "FILE")]
    pub faults: Option<PathBuf>,
    /// With `--driver nvml`: the NVML library to load (default: libnvidia-ml.so.1).
    #[arg(long, env = "TESSERA_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// SQLite database: workloads, revisions, the action journal, events (default:
    /// `tessera.db` in the state directory). The same as `--store sqlite:FILE`.
    #[arg(long, value_name = "FILE", conflicts_with = "store")]
    pub db: Option<PathBuf>,
    /// Where the state is kept: `sqlite:PATH` (the default, `tessera.db` in the state
    /// directory; one process), or `etcd://HOST:PORT[,HOST:PORT...]` (fleet mode: any number
    /// of replicas, one of which leads; runs `tessera-fleet reconcile`).
    #[arg(long, value_name = "URL")]
    pub store: Option<StoreArg>,
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Everything the service keeps: the database, the policy mirror, the simulated nodes'
    /// state, workload logs and checkpoints. Created with a `.gitignore` of its own, so that
    /// it never shows in a repository it lies in.
    #[arg(long, value_name = "DIR", default_value = ".tessera")]
    pub state_dir: PathBuf,
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Bearer tokens (YAML: `admin: TOKEN`, `tenants: {NAME: TOKEN}`). Without it the API
    /// accepts no token: only /status, /metrics and /healthz answer.
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub cycle_period: Duration,
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub fetch_interval: Duration,
    /// The solver's budget per cycle.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub time_limit: Duration,
    /// A committed workload that keeps ending after short runs (under 10 minutes) is queued
    /// again after this, doubled for each further short run (CrashLoopBackOff).
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub restart_backoff: Duration,
    /// The longest wait before a crash-looping committed workload is queued again.
    #[arg(long, default_value = "5m", value_parser = duration)]
    pub restart_backoff_max: Duration,
    /// The most submitted workloads one tenant may have that have not ended; a submission
    /// past it is refused (HTTP 429) until some end or are cancelled.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_submitted_per_tenant: u32,
    /// Decide every cycle from scratch. By default, workloads submitted since the last full
    /// cycle are decided against its standing decision when nothing else changed (one
    /// arrival in milliseconds instead of a whole queue re-decided); a full cycle still runs
    /// every `--cycle-period` and after any other change.
    #[arg(long)]
    pub full_cycles_only: bool,
    /// `process`: start each workload's command; `none`: place workloads and make their
    /// devices but run nothing (a fleet simulation).
    #[arg(long, value_enum, default_value_t = RuntimeKind::Process)]
    pub runtime: RuntimeKind,
    /// Run workloads unconfined, as the service's own user with its view of the machine,
    /// where the host cannot sandbox them (no bubblewrap, user namespaces or cgroups). Any
    /// workload can then read the store and the tokens and stop the service: never on a
    /// fleet shared by tenants who do not trust each other.
    #[arg(long)]
    pub insecure_runtime: bool,
    /// Run cycles until one has nothing left to do now, print the status and what each cycle
    /// did, and exit (0 when Synced and Healthy, 1 otherwise). No API is served.
    #[arg(long)]
    pub once: bool,
    #[arg(long, value_enum, default_value_t = TextOrJson::Human, requires = "once")]
    pub output: TextOrJson,
    #[command(flatten)]
    pub signatures: SignatureArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// Serve `POST /v1/hooks/git` for GitHub and GitLab push webhooks, authenticated with the
    /// shared secret in FILE: a push is fetched at once.
    #[arg(long, value_name = "FILE")]
    pub webhook_secret_file: Option<PathBuf>,
}

impl ReconcileArgs {
    /// Where the state is kept: `--store`, else `--db`, else `tessera.db` in the state
    /// directory.
    pub fn store(&self) -> StoreArg {
        match (&self.store, &self.db) {
            (Some(store), _) => store.clone(),
            (None, Some(db)) => StoreArg::Sqlite(db.clone()),
            (None, None) => StoreArg::Sqlite(self.state_dir.join("tessera.db")),
        }
    }
}

/// A replica's flags in fleet mode (`--store etcd://…`); ignored with SQLite.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// With `--store etcd://`: the cluster; every key lives under `/tessera/<cluster>/`.
    #[arg(long, default_value = "default")]
    pub cluster: String,
    /// With `--store etcd://`: this replica's identity among replicas (default: the host
    /// name and the API's address).
    #[arg(long, value_name = "ID")]
    pub replica_id: Option<String>,
    /// With `--store etcd://`: the API's address as clients reach it, which standbys name in
    /// their answer to a write (default: `http://` and `--listen`).
    #[arg(long, value_name = "URL")]
    pub advertise: Option<String>,
    /// With `--store etcd://`: the leader's lease period; a standby leads at most this long
    /// after the leader stops renewing (etcd raises it to its minimum, about 2 s).
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub lease_ttl: Duration,
    /// With `--store etcd://` and etcd's access control on: the etcd user this replica
    /// connects as, `tessera.<cluster>.control` (`tessera-fleet access control-plane` makes
    /// it, with read-write on the cluster's prefix and nothing else).
    #[arg(long, value_name = "USER", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,
    /// The `--etcd-user`'s password: the first line of FILE (never given on the command
    /// line, where other users of the machine could read it).
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
    /// With `--store etcd://`: where the leader runs the workloads: `agents` (each node's
    /// `tessera agent`, through etcd) or `local` (this machine through `--driver` and
    /// `--nodes`, as `tessera reconcile` does).
    #[arg(long, value_enum, default_value = "agents")]
    pub fleet_nodes: NodesKind,
    /// With `--fleet-nodes agents`: how long a node's agent may be away (its registration gone)
    /// before the node is lost and its workloads are placed elsewhere.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub node_grace: Duration,
}

/// How long the service keeps what has ended, as slurmdbd's `Purge*After` settings: each
/// kind is pruned once it is older than its time (never what is still open, live or metered).
#[derive(Debug, Clone, clap::Args)]
pub struct RetentionArgs {
    /// How long a closed entry of the action journal is kept after it closed: a duration of
    /// at least 1h, or `forever`. Open intents are never deleted.
    #[arg(long, default_value = "7d", value_parser = retention, value_name = "DURATION|forever")]
    pub retain_journal: Keep,
    /// How long an event is kept after it was recorded (`GET /v1/events`, `describe`).
    #[arg(long, default_value = "30d", value_parser = retention, value_name = "DURATION|forever")]
    pub retain_events: Keep,
    /// How long an ended workload (succeeded, failed, cancelled) is kept after it ended; `GET
    /// /v1/workloads/NAME` answers 404 for it after. Live workloads are never deleted.
    #[arg(long, default_value = "30d", value_parser = retention, value_name = "DURATION|forever")]
    pub retain_workloads: Keep,
    /// How long metered usage (`tessera report usage`) is kept after it ended. Billing data:
    /// kept forever unless set. A run still placed is never deleted.
    #[arg(long, default_value = "forever", value_parser = retention, value_name = "DURATION|forever")]
    pub retain_usage: Keep,
    /// How often the service prunes what is past its keeping time (and once at start-up),
    /// a bounded batch at a time between cycles.
    #[arg(long, default_value = "1h", value_parser = duration)]
    pub prune_interval: Duration,
}

/// A keeping time: a duration, or forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    For(Duration),
    Forever,
}

impl Keep {
    /// The duration; `None` for forever.
    pub fn duration(self) -> Option<Duration> {
        match self {
            Keep::For(d) => Some(d),
            Keep::Forever => None,
        }
    }
}

/// The shortest keeping time: what recovery, the crash-loop count of interrupted starts and
/// the restart back-off read is minutes old, and an incident needs its history afterwards.
pub const MIN_RETENTION: Duration = Duration::from_secs(3600);

/// The value parser of the `--retain-*` flags: a duration of at least [`MIN_RETENTION`], or
/// `forever`.
pub fn retention(value: &str) -> Result<Keep, String> {
    if value.trim() == "forever" {
        return Ok(Keep::Forever);
    }
    let keep = duration(value)
        .map_err(|_| "not a keeping time: write a duration (e.g. 12h, 7d, 90d) or `forever`")?;
    if keep < MIN_RETENTION {
        return Err(format!(
            "{value} is under 1h: keep at least an hour (what recovery and the restart \
             back-off read is recent), or write `forever`"
        ));
    }
    Ok(Keep::For(keep))
}

/// Where a fleet-mode leader runs the workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NodesKind {
    Agents,
    Local,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    Process,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DriverKind {
    /// Simulated nodes from a ClusterState file, obeying NVML's rules.
    Sim,
    /// The GPUs of this machine through NVML.
    Nvml,
}

/// Signed revisions: only commits signed by a trusted key are accepted.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SignatureArgs {
    /// Accept only commits signed by a key in --trusted-signers (SSH or OpenPGP); an unsigned
    /// or untrusted head keeps the last good revision in force.
    #[arg(long, requires = "trusted_signers")]
    pub verify_signatures: bool,
    /// Git's `allowed_signers` entries and/or armored OpenPGP public keys, in one file or
    /// several (repeat the flag).
    #[arg(long, value_name = "FILE", requires = "verify_signatures")]
    pub trusted_signers: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TextOrJson {
    Human,
    Json,
}

/// The value parser of every duration flag: the policy language's spelling (`90s`, `10m`,
/// `2h`), so that a flag and a document read the same way.
pub fn duration(value: &str) -> Result<Duration, String> {
    tessera_compiler::units::Duration::parse(value)
        .map(|d| Duration::from_secs(d.seconds()))
        .ok_or_else(|| "not a duration: write e.g. 0s, 30s, 5m or 1h".to_string())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReconcileArgs,
    }

    fn store(flags: &[&str]) -> Result<StoreArg, String> {
        let argv = [
            &["reconcile", "--repo", "policy", "--state-dir", "/srv/t"][..],
            flags,
        ]
        .concat();
        Cli::try_parse_from(argv)
            .map(|cli| cli.args.store())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_store_is_sqlite_in_the_state_directory_unless_db_or_store_says_otherwise() {
        assert_eq!(
            store(&[]).unwrap(),
            StoreArg::Sqlite(PathBuf::from("/srv/t/tessera.db"))
        );
        assert_eq!(
            store(&["--db", "x.db"]).unwrap(),
            StoreArg::Sqlite(PathBuf::from("x.db"))
        );
        assert_eq!(
            store(&["--store", "sqlite:y.db"]).unwrap(),
            StoreArg::Sqlite(PathBuf::from("y.db"))
        );
        assert_eq!(
            store(&["--store", "etcd://127.0.0.1:2379"]).unwrap(),
            StoreArg::Etcd(vec!["http://127.0.0.1:2379".to_string()])
        );
        let both = store(&["--db", "x.db", "--store", "sqlite:y.db"]).unwrap_err();
        assert!(both.contains("cannot be used with"), "{both}");
        let bad = store(&["--store", "etcd://nowhere"]).unwrap_err();
        assert!(
            bad.contains("--store") && bad.contains("HOST:PORT"),
            "{bad}"
        );
    }

    #[test]
    fn keeping_times_default_to_a_week_a_month_and_forever_for_usage() {
        let parse = |flags: &[&str]| {
            let argv = [&["reconcile", "--repo", "policy"][..], flags].concat();
            Cli::try_parse_from(argv)
                .map(|cli| cli.args.retention)
                .map_err(|e| e.to_string())
        };
        let day = |n: u64| Keep::For(Duration::from_secs(n * 86_400));
        let defaults = parse(&[]).unwrap();
        assert_eq!(defaults.retain_journal, day(7));
        assert_eq!(defaults.retain_events, day(30));
        assert_eq!(defaults.retain_workloads, day(30));
        assert_eq!(defaults.retain_usage, Keep::Forever);
        assert_eq!(defaults.prune_interval, Duration::from_secs(3600));

        let set = parse(&[
            "--retain-journal",
            "forever",
            "--retain-usage",
            "400d",
            "--retain-events",
            "1h30m",
            "--prune-interval",
            "10m",
        ])
        .unwrap();
        assert_eq!(set.retain_journal.duration(), None);
        assert_eq!(set.retain_usage, day(400));
        assert_eq!(set.retain_events, Keep::For(Duration::from_secs(5400)));
        assert_eq!(set.prune_interval, Duration::from_secs(600));

        let short = parse(&["--retain-workloads", "10m"]).unwrap_err();
        assert!(
            short.contains("--retain-workloads") && short.contains("under 1h"),
            "{short}"
        );
        let bad = parse(&["--retain-events", "a month"]).unwrap_err();
        assert!(bad.contains("`forever`"), "{bad}");
    }

    #[test]
    fn an_etcd_user_comes_with_a_password_file_and_never_a_password() {
        let parse = |flags: &[&str]| {
            let argv = [&["reconcile", "--repo", "policy"][..], flags].concat();
            Cli::try_parse_from(argv).map(|cli| cli.args.fleet)
        };
        let both = parse(&["--etcd-user", "cp", "--etcd-password-file", "/run/cp"]).unwrap();
        assert_eq!(both.etcd_user.as_deref(), Some("cp"));
        assert_eq!(both.etcd_password_file, Some(PathBuf::from("/run/cp")));
        for half in [
            &["--etcd-user", "cp"][..],
            &["--etcd-password-file", "/run/cp"],
        ] {
            let e = parse(half).unwrap_err().to_string();
            assert!(e.contains("required"), "{e}");
        }
        assert!(parse(&["--etcd-password", "x"]).is_err());
    }
}
