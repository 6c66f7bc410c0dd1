//! Finding and reading policy files: the compiler's only I/O.

use std::fs;
use std::path::{Path, PathBuf};

use thiserror::Error;

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

/// Files larger than this are refused before parsing: a policy file this large is a mistake or
/// an attack, and reading it would cost the memory the limit protects.
pub const MAX_FILE_BYTES: u64 = 32 << 20;

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

/// What a file looks like before it is parsed.
#[derive(Debug)]
pub enum Loaded {
    File(SourceFile),
    /// Refused unread; the compiler reports it as `input-too-large`.
    TooLarge {
        path: String,
        bytes: u64,
    },
    /// Not UTF-8; the compiler reports it as `yaml-syntax`.
    NotUtf8 {
        path: String,
    },
}

/// Every `*.yaml`/`*.yml` under `paths`, skipping hidden directories and files, in a stable
/// order. A path given explicitly is read whatever its extension.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<Loaded>, SourceError> {
    let mut found = Vec::new();
    for path in paths {
        let meta = fs::metadata(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => SourceError::NotFound {
                path: display(path),
            },
            _ => SourceError::Io {
                path: display(path),
                source,
            },
        })?;
        if meta.is_dir() {
            walk(path, &mut found)?;
        } else {
            found.push(path.clone());
        }
    }
    found.sort();
    found.dedup();
    found.iter().map(|p| load(p)).collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), SourceError> {
    let io = |source| SourceError::Io {
        path: display(dir),
        source,
    };
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(io)?
        .collect::<Result<_, _>>()
        .map_err(io)?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(io)?;
        if kind.is_dir() {
            walk(&path, out)?;
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            out.push(path);
        }
    }
    Ok(())
}

fn load(path: &Path) -> Result<Loaded, SourceError> {
    let io = |source| SourceError::Io {
        path: display(path),
        source,
    };
    let bytes = fs::metadata(path).map_err(io)?.len();
    if bytes > MAX_FILE_BYTES {
        return Ok(Loaded::TooLarge {
            path: display(path),
            bytes,
        });
    }
    let raw = fs::read(path).map_err(io)?;
    Ok(match String::from_utf8(raw) {
        Ok(text) => Loaded::File(SourceFile::new(display(path), text)),
        Err(_) => Loaded::NotUtf8 {
            path: display(path),
        },
    })
}

fn display(path: &Path) -> String {
    let s = path.to_string_lossy().replace('\\', "/");
    s.strip_prefix("./").map(str::to_owned).unwrap_or(s)
}
