//! End-to-end tests of `tessera plan`: a real Git repository is built with git2 in a temporary
//! directory, one commit per policy change (fixed signatures and times, so commit ids are the
//! same on every run), and every output format and exit code is snapshot-tested.
//! `INSTA_UPDATE=always cargo test --test plan` records new expectations.

use std::path::Path;

use git2::Repository;

mod common;

use common::tessera;

const STATE: &str = "tests/data/plan/state.yaml";

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/plan/policy")
            .join(name),
    )
    .expect("fixture exists")
}

/// The test repository: a policy directory beside files the plan must ignore.
struct Fleet {
    _dir: tempfile::TempDir,
    repo: Repository,
    ticks: i64,
}

impl Fleet {
    fn new() -> Fleet {
        let dir = tempfile::tempdir().expect("temp dir");
        let repo = Repository::init(dir.path()).expect("git init");
        Fleet {
            _dir: dir,
            repo,
            ticks: 0,
        }
    }

    fn path(&self) -> &str {
        self.repo
            .workdir()
            .expect("work tree")
            .to_str()
            .expect("utf-8 path")
    }

    fn write(&self, path: &str, bytes: &[u8]) {
        let full = self.repo.workdir().unwrap().join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, bytes).unwrap();
    }

    /// Commits the whole work tree (`git add -A && git commit`), at a fixed time; returns the id.
    fn commit(&mut self, message: &str) -> String {
        self.ticks += 1;
        common::commit_all(&self.repo, self.ticks, message)
    }

    fn tag(&self, name: &str, commit: &str) {
        let obj = self
            .repo
            .find_object(git2::Oid::from_str(commit).unwrap(), None)
            .unwrap();
        self.repo.tag_lightweight(name, &obj, false).unwrap();
    }
}

/// The sequence of commits the issue asks for, tagged `v0` (base) to `v4` (broken).
fn history() -> Fleet {
    let mut f = Fleet::new();
    let fleet = fixture("fleet.yaml");
    let tenants = fixture("tenants.yaml");
    f.write("README.md", b"# policy\n");
    f.write(".github/workflows/ci.yaml", b"not: [a policy\n");
    f.write("policy/fleet.yaml", fleet.as_bytes());
    f.write("policy/tenants.yaml", tenants.as_bytes());
    let c = f.commit("base fleet");
    f.tag("v0", &c);

    let raised = tenants.replace("  guarantee: {train: 24}\n", "  guarantee: {train: 32}\n");
    assert_ne!(raised, tenants);
    f.write("policy/tenants.yaml", raised.as_bytes());
    let c = f.commit("research: raise the training guarantee to 32");
    f.tag("v1", &c);

    let layouts = fleet.replace(
        "  migLayouts: [halves]\n",
        "  migLayouts: [halves, sevenths]\n",
    ) + "---\napiVersion: tessera/v1alpha1\nkind: MigLayout\nmetadata: {name: sevenths}\n\
           spec: {gpuModel: H100-SXM5-80GB, instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, \
           1g.10gb, 1g.10gb, 1g.10gb]}\n";
    f.write("policy/fleet.yaml", layouts.as_bytes());
    let c = f.commit("infer: offer the all-1g layout");
    f.tag("v2", &c);

    let renamed = raised.replace("metadata: {name: product}", "metadata: {name: apps}");
    assert_ne!(renamed, raised);
    f.write("policy/tenants.yaml", renamed.as_bytes());
    let c = f.commit("rename product to apps");
    f.tag("v3", &c);

    let broken = renamed.replace(
        "  parent: org\n  guarantee: {train: 32}",
        "  parent: orgg\n  guarantee: {train: 32}",
    );
    assert_ne!(broken, renamed);
    f.write("policy/tenants.yaml", broken.as_bytes());
    let c = f.commit("typo in research's parent");
    f.tag("v4", &c);
    f
}

/// Runs the plan in every format, with and without `--detailed-exitcode`; returns one report
/// of exit codes and outputs for a snapshot.
fn every_format(f: &Fleet, base: &str, head: &str) -> String {
    every_format_with(f, base, head, STATE)
}

