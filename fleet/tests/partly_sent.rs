//! What a dispatch cut part-way, or a node lost, leaves in flight, and how the leader finishes
//! it: a stop or checkpoint that reached only some of its workload's nodes is sent to the
//! rest before it is recorded; a start whose copy's node is lost fails; a lost node's `bound`
//! is emptied before its workloads are reported for requeueing, unless its agent is back; a
//! gang that loses a node has its replicas on the others stopped; a gang start that reached
//! only some of its nodes is failed, not taken for the whole start.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use etcd_client::Client;
use serde_json::json;
use support::{TTL_SECS, connect, etcd, keys, leader, read_prefix, two_lease_periods, within};
use tessera_compiler::WorkloadKey;
use tessera_fleet::actions::ActionFeed;
use tessera_fleet::dispatch::{DEFAULT_MAX_TXN_OPS, Dispatcher, NodeAction, Plan};
use tessera_fleet::election::Leadership;
use tessera_fleet::nodes::{AgentNodes, AgentOptions};
use tessera_fleet::protocol::{self, ActionMessage, Bound, Launch, VERSION};
use tessera_fleet::registration::{Registrar, Registration};
use tessera_reconciler::actions::Action;
use tessera_reconciler::driver::Observation;
use tessera_reconciler::driver::sim::SimDriver;
use tessera_reconciler::service::nodes::{Carry, NodeSide};
use tessera_reconciler::store::starts::StartIntent;
use tessera_reconciler::store::{
    ActionId, Ended, Origin, Phase, ReplicaProcess, StateStore, StateStoreExt, Store,
};
use tessera_solver::decision::ReplicaBinding;

/// The leaders' lease: long enough that no term ends while the test drives it.
const LEASE_SECS: i64 = 30;

/// How long the tests wait for the view to see a node lost: the grace and many ticks more.
const PATIENCE: Duration = Duration::from_secs(30);

/// A runtime, a fresh etcd (stopped when dropped) and a client of it.
struct Opened {
    runtime: tokio::runtime::Runtime,
    etcd: tessera_fleet::testing::TestEtcd,
    client: Client,
}

fn opened() -> Opened {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let etcd = etcd();
    let client = runtime.block_on(connect(&etcd));
    Opened {
        runtime,
        etcd,
        client,
    }
}

fn start_of(name: &str, nodes: &[&str]) -> Action {
    Action::Start {
        workload: format!("t/{name}"),
        bindings: nodes
            .iter()
            .map(|node| ReplicaBinding {
                node: (*node).into(),
                gpus: vec![0],
                mig_profile: None,
                mig_start: None,
                share: None,
            })
            .collect(),
    }
}

fn launch() -> Launch {
    Launch {
        attempt: 0,
        command: Vec::new(),
        env: BTreeMap::new(),
        cpu_millis: 0,
        memory_bytes: 0,
    }
}

/// `t/train`, one replica a node, submitted and its start's intent recorded (`Starting` on
/// `nodes`); returns the start and its journal entry.
fn starting(store: &Store, nodes: &[&str]) -> (Action, ActionId) {
    starting_as(store, "train", nodes)
}

fn starting_as(store: &Store, name: &str, nodes: &[&str]) -> (Action, ActionId) {
    let key = WorkloadKey::new("t", name);
    let spec = serde_json::from_value(json!({
        "tenant": "t", "sloClass": "training", "gpu": {"count": 1}, "replicas": nodes.len()
    }))
    .unwrap();
    store.submit(name, &spec, Origin::Submitted, 10).unwrap();
    let start = start_of(name, nodes);
    let Action::Start { bindings, .. } = &start else {
        unreachable!()
    };
    let plain: Vec<_> = bindings.iter().map(|b| b.binding()).collect();
    let intent = StartIntent {
        workload: &key,
        bindings: &plain,
        action: &start,
    };
    let ids = store.begin_starts(1, &[intent], 20).unwrap();
    (start, ids[0])
}

