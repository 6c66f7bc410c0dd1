//! Signed revisions end to end: real SSH signatures (ssh-keygen) and OpenPGP signatures (gpg)
//! on real commits, `tessera verify`, `tessera plan --verify-signatures`, and
//! `tessera reconcile --verify-signatures` keeping the last trusted revision while the head is
//! unsigned, signed by an unknown key or tampered with, then recovering.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use git2::{Oid, Repository, RepositoryInitOptions, Signature, Time};

use common::{eventually, tessera};

/// A key that signs commits the way Git does (`gpg.format = ssh` or OpenPGP).
enum Signer {
    Ssh { key: PathBuf },
    Gpg { home: PathBuf, fingerprint: String },
}

impl Signer {
    fn sign(&self, payload: &str) -> String {
        let mut command = match self {
            Signer::Ssh { key } => {
                let mut c = Command::new("ssh-keygen");
                c.args(["-Y", "sign", "-n", "git", "-q", "-f"]).arg(key);
                c
            }
            Signer::Gpg { home, fingerprint } => {
                let mut c = Command::new("gpg");
                c.env("GNUPGHOME", home)
                    .args(["--batch", "--pinentry-mode", "loopback", "--passphrase", ""])
                    .args(["--armor", "--detach-sign", "--local-user", fingerprint]);
                c
            }
        };
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the signing tool runs");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(payload.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "signing failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

/// A new SSH key in `dir`; returns the signer and its `allowed_signers` line.
fn ssh_key(dir: &Path, name: &str) -> (Signer, String) {
    let key = dir.join(name);
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen runs");
    assert!(status.success());
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let mut parts = public.split_whitespace();
    let line = format!(
        "{name}@example.invalid namespaces=\"git\" {} {}\n",
        parts.next().unwrap(),
        parts.next().unwrap()
    );
    (Signer::Ssh { key }, line)
}

/// A new OpenPGP key in a GnuPG home of its own; returns the signer and its armored public key.
fn gpg_key(dir: &Path, name: &str) -> (Signer, String) {
    let home = dir.join(format!("gnupg-{name}"));
    std::fs::create_dir_all(&home).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let gpg = |args: &[&str]| {
        let out = Command::new("gpg")
            .env("GNUPGHOME", &home)
            .args(["--batch", "--pinentry-mode", "loopback", "--passphrase", ""])
            .args(args)
            .output()
            .expect("gpg runs");
        assert!(
            out.status.success(),
            "gpg {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let uid = format!("{name} <{name}@example.invalid>");
    gpg(&["--quick-gen-key", &uid, "ed25519", "sign", "never"]);
    let listing = gpg(&["--with-colons", "--list-keys", &uid]);
    let fingerprint = listing
        .lines()
        .find(|l| l.starts_with("fpr:"))
        .and_then(|l| l.split(':').nth(9))
        .unwrap()
        .to_string();
    let armored = gpg(&["--armor", "--export", &fingerprint]);
    (Signer::Gpg { home, fingerprint }, armored)
}

/// The policy repository on `main`, committed to with or without a signature.
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
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reconcile/policy");
        for f in ["fleet.yaml", "tenants.yaml"] {
            let full = dir.path().join("policy").join(f);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::copy(data.join(f), full).unwrap();
        }
        PolicyRepo {
            dir,
            repo,
            ticks: 0,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Commits the work tree (with a file changed so that every commit differs), signed by
    /// `signer` when given; moves `main` to it.
    fn commit(&mut self, message: &str, signer: Option<&Signer>) -> String {
        let id = self.commit_object(message, signer);
        self.point_main(id);
        id.to_string()
    }

    /// The commit `commit` would make, without moving `main` to it.
    fn commit_object(&mut self, message: &str, signer: Option<&Signer>) -> Oid {
        self.ticks += 1;
        std::fs::write(
            self.dir.path().join("policy/NOTES.md"),
            format!("{message}\n"),
        )
        .unwrap();
        let mut index = self.repo.index().unwrap();
        index
            .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
            .unwrap();
        index.write().unwrap();
        let tree = self.repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = Signature::new(
            "Policy Author",
            "author@example.invalid",
            &Time::new(1_790_000_000 + self.ticks * 60, 0),
        )
        .unwrap();
        let parent = self.repo.head().ok().map(|h| h.peel_to_commit().unwrap());
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        let buffer = self
            .repo
            .commit_create_buffer(&sig, &sig, message, &tree, &parents)
            .unwrap();
        let payload = buffer.as_str().unwrap().to_string();
        match signer {
            Some(s) => self
                .repo
                .commit_signed(&payload, &s.sign(&payload), None)
                .unwrap(),
            None => self
                .repo
                .odb()
                .unwrap()
                .write(git2::ObjectType::Commit, payload.as_bytes())
                .unwrap(),
        }
    }

    /// A copy of `commit` with its message changed and its signature kept: what an attacker
    /// with push access but no key would make of a signed commit.
    fn tamper(&mut self, commit: &str) -> String {
        let odb = self.repo.odb().unwrap();
        let object = odb.read(Oid::from_str(commit).unwrap()).unwrap();
        let text = String::from_utf8(object.data().to_vec()).unwrap();
        assert!(text.contains("gpgsig"), "the commit is signed");
        let (head, message) = text.split_once("\n\n").unwrap();
        let forged = format!(
            "{head}\n\n{} (and one GPU more for me)\n",
            message.trim_end()
        );
        let id = self
            .repo
            .odb()
            .unwrap()
            .write(git2::ObjectType::Commit, forged.as_bytes())
            .unwrap();
        self.point_main(id);
        id.to_string()
    }

    fn point_main(&self, id: Oid) {
        self.repo
            .reference("refs/heads/main", id, true, "test")
            .unwrap();
    }
}

struct Keys {
    _dir: tempfile::TempDir,
    ssh: Signer,
    stranger: Signer,
    gpg: Signer,
    gpg_stranger: Signer,
    trusted: PathBuf,
}

fn keys() -> Keys {
    let dir = tempfile::tempdir().unwrap();
    let (ssh, ssh_line) = ssh_key(dir.path(), "alice");
    let (stranger, _) = ssh_key(dir.path(), "mallory");
    let (gpg, armored) = gpg_key(dir.path(), "bob");
    let (gpg_stranger, _) = gpg_key(dir.path(), "eve");
    let trusted = dir.path().join("trusted-signers");
    std::fs::write(
        &trusted,
        format!("# The platform team's keys.\n{ssh_line}\n{armored}"),
    )
    .unwrap();
    Keys {
        _dir: dir,
        ssh,
        stranger,
        gpg,
        gpg_stranger,
        trusted,
    }
}

fn verify(repo: &PolicyRepo, rev: &str, trusted: &Path) -> (i32, serde_json::Value) {
    let (code, out, err) = tessera(&[
        "verify",
        "--repo",
        repo.path().to_str().unwrap(),
        rev,
        "--trusted-signers",
        trusted.to_str().unwrap(),
        "--output",
        "json",
    ]);
    let value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}\n{err}"));
    (code, value)
}

#[test]
fn verify_tells_trusted_commits_from_unsigned_unknown_and_tampered_ones() {
    let k = keys();
    let mut repo = PolicyRepo::new();

    let ssh = repo.commit("signed with SSH", Some(&k.ssh));
    let (code, v) = verify(&repo, &ssh, &k.trusted);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["signer"]["method"], "ssh");
    assert_eq!(v["signer"]["identity"], "alice@example.invalid");
    assert!(v["key"].as_str().unwrap().starts_with("SHA256:"));

    let pgp = repo.commit("signed with OpenPGP", Some(&k.gpg));
    let (code, v) = verify(&repo, "main", &k.trusted);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["commit"], pgp);
    assert_eq!(v["signer"]["method"], "openpgp");
    assert!(
        v["signer"]["identity"]
            .as_str()
            .unwrap()
            .contains("bob@example.invalid")
    );

    let unsigned = repo.commit("not signed", None);
    let (code, v) = verify(&repo, &unsigned, &k.trusted);
    assert_eq!(code, 1);
    assert_eq!(v["refusal"]["reason"], "unsigned");
    assert!(v["message"].as_str().unwrap().contains("key: none"), "{v}");

    for (signer, method) in [(&k.stranger, "ssh"), (&k.gpg_stranger, "openpgp")] {
        let unknown = repo.commit("signed by a stranger", Some(signer));
        let (code, v) = verify(&repo, &unknown, &k.trusted);
        assert_eq!(code, 1);
        assert_eq!(v["refusal"]["reason"], "unknown_key", "{v}");
        assert_eq!(v["refusal"]["method"], method);
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains(v["key"].as_str().unwrap())
        );
    }

