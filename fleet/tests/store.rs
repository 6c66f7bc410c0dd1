//! The service's state in a real etcd: the same contract as the SQLite store
//! (`tessera_reconciler::store::contract`, every case), the fence (a deposed leader's store
//! writes nothing; a standby's store reads and refuses writes), writers of one leader racing
//! each other, and writes larger than one etcd transaction.

mod support;

use std::sync::Arc;

use etcd_client::Client;
use serde_json::json;
use support::{TTL_SECS, etcd};
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::WorkloadSpec;
use tessera_compiler::units::Gpus;
use tessera_fleet::election::{Candidate, LeaderInfo, Leadership};
use tessera_fleet::keys::Keys;
use tessera_fleet::store::{EtcdStore, MAX_TXN_OPS, StoreRuntime};
use tessera_fleet::testing::TestEtcd;
use tessera_reconciler::store::contract::CASES;
use tessera_reconciler::store::usage::{NewRun, RunKey};
use tessera_reconciler::store::{Ended, Origin, Phase, StateStore, StateStoreExt, StoreError};

/// A runtime and a client for one test's stores.
struct Bench {
    runtime: Arc<StoreRuntime>,
    client: Client,
    // Dropped last: etcd outlives the stores.
    _etcd: TestEtcd,
}

impl Bench {
    fn start() -> Bench {
        let etcd = etcd();
        let runtime = StoreRuntime::new().unwrap();
        let client = runtime
            .block_on(Client::connect([etcd.endpoint()], None))
            .unwrap();
        Bench {
            runtime,
            client,
            _etcd: etcd,
        }
    }

    /// Campaigns as `id` in `cluster` and returns the term with its store.
    fn lead(&self, cluster: &str, id: &str) -> (Leadership, EtcdStore) {
        let keys = Keys::new(cluster).unwrap();
        let info = LeaderInfo {
            id: id.to_string(),
            advertise: None,
        };
        let candidate = Candidate::new(self.client.clone(), keys.clone(), info, TTL_SECS);
        let leadership = self.runtime.block_on(candidate.campaign()).unwrap();
        let store = EtcdStore::leader(
            self.runtime.clone(),
            self.client.clone(),
            keys,
            leadership.fence().clone(),
        );
        (leadership, store)
    }

    fn reader(&self, cluster: &str) -> EtcdStore {
        let keys = Keys::new(cluster).unwrap();
        EtcdStore::reader(self.runtime.clone(), self.client.clone(), keys)
    }
}

fn spec(tenant: &str) -> WorkloadSpec {
    serde_json::from_value(json!({"tenant": tenant, "sloClass": "batch", "gpu": {"count": 1}}))
        .unwrap()
}

#[test]
fn every_case_of_the_contract_holds_on_etcd() {
    let bench = Bench::start();
    for (i, (name, case)) in CASES.iter().enumerate() {
        // Each case on an empty cluster of its own.
        let (_term, store) = bench.lead(&format!("contract-{i}"), "leader");
        eprintln!("contract case {name}");
        case(&store);
    }
}

#[test]
fn a_deposed_leaders_store_writes_nothing() {
    let bench = Bench::start();
    let (term, old) = bench.lead("fenced", "old");
    old.submit("w", &spec("a"), Origin::Submitted, 1).unwrap();
    let intent = old.begin_action(1, &json!({"action": "start"}), 1).unwrap();
    bench.runtime.block_on(term.resign()).unwrap();
    let (_term, new) = bench.lead("fenced", "new");
    let events = new.events(0, 100).unwrap();

    let key = WorkloadKey::new("a", "w");
    let refused: Vec<(&str, Result<(), StoreError>)> = vec![
        ("cancel", old.cancel(&key, 2).map(drop)),
        (
            "submit",
            old.submit("v", &spec("a"), Origin::Submitted, 2).map(drop),
        ),
        ("close", old.close(intent, Ended::Done, 2)),
        ("event", old.record_event("x", None, "y", 2).map(drop)),
        ("carried", old.set_carried(&Default::default(), 2)),
        ("prune", old.prune_events(100, 10).map(drop)),
    ];
    for (what, result) in refused {
        match result {
            Err(StoreError::NotLeader { leader }) => assert!(
                leader.as_deref().is_some_and(|l| l.starts_with("new")),
                "{what}: names the new leader: {leader:?}"
            ),
            other => panic!("{what}: a deposed leader's write must be refused, got {other:?}"),
        }
    }
    // Nothing of the refused writes reached etcd; the new leader writes.
    assert_eq!(new.workload(&key).unwrap().phase, Phase::Pending);
    assert_eq!(new.list(None).unwrap().len(), 1);
    assert_eq!(new.open_actions().unwrap().len(), 1);
    assert_eq!(new.events(0, 100).unwrap(), events);
    new.cancel(&key, 3).unwrap();
    assert_eq!(new.workload(&key).unwrap().phase, Phase::Cancelled);
}

