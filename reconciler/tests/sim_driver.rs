//! The simulated node driver against the rules NVML enforces, its fault injection and its
//! persistence, on the quickstart fleet.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tessera_compiler::model::{Health, MigInstance};
use tessera_reconciler::driver::faults::{Call, Fault, FaultPlan};
use tessera_reconciler::driver::sim::{SimDriver, SimError};
use tessera_reconciler::driver::{DriverError, GpuRef, NodeDriver, NvmlReturn, Observation};

fn quickstart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies/quickstart/cluster-state.yaml")
}

fn gpu(node: &str, index: u32) -> GpuRef {
    GpuRef {
        node: node.into(),
        index,
    }
}

struct Fleet {
    dir: tempfile::TempDir,
    sim: SimDriver,
}

impl Fleet {
    fn state(&self) -> PathBuf {
        self.dir.path().join("sim-state.json")
    }

    /// The driver as a restarted service would open it.
    fn reopen(&self) -> SimDriver {
        SimDriver::open(Path::new("/nonexistent/nodes.yaml"), &self.state())
            .expect("reopen from the state file")
    }
}

fn fleet() -> Fleet {
    let dir = tempfile::tempdir().expect("temp dir");
    let sim = SimDriver::open(&quickstart(), &dir.path().join("sim-state.json"))
        .expect("quickstart nodes");
    Fleet { dir, sim }
}

fn code<T: std::fmt::Debug>(r: Result<T, DriverError>) -> NvmlReturn {
    match r {
        Err(DriverError::Nvml { code, .. }) => code,
        other => panic!("expected an NVML error, got {other:?}"),
    }
}

fn instances(obs: &Observation, node: &str, index: u32) -> Vec<(String, u8)> {
    let n = obs.nodes.iter().find(|n| n.name == node).expect("node");
    let g = n.gpus.iter().find(|g| g.index == index).expect("gpu");
    g.instances
        .iter()
        .map(|i| (i.profile.clone(), i.start))
        .collect()
}

fn observed_gpu<'a>(
    obs: &'a Observation,
    node: &str,
    index: u32,
) -> &'a tessera_compiler::model::Gpu {
    obs.nodes
        .iter()
        .find(|n| n.name == node)
        .and_then(|n| n.gpus.iter().find(|g| g.index == index))
        .expect("gpu")
}

/// GPU instance id at a memory-slice start, from the observation's details.
fn gi_at(obs: &Observation, g: &GpuRef, start: u8) -> u32 {
    obs.details
        .iter()
        .find(|d| d.gpu == *g)
        .and_then(|d| d.instances.iter().find(|i| i.start == start))
        .map(|i| i.id)
        .unwrap_or_else(|| panic!("no instance at {start} on {g}"))
}

fn owned(v: &[(&str, u8)]) -> Vec<(String, u8)> {
    v.iter().map(|(p, s)| ((*p).to_owned(), *s)).collect()
}

#[test]
fn observes_the_quickstart_fleet() {
    let mut f = fleet();
    let obs = f.sim.observe().unwrap();
    let names: Vec<&str> = obs.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["train-0", "train-1", "infer-0"]);
    assert_eq!(obs.details.len(), 24);
    assert_eq!(
        instances(&obs, "infer-0", 0),
        owned(&[
            ("2g.20gb", 0),
            ("1g.10gb", 2),
            ("1g.10gb", 3),
            ("3g.40gb", 4)
        ])
    );
    let g0 = observed_gpu(&obs, "infer-0", 0);
    assert!(g0.mig.enabled && g0.mig.pending.is_none());
    assert_eq!(g0.uuid, "GPU-767c5291-2c3f-0785-831a-22d41d0e178f");
    assert!(
        g0.instances
            .iter()
            .all(|i| i.uuid.as_deref().is_some_and(|u| u.starts_with("MIG-")))
    );
    let t0 = observed_gpu(&obs, "train-0", 0);
    assert!(!t0.mig.enabled && t0.instances.is_empty() && t0.health == Health::Healthy);
    // NVML ids: left to right on the grid, one full-size compute instance each.
    let d = obs
        .details
        .iter()
        .find(|d| d.gpu == gpu("infer-0", 0))
        .unwrap();
    let ids: Vec<(u32, u32, u8, usize)> = d
        .instances
        .iter()
        .map(|i| (i.id, i.profile_id, i.start, i.compute_instances.len()))
        .collect();
    assert_eq!(
        ids,
        [(0, 14, 0, 1), (1, 19, 2, 1), (2, 19, 3, 1), (3, 9, 4, 1)]
    );
    // Every MIG UUID in the fleet is distinct.
    let mut uuids: Vec<&str> = obs
        .nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .flat_map(|g| &g.instances)
        .filter_map(|i| i.uuid.as_deref())
        .collect();
    let total = uuids.len();
    uuids.sort_unstable();
    uuids.dedup();
    assert_eq!((total, uuids.len()), (6 * 4 + 2 * 7, total));
}

