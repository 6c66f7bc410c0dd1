//! End-to-end tests of `tessera validate`, driven by data: every directory under
//! `tests/data/invalid/` is one case, layered on the valid fleet in `tests/data/base/` (unless
//! it holds a file named `STANDALONE`), and its diagnostics are snapshot-tested in every output
//! format, with `--deny-warnings` so that warning cases fail too. Adding a case is adding a
//! directory; `INSTA_UPDATE=always cargo test --test validate`
//! records its expectation.

use std::path::{Path, PathBuf};

mod common;

use common::tessera;

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/invalid");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/data/invalid exists")
        .map(|e| e.expect("readable").path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    cases
}

fn args_for(case: &Path) -> Vec<String> {
    let rel = |p: &Path| {
        p.strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .expect("inside the package")
            .to_string_lossy()
            .into_owned()
    };
    let mut args = Vec::new();
    if !case.join("STANDALONE").exists() {
        args.push("tests/data/base".to_owned());
    }
    args.push(rel(case));
    args
}

#[test]
fn base_fleet_is_valid_and_clean() {
    let (code, stdout, _) = tessera(&["validate", "--deny-warnings", "tests/data/base"]);
    assert_eq!(code, 0, "{stdout}");
}

#[test]
fn every_invalid_case_fails_with_its_diagnostics_in_every_format() {
    let cases = cases();
    assert!(!cases.is_empty());
    for case in cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let paths = args_for(&case);
        let mut report = String::new();
        let mut json_codes = Vec::new();
        for format in ["human", "json", "github", "sarif"] {
            let mut args = vec!["validate", "--deny-warnings", "--output", format];
            args.extend(paths.iter().map(String::as_str));
            let (code, stdout, stderr) = tessera(&args);
            assert_eq!(
                code, 1,
                "case {name} ({format}) must exit 1\n{stdout}{stderr}"
            );
            let shown = match format {
                "json" => {
                    let v: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
                    json_codes = v["diagnostics"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|d| d["name"].as_str().unwrap().to_owned())
                        .collect();
                    stdout
                }
                "sarif" => {
                    let v: serde_json::Value = serde_json::from_str(&stdout).expect("valid SARIF");
                    assert_eq!(v["version"], "2.1.0");
                    serde_json::to_string_pretty(&v["runs"][0]["results"]).unwrap() + "\n"
                }
                _ => stdout,
            };
            report.push_str(&format!("===== {format} (exit {code})\n{shown}"));
        }
        // The directory name starts with the slug of the diagnostic it is about.
        let slug = name.split("--").next().unwrap();
        assert!(
            json_codes.iter().any(|c| c == slug),
            "case {name} does not report `{slug}`: {json_codes:?}"
        );
        insta::assert_snapshot!(name, report);
    }
}

#[test]
fn sarif_lists_every_rule_once_in_a_stable_order() {
    let (_, stdout, _) = tessera(&["validate", "--output", "sarif", "tests/data/base"]);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let rules: Vec<String> = v["runs"][0]["tool"]["driver"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["id"].as_str().unwrap(),
                r["name"].as_str().unwrap()
            )
        })
        .collect();
    insta::assert_snapshot!(rules.join("\n"));
}

#[test]
fn missing_path_is_a_usage_error() {
    let (code, _, stderr) = tessera(&["validate", "tests/data/does-not-exist"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("does-not-exist"), "{stderr}");
}

#[test]
fn bad_flags_are_usage_errors() {
    let (code, _, _) = tessera(&["validate", "--output", "xml", "tests/data/base"]);
    assert_eq!(code, 2);
}

#[test]
fn warnings_fail_only_with_deny_warnings() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("unused.yaml"),
        "apiVersion: tessera/v1alpha1\nkind: MigLayout\nmetadata: {name: spare}\nspec: {gpuModel: H100-SXM5-80GB, instances: [7g.80gb]}\n",
    )
    .unwrap();
    let p = dir.path().to_str().unwrap();
    let (code, stdout, _) = tessera(&["validate", "tests/data/base", p]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("TSR202"), "{stdout}");
    let (code, _, _) = tessera(&["validate", "--deny-warnings", "tests/data/base", p]);
    assert_eq!(code, 1);
}

