//! Reading policy files straight out of a Git repository (bare or with a work tree), at any
//! revision, without a checkout: what `tessera plan` compiles in a pull-request job and what the
//! reconcile service applies.
//!
//! The rules are the compiler's directory discovery (`tessera_compiler::source::discover`):
//! `*.yaml`/`*.yml` blobs, hidden files and directories skipped, paths in sorted order, blobs
//! over `MAX_FILE_BYTES` refused unread and non-UTF-8 blobs reported, both as the same
//! diagnostics as on disk. Symbolic links and submodules are skipped: a blob of a link holds
//! its target's name, not a policy.

use std::path::{Path, PathBuf};

use git2::{ObjectType, Repository, Tree, TreeWalkMode, TreeWalkResult};
use tessera_compiler::source::MAX_FILE_BYTES;
use tessera_compiler::{Loaded, SourceFile};

#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("revision {0:?} is not a commit in this repository")]
    NoSuchRevision(String),
    #[error("{path} is not a directory at revision {rev}")]
    NotADirectory { path: String, rev: String },
    #[error(transparent)]
    Git(#[from] git2::Error),
}

/// A revision's policy files.
pub struct Snapshot {
    /// The commit's full id.
    pub commit: String,
    /// `None` when the policy directory does not exist at this revision.
    pub loaded: Option<Vec<Loaded>>,
}

/// The files under `subdir` (the whole tree when `None`) at `rev` (a branch, tag, sha or any
/// `git rev-parse` expression), named by their path from the repository's root.
pub fn load(repo: &Repository, rev: &str, subdir: Option<&str>) -> Result<Snapshot, TreeError> {
    let commit = repo
        .revparse_single(rev)
        .and_then(|o| o.peel_to_commit())
        .map_err(|_| TreeError::NoSuchRevision(rev.to_string()))?;
    let id = commit.id().to_string();
    let root = commit.tree()?;
    let prefix = subdir.map(normalize).filter(|s| !s.is_empty());
    let tree: Tree<'_> = match &prefix {
        None => root,
        Some(p) => match root.get_path(Path::new(p)) {
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                return Ok(Snapshot {
                    commit: id,
                    loaded: None,
                });
            }
            Err(e) => return Err(e.into()),
            Ok(entry) if entry.kind() == Some(ObjectType::Tree) => repo.find_tree(entry.id())?,
            Ok(_) => {
                return Err(TreeError::NotADirectory {
                    path: p.clone(),
                    rev: rev.to_string(),
                });
            }
        },
    };

    let mut found: Vec<(PathBuf, git2::Oid)> = Vec::new();
    tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        let name = String::from_utf8_lossy(entry.name_bytes()).into_owned();
        if name.starts_with('.') {
            // In pre-order, `Skip` on a tree leaves out everything below it.
            return TreeWalkResult::Skip;
        }
        let regular = matches!(entry.filemode(), 0o100644 | 0o100755 | 0o100664);
        if regular && (name.ends_with(".yaml") || name.ends_with(".yml")) {
            let mut path = PathBuf::new();
            if let Some(p) = &prefix {
                path.push(p);
            }
            path.push(dir);
            path.push(&name);
            found.push((path, entry.id()));
        }
        TreeWalkResult::Ok
    })?;
    // The order `discover` gives files on disk: sorted by path, component by component.
    found.sort();

    let odb = repo.odb()?;
    let mut loaded = Vec::with_capacity(found.len());
    for (path, oid) in found {
        let path = path.to_string_lossy().replace('\\', "/");
        let (bytes, _) = odb.read_header(oid)?;
        if bytes as u64 > MAX_FILE_BYTES {
            loaded.push(Loaded::TooLarge {
                path,
                bytes: bytes as u64,
            });
            continue;
        }
        let blob = repo.find_blob(oid)?;
        loaded.push(match std::str::from_utf8(blob.content()) {
            Ok(text) => Loaded::File(SourceFile::new(path, text)),
            Err(_) => Loaded::NotUtf8 { path },
        });
    }
    Ok(Snapshot {
        commit: id,
        loaded: Some(loaded),
    })
}

/// `./policy/` → `policy`: a path inside the tree, without empty or `.` components.
pub fn normalize(subdir: &str) -> String {
    subdir
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    #[test]
    fn subdirectories_are_normalized() {
        assert_eq!(super::normalize("./policy/"), "policy");
        assert_eq!(super::normalize("a//b/./c"), "a/b/c");
        assert_eq!(super::normalize("."), "");
    }
}
