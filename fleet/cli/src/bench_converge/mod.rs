//! `tessera-fleet bench converge`: issue 17's scale figures, measured on the control plane users
//! run. Simulated agents (`bench agents`' in-process loops, each with its own lease, watch and
//! journal) join a real etcd; a real replica (`tessera-fleet reconcile --fleet-nodes agents`,
//! this executable as a child process) follows a policy repository the bench writes, and leads.
//! The bench then commits a policy change that re-partitions every GPU and measures, from the
//! commit, until every node's `observed` shows the new geometry. It prints figures and asserts
//! nothing.
//!
//! **The change.** Every GPU starts with MIG on and one 3g.40gb instance at slice 4. The first
//! revision's pool `h100` allows only the layout `whole` (7g.80gb), which that instance cannot
//! be completed into, so the replica leaves the GPUs as they are. The commit adds the layout
//! `halves` (4g.40gb, 3g.40gb): the solver completes every GPU's geometry into it (a 4g.40gb
//! instance at slice 0 and its compute instance), a geometry change on every GPU of the fleet,
//! as an operator's layout change is.
//!
//! **Converged** (printed with the figures): every GPU of every node, as its agent's `observed`
//! key in etcd shows it, has MIG on with no mode change pending and exactly the instances of
//! `halves` (4g.40gb at slice 0, 3g.40gb at slice 4), each with its compute instance.

mod change;
mod replica;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use tessera_fleet::actions::JournalRecord;
use tessera_fleet::agent::AgentConfig;
use tessera_fleet::keys::{Keys, NodeKey};
use tessera_fleet::protocol::{self, Observed};
use tessera_fleet::testing::TestEtcd;
use tessera_fleet::utilization::Cadence;

use crate::bench::{Metrics, SimAgents, fleet, metric, wait_joined};
use change::{INITIAL_GPU, PolicyRepo, policy, shows_target};
use replica::ReplicaProcess;

/// The cluster (key prefix) the bench's fleet lives under.
const CLUSTER: &str = "bench";

#[derive(Debug, Args)]
pub struct BenchConvergeArgs {
    /// Simulated nodes, one agent each.
    #[arg(long, default_value_t = 500)]
    pub nodes: usize,
    /// H100 80GB GPUs per node.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub gpus: u32,
    /// The replicas' `--cycle-period`.
    #[arg(long, default_value = "1s", value_parser = seconds)]
    pub cycle_period: Duration,
    /// The replicas' `--fetch-interval`: how long a commit may wait before a replica sees it.
    #[arg(long, default_value = "1s", value_parser = seconds)]
    pub fetch_interval: Duration,
    /// The replicas' `--lease-ttl` (the leader's term lease).
    #[arg(long, default_value = "5s", value_parser = seconds)]
    pub replica_lease_ttl: Duration,
    /// The agents' registration lease.
    #[arg(long, default_value = "10s", value_parser = seconds)]
    pub agent_lease_ttl: Duration,
    /// How long to count etcd's writes while nothing changes, before the commit and after
    /// convergence.
    #[arg(long, default_value = "10s", value_parser = seconds)]
    pub steady: Duration,
    /// Also start a second replica, standing by; at the end SIGKILL the leader and measure
    /// until the standby leads.
    #[arg(long)]
    pub failover: bool,
    /// The most to wait for any one step (the leader, convergence) before giving up.
    #[arg(long, default_value = "300s", value_parser = seconds)]
    pub patience: Duration,
    /// Where to keep the policy repository, the replicas' state and logs and the agents'
    /// state (created; must be empty if it exists); by default a temporary directory, removed
    /// at the end.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
}

/// A whole number of seconds, at least one.
fn seconds(value: &str) -> Result<Duration, String> {
    match tessera_compiler::units::Duration::parse(value) {
        Some(d) if d.seconds() >= 1 => Ok(Duration::from_secs(d.seconds())),
        Some(_) => Err("at least 1s".to_string()),
        None => Err("not a duration: write e.g. 1s, 30s or 1m".to_string()),
    }
}

