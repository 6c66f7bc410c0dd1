//! Node registration against a real etcd: what the driver observes is registered, the
//! registration lives exactly as long as the agent's lease, and the control plane's watch
//! sees the node Ready and NotReady.

mod support;

use std::path::Path;

use support::{TTL_SECS, connect, etcd, two_lease_periods, within};
use tessera_fleet::FleetError;
use tessera_fleet::keys::Keys;
use tessera_fleet::registration::{
    NodeEvent, NodeWatch, Registrar, Registration, RegistrationState,
};
use tessera_reconciler::driver::sim::SimDriver;
use tessera_reconciler::driver::{GpuRef, NodeDriver};

fn keys() -> Keys {
    Keys::new("test").unwrap()
}

/// The quickstart fleet in the sim driver, with MIG on `train-0`'s GPU 0 and one 3g.40gb
/// instance made, so that the registration has MIG geometry to carry.
fn sim(dir: &Path) -> SimDriver {
    let nodes = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/nodes/quickstart.yaml");
    let mut sim = SimDriver::open(&nodes, &dir.join("sim.json")).unwrap();
    let gpu = GpuRef {
        node: "train-0".to_string(),
        index: 0,
    };
    sim.set_mig_mode(&gpu, true).unwrap();
    sim.reset_gpu(&gpu).unwrap();
    // Profile 9 is 3g.40gb on an H100 80GB; placement 0.
    let gi = sim.create_gpu_instance(&gpu, 9, 0).unwrap();
    sim.create_compute_instance(&gpu, gi).unwrap();
    sim
}

