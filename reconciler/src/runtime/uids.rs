//! The unprivileged users replicas run as: one per live replica, drawn from a range no login
//! user has, so that no two replicas (and never the service) share a uid; and handing a
//! replica's directories to its uid.

use std::io;
use std::path::Path;

/// Uids (each also used as the gid) the runtime gives replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub count: u32,
}

impl Default for UidRange {
    /// Far above the ranges distributions hand to login users (1000…) and to user namespaces
    /// in `/etc/subuid` (100000 + 65536·n), and below the 2³¹ some tools misread as negative.
    fn default() -> UidRange {
        UidRange {
            first: 1_900_000_000,
            count: 1_000_000,
        }
    }
}

impl UidRange {
    /// The lowest uid of the range not in `used`.
    pub fn allocate(&self, used: impl IntoIterator<Item = u32>) -> Option<u32> {
        let mut used: Vec<u32> = used.into_iter().filter(|u| self.contains(*u)).collect();
        used.sort_unstable();
        used.dedup();
        // The first gap in the sorted list, else the next after it.
        let offset = used
            .iter()
            .enumerate()
            .find(|(i, u)| **u != self.first + *i as u32)
            .map_or(used.len() as u32, |(i, _)| i as u32);
        (offset < self.count).then_some(self.first + offset)
    }

    pub fn contains(&self, uid: u32) -> bool {
        uid >= self.first && uid - self.first < self.count
    }
}

/// Gives `root` and everything under it to `uid:uid`, without following a symbolic link (the
/// previous attempt's workload may have left one pointing anywhere). Walks with a stack, not
/// recursion: the depth is the workload's to choose.
pub fn chown_tree(root: &Path, uid: u32) -> io::Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        std::os::unix::fs::lchown(&path, Some(uid), Some(uid))?;
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// An allocated uid is in the range and not in use; none is refused while one is free.
        #[test]
        fn allocation_finds_a_free_uid(used in proptest::collection::vec(0u32..12, 0..12)) {
            let range = UidRange { first: 100, count: 8 };
            let used: Vec<u32> = used.into_iter().map(|u| u + 98).collect();
            let free = (100..108).find(|u| !used.contains(u));
            let got = range.allocate(used.iter().copied());
            prop_assert_eq!(got, free);
        }
    }
}
