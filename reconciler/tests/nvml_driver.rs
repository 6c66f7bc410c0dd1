//! The `nvml` driver through its real FFI, loaded against the stand-in `libnvidia-ml.so`
//! (`reconciler/fake-nvml`), and side by side with the `sim` driver on the same states.
//!
//! The stand-in's state file is named by an environment variable and the library is loaded
//! once per process, so the tests here take a lock and run one at a time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};

use tessera_compiler::model::{Gpu, Health, Node};
use tessera_fake_nvml::state::{
    FakeFault, FakeGpm, FakeGpu, FakeSmActivity, FakeState, FakeUtilization, STATE_ENV,
};
use tessera_mig::device::{InitialInstance, MigDevice, MigMode, ProcessScope};
use tessera_mig::{Placement, builtin_model};
use tessera_reconciler::driver::faults::{Call, Fault, FaultPlan};
use tessera_reconciler::driver::nvml::NvmlDriver;
use tessera_reconciler::driver::sim::{SimDriver, load_nodes};
use tessera_reconciler::driver::{
    DriverError, GpuRef, GpuUtilization, NodeDriver, NvmlReturn, Observation, SmActivity,
};

const H100: u32 = 0;
const H100_OFF: u32 = 1;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/nvml")
        .join(name)
}

/// The built stand-in: beside this test binary when cargo built it as a dependency, else
/// built now into a target directory of its own (so as not to wait on this build's lock).
fn fake_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let file = format!(
            "{}tessera_fake_nvml{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        );
        let exe = std::env::current_exe().expect("test binary path");
        let deps = exe.parent().expect("deps directory");
        for dir in [Some(deps), deps.parent()].into_iter().flatten() {
            if dir.join(&file).is_file() {
                return dir.join(&file);
            }
        }
        let target = deps
            .parent()
            .and_then(Path::parent)
            .expect("target directory")
            .join("fake-nvml");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "tessera-fake-nvml", "--target-dir"])
            .arg(&target)
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the fake libnvidia-ml failed");
        let built = target.join("debug").join(&file);
        assert!(built.is_file(), "{} was not built", built.display());
        built
    })
    .clone()
}

/// NVML's name and total memory for the catalog models these tests use.
fn nvml_identity(model: &str) -> (&'static str, u64) {
    const MIB: u64 = 1024 * 1024;
    match model {
        "H100-SXM5-80GB" => ("NVIDIA H100 80GB HBM3", 81_559 * MIB),
        "A100-SXM4-40GB" => ("NVIDIA A100-SXM4-40GB", 40_536 * MIB),
        other => panic!("no NVML identity for {other} in this test"),
    }
}

/// The stand-in's GPUs for a node's GPUs, built the way the `sim` driver builds its devices.
fn fake_gpus(node: &Node) -> Vec<FakeGpu> {
    let mut gpus: Vec<&Gpu> = node.gpus.iter().collect();
    gpus.sort_by_key(|g| g.index);
    gpus.iter()
        .enumerate()
        .map(|(i, g)| {
            assert_eq!(g.index as usize, i, "NVML indices are dense");
            let model = builtin_model(&g.model).expect("catalog model");
            let instances: Vec<InitialInstance> = g
                .instances
                .iter()
                .map(|inst| InitialInstance {
                    placement: Placement::new(
                        model.resolve_profile(&inst.profile).expect("profile"),
                        inst.start,
                    ),
                    uuid: inst.uuid.clone(),
                })
                .collect();
            let mig = MigMode {
                current: g.mig.enabled,
                pending: g.mig.pending.unwrap_or(g.mig.enabled),
            };
            let mut device =
                MigDevice::with_geometry(g.uuid.clone(), model, mig, &instances).expect("device");
            device.set_lost(g.health == Health::Lost);
            let (name, memory_total) = nvml_identity(&g.model);
            FakeGpu {
                name: name.into(),
                memory_total,
                device,
                foreign: Vec::new(),
                utilization: None,
                gpm: None,
            }
        })
        .collect()
}

/// One test's machine: the stand-in's state file (named in the environment while the guard
/// lives), and the node both drivers describe.
struct Machine {
    _guard: MutexGuard<'static, ()>,
    dir: tempfile::TempDir,
    node: Node,
}

impl Machine {
    fn new(mutate: impl FnOnce(&mut FakeState)) -> Machine {
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = load_nodes(&data("fleet.yaml")).unwrap();
        let node = nodes.remove(0);
        let mut state = FakeState::new(fake_gpus(&node));
        mutate(&mut state);
        let path = dir.path().join("fake-nvml.json");
        state.save(&path).unwrap();
        // SAFETY: tests in this binary take ONE_AT_A_TIME before touching the environment,
        // and nothing else here reads it concurrently.
        unsafe { std::env::set_var(STATE_ENV, &path) };
        Machine {
            _guard: guard,
            dir,
            node,
        }
    }

    fn state_path(&self) -> PathBuf {
        self.dir.path().join("fake-nvml.json")
    }

    fn edit(&self, f: impl FnOnce(&mut FakeState)) {
        let mut s = FakeState::load(&self.state_path()).unwrap();
        f(&mut s);
        s.save(&self.state_path()).unwrap();
    }

    fn state(&self) -> FakeState {
        FakeState::load(&self.state_path()).unwrap()
    }

    fn descriptor(&self) -> Node {
        let mut n = self.node.clone();
        n.gpus.clear();
        n
    }

    fn nvml(&self) -> NvmlDriver {
        NvmlDriver::open(Some(&fake_library()), self.descriptor()).unwrap()
    }

    fn sim(&self) -> SimDriver {
        SimDriver::from_nodes(
            std::slice::from_ref(&self.node),
            &self.dir.path().join("sim.json"),
        )
        .unwrap()
    }
}

