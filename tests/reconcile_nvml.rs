//! `tessera reconcile --driver nvml` end to end: the built binary loads the stand-in
//! `libnvidia-ml.so` (`reconciler/fake-nvml`) through nvml-wrapper, follows a real Git
//! repository and converges the fake machine's GPU to the policy's MIG layout.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use git2::{Repository, RepositoryInitOptions, Signature};
use serde_json::Value;

const STATE_ENV: &str = "TESSERA_FAKE_NVML_STATE";

fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(path)
}

/// The built stand-in: in this target directory when the workspace built it, else built now
/// into a target directory of its own (so as not to wait on this build's lock).
fn fake_library() -> PathBuf {
    let file = format!(
        "{}tessera_fake_nvml{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_tessera"));
    let profile_dir = exe.parent().expect("target/<profile>");
    for dir in [profile_dir.to_path_buf(), profile_dir.join("deps")] {
        if dir.join(&file).is_file() {
            return dir.join(&file);
        }
    }
    let target = profile_dir
        .parent()
        .expect("target directory")
        .join("fake-nvml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "tessera-fake-nvml", "--target-dir"])
        .arg(&target)
        .status()
        .expect("run cargo build");
    assert!(status.success(), "building the fake libnvidia-ml failed");
    target.join("debug").join(file)
}

/// The `tests/reconcile.rs` policy (infer: one H100 cut in halves, 4g.40gb + 3g.40gb),
/// committed to a fresh repository.
fn policy_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init_opts(
        dir.path(),
        RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("policy")).unwrap();
    for f in ["fleet.yaml", "tenants.yaml"] {
        std::fs::copy(
            data("reconcile/policy").join(f),
            dir.path().join("policy").join(f),
        )
        .unwrap();
    }
    let mut index = repo.index().unwrap();
    index
        .add_all(["policy"], git2::IndexAddOption::DEFAULT, None)
        .unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = Signature::now("test", "test@example.invalid").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "policy", &tree, &[])
        .unwrap();
    dir
}

/// The fake machine: one H100 with MIG on and half a layout (the 4g.40gb at slice 0), plus
/// whatever faults `faults` lists.
fn machine(dir: &Path, faults: Value) -> PathBuf {
    let text = std::fs::read_to_string(data("nvml/machine.json")).unwrap();
    let mut state: Value = serde_json::from_str(&text).unwrap();
    state["faults"] = faults;
    let path = dir.join("fake-nvml.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();
    path
}

fn reconcile(repo: &Path, work: &Path, state: &Path, lib: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.args(["reconcile", "--repo"])
        .arg(repo)
        .args(["--path", "policy", "--driver", "nvml", "--once", "--nodes"])
        .arg(data("nvml/node.yaml"))
        .arg("--state-dir")
        .arg(work.join("state"))
        .arg("--db")
        .arg(work.join("tessera.db"))
        .env(STATE_ENV, state)
        .env_remove("TESSERA_NVML_LIB");
    if let Some(lib) = lib {
        cmd.arg("--nvml-lib").arg(lib);
    }
    cmd.output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The fake's GPU instances as (profile ID, start, has a compute instance).
fn instances(state: &Path) -> Vec<(u64, u64, bool)> {
    let s: Value = serde_json::from_slice(&std::fs::read(state).unwrap()).unwrap();
    let mut v: Vec<(u64, u64, bool)> = s["gpus"][0]["device"]["gpu_instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["placement"]["profile_id"].as_u64().unwrap(),
                g["placement"]["start"].as_u64().unwrap(),
                !g["compute_instances"].as_array().unwrap().is_empty(),
            )
        })
        .collect();
    v.sort_by_key(|&(_, start, _)| start);
    v
}

#[test]
fn reconcile_with_the_nvml_driver_completes_the_layout_through_the_library() {
    let repo = policy_repo();
    let work = tempfile::tempdir().unwrap();
    let state = machine(work.path(), Value::Array(Vec::new()));
    let lib = fake_library();
    let out = reconcile(repo.path(), work.path(), &state, Some(&lib));
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("gpu-0/gpu0: create GPU instance of profile 9 at memory slice 4"),
        "{shown}"
    );
    assert!(shown.contains("Synced Healthy"), "{shown}");
    assert_eq!(instances(&state), [(5, 0, true), (9, 4, true)]);

    // Converged: a second run finds nothing to do.
    let out = reconcile(repo.path(), work.path(), &state, Some(&lib));
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("cycle 1: 0 actions"), "{shown}");
}

#[test]
fn a_failed_nvml_call_is_reported_with_its_code_and_retried() {
    let repo = policy_repo();
    let work = tempfile::tempdir().unwrap();
    let faults = serde_json::json!([{"fail": {
        "function": "nvmlDeviceCreateGpuInstanceWithPlacement",
        "gpu": 0,
        "code": 23,
    }}]);
    let state = machine(work.path(), faults);
    let lib = fake_library();
    let out = reconcile(repo.path(), work.path(), &state, Some(&lib));
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(
        shown.contains(
            "nvmlDeviceCreateGpuInstanceWithPlacement failed: NVML_ERROR_INSUFFICIENT_RESOURCES"
        ),
        "{shown}"
    );
    assert!(shown.contains("Degraded"), "{shown}");
    // Nothing half-made: no instance, and no compute instance attempted without one.
    assert_eq!(instances(&state), [(5, 0, true)]);

    // The service backs off before retrying; a later run (as a restarted service would)
    // retries once the backoff has passed. Polled, never timed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let out = reconcile(repo.path(), work.path(), &state, Some(&lib));
        if out.status.success() {
            assert!(text(&out).contains("Synced Healthy"), "{}", text(&out));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never retried: {}",
            text(&out)
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert_eq!(instances(&state), [(5, 0, true), (9, 4, true)]);
}

#[test]
fn without_the_library_the_driver_fails_at_start_naming_it() {
    let repo = policy_repo();
    let work = tempfile::tempdir().unwrap();
    let state = machine(work.path(), Value::Array(Vec::new()));
    let missing = work.path().join("lib/libnvidia-ml.so.1");
    let out = reconcile(repo.path(), work.path(), &state, Some(&missing));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!(
            "cannot load the NVML library {}",
            missing.display()
        )),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one clear message: {stderr}");

    // Without --nvml-lib: the driver's soname, found through the loader's search path. Only
    // asserted where no NVIDIA driver is installed (CI, and every machine this project has).
    let installed = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/lib/aarch64-linux-gnu",
    ]
    .iter()
    .any(|d| Path::new(d).join("libnvidia-ml.so.1").exists());
    if !installed {
        let out = reconcile(repo.path(), work.path(), &state, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            stderr.contains("cannot load the NVML library libnvidia-ml.so.1"),
            "{stderr}"
        );
    }
    // The file is untouched: nothing was loaded, nothing was changed.
    assert_eq!(instances(&state), [(5, 0, true)]);
}

