//! The agent's side of the action protocol against a real etcd: actions handed out in id
//! order, each at most once across restarts once its journal settles it, and an interrupted
//! one handed out again marked as such.

mod support;

use support::{TTL_SECS, connect, etcd, keys, leader, two_lease_periods, within};
use tessera_fleet::FleetError;
use tessera_fleet::actions::{ActionFeed, JournalRecord, PendingAction};
use tessera_fleet::election::{Leadership, Write};

const NODE: &str = "gpu-1";

/// The leader posts actions `ids` to the node in one fenced transaction, in the order given.
async fn post(leader: &Leadership, ids: &[u64]) {
    let writes: Vec<Write> = ids
        .iter()
        .map(|id| Write::Put {
            key: keys().action(NODE, *id).unwrap(),
            value: format!("{{\"action\":{id}}}").into_bytes(),
        })
        .collect();
    leader.write(&[], &writes).await.unwrap();
}

async fn next(feed: &mut ActionFeed) -> PendingAction {
    within(two_lease_periods(), "the next action", feed.next())
        .await
        .unwrap()
        .expect("the watch goes on")
}

/// Applies the next action (records intent, then done) and returns its id.
async fn apply_next(feed: &mut ActionFeed) -> u64 {
    let action = next(feed).await;
    assert!(!action.interrupted, "{action:?}");
    assert_eq!(
        action.body,
        format!("{{\"action\":{}}}", action.id).into_bytes()
    );
    feed.begin(action.id).await.unwrap();
    feed.finish(action.id, Ok(())).await.unwrap();
    action.id
}

/// Asserts that the next action `feed` hands out is `id`.
async fn next_is(feed: &mut ActionFeed, id: u64) {
    assert_eq!(next(feed).await.id, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_are_applied_in_id_order_and_once_across_restarts() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let leader = leader(&client, "cp", TTL_SECS).await;
    post(&leader, &[3, 1, 2]).await;

    let mut feed = ActionFeed::start(&client, &keys(), NODE).await.unwrap();
    assert_eq!(apply_next(&mut feed).await, 1);
    assert_eq!(apply_next(&mut feed).await, 2);
    // Actions written while the agent runs arrive through the watch, in order.
    post(&leader, &[5, 4]).await;
    assert_eq!(apply_next(&mut feed).await, 3);
    assert_eq!(apply_next(&mut feed).await, 4);
    let five = next(&mut feed).await;
    assert_eq!(five.id, 5);
    feed.begin(5).await.unwrap();
    feed.finish(5, Err("GPU is lost".to_string()))
        .await
        .unwrap();
    drop(feed);

    // A restarted agent applies nothing twice: the first action it gets is the next new one.
    let mut feed = ActionFeed::start(&client, &keys(), NODE).await.unwrap();
    assert_eq!(
        feed.journal(5),
        Some(&JournalRecord::Failed {
            error: "GPU is lost".to_string()
        })
    );
    post(&leader, &[6]).await;
    next_is(&mut feed, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_begun_and_not_finished_is_handed_out_again_as_interrupted() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let leader = leader(&client, "cp", TTL_SECS).await;
    post(&leader, &[1, 2]).await;
    let mut feed = ActionFeed::start(&client, &keys(), NODE).await.unwrap();
    let first = next(&mut feed).await;
    feed.begin(first.id).await.unwrap();
    drop(feed); // the agent dies while applying action 1

    let mut feed = ActionFeed::start(&client, &keys(), NODE).await.unwrap();
    let again = next(&mut feed).await;
    assert_eq!((again.id, again.interrupted), (1, true));
    feed.finish(1, Ok(())).await.unwrap();
    let second = next(&mut feed).await;
    assert_eq!((second.id, second.interrupted), (2, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_older_than_one_handed_out_is_settled_as_failed_not_applied() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let leader = leader(&client, "cp", TTL_SECS).await;
    post(&leader, &[5]).await;
    let mut feed = ActionFeed::start(&client, &keys(), NODE).await.unwrap();
    assert_eq!(apply_next(&mut feed).await, 5);
    post(&leader, &[4]).await;
    post(&leader, &[6]).await;
    next_is(&mut feed, 6).await;
    let refused = FleetError::ActionOutOfOrder {
        node: NODE.to_string(),
        id: 4,
        after: 5,
    };
    let failed = JournalRecord::Failed {
        error: refused.to_string(),
    };
    assert_eq!(feed.journal(4), Some(&failed));
    drop(feed);

    // A restarted feed knows it too, from etcd: 4 is settled, and the first action is 6.
    let mut feed = ActionFeed::start(&client, &keys(), NODE).await.unwrap();
    assert_eq!(feed.journal(4), Some(&failed));
    next_is(&mut feed, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_journaled_in_two_writes_and_one_cut_short_is_handed_out_as_interrupted() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let leader = leader(&client, "cp", TTL_SECS).await;
    post(&leader, &[1, 2, 3, 4]).await;
    let mut feed = ActionFeed::start(&client, &keys(), NODE).await.unwrap();
    let batch = within(two_lease_periods(), "a batch", feed.next_batch(3))
        .await
        .unwrap()
        .unwrap();
    let ids: Vec<u64> = batch.iter().map(|p| p.id).collect();
    assert_eq!(ids, [1, 2, 3], "at most the batch's size, in id order");
    feed.begin_all(&ids).await.unwrap();
    drop(feed); // the agent dies while applying the batch

    let mut feed = ActionFeed::start(&client, &keys(), NODE).await.unwrap();
    let batch = within(two_lease_periods(), "a batch", feed.next_batch(128))
        .await
        .unwrap()
        .unwrap();
    let handed: Vec<(u64, bool)> = batch.iter().map(|p| (p.id, p.interrupted)).collect();
    assert_eq!(handed, [(1, true), (2, true), (3, true), (4, false)]);
    feed.begin_all(&[4]).await.unwrap();
    let outcomes = vec![
        (1, Ok(())),
        (2, Err(support_failure())),
        (3, Ok(())),
        (4, Ok(())),
    ];
    feed.finish_all(outcomes).await.unwrap();
    drop(feed);
    let mut feed = ActionFeed::start(&client, &keys(), NODE).await.unwrap();
    assert_eq!(feed.journal(1), Some(&JournalRecord::Done));
    assert_eq!(
        feed.journal(2),
        Some(&JournalRecord::Failed {
            error: support_failure()
        })
    );
    assert_eq!(feed.journal(4), Some(&JournalRecord::Done));
    // Every one of them is settled: the first action handed out is the next new one.
    post(&leader, &[5]).await;
    next_is(&mut feed, 5).await;
}

fn support_failure() -> String {
    "interrupted: the node does not show it".to_string()
}
