//! The embedded runtime with real `sh` scripts: environment, checkpoint signal, kill after the
//! grace period, adoption of orphans left by a previous service process, and the errors. Every
//! test runs its workloads confined, as the service does (these tests need root, bubblewrap and
//! cgroups, as CI has); the attacks a hostile tenant tried are in `tests/confinement.rs`.
//!
//! Scripts signal readiness with files and the tests wait for files or exits in polling loops
//! with a generous bound; nothing asserts how long anything takes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tessera_reconciler::runtime::{
    Confinement, ExitStatus, Exited, LaunchSpec, Runtime, RuntimeError, SandboxConfig, Signal,
};

/// Far above anything these scripts need, so that a loaded machine never fails a test.
const PATIENCE: Duration = Duration::from_secs(30);
const STEP: Duration = Duration::from_millis(10);

/// Idles until a `stop` file appears in the work directory; gives up after about 30 s, so that
/// a failed test never leaves a process behind for long.
const IDLE: &str = "i=0; while [ ! -e stop ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done";

fn launch(dir: &Path, workload: &str, script: &str) -> LaunchSpec {
    LaunchSpec {
        tenant: "t".into(),
        workload: workload.to_string(),
        replica: 0,
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: Default::default(),
        devices: vec!["MIG-aaaa".into(), "MIG-bbbb".into()],
        gpus: Vec::new(),
        mps_thread_percentage: None,
        cpu_millis: 0,
        memory_bytes: 0,
        work_dir: dir.join("work").join(workload),
        checkpoint_dir: dir.join("checkpoints").join(workload),
        resume_from: None,
    }
}

/// A confined runtime; fails the test, saying what is missing, where the host cannot sandbox.
fn runtime(root: impl Into<PathBuf>) -> Runtime {
    let rt = Runtime::new(root, Confinement::Sandbox(SandboxConfig::default())).unwrap();
    if let Some(why) = rt.refusal() {
        panic!("{why}");
    }
    rt
}

fn wait_for_file(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < PATIENCE,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(STEP);
    }
}

fn wait_for_exit(rt: &mut Runtime, pid: u32) -> Exited {
    let start = Instant::now();
    loop {
        let exits = rt.poll();
        if let Some(e) = exits.into_iter().find(|e| e.pid == pid) {
            return e;
        }
        assert!(start.elapsed() < PATIENCE, "process {pid} never exited");
        std::thread::sleep(STEP);
    }
}

/// Waits until a script that ends by itself has ended.
fn run_to_end(rt: &mut Runtime, spec: &LaunchSpec) -> ExitStatus {
    let pid = rt.start(spec).expect("starts").pid;
    wait_for_exit(rt, pid).status
}

#[test]
fn the_command_sees_its_devices_and_checkpoint_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let mut rt = runtime(dir.path().join("rt"));
    let mut spec = launch(
        dir.path(),
        "envs",
        r#"printf '%s\n' "$CUDA_VISIBLE_DEVICES" "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" \
             "$TESSERA_WORKLOAD" "$TESSERA_TENANT" "$TESSERA_REPLICA" "$TESSERA_CHECKPOINT_DIR" \
             "$TESSERA_RESUME_FROM" "$EXTRA" "$(pwd)" > env.txt
           echo to-stdout; echo to-stderr >&2"#,
    );
    spec.replica = 2;
    spec.mps_thread_percentage = Some(25);
    spec.resume_from = Some(spec.checkpoint_dir.clone());
    spec.env.insert("EXTRA".into(), "x y".into());
    // The runtime's own variables win: a spec cannot widen its devices.
    spec.env.insert("CUDA_VISIBLE_DEVICES".into(), "all".into());
    assert_eq!(run_to_end(&mut rt, &spec), ExitStatus::Code(0));

    let work = spec.work_dir.canonicalize().unwrap();
    let ckpt = spec.checkpoint_dir.canonicalize().unwrap();
    let env = std::fs::read_to_string(work.join("env.txt")).unwrap();
    let lines: Vec<&str> = env.lines().collect();
    assert_eq!(
        lines,
        [
            "MIG-aaaa,MIG-bbbb",
            "25",
            "envs",
            "t",
            "2",
            ckpt.to_str().unwrap(),
            ckpt.to_str().unwrap(),
            "x y",
            work.to_str().unwrap(),
        ]
    );
    let log = std::fs::read_to_string(rt.root().join("t.envs").join("2.log")).unwrap();
    assert!(
        log.contains("to-stdout") && log.contains("to-stderr"),
        "log: {log}"
    );
}

