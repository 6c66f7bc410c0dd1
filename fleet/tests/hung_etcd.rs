//! A hung etcd (SIGSTOP: its connections stay open and nothing answers). Every request of a
//! client made by `access::connect` fails with a timeout instead of waiting for ever; the
//! leader counts itself deposed by its lease period; once etcd resumes, the same client works
//! again, another term leads, and the old term's writes are refused.
//!
//! Each wait is bounded by a guard that fails the test on a hang; nothing asserts on time.

mod support;

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use etcd_client::Client;
use serde_json::json;
use support::{TTL_SECS, two_lease_periods, within};
use tessera_compiler::model::WorkloadSpec;
use tessera_fleet::FleetError;
use tessera_fleet::access::{self, REQUEST_TIMEOUT};
use tessera_fleet::election::{Candidate, LeaderInfo, Leadership, current_leader};
use tessera_fleet::keys::Keys;
use tessera_fleet::store::{EtcdStore, StoreRuntime};
use tessera_reconciler::store::{Origin, StateStore, StoreError};

fn spec() -> WorkloadSpec {
    serde_json::from_value(json!({"tenant": "a", "sloClass": "batch", "gpu": {"count": 1}}))
        .unwrap()
}

fn lead(
    runtime: &Arc<StoreRuntime>,
    client: &Client,
    keys: &Keys,
    id: &str,
) -> (Leadership, EtcdStore) {
    let info = LeaderInfo {
        id: id.to_string(),
        advertise: None,
    };
    let candidate = Candidate::new(client.clone(), keys.clone(), info, TTL_SECS);
    let leadership = runtime.block_on(candidate.campaign()).unwrap();
    let store = EtcdStore::leader(
        runtime.clone(),
        client.clone(),
        keys.clone(),
        leadership.fence().clone(),
    );
    (leadership, store)
}

/// Runs `f` on a thread of its own; its answer comes through the channel.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// The answer of a call [`spawn`]ed, failing the test if there is none within `limit` (a
/// guard against a hang: the bound the client promises, with room for a loaded machine).
fn answer<T>(rx: mpsc::Receiver<T>, limit: Duration, what: &str) -> T {
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?}: the call hangs"))
}

fn timed_out(e: &StoreError) -> bool {
    e.to_string()
        .contains(&format!("timed out after {REQUEST_TIMEOUT:?}"))
}

#[test]
fn a_hung_etcd_times_every_request_out_and_its_old_term_is_fenced_once_it_resumes() {
    let etcd = support::etcd();
    let runtime = StoreRuntime::new().unwrap();
    let client = runtime
        .block_on(access::connect(&[etcd.endpoint()], None))
        .unwrap();
    let keys = Keys::new("hung").unwrap();
    let (mut old_term, old) = lead(&runtime, &client, &keys, "old");
    old.submit("w", &spec(), Origin::Submitted, 1).unwrap();

    etcd.pause().unwrap();
    // A read, a write and a leader lookup, at once: each fails with the timeout.
    let guard = REQUEST_TIMEOUT * 4;
    let read = {
        let old = old.clone();
        spawn(move || old.live())
    };
    let write = {
        let old = old.clone();
        spawn(move || old.submit("v", &spec(), Origin::Submitted, 2).map(drop))
    };
    let lookup = {
        let (runtime, client, keys) = (runtime.clone(), client.clone(), keys.clone());
        spawn(move || runtime.block_on(current_leader(&client, &keys)))
    };
    match answer(read, guard, "a read") {
        Err(e) if timed_out(&e) => eprintln!("read: {e}"),
        other => panic!("a read of a hung etcd times out, got {other:?}"),
    }
    // The write's outcome is unknown: etcd may apply it when it resumes, if this term still
    // holds then. What is certain is that the caller was told it failed.
    match answer(write, guard, "a write") {
        Err(e) if timed_out(&e) => eprintln!("write: {e}"),
        other => panic!("a write to a hung etcd times out, got {other:?}"),
    }
    match answer(lookup, guard, "a leader lookup") {
        Err(FleetError::TimedOut { op: "get", .. }) => {}
        other => panic!("a leader lookup on a hung etcd times out, got {other:?}"),
    }
    // No keepalive is answered: the leader stops acting at its lease's local deadline.
    runtime.block_on(within(
        two_lease_periods(),
        "the old term counts itself deposed",
        old_term.lost(),
    ));

    // Resumed: etcd expires the old term's lease, another term leads, the same client reads
    // again, and nothing of the old term is written any more.
    etcd.resume().unwrap();
    let candidate = Candidate::new(
        client.clone(),
        keys.clone(),
        LeaderInfo {
            id: "new".to_string(),
            advertise: None,
        },
        TTL_SECS,
    );
    let new_term = runtime.block_on(within(
        two_lease_periods() + REQUEST_TIMEOUT,
        "another term leads once etcd resumes",
        candidate.campaign(),
    ));
    let new_term = new_term.unwrap();
    let new = EtcdStore::leader(
        runtime.clone(),
        client.clone(),
        keys.clone(),
        new_term.fence().clone(),
    );
    assert!(new.live().unwrap().iter().any(|w| w.name == "w"));
    match old.submit("late", &spec(), Origin::Submitted, 3) {
        Err(StoreError::NotLeader { leader }) => assert!(
            leader.as_deref().is_some_and(|l| l.starts_with("new")),
            "names the new leader: {leader:?}"
        ),
        other => panic!("the old term's write must be refused, got {other:?}"),
    }
    assert!(new.live().unwrap().iter().all(|w| w.name != "late"));
}
