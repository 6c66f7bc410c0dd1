//! The control plane's `FleetView` against a real etcd: the whole fleet's observation from
//! registrations, `observed` and `utilization`, kept up to date by watches; a node away is
//! Degraded with since when and why, then Lost after the grace; a node that registers later
//! joins the view; nothing of a node's actions or journal reaches it; and etcd stopped and
//! restarted is reported as trouble, then read again.

mod support;

use std::path::Path;
use std::time::Duration;

use etcd_client::Client;
use support::{TTL_SECS, connect, etcd, two_lease_periods, within};
use tessera_compiler::model::Health;
use tessera_fleet::keys::Keys;
use tessera_fleet::liveness::Liveness;
use tessera_fleet::protocol::{self, Observed, VERSION};
use tessera_fleet::registration::{Registrar, Registration};
use tessera_fleet::utilization::{self, Utilization};
use tessera_fleet::view::{Availability, FleetView};
use tessera_reconciler::driver::GpuUtilization;
use tessera_reconciler::driver::sim::SimDriver;

fn keys() -> Keys {
    Keys::new("test").unwrap()
}

const GRACE: Duration = Duration::from_secs(1);
const PATIENCE: Duration = Duration::from_secs(30);

/// The quickstart fleet in the sim driver.
fn sim(dir: &Path) -> SimDriver {
    let nodes = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/nodes/quickstart.yaml");
    SimDriver::open(&nodes, &dir.join("sim.json")).unwrap()
}

/// What `node`'s agent would register and write to `observed` and `utilization` (every GPU
/// at `percent`).
fn node_state(
    sim: &mut SimDriver,
    node: &str,
    percent: u32,
) -> (Registration, Observed, Utilization) {
    let (registration, observation) = Registration::observe(sim, node).unwrap();
    let mut details = observation.details;
    for d in &mut details {
        d.utilization = Some(GpuUtilization {
            gpu_percent: percent,
            memory_percent: 0,
        });
    }
    let figures = utilization::split(&mut details);
    let observed = Observed {
        version: VERSION,
        node: observation.node,
        details,
        workloads: Vec::new(),
    };
    (registration, observed, figures)
}

async fn put(client: &Client, key: String, value: Vec<u8>) {
    client.clone().put(key, value, None).await.unwrap();
}

