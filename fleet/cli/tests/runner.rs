//! The leader's `PlanRunner` against real `tessera-fleet agent` processes and a real etcd:
//! each action's outcome is what the agent journaled (done, or failed with its message); an
//! agent that is dead while the plan runs leaves its actions not settled while the others are
//! done, and reports them once it is back; a runner of a new term collects what its deposed
//! predecessor left in flight, and the predecessor can write nothing more.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use serde_json::json;
use support::Agent;
use tessera_fleet::FleetError;
use tessera_fleet::actions::JournalRecord;
use tessera_fleet::dispatch::DEFAULT_MAX_TXN_OPS;
use tessera_fleet::election::{Candidate, LeaderInfo, Leadership};
use tessera_fleet::keys::{Keys, NodeKey};
use tessera_fleet::runner::{PlanRunner, PlannedAction, RunReport, Settled};
use tessera_fleet::testing::TestEtcd;
use tessera_reconciler::actions::Action;
use tokio::time::Instant;

const LEADER_TTL: i64 = 30;
/// Every wait is bounded by this: a failure guard, never a timing assertion.
const PATIENCE: Duration = Duration::from_secs(60);

fn keys() -> Keys {
    Keys::new("test").unwrap()
}

fn etcd() -> TestEtcd {
    TestEtcd::start().unwrap_or_else(|e| panic!("{e}"))
}

async fn connect(etcd: &TestEtcd) -> Client {
    Client::connect([etcd.endpoint()], None)
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", etcd.endpoint()))
}

async fn lead(client: &Client, id: &str) -> Leadership {
    let info = LeaderInfo {
        id: id.into(),
        advertise: None,
    };
    Candidate::new(client.clone(), keys(), info, LEADER_TTL)
        .campaign()
        .await
        .unwrap()
}

async fn runner(client: &Client, leader: &Leadership) -> PlanRunner {
    PlanRunner::start(client, &keys(), leader.fence().clone(), DEFAULT_MAX_TXN_OPS)
        .await
        .unwrap()
}

fn nodes_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/nodes/quickstart.yaml")
}

/// `tessera-fleet agent` for `node` of the quickstart fleet in cluster `test`, running
/// nothing (`--runtime none`), its state and log in `dir`.
fn start_agent(etcd: &TestEtcd, dir: &Path, node: &str) -> Agent {
    let log = dir.join(format!("{node}-{}.log", std::process::id()));
    Agent::spawn(
        etcd,
        "test",
        node,
        &nodes_file(),
        &dir.join(node),
        &log,
        &["--runtime", "none"],
    )
}

/// Waits until `node` has written `observed`: it has joined and taken its actions' watch.
async fn joined(client: &Client, agent: &Agent, node: &str) {
    let key = keys().observed(node).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while client
        .clone()
        .get(key.as_str(), None)
        .await
        .unwrap()
        .kvs()
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "{node} did not join:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn action(value: serde_json::Value) -> PlannedAction {
    let action: Action = serde_json::from_value(value).unwrap();
    PlannedAction::new(action, None, &[]).unwrap()
}

/// One 3g.40gb instance (profile 9) at slice 0 of GPU `index` of `node`.
fn make_instance(node: &str, index: u32) -> Vec<PlannedAction> {
    let gpu = json!({"node": node, "index": index});
    vec![
        action(json!({"action": "set_mig_mode", "gpu": gpu, "enabled": true})),
        action(json!({"action": "reset_gpu", "gpu": gpu})),
        action(json!({"action": "create_gpu_instance", "gpu": gpu, "profile_id": 9, "start": 0})),
        action(json!({"action": "create_compute_instance", "gpu": gpu, "start": 0})),
    ]
}

/// The journal entries of `node`, by id.
async fn journal(client: &Client, node: &str) -> BTreeMap<u64, JournalRecord> {
    let prefix = keys().journal_prefix(node).unwrap();
    let answer = client
        .clone()
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    answer
        .kvs()
        .iter()
        .filter_map(|kv| match keys().parse_node_key(kv.key()) {
            Some(NodeKey::Journal { id, .. }) => {
                Some((id, serde_json::from_slice(kv.value()).unwrap()))
            }
            _ => None,
        })
        .collect()
}

