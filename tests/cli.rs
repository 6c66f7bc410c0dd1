//! End-to-end tests of `compile`, `schema`, `mig` and `bench service`, through the built binary.

mod common;

use common::tessera;

#[test]
fn compiled_policy_of_the_base_fleet() {
    let (code, stdout, stderr) = tessera(&["compile", "tests/data/base"]);
    assert_eq!(code, 0, "{stderr}");
    insta::assert_snapshot!(stdout);
}

#[test]
fn compile_is_byte_for_byte_stable_whatever_the_order_of_paths() {
    let files = ["tests/data/base/tenants.yaml", "tests/data/base/fleet.yaml"];
    let (_, a, _) = tessera(&["compile", files[0], files[1]]);
    let (_, b, _) = tessera(&["compile", files[1], files[0]]);
    let (_, c, _) = tessera(&["compile", "tests/data/base"]);
    assert!(!a.is_empty());
    assert_eq!(a, b);
    assert_eq!(a, c);
}

#[test]
fn compile_refuses_an_invalid_policy_and_prints_nothing_on_stdout() {
    let (code, stdout, stderr) = tessera(&[
        "compile",
        "tests/data/base",
        "tests/data/invalid/unknown-parent--typo",
    ]);
    assert_eq!(code, 1);
    assert!(stdout.is_empty());
    assert!(stderr.contains("TSR102"), "{stderr}");
}

