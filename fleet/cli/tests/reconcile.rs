//! `tessera-fleet reconcile` replicas as real processes on a real etcd, following a real Git
//! repository with the `sim` driver: one leads and the other stands by, serving reads and
//! forwarding writes to the leader (which authorizes the caller), or answering with where the
//! leader is a write forwarded to it already, and showing the leader's status in its own; a
//! workload submitted through the standby runs; the
//! leader SIGKILLed, the standby leads and finds the workload as it was, started once; a leader
//! paused past its lease stops leading when it resumes and stands by.
//!
//! Both replicas share one state directory: it stands for the nodes (the sim driver keeps the
//! GPUs' state there), which outlive any control-plane replica. A standby touches none of it.
//! Every wait is bounded by a deadline that guards against a hang, never asserts on time.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{ADMIN, PRODUCT, eventually};
use tessera_fleet::keys::Keys;
use tessera_fleet::store::{EtcdStore, StoreRuntime};
use tessera_fleet::testing::TestEtcd;
use tessera_reconciler::store::StateStore;

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

/// The flags of every replica here: the simulated nodes of `tests/reconcile.rs`, run by the
/// replica's own driver.
fn flags() -> Vec<String> {
    let nodes = data("nodes.yaml");
    [
        "--cluster",
        CLUSTER,
        "--lease-ttl",
        &format!("{}s", LEASE.as_secs()),
        "--driver",
        "sim",
        "--fleet-nodes",
        "local",
        "--nodes",
        nodes.to_str().unwrap(),
        "--runtime",
        "none",
        "--insecure-runtime",
    ]
    .map(str::to_owned)
    .to_vec()
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
        Replica::start_with(etcd, repo, work, id, &[])
    }

    /// `start` with further flags.
    fn start_with(etcd: &TestEtcd, repo: &Path, work: &Path, id: &str, extra: &[&str]) -> Replica {
        let flags = [flags(), extra.iter().map(|s| s.to_string()).collect()].concat();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Replica(support::Replica::spawn(etcd, repo, work, id, &flags))
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
fn a_standby_serves_reads_forwards_writes_and_takes_over_a_running_workload() {
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

    let job = json!({
        "tenant": "product",
        "sloClass": "training",
        "pool": "train",
        "gpu": {"count": 1},
        "command": ["sleep", "1000"],
    });
    // Submissions wait for the leader's first revision in force (503 until then).
    eventually("the leader's first revision", || {
        let (_, status) = first.call("GET", "/status", ADMIN, None);
        status["revision"].as_str().map(|_| ())
    });
    // A write sent to the standby is forwarded: the leader creates it, once.
    let (status, body) = second.call(
        "POST",
        "/v1/workloads",
        PRODUCT,
        Some(json!({"name": "train", "spec": job})),
    );
    assert_eq!(status, 201, "{body}");
    let (status, listed) = first.call("GET", "/v1/workloads", ADMIN, None);
    assert_eq!(status, 200, "{listed}");
    let named_train = listed["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["name"] == "train")
        .count();
    assert_eq!(named_train, 1, "{listed}");
    // The leader, not the standby, judges the caller's token.
    let (status, body) = second.call(
        "POST",
        "/v1/workloads",
        "not-a-token-of-anyone",
        Some(json!({"name": "intruder", "spec": job})),
    );
    assert_eq!(status, 401, "{body}");
    // A write another replica forwarded already is not forwarded again: 503 naming the leader.
    let (status, body) = second.call_with(
        "POST",
        "/v1/workloads",
        PRODUCT,
        Some(json!({"name": "refused", "spec": job})),
        &[("x-tessera-forwarded-by", "third")],
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["leader"], json!(first.base), "{body}");
    assert!(body["error"].as_str().unwrap().contains("first"), "{body}");

    eventually("train running", || {
        (first.workload("train")["phase"] == "running").then_some(())
    });
    let before = second.workload("train");
    assert_eq!(before["phase"], "running", "{before}");
    for name in ["refused", "intruder"] {
        let (status, left) = second.call("GET", &format!("/v1/workloads/{name}"), ADMIN, None);
        assert_eq!(status, 404, "the refused write left nothing: {left}");
    }
    let standing = second.call("GET", "/status", ADMIN, None).1;
    assert!(
        standing["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("stands by")),
        "{standing}"
    );
    // The standby's /status carries the leader's, with the cycles only the leader runs.
    assert_eq!(standing["cycles"], 0, "{standing}");
    assert!(
        standing["leaderStatus"]["cycles"].as_u64() >= Some(1),
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
    let (status, body) = second.call("POST", "/v1/reconcile", ADMIN, Some(json!({})));
    assert!(status < 300, "the new leader takes writes: {status} {body}");
    // The old leader, standing by, forwards them to the new one.
    let (status, body) = first.call("POST", "/v1/reconcile", ADMIN, Some(json!({})));
    assert!(status < 300, "forwarded to the new leader: {status} {body}");
}

/// Runs `tessera-fleet ARGS` to its end: its exit code, stdout and stderr.
fn fleet(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tessera-fleet"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("tessera-fleet runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A replica listening on every address refuses to start without the URL the others reach it
/// at, before it touches etcd or the state directory.
#[test]
fn a_replica_listening_on_every_address_asks_for_advertise() {
    let work = tempfile::tempdir().unwrap();
    let state = work.path().join("state");
    let port = support::free_port().to_string();
    let etcd = format!("etcd://127.0.0.1:{port}");
    let (code, _, stderr) = fleet(&[
        "reconcile",
        "--repo",
        "policy",
        "--store",
        &etcd,
        "--state-dir",
        state.to_str().unwrap(),
        "--listen",
        "0.0.0.0:8080",
    ]);
    assert_ne!(code, 0);
    assert!(stderr.contains("--advertise http://HOST:8080"), "{stderr}");
    assert!(!state.exists(), "nothing was prepared");
}

/// A put and a delete as `client` makes them, `Err` with etcd's status code where refused.
fn write_as(client: &etcd_client::Client, key: &str) -> Result<(), tonic::Code> {
    let runtime = StoreRuntime::new().unwrap();
    let code = |e: etcd_client::Error| match e {
        etcd_client::Error::GRpcStatus(status) => status.code(),
        other => panic!("expected a refusal from etcd, got {other}"),
    };
    let mut client = client.clone();
    runtime.block_on(async {
        client.put(key, "x", None).await.map_err(code)?;
        client.delete(key, None).await.map_err(code)?;
        Ok(())
    })
}

#[test]
fn with_access_control_on_a_replica_works_as_its_own_user_and_an_agents_user_cannot_touch_its_state()
 {
    let etcd = TestEtcd::start().unwrap_or_else(|e| panic!("{e}"));
    let repo = policy_repo();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        work.path().join("tokens.yaml"),
        format!("admin: {ADMIN}\ntenants:\n  product: {PRODUCT}\n"),
    )
    .unwrap();
    let secret = |name: &str, password: &str| {
        let path = work.path().join(name);
        std::fs::write(&path, format!("{password}\n")).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (root, control, node, wrong) = (
        secret("root", "root-secret"),
        secret("control", "control-secret"),
        secret("node", "node-secret"),
        secret("wrong", "not-the-control-secret"),
    );
    let url = etcd.endpoint();

    // Access control on, and the users made, by `tessera-fleet access` (no etcdctl).
    let (code, _, err) = fleet(&[
        "access",
        "enable",
        "--etcd",
        &url,
        "--root-password-file",
        &root,
    ]);
    assert_eq!(code, 0, "{err}");
    let admin = [
        "--etcd",
        &url,
        "--cluster",
        CLUSTER,
        "--root-password-file",
        &root,
    ];
    let (code, out, err) = fleet(
        &[
            &["access", "control-plane"][..],
            &admin,
            &["--password-file", &control],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{err}");
    let control_user = format!("tessera.{CLUSTER}.control");
    assert!(out.contains(&control_user), "{out}");
    let (code, out, err) = fleet(
        &[
            &["access", "node", "t0"][..],
            &admin,
            &["--password-file", &node],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{err}");
    let node_user = format!("tessera.{CLUSTER}.node.t0");
    assert!(out.contains(&node_user), "{out}");

    // A wrong password: one clear error naming the user, exit 2, before anything runs.
    let flags = flags();
    let output = support::Replica::command(
        &etcd,
        repo.path(),
        work.path(),
        "wrong",
        support::free_port(),
    )
    .args(&flags)
    .args(["--etcd-user", &control_user, "--etcd-password-file", &wrong])
    .output()
    .expect("tessera-fleet runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains(&format!(
            "refused user {control_user}: wrong user name or password"
        )),
        "{stderr}"
    );
    assert!(
        !stderr.contains("not-the-control-secret"),
        "the password is never printed"
    );

    // With its own user the replica leads and runs a workload.
    let replica = Replica::start_with(
        &etcd,
        repo.path(),
        work.path(),
        "first",
        &[
            "--etcd-user",
            &control_user,
            "--etcd-password-file",
            &control,
        ],
    );
    replica.await_line("tessera-fleet reconcile: leading (term ");
    let job = json!({
        "tenant": "product",
        "sloClass": "training",
        "pool": "train",
        "gpu": {"count": 1},
        "command": ["sleep", "1000"],
    });
    // Submissions wait for its first revision in force (503 until then).
    let (status, body) = eventually("the policy in force", || {
        let answer = replica.call(
            "POST",
            "/v1/workloads",
            PRODUCT,
            Some(json!({"name": "train", "spec": job})),
        );
        (answer.0 != 503).then_some(answer)
    });
    assert_eq!(status, 201, "{body}");
    eventually("train running", || {
        (replica.workload("train")["phase"] == "running").then_some(())
    });

    // The agent's user of node t0 cannot change the control plane's state (the workloads,
    // the policy's revisions), the leader key or another node's keys.
    let runtime = StoreRuntime::new().unwrap();
    let as_node = runtime
        .block_on(tessera_fleet::access::connect(
            std::slice::from_ref(&url),
            Some(&tessera_fleet::access::Credentials {
                user: node_user.clone(),
                password: "node-secret".into(),
            }),
        ))
        .unwrap();
    let keys = Keys::new(CLUSTER).unwrap();
    let as_control = runtime
        .block_on(tessera_fleet::access::connect(
            std::slice::from_ref(&url),
            Some(&tessera_fleet::access::Credentials {
                user: control_user.clone(),
                password: "control-secret".into(),
            }),
        ))
        .unwrap();
    let state = runtime
        .block_on(
            as_control.clone().get(
                keys.state_prefix(),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only(),
                ),
            ),
        )
        .unwrap();
    let mut targets: Vec<String> = state
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect();
    assert!(
        targets.iter().any(|k| k.contains("train")),
        "the workload is in the control plane's state: {targets:?}"
    );
    targets.extend([
        keys.leader(),
        keys.action("t1", 1).unwrap(),
        keys.bound("t0").unwrap(),
    ]);
    for key in targets {
        assert_eq!(
            write_as(&as_node, &key),
            Err(tonic::Code::PermissionDenied),
            "node t0's user writing {key}"
        );
    }
    assert_eq!(write_as(&as_node, &keys.observed("t0").unwrap()), Ok(()));
    // And the workload the control plane keeps is as it was.
    assert_eq!(replica.workload("train")["phase"], "running");
}