#[test]
fn a_reconfiguration_applied_in_nvml_order_succeeds() {
    let mut f = fleet();
    let g = gpu("infer-0", 0);
    let before = f.sim.observe().unwrap();
    let three_g_uuid = observed_gpu(&before, "infer-0", 0).instances[3]
        .uuid
        .clone();
    // balanced (2g@0, 1g@2, 1g@3, 3g@4) -> 4g@0 + the 3g@4 that stays.
    for start in [0, 2, 3] {
        let gi = gi_at(&before, &g, start);
        f.sim.destroy_compute_instance(&g, gi, 0).unwrap();
        f.sim.destroy_gpu_instance(&g, gi).unwrap();
    }
    let gi = f.sim.create_gpu_instance(&g, 5, 0).unwrap();
    assert_eq!(gi, 0, "the smallest free GPU instance id");
    let ci = f.sim.create_compute_instance(&g, gi).unwrap();
    assert_eq!(ci.id, 0);
    assert!(ci.uuid.starts_with("MIG-"));

    let after = f.sim.observe().unwrap();
    assert_eq!(
        instances(&after, "infer-0", 0),
        owned(&[("4g.40gb", 0), ("3g.40gb", 4)])
    );
    let og = observed_gpu(&after, "infer-0", 0);
    assert_eq!(og.instances[0].uuid.as_deref(), Some(ci.uuid.as_str()));
    assert_eq!(
        og.instances[1].uuid, three_g_uuid,
        "the kept instance kept its UUID"
    );
    // The other GPUs did not move.
    assert_eq!(
        instances(&after, "infer-0", 1),
        instances(&before, "infer-0", 1)
    );
}

#[test]
fn enabling_mig_is_pending_until_reset() {
    let mut f = fleet();
    let g = gpu("train-0", 3);
    assert_eq!(
        code(f.sim.create_gpu_instance(&g, 0, 0)),
        NvmlReturn::NotSupported
    );
    f.sim.set_mig_mode(&g, true).unwrap();
    let obs = f.sim.observe().unwrap();
    let og = observed_gpu(&obs, "train-0", 3);
    assert!(!og.mig.enabled);
    assert_eq!(og.mig.pending, Some(true));
    assert_eq!(
        code(f.sim.create_gpu_instance(&g, 0, 0)),
        NvmlReturn::NotSupported
    );
    f.sim.reset_gpu(&g).unwrap();
    let og = observed_gpu(&f.sim.observe().unwrap(), "train-0", 3).clone();
    assert!(og.mig.enabled && og.mig.pending.is_none());
    let gi = f.sim.create_gpu_instance(&g, 0, 0).unwrap();
    f.sim.create_compute_instance(&g, gi).unwrap();
    assert_eq!(
        instances(&f.sim.observe().unwrap(), "train-0", 3),
        owned(&[("7g.80gb", 0)])
    );
}