/// `t/train` running on `nodes`, and `action`'s intent recorded; returns its journal entry.
fn running_then(store: &Store, nodes: &[&str], action: &Action) -> ActionId {
    running(store, "train", nodes);
    StateStoreExt::begin_action(store, 2, action, 22).unwrap()
}

/// `t/<name>` running on `nodes`.
fn running(store: &Store, name: &str, nodes: &[&str]) {
    let (_, start) = starting_as(store, name, nodes);
    let key = WorkloadKey::new("t", name);
    let replicas: Vec<ReplicaProcess> = (0..nodes.len() as u32)
        .map(|replica| ReplicaProcess {
            replica,
            pid: None,
            devices: Vec::new(),
        })
        .collect();
    StateStore::mark_running(store, &key, &replicas, 21).unwrap();
    StateStore::close(store, start, Ended::Done, 21).unwrap();
    assert_eq!(store.workload(&key).unwrap().phase, Phase::Running);
}

/// A first leader writes `action` to `nodes` only (its dispatch cut before the rest), and
/// resigns; each of `settle` settles its copy done, as its agent would.
async fn cut_dispatch(client: &Client, action: &Action, nodes: &[&str], settle: &[&str]) {
    let first = leader(client, "a", LEASE_SECS).await;
    let mut dispatcher =
        Dispatcher::start(client, &keys(), first.fence().clone(), DEFAULT_MAX_TXN_OPS)
            .await
            .unwrap();
    let launch = matches!(action, Action::Start { .. }).then(launch);
    let plan = Plan {
        actions: nodes
            .iter()
            .map(|node| NodeAction {
                node: (*node).into(),
                message: ActionMessage {
                    version: VERSION,
                    action: action.clone(),
                    launch: launch.clone(),
                },
            })
            .collect(),
        bound: BTreeMap::new(),
    };
    dispatcher.dispatch(&plan).await.unwrap();
    for node in settle {
        settle_next(client, node).await;
    }
    first.resign().await.unwrap();
}

/// `node`'s agent takes its next action and settles it done; returns it.
async fn settle_next(client: &Client, node: &str) -> Action {
    let mut feed = ActionFeed::start(client, &keys(), node).await.unwrap();
    let action = within(two_lease_periods(), "the next action", feed.next())
        .await
        .unwrap()
        .expect("the watch goes on");
    feed.begin(action.id).await.unwrap();
    feed.finish(action.id, Ok(())).await.unwrap();
    protocol::decode::<ActionMessage>(&action.body)
        .unwrap()
        .action
}

/// The actions waiting under `node`, read back.
async fn actions_of(client: &Client, node: &str) -> Vec<Action> {
    read_prefix(client, &keys().actions_prefix(node).unwrap())
        .await
        .iter()
        .filter_map(|kv| protocol::decode::<ActionMessage>(kv.value()).ok())
        .map(|m| m.action)
        .collect()
}

/// `node`'s `bound` as etcd holds it.
async fn bound_of(client: &Client, node: &str) -> Option<Bound> {
    read_prefix(client, &keys().bound(node).unwrap())
        .await
        .first()
        .map(|kv| protocol::decode::<Bound>(kv.value()).unwrap())
}

fn options(grace: Duration) -> AgentOptions {
    AgentOptions {
        grace,
        settle: Duration::from_millis(200),
        max_txn_ops: DEFAULT_MAX_TXN_OPS,
    }
}

/// The node side of the term `term` leads, with node grace `grace`.
fn agent_nodes(client: &Client, term: &Leadership, grace: Duration) -> AgentNodes {
    AgentNodes::new(client.clone(), keys(), term.fence().clone(), options(grace)).unwrap()
}

/// One cycle's carrying out of an empty plan: what records earlier actions' outcomes and
/// sends the housekeeping.
fn quiet_cycle(nodes: &mut AgentNodes, store: &Store, cycle: u64, now: i64) {
    let mut observation = Observation {
        nodes: Vec::new(),
        details: Vec::new(),
    };
    let mut cx = Carry {
        store,
        cycle,
        now,
        run_commands: false,
        records: &[],
        observation: &mut observation,
    };
    nodes.carry_out(&[], &mut cx, &mut |_, _| Ok(())).unwrap();
}

