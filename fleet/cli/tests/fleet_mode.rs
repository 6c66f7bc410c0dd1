//! Fleet mode end to end: `tessera-fleet reconcile` replicas whose leader drives real
//! `tessera-fleet agent` processes (sim driver, real replicas) through a real etcd. A workload
//! submitted to the leader runs on one agent, started once, on the MIG instance the leader had
//! that agent make; its agent killed, the node is lost after the grace, `/status` says so and
//! the workload runs on the other agent; the agent back, it stops the stale replica before it
//! rejoins, and `/status` recovers.
//!
//! Every wait is bounded by a deadline that guards against a hang, never asserts on time.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use support::{ADMIN, Agent, PRODUCT, Replica, agents_data, conditions, eventually, gone};
use tessera_fleet::protocol::Observed;
use tessera_fleet::testing::TestEtcd;

const CLUSTER: &str = "agents";
const WORKLOAD: &str = "product/web";

fn agent(etcd: &TestEtcd, work: &Path, node: &str) -> Agent {
    Agent::spawn(
        etcd,
        CLUSTER,
        node,
        &agents_data("nodes.yaml"),
        &work.join(node),
        &work.join(format!("{node}.log")),
        &["--runtime", "process", "--insecure-runtime"],
    )
}

fn replica(etcd: &TestEtcd, repo: &Path, work: &Path, id: &str) -> Replica {
    Replica::spawn(
        etcd,
        repo,
        work,
        id,
        &[
            "--cluster",
            CLUSTER,
            "--lease-ttl",
            "2s",
            "--node-grace",
            "3s",
        ],
    )
}

/// etcd as the test reads it, for this fleet's nodes and `WORKLOAD`.
struct Etcd(support::FleetEtcd);

impl Etcd {
    fn connect(etcd: &TestEtcd) -> Etcd {
        Etcd(support::FleetEtcd::connect(etcd, CLUSTER))
    }

    fn observed(&self, node: &str) -> Option<Observed> {
        self.0.observed(node)
    }

    /// The replicas of `WORKLOAD` each node reports running: node → (attempt, pid).
    fn running(&self) -> BTreeMap<String, Vec<(u32, Option<u32>)>> {
        self.0.running(WORKLOAD, &["n1", "n2"])
    }

    fn events(&self, kind: &str) -> usize {
        self.0.events("web", kind)
    }
}

