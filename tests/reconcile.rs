//! `tessera reconcile` end to end: the built binary, a real Git repository it follows, the
//! `sim` driver, real processes (shell scripts that checkpoint on SIGUSR1) and a real HTTP
//! client.
//!
//! Every wait polls with a generous deadline and never asserts on time: a slow machine makes
//! these tests slower, not red.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use git2::{Repository, RepositoryInitOptions};
use serde_json::{Value, json};

use common::eventually;

const ADMIN: &str = "admin-token-0123456789abcdef";
const PRODUCT: &str = "product-token-0123456789abcdef";
const RESEARCH: &str = "research-token-0123456789abcdef";

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/reconcile")
        .join(name)
}

/// The policy repository, on branch `main`.
struct PolicyRepo {
    dir: tempfile::TempDir,
    repo: Repository,
    ticks: i64,
}

impl PolicyRepo {
    fn new() -> PolicyRepo {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_opts(
            dir.path(),
            RepositoryInitOptions::new().initial_head("main"),
        )
        .unwrap();
        let r = PolicyRepo {
            dir,
            repo,
            ticks: 0,
        };
        for f in ["fleet.yaml", "tenants.yaml"] {
            let text = std::fs::read_to_string(data("policy").join(f)).unwrap();
            r.write(&format!("policy/{f}"), &text);
        }
        r
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, path: &str, text: &str) {
        let full = self.dir.path().join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, text).unwrap();
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(path)).unwrap()
    }

    fn commit(&mut self, message: &str) -> String {
        self.ticks += 1;
        common::commit_all(&self.repo, self.ticks, message)
    }
}

/// A running `tessera reconcile`.
struct Service {
    child: Child,
    base: String,
}

impl Service {
    /// Runs workloads unconfined (`--insecure-runtime`): these tests are about reconciling,
    /// and their workloads run scripts from `tests/data`, which a sandbox does not show.
    /// [`Service::start_confined`] runs them as the service does by default.
    fn start(repo: &Path, work: &Path, extra: &[&str]) -> Service {
        let mut extra = extra.to_vec();
        extra.push("--insecure-runtime");
        Service::start_confined(repo, work, &extra)
    }

    fn start_confined(repo: &Path, work: &Path, extra: &[&str]) -> Service {
        std::fs::write(
            work.join("tokens.yaml"),
            format!("admin: {ADMIN}\ntenants:\n  product: {PRODUCT}\n  research: {RESEARCH}\n"),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["reconcile", "--repo"])
            .arg(repo)
            .args([
                "--branch", "main", "--path", "policy", "--driver", "sim", "--nodes",
            ])
            .arg(data("nodes.yaml"))
            .arg("--db")
            .arg(work.join("tessera.db"))
            .arg("--state-dir")
            .arg(work.join("state"))
            .arg("--tokens")
            .arg(work.join("tokens.yaml"))
            .args(["--listen", "127.0.0.1:0"])
            .args(
                [("--cycle-period", "1s"), ("--fetch-interval", "1s")]
                    .into_iter()
                    .filter(|(flag, _)| !extra.contains(flag))
                    .flat_map(|(flag, value)| [flag, value]),
            )
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("tessera runs");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let base = loop {
            let line = lines
                .next()
                .expect("the service prints where it listens")
                .unwrap();
            if let Some(url) = line.strip_prefix("tessera reconcile: API listening on ") {
                break url.trim().to_string();
            }
        };
        // Keep draining stdout so the service never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Service { child, base }
    }

    /// Starts the service and waits until a revision is in force.
    fn ready(repo: &Path, work: &Path, extra: &[&str]) -> Service {
        let service = Service::start(repo, work, extra);
        eventually("a revision in force", || {
            service.status()["revision"].as_str().map(|_| ())
        });
        service
    }