    for signer in [&k.ssh, &k.gpg] {
        let signed = repo.commit("signed, then altered", Some(signer));
        assert_eq!(verify(&repo, &signed, &k.trusted).0, 0);
        let forged = repo.tamper(&signed);
        let (code, v) = verify(&repo, &forged, &k.trusted);
        assert_eq!(code, 1);
        assert_eq!(v["refusal"]["reason"], "bad_signature", "{v}");
    }
}

#[test]
fn a_bad_trust_file_is_a_usage_error_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let trusted = dir.path().join("allowed_signers");
    std::fs::write(
        &trusted,
        "# keys\nalice@example.invalid ssh-ed25519 AAAAnot-a-key\n",
    )
    .unwrap();
    let repo = PolicyRepo::new();
    let (code, _, err) = tessera(&[
        "verify",
        "--repo",
        repo.path().to_str().unwrap(),
        "HEAD",
        "--trusted-signers",
        trusted.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("allowed_signers:2:"), "{err}");
}

#[test]
fn plan_reports_whether_the_head_would_be_accepted() {
    let k = keys();
    let mut repo = PolicyRepo::new();
    let base = repo.commit("trusted base", Some(&k.ssh));
    let head = repo.commit("an unsigned change", None);
    let state = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reconcile/nodes.yaml");
    let plan = |head: &str, output: &str| {
        tessera(&[
            "plan",
            "--repo",
            repo.path().to_str().unwrap(),
            "--base",
            &base,
            "--head",
            head,
            "--path",
            "policy",
            "--state",
            state.to_str().unwrap(),
            "--verify-signatures",
            "--trusted-signers",
            k.trusted.to_str().unwrap(),
            "--output",
            output,
        ])
    };
    let (code, out, err) = plan(&head, "markdown");
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("would be refused"), "{out}");
    assert!(out.contains("is not signed"), "{out}");
    let (code, out, _) = plan(&head, "json");
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["signature"]["trusted"], false);
    let (code, out, err) = plan(&base, "human");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("accepted: commit"), "{out}");
}