fn every_format_with(f: &Fleet, base: &str, head: &str, state: &str) -> String {
    let mut report = String::new();
    for format in ["human", "markdown", "json", "github"] {
        let mut codes = Vec::new();
        let mut text = None;
        for detailed in [false, true] {
            let mut args = vec![
                "plan",
                "--repo",
                f.path(),
                "--base",
                base,
                "--head",
                head,
                "--path",
                "policy",
                "--state",
                state,
                "--output",
                format,
            ];
            if detailed {
                args.push("--detailed-exitcode");
            }
            let (code, stdout, stderr) = tessera(&args);
            assert!(stderr.is_empty(), "{stderr}");
            codes.push(code);
            if let Some(t) = &text {
                assert_eq!(t, &stdout, "--detailed-exitcode changes only the exit code");
            }
            text = Some(stdout);
        }
        report.push_str(&format!(
            "===== --output {format}: exit {} (with --detailed-exitcode: {})\n{}\n",
            codes[0],
            codes[1],
            text.unwrap()
        ));
    }
    report
}

#[test]
fn commit_ids_are_deterministic() {
    let (a, b) = (history(), history());
    for tag in ["v0", "v4"] {
        let id = |f: &Fleet| f.repo.revparse_single(tag).unwrap().id();
        assert_eq!(id(&a), id(&b));
    }
}

#[test]
fn a_raised_guarantee() {
    let f = history();
    insta::assert_snapshot!(every_format(&f, "v0", "v1"));
}

#[test]
fn a_shorter_usage_half_life_moves_the_shares_of_idle_capacity() {
    let mut f = Fleet::new();
    let tenants = fixture("tenants.yaml");
    f.write("policy/fleet.yaml", fixture("fleet.yaml").as_bytes());
    f.write(
        "policy/tenants.yaml",
        common::with_fair_share(&tenants, "24h").as_bytes(),
    );
    let state = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(STATE))
        .expect("state fixture");
    f.write("state.yaml", common::with_usage(&state).as_bytes());
    let c = f.commit("fair share over a day");
    f.tag("day", &c);
    f.write(
        "policy/tenants.yaml",
        common::with_fair_share(&tenants, "2h").as_bytes(),
    );
    let c = f.commit("fair share forgets within hours");
    f.tag("hours", &c);
    let state = Path::new(f.path()).join("state.yaml");
    let report = every_format_with(&f, "day", "hours", state.to_str().expect("utf-8 path"));
    // A shorter half-life weighs the recent past: platform, borrowing now, loses share of idle
    // capacity; product, borrowing nothing, gains. No workload moves in this snapshot.
    assert!(
        report.contains("share of idle capacity 25.3 % -> 18.1 %"),
        "{report}"
    );
    assert!(report.contains("no workload, GPU or tenant usage changes"));
    insta::assert_snapshot!(report.replace(f.path().trim_end_matches('/'), "<repo>"));
}

