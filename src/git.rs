//! Opening the policy repository for `tessera plan`; reading a revision's files is
//! `tessera_source::git`'s, shared with the reconcile service.

use std::path::Path;

use anyhow::Context;
use git2::Repository;

pub use tessera_source::git::{Snapshot, normalize};

pub fn open(repo: &Path) -> anyhow::Result<Repository> {
    Repository::open(repo).with_context(|| format!("{}: not a Git repository", repo.display()))
}

/// See [`tessera_source::git::load`].
pub fn load(repo: &Repository, rev: &str, subdir: Option<&str>) -> anyhow::Result<Snapshot> {
    Ok(tessera_source::git::load(repo, rev, subdir)?)
}