fn gpu(index: u32) -> GpuRef {
    GpuRef {
        node: "gpu-0".into(),
        index,
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    SetMig(u32, bool),
    Reset(u32),
    CreateGi(u32, u32, u8),
    DestroyGi(u32, u32),
    CreateCi(u32, u32),
    DestroyCi(u32, u32, u32),
}

/// What a step returned, comparable across drivers: the value, or the NVML code.
#[derive(Debug, PartialEq)]
enum Outcome {
    Done,
    Id(u32),
    Ci(u32, String),
    Failed(Option<NvmlReturn>),
}

fn apply(d: &mut dyn NodeDriver, step: Step) -> Outcome {
    let r: Result<Outcome, DriverError> = match step {
        Step::SetMig(g, on) => d.set_mig_mode(&gpu(g), on).map(|()| Outcome::Done),
        Step::Reset(g) => d.reset_gpu(&gpu(g)).map(|()| Outcome::Done),
        Step::CreateGi(g, p, s) => d.create_gpu_instance(&gpu(g), p, s).map(Outcome::Id),
        Step::DestroyGi(g, i) => d.destroy_gpu_instance(&gpu(g), i).map(|()| Outcome::Done),
        Step::CreateCi(g, i) => d
            .create_compute_instance(&gpu(g), i)
            .map(|c| Outcome::Ci(c.id, c.uuid)),
        Step::DestroyCi(g, i, c) => d
            .destroy_compute_instance(&gpu(g), i, c)
            .map(|()| Outcome::Done),
    };
    r.unwrap_or_else(|e| Outcome::Failed(e.code()))
}

/// Runs `steps` on both drivers: each step must return the same thing, a failed step must
/// leave the observation as it was, and after each step (but a mode change, which NVML may
/// activate at once; see the driver's documentation) both must observe the same fleet.
fn side_by_side(nvml: &mut NvmlDriver, sim: &mut SimDriver, steps: &[(Step, Outcome)]) {
    let mut before = nvml.observe().unwrap();
    assert_eq!(before, sim.observe().unwrap(), "initial observation");
    for (step, want) in steps {
        let got_nvml = apply(nvml, *step);
        let got_sim = apply(sim, *step);
        assert_eq!(&got_sim, want, "sim: {step:?}");
        assert_eq!(&got_nvml, want, "nvml: {step:?}");
        let after = nvml.observe().unwrap();
        if matches!(want, Outcome::Failed(_)) {
            assert_eq!(after, before, "{step:?} failed but changed the GPU");
        }
        if !matches!(step, Step::SetMig(..)) {
            assert_eq!(after, sim.observe().unwrap(), "after {step:?}");
        }
        before = after;
    }
}

fn layout(o: &Observation, index: u32) -> Vec<(String, u8)> {
    o.nodes[0].gpus[index as usize]
        .instances
        .iter()
        .map(|i| (i.profile.clone(), i.start))
        .collect()
}

const FAILED_IN_USE: Outcome = Outcome::Failed(Some(NvmlReturn::InUse));
const FAILED_NO_ROOM: Outcome = Outcome::Failed(Some(NvmlReturn::InsufficientResources));

#[test]
fn reads_the_gpus_and_their_geometry_as_the_sim_driver_does() {
    let m = Machine::new(|_| {});
    let mut nvml = m.nvml();
    let o = nvml.observe().unwrap();
    assert_eq!(o, m.sim().observe().unwrap());
    let node = &o.nodes[0];
    assert_eq!((node.name.as_str(), node.pool.as_str()), ("gpu-0", "infer"));
    let models: Vec<&str> = node.gpus.iter().map(|g| g.model.as_str()).collect();
    assert_eq!(
        models,
        ["H100-SXM5-80GB", "H100-SXM5-80GB", "A100-SXM4-40GB"]
    );
    assert_eq!(
        layout(&o, H100),
        [("4g.40gb".to_string(), 0), ("3g.40gb".to_string(), 4)]
    );
    assert!(
        node.gpus[H100 as usize]
            .instances
            .iter()
            .all(|i| i.uuid.as_deref().is_some_and(|u| u.starts_with("MIG-")))
    );
    assert!(!node.gpus[H100_OFF as usize].mig.enabled);
    assert_eq!(o.details[H100 as usize].instances.len(), 2);
}

#[test]
fn a_reconfiguration_with_explicit_placements_in_order_matches_the_sim_driver() {
    let m = Machine::new(|_| {});
    let (mut nvml, mut sim) = (m.nvml(), m.sim());
    // 4g@0 (GI 0) + 3g@4 (GI 1)  ->  3g@0 + 2g@4 + 1g@6.
    let steps = [
        // A GPU instance with a compute instance cannot go first; nor can the mode change.
        (Step::DestroyGi(H100, 0), FAILED_IN_USE),
        (Step::SetMig(H100, false), FAILED_IN_USE),
        (Step::DestroyCi(H100, 0, 0), Outcome::Done),
        (Step::DestroyGi(H100, 0), Outcome::Done),
        (Step::CreateGi(H100, 9, 0), Outcome::Id(0)),
        // The 2g's slot is still the old 3g's: refused before anything is asked of the GPU.
        (Step::CreateGi(H100, 14, 4), FAILED_NO_ROOM),
        // Not a start the 3g profile allows.
        (Step::CreateGi(H100, 9, 2), FAILED_NO_ROOM),
        (
            Step::CreateGi(H100, 1, 0),
            Outcome::Failed(Some(NvmlReturn::InvalidArgument)),
        ),
        (Step::DestroyCi(H100, 1, 0), Outcome::Done),
        (Step::DestroyGi(H100, 1), Outcome::Done),
        (Step::CreateGi(H100, 14, 4), Outcome::Id(1)),
        (Step::CreateGi(H100, 19, 6), Outcome::Id(2)),
    ];
    side_by_side(&mut nvml, &mut sim, &steps);
    // Compute instances: the UUIDs are derived from the GPU and the instance, so both drivers
    // must hand out the same ones.
    for gi in 0..3 {
        let a = apply(&mut nvml, Step::CreateCi(H100, gi));
        let b = apply(&mut sim, Step::CreateCi(H100, gi));
        assert!(
            matches!(&a, Outcome::Ci(0, u) if u.starts_with("MIG-")),
            "{a:?}"
        );
        assert_eq!(a, b);
    }
    let o = nvml.observe().unwrap();
    assert_eq!(o, sim.observe().unwrap());
    assert_eq!(
        layout(&o, H100),
        [
            ("3g.40gb".to_string(), 0),
            ("2g.20gb".to_string(), 4),
            ("1g.10gb".to_string(), 6)
        ]
    );
    // The stand-in's file holds what was made: the same geometry the driver reports.
    let placements = m.state().gpus[H100 as usize].device.placements();
    assert_eq!(
        placements,
        [
            Placement::new(9, 0),
            Placement::new(14, 4),
            Placement::new(19, 6)
        ]
    );
}

#[test]
fn an_instance_a_process_holds_cannot_be_destroyed() {
    let m = Machine::new(|_| {});
    let (mut nvml, mut sim) = (m.nvml(), m.sim());
    // A live pid: the sim driver drops processes that no longer exist, as NVML does.
    let pid = std::process::id();
    sim.attach_process(pid, &gpu(H100), Some(1)).unwrap();
    m.edit(|s| {
        s.gpus[H100 as usize]
            .device
            .attach_process(pid, ProcessScope::GpuInstance(1))
            .unwrap()
    });
    let o = nvml.observe().unwrap();
    assert_eq!(o, sim.observe().unwrap());
    assert_eq!(o.details[H100 as usize].processes[0].pid, pid);
    assert_eq!(o.details[H100 as usize].processes[0].gpu_instance, Some(1));
    side_by_side(
        &mut nvml,
        &mut sim,
        &[
            (Step::DestroyCi(H100, 1, 0), FAILED_IN_USE),
            (Step::DestroyGi(H100, 1), FAILED_IN_USE),
            // The other instance is free.
            (Step::DestroyCi(H100, 0, 0), Outcome::Done),
            (Step::DestroyGi(H100, 0), Outcome::Done),
        ],
    );
    sim.process_ended(pid);
    m.edit(|s| {
        s.gpus[H100 as usize].device.detach_process(pid);
    });
    side_by_side(
        &mut nvml,
        &mut sim,
        &[
            (Step::DestroyCi(H100, 1, 0), Outcome::Done),
            (Step::DestroyGi(H100, 1), Outcome::Done),
        ],
    );
}

#[test]
fn a_call_that_fails_once_changes_nothing_and_the_retry_succeeds() {
    let m = Machine::new(|s| {
        s.faults.push(FakeFault::Fail {
            function: "nvmlDeviceCreateGpuInstanceWithPlacement".into(),
            gpu: Some(H100),
            code: NvmlReturn::Unknown,
            times: 1,
            after: 0,
        });
        s.faults.push(FakeFault::Fail {
            function: "nvmlComputeInstanceDestroy".into(),
            gpu: Some(H100),
            code: NvmlReturn::InUse,
            times: 1,
            after: 1,
        });
    });
    let (mut nvml, mut sim) = (m.nvml(), m.sim());
    sim.set_faults(FaultPlan {
        faults: vec![
            Fault::Fail {
                call: Call::CreateGpuInstance,
                node: None,
                gpu: Some(H100),
                code: NvmlReturn::Unknown,
                times: 1,
                after: 0,
            },
            Fault::Fail {
                call: Call::DestroyComputeInstance,
                node: None,
                gpu: Some(H100),
                code: NvmlReturn::InUse,
                times: 1,
                after: 1,
            },
        ],
    });
    side_by_side(
        &mut nvml,
        &mut sim,
        &[
            (Step::DestroyCi(H100, 1, 0), Outcome::Done),
            (Step::DestroyCi(H100, 0, 0), FAILED_IN_USE),
            (Step::DestroyCi(H100, 0, 0), Outcome::Done),
            (Step::DestroyGi(H100, 1), Outcome::Done),
            (
                Step::CreateGi(H100, 19, 6),
                Outcome::Failed(Some(NvmlReturn::Unknown)),
            ),
        ],
    );
    // Faults fire once: the stand-in has used them up and says so in its file.
    assert!(m.state().faults.is_empty());
    side_by_side(
        &mut nvml,
        &mut sim,
        &[(Step::CreateGi(H100, 19, 6), Outcome::Id(1))],
    );
}

#[test]
fn a_lost_gpu_fails_every_call_and_is_reported_lost_with_its_last_geometry() {
    let m = Machine::new(|_| {});
    let (mut nvml, mut sim) = (m.nvml(), m.sim());
    let before = nvml.observe().unwrap();
    m.edit(|s| {
        s.faults.push(FakeFault::Lose {
            gpu: H100,
            after: 0,
        })
    });
    sim.set_faults(FaultPlan {
        faults: vec![Fault::Lose {
            node: "gpu-0".into(),
            gpu: H100,
            after: 0,
        }],
    });
    let lost = Outcome::Failed(Some(NvmlReturn::GpuIsLost));
    side_by_side(
        &mut nvml,
        &mut sim,
        &[
            (Step::DestroyCi(H100, 0, 0), lost),
            (
                Step::CreateGi(H100, 19, 6),
                Outcome::Failed(Some(NvmlReturn::GpuIsLost)),
            ),
            (
                Step::SetMig(H100, false),
                Outcome::Failed(Some(NvmlReturn::GpuIsLost)),
            ),
            // The other GPUs are untouched.
            (Step::CreateGi(2, 0, 0), Outcome::Id(0)),
        ],
    );
    let o = nvml.observe().unwrap();
    let g = &o.nodes[0].gpus[H100 as usize];
    assert_eq!(g.health, Health::Lost);
    assert_eq!(g.instances, before.nodes[0].gpus[H100 as usize].instances);
    assert!(m.state().gpus[H100 as usize].device.is_lost());
}

#[test]
fn enabling_mig_waits_for_a_reset_that_a_hidden_client_refuses() {
    // NVML activates the mode inside nvmlDeviceSetMigMode; that attempt is refused too, so the
    // stand-in refuses twice where the sim driver, whose reset is a call of its own, once.
    let m = Machine::new(|s| {
        s.faults.push(FakeFault::RefuseReset {
            gpu: Some(H100_OFF),
            times: 2,
            after: 0,
        })
    });
    let (mut nvml, mut sim) = (m.nvml(), m.sim());
    sim.set_faults(FaultPlan {
        faults: vec![Fault::RefuseReset {
            node: None,
            gpu: Some(H100_OFF),
            times: 1,
            after: 0,
        }],
    });
    side_by_side(
        &mut nvml,
        &mut sim,
        &[
            (Step::SetMig(H100_OFF, true), Outcome::Done),
            // Not yet enabled: nothing can be created.
            (
                Step::CreateGi(H100_OFF, 0, 0),
                Outcome::Failed(Some(NvmlReturn::NotSupported)),
            ),
            (Step::Reset(H100_OFF), FAILED_IN_USE),
        ],
    );
    let o = nvml.observe().unwrap();
    let g = &o.nodes[0].gpus[H100_OFF as usize];
    assert_eq!((g.mig.enabled, g.mig.pending), (false, Some(true)));
    side_by_side(
        &mut nvml,
        &mut sim,
        &[
            (Step::Reset(H100_OFF), Outcome::Done),
            (Step::CreateGi(H100_OFF, 0, 0), Outcome::Id(0)),
        ],
    );
}

#[test]
fn an_unknown_gpu_model_is_a_clear_error() {
    let m = Machine::new(|s| s.gpus[2].name = "NVIDIA GeForce RTX 4090".into());
    let err = NvmlDriver::open(Some(&fake_library()), m.descriptor()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("gpu-0/gpu2"), "{text}");
    assert!(text.contains("NVIDIA GeForce RTX 4090"), "{text}");
    assert!(text.contains("matches no GPU model"), "{text}");
}

#[test]
fn a_descriptor_listing_gpus_is_refused() {
    let m = Machine::new(|_| {});
    let err = NvmlDriver::open(Some(&fake_library()), m.node.clone()).unwrap_err();
    assert!(err.to_string().contains("gpus: []"), "{err}");
}

#[test]
fn without_the_library_open_fails_naming_it() {
    let m = Machine::new(|_| {});
    let missing = m.dir.path().join("no-such/libnvidia-ml.so.1");
    let err = NvmlDriver::open(Some(&missing), m.descriptor()).unwrap_err();
    assert!(
        matches!(&err, DriverError::Library { path, .. } if *path == missing.display().to_string()),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("cannot load the NVML library"),
        "{err}"
    );
    // A library that loads but whose nvmlInit fails (here: the stand-in without a state file)
    // is the same kind of error, with NVML's reason.
    // SAFETY: serialised by the Machine's lock.
    unsafe { std::env::set_var(STATE_ENV, m.dir.path().join("none.json")) };
    let err = NvmlDriver::open(Some(&fake_library()), m.descriptor()).unwrap_err();
    assert!(
        matches!(&err, DriverError::Library { reason, .. } if reason.contains("nvmlInit_v2")),
        "{err:?}"
    );
}

#[test]
fn the_stand_in_answers_nvml_wrappers_own_api_per_device_and_per_instance() {
    // The driver uses raw symbols; nvml-wrapper's safe wrappers are a second, independent
    // reader of the same C answers (sizes, out-pointers, INSUFFICIENT_SIZE handshakes).
    let m = Machine::new(|_| {});
    let pid = std::process::id();
    m.edit(|s| {
        let d = &mut s.gpus[H100 as usize].device;
        d.attach_process(pid, ProcessScope::GpuInstance(1)).unwrap();
        d.attach_process(pid + 1, ProcessScope::Gpu).unwrap();
    });
    let lib = fake_library();
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap();
    assert_eq!(nvml.device_count().unwrap(), 3);
    let device = nvml.device_by_index(H100).unwrap();
    assert_eq!(device.name().unwrap(), "NVIDIA H100 80GB HBM3");
    assert_eq!(
        device.uuid().unwrap(),
        "GPU-0c000000-0000-0000-0000-000000000000"
    );
    let mode = device.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    let all: Vec<(u32, Option<u32>)> = device
        .running_compute_processes()
        .unwrap()
        .iter()
        .map(|p| (p.pid, p.gpu_instance_id))
        .collect();
    assert_eq!(all, [(pid, Some(1)), (pid + 1, None)]);

    // MIG devices in NVML's order (GPU instance 0, then 1); only the one on GPU instance 1
    // runs the process.
    let expected = m.sim().observe().unwrap().details[H100 as usize].clone();
    for (index, gi) in expected.instances.iter().enumerate() {
        let mig = device.mig_device_by_index(index as u32).unwrap();
        assert!(mig.mig_is_mig_device_handle().unwrap());
        assert_eq!(mig.uuid().unwrap(), gi.compute_instances[0].uuid);
        let pids: Vec<u32> = mig
            .running_compute_processes()
            .unwrap()
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(pids, if gi.id == 1 { vec![pid] } else { vec![] });
    }
    assert!(device.mig_device_by_index(2).is_err());
    // A symbol the stand-in does not export is a per-call error, not a load failure.
    assert!(device.memory_info().is_err());
}

// ----- What a real driver answers (issue 24). Each test sets the stand-in's knobs to one
// driver's behaviour; ARCHITECTURE.md records the evidence for each. -----

const A100: u32 = 2;

/// Processes on the H100, alternating between its two GPU instances and the whole GPU, with
/// pids no live process has (the stand-in lists what its file says).
fn many_processes(s: &mut FakeState, count: u32) -> Vec<(u32, Option<u32>)> {
    let d = &mut s.gpus[H100 as usize].device;
    let mut want = Vec::new();
    for i in 0..count {
        let pid = 40_000 + i;
        let (scope, gi) = match i % 3 {
            0 => (ProcessScope::GpuInstance(0), Some(0)),
            1 => (ProcessScope::GpuInstance(1), Some(1)),
            _ => (ProcessScope::Gpu, None),
        };
        d.attach_process(pid, scope).unwrap();
        want.push((pid, gi));
    }
    want
}

fn processes(o: &Observation, index: u32) -> Vec<(u32, Option<u32>)> {
    o.details[index as usize]
        .processes
        .iter()
        .map(|p| (p.pid, p.gpu_instance))
        .collect()
}

#[test]
fn an_r535_driver_writing_32_byte_process_entries_is_read_at_its_stride() {
    // 20 processes: more than a buffer of 24-byte entries could take at that stride.
    let mut want = Vec::new();
    let m = Machine::new(|s| {
        s.driver.version = "535.54.03".into();
        s.driver.process_info_bytes = 32;
        want = many_processes(s, 20);
    });
    let mut nvml = m.nvml();
    assert_eq!(nvml.driver_version(), "535.54.03");
    assert_eq!(processes(&nvml.observe().unwrap(), H100), want);

    // The same entries read at nvml.h's 24 bytes (a driver claiming a version that writes 24)
    // come out wrong: the stride is what the version decides.
    m.edit(|s| s.driver.version = "550.127.08".into());
    let got = processes(&m.nvml().observe().unwrap(), H100);
    assert_ne!(got, want);

    // And a driver that writes 24-byte entries is read at 24.
    m.edit(|s| s.driver.process_info_bytes = 24);
    assert_eq!(processes(&m.nvml().observe().unwrap(), H100), want);
}

#[test]
fn an_empty_mig_slot_answered_with_invalid_argument_is_skipped() {
    // The H100 has two MIG devices (4g at 0, 3g at 4) of seven slots: five are empty.
    let m = Machine::new(|s| s.driver.empty_mig_slot = NvmlReturn::InvalidArgument);
    let mut nvml = m.nvml();
    assert_eq!(nvml.observe().unwrap(), m.sim().observe().unwrap());
    // Any other answer for an empty slot is an error, naming the call and its code.
    m.edit(|s| s.driver.empty_mig_slot = NvmlReturn::Other(77));
    let err = nvml.observe().unwrap_err().to_string();
    assert!(err.contains("nvmlDeviceGetMigDeviceHandleByIndex"), "{err}");
    assert!(err.contains("77"), "{err}");
}

/// Calls `nvmlDeviceGetGpuInstancePossiblePlacements_v2` on the stand-in directly.
fn possible_placements_raw(gpu: u32, profile_id: u32) -> Result<Vec<(u32, u32)>, NvmlReturn> {
    use nvml_wrapper_sys::bindings::nvmlGpuInstancePlacement_t;
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(fake_library().as_os_str())
        .init()
        .unwrap();
    let device = nvml.device_by_index(gpu).unwrap();
    let f = nvml
        .lib()
        .nvmlDeviceGetGpuInstancePossiblePlacements_v2
        .as_ref()
        .unwrap();
    let mut out = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 8];
    let mut n: u32 = 8;
    // SAFETY: a handle from this library; `out` has room for `n` placements.
    let ret = unsafe { f(device.handle(), profile_id, out.as_mut_ptr(), &mut n) };
    match NvmlReturn::from_raw(ret) {
        NvmlReturn::Success => Ok(out[..n as usize]
            .iter()
            .map(|p| (p.start, p.size))
            .collect()),
        code => Err(code),
    }
}

