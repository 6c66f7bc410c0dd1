//! The leader's side of the protocol against a real etcd: a plan written in fenced chunks
//! within etcd's `--max-txn-ops`, ids that only grow across failover and pruning, `bound`
//! written only where it changed, outcomes collected (also a predecessor's), pruning that
//! leaves each node one journal entry, and an agent that still refuses an old id after it.

mod support;

use std::collections::BTreeMap;

use etcd_client::Client;
use support::{TTL_SECS, connect, etcd, keys, leader, read_prefix, two_lease_periods, within};
use tessera_fleet::FleetError;
use tessera_fleet::actions::{ActionFeed, JournalRecord};
use tessera_fleet::dispatch::{DEFAULT_MAX_TXN_OPS, Dispatcher, NodeAction, Outcome, Plan};
use tessera_fleet::election::{Leadership, Write};
use tessera_fleet::keys::NodeKey;
use tessera_fleet::protocol::{self, ActionMessage, Bound, VERSION};
use tessera_fleet::testing::TestEtcd;
use tessera_reconciler::actions::Action;
use tessera_reconciler::driver::GpuRef;

/// A real etcd, a client, leader `a` and its dispatcher writing at most `max_txn_ops`
/// operations a transaction: what most tests start from.
async fn leading(max_txn_ops: usize) -> (TestEtcd, Client, Leadership, Dispatcher) {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let leader = leader(&client, "a", TTL_SECS).await;
    let dispatcher = Dispatcher::start(&client, &keys(), leader.fence().clone(), max_txn_ops)
        .await
        .unwrap();
    (etcd, client, leader, dispatcher)
}

/// A reset of GPU `index` on `node`: any action will do, the body is what is checked.
fn reset(node: &str, index: u32) -> NodeAction {
    NodeAction {
        node: node.to_string(),
        message: ActionMessage {
            version: VERSION,
            action: Action::ResetGpu {
                gpu: GpuRef {
                    node: node.to_string(),
                    index,
                },
            },
            launch: None,
        },
    }
}

fn bound(workloads: &[(&str, u32)]) -> Bound {
    Bound {
        version: VERSION,
        workloads: workloads.iter().map(|(w, a)| (w.to_string(), *a)).collect(),
    }
}

/// Every key under `nodes/`, parsed.
async fn node_keys(client: &Client) -> Vec<NodeKey> {
    read_prefix(client, &keys().nodes_prefix())
        .await
        .iter()
        .map(|kv| keys().parse_node_key(kv.key()).unwrap())
        .collect()
}

async fn action_ids(client: &Client, node: &str) -> Vec<u64> {
    node_keys(client)
        .await
        .into_iter()
        .filter_map(|k| match k {
            NodeKey::Action { node: n, id } if n == node => Some(id),
            _ => None,
        })
        .collect()
}

