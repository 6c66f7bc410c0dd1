//! The fleet page (`/ui`) end to end: `tessera reconcile` on the quickstart (the `sim` driver,
//! no commands run), a one-time link minted with a token, and the page loaded in a real
//! browser (Debian's headless Chromium) whose DOM must show the pools, the nodes, a running
//! workload and a waiting one with its reason; a screenshot is saved under the test's
//! temporary directory. The sessions' rules (cookies, codes used once, tenants kept apart) are
//! checked over plain HTTP.
//!
//! Chromium is required, not optional: without it the test fails and says what to install.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use git2::{Repository, RepositoryInitOptions};
use serde_json::{Value, json};

use common::eventually;

const QUICKSTART: &str = "examples/policies/quickstart";
const NODES: &str = "examples/nodes/quickstart.yaml";
const ADMIN: &str = "admin-token-0123456789abcdef";
const PRODUCT: &str = "product-token-0123456789abcdef";
const RESEARCH: &str = "research-token-0123456789abcdef";

/// `tessera reconcile` on a repository holding the quickstart policy.
struct Service {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Service {
    fn start() -> Service {
        let dir = tempfile::tempdir().unwrap();
        let repo_dir = dir.path().join("repo");
        let repo =
            Repository::init_opts(&repo_dir, RepositoryInitOptions::new().initial_head("main"))
                .unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let policy = repo_dir.join(QUICKSTART);
        std::fs::create_dir_all(&policy).unwrap();
        for entry in std::fs::read_dir(root.join(QUICKSTART)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), policy.join(entry.file_name())).unwrap();
        }
        common::commit_all(&repo, 1, "quickstart");
        let tokens = dir.path().join("tokens.yaml");
        std::fs::write(
            &tokens,
            format!("admin: {ADMIN}\ntenants:\n  product: {PRODUCT}\n  research: {RESEARCH}\n"),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["reconcile", "--repo"])
            .arg(&repo_dir)
            .args(["--branch", "main", "--path", QUICKSTART, "--driver", "sim"])
            .arg("--nodes")
            .arg(root.join(NODES))
            .args(["--runtime", "none"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--tokens")
            .arg(&tokens)
            .args(["--listen", "127.0.0.1:0", "--cycle-period", "1s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("tessera runs");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let base = loop {
            let line = lines
                .next()
                .expect("the service prints where it listens")
                .unwrap();
            if let Some(url) = line.strip_prefix("tessera reconcile: API listening on ") {
                break url.trim().to_string();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Service {
            child,
            base,
            _dir: dir,
        }
    }

    /// An HTTP client that reads error statuses as answers and follows no redirect.
    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .into()
    }

    fn api(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {token}");
        let agent = Service::agent();
        let response = if method == "POST" {
            agent
                .post(&url)
                .header("Authorization", &auth)
                .content_type("application/json")
                .send(body.map(|b| b.to_string()).unwrap_or_default())
        } else {
            agent.get(&url).header("Authorization", &auth).call()
        };
        let mut response = response.expect("the service answers");
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// A GET with `cookie` (if any): status, `Location`, `Set-Cookie` and body.
    fn browse(&self, path: &str, cookie: Option<&str>) -> (u16, String, String, String) {
        let mut request = Service::agent().get(&format!("{}{path}", self.base));
        if let Some(c) = cookie {
            request = request.header("Cookie", c);
        }
        let mut response = request.call().expect("the service answers");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let (location, set_cookie) = (header("location"), header("set-cookie"));
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().unwrap_or_default();
        (status, location, set_cookie, body)
    }

    /// A fresh one-time login link for `token`'s principal.
    fn link(&self, token: &str) -> String {
        let (code, body) = self.api("POST", "/v1/ui/links", token, None);
        assert_eq!(code, 201, "{body}");
        format!("{}{}", self.base, body["path"].as_str().unwrap())
    }

    /// Waits until a cycle has started the quickstart's committed `chat-api` and decided the
    /// waiting `too-big` (more GPUs than the pool has); returns too-big's reason.
    fn running_and_waiting(&self) -> String {
        eventually("a revision in force", || {
            let (_, status) = self.api("GET", "/status", ADMIN, None);
            status["revision"].as_str().map(|_| ())
        });
        let (code, body) = self.api(
            "POST",
            "/v1/workloads",
            RESEARCH,
            Some(json!({"name": "too-big", "spec": {
                "tenant": "research", "sloClass": "batch", "pool": "h100-train",
                "gpu": {"count": 8}, "replicas": 4,
            }})),
        );
        assert_eq!(code, 201, "{body}");
        eventually("chat-api running", || {
            let (_, w) = self.api("GET", "/v1/workloads/chat-api", PRODUCT, None);
            (w["phase"] == "running").then_some(())
        });
        eventually("a reason for too-big", || {
            let (_, w) = self.api("GET", "/v1/workloads/too-big", RESEARCH, None);
            w["reason"].as_str().map(str::to_string)
        })
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Debian's Chromium, or a failure that says how to get it.
fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join("chromium"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "this test loads the fleet page in a real browser and needs Debian's `chromium` \
             on PATH: install it with `apt-get install chromium` (.ci/run does)"
        )
    })
}

/// Runs headless Chromium on `url` with `args`, in a fresh profile under `dir`; returns
/// stdout. A browser that has not finished after two minutes is killed and the test fails.
fn run_chromium(dir: &Path, args: &[String], url: &str) -> String {
    let profile = tempfile::tempdir_in(dir).unwrap();
    let mut child = Command::new(chromium())
        .args(["--headless", "--no-sandbox", "--disable-gpu"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish loading {url} in two minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_fleet_page_shows_pools_nodes_running_and_waiting_work_in_a_browser() {
    chromium();
    let service = Service::start();
    let reason = service.running_and_waiting();
    let work = tempfile::tempdir().unwrap();

    let dom = run_chromium(
        work.path(),
        &["--dump-dom".to_string()],
        &service.link(ADMIN),
    );
    for wanted in [
        "Signed in as operator",
        "Pool h100-train",
        "Pool h100-infer",
        "train-0",
        "infer-0",
        "product/chat-api",
        "research/too-big",
        reason.as_str(),
        "3g.40gb",
    ] {
        assert!(
            dom.contains(wanted),
            "{wanted} missing from the page:\n{dom}"
        );
    }
    assert!(
        !dom.contains("Sign in</button>"),
        "the link signed the browser in:\n{dom}"
    );

    let png = work.path().join("fleet.png");
    run_chromium(
        work.path(),
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1400,1000".to_string(),
        ],
        &service.link(ADMIN),
    );
    let bytes = std::fs::read(&png).expect("chromium saved the screenshot");
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "the screenshot is not a PNG"
    );
    assert!(
        bytes.len() > 20_000,
        "a near-empty screenshot: {} bytes",
        bytes.len()
    );
    // Kept for a person to look at: the test's temporary directory outlives the test.
    let kept = work.keep();
    println!(
        "fleet page screenshot: {}",
        kept.join("fleet.png").display()
    );
}

#[test]
fn sessions_need_a_login_codes_work_once_and_tenants_see_only_their_own() {
    let service = Service::start();
    service.running_and_waiting();

    // No session: to the login form.
    let (code, location, _, _) = service.browse("/ui", None);
    assert_eq!((code, location.as_str()), (303, "/ui/login"));
    let (code, _, _, _) = service.browse("/ui", Some("tessera_session=forged"));
    assert_eq!(code, 303, "an unknown session id is no session");
    let (code, _, _, form) = service.browse("/ui/login", None);
    assert_eq!(code, 200);
    assert!(form.contains("name=\"token\""), "{form}");

    // A link signs in once; the cookie holds a session id, not the token.
    let link = service.link(PRODUCT);
    let path = link.strip_prefix(&service.base).unwrap();
    let (code, location, set_cookie, _) = service.browse(path, None);
    assert_eq!((code, location.as_str()), (303, "/ui"));
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age="] {
        assert!(set_cookie.contains(attribute), "{attribute}: {set_cookie}");
    }
    assert!(!set_cookie.contains(PRODUCT), "{set_cookie}");
    let (code, _, again, page) = service.browse(path, None);
    assert_eq!(code, 401, "a used link is refused: {page}");
    assert!(again.is_empty() && page.contains("already used"), "{page}");

    // The tenant's page: its own workloads, not research's.
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    let (code, _, _, page) = service.browse("/ui", Some(&cookie));
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("Signed in as tenant product"), "{page}");
    assert!(page.contains("product/chat-api"), "{page}");
    assert!(
        !page.contains("too-big"),
        "research's workload shown to product:\n{page}"
    );
    assert!(
        !page.contains("research/"),
        "research named to product:\n{page}"
    );

    // The login form takes a token in the body; a wrong one is refused.
    let agent = Service::agent();
    let mut wrong = agent
        .post(&format!("{}/ui/login", service.base))
        .send_form([("token", "not-a-token-at-all")])
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    assert!(
        wrong
            .body_mut()
            .read_to_string()
            .unwrap()
            .contains("unknown token")
    );
    let right = agent
        .post(&format!("{}/ui/login", service.base))
        .send_form([("token", RESEARCH)])
        .unwrap();
    assert_eq!(right.status().as_u16(), 303);
    let cookie = right
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let (code, _, _, page) = service.browse("/ui", Some(&cookie));
    assert_eq!(code, 200);
    assert!(page.contains("research/too-big"), "{page}");
    assert!(
        !page.contains("chat-api"),
        "product's workload shown to research:\n{page}"
    );

    // A link needs a valid token.
    let (code, _) = service.api("POST", "/v1/ui/links", "no-such-token-0123456789", None);
    assert_eq!(code, 401);
}