#[test]
fn a_snapshot_with_usage_and_reservations_is_valid_and_clean() {
    // The fair-share and reservation sections of a ClusterState, as the reconciler writes them,
    // read against the base fleet (which sets fairShare and Pool reservations).
    let (code, stdout, stderr) = tessera(&[
        "validate",
        "--deny-warnings",
        "tests/data/base",
        "tests/data/state-with-history",
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("no problems"), "{stdout}");
}

#[test]
fn every_diagnostic_code_has_a_case_in_the_corpus() {
    let (_, stdout, _) = tessera(&["validate", "--output", "sarif", "tests/data/base"]);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let covered: Vec<String> = cases()
        .iter()
        .map(|c| {
            let name = c.file_name().unwrap().to_string_lossy().into_owned();
            name.split("--").next().unwrap().to_owned()
        })
        .collect();
    let missing: Vec<&str> = v["runs"][0]["tool"]["driver"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .filter(|name| !covered.iter().any(|c| c == name))
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a case in tests/data/invalid: {missing:?}"
    );
}

#[test]
fn huge_files_are_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.yaml");
    let line = "# padding\n".repeat(1 << 16);
    let mut text = String::with_capacity(33 << 20);
    while text.len() <= 32 << 20 {
        text.push_str(&line);
    }
    std::fs::write(&path, text).unwrap();
    let (code, stdout, _) =
        tessera(&["validate", "--output", "json", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1, "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["diagnostics"].as_array().unwrap().len(), 1, "{stdout}");
    assert_eq!(v["diagnostics"][0]["name"], "input-too-large");
}

#[test]
fn a_cluster_state_in_json_is_read_like_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    std::fs::write(
        &path,
        r#"{"apiVersion": "tessera/v1alpha1", "kind": "ClusterState", "metadata": {"name": "now"},
  "spec": {"observedAt": "2026-11-20T08:00:00Z",
    "nodes": [{"name": "n1", "pool": "train", "cpu": 192, "memory": "2Ti",
      "gpus": [{"index": 0, "uuid": "GPU-0a", "model": "H100-SXM5-80GB"}]}],
    "running": [{"name": "job", "spec": {"tenant": "research", "sloClass": "training", "gpu": {"count": 1}},
      "bindings": [{"node": "n1", "gpus": [7]}], "startedAt": "2026-11-20T07:00:00Z"}]}}
"#,
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let (code, stdout, _) = tessera(&["validate", "--output", "json", "tests/data/base", p]);
    assert_eq!(code, 1, "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let d = &v["diagnostics"][0];
    assert_eq!(d["name"], "invalid-cluster-state");
    assert!(d["message"].as_str().unwrap().contains("GPU 7"), "{d}");
    // The position is the JSON text's own: line 6, where the binding is.
    assert_eq!(d["line"], 6);
}

#[test]
fn links_fifos_and_devices_are_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::copy("tests/data/base/tenants.yaml", root.join("tenants.yaml")).unwrap();
    std::fs::copy("tests/data/base/fleet.yaml", root.join("fleet.yaml")).unwrap();
    std::fs::write(root.join("tokens.txt"), "operator: s3cr3t-token\n").unwrap();
    std::os::unix::fs::symlink(root.join("tokens.txt"), root.join("zz.yaml")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", root.join("zero.yaml")).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(root.join("pipe.yaml"))
        .status()
        .expect("mkfifo runs");
    assert!(status.success());

    for format in ["json", "human"] {
        let (code, stdout, stderr) =
            tessera(&["validate", "--output", format, root.to_str().unwrap()]);
        assert_eq!(code, 1, "{stdout}{stderr}");
        assert!(!stdout.contains("s3cr3t"), "{stdout}");
        if format == "json" {
            let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            let found: Vec<(&str, &str)> = v["diagnostics"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    let file = d["file"].as_str().unwrap();
                    (
                        d["name"].as_str().unwrap(),
                        &file[file.rfind('/').unwrap() + 1..],
                    )
                })
                .collect();
            assert_eq!(
                found,
                vec![
                    ("not-a-regular-file", "pipe.yaml"),
                    ("not-a-regular-file", "zero.yaml"),
                    ("not-a-regular-file", "zz.yaml"),
                ]
            );
        }
    }
}