/// Plays the agent of `node`: takes `count` actions, settling each done, or failed where
/// `fail` names it.
async fn agent_settles(client: &Client, node: &str, count: usize, fail: Option<u64>) {
    let mut feed = ActionFeed::start(client, &keys(), node).await.unwrap();
    for _ in 0..count {
        let action = within(two_lease_periods(), "the next action", feed.next())
            .await
            .unwrap()
            .expect("the watch goes on");
        feed.begin(action.id).await.unwrap();
        let outcome = if Some(action.id) == fail {
            Err(format!("GPU {} is lost", action.id))
        } else {
            Ok(())
        };
        feed.finish(action.id, outcome).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_beyond_one_transaction_is_written_in_fenced_chunks_within_etcds_limit() {
    let (_etcd, client, _leader, mut dispatcher) = leading(128).await;
    // 300 actions: more than etcd's default of 128 operations would accept in one.
    let plan = Plan {
        actions: (0..300).map(|i| reset(&format!("n{}", i % 3), i)).collect(),
        bound: BTreeMap::from([("n0".to_string(), bound(&[("a/x", 0)]))]),
    };
    let dispatched = dispatcher.dispatch(&plan).await.unwrap();
    assert_eq!(dispatched.ids, (1..=300).collect::<Vec<u64>>());
    // The ids reserved, then n0's bound and 100 actions, n1's and n2's 100 each: three
    // transactions of one node each, since two nodes' would exceed 128 operations.
    assert_eq!(dispatched.transactions, 4);
    assert_eq!(dispatched.bound_written, ["n0"]);
    let ids = action_ids(&client, "n1").await;
    assert_eq!(ids, (1..=300).filter(|i| i % 3 == 2).collect::<Vec<u64>>());
    let key = keys().action("n1", 2).unwrap();
    let answer = client.clone().get(key.as_str(), None).await.unwrap();
    let written: ActionMessage = protocol::decode(answer.kvs()[0].value()).unwrap();
    assert_eq!(written, reset("n1", 1).message);
    assert_eq!(DEFAULT_MAX_TXN_OPS, 128);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_is_written_only_where_it_changed() {
    let (_etcd, client, leader, mut dispatcher) = leading(8).await;
    let mut plan = Plan {
        actions: Vec::new(),
        bound: BTreeMap::from([
            ("n0".to_string(), bound(&[("a/x", 0)])),
            ("n1".to_string(), bound(&[("a/y", 1)])),
        ]),
    };
    let first = dispatcher.dispatch(&plan).await.unwrap();
    assert_eq!(first.bound_written, ["n0", "n1"]);
    let again = dispatcher.dispatch(&plan).await.unwrap();
    assert_eq!((again.bound_written.len(), again.transactions), (0, 0));
    plan.bound
        .insert("n1".to_string(), bound(&[("a/y", 2), ("a/z", 0)]));
    assert_eq!(
        dispatcher.dispatch(&plan).await.unwrap().bound_written,
        ["n1"]
    );

    // A new dispatcher (a new leader) reads what the nodes hold and writes nothing either.
    leader.resign().await.unwrap();
    let next = support::leader(&client, "b", TTL_SECS).await;
    let mut dispatcher = Dispatcher::start(&client, &keys(), next.fence().clone(), 8)
        .await
        .unwrap();
    assert_eq!(dispatcher.dispatch(&plan).await.unwrap().transactions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_collected_and_pruning_leaves_one_journal_entry_per_node() {
    let (_etcd, client, _leader, mut dispatcher) = leading(4).await;
    let plan = Plan {
        actions: (0..5).map(|i| reset("n0", i)).collect(),
        bound: BTreeMap::new(),
    };
    dispatcher.dispatch(&plan).await.unwrap();
    assert!(dispatcher.collect().await.unwrap().is_empty());
    agent_settles(&client, "n0", 5, Some(3)).await;
    let outcomes = dispatcher.collect().await.unwrap();
    let expected: Vec<Outcome> = (1..=5)
        .map(|id| Outcome {
            node: "n0".to_string(),
            id,
            result: if id == 3 {
                Err("GPU 3 is lost".to_string())
            } else {
                Ok(())
            },
        })
        .collect();
    assert_eq!(outcomes, expected);
    // Reported until pruned, so a caller that failed to record them sees them again.
    assert_eq!(dispatcher.collect().await.unwrap(), expected);
    // 5 action deletes and 4 journal deletes, 4 to a transaction.
    assert_eq!(dispatcher.prune(&outcomes).await.unwrap(), 3);
    assert_eq!(
        node_keys(&client).await,
        [NodeKey::Journal {
            node: "n0".to_string(),
            id: 5
        }]
    );
    assert!(dispatcher.collect().await.unwrap().is_empty());

    // The next settled id becomes the floor; the previous floor goes.
    dispatcher.dispatch(&plan).await.unwrap();
    agent_settles(&client, "n0", 5, None).await;
    let outcomes = dispatcher.collect().await.unwrap();
    assert_eq!(outcomes.len(), 5);
    dispatcher.prune(&outcomes).await.unwrap();
    assert_eq!(
        node_keys(&client).await,
        [NodeKey::Journal {
            node: "n0".to_string(),
            id: 10
        }]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_only_grow_across_failover_after_pruning_and_a_deposed_leader_writes_nothing() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let first = leader(&client, "a", TTL_SECS).await;
    let mut old = Dispatcher::start(&client, &keys(), first.fence().clone(), 128)
        .await
        .unwrap();
    let plan = Plan {
        actions: (0..3).map(|i| reset("n0", i)).collect(),
        bound: BTreeMap::new(),
    };
    assert_eq!(old.dispatch(&plan).await.unwrap().ids, [1, 2, 3]);
    agent_settles(&client, "n0", 3, None).await;
    let outcomes = old.collect().await.unwrap();
    old.prune(&outcomes).await.unwrap();
    // A fresh plan the old leader does not get to collect: its successor does.
    assert_eq!(old.dispatch(&plan).await.unwrap().ids, [4, 5, 6]);
    agent_settles(&client, "n0", 3, None).await;

    first.resign().await.unwrap();
    let second = leader(&client, "b", TTL_SECS).await;
    let mut new = Dispatcher::start(&client, &keys(), second.fence().clone(), 128)
        .await
        .unwrap();
    let inherited = new.collect().await.unwrap();
    assert_eq!(
        inherited.iter().map(|o| o.id).collect::<Vec<_>>(),
        [4, 5, 6]
    );
    new.prune(&inherited).await.unwrap();
    // Nothing of ids 1 to 6 is left but the floor, yet the next ids are larger.
    assert_eq!(new.dispatch(&plan).await.unwrap().ids, [7, 8, 9]);

    let before = node_keys(&client).await;
    match old.dispatch(&plan).await {
        Err(FleetError::Deposed { now, .. }) => assert_eq!(now.as_deref(), Some("b")),
        other => panic!("a deposed leader's dispatch must be refused, got {other:?}"),
    }
    assert_eq!(node_keys(&client).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_whose_view_is_stale_conflicts_instead_of_reusing_ids() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let leader = leader(&client, "a", TTL_SECS).await;
    let mut one = Dispatcher::start(&client, &keys(), leader.fence().clone(), 128)
        .await
        .unwrap();
    let mut two = Dispatcher::start(&client, &keys(), leader.fence().clone(), 128)
        .await
        .unwrap();
    let plan = Plan {
        actions: vec![reset("n0", 0)],
        bound: BTreeMap::new(),
    };
    assert_eq!(one.dispatch(&plan).await.unwrap().ids, [1]);
    assert!(matches!(
        two.dispatch(&plan).await,
        Err(FleetError::Conflict { .. })
    ));
    // It reads the counter again after the failure and goes on from there.
    assert_eq!(two.dispatch(&plan).await.unwrap().ids, [2]);
    assert_eq!(action_ids(&client, "n0").await, [1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_pruning_a_restarted_agent_settles_an_old_id_as_failed_instead_of_applying_it() {
    let (_etcd, client, leader, mut dispatcher) = leading(128).await;
    let plan = Plan {
        actions: (0..3).map(|i| reset("n0", i)).collect(),
        bound: BTreeMap::new(),
    };
    dispatcher.dispatch(&plan).await.unwrap();
    agent_settles(&client, "n0", 3, None).await;
    let outcomes = dispatcher.collect().await.unwrap();
    dispatcher.prune(&outcomes).await.unwrap();

    // A broken leader writes id 2 again, below the settled 3, then a proper id 4.
    let old = keys().action("n0", 2).unwrap();
    let body = protocol::encode(&reset("n0", 9).message);
    leader
        .write(
            &[],
            &[Write::Put {
                key: old,
                value: body,
            }],
        )
        .await
        .unwrap();
    dispatcher
        .dispatch(&Plan {
            actions: vec![reset("n0", 4)],
            bound: BTreeMap::new(),
        })
        .await
        .unwrap();
    let mut feed = ActionFeed::start(&client, &keys(), "n0").await.unwrap();
    let next = within(two_lease_periods(), "the next action", feed.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((next.id, next.interrupted), (4, false));
    match feed.journal(2) {
        Some(JournalRecord::Failed { error }) => {
            assert!(error.contains("action 2 arrived after action 3"), "{error}")
        }
        other => panic!("id 2 must be settled as failed, got {other:?}"),
    }
}