/// `key`'s record was queued again with a reason naming `node`.
fn assert_requeued_naming(store: &Store, key: &WorkloadKey, node: &str) {
    let events = store.recent_workload_events(key, 10).unwrap();
    let requeued = events
        .iter()
        .find(|e| e.kind == "requeued")
        .unwrap_or_else(|| panic!("no requeue among {events:?}"));
    assert!(requeued.message.contains(node), "{}", requeued.message);
}

/// Whether `actions` hold a stop of `workload`.
fn stops(actions: &[Action], workload: &str) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::Stop { workload: w, .. } if w == workload))
}

/// Asks the node side which nodes are lost until `node` is among them.
fn until_lost(nodes: &mut AgentNodes, node: &str) {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if nodes.lost().iter().any(|(n, _)| n == node) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{node} not lost within {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_stop_that_reached_only_some_nodes_is_sent_to_the_rest_before_it_is_recorded() {
    let Opened {
        runtime,
        etcd: _etcd,
        client,
    } = opened();
    let store = Store::open_in_memory().unwrap();
    let key = WorkloadKey::new("t", "train");
    let stop = Action::Stop {
        workload: "t/train".into(),
        reason: "preempted".into(),
    };
    let journal = running_then(&store, &["n1", "n2"], &stop);

    // The first leader's dispatch is cut after n1's copy, which n1 settles.
    runtime.block_on(cut_dispatch(&client, &stop, &["n1"], &["n1"]));

    let second = runtime.block_on(leader(&client, "b", LEASE_SECS));
    let mut nodes = agent_nodes(&client, &second, Duration::from_secs(60));
    let in_flight = nodes.in_flight_at_start(&store, 30).unwrap();

    // Not recorded done on n1's word: n2's replica would run on beside the requeued workload.
    assert_eq!(
        store.workload(&key).unwrap().phase,
        Phase::Running,
        "a stop that never reached n2 was recorded done"
    );
    assert!(in_flight.actions.contains(&journal), "{in_flight:?}");
    let to_n2 = runtime.block_on(actions_of(&client, "n2"));
    assert_eq!(
        to_n2,
        std::slice::from_ref(&stop),
        "n2 is sent the stop it never got"
    );
    assert_eq!(
        runtime.block_on(actions_of(&client, "n1")),
        std::slice::from_ref(&stop),
        "n1 keeps its settled copy until the stop is recorded, and is not sent another"
    );

    // Still in flight until n2 settles it; recorded (the workload requeued) once it has.
    quiet_cycle(&mut nodes, &store, 2, 40);
    assert_eq!(store.workload(&key).unwrap().phase, Phase::Running);
    assert_eq!(runtime.block_on(settle_next(&client, "n2")), stop);
    quiet_cycle(&mut nodes, &store, 3, 50);
    let record = store.workload(&key).unwrap();
    assert_eq!(record.phase, Phase::Pending, "the stop done requeues it");
    assert!(store.open_actions().unwrap().is_empty());
    let events = store.recent_workload_events(&key, 10).unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "requeued" && e.message == "preempted"),
        "{events:?}"
    );
    for node in ["n1", "n2"] {
        assert!(
            runtime.block_on(actions_of(&client, node)).is_empty(),
            "{node}"
        );
    }
}