#[test]
fn the_code_nvml_returned_is_what_the_journal_and_the_report_say() {
    // LIB_RM_VERSION_MISMATCH (18) was reported as UNKNOWN (999) before; the stand-in's state
    // names it as fault plans do. The report prints the message the journal records.
    let repo = policy_repo();
    let work = tempfile::tempdir().unwrap();
    let faults = serde_json::json!([{"fail": {
        "function": "nvmlDeviceCreateGpuInstanceWithPlacement",
        "code": "lib_rm_version_mismatch",
    }}]);
    let state = machine(work.path(), faults);
    let out = reconcile(repo.path(), work.path(), &state, Some(&fake_library()));
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(
        shown.contains(
            "nvmlDeviceCreateGpuInstanceWithPlacement failed: \
             NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)"
        ),
        "{shown}"
    );
    // The code, not any "999" (a commit hash or a timestamp in the output may hold one).
    assert!(
        !shown.contains("(999)") && !shown.contains("NVML_ERROR_UNKNOWN"),
        "{shown}"
    );
}

fn observe(state: &Path, lib: &Path, output: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["observe", "--driver", "nvml", "--output", output, "--nodes"])
        .arg(data("nvml/node.yaml"))
        .arg("--nvml-lib")
        .arg(lib)
        .env(STATE_ENV, state)
        .output()
        .unwrap()
}

#[test]
fn observe_prints_what_the_nvml_driver_sees_and_changes_nothing() {
    let work = tempfile::tempdir().unwrap();
    let state = machine(work.path(), Value::Array(Vec::new()));
    let before = std::fs::read(&state).unwrap();
    let lib = fake_library();
    let out = observe(&state, &lib, "human");
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("(NVIDIA driver 580.159.04)"), "{shown}");
    assert!(
        shown.contains(
            "GPU 0  H100-SXM5-80GB  GPU-0d000000-0000-0000-0000-000000000000  healthy  MIG enabled"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("GI 0  4g.40gb      profile ID 5  start 0"),
        "{shown}"
    );

    let out = observe(&state, &lib, "json");
    assert!(out.status.success(), "{}", text(&out));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpu = &json["observation"]["nodes"][0]["gpus"][0];
    assert_eq!(gpu["model"], "H100-SXM5-80GB");
    assert_eq!(gpu["instances"][0]["profile"], "4g.40gb");
    assert_eq!(
        json["observation"]["details"][0]["instances"][0]["profile_id"],
        5
    );
    assert_eq!(
        std::fs::read(&state).unwrap(),
        before,
        "observe changed the machine"
    );

    // Without the MIG monitor capability: one clear error naming the call and the fix.
    let mut s: Value = serde_json::from_slice(&before).unwrap();
    s["driver"] = serde_json::json!({"mig_monitor": false});
    std::fs::write(&state, serde_json::to_vec(&s).unwrap()).unwrap();
    let out = observe(&state, &lib, "human");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one clear message: {stderr}");
    assert!(stderr.contains("NVML_ERROR_NO_PERMISSION (4)"), "{stderr}");
    assert!(stderr.contains("capabilities/mig/monitor"), "{stderr}");
}

/// `tessera observe` reports a GPU's utilization as the library answers
/// `nvmlDeviceGetUtilizationRates`, and none for a GPU in MIG mode.
#[test]
fn observe_reports_utilization_where_the_library_does() {
    let work = tempfile::tempdir().unwrap();
    let state = machine(work.path(), Value::Array(Vec::new()));
    let lib = fake_library();
    let mut s: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    s["gpus"][0]["utilization"] = serde_json::json!({"gpu": 87, "memory": 40});
    std::fs::write(&state, serde_json::to_vec(&s).unwrap()).unwrap();
    let utilization = |state: &Path| {
        let out = observe(state, &lib, "json");
        assert!(out.status.success(), "{}", text(&out));
        let json: Value = serde_json::from_slice(&out.stdout).unwrap();
        json["observation"]["details"][0]["utilization"].clone()
    };
    // In MIG mode the GPU reports none of its own.
    assert_eq!(utilization(&state), Value::Null);
    s["gpus"][0]["device"]["mig"] = serde_json::json!({"current": false, "pending": false});
    s["gpus"][0]["device"]["gpu_instances"] = serde_json::json!([]);
    std::fs::write(&state, serde_json::to_vec(&s).unwrap()).unwrap();
    assert_eq!(
        utilization(&state),
        serde_json::json!({"gpuPercent": 87, "memoryPercent": 40})
    );
}
