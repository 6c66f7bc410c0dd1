//! What the process tests share: `tessera-fleet agent` and `tessera-fleet reconcile` as
//! child processes (killed on drop), a policy repository, free loopback ports, bounded waits.
//! Each test file uses what it needs.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use git2::{Repository, RepositoryInitOptions, Signature};
use serde_json::Value;
use tessera_fleet::keys::Keys;
use tessera_fleet::protocol::{self, Observed, RunState};
use tessera_fleet::store::{EtcdStore, StoreRuntime};
use tessera_fleet::testing::TestEtcd;
use tessera_reconciler::store::StateStore;

/// The tokens the process tests' services are given (`tokens.yaml` in their data).
pub const ADMIN: &str = "admin-token-0123456789abcdef";
pub const PRODUCT: &str = "product-token-0123456789abcdef";

/// A file of `tests/data/agents`, the fleet tests' policy, nodes and tokens.
pub fn agents_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/agents")
        .join(name)
}

/// Every wait is bounded by this: a guard against a hang, never a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// A loopback port no one listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` until it answers, at most [`PATIENCE`].
pub fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A Git repository with the files of `from` under `policy/`, on `main`.
pub fn policy_repo(from: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init_opts(
        dir.path(),
        RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("policy")).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(
            &path,
            dir.path().join("policy").join(path.file_name().unwrap()),
        )
        .unwrap();
    }
    let mut index = repo.index().unwrap();
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = Signature::now("Policy Author", "author@example.invalid").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "policy", &tree, &[])
        .unwrap();
    dir
}

/// One `tessera-fleet agent` process on a simulated node; killed on drop (its workloads'
/// processes are not: they outlive the agent, as on a real node).
pub struct Agent {
    pub child: Child,
    pub log: PathBuf,
}

impl Agent {
    /// `tessera-fleet agent --node NODE` of cluster `cluster`, its node described in
    /// `nodes_file`, its state in `state`, its log appended to `log`, with `extra` flags.
    pub fn spawn(
        etcd: &TestEtcd,
        cluster: &str,
        node: &str,
        nodes_file: &Path,
        state: &Path,
        log: &Path,
        extra: &[&str],
    ) -> Agent {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tessera-fleet"))
            .args(["agent", "--node", node, "--etcd", &etcd.endpoint()])
            .args(["--cluster", cluster, "--driver", "sim", "--lease-ttl", "2s"])
            .arg("--node-file")
            .arg(nodes_file)
            .arg("--state-dir")
            .arg(state)
            .args(extra)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("tessera-fleet runs");
        Agent {
            child,
            log: log.to_path_buf(),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits for the process to exit by itself; its exit code.
    pub fn exit_code(&mut self) -> i32 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.sigkill();
    }
}

/// One `tessera-fleet reconcile` process; killed on drop. Its stdout lines arrive on `lines`.
pub struct Replica {
    pub child: Child,
    pub base: String,
    pub lines: Receiver<String>,
}

impl Replica {
    /// `tessera-fleet reconcile` on `etcd` following `repo`'s `main` under `policy/`, with
    /// its state in `work/state`, the tokens of `work/tokens.yaml`, and `extra` flags.
    pub fn spawn(etcd: &TestEtcd, repo: &Path, work: &Path, id: &str, extra: &[&str]) -> Replica {
        let port = free_port();
        let mut child = Replica::command(etcd, repo, work, id, port)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("tessera-fleet runs");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Replica {
            child,
            base: format!("http://127.0.0.1:{port}"),
            lines,
        }
    }

    /// The command line of [`Replica::spawn`] listening on `port`, before its `extra` flags.
    pub fn command(etcd: &TestEtcd, repo: &Path, work: &Path, id: &str, port: u16) -> Command {
        let endpoint = etcd.endpoint();
        let member = endpoint.strip_prefix("http://").unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_tessera-fleet"));
        command
            .arg("reconcile")
            .args(["--store", &format!("etcd://{member}")])
            .args(["--replica-id", id])
            .arg("--repo")
            .arg(repo)
            .args(["--branch", "main", "--path", "policy"])
            .arg("--state-dir")
            .arg(work.join("state"))
            .arg("--tokens")
            .arg(work.join("tokens.yaml"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--cycle-period", "1s", "--fetch-interval", "1s"])
            .env("NO_COLOR", "1");
        command
    }

    /// Waits for a stdout line starting with `prefix`.
    pub fn await_line(&self, prefix: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line `{prefix}…` from the replica: {e}"),
            }
        }
    }