#[test]
fn a_checkpoint_that_reached_only_some_nodes_is_completed_with_its_deadline() {
    let Opened {
        runtime,
        etcd: _etcd,
        client,
    } = opened();
    let store = Store::open_in_memory().unwrap();
    let key = WorkloadKey::new("t", "train");
    let checkpoint = Action::Checkpoint {
        workload: "t/train".into(),
        signal: "SIGUSR1".into(),
        deadline: 600,
    };
    running_then(&store, &["n1", "n2"], &checkpoint);
    runtime.block_on(cut_dispatch(&client, &checkpoint, &["n1"], &["n1"]));

    let second = runtime.block_on(leader(&client, "b", LEASE_SECS));
    let mut nodes = agent_nodes(&client, &second, Duration::from_secs(60));
    nodes.in_flight_at_start(&store, 30).unwrap();
    assert_eq!(
        store.workload(&key).unwrap().phase,
        Phase::Running,
        "a checkpoint that never reached n2 was recorded"
    );
    // The same action, its deadline unchanged: n2's replica is signalled once, late.
    assert_eq!(
        runtime.block_on(actions_of(&client, "n2")),
        std::slice::from_ref(&checkpoint)
    );
    assert_eq!(runtime.block_on(settle_next(&client, "n2")), checkpoint);
    quiet_cycle(&mut nodes, &store, 2, 40);
    let record = store.workload(&key).unwrap();
    assert_eq!(record.phase, Phase::Checkpointing);
    assert_eq!(record.grace_deadline, Some(600));
    assert!(store.open_actions().unwrap().is_empty());
}

#[test]
fn a_stop_a_failed_dispatch_left_on_some_nodes_is_completed_by_the_next_cycle() {
    let Opened {
        runtime,
        etcd: _etcd,
        client,
    } = opened();
    let store = Store::open_in_memory().unwrap();
    let key = WorkloadKey::new("t", "train");
    running(&store, "train", &["n1", "n2"]);
    running(&store, "big", &["n2"]);
    let term = runtime.block_on(leader(&client, "a", LEASE_SECS));
    // Two operations a transaction, so that n1's copy of the stop and n2's writes go in
    // different transactions of one wave.
    let mut nodes = AgentNodes::new(
        client.clone(),
        keys(),
        term.fence().clone(),
        AgentOptions {
            max_txn_ops: 2,
            ..options(Duration::from_secs(60))
        },
    )
    .unwrap();
    nodes.in_flight_at_start(&store, 30).unwrap();

    // A plan whose n2 transaction etcd refuses (a request past its 1.5 MiB limit), while
    // n1's, with its copy of the stop, is written.
    let stop = Action::Stop {
        workload: "t/train".into(),
        reason: "preempted".into(),
    };
    let too_big = Action::Checkpoint {
        workload: "t/big".into(),
        signal: "X".repeat(2 << 20),
        deadline: 600,
    };
    let records = store.live().unwrap();
    let mut observation = Observation {
        nodes: Vec::new(),
        details: Vec::new(),
    };
    let mut cx = Carry {
        store: &store,
        cycle: 2,
        now: 40,
        run_commands: false,
        records: &records,
        observation: &mut observation,
    };
    let failed = nodes.carry_out(&[too_big, stop.clone()], &mut cx, &mut |_, _| Ok(()));
    assert!(failed.is_err(), "the dispatch was to fail: {failed:?}");
    assert_eq!(
        runtime.block_on(actions_of(&client, "n1")),
        std::slice::from_ref(&stop)
    );
    assert!(runtime.block_on(actions_of(&client, "n2")).is_empty());

    // The next cycle finds n1's copy in flight and sends n2 its own.
    quiet_cycle(&mut nodes, &store, 3, 50);
    assert_eq!(
        store.workload(&key).unwrap().phase,
        Phase::Running,
        "a stop that never reached n2 was recorded"
    );
    assert_eq!(
        runtime.block_on(actions_of(&client, "n2")),
        std::slice::from_ref(&stop),
        "n2 is sent the stop the failed dispatch did not carry"
    );
    runtime.block_on(settle_next(&client, "n1"));
    assert_eq!(runtime.block_on(settle_next(&client, "n2")), stop);
    quiet_cycle(&mut nodes, &store, 4, 60);
    assert_eq!(store.workload(&key).unwrap().phase, Phase::Pending);
    assert!(store.open_actions().unwrap().is_empty());
}

