//! A gang start that a cut dispatch left on only some of its nodes (issue 17): the leader
//! that takes over must not take the copies it finds for the whole start.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::Client;
use serde_json::json;
use support::{connect, etcd, keys, leader, read_prefix, two_lease_periods, within};
use tessera_compiler::WorkloadKey;
use tessera_fleet::actions::ActionFeed;
use tessera_fleet::dispatch::{DEFAULT_MAX_TXN_OPS, Dispatcher, NodeAction, Plan};
use tessera_fleet::nodes::{AgentNodes, AgentOptions};
use tessera_fleet::protocol::{self, ActionMessage, Launch, VERSION};
use tessera_reconciler::actions::Action;
use tessera_reconciler::driver::Observation;
use tessera_reconciler::service::nodes::{Carry, NodeSide};
use tessera_reconciler::store::starts::StartIntent;
use tessera_reconciler::store::{Origin, Phase, Store};
use tessera_solver::decision::ReplicaBinding;

/// The leaders' lease: long enough that neither term ends while the test drives it.
const LEASE_SECS: i64 = 30;

fn gang() -> Action {
    let on = |node: &str| ReplicaBinding {
        node: node.into(),
        gpus: vec![0],
        mig_profile: None,
        mig_start: None,
        share: None,
    };
    Action::Start {
        workload: "t/train".into(),
        bindings: vec![on("n1"), on("n2")],
    }
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

#[test]
fn a_gang_start_that_reached_only_some_nodes_is_failed_and_its_started_copies_stopped() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let etcd = etcd();
    let client = runtime.block_on(connect(&etcd));
    let store = Store::open_in_memory().unwrap();
    let key = WorkloadKey::new("t", "train");
    let spec = serde_json::from_value(json!({
        "tenant": "t", "sloClass": "training", "gpu": {"count": 1}, "replicas": 2
    }))
    .unwrap();
    store.submit("train", &spec, Origin::Submitted, 10).unwrap();

    // The first leader records the start's intent (the workload `Starting`), then its
    // dispatch is cut after n1's copy: n2's never reaches etcd.
    let start = gang();
    let Action::Start { bindings, .. } = &start else {
        unreachable!()
    };
    let plain: Vec<_> = bindings.iter().map(|b| b.binding()).collect();
    let intent = StartIntent {
        workload: &key,
        bindings: &plain,
        action: &start,
    };
    store.begin_starts(1, &[intent], 20).unwrap();
    assert_eq!(store.workload(&key).unwrap().phase, Phase::Starting);
    runtime.block_on(async {
        let first = leader(&client, "a", LEASE_SECS).await;
        let mut dispatcher =
            Dispatcher::start(&client, &keys(), first.fence().clone(), DEFAULT_MAX_TXN_OPS)
                .await
                .unwrap();
        let copy = NodeAction {
            node: "n1".into(),
            message: ActionMessage {
                version: VERSION,
                action: start.clone(),
                launch: Some(Launch {
                    attempt: 0,
                    command: Vec::new(),
                    env: BTreeMap::new(),
                    cpu_millis: 0,
                    memory_bytes: 0,
                }),
            },
        };
        let plan = Plan {
            actions: vec![copy],
            bound: BTreeMap::new(),
        };
        dispatcher.dispatch(&plan).await.unwrap();
        // n1's agent starts its replica.
        let mut feed = ActionFeed::start(&client, &keys(), "n1").await.unwrap();
        let action = within(two_lease_periods(), "n1's copy", feed.next())
            .await
            .unwrap()
            .expect("the watch goes on");
        feed.begin(action.id).await.unwrap();
        feed.finish(action.id, Ok(())).await.unwrap();
        first.resign().await.unwrap();
    });

    // A new term takes over what is in flight.
    let second = runtime.block_on(leader(&client, "b", LEASE_SECS));
    let options = AgentOptions {
        grace: Duration::from_secs(60),
        settle: Duration::from_millis(200),
        max_txn_ops: DEFAULT_MAX_TXN_OPS,
    };
    let mut nodes =
        AgentNodes::new(client.clone(), keys(), second.fence().clone(), options).unwrap();
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
    let events = store.recent_workload_events(&key, 10).unwrap();
    let requeued = events
        .iter()
        .find(|e| e.kind == "requeued")
        .unwrap_or_else(|| panic!("no requeue among {events:?}"));
    assert!(requeued.message.contains("n2"), "{}", requeued.message);

    // The replica n1 started is stopped with the next dispatch; n2 is sent nothing.
    let mut observation = Observation {
        nodes: Vec::new(),
        details: Vec::new(),
    };
    let mut cx = Carry {
        store: &store,
        cycle: 2,
        now: 40,
        run_commands: false,
        records: &[],
        observation: &mut observation,
    };
    nodes.carry_out(&[], &mut cx, &mut |_, _| Ok(())).unwrap();
    let sent = runtime.block_on(actions_of(&client, "n1"));
    assert!(
        sent.iter()
            .any(|a| matches!(a, Action::Stop { workload, .. } if workload == "t/train")),
        "{sent:?}"
    );
    assert!(runtime.block_on(actions_of(&client, "n2")).is_empty());
}
