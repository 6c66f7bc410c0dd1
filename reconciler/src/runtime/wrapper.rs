//! The `sh` wrapper every command runs under, and the files it leaves per replica.
//!
//! The service may be killed while its workloads run; they must keep running, and the next
//! instance must still learn how they end although it cannot `wait` for processes it did not
//! start. So each replica is `/bin/sh` running this script as the leader of its own process
//! group, with the command as a foreground child in the same group:
//!
//! - it writes its pid to `<replica>.pid`, so that a successor finds replicas it never recorded;
//! - its files are private (`umask 077`), and so are the command's unless it widens them;
//! - it traps every [`Signal`] with a no-op. A group signal reaches the command directly, once;
//!   the wrapper neither dies of it nor forwards it (a trapped signal is reset to its default in
//!   the command at `exec`, where an ignored one would stay ignored). While a foreground
//!   command runs, the shell defers the trap until it ends, so the wrapper always waits;
//! - when the command ends it writes `<its pid> <status>` to `<replica>.exit`: the status as
//!   the shell reports it, 128 + n for a command killed by signal n.
//!
//! Only `SIGKILL` of the group (or of the wrapper) leaves no exit file.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{ExitStatus, Signal};

/// `$0` of the wrapper, as `ps` shows it.
pub const NAME: &str = "tessera-run";

/// The script; `$1` is the pid file, `$2` the exit file, the rest the command (its program
/// already resolved to a path, so that it is never taken for a shell builtin).
pub fn script() -> String {
    let traps: Vec<&str> = Signal::ALL
        .iter()
        .map(|s| s.name().trim_start_matches("SIG"))
        .collect();
    format!(
        "trap : {}\n\
         umask 077\n\
         pid_file=$1\n\
         exit_file=$2\n\
         shift 2\n\
         echo $$ > \"$pid_file\"\n\
         \"$@\"\n\
         status=$?\n\
         echo \"$$ $status\" > \"$exit_file\"\n\
         exit \"$status\"\n",
        traps.join(" ")
    )
}

/// Where one replica's files live: `<root>/<workload>/<replica>.{pid,exit,log}`.
#[derive(Debug, Clone)]
pub struct Files {
    pub pid: PathBuf,
    pub exit: PathBuf,
    pub log: PathBuf,
    pub uid: PathBuf,
}

impl Files {
    pub fn new(root: &Path, workload: &str, replica: u32) -> Files {
        let dir = root.join(workload);
        Files {
            pid: dir.join(format!("{replica}.pid")),
            exit: dir.join(format!("{replica}.exit")),
            log: dir.join(format!("{replica}.log")),
            uid: dir.join(format!("{replica}.uid")),
        }
    }
}

/// The number in a pid (or uid) file, if the file is there and complete.
pub fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// How wrapper `pid`'s command ended, if its exit file says so. An exit file naming another
/// pid is a previous run's, not this one's.
pub fn read_exit(path: &Path, pid: u32) -> Option<ExitStatus> {
    let text = fs::read_to_string(path).ok()?;
    let (who, status) = text.trim().split_once(' ')?;
    if who.parse::<u32>().ok()? != pid {
        return None;
    }
    Some(from_shell_status(status.parse().ok()?))
}

/// The shell's `$?`: 128 + n for death by signal n (signals run to 64 on Linux). A command
/// that itself exits with 129..=192 reads as a signal too; `sh` cannot tell them apart.
pub fn from_shell_status(status: i32) -> ExitStatus {
    if (129..=192).contains(&status) {
        ExitStatus::Signal(status - 128)
    } else {
        ExitStatus::Code(status)
    }
}

/// Writes a file only the service may read.
pub fn write_private(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}

/// Removes a file if it exists.
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Whether `pid` is still a wrapper this root started, as opposed to a process that reused the
/// pid after the wrapper ended. Linux shows it in `/proc/<pid>/cmdline` (the wrapper's argument
/// list names its exit file); elsewhere only liveness is known.
pub fn is_ours(pid: u32, exit: &Path) -> bool {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    use std::os::unix::ffi::OsStrExt;

    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    match kill(Pid::from_raw(raw), None) {
        Ok(()) | Err(Errno::EPERM) => {}
        Err(_) => return false,
    }
    if !Path::new("/proc/self/cmdline").exists() {
        return true;
    }
    match fs::read(format!("/proc/{pid}/cmdline")) {
        // A zombie's command line is empty: it has ended.
        Ok(cmdline) => cmdline
            .split(|&b| b == 0)
            .any(|arg| arg == exit.as_os_str().as_bytes()),
        Err(_) => false,
    }
}