    /// A GET, or a POST of `body`, with `token`; the status and the JSON answer.
    pub fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        self.try_call(method, path, token, body)
            .expect("the replica answers")
    }

    /// [`Replica::call`] with extra request headers.
    pub fn call_with(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        self.try_call_with(method, path, token, body, headers)
            .expect("the replica answers")
    }

    /// [`Replica::call`], `None` where the replica does not answer (it is gone).
    pub fn try_call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> Option<(u16, Value)> {
        self.try_call_with(method, path, token, body, &[])
    }

    fn try_call_with(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Option<(u16, Value)> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .into();
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {token}");
        let response = match body {
            Some(body) => {
                let mut request = agent.post(&url).header("Authorization", &auth);
                for (name, value) in headers {
                    request = request.header(*name, *value);
                }
                request
                    .content_type("application/json")
                    .send(body.to_string())
            }
            None if method == "GET" => agent.get(&url).header("Authorization", &auth).call(),
            None => panic!("{method} without a body"),
        };
        let mut response = response.ok()?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        Some((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    pub fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.sigkill();
    }
}

/// etcd as a test reads it: the agents' `observed` and the service's events.
pub struct FleetEtcd {
    pub runtime: std::sync::Arc<StoreRuntime>,
    pub client: etcd_client::Client,
    pub keys: Keys,
}

impl FleetEtcd {
    pub fn connect(etcd: &TestEtcd, cluster: &str) -> FleetEtcd {
        let runtime = StoreRuntime::new().unwrap();
        let client = runtime
            .block_on(etcd_client::Client::connect([etcd.endpoint()], None))
            .unwrap();
        FleetEtcd {
            runtime,
            client,
            keys: Keys::new(cluster).unwrap(),
        }
    }

    /// What `node`'s agent last reported; `None` where it reported nothing or etcd is away.
    pub fn observed(&self, node: &str) -> Option<Observed> {
        let key = self.keys.observed(node).unwrap();
        let mut client = self.client.clone();
        let answer = self.runtime.block_on(client.get(key.as_str(), None)).ok()?;
        let kv = answer.kvs().first()?;
        Some(protocol::decode(kv.value()).unwrap())
    }

    /// The replicas of `workload` (`tenant/name`) each of `nodes` reports running:
    /// node → (attempt, pid).
    pub fn running(
        &self,
        workload: &str,
        nodes: &[&str],
    ) -> BTreeMap<String, Vec<(u32, Option<u32>)>> {
        let mut out = BTreeMap::new();
        for &node in nodes {
            let Some(observed) = self.observed(node) else {
                continue;
            };
            let running: Vec<(u32, Option<u32>)> = observed
                .workloads
                .iter()
                .filter(|w| w.workload == workload && w.state == RunState::Running)
                .map(|w| (w.attempt, w.pid))
                .collect();
            if !running.is_empty() {
                out.insert(node.to_string(), running);
            }
        }
        out
    }

    /// How many events of `kind` workload `name` has.
    pub fn events(&self, name: &str, kind: &str) -> usize {
        let store = EtcdStore::reader(self.runtime.clone(), self.client.clone(), self.keys.clone());
        store
            .events(0, 10_000)
            .unwrap()
            .iter()
            .filter(|e| e.kind == kind && e.workload.as_deref() == Some(name))
            .count()
    }
}

/// Whether process `pid` is gone (or a zombie no one has reaped yet).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// The messages of a `/status` answer's conditions.
pub fn conditions(status: &Value) -> Vec<String> {
    status["conditions"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c["message"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