#[test]
fn rule_violations_give_nvmls_codes() {
    let mut f = fleet();
    let g = gpu("infer-0", 1);
    let obs = f.sim.observe().unwrap();
    let gi_3g = gi_at(&obs, &g, 4);
    // Overlap, start not allowed, per-GPU maximum, full compute budget.
    assert_eq!(
        code(f.sim.create_gpu_instance(&g, 19, 5)),
        NvmlReturn::InsufficientResources
    );
    assert_eq!(
        code(f.sim.create_gpu_instance(&g, 19, 7)),
        NvmlReturn::InsufficientResources
    );
    assert_eq!(
        code(f.sim.create_gpu_instance(&g, 9, 0)),
        NvmlReturn::InsufficientResources
    );
    // A profile ID that does not exist (1 is an NVML enum value).
    assert_eq!(
        code(f.sim.create_gpu_instance(&g, 1, 0)),
        NvmlReturn::InvalidArgument
    );
    // A GPU instance with its compute instance left.
    assert_eq!(
        code(f.sim.destroy_gpu_instance(&g, gi_3g)),
        NvmlReturn::InUse
    );
    // A second full-size compute instance does not fit.
    assert_eq!(
        code(f.sim.create_compute_instance(&g, gi_3g)),
        NvmlReturn::InsufficientResources
    );
    // Unknown ids.
    assert_eq!(
        code(f.sim.destroy_gpu_instance(&g, 40)),
        NvmlReturn::NotFound
    );
    assert_eq!(
        code(f.sim.destroy_compute_instance(&g, gi_3g, 5)),
        NvmlReturn::NotFound
    );
    // The mode cannot change while instances exist.
    assert_eq!(code(f.sim.set_mig_mode(&g, false)), NvmlReturn::InUse);
    // MIG calls on a GPU without MIG mode.
    assert_eq!(
        code(f.sim.destroy_gpu_instance(&gpu("train-1", 0), 0)),
        NvmlReturn::NotSupported
    );
    // An unknown GPU is not an NVML error.
    assert_eq!(
        f.sim.reset_gpu(&gpu("infer-9", 0)),
        Err(DriverError::UnknownGpu(gpu("infer-9", 0)))
    );
    assert_eq!(
        f.sim.reset_gpu(&gpu("infer-0", 8)),
        Err(DriverError::UnknownGpu(gpu("infer-0", 8)))
    );
    // Nothing changed.
    assert_eq!(f.sim.observe().unwrap(), obs);
}

#[test]
fn a_running_process_holds_its_instance_and_its_gpu() {
    let mut f = fleet();
    let g = gpu("infer-0", 2);
    let obs = f.sim.observe().unwrap();
    let gi = gi_at(&obs, &g, 4);
    // This test process is alive for as long as the test runs.
    let pid = std::process::id();
    f.sim.process_started(pid, &g, Some(gi));
    assert!(f.sim.take_process_errors().is_empty());
    let obs = f.sim.observe().unwrap();
    let detail = obs.details.iter().find(|d| d.gpu == g).unwrap();
    assert_eq!(detail.processes.len(), 1);
    assert_eq!(detail.processes[0].pid, pid);
    assert_eq!(detail.processes[0].gpu_instance, Some(gi));

    assert_eq!(
        code(f.sim.destroy_compute_instance(&g, gi, 0)),
        NvmlReturn::InUse
    );
    // Another instance of the same GPU is free to go.
    let other = gi_at(&obs, &g, 0);
    f.sim.destroy_compute_instance(&g, other, 0).unwrap();
    f.sim.destroy_gpu_instance(&g, other).unwrap();
    for start in [2, 3] {
        let id = gi_at(&obs, &g, start);
        f.sim.destroy_compute_instance(&g, id, 0).unwrap();
        f.sim.destroy_gpu_instance(&g, id).unwrap();
    }
    f.sim.process_ended(pid);
    f.sim.destroy_compute_instance(&g, gi, 0).unwrap();
    // A process on the whole GPU blocks the reset.
    f.sim.destroy_gpu_instance(&g, gi).unwrap();
    f.sim.set_mig_mode(&g, false).unwrap();
    f.sim.process_started(pid, &g, None);
    assert_eq!(code(f.sim.reset_gpu(&g)), NvmlReturn::InUse);
    f.sim.process_ended(pid);
    f.sim.reset_gpu(&g).unwrap();
    assert!(
        !observed_gpu(&f.sim.observe().unwrap(), "infer-0", 2)
            .mig
            .enabled
    );
}

