//! `tessera-fleet reconcile` replicas as real processes on a real etcd, following a real Git
//! repository with the `sim` driver: one leads and the other stands by, serving reads and
//! answering a write with where the leader is; a workload submitted to the leader runs; the
//! leader SIGKILLed, the standby leads and finds the workload as it was, started once; a leader
//! paused past its lease stops leading when it resumes and stands by.
//!
//! Both replicas share one state directory: it stands for the nodes (the sim driver keeps the
//! GPUs' state there), which outlive any control-plane replica. A standby touches none of it.
//! Every wait is bounded by a deadline that guards against a hang, never asserts on time.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::eventually;
use tessera_fleet::keys::Keys;
use tessera_fleet::store::{EtcdStore, StoreRuntime};
use tessera_fleet::testing::TestEtcd;
use tessera_reconciler::store::StateStore;

const ADMIN: &str = "admin-token-0123456789abcdef";
const PRODUCT: &str = "product-token-0123456789abcdef";
const CLUSTER: &str = "replicas";
/// The leader's lease period (`--lease-ttl`).
const LEASE: Duration = Duration::from_secs(2);

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/reconcile")
        .join(name)
}

fn policy_repo() -> tempfile::TempDir {
    support::policy_repo(&data("policy"))
}

/// A replica on the simulated nodes of `tests/reconcile.rs`, run by its own driver.
struct Replica(support::Replica);

impl std::ops::Deref for Replica {
    type Target = support::Replica;
    fn deref(&self) -> &support::Replica {
        &self.0
    }
}

impl std::ops::DerefMut for Replica {
    fn deref_mut(&mut self) -> &mut support::Replica {
        &mut self.0
    }
}

impl Replica {
    fn start(etcd: &TestEtcd, repo: &Path, work: &Path, id: &str) -> Replica {
        let nodes = data("nodes.yaml");
        let lease = format!("{}s", LEASE.as_secs());
        Replica(support::Replica::spawn(
            etcd,
            repo,
            work,
            id,
            &[
                "--cluster",
                CLUSTER,
                "--lease-ttl",
                &lease,
                "--driver",
                "sim",
                "--fleet-nodes",
                "local",
                "--nodes",
                nodes.to_str().unwrap(),
                "--runtime",
                "none",
                "--insecure-runtime",
            ],
        ))
    }

    fn workload(&self, name: &str) -> Value {
        self.call("GET", &format!("/v1/workloads/{name}"), ADMIN, None)
            .1
    }
}

/// The events of kind `kind` about workload `name`, read from etcd directly.
fn events(etcd: &TestEtcd, name: &str, kind: &str) -> usize {
    let runtime = StoreRuntime::new().unwrap();
    let endpoint = etcd.endpoint();
    let client = runtime
        .block_on(etcd_client::Client::connect([endpoint], None))
        .unwrap();
    let store = EtcdStore::reader(runtime, client, Keys::new(CLUSTER).unwrap());
    store
        .events(0, 10_000)
        .unwrap()
        .iter()
        .filter(|e| e.kind == kind && e.workload.as_deref() == Some(name))
        .count()
}

#[test]
fn a_standby_serves_reads_names_the_leader_and_takes_over_a_running_workload() {
    let etcd = TestEtcd::start().unwrap_or_else(|e| panic!("{e}"));
    let repo = policy_repo();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        work.path().join("tokens.yaml"),
        format!("admin: {ADMIN}\ntenants:\n  product: {PRODUCT}\n"),
    )
    .unwrap();

    let mut first = Replica::start(&etcd, repo.path(), work.path(), "first");
    first.await_line("tessera-fleet reconcile: leading (term ");
    let second = Replica::start(&etcd, repo.path(), work.path(), "second");
    second.await_line("tessera-fleet reconcile: standing by");

    // A write to the standby is refused, naming the leader; nothing of it is kept.
    let job = json!({
        "tenant": "product",
        "sloClass": "training",
        "pool": "train",
        "gpu": {"count": 1},
        "command": ["sleep", "1000"],
    });
    let (status, body) = second.call(
        "POST",
        "/v1/workloads",
        PRODUCT,
        Some(json!({"name": "refused", "spec": job})),
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["leader"], json!(first.base), "{body}");
    assert!(body["error"].as_str().unwrap().contains("first"), "{body}");

    // Submitted to the leader, it runs; the standby reads it from etcd.
    let (status, body) = first.call(
        "POST",
        "/v1/workloads",
        PRODUCT,
        Some(json!({"name": "train", "spec": job})),
    );
    assert_eq!(status, 201, "{body}");
    eventually("train running", || {
        (first.workload("train")["phase"] == "running").then_some(())
    });
    let before = second.workload("train");
    assert_eq!(before["phase"], "running", "{before}");
    let (status, refused) = second.call("GET", "/v1/workloads/refused", ADMIN, None);
    assert_eq!(status, 404, "the refused write left nothing: {refused}");
    let standing = second.call("GET", "/status", ADMIN, None).1;
    assert!(
        standing["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("stands by")),
        "{standing}"
    );
    assert_eq!(events(&etcd, "train", "running"), 1);

    // The leader dies without resigning: the standby leads once its lease expires.
    first.sigkill();
    let killed = Instant::now();
    second.await_line("tessera-fleet reconcile: leading (term ");
    eprintln!(
        "failover: {:.1} s after SIGKILL (lease period {} s)",
        killed.elapsed().as_secs_f64(),
        LEASE.as_secs()
    );
    // Several cycles of the new leader later, the workload runs as it did, started once.
    eventually("three cycles of the new leader", || {
        let status = second.call("GET", "/status", ADMIN, None).1;
        (status["cycles"].as_u64() >= Some(3)).then_some(())
    });
    let after = second.workload("train");
    assert_eq!(after["phase"], "running", "{after}");
    assert_eq!(after["started"], before["started"], "{after}");
    assert_eq!(after["attempts"], before["attempts"], "{after}");
    assert_eq!(events(&etcd, "train", "running"), 1, "no second start");
    // The new leader takes writes.
    let (status, body) = second.call(
        "POST",
        "/v1/workloads",
        PRODUCT,
        Some(json!({"name": "second", "spec": job})),
    );
    assert_eq!(status, 201, "{body}");
}

#[test]
fn a_leader_paused_past_its_lease_stands_by_when_it_resumes() {
    use nix::sys::signal::Signal;
    let etcd = TestEtcd::start().unwrap_or_else(|e| panic!("{e}"));
    let repo = policy_repo();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        work.path().join("tokens.yaml"),
        format!("admin: {ADMIN}\ntenants:\n  product: {PRODUCT}\n"),
    )
    .unwrap();
    let first = Replica::start(&etcd, repo.path(), work.path(), "first");
    first.await_line("tessera-fleet reconcile: leading (term ");
    let second = Replica::start(&etcd, repo.path(), work.path(), "second");
    second.await_line("tessera-fleet reconcile: standing by");

    // Paused, the leader stops renewing its lease; etcd expires it and the standby leads.
    first.signal(Signal::SIGSTOP);
    second.await_line("tessera-fleet reconcile: leading (term ");
    first.signal(Signal::SIGCONT);
    // Resumed, it finds its term over, stops its service and stands by.
    first.await_line("tessera-fleet reconcile: standing by");
    let (status, body) = first.call("POST", "/v1/reconcile", ADMIN, Some(json!({})));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["leader"], json!(second.base), "{body}");
    let (status, body) = second.call("POST", "/v1/reconcile", ADMIN, Some(json!({})));
    assert!(status < 300, "the new leader takes writes: {status} {body}");
}
