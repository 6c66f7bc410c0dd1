//! The attacks a hostile review ran from inside a workload (issue 20), each as a workload command
//! run through the confined runtime: the attack must fail, and the same command pointed at the
//! workload's own files (the control) must succeed, so that a failure means the sandbox stopped
//! it and not that the command was broken.
//!
//! The service's files are laid out as the service lays them out (`state/` with the store,
//! tokens, mirror, runtime root, workloads and checkpoints), and another tenant's workload has
//! its checkpoint and log there. These tests need root, bubblewrap and cgroups, as CI has.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_reconciler::runtime::{
    Confinement, ExitStatus, GpuDevice, LaunchSpec, Runtime, SandboxConfig,
};

const PATIENCE: Duration = Duration::from_secs(30);
const STEP: Duration = Duration::from_millis(10);
const IDLE: &str = "i=0; while [ ! -e stop ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done";

/// A service's state directory with another tenant's files in it, and a confined runtime on it.
struct Host {
    _dir: tempfile::TempDir,
    state: PathBuf,
    rt: Runtime,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        // Private, as the service makes it.
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
        let files = [
            ("tessera.db", "SQLite format 3"),
            ("tokens.yaml", "operator: s3cret-operator-token"),
            ("mirror.git/config", "[remote \"origin\"]\n\turl = /policy"),
            ("checkpoints/victim/state", "victim's checkpoint"),
        ];
        for (path, text) in files {
            let path = state.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        // Fake GPU device nodes (no GPU here): char devices behaving as /dev/null.
        let dev = dir.path().join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        for name in ["nvidia0", "nvidia1", "nvidiactl"] {
            let ok = Command::new("mknod")
                .args(["-m", "666"])
                .arg(dev.join(name))
                .args(["c", "1", "3"])
                .status()
                .unwrap()
                .success();
            assert!(ok, "mknod {name}");
        }
        let config = SandboxConfig {
            hidden: vec![state.clone()],
            device_root: dev,
            mig_minors: dir.path().join("no-mig-minors"),
            ..SandboxConfig::default()
        };
        let mut rt = Runtime::new(state.join("runtime"), Confinement::Sandbox(config)).unwrap();
        if let Some(why) = rt.refusal() {
            panic!("{why}");
        }
        // The other tenant's workload has run: its log is in the runtime root.
        let victim = launch(&state, "victim", "echo victim-log-line");
        assert_eq!(run(&mut rt, &victim), ExitStatus::Code(0));
        Host {
            _dir: dir,
            state,
            rt,
        }
    }

    /// Runs `script` as workload `attacker` (with `$STATE` and `$OWN` set to the service's
    /// state directory and the workload's own checkpoint directory) and returns how it ended.
    fn attempt(&mut self, script: &str) -> ExitStatus {
        let mut spec = launch(&self.state, "attacker", script);
        spec.env
            .insert("STATE".into(), self.state.display().to_string());
        spec.env
            .insert("SERVICE_PID".into(), std::process::id().to_string());
        run(&mut self.rt, &spec)
    }
}

fn launch(state: &Path, workload: &str, script: &str) -> LaunchSpec {
    LaunchSpec {
        tenant: "t".into(),
        workload: workload.to_string(),
        replica: 0,
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: [(
            "OWN".to_string(),
            state
                .join("checkpoints")
                .join(workload)
                .display()
                .to_string(),
        )]
        .into(),
        devices: vec!["GPU-0000".into()],
        gpus: vec![GpuDevice {
            index: 0,
            mig: None,
        }],
        mps_thread_percentage: None,
        cpu_millis: 500,
        memory_bytes: 256 << 20,
        work_dir: state.join("workloads").join(workload),
        checkpoint_dir: state.join("checkpoints").join(workload),
        resume_from: None,
    }
}

fn run(rt: &mut Runtime, spec: &LaunchSpec) -> ExitStatus {
    let pid = rt.start(spec).expect("starts").pid;
    wait_for_exit(rt, pid)
}

fn wait_for_exit(rt: &mut Runtime, pid: u32) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(e) = rt.poll().into_iter().find(|e| e.pid == pid) {
            return e.status;
        }
        assert!(start.elapsed() < PATIENCE, "process {pid} never exited");
        std::thread::sleep(STEP);
    }
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < PATIENCE, "{what}");
        std::thread::sleep(STEP);
    }
}

