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
use tessera_compiler::units::Gpus;
use tessera_fleet::election::{Candidate, LeaderInfo};
use tessera_fleet::keys::Keys;
use tessera_fleet::store::{EtcdStore, StoreRuntime};
use tessera_reconciler::store::usage::{NewRun, RunKey};
use tessera_reconciler::store::{
    EndReason, Ended, Origin, ReplicaProcess, StateStore, StateStoreExt, Store,
};

const TENANTS: [&str; 2] = ["a", "b"];
const NAMES: [&str; 2] = ["w", "v"];

#[derive(Debug, Clone)]
enum Op {
    Submit {
        key: usize,
        committed: bool,
    },
    Start {
        key: usize,
    },
    Run {
        key: usize,
        pid: u32,
    },
    Checkpoint {
        key: usize,
    },
    Signal {
        key: usize,
    },
    Exit {
        key: usize,
        pid: u32,
    },
    Requeue {
        key: usize,
    },
    Finish {
        key: usize,
        reason: usize,
    },
    Cancel {
        key: usize,
    },
    Begin,
    Close {
        id: i64,
        failed: bool,
    },
    /// Several intents at once.
    BeginAll {
        count: usize,
    },
    /// Several closes at once (an id may repeat, or be closed already).
    CloseAll {
        ids: Vec<(i64, bool)>,
    },
    CloseAndBegin {
        id: i64,
    },
    Event {
        key: Option<usize>,
    },
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
        1 => (0..4usize).prop_map(|count| Op::BeginAll { count }),
        1 => proptest::collection::vec((1..8i64, any::<bool>()), 0..4)
            .prop_map(|ids| Op::CloseAll { ids }),
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
        Op::BeginAll { count } => {
            let actions: Vec<serde_json::Value> = (0..*count)
                .map(|n| json!({"action": "reset", "gpu": n}))
                .collect();
            let actions: Vec<&serde_json::Value> = actions.iter().collect();
            store
                .begin_actions(1, &actions, now)
                .map(|ids| format!("{ids:?}"))
        }
        Op::CloseAll { ids } => {
            let ended: Vec<(i64, Ended<'_>)> = ids
                .iter()
                .map(|&(id, failed)| {
                    let how = if failed {
                        Ended::Failed("interrupted")
                    } else {
                        Ended::Done
                    };
                    (id, how)
                })
                .collect();
            store.close_all(&ended, now).map(|()| "closed".to_string())
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

/// Runs metered in the property below, one per workload.
const RUNS: usize = 4;

fn metered_run(i: usize) -> RunKey {
    RunKey {
        tenant: TENANTS[i % TENANTS.len()].to_string(),
        workload: format!("r{i}"),
        submitted_at: 50,
        started_at: 90 + 5 * i as i64,
    }
}

fn described(i: usize) -> NewRun {
    NewRun {
        key: metered_run(i),
        pool: "train".into(),
        model: "A100".into(),
        profile: (i % 2 == 1).then(|| "3g.40gb".to_string()),
        gpus: Gpus::whole(1 + i as i64),
        cpu_millicores: 1000,
        memory_mib: 512,
    }
}

#[derive(Debug, Clone)]
enum Metering {
    /// `meter_runs` with the runs of `extend` and the described runs of `create` (bit masks),
    /// `step` seconds after the previous call (negative: a clock behind).
    Meter {
        extend: u8,
        create: u8,
        step: i64,
    },
    Admit {
        run: usize,
    },
}

fn metering() -> impl Strategy<Value = Metering> {
    let mask = 0..(1u8 << RUNS);
    prop_oneof![
        6 => (mask.clone(), mask, -15..40i64)
            .prop_map(|(extend, create, step)| Metering::Meter { extend, create, step }),
        1 => (0..RUNS).prop_map(|run| Metering::Admit { run }),
    ]
}

/// Usage in windows before, across and after the metered instants, as the report reads it.
fn reports(store: &dyn StateStore) -> String {
    [(0, i64::MAX), (0, 100), (95, 130), (120, 180), (170, 400)]
        .iter()
        .map(|&(since, until)| format!("{:?}", store.usage(since, until).unwrap()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The etcd store meters runs with a watermark (a steady cycle writes one key) where SQLite
/// writes each run's row: any sequence of meterings (runs named, left out and named again,
/// described again, a clock going back) reports the same usage in every window on both.
#[test]
fn metering_reports_the_same_usage_on_etcd_and_sqlite() {
    let etcd = etcd();
    let runtime = StoreRuntime::new().unwrap();
    let client = runtime
        .block_on(Client::connect([etcd.endpoint()], None))
        .unwrap();
    let case = Cell::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(metering(), 1..25), |ops| {
        case.set(case.get() + 1);
        let keys = Keys::new(&format!("metering-{}", case.get())).unwrap();
        let info = LeaderInfo {
            id: "leader".into(),
            advertise: None,
        };
        let candidate = Candidate::new(client.clone(), keys.clone(), info, TTL_SECS);
        let term = runtime.block_on(candidate.campaign()).unwrap();
        let on_etcd =
            EtcdStore::leader(runtime.clone(), client.clone(), keys, term.fence().clone());
        let on_sqlite = Store::open_in_memory().unwrap();
        let mut now = 100;
        for op in &ops {
            let stores: [&dyn StateStore; 2] = [&on_etcd, &on_sqlite];
            match op {
                Metering::Meter {
                    extend,
                    create,
                    step,
                } => {
                    now += step;
                    let named = |mask: u8| (0..RUNS).filter(move |i| mask & (1 << i) != 0);
                    let extend: Vec<RunKey> = named(*extend).map(metered_run).collect();
                    let create: Vec<NewRun> = named(*create).map(described).collect();
                    for store in stores {
                        store.meter_runs(&extend, &create, now).unwrap();
                    }
                }
                Metering::Admit { run } => {
                    let r = metered_run(*run);
                    for store in stores {
                        store
                            .record_admission(
                                &r.tenant,
                                &r.workload,
                                r.submitted_at,
                                Gpus::whole(1),
                                Gpus::whole(*run as i64),
                            )
                            .unwrap();
                    }
                }
            }
            prop_assert_eq!(reports(&on_etcd), reports(&on_sqlite), "after {:?}", op);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
