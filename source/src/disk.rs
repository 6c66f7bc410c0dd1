//! The directory reader: policy files below the paths a user gave, never following a link.

use std::fs::{self, File, FileType};
use std::io::Read;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::rules::{self, Budget, EntryKind, Limits, Verdict};
use crate::{Loaded, Refusal, SourceFile};

#[derive(Debug, Error)]
pub enum SourceError {
    #[error("{path}: no such file or directory")]
    NotFound { path: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Every policy file under `paths` by the rules of [`crate::rules`], in path order, under the
/// production [`Limits`]. A path given explicitly is read whatever its extension, but like any
/// other it must be a directory or a regular file, not a link.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<Loaded>, SourceError> {
    discover_with(paths, Limits::default())
}

/// [`discover`] under other limits.
pub fn discover_with(paths: &[PathBuf], limits: Limits) -> Result<Vec<Loaded>, SourceError> {
    let mut found: Vec<(PathBuf, Option<Refusal>)> = Vec::new();
    for path in paths {
        let meta = fs::symlink_metadata(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => SourceError::NotFound {
                path: display(path),
            },
            _ => io(path, source),
        })?;
        match entry_kind(meta.file_type()) {
            EntryKind::Dir => walk(path, &mut found)?,
            EntryKind::File => found.push((path.clone(), None)),
            EntryKind::Symlink => found.push((path.clone(), Some(Refusal::Symlink))),
            EntryKind::Special(kind) => {
                found.push((path.clone(), Some(Refusal::NotRegular { kind })));
            }
            EntryKind::Submodule => {}
        }
    }
    // Sorted by path, component by component: the order the Git reader gives too.
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found.dedup_by(|a, b| a.0 == b.0);

    let mut budget = Budget::new(limits);
    let mut loaded = Vec::with_capacity(found.len());
    for (path, refused) in found {
        let item = match refused {
            Some(refusal) => refused_at(&path, refusal),
            None => match budget.admit_file() {
                Ok(()) => read(&path, &mut budget)?,
                Err(refusal) => refused_at(&path, refusal),
            },
        };
        let stop = matches!(&item, Loaded::Refused { refusal, .. } if rules::ends_reading(refusal));
        loaded.push(item);
        if stop {
            break;
        }
    }
    Ok(loaded)
}

/// The policy entries below `root`, depth first with an explicit stack: a tree's depth is the
/// repository writer's to choose, so it must not become this thread's stack depth.
fn walk(root: &Path, out: &mut Vec<(PathBuf, Option<Refusal>)>) -> Result<(), SourceError> {
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| io(&dir, e))?;
        for entry in entries {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let kind = entry.file_type().map_err(|e| io(&entry.path(), e))?;
            match rules::classify(&name, entry_kind(kind)) {
                Verdict::Descend => pending.push(entry.path()),
                Verdict::Read => out.push((entry.path(), None)),
                Verdict::Refuse(refusal) => out.push((entry.path(), Some(refusal))),
                Verdict::Skip => {}
            }
        }
    }
    Ok(())
}

/// Reads one file through a descriptor opened without following a link and without blocking
/// (a FIFO put in place after the walk cannot hang the reader), and only as much as the caps
/// allow (a device claims size 0 and never ends).
fn read(path: &Path, budget: &mut Budget) -> Result<Loaded, SourceError> {
    let file = match open_no_follow(path) {
        Ok(f) => f,
        Err(e) if is_link_error(&e) => return Ok(refused_at(path, Refusal::Symlink)),
        Err(e) => return Err(io(path, e)),
    };
    let meta = file.metadata().map_err(|e| io(path, e))?;
    match entry_kind(meta.file_type()) {
        EntryKind::File => {}
        EntryKind::Special(kind) => return Ok(refused_at(path, Refusal::NotRegular { kind })),
        _ => {
            return Ok(refused_at(path, Refusal::NotRegular { kind: "directory" }));
        }
    }
    let declared = meta.len();
    if let Err(refusal) = budget.admit_bytes(declared) {
        return Ok(refused_at(path, refusal));
    }
    let limit = budget.limits().file_bytes;
    let mut raw = Vec::with_capacity(declared.min(limit) as usize);
    file.take(limit + 1)
        .read_to_end(&mut raw)
        .map_err(|e| io(path, e))?;
    let actual = raw.len() as u64;
    // The file grew between the size check and the read.
    if actual > declared
        && let Err(refusal) = budget.admit_bytes(actual - declared)
    {
        let refusal = match refusal {
            Refusal::TooLarge { limit, .. } => Refusal::TooLarge {
                bytes: actual,
                limit,
            },
            other => other,
        };
        return Ok(refused_at(path, refusal));
    }
    if actual > limit {
        return Ok(refused_at(
            path,
            Refusal::TooLarge {
                bytes: actual,
                limit,
            },
        ));
    }
    Ok(match String::from_utf8(raw) {
        Ok(text) => Loaded::File(SourceFile::new(display(path), text)),
        Err(_) => refused_at(path, Refusal::NotUtf8),
    })
}

#[cfg(unix)]
fn open_no_follow(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> std::io::Result<File> {
    // The walk refused links already; without O_NOFOLLOW a link swapped in afterwards is a
    // race this platform leaves open.
    File::open(path)
}

/// `open` with `O_NOFOLLOW` on a link fails with `ELOOP`.
fn is_link_error(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        e.raw_os_error() == Some(libc::ELOOP)
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

fn entry_kind(t: FileType) -> EntryKind {
    if t.is_symlink() {
        return EntryKind::Symlink;
    }
    if t.is_dir() {
        return EntryKind::Dir;
    }
    if t.is_file() {
        return EntryKind::File;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return EntryKind::Special("FIFO");
        }
        if t.is_socket() {
            return EntryKind::Special("socket");
        }
        if t.is_char_device() {
            return EntryKind::Special("character device");
        }
        if t.is_block_device() {
            return EntryKind::Special("block device");
        }
    }
    EntryKind::Special("special file")
}

fn refused_at(path: &Path, refusal: Refusal) -> Loaded {
    Loaded::Refused {
        path: display(path),
        refusal,
    }
}

fn io(path: &Path, source: std::io::Error) -> SourceError {
    SourceError::Io {
        path: display(path),
        source,
    }
}

fn display(path: &Path) -> String {
    let s = path.to_string_lossy().replace('\\', "/");
    s.strip_prefix("./").map(str::to_owned).unwrap_or(s)
}