/// Each attack of the review, with its control: the same command against the workload's own
/// files. `$STATE` is the service's state directory, `$OWN` the workload's checkpoint directory.
/// A write counts only into the real file: the sandbox's root is a private scratch `tmpfs`
/// where a path that does not exist on its view can be created, so each write attack first
/// reads what the real file holds.
const ATTACKS: [(&str, &str, &str); 11] = [
    (
        "reads /proc of the service",
        "cat /proc/$SERVICE_PID/environ > /dev/null",
        "cat /proc/self/environ > /dev/null",
    ),
    (
        "reads the tokens file",
        "cat $STATE/tokens.yaml",
        "echo t > $OWN/tokens.yaml && cat $OWN/tokens.yaml",
    ),
    (
        "reads the tokens through the service's root in /proc",
        "cat /proc/$SERVICE_PID/root$STATE/tokens.yaml",
        "echo t > $OWN/tokens.yaml && cat /proc/self/root$OWN/tokens.yaml",
    ),
    (
        "reads the store",
        "cat $STATE/tessera.db",
        "echo s > $OWN/tessera.db && cat $OWN/tessera.db",
    ),
    (
        "rewrites the store",
        "grep -q SQLite $STATE/tessera.db && echo evil >> $STATE/tessera.db",
        "echo SQLite > $OWN/db && grep -q SQLite $OWN/db && echo evil >> $OWN/db",
    ),
    (
        "reads another tenant's checkpoint",
        "cat $STATE/checkpoints/victim/state",
        "echo c > $OWN/state && cat $OWN/state",
    ),
    (
        "overwrites another tenant's checkpoint",
        "grep -q victim $STATE/checkpoints/victim/state && echo x > $STATE/checkpoints/victim/state",
        "echo victim > $OWN/state && grep -q victim $OWN/state && echo x > $OWN/state",
    ),
    (
        "overwrites another tenant's log",
        "grep -q victim $STATE/runtime/t.victim/0.log && echo evil >> $STATE/runtime/t.victim/0.log",
        "echo victim > $OWN/0.log && grep -q victim $OWN/0.log && echo evil >> $OWN/0.log",
    ),
    (
        "writes into the system",
        "touch /usr/pwned || touch /etc/pwned || touch /opt/pwned",
        "touch $OWN/pwned && touch /tmp/pwned",
    ),
    (
        "repoints the policy mirror's remote",
        "grep -q origin $STATE/mirror.git/config && echo '  url = /evil' >> $STATE/mirror.git/config",
        "echo origin > $OWN/config && grep -q origin $OWN/config && echo '  url = /evil' >> $OWN/config",
    ),
    (
        "opens another tenant's GPU by path",
        // A device node, not a file made in the sandbox's own `/dev`.
        "[ -c /dev/nvidia1 ] && : > /dev/nvidia1",
        "[ -c /dev/nvidia0 ] && : > /dev/nvidia0",
    ),
];

#[test]
fn every_attack_fails_and_its_control_succeeds() {
    let mut host = Host::new();
    for (attack, script, control) in ATTACKS {
        assert_eq!(
            host.attempt(control),
            ExitStatus::Code(0),
            "control of {attack:?} ({control}) must succeed"
        );
        let status = host.attempt(script);
        assert_ne!(
            status,
            ExitStatus::Code(0),
            "attack {attack:?} ({script}) succeeded"
        );
    }
    // Nothing of the service's or the other tenant's changed.
    let read = |p: &str| std::fs::read_to_string(host.state.join(p)).unwrap();
    assert_eq!(read("tessera.db"), "SQLite format 3");
    assert_eq!(read("checkpoints/victim/state"), "victim's checkpoint");
    assert_eq!(
        read("mirror.git/config"),
        "[remote \"origin\"]\n\turl = /policy"
    );
    assert_eq!(read("runtime/t.victim/0.log"), "victim-log-line\n");
    assert!(!Path::new("/usr/pwned").exists() && !Path::new("/etc/pwned").exists());
}