#[test]
fn a_registration_is_the_node_as_the_driver_observes_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut sim = sim(dir.path());
    let (registration, observation) = Registration::observe(&mut sim, "train-0").unwrap();
    assert_eq!(registration.node.name, "train-0");
    assert_eq!(registration.node.pool, "h100-train");
    assert_eq!(registration.driver, "sim");
    assert_eq!(registration.node.gpus.len(), 8);
    let gpu0 = &registration.node.gpus[0];
    assert!(gpu0.mig.enabled, "MIG mode as observed");
    assert_eq!(gpu0.instances.len(), 1, "the instance made is registered");
    assert_eq!(observation.details.len(), 8);
    assert!(observation.details.iter().all(|d| d.gpu.node == "train-0"));
    assert_eq!(observation.details[0].instances.len(), 1);

    match Registration::observe(&mut sim, "gpu-9") {
        Err(FleetError::NodeNotObserved { node, observed }) => {
            assert_eq!(node, "gpu-9");
            assert!(observed.contains("train-0"), "{observed}");
        }
        other => panic!("an unknown node is an error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_expires_with_its_lease_and_the_watch_sees_not_ready() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let (registration, _) = Registration::observe(&mut sim(dir.path()), "train-0").unwrap();

    let (known, mut watch) = NodeWatch::start(&client, &keys()).await.unwrap();
    assert!(known.is_empty());
    let registrar = Registrar::start(&client, &keys(), &registration, TTL_SECS)
        .await
        .unwrap();
    let event = within(two_lease_periods(), "the watch sees the node", watch.next())
        .await
        .unwrap();
    assert_eq!(
        event,
        Some(NodeEvent::Ready(Box::new(registration.clone())))
    );

    // A watch started now reads it back whole.
    let (known, _) = NodeWatch::start(&client, &keys()).await.unwrap();
    assert_eq!(known.get("train-0"), Some(&registration));

    registrar.stop_renewing();
    let event = within(two_lease_periods(), "the node goes NotReady", watch.next())
        .await
        .unwrap();
    assert_eq!(
        event,
        Some(NodeEvent::NotReady {
            node: "train-0".to_string()
        })
    );
    let mut reader = client.clone();
    let key = keys().registration("train-0").unwrap();
    assert!(
        reader.get(key, None).await.unwrap().kvs().is_empty(),
        "the key is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_lease_was_lost_registers_again() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let (registration, _) = Registration::observe(&mut sim(dir.path()), "train-0").unwrap();
    let mut registrar = Registrar::start(&client, &keys(), &registration, TTL_SECS)
        .await
        .unwrap();
    let RegistrationState::Registered { lease: first } = registrar.state() else {
        panic!("registered at start");
    };
    let (_, mut watch) = NodeWatch::start(&client, &keys()).await.unwrap();

    // The lease is lost under the agent (as after a pause longer than the TTL).
    let mut admin = client.clone();
    admin.lease_revoke(first).await.unwrap();
    let event = within(two_lease_periods(), "NotReady", watch.next())
        .await
        .unwrap();
    assert!(
        matches!(event, Some(NodeEvent::NotReady { .. })),
        "{event:?}"
    );

    let again = within(
        two_lease_periods(),
        "the agent registers again",
        registrar
            .wait_for(|s| matches!(s, RegistrationState::Registered { lease } if *lease != first)),
    )
    .await;
    assert!(matches!(again, RegistrationState::Registered { .. }));
    let event = within(two_lease_periods(), "Ready again", watch.next())
        .await
        .unwrap();
    assert_eq!(event, Some(NodeEvent::Ready(Box::new(registration))));

    registrar.deregister().await.unwrap();
    let event = within(two_lease_periods(), "NotReady on leaving", watch.next())
        .await
        .unwrap();
    assert!(
        matches!(event, Some(NodeEvent::NotReady { .. })),
        "{event:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_registers_again_after_etcd_was_away_past_its_lease() {
    let mut etcd = etcd();
    let client = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let (registration, _) = Registration::observe(&mut sim(dir.path()), "train-0").unwrap();
    let mut registrar = Registrar::start(&client, &keys(), &registration, TTL_SECS)
        .await
        .unwrap();
    let RegistrationState::Registered { lease: first } = registrar.state() else {
        panic!("registered at start");
    };

    // etcd goes away: unrenewed, the agent counts its lease lost at its local deadline.
    etcd.kill();
    let lost = within(
        two_lease_periods(),
        "the agent notices its lease may be gone",
        registrar.wait_for(|s| *s == RegistrationState::Lost),
    )
    .await;
    assert_eq!(lost, RegistrationState::Lost);

    // etcd comes back with its data: the agent registers again, on a new lease.
    etcd.restart().unwrap_or_else(|e| panic!("{e}"));
    let again = within(
        4 * two_lease_periods(),
        "the agent registers again once etcd is back",
        registrar
            .wait_for(|s| matches!(s, RegistrationState::Registered { lease } if *lease != first)),
    )
    .await;
    let RegistrationState::Registered { lease } = again else {
        unreachable!("waited for Registered")
    };
    let mut reader = client.clone();
    let key = keys().registration("train-0").unwrap();
    let stored = reader.get(key, None).await.unwrap();
    let kv = &stored.kvs()[0];
    assert_eq!(kv.lease(), lease, "the registration is on the new lease");
    let back: Registration = serde_json::from_slice(kv.value()).unwrap();
    assert_eq!(back, registration);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_registration_is_an_error_and_the_watch_goes_on() {
    let etcd = etcd();
    let client = connect(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let (registration, _) = Registration::observe(&mut sim(dir.path()), "train-0").unwrap();
    let (_, mut watch) = NodeWatch::start(&client, &keys()).await.unwrap();

    // Both in one transaction, so that the watch delivers them in one answer.
    let bad = keys().registration("bad").unwrap();
    let good = keys().registration("train-0").unwrap();
    let mut writer = client.clone();
    writer
        .txn(etcd_client::Txn::new().and_then([
            etcd_client::TxnOp::put(bad.as_str(), "not json", None),
            etcd_client::TxnOp::put(
                good.as_str(),
                serde_json::to_vec(&registration).unwrap(),
                None,
            ),
        ]))
        .await
        .unwrap();
    match within(two_lease_periods(), "the bad one", watch.next()).await {
        Err(FleetError::Decode { key, .. }) => assert_eq!(key, bad),
        other => panic!("expected a decode error naming {bad}, got {other:?}"),
    }
    let event = within(two_lease_periods(), "the good one", watch.next())
        .await
        .unwrap();
    assert_eq!(event, Some(NodeEvent::Ready(Box::new(registration))));
}