/// `node` registered by an agent (the quickstart fleet's sim driver) until the result drops.
async fn register(client: &Client, dir: &Path, node: &str) -> Registrar {
    let nodes = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/nodes/quickstart.yaml");
    let mut sim = SimDriver::open(&nodes, &dir.join("sim.json")).unwrap();
    let (registration, _) = Registration::observe(&mut sim, node).unwrap();
    Registrar::start(client, &keys(), &registration, TTL_SECS)
        .await
        .unwrap()
}

#[test]
fn a_start_whose_node_is_lost_fails_and_its_started_copy_is_stopped() {
    let Opened {
        runtime,
        etcd: _etcd,
        client,
    } = opened();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_in_memory().unwrap();
    let key = WorkloadKey::new("t", "train");
    // A gang on train-0 (its agent registered, it starts its replica) and gone-0 (its agent
    // never answers again).
    let _train = runtime.block_on(register(&client, dir.path(), "train-0"));
    let (start, journal) = starting(&store, &["gone-0", "train-0"]);
    runtime.block_on(cut_dispatch(
        &client,
        &start,
        &["gone-0", "train-0"],
        &["train-0"],
    ));

    let second = runtime.block_on(leader(&client, "b", LEASE_SECS));
    let mut nodes = agent_nodes(&client, &second, Duration::from_secs(1));
    let in_flight = nodes.in_flight_at_start(&store, 30).unwrap();
    assert!(in_flight.starts.contains(&key), "{in_flight:?}");
    assert!(in_flight.actions.contains(&journal));

    until_lost(&mut nodes, "gone-0");
    quiet_cycle(&mut nodes, &store, 2, 40);
    let record = store.workload(&key).unwrap();
    assert_eq!(
        record.phase,
        Phase::Pending,
        "a start whose node is lost stayed {}",
        record.phase
    );
    assert!(store.open_actions().unwrap().is_empty());
    assert_requeued_naming(&store, &key, "gone-0");

    // train-0's replica is stopped with the next dispatch; gone-0's copy stays for its agent
    // to settle (refused: its `bound` no longer names the workload).
    quiet_cycle(&mut nodes, &store, 3, 50);
    let to_train = runtime.block_on(actions_of(&client, "train-0"));
    assert!(stops(&to_train, "t/train"), "{to_train:?}");
    assert_eq!(runtime.block_on(actions_of(&client, "gone-0")), [start]);
    let gone = runtime.block_on(bound_of(&client, "gone-0")).unwrap();
    assert!(gone.workloads.is_empty(), "{gone:?}");
}

#[test]
fn a_lost_node_is_unbound_before_it_is_reported_and_not_once_its_agent_is_back() {
    let Opened {
        runtime,
        etcd: _etcd,
        client,
    } = opened();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_in_memory().unwrap();
    let key = WorkloadKey::new("t", "train");
    let stop = Action::Stop {
        workload: "t/other".into(),
        reason: "unused".into(),
    };
    // t/train runs on train-0, whose agent is away.
    running_then(&store, &["train-0"], &stop);
    let term = runtime.block_on(leader(&client, "a", LEASE_SECS));
    let mut nodes = agent_nodes(&client, &term, Duration::from_secs(1));
    nodes.in_flight_at_start(&store, 30).unwrap();
    let before = runtime.block_on(bound_of(&client, "train-0")).unwrap();
    assert_eq!(before.workloads.get("t/train"), Some(&0), "{before:?}");

    // Reported lost only with its `bound` emptied: an agent registering from now on reads
    // that, and stops the workload the caller is about to requeue and place elsewhere.
    until_lost(&mut nodes, "train-0");
    let after = runtime.block_on(bound_of(&client, "train-0")).unwrap();
    assert!(
        after.workloads.is_empty(),
        "train-0 reported lost while its bound still names {:?}",
        after.workloads
    );
    assert_eq!(store.workload(&key).unwrap().phase, Phase::Running);

    // The emptying is guarded on the registration: an agent back first keeps its node.
    let mut dispatcher = runtime.block_on(async {
        Dispatcher::start(&client, &keys(), term.fence().clone(), DEFAULT_MAX_TXN_OPS)
            .await
            .unwrap()
    });
    let _back = runtime.block_on(register(&client, dir.path(), "infer-0"));
    let bound = BTreeMap::from([(
        "infer-0".to_string(),
        Bound {
            version: VERSION,
            workloads: BTreeMap::from([("t/train".to_string(), 0)]),
        },
    )]);
    runtime.block_on(async {
        dispatcher
            .dispatch(&Plan {
                actions: Vec::new(),
                bound: bound.clone(),
            })
            .await
            .unwrap();
        assert!(!dispatcher.unbind_lost("infer-0").await.unwrap());
    });
    assert_eq!(
        runtime.block_on(bound_of(&client, "infer-0")).as_ref(),
        bound.get("infer-0")
    );
}

