//! Opening the policy repository for `tessera plan`; reading a revision's files is shared with
//! the reconcile service (`tessera_reconciler::repo::tree`).

use std::path::Path;

use anyhow::Context;
use git2::Repository;

pub use tessera_reconciler::repo::tree::{Snapshot, normalize};

pub fn open(repo: &Path) -> anyhow::Result<Repository> {
    Repository::open(repo).with_context(|| format!("{}: not a Git repository", repo.display()))
}

/// See [`tessera_reconciler::repo::tree::load`].
pub fn load(repo: &Repository, rev: &str, subdir: Option<&str>) -> anyhow::Result<Snapshot> {
    Ok(tessera_reconciler::repo::tree::load(repo, rev, subdir)?)
}