#[test]
fn possible_placements_are_every_placement_and_the_driver_computes_occupancy() {
    let m = Machine::new(|s| {
        // Sent, this create would fail with UNKNOWN; refused beforehand, the fault stays.
        s.faults.push(FakeFault::Fail {
            function: "nvmlDeviceCreateGpuInstanceWithPlacement".into(),
            gpu: Some(H100),
            code: NvmlReturn::Unknown,
            times: 1,
            after: 0,
        })
    });
    // As nvml.h says and the H100 answered: all seven 1g placements whatever is occupied (the
    // H100's 4g and 3g cover every slice), MIG enabled or not.
    let all_1g: Vec<(u32, u32)> = (0..7).map(|s| (s, 1)).collect();
    assert_eq!(possible_placements_raw(H100, 19), Ok(all_1g.clone()));
    assert_eq!(possible_placements_raw(H100_OFF, 19), Ok(all_1g));
    assert_eq!(
        possible_placements_raw(H100_OFF, 9),
        Ok(vec![(0, 4), (4, 4)])
    );
    assert_eq!(
        possible_placements_raw(H100, 1),
        Err(NvmlReturn::InvalidArgument)
    );

    let (mut nvml, mut sim) = (m.nvml(), m.sim());
    side_by_side(
        &mut nvml,
        &mut sim,
        &[
            // Listed by NVML, but the 3g at 4 holds slices 4 to 7.
            (Step::CreateGi(H100, 14, 4), FAILED_NO_ROOM),
            (Step::CreateGi(H100, 19, 6), FAILED_NO_ROOM),
        ],
    );
    assert_eq!(m.state().faults.len(), 1, "a refused create was sent");
}