#[test]
fn two_tenants_workloads_of_one_name_run_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let mut rt = runtime(dir.path().join("rt"));
    let spec = |tenant: &str| {
        let mut spec = launch(
            dir.path(),
            "train",
            &format!("echo \"$TESSERA_TENANT\"; touch ready; {IDLE}"),
        );
        spec.tenant = tenant.to_string();
        spec.work_dir = dir.path().join("work").join(tenant).join("train");
        spec
    };
    let (a, b) = (spec("a"), spec("b"));
    // Names are per tenant: the second is no `AlreadyRunning`, and neither shares the
    // other's files or cgroup.
    let pa = rt.start(&a).unwrap().pid;
    let pb = rt.start(&b).unwrap().pid;
    wait_for_file(&a.work_dir.join("ready"));
    wait_for_file(&b.work_dir.join("ready"));
    assert_eq!(rt.pids_of("a.train"), [pa]);
    assert_eq!(rt.pids_of("b.train"), [pb]);
    for (tenant, spec, pid) in [("a", &a, pa), ("b", &b, pb)] {
        std::fs::write(spec.work_dir.join("stop"), "").unwrap();
        let log = rt.root().join(format!("{tenant}.train")).join("0.log");
        wait_for_exit(&mut rt, pid);
        assert_eq!(std::fs::read_to_string(log).unwrap(), format!("{tenant}\n"));
    }
    let mut dotted = spec("a");
    dotted.tenant = "a.b".into();
    assert!(matches!(
        rt.start(&dotted),
        Err(RuntimeError::InvalidTenant(_))
    ));
}

#[test]
fn exit_codes_and_signals_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut rt = runtime(dir.path().join("rt"));
    let cases = [
        ("exit 0", ExitStatus::Code(0)),
        ("exit 3", ExitStatus::Code(3)),
        // The command dies of a signal it does not handle; the wrapper survives to say so.
        ("kill -TERM $$", ExitStatus::Signal(15)),
        ("kill -KILL $$", ExitStatus::Signal(9)),
    ];
    for (i, (script, expected)) in cases.into_iter().enumerate() {
        let spec = launch(dir.path(), &format!("w{i}"), script);
        assert_eq!(run_to_end(&mut rt, &spec), expected, "{script}");
    }
}

#[test]
fn a_checkpoint_signal_is_handled_and_the_exit_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let mut rt = runtime(dir.path().join("rt"));
    let spec = launch(
        dir.path(),
        "ckpt",
        &format!(
            r#"trap 'echo saved > "$TESSERA_CHECKPOINT_DIR/state"; exit 0' USR1
               touch ready
               {IDLE}
               exit 99"#
        ),
    );
    let pid = rt.start(&spec).unwrap().pid;
    wait_for_file(&spec.work_dir.join("ready"));
    rt.signal(pid, Signal::parse("SIGUSR1").unwrap()).unwrap();
    let exit = wait_for_exit(&mut rt, pid);
    assert_eq!(
        (exit.workload.as_str(), exit.replica, exit.status),
        ("t.ckpt", 0, ExitStatus::Code(0))
    );
    let saved = std::fs::read_to_string(spec.checkpoint_dir.join("state")).unwrap();
    assert_eq!(saved.trim(), "saved");
    assert!(
        rt.pids_of("t.ckpt").is_empty(),
        "reported once, then forgotten"
    );
    assert!(rt.poll().is_empty());
}

#[test]
fn a_group_signal_reaches_the_command_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut rt = runtime(dir.path().join("rt"));
    let spec = launch(
        dir.path(),
        "count",
        &format!(
            r#"n=0
               trap 'n=$((n + 1)); echo $n > count' TERM
               touch ready
               {IDLE}
               exit 4"#
        ),
    );
    let pid = rt.start(&spec).unwrap().pid;
    wait_for_file(&spec.work_dir.join("ready"));
    rt.signal(pid, Signal::Term).unwrap();
    wait_for_file(&spec.work_dir.join("count"));
    // Room for a duplicate (a wrapper forwarding what the group already got) to arrive.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(spec.work_dir.join("stop"), "").unwrap();
    assert_eq!(wait_for_exit(&mut rt, pid).status, ExitStatus::Code(4));
    let count = std::fs::read_to_string(spec.work_dir.join("count")).unwrap();
    assert_eq!(count.trim(), "1");
}