/// A pull request that lets borrowers preempt each other by fair share in `train` shows who
/// would yield: platform borrows 24 of the 40 training GPUs observed, product waits for 8 more
/// above its guarantee; after the swap product borrows 8 and platform 16, so one platform job
/// yields (the one that loses the least work), and product's second request still waits.
#[test]
fn fair_share_preemption_shows_who_yields() {
    let mut f = Fleet::new();
    let fleet = fixture("fleet.yaml");
    f.write("policy/fleet.yaml", fleet.as_bytes());
    f.write("policy/tenants.yaml", fixture("tenants.yaml").as_bytes());
    let observed = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(STATE))
        .expect("state fixture");
    let nodes = &observed[..observed.find("  running:").expect("a running list")];
    let mut state = nodes.to_owned() + "  running:\n";
    let job = |name: &str, tenant: &str, node: &str, started: &str| {
        format!(
            "    - name: {name}\n      spec: {{tenant: {tenant}, sloClass: training, gpu: {{count: 8}}}}\n      bindings: [{{node: {node}, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}}]\n      startedAt: \"{started}\"\n"
        )
    };
    state += &job("platform-1", "platform", "n1", "2026-11-20T01:00:00Z");
    state += &job("platform-2", "platform", "n2", "2026-11-20T02:00:00Z");
    state += &job("platform-3", "platform", "n3", "2026-11-20T03:00:00Z");
    state += &job("platform-4", "platform", "n4", "2026-11-20T04:00:00Z");
    state += &job("product-1", "product", "n5", "2026-11-20T04:00:00Z");
    state += "  pending:\n";
    for (name, at) in [("product-2", "07:30"), ("product-3", "07:31")] {
        state += &format!(
            "    - name: {name}\n      spec: {{tenant: product, sloClass: training, gpu: {{count: 8}}}}\n      submittedAt: \"2026-11-20T{at}:00Z\"\n"
        );
    }
    f.write("state.yaml", state.as_bytes());
    let c = f.commit("base fleet");
    f.tag("base", &c);
    let fair = fleet.replace(
        "  sharing: exclusive\n",
        "  sharing: exclusive\n  preemption: {borrowers: FairShare}\n",
    );
    assert_ne!(fair, fleet);
    f.write("policy/fleet.yaml", fair.as_bytes());
    let c = f.commit("train: borrowers preempt each other by fair share");
    f.tag("fair", &c);
    let state = Path::new(f.path()).join("state.yaml");
    let report = every_format_with(&f, "base", "fair", state.to_str().expect("utf-8 path"));
    assert!(report.contains("product-2"), "{report}");
    assert!(report.contains("fair share"), "{report}");
    insta::assert_snapshot!(report.replace(f.path().trim_end_matches('/'), "<repo>"));
}

#[test]
fn a_pool_offers_another_mig_layout() {
    let f = history();
    insta::assert_snapshot!(every_format(&f, "v1", "v2"));
}

#[test]
fn a_renamed_tenant_is_one_rename() {
    let f = history();
    insta::assert_snapshot!(every_format(&f, "v2", "v3"));
}

#[test]
fn a_broken_reference_makes_the_head_invalid() {
    let f = history();
    let report = every_format(&f, "v3", "v4");
    assert!(report.contains("exit 1 (with --detailed-exitcode: 1)"));
    insta::assert_snapshot!(report);
}

#[test]
fn the_same_revision_twice_is_no_change() {
    let f = history();
    let (code, stdout, _) = tessera(&[
        "plan",
        "--repo",
        f.path(),
        "--base",
        "v1",
        "--head",
        "v1",
        "--path",
        "policy",
        "--state",
        STATE,
        "--detailed-exitcode",
    ]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("No changes."), "{stdout}");
}