/// Kills the replicas' process groups the test saw, whatever happens to it: they outlive
/// their agents by design.
struct Reaper(Vec<u32>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn status(replica: &Replica) -> Value {
    replica.call("GET", "/status", ADMIN, None).1
}

#[test]
fn the_leader_runs_workloads_on_agents_and_moves_them_off_a_lost_node() {
    let etcd = TestEtcd::start().unwrap_or_else(|e| panic!("{e}"));
    let repo = support::policy_repo(&agents_data("policy"));
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        work.path().join("tokens.yaml"),
        format!("admin: {ADMIN}\ntenants:\n  product: {PRODUCT}\n"),
    )
    .unwrap();
    let mut agents: BTreeMap<String, Agent> = BTreeMap::new();
    for node in ["n1", "n2"] {
        agents.insert(node.to_string(), agent(&etcd, work.path(), node));
    }
    let first = replica(&etcd, repo.path(), work.path(), "first");
    first.await_line("tessera-fleet reconcile: leading (term ");
    let second = replica(&etcd, repo.path(), work.path(), "second");
    second.await_line("tessera-fleet reconcile: standing by");
    let view = Etcd::connect(&etcd);
    let mut reaper = Reaper(Vec::new());

    // Submitted to the leader, it runs on one agent, once, on the instance the leader had
    // that agent make.
    let job = json!({
        "tenant": "product",
        "sloClass": "serving",
        "pool": "infer",
        "gpu": {"migProfile": "3g.40gb"},
        "command": ["sleep", "600"],
    });
    // Accepted once the leader has a revision in force.
    eventually("the submission accepted", || {
        let (code, body) = first.call(
            "POST",
            "/v1/workloads",
            PRODUCT,
            Some(json!({"name": "web", "spec": job})),
        );
        let waiting = body["error"]
            .as_str()
            .is_some_and(|e| e.contains("no policy revision"));
        assert!(code == 201 || waiting, "{code} {body}");
        (code == 201).then_some(())
    });
    let running = eventually("web running on an agent", || {
        let running = view.running();
        (!running.is_empty()).then_some(running)
    });
    assert_eq!(running.len(), 1, "one node runs it: {running:?}");
    let (node, replicas) = running.iter().next().unwrap();
    let node = node.clone();
    assert_eq!(replicas.len(), 1, "{replicas:?}");
    let (attempt, pid) = replicas[0];
    assert_eq!(attempt, 0);
    let pid = pid.expect("a real process");
    reaper.0.push(pid);
    let observed = view.observed(&node).unwrap();
    let gpu = &observed.node.gpus[0];
    let mig = serde_json::to_value(gpu).unwrap();
    assert_eq!(
        mig["mig"]["enabled"],
        json!(true),
        "MIG made on {node}: {mig}"
    );
    assert!(
        mig["instances"]
            .as_array()
            .is_some_and(|i| i.iter().any(|i| i["profile"] == "3g.40gb")),
        "the 3g.40gb instance exists on {node}: {mig}"
    );
    eventually("web running in the store", || {
        let w = first.call("GET", "/v1/workloads/web", ADMIN, None).1;
        (w["phase"] == "running").then_some(())
    });
    assert_eq!(view.events("running"), 1, "started once");

    // Its agent dies: after the grace its node is lost, the service says why, and the
    // workload runs on the other node.
    let other = if node == "n1" { "n2" } else { "n1" };
    agents.get_mut(&node).unwrap().sigkill();
    let degraded = eventually("the status naming the lost node", || {
        let s = status(&first);
        let named = conditions(&s)
            .iter()
            .any(|c| c.contains(&format!("node {node}")));
        (s["health"] == "Degraded" && named).then_some(s)
    });
    eprintln!("degraded: {:?}", conditions(&degraded));
    let moved = eventually("web running on the other node", || {
        view.running()
            .get(other)
            .and_then(|r| r.iter().find(|(attempt, _)| *attempt == 1).copied())
    });
    reaper.0.extend(moved.1);
    assert!(
        !gone(pid),
        "the old replica runs on while its agent is away"
    );

    // Back, the agent stops the stale replica before it rejoins: nothing runs twice.
    agents.insert(node.clone(), agent(&etcd, work.path(), &node));
    eventually("the stale replica stopped", || gone(pid).then_some(()));
    eventually("the returning node reporting nothing of web", || {
        let running = view.running();
        (!running.contains_key(node.as_str()) && running.get(other).is_some_and(|r| r.len() == 1))
            .then_some(())
    });
    let healthy = eventually("the status recovered", || {
        let s = status(&first);
        let named = conditions(&s)
            .iter()
            .any(|c| c.contains(&format!("node {node}")));
        (s["health"] != "Degraded" && !named).then_some(s)
    });
    eprintln!("recovered: {healthy}");
    let w = first.call("GET", "/v1/workloads/web", ADMIN, None).1;
    assert_eq!(w["phase"], "running", "{w}");
    assert_eq!(view.events("running"), 2, "started once per placement");
    drop(second);
}

/// A small seeded generator (xorshift64*): the moments of the kills, reproducible by seed.
struct Moments(u64);