#[test]
fn checked_in_schemas_are_current() {
    let (code, stdout, stderr) = tessera(&["schema", "--check", "schemas"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
}

#[test]
fn schema_check_finds_stale_missing_and_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (code, _, _) = tessera(&["schema", "--out", d]);
    assert_eq!(code, 0);
    let (code, _, _) = tessera(&["schema", "--check", d]);
    assert_eq!(code, 0);

    let pool = dir.path().join("Pool.schema.json");
    let text = std::fs::read_to_string(&pool).unwrap();
    std::fs::write(&pool, text.replace("\"gpuModel\"", "\"gpu_model\"")).unwrap();
    std::fs::remove_file(dir.path().join("Tenant.schema.json")).unwrap();
    std::fs::write(dir.path().join("Old.schema.json"), "{}").unwrap();
    let (code, _, stderr) = tessera(&["schema", "--check", d]);
    assert_eq!(code, 1);
    assert!(stderr.contains("Pool.schema.json is stale"), "{stderr}");
    assert!(stderr.contains("Tenant.schema.json is missing"), "{stderr}");
    assert!(
        stderr.contains("Old.schema.json is not generated"),
        "{stderr}"
    );
}

#[test]
fn schema_needs_a_directory_to_check() {
    let (code, _, _) = tessera(&["schema", "--check", "tests/data/nowhere"]);
    assert_eq!(code, 2);
    let (code, _, _) = tessera(&["schema"]);
    assert_eq!(code, 2);
}

#[test]
fn mig_layouts_lists_every_maximal_layout() {
    let (code, stdout, _) = tessera(&["mig", "layouts", "H100-SXM5-80GB", "--output", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let layouts = v["layouts"].as_array().unwrap();
    // 78 maximal layouts over profiles 19, 15, 14, 9, 5 and 0 (NVIDIA's MIG user guide).
    assert_eq!(layouts.len(), 78);
    for l in layouts {
        let slices: u64 = l["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["compute_slices"].as_u64().unwrap())
            .sum();
        assert!(slices <= 7);
        assert_eq!(l["compute_slices"].as_u64().unwrap(), slices);
    }
    let (code, stdout, _) = tessera(&["mig", "layouts", "A100-SXM4-40GB"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("3g.20gb@4"), "{stdout}");
}

#[test]
fn mig_check_answers_with_a_placement_or_a_reason() {
    let (code, stdout, _) = tessera(&["mig", "check", "H100-SXM5-80GB", "3g.40gb", "4g.40gb"]);
    assert_eq!(code, 0);
    assert_eq!(stdout, "fits on one H100-SXM5-80GB: 4g.40gb@0  3g.40gb@4\n");

    let (code, stdout, _) = tessera(&[
        "mig",
        "check",
        "H100-SXM5-80GB",
        "2g.20gb",
        "2g.20gb",
        "2g.20gb",
        "1g.10gb",
    ]);
    assert_eq!(code, 0);
    assert!(stdout.contains("1g.10gb@6"), "{stdout}");

    let (code, stdout, _) = tessera(&[
        "mig",
        "check",
        "H100-SXM5-80GB",
        "3g.40gb",
        "3g.40gb",
        "1g.10gb",
    ]);
    assert_eq!(code, 1);
    assert!(stdout.starts_with("does not fit"), "{stdout}");

    let seven = ["1g.10gb"; 7];
    let mut args = vec!["mig", "check", "H100-SXM5-80GB"];
    args.extend(seven);
    assert_eq!(tessera(&args).0, 0);
    args.push("1g.10gb");
    assert_eq!(tessera(&args).0, 1);

    // Profile IDs work as well as names.
    let (code, stdout, _) = tessera(&[
        "mig",
        "check",
        "H100-SXM5-80GB",
        "9",
        "5",
        "--output",
        "json",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["fits"], true);
    assert_eq!(v["instances"][0]["profile"], "4g.40gb");
}

#[test]
fn mig_rejects_unknown_models_and_profiles_as_usage_errors() {
    assert_eq!(tessera(&["mig", "check", "H100", "1g.10gb"]).0, 2);
    assert_eq!(tessera(&["mig", "check", "L40S-48GB", "1g.10gb"]).0, 2);
    let (code, _, stderr) = tessera(&["mig", "check", "H100-SXM5-80GB", "3g.20gb"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("3g.40gb"),
        "the error lists the model's profiles: {stderr}"
    );
}

/// `tessera bench openb` on the openb slice the sim crate's tests use, with `args` after.
fn bench_openb_slice(args: &[&str]) -> (i32, String, String) {
    let mut all = vec![
        "bench",
        "openb",
        "--trace",
        "sim/tests/data/openb_slice/openb_pod_list_default.csv",
        "--nodes",
        "sim/tests/data/openb_slice/openb_node_list_gpu_node.csv",
    ];
    all.extend_from_slice(args);
    tessera(&all)
}

/// The Tessera and FGD rows, seed 1 of the published variant.
const TESSERA_AND_FGD: [&str; 6] = [
    "--variant",
    "published",
    "--seeds",
    "1",
    "--policies",
    "Tessera,FGD",
];

/// [`bench_openb_slice`] for [`TESSERA_AND_FGD`], in JSON, with `args` among the options.
fn tessera_and_fgd_on_the_slice(args: &[&str]) -> (i32, String, String) {
    bench_openb_slice(&[&TESSERA_AND_FGD[..], args, &["--output", "json"]].concat())
}

#[test]
fn bench_openb_runs_any_trace_in_the_format_and_prints_json() {
    let (code, stdout, stderr) = bench_openb_slice(&["--seeds", "2", "--output", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["trace"], "default");
    let policies: Vec<&str> = v["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        policies,
        ["Tessera", "FGD", "BestFit", "FirstFit", "Random"]
    );
    let (code, _, stderr) = bench_openb_slice(&["--policies", "tetris"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("unknown policy"), "{stderr}");
}

#[test]
fn bench_openb_pins_a_share_of_tasks_to_one_model_and_names_the_variant() {
    let run = |share: &str| {
        tessera_and_fgd_on_the_slice(&["--gpu-spec-share", share, "--cpu-only", "fgd"])
    };
    let (code, stdout, stderr) = run("0.33");
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["trace"], "default+spec33");
    assert_eq!(v["policies"].as_array().unwrap().len(), 2);
    // Pinned tasks change what FGD's typical shapes are (their `gpu_spec` is part of a shape).
    let (_, plain, _) = run("0");
    let plain: serde_json::Value = serde_json::from_str(&plain).unwrap();
    assert_eq!(plain["trace"], "default");
    assert_ne!(v["policies"][1], plain["policies"][1]);
    let (code, _, stderr) = run("1.5");
    assert_eq!(code, 2);
    assert!(stderr.contains("a share from 0 to 1"), "{stderr}");
}

#[test]
fn bench_openb_cpu_only_rule_moves_the_tessera_row_alone_unless_every_row_follows_it() {
    let run = |rule: &str| {
        let (code, stdout, stderr) = tessera_and_fgd_on_the_slice(&["--cpu-only", rule]);
        assert_eq!(code, 0, "{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        (v["policies"][0].clone(), v["policies"][1].clone())
    };
    let (best_fit, fgd) = run("best-fit");
    let (kube, fgd_beside_kube) = run("kube");
    assert_eq!(
        fgd, fgd_beside_kube,
        "the FGD row places its own CPU-only tasks"
    );
    assert_ne!(
        best_fit["per_seed"], kube["per_seed"],
        "the slice's CPU-only tasks land elsewhere when spread"
    );
    // By default the solver places them, as workloads asking no GPU; the FGD row is the same.
    let (solver, fgd_beside_solver) = run("solver");
    assert_eq!(fgd, fgd_beside_solver);
    assert_ne!(
        solver["per_seed"], best_fit["per_seed"],
        "the solver places the slice's CPU-only tasks elsewhere than best fit"
    );
    let (code, stdout, stderr) = tessera_and_fgd_on_the_slice(&[]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["policies"][0], solver, "the solver is the default");
    let (code, _, stderr) = bench_openb_slice(&["--cpu-only", "most-allocated"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("kube"),
        "the error lists the rules: {stderr}"
    );
    // With `--cpu-only-rows all` the FGD row follows the rule too; under its own rule it is
    // itself.
    let rows = |rule: &str| {
        let (code, stdout, stderr) =
            tessera_and_fgd_on_the_slice(&["--cpu-only", rule, "--cpu-only-rows", "all"]);
        assert_eq!(code, 0, "{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["config"]["cpu_only_rows"], "All");
        (v["policies"][0].clone(), v["policies"][1].clone())
    };
    let (kube_again, fgd_by_kube) = rows("kube");
    assert_eq!(kube_again["per_seed"], kube["per_seed"]);
    assert_ne!(fgd_by_kube["per_seed"], fgd["per_seed"]);
    assert_eq!(rows("fgd").1["per_seed"], fgd["per_seed"]);
    // The solver's rule is the Tessera row's alone.
    assert_eq!(rows("solver").1["per_seed"], fgd["per_seed"]);
}

#[test]
fn solve_prints_each_tenants_decayed_usage_and_share() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/plan");
    let read = |p: &str| std::fs::read_to_string(data.join(p)).expect("fixture");
    std::fs::create_dir(dir.path().join("policy")).unwrap();
    std::fs::write(
        dir.path().join("policy/fleet.yaml"),
        read("policy/fleet.yaml"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("policy/tenants.yaml"),
        common::with_fair_share(&read("policy/tenants.yaml"), "12h"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("state.yaml"),
        common::with_usage(&read("state.yaml")),
    )
    .unwrap();
    let path = |p: &str| dir.path().join(p).to_str().unwrap().to_owned();
    let (policy, state) = (path("policy"), path("state.yaml"));
    let args = ["solve", "--policy", &policy, "--state", &state];
    let (code, human, stderr) = tessera(&[&args[..], &["--output", "human"]].concat());
    assert_eq!(code, 0, "{stderr}");
    let table = &human[human.find("Fair share").expect("a fair-share table")..];
    insta::assert_snapshot!(table);
    let (code, json, stderr) = tessera(&[&args[..], &["--output", "json"]].concat());
    assert_eq!(code, 0, "{stderr}");
    let d: serde_json::Value = serde_json::from_str(&json).unwrap();
    let fs = &d["fair_share"];
    assert_eq!(fs["record"]["asOf"], "2026-11-20T08:00:00Z");
    let names: Vec<&str> = fs["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["org", "platform", "product", "research"]);
}

#[test]
fn a_duration_flag_is_checked_before_anything_runs() {
    let (code, stdout, stderr) = tessera(&[
        "solve",
        "--policy",
        "examples/policies/quickstart",
        "--time-limit",
        "soon",
    ]);
    assert_eq!(code, 2, "a usage error: {stdout}{stderr}");
    assert!(
        stderr.contains("'soon'")
            && stderr.contains("--time-limit")
            && stderr.contains("not a duration: write e.g. 0s, 30s, 5m or 1h"),
        "{stderr}"
    );
}

/// `tessera bench service` at a tiny size: the service it runs admits the whole burst and
/// decides and starts every steady submission (figures are not checked, only that each was
/// measured).
#[test]
fn bench_service_runs_the_service_and_follows_every_submission() {
    let (code, stdout, stderr) = tessera(&[
        "bench",
        "service",
        "--nodes",
        "4",
        "--orgs",
        "1",
        "--running",
        "20",
        "--rate",
        "10",
        "--duration",
        "1s",
        "--output",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["fleet"]["tenants"], 29, "{report}");
    assert_eq!(report["burst"]["submitted"], 20, "{report}");
    assert_eq!(report["burst"]["running"], 20, "{report}");
    let steady = &report["steady"];
    assert_eq!(steady["submitted"], 10, "{report}");
    assert_eq!(steady["decided"]["count"], 10, "{report}");
    assert_eq!(steady["running"]["count"], 10, "{report}");
    assert!(
        steady["running"]["p99Ms"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(steady["cycles"].as_f64().unwrap() >= 1.0, "{report}");
}

#[test]
fn bench_service_refuses_a_load_larger_than_the_fleet() {
    let (code, _, stderr) = tessera(&["bench", "service", "--nodes", "2", "--running", "5000"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("lower --running, --rate or --duration"),
        "{stderr}"
    );
}

/// `tessera agent` runs `tessera-fleet agent` found beside its own executable (or on PATH),
/// passing arguments and the exit code through; without it, it says what to build. The
/// `tessera` binary is hard-linked into a directory of its own so that what lies beside it is
/// the test's choice.
#[test]
fn agent_delegates_to_tessera_fleet_or_says_how_to_get_it() {
    let dir = tempfile::Builder::new()
        .prefix("agent-delegation-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let tessera = dir.path().join("tessera");
    std::fs::hard_link(env!("CARGO_BIN_EXE_tessera"), &tessera).unwrap();
    let empty_path = tempfile::tempdir().unwrap();
    let run = || {
        std::process::Command::new(&tessera)
            .args(["agent", "--node", "gpu-1", "--help"])
            .env("PATH", empty_path.path())
            .output()
            .unwrap()
    };

    let out = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for says in [
        "`tessera-fleet` binary",
        "cargo build --release --workspace",
        "protobuf-compiler",
    ] {
        assert!(stderr.contains(says), "{stderr:?} should say {says:?}");
    }

    let fake = dir.path().join("tessera-fleet");
    std::fs::write(&fake, "#!/bin/sh\necho \"$@\"\nexit 7\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "agent --node gpu-1 --help\n"
    );
}

/// `tessera reconcile --store etcd://…` runs `tessera-fleet reconcile` with its arguments as
/// given (the same flags, parsed by the same code there); SQLite stays in this process, and
/// what fleet mode cannot do is refused here before anything runs.
#[test]
fn reconcile_on_etcd_delegates_to_tessera_fleet() {
    let dir = tempfile::Builder::new()
        .prefix("reconcile-delegation-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let tessera = dir.path().join("tessera");
    std::fs::hard_link(env!("CARGO_BIN_EXE_tessera"), &tessera).unwrap();
    let fake = dir.path().join("tessera-fleet");
    std::fs::write(&fake, "#!/bin/sh\necho \"$@\"\nexit 7\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(&tessera)
            .args(args)
            .env("PATH", "")
            .output()
            .unwrap()
    };
    let args = [
        "reconcile",
        "--repo",
        "policy",
        "--store",
        "etcd://127.0.0.1:2379,127.0.0.2:2379",
        "--lease-ttl",
        "3s",
    ];
    let out = run(&args);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", args.join(" "))
    );

    let mut once = args.to_vec();
    once.push("--once");
    let out = run(&once);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--once runs without replicas"), "{stderr}");

    for (bad, says) in [
        (["--store", "etcd://127.0.0.1"], "is not HOST:PORT"),
        (["--store", "mysql://x"], "sqlite:PATH or etcd://"),
    ] {
        let out = run(&[&["reconcile", "--repo", "policy"][..], &bad[..]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    let out = run(&[
        "reconcile",
        "--repo",
        "policy",
        "--db",
        "x.db",
        "--store",
        "sqlite:y.db",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn bench_openb_prints_the_first_refusal_only_when_asked() {
    let (code, stdout, stderr) =
        bench_openb_slice(&[&TESSERA_AND_FGD[..], &["--first-refusal"]].concat());
    assert_eq!(code, 0, "{stderr}");
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("first refusal"))
        .collect();
    assert!(table.len() > 2, "{stdout}");
    for policy in ["Tessera", "FGD"] {
        assert!(
            table.iter().any(|l| l.starts_with(policy)),
            "a row for {policy}: {stdout}"
        );
    }
    let (code, stdout, _) = bench_openb_slice(&TESSERA_AND_FGD);
    assert_eq!(code, 0);
    assert!(!stdout.contains("first refusal"), "{stdout}");
    // The JSON holds it either way.
    let (code, stdout, _) = tessera_and_fgd_on_the_slice(&[]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        v["policies"][0]["per_seed"][0]
            .as_object()
            .unwrap()
            .contains_key("first_refusal")
    );
}
