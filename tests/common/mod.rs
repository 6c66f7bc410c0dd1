//! Running the built `tessera` binary from end-to-end tests, and committing to test
//! repositories.
#![allow(dead_code)]

use std::process::Command;

use git2::{Repository, Signature, Time};

/// Commits the whole work tree (`git add -A && git commit`) at a fixed time (`tick` minutes
/// after a fixed epoch), so that commit ids are the same on every run; returns the id.
pub fn commit_all(repo: &Repository, tick: i64, message: &str) -> String {
    let mut index = repo.index().unwrap();
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .unwrap();
    index.update_all(["*"], None).unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = Signature::new(
        "Policy Author",
        "author@example.invalid",
        &Time::new(1_790_000_000 + tick * 60, 0),
    )
    .unwrap();
    let parent = repo.head().ok().map(|h| h.peel_to_commit().unwrap());
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)
        .unwrap()
        .to_string()
}

/// Polls `f` until it returns `Some`, for at most two minutes; a test that waits on a running
/// service says what it waited for, and never asserts on time.
pub fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Runs `tessera ARGS` in the package root without colour; returns exit code, stdout, stderr.
pub fn tessera(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("NO_COLOR", "1")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the tessera binary runs");
    (
        out.status.code().expect("exited normally"),
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

/// The plan fixture's tenants (`tests/data/plan/policy/tenants.yaml`) with fair share over time
/// set at the root.
pub fn with_fair_share(tenants: &str, half_life: &str) -> String {
    let anchor = "  sloClasses: [serving, training]\n";
    assert!(
        tenants.contains(anchor),
        "the fixture's root names its classes"
    );
    tenants.replacen(
        anchor,
        &format!("{anchor}  fairShare: {{usageHalfLife: {half_life}, resources: [gpu]}}\n"),
        1,
    )
}

/// The plan fixture's snapshot (`tests/data/plan/state.yaml`, which ends with its pending
/// list) with a usage record six hours old: research borrowed heavily, platform a little.
pub fn with_usage(state: &str) -> String {
    let hours = |used: u32, borrowed: u32| {
        format!("{{used: {{gpuHours: {used}}}, borrowed: {{gpuHours: {borrowed}}}}}")
    };
    format!(
        "{state}  usage:\n    asOf: \"2026-11-20T02:00:00Z\"\n    tenants:\n      org: {}\n      research: {}\n      product: {}\n      platform: {}\n",
        hours(900, 0),
        hours(700, 300),
        hours(20, 0),
        hours(180, 40)
    )
}