async fn publish(client: &Client, node: &str, observed: &Observed, figures: &Utilization) {
    put(
        client,
        keys().observed(node).unwrap(),
        protocol::encode(observed),
    )
    .await;
    put(
        client,
        keys().utilization(node).unwrap(),
        protocol::encode(figures),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_follows_registrations_observations_and_liveness() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let mut sim = sim(dir.path());

    // train-0 registered and observed before the view starts; infer-0 expected (the control
    // plane bound work to it) but not registered.
    let (reg0, obs0, use0) = node_state(&mut sim, "train-0", 40);
    let agent0 = Registrar::start(&client, &keys(), &reg0, TTL_SECS)
        .await
        .unwrap();
    publish(&client, "train-0", &obs0, &use0).await;
    let mut view = FleetView::start(&client, &keys(), GRACE, ["infer-0".to_string()])
        .await
        .unwrap();
    let snapshot = view.snapshot();
    let observation = snapshot.observation();
    let names: Vec<&str> = observation.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["train-0"]);
    assert_eq!(observation.nodes[0].health, Health::Healthy);
    assert_eq!(observation.details.len(), 8);
    assert!(
        observation
            .details
            .iter()
            .all(|d| d.utilization.map(|u| u.gpu_percent) == Some(40))
    );
    let infer = snapshot.node("infer-0").unwrap();
    assert!(matches!(infer.liveness, Liveness::NotReady { .. }));
    assert!(infer.since.is_some());

    // A node that registers later joins the view, with what it writes after.
    let (reg1, obs1, use1) = node_state(&mut sim, "train-1", 70);
    let agent1 = Registrar::start(&client, &keys(), &reg1, TTL_SECS)
        .await
        .unwrap();
    publish(&client, "train-1", &obs1, &use1).await;
    let snapshot = within(
        PATIENCE,
        "train-1 in the view",
        view.wait_for(|s| {
            s.node("train-1")
                .is_some_and(|n| n.observed.is_some() && n.utilization.is_some())
        }),
    )
    .await;
    assert_eq!(snapshot.observation().nodes.len(), 2);

    // The node's other keys (actions, journal, bound) do not reach the view; `observed`
    // changes do.
    let before = view.snapshot();
    put(
        &client,
        keys().action("train-1", 1).unwrap(),
        b"{}".to_vec(),
    )
    .await;
    put(
        &client,
        keys().journal("train-1", 1).unwrap(),
        b"{}".to_vec(),
    )
    .await;
    let (_, mut changed, _) = node_state(&mut sim, "train-1", 70);
    changed.node.labels.insert("seen".into(), "yes".into());
    put(
        &client,
        keys().observed("train-1").unwrap(),
        protocol::encode(&changed),
    )
    .await;
    let after = within(
        PATIENCE,
        "the change in the view",
        view.wait_for(|s| {
            s.node("train-1")
                .and_then(|n| n.observed.as_ref())
                .is_some_and(|o| o.node.labels.contains_key("seen"))
        }),
    )
    .await;
    assert!(after.revision > before.revision);
    // The snapshot taken before is unchanged: snapshots are values.
    assert!(
        !before
            .node("train-1")
            .unwrap()
            .observed
            .as_ref()
            .unwrap()
            .node
            .labels
            .contains_key("seen")
    );

    // train-0's agent stops renewing: NotReady (Degraded in the observation, kept), then
    // Lost after the grace; unavailable() says since when and why.
    agent0.stop_renewing();
    let snapshot = within(
        two_lease_periods() + PATIENCE,
        "train-0 NotReady",
        view.wait_for(|s| {
            s.node("train-0")
                .is_some_and(|n| !matches!(n.liveness, Liveness::Ready))
        }),
    )
    .await;
    let observed = snapshot.observation();
    let train0 = observed.nodes.iter().find(|n| n.name == "train-0").unwrap();
    assert_ne!(train0.health, Health::Healthy);
    let lost = within(
        PATIENCE,
        "train-0 Lost",
        view.wait_for(|s| s.lost().contains(&"train-0")),
    )
    .await;
    let observed = lost.observation();
    let train0 = observed.nodes.iter().find(|n| n.name == "train-0").unwrap();
    assert_eq!(train0.health, Health::Lost);
    let unavailable = lost.unavailable();
    let why = unavailable.iter().find(|u| u.node == "train-0").unwrap();
    assert_eq!(why.state, Availability::Lost);
    assert!(why.since.is_some());
    assert!(
        why.reason.contains("longer than the grace"),
        "{}",
        why.reason
    );
    // infer-0 never came: Lost too. train-1 is fine.
    assert!(lost.lost().contains(&"infer-0"));
    assert!(!unavailable.iter().any(|u| u.node == "train-1"));

    // Back on a fresh lease: Ready again.
    let _again = Registrar::start(&client, &keys(), &reg0, TTL_SECS)
        .await
        .unwrap();
    within(
        PATIENCE,
        "train-0 Ready again",
        view.wait_for(|s| {
            s.node("train-0")
                .is_some_and(|n| n.liveness == Liveness::Ready)
        }),
    )
    .await;
    drop(agent1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_away_is_trouble_and_the_view_reads_again_when_it_is_back() {
    let mut etcd = etcd();
    let client = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let mut sim = sim(dir.path());
    let (reg, obs, figures) = node_state(&mut sim, "train-0", 40);
    let _agent = Registrar::start(&client, &keys(), &reg, 30).await.unwrap();
    publish(&client, "train-0", &obs, &figures).await;
    let mut view = FleetView::start(&client, &keys(), GRACE, Vec::new())
        .await
        .unwrap();
    assert!(view.snapshot().trouble.is_none());

    etcd.kill();
    let troubled = within(
        PATIENCE,
        "trouble reported",
        view.wait_for(|s| s.trouble.is_some()),
    )
    .await;
    // The last snapshot is kept meanwhile.
    assert_eq!(troubled.observation().nodes.len(), 1);
    etcd.restart().unwrap();
    // What changed while etcd was away from the view's point of view is read again.
    let (_, mut changed, _) = node_state(&mut sim, "train-0", 40);
    changed.node.labels.insert("after".into(), "restart".into());
    let writer = connect(&etcd).await;
    within(PATIENCE, "a write after the restart", async {
        while writer
            .clone()
            .put(
                keys().observed("train-0").unwrap(),
                protocol::encode(&changed),
                None,
            )
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let back = within(
        PATIENCE,
        "the view back",
        view.wait_for(|s| {
            s.trouble.is_none()
                && s.node("train-0")
                    .and_then(|n| n.observed.as_ref())
                    .is_some_and(|o| o.node.labels.contains_key("after"))
        }),
    )
    .await;
    assert_eq!(back.node("train-0").unwrap().liveness, Liveness::Ready);
}
