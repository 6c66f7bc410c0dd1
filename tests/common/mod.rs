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