#[test]
fn an_instance_of_a_profile_the_catalog_does_not_know_is_reported_and_occupies_its_slices() {
    use tessera_fake_nvml::state::ForeignInstance;
    let m = Machine::new(|s| {
        s.gpus[A100 as usize].foreign.push(ForeignInstance {
            id: 9,
            profile_id: 30,
            // NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX: no catalog profile has it.
            nvml_enum: 11,
            start: 4,
            size: 2,
            compute_slices: 2,
            uuid: "MIG-f0000000-0000-0000-0000-000000000009".into(),
        });
        s.faults.push(FakeFault::Fail {
            function: "nvmlDeviceCreateGpuInstanceWithPlacement".into(),
            gpu: Some(A100),
            code: NvmlReturn::Unknown,
            times: 1,
            after: 0,
        });
    });
    let mut nvml = m.nvml();
    let o = nvml.observe().unwrap();
    let g = &o.nodes[0].gpus[A100 as usize];
    assert_eq!(g.health, Health::Degraded);
    assert_eq!(layout(&o, A100), [("30".to_string(), 4)]);
    assert_eq!(
        g.instances[0].uuid.as_deref(),
        Some("MIG-f0000000-0000-0000-0000-000000000009")
    );
    let detail = &o.details[A100 as usize].instances;
    assert_eq!(
        (
            detail[0].id,
            detail[0].profile_id,
            detail[0].compute_instances.len()
        ),
        (9, 30, 1)
    );
    // Its slices are taken: a 3g at 4 is refused before it is sent; beside it, a 2g fits.
    let got = apply(&mut nvml, Step::CreateGi(A100, 9, 4));
    assert_eq!(got, FAILED_NO_ROOM);
    assert_eq!(m.state().faults.len(), 1, "a refused create was sent");
    assert_eq!(
        apply(&mut nvml, Step::CreateGi(A100, 14, 0)),
        Outcome::Failed(Some(NvmlReturn::Unknown))
    );
    assert_eq!(
        apply(&mut nvml, Step::CreateGi(A100, 14, 0)),
        Outcome::Id(0)
    );
}