#[test]
fn process_bookkeeping_failures_are_kept() {
    let mut f = fleet();
    let pid = std::process::id();
    f.sim.process_started(pid, &gpu("infer-0", 0), Some(30));
    f.sim.process_started(pid, &gpu("nowhere", 0), None);
    f.sim.process_started(0, &gpu("infer-0", 0), None);
    let errors = f.sim.take_process_errors();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(matches!(&errors[1], DriverError::UnknownGpu(g) if g.node == "nowhere"));
    assert!(f.sim.take_process_errors().is_empty());
    let obs = f.sim.observe().unwrap();
    assert!(obs.details.iter().all(|d| d.processes.is_empty()));
}

#[test]
fn a_dead_process_is_dropped_at_observe() {
    let mut f = fleet();
    let g = gpu("infer-0", 6);
    let obs = f.sim.observe().unwrap();
    let gi = gi_at(&obs, &g, 0);
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep");
    f.sim.process_started(child.id(), &g, Some(gi));
    assert_eq!(
        code(f.sim.destroy_compute_instance(&g, gi, 0)),
        NvmlReturn::InUse
    );
    // Still running: observe keeps it.
    let obs = f.sim.observe().unwrap();
    let held = |obs: &Observation| {
        obs.details
            .iter()
            .find(|d| d.gpu == g)
            .unwrap()
            .processes
            .len()
    };
    assert_eq!(held(&obs), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    // Nobody told the driver; NVML would stop listing it, and so does the simulation.
    let obs = f.sim.observe().unwrap();
    assert_eq!(held(&obs), 0);
    f.sim.destroy_compute_instance(&g, gi, 0).unwrap();
    // And the state file forgot it too.
    let mut reopened = f.reopen();
    assert_eq!(held(&reopened.observe().unwrap()), 0);
}

#[test]
fn the_fleet_survives_a_restart() {
    let mut f = fleet();
    let g = gpu("infer-0", 7);
    let obs = f.sim.observe().unwrap();
    for start in 0..7 {
        let gi = gi_at(&obs, &g, start);
        f.sim.destroy_compute_instance(&g, gi, 0).unwrap();
        f.sim.destroy_gpu_instance(&g, gi).unwrap();
    }
    let a = f.sim.create_gpu_instance(&g, 9, 0).unwrap();
    f.sim.create_compute_instance(&g, a).unwrap();
    f.sim.create_gpu_instance(&g, 9, 4).unwrap();
    f.sim.set_mig_mode(&gpu("train-1", 7), true).unwrap();
    f.sim
        .process_started(std::process::id(), &gpu("train-1", 7), None);
    let before = f.sim.observe().unwrap();
    let Fleet { dir, sim } = f;
    drop(sim);

    // The nodes file is not read again: the state file wins.
    let mut sim = SimDriver::open(
        Path::new("/nonexistent/nodes.yaml"),
        &dir.path().join("sim-state.json"),
    )
    .unwrap();
    let after = sim.observe().unwrap();
    assert_eq!(after, before);
    assert_eq!(
        instances(&after, "infer-0", 7),
        owned(&[("3g.40gb", 0), ("3g.40gb", 4)])
    );
    let t = observed_gpu(&after, "train-1", 7);
    assert_eq!(t.mig.pending, Some(true));
    // The restarted driver still knows the process holds the GPU.
    assert_eq!(code(sim.reset_gpu(&gpu("train-1", 7))), NvmlReturn::InUse);
    // Instance ids continue where they were: the 3g@4 without a compute instance is id 1.
    assert_eq!(sim.create_compute_instance(&g, 1).unwrap().id, 0);
    // Only the state file is left in the directory: no temporary files.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["sim-state.json"]);
}

#[test]
fn a_damaged_state_file_is_refused() {
    let f = fleet();
    let text = std::fs::read_to_string(f.state()).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Move infer-0 GPU 0's 1g at slice 2 onto its 2g at slice 0.
    let gi = &mut json["nodes"][2]["gpus"][0]["device"]["gpu_instances"][1];
    assert_eq!(gi["placement"]["start"], 2);
    gi["placement"]["start"] = 1.into();
    std::fs::write(f.state(), serde_json::to_string(&json).unwrap()).unwrap();
    let err = SimDriver::open(&quickstart(), &f.state()).unwrap_err();
    assert!(matches!(err, SimError::State { .. }), "{err}");
    assert!(err.to_string().contains("overlaps"), "{err}");

    json["format"] = 99.into();
    std::fs::write(f.state(), serde_json::to_string(&json).unwrap()).unwrap();
    let err = SimDriver::open(&quickstart(), &f.state()).unwrap_err();
    assert!(err.to_string().contains("format 99"), "{err}");
}

#[test]
fn a_bad_nodes_file_is_reported_at_file_line_col() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.yaml");
    std::fs::write(
        &nodes,
        "apiVersion: tessera/v1alpha1\n\
         kind: ClusterState\n\
         metadata: {name: broken}\n\
         spec:\n\
         \x20 observedAt: \"2026-11-20T08:00:00Z\"\n\
         \x20 nodes:\n\
         \x20   - name: n0\n\
         \x20     pool: p\n\
         \x20     cpu: 8\n\
         \x20     memory: 64Gi\n\
         \x20     gpus:\n\
         \x20       - index: 0\n\
         \x20         uuid: GPU-0000\n\
         \x20         model: H100-SXM5-80GB\n\
         \x20         mig: {enabled: true}\n\
         \x20         instances:\n\
         \x20           - {profile: 3g.40gb, start: 0}\n\
         \x20           - {profile: 3g.40gb, start: 4}\n\
         \x20           - {profile: 1g.10gb, start: 6}\n",
    )
    .unwrap();
    let state = dir.path().join("state.json");
    let err = SimDriver::open(&nodes, &state).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, SimError::Nodes { .. }), "{msg}");
    assert!(msg.contains("nodes.yaml:16:"), "{msg}");
    assert!(msg.contains("invalid-mig-geometry"), "{msg}");
    assert!(
        !state.exists(),
        "nothing is written for a refused nodes file"
    );

    let missing = SimDriver::open(&dir.path().join("absent.yaml"), &state).unwrap_err();
    assert!(matches!(missing, SimError::Read { .. }), "{missing}");
}

