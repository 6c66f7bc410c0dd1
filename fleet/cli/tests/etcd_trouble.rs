//! Fleet mode through etcd trouble, end to end: one `tessera-fleet reconcile` replica and two
//! `tessera-fleet agent` processes (sim driver) on a real etcd.
//!
//! - etcd killed for longer than the lease and restarted on the same data directory: while it
//!   is away `/status` is Degraded with a condition naming etcd; once it is back the replica
//!   leads again, the workload that ran throughout still runs, started once, a new submission
//!   runs, and `/status` recovers.
//! - etcd hung (SIGSTOP) for longer than the lease and resumed: the replica's calls to etcd
//!   time out instead of waiting for ever, it steps down at its lease's deadline, and its
//!   `/status`, served from memory, is Degraded naming etcd; once etcd answers it leads
//!   again, the workload that ran throughout was started once, and a new submission runs.
//! - An agent paused (SIGSTOP) past its lease and the node grace: its node is lost, `/status`
//!   is Degraded naming it and its workload runs on the other node; resumed (SIGCONT), the
//!   agent registers again, stops the replica that was moved away from it, and `/status`
//!   recovers.
//!
//! Every wait is bounded by a deadline that guards against a hang, never asserts on time.

mod support;

use std::collections::BTreeMap;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use support::{ADMIN, Agent, PRODUCT, Replica, agents_data, conditions, eventually, gone};
use tessera_fleet::testing::TestEtcd;

const CLUSTER: &str = "agents";

/// One replica, two agents and the tokens, on a fresh etcd.
struct Fleet {
    // Dropped in this order: the processes before the etcd they use.
    replica: Replica,
    agents: BTreeMap<String, Agent>,
    etcd: TestEtcd,
    _repo: tempfile::TempDir,
    work: tempfile::TempDir,
    /// The process groups of the workloads the test saw: they outlive their agents by design.
    reap: Vec<u32>,
}

impl Fleet {
    fn start() -> Fleet {
        Fleet::start_with_grace("3s")
    }

    /// A fleet whose nodes are lost after `grace` away.
    fn start_with_grace(grace: &str) -> Fleet {
        let etcd = TestEtcd::start().unwrap_or_else(|e| panic!("{e}"));
        let repo = support::policy_repo(&agents_data("policy"));
        let work = tempfile::tempdir().unwrap();
        std::fs::write(
            work.path().join("tokens.yaml"),
            format!("admin: {ADMIN}\ntenants:\n  product: {PRODUCT}\n"),
        )
        .unwrap();
        let mut fleet = Fleet {
            replica: Replica::spawn(
                &etcd,
                repo.path(),
                work.path(),
                "only",
                &[
                    "--cluster",
                    CLUSTER,
                    "--lease-ttl",
                    "2s",
                    "--node-grace",
                    grace,
                ],
            ),
            etcd,
            _repo: repo,
            work,
            agents: BTreeMap::new(),
            reap: Vec::new(),
        };
        for node in ["n1", "n2"] {
            fleet.spawn_agent(node);
        }
        fleet
            .replica
            .await_line("tessera-fleet reconcile: leading (term ");
        fleet
    }

    fn spawn_agent(&mut self, node: &str) {
        let agent = Agent::spawn(
            &self.etcd,
            CLUSTER,
            node,
            &agents_data("nodes.yaml"),
            &self.work.path().join(node),
            &self.work.path().join(format!("{node}.log")),
            &["--runtime", "process", "--insecure-runtime"],
        );
        self.agents.insert(node.to_string(), agent);
    }

    fn agent_signal(&self, node: &str, signal: Signal) {
        kill(Pid::from_raw(self.agents[node].child.id() as i32), signal).unwrap();
    }

    /// Submits `name` (a long sleep on a `profile` instance), once a revision is in force.
    fn submit(&self, name: &str, profile: &str) {
        let job = json!({
            "tenant": "product",
            "sloClass": "serving",
            "pool": "infer",
            "gpu": {"migProfile": profile},
            "command": ["sleep", "600"],
        });
        eventually(&format!("{name} accepted"), || {
            let (code, body) = self.replica.try_call(
                "POST",
                "/v1/workloads",
                PRODUCT,
                Some(json!({"name": name, "spec": job})),
            )?;
            let waiting = body["error"]
                .as_str()
                .is_some_and(|e| e.contains("no policy revision"));
            assert!(code == 201 || waiting, "{code} {body}");
            (code == 201).then_some(())
        });
    }

