//! The embedded workload runtime: starts each replica's command as a local process with its
//! devices in `CUDA_VISIBLE_DEVICES`, signals it to checkpoint, kills it, and reports how it
//! ended, including for processes a previous instance of the service started.
//!
//! Every replica runs confined ([`Confinement::Sandbox`], `confine.rs`): its own uid, its own
//! mount view, PID namespace and cgroup, only its GPUs' device nodes, a clean environment.
//! A host that cannot sandbox gets every start refused with what it lacks, unless the
//! operator chose [`Confinement::Insecure`]; nothing ever runs unconfined by default.
//!
//! Every command runs under a small `sh` wrapper (`wrapper.rs`) that leads its own process
//! group and writes the command's exit status to a file, so the runtime learns how a process
//! ended whether it is its own child ([`Runtime::start`]) or an orphan it adopted
//! ([`Runtime::adopt`], [`Runtime::new`]) after a restart. Dropping a [`Runtime`] leaves its
//! processes running: the service's restart must not stop the fleet's work.
//!
//! A workload is known to the runtime by its id, `<tenant>.<name>` ([`workload_id`]): names
//! are per tenant, so two tenants' `train` must not share files or cgroups.
//!
//! Layout under the root: `<id>/<replica>.log` (stdout and stderr, appended across
//! attempts), `<replica>.pid` (until its exit is reported), `<replica>.exit`, `<replica>.uid`
//! (the uid a confined replica runs as). The root and its files are the service's alone (0700,
//! 0600); the sandbox never shows them.

mod cgroup;
mod confine;
mod devices;
mod launch;
mod signal;
mod uids;
mod wrapper;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Child;

use nix::errno::Errno;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

pub use confine::{Confinement, SYSTEM_DIRS, SandboxConfig};
pub use devices::GpuDevice;
pub use signal::Signal;
pub use uids::UidRange;

use cgroup::Group;
use confine::Sandbox;