#[test]
fn from_nodes_builds_the_same_fleet_as_open() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = tessera_reconciler::driver::sim::load_nodes(&quickstart()).unwrap();
    let mut a = SimDriver::from_nodes(&nodes, &dir.path().join("a.json")).unwrap();
    let mut b = SimDriver::open(&quickstart(), &dir.path().join("b.json")).unwrap();
    assert_eq!(a.observe().unwrap(), b.observe().unwrap());
    // The nodes as observed are the nodes as given, workloads aside.
    let observed = a.observe().unwrap().nodes;
    let strip = |mut ns: Vec<tessera_compiler::model::Node>| {
        for g in ns.iter_mut().flat_map(|n| &mut n.gpus) {
            for i in &mut g.instances {
                i.uuid = None;
            }
        }
        ns
    };
    assert_eq!(strip(observed), strip(nodes));
}

#[test]
fn a_snapshot_with_uuids_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = tessera_reconciler::driver::sim::load_nodes(&quickstart()).unwrap();
    let uuid = "MIG-0123abcd-0000-1111-2222-333344445555".to_owned();
    nodes[2].gpus[0].instances[3] = MigInstance {
        profile: "3g.40gb".into(),
        start: 4,
        uuid: Some(uuid.clone()),
    };
    let mut sim = SimDriver::from_nodes(&nodes, &dir.path().join("s.json")).unwrap();
    let obs = sim.observe().unwrap();
    assert_eq!(
        observed_gpu(&obs, "infer-0", 0).instances[3].uuid,
        Some(uuid)
    );
}

