//! One cgroup per replica: its CPU, memory and process limits, and the handle that kills all it
//! started, however it detached (`setsid`, double fork), since membership follows every fork.
//!
//! Two layouts are supported:
//!
//! - cgroup v2 alone (`/sys/fs/cgroup/cgroup.controllers` exists): the groups live under the
//!   service's own cgroup. v2 lets a cgroup hand controllers to its children only while it has
//!   no processes itself, so the service moves itself into a `tessera-service` leaf first, the
//!   same delegation systemd does for `Delegate=yes` units.
//! - v1 controllers (`memory`, `cpu`, optionally `pids`) mounted under `/sys/fs/cgroup/<name>`,
//!   with or without the empty v2 hierarchy at `/sys/fs/cgroup/unified` (the hybrid layout).
//!   Limits go to the v1 groups; when the unified hierarchy is there, the replica is also put
//!   in a group of its own there, whose `cgroup.kill` ends it in one write.
//!
//! Group paths are a function of the runtime root and the replica, so that a successor finds
//! (and can kill) the groups of replicas it adopted.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// The controllers limits need.
const V2_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];
/// The CFS period quotas are expressed against (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

/// What a replica may use; 0 (CPU, memory) means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pids: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// cgroup v2 with its controllers.
    V2,
    /// The v2 hierarchy of a hybrid host: no controllers, only membership and `cgroup.kill`.
    Unified,
    V1Memory,
    V1Cpu,
    V1Pids,
}

/// Where replica groups are made on this host.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// Per hierarchy, the directory holding this runtime's replica groups. The first is the one
    /// whose membership is read and killed.
    bases: Vec<(Kind, PathBuf)>,
}

/// One replica's groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    dirs: Vec<(Kind, PathBuf)>,
}

impl Cgroups {
    /// Finds the layout and prepares this runtime's parent groups, named `tessera-<instance>`.
    /// The error says what is missing.
    pub fn detect(instance: &str) -> Result<Cgroups, String> {
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cgroups (cannot read /proc/self/cgroup: {e})"))?;
        let root = Path::new("/sys/fs/cgroup");
        let parent = format!("tessera-{instance}");
        if root.join("cgroup.controllers").exists() {
            let own = own_path(&own, "").ok_or("cgroups (no v2 entry in /proc/self/cgroup)")?;
            let base = root.join(own.trim_start_matches('/'));
            delegate_v2(&base)?;
            let dir = base.join(&parent);
            make_dir(&dir)
                .map_err(|e| format!("cgroups (cannot create {}: {e})", dir.display()))?;
            enable_v2(&dir)?;
            return Ok(Cgroups {
                bases: vec![(Kind::V2, dir)],
            });
        }
        let mut bases = Vec::new();
        let unified = root.join("unified");
        if unified.join("cgroup.procs").exists()
            && let Some(own) = own_path(&own, "")
        {
            bases.push((Kind::Unified, unified.join(own.trim_start_matches('/'))));
        }
        for (controller, kind, required) in [
            ("memory", Kind::V1Memory, true),
            ("cpu", Kind::V1Cpu, true),
            ("pids", Kind::V1Pids, false),
        ] {
            let mount = root.join(controller);
            match own_path(&own, controller) {
                Some(own) if mount.join("cgroup.procs").exists() => {
                    bases.push((kind, mount.join(own.trim_start_matches('/'))));
                }
                _ if required => {
                    return Err(format!(
                        "the cgroup {controller} controller (neither cgroup v2 at /sys/fs/cgroup \
                         nor a v1 {controller} hierarchy at {})",
                        mount.display()
                    ));
                }
                _ => {}
            }
        }
        for (_, base) in &mut bases {
            *base = base.join(&parent);
            make_dir(base)
                .map_err(|e| format!("cgroups (cannot create {}: {e})", base.display()))?;
        }
        Ok(Cgroups { bases })
    }

    /// The groups of one replica (made by [`Group::create`]).
    pub fn group(&self, workload: &str, replica: u32) -> Group {
        // `_` cannot occur in a workload name, so no two replicas share a name.
        let name = format!("{workload}_{replica}");
        Group {
            dirs: self
                .bases
                .iter()
                .map(|(kind, base)| (*kind, base.join(&name)))
                .collect(),
        }
    }

    /// Removes this runtime's parent groups if nothing is left in them; a group still in use
    /// stays (and is found again by the next runtime on the same root).
    pub fn remove_parents_if_empty(&self) {
        for (_, base) in &self.bases {
            let _ = fs::remove_dir(base);
        }
    }
}

