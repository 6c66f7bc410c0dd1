//! The arrival path (`cycle/arrivals.rs`) driven pass by pass on a simulated fleet: what it
//! decides and records, each change other than a submission sending it to a full cycle, and
//! the fleet it leaves agreeing with the one full cycles leave on the same submissions.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{Binding, WorkloadSpec};

use super::cycle::Decided;
use super::standing::Stale;
use super::{Config, Reconciler, Shared};
use crate::driver::sim::SimDriver;
use crate::driver::{ComputeInstanceInfo, DriverError, GpuRef, NodeDriver, Observation};
use crate::repo::{Mirror, Source};
use crate::runtime::{Confinement, Runtime};
use crate::store::{EndReason, Origin, Phase, Store};

/// Whole GPUs only: 3 nodes of 4 GPUs for training.
const FLEET: &str = "\
apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {name: tiers}
spec: {tiers: [{name: batch, value: 100}]}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: training}
spec: {tier: batch, preemptible: true, isolation: {minimum: exclusive}, preemption: {signal: SIGUSR1, gracePeriod: 20s, minRuntime: 1h}}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: train}
spec: {gpuModel: H100-SXM5-80GB, sharing: exclusive, capacity: {nodes: 3, gpusPerNode: 4, cpuPerNode: 64, memoryPerNode: 512Gi}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: org}
spec: {guarantee: {train: 12}, sloClasses: [training]}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: a}
spec: {parent: org, guarantee: {train: 6}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: b}
spec: {parent: org, guarantee: {train: 4}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: c}
spec: {parent: org, guarantee: {train: 2}}
";

fn nodes_yaml() -> String {
    let mut s = String::from(
        "apiVersion: tessera/v1alpha1\nkind: ClusterState\nmetadata: {name: nodes}\nspec:\n  \
         observedAt: \"2026-11-23T00:00:00Z\"\n  nodes:\n",
    );
    for n in 0..3 {
        s.push_str(&format!(
            "    - name: t{n}\n      pool: train\n      cpu: 64\n      memory: 512Gi\n      gpus:\n"
        ));
        for g in 0..4 {
            s.push_str(&format!(
                "        - {{index: {g}, uuid: GPU-0a00000{n}-0000-0000-0000-00000000000{g}, model: H100-SXM5-80GB}}\n"
            ));
        }
    }
    s
}

/// The simulated driver, shared with the test so that it can change the nodes; it counts
/// the observations made, and keeps its generation to itself unless `vouches` (a node side
/// that can only observe, as real NVML and fleet mode).
#[derive(Clone)]
struct Sim {
    driver: Arc<Mutex<SimDriver>>,
    observations: Arc<AtomicUsize>,
    vouches: bool,
}

impl Sim {
    fn lock(&self) -> std::sync::MutexGuard<'_, SimDriver> {
        self.driver.lock().unwrap()
    }
}

impl NodeDriver for Sim {
    fn kind(&self) -> &'static str {
        "sim"
    }
    fn observe(&mut self) -> Result<Observation, DriverError> {
        self.observations.fetch_add(1, Ordering::SeqCst);
        self.lock().observe()
    }
    fn generation(&self) -> Option<u64> {
        self.lock().generation().filter(|_| self.vouches)
    }
    fn set_mig_mode(&mut self, gpu: &GpuRef, enabled: bool) -> Result<(), DriverError> {
        self.lock().set_mig_mode(gpu, enabled)
    }
    fn reset_gpu(&mut self, gpu: &GpuRef) -> Result<(), DriverError> {
        self.lock().reset_gpu(gpu)
    }
    fn create_gpu_instance(
        &mut self,
        gpu: &GpuRef,
        profile_id: u32,
        start: u8,
    ) -> Result<u32, DriverError> {
        self.lock().create_gpu_instance(gpu, profile_id, start)
    }
    fn destroy_gpu_instance(&mut self, gpu: &GpuRef, gpu_instance: u32) -> Result<(), DriverError> {
        self.lock().destroy_gpu_instance(gpu, gpu_instance)
    }
    fn create_compute_instance(
        &mut self,
        gpu: &GpuRef,
        gpu_instance: u32,
    ) -> Result<ComputeInstanceInfo, DriverError> {
        self.lock().create_compute_instance(gpu, gpu_instance)
    }
    fn destroy_compute_instance(
        &mut self,
        gpu: &GpuRef,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<(), DriverError> {
        self.lock()
            .destroy_compute_instance(gpu, gpu_instance, compute_instance)
    }
}