#[test]
fn an_injected_failure_fires_on_schedule_and_changes_nothing() {
    let mut f = fleet();
    let g = gpu("infer-0", 3);
    let obs = f.sim.observe().unwrap();
    let gi = gi_at(&obs, &g, 2);
    f.sim.set_faults(FaultPlan::new(vec![Fault::Fail {
        call: Call::DestroyComputeInstance,
        node: Some("infer-0".into()),
        gpu: Some(3),
        code: NvmlReturn::Unknown,
        times: 2,
        after: 1,
    }]));
    // The first matching call passes; on another GPU, calls do not count.
    let other = gpu("infer-0", 4);
    f.sim.destroy_compute_instance(&other, gi, 0).unwrap();
    f.sim
        .destroy_compute_instance(&g, gi_at(&obs, &g, 0), 0)
        .unwrap();
    let state_before = std::fs::read(f.state()).unwrap();
    let seen = f.sim.observe().unwrap();
    for _ in 0..2 {
        let err = f.sim.destroy_compute_instance(&g, gi, 0).unwrap_err();
        assert_eq!(
            err,
            DriverError::Nvml {
                gpu: g.clone(),
                call: "nvmlComputeInstanceDestroy",
                code: NvmlReturn::Unknown
            }
        );
    }
    assert_eq!(std::fs::read(f.state()).unwrap(), state_before);
    assert_eq!(f.sim.observe().unwrap(), seen);
    f.sim.destroy_compute_instance(&g, gi, 0).unwrap();
}

#[test]
fn a_lost_gpu_fails_every_call_and_stays_lost() {
    let mut f = fleet();
    let g = gpu("infer-0", 5);
    f.sim.set_faults(FaultPlan::new(vec![Fault::Lose {
        node: "infer-0".into(),
        gpu: 5,
        after: 1,
    }]));
    // Call 1 (this observation) passes; call 2 loses the GPU.
    let obs = f.sim.observe().unwrap();
    assert_eq!(observed_gpu(&obs, "infer-0", 5).health, Health::Healthy);
    let gi = gi_at(&obs, &g, 0);
    assert_eq!(
        code(f.sim.destroy_compute_instance(&g, gi, 0)),
        NvmlReturn::GpuIsLost
    );
    assert_eq!(code(f.sim.set_mig_mode(&g, false)), NvmlReturn::GpuIsLost);
    assert_eq!(code(f.sim.reset_gpu(&g)), NvmlReturn::GpuIsLost);
    assert_eq!(
        code(f.sim.create_gpu_instance(&g, 19, 0)),
        NvmlReturn::GpuIsLost
    );
    assert_eq!(
        code(f.sim.create_compute_instance(&g, gi)),
        NvmlReturn::GpuIsLost
    );
    assert_eq!(
        code(f.sim.destroy_gpu_instance(&g, gi)),
        NvmlReturn::GpuIsLost
    );
    let obs = f.sim.observe().unwrap();
    let lost = observed_gpu(&obs, "infer-0", 5);
    assert_eq!(lost.health, Health::Lost);
    assert_eq!(
        lost.instances.len(),
        4,
        "last known geometry, never dropped"
    );
    assert_eq!(
        observed_gpu(&obs, "infer-0", 4).health,
        Health::Healthy,
        "only that GPU"
    );
    // A restart does not bring it back.
    let mut sim = f.reopen();
    assert_eq!(
        observed_gpu(&sim.observe().unwrap(), "infer-0", 5).health,
        Health::Lost
    );
    // Recovery is explicit.
    sim.set_gpu_lost(&g, false).unwrap();
    sim.destroy_compute_instance(&g, gi, 0).unwrap();
}