impl Group {
    /// Makes the groups (emptied of a previous attempt's leftovers) and sets their limits.
    pub fn create(&self, limits: &Limits) -> io::Result<()> {
        if self.dirs.iter().any(|(_, d)| d.exists()) {
            self.kill()?;
            self.remove();
        }
        for (kind, dir) in &self.dirs {
            make_dir(dir)?;
            let write = |file: &str, value: String| {
                fs::write(dir.join(file), value).map_err(|e| {
                    io::Error::new(e.kind(), format!("{}: {e}", dir.join(file).display()))
                })
            };
            let quota = (limits.cpu_millis > 0)
                .then(|| (limits.cpu_millis * CPU_PERIOD_US / 1000).max(1000));
            match kind {
                Kind::V2 => {
                    if let Some(quota) = quota {
                        write("cpu.max", format!("{quota} {CPU_PERIOD_US}"))?;
                    }
                    if limits.memory_bytes > 0 {
                        write("memory.max", limits.memory_bytes.to_string())?;
                        // Swapped-out pages would not count against the limit.
                        if dir.join("memory.swap.max").exists() {
                            write("memory.swap.max", "0".into())?;
                        }
                    }
                    write("pids.max", limits.pids.to_string())?;
                }
                Kind::V1Cpu => {
                    if let Some(quota) = quota {
                        write("cpu.cfs_period_us", CPU_PERIOD_US.to_string())?;
                        write("cpu.cfs_quota_us", quota.to_string())?;
                    }
                }
                Kind::V1Memory => {
                    if limits.memory_bytes > 0 {
                        write("memory.limit_in_bytes", limits.memory_bytes.to_string())?;
                    }
                }
                Kind::V1Pids => write("pids.max", limits.pids.to_string())?,
                Kind::Unified => {}
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files, open for writing: a child writes `0` to each before it runs
    /// the command, so it is inside from its first instruction on.
    pub fn procs_files(&self) -> io::Result<Vec<File>> {
        self.dirs
            .iter()
            .map(|(_, dir)| {
                let path = dir.join("cgroup.procs");
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
            })
            .collect()
    }

    /// Kills every process in the group. `cgroup.kill` does it atomically; without it (v1
    /// only, or a kernel before 5.14) the members are killed until none is left, which forks
    /// racing the loop cannot outrun for long since every round kills all it sees.
    pub fn kill(&self) -> io::Result<()> {
        let Some((_, dir)) = self.dirs.first() else {
            return Ok(());
        };
        if !dir.exists() {
            return Ok(());
        }
        let kill_file = dir.join("cgroup.kill");
        if kill_file.exists() {
            return fs::write(&kill_file, "1");
        }
        for _ in 0..1000 {
            let pids = self.members()?;
            if pids.is_empty() {
                return Ok(());
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        Err(io::Error::other(format!(
            "{}: processes keep appearing while being killed",
            dir.display()
        )))
    }

    /// The pids in the group (empty when it does not exist).
    pub fn members(&self) -> io::Result<Vec<i32>> {
        let Some((_, dir)) = self.dirs.first() else {
            return Ok(Vec::new());
        };
        match fs::read_to_string(dir.join("cgroup.procs")) {
            Ok(text) => Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Removes the groups; `false` while one still has members (dying processes), to retry.
    pub fn remove(&self) -> bool {
        let mut all = true;
        for (_, dir) in &self.dirs {
            match fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(_) => all = false,
            }
        }
        all
    }
}

/// The service's own cgroup path in the hierarchy with `controller` (`""`: the v2 one).
fn own_path(proc_self_cgroup: &str, controller: &str) -> Option<String> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        matches.then(|| path.to_string())
    })
}

/// Makes `base` able to give its children the controllers limits need: they must be in its
/// `cgroup.controllers`, and it must hold no processes of its own.
fn delegate_v2(base: &Path) -> Result<(), String> {
    let available = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    let missing: Vec<&str> = V2_CONTROLLERS
        .into_iter()
        .filter(|c| !available.split_whitespace().any(|a| a == *c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the cgroup v2 controllers {} in {} (delegate them to the service, e.g. \
             Delegate=yes in its systemd unit)",
            missing.join(", "),
            base.display()
        ));
    }
    if enable_v2(base).is_ok() {
        return Ok(());
    }
    // "No internal processes": move this cgroup's processes into a leaf, then enable.
    let leaf = base.join("tessera-service");
    make_dir(&leaf).map_err(|e| format!("cgroups (cannot create {}: {e})", leaf.display()))?;
    let procs = fs::read_to_string(base.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines() {
        // A process that exited meanwhile cannot be moved, and need not be.
        let _ = fs::write(leaf.join("cgroup.procs"), pid.trim());
    }
    enable_v2(base)
}

fn enable_v2(dir: &Path) -> Result<(), String> {
    let want: Vec<String> = V2_CONTROLLERS.iter().map(|c| format!("+{c}")).collect();
    fs::write(dir.join("cgroup.subtree_control"), want.join(" ")).map_err(|e| {
        format!(
            "cgroups (cannot enable {} for the children of {}: {e})",
            V2_CONTROLLERS.join(", "),
            dir.display()
        )
    })
}

fn make_dir(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_paths_are_read_per_controller() {
        let text = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/x\n0::/svc\n";
        assert_eq!(
            own_path(text, "memory").as_deref(),
            Some("/process_api/abc")
        );
        assert_eq!(own_path(text, "cpu").as_deref(), Some("/x"));
        assert_eq!(own_path(text, "cpuacct").as_deref(), Some("/x"));
        assert_eq!(own_path(text, "").as_deref(), Some("/svc"));
        assert_eq!(own_path(text, "pids"), None);
    }

    #[test]
    fn replica_groups_are_named_apart() {
        let cgroups = Cgroups {
            bases: vec![(Kind::V2, PathBuf::from("/cg/tessera-1"))],
        };
        let a = cgroups.group("a.b", 1);
        let b = cgroups.group("a", 11);
        assert_ne!(a, b);
        assert_eq!(a.dirs[0].1, Path::new("/cg/tessera-1/a.b_1"));
    }
}