    /// An HTTP client that reads error statuses as answers.
    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .into()
    }

    fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Value) {
        let agent = Service::agent();
        let url = format!("{}{path}", self.base);
        let auth = token.map(|t| format!("Bearer {t}"));
        let response = match method {
            "POST" => {
                let mut r = agent.post(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.content_type("application/json")
                    .send(body.unwrap_or("").to_string())
            }
            "DELETE" => {
                let mut r = agent.delete(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            _ => {
                let mut r = agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
        };
        let mut response = response.expect("the service answers");
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Whether a POST of `body` is refused as too large: a 413, or the connection reset while
    /// the body was still being written (the service answers before reading it).
    fn refuses_oversized(&self, path: &str, token: &str, body: &str) -> bool {
        let agent = Service::agent();
        match agent
            .post(&format!("{}{path}", self.base))
            .header("Authorization", &format!("Bearer {token}"))
            .content_type("application/json")
            .send(body.to_string())
        {
            Ok(response) => response.status().as_u16() == 413,
            Err(ureq::Error::Io(e)) => matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ),
            Err(_) => false,
        }
    }

    /// Waits until workload `name` is in phase `wanted`.
    fn await_phase(&self, token: &str, name: &str, wanted: &str) {
        eventually(&format!("{name} {wanted}"), || {
            (phase(&self.workload(token, name)) == wanted).then_some(())
        });
    }

    /// The status as the operator sees it.
    fn status(&self) -> Value {
        self.call("GET", "/status", Some(ADMIN), None).1
    }

    fn workload(&self, token: &str, name: &str) -> Value {
        self.call("GET", &format!("/v1/workloads/{name}"), Some(token), None)
            .1
    }

    fn submit(&self, token: &str, name: &str, spec: Value) -> (u16, Value) {
        let body = json!({ "name": name, "spec": spec }).to_string();
        self.call("POST", "/v1/workloads", Some(token), Some(&body))
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Stops the workload processes a test started: the service leaves them running when it stops
/// (a restarted control plane must not kill the fleet's work), so the test does.
fn stop_workloads(service: &Service) {
    let all = service.call("GET", "/v1/workloads", Some(ADMIN), None).1;
    for w in all["workloads"].as_array().into_iter().flatten() {
        for r in w["replicas"].as_array().into_iter().flatten() {
            if let Some(pid) = r["pid"].as_i64() {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// Writes a fault plan for the sim driver; returns its path as `--faults` takes it.
fn faults(work: &Path, plan: &str) -> String {
    let path = work.join("faults.yaml");
    std::fs::write(&path, plan).unwrap();
    path.display().to_string()
}

fn script(name: &str) -> Value {
    json!(["sh", data(name).display().to_string()])
}

/// An RFC 3339 instant of the API as Unix seconds.
fn unix(v: &Value) -> Option<i64> {
    v.as_str()
        .and_then(tessera_compiler::units::parse_rfc3339)
        .map(|t| t.as_second())
}

fn phase(v: &Value) -> &str {
    v["phase"].as_str().unwrap_or("")
}

fn instances(state: &Value, node: &str, gpu: u64) -> Vec<(String, u64)> {
    state["spec"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == node)
        .unwrap()["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["index"] == gpu)
        .unwrap()["instances"]
        .as_array()
        .map(|is| {
            is.iter()
                .map(|i| {
                    (
                        i["profile"].as_str().unwrap().to_string(),
                        i["start"].as_u64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn with_all_1g(repo: &PolicyRepo) -> String {
    let fleet = repo.read("policy/fleet.yaml");
    let fleet = fleet.replace("migLayouts: [halves]", "migLayouts: [halves, all-1g]");
    fleet
        + "---\napiVersion: tessera/v1alpha1\nkind: MigLayout\nmetadata: {name: all-1g}\n\
           spec:\n  gpuModel: H100-SXM5-80GB\n  instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, \
           1g.10gb, 1g.10gb, 1g.10gb]\n"
}

fn small_inference() -> Value {
    json!({
        "tenant": "product",
        "sloClass": "serving",
        "pool": "infer",
        "gpu": {"migProfile": "1g.10gb"},
        "command": script("serve.sh"),
    })
}

#[test]
fn a_policy_change_re_partitions_a_gpu_and_starts_the_waiting_workload() {
    let mut repo = PolicyRepo::new();
    let first = repo.commit("two pools, MIG halves");
    let work = tempfile::tempdir().unwrap();
    let service = Service::start(repo.path(), work.path(), &[]);
    eventually("the first revision in force", || {
        let s = service.status();
        (s["revision"] == first && s["health"] != "Degraded").then_some(())
    });

    let (code, body) = service.submit(PRODUCT, "chat-small", small_inference());
    assert_eq!(code, 201, "{body}");
    let pending = eventually("a cycle on the new workload", || {
        let w = service.workload(PRODUCT, "chat-small");
        (service.status()["cycles"].as_u64().unwrap_or(0) > 1).then_some(w)
    });
    assert_eq!(
        phase(&pending),
        "pending",
        "no layout of the pool has a 1g: {pending}"
    );

    repo.write("policy/fleet.yaml", &with_all_1g(&repo));
    let second = repo.commit("infer may also be cut in sevenths");
    let running = eventually("the workload running under the new revision", || {
        let w = service.workload(PRODUCT, "chat-small");
        (phase(&w) == "running").then_some(w)
    });
    // The store marks the workload running while the cycle is under way; `/status` names the
    // cycle's revision when the cycle ends.
    eventually("the status names the new revision", || {
        (service.status()["revision"] == second).then_some(())
    });
    let devices = running["replicas"][0]["devices"][0].as_str().unwrap();
    assert!(devices.starts_with("MIG-"), "{running}");

    let state = service.call("GET", "/state", Some(ADMIN), None).1;
    let layout = instances(&state, "i0", 0);
    assert!(
        layout.iter().all(|(p, _)| p == "1g.10gb") && layout.len() == 7,
        "{layout:?}"
    );
    // The process was given the instance the solver placed it on.
    let checkpoints = work.path().join("state/checkpoints/product/chat-small");
    let seen = eventually("the server wrote its devices", || {
        std::fs::read_to_string(checkpoints.join("devices-0")).ok()
    });
    assert_eq!(seen.trim(), devices);

    let metrics = service.call("GET", "/metrics", None, None).1;
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics.contains("tessera_reconfigurations_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tessera_pool_allocation_ratio{pool=\"infer\"}"),
        "{metrics}"
    );
    eventually("synced and healthy", || {
        let s = service.status();
        (s["sync"] == "Synced" && s["health"] == "Healthy").then_some(())
    });
    stop_workloads(&service);
    service.stop();
}

#[test]
fn an_inference_burst_preempts_training_which_checkpoints_and_resumes() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);

    let training = json!({
        "tenant": "research",
        "sloClass": "training",
        "pool": "train",
        "gpu": {"count": 2},
        "command": script("train.sh"),
    });
    assert_eq!(service.submit(RESEARCH, "pretrain", training).0, 201);
    service.await_phase(RESEARCH, "pretrain", "running");
    let checkpoints = work.path().join("state/checkpoints/research/pretrain");
    eventually("training has started work", || {
        std::fs::read_to_string(checkpoints.join("devices-0")).ok()
    });

    let burst = json!({
        "tenant": "product",
        "sloClass": "interactive",
        "pool": "train",
        "gpu": {"count": 2},
        "command": script("serve.sh"),
    });
    assert_eq!(service.submit(PRODUCT, "burst", burst).0, 201);
    service.await_phase(PRODUCT, "burst", "running");
    let requeued = service.workload(RESEARCH, "pretrain");
    assert_eq!(phase(&requeued), "pending", "{requeued}");
    assert_eq!(requeued["attempts"], 1, "{requeued}");
    let step = std::fs::read_to_string(checkpoints.join("step")).expect("a checkpoint was saved");

    let (code, _) = service.call("DELETE", "/v1/workloads/burst", Some(PRODUCT), None);
    assert_eq!(code, 200);
    service.await_phase(RESEARCH, "pretrain", "running");
    let resumed = eventually("training resumed from its checkpoint", || {
        std::fs::read_to_string(checkpoints.join("resumed")).ok()
    });
    assert_eq!(resumed.trim(), format!("resumed from {}", step.trim()));
    stop_workloads(&service);
    service.stop();
}

#[test]
fn a_broken_commit_degrades_the_service_and_the_next_good_one_recovers_it() {
    let mut repo = PolicyRepo::new();
    let good = repo.commit("good");
    let work = tempfile::tempdir().unwrap();
    let service = Service::start(repo.path(), work.path(), &[]);
    eventually("healthy", || {
        let s = service.status();
        (s["revision"] == good && s["health"] == "Healthy").then_some(())
    });

    let tenants = repo.read("policy/tenants.yaml");
    repo.write(
        "policy/tenants.yaml",
        &tenants.replace("guarantee: {train: 0}", "guarantee: {trian: 1}"),
    );
    let bad = repo.commit("a typo in a pool name");
    let status = eventually("degraded", || {
        let s = service.status();
        (s["health"] == "Degraded" && s["head"] == bad).then_some(s)
    });
    assert_eq!(
        status["revision"], good,
        "the last good revision stays in force"
    );
    assert_eq!(status["sync"], "OutOfSync");
    let diagnostics = status["diagnostics"].to_string();
    assert!(
        diagnostics.contains("policy/tenants.yaml:"),
        "{diagnostics}"
    );
    assert!(diagnostics.contains("trian"), "{diagnostics}");

    repo.write("policy/tenants.yaml", &tenants);
    let fixed = repo.commit("fix the typo");
    eventually("recovered", || {
        let s = service.status();
        (s["revision"] == fixed && s["health"] == "Healthy" && s["diagnostics"] == json!([]))
            .then_some(())
    });
    stop_workloads(&service);
    service.stop();
}

#[test]
fn tenants_cannot_see_or_touch_each_other_and_bad_requests_change_nothing() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    assert_eq!(
        service.submit(PRODUCT, "chat-small", small_inference()).0,
        201
    );

    // No token, a wrong token: 401.
    assert_eq!(service.call("GET", "/v1/workloads", None, None).0, 401);
    assert_eq!(
        service
            .call("GET", "/v1/workloads", Some("not-a-token-at-all"), None)
            .0,
        401
    );
    // Another tenant's workload does not exist for research, and cannot be cancelled.
    assert_eq!(
        service
            .call("GET", "/v1/workloads/chat-small", Some(RESEARCH), None)
            .0,
        404
    );
    assert_eq!(
        service
            .call("DELETE", "/v1/workloads/chat-small", Some(RESEARCH), None)
            .0,
        404
    );
    let listed = service.call("GET", "/v1/workloads", Some(RESEARCH), None).1;
    assert_eq!(listed["workloads"], json!([]));
    // Submitting in another tenant's name: 403.
    assert_eq!(service.submit(RESEARCH, "sneaky", small_inference()).0, 403);
    // Malformed, unknown fields, oversized, invalid: 4xx with a message.
    let (code, body) = service.call("POST", "/v1/workloads", Some(PRODUCT), Some("{not json"));
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("malformed"),
        "{body}"
    );
    let (code, _) = service.call(
        "POST",
        "/v1/workloads",
        Some(PRODUCT),
        Some(r#"{"name": "x", "spec": {"tenant": "product"}, "extra": 1}"#),
    );
    assert_eq!(code, 400);
    let huge = format!(
        r#"{{"name": "big", "spec": {{"tenant": "product", "padding": "{}"}}}}"#,
        "x".repeat(400 * 1024)
    );
    // The service answers 413 without reading the body and closes the connection, so a client
    // still writing may see the connection reset before it reads the answer: either is a
    // refusal, and the workload must not exist afterwards.
    assert!(
        service.refuses_oversized("/v1/workloads", PRODUCT, &huge),
        "a 400 KiB body is refused"
    );
    assert_eq!(
        service
            .call("GET", "/v1/workloads/big", Some(PRODUCT), None)
            .0,
        404
    );
    let mut wrong_class = small_inference();
    wrong_class["sloClass"] = json!("gold");
    let (code, body) = service.submit(PRODUCT, "gold-plated", wrong_class);
    assert_eq!(code, 422, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("sloClass"),
        "{body}"
    );
    assert_eq!(
        service.submit(PRODUCT, "chat-small", small_inference()).0,
        409
    );
    assert_eq!(
        service.submit(PRODUCT, "Bad_Name", small_inference()).0,
        422
    );
    assert_eq!(service.call("GET", "/state", Some(PRODUCT), None).0, 403);

    // Nothing of the refused requests was recorded.
    let all = service.call("GET", "/v1/workloads", Some(ADMIN), None).1;
    let names: Vec<&str> = all["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["chat-small"]);
    stop_workloads(&service);
    service.stop();
}

#[test]
fn killed_in_the_middle_of_a_reconfiguration_the_service_resumes_and_finishes_it() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    // Each GPU instance takes a second to create, so the kill lands mid-way.
    let faults_arg = faults(
        work.path(),
        "faults:\n  - slow: {call: create_gpu_instance, ms: 1000}\n",
    );
    let service = Service::ready(repo.path(), work.path(), &["--faults", &faults_arg]);
    assert_eq!(
        service.submit(PRODUCT, "chat-small", small_inference()).0,
        201
    );
    let training = json!({
        "tenant": "research",
        "sloClass": "training",
        "pool": "train",
        "gpu": {"count": 1},
        "command": script("train.sh"),
    });
    assert_eq!(service.submit(RESEARCH, "pretrain", training).0, 201);
    service.await_phase(RESEARCH, "pretrain", "running");
    repo.write("policy/fleet.yaml", &with_all_1g(&repo));
    repo.commit("infer may also be cut in sevenths");

    // Kill the service once the GPU is half-made: its old instances gone, not all new made.
    let sim_state = work.path().join("state/sim-nodes.json");
    eventually("a half-made GPU", || {
        let text = std::fs::read_to_string(&sim_state).ok()?;
        let count =
            text.matches("\"profile_id\": 19").count() + text.matches("\"profile_id\":19").count();
        (count > 0 && count < 7).then_some(())
    });
    service.kill();

    let service = Service::start(repo.path(), work.path(), &[]);
    service.await_phase(PRODUCT, "chat-small", "running");
    let state = service.call("GET", "/state", Some(ADMIN), None).1;
    let layout = instances(&state, "i0", 0);
    let placements: Vec<tessera_compiler::mig::Placement> = layout
        .iter()
        .map(|(p, s)| {
            assert_eq!(p, "1g.10gb");
            tessera_compiler::mig::Placement::new(19, *s as u8)
        })
        .collect();
    tessera_compiler::mig::validate(&placements).expect("a valid geometry");
    assert_eq!(placements.len(), 7);
    // Every workload is accounted for, and the training job survived its supervisor's death.
    let all = service.call("GET", "/v1/workloads", Some(ADMIN), None).1;
    let mut names: Vec<&str> = all["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["chat-small", "pretrain"]);
    assert_eq!(phase(&service.workload(RESEARCH, "pretrain")), "running");
    eventually("synced", || {
        (service.status()["sync"] == "Synced").then_some(())
    });
    stop_workloads(&service);
    service.stop();
}

#[test]
fn a_failed_nvml_call_degrades_the_service_and_is_retried_until_it_succeeds() {
    let mut repo = PolicyRepo::new();
    repo.write("policy/fleet.yaml", &with_all_1g(&repo));
    repo.commit("infer may be cut in sevenths");
    let work = tempfile::tempdir().unwrap();
    let faults_arg = faults(
        work.path(),
        "faults:\n  - fail: {call: create_gpu_instance, node: i0, gpu: 0, code: insufficient_resources, times: 1}\n",
    );
    let service = Service::ready(repo.path(), work.path(), &["--faults", &faults_arg]);
    assert_eq!(
        service.submit(PRODUCT, "chat-small", small_inference()).0,
        201
    );
    let degraded = eventually("the failure reported", || {
        let s = service.status();
        (s["health"] == "Degraded").then_some(s)
    });
    let error = degraded["lastError"].as_str().unwrap();
    assert!(
        error.contains("NVML_ERROR_INSUFFICIENT_RESOURCES"),
        "{error}"
    );
    service.await_phase(PRODUCT, "chat-small", "running");
    let healthy = eventually("healthy again", || {
        let s = service.status();
        (s["health"] == "Healthy" && s["sync"] == "Synced").then_some(s)
    });
    assert_eq!(healthy["lastError"], Value::Null);
    let state = service.call("GET", "/state", Some(ADMIN), None).1;
    assert_eq!(instances(&state, "i0", 0).len(), 7);

    // The exported state is what `tessera plan` reads in CI: it plans against it cleanly.
    let exported = work.path().join("state.json");
    std::fs::write(&exported, state.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["plan", "--policy"])
        .arg(repo.path().join("policy"))
        .arg("--state")
        .arg(&exported)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // `tessera status` reads the same, and exits 0 when Synced and Healthy.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["status", "--server", &service.base])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("sync:      Synced"), "{text}");
    stop_workloads(&service);
    service.stop();
}

#[test]
fn submit_checks_the_file_first_and_cancel_goes_through_the_api() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(args)
            .args(["--server", &service.base])
            .env("TESSERA_TOKEN", PRODUCT)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let bad = work.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: tessera/v1alpha1\nkind: Workload\nmetadata: {name: w}\nspec:\n  tenant: product\n  sloClass: serving\n  gpu: {migProfile: 1g.10gb}\n  replica: 2\n",
    )
    .unwrap();
    let (code, text) = cli(&["submit", bad.to_str().unwrap()]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("bad.yaml:8:3"), "{text}");
    let all = service.call("GET", "/v1/workloads", Some(ADMIN), None).1;
    assert_eq!(all["workloads"], json!([]), "a refused file sends nothing");

    let good = work.path().join("good.yaml");
    std::fs::write(
        &good,
        "apiVersion: tessera/v1alpha1\nkind: Workload\nmetadata: {name: w}\nspec:\n  tenant: product\n  sloClass: serving\n  gpu: {migProfile: 3g.40gb}\n",
    )
    .unwrap();
    let (code, text) = cli(&["submit", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    service.await_phase(PRODUCT, "w", "running");
    let (code, text) = cli(&["cancel", "w"]);
    assert_eq!(code, 0, "{text}");
    service.await_phase(PRODUCT, "w", "cancelled");
    let (code, text) = cli(&["cancel", "nope"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("no workload"), "{text}");
    service.stop();
}

/// With a long cycle period, a workload submitted between full cycles is decided against the
/// standing decision (the solver's session) and started; a cancellation (a change other than a
/// submission) brings a full cycle back, after which submissions use the session again.
#[test]
fn a_submission_between_full_cycles_is_decided_against_the_standing_decision() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(
        repo.path(),
        work.path(),
        &["--cycle-period", "10m", "--fetch-interval", "10m"],
    );
    let session_decisions = || {
        let text = service.call("GET", "/metrics", None, None).1;
        let text = text.as_str().unwrap_or_default().to_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("tessera_session_decisions_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    eventually("the first full cycle", || {
        (service.status()["cycles"].as_u64().unwrap_or(0) >= 1).then_some(())
    });
    assert_eq!(session_decisions(), 0);

    let mut chat = small_inference();
    chat["gpu"] = json!({"migProfile": "3g.40gb"});
    assert_eq!(service.submit(PRODUCT, "chat-a", chat.clone()).0, 201);
    service.await_phase(PRODUCT, "chat-a", "running");
    assert_eq!(session_decisions(), 1, "decided by the session");
    let a = service.workload(PRODUCT, "chat-a");
    assert!(a["bindings"][0]["node"].is_string(), "{a}");

    // The standing decision moves on with what it started: the GPU's other half.
    let mut larger = chat.clone();
    larger["gpu"] = json!({"migProfile": "4g.40gb"});
    assert_eq!(service.submit(PRODUCT, "chat-b", larger).0, 201);
    service.await_phase(PRODUCT, "chat-b", "running");
    assert_eq!(session_decisions(), 2);

    // A cancellation is not a submission: the next cycle is a full one, and its half of the
    // GPU is free again.
    assert_eq!(
        service
            .call("DELETE", "/v1/workloads/chat-a", Some(PRODUCT), None)
            .0,
        200
    );
    service.await_phase(PRODUCT, "chat-a", "cancelled");
    assert_eq!(service.submit(PRODUCT, "chat-c", chat).0, 201);
    service.await_phase(PRODUCT, "chat-c", "running");
    assert_eq!(
        session_decisions(),
        3,
        "after a full cycle, the session again"
    );
    let status = service.status();
    assert!(status["lastError"].is_null(), "{status}");
    stop_workloads(&service);
    service.stop();
}

#[test]
fn a_suspended_service_applies_nothing_until_resumed() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    assert_eq!(
        service.call("POST", "/v1/suspend", Some(PRODUCT), None).0,
        403
    );
    let (code, status) = service.call("POST", "/v1/suspend", Some(ADMIN), None);
    assert_eq!(code, 200);
    assert_eq!(status["suspended"], true);
    let mut chat = small_inference();
    chat["gpu"] = json!({"migProfile": "3g.40gb"});
    assert_eq!(service.submit(PRODUCT, "chat-small", chat).0, 201);
    // Cycles go on (the decision is computed and shown) but nothing is applied.
    let before = service.status()["cycles"].as_u64().unwrap();
    eventually("two more cycles", || {
        (service.status()["cycles"].as_u64().unwrap() >= before + 2).then_some(())
    });
    assert_eq!(phase(&service.workload(PRODUCT, "chat-small")), "pending");
    assert_eq!(service.status()["sync"], "OutOfSync");

    assert_eq!(service.call("POST", "/v1/resume", Some(ADMIN), None).0, 200);
    assert_eq!(
        service.call("POST", "/v1/reconcile", Some(ADMIN), None).0,
        202
    );
    service.await_phase(PRODUCT, "chat-small", "running");
    stop_workloads(&service);
    service.stop();
}

/// Workload names are per tenant: another tenant's `chat` neither shows (no 409 for it, no
/// name in an error) nor blocks a committed `chat`, and both run side by side.
#[test]
fn two_tenants_workloads_of_one_name_both_run() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    let research_chat = json!({
        "tenant": "research", "sloClass": "training", "pool": "train", "gpu": {"count": 1},
    });
    // Research takes the name first; product then commits a workload of the same name.
    let (code, body) = service.submit(RESEARCH, "chat", research_chat.clone());
    assert_eq!(code, 201, "{body}");
    repo.write(
        "policy/chat.yaml",
        "apiVersion: tessera/v1alpha1\nkind: Workload\nmetadata: {name: chat}\nspec:\n  \
         tenant: product\n  sloClass: serving\n  pool: infer\n  gpu: {migProfile: 3g.40gb}\n",
    );
    repo.commit("product's chat");
    service.await_phase(PRODUCT, "chat", "running");
    service.await_phase(RESEARCH, "chat", "running");
    // Nothing is blocked or Degraded (it was: the submitted name took the committed one's).
    eventually("Synced and Healthy", || {
        let s = service.status();
        (s["sync"] == "Synced" && s["health"] == "Healthy").then_some(())
    });
    assert_eq!(service.workload(PRODUCT, "chat")["origin"], "committed");
    assert_eq!(service.workload(RESEARCH, "chat")["origin"], "submitted");

    // A 409 only for the tenant's own live name, and it names no other tenant.
    // Product's `chat` is committed: the name is refused as the policy's, live or not, so a
    // submission can never hold it when the committed one is queued again.
    let (code, body) = service.submit(PRODUCT, "chat", small_inference());
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("committed"),
        "{body}"
    );
    assert!(!body.to_string().contains("research"), "{body}");
    let (code, body) = service.submit(RESEARCH, "chat", research_chat);
    assert_eq!(code, 409, "{body}");
    assert!(!body.to_string().contains("product"), "{body}");

    // The operator says whose: a bare name two tenants use is ambiguous.
    let (code, body) = service.call("GET", "/v1/workloads/chat", Some(ADMIN), None);
    assert_eq!(code, 400, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("product") && error.contains("research") && error.contains("?tenant="),
        "{error}"
    );
    let (code, body) = service.call(
        "GET",
        "/v1/workloads/chat?tenant=research",
        Some(ADMIN),
        None,
    );
    assert_eq!((code, body["tenant"].as_str()), (200, Some("research")));
    // A tenant cannot name another tenant's workload.
    let (code, _) = service.call(
        "GET",
        "/v1/workloads/chat?tenant=product",
        Some(RESEARCH),
        None,
    );
    assert_eq!(code, 403);

    // Cancelling research's `chat` leaves product's running.
    let (code, body) = service.call("DELETE", "/v1/workloads/chat", Some(RESEARCH), None);
    assert_eq!(code, 200, "{body}");
    service.await_phase(RESEARCH, "chat", "cancelled");
    assert_eq!(phase(&service.workload(PRODUCT, "chat")), "running");
    stop_workloads(&service);
    service.stop();
}

#[test]
fn committed_workloads_follow_the_repository_like_a_deployment() {
    let mut repo = PolicyRepo::new();
    let doc = |model: &str| {
        format!(
            "apiVersion: tessera/v1alpha1\nkind: Workload\nmetadata: {{name: chat}}\nspec:\n  \
             tenant: product\n  sloClass: serving\n  pool: infer\n  gpu: {{migProfile: 3g.40gb}}\n  \
             command: [sh, {}]\n  env: {{MODEL: {model}}}\n",
            data("serve.sh").display()
        )
    };
    repo.write("policy/chat.yaml", &doc("small"));
    repo.commit("a committed service");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    let pid_of = |w: &Value| w["replicas"][0]["pid"].as_i64();
    let first = eventually("the service running", || {
        let w = service.workload(ADMIN, "chat");
        (phase(&w) == "running").then(|| pid_of(&w)).flatten()
    });
    assert_eq!(service.workload(ADMIN, "chat")["origin"], "committed");
    // Committed work is changed in Git, not through the API.
    let (code, body) = service.call("DELETE", "/v1/workloads/chat", Some(PRODUCT), None);
    assert_eq!(code, 422, "{body}");

    // A changed spec replaces the running process.
    repo.write("policy/chat.yaml", &doc("large"));
    repo.commit("a larger model");
    let second = eventually("the new spec running", || {
        let w = service.workload(ADMIN, "chat");
        (phase(&w) == "running" && w["spec"]["env"]["MODEL"] == "large")
            .then(|| pid_of(&w))
            .flatten()
    });
    assert_ne!(first, second);
    eventually("the old process gone", || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(first as i32), None)
            .is_err()
            .then_some(())
    });

    // Removed from the repository: stopped and cancelled.
    std::fs::remove_file(repo.path().join("policy/chat.yaml")).unwrap();
    repo.commit("retire the service");
    service.await_phase(ADMIN, "chat", "cancelled");
    service.stop();
}

/// The decayed usage of fair share over time is accounted while work runs, shown in `/state`
/// (what `tessera plan` reads) and `/metrics`, and survives a restart of the service.
#[test]
fn fair_share_usage_is_accounted_exported_and_survives_a_restart() {
    let mut repo = PolicyRepo::new();
    let tenants = repo.read("policy/tenants.yaml").replace(
        "  sloClasses: [interactive, serving, training]\n",
        "  sloClasses: [interactive, serving, training]\n  fairShare: {usageHalfLife: 1h}\n",
    );
    repo.write("policy/tenants.yaml", &tenants);
    repo.commit("fair share over an hour");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    let training = json!({
        "tenant": "research",
        "sloClass": "training",
        "pool": "train",
        "gpu": {"count": 2},
        "command": script("train.sh"),
    });
    assert_eq!(service.submit(RESEARCH, "pretrain", training).0, 201);
    service.await_phase(RESEARCH, "pretrain", "running");
    // research has no guarantee in `train`: its two GPUs are borrowed, and accrue as such.
    let usage = |service: &Service| {
        let state = service.call("GET", "/state", Some(ADMIN), None).1;
        let research = &state["spec"]["usage"]["tenants"]["research"];
        (
            research["used"]["gpuHours"].as_f64().unwrap_or(0.0),
            research["borrowed"]["gpuHours"].as_f64().unwrap_or(0.0),
            state["spec"]["usage"]["asOf"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
    };
    let (used, borrowed, as_of) = eventually("usage accrued", || {
        let u = usage(&service);
        (u.0 > 0.0).then_some(u)
    });
    assert!((used - borrowed).abs() < 1e-9, "{used} {borrowed}");
    let metrics = service.call("GET", "/metrics", None, None).1;
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics.contains(
            "tessera_tenant_decayed_usage{tenant=\"research\",resource=\"gpu_hours\",kind=\"borrowed\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("tessera_tenant_fair_share{tenant=\"research\"}"),
        "{metrics}"
    );
    service.stop();

    // A restart starts from the stored record: it decays, it is not forgotten.
    let service = Service::ready(repo.path(), work.path(), &[]);
    let (after, _, as_of_after) = eventually("usage after the restart", || {
        let u = usage(&service);
        (!u.2.is_empty()).then_some(u)
    });
    assert!(as_of_after >= as_of, "{as_of_after} < {as_of}");
    // Seconds at most have passed: an hour's half-life keeps nearly all of it.
    assert!(
        after >= used * 0.99,
        "{after} after the restart, {used} before"
    );
    stop_workloads(&service);
    service.stop();
}

/// A GPU's re-partitions are stored as they are made and exported in `/state`: a restarted
/// service still counts them against the pool's `maxPerGpuPerHour`, and says so.
#[test]
fn a_restart_does_not_reset_the_reconfiguration_budget() {
    let mut repo = PolicyRepo::new();
    let fleet = with_all_1g(&repo).replace(
        "  migLayouts: [halves, all-1g]\n",
        "  migLayouts: [halves, all-1g]\n  reconfiguration: {maxPerGpuPerHour: 1}\n",
    );
    assert!(fleet.contains("maxPerGpuPerHour: 1"));
    repo.write("policy/fleet.yaml", &fleet);
    repo.commit("infer cut in sevenths or halves, once an hour");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    // The 1g needs the halves destroyed: the GPU's one change this hour.
    assert_eq!(
        service.submit(PRODUCT, "chat-small", small_inference()).0,
        201
    );
    service.await_phase(PRODUCT, "chat-small", "running");
    let recorded = |service: &Service| {
        let state = service.call("GET", "/state", Some(ADMIN), None).1;
        state["spec"]["reconfigurations"].clone()
    };
    // `/state` is published after the cycle records the run: wait for it rather than read it
    // the moment the workload shows running.
    let before = eventually("the re-partition in /state", || {
        let r = recorded(&service);
        (r.as_array().map(Vec::len) == Some(1)).then_some(r)
    });
    assert_eq!(
        (&before[0]["node"], &before[0]["gpu"]),
        (&json!("i0"), &json!(0))
    );
    let (code, _) = service.call("DELETE", "/v1/workloads/chat-small", Some(PRODUCT), None);
    assert_eq!(code, 200);
    service.await_phase(PRODUCT, "chat-small", "cancelled");
    service.stop();

    let service = Service::ready(repo.path(), work.path(), &[]);
    assert_eq!(
        recorded(&service),
        before,
        "the record survives the restart"
    );
    // A 4g needs the halves back: a second change within the hour, which waits.
    let mut large = small_inference();
    large["gpu"] = json!({"migProfile": "4g.40gb"});
    assert_eq!(service.submit(PRODUCT, "chat-large", large).0, 201);
    let waiting = eventually("a reason for chat-large", || {
        let w = service.workload(PRODUCT, "chat-large");
        w["message"].as_str().is_some().then_some(w)
    });
    assert_eq!(waiting["phase"], "pending", "{waiting}");
    assert!(
        waiting["message"]
            .as_str()
            .unwrap()
            .contains("reconfiguration budget spent on GPU i0/0 of pool `infer`"),
        "{waiting}"
    );
    stop_workloads(&service);
    service.stop();
}

/// A committed service whose command keeps failing is queued again after a wait that doubles
/// with each short run (CrashLoopBackOff), and the service says so while it waits.
#[test]
fn a_crash_looping_committed_service_backs_off() {
    let mut repo = PolicyRepo::new();
    repo.write(
        "policy/crash.yaml",
        "apiVersion: tessera/v1alpha1\nkind: Workload\nmetadata: {name: crash}\nspec:\n  \
         tenant: product\n  sloClass: serving\n  pool: infer\n  gpu: {migProfile: 3g.40gb}\n  \
         command: [sh, -c, 'exit 3']\n",
    );
    repo.commit("a service that cannot start");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &["--restart-backoff", "2s"]);
    // (submittedAt, endedAt) of each run, in order, as the API shows the current record.
    let mut runs: Vec<(i64, i64)> = Vec::new();
    let mut backing_off = false;
    eventually("three runs ended", || {
        let w = service.workload(ADMIN, "crash");
        if let (Some(s), Some(e)) = (unix(&w["submittedAt"]), unix(&w["endedAt"]))
            && runs.last() != Some(&(s, e))
        {
            assert_eq!(w["end"], json!({"kind": "exited", "code": 3}), "{w}");
            runs.push((s, e));
        }
        let status = service.status();
        backing_off |= status["health"] == "Degraded"
            && status["lastError"].as_str().is_some_and(|e| {
                e.contains("committed workload product/crash keeps ending after short runs")
            });
        (runs.len() >= 3).then_some(())
    });
    assert!(backing_off, "the status never told of the back-off");
    // Queued again no sooner than 2 s, then 4 s, after the run before ended.
    assert!(runs[1].0 - runs[0].1 >= 2, "{runs:?}");
    assert!(runs[2].0 - runs[1].1 >= 4, "{runs:?}");
    service.stop();
}

/// A workload that declares `maxDuration` is stopped when its run reaches it (the solver lets
/// such work backfill ahead of a reservation on that promise).
#[test]
fn a_workload_is_stopped_at_its_max_duration() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    let mut job = small_inference();
    job["gpu"] = json!({"migProfile": "3g.40gb"});
    job["maxDuration"] = json!("2s");
    assert_eq!(service.submit(PRODUCT, "short", job).0, 201);
    let pid = eventually("running", || {
        let w = service.workload(PRODUCT, "short");
        (phase(&w) == "running")
            .then(|| w["replicas"][0]["pid"].as_i64())
            .flatten()
    });
    let ended = eventually("stopped at its limit", || {
        let w = service.workload(PRODUCT, "short");
        (phase(&w) == "failed").then_some(w)
    });
    assert_eq!(
        ended["end"],
        json!({"kind": "timedOut", "limitSeconds": 2}),
        "{ended}"
    );
    let ran = unix(&ended["endedAt"]).unwrap() - unix(&ended["startedAt"]).unwrap();
    assert!(ran >= 2, "{ended}");
    eventually("the process gone", || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None)
            .is_err()
            .then_some(())
    });
    service.stop();
}

/// A gang that cannot start holds its node across cycles (the reservation the service carries
/// from one decision to the next, shown in `/state` and `/metrics`), and starts when the work
/// in the way ends.
#[test]
fn a_reservation_is_carried_across_cycles_until_the_gang_starts() {
    let mut repo = PolicyRepo::new();
    let fleet = repo.read("policy/fleet.yaml").replace(
        "  capacity: {nodes: 1, gpusPerNode: 2, cpuPerNode: 64, memoryPerNode: 512Gi}\n  sharing: exclusive\n",
        "  capacity: {nodes: 1, gpusPerNode: 2, cpuPerNode: 64, memoryPerNode: 512Gi}\n  sharing: exclusive\n  reservations: {maxGpus: 2}\n",
    );
    assert!(
        fleet.contains("reservations"),
        "the train pool changed shape"
    );
    repo.write("policy/fleet.yaml", &fleet);
    repo.commit("reservations in train");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    let one = json!({
        "tenant": "product",
        "sloClass": "training",
        "pool": "train",
        "gpu": {"count": 1},
        "command": script("serve.sh"),
        "maxDuration": "1h",
    });
    assert_eq!(service.submit(PRODUCT, "finetune", one).0, 201);
    service.await_phase(PRODUCT, "finetune", "running");
    let gang = json!({
        "tenant": "research",
        "sloClass": "training",
        "pool": "train",
        "gpu": {"count": 2},
        "command": script("train.sh"),
    });
    assert_eq!(service.submit(RESEARCH, "pretrain", gang).0, 201);
    let reservation = |service: &Service| {
        let state = service.call("GET", "/state", Some(ADMIN), None).1;
        state["spec"]["reservations"][0].clone()
    };
    let first = eventually("the gang reserving", || {
        let r = reservation(&service);
        r.is_object().then_some(r)
    });
    assert_eq!(first["workload"], "research/pretrain", "{first}");
    assert_eq!(first["nodes"], json!(["t0"]), "{first}");
    // Later cycles keep it, with its first instant.
    let cycles = service.status()["cycles"].as_u64().unwrap();
    eventually("two more cycles", || {
        (service.status()["cycles"].as_u64().unwrap() >= cycles + 2).then_some(())
    });
    assert_eq!(reservation(&service), first);
    let metrics = service.call("GET", "/metrics", None, None).1;
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics.contains("tessera_pool_reservations{pool=\"train\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tessera_pool_reserved_idle_gpus{pool=\"train\"} 1\n"),
        "{metrics}"
    );
    let waiting = service.workload(RESEARCH, "pretrain");
    assert_eq!(phase(&waiting), "pending", "{waiting}");
    // The tenant sees why, and when the work in the way declares it ends.
    assert_eq!(waiting["reason"], "reserving", "{waiting}");
    let started = unix(&service.workload(PRODUCT, "finetune")["startedAt"]).unwrap();
    assert_eq!(
        unix(&waiting["expectedStart"]),
        Some(started + 3600),
        "{waiting}"
    );

    let (code, _) = service.call("DELETE", "/v1/workloads/finetune", Some(PRODUCT), None);
    assert_eq!(code, 200);
    service.await_phase(RESEARCH, "pretrain", "running");
    eventually("the reservation released", || {
        reservation(&service).is_null().then_some(())
    });
    stop_workloads(&service);
    service.stop();
}

/// The attacks of issue 20 from inside a workload the service itself runs, confined as it is by
/// default: the command tries each and reports those that worked; none may. Writing the report
/// into its own checkpoint directory is the control.
#[test]
fn a_confined_workload_cannot_reach_the_service_or_other_tenants() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::start_confined(repo.path(), work.path(), &[]);
    eventually("a revision in force", || {
        service.status()["revision"].as_str().map(|_| ())
    });
    let pid = service.child.id();
    let w = work.path().display();
    let script = format!(
        r#"report="$TESSERA_CHECKPOINT_DIR/report"
           : > "$report"
           try() {{ if sh -c "$2" > /dev/null 2>&1; then echo "$1" >> "$report"; fi; }}
           try tokens "cat {w}/tokens.yaml"
           try store "grep -q SQLite {w}/tessera.db"
           try store-write "grep -q SQLite {w}/tessera.db && echo x >> {w}/tessera.db"
           try mirror "grep -q . {w}/state/mirror.git/config"
           try proc "cat /proc/{pid}/environ"
           try proc-root "cat /proc/{pid}/root{w}/tokens.yaml"
           try kill "kill -9 {pid}"
           try environment "env | grep -q -e CARGO -e HOME"
           try system "touch /usr/pwned || touch /etc/pwned"
           echo done >> "$report""#
    );
    let mut job = small_inference();
    job["gpu"] = json!({"migProfile": "3g.40gb"});
    job["command"] = json!(["sh", "-c", script]);
    assert_eq!(service.submit(PRODUCT, "hostile", job).0, 201);
    let ended = eventually("the workload ended", || {
        let w = service.workload(PRODUCT, "hostile");
        matches!(phase(&w), "succeeded" | "failed").then_some(w)
    });
    let log = std::fs::read_to_string(work.path().join("state/runtime/product.hostile/0.log"));
    assert_eq!(phase(&ended), "succeeded", "{ended}\nlog: {log:?}");
    let report =
        std::fs::read_to_string(work.path().join("state/checkpoints/product/hostile/report"))
            .unwrap();
    assert_eq!(report, "done\n", "attacks that worked: {report}");
    // The service lives, and its store is what it wrote.
    assert!(service.status()["revision"].is_string());
    service.stop();
}

/// A start the service died during (its intent still open at the next start) is not blindly
/// retried: each is counted, the workload waits out a back-off, and after the third it fails
/// with the reason instead of taking the service down again.
#[test]
fn a_start_the_service_keeps_dying_during_is_failed_after_three() {
    use tessera_compiler::model::{Binding, WorkloadSpec};
    use tessera_reconciler::store::{Origin, Phase, Store};

    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let db = work.path().join("tessera.db");
    let once = || {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["reconcile", "--repo"])
            .arg(repo.path())
            .args(["--branch", "main", "--path", "policy", "--driver", "sim"])
            .arg("--nodes")
            .arg(data("nodes.yaml"))
            .arg("--db")
            .arg(&db)
            .arg("--state-dir")
            .arg(work.path().join("state"))
            .args(["--runtime", "none", "--once"])
            .output()
            .unwrap()
    };
    once();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let mut job = small_inference();
    job["gpu"] = json!({"migProfile": "3g.40gb"});
    let spec: WorkloadSpec = serde_json::from_value(job).unwrap();
    let crasher = tessera_compiler::WorkloadKey::new(&spec.tenant, "crasher");
    Store::open(&db)
        .unwrap()
        .submit("crasher", &spec, Origin::Submitted, now())
        .unwrap();
    for round in 1..=3 {
        {
            // What a service killed in the middle of starting it leaves.
            let store = Store::open(&db).unwrap();
            let binding = Binding {
                node: "i0".into(),
                gpus: vec![0],
                mig_start: Some(0),
                share: None,
            };
            store.mark_starting(&crasher, &[binding], now()).unwrap();
            let intent =
                json!({"action": "start", "workload": crasher.to_string(), "bindings": []});
            store.begin_action(1, &intent, now()).unwrap();
        }
        let out = once();
        let text = String::from_utf8_lossy(&out.stdout);
        let record = Store::open(&db).unwrap().workload(&crasher).unwrap();
        if round < 3 {
            assert_eq!(record.phase, Phase::Pending, "round {round}: {text}");
            assert!(
                text.contains(&format!(
                    "the service stopped while starting it ({round} times)"
                )),
                "round {round}: {text}"
            );
        } else {
            assert_eq!(record.phase, Phase::Failed, "{text}");
            let end = serde_json::to_string(&record.end).unwrap();
            assert!(end.contains("not started again"), "{end}");
        }
    }
}

/// Runs the CLI against `service` with `token`; returns the exit code and stdout + stderr.
fn cli(service: &Service, token: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .args(["--server", &service.base])
        .env("TESSERA_TOKEN", token)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A tenant finds out why its workload waits: `GET /v1/workloads` and `tessera get` give the
/// reason the last decision gave, `tessera describe` its sentence and the events; every
/// instant is RFC 3339. A `kind: Workload` document is accepted as the body too.
#[test]
fn a_tenant_sees_why_its_workload_waits() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    let document = json!({
        "apiVersion": "tessera/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "too-big"},
        "spec": {"tenant": "research", "sloClass": "training", "pool": "train",
                 "gpu": {"count": 8}},
    });
    let (code, body) = service.call(
        "POST",
        "/v1/workloads",
        Some(RESEARCH),
        Some(&document.to_string()),
    );
    assert_eq!(code, 201, "{body}");
    let submitted = body["submittedAt"].as_str().unwrap();
    assert!(
        tessera_compiler::units::parse_rfc3339(submitted).is_some(),
        "{submitted}"
    );
    let mut wrong = document.clone();
    wrong["kind"] = json!("Tenant");
    let (code, body) = service.call(
        "POST",
        "/v1/workloads",
        Some(RESEARCH),
        Some(&wrong.to_string()),
    );
    assert_eq!(code, 422, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("kind: Workload"),
        "{body}"
    );

    let waiting = eventually("a reason for too-big", || {
        let w = service.workload(RESEARCH, "too-big");
        w["reason"].as_str().is_some().then_some(w)
    });
    assert_eq!(waiting["phase"], "pending");
    assert!(waiting["message"].as_str().unwrap().len() > 10, "{waiting}");
    assert!(
        waiting["decidedAt"]
            .as_str()
            .and_then(tessera_compiler::units::parse_rfc3339)
            .is_some(),
        "{waiting}"
    );
    assert_eq!(waiting["events"][0]["kind"], "submitted", "{waiting}");
    // No pool can hold it: the queue never reaches it, so it has no place in line.
    assert_eq!(waiting["queuePosition"], Value::Null, "{waiting}");
    let reason = waiting["reason"].as_str().unwrap().to_string();

    let (code, text) = cli(&service, RESEARCH, &["get"]);
    assert_eq!(code, 0, "{text}");
    let header = text.lines().next().unwrap();
    assert!(
        header.starts_with("NAME") && header.contains("REASON"),
        "{text}"
    );
    let row = text.lines().find(|l| l.starts_with("too-big")).unwrap();
    for cell in ["research", "training", "pending", "1x8", reason.as_str()] {
        assert!(row.contains(cell), "{cell} missing: {text}");
    }
    let (code, text) = cli(&service, PRODUCT, &["get", "workloads"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(
        text, "No workloads.\n",
        "another tenant's workloads are not listed"
    );
    let (code, text) = cli(&service, PRODUCT, &["get", "--tenant", "research"]);
    assert_eq!(code, 1, "{text}");
    let (code, text) = cli(
        &service,
        ADMIN,
        &["get", "--tenant", "research", "-o", "wide"],
    );
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("EXPECTED-START") && text.contains("too-big"),
        "{text}"
    );

    let (code, text) = cli(&service, RESEARCH, &["describe", "too-big"]);
    assert_eq!(code, 0, "{text}");
    for wanted in [
        "Reason:",
        &reason,
        "Message:",
        "Spec:",
        "Events:",
        "submitted",
    ] {
        assert!(text.contains(wanted), "{wanted} missing: {text}");
    }
    let (code, text) = cli(&service, PRODUCT, &["describe", "too-big"]);
    assert_eq!(code, 1, "another tenant's workload reads as absent: {text}");
    service.stop();
}

/// A workload waiting for capacity has its place in line, in the API and in `describe`.
#[test]
fn a_waiting_workload_knows_its_place_in_line() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    let training = json!({
        "tenant": "research",
        "sloClass": "training",
        "pool": "train",
        "gpu": {"count": 2},
        "command": script("train.sh"),
    });
    // The first takes both training GPUs; the second and third wait for them, in that order.
    assert_eq!(service.submit(RESEARCH, "first", training.clone()).0, 201);
    service.await_phase(RESEARCH, "first", "running");
    assert_eq!(service.submit(RESEARCH, "second", training.clone()).0, 201);
    assert_eq!(service.submit(RESEARCH, "third", training).0, 201);
    // Both read from the decision that saw both waiting.
    let (second, third) = eventually("both in line", || {
        let second = service.workload(RESEARCH, "second");
        let third = service.workload(RESEARCH, "third");
        let counted = |w: &Value| w["queuePosition"]["of"] == 2;
        (counted(&second) && counted(&third) && second["decidedAt"] == third["decidedAt"])
            .then_some((second, third))
    });
    assert_eq!(second["phase"], "pending", "{second}");
    assert_eq!(
        second["queuePosition"],
        json!({"position": 1, "of": 2}),
        "{second}"
    );
    assert_eq!(
        third["queuePosition"],
        json!({"position": 2, "of": 2}),
        "{third}"
    );
    let (code, text) = cli(&service, RESEARCH, &["describe", "third"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("Queue position:  2 of 2 waiting"), "{text}");
    let (code, text) = cli(&service, RESEARCH, &["get", "-o", "wide"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.lines().next().unwrap().contains("QUEUE"), "{text}");
    stop_workloads(&service);
    service.stop();
}

/// Without a token `/status` says sync and health only; a tenant's token adds the conditions
/// about its own workloads and nothing of the service's; the operator sees every condition.
/// A lost GPU degrades the service with its name, and is counted in a metric.
#[test]
fn status_details_need_a_token_and_a_lost_gpu_degrades_the_service() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let faults_arg = faults(work.path(), "faults:\n  - lose: {node: t0, gpu: 1}\n");
    let service = Service::ready(repo.path(), work.path(), &["--faults", &faults_arg]);
    let degraded = eventually("the lost GPU reported", || {
        let s = service.status();
        (s["health"] == "Degraded").then_some(s)
    });
    let error = degraded["lastError"].as_str().unwrap();
    assert!(error.contains("lost hardware: t0/1"), "{error}");
    assert_eq!(degraded["lostGpus"], json!(["t0/1"]));

    let public = service.call("GET", "/status", None, None).1;
    assert_eq!(public["health"], "Degraded");
    for hidden in [
        "lastError",
        "conditions",
        "diagnostics",
        "driver",
        "lostGpus",
    ] {
        assert!(public.get(hidden).is_none(), "{hidden} shown: {public}");
    }
    let tenant = service.call("GET", "/status", Some(PRODUCT), None).1;
    assert_eq!(tenant["health"], "Degraded");
    assert_eq!(tenant["conditions"], json!([]), "{tenant}");
    assert_eq!(tenant["lastError"], Value::Null, "{tenant}");
    let (code, _) = service.call("GET", "/status", Some("not-a-token-0123456789"), None);
    assert_eq!(code, 401);

    let metrics = service.call("GET", "/metrics", None, None).1;
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "tessera_pool_lost_gpus{pool=\"train\"} 1"),
        "{metrics}"
    );
    service.stop();
}

/// A tenant may have at most `--max-submitted-per-tenant` submitted workloads that have not
/// ended: the next is refused with 429 and what to do, other tenants are not affected, and a
/// cancellation makes room.
#[test]
fn submissions_are_capped_per_tenant() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(
        repo.path(),
        work.path(),
        &["--max-submitted-per-tenant", "2"],
    );
    let big = |tenant: &str| json!({"tenant": tenant, "sloClass": "training", "pool": "train", "gpu": {"count": 8}});
    assert_eq!(service.submit(RESEARCH, "r1", big("research")).0, 201);
    assert_eq!(service.submit(RESEARCH, "r2", big("research")).0, 201);
    let (code, body) = service.submit(RESEARCH, "r3", big("research"));
    assert_eq!(code, 429, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("tessera cancel"), "{error}");
    assert!(service.workload(RESEARCH, "r3").get("error").is_some());
    let (code, body) = service.call("DELETE", "/v1/workloads/r1", Some(RESEARCH), None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(service.submit(RESEARCH, "r3", big("research")).0, 201);
    service.stop();
}

/// Whether a status's `lastError` says the branch or repository it follows does not exist.
fn names_what_is_missing(status: &Value) -> bool {
    status["lastError"]
        .as_str()
        .is_some_and(|e| e.contains("does not exist"))
}

/// A fetch that fails keeps the service Degraded, cycle after cycle, until a fetch succeeds,
/// and a vanished local repository is named as such; a deleted branch makes the service
/// OutOfSync and Degraded (its head is gone), and recreating it recovers.
#[test]
fn fetch_failures_hold_until_a_fetch_succeeds_and_a_deleted_branch_is_noticed() {
    let mut repo = PolicyRepo::new();
    let first = repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    eventually("synced", || {
        (service.status()["sync"] == "Synced").then_some(())
    });

    // The branch deleted: HEAD detached first, as a branch that is HEAD cannot be deleted.
    let oid = repo.repo.head().unwrap().target().unwrap();
    repo.repo.set_head_detached(oid).unwrap();
    repo.repo
        .find_branch("main", git2::BranchType::Local)
        .unwrap()
        .delete()
        .unwrap();
    // As below, a fetch under way when the branch goes may first fail otherwise; the next
    // names the missing branch.
    let gone = eventually("the deleted branch noticed", || {
        let s = service.status();
        (s["head"].is_null() && s["health"] == "Degraded" && names_what_is_missing(&s)).then_some(s)
    });
    assert_eq!(gone["sync"], "OutOfSync", "{gone}");
    assert_eq!(
        gone["revision"],
        first.as_str(),
        "the revision in force stays"
    );
    let commit = repo.repo.find_commit(oid).unwrap();
    repo.repo.branch("main", &commit, false).unwrap();
    repo.repo.set_head("refs/heads/main").unwrap();
    eventually("the branch back", || {
        let s = service.status();
        (s["sync"] == "Synced" && s["health"] == "Healthy").then_some(())
    });

    // The repository moved away: the condition holds across cycles, whatever runs between.
    let moved = work.path().join("moved-away");
    std::fs::rename(repo.path(), &moved).unwrap();
    // A fetch under way while the directory moves may first fail on a missing object; the
    // next says the repository is gone.
    let degraded = eventually("the vanished repository named", || {
        let s = service.status();
        (s["health"] == "Degraded" && names_what_is_missing(&s)).then_some(s)
    });
    let error = degraded["lastError"].as_str().unwrap();
    assert!(!error.contains("unsupported URL protocol"), "{error}");
    let from = degraded["cycles"].as_u64().unwrap();
    let mut samples = 0;
    eventually("three more cycles", || {
        let s = service.status();
        assert_eq!(s["health"], "Degraded", "the condition flickered: {s}");
        samples += 1;
        (s["cycles"].as_u64().unwrap() >= from + 3).then_some(())
    });
    assert!(samples > 0);
    std::fs::rename(&moved, repo.path()).unwrap();
    eventually("healthy once the repository is back", || {
        let s = service.status();
        (s["health"] == "Healthy" && s["lastError"].is_null()).then_some(())
    });
    service.stop();
}

/// A workload that ran is metered: `tessera report usage` charges its tenant exactly the MIG
/// instance's sevenths of a GPU for the seconds it ran, rolls it up to the root, splits it into
/// guaranteed and borrowed as the solver admitted it, and shows a tenant only its own subtree.
#[test]
fn usage_is_metered_and_reported_per_tenant_subtree() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    let mut job = small_inference();
    job["gpu"] = json!({"migProfile": "3g.40gb"});
    job["maxDuration"] = json!("2s");
    assert_eq!(service.submit(PRODUCT, "metered", job).0, 201);
    let ended = eventually("stopped at its limit", || {
        let w = service.workload(PRODUCT, "metered");
        (phase(&w) == "failed").then_some(w)
    });
    let ran = unix(&ended["endedAt"]).unwrap() - unix(&ended["startedAt"]).unwrap();
    // The run's own interval: it is counted from its start up to the cycle that stopped it.
    let (since, until) = (
        ended["startedAt"].as_str().unwrap(),
        ended["endedAt"].as_str().unwrap(),
    );
    let report = |token: &str| {
        let (code, out) = cli(
            &service,
            token,
            &[
                "report", "usage", "--since", since, "--until", until, "--output", "json",
            ],
        );
        assert_eq!(code, 0, "{out}");
        serde_json::from_str::<Value>(&out).unwrap()
    };
    let line = |report: &Value, name: &str| {
        report["lines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .cloned()
    };
    let all = report(ADMIN);
    let product = line(&all, "product").expect("product's line");
    // A 3g instance is 3/7 of a GPU: 3000 units per second.
    assert_eq!(product["gpuUnitSeconds"], json!(3000 * ran), "{all}");
    assert_eq!(
        product["guaranteedUnitSeconds"].as_i64().unwrap()
            + product["borrowedUnitSeconds"].as_i64().unwrap(),
        3000 * ran,
        "{all}"
    );
    assert_eq!(
        line(&all, "org").unwrap()["gpuUnitSeconds"],
        json!(3000 * ran)
    );
    assert_eq!(all["total"]["gpuUnitSeconds"], json!(3000 * ran));
    // By team, the quickstart's teams being the root's children: product's line is all of it.
    let (code, out) = cli(
        &service,
        ADMIN,
        &[
            "report",
            "usage",
            "--since",
            since,
            "--until",
            until,
            "--by",
            "team",
            "--team-depth",
            "1",
            "--output",
            "json",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let teams: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        line(&teams, "product").expect("product's line")["gpuUnitSeconds"],
        json!(3000 * ran),
        "{teams}"
    );
    assert!(line(&teams, "org").is_none(), "{teams}");
    assert_eq!(teams["total"]["gpuUnitSeconds"], json!(3000 * ran));
    // A tenant sees its own subtree only.
    let own = report(PRODUCT);
    assert!(line(&own, "org").is_none(), "{own}");
    assert_eq!(own["total"]["gpuUnitSeconds"], json!(3000 * ran));
    let other = report(RESEARCH);
    assert!(line(&other, "product").is_none(), "{other}");
    assert_eq!(other["total"]["gpuUnitSeconds"], json!(0));
    // Without a token there is no report.
    let (code, out) = cli(
        &service,
        "",
        &["report", "usage", "--since", since, "--until", until],
    );
    assert_eq!(code, 1, "{out}");
    service.stop();
}

/// A workload asking no GPU (`gpu: {count: 0}`) is placed on a node for its CPU and runs there
/// with no GPU visible: no device in its replica, `CUDA_VISIBLE_DEVICES` empty.
#[test]
fn a_cpu_only_workload_runs_with_no_gpu_visible() {
    let mut repo = PolicyRepo::new();
    repo.commit("two pools");
    let work = tempfile::tempdir().unwrap();
    let service = Service::ready(repo.path(), work.path(), &[]);
    let mut job = small_inference();
    job["pool"] = json!("train");
    job["gpu"] = json!({"count": 0});
    job["cpu"] = json!(4);
    assert_eq!(service.submit(PRODUCT, "loader", job).0, 201);
    let running = eventually("running", || {
        let w = service.workload(PRODUCT, "loader");
        (phase(&w) == "running").then_some(w)
    });
    assert_eq!(running["replicas"][0]["devices"], json!([]), "{running}");
    let checkpoints = work.path().join("state/checkpoints/product/loader");
    let seen = eventually("the server wrote its devices", || {
        std::fs::read_to_string(checkpoints.join("devices-0")).ok()
    });
    assert_eq!(seen.trim(), "", "no GPU is visible to it");
    service.stop();
}
