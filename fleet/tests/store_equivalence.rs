//! The etcd store and the SQLite store as one machine: any sequence of calls (legal or not)
//! gets the same answers from both (the same records, the same errors word for word, the same
//! ids) and leaves the same workloads, events and open intents. A property over random
//! sequences, on a real etcd: each case on a cluster of its own.

mod support;

use std::cell::Cell;

use etcd_client::Client;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::json;
use support::{TTL_SECS, etcd};
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{Binding, WorkloadSpec};
use tessera_fleet::election::{Candidate, LeaderInfo};
use tessera_fleet::keys::Keys;
use tessera_fleet::store::{EtcdStore, StoreRuntime};
use tessera_reconciler::store::{
    EndReason, Ended, Origin, ReplicaProcess, StateStore, StateStoreExt, Store,
};

const TENANTS: [&str; 2] = ["a", "b"];
const NAMES: [&str; 2] = ["w", "v"];

#[derive(Debug, Clone)]
enum Op {
    Submit { key: usize, committed: bool },
    Start { key: usize },
    Run { key: usize, pid: u32 },
    Checkpoint { key: usize },
    Signal { key: usize },
    Exit { key: usize, pid: u32 },
    Requeue { key: usize },
    Finish { key: usize, reason: usize },
    Cancel { key: usize },
    Begin,
    Close { id: i64, failed: bool },
    CloseAndBegin { id: i64 },
    Event { key: Option<usize> },
}

fn op() -> impl Strategy<Value = Op> {
    // Three keys (two tenants' `w`, one `v`), and the steps of a lifecycle weighted up, so
    // that sequences reach every phase rather than mostly failing at the first step.
    let key = 0..3usize;
    prop_oneof![
        3 => (key.clone(), any::<bool>()).prop_map(|(key, committed)| Op::Submit { key, committed }),
        3 => key.clone().prop_map(|key| Op::Start { key }),
        3 => (key.clone(), 1..4u32).prop_map(|(key, pid)| Op::Run { key, pid }),
        1 => key.clone().prop_map(|key| Op::Checkpoint { key }),
        1 => key.clone().prop_map(|key| Op::Signal { key }),
        1 => (key.clone(), 1..8u32).prop_map(|(key, pid)| Op::Exit { key, pid }),
        1 => key.clone().prop_map(|key| Op::Requeue { key }),
        1 => (key.clone(), 0..4usize).prop_map(|(key, reason)| Op::Finish { key, reason }),
        1 => key.clone().prop_map(|key| Op::Cancel { key }),
        1 => Just(Op::Begin),
        1 => (1..6i64, any::<bool>()).prop_map(|(id, failed)| Op::Close { id, failed }),
        1 => (1..6i64).prop_map(|id| Op::CloseAndBegin { id }),
        1 => proptest::option::of(key).prop_map(|key| Op::Event { key }),
    ]
}

fn key(i: usize) -> WorkloadKey {
    WorkloadKey::new(TENANTS[i % TENANTS.len()], NAMES[i / TENANTS.len()])
}

fn spec(tenant: &str) -> WorkloadSpec {
    serde_json::from_value(json!({"tenant": tenant, "sloClass": "batch", "replicas": 2,
                                  "gpu": {"count": 1}}))
    .unwrap()
}

fn bindings() -> Vec<Binding> {
    serde_json::from_value(json!([{"node": "n1", "gpus": [0]}, {"node": "n0", "gpus": [1]}]))
        .unwrap()
}

