//! Reading a policy tree: the files `tessera validate`, `compile` and `plan` compile, and the
//! files of a revision the reconcile service applies. One set of rules ([`rules`]) decides what
//! is read, and two readers apply it: [`discover`] to directories on disk, [`git::load`] to a
//! revision of a Git repository (with the `git` feature).
//!
//! The rules, the same for both readers: `*.yaml`/`*.yml` files, hidden files and directories
//! skipped, paths in sorted order; symbolic links and anything that is not a regular file
//! refused unread, never followed; a cap on each file and on the whole tree, past which nothing
//! more is read. What is refused is returned as [`Loaded::Refused`] so that the compiler reports
//! it at its path like any other problem.
//!
//! With the `verify` feature, [`signature`] decides whether a revision is signed by a key the
//! operator trusts (SSH and OpenPGP, verified in process) and [`commit`] reads a commit's
//! signature out of the repository: `tessera plan`, `tessera verify` and the service share it.

#[cfg(feature = "verify")]
pub mod commit;
mod disk;
#[cfg(feature = "git")]
pub mod git;
pub mod rules;
#[cfg(feature = "verify")]
pub mod signature;

pub use disk::{SourceError, discover, discover_with};
pub use rules::{Limits, MAX_FILE_BYTES, MAX_FILES, MAX_TREE_BYTES};

/// A file's text, under the name diagnostics will show for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// The path as the user gave it (or as found below a directory they gave), with `/`.
    pub path: String,
    pub text: String,
}

impl SourceFile {
    pub fn new(path: impl Into<String>, text: impl Into<String>) -> Self {
        SourceFile {
            path: path.into(),
            text: text.into(),
        }
    }
}

/// What a reader found at one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    File(SourceFile),
    /// Not read, or read but unusable; the compiler reports why at `path`.
    Refused {
        path: String,
        refusal: Refusal,
    },
}

impl Loaded {
    pub fn path(&self) -> &str {
        match self {
            Loaded::File(f) => &f.path,
            Loaded::Refused { path, .. } => path,
        }
    }
}

/// Why a path was not compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Larger than [`Limits::file_bytes`]; not read.
    TooLarge { bytes: u64, limit: u64 },
    /// Not UTF-8 text.
    NotUtf8,
    /// A symbolic link: its target may be anything (a device, a secret outside the tree).
    Symlink,
    /// A FIFO, socket or device: reading it could block or never end.
    NotRegular { kind: &'static str },
    /// Reading this file would take the tree past [`Limits::tree_bytes`]; it and every file
    /// after it in path order were left unread.
    TreeTooLarge { limit: u64 },
    /// The tree holds more than [`Limits::files`] policy files; this one and every file after
    /// it in path order were left unread.
    TooManyFiles { limit: usize },
}