/// Runs empty plans until `f` holds of the earlier outcomes gathered so far (they are
/// returned), failing after [`PATIENCE`].
async fn earlier_until(
    runner: &mut PlanRunner,
    what: &str,
    f: impl Fn(&BTreeMap<(String, u64), Result<(), String>>) -> bool,
) -> BTreeMap<(String, u64), (Result<(), String>, Option<Action>)> {
    let deadline = Instant::now() + PATIENCE;
    let mut gathered = BTreeMap::new();
    loop {
        let report = runner
            .run(
                &[],
                &BTreeMap::new(),
                Instant::now() + Duration::from_millis(200),
            )
            .await
            .unwrap();
        for e in report.earlier {
            gathered.insert((e.node, e.id), (e.result, e.message.map(|m| m.action)));
        }
        let results = gathered
            .iter()
            .map(|(k, (r, _))| (k.clone(), r.clone()))
            .collect();
        if f(&results) {
            return gathered;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {PATIENCE:?}: {gathered:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn copies_of(report: &RunReport, node: &str) -> Vec<(u64, Settled)> {
    report
        .outcomes
        .iter()
        .flat_map(|o| &o.copies)
        .filter(|c| c.node == node)
        .map(|c| (c.id, c.settled.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_what_the_agents_journaled() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let a = start_agent(&etcd, dir.path(), "train-0");
    let b = start_agent(&etcd, dir.path(), "train-1");
    joined(&client, &a, "train-0").await;
    joined(&client, &b, "train-1").await;
    let leader = lead(&client, "a").await;
    let mut runner = runner(&client, &leader).await;

    // train-0 makes an instance; train-1 is asked for a compute instance where no GPU
    // instance exists, which its driver refuses.
    let mut plan = make_instance("train-0", 0);
    plan.push(action(json!({
        "action": "create_compute_instance",
        "gpu": {"node": "train-1", "index": 2},
        "start": 0,
    })));
    let report = runner
        .run(&plan, &BTreeMap::new(), Instant::now() + PATIENCE)
        .await
        .unwrap();
    assert_eq!(report.outcomes.len(), 5);
    assert!(report.pending().is_empty(), "{report:?}\n{}", b.log());
    assert_eq!(report.done().len(), 4, "{report:?}\n{}", a.log());
    let failed = report.failed();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0, plan[4].action);

    // Each outcome is the journal's record of that id, message and all.
    for node in ["train-0", "train-1"] {
        let journal = journal(&client, node).await;
        for (id, settled) in copies_of(&report, node) {
            let expected = match &journal[&id] {
                JournalRecord::Done => Settled::Done,
                JournalRecord::Failed { error } => Settled::Failed(error.clone()),
                JournalRecord::Intent => panic!("{id} is settled in the report"),
            };
            assert_eq!(settled, expected, "{node} action {id}");
        }
    }
    let Settled::Failed(message) = &report.outcomes[4].settled else {
        panic!("{:?}", report.outcomes[4]);
    };
    assert!(message.contains("train-1/gpu2"), "{message}");

    // Once consumed, each node keeps only its floor entry and no action.
    runner.consumed(&report).await.unwrap();
    assert!(runner.in_flight().is_empty());
    for node in ["train-0", "train-1"] {
        assert_eq!(journal(&client, node).await.len(), 1, "{node}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agents_actions_stay_unsettled_the_others_are_done_and_it_reports_them_later() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let a = start_agent(&etcd, dir.path(), "train-0");
    let mut b = start_agent(&etcd, dir.path(), "train-1");
    joined(&client, &a, "train-0").await;
    joined(&client, &b, "train-1").await;
    b.sigkill();
    let leader = lead(&client, "a").await;
    let mut runner = runner(&client, &leader).await;

    let mut plan = make_instance("train-0", 1);
    plan.extend(make_instance("train-1", 1));
    let report = runner
        .run(
            &plan,
            &BTreeMap::new(),
            Instant::now() + Duration::from_secs(1),
        )
        .await
        .unwrap();
    // Whatever the deadline caught of train-0's, none of train-1's is settled.
    assert!(
        copies_of(&report, "train-1")
            .iter()
            .all(|(_, s)| *s == Settled::Pending),
        "{report:?}"
    );
    assert!(report.failed().is_empty(), "{report:?}");
    let done_in_run: Vec<u64> = copies_of(&report, "train-0")
        .into_iter()
        .filter(|(_, s)| *s == Settled::Done)
        .map(|(id, _)| id)
        .collect();
    runner.consumed(&report).await.unwrap();

    // train-0's are all done, those the deadline missed among the earlier outcomes; while
    // train-1 is dead, none of its actions settles.
    let a_ids: Vec<u64> = copies_of(&report, "train-0")
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let b_ids: Vec<u64> = copies_of(&report, "train-1")
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let missing: Vec<u64> = a_ids
        .iter()
        .copied()
        .filter(|id| !done_in_run.contains(id))
        .collect();
    let gathered = earlier_until(&mut runner, "train-0's actions", |got| {
        missing
            .iter()
            .all(|id| got.contains_key(&("train-0".to_string(), *id)))
    })
    .await;
    for ((node, _), (result, _)) in &gathered {
        assert_eq!(node, "train-0");
        assert_eq!(result, &Ok(()));
    }
    assert_eq!(
        runner
            .in_flight()
            .get("train-1")
            .cloned()
            .unwrap_or_default(),
        b_ids.iter().copied().collect()
    );

    // Back, train-1 applies them in order and the runner reports each with its action.
    let _b = start_agent(&etcd, dir.path(), "train-1");
    let gathered = earlier_until(&mut runner, "train-1's actions", |got| {
        b_ids
            .iter()
            .all(|id| got.contains_key(&("train-1".to_string(), *id)))
    })
    .await;
    for (id, planned) in b_ids.iter().zip(&plan[4..]) {
        let (result, action) = &gathered[&("train-1".to_string(), *id)];
        assert_eq!(result, &Ok(()), "action {id}");
        assert_eq!(action.as_ref(), Some(&planned.action), "action {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_terms_runner_collects_its_predecessors_outcomes_and_the_old_one_cannot_write() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&etcd, dir.path(), "train-0");
    joined(&client, &agent, "train-0").await;
    agent.sigkill();

    let first = lead(&client, "first").await;
    let mut deposed = runner(&client, &first).await;
    let plan = make_instance("train-0", 2);
    let report = deposed
        .run(&plan, &BTreeMap::new(), Instant::now())
        .await
        .unwrap();
    assert_eq!(report.pending().len(), 4, "{report:?}");
    let ids: Vec<u64> = report.outcomes.iter().map(|o| o.copies[0].id).collect();
    first.resign().await.unwrap();

    let second = lead(&client, "second").await;
    let mut successor = runner(&client, &second).await;
    assert_eq!(
        successor
            .in_flight()
            .get("train-0")
            .cloned()
            .unwrap_or_default(),
        ids.iter().copied().collect()
    );
    // The deposed runner's next write is refused by the fence.
    let refused = deposed
        .run(
            &make_instance("train-0", 3),
            &BTreeMap::new(),
            Instant::now(),
        )
        .await
        .unwrap_err();
    assert!(matches!(refused, FleetError::Deposed { .. }), "{refused}");

    let _agent = start_agent(&etcd, dir.path(), "train-0");
    let gathered = earlier_until(&mut successor, "the predecessor's actions", |got| {
        ids.iter()
            .all(|id| got.contains_key(&("train-0".to_string(), *id)))
    })
    .await;
    for (id, planned) in ids.iter().zip(&plan) {
        let (result, action) = &gathered[&("train-0".to_string(), *id)];
        assert_eq!(result, &Ok(()), "action {id}");
        // Read back from etcd: this runner did not write it.
        assert_eq!(action.as_ref(), Some(&planned.action), "action {id}");
    }
    // New actions get ids past the predecessor's.
    let next = successor
        .run(
            &make_instance("train-0", 3),
            &BTreeMap::new(),
            Instant::now() + PATIENCE,
        )
        .await
        .unwrap();
    assert!(next.outcomes[0].copies[0].id > *ids.last().unwrap());
    assert_eq!(next.done().len(), 4, "{next:?}");
}