impl Moments {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// How many times the leader is killed: the 20, each a few seconds (a lease of 2 s).
const KILLS: usize = 20;

#[test]
fn leaders_killed_at_random_moments_apply_nothing_twice_run_nothing_twice_and_lose_nothing() {
    let etcd = TestEtcd::start().unwrap_or_else(|e| panic!("{e}"));
    let repo = support::policy_repo(&agents_data("policy"));
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        work.path().join("tokens.yaml"),
        format!("admin: {ADMIN}\ntenants:\n  product: {PRODUCT}\n"),
    )
    .unwrap();
    let marks = work.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let agents: Vec<Agent> = ["n1", "n2"]
        .iter()
        .map(|n| agent(&etcd, work.path(), n))
        .collect();
    let mut replicas: BTreeMap<String, Replica> = (0..3)
        .map(|i| {
            let id = format!("r{i}");
            let r = replica(&etcd, repo.path(), work.path(), &id);
            (id, r)
        })
        .collect();
    let view = Etcd::connect(&etcd);
    let leader_id = |view: &Etcd| {
        let client = view.0.client.clone();
        let keys = view.0.keys.clone();
        view.0
            .runtime
            .block_on(async move { tessera_fleet::election::current_leader(&client, &keys).await })
            .ok()
            .flatten()
            .map(|l| l.id)
    };
    let seed = 0x7e55_e7a0_u64;
    eprintln!("seed {seed:#x}");
    let mut moments = Moments(seed);
    let mut names = Vec::new();
    for round in 0..KILLS {
        // A workload submitted to whoever leads: short, so that instances are used, freed and
        // used again while leaders die; each run appends its pid to its own file.
        let name = format!("w{round}");
        let profile = if round % 2 == 0 { "3g.40gb" } else { "4g.40gb" };
        let mark = marks.join(&name);
        let job = json!({
            "tenant": "product",
            "sloClass": "serving",
            "pool": "infer",
            "gpu": {"migProfile": profile},
            "command": ["sh", "-c", format!("echo $$ >> {}; sleep 1", mark.display())],
        });
        eventually(&format!("{name} accepted by the leader"), || {
            let leader = leader_id(&view)?;
            let (code, _) = replicas[&leader].try_call(
                "POST",
                "/v1/workloads",
                PRODUCT,
                Some(json!({"name": name, "spec": job})),
            )?;
            // 409: accepted by a leader that died before answering, or by this one already.
            (code == 201 || code == 409).then_some(())
        });
        names.push(name);
        std::thread::sleep(std::time::Duration::from_millis(moments.below(2_000)));
        let leader = eventually("a leader", || leader_id(&view));
        replicas.get_mut(&leader).unwrap().sigkill();
        let killed = std::time::Instant::now();
        let next = eventually("another leader", || {
            leader_id(&view).filter(|id| *id != leader)
        });
        eprintln!(
            "kill {round}: {leader} killed, {next} leads {:.1} s later",
            killed.elapsed().as_secs_f64()
        );
        replicas.insert(
            leader.clone(),
            replica(&etcd, repo.path(), work.path(), &leader),
        );
    }

    // None is lost: every workload ran to its end, exactly once.
    for name in &names {
        eventually(&format!("{name} succeeded"), || {
            let leader = leader_id(&view)?;
            let (_, w) =
                replicas[&leader].try_call("GET", &format!("/v1/workloads/{name}"), ADMIN, None)?;
            assert_ne!(w["phase"], "failed", "{name}: {w}");
            (w["phase"] == "succeeded").then_some(())
        });
        let runs = std::fs::read_to_string(marks.join(name)).unwrap_or_default();
        assert_eq!(runs.lines().count(), 1, "{name} ran once: {runs:?}");
    }
    // No action was applied twice on any node.
    let mut seen = 0;
    for agent in &agents {
        let log = agent.log();
        let mut applied = std::collections::BTreeSet::new();
        for line in log.lines().filter(|l| l.ends_with(": applied")) {
            let id = line
                .split("action{id=")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .unwrap_or_else(|| panic!("an action's id in {line:?}"));
            assert!(
                applied.insert(id.to_string()),
                "action {id} applied twice:\n{log}"
            );
        }
        assert!(!log.contains("already runs here"), "{log}");
        seen += applied.len();
    }
    assert!(seen >= names.len(), "every start is in an agent's log");
    // No GPU is left half-made: each is off, or whole in the pool's layout.
    for node in ["n1", "n2"] {
        let observed = view.observed(node).unwrap();
        let gpu = serde_json::to_value(&observed.node.gpus[0]).unwrap();
        let mut profiles: Vec<String> = gpu["instances"]
            .as_array()
            .map(|i| {
                i.iter()
                    .map(|i| i["profile"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default();
        profiles.sort();
        assert!(
            profiles.is_empty() || profiles == ["3g.40gb", "4g.40gb"],
            "{node}: {gpu}"
        );
        let details = serde_json::to_value(&observed.details[0]).unwrap();
        assert!(
            details["instances"]
                .as_array()
                .is_none_or(|i| i.iter().all(|i| i["compute_instances"]
                    .as_array()
                    .is_some_and(|c| c.len() == 1))),
            "{node}: every instance has its compute instance: {details}"
        );
    }
}
