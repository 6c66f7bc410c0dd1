//! From a [`LaunchSpec`] to the wrapper's `Command`: checks first, so that a bad spec is an
//! error here rather than a process that fails in its log.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::cgroup::{Group, Limits};
use super::confine::{self, Sandbox};
use super::wrapper::{self, Files};
use super::{LaunchSpec, RuntimeError, devices, uids};

/// The command's `PATH` unless its spec sets one (the service's own is not passed on).
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Whether a workload name can name a directory: the `PendingWorkload` name rule
/// (`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`), which also rules out `.` and `..`.
pub fn check_name(name: &str) -> Result<(), RuntimeError> {
    let bytes = name.as_bytes();
    let inner = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'.';
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ok = !bytes.is_empty()
        && bytes.len() <= 253
        && bytes.iter().all(inner)
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge);
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::InvalidName(name.to_string()))
    }
}

/// A tenant name as the runtime id needs it: a name without `.` (a DNS label), so that
/// `<tenant>.<name>` names one workload.
pub fn check_tenant(tenant: &str) -> Result<(), RuntimeError> {
    if tenant.contains('.') || check_name(tenant).is_err() {
        return Err(RuntimeError::InvalidTenant(tenant.to_string()));
    }
    Ok(())
}

/// A replica ready to spawn: the wrapper command and, when confined, what confines it.
pub struct Prepared {
    pub cmd: Command,
    pub uid: Option<u32>,
    pub group: Option<Group>,
}