#[test]
fn a_user_without_the_mig_capabilities_gets_a_clear_error() {
    // Without mig/monitor the instance-listing calls answer NO_PERMISSION: the node cannot be
    // observed, and the error says what to give the service.
    let m = Machine::new(|s| s.driver.mig_monitor = false);
    let err = NvmlDriver::open(Some(&fake_library()), m.descriptor())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("gpu-0/gpu0: nvmlDeviceGetGpuInstances failed"),
        "{err}"
    );
    assert!(err.contains("NVML_ERROR_NO_PERMISSION (4)"), "{err}");
    assert!(err.contains("capabilities/mig/monitor"), "{err}");

    // With monitor but not config (the default for a user that is not root): the node is
    // observed, and a change is refused naming the call and mig/config, changing nothing.
    m.edit(|s| {
        s.driver.mig_monitor = true;
        s.driver.mig_config = false;
    });
    let mut nvml = m.nvml();
    let before = nvml.observe().unwrap();
    let err = nvml.destroy_compute_instance(&gpu(H100), 0, 0).unwrap_err();
    assert_eq!(err.code(), Some(NvmlReturn::NoPermission));
    let text = err.to_string();
    assert!(text.contains("nvmlComputeInstanceDestroy"), "{text}");
    assert!(text.contains("capabilities/mig/config"), "{text}");
    assert_eq!(nvml.observe().unwrap(), before);
}

