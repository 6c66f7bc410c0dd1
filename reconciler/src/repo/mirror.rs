//! A bare mirror of the policy repository's branch, fetched with git2.
//!
//! The service never reads the remote's work tree: it fetches the branch into its own bare
//! repository and compiles the files of a commit from there, so an edit in progress on a
//! developer's checkout is never applied, only commits are.

use std::path::{Path, PathBuf};

use git2::{FetchOptions, RemoteCallbacks, Repository};

use tessera_source::commit::CommitSignature;
use tessera_source::git::{self as tree, Snapshot, TreeError};

/// Where the policy lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// A remote URL (`file://`, `https://`, `ssh://`, `git@host:path`) or a local path.
    pub url: String,
    pub branch: String,
    /// The policy directory inside the repository; the whole tree when `None`.
    pub subdir: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("cannot open the mirror at {path}: {source}")]
    Mirror { path: String, source: git2::Error },
    #[error("fetching branch {branch:?} from {url}: {source}")]
    Fetch {
        url: String,
        branch: String,
        source: git2::Error,
    },
    #[error(
        "branch {branch:?} does not exist in {url} (deleted or renamed?): the revision in \
         force stays until the branch is back or the service follows another one (--branch)"
    )]
    NoBranch { url: String, branch: String },
    #[error(
        "the policy repository {path} does not exist (moved or deleted?): restore it or \
         point --repo at it"
    )]
    MissingLocalRepository { path: String },
    #[error(transparent)]
    Tree(#[from] TreeError),
}

pub struct Mirror {
    repo: Repository,
    source: Source,
}

impl Mirror {
    /// Opens (or creates) the bare mirror at `dir` and points its `origin` at `source.url`.
    pub fn open(source: Source, dir: &Path) -> Result<Mirror, RepoError> {
        let mirror_err = |source| RepoError::Mirror {
            path: dir.display().to_string(),
            source,
        };
        let repo = match Repository::open_bare(dir) {
            Ok(repo) => repo,
            Err(_) => Repository::init_bare(dir).map_err(mirror_err)?,
        };
        let url = remote_url(&source.url);
        match repo.find_remote("origin") {
            Ok(remote) if remote.url().ok() == Some(url.as_str()) => {}
            Ok(_) => repo.remote_set_url("origin", &url).map_err(mirror_err)?,
            Err(_) => {
                repo.remote("origin", &url).map_err(mirror_err)?;
            }
        }
        Ok(Mirror { repo, source })
    }

    /// Fetches the branch and returns the commit it points at.
    pub fn fetch(&self) -> Result<String, RepoError> {
        let branch = &self.source.branch;
        let fetch_err = |source| RepoError::Fetch {
            url: self.source.url.clone(),
            branch: branch.clone(),
            source,
        };
        // libgit2 reads a path it cannot find as a URL and reports "unsupported URL protocol".
        if let Some(path) = local_path(&self.source.url)
            && !path.exists()
        {
            return Err(RepoError::MissingLocalRepository {
                path: path.display().to_string(),
            });
        }
        let mut remote = self.repo.find_remote("origin").map_err(fetch_err)?;
        let mut callbacks = RemoteCallbacks::new();
        let config = self.repo.config().ok();
        callbacks.credentials(move |url, username, allowed| {
            if allowed.is_ssh_key()
                && let Some(user) = username
            {
                return git2::Cred::ssh_key_from_agent(user);
            }
            if allowed.is_user_pass_plaintext()
                && let Some(config) = &config
            {
                return git2::Cred::credential_helper(config, url, username);
            }
            git2::Cred::default()
        });
        let mut options = FetchOptions::new();
        options.remote_callbacks(callbacks);
        // Forced: a force-push on the branch is followed, as Flux and Argo CD follow it.
        let refspec = format!("+refs/heads/{branch}:refs/remotes/origin/{branch}");
        remote
            .fetch(&[refspec.as_str()], Some(&mut options), None)
            .map_err(fetch_err)?;
        // A refspec whose branch is gone fetches nothing and leaves the tracking ref where it
        // was: ask what the remote advertised, and forget the branch if it is not there.
        let wanted = format!("refs/heads/{branch}");
        let advertised = remote
            .list()
            .map_err(fetch_err)?
            .iter()
            .any(|head| head.name() == wanted);
        if !advertised {
            if let Ok(mut tracking) = self
                .repo
                .find_reference(&format!("refs/remotes/origin/{branch}"))
            {
                tracking.delete().map_err(fetch_err)?;
            }
            return Err(RepoError::NoBranch {
                url: self.source.url.clone(),
                branch: branch.clone(),
            });
        }
        self.head()
    }

    /// The branch's commit as last fetched.
    pub fn head(&self) -> Result<String, RepoError> {
        let name = format!("refs/remotes/origin/{}", self.source.branch);
        let reference = self
            .repo
            .find_reference(&name)
            .map_err(|_| RepoError::NoBranch {
                url: self.source.url.clone(),
                branch: self.source.branch.clone(),
            })?;
        let commit = reference
            .peel_to_commit()
            .map_err(|source| RepoError::Fetch {
                url: self.source.url.clone(),
                branch: self.source.branch.clone(),
                source,
            })?;
        Ok(commit.id().to_string())
    }

    /// The policy files at `commit`.
    pub fn snapshot(&self, commit: &str) -> Result<Snapshot, RepoError> {
        Ok(tree::load(
            &self.repo,
            commit,
            self.source.subdir.as_deref(),
        )?)
    }

    /// The signature of `commit` and the bytes it covers.
    pub fn signature(&self, commit: &str) -> Result<CommitSignature, RepoError> {
        Ok(tessera_source::commit::signature(&self.repo, commit)?)
    }

    /// For a repository on this machine, the directory whose changes mean a new commit (its
    /// `.git`, or itself when bare), so that a commit is picked up at once rather than at the
    /// next fetch interval.
    pub fn local_git_dir(&self) -> Option<PathBuf> {
        let path = local_path(&self.source.url)?;
        let dot_git = path.join(".git");
        if dot_git.is_dir() {
            Some(dot_git)
        } else if path.join("HEAD").is_file() {
            Some(path)
        } else {
            None
        }
    }
}

/// A local path as a URL libgit2 fetches from; URLs are kept as they are.
fn remote_url(url: &str) -> String {
    match local_path(url) {
        Some(path) if !url.starts_with("file://") => {
            let absolute = std::fs::canonicalize(&path).unwrap_or(path);
            absolute.display().to_string()
        }
        _ => url.to_string(),
    }
}

fn local_path(url: &str) -> Option<PathBuf> {
    if let Some(rest) = url.strip_prefix("file://") {
        return Some(PathBuf::from(rest));
    }
    let is_url = url.contains("://") || (url.contains('@') && url.contains(':'));
    (!is_url).then(|| PathBuf::from(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_and_urls_are_told_apart() {
        assert_eq!(
            local_path("/srv/policy"),
            Some(PathBuf::from("/srv/policy"))
        );
        assert_eq!(
            local_path("file:///srv/policy"),
            Some(PathBuf::from("/srv/policy"))
        );
        assert_eq!(local_path("https://example.invalid/p.git"), None);
        assert_eq!(local_path("git@example.invalid:team/p.git"), None);
        assert_eq!(local_path("ssh://git@example.invalid/p.git"), None);
    }
}
