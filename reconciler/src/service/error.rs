//! What a cycle, a fetch or the recovery fails with. Each is reported in the status as one
//! condition and logged; none stops the loop.

use crate::driver::DriverError;
use crate::repo::RepoError;
use crate::store::StoreError;

/// Why a cycle stopped before it finished.
#[derive(Debug, thiserror::Error)]
pub enum CycleError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("observe: {0}")]
    Observe(#[source] DriverError),
    /// The node side could not send the plan (fleet mode: etcd refused or was away).
    #[error("nodes: {0}")]
    Nodes(String),
    #[error("solve: {0}")]
    Solve(#[from] tessera_solver::SolveError),
    #[error("revision {commit} rejected; no earlier revision to keep")]
    RejectedWithoutFallback { commit: String },
    #[error("no policy revision fetched yet")]
    NoRevision,
}

/// Why following the branch failed; the revision in force stays.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("fetch: {0}")]
    Repo(#[from] RepoError),
    #[error("fetch: recording the revision: {0}")]
    Store(#[from] StoreError),
}

impl FetchError {
    /// Whether the branch itself is gone (deleted or renamed), as opposed to unreachable.
    pub fn branch_gone(&self) -> bool {
        matches!(self, FetchError::Repo(RepoError::NoBranch { .. }))
    }
}

/// Why the recovery at start left something open.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("recovery: {0}")]
    Store(#[from] StoreError),
}