#[test]
fn a_standby_reads_what_the_leader_wrote_and_refuses_writes() {
    let bench = Bench::start();
    let (_term, leader) = bench.lead("standby", "leader-1");
    leader
        .submit("w", &spec("a"), Origin::Submitted, 1)
        .unwrap();
    let standby = bench.reader("standby");
    let key = WorkloadKey::new("a", "w");
    assert_eq!(
        standby.workload(&key).unwrap(),
        leader.workload(&key).unwrap()
    );
    assert_eq!(standby.events(0, 10).unwrap().len(), 1);
    match standby.cancel(&key, 2) {
        Err(StoreError::NotLeader { leader }) => {
            assert!(leader.is_some_and(|l| l.starts_with("leader-1")))
        }
        other => panic!("a standby must refuse writes, got {other:?}"),
    }
    assert_eq!(leader.workload(&key).unwrap().phase, Phase::Pending);
}

/// The API and the cycle write through two clones at once: every write lands once, ids stay
/// unique and the event log holds one event per write.
#[test]
fn writers_of_one_leader_racing_each_other_lose_nothing() {
    let bench = Bench::start();
    let (_term, store) = bench.lead("race", "leader");
    let per_writer = 15;
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut ids = Vec::new();
                for i in 0..per_writer {
                    let name = format!("w{w}-{i}");
                    store
                        .submit(&name, &spec("a"), Origin::Submitted, i)
                        .unwrap();
                    ids.push(store.begin_action(1, &json!({"n": name}), i).unwrap());
                }
                ids
            })
        })
        .collect();
    let mut ids: Vec<i64> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3 * per_writer as usize, "journal ids are unique");
    assert_eq!(store.live().unwrap().len(), 3 * per_writer as usize);
    let events = store.events(0, 1000).unwrap();
    assert_eq!(events.len(), 3 * per_writer as usize);
    assert!(events.windows(2).all(|e| e[0].id < e[1].id));
}