#[test]
fn a_refused_reset_and_a_failing_observation() {
    let mut f = fleet();
    let g = gpu("train-1", 6);
    f.sim.set_mig_mode(&g, true).unwrap();
    f.sim.set_faults(FaultPlan::new(vec![
        Fault::RefuseReset {
            node: Some("train-1".into()),
            gpu: None,
            times: 1,
            after: 0,
        },
        Fault::Fail {
            call: Call::Observe,
            node: Some("infer-0".into()),
            gpu: None,
            code: NvmlReturn::Unknown,
            times: 1,
            after: 0,
        },
    ]));
    assert_eq!(code(f.sim.reset_gpu(&g)), NvmlReturn::InUse);
    assert_eq!(
        f.sim.observe().unwrap_err(),
        DriverError::Nvml {
            gpu: gpu("infer-0", 0),
            call: "nvmlDeviceGetMigMode",
            code: NvmlReturn::Unknown
        }
    );
    let obs = f.sim.observe().unwrap();
    assert_eq!(observed_gpu(&obs, "train-1", 6).mig.pending, Some(true));
    f.sim.reset_gpu(&g).unwrap();
    assert!(
        observed_gpu(&f.sim.observe().unwrap(), "train-1", 6)
            .mig
            .enabled
    );
}

#[test]
fn a_slow_call_sleeps_then_does_its_work() {
    let mut f = fleet();
    let g = gpu("train-0", 0);
    f.sim.set_faults(FaultPlan::new(vec![Fault::Slow {
        call: Call::SetMigMode,
        node: None,
        gpu: Some(0),
        ms: 60,
        times: Some(1),
    }]));
    let t = Instant::now();
    f.sim.set_mig_mode(&g, true).unwrap();
    // A lower bound only: sleeping is what the fault does, and it never sleeps less.
    assert!(t.elapsed() >= Duration::from_millis(60));
    let obs = f.sim.observe().unwrap();
    assert_eq!(observed_gpu(&obs, "train-0", 0).mig.pending, Some(true));
}

#[test]
fn a_fault_plan_file_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("faults.yaml");
    std::fs::write(
        &path,
        "# the second instance creation on infer-0 GPU 0 fails\n\
         faults:\n\
         \x20 - fail: {call: create_gpu_instance, node: infer-0, gpu: 0, code: insufficient_resources, after: 1}\n\
         \x20 - lose: {node: train-0, gpu: 7}\n",
    )
    .unwrap();
    let plan = FaultPlan::load(&path).unwrap();
    let mut f = fleet();
    f.sim.set_faults(plan.clone());
    assert_eq!(f.sim.faults(), &plan);
    let g = gpu("infer-0", 0);
    let obs = f.sim.observe().unwrap();
    assert_eq!(observed_gpu(&obs, "train-0", 7).health, Health::Lost);
    // Free slice 2 and 3: destroy the two 1g instances.
    for start in [2, 3] {
        let gi = gi_at(&obs, &g, start);
        f.sim.destroy_compute_instance(&g, gi, 0).unwrap();
        f.sim.destroy_gpu_instance(&g, gi).unwrap();
    }
    f.sim.create_gpu_instance(&g, 19, 2).unwrap();
    assert_eq!(
        code(f.sim.create_gpu_instance(&g, 19, 3)),
        NvmlReturn::InsufficientResources
    );
    f.sim.create_gpu_instance(&g, 19, 3).unwrap();

    std::fs::write(&path, "faults:\n  - fail: {call: observe, code: nope}\n").unwrap();
    let err = FaultPlan::load(&path).unwrap_err().to_string();
    assert!(err.contains("faults.yaml") && err.contains("nope"), "{err}");
}

