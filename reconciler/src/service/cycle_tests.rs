//! Cycles driven one at a time on the simulated fleet of `tests/data/reconcile`, with a
//! submission made while a cycle runs (from inside the driver, as the API would from another
//! thread).

use std::path::Path;
use std::sync::{Arc, Mutex};

use tessera_compiler::model::WorkloadSpec;

use super::cycle::{CycleReport, Decided};
use super::run::run_loop;
use super::{Config, Handle, Limits, Reconciler, ServiceError, Shared, Wake};
use crate::auth::Principal;
use crate::driver::observe_hook::ObserveHook;
use crate::driver::sim::SimDriver;
use crate::driver::{NodeDriver, Observation};
use crate::repo::{Mirror, Source};
use crate::runtime::{Confinement, Runtime};
use crate::store::{Origin, Phase, Store};

fn data(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/reconcile")
        .join(path)
}

/// A submission the driver makes on its `at`-th observation from now.
struct During {
    at: usize,
    store: Store,
    name: String,
    spec: WorkloadSpec,
    now: i64,
}

/// The simulated driver, submitting `during` when its observation comes.
fn submitting(sim: SimDriver, during: Arc<Mutex<Option<During>>>) -> impl NodeDriver {
    ObserveHook::new(sim, move |_: &mut Observation| {
        let mut during = during.lock().unwrap();
        if let Some(d) = during.as_mut() {
            d.at -= 1;
            if d.at == 0 {
                let d = during.take().unwrap();
                d.store
                    .submit(&d.name, &d.spec, Origin::Submitted, d.now)
                    .unwrap();
            }
        }
    })
}

fn training(tenant: &str) -> WorkloadSpec {
    serde_json::from_value(serde_json::json!({
        "tenant": tenant, "sloClass": "training", "pool": "train", "gpu": {"count": 1}
    }))
    .unwrap()
}

fn decided<'r>(
    report: &'r CycleReport,
    name: &str,
) -> Option<&'r tessera_solver::decision::Outcome> {
    report
        .decision
        .as_ref()?
        .workloads
        .iter()
        .find(|w| w.name == name)
        .map(|w| &w.outcome)
}

/// Commits the simulated fleet's policy to the repository `git` at `repo`.
fn commit_policy(git: &git2::Repository, repo: &Path) {
    let mut index = git.index().unwrap();
    for f in ["fleet.yaml", "tenants.yaml"] {
        std::fs::copy(data("policy").join(f), repo.join(f)).unwrap();
        index.add_path(Path::new(f)).unwrap();
    }
    let tree = git.find_tree(index.write_tree().unwrap()).unwrap();
    let who = git2::Signature::now("test", "test@tessera.invalid").unwrap();
    git.commit(Some("HEAD"), &who, &who, "policy", &tree, &[])
        .unwrap();
}