#[test]
fn errors_keep_the_code_nvml_returned_and_name_the_function_called() {
    // Codes the old table folded into UNKNOWN (999): a named one and one nvml.h lacks.
    let m = Machine::new(|s| {
        for code in [NvmlReturn::LibRmVersionMismatch, NvmlReturn::Other(77)] {
            s.faults.push(FakeFault::Fail {
                function: "nvmlGpuInstanceDestroy".into(),
                gpu: Some(H100),
                code,
                times: 1,
                after: 0,
            });
        }
        s.faults.push(FakeFault::RefuseReset {
            gpu: Some(H100_OFF),
            times: 2,
            after: 0,
        });
    });
    let mut nvml = m.nvml();
    nvml.destroy_compute_instance(&gpu(H100), 0, 0).unwrap();
    let first = nvml.destroy_gpu_instance(&gpu(H100), 0).unwrap_err();
    assert_eq!(first.code(), Some(NvmlReturn::LibRmVersionMismatch));
    assert!(
        first
            .to_string()
            .ends_with("nvmlGpuInstanceDestroy failed: NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)"),
        "{first}"
    );
    let second = nvml.destroy_gpu_instance(&gpu(H100), 0).unwrap_err();
    assert_eq!(second.code(), Some(NvmlReturn::Other(77)));
    assert!(second.to_string().contains("77"), "{second}");

    // NVML has no reset call: both drivers name the activation nvmlDeviceSetMigMode attempts.
    nvml.set_mig_mode(&gpu(H100_OFF), true).unwrap();
    let reset = nvml.reset_gpu(&gpu(H100_OFF)).unwrap_err().to_string();
    let mut sim = m.sim();
    sim.set_faults(FaultPlan {
        faults: vec![Fault::RefuseReset {
            node: None,
            gpu: Some(H100_OFF),
            times: 1,
            after: 0,
        }],
    });
    sim.set_mig_mode(&gpu(H100_OFF), true).unwrap();
    let sim_reset = sim.reset_gpu(&gpu(H100_OFF)).unwrap_err().to_string();
    for text in [reset, sim_reset] {
        assert!(
            text.contains("nvmlDeviceSetMigMode (activation) failed: NVML_ERROR_IN_USE (19)"),
            "{text}"
        );
        assert!(!text.contains("ResetGpu"), "{text}");
    }
}

/// What the stand-in answers on a GPU with MIG disabled, call by call, against what driver
/// 580.159.04 answered on an H100 80GB HBM3 with MIG disabled (ARCHITECTURE.md, "What the
/// stand-in reproduces").
#[test]
fn with_mig_disabled_the_stand_in_answers_as_driver_580_did_on_an_h100() {
    use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlGpuInstanceProfileInfo_t};
    let _m = Machine::new(|_| {});
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(fake_library().as_os_str())
        .init()
        .unwrap();
    let lib = nvml.lib();
    let device = nvml.device_by_index(H100_OFF).unwrap();
    // SAFETY: a handle from this library, used while `nvml` lives.
    let h = unsafe { device.handle() };
    let code = |ret: u32| NvmlReturn::from_raw(ret);
    let info = |e: u32| -> (NvmlReturn, u32, u32) {
        let mut i: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        let f = lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref().unwrap();
        // SAFETY: `i` is a live out-parameter.
        let ret = unsafe { f(h, e, &mut i) };
        (code(ret), i.id, i.instanceCount)
    };
    // Profile enum → (code, profile ID, instances), as the H100 answered.
    let enums = [
        (0, (NvmlReturn::Success, 19, 7)),
        (1, (NvmlReturn::Success, 14, 3)),
        (2, (NvmlReturn::Success, 9, 2)),
        (3, (NvmlReturn::Success, 5, 1)),
        (4, (NvmlReturn::Success, 0, 1)),
        (5, (NvmlReturn::NotSupported, 0, 0)),
        (7, (NvmlReturn::Success, 20, 1)),
        (9, (NvmlReturn::Success, 15, 4)),
        (16, (NvmlReturn::NotSupported, 0, 0)),
        (17, (NvmlReturn::InvalidArgument, 0, 0)),
    ];
    for (e, want) in enums {
        assert_eq!(info(e), want, "profile enum {e}");
    }
    let mut n: u32 = 9;
    let f = lib.nvmlDeviceGetMaxMigDeviceCount.as_ref().unwrap();
    assert_eq!((code(unsafe { f(h, &mut n) }), n), (NvmlReturn::Success, 0));
    let mut mig: nvmlDevice_t = std::ptr::null_mut();
    let f = lib.nvmlDeviceGetMigDeviceHandleByIndex.as_ref().unwrap();
    assert_eq!(code(unsafe { f(h, 0, &mut mig) }), NvmlReturn::NotFound);
    let mut gis = [std::ptr::null_mut(); 7];
    let mut count: u32 = 9;
    let f = lib.nvmlDeviceGetGpuInstances.as_ref().unwrap();
    let ret = unsafe { f(h, 19, gis.as_mut_ptr(), &mut count) };
    assert_eq!((code(ret), count), (NvmlReturn::Success, 0));
    let ret = unsafe { f(h, 1, gis.as_mut_ptr(), &mut count) };
    assert_eq!(code(ret), NvmlReturn::InvalidArgument);
    let f = lib.nvmlDeviceGetGpuInstanceById.as_ref().unwrap();
    let ret = unsafe { f(h, 1, gis.as_mut_ptr()) };
    assert_eq!(code(ret), NvmlReturn::NotFound);
    // No processes: SUCCESS with a count of 0 when asked with no buffer.
    let mut n: u32 = 0;
    let f = lib
        .nvmlDeviceGetComputeRunningProcesses_v3
        .as_ref()
        .unwrap();
    let ret = unsafe { f(h, &mut n, std::ptr::null_mut()) };
    assert_eq!((code(ret), n), (NvmlReturn::Success, 0));
    let msg = unsafe { std::ffi::CStr::from_ptr((lib.nvmlErrorString.as_ref().unwrap())(4)) };
    assert_eq!(msg.to_str(), Ok("Insufficient Permissions"));
}

