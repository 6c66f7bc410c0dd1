//! Confining a replica: what the host must offer, checked once, and the command line that runs
//! a replica inside its sandbox.
//!
//! The sandbox is bubblewrap (`bwrap`), run by the (root) service without a user namespace:
//! it makes a PID, IPC, UTS and cgroup namespace and a mount view built from an allow-list (the
//! system directories read-only, a private `/tmp` and `/dev`, the replica's own work and
//! checkpoint directories writable, its GPUs' device nodes); inside, `setpriv` (util-linux)
//! switches to the replica's uid with no groups, no capabilities (bounding set included) and
//! `no_new_privs` before the command runs. bubblewrap rather than raw namespaces: it is the
//! small, audited tool Flatpak and others trust with the same job, and it gets the ordering
//! subtleties right (mount propagation, `pivot_root`, a reaping init as PID 1). It runs as root
//! rather than unprivileged in a user namespace because it must reach the bind sources under
//! the service's private (0700) state directory, and because hosts that restrict unprivileged
//! user namespaces (Ubuntu's AppArmor policy) are then supported as they are. The chain, under
//! the runtime's `sh` wrapper (`wrapper.rs`):
//!
//! `env --ignore-signal=… bwrap … -- setpriv --reuid U … -- env --default-signal=… program`
//!
//! A checkpoint signal goes to the wrapper's process group; `bwrap` must not die of it while
//! the command saves its work, so it runs with the checkpoint signals ignored, and the command
//! gets the defaults back at its `exec`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::Signal;
use super::cgroup::Cgroups;
use super::uids::UidRange;

/// How workloads run.
#[derive(Debug, Clone)]
pub enum Confinement {
    /// Each replica in its own sandbox (the default); starts are refused where the host cannot
    /// provide one.
    Sandbox(SandboxConfig),
    /// As plain child processes of the service, with its uid and its view of the machine.
    /// For trying tessera out on a machine that cannot sandbox, never for a shared fleet.
    Insecure,
}

/// What a sandbox is made of.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub uids: UidRange,
    /// Paths a replica must not see even where they lie under a directory it is shown (the
    /// service's state directory, store and tokens file, say under `/etc` or `/opt`).
    pub hidden: Vec<PathBuf>,
    /// Where the host's device nodes are (`/dev`; tests point it at fake nodes).
    pub device_root: PathBuf,
    /// The NVIDIA driver's table of MIG capability minors.
    pub mig_minors: PathBuf,
    /// The most processes (and threads) one replica may have.
    pub pids_max: u64,
    /// Where `bwrap`, `setpriv` and `env` are looked for: never the service's `PATH`, which
    /// an operator's shell may have pointed anywhere.
    pub tool_dirs: Vec<PathBuf>,
}

impl Default for SandboxConfig {
    fn default() -> SandboxConfig {
        SandboxConfig {
            uids: UidRange::default(),
            hidden: Vec::new(),
            device_root: PathBuf::from("/dev"),
            mig_minors: PathBuf::from("/proc/driver/nvidia-caps/mig-minors"),
            pids_max: 32_768,
            tool_dirs: ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
                .map(PathBuf::from)
                .to_vec(),
        }
    }
}

/// The system directories a replica sees, read-only (those the host has).
pub const SYSTEM_DIRS: [&str; 10] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys",
];

/// A host able to sandbox, with the tools found.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub config: SandboxConfig,
    pub cgroups: Cgroups,
    bwrap: PathBuf,
    setpriv: PathBuf,
    env: PathBuf,
}

