//! Leader election and fencing against a real etcd: one leader at a time, failover within two
//! lease periods when the leader resigns, stalls, loses its lease or is killed, and no write
//! from a deposed leader is applied.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use etcd_client::Client;
use support::{TTL_SECS, connect, etcd, keys, two_lease_periods, within};
use tessera_fleet::FleetError;
use tessera_fleet::election::{
    Candidate, Fence, Guard, LeaderInfo, Leadership, Write, current_leader,
};

fn candidate(client: &Client, id: &str) -> Candidate {
    let info = LeaderInfo {
        id: id.to_string(),
        advertise: Some(format!("http://{id}:8080")),
    };
    Candidate::new(client.clone(), keys(), info, TTL_SECS)
}

fn put(key: &str, value: &str) -> Write {
    Write::Put {
        key: key.to_string(),
        value: value.as_bytes().to_vec(),
    }
}

async fn value(client: &Client, key: &str) -> Option<String> {
    let mut client = client.clone();
    let answer = client.get(key, None).await.unwrap();
    answer
        .kvs()
        .first()
        .map(|kv| String::from_utf8(kv.value().to_vec()).unwrap())
}

/// Asserts that `leadership`'s writes are refused as deposed, naming `now` as the leader,
/// and that nothing was written.
async fn assert_deposed(client: &Client, leadership: &Leadership, now: Option<&str>) {
    let key = keys().state("deposed-write");
    match leadership.write(&[], &[put(&key, "stale")]).await {
        Err(FleetError::Deposed {
            key: refused,
            now: named,
        }) => {
            assert_eq!(refused, key);
            match now {
                Some(id) => assert!(
                    named.as_deref().is_some_and(|n| n.starts_with(id)),
                    "names {id} as the leader: {named:?}"
                ),
                None => assert_eq!(named, None),
            }
        }
        other => panic!("a deposed leader's write must be refused, got {other:?}"),
    }
    assert_eq!(value(client, &key).await, None, "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_candidate_leads_until_it_resigns_then_the_other_leads() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let a = within(
        two_lease_periods(),
        "a leads an empty cluster",
        candidate(&client, "a").campaign(),
    )
    .await
    .unwrap();
    let b_campaign = tokio::spawn({
        let b = candidate(&client, "b");
        async move { b.campaign().await }
    });

    // While a leads, its writes apply and b waits.
    let key = keys().state("owner");
    a.write(&[], &[put(&key, "a")]).await.unwrap();
    assert_eq!(value(&client, &key).await.as_deref(), Some("a"));
    assert_eq!(
        current_leader(&client, &keys())
            .await
            .unwrap()
            .map(|l| l.id)
            .as_deref(),
        Some("a")
    );
    assert!(!b_campaign.is_finished(), "b cannot lead while a does");

    let a_fence = a.fence().clone();
    a.resign().await.unwrap();
    let b = within(two_lease_periods(), "b leads after a resigned", b_campaign)
        .await
        .unwrap()
        .unwrap();
    assert!(
        b.fence().term() > a_fence.term(),
        "a later term has a larger revision"
    );
    b.write(&[], &[put(&key, "b")]).await.unwrap();

    // a's fence, as a request of a's still in flight would carry it, is refused.
    let refused = a_fence.write(&client, &[], &[put(&key, "a again")]).await;
    assert!(
        matches!(refused, Err(FleetError::Deposed { .. })),
        "{refused:?}"
    );
    assert_eq!(value(&client, &key).await.as_deref(), Some("b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_simultaneous_candidates_exactly_one_leads() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let mut a = tokio::spawn({
        let a = candidate(&client, "a");
        async move { a.campaign().await }
    });
    let mut b = tokio::spawn({
        let b = candidate(&client, "b");
        async move { b.campaign().await }
    });
    let (a_won, won) = within(two_lease_periods(), "one of two leads", async {
        tokio::select! {
            won = &mut a => (true, won),
            won = &mut b => (false, won),
        }
    })
    .await;
    let winner = won.unwrap().unwrap();
    let (loser, loser_id) = if a_won { (b, "b") } else { (a, "a") };
    let winner_id = current_leader(&client, &keys()).await.unwrap().unwrap().id;
    assert_ne!(winner_id, loser_id);
    winner
        .write(&[], &[put(&keys().state("x"), "1")])
        .await
        .unwrap();
    assert!(
        !loser.is_finished(),
        "{loser_id} cannot lead while {winner_id} does"
    );
    loser.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_deposes_the_leader_and_the_standby_takes_over() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let mut a = candidate(&client, "a").campaign().await.unwrap();
    let b_campaign = tokio::spawn({
        let b = candidate(&client, "b");
        async move { b.campaign().await }
    });
    // The lease vanishes under a (etcd expired it, or an operator revoked it).
    let mut admin = client.clone();
    let revoked = Instant::now();
    admin.lease_revoke(a.lease()).await.unwrap();
    let b = within(
        two_lease_periods(),
        "b leads after a's lease went",
        b_campaign,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(revoked.elapsed() < two_lease_periods());
    assert_deposed(&client, &a, Some("b")).await;
    within(two_lease_periods(), "a learns it lost", a.lost()).await;
    assert!(a.is_lost());
    b.write(&[], &[put(&keys().state("x"), "b")]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stops_renewing_is_deposed_within_two_lease_periods() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let a = candidate(&client, "a").campaign().await.unwrap();
    let b_campaign = tokio::spawn({
        let b = candidate(&client, "b");
        async move { b.campaign().await }
    });
    a.stop_renewing();
    let b = within(two_lease_periods(), "b leads after a stalled", b_campaign)
        .await
        .unwrap()
        .unwrap();
    assert_deposed(&client, &a, Some("b")).await;
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_with_a_failed_guard_applies_nothing() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let a = candidate(&client, "a").campaign().await.unwrap();
    let taken = keys().state("taken");
    let other = keys().state("other");
    a.write(&[], &[put(&taken, "1")]).await.unwrap();
    let refused = a
        .write(
            &[Guard::Absent { key: taken.clone() }],
            &[put(&other, "1"), put(&taken, "2")],
        )
        .await;
    match refused {
        Err(FleetError::Conflict { key }) => assert_eq!(key, taken),
        other => panic!("expected a conflict on {taken}, got {other:?}"),
    }
    assert_eq!(value(&client, &other).await, None);
    assert_eq!(value(&client, &taken).await.as_deref(), Some("1"));

    let mut reader = client.clone();
    let revision = reader.get(taken.as_str(), None).await.unwrap().kvs()[0].mod_revision();
    let guard = Guard::Unchanged {
        key: taken.clone(),
        mod_revision: revision,
    };
    a.write(std::slice::from_ref(&guard), &[put(&taken, "3")])
        .await
        .unwrap();
    let stale = a.write(&[guard], &[put(&taken, "4")]).await;
    assert!(
        matches!(stale, Err(FleetError::Conflict { .. })),
        "{stale:?}"
    );
    assert_eq!(value(&client, &taken).await.as_deref(), Some("3"));
}

/// The child of `a_killed_leader_process_is_replaced_within_two_lease_periods`: campaigns,
/// says its term on stdout, and waits to be killed (or for its parent to go: its stdin
/// closes). Run only as that child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the leader process of a_killed_leader_process_is_replaced_within_two_lease_periods"]
async fn leader_child_process() {
    let endpoint = std::env::var(CHILD_ENDPOINT).expect("run by its parent test");
    let client = Client::connect([endpoint], None).await.unwrap();
    let leadership = candidate(&client, "child").campaign().await.unwrap();
    println!("LEADING {}", leadership.fence().term());
    tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
        .await
        .unwrap()
        .unwrap();
}

const CHILD_ENDPOINT: &str = "TESSERA_FLEET_TEST_CHILD_ETCD";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_process_is_replaced_within_two_lease_periods() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "leader_child_process",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENDPOINT, etcd.endpoint())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let term: i64 = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|line| line.strip_prefix("LEADING ").map(|t| t.parse().unwrap()))
            .expect("the child says when it leads")
    })
    .await
    .unwrap();
    assert_eq!(
        current_leader(&client, &keys()).await.unwrap().unwrap().id,
        "child"
    );

    let b_campaign = tokio::spawn({
        let b = candidate(&client, "b");
        async move { b.campaign().await }
    });
    let killed = Instant::now();
    child.kill().unwrap();
    child.wait().unwrap();
    let b = within(
        two_lease_periods(),
        "b leads after the leader was killed",
        b_campaign,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        killed.elapsed() < two_lease_periods(),
        "failover took {:?}",
        killed.elapsed()
    );
    assert!(b.fence().term() > term);

    // A write of the dead leader's term (one it sent just before it died) is refused.
    let dead = Fence::for_term(keys(), term);
    let key = keys().state("late");
    let refused = dead.write(&client, &[], &[put(&key, "child")]).await;
    assert!(
        matches!(refused, Err(FleetError::Deposed { .. })),
        "{refused:?}"
    );
    assert_eq!(value(&client, &key).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_counts_itself_deposed_by_its_lease_period() {
    let mut etcd = etcd();
    let client = connect(&etcd).await;
    let mut a = candidate(&client, "a").campaign().await.unwrap();
    assert!(!a.is_lost());
    // No keepalive is answered from now on: the leader stops acting at its local deadline, one
    // lease period after it sent its last renewed keepalive.
    etcd.kill();
    within(two_lease_periods(), "a counts itself deposed", a.lost()).await;
    assert!(a.is_lost());
}
