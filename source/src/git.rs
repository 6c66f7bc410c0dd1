//! The Git reader: a revision's policy files straight out of a repository (bare or with a work
//! tree), without a checkout: what `tessera plan` compiles in a pull-request job and what the
//! reconcile service applies. The rules are the directory reader's ([`crate::rules`]); a blob
//! of a link holds its target's name, not a policy, and is refused like a link on disk.

use std::path::{Path, PathBuf};

use git2::{ObjectType, Oid, Repository, Tree};

use crate::rules::{self, Budget, EntryKind, Limits, Verdict};
use crate::{Loaded, Refusal, SourceFile};

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
#[derive(Debug)]
pub struct Snapshot {
    /// The commit's full id.
    pub commit: String,
    /// `None` when the policy directory does not exist at this revision.
    pub loaded: Option<Vec<Loaded>>,
}

/// The files under `subdir` (the whole tree when `None`) at `rev` (a branch, tag, sha or any
/// `git rev-parse` expression), named by their path from the repository's root, under the
/// production [`Limits`].
pub fn load(repo: &Repository, rev: &str, subdir: Option<&str>) -> Result<Snapshot, TreeError> {
    load_with(repo, rev, subdir, Limits::default())
}

/// [`load`] under other limits.
pub fn load_with(
    repo: &Repository,
    rev: &str,
    subdir: Option<&str>,
    limits: Limits,
) -> Result<Snapshot, TreeError> {
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

    let start = prefix.as_deref().map(PathBuf::from).unwrap_or_default();
    let mut found = walk(repo, tree, start)?;
    // The order the directory reader gives: sorted by path, component by component.
    found.sort_by(|a, b| a.0.cmp(&b.0));

    let odb = repo.odb()?;
    let mut budget = Budget::new(limits);
    let mut loaded = Vec::with_capacity(found.len());
    for (path, entry) in found {
        let path = path.to_string_lossy().replace('\\', "/");
        let item = match entry {
            Found::Refused(refusal) => Loaded::Refused { path, refusal },
            Found::Blob(oid) => {
                let admitted = match budget.admit_file() {
                    Err(refusal) => Err(refusal),
                    Ok(()) => {
                        let (bytes, _) = odb.read_header(oid)?;
                        budget.admit_bytes(bytes as u64)
                    }
                };
                match admitted {
                    Err(refusal) => Loaded::Refused { path, refusal },
                    Ok(()) => {
                        let blob = repo.find_blob(oid)?;
                        match std::str::from_utf8(blob.content()) {
                            Ok(text) => Loaded::File(SourceFile::new(path, text)),
                            Err(_) => Loaded::Refused {
                                path,
                                refusal: Refusal::NotUtf8,
                            },
                        }
                    }
                }
            }
        };
        let stop = matches!(&item, Loaded::Refused { refusal, .. } if rules::ends_reading(refusal));
        loaded.push(item);
        if stop {
            break;
        }
    }
    Ok(Snapshot {
        commit: id,
        loaded: Some(loaded),
    })
}

enum Found {
    Blob(Oid),
    Refused(Refusal),
}

/// The policy entries below `tree`, with an explicit stack: Git trees nest as deep as their
/// writer likes, and libgit2's own walk recurses.
fn walk(
    repo: &Repository,
    tree: Tree<'_>,
    start: PathBuf,
) -> Result<Vec<(PathBuf, Found)>, TreeError> {
    let mut found = Vec::new();
    let mut pending = vec![(tree, start)];
    while let Some((tree, dir)) = pending.pop() {
        for entry in tree.iter() {
            let name = String::from_utf8_lossy(entry.name_bytes()).into_owned();
            let kind = match entry.filemode() {
                0o040000 => EntryKind::Dir,
                0o100644 | 0o100755 | 0o100664 => EntryKind::File,
                0o120000 => EntryKind::Symlink,
                0o160000 => EntryKind::Submodule,
                _ => EntryKind::Special("unknown Git entry"),
            };
            let path = dir.join(&name);
            match rules::classify(&name, kind) {
                Verdict::Descend => pending.push((repo.find_tree(entry.id())?, path)),
                Verdict::Read => found.push((path, Found::Blob(entry.id()))),
                Verdict::Refuse(refusal) => found.push((path, Found::Refused(refusal))),
                Verdict::Skip => {}
            }
        }
    }
    Ok(found)
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