/// The SM activity set in the state file is reported: the GPU's, in MIG mode too, and a MIG
/// instance's by its GPU instance id; an id no instance has is not reported, and a GPU with
/// none set reports none.
#[test]
fn sm_activity_from_the_state_file_is_reported() {
    let mut f = fleet();
    let obs = f.sim.observe().unwrap();
    let mig = obs
        .details
        .iter()
        .find(|d| !d.instances.is_empty())
        .expect("a GPU with MIG instances")
        .clone();
    let id = mig.instances[0].id;
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.state()).unwrap()).unwrap();
    for node in state["nodes"].as_array_mut().unwrap() {
        if node["node"]["name"] != mig.gpu.node.as_str() {
            continue;
        }
        for g in node["gpus"].as_array_mut().unwrap() {
            if g["index"] == mig.gpu.index {
                g["sm_activity"] =
                    serde_json::json!({"smUtilPercent": 40.0, "smOccupancyPercent": 20.0});
                g["instance_sm_activity"] = serde_json::json!({
                    id.to_string(): {"smUtilPercent": 75.5, "smOccupancyPercent": 30.0},
                    "99": {"smUtilPercent": 1.0, "smOccupancyPercent": 1.0},
                });
            }
        }
    }
    std::fs::write(f.state(), serde_json::to_string(&state).unwrap()).unwrap();
    f.sim = f.reopen();
    let obs = f.sim.observe().unwrap();
    let d = obs.details.iter().find(|d| d.gpu == mig.gpu).unwrap();
    let activity = |util: f64, occupancy: f64| {
        Some(tessera_reconciler::driver::SmActivity {
            sm_util_percent: util,
            sm_occupancy_percent: occupancy,
        })
    };
    assert_eq!(d.sm_activity, activity(40.0, 20.0));
    let reported: Vec<_> = d.instances.iter().map(|i| (i.id, i.sm_activity)).collect();
    let want: Vec<_> = d
        .instances
        .iter()
        .map(|i| {
            (
                i.id,
                if i.id == id {
                    activity(75.5, 30.0)
                } else {
                    None
                },
            )
        })
        .collect();
    assert_eq!(reported, want);
    assert!(
        obs.details
            .iter()
            .filter(|o| o.gpu != mig.gpu)
            .all(|o| o.sm_activity.is_none())
    );
}

/// What the generation vouches for: the nodes and the GPU instances of an observation.
fn geometry(obs: &Observation) -> (Vec<tessera_compiler::model::Node>, Vec<String>) {
    let instances = obs
        .details
        .iter()
        .map(|d| format!("{}: {:?}", d.gpu, d.instances))
        .collect();
    (obs.nodes.clone(), instances)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// The generation misses no change: after any sequence of calls (those NVML refuses
    /// included), an observation whose geometry or health differs from the last one comes
    /// with another generation. Processes come and go without changing it.
    #[test]
    fn the_generation_changes_with_every_change_to_geometry_or_health(
        calls in proptest::collection::vec((0u8..8, 0usize..64, 0u8..8), 1..40)
    ) {
        let mut f = fleet();
        let gpus = f.sim.gpus();
        let pid = std::process::id();
        let mut last = (f.sim.generation(), geometry(&f.sim.observe().unwrap()));
        for (call, at, arg) in calls {
            let g = &gpus[at % gpus.len()];
            let gi = u32::from(arg);
            // Refusals are part of the sequence: what NVML refuses changes nothing.
            let _ = match call {
                0 => f.sim.set_mig_mode(g, arg % 2 == 0),
                1 => f.sim.reset_gpu(g),
                2 => f.sim.create_gpu_instance(g, gi % 20, arg).map(drop),
                3 => f.sim.create_compute_instance(g, gi).map(drop),
                4 => f.sim.destroy_compute_instance(g, gi, 0),
                5 => f.sim.destroy_gpu_instance(g, gi),
                6 => f.sim.set_gpu_lost(g, arg % 2 == 0),
                _ => {
                    if arg % 2 == 0 {
                        f.sim.process_started(pid, g, Some(gi));
                    } else {
                        f.sim.process_ended(pid);
                    }
                    Ok(())
                }
            };
            let generation = f.sim.generation();
            proptest::prop_assert!(generation.is_some(), "no fault plan: a generation");
            let now = (generation, geometry(&f.sim.observe().unwrap()));
            if now.0 == last.0 {
                proptest::prop_assert_eq!(&now.1, &last.1, "call {} on {}", call, g);
            }
            if call == 7 {
                proptest::prop_assert_eq!(now.0, last.0, "a process is not geometry");
            }
            last = now;
        }
    }
}

#[test]
fn a_fault_plan_leaves_the_sim_without_a_generation() {
    let mut f = fleet();
    assert!(f.sim.generation().is_some());
    f.sim.set_faults(FaultPlan::new(vec![Fault::Lose {
        node: "train-0".into(),
        gpu: 0,
        after: 1,
    }]));
    assert_eq!(f.sim.generation(), None, "its faults count observations");
    f.sim.set_faults(FaultPlan::default());
    assert!(f.sim.generation().is_some());
}
