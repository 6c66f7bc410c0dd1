//! `tessera plan` on the acme fleet: a Git repository with the acme policy at two revisions
//! (the head halves one project's training guarantee, so its running work turns into borrowing),
//! planned against the acme snapshot through the real binary, five times. Prints the wall time;
//! never asserts it.
//!
//! `cargo bench --bench plan_acme`

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use git2::{Repository, Signature, Time};

fn copy_policy(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("acme is readable") {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name();
        // The snapshot is the plan's --state, not part of the policy.
        if name == "state" {
            continue;
        }
        let target = to.join(&name);
        if path.is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_policy(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

fn commit(repo: &Repository, message: &str, tick: i64) -> String {
    let mut index = repo.index().unwrap();
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = Signature::new(
        "bench",
        "bench@example.invalid",
        &Time::new(1_790_000_000 + tick, 0),
    )
    .unwrap();
    let parent = repo.head().ok().map(|h| h.peel_to_commit().unwrap());
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)
        .unwrap()
        .to_string()
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let acme = root.join("examples/policies/acme");
    let state = acme.join("state/cluster-state.yaml");
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let policy = dir.path().join("policy");
    std::fs::create_dir_all(&policy).unwrap();
    copy_policy(&acme, &policy);
    let base = commit(&repo, "acme", 0);

    // A project (a leaf: lowering it never breaks the nesting) gives up half its guarantee.
    let team = policy.join("tenants/research/alignment.yaml");
    let text = std::fs::read_to_string(&team).expect("acme has tenants/research/alignment.yaml");
    let changed = halve_last_guarantee(&text);
    assert_ne!(changed, text, "the bench needs a guarantee to change");
    std::fs::write(&team, changed).unwrap();
    let head = commit(&repo, "alignment-interp: half the training guarantee", 60);

    let bin = env!("CARGO_BIN_EXE_tessera");
    let args = [
        "plan",
        "--repo",
        dir.path().to_str().unwrap(),
        "--base",
        &base,
        "--head",
        &head,
        "--path",
        "policy",
        "--state",
        state.to_str().unwrap(),
        "--output",
        "json",
    ];
    let mut times = Vec::new();
    let mut summary = String::new();
    for _ in 0..5 {
        let start = Instant::now();
        let out = Command::new(bin).args(args).output().expect("tessera runs");
        times.push(start.elapsed().as_secs_f64());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        summary = format!(
            "{}; decisions computed: {}, workload changes: {}",
            v["summary"]
                .as_str()
                .unwrap_or_default()
                .trim_end_matches('.'),
            v["decisions"]["computed"],
            v["decisions"]["diff"]["workloads"]
                .as_array()
                .map_or(0, Vec::len)
        );
    }
    times.sort_by(f64::total_cmp);
    println!("plan_acme: {summary}");
    println!(
        "  wall time over 5 runs (git read, two compiles, two solves, diff, JSON): min {:.2} s, median {:.2} s, max {:.2} s",
        times[0], times[2], times[4]
    );
}

/// The last `guarantee: {h100-train: N, ...}` of the file, halved.
fn halve_last_guarantee(text: &str) -> String {
    let Some(at) = text.rfind("guarantee: {h100-train: ") else {
        return text.to_owned();
    };
    let at = at + "guarantee: {".len();
    let start = at + "h100-train: ".len();
    let end = start
        + text[start..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(0);
    let Ok(n) = text[start..end].parse::<u64>() else {
        return text.to_owned();
    };
    format!("{}{}{}", &text[..start], n / 2, &text[end..])
}