#[test]
fn the_environment_is_the_specs_and_the_runtimes_only() {
    let mut host = Host::new();
    let status = host.attempt("env | cut -d= -f1 | sort > $OWN/env-names");
    assert_eq!(status, ExitStatus::Code(0));
    let names = std::fs::read_to_string(host.state.join("checkpoints/attacker/env-names")).unwrap();
    let names: Vec<&str> = names
        .lines()
        // The shell's own bookkeeping.
        .filter(|n| !matches!(*n, "PWD" | "OLDPWD" | "SHLVL" | "_"))
        .collect();
    assert_eq!(
        names,
        [
            "CUDA_VISIBLE_DEVICES",
            "OWN",
            "PATH",
            "SERVICE_PID",
            "STATE",
            "TESSERA_CHECKPOINT_DIR",
            "TESSERA_REPLICA",
            "TESSERA_TENANT",
            "TESSERA_WORKLOAD",
        ]
    );
}

#[test]
fn it_cannot_kill_the_service_but_can_kill_its_own() {
    let mut host = Host::new();
    let mut victim: Child = Command::new("sleep")
        .arg("60")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let attack = format!("kill -9 {}", victim.id());
    assert_eq!(
        host.attempt("sleep 60 & kill -9 $! && wait $!; [ $? -eq 137 ]"),
        ExitStatus::Code(0),
        "control"
    );
    assert_ne!(host.attempt(&attack), ExitStatus::Code(0));
    assert_ne!(host.attempt("kill -9 $SERVICE_PID"), ExitStatus::Code(0));
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the service's process lives"
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[test]
fn it_runs_as_its_own_unprivileged_user() {
    let mut host = Host::new();
    let status = host.attempt("id -u > $OWN/uid; id -G > $OWN/groups; [ \"$(id -u)\" != 0 ]");
    assert_eq!(status, ExitStatus::Code(0));
    let read =
        |f: &str| std::fs::read_to_string(host.state.join("checkpoints/attacker").join(f)).unwrap();
    let uid: u32 = read("uid").trim().parse().unwrap();
    assert!(
        tessera_reconciler::runtime::UidRange::default().contains(uid),
        "{uid}"
    );
    assert_eq!(
        read("groups").trim(),
        uid.to_string(),
        "no supplementary groups"
    );
}

/// Processes on the host whose command line has `marker`.
fn with_marker(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn a_setsid_child_does_not_survive_cancellation() {
    let mut host = Host::new();
    // Put together inside, so that only the detached children's command lines hold it.
    let marker = format!("tessera-escapee-{}", std::process::id());
    let script = format!(
        "setsid sh -c 'while :; do sleep 0.05; done' \"tessera-escapee-$ID\" > /dev/null 2>&1 &
         ( setsid sh -c 'while :; do sleep 0.05; done' \"tessera-escapee-$ID\" & ) > /dev/null 2>&1
         touch ready; {IDLE}"
    );
    let mut spec = launch(&host.state, "escaper", &script);
    spec.env.insert("ID".into(), std::process::id().to_string());
    let pid = host.rt.start(&spec).unwrap().pid;
    let ready = spec.work_dir.join("ready");
    wait_until("the workload never got ready", || ready.exists());
    // Control: the detached children did start, outside the workload's process group.
    wait_until("the detached children never ran", || {
        with_marker(&marker).len() >= 2
    });
    host.rt.kill(pid).unwrap();
    assert_eq!(wait_for_exit(&mut host.rt, pid), ExitStatus::Signal(9));
    wait_until("a detached child survived the kill", || {
        with_marker(&marker).is_empty()
    });
}

#[test]
fn its_cgroup_carries_the_specs_limits() {
    let mut host = Host::new();
    let spec = launch(&host.state, "limited", &format!("touch ready; {IDLE}"));
    let pid = host.rt.start(&spec).unwrap().pid;
    let ready = spec.work_dir.join("ready");
    wait_until("the workload never got ready", || ready.exists());
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let root = Path::new("/sys/fs/cgroup");
    let (memory, cpu) = if root.join("cgroup.controllers").exists() {
        let path = cgroups.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        let dir = root.join(path.trim_start_matches('/'));
        (
            std::fs::read_to_string(dir.join("memory.max")).unwrap(),
            std::fs::read_to_string(dir.join("cpu.max")).unwrap(),
        )
    } else {
        let of = |controller: &str| {
            let line = cgroups
                .lines()
                .find(|l| {
                    l.split(':')
                        .nth(1)
                        .is_some_and(|c| c.split(',').any(|c| c == controller))
                })
                .unwrap();
            root.join(controller)
                .join(line.splitn(3, ':').nth(2).unwrap().trim_start_matches('/'))
        };
        let quota = std::fs::read_to_string(of("cpu").join("cpu.cfs_quota_us")).unwrap();
        let period = std::fs::read_to_string(of("cpu").join("cpu.cfs_period_us")).unwrap();
        (
            std::fs::read_to_string(of("memory").join("memory.limit_in_bytes")).unwrap(),
            format!("{} {}", quota.trim(), period.trim()),
        )
    };
    assert_eq!(memory.trim(), (256u64 << 20).to_string());
    assert_eq!(cpu.trim(), "50000 100000", "half a core");
    host.rt.kill(pid).unwrap();
    wait_for_exit(&mut host.rt, pid);
}

#[test]
fn the_runtimes_files_are_private() {
    let host = Host::new();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(host.rt.root()), 0o700);
    assert_eq!(mode(&host.rt.root().join("t.victim")), 0o700);
    assert_eq!(mode(&host.rt.root().join("t.victim/0.log")), 0o600);
    assert_eq!(mode(&host.rt.root().join("t.victim/0.exit")), 0o600);
}

#[test]
fn an_unconfinable_host_refuses_starts_with_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    // Tools looked for where there are none stand for a host without them.
    let config = SandboxConfig {
        tool_dirs: vec![dir.path().join("empty")],
        ..SandboxConfig::default()
    };
    let mut rt = Runtime::new(dir.path().join("rt"), Confinement::Sandbox(config)).unwrap();
    assert!(!rt.is_confined());
    let spec = launch(dir.path(), "refused", "touch ran");
    let err = rt.start(&spec).unwrap_err().to_string();
    for needed in ["bubblewrap", "setpriv", "env", "--insecure-runtime"] {
        assert!(err.contains(needed), "{needed}: {err}");
    }
    assert!(!spec.work_dir.join("ran").exists(), "nothing ran");

    // The operator's explicit choice runs it, unconfined.
    let mut insecure = Runtime::new(dir.path().join("rt2"), Confinement::Insecure).unwrap();
    assert_eq!(run(&mut insecure, &spec), ExitStatus::Code(0));
    assert!(spec.work_dir.join("ran").exists());
}

#[test]
fn a_uid_range_that_is_used_up_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = SandboxConfig {
        uids: tessera_reconciler::runtime::UidRange {
            first: 1_900_000_000,
            count: 1,
        },
        ..SandboxConfig::default()
    };
    let mut rt = Runtime::new(dir.path().join("rt"), Confinement::Sandbox(config)).unwrap();
    let first = launch(dir.path(), "first", IDLE);
    let pid = rt.start(&first).unwrap().pid;
    let err = rt.start(&launch(dir.path(), "second", "true")).unwrap_err();
    assert!(err.to_string().contains("no uid left"), "{err}");
    rt.kill(pid).unwrap();
    wait_for_exit(&mut rt, pid);
}