#[test]
fn revisions_by_branch_and_sha_and_the_whole_repository() {
    let f = history();
    let v1 = f.repo.revparse_single("v1").unwrap().id().to_string();
    // No --path: hidden directories (.github) and non-YAML files (README.md) are skipped.
    let (code, by_sha, stderr) = tessera(&[
        "plan",
        "--repo",
        f.path(),
        "--base",
        "v0",
        "--head",
        &v1,
        "--state",
        STATE,
        "--output",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let (_, by_branch, _) = tessera(&[
        "plan",
        "--repo",
        f.path(),
        "--base",
        "v0",
        "--head",
        "HEAD~3",
        "--state",
        STATE,
        "--output",
        "json",
    ]);
    let mut plan: serde_json::Value = serde_json::from_str(&by_sha).unwrap();
    let mut other: serde_json::Value = serde_json::from_str(&by_branch).unwrap();
    assert_eq!(plan["head"]["commit"], v1.as_str());
    assert_eq!(plan["head"]["files"], 3, "two policy files and the state");
    assert_eq!(other["head"]["rev"], "HEAD~3");
    plan["head"]["rev"] = serde_json::Value::Null;
    other["head"]["rev"] = serde_json::Value::Null;
    assert_eq!(plan, other);
}

#[test]
fn a_new_policy_directory_is_all_added() {
    let mut g = Fleet::new();
    g.write("README.md", b"# empty\n");
    let c0 = g.commit("empty");
    g.write("policy/fleet.yaml", fixture("fleet.yaml").as_bytes());
    g.write("policy/tenants.yaml", fixture("tenants.yaml").as_bytes());
    let c1 = g.commit("first policy");
    let (code, stdout, stderr) = tessera(&[
        "plan",
        "--repo",
        g.path(),
        "--base",
        &c0,
        "--head",
        &c1,
        "--path",
        "policy",
        "--state",
        STATE,
        "--detailed-exitcode",
    ]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stdout.contains("base:  no policy files"), "{stdout}");
    assert!(
        stdout.contains("Plan: 0 tenants changed, 4 added, 0 removed; 0 pools changed, 2 added"),
        "{stdout}"
    );
}

#[test]
fn blobs_are_checked_like_files_on_disk() {
    let mut f = history();
    f.write("policy/tenants.yaml", fixture("tenants.yaml").as_bytes());
    f.write("policy/binary.yaml", b"\xff\xfe not utf-8\n");
    f.write("policy/.hidden/ignored.yaml", b"not: [yaml\n");
    f.write("policy/notes.txt", b"not: [yaml\n");
    // One byte over the cap: refused unread, as on disk.
    let huge = vec![b'#'; (tessera_compiler::source::MAX_FILE_BYTES + 1) as usize];
    f.write("policy/huge.yaml", &huge);
    let head = f.commit("a binary file");
    let (code, stdout, _) = tessera(&[
        "plan",
        "--repo",
        f.path(),
        "--base",
        "v0",
        "--head",
        &head,
        "--path",
        "policy",
        "--state",
        STATE,
        "--output",
        "json",
    ]);
    assert_eq!(code, 1, "{stdout}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let diagnostics = plan["diagnostics"].as_array().unwrap();
    let found: Vec<(&str, &str)> = diagnostics
        .iter()
        .map(|d| (d["name"].as_str().unwrap(), d["file"].as_str().unwrap()))
        .collect();
    assert_eq!(
        found,
        [
            ("yaml-syntax", "policy/binary.yaml"),
            ("input-too-large", "policy/huge.yaml")
        ],
        "{stdout}"
    );
    assert_eq!(plan["policy"], serde_json::Value::Null);
}

#[test]
fn a_directory_is_validated_with_the_state_and_not_diffed() {
    let (code, stdout, stderr) = tessera(&[
        "plan",
        "--policy",
        "tests/data/plan/policy",
        "--state",
        STATE,
        "--detailed-exitcode",
    ]);
    assert_eq!(code, 0, "{stderr}");
    insta::assert_snapshot!(stdout);
}

#[test]
fn a_state_that_contradicts_the_head_is_an_invalid_plan() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.yaml");
    let text = std::fs::read_to_string(STATE)
        .unwrap()
        // A binding to a node the snapshot does not have: the state contradicts itself. (A
        // tenant the head does not know is no contradiction: that work is orphaned.)
        .replace("bindings: [{node: n1,", "bindings: [{node: n9,");
    std::fs::write(&state, text).unwrap();
    let (code, stdout, _) = tessera(&[
        "plan",
        "--policy",
        "tests/data/plan/policy",
        "--state",
        state.to_str().unwrap(),
        "--output",
        "json",
    ]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("\"valid\": false"), "{stdout}");
}

#[test]
fn errors_before_planning_are_exit_2_or_1_with_detailed_exitcode() {
    let f = history();
    let args = [
        "plan",
        "--repo",
        f.path(),
        "--base",
        "no-such-branch",
        "--head",
        "v1",
        "--state",
        STATE,
    ];
    let (code, _, stderr) = tessera(&args);
    assert_eq!(code, 2);
    assert!(stderr.contains("no-such-branch"), "{stderr}");
    let mut detailed = args.to_vec();
    detailed.push("--detailed-exitcode");
    assert_eq!(tessera(&detailed).0, 1);
    let (code, _, stderr) = tessera(&[
        "plan",
        "--repo",
        f.path(),
        "--base",
        "v0",
        "--head",
        "v1",
        "--path",
        "./polcy/",
        "--state",
        STATE,
    ]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("polcy: no such directory at revision v1"),
        "{stderr}"
    );
    let (code, _, _) = tessera(&["plan", "--state", STATE]);
    assert_eq!(code, 2, "--repo or --policy is required");
    let (code, _, stderr) = tessera(&["plan", "--state", STATE, "--detailed-exitcode"]);
    assert_eq!(code, 1, "a usage error is not 'changes': {stderr}");
    let (code, _, _) = tessera(&["plan", "--help", "--detailed-exitcode"]);
    assert_eq!(code, 0);
}

#[test]
fn a_saved_plan_is_refused_once_the_policy_or_the_state_moved() {
    let f = history();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan.json");
    let (code, stdout, stderr) = tessera(&[
        "plan",
        "--repo",
        f.path(),
        "--base",
        "v0",
        "--head",
        "v1",
        "--path",
        "policy",
        "--state",
        STATE,
        "--output",
        "json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let saved_text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(saved_text, stdout, "--out saves what --output json prints");
    let saved = tessera_plan::SavedPlan::from_json(&saved_text).unwrap();
    let v1 = f.repo.revparse_single("v1").unwrap().id().to_string();
    let v2 = f.repo.revparse_single("v2").unwrap().id().to_string();
    let digest = tessera_plan::state_digest(&std::fs::read(STATE).unwrap());
    assert_eq!(
        saved.plan.base.as_ref().unwrap().commit.as_deref(),
        Some(
            f.repo
                .revparse_single("v0")
                .unwrap()
                .id()
                .to_string()
                .as_str()
        )
    );
    assert_eq!(saved.check_current(&v1, &digest), Ok(()));
    assert!(matches!(
        saved.check_current(&v2, &digest),
        Err(tessera_plan::Stale::PolicyMoved { .. })
    ));
    let moved = tessera_plan::state_digest(b"another snapshot");
    let err = saved.check_current(&v1, &moved).unwrap_err();
    assert!(matches!(err, tessera_plan::Stale::StateMoved { .. }));
    assert!(
        err.to_string()
            .starts_with("stale plan: the cluster state moved")
    );

    // No plan is saved for an invalid head.
    let bad = dir.path().join("bad.json");
    let (code, _, stderr) = tessera(&[
        "plan",
        "--repo",
        f.path(),
        "--base",
        "v3",
        "--head",
        "v4",
        "--path",
        "policy",
        "--state",
        STATE,
        "--out",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(!bad.exists(), "{stderr}");
}

#[test]
fn a_bare_clone_and_a_remote_tracking_branch_plan_the_same() {
    let f = history();
    let id = |tag: &str| f.repo.revparse_single(tag).unwrap().id().to_string();
    let (v0, v1) = (id("v0"), id("v1"));
    let plan_json = |repo: &str, base: &str, head: &str| {
        let (code, stdout, stderr) = tessera(&[
            "plan", "--repo", repo, "--base", base, "--head", head, "--path", "policy", "--state",
            STATE, "--output", "json",
        ]);
        assert_eq!(code, 0, "{stderr}");
        let mut v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        v["base"]["rev"] = serde_json::Value::Null;
        v["head"]["rev"] = serde_json::Value::Null;
        v
    };
    let expected = plan_json(f.path(), &v0, &v1);

    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("bare.git");
    git2::build::RepoBuilder::new()
        .bare(true)
        .clone(f.path(), &bare)
        .expect("a local bare clone");
    assert_eq!(plan_json(bare.to_str().unwrap(), &v0, &v1), expected);

    // A work-tree clone whose local branch is behind: plan against `origin/<branch>`.
    let clone = dir.path().join("clone");
    let cloned = git2::build::RepoBuilder::new()
        .clone(f.path(), &clone)
        .expect("a local clone");
    let branch = cloned.head().unwrap().shorthand().unwrap().to_owned();
    let behind = format!("origin/{branch}~3");
    assert_eq!(
        plan_json(clone.to_str().unwrap(), &v0, &behind),
        expected,
        "{behind} is v1"
    );
}

#[test]
fn a_directory_is_planned_against_the_fleet_as_observed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fleet.yaml"), fixture("fleet.yaml")).unwrap();
    let raised =
        fixture("tenants.yaml").replace("  guarantee: {train: 24}\n", "  guarantee: {train: 32}\n");
    std::fs::write(dir.path().join("tenants.yaml"), raised).unwrap();
    let (code, stdout, stderr) = tessera(&[
        "plan",
        "--policy",
        dir.path().to_str().unwrap(),
        "--state",
        STATE,
        "--output",
        "json",
        "--detailed-exitcode",
    ]);
    assert_eq!(code, 2, "the decision changes the fleet: {stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let changes: Vec<(String, String)> = v["decisions"]["diff"]["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap().to_owned(),
                w["change"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("platform-extra".to_owned(), "preempted".to_owned()),
            ("research-next".to_owned(), "admitted".to_owned()),
        ]
    );
}

#[test]
fn renaming_a_tenant_with_running_work_orphans_that_work_instead_of_failing() {
    let mut f = history();
    let tenants =
        fixture("tenants.yaml").replace("guarantee: {train: 24}", "guarantee: {train: 32}");
    let renamed = tenants.replace("metadata: {name: platform}", "metadata: {name: infra}");
    assert_ne!(renamed, tenants);
    f.write("policy/tenants.yaml", tenants.as_bytes());
    let before = f.commit("back to the raised fleet");
    f.write("policy/tenants.yaml", renamed.as_bytes());
    let after = f.commit("platform is now infra");
    let (code, stdout, stderr) = tessera(&[
        "plan",
        "--repo",
        f.path(),
        "--base",
        &before,
        "--head",
        &after,
        "--path",
        "policy",
        "--state",
        STATE,
        "--output",
        "json",
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["policy"]["tenants"][0]["change"], "renamed");
    // The snapshot's `platform` work is orphaned under the head, and the plan says so.
    let orphaned: Vec<&str> = v["decisions"]["diff"]["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["tenant"] == "platform")
        .map(|w| w["after"]["reason"].as_str().unwrap_or_default())
        .collect();
    assert!(!orphaned.is_empty(), "{stdout}");
    assert!(
        orphaned.iter().all(|r| r.contains("orphaned")),
        "{orphaned:?}"
    );
    assert!(
        v["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["severity"] == "warning"
                && d["message"].as_str().unwrap().contains("orphaned")),
        "{stdout}"
    );
}

/// The state file is the fleet as observed: it replaces a `ClusterState` committed in the
/// policy tree (the issue's `--path examples/policies/quickstart --state
/// examples/policies/quickstart/cluster-state.yaml`), and the plan says so.
#[test]
fn the_state_file_replaces_a_snapshot_committed_in_the_policy_tree() {
    let mut f = Fleet::new();
    let state = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(STATE)).unwrap();
    f.write("policy/fleet.yaml", fixture("fleet.yaml").as_bytes());
    f.write("policy/tenants.yaml", fixture("tenants.yaml").as_bytes());
    f.write("policy/cluster-state.yaml", state.as_bytes());
    let base = f.commit("with a snapshot");
    let raised =
        fixture("tenants.yaml").replace("  guarantee: {train: 24}\n", "  guarantee: {train: 32}\n");
    f.write("policy/tenants.yaml", raised.as_bytes());
    let head = f.commit("raise");
    let run = |output: &str| {
        tessera(&[
            "plan",
            "--repo",
            f.path(),
            "--base",
            &base,
            "--head",
            &head,
            "--path",
            "policy",
            "--state",
            STATE,
            "--output",
            output,
        ])
    };
    let (code, stdout, stderr) = run("human");
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "replaces ClusterState `snapshot` (policy/cluster-state.yaml:7): the state file is the fleet as observed"
        ),
        "{stdout}"
    );
    let (_, json, _) = run("json");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["state"]["snapshots"], serde_json::json!(["snapshot"]));
    assert_eq!(
        v["state"]["replaces"],
        serde_json::json!([{"name": "snapshot", "file": "policy/cluster-state.yaml", "line": 7}])
    );
}

/// A state file inside the planned directory, however it is spelt, is read once.
#[test]
fn a_state_file_in_the_policy_directory_is_read_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fleet.yaml"), fixture("fleet.yaml")).unwrap();
    std::fs::write(dir.path().join("tenants.yaml"), fixture("tenants.yaml")).unwrap();
    let state = Path::new(env!("CARGO_MANIFEST_DIR")).join(STATE);
    std::fs::copy(state, dir.path().join("state.yaml")).unwrap();
    let spelt = dir.path().join(".").join("state.yaml");
    let (code, stdout, stderr) = tessera(&[
        "plan",
        "--policy",
        dir.path().to_str().unwrap(),
        "--state",
        spelt.to_str().unwrap(),
        "--output",
        "json",
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["state"]["snapshots"], serde_json::json!(["snapshot"]));
    assert!(v["state"].get("replaces").is_none(), "{stdout}");
}

/// The snapshot's reconfiguration records spend a pool's budget under `plan` as in the
/// service: a head that lowers `maxPerGpuPerHour` to what the last hour already spent leaves
/// the re-partition the base would make waiting, with the reason.
#[test]
fn a_spent_reconfiguration_budget_leaves_the_change_waiting() {
    let mut f = Fleet::new();
    let fleet = fixture("fleet.yaml").replace(
        "  migLayouts: [halves]\n",
        "  migLayouts: [halves, sevenths]\n",
    ) + "---\napiVersion: tessera/v1alpha1\nkind: MigLayout\nmetadata: {name: sevenths}\n\
           spec: {gpuModel: H100-SXM5-80GB, instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, \
           1g.10gb, 1g.10gb, 1g.10gb]}\n";
    f.write("policy/fleet.yaml", fleet.as_bytes());
    f.write("policy/tenants.yaml", fixture("tenants.yaml").as_bytes());
    let base = f.commit("infer: the all-1g layout, two changes an hour");
    let once = fleet.replace(
        "  migLayouts: [halves, sevenths]\n",
        "  migLayouts: [halves, sevenths]\n  reconfiguration: {maxPerGpuPerHour: 1}\n",
    );
    assert_ne!(once, fleet);
    f.write("policy/fleet.yaml", once.as_bytes());
    let head = f.commit("infer: one change an hour");

    // Every GPU of `m1` was re-partitioned half an hour before the snapshot.
    let records: String = (0..8)
        .map(|g| format!("    - {{node: m1, gpu: {g}, at: \"2026-11-20T07:30:00Z\"}}\n"))
        .collect();
    let state_dir = tempfile::tempdir().unwrap();
    let state = state_dir.path().join("state.yaml");
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(STATE)).unwrap()
        + "  reconfigurations:\n"
        + &records;
    std::fs::write(&state, text).unwrap();

    let plan = |state: &str| -> serde_json::Value {
        let (code, stdout, stderr) = tessera(&[
            "plan",
            "--repo",
            f.path(),
            "--base",
            &base,
            "--head",
            &head,
            "--path",
            "policy",
            "--state",
            state,
            "--output",
            "json",
        ]);
        assert_eq!(code, 0, "{stdout}{stderr}");
        serde_json::from_str(&stdout).unwrap()
    };
    let v = plan(state.to_str().unwrap());
    let workloads = v["decisions"]["diff"]["workloads"].as_array().unwrap();
    let chat = workloads
        .iter()
        .find(|w| w["name"] == "tiny-chat")
        .unwrap_or_else(|| panic!("tiny-chat changes: {v}"));
    assert_eq!(chat["change"], "pending", "{chat}");
    assert_eq!(chat["before"]["outcome"], "admit", "{chat}");
    let reason = chat["after"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("reconfiguration budget spent on GPU m1/"),
        "{reason}"
    );

    // Without the records both revisions re-partition a GPU for it: no change.
    let v = plan(STATE);
    let workloads = v["decisions"]["diff"]["workloads"].as_array().unwrap();
    assert!(
        workloads.iter().all(|w| w["name"] != "tiny-chat"),
        "{workloads:?}"
    );
}
