//! The README's main job on a fresh clone: `tessera reconcile --once` on the quickstart, with
//! every default path. It must show the system working (geometry made, workloads started, where
//! to look next) and leave the clone's work tree clean.

mod common;

use std::path::Path;
use std::process::Command;

use git2::{Repository, RepositoryInitOptions, StatusOptions};

const QUICKSTART: &str = "examples/policies/quickstart";
const NODES: &str = "examples/nodes/quickstart.yaml";

/// A repository holding the quickstart policy on `main`, as a clone would.
fn fresh_clone(dir: &Path) -> Repository {
    let repo =
        Repository::init_opts(dir, RepositoryInitOptions::new().initial_head("main")).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(QUICKSTART);
    let target = dir.join(QUICKSTART);
    std::fs::create_dir_all(&target).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), target.join(entry.file_name())).unwrap();
    }
    let nodes = dir.join(NODES);
    std::fs::create_dir_all(nodes.parent().unwrap()).unwrap();
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join(NODES), nodes).unwrap();
    common::commit_all(&repo, 1, "quickstart");
    repo
}

fn main_job(clone: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "reconcile",
            "--repo",
            ".",
            "--branch",
            "main",
            "--path",
            QUICKSTART,
        ])
        .args(["--driver", "sim", "--nodes", NODES])
        .args(["--runtime", "none", "--once"])
        .current_dir(clone)
        .env("NO_COLOR", "1")
        .output()
        .expect("the tessera binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn dirty_paths(repo: &Repository) -> Vec<String> {
    let mut options = StatusOptions::new();
    options.include_untracked(true).recurse_untracked_dirs(true);
    repo.statuses(Some(&mut options))
        .unwrap()
        .iter()
        .filter_map(|s| s.path().ok().map(str::to_owned))
        .collect()
}

/// The number before `what` in a summary line such as `..., 12 GPU instances created`.
fn figure(text: &str, what: &str) -> usize {
    let at = text
        .find(what)
        .unwrap_or_else(|| panic!("no `{what}` in:\n{text}"));
    text[..at]
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figure before `{what}` in:\n{text}"))
}

#[test]
fn the_main_job_on_a_fresh_clone_makes_geometry_and_starts_work_and_keeps_the_tree_clean() {
    let dir = tempfile::tempdir().unwrap();
    let repo = fresh_clone(dir.path());

    let (ok, text) = main_job(dir.path());
    assert!(ok, "the main job ends Synced and Healthy:\n{text}");
    assert!(
        figure(&text, "GPU instances created") > 0,
        "geometry made:\n{text}"
    );
    assert!(text.contains("started: "), "workloads started:\n{text}");
    assert!(
        text.contains("chat-api ("),
        "the committed service runs:\n{text}"
    );
    assert!(
        text.contains("state kept in .tessera/") && text.contains("next: "),
        "where to look next:\n{text}"
    );

    // Every default path lies in one state directory, which ignores itself.
    let state = dir.path().join(".tessera");
    for kept in ["tessera.db", "sim-nodes.json", "mirror.git", ".gitignore"] {
        assert!(state.join(kept).exists(), "{kept} is under .tessera/");
    }
    assert_eq!(
        dirty_paths(&repo),
        Vec::<String>::new(),
        "the work tree stays clean"
    );

    // A second run finds the fleet as the first left it.
    let (ok, again) = main_job(dir.path());
    assert!(ok, "{again}");
    assert_eq!(figure(&again, "GPU instances created"), 0, "{again}");
    assert!(again.contains("started: no workload"), "{again}");
}