#[test]
fn a_command_ignoring_its_checkpoint_signal_is_killed_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let mut rt = runtime(dir.path().join("rt"));
    let spec = launch(
        dir.path(),
        "stubborn",
        &format!(
            r#"trap '' USR1
               touch ready
               {IDLE}
               exit 99"#
        ),
    );
    let pid = rt.start(&spec).unwrap().pid;
    wait_for_file(&spec.work_dir.join("ready"));
    rt.signal(pid, Signal::Usr1).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        rt.poll().is_empty(),
        "it ignores the signal and keeps running"
    );
    rt.kill(pid).unwrap();
    assert_eq!(wait_for_exit(&mut rt, pid).status, ExitStatus::Signal(9));
}

#[test]
fn a_replica_runs_once_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut rt = runtime(dir.path().join("rt"));
    let spec = launch(dir.path(), "once", &format!("touch ready; {IDLE}; exit 99"));
    let pid = rt.start(&spec).unwrap().pid;
    assert!(matches!(
        rt.start(&spec),
        Err(RuntimeError::AlreadyRunning { pid: p, .. }) if p == pid
    ));
    rt.kill(pid).unwrap();
    wait_for_exit(&mut rt, pid);
    // Once it has ended, the replica starts again (a requeued workload).
    let again = rt.start(&spec).unwrap().pid;
    rt.kill(again).unwrap();
    assert_eq!(wait_for_exit(&mut rt, again).status, ExitStatus::Signal(9));
}

#[test]
fn a_fresh_runtime_in_the_same_process_adopts_and_reaps() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rt");
    let spec = launch(dir.path(), "same", &format!("touch ready; {IDLE}; exit 7"));
    let pid = {
        let mut first = runtime(&root);
        first.start(&spec).unwrap().pid
    };
    wait_for_file(&spec.work_dir.join("ready"));
    let mut second = runtime(&root);
    assert_eq!(second.pids_of("t.same"), [pid], "found from its pid file");
    second.adopt("t.same", 0, pid).unwrap();
    std::fs::write(spec.work_dir.join("stop"), "").unwrap();
    assert_eq!(wait_for_exit(&mut second, pid).status, ExitStatus::Code(7));
    let mut third = runtime(&root);
    assert!(
        third.pids_of("t.same").is_empty(),
        "a reported exit is not adopted again"
    );
    assert!(third.poll().is_empty());
}

/// Where [`orphan_parent`] starts its workload; unset in a normal test run.
const ORPHAN_ROOT: &str = "TESSERA_TEST_ORPHAN_ROOT";

/// Not a test of its own: the previous service instance of the orphan tests, run as a child
/// process of the test binary. It starts a workload and exits without waiting for it, so the
/// workload is reparented away from the test process, as after a killed service.
#[test]
#[ignore = "run by the orphan tests in a child process"]
fn orphan_parent() {
    let Ok(root) = std::env::var(ORPHAN_ROOT) else {
        return;
    };
    let dir = PathBuf::from(&root);
    let mut rt = runtime(dir.join("rt"));
    let spec = launch(
        &dir,
        "orphan",
        &format!(
            r#"trap 'echo saved > "$TESSERA_CHECKPOINT_DIR/state"; exit 5' USR1
               touch ready
               {IDLE}
               exit 99"#
        ),
    );
    let pid = rt.start(&spec).unwrap().pid;
    println!("orphan-pid={pid}");
    std::process::exit(0);
}

