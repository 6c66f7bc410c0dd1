//! `tessera agent`: fleet mode's node agent lives in the `tessera-fleet` binary (etcd's client
//! needs `protoc` to build, and this binary must build without it), so this verb runs
//! `tessera-fleet agent ARGS…`, the way git runs `git-foo` for `git foo`: first the one next to
//! this executable (where cargo puts every binary of the workspace), then the one on PATH.
//!
//! It replaces this process (`exec`) rather than running as its child, so that a service
//! manager's SIGTERM reaches the agent itself and its exit code is the command's.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};

/// The program that carries fleet mode.
const PROGRAM: &str = "tessera-fleet";

pub fn run(args: &[OsString]) -> anyhow::Result<ExitCode> {
    exec("agent", args)
}

/// Replaces this process with `tessera-fleet VERB ARGS…`; returns only when that failed.
pub fn exec(verb: &str, args: &[OsString]) -> anyhow::Result<ExitCode> {
    let here = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let Some(program) = find(here.as_deref(), std::env::var_os("PATH").as_deref()) else {
        bail!(
            "fleet mode is the `{PROGRAM}` binary, which was not found next to this one{} nor \
             on PATH: build it with `cargo build --release --workspace` (or `-p \
             tessera-fleet-cli`), which needs Debian's protobuf-compiler (`protoc`)",
            here.map(|h| format!(" ({})", h.display()))
                .unwrap_or_default()
        );
    };
    // `exec` returns only when it failed.
    let error = Command::new(&program).arg(verb).args(args).exec();
    Err(error).with_context(|| format!("cannot run {}", program.display()))
}

/// `tessera-fleet` in `here` (this executable's directory), else the first on `path`.
fn find(here: Option<&Path>, path: Option<&OsStr>) -> Option<PathBuf> {
    let beside = here.map(|dir| dir.join(PROGRAM));
    let on_path = path
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(PROGRAM));
    beside.into_iter().chain(on_path).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn program_in(dir: &Path, mode: u32) -> PathBuf {
        let path = dir.join(PROGRAM);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn the_binary_beside_this_one_wins_over_path() {
        let beside = tempfile::tempdir().unwrap();
        let on_path = tempfile::tempdir().unwrap();
        let expected = program_in(beside.path(), 0o755);
        program_in(on_path.path(), 0o755);
        let path = std::env::join_paths([on_path.path()]).unwrap();
        assert_eq!(find(Some(beside.path()), Some(&path)), Some(expected));
    }

    #[test]
    fn path_is_searched_in_order_and_non_executables_are_skipped() {
        let beside = tempfile::tempdir().unwrap();
        let first = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();
        program_in(first.path(), 0o644);
        let expected = program_in(second.path(), 0o755);
        let path = std::env::join_paths([first.path(), second.path()]).unwrap();
        assert_eq!(find(Some(beside.path()), Some(&path)), Some(expected));
        assert_eq!(find(Some(beside.path()), None), None);
    }
}