/// Builds the wrapper command for `spec`, with its replica's files; creates the directories
/// it needs. Confined (`sandbox` with the replica's `uid`), the command runs in its sandbox
/// and its cgroup; either way its environment is only what the spec sets, `PATH`, and the
/// runtime's own variables: nothing of the service's.
pub fn command(
    spec: &LaunchSpec,
    files: &Files,
    confined: Option<(&Sandbox, u32)>,
) -> Result<Prepared, RuntimeError> {
    let invalid = |reason: String| RuntimeError::InvalidSpec {
        workload: spec.workload.clone(),
        replica: spec.replica,
        reason,
    };
    for (key, value) in &spec.env {
        if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
            return Err(invalid(format!(
                "environment variable {key:?} cannot be set"
            )));
        }
    }
    if let Some(arg) = spec.command.iter().find(|a| a.contains('\0')) {
        return Err(invalid(format!(
            "command argument {arg:?} contains a NUL byte"
        )));
    }
    if let Some(device) = spec
        .devices
        .iter()
        .find(|d| d.is_empty() || d.contains([',', '\0']))
    {
        return Err(invalid(format!("device {device:?} is not a UUID")));
    }
    if let Some(p) = spec.mps_thread_percentage
        && !(1..=100).contains(&p)
    {
        return Err(invalid(format!(
            "MPS thread percentage {p} is not between 1 and 100"
        )));
    }
    let absolute = |p: &Path| {
        std::path::absolute(p).map_err(|source| RuntimeError::Io {
            path: p.to_path_buf(),
            source,
        })
    };
    let work_dir = absolute(&spec.work_dir)?;
    let checkpoint_dir = absolute(&spec.checkpoint_dir)?;
    for dir in [&work_dir, &checkpoint_dir] {
        create_dir(dir)?;
    }
    // Canonical, because the sandbox binds them at these paths and resolves its own.
    let canonical = |p: &Path| {
        p.canonicalize().map_err(|source| RuntimeError::Io {
            path: p.to_path_buf(),
            source,
        })
    };
    let work_dir = canonical(&work_dir)?;
    let checkpoint_dir = canonical(&checkpoint_dir)?;
    let program = resolve(spec, &work_dir)?;
    if let Some(parent) = files.log.parent() {
        create_private_dir(parent)?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&files.log)
        .map_err(|source| RuntimeError::Io {
            path: files.log.clone(),
            source,
        })?;
    let log_err = log.try_clone().map_err(|source| RuntimeError::Io {
        path: files.log.clone(),
        source,
    })?;

    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(wrapper::script())
        .arg(wrapper::NAME)
        .arg(&files.pid)
        .arg(&files.exit);
    let mut uid = None;
    let mut group = None;
    let mut procs = Vec::new();
    match confined {
        None => {
            cmd.arg(&program)
                .args(&spec.command[1..])
                .current_dir(&work_dir);
        }
        Some((sandbox, replica_uid)) => {
            let writable = [work_dir.as_path(), checkpoint_dir.as_path()];
            if !sandbox.shows(&program, &writable) {
                return Err(invalid(format!(
                    "program {} is outside what the sandbox shows (the system directories {} \
                     and the work directory {}): install it there",
                    program.display(),
                    confine::SYSTEM_DIRS.join(", "),
                    work_dir.display()
                )));
            }
            let devices = devices::nodes(
                &spec.gpus,
                &sandbox.config.device_root,
                &sandbox.config.mig_minors,
            )
            .map_err(invalid)?;
            for dir in writable {
                uids::chown_tree(dir, replica_uid).map_err(|source| RuntimeError::Io {
                    path: dir.to_path_buf(),
                    source,
                })?;
            }
            let replica_group = sandbox.cgroups.group(&spec.id(), spec.replica);
            let cgroup_io = |source: std::io::Error| RuntimeError::Cgroup {
                workload: spec.workload.clone(),
                replica: spec.replica,
                source,
            };
            replica_group
                .create(&Limits {
                    cpu_millis: spec.cpu_millis,
                    memory_bytes: spec.memory_bytes,
                    pids: sandbox.config.pids_max,
                })
                .map_err(cgroup_io)?;
            procs = replica_group.procs_files().map_err(cgroup_io)?;
            let inner = sandbox.command(
                replica_uid,
                &writable,
                &devices,
                &work_dir,
                &program,
                &spec.command[1..],
            );
            cmd.arg(inner.get_program())
                .args(inner.get_args())
                .current_dir("/");
            uid = Some(replica_uid);
            group = Some(replica_group);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .envs(&spec.env);
    // SAFETY: between fork and exec only async-signal-safe calls: write(2) to files opened
    // before the fork, and setsid(2).
    unsafe {
        cmd.pre_exec(move || {
            // Into the replica's cgroups before anything of the command runs, so that all it
            // ever forks is inside.
            for file in &procs {
                nix::unistd::write(file, b"0")?;
            }
            // Its own session and process group: a signal to the group reaches the command and
            // all it spawned, and nothing sent to the service's group or terminal reaches it.
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    // Set after the spec's environment, so that a spec cannot widen its own devices.
    cmd.env("CUDA_VISIBLE_DEVICES", spec.devices.join(","))
        .env("TESSERA_WORKLOAD", &spec.workload)
        .env("TESSERA_TENANT", &spec.tenant)
        .env("TESSERA_REPLICA", spec.replica.to_string())
        .env("TESSERA_CHECKPOINT_DIR", &checkpoint_dir);
    if let Some(p) = spec.mps_thread_percentage {
        cmd.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", p.to_string());
    }
    if let Some(dir) = &spec.resume_from {
        let dir = dir.canonicalize().or_else(|_| absolute(dir))?;
        cmd.env("TESSERA_RESUME_FROM", dir);
    }
    Ok(Prepared { cmd, uid, group })
}

/// The command's program as a path: searched in `PATH` (the spec's, else [`DEFAULT_PATH`]) when
/// it has no `/`, else taken relative to the work directory.
fn resolve(spec: &LaunchSpec, work_dir: &Path) -> Result<PathBuf, RuntimeError> {
    let Some(program) = spec.command.first().filter(|p| !p.is_empty()) else {
        return Err(RuntimeError::EmptyCommand {
            workload: spec.workload.clone(),
            replica: spec.replica,
        });
    };
    let not_executable = |path: PathBuf| RuntimeError::NotExecutable {
        workload: spec.workload.clone(),
        replica: spec.replica,
        path,
    };
    if program.contains('/') {
        let path = work_dir.join(program);
        return match executable(&path) {
            Some(true) => Ok(path),
            Some(false) => Err(not_executable(path)),
            None => Err(RuntimeError::CommandNotFound {
                workload: spec.workload.clone(),
                replica: spec.replica,
                command: program.clone(),
                searched: work_dir.display().to_string(),
            }),
        };
    }
    let search = search_path(&spec.env);
    let mut found_not_executable = None;
    for dir in std::env::split_paths(OsStr::new(&search)) {
        // An empty entry means the current directory, which for the command is its work dir.
        let candidate = work_dir.join(dir).join(program);
        match executable(&candidate) {
            Some(true) => return Ok(candidate),
            Some(false) => {
                found_not_executable.get_or_insert(candidate);
            }
            None => {}
        }
    }
    Err(match found_not_executable {
        Some(path) => not_executable(path),
        None => RuntimeError::CommandNotFound {
            workload: spec.workload.clone(),
            replica: spec.replica,
            command: program.clone(),
            searched: search,
        },
    })
}

fn search_path(env: &BTreeMap<String, String>) -> String {
    env.get("PATH")
        .cloned()
        .unwrap_or_else(|| DEFAULT_PATH.to_string())
}

/// `None` when there is no such file, else whether it is an executable file.
fn executable(path: &Path) -> Option<bool> {
    let meta = std::fs::metadata(path).ok()?;
    Some(meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

fn create_dir(dir: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(dir).map_err(|source| RuntimeError::Io {
        path: dir.to_path_buf(),
        source,
    })
}

/// A directory only the service may enter (the runtime's own files).
pub fn create_private_dir(dir: &Path) -> Result<(), RuntimeError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| RuntimeError::Io {
            path: dir.to_path_buf(),
            source,
        })
}
