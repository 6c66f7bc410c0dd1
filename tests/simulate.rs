//! `tessera simulate` end to end on a tiny fleet: the JSON report, and a bad trace line.

use std::process::Command;

fn tessera(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `tessera simulate` on the tiny fleet and trace, with `extra` arguments.
fn on_tiny_trace(extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        "simulate",
        "--policy",
        "sim/tests/replay/policy",
        "--trace",
        "sim/tests/replay/trace.yaml",
    ];
    args.extend_from_slice(extra);
    tessera(&args)
}

/// [`on_tiny_trace`]'s JSON report, which must succeed.
fn json_on_tiny_trace(extra: &[&str]) -> serde_json::Value {
    let mut args = extra.to_vec();
    args.extend_from_slice(&["--output", "json", "--time-limit", "60s"]);
    let (code, stdout, stderr) = on_tiny_trace(&args);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn simulate_reports_every_run_as_json() {
    let (code, stdout, stderr) = on_tiny_trace(&[
        "--compare",
        "FGD,BestFit",
        "--output",
        "json",
        "--time-limit",
        "60s",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["format_version"], 1);
    assert_eq!(v["workloads"], 50);
    let runs: Vec<&str> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["placement"].as_str().unwrap())
        .collect();
    assert_eq!(runs, ["Tessera", "FGD", "BestFit"]);
    assert!(
        stderr.contains("Tessera: "),
        "wall time on stderr: {stderr}"
    );

    let (code, _, stderr) = on_tiny_trace(&["--compare", "Tetris"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("unknown baseline `Tetris`"), "{stderr}");
}

/// Runs replayed at once write the report runs replayed one by one write, in `--compare`'s
/// order, whichever run ends first.
#[test]
fn runs_on_several_threads_report_what_one_thread_reports() {
    let all = ["--compare", "Random,FirstFit,BestFit,FGD"];
    let one = json_on_tiny_trace(&[&all[..], &["-j", "1"]].concat());
    let several = json_on_tiny_trace(&[&all[..], &["--jobs", "5"]].concat());
    assert_eq!(one, several);
    let runs: Vec<&str> = several["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["placement"].as_str().unwrap())
        .collect();
    assert_eq!(runs, ["Tessera", "Random", "FirstFit", "BestFit", "FGD"]);

    let (code, _, stderr) = on_tiny_trace(&["-j", "0"]);
    assert_eq!(code, 2, "{stderr}");
}

#[test]
fn a_bad_trace_line_is_an_input_error_at_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.yaml");
    std::fs::write(
        &trace,
        "kind: Workload\nmetadata: {name: a}\nspec: {tenant: alpha, sloClass: batch, gpu: {count: 1}}\narrival: 0\nduration: forever\n",
    )
    .unwrap();
    let (code, _, stderr) = tessera(&[
        "simulate",
        "--policy",
        "sim/tests/replay/policy",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("trace.yaml:5:1: `duration`"),
        "file:line:col and the field: {stderr}"
    );
}

#[test]
fn speed_compresses_arrivals_and_the_report_says_so() {
    let run = |speed: &str| json_on_tiny_trace(&["--speed", speed]);
    let (real, fast) = (run("1"), run("4"));
    assert_eq!(fast["speed"], 4.0);
    let load = |v: &serde_json::Value| v["offered_load"].as_f64().unwrap();
    // The last arrival comes 4 times sooner (to the second), run times are the same.
    let ratio = load(&fast) / load(&real);
    assert!((3.9..=4.1).contains(&ratio), "{ratio}");
    assert!(
        fast["runs"][0]["duration_seconds"].as_i64() < real["runs"][0]["duration_seconds"].as_i64()
    );

    let (code, _, stderr) = on_tiny_trace(&["--speed", "0"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("not a speed"), "{stderr}");
}

#[test]
fn demand_draws_more_workloads_and_the_report_says_what_they_ask() {
    let run = |demand: &str| json_on_tiny_trace(&["--demand", demand, "--seed", "3"]);
    let (as_is, doubled) = (run("1"), run("2"));
    assert_eq!(as_is["workloads"], 50);
    assert_eq!(doubled["workloads"], 100);
    assert_eq!(doubled["demand"], 2.0);
    let asked = |v: &serde_json::Value| v["asked_share"].as_f64().unwrap();
    // A draw with replacement asks about twice as much, not exactly.
    let ratio = asked(&doubled) / asked(&as_is);
    assert!((1.4..=2.6).contains(&ratio), "{ratio}");
    assert_eq!(doubled["runs"][0]["workloads"], 100);
    assert_eq!(run("2"), doubled, "the seed decides the draw");

    let (code, _, stderr) = on_tiny_trace(&["--demand", "0"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("not a demand factor"), "{stderr}");
}