/// Metering more runs, and pruning more entries, than one transaction may carry; reading more
/// than one page.
#[test]
fn writes_larger_than_one_transaction_are_chunked_and_add_up() {
    let bench = Bench::start();
    let (_term, store) = bench.lead("large", "leader");
    let runs = 2 * MAX_TXN_OPS + 7;
    let keys: Vec<RunKey> = (0..runs)
        .map(|i| RunKey {
            tenant: "a".into(),
            workload: format!("w{i}"),
            submitted_at: 0,
            started_at: 100,
        })
        .collect();
    let new: Vec<NewRun> = keys
        .iter()
        .map(|key| NewRun {
            key: key.clone(),
            pool: "train".into(),
            model: "A100".into(),
            profile: None,
            gpus: Gpus::whole(1),
            cpu_millicores: 0,
            memory_mib: 0,
        })
        .collect();
    store.meter_runs(&[], &new, 110).unwrap();
    assert!(store.unmetered_runs(&keys).unwrap().is_empty());
    store.meter_runs(&keys, &[], 200).unwrap();
    let rows = store.usage(0, 1000).unwrap();
    assert_eq!(
        rows[0].gpu_unit_seconds,
        runs as i64 * 100 * Gpus::UNITS_PER_GPU
    );

    let entries = MAX_TXN_OPS + 30;
    for i in 0..entries {
        let id = store.begin_action(1, &json!(i), 1).unwrap();
        store.complete_action(id, 2).unwrap();
    }
    let open = store.begin_action(1, &json!("open"), 3).unwrap();
    assert_eq!(store.prune_journal(10, usize::MAX).unwrap(), entries);
    assert_eq!(
        store
            .open_actions()
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect::<Vec<_>>(),
        [open]
    );

    // Reads longer than one page (500 keys), ascending and descending.
    let key = WorkloadKey::new("a", "w");
    let logged = 510;
    for i in 0..logged {
        store.record_event("note", Some(&key), "n", i).unwrap();
    }
    let all = store.events(0, 10_000).unwrap();
    assert_eq!(all.len(), logged as usize);
    assert!(all.windows(2).all(|e| e[0].id < e[1].id));
    assert_eq!(store.recent_workload_events(&key, 600).unwrap(), all);
    let rest = store.events(all[249].id, 10_000).unwrap();
    assert_eq!(rest, all[250..]);

    // Retention beyond one commit and up to a limit: events (60 a commit), with their copies
    // per workload; ended records (25 a commit); usage rows (100 a commit), once closed.
    assert_eq!(store.prune_events(400, 150).unwrap(), 150, "the limit");
    assert_eq!(store.prune_events(400, usize::MAX).unwrap(), 250);
    assert_eq!(store.events(0, 10_000).unwrap(), all[400..]);
    assert_eq!(store.recent_workload_events(&key, 600).unwrap(), all[400..]);
    let ended = 70;
    for i in 0..ended {
        let name = format!("done-{i}");
        store
            .submit(&name, &spec("a"), Origin::Submitted, 600)
            .unwrap();
        store.cancel(&WorkloadKey::new("a", &name), 601).unwrap();
    }
    store
        .submit("live", &spec("a"), Origin::Submitted, 600)
        .unwrap();
    assert_eq!(store.prune_workloads(700, 50).unwrap(), 50);
    assert_eq!(store.prune_workloads(700, usize::MAX).unwrap(), ended - 50);
    let left: Vec<String> = store
        .list(None)
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(left, ["live"]);
    assert!(store.tenants_with("done-3").unwrap().is_empty());
    store.meter_runs(&[], &[], 300).unwrap();
    assert_eq!(store.prune_usage(1000, usize::MAX).unwrap(), runs);
    assert!(store.usage(0, 1000).unwrap().is_empty());
}

/// A service restarted against the same etcd (a new runtime, connection and term) finds its
/// state.
#[test]
fn a_new_term_finds_the_state_the_last_one_left() {
    let bench = Bench::start();
    let (term, store) = bench.lead("restart", "first");
    store.submit("w", &spec("a"), Origin::Committed, 1).unwrap();
    let intent = store
        .begin_action(4, &json!({"action": "start"}), 2)
        .unwrap();
    bench.runtime.block_on(term.resign()).unwrap();
    drop(store);

    let runtime = StoreRuntime::new().unwrap();
    let client = runtime
        .block_on(Client::connect([bench._etcd.endpoint()], None))
        .unwrap();
    let keys = Keys::new("restart").unwrap();
    let info = LeaderInfo {
        id: "second".into(),
        advertise: None,
    };
    let candidate = Candidate::new(client.clone(), keys.clone(), info, TTL_SECS);
    let term = runtime.block_on(candidate.campaign()).unwrap();
    let store = EtcdStore::leader(runtime.clone(), client, keys, term.fence().clone());
    let key = WorkloadKey::new("a", "w");
    assert_eq!(store.workload(&key).unwrap().origin, Origin::Committed);
    assert_eq!(store.open_actions().unwrap()[0].id, intent);
    store
        .close(intent, Ended::Failed("interrupted"), 5)
        .unwrap();
    assert!(store.open_actions().unwrap().is_empty());
}
