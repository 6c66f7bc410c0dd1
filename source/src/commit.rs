//! A commit's signature and the bytes it covers, read out of the repository for
//! [`crate::signature`].

use git2::Repository;

use crate::git::TreeError;

/// A commit as signature verification sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitSignature {
    /// The commit's full id.
    pub id: String,
    /// The `gpgsig` header; `None` for an unsigned commit.
    pub signature: Option<Vec<u8>>,
    /// The commit object without the `gpgsig` header.
    pub signed_data: Vec<u8>,
    /// The committer's time, Unix seconds.
    pub committed_at: i64,
}

impl CommitSignature {
    pub fn as_signed(&self) -> crate::signature::SignedCommit<'_> {
        crate::signature::SignedCommit {
            id: &self.id,
            signature: self.signature.as_deref(),
            signed_data: &self.signed_data,
            committed_at: self.committed_at,
        }
    }
}

/// Reads the signature of `rev` (any `git rev-parse` expression that names a commit).
pub fn signature(repo: &Repository, rev: &str) -> Result<CommitSignature, TreeError> {
    let commit = repo
        .revparse_single(rev)
        .and_then(|o| o.peel_to_commit())
        .map_err(|_| TreeError::NoSuchRevision(rev.to_string()))?;
    let id = commit.id();
    let committed_at = commit.committer().when().seconds();
    match repo.extract_signature(&id, None) {
        Ok((signature, signed)) => Ok(CommitSignature {
            id: id.to_string(),
            signature: Some(signature.to_vec()),
            signed_data: signed.to_vec(),
            committed_at,
        }),
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            let odb = repo.odb()?;
            let object = odb.read(id)?;
            Ok(CommitSignature {
                id: id.to_string(),
                signature: None,
                signed_data: object.data().to_vec(),
                committed_at,
            })
        }
        Err(e) => Err(e.into()),
    }
}