/// A workload submitted while a cycle carries out its decision is not part of what that
/// decision stands for: the next cycle decides it with its own arrivals, by the session,
/// rather than leaving it undecided until a full cycle.
#[test]
fn a_submission_made_while_a_cycle_runs_is_decided_by_the_next() {
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("policy-repo");
    let git = git2::Repository::init_opts(
        &repo,
        git2::RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    commit_policy(&git, &repo);

    let state_dir = work.path().join("state");
    std::fs::create_dir_all(&state_dir).unwrap();
    let db = state_dir.join("tessera.db");
    let source = Source {
        url: repo.display().to_string(),
        branch: "main".to_owned(),
        subdir: None,
    };
    let mut config = Config::new(source.clone(), state_dir.clone());
    config.run_commands = false;
    config.confinement = Confinement::Insecure;
    config.cycle_period = std::time::Duration::from_secs(3600);
    let during = Arc::new(Mutex::new(None));
    let driver = submitting(
        SimDriver::open(&data("nodes.yaml"), &state_dir.join("sim-nodes.json")).unwrap(),
        during.clone(),
    );
    let api = Store::open(&db).unwrap();
    let mirror = Mirror::open(source, &state_dir.join("mirror.git")).unwrap();
    let runtime = Runtime::new(state_dir.join("runtime"), Confinement::Insecure).unwrap();
    let (tx, _rx) = std::sync::mpsc::channel();
    let shared = Arc::new(Shared::new("sim", tx));
    let mut reconciler = Reconciler::new(
        config,
        Box::new(Store::open(&db).unwrap()),
        Box::new(driver),
        runtime,
        mirror,
        shared,
    );
    let now = 1_800_000_000;
    reconciler.sync_repository(now).unwrap();
    let first = reconciler.cycle(now);
    assert_eq!(first.error, None);

    // `a` arrives; while the cycle that starts it runs, `b` is submitted: at the cycle's
    // second observation, the one after its actions.
    api.submit("a", &training("research"), Origin::Submitted, now)
        .unwrap();
    *during.lock().unwrap() = Some(During {
        at: 2,
        store: Store::open(&db).unwrap(),
        name: "b".into(),
        spec: training("research"),
        now,
    });
    let second = reconciler.cycle(now);
    assert_eq!(second.error, None);
    assert!(during.lock().unwrap().is_none(), "`b` was submitted");
    assert_eq!(second.decided, Decided::Session { arrivals: 1 });
    assert!(decided(&second, "a").is_some());
    assert!(
        decided(&second, "b").is_none(),
        "`b` came after the snapshot"
    );

    // `c` arrives: the next cycle decides both, `b` first (one GPU left, so `c` waits).
    api.submit("c", &training("research"), Origin::Submitted, now + 1)
        .unwrap();
    let third = reconciler.cycle(now + 1);
    assert_eq!(third.error, None);
    assert_eq!(third.decided, Decided::Session { arrivals: 2 });
    assert!(
        matches!(
            decided(&third, "b"),
            Some(tessera_solver::decision::Outcome::Admit { .. })
        ),
        "{:?}",
        decided(&third, "b")
    );
    assert!(
        matches!(
            decided(&third, "c"),
            Some(tessera_solver::decision::Outcome::Pending { .. })
        ),
        "{:?}",
        decided(&third, "c")
    );
    let phase = |name: &str| {
        api.live()
            .unwrap()
            .into_iter()
            .find(|r| r.name == name)
            .map(|r| r.phase)
    };
    assert_eq!(phase("b"), Some(Phase::Running));
}

/// The loop prunes at start-up, before its first cycle: an ended workload older than its
/// keeping time is gone from the API, and the rows deleted are counted in `/metrics`; a live
/// workload submitted as long ago is kept.
#[test]
fn the_loop_prunes_what_aged_past_its_keeping_time_at_start_up() {
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("policy-repo");
    let git = git2::Repository::init_opts(
        &repo,
        git2::RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    commit_policy(&git, &repo);
    let state_dir = work.path().join("state");
    std::fs::create_dir_all(&state_dir).unwrap();
    let db = state_dir.join("tessera.db");

    // The loop reads the clock: the history is dated from it.
    let long_ago = crate::snapshot::now() - 40 * 86_400;
    let api = Store::open(&db).unwrap();
    api.submit("old", &training("research"), Origin::Submitted, long_ago)
        .unwrap();
    api.cancel(
        &tessera_compiler::WorkloadKey::new("research", "old"),
        long_ago,
    )
    .unwrap();
    api.submit(
        "waiting",
        &training("research"),
        Origin::Submitted,
        long_ago,
    )
    .unwrap();

    let source = Source {
        url: repo.display().to_string(),
        branch: "main".to_owned(),
        subdir: None,
    };
    let mut config = Config::new(source.clone(), state_dir.clone());
    config.run_commands = false;
    config.confinement = Confinement::Insecure;
    config.cycle_period = std::time::Duration::from_secs(3600);
    let driver = SimDriver::open(&data("nodes.yaml"), &state_dir.join("sim-nodes.json")).unwrap();
    let mirror = Mirror::open(source, &state_dir.join("mirror.git")).unwrap();
    let runtime = Runtime::new(state_dir.join("runtime"), Confinement::Insecure).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let shared = Arc::new(Shared::new("sim", tx.clone()));
    let reconciler = Reconciler::new(
        config,
        Box::new(Store::open(&db).unwrap()),
        Box::new(driver),
        runtime,
        mirror,
        shared.clone(),
    );
    // One pass of the loop: recovery, the start-up prune, a fetch and a cycle, then the stop.
    tx.send(Wake::Shutdown).unwrap();
    run_loop(reconciler, rx);

    let handle = Handle::new(shared, Box::new(api), Limits::default());
    let gone = handle.get(&Principal::Admin, "old", Some("research"));
    assert!(matches!(gone, Err(ServiceError::NotFound(_))), "{gone:?}");
    let kept = handle
        .get(&Principal::Admin, "waiting", Some("research"))
        .unwrap();
    assert!(!kept.phase.is_ended(), "{:?}", kept.phase);
    let metrics = handle.metrics();
    for line in [
        "tessera_pruned_total{kind=\"workloads\"} 1",
        // Both workloads' submissions and the cancel, 40 days old.
        "tessera_pruned_total{kind=\"events\"} 3",
        "tessera_pruned_total{kind=\"usage\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}
