//! The discovery rules both readers apply: what an entry of the tree is to the compiler, and
//! the limits on what is read.

use crate::Refusal;

/// Files larger than this are refused before parsing: a policy file this large is a mistake or
/// an attack, and reading it would cost the memory the limit protects.
pub const MAX_FILE_BYTES: u64 = 32 << 20;

/// The most a whole policy tree may hold, all its files together. The largest real input, a
/// cluster-state snapshot of the reference fleet, is a few megabytes.
pub const MAX_TREE_BYTES: u64 = 64 << 20;

/// The most policy files a tree may hold.
pub const MAX_FILES: usize = 50_000;

/// The caps a reader applies. [`Limits::default`] is the production setting; tests lower it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub file_bytes: u64,
    pub tree_bytes: u64,
    pub files: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            file_bytes: MAX_FILE_BYTES,
            tree_bytes: MAX_TREE_BYTES,
            files: MAX_FILES,
        }
    }
}

/// What an entry is, as the reader sees it without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    Symlink,
    /// A Git submodule: a commit of another repository, never read.
    Submodule,
    /// A FIFO, socket or device.
    Special(&'static str),
}

/// What the reader does with an entry found below a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Descend,
    Read,
    Refuse(Refusal),
    Skip,
}

/// Hidden entries (`.git`, `.github`, editors' swap files) are never policy.
pub fn is_hidden(name: &str) -> bool {
    name.starts_with('.')
}

pub fn is_policy_name(name: &str) -> bool {
    name.ends_with(".yaml") || name.ends_with(".yml")
}

/// The rule for an entry named `name` found below a directory. A link or special file that
/// looks like policy is refused (a diagnostic), anything else that is not policy is skipped.
pub fn classify(name: &str, kind: EntryKind) -> Verdict {
    if is_hidden(name) {
        return Verdict::Skip;
    }
    match kind {
        EntryKind::Dir => Verdict::Descend,
        EntryKind::Submodule => Verdict::Skip,
        _ if !is_policy_name(name) => Verdict::Skip,
        EntryKind::File => Verdict::Read,
        EntryKind::Symlink => Verdict::Refuse(Refusal::Symlink),
        EntryKind::Special(kind) => Verdict::Refuse(Refusal::NotRegular { kind }),
    }
}

/// Counts what a reader has taken so far against [`Limits`].
#[derive(Debug)]
pub struct Budget {
    limits: Limits,
    files: usize,
    bytes: u64,
}

impl Budget {
    pub fn new(limits: Limits) -> Self {
        Budget {
            limits,
            files: 0,
            bytes: 0,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Takes one more file into the tree, before its size is known.
    pub fn admit_file(&mut self) -> Result<(), Refusal> {
        if self.files >= self.limits.files {
            return Err(Refusal::TooManyFiles {
                limit: self.limits.files,
            });
        }
        self.files += 1;
        Ok(())
    }

    /// Checks a file of `bytes` against the caps, and counts it when it will be read.
    pub fn admit_bytes(&mut self, bytes: u64) -> Result<(), Refusal> {
        if bytes > self.limits.file_bytes {
            return Err(Refusal::TooLarge {
                bytes,
                limit: self.limits.file_bytes,
            });
        }
        if self.bytes + bytes > self.limits.tree_bytes {
            return Err(Refusal::TreeTooLarge {
                limit: self.limits.tree_bytes,
            });
        }
        self.bytes += bytes;
        Ok(())
    }
}

/// True for the refusals after which a reader stops: the tree as a whole is over its caps.
pub fn ends_reading(refusal: &Refusal) -> bool {
    matches!(
        refusal,
        Refusal::TreeTooLarge { .. } | Refusal::TooManyFiles { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_special_files_are_refused_only_when_they_look_like_policy() {
        assert_eq!(
            classify("a.yaml", EntryKind::Symlink),
            Verdict::Refuse(Refusal::Symlink)
        );
        assert_eq!(classify("README", EntryKind::Symlink), Verdict::Skip);
        assert_eq!(classify(".a.yaml", EntryKind::Symlink), Verdict::Skip);
        assert_eq!(
            classify("p.yml", EntryKind::Special("FIFO")),
            Verdict::Refuse(Refusal::NotRegular { kind: "FIFO" })
        );
        assert_eq!(classify("sub.yaml", EntryKind::Dir), Verdict::Descend);
        assert_eq!(classify(".git", EntryKind::Dir), Verdict::Skip);
        assert_eq!(classify("vendor.yaml", EntryKind::Submodule), Verdict::Skip);
    }

    #[test]
    fn the_budget_counts_files_and_bytes() {
        let mut b = Budget::new(Limits {
            file_bytes: 10,
            tree_bytes: 15,
            files: 2,
        });
        assert_eq!(
            b.admit_bytes(11),
            Err(Refusal::TooLarge {
                bytes: 11,
                limit: 10
            })
        );
        assert_eq!(b.admit_file(), Ok(()));
        assert_eq!(b.admit_bytes(10), Ok(()));
        assert_eq!(b.admit_file(), Ok(()));
        assert_eq!(b.admit_bytes(6), Err(Refusal::TreeTooLarge { limit: 15 }));
        assert_eq!(b.admit_file(), Err(Refusal::TooManyFiles { limit: 2 }));
    }
}