/// A running `tessera reconcile`, found by the line it prints when it listens.
struct Service {
    child: std::process::Child,
    base: String,
}

impl Service {
    fn start(repo: &Path, work: &Path, extra: &[&str]) -> Service {
        use std::io::{BufRead, BufReader};
        let nodes = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reconcile/nodes.yaml");
        // `/status` shows why the service is Degraded to the operator only.
        let tokens = work.join("tokens.yaml");
        std::fs::write(&tokens, format!("admin: {ADMIN}\ntenants: {{}}\n")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["reconcile", "--repo"])
            .arg(repo)
            .args([
                "--branch",
                "main",
                "--path",
                "policy",
                "--driver",
                "sim",
                "--runtime",
                "none",
                "--nodes",
            ])
            .arg(nodes)
            .arg("--db")
            .arg(work.join("tessera.db"))
            .arg("--state-dir")
            .arg(work.join("state"))
            .args(["--listen", "127.0.0.1:0", "--cycle-period", "1s"])
            .arg("--tokens")
            .arg(&tokens)
            .args(extra)
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
        Service { child, base }
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(20)))
            .build()
            .into()
    }

    fn status(&self) -> serde_json::Value {
        let mut r = Self::agent()
            .get(&format!("{}/status", self.base))
            .header("Authorization", &format!("Bearer {ADMIN}"))
            .call()
            .expect("the service answers");
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
    }

    /// Posts a push hook with `headers`; returns the status code.
    fn hook(&self, body: &str, headers: &[(&str, &str)]) -> u16 {
        let mut request = Self::agent().post(&format!("{}/v1/hooks/git", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
            .content_type("application/json")
            .send(body.to_string())
            .expect("the service answers")
            .status()
            .as_u16()
    }
}

/// The operator's token of the services these tests start.
const ADMIN: &str = "operator-token-0123456789abcdef";

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the status is Degraded by a rejection of `commit` (its error names it).
fn names(status: &serde_json::Value, commit: &str) -> bool {
    status["health"] == "Degraded"
        && status["lastError"]
            .as_str()
            .is_some_and(|e| e.contains(&commit[..12]))
}

#[test]
fn reconcile_keeps_the_last_trusted_revision_until_a_trusted_commit_comes() {
    let k = keys();
    let mut repo = PolicyRepo::new();
    let trusted = repo.commit("trusted", Some(&k.ssh));
    let work = tempfile::tempdir().unwrap();
    let service = Service::start(
        repo.path(),
        work.path(),
        &[
            "--fetch-interval",
            "1s",
            "--verify-signatures",
            "--trusted-signers",
            k.trusted.to_str().unwrap(),
        ],
    );
    eventually("the trusted commit in force", || {
        let s = service.status();
        (s["revision"] == trusted && s["health"] == "Healthy").then_some(())
    });

    let unsigned = repo.commit("pushed without a signature", None);
    let s = eventually("degraded by the unsigned head", || {
        let s = service.status();
        (s["head"] == unsigned && s["health"] == "Degraded").then_some(s)
    });
    assert_eq!(
        s["revision"], trusted,
        "the last trusted revision stays in force"
    );
    let error = s["lastError"].as_str().unwrap();
    assert!(
        error.contains(&unsigned[..12]) && error.contains("key: none"),
        "{error}"
    );

    let stranger = repo.commit("signed by a stranger", Some(&k.stranger));
    // Degraded already: the status shows the new head as soon as it is fetched, and its
    // verdict once the next cycle has published it, so wait for the error that names it.
    let s = eventually("degraded by the stranger's head", || {
        let s = service.status();
        (s["head"] == stranger && names(&s, &stranger)).then_some(s)
    });
    assert_eq!(s["revision"], trusted);
    let error = s["lastError"].as_str().unwrap();
    assert!(
        error.contains("SHA256:") && error.contains("not a trusted signer"),
        "{error}"
    );

    // Signed, then altered before it was ever pushed: the service only sees the forgery.
    let signed = repo.commit_object("signed again", Some(&k.gpg));
    let forged = repo.tamper(&signed.to_string());
    let s = eventually("degraded by the forged head", || {
        let s = service.status();
        (s["head"] == forged && names(&s, &forged)).then_some(s)
    });
    assert_eq!(s["revision"], trusted);
    assert!(
        s["lastError"]
            .as_str()
            .unwrap()
            .contains("does not match the commit"),
        "{s}"
    );

    let recovered = repo.commit("trusted again", Some(&k.gpg));
    eventually("recovered on the next trusted commit", || {
        let s = service.status();
        (s["revision"] == recovered && s["health"] == "Healthy").then_some(())
    });
}

#[test]
fn a_signed_push_hook_fetches_at_once_and_a_forged_one_is_refused() {
    let mut repo = PolicyRepo::new();
    let first = repo.commit("first", None);
    let work = tempfile::tempdir().unwrap();
    let secret = "a-webhook-secret-0123456789";
    std::fs::write(work.path().join("hook-secret"), format!("{secret}\n")).unwrap();
    // An hour between fetches: only a hook (or the file watcher on this local repository)
    // brings the next commit in. The watcher is why this test does not prove that a refused
    // hook fetches nothing; `reconciler/tests/hooks.rs` does, without a loop.
    let service = Service::start(
        repo.path(),
        work.path(),
        &[
            "--fetch-interval",
            "1h",
            "--webhook-secret-file",
            work.path().join("hook-secret").to_str().unwrap(),
        ],
    );
    eventually("the first commit in force", || {
        (service.status()["revision"] == first).then_some(())
    });
    let body = r#"{"ref":"refs/heads/main"}"#;
    assert_eq!(
        service.hook(
            body,
            &[
                ("X-GitHub-Event", "push"),
                ("X-Hub-Signature-256", "sha256=00")
            ]
        ),
        401
    );
    assert_eq!(
        service.hook(body, &[("X-Gitlab-Token", "not-the-secret-at-all")]),
        401
    );
    assert_eq!(service.hook(body, &[]), 401);
    let second = repo.commit("second", None);
    assert_eq!(
        service.hook(
            body,
            &[("X-Gitlab-Token", secret), ("X-Gitlab-Event", "Push Hook")]
        ),
        202
    );
    eventually("the pushed commit fetched", || {
        (service.status()["head"] == second).then_some(())
    });
}
