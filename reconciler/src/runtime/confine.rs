//! Confining a replica: what the host must offer, checked once, and the command line that runs
//! a replica inside its sandbox.
//!
//! The sandbox is bubblewrap (`bwrap`), run unprivileged under the replica's own uid: it makes a
//! user, PID, IPC, UTS and cgroup namespace and a mount view built from an allow-list (the
//! system directories read-only, a private `/tmp` and `/dev`, the replica's own work and
//! checkpoint directories writable, its GPUs' device nodes). bubblewrap rather than raw
//! namespaces: it is the small, audited tool Flatpak and others trust with the same job, it
//! gets the ordering subtleties right (mount propagation, `pivot_root`, dropping capabilities,
//! a reaping init as PID 1), and it needs no privileges, so the privileged part of a start is
//! only what must be privileged: making the cgroups and switching to the replica's uid
//! (`setpriv`, util-linux). The chain, under the runtime's `sh` wrapper (`wrapper.rs`):
//!
//! `env --ignore-signal=… setpriv --reuid U … -- bwrap … -- env --default-signal=… program`
//!
//! A checkpoint signal goes to the wrapper's process group; `setpriv` and `bwrap` must not die
//! of it while the command saves its work, so they run with the checkpoint signals ignored,
//! and the command gets the defaults back at its `exec`.

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
                "root (the service switches each workload to its own uid and makes its cgroups)"
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
        // The tools are there; whether the kernel lets an unprivileged user make namespaces
        // (`kernel.unprivileged_userns_clone`, AppArmor's userns restriction) shows only by
        // trying.
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
                "user namespaces for unprivileged users (a trial sandbox failed: {}; check \
                 sysctl kernel.unprivileged_userns_clone and AppArmor's \
                 kernel.apparmor_restrict_unprivileged_userns)",
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
            .arg(&self.setpriv)
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .args(["--clear-groups", "--no-new-privs", "--"])
            .arg(&self.bwrap)
            .args([
                "--unshare-user",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]);
        for dir in SYSTEM_DIRS {
            cmd.args(["--ro-bind-try", dir, dir]);
        }
        cmd.args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
        for hidden in self.masked() {
            if hidden.is_dir() {
                cmd.arg("--tmpfs").arg(hidden);
            } else {
                cmd.args(["--ro-bind", "/dev/null"]).arg(hidden);
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

fn refusal(missing: &[String]) -> String {
    format!(
        "this host cannot confine workloads; missing: {}. Workloads are not started: install \
         what is missing, or run the service with --insecure-runtime to run them unconfined \
         (any workload can then read the store and tokens and stop the service)",
        missing.join("; ")
    )
}