    fn status(&self) -> Option<Value> {
        self.replica
            .try_call("GET", "/status", ADMIN, None)
            .filter(|(code, _)| *code == 200)
            .map(|(_, body)| body)
    }

    /// Waits until the store says `name` runs.
    fn await_running(&self, name: &str) {
        eventually(&format!("{name} running in the store"), || {
            let (_, w) =
                self.replica
                    .try_call("GET", &format!("/v1/workloads/{name}"), ADMIN, None)?;
            (w["phase"] == "running").then_some(())
        });
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for node in self.agents.keys() {
            // A paused agent is resumed so that its kill on drop ends it.
            let _ = kill(
                Pid::from_raw(self.agents[node].child.id() as i32),
                Signal::SIGCONT,
            );
        }
        for &pid in &self.reap {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// etcd as the test reads it, for this fleet's nodes and tenant.
struct View(support::FleetEtcd);

impl View {
    fn connect(etcd: &TestEtcd) -> View {
        View(support::FleetEtcd::connect(etcd, CLUSTER))
    }

    /// The replicas of `product/<name>` each node reports running: node → (attempt, pid).
    fn running(&self, name: &str) -> BTreeMap<String, Vec<(u32, Option<u32>)>> {
        self.0.running(&format!("product/{name}"), &["n1", "n2"])
    }

    /// How many `running` events `name` has: one per start.
    fn starts(&self, name: &str) -> usize {
        self.0.events(name, "running")
    }

    /// Waits until `name` runs on one node, once; that node and the replica's pid.
    fn await_one(&self, name: &str) -> (String, u32, u32) {
        let running = eventually(&format!("{name} running on an agent"), || {
            let running = self.running(name);
            (!running.is_empty()).then_some(running)
        });
        assert_eq!(running.len(), 1, "one node runs {name}: {running:?}");
        let (node, replicas) = running.into_iter().next().unwrap();
        assert_eq!(replicas.len(), 1, "{name}: {replicas:?}");
        let (attempt, pid) = replicas[0];
        (node, attempt, pid.expect("a real process"))
    }
}

/// Submits `web` and waits for it to run: the node and the process, started once at attempt 0.
fn web_running_once(fleet: &mut Fleet, view: &View) -> (String, u32) {
    fleet.submit("web", "3g.40gb");
    let (node, attempt, pid) = view.await_one("web");
    fleet.reap.push(pid);
    assert_eq!(attempt, 0);
    fleet.await_running("web");
    assert_eq!(view.starts("web"), 1, "started once");
    (node, pid)
}

/// Waits for a Degraded `/status` with a condition that contains `naming`.
fn await_degraded(fleet: &Fleet, naming: &str) -> Value {
    eventually(&format!("/status Degraded naming {naming:?}"), || {
        let s = fleet.status()?;
        let named = conditions(&s).iter().any(|c| c.contains(naming));
        (s["health"] == "Degraded" && named).then_some(s)
    })
}

/// Waits for a `/status` that is not Degraded and names nothing containing `naming`.
fn await_recovered(fleet: &Fleet, naming: &str) -> Value {
    eventually(&format!("/status recovered from {naming:?}"), || {
        let s = fleet.status()?;
        let named = conditions(&s).iter().any(|c| c.contains(naming));
        (s["health"] != "Degraded" && !named).then_some(s)
    })
}

#[test]
fn etcd_away_past_the_lease_degrades_the_status_and_loses_nothing() {
    etcd_outage_loses_nothing(
        Fleet::start(),
        // Standing by comes only once the term's lease deadline passed, so the outage is past
        // the lease (2 s).
        |fleet| fleet.etcd.kill(),
        |fleet| {
            fleet
                .etcd
                .restart()
                .unwrap_or_else(|e| panic!("etcd restarts on its data: {e}"))
        },
        "etcd: ",
    );
}

#[test]
fn a_hung_etcd_degrades_the_status_the_leader_steps_down_and_recovers_running_nothing_twice() {
    // A node grace longer than the pause: etcd expires the agents' registrations when it
    // resumes (their leases ran out meanwhile) and they register again within it, so no
    // node is lost and nothing is moved.
    etcd_outage_loses_nothing(
        Fleet::start_with_grace("60s"),
        // Hung (SIGSTOP: its connections stay open, nothing answers) past the lease: the
        // replica's calls to etcd time out, it counts its term over at the lease's deadline
        // and steps down, which needs its cycle to end.
        |fleet| {
            fleet.etcd.pause().unwrap_or_else(|e| panic!("{e}"));
            fleet
                .replica
                .await_line("tessera-fleet reconcile: standing by");
        },
        |fleet| fleet.etcd.resume().unwrap_or_else(|e| panic!("{e}")),
        "etcd",
    );
}

/// A workload runs; `outage` takes etcd away past the lease: the replica stands by, its
/// status, served from memory, Degraded naming etcd, while the workload runs on. `back`
/// brings etcd back: the replica leads again, the workload runs where it ran as the same
/// process, started once, a new submission runs once, and `/status` recovers (no condition
/// containing `recovered_from`).
fn etcd_outage_loses_nothing(
    mut fleet: Fleet,
    outage: impl FnOnce(&mut Fleet),
    back: impl FnOnce(&mut Fleet),
    recovered_from: &str,
) {
    let view = View::connect(&fleet.etcd);
    let (node, pid) = web_running_once(&mut fleet, &view);

    outage(&mut fleet);
    let degraded = eventually("the standby's status Degraded naming etcd", || {
        let s = fleet.status()?;
        let conditions = conditions(&s);
        let standing_by = conditions.iter().any(|c| c.contains("stands by"));
        let etcd = conditions.iter().any(|c| c.starts_with("etcd: "));
        (s["health"] == "Degraded" && standing_by && etcd).then_some(s)
    });
    eprintln!("degraded: {:?}", conditions(&degraded));
    assert!(!gone(pid), "the workload runs on while etcd is away");
    back(&mut fleet);

    fleet
        .replica
        .await_line("tessera-fleet reconcile: leading (term ");
    fleet.await_running("web");
    fleet.submit("api", "4g.40gb");
    let (_, api_attempt, api_pid) = view.await_one("api");
    fleet.reap.push(api_pid);
    assert_eq!(api_attempt, 0);
    fleet.await_running("api");
    let recovered = await_recovered(&fleet, recovered_from);
    eprintln!("recovered: {recovered}");
    assert!(!gone(pid), "web was not stopped");
    assert_eq!(
        view.running("web"),
        BTreeMap::from([(node, vec![(0, Some(pid))])]),
        "web runs where it ran, the same process"
    );
    assert_eq!(view.starts("web"), 1, "web was started once");
    assert_eq!(view.starts("api"), 1, "api was started once");
}

#[test]
fn an_agent_paused_past_its_lease_is_lost_then_rejoins_without_running_anything_twice() {
    let mut fleet = Fleet::start();
    let view = View::connect(&fleet.etcd);
    let (node, pid) = web_running_once(&mut fleet, &view);
    let other = if node == "n1" { "n2" } else { "n1" };

    // Paused past its lease and the grace: the node is lost and the status names it; the
    // workload runs on the other node.
    fleet.agent_signal(&node, Signal::SIGSTOP);
    let degraded = await_degraded(&fleet, &format!("node {node}"));
    eprintln!("degraded: {:?}", conditions(&degraded));
    let moved = eventually("web running on the other node", || {
        view.running("web")
            .get(other)
            .and_then(|r| r.iter().find(|(attempt, _)| *attempt == 1).copied())
    });
    fleet.reap.extend(moved.1);
    assert!(
        !gone(pid),
        "the old replica runs on while its agent is paused"
    );

    // Resumed: the agent registers again and stops what was moved away from it.
    fleet.agent_signal(&node, Signal::SIGCONT);
    eventually("the stale replica stopped", || gone(pid).then_some(()));
    eventually("the resumed node reporting nothing of web", || {
        let running = view.running("web");
        (!running.contains_key(node.as_str()) && running.get(other).is_some_and(|r| r.len() == 1))
            .then_some(())
    });
    let recovered = await_recovered(&fleet, &format!("node {node}"));
    eprintln!("recovered: {recovered}");
    let (_, w) = fleet.replica.call("GET", "/v1/workloads/web", ADMIN, None);
    assert_eq!(w["phase"], "running", "{w}");
    assert_eq!(view.starts("web"), 2, "started once per placement");
}