/// Starts [`orphan_parent`] and returns the pid of the orphan it leaves, once it runs.
fn start_orphan(dir: &Path) -> u32 {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["orphan_parent", "--exact", "--ignored", "--nocapture"])
        .env(ORPHAN_ROOT, dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let pid = stdout
        .lines()
        .find_map(|l| l.strip_prefix("orphan-pid="))
        .unwrap_or_else(|| {
            panic!(
                "no pid from the parent: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    wait_for_file(&dir.join("work").join("orphan").join("ready"));
    pid.parse().unwrap()
}

#[test]
fn an_adopted_orphan_reports_its_exit_through_the_exit_file() {
    let dir = tempfile::tempdir().unwrap();
    let pid = start_orphan(dir.path());
    let mut rt = runtime(dir.path().join("rt"));
    rt.adopt("t.orphan", 0, pid).unwrap();
    assert!(rt.poll().is_empty(), "it still runs");
    rt.signal(pid, Signal::Usr1).unwrap();
    let exit = wait_for_exit(&mut rt, pid);
    // Not our child: only the wrapper's exit file can tell code 5.
    assert_eq!(exit.status, ExitStatus::Code(5));
    let saved = dir.path().join("checkpoints").join("orphan").join("state");
    assert_eq!(std::fs::read_to_string(saved).unwrap().trim(), "saved");
}

#[test]
fn an_adopted_orphan_killed_by_us_reads_as_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pid = start_orphan(dir.path());
    let mut rt = runtime(dir.path().join("rt"));
    assert_eq!(rt.pids_of("t.orphan"), [pid], "adopted from its pid file");
    rt.kill(pid).unwrap();
    assert_eq!(wait_for_exit(&mut rt, pid).status, ExitStatus::Signal(9));
}

#[test]
fn signal_names_parse_or_fail_clearly() {
    for s in Signal::ALL {
        assert_eq!(Signal::parse(s.name()).unwrap(), s);
    }
    for bad in ["SIGFOO", "USR1", "sigusr1", "SIGKILL", "SIGSTOP", ""] {
        match Signal::parse(bad) {
            Err(e @ RuntimeError::UnknownSignal(_)) => {
                let message = e.to_string();
                assert!(message.contains("SIGUSR1"), "{message}");
            }
            other => panic!("{bad:?}: expected UnknownSignal, got {other:?}"),
        }
    }
}

#[test]
fn bad_specs_fail_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let mut rt = runtime(dir.path().join("rt"));
    let base = launch(dir.path(), "bad", "exit 0");

    let mut missing = base.clone();
    missing.command = vec!["tessera-no-such-command".into()];
    let err = rt.start(&missing).unwrap_err();
    assert!(
        matches!(err, RuntimeError::CommandNotFound { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("tessera-no-such-command"), "{err}");

    let mut missing_path = base.clone();
    missing_path.command = vec!["./no-such-script.sh".into()];
    assert!(matches!(
        rt.start(&missing_path),
        Err(RuntimeError::CommandNotFound { .. })
    ));

    std::fs::create_dir_all(&base.work_dir).unwrap();
    std::fs::write(base.work_dir.join("plain.txt"), "not a program").unwrap();
    let mut not_executable = base.clone();
    not_executable.command = vec!["./plain.txt".into()];
    assert!(matches!(
        rt.start(&not_executable),
        Err(RuntimeError::NotExecutable { .. })
    ));

    let mut empty = base.clone();
    empty.command.clear();
    assert!(matches!(
        rt.start(&empty),
        Err(RuntimeError::EmptyCommand { .. })
    ));

    for name in ["..", "../escape", "Upper", "", "a/b", "-lead"] {
        let mut named = base.clone();
        named.workload = name.into();
        assert!(
            matches!(rt.start(&named), Err(RuntimeError::InvalidName(_))),
            "{name:?}"
        );
    }

    let mut bad_env = base.clone();
    bad_env.env.insert("A=B".into(), "x".into());
    assert!(matches!(
        rt.start(&bad_env),
        Err(RuntimeError::InvalidSpec { .. })
    ));
    let mut bad_mps = base.clone();
    bad_mps.mps_thread_percentage = Some(0);
    assert!(matches!(
        rt.start(&bad_mps),
        Err(RuntimeError::InvalidSpec { .. })
    ));

    assert!(rt.pids_of("t.bad").is_empty());
    assert!(!rt.root().join("t.bad").join("0.pid").exists());
    assert!(matches!(
        rt.signal(12345678, Signal::Term),
        Err(RuntimeError::UnknownProcess(12345678))
    ));
}
