//! `tessera-fleet agent` as a real process against a real etcd, with a test acting as the
//! leader through a real fence: actions are applied once and in order, journaled, reported in
//! `observed`; a SIGKILLed agent restarts without applying anything twice and settles what it
//! left open; what is no longer bound to the node is stopped before it rejoins; unreadable
//! actions fail with a clear journal error; an agent's credentials cannot act for another
//! node; a paused agent's node is NotReady and comes back Ready with nothing lost, a killed
//! one's is Lost after the grace.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions};
use nix::sys::signal::Signal;
use serde_json::json;
use support::Agent;
use tessera_fleet::access::{self, Credentials};
use tessera_fleet::actions::JournalRecord;
use tessera_fleet::agent::INTERRUPTED;
use tessera_fleet::election::{Candidate, LeaderInfo, Leadership, Write};
use tessera_fleet::keys::Keys;
use tessera_fleet::liveness::{Liveness, LivenessTracker};
use tessera_fleet::protocol::{self, Bound, Observed, RunState, VERSION};
use tessera_fleet::registration::{NodeEvent, NodeWatch};
use tessera_fleet::testing::TestEtcd;

const NODE: &str = "train-0";
/// Long enough that no test waits on a lease.
const LEADER_TTL: i64 = 30;
/// Every wait is bounded by this: a failure guard, never a timing assertion.
const PATIENCE: Duration = Duration::from_secs(60);

fn keys() -> Keys {
    Keys::new("test").unwrap()
}

fn etcd() -> TestEtcd {
    TestEtcd::start().unwrap_or_else(|e| panic!("{e}"))
}

async fn connect(etcd: &TestEtcd, who: Option<&Credentials>) -> Client {
    let options = who.map(|c| ConnectOptions::new().with_user(c.user.clone(), c.password.clone()));
    Client::connect([etcd.endpoint()], options)
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", etcd.endpoint()))
}

async fn lead(client: &Client) -> Leadership {
    let info = LeaderInfo {
        id: "test-leader".into(),
        advertise: None,
    };
    Candidate::new(client.clone(), keys(), info, LEADER_TTL)
        .campaign()
        .await
        .unwrap()
}

fn nodes_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/nodes/quickstart.yaml")
}

/// `tessera-fleet agent` for `node` of the quickstart fleet in cluster `test`, its state in
/// `state` and its log beside it, with `extra` flags.
fn start_agent(etcd: &TestEtcd, state: &Path, node: &str, extra: &[&str]) -> Agent {
    let log = state.with_file_name(format!(
        "agent-{}.log",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    Agent::spawn(etcd, "test", node, &nodes_file(), state, &log, extra)
}

fn gpu(index: u32) -> serde_json::Value {
    json!({"node": NODE, "index": index})
}

/// The steps that make one 3g.40gb instance (profile 9 on an H100 80GB) at slice 0 of `index`.
fn make_instance(index: u32) -> Vec<serde_json::Value> {
    vec![
        json!({"action": "set_mig_mode", "gpu": gpu(index), "enabled": true}),
        json!({"action": "reset_gpu", "gpu": gpu(index)}),
        json!({"action": "create_gpu_instance", "gpu": gpu(index), "profile_id": 9, "start": 0}),
        json!({"action": "create_compute_instance", "gpu": gpu(index), "start": 0}),
    ]
}

fn message(action: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"version": VERSION, "action": action})).unwrap()
}

fn start(workload: &str, binding: serde_json::Value, attempt: u32, command: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "version": VERSION,
        "action": {"action": "start", "workload": workload, "bindings": [binding]},
        "launch": {"attempt": attempt, "command": command},
    }))
    .unwrap()
}

/// Writes `bodies` as actions `first..` through the leader's fence.
async fn post(leader: &Leadership, first: u64, bodies: Vec<Vec<u8>>) {
    let writes: Vec<Write> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, value)| Write::Put {
            key: keys().action(NODE, first + i as u64).unwrap(),
            value,
        })
        .collect();
    leader.write(&[], &writes).await.unwrap();
}

async fn bind(leader: &Leadership, workloads: &[(&str, u32)]) {
    let bound = Bound {
        version: VERSION,
        workloads: workloads.iter().map(|(k, a)| (k.to_string(), *a)).collect(),
    };
    leader
        .write(
            &[],
            &[Write::Put {
                key: keys().bound(NODE).unwrap(),
                value: protocol::encode(&bound),
            }],
        )
        .await
        .unwrap();
}