/// Applies `op` at `now`; the answer as text, so that errors compare word for word.
fn apply(store: &dyn StateStore, op: &Op, now: i64) -> String {
    let reason = |i: usize| match i {
        0 => EndReason::Exited { code: 0 },
        1 => EndReason::Cancelled,
        2 => EndReason::Rejected {
            reason: "gone".into(),
        },
        _ => EndReason::Lost { node: "n1".into() },
    };
    let answer = match op {
        Op::Submit { key: k, committed } => {
            let k = key(*k);
            let origin = if *committed {
                Origin::Committed
            } else {
                Origin::Submitted
            };
            store
                .submit(&k.name, &spec(&k.tenant), origin, now)
                .map(|r| format!("{r:?}"))
        }
        Op::Start { key: k } => store
            .mark_starting(&key(*k), &bindings(), now)
            .map(|r| format!("{r:?}")),
        Op::Run { key: k, pid } => {
            let replicas: Vec<ReplicaProcess> = (0..2)
                .map(|r| ReplicaProcess {
                    replica: 1 - r,
                    pid: Some(pid * 2 + r),
                    devices: vec![format!("GPU-{r}")],
                })
                .collect();
            store
                .mark_running(&key(*k), &replicas, now)
                .map(|r| format!("{r:?}"))
        }
        Op::Checkpoint { key: k } => store
            .record_checkpoint(&key(*k), "/ckpt", now)
            .map(|r| format!("{r:?}")),
        Op::Signal { key: k } => store
            .mark_checkpointing(&key(*k), now + 30, now)
            .map(|r| format!("{r:?}")),
        Op::Exit { key: k, pid } => store
            .replica_exited(&key(*k), *pid, now)
            .map(|n| n.to_string()),
        Op::Requeue { key: k } => store
            .requeue(&key(*k), "preempted", now)
            .map(|r| format!("{r:?}")),
        Op::Finish { key: k, reason: i } => store
            .finish(&key(*k), reason(*i), now)
            .map(|r| format!("{r:?}")),
        Op::Cancel { key: k } => store.cancel(&key(*k), now).map(|r| format!("{r:?}")),
        Op::Begin => store
            .begin_action(1, &json!({"action": "start", "workload": "a/w"}), now)
            .map(|id| id.to_string()),
        Op::Close { id, failed } => {
            let how = if *failed {
                Ended::Failed("interrupted")
            } else {
                Ended::Done
            };
            store.close(*id, how, now).map(|()| "closed".to_string())
        }
        Op::CloseAndBegin { id } => store
            .close_and_begin((*id, Ended::Done), 2, &json!({"action": "stop"}), now)
            .map(|id| id.to_string()),
        Op::Event { key: k } => store
            .record_event("note", k.map(key).as_ref(), "a note", now)
            .map(|id| id.to_string()),
    };
    match answer {
        Ok(text) => text,
        Err(e) => format!("error: {e}"),
    }
}

/// What a store holds, as the service reads it.
fn contents(store: &dyn StateStore) -> String {
    let mut out = format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}",
        store.list(None).unwrap(),
        store.live().unwrap(),
        store.committed().unwrap(),
        store.cancel_requested().unwrap(),
        store.events(0, 1000).unwrap(),
        store.open_actions().unwrap(),
    );
    for i in 0..TENANTS.len() * NAMES.len() {
        let k = key(i);
        out.push_str(&format!(
            "\n{:?}\n{:?}\n{:?}\n{:?}",
            store.get(&k).unwrap(),
            store.ended(&k, 10).unwrap(),
            store.recent_workload_events(&k, 3).unwrap(),
            store.interrupted_starts(&k, 0, "interrupted").unwrap(),
        ));
    }
    for name in NAMES {
        out.push_str(&format!("\n{:?}", store.tenants_with(name).unwrap()));
    }
    out
}

#[test]
fn etcd_and_sqlite_answer_every_sequence_alike() {
    let etcd = etcd();
    let runtime = StoreRuntime::new().unwrap();
    let client = runtime
        .block_on(Client::connect([etcd.endpoint()], None))
        .unwrap();
    let case = Cell::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), 1..60), |ops| {
        case.set(case.get() + 1);
        let keys = Keys::new(&format!("equivalence-{}", case.get())).unwrap();
        let info = LeaderInfo {
            id: "leader".into(),
            advertise: None,
        };
        let candidate = Candidate::new(client.clone(), keys.clone(), info, TTL_SECS);
        let term = runtime.block_on(candidate.campaign()).unwrap();
        let on_etcd =
            EtcdStore::leader(runtime.clone(), client.clone(), keys, term.fence().clone());
        let on_sqlite = Store::open_in_memory().unwrap();
        for (at, op) in ops.iter().enumerate() {
            let now = 100 + at as i64;
            prop_assert_eq!(
                apply(&on_etcd, op, now),
                apply(&on_sqlite, op, now),
                "{:?} at {}",
                op,
                now
            );
        }
        prop_assert_eq!(contents(&on_etcd), contents(&on_sqlite));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