#[test]
fn a_gang_that_loses_a_node_has_its_replicas_on_the_other_nodes_stopped() {
    let Opened {
        runtime,
        etcd: _etcd,
        client,
    } = opened();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_in_memory().unwrap();
    let key = WorkloadKey::new("t", "train");
    let unused = Action::Stop {
        workload: "t/other".into(),
        reason: "unused".into(),
    };
    // A gang running on train-0 (its agent registered) and gone-0 (away from now on).
    let _train = runtime.block_on(register(&client, dir.path(), "train-0"));
    running_then(&store, &["gone-0", "train-0"], &unused);
    let term = runtime.block_on(leader(&client, "a", LEASE_SECS));
    let mut nodes = agent_nodes(&client, &term, Duration::from_secs(1));
    nodes.in_flight_at_start(&store, 30).unwrap();
    assert!(runtime.block_on(actions_of(&client, "train-0")).is_empty());

    // The cycle requeues the gang once gone-0 is reported lost; train-0's replica, which its
    // agent would otherwise keep, is sent a stop by the next dispatch.
    until_lost(&mut nodes, "gone-0");
    StateStore::requeue(&store, &key, "node gone-0 lost", 35).unwrap();
    quiet_cycle(&mut nodes, &store, 2, 40);
    let to_train = runtime.block_on(actions_of(&client, "train-0"));
    assert!(
        stops(&to_train, "t/train"),
        "train-0's replica of the requeued gang is sent no stop: {to_train:?}"
    );
    assert!(runtime.block_on(actions_of(&client, "gone-0")).is_empty());
}

#[test]
fn a_gang_start_that_reached_only_some_nodes_is_failed_and_its_started_copies_stopped() {
    let Opened {
        runtime,
        etcd: _etcd,
        client,
    } = opened();
    let store = Store::open_in_memory().unwrap();
    let key = WorkloadKey::new("t", "train");

    // The first leader records the start's intent (the workload `Starting`), then its
    // dispatch is cut after n1's copy, which n1's agent starts: n2's never reaches etcd.
    let (start, _) = starting(&store, &["n1", "n2"]);
    assert_eq!(store.workload(&key).unwrap().phase, Phase::Starting);
    runtime.block_on(cut_dispatch(&client, &start, &["n1"], &["n1"]));

    // A new term takes over what is in flight.
    let second = runtime.block_on(leader(&client, "b", LEASE_SECS));
    let mut nodes = agent_nodes(&client, &second, Duration::from_secs(60));
    let in_flight = nodes.in_flight_at_start(&store, 30).unwrap();

    let record = store.workload(&key).unwrap();
    assert_ne!(
        record.phase,
        Phase::Running,
        "a gang start that never reached n2 was taken as started"
    );
    assert_eq!(record.phase, Phase::Pending, "the failure path requeues it");
    assert!(in_flight.starts.is_empty(), "{in_flight:?}");
    assert!(store.open_actions().unwrap().is_empty());
    assert_requeued_naming(&store, &key, "n2");

    // The replica n1 started is stopped with the next dispatch; n2 is sent nothing.
    quiet_cycle(&mut nodes, &store, 2, 40);
    let sent = runtime.block_on(actions_of(&client, "n1"));
    assert!(stops(&sent, "t/train"), "{sent:?}");
    assert!(runtime.block_on(actions_of(&client, "n2")).is_empty());
}