/// A service on [`FLEET`], its first cycle run, driven by the test.
struct Service {
    reconciler: Reconciler,
    /// The API's connection.
    api: Store,
    shared: Arc<Shared>,
    sim: Sim,
    repo: git2::Repository,
    _work: tempfile::TempDir,
}

const NOW: i64 = 1_800_000_000;

fn commit(repo: &git2::Repository, policy: &str) {
    let dir = repo.workdir().unwrap();
    std::fs::write(dir.join("fleet.yaml"), policy).unwrap();
    let mut index = repo.index().unwrap();
    index.add_path(Path::new("fleet.yaml")).unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let who = git2::Signature::now("test", "test@tessera.invalid").unwrap();
    let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    repo.commit(Some("HEAD"), &who, &who, "policy", &tree, &parents)
        .unwrap();
}

fn service(incremental: bool) -> Service {
    service_on(incremental, true)
}

/// `vouches`: whether the node side keeps a generation (see [`Sim`]).
fn service_on(incremental: bool, vouches: bool) -> Service {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("policy-repo");
    let repo = git2::Repository::init_opts(
        &dir,
        git2::RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    commit(&repo, FLEET);
    let state_dir = work.path().join("state");
    std::fs::create_dir_all(&state_dir).unwrap();
    let nodes = work.path().join("nodes.yaml");
    std::fs::write(&nodes, nodes_yaml()).unwrap();
    let db = state_dir.join("tessera.db");
    let source = Source {
        url: dir.display().to_string(),
        branch: "main".to_owned(),
        subdir: None,
    };
    let mut config = Config::new(source.clone(), state_dir.clone());
    config.run_commands = false;
    config.confinement = Confinement::Insecure;
    config.cycle_period = std::time::Duration::from_secs(3600);
    config.incremental = incremental;
    let sim = Sim {
        driver: Arc::new(Mutex::new(
            SimDriver::open(&nodes, &state_dir.join("sim-nodes.json")).unwrap(),
        )),
        observations: Arc::new(AtomicUsize::new(0)),
        vouches,
    };
    let mirror = Mirror::open(source, &state_dir.join("mirror.git")).unwrap();
    let runtime = Runtime::new(state_dir.join("runtime"), Confinement::Insecure).unwrap();
    let (tx, _rx) = std::sync::mpsc::channel();
    let shared = Arc::new(Shared::new("sim", tx));
    let mut reconciler = Reconciler::new(
        config,
        Box::new(Store::open(&db).unwrap()),
        Box::new(sim.clone()),
        runtime,
        mirror,
        shared.clone(),
    );
    reconciler.sync_repository(NOW).unwrap();
    let first = reconciler.cycle(NOW);
    assert_eq!(first.error, None);
    Service {
        reconciler,
        api: Store::open(&db).unwrap(),
        shared,
        sim,
        repo,
        _work: work,
    }
}

fn training(tenant: &str, gpus: u32) -> WorkloadSpec {
    serde_json::from_value(serde_json::json!({
        "tenant": tenant, "sloClass": "training", "pool": "train", "gpu": {"count": gpus}
    }))
    .unwrap()
}

impl Service {
    fn submit(&self, tenant: &str, name: &str, gpus: u32, now: i64) {
        self.api
            .submit(name, &training(tenant, gpus), Origin::Submitted, now)
            .unwrap();
    }

    /// Each live workload's key, phase and bindings, in key order.
    fn fleet(&self) -> Vec<(String, Phase, Vec<Binding>)> {
        let mut live: Vec<_> = self
            .api
            .live()
            .unwrap()
            .into_iter()
            .map(|r| (r.key().to_string(), r.phase, r.bindings))
            .collect();
        live.sort_by(|a, b| a.0.cmp(&b.0));
        live
    }

    fn phase(&self, tenant: &str, name: &str) -> Phase {
        self.api
            .workload(&WorkloadKey::new(tenant, name))
            .unwrap()
            .phase
    }
}

#[test]
fn submissions_are_decided_and_started_by_the_arrival_path() {
    let mut s = service(true);
    s.submit("a", "one", 2, NOW + 1);
    s.submit("b", "two", 1, NOW + 1);
    let pass = s
        .reconciler
        .arrivals(NOW + 2)
        .expect("decided by the session");
    assert_eq!((pass.decided, pass.started, pass.more), (2, 2, false));
    assert_eq!(s.phase("a", "one"), Phase::Running);
    assert_eq!(s.phase("b", "two"), Phase::Running);
    assert!(
        s.api.open_actions().unwrap().is_empty(),
        "every intent closed"
    );

    // The API's reasons and `/state` follow without a full cycle.
    let index = s.shared.decisions.read().unwrap().clone().unwrap();
    let decided = &index.workload(&WorkloadKey::new("a", "one")).unwrap();
    assert_eq!(decided.outcome, "admit");
    assert_eq!(decided.decided_at, Some(crate::snapshot::unix(NOW + 2)));
    let state = s.shared.state.read().unwrap().clone().unwrap();
    assert!(
        state
            .running
            .iter()
            .any(|r| r.name == "one" && r.spec.tenant == "a" && r.bindings.len() == 1)
    );
    assert!(state.pending.is_empty());

    // Nothing new: a pass that decides nothing, and the standing decision still stands.
    let idle = s.reconciler.arrivals(NOW + 3).expect("nothing changed");
    assert_eq!(idle.decided, 0);

    // A workload that does not fit waits, with its reason published.
    s.submit("c", "big", 12, NOW + 4);
    let pass = s
        .reconciler
        .arrivals(NOW + 5)
        .expect("decided by the session");
    assert_eq!((pass.decided, pass.started), (1, 0));
    assert_eq!(s.phase("c", "big"), Phase::Pending);
    let index = s.shared.decisions.read().unwrap().clone().unwrap();
    assert_eq!(
        index
            .workload(&WorkloadKey::new("c", "big"))
            .unwrap()
            .outcome,
        "pending"
    );
    let state = s.shared.state.read().unwrap().clone().unwrap();
    assert_eq!(state.pending.len(), 1);
}

/// The changes other than a submission, each made after one pass of the arrival path.
#[derive(Debug, Clone, Copy)]
enum Change {
    Cancel,
    Finish,
    Requeue,
    NodeLost,
    Revision,
    Suspend,
    PeriodPassed,
}

#[test]
fn every_change_but_a_submission_sends_arrivals_to_a_full_cycle() {
    let cases = [
        (Change::Cancel, "event"),
        (Change::Finish, "event"),
        (Change::Requeue, "event"),
        (Change::NodeLost, "changed"),
        (Change::Revision, "revision"),
        (Change::Suspend, "suspended"),
        (Change::PeriodPassed, "expired"),
    ];
    for (change, why) in cases {
        let mut s = service(true);
        s.submit("a", "one", 1, NOW + 1);
        assert!(s.reconciler.arrivals(NOW + 2).is_some(), "{change:?}");
        let one = WorkloadKey::new("a", "one");
        let mut now = NOW + 3;
        match change {
            Change::Cancel => {
                s.api.cancel(&one, now).unwrap();
            }
            Change::Finish => {
                s.api
                    .finish(&one, EndReason::Exited { code: 0 }, now)
                    .unwrap();
            }
            Change::Requeue => {
                s.api.requeue(&one, "test", now).unwrap();
            }
            Change::NodeLost => {
                let gpu = GpuRef {
                    node: "t2".into(),
                    index: 3,
                };
                s.sim.lock().set_gpu_lost(&gpu, true).unwrap();
            }
            Change::Revision => {
                commit(&s.repo, &FLEET.replace("train: 6", "train: 5"));
                s.reconciler.sync_repository(now).unwrap();
            }
            Change::Suspend => s.shared.suspended.store(true, Ordering::SeqCst),
            Change::PeriodPassed => now += 3600,
        }
        s.submit("b", "two", 1, now);
        assert!(s.reconciler.arrivals(now).is_none(), "{change:?}");
        let report = s.reconciler.cycle(now);
        assert_eq!(report.error, None, "{change:?}");
        match &report.decided {
            Decided::Full { why: Some(text) } => {
                let kind = kind_of(text);
                assert_eq!(kind, why, "{change:?}: {text}");
            }
            other => panic!("{change:?}: decided {other:?}"),
        }
    }
}

/// The nodes' changes between two passes that the arrival path must see: each sends the pass
/// to a full cycle, whether the node side vouches for its last observation with a generation
/// or is observed and compared, and the full cycle's decision is made on the changed fleet.
#[test]
fn a_node_change_between_passes_sends_arrivals_to_a_full_cycle() {
    let gpu = GpuRef {
        node: "t2".into(),
        index: 3,
    };
    type NodeChange = fn(&mut SimDriver, &GpuRef);
    let changes: [(&str, NodeChange); 3] = [
        ("lost", |sim, gpu| sim.set_gpu_lost(gpu, true).unwrap()),
        ("MIG mode pending", |sim, gpu| {
            sim.set_mig_mode(gpu, true).unwrap()
        }),
        ("lost and back", |sim, gpu| {
            sim.set_gpu_lost(gpu, true).unwrap();
            sim.set_gpu_lost(gpu, false).unwrap();
        }),
    ];
    for vouches in [true, false] {
        for (name, change) in changes {
            let mut s = service_on(true, vouches);
            s.submit("a", "one", 1, NOW + 1);
            assert!(s.reconciler.arrivals(NOW + 2).is_some(), "{name}");
            change(&mut s.sim.lock(), &gpu);
            s.submit("b", "two", 1, NOW + 3);
            let pass = s.reconciler.arrivals(NOW + 3);
            if name == "lost and back" && !vouches {
                // Observed and compared, a change undone before the pass is no change: the
                // nodes are as the standing decision saw them.
                assert!(pass.is_some(), "{name}, observed");
                continue;
            }
            assert!(pass.is_none(), "{name}, vouches: {vouches}");
            let report = s.reconciler.cycle(NOW + 3);
            assert_eq!(report.error, None, "{name}");
            match &report.decided {
                Decided::Full { why: Some(text) } => {
                    assert_eq!(
                        kind_of(text),
                        "changed",
                        "{name}, vouches: {vouches}: {text}"
                    )
                }
                other => panic!("{name}, vouches: {vouches}: decided {other:?}"),
            }
            assert_eq!(s.phase("b", "two"), Phase::Running, "{name}");
        }
    }
}

/// A node side that keeps a generation is not observed by a pass while the generation
/// stands: what the pass checks and starts from is the full cycle's last observation. One
/// without is observed once a pass that has arrivals.
#[test]
fn a_pass_observes_the_nodes_only_when_their_generation_cannot_vouch() {
    for vouches in [true, false] {
        let mut s = service_on(true, vouches);
        let before = s.sim.observations.load(Ordering::SeqCst);
        for (i, tenant) in ["a", "b", "c"].into_iter().enumerate() {
            let at = NOW + 1 + i as i64;
            s.submit(tenant, &format!("w{i}"), 1, at);
            let pass = s.reconciler.arrivals(at).expect("decided by the session");
            assert_eq!((pass.decided, pass.started), (1, 1), "vouches: {vouches}");
        }
        let observed = s.sim.observations.load(Ordering::SeqCst) - before;
        assert_eq!(observed, if vouches { 0 } else { 3 }, "vouches: {vouches}");
        // The starts resolved their devices from the vouched-for observation.
        let running = s.api.live().unwrap();
        assert!(
            running
                .iter()
                .all(|r| r.phase == Phase::Running
                    && r.replicas.iter().all(|p| !p.devices.is_empty()))
        );
    }
}

/// The reason's kind from its sentence (`Stale`'s `Display`).
fn kind_of(text: &str) -> &'static str {
    let all = [
        Stale::Revision,
        Stale::Expired,
        Stale::Suspended,
        Stale::Exited,
        Stale::Changed("nodes"),
    ];
    if let Some(s) = all.iter().find(|s| s.to_string() == text) {
        return s.kind();
    }
    if text.starts_with("the store recorded") {
        "event"
    } else {
        "other"
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Submissions decided one by one by the arrival path leave the fleet that a full cycle
    /// after each leaves: the same workloads running on the same GPUs, the same ones waiting.
    /// (Several submissions at once agree only in part: the arrival path decides them in
    /// submission order and leaves one the full cycle would order first to the next pass,
    /// which decides it after the others run, as `standing.rs` says.)
    #[test]
    fn the_arrival_path_leaves_the_fleet_full_cycles_leave(
        arrivals in prop::collection::vec((0usize..3, 1u32..=3), 1..8)
    ) {
        let mut fast = service(true);
        let mut full = service(false);
        for (n, &(tenant, gpus)) in arrivals.iter().enumerate() {
            let now = NOW + 10 * (n as i64 + 1);
            let tenant = ["a", "b", "c"][tenant];
            let name = format!("w{n}");
            fast.submit(tenant, &name, gpus, now);
            full.submit(tenant, &name, gpus, now);
            // As the service's loop runs it: a full cycle when the pass cannot decide.
            if fast.reconciler.arrivals(now + 1).is_none() {
                let report = fast.reconciler.cycle(now + 1);
                prop_assert_eq!(report.error, None);
            }
            let report = full.reconciler.cycle(now + 1);
            prop_assert_eq!(report.error, None);
            prop_assert_eq!(fast.fleet(), full.fleet(), "after {}", name);
        }
    }
}