pub fn run(args: BenchConvergeArgs) -> anyhow::Result<()> {
    // The agents' own lines would drown the figures: warnings only, unless RUST_LOG says
    // otherwise. The replicas log to their own files.
    crate::agent::init_logging("warn");
    let (_temporary, work) = match &args.work_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            if std::fs::read_dir(dir)?.next().is_some() {
                bail!(
                    "{}: not empty; give --work-dir a new or empty directory",
                    dir.display()
                );
            }
            (None, dir.clone())
        }
        None => {
            let dir = tempfile::Builder::new()
                .prefix("tessera-bench-converge-")
                .tempdir()?;
            let path = dir.path().to_path_buf();
            (Some(dir), path)
        }
    };
    let etcd = TestEtcd::start().context("cannot start etcd")?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = Bench {
        args: &args,
        work: &work,
        endpoint: etcd.endpoint(),
        keys: Keys::new(CLUSTER)?,
        tokio: &tokio,
    }
    .run()?;
    print!("{report}");
    Ok(())
}

struct Bench<'a> {
    args: &'a BenchConvergeArgs,
    work: &'a Path,
    endpoint: String,
    keys: Keys,
    tokio: &'a tokio::runtime::Runtime,
}

/// The figures of one run, in the order they are printed.
#[derive(Default)]
struct Figures {
    joined_in: Duration,
    leading_in: Duration,
    before: Steady,
    memory_idle: Memory,
    commit: String,
    first_action: Option<Duration>,
    last_action: Option<Duration>,
    actions: usize,
    last_journaled: Option<Duration>,
    done: usize,
    failed: Vec<String>,
    converged_in: Duration,
    converged_gpus: usize,
    during: Delta,
    /// The end of the replica's cycle that was running at convergence.
    cycle_done_in: Duration,
    /// `None` where leadership moved during the change.
    cycles: Option<ReplicaCycles>,
    /// Leadership moved from one replica to the other during the change: (from, to).
    moved: Option<(String, String)>,
    leader_pid: u32,
    memory_converged: Memory,
    after: Steady,
    failover: Option<Failover>,
}

/// etcd's counters between two readings.
#[derive(Default, Clone, Copy)]
struct Delta {
    puts: u64,
    deletes: u64,
    bytes: u64,
}

impl Delta {
    fn between(before: &Metrics, after: &Metrics) -> Delta {
        Delta {
            puts: after.puts.saturating_sub(before.puts),
            deletes: after.deletes.saturating_sub(before.deletes),
            bytes: after.received_bytes.saturating_sub(before.received_bytes),
        }
    }
}

/// A window with nothing changing: etcd's writes and the replica's cycles meanwhile.
#[derive(Default)]
struct Steady {
    window: Duration,
    cycles: u64,
    delta: Delta,
}

/// The replica's cycles over the convergence, from its `/metrics`.
#[derive(Default)]
struct ReplicaCycles {
    count: f64,
    seconds: f64,
    solve_seconds: f64,
}

#[derive(Default, Clone, Copy)]
struct Memory {
    rss: u64,
    hwm: u64,
}

struct Failover {
    leads_in: Duration,
    first_cycle_in: Duration,
}