/// Utilization goes through `nvmlDeviceGetUtilizationRates`: a GPU that reports it is read as
/// it reports it; one that answers `NOT_SUPPORTED` (no counters, or in MIG mode) has none, never
/// a made-up zero.
#[test]
fn utilization_is_read_where_reported_and_absent_where_not() {
    let busy = FakeUtilization {
        gpu: 87,
        memory: 40,
    };
    let m = Machine::new(|s| {
        // GPU 0 is in MIG mode: what is set for it is not answered.
        s.gpus[0].utilization = Some(busy);
        s.gpus[H100_OFF as usize].utilization = Some(busy);
    });
    let of = |o: &Observation, index: u32| {
        o.details
            .iter()
            .find(|d| d.gpu.index == index)
            .unwrap()
            .utilization
    };
    let o = m.nvml().observe().unwrap();
    assert_eq!(
        of(&o, H100_OFF),
        Some(GpuUtilization {
            gpu_percent: 87,
            memory_percent: 40
        })
    );
    assert_eq!(of(&o, 0), None);
    m.edit(|s| s.gpus[H100_OFF as usize].utilization = None);
    assert_eq!(of(&m.nvml().observe().unwrap(), H100_OFF), None);
}

fn activity(sm_util: f64, sm_occupancy: f64) -> FakeSmActivity {
    FakeSmActivity {
        sm_util,
        sm_occupancy,
    }
}

fn sm(o: &Observation, index: u32) -> Option<SmActivity> {
    o.details[index as usize].sm_activity
}

/// The SM activity of each GPU instance of GPU `index`, by instance id.
fn instance_sm(o: &Observation, index: u32) -> Vec<(u32, Option<SmActivity>)> {
    o.details[index as usize]
        .instances
        .iter()
        .map(|gi| (gi.id, gi.sm_activity))
        .collect()
}

fn reported(sm_util_percent: f64, sm_occupancy_percent: f64) -> Option<SmActivity> {
    Some(SmActivity {
        sm_util_percent,
        sm_occupancy_percent,
    })
}

/// GPM's SM activity is measured between one observation's sample and the next, for the
/// whole GPU and for each MIG instance the library reports it for; a GPU without GPM (the
/// A100), an instance the library has no figure for, and a scope's first sample report none.
#[test]
fn sm_activity_is_measured_between_observations_where_gpm_is_supported() {
    let m = Machine::new(|s| {
        let first = s.gpus[H100 as usize].device.gpu_instances()[0].id;
        s.gpus[H100 as usize].gpm = Some(FakeGpm {
            gpu: activity(40.0, 20.0),
            instances: [(first, activity(90.0, 55.5))].into(),
        });
        s.gpus[H100_OFF as usize].gpm = Some(FakeGpm {
            gpu: activity(62.5, 30.0),
            instances: Default::default(),
        });
    });
    let mut nvml = m.nvml();
    // Opening observed once: this observation measures from its samples.
    let o = nvml.observe().unwrap();
    assert_eq!(sm(&o, H100_OFF), reported(62.5, 30.0));
    assert_eq!(sm(&o, H100), reported(40.0, 20.0));
    let ids: Vec<u32> = o.details[H100 as usize]
        .instances
        .iter()
        .map(|gi| gi.id)
        .collect();
    let first = m.state().gpus[H100 as usize].device.gpu_instances()[0].id;
    let want: Vec<(u32, Option<SmActivity>)> = ids
        .iter()
        .map(|&id| (id, (id == first).then(|| reported(90.0, 55.5)).flatten()))
        .collect();
    assert_eq!(instance_sm(&o, H100), want);
    assert_eq!(sm(&o, A100), None);
    // A new figure is the next interval's.
    m.edit(|s| s.gpus[H100_OFF as usize].gpm.as_mut().unwrap().gpu = activity(5.0, 1.0));
    assert_eq!(sm(&nvml.observe().unwrap(), H100_OFF), reported(5.0, 1.0));
    // GPM gone: nothing; back: nothing until a second sample, then the figure.
    let gpm = m.state().gpus[H100_OFF as usize].gpm.clone();
    m.edit(|s| s.gpus[H100_OFF as usize].gpm = None);
    assert_eq!(sm(&nvml.observe().unwrap(), H100_OFF), None);
    m.edit(|s| s.gpus[H100_OFF as usize].gpm = gpm);
    assert_eq!(sm(&nvml.observe().unwrap(), H100_OFF), None);
    assert_eq!(sm(&nvml.observe().unwrap(), H100_OFF), reported(5.0, 1.0));
    // A fresh driver measures from the samples its opening took.
    assert_eq!(
        sm(&m.nvml().observe().unwrap(), H100_OFF),
        reported(5.0, 1.0)
    );
}

