//! etcd's access control with per-node users, against a real etcd with auth enabled: an agent
//! writes its own node's keys and nothing else.

mod support;

use etcd_client::{Client, GetOptions};
use support::{TTL_SECS, connect, connect_as, etcd, keys};
use tessera_fleet::FleetError;
use tessera_fleet::access::{self, Credentials};
use tessera_fleet::actions::ActionFeed;
use tessera_fleet::election::{Candidate, LeaderInfo, Write};
use tessera_fleet::registration::{Registrar, Registration};
use tessera_reconciler::driver::sim::SimDriver;

/// A put as an agent would make it, with its error sorted the way the crate sorts them.
async fn put(client: &Client, key: &str) -> Result<(), etcd_client::Error> {
    let mut client = client.clone();
    client.put(key, "x", None).await.map(|_| ())
}

fn assert_denied(result: Result<(), etcd_client::Error>, what: &str) {
    match result {
        Err(etcd_client::Error::GRpcStatus(status)) => assert_eq!(
            status.code(),
            tonic::Code::PermissionDenied,
            "{what}: {status:?}"
        ),
        other => panic!("{what} must be refused with permission denied, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_writes_its_own_keys_and_no_one_elses() {
    let etcd = etcd();
    let bootstrap = connect(&etcd).await;
    access::enable_auth(&bootstrap, "root-secret")
        .await
        .unwrap();
    let root = connect_as(
        &etcd,
        &Credentials {
            user: access::ROOT_USER.to_string(),
            password: "root-secret".to_string(),
        },
    )
    .await;
    let a_creds = access::provision_node(&root, &keys(), "node-a", "a-secret")
        .await
        .unwrap();
    access::provision_node(&root, &keys(), "node-b", "b-secret")
        .await
        .unwrap();
    let control = access::provision_control_plane(&root, &keys(), "cp-secret")
        .await
        .unwrap();
    // A wider grant than the agent's (an older provisioning's) is taken away when the node is
    // provisioned again.
    let prefix = keys().node_prefix("node-a").unwrap();
    root.clone()
        .role_grant_permission(
            access::node_user(&keys(), "node-a").unwrap(),
            etcd_client::Permission::read_write(prefix.as_str())
                .with_range_end(tessera_fleet::keys::prefix_end(&prefix)),
        )
        .await
        .unwrap();
    // Provisioning again (after a half-done run, or to rotate) succeeds and keeps one user.
    access::provision_node(&root, &keys(), "node-a", "a-secret")
        .await
        .unwrap();

    let a = connect_as(&etcd, &a_creds).await;
    let keys = keys();
    put(&a, &keys.observed("node-a").unwrap()).await.unwrap();
    put(&a, &keys.utilization("node-a").unwrap()).await.unwrap();
    assert_denied(
        put(&a, &keys.utilization("node-b").unwrap()).await,
        "node-a writing node-b's utilisation",
    );
    // Its actions and the workloads bound to it are the leader's to write, not its own.
    assert_denied(
        put(&a, &keys.action("node-a", 1).unwrap()).await,
        "node-a writing its own actions",
    );
    assert_denied(
        put(&a, &keys.bound("node-a").unwrap()).await,
        "node-a writing the workloads bound to it",
    );
    assert_denied(
        put(&a, &keys.registration("node-b").unwrap()).await,
        "node-a writing node-b's registration",
    );
    assert_denied(
        put(&a, &keys.action("node-b", 1).unwrap()).await,
        "node-a writing node-b's actions",
    );
    assert_denied(
        put(&a, &keys.state("policy")).await,
        "node-a writing the control plane's state",
    );
    assert_denied(
        put(&a, &keys.leader()).await,
        "node-a writing the leader key",
    );
    let mut reader = a.clone();
    let read_b = reader
        .get(
            keys.node_prefix("node-b").unwrap(),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .map(|_| ());
    assert_denied(read_b, "node-a reading node-b's keys");

    // The agent's own registration, on its lease, works under its credentials.
    let dir = tempfile::tempdir().unwrap();
    let nodes =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/nodes/quickstart.yaml");
    let mut sim = SimDriver::open(&nodes, &dir.path().join("sim.json")).unwrap();
    let (mut registration, _) = Registration::observe(&mut sim, "train-0").unwrap();
    registration.node.name = "node-a".to_string();
    let registrar = Registrar::start(&a, &keys, &registration, TTL_SECS)
        .await
        .unwrap();
    let mut other = registration.clone();
    other.node.name = "node-b".to_string();
    match Registrar::start(&a, &keys, &other, TTL_SECS).await {
        Err(FleetError::PermissionDenied { key, .. }) => {
            assert_eq!(key, keys.registration("node-b").unwrap())
        }
        Err(other) => panic!("expected permission denied, got {other}"),
        Ok(_) => panic!("node-a registered as node-b"),
    }

    // Its actions and journal, under its own prefix, work under its credentials; node-b's do not.
    let mut feed = ActionFeed::start(&a, &keys, "node-a").await.unwrap();
    feed.begin(1).await.unwrap();
    feed.finish(1, Ok(())).await.unwrap();
    match ActionFeed::start(&a, &keys, "node-b").await {
        Err(FleetError::PermissionDenied { .. }) => {}
        Err(other) => panic!("expected permission denied, got {other}"),
        Ok(_) => panic!("node-a read node-b's actions"),
    }

    // node-a cannot make itself leader; the control plane can, and writes state.
    let agent_candidate = Candidate::new(
        a.clone(),
        keys.clone(),
        LeaderInfo {
            id: "node-a".into(),
            advertise: None,
        },
        TTL_SECS,
    );
    match agent_candidate.campaign().await {
        Err(FleetError::PermissionDenied { .. }) => {}
        Err(other) => panic!("expected permission denied, got {other}"),
        Ok(_) => panic!("an agent became the leader"),
    }
    let cp = connect_as(&etcd, &control).await;
    let leadership = Candidate::new(
        cp.clone(),
        keys.clone(),
        LeaderInfo {
            id: "cp".into(),
            advertise: None,
        },
        TTL_SECS,
    )
    .campaign()
    .await
    .unwrap();
    leadership
        .write(
            &[],
            &[Write::Put {
                key: keys.action("node-a", 2).unwrap(),
                value: b"{}".to_vec(),
            }],
        )
        .await
        .unwrap();
    drop(registrar);

    // A revoked node cannot connect any more.
    access::revoke_node(&root, &keys, "node-a").await.unwrap();
    match access::connect(&[etcd.endpoint()], Some(&a_creds)).await {
        Err(FleetError::Unauthenticated {
            endpoints, user, ..
        }) => {
            assert_eq!(endpoints, etcd.endpoint());
            assert_eq!(user, a_creds.user);
        }
        Err(other) => panic!("expected a refused user, got {other}"),
        Ok(_) => panic!("a revoked node's user authenticated"),
    }
    // A wrong password is refused the same way, naming the user.
    let wrong = Credentials {
        user: control.user.clone(),
        password: "not-cp-secret".to_string(),
    };
    match access::connect(&[etcd.endpoint()], Some(&wrong)).await {
        Err(e @ FleetError::Unauthenticated { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&control.user) && text.contains("wrong user name or password"),
                "{text}"
            );
        }
        Err(other) => panic!("expected a refused user, got {other}"),
        Ok(_) => panic!("a wrong password authenticated"),
    }
    // The control plane's user is limited to its cluster's prefix.
    let mut cp_client = cp.clone();
    assert_denied(
        cp_client
            .put("/tessera/another-cluster/leader", "x", None)
            .await
            .map(|_| ()),
        "the control plane writing another cluster's keys",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_given_to_an_etcd_without_access_control_are_refused_clearly() {
    let etcd = etcd();
    let someone = Credentials {
        user: "someone".to_string(),
        password: "secret".to_string(),
    };
    match access::connect(&[etcd.endpoint()], Some(&someone)).await {
        Err(e @ FleetError::AuthDisabled { .. }) => {
            assert!(e.to_string().contains("access control off"), "{e}")
        }
        Err(other) => panic!("expected access control off, got {other}"),
        Ok(_) => panic!("a user was accepted by an etcd without access control"),
    }
}

#[test]
fn a_node_name_that_is_not_a_key_segment_gets_no_user() {
    match access::node_user(&keys(), "a/../b") {
        Err(FleetError::Name(e)) => assert_eq!(e.what, "node"),
        other => panic!("expected a name error, got {other:?}"),
    }
    assert_eq!(
        access::node_user(&keys(), "gpu-1").unwrap(),
        "tessera.test.node.gpu-1"
    );
}