async fn journal(client: &Client) -> BTreeMap<u64, JournalRecord> {
    let prefix = keys().journal_prefix(NODE).unwrap();
    let answer = client
        .clone()
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    answer
        .kvs()
        .iter()
        .map(|kv| {
            let id = kv
                .key_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            (id, serde_json::from_slice(kv.value()).unwrap())
        })
        .collect()
}

/// Waits until every id in `ids` is settled in the journal; the journal then.
async fn settled(
    client: &Client,
    agent: &Agent,
    ids: std::ops::RangeInclusive<u64>,
) -> BTreeMap<u64, JournalRecord> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let journal = journal(client).await;
        if ids
            .clone()
            .all(|id| journal.get(&id).is_some_and(JournalRecord::is_settled))
        {
            return journal;
        }
        assert!(
            Instant::now() < deadline,
            "actions {ids:?} not settled; journal {journal:?}; agent log:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `observed` satisfies `f`; the observation then.
async fn observed_until(client: &Client, agent: &Agent, f: impl Fn(&Observed) -> bool) -> Observed {
    let key = keys().observed(NODE).unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let answer = client.clone().get(key.as_str(), None).await.unwrap();
        if let Some(kv) = answer.kvs().first() {
            let observed: Observed = protocol::decode(kv.value()).unwrap();
            if f(&observed) {
                return observed;
            }
        }
        assert!(
            Instant::now() < deadline,
            "observed never matched; agent log:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn instances_at(observed: &Observed, index: u32) -> usize {
    observed
        .node
        .gpus
        .iter()
        .find(|g| g.index == index)
        .map_or(0, |g| g.instances.len())
}

fn pid_alive(pid: u32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_are_applied_once_in_order_journaled_and_observed() {
    let etcd = etcd();
    let client = connect(&etcd, None).await;
    let leader = lead(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(
        &etcd,
        &dir.path().join("state"),
        NODE,
        &["--runtime", "none"],
    );

    post(
        &leader,
        1,
        make_instance(0).into_iter().map(message).collect(),
    )
    .await;
    let journal = settled(&client, &agent, 1..=4).await;
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.path().join("state"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(
        mode & 0o777,
        0o700,
        "the state directory is the agent's alone"
    );
    for id in 1..=4 {
        assert_eq!(
            journal[&id],
            JournalRecord::Done,
            "action {id}: {:?}\n{}",
            journal[&id],
            agent.log()
        );
    }
    let observed = observed_until(&client, &agent, |o| instances_at(o, 0) == 1).await;
    let gpu0 = &observed.node.gpus[0];
    assert!(gpu0.mig.enabled);
    assert_eq!(gpu0.instances[0].start, 0);
    assert_eq!(observed.details[0].instances[0].compute_instances.len(), 1);

    // Unreadable or misaddressed actions fail, each with why, and the agent goes on.
    post(
        &leader,
        5,
        vec![
            b"{\"version\": 1, \"action\": {\"action\": \"melt\"}}".to_vec(),
            b"{\"version\": 2, \"action\": {}}".to_vec(),
            b"not json".to_vec(),
            message(json!({"action": "reset_gpu", "gpu": {"node": "train-1", "index": 0}})),
            message(json!({"action": "create_gpu_instance", "gpu": gpu(0), "profile_id": 9, "start": 0})),
            // A start with no launch, and one bound to another node only.
            message(json!({"action": "start", "workload": "research/a", "bindings": [{"node": NODE, "gpus": [1]}]})),
            start("research/b", json!({"node": "train-1", "gpus": [0]}), 0, &[]),
        ],
    )
    .await;
    let journal = settled(&client, &agent, 5..=11).await;
    let expected = [
        (5, "unknown variant `melt`"),
        (6, "protocol version 2 is not spoken here"),
        (7, "the action cannot be read"),
        (8, "train-1/gpu0 is not a GPU of this node (train-0)"),
        (9, "NVML_ERROR_INSUFFICIENT_RESOURCES"),
        (10, "the start of research/a carries no launch"),
        (11, "no replica of research/b is bound to this node"),
    ];
    for (id, says) in expected {
        match &journal[&id] {
            JournalRecord::Failed { error } => assert!(
                error.contains(says),
                "action {id}: {error:?} should say {says:?}"
            ),
            other => panic!("action {id} should have failed, got {other:?}"),
        }
    }
    assert!(
        agent.is_running(),
        "bad actions never stop the agent:\n{}",
        agent.log()
    );

    // A start on the new instance (runtime none: devices claimed, nothing run).
    post(
        &leader,
        12,
        vec![start(
            "research/train",
            json!({"node": NODE, "gpus": [0], "migStart": 0}),
            0,
            &["sleep", "60"],
        )],
    )
    .await;
    let journal = settled(&client, &agent, 12..=12).await;
    assert_eq!(journal[&12], JournalRecord::Done, "{}", agent.log());
    let observed = observed_until(&client, &agent, |o| !o.workloads.is_empty()).await;
    assert_eq!(observed.workloads.len(), 1);
    let replica = &observed.workloads[0];
    assert_eq!(
        (replica.workload.as_str(), replica.attempt, replica.replica),
        ("research/train", 0, 0)
    );
    assert_eq!(replica.pid, None);
    assert_eq!(replica.state, RunState::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_applies_nothing_twice_and_stops_what_is_no_longer_bound() {
    let etcd = etcd();
    let client = connect(&etcd, None).await;
    let leader = lead(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let run = ["--runtime", "process", "--insecure-runtime"];

    // A workload that runs, bound to the node.
    let mut agent = start_agent(&etcd, &state, NODE, &run);
    bind(&leader, &[("research/sleep", 0)]).await;
    post(
        &leader,
        1,
        vec![start(
            "research/sleep",
            json!({"node": NODE, "gpus": [7]}),
            0,
            &["sleep", "300"],
        )],
    )
    .await;
    let journal = settled(&client, &agent, 1..=1).await;
    assert_eq!(journal[&1], JournalRecord::Done, "{}", agent.log());
    let observed = observed_until(&client, &agent, |o| {
        o.workloads.iter().any(|w| w.pid.is_some())
    })
    .await;
    let pid = observed.workloads[0].pid.unwrap();
    assert!(pid_alive(pid));

    // Geometry on six GPUs (24 steps, one journal batch); SIGKILL the agent as soon as the
    // batch's intents are written, while it applies them.
    let steps: Vec<Vec<u8>> = (0..6).flat_map(make_instance).map(message).collect();
    post(&leader, 2, steps).await;
    let deadline = Instant::now() + PATIENCE;
    while !journal_has_entry_after(&client, 1).await {
        assert!(Instant::now() < deadline, "{}", agent.log());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    agent.sigkill();
    assert!(pid_alive(pid), "the workload outlives its agent");

    // As if the killed agent had also begun (journaled intent for) an action it did not get
    // to apply: the next one, which the node does not show done.
    let open = 26;
    post(
        &leader,
        open,
        vec![message(
            json!({"action": "create_gpu_instance", "gpu": gpu(6), "profile_id": 9, "start": 0}),
        )],
    )
    .await;
    client
        .clone()
        .put(
            keys().journal(NODE, open).unwrap(),
            serde_json::to_vec(&JournalRecord::Intent).unwrap(),
            None,
        )
        .await
        .unwrap();

    let agent = start_agent(&etcd, &state, NODE, &run);
    let journal = settled(&client, &agent, 1..=open).await;
    assert_eq!(
        journal[&open],
        JournalRecord::Failed {
            error: INTERRUPTED.to_string()
        },
        "an intent the node does not show done is settled as interrupted, not applied"
    );
    // Applied at most once each: no GPU has more than its one instance (a second create
    // would have made another). A GPU whose steps were all done has it; one whose step the
    // kill interrupted has that step failed as interrupted, and its later steps fail on what
    // the node then shows (the control plane re-plans from `observed`).
    let observed =
        observed_until(&client, &agent, |o| (0..6).all(|i| instances_at(o, i) <= 1)).await;
    for index in 0..6u64 {
        let ids = 2 + 4 * index..=5 + 4 * index;
        let records: Vec<&JournalRecord> = ids.clone().map(|id| &journal[&id]).collect();
        let first_failed = records
            .iter()
            .position(|r| !matches!(r, JournalRecord::Done));
        match first_failed {
            None => assert_eq!(instances_at(&observed, index as u32), 1, "gpu{index}"),
            Some(at) => assert_eq!(
                records[at],
                &JournalRecord::Failed {
                    error: INTERRUPTED.to_string()
                },
                "gpu{index}: the first step not done was the interrupted one: {records:?}\n{}",
                agent.log()
            ),
        }
    }
    assert_eq!(instances_at(&observed, 6), 0);
    // The workload was adopted, not started again.
    assert_eq!(observed.workloads.len(), 1);
    assert_eq!(observed.workloads[0].pid, Some(pid));
    assert!(pid_alive(pid));

    // While the agent is away the workload is bound elsewhere: back, it stops it first.
    drop(agent);
    bind(&leader, &[]).await;
    let agent = start_agent(&etcd, &state, NODE, &run);
    observed_until(&client, &agent, |o| o.workloads.is_empty()).await;
    let deadline = Instant::now() + PATIENCE;
    while pid_alive(pid) && !is_zombie_or_gone(pid) {
        assert!(
            Instant::now() < deadline,
            "the unbound workload still runs:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        agent.log().contains("no longer bound to this node"),
        "{}",
        agent.log()
    );
}

async fn journal_has_entry_after(client: &Client, id: u64) -> bool {
    journal(client).await.keys().any(|i| *i > id)
}

/// A killed process of an agent that is gone itself lingers as a zombie until reaped.
fn is_zombie_or_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_one_nodes_credentials_cannot_act_for_another() {
    let etcd = etcd();
    let bootstrap = connect(&etcd, None).await;
    access::enable_auth(&bootstrap, "root-secret")
        .await
        .unwrap();
    let root = connect(
        &etcd,
        Some(&Credentials {
            user: access::ROOT_USER.into(),
            password: "root-secret".into(),
        }),
    )
    .await;
    let mine = access::provision_node(&root, &keys(), NODE, "train-0-secret")
        .await
        .unwrap();
    access::provision_node(&root, &keys(), "train-1", "train-1-secret")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("credentials");
    std::fs::write(&creds, format!("{}:{}\n", mine.user, mine.password)).unwrap();
    let creds = creds.to_str().unwrap();

    // With its own node's credentials the agent registers and reports.
    let agent = start_agent(
        &etcd,
        &dir.path().join("a"),
        NODE,
        &["--runtime", "none", "--credentials", creds],
    );
    observed_until(&root, &agent, |o| o.node.name == NODE).await;

    // The same credentials for train-1: etcd refuses, and the agent says so and exits 3.
    let mut other = start_agent(
        &etcd,
        &dir.path().join("b"),
        "train-1",
        &["--runtime", "none", "--credentials", creds],
    );
    assert_eq!(other.exit_code(), 3, "{}", other.log());
    let log = other.log();
    assert!(
        log.contains("permission denied") && log.contains("/registrations/train-1"),
        "{log}"
    );
    let answer = root
        .clone()
        .get(keys().registration("train-1").unwrap(), None)
        .await
        .unwrap();
    assert!(answer.kvs().is_empty(), "nothing was written for train-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_keep_running_while_etcd_is_away_and_the_agent_catches_up() {
    let mut etcd = etcd();
    let client = connect(&etcd, None).await;
    let leader = lead(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let run = ["--runtime", "process", "--insecure-runtime"];
    let mut agent = start_agent(&etcd, &dir.path().join("state"), NODE, &run);
    post(
        &leader,
        1,
        vec![
            start(
                "research/short",
                json!({"node": NODE, "gpus": [0]}),
                0,
                &["sh", "-c", "exit 3"],
            ),
            start(
                "research/long",
                json!({"node": NODE, "gpus": [1]}),
                0,
                &["sleep", "300"],
            ),
        ],
    )
    .await;
    settled(&client, &agent, 1..=2).await;
    // An exit is reported in `observed`, with how it ended.
    let observed = observed_until(&client, &agent, |o| {
        o.workloads
            .iter()
            .any(|w| matches!(&w.state, RunState::Exited { status } if status == "exit code 3"))
    })
    .await;
    let long = observed
        .workloads
        .iter()
        .find(|w| w.workload == "research/long")
        .and_then(|w| w.pid)
        .unwrap();

    etcd.kill();
    let deadline = Instant::now() + PATIENCE;
    while !agent.log().contains("the node's workloads keep running") {
        assert!(
            Instant::now() < deadline,
            "the agent did not notice etcd going:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(agent.is_running(), "{}", agent.log());
    assert!(pid_alive(long), "the workload runs on without etcd");

    etcd.restart().unwrap();
    let client = connect(&etcd, None).await;
    post(
        &leader,
        3,
        vec![message(
            json!({"action": "stop", "workload": "research/long", "reason": "test"}),
        )],
    )
    .await;
    let journal = settled(&client, &agent, 3..=3).await;
    assert_eq!(journal[&3], JournalRecord::Done, "{}", agent.log());
    observed_until(&client, &agent, |o| {
        o.workloads.iter().all(|w| w.workload != "research/long")
    })
    .await;
    let deadline = Instant::now() + PATIENCE;
    while !is_zombie_or_gone(long) {
        assert!(Instant::now() < deadline, "the stopped workload still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the next registration event of `node` and feeds it to `liveness`; the node's
/// liveness after it.
async fn next_liveness(
    watch: &mut NodeWatch,
    liveness: &mut LivenessTracker,
    agent: &Agent,
) -> Liveness {
    loop {
        let event = tokio::time::timeout(PATIENCE, watch.next())
            .await
            .unwrap_or_else(|_| panic!("no registration event; agent log:\n{}", agent.log()))
            .unwrap()
            .expect("the watch goes on");
        let node = match &event {
            NodeEvent::Ready(registration) => registration.node.name.clone(),
            NodeEvent::NotReady { node } => node.clone(),
        };
        let state = liveness.observe(&event, tokio::time::Instant::now());
        if node == NODE {
            return state;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_agent_is_not_ready_then_ready_with_nothing_lost_and_a_killed_one_is_lost() {
    let etcd = etcd();
    let client = connect(&etcd, None).await;
    let leader = lead(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let run = ["--runtime", "process", "--insecure-runtime"];
    let (registered, mut watch) = NodeWatch::start(&client, &keys()).await.unwrap();
    let expected = [NODE.to_string()];
    let grace = Duration::from_secs(1);
    let mut liveness = LivenessTracker::new(
        grace,
        registered.keys(),
        &expected,
        tokio::time::Instant::now(),
    );
    assert!(matches!(
        liveness.get(NODE),
        Some(Liveness::NotReady { .. })
    ));

    let mut agent = start_agent(&etcd, &state, NODE, &run);
    assert_eq!(
        next_liveness(&mut watch, &mut liveness, &agent).await,
        Liveness::Ready
    );
    bind(&leader, &[("research/sleep", 0)]).await;
    post(
        &leader,
        1,
        vec![start(
            "research/sleep",
            json!({"node": NODE, "gpus": [7]}),
            0,
            &["sleep", "300"],
        )],
    )
    .await;
    settled(&client, &agent, 1..=1).await;
    let observed = observed_until(&client, &agent, |o| {
        o.workloads.iter().any(|w| w.pid.is_some())
    })
    .await;
    let pid = observed.workloads[0].pid.unwrap();

    // Paused past its lease (2 s): its registration expires and the node is NotReady.
    let agent_pid = nix::unistd::Pid::from_raw(agent.child.id() as i32);
    nix::sys::signal::kill(agent_pid, Signal::SIGSTOP).unwrap();
    let away = next_liveness(&mut watch, &mut liveness, &agent).await;
    assert!(matches!(away, Liveness::NotReady { .. }), "{away:?}");
    assert!(
        pid_alive(pid),
        "the workload runs on while its agent is paused"
    );

    // Resumed, it registers again by itself, with its workload as it was.
    nix::sys::signal::kill(agent_pid, Signal::SIGCONT).unwrap();
    loop {
        if next_liveness(&mut watch, &mut liveness, &agent).await == Liveness::Ready {
            break;
        }
    }
    assert!(pid_alive(pid));
    post(
        &leader,
        2,
        vec![message(
            json!({"action": "set_mig_mode", "gpu": gpu(0), "enabled": true}),
        )],
    )
    .await;
    let journal = settled(&client, &agent, 1..=2).await;
    assert_eq!(
        journal,
        BTreeMap::from([(1, JournalRecord::Done), (2, JournalRecord::Done)]),
        "one entry per action, each applied once"
    );
    let observed = observed_until(&client, &agent, |o| {
        let mig = &o.node.gpus[0].mig;
        mig.enabled || mig.pending == Some(true)
    })
    .await;
    assert_eq!(observed.workloads.len(), 1, "{observed:?}");
    assert_eq!(observed.workloads[0].pid, Some(pid));
    assert_eq!(observed.workloads[0].state, RunState::Running);
    assert_eq!(liveness.lost().count(), 0);

    // Killed, it is NotReady once its lease expires, and Lost after the grace.
    agent.sigkill();
    let away = next_liveness(&mut watch, &mut liveness, &agent).await;
    let Liveness::NotReady { since } = away else {
        panic!("{away:?}")
    };
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = tokio::time::Instant::now();
        if liveness.tick(now) == [NODE] {
            assert!(now >= since + grace);
            break;
        }
        assert_eq!(liveness.get(NODE), Some(Liveness::NotReady { since }));
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(liveness.get(NODE), Some(Liveness::Lost { since }));
    assert_eq!(liveness.lost().collect::<Vec<_>>(), [NODE]);
}