impl Bench<'_> {
    fn run(&self) -> anyhow::Result<String> {
        let args = self.args;
        let client = self
            .tokio
            .block_on(Client::connect([&self.endpoint], None))?;
        let mut figures = Figures::default();

        let repo = PolicyRepo::init(&self.work.join("policy-repo"))?;
        let first_revision = repo.commit(&policy(args, false), "the pool h100: layout whole")?;

        let nodes = fleet(self.work, args.nodes, args.gpus, INITIAL_GPU)?;
        let config = AgentConfig {
            keys: self.keys.clone(),
            endpoints: vec![self.endpoint.clone()],
            credentials: None,
            lease_ttl_secs: args.agent_lease_ttl.as_secs() as i64,
            observe_every: Duration::from_secs(1),
            utilization: Cadence {
                interval: Duration::from_secs(30),
                dead_band: 10.0,
            },
        };
        let t0 = Instant::now();
        let agents_dir = self.work.join("agents");
        let agents = {
            let _entered = self.tokio.enter();
            SimAgents::spawn(&config, nodes, &agents_dir, args.gpus, 0)?
        };
        self.tokio
            .block_on(wait_joined(&client, &self.keys, args.nodes))?;
        figures.joined_in = t0.elapsed();
        eprintln!(
            "bench converge: {} agents joined in {:.2} s",
            args.nodes,
            figures.joined_in.as_secs_f64()
        );

        let t1 = Instant::now();
        let mut replicas = vec![ReplicaProcess::spawn(self, repo.path(), "first")?];
        replicas[0].await_line("tessera-fleet reconcile: leading (term ", args.patience)?;
        figures.leading_in = t1.elapsed();
        if args.failover {
            let standby = ReplicaProcess::spawn(self, repo.path(), "second")?;
            standby.await_line("tessera-fleet reconcile: standing by", args.patience)?;
            replicas.push(standby);
        }
        // Steady under the first revision: it is in force and two cycles ran since.
        let leader = &replicas[self.leading(&client, &replicas)?];
        let at = leader.await_status("the first revision in force", args.patience, |s| {
            in_force(s, &first_revision).then(|| cycles_of(s))
        })?;
        leader.await_status("two cycles under it", args.patience, |s| {
            (cycles_of(s) >= at + 2).then_some(())
        })?;
        figures.before = self.steady(leader)?;
        eprintln!("bench converge: steady before the commit; committing the new layout");

        // From the commit to every node converged.
        let leading_at_commit = self.leading(&client, &replicas)?;
        let leader = &replicas[leading_at_commit];
        figures.memory_idle = leader.memory();
        let revision = self
            .tokio
            .block_on(
                client
                    .clone()
                    .get(self.keys.root(), Some(GetOptions::new().with_count_only())),
            )?
            .header()
            .map_or(0, |h| h.revision());
        let stream = self.tokio.block_on(
            client.clone().watch(
                self.keys.nodes_prefix(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision + 1),
                ),
            ),
        )?;
        let at_commit = Metrics::read(&self.endpoint)?;
        let replica_at_commit = leader.metrics()?;
        let committed = Instant::now();
        figures.commit = repo.commit(&policy(args, true), "the pool h100: layout halves too")?;
        self.tokio
            .block_on(self.until_converged(stream, committed, &mut figures))?;
        figures.during = Delta::between(&at_commit, &Metrics::read(&self.endpoint)?);
        eprintln!(
            "bench converge: converged in {:.2} s",
            figures.converged_in.as_secs_f64()
        );

        // A replica starved past its term's lease (a loaded machine) hands the change to the
        // other: the figures go on with whichever leads, and the report says so.
        let leading = self.leading(&client, &replicas)?;
        if leading != leading_at_commit {
            figures.moved = Some((
                replicas[leading_at_commit].id.clone(),
                replicas[leading].id.clone(),
            ));
        }
        let leader = &replicas[leading];
        figures.memory_converged = leader.memory();
        figures.leader_pid = leader.pid;
        // The cycle that carried out the change may still be recording its outcomes at
        // convergence; its end, then steady again once the outcomes are pruned (a cycle on).
        let at = cycles_of(&leader.status()?);
        leader.await_status(
            "the cycle running at convergence to end",
            args.patience,
            |s| (cycles_of(s) > at).then_some(()),
        )?;
        figures.cycle_done_in = committed.elapsed();
        leader.await_status("two cycles after convergence", args.patience, |s| {
            (cycles_of(s) >= at + 2).then_some(())
        })?;
        if figures.moved.is_none() {
            let replica_after = leader.metrics()?;
            let sample =
                |name: &str| metric(&replica_after, name) - metric(&replica_at_commit, name);
            figures.cycles = Some(ReplicaCycles {
                count: sample("tessera_cycle_duration_seconds_count"),
                seconds: sample("tessera_cycle_duration_seconds_sum"),
                solve_seconds: sample("tessera_solve_duration_seconds_sum"),
            });
        }
        figures.after = self.steady(leader)?;

        if args.failover {
            let standby = 1 - leading;
            // Lines the standby printed earlier (a term it held before) are not this failover.
            replicas[standby].drain();
            let killed = Instant::now();
            replicas[leading].kill();
            let standby = &replicas[standby];
            standby.await_line("tessera-fleet reconcile: leading (term ", args.patience)?;
            let leads_in = killed.elapsed();
            standby.await_status("the new leader's first cycle", args.patience, |s| {
                (in_force(s, &figures.commit) && cycles_of(s) >= 1).then_some(())
            })?;
            figures.failover = Some(Failover {
                leads_in,
                first_cycle_in: killed.elapsed(),
            });
        }
        self.tokio.block_on(agents.stop())?;
        Ok(self.report(&figures))
    }

    /// Which of `replicas` leads, as etcd's leader key says; waits while none does.
    fn leading(&self, client: &Client, replicas: &[ReplicaProcess]) -> anyhow::Result<usize> {
        let deadline = Instant::now() + self.args.patience;
        loop {
            let leader = self
                .tokio
                .block_on(tessera_fleet::election::current_leader(client, &self.keys))?;
            if let Some(i) = leader.and_then(|l| replicas.iter().position(|r| r.id == l.id)) {
                return Ok(i);
            }
            if Instant::now() >= deadline {
                bail!(
                    "no replica of the bench led within {:?}",
                    self.args.patience
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for `args.steady` with nothing changing; etcd's writes and the replica's cycles
    /// meanwhile.
    fn steady(&self, replica: &ReplicaProcess) -> anyhow::Result<Steady> {
        let before = Metrics::read(&self.endpoint)?;
        let cycles_before = cycles_of(&replica.status()?);
        let started = Instant::now();
        std::thread::sleep(self.args.steady);
        let after = Metrics::read(&self.endpoint)?;
        let cycles_after = cycles_of(&replica.status()?);
        Ok(Steady {
            window: started.elapsed(),
            cycles: cycles_after.saturating_sub(cycles_before),
            delta: Delta::between(&before, &after),
        })
    }

    /// Reads the nodes' keys from the watch until every node's `observed` shows the target
    /// geometry on every GPU; the actions and journal entries seen meanwhile go to `figures`.
    async fn until_converged(
        &self,
        mut stream: etcd_client::WatchStream,
        committed: Instant,
        figures: &mut Figures,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::from_std(committed + self.args.patience);
        let mut converged: BTreeMap<String, bool> = BTreeMap::new();
        let mut done = 0;
        while done < self.args.nodes {
            let answer = match tokio::time::timeout_at(deadline, stream.message()).await {
                Ok(answer) => answer?.context("etcd ended the watch")?,
                Err(_) => bail!(
                    "{done} of {} nodes converged within {:?} of the commit ({} actions \
                     written, {} journaled done, {} failed{}); the replica's log: {}",
                    self.args.nodes,
                    self.args.patience,
                    figures.actions,
                    figures.done,
                    figures.failed.len(),
                    figures
                        .failed
                        .first()
                        .map(|f| format!(", the first: {f}"))
                        .unwrap_or_default(),
                    self.work.join("replica-first.log").display()
                ),
            };
            let now = committed.elapsed();
            for event in answer.events() {
                if event.event_type() != EventType::Put {
                    continue;
                }
                let Some(kv) = event.kv() else { continue };
                match self.keys.parse_node_key(kv.key()) {
                    Some(NodeKey::Action { .. }) => {
                        figures.actions += 1;
                        figures.first_action.get_or_insert(now);
                        figures.last_action = Some(now);
                    }
                    Some(NodeKey::Journal { .. }) => {
                        match serde_json::from_slice::<JournalRecord>(kv.value())? {
                            JournalRecord::Done => figures.done += 1,
                            JournalRecord::Failed { error } => figures.failed.push(error),
                            JournalRecord::Intent => continue,
                        }
                        figures.last_journaled = Some(now);
                    }
                    Some(NodeKey::Observed { node }) => {
                        let observed: Observed = protocol::decode(kv.value())?;
                        converged.insert(node, shows_target(&observed, self.args.gpus));
                        done = converged.values().filter(|c| **c).count();
                    }
                    _ => {}
                }
            }
        }
        figures.converged_in = committed.elapsed();
        figures.converged_gpus = done * self.args.gpus as usize;
        Ok(())
    }

    fn report(&self, f: &Figures) -> String {
        let args = self.args;
        let secs = |d: Option<Duration>| match d {
            Some(d) => format!("{:>7.2} s", d.as_secs_f64()),
            None => "      none".to_string(),
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "tessera-fleet bench converge: {} nodes x {} GPUs, {} agents in this process, {} \
             replica{} (`tessera-fleet reconcile`), etcd at {}",
            args.nodes,
            args.gpus,
            args.nodes,
            if args.failover { 2 } else { 1 },
            if args.failover { "s" } else { "" },
            self.endpoint
        );
        let _ = writeln!(
            out,
            "  replicas: --cycle-period {}s --fetch-interval {}s --lease-ttl {}s; agents' lease {}s",
            args.cycle_period.as_secs(),
            args.fetch_interval.as_secs(),
            args.replica_lease_ttl.as_secs(),
            args.agent_lease_ttl.as_secs()
        );
        let _ = writeln!(
            out,
            "  converged means: every GPU of every node, as its agent's `observed` in etcd shows \
             it, has MIG on, no mode change pending, and exactly 4g.40gb at slice 0 and 3g.40gb \
             at slice 4, each with its compute instance"
        );
        let _ = writeln!(
            out,
            "  agents joined (registration, observed, utilization)   {:>7.2} s",
            f.joined_in.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "  replica leading after its start                        {:>7.2} s",
            f.leading_in.as_secs_f64()
        );
        write_steady(&mut out, "before the commit", &f.before);
        let _ = writeln!(
            out,
            "  policy commit {} (pool h100 gains layout halves); from the commit:",
            &f.commit[..f.commit.len().min(12)]
        );
        let _ = writeln!(
            out,
            "    first action in etcd                                 {}",
            secs(f.first_action)
        );
        let _ = writeln!(
            out,
            "    last action in etcd                                  {}   ({} actions)",
            secs(f.last_action),
            f.actions
        );
        let _ = writeln!(
            out,
            "    last action journaled                                {}   ({} done, {} failed)",
            secs(f.last_journaled),
            f.done,
            f.failed.len()
        );
        let _ = writeln!(
            out,
            "    {:<52} {:>7.2} s   etcd puts {}, deletes {}, client bytes {}",
            format!(
                "converged: {} of {} nodes, {} GPUs",
                f.converged_gpus / args.gpus as usize,
                args.nodes,
                f.converged_gpus
            ),
            f.converged_in.as_secs_f64(),
            f.during.puts,
            f.during.deletes,
            f.during.bytes
        );
        let _ = writeln!(
            out,
            "    the replica's cycle running at convergence ended     {:>7.2} s",
            f.cycle_done_in.as_secs_f64()
        );
        match (&f.cycles, &f.moved) {
            (Some(c), _) => {
                let _ = writeln!(
                    out,
                    "    the replica's cycles from the commit to two after convergence: {:.0}, \
                     {:.2} s in cycles, {:.2} s of it solving",
                    c.count, c.seconds, c.solve_seconds
                );
            }
            (None, Some((from, to))) => {
                let _ = writeln!(
                    out,
                    "    leadership moved from {from} to {to} during the change (a replica \
                     starved past its term's lease); the figures after it are {to}'s"
                );
            }
            (None, None) => {}
        }
        write_steady(&mut out, "after convergence", &f.after);
        let _ = writeln!(
            out,
            "  leading replica's memory (pid {} at convergence): idle VmRSS {} (VmHWM {}); converged VmRSS {} (VmHWM {})",
            f.leader_pid,
            mib(f.memory_idle.rss),
            mib(f.memory_idle.hwm),
            mib(f.memory_converged.rss),
            mib(f.memory_converged.hwm)
        );
        if let Some(failover) = &f.failover {
            let lease = args.replica_lease_ttl.as_secs_f64();
            let _ = writeln!(
                out,
                "  failover: leader SIGKILLed; the standby leads after {:.2} s ({:.2} lease periods), its first cycle done after {:.2} s",
                failover.leads_in.as_secs_f64(),
                failover.leads_in.as_secs_f64() / lease,
                failover.first_cycle_in.as_secs_f64()
            );
        }
        if let Some(first) = f.failed.first() {
            let _ = writeln!(out, "  first failure: {first}");
        }
        out
    }
}

fn write_steady(out: &mut String, when: &str, s: &Steady) {
    let per_cycle = |n: u64| {
        if s.cycles == 0 {
            "no cycle".to_string()
        } else {
            format!("{:.1} a cycle", n as f64 / s.cycles as f64)
        }
    };
    let _ = writeln!(
        out,
        "  steady {when}: {:.1} s, {} cycles: etcd puts {} ({}), deletes {}, client bytes {} ({})",
        s.window.as_secs_f64(),
        s.cycles,
        s.delta.puts,
        per_cycle(s.delta.puts),
        s.delta.deletes,
        s.delta.bytes,
        per_cycle(s.delta.bytes)
    );
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
}

/// Whether a replica's public `/status` has `commit` in force.
fn in_force(status: &serde_json::Value, commit: &str) -> bool {
    status["revision"]
        .as_str()
        .is_some_and(|r| !r.is_empty() && (commit.starts_with(r) || r.starts_with(commit)))
}

/// The cycles a replica's public `/status` counts.
fn cycles_of(status: &serde_json::Value) -> u64 {
    status["cycles"].as_u64().unwrap_or(0)
}