/// On a machine with an NVIDIA GPU (run with `--ignored`): `nvidia-smi` inside the sandbox
/// works with the GPU assigned, and finds no GPU without it, although `CUDA_VISIBLE_DEVICES`
/// plays no part in what NVML can open.
#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn a_real_gpu_opens_only_when_assigned() {
    assert!(Path::new("/dev/nvidia0").exists(), "no /dev/nvidia0 here");
    let dir = tempfile::tempdir().unwrap();
    let mut rt = Runtime::new(
        dir.path().join("rt"),
        Confinement::Sandbox(SandboxConfig::default()),
    )
    .unwrap();
    if let Some(why) = rt.refusal() {
        panic!("{why}");
    }
    let mut spec = launch(dir.path(), "gpu", "nvidia-smi -L");
    // Where NVIDIA's container images put the tool and its library: the spec says so, as a
    // workload's own spec would; the service's environment is not passed on.
    spec.env.insert(
        "PATH".into(),
        "/usr/local/nvidia/bin:/usr/local/bin:/usr/bin:/bin".into(),
    );
    spec.env.insert(
        "LD_LIBRARY_PATH".into(),
        "/usr/local/nvidia/lib64:/usr/local/nvidia/lib".into(),
    );
    assert_eq!(run(&mut rt, &spec), ExitStatus::Code(0), "assigned");
    spec.gpus.clear();
    assert_ne!(run(&mut rt, &spec), ExitStatus::Code(0), "not assigned");
}