impl Sandbox {
    /// Checks everything a sandbox needs and says, in one message, all that is missing.
    pub fn probe(config: SandboxConfig, instance: &str) -> Result<Sandbox, String> {
        let mut missing = Vec::new();
        if !nix::unistd::geteuid().is_root() {
            missing.push(
                "root (the service makes each workload's namespaces and cgroups and switches it to \
                 its own uid)"
                    .to_string(),
            );
        }
        let find_tool = |name: &str| {
            config
                .tool_dirs
                .iter()
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        };
        let bwrap = find_tool("bwrap");
        if bwrap.is_none() {
            missing.push("bubblewrap (`bwrap`: apt-get install bubblewrap)".to_string());
        }
        let setpriv = find_tool("setpriv");
        if setpriv.is_none() {
            missing.push("setpriv (util-linux)".to_string());
        }
        let env = find_tool("env").filter(|env| {
            Command::new(env)
                .args(["--ignore-signal=USR1", "--default-signal=USR2", "true"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .env_clear()
                .status()
                .is_ok_and(|s| s.success())
        });
        if env.is_none() {
            missing.push(
                "an `env` with --ignore-signal and --default-signal (GNU coreutils 8.31 or later)"
                    .to_string(),
            );
        }
        let cgroups = Cgroups::detect(instance).map_err(|e| missing.push(e)).ok();
        let (Some(bwrap), Some(setpriv), Some(env), Some(cgroups), true) =
            (bwrap, setpriv, env, cgroups.clone(), missing.is_empty())
        else {
            if let Some(cgroups) = cgroups {
                cgroups.remove_parents_if_empty();
            }
            return Err(refusal(&missing));
        };
        let sandbox = Sandbox {
            config,
            cgroups,
            bwrap,
            setpriv,
            env,
        };
        // The tools are there; whether the kernel lets them make namespaces (a container
        // without CAP_SYS_ADMIN, a seccomp policy) shows only by trying.
        let uid = sandbox.config.uids.first;
        let mut trial = sandbox.command(uid, &[], &[], Path::new("/"), Path::new("/bin/true"), &[]);
        let out = trial
            .stdin(Stdio::null())
            .env_clear()
            .output()
            .map_err(|e| {
                sandbox.cgroups.remove_parents_if_empty();
                refusal(&[format!("a working bwrap ({e})")])
            })?;
        if !out.status.success() {
            sandbox.cgroups.remove_parents_if_empty();
            return Err(refusal(&[format!(
                "namespaces for bwrap (a trial sandbox failed: {}; a container needs \
                 CAP_SYS_ADMIN and a seccomp profile that allows unshare and mount)",
                String::from_utf8_lossy(&out.stderr).trim()
            )]));
        }
        Ok(sandbox)
    }

    /// The command running `program args` as `uid` in a sandbox showing `writable` (bound at the
    /// same paths) and the device nodes `devices` (names under `/dev`), starting in `work_dir`.
    pub fn command(
        &self,
        uid: u32,
        writable: &[&Path],
        devices: &[String],
        work_dir: &Path,
        program: &Path,
        args: &[String],
    ) -> Command {
        let signals = Signal::ALL.map(Signal::name).join(",");
        let mut cmd = Command::new(&self.env);
        cmd.arg(format!("--ignore-signal={signals}"))
            .arg(&self.bwrap)
            .args([
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]);
        for dir in SYSTEM_DIRS {
            cmd.args(["--ro-bind-try", dir, dir]);
        }
        cmd.args(["--proc", "/proc", "--dev", "/dev"])
            .args(["--perms", "1777", "--tmpfs", "/tmp"]);
        for hidden in self.masked() {
            if hidden.is_dir() {
                cmd.arg("--tmpfs").arg(hidden);
            } else {
                cmd.args(["--ro-bind", "/dev/null"]).arg(hidden);
            }
        }
        // bwrap would make the directories above a bind 0700 root, which the replica's uid
        // could not pass through: made here, traversable but not listable.
        let masked = self.masked();
        let mut made = std::collections::BTreeSet::new();
        for dir in writable {
            for ancestor in dir
                .ancestors()
                .skip(1)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
            {
                if made_by_sandbox(ancestor, &masked) && made.insert(ancestor.to_path_buf()) {
                    cmd.args(["--perms", "0711", "--dir"]).arg(ancestor);
                }
            }
        }
        for dir in writable {
            cmd.arg("--bind").arg(dir).arg(dir);
        }
        for name in devices {
            cmd.arg("--dev-bind")
                .arg(self.config.device_root.join(name))
                .arg(Path::new("/dev").join(name));
        }
        cmd.arg("--chdir")
            .arg(work_dir)
            .arg("--")
            .arg(&self.setpriv)
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .args([
                "--clear-groups",
                "--no-new-privs",
                "--bounding-set=-all",
                "--inh-caps=-all",
                "--",
            ])
            .arg(&self.env)
            .arg(format!("--default-signal={signals}"))
            .arg(program)
            .args(args);
        cmd
    }

    /// Whether a replica shown `writable` sees `path` (for its program: a path it cannot see
    /// is a clear error at start, not an `execvp` failure in its log).
    pub fn shows(&self, path: &Path, writable: &[&Path]) -> bool {
        let system = SYSTEM_DIRS.iter().any(|d| path.starts_with(d));
        let own = writable.iter().any(|d| path.starts_with(d));
        let masked = self.masked().iter().any(|h| path.starts_with(h));
        own || (system && !masked)
    }

    /// The hidden paths that lie under a directory the sandbox shows (others are not visible
    /// to begin with), resolved as the mount view resolves them.
    fn masked(&self) -> Vec<PathBuf> {
        self.config
            .hidden
            .iter()
            .filter_map(|h| h.canonicalize().ok())
            .filter(|h| SYSTEM_DIRS.iter().any(|d| h.starts_with(d)))
            .collect()
    }
}

/// Whether `dir` is not in the sandbox until bwrap makes it: below its scratch root, `/tmp` or
/// a masked path, rather than a mount point or inside a read-only system directory.
fn made_by_sandbox(dir: &Path, masked: &[PathBuf]) -> bool {
    let mount_point = dir == Path::new("/")
        || dir == Path::new("/tmp")
        || SYSTEM_DIRS.iter().any(|d| dir == Path::new(d))
        || masked.iter().any(|m| dir == m);
    let in_system = SYSTEM_DIRS.iter().any(|d| dir.starts_with(d));
    let in_mask = masked.iter().any(|m| dir.starts_with(m));
    !mount_point && (!in_system || in_mask)
}

fn refusal(missing: &[String]) -> String {
    format!(
        "this host cannot confine workloads; missing: {}. Workloads are not started: install \
         what is missing, or run the service with --insecure-runtime to run them unconfined \
         (any workload can then read the store and tokens and stop the service)",
        missing.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directories_above_a_bind_are_made_only_where_the_sandbox_has_none() {
        let masked = [PathBuf::from("/opt/tessera")];
        let made = |p: &str| made_by_sandbox(Path::new(p), &masked);
        assert!(made("/tmp/x") && made("/var") && made("/var/lib/tessera"));
        assert!(made("/opt/tessera/checkpoints"));
        for existing in ["/", "/tmp", "/opt", "/usr/lib", "/opt/tessera", "/etc"] {
            assert!(!made(existing), "{existing}");
        }
    }
}