/// What to start: one replica of a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    /// The workload's tenant and name: it is known to the runtime by [`LaunchSpec::id`].
    pub tenant: String,
    pub workload: String,
    pub replica: u32,
    /// Program and arguments; the program is looked up in `PATH` unless it has a `/`.
    pub command: Vec<String>,
    /// Extra environment; the runtime's own variables win over it.
    pub env: BTreeMap<String, String>,
    /// `GPU-...` or `MIG-...` UUIDs: `CUDA_VISIBLE_DEVICES` (empty: no GPU visible).
    pub devices: Vec<String>,
    /// The GPUs whose device nodes the sandbox shows (the same devices as `devices`, by
    /// index and MIG instance).
    pub gpus: Vec<GpuDevice>,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` for an MPS share, 1 to 100.
    pub mps_thread_percentage: Option<u32>,
    /// CPU limit in thousandths of a core; 0: none.
    pub cpu_millis: u64,
    /// Memory limit in bytes; 0: none.
    pub memory_bytes: u64,
    /// The command's working directory (created if missing).
    pub work_dir: PathBuf,
    /// `TESSERA_CHECKPOINT_DIR`: where it saves checkpoints (created if missing).
    pub checkpoint_dir: PathBuf,
    /// `TESSERA_RESUME_FROM`: the checkpoint a requeued workload resumes from.
    pub resume_from: Option<PathBuf>,
}

impl LaunchSpec {
    /// The runtime's id of the workload: [`workload_id`].
    pub fn id(&self) -> String {
        workload_id(&self.tenant, &self.workload)
    }
}

/// The runtime's id of a workload, `<tenant>.<name>`: what names its directory under the
/// root and its replicas' cgroups. One id per workload key, since a tenant name (a DNS label)
/// has no `.`: the first `.` ends it.
pub fn workload_id(tenant: &str, name: &str) -> String {
    format!("{tenant}.{name}")
}

/// A started replica: `pid` is its wrapper's, which is also its process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    pub pid: u32,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExitStatus {
    /// The command exited with this code.
    Code(i32),
    /// The command was killed by this signal.
    Signal(i32),
    /// It is gone and left no exit status: its wrapper was killed while this runtime could
    /// not wait for it (an adopted process).
    Unknown,
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Code(code) => write!(f, "exit code {code}"),
            ExitStatus::Signal(signal) => write!(f, "signal {signal}"),
            ExitStatus::Unknown => f.write_str("unknown exit"),
        }
    }
}

/// An exit status written by [`ExitStatus`]'s `Display` is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an exit status (`exit code N`, `signal N` or `unknown exit`)")]
pub struct NotAnExitStatus(pub String);

/// Reads back what `Display` writes: fleet mode's agents report exits as text.
impl std::str::FromStr for ExitStatus {
    type Err = NotAnExitStatus;

    fn from_str(s: &str) -> Result<ExitStatus, NotAnExitStatus> {
        let number = |rest: &str| {
            rest.parse::<i32>()
                .map_err(|_| NotAnExitStatus(s.to_string()))
        };
        if let Some(rest) = s.strip_prefix("exit code ") {
            Ok(ExitStatus::Code(number(rest)?))
        } else if let Some(rest) = s.strip_prefix("signal ") {
            Ok(ExitStatus::Signal(number(rest)?))
        } else if s == "unknown exit" {
            Ok(ExitStatus::Unknown)
        } else {
            Err(NotAnExitStatus(s.to_string()))
        }
    }
}

/// A process that ended, as [`Runtime::poll`] reports it (once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    pub pid: u32,
    pub workload: String,
    pub replica: u32,
    pub status: ExitStatus,
}

/// What a runtime call failed with.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "workload name {0:?} cannot name a directory: use lowercase letters, digits, '-' and \
         '.', starting and ending with a letter or digit"
    )]
    InvalidName(String),
    #[error(
        "tenant name {0:?} cannot name a directory: use lowercase letters, digits and '-', \
         starting and ending with a letter or digit"
    )]
    InvalidTenant(String),
    #[error("{workload}/{replica}: the command is empty")]
    EmptyCommand { workload: String, replica: u32 },
    #[error("{workload}/{replica}: command {command:?} not found (searched {searched})")]
    CommandNotFound {
        workload: String,
        replica: u32,
        command: String,
        searched: String,
    },
    #[error("{workload}/{replica}: {} is not an executable file", path.display())]
    NotExecutable {
        workload: String,
        replica: u32,
        path: PathBuf,
    },
    #[error("{workload}/{replica}: {reason}")]
    InvalidSpec {
        workload: String,
        replica: u32,
        reason: String,
    },
    #[error("{workload}/{replica} is already running as process {pid}")]
    AlreadyRunning {
        workload: String,
        replica: u32,
        pid: u32,
    },
    #[error("process {pid} is already tracked as {workload}/{replica}")]
    AlreadyTracked {
        pid: u32,
        workload: String,
        replica: u32,
    },
    #[error("unknown checkpoint signal {0:?}: use one of {names}", names = Signal::names())]
    UnknownSignal(String),
    #[error("process {0} was not started or adopted by this runtime")]
    UnknownProcess(u32),
    #[error("starting {workload}/{replica}: {source}")]
    Spawn {
        workload: String,
        replica: u32,
        source: std::io::Error,
    },
    #[error("sending {signal} to process group {pid}: {source}")]
    Signal {
        pid: u32,
        signal: &'static str,
        source: Errno,
    },
    #[error("{0}")]
    CannotConfine(String),
    #[error("{workload}/{replica}: no uid left in the range {first}..{end} for its sandbox", end = u64::from(*first) + u64::from(*count))]
    NoUidLeft {
        workload: String,
        replica: u32,
        first: u32,
        count: u32,
    },
    #[error("{workload}/{replica}: its cgroup: {source}")]
    Cgroup {
        workload: String,
        replica: u32,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The processes of this service instance.
pub struct Runtime {
    root: PathBuf,
    mode: Mode,
    processes: BTreeMap<u32, Process>,
    /// Groups of ended replicas that still had dying members when last removed.
    stale_groups: Vec<Group>,
}

enum Mode {
    Confined(Box<Sandbox>),
    /// Confinement was asked for and the host cannot provide it: why, for every start.
    Refused(String),
    Insecure,
}

struct Process {
    workload: String,
    replica: u32,
    /// The uid a confined replica runs as.
    uid: Option<u32>,
    handle: Handle,
    /// Sent `SIGKILL` by us: an adopted process gone without an exit file died of it.
    killed: bool,
}

enum Handle {
    /// Started by this instance: `wait`ed for.
    Child(Child),
    /// Started by a predecessor: watched through `/proc`, `kill(pid, 0)` and its exit file.
    Adopted,
}

impl Runtime {
    /// A runtime keeping its files under `root` (created if missing). Replicas whose pid file
    /// a predecessor left are adopted at once, so that none is forgotten, even one started
    /// just before the predecessor could record it.
    ///
    /// Under [`Confinement::Sandbox`] the host is checked here; if it cannot sandbox, the
    /// runtime is still made (it adopts, signals and kills as ever) but refuses every start
    /// with the reason ([`Runtime::refusal`]).
    pub fn new(
        root: impl Into<PathBuf>,
        confinement: Confinement,
    ) -> Result<Runtime, RuntimeError> {
        let root = root.into();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RuntimeError::Io { path, source }
        };
        launch::create_private_dir(&root)?;
        // Absolute, because wrappers are recognised by the exit path in their arguments.
        let root = root.canonicalize().map_err(io(&root))?;
        let mode = match confinement {
            Confinement::Insecure => Mode::Insecure,
            Confinement::Sandbox(config) => match Sandbox::probe(config, &instance_name(&root)) {
                Ok(sandbox) => Mode::Confined(Box::new(sandbox)),
                Err(why) => Mode::Refused(why),
            },
        };
        let mut runtime = Runtime {
            root,
            mode,
            processes: BTreeMap::new(),
            stale_groups: Vec::new(),
        };
        runtime.adopt_recorded()?;
        Ok(runtime)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Why starts are refused, when confinement was asked for and the host cannot provide it.
    pub fn refusal(&self) -> Option<&str> {
        match &self.mode {
            Mode::Refused(why) => Some(why),
            _ => None,
        }
    }

    /// Whether replicas run confined.
    pub fn is_confined(&self) -> bool {
        matches!(self.mode, Mode::Confined(_))
    }

    /// Starts one replica. Fails before spawning anything if the spec is invalid or its
    /// program cannot be found.
    pub fn start(&mut self, spec: &LaunchSpec) -> Result<Started, RuntimeError> {
        launch::check_tenant(&spec.tenant)?;
        launch::check_name(&spec.workload)?;
        let id = spec.id();
        launch::check_name(&id)?;
        if let Some((&pid, _)) = self
            .processes
            .iter()
            .find(|(_, p)| p.workload == id && p.replica == spec.replica)
        {
            return Err(RuntimeError::AlreadyRunning {
                workload: id.clone(),
                replica: spec.replica,
                pid,
            });
        }
        let files = wrapper::Files::new(&self.root, &id, spec.replica);
        let confined = match &self.mode {
            Mode::Refused(why) => return Err(RuntimeError::CannotConfine(why.clone())),
            Mode::Insecure => None,
            Mode::Confined(sandbox) => {
                let range = sandbox.config.uids;
                let uid = range
                    .allocate(self.processes.values().filter_map(|p| p.uid))
                    .ok_or_else(|| RuntimeError::NoUidLeft {
                        workload: id.clone(),
                        replica: spec.replica,
                        first: range.first,
                        count: range.count,
                    })?;
                Some((sandbox.as_ref(), uid))
            }
        };
        let launch::Prepared {
            mut cmd,
            uid,
            group,
        } = launch::command(spec, &files, confined)?;
        // A previous attempt's files would be read as this one's.
        for path in [&files.pid, &files.exit, &files.uid] {
            wrapper::remove(path).map_err(|source| RuntimeError::Io {
                path: path.clone(),
                source,
            })?;
        }
        if let Some(uid) = uid {
            wrapper::write_private(&files.uid, &uid.to_string()).map_err(|source| {
                RuntimeError::Io {
                    path: files.uid.clone(),
                    source,
                }
            })?;
        }
        let child = cmd.spawn().map_err(|source| {
            if let Some(group) = &group {
                group.remove();
            }
            RuntimeError::Spawn {
                workload: id.clone(),
                replica: spec.replica,
                source,
            }
        })?;
        let pid = child.id();
        self.processes.insert(
            pid,
            Process {
                workload: id,
                replica: spec.replica,
                uid,
                handle: Handle::Child(child),
                killed: false,
            },
        );
        Ok(Started { pid })
    }

    /// Watches a replica a previous instance started (its pid from the store), of the
    /// workload with runtime id `workload` ([`workload_id`]). Adopting a process already
    /// tracked for the same replica changes nothing.
    pub fn adopt(&mut self, workload: &str, replica: u32, pid: u32) -> Result<(), RuntimeError> {
        launch::check_name(workload)?;
        if let Some(p) = self.processes.get(&pid) {
            if p.workload == workload && p.replica == replica {
                return Ok(());
            }
            return Err(RuntimeError::AlreadyTracked {
                pid,
                workload: p.workload.clone(),
                replica: p.replica,
            });
        }
        let files = wrapper::Files::new(&self.root, workload, replica);
        let uid = wrapper::read_pid(&files.uid);
        self.processes.insert(
            pid,
            Process {
                workload: workload.to_string(),
                replica,
                uid,
                handle: Handle::Adopted,
                killed: false,
            },
        );
        Ok(())
    }

    /// Sends `signal` to the replica's whole process group.
    pub fn signal(&mut self, pid: u32, signal: Signal) -> Result<(), RuntimeError> {
        self.send(pid, signal.to_nix(), signal.name())
    }

    /// Kills the replica: its whole cgroup when confined (whatever left its process group
    /// with `setsid` or a double fork dies too), and its process group.
    pub fn kill(&mut self, pid: u32) -> Result<(), RuntimeError> {
        if let (Some(p), Mode::Confined(sandbox)) = (self.processes.get(&pid), &self.mode) {
            let group = sandbox.cgroups.group(&p.workload, p.replica);
            group.kill().map_err(|source| RuntimeError::Cgroup {
                workload: p.workload.clone(),
                replica: p.replica,
                source,
            })?;
        }
        self.send(pid, nix::sys::signal::Signal::SIGKILL, "SIGKILL")?;
        if let Some(p) = self.processes.get_mut(&pid) {
            p.killed = true;
        }
        Ok(())
    }

    /// The tracked pids of the replicas of the workload with runtime id `workload`.
    pub fn pids_of(&self, workload: &str) -> Vec<u32> {
        self.processes
            .iter()
            .filter(|(_, p)| p.workload == workload)
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// The processes that ended since the last call, each reported once; never blocks.
    pub fn poll(&mut self) -> Vec<Exited> {
        let mut exited = Vec::new();
        for (&pid, process) in &mut self.processes {
            let files = wrapper::Files::new(&self.root, &process.workload, process.replica);
            let Some(fallback) = process.ended(pid, &files.exit) else {
                continue;
            };
            // Written before the wrapper exits, so complete once it has.
            let mut status = wrapper::read_exit(&files.exit, pid).unwrap_or(fallback);
            if status == ExitStatus::Unknown && process.killed {
                status = ExitStatus::Signal(nix::sys::signal::Signal::SIGKILL as i32);
            }
            if wrapper::read_pid(&files.pid) == Some(pid) {
                // Reported: a successor must not adopt it again. Failing to remove it only
                // means a successor reports it once more.
                let _ = wrapper::remove(&files.pid);
            }
            exited.push(Exited {
                pid,
                workload: process.workload.clone(),
                replica: process.replica,
                status,
            });
        }
        for e in &exited {
            self.processes.remove(&e.pid);
            if let Mode::Confined(sandbox) = &self.mode {
                // What the command left behind (a detached child) ends with it.
                let group = sandbox.cgroups.group(&e.workload, e.replica);
                let _ = group.kill();
                self.stale_groups.push(group);
            }
        }
        // A group empties only once its members have died; until then it is kept to retry.
        self.stale_groups.retain(|g| !g.remove());
        exited
    }

    /// Adopts every replica with a pid file under the root.
    fn adopt_recorded(&mut self) -> Result<(), RuntimeError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RuntimeError::Io { path, source }
        };
        let mut found = BTreeSet::new();
        for entry in std::fs::read_dir(&self.root).map_err(io(&self.root))? {
            let dir = entry.map_err(io(&self.root))?.path();
            let Some(workload) = dir.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if launch::check_name(workload).is_err() || !dir.is_dir() {
                continue;
            }
            for file in std::fs::read_dir(&dir).map_err(io(&dir))? {
                let path = file.map_err(io(&dir))?.path();
                if path.extension().and_then(|e| e.to_str()) != Some("pid") {
                    continue;
                }
                let replica = path
                    .file_stem()
                    .and_then(|s| s.to_str()?.parse::<u32>().ok());
                // A pid file being written right now reads empty: its wrapper has only just
                // started, and is adopted from the store or found by the next instance.
                if let (Some(replica), Some(pid)) = (replica, wrapper::read_pid(&path)) {
                    found.insert((workload.to_string(), replica, pid));
                }
            }
        }
        for (workload, replica, pid) in found {
            // A pid reused across two pid files belongs to the newer wrapper; the other one is
            // reported gone when its exit file is read.
            let _ = self.adopt(&workload, replica, pid);
        }
        Ok(())
    }

    fn send(
        &mut self,
        pid: u32,
        signal: nix::sys::signal::Signal,
        name: &'static str,
    ) -> Result<(), RuntimeError> {
        let process = self
            .processes
            .get(&pid)
            .ok_or(RuntimeError::UnknownProcess(pid))?;
        if matches!(process.handle, Handle::Adopted) {
            let files = wrapper::Files::new(&self.root, &process.workload, process.replica);
            if !wrapper::is_ours(pid, &files.exit) {
                // Gone (perhaps its pid already reused): nothing to signal; `poll` reports it.
                return Ok(());
            }
        }
        let group = i32::try_from(pid).map_err(|_| RuntimeError::UnknownProcess(pid))?;
        match nix::sys::signal::killpg(Pid::from_raw(group), signal) {
            // The group is empty: it ended and `poll` will say how.
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(source) => Err(RuntimeError::Signal {
                pid,
                signal: name,
                source,
            }),
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Replicas keep running (a restart must not stop the fleet); only an emptied parent
        // group is tidied away.
        if let Mode::Confined(sandbox) = &self.mode {
            for group in &self.stale_groups {
                // Killed members take a moment to leave; a group still busy after that stays,
                // and the next runtime on this root empties it before reusing its name.
                for _ in 0..100 {
                    if group.remove() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            sandbox.cgroups.remove_parents_if_empty();
        }
    }
}

/// Names this runtime's cgroups: the same for every instance on the same root (so that a
/// successor finds its predecessor's groups), different for two services on one host.
fn instance_name(root: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    // FNV-1a: stable across builds and platforms, unlike the standard library's hasher.
    let hash = root
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("{hash:016x}")
}

impl Process {
    /// `None` while the wrapper runs; once it has ended, the status to report if it left no
    /// exit file.
    fn ended(&mut self, pid: u32, exit: &Path) -> Option<ExitStatus> {
        match &mut self.handle {
            Handle::Child(child) => match child.try_wait() {
                Ok(None) => None,
                Ok(Some(status)) => Some(from_wrapper_status(status)),
                // Reaped elsewhere (another runtime in this process adopted it).
                Err(_) => Some(ExitStatus::Unknown),
            },
            Handle::Adopted => {
                // An adopted pid may still be our child when the previous runtime lived in
                // this same process; reap it, or it would stay a zombie that looks alive.
                let raw = i32::try_from(pid).ok()?;
                match waitpid(Pid::from_raw(raw), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(_, code)) => Some(wrapper::from_shell_status(code)),
                    Ok(WaitStatus::Signaled(_, signal, _)) => {
                        Some(ExitStatus::Signal(signal as i32))
                    }
                    Ok(_) => None,
                    Err(_) => (!wrapper::is_ours(pid, exit)).then_some(ExitStatus::Unknown),
                }
            }
        }
    }
}

/// How the wrapper itself ended: it exits with the command's shell status, or dies of a signal
/// it could not trap (`SIGKILL`).
fn from_wrapper_status(status: std::process::ExitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => wrapper::from_shell_status(code),
        (None, Some(signal)) => ExitStatus::Signal(signal),
        (None, None) => ExitStatus::Unknown,
    }
}

#[cfg(test)]
mod exit_status_tests {
    use super::*;

    #[test]
    fn an_exit_status_reads_back_as_written() {
        for status in [
            ExitStatus::Code(0),
            ExitStatus::Code(-3),
            ExitStatus::Signal(9),
            ExitStatus::Unknown,
        ] {
            assert_eq!(status.to_string().parse::<ExitStatus>(), Ok(status));
        }
        let err = "exit code x".parse::<ExitStatus>().unwrap_err();
        assert!(
            err.to_string()
                .contains("`exit code x` is not an exit status")
        );
    }
}