/// An instance destroyed and made again is a new scope: never measured across the change.
#[test]
fn a_remade_instance_starts_its_sm_activity_over() {
    let m = Machine::new(|s| {
        let ids: Vec<u32> = s.gpus[H100 as usize]
            .device
            .gpu_instances()
            .iter()
            .map(|gi| gi.id)
            .collect();
        s.gpus[H100 as usize].gpm = Some(FakeGpm {
            gpu: activity(10.0, 10.0),
            instances: ids.iter().map(|&id| (id, activity(70.0, 35.0))).collect(),
        });
    });
    let mut nvml = m.nvml();
    let o = nvml.observe().unwrap();
    let (id, _) = instance_sm(&o, H100)[1];
    assert!(
        instance_sm(&o, H100)
            .iter()
            .all(|(_, a)| *a == reported(70.0, 35.0))
    );
    let gi = &o.details[H100 as usize].instances[1];
    let (profile, start) = (gi.profile_id, gi.start);
    let ci = gi.compute_instances[0].id;
    nvml.destroy_compute_instance(&gpu(H100), id, ci).unwrap();
    nvml.destroy_gpu_instance(&gpu(H100), id).unwrap();
    // Half the slices of the old instance, at its start: another profile, maybe the same id.
    let small = builtin_model("H100-SXM5-80GB")
        .unwrap()
        .resolve_profile("1g.10gb")
        .unwrap();
    let remade = nvml.create_gpu_instance(&gpu(H100), small, start).unwrap();
    assert_ne!(small, profile);
    nvml.create_compute_instance(&gpu(H100), remade).unwrap();
    m.edit(|s| {
        let gpm = s.gpus[H100 as usize].gpm.as_mut().unwrap();
        gpm.instances.insert(remade, activity(12.0, 6.0));
    });
    let o = nvml.observe().unwrap();
    let of = |o: &Observation| {
        instance_sm(o, H100)
            .into_iter()
            .find(|(i, _)| *i == remade)
            .unwrap()
            .1
    };
    assert_eq!(of(&o), None);
    assert_eq!(of(&nvml.observe().unwrap()), reported(12.0, 6.0));
}

/// The stand-in's GPM answers nvml-wrapper's own API (an independent reader of the same ABI)
/// as a real H100 did (`evidence/h100-580.159.04-gpm.txt`): percentages with NVML's names,
/// two samples in either order, one sample twice refused, a MIG sample refused with MIG off;
/// and samples of two scopes refused.
#[test]
fn the_stand_ins_gpm_answers_nvml_wrappers_api_and_refuses_mismatched_samples() {
    use nvml_wrapper::enums::gpm::GpmMetricId;
    use nvml_wrapper::error::NvmlError;
    use nvml_wrapper::gpm::gpm_metrics_get;
    let m = Machine::new(|s| {
        let first = s.gpus[H100 as usize].device.gpu_instances()[0].id;
        s.gpus[H100 as usize].gpm = Some(FakeGpm {
            gpu: activity(33.0, 11.0),
            instances: [(first, activity(80.0, 40.0))].into(),
        });
        s.gpus[H100_OFF as usize].gpm = Some(FakeGpm {
            gpu: activity(0.0, 0.0),
            instances: Default::default(),
        });
    });
    let first = m.state().gpus[H100 as usize].device.gpu_instances()[0].id;
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(fake_library().as_os_str())
        .init()
        .unwrap();
    let h100 = nvml.device_by_index(H100).unwrap();
    let a100 = nvml.device_by_index(A100).unwrap();
    assert!(h100.gpm_support().unwrap());
    assert!(!a100.gpm_support().unwrap());
    assert!(matches!(a100.gpm_sample(), Err(NvmlError::NotSupported)));
    let ids = [
        GpmMetricId::SmUtil,
        GpmMetricId::SmOccupancy,
        GpmMetricId::Fp64Util,
    ];
    let (a, b) = (h100.gpm_sample().unwrap(), h100.gpm_sample().unwrap());
    let values = gpm_metrics_get(&nvml, &a, &b, &ids).unwrap();
    let util = values[0].as_ref().unwrap();
    assert_eq!(util.value, 33.0);
    assert_eq!(
        (
            util.metric_info.short_name.as_str(),
            util.metric_info.long_name.as_str(),
            util.metric_info.unit.as_str()
        ),
        ("smutil", "SM_UTIL", "%")
    );
    assert_eq!(values[1].as_ref().unwrap().value, 11.0);
    assert_eq!(values[1].as_ref().unwrap().metric_info.short_name, "smocc");
    assert!(matches!(values[2], Err(NvmlError::NotSupported)));
    let reversed = gpm_metrics_get(&nvml, &b, &a, &ids).unwrap();
    assert_eq!(reversed[0].as_ref().unwrap().value, 33.0);
    assert!(matches!(
        gpm_metrics_get(&nvml, &a, &a, &ids),
        Err(NvmlError::InvalidArg)
    ));
    let (c, d) = (
        h100.gpm_mig_sample(first).unwrap(),
        h100.gpm_mig_sample(first).unwrap(),
    );
    assert_eq!(
        gpm_metrics_get(&nvml, &c, &d, &ids[..1]).unwrap()[0]
            .as_ref()
            .unwrap()
            .value,
        80.0
    );
    assert!(matches!(
        gpm_metrics_get(&nvml, &a, &d, &ids),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        h100.gpm_mig_sample(99),
        Err(NvmlError::InvalidArg)
    ));
    // Not in MIG mode: no instance to sample.
    let off = nvml.device_by_index(H100_OFF).unwrap();
    assert!(matches!(
        off.gpm_mig_sample(first),
        Err(NvmlError::InvalidArg)
    ));
}

/// A GPM call that fails (other than a lost GPU) leaves the activity unreported and the
/// observation whole; the next samples measure again.
#[test]
fn a_failing_gpm_call_reports_no_activity_and_stops_nothing() {
    let m = Machine::new(|s| {
        s.gpus[H100_OFF as usize].gpm = Some(FakeGpm {
            gpu: activity(64.0, 32.0),
            instances: Default::default(),
        });
    });
    let mut nvml = m.nvml();
    m.edit(|s| {
        s.faults.push(FakeFault::Fail {
            function: "nvmlGpmSampleGet".into(),
            gpu: Some(H100_OFF),
            code: NvmlReturn::Unknown,
            times: 1,
            after: 0,
        })
    });
    let o = nvml.observe().expect("the observation stands");
    assert_eq!(sm(&o, H100_OFF), None);
    assert_eq!(o.nodes[0].gpus.len(), 3);
    // The failed sample left no earlier one: one more observation to measure from.
    assert_eq!(sm(&nvml.observe().unwrap(), H100_OFF), None);
    assert_eq!(sm(&nvml.observe().unwrap(), H100_OFF), reported(64.0, 32.0));
}
