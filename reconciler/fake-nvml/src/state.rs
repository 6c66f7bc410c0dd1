//! The fake's state file: the GPUs (each a [`MigDevice`], so the MIG rules are the ones the
//! `sim` driver obeys) and the faults still to fire.
//!
//! The file is read at every call and written back after every call that changed anything
//! (a mutation, or a fault counter), so a test can inspect or edit it between calls and two
//! processes loading the library see one machine.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tessera_mig::NvmlReturn;
use tessera_mig::device::MigDevice;

/// The environment variable naming the state file.
pub const STATE_ENV: &str = "TESSERA_FAKE_NVML_STATE";

/// The whole machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeState {
    /// By NVML device index.
    pub gpus: Vec<FakeGpu>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<FakeFault>,
    /// How the driver behind the library behaves where drivers differ.
    #[serde(default)]
    pub driver: DriverTraits,
}

impl FakeState {
    /// A machine with these GPUs, no faults, and the driver the H100 evidence was read from.
    pub fn new(gpus: Vec<FakeGpu>) -> FakeState {
        FakeState {
            gpus,
            faults: Vec::new(),
            driver: DriverTraits::default(),
        }
    }
}

/// The knobs that make the stand-in answer as one real driver or another does (the evidence
/// for each is recorded in ARCHITECTURE.md, "What the stand-in reproduces").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriverTraits {
    /// What `nvmlSystemGetDriverVersion` answers.
    pub version: String,
    /// Bytes per entry `nvmlDeviceGetComputeRunningProcesses_v3` writes: 24 (`nvmlProcessInfo_t`
    /// as nvml.h declares it; driver 580.159.04 measured) or 32 (drivers 535.43 to 535.86, which
    /// add `usedGpuCcProtectedMemory` through the same symbol).
    pub process_info_bytes: u32,
    /// What `nvmlDeviceGetMigDeviceHandleByIndex` answers for an index with no MIG device:
    /// `not_found` (driver 580.159.04) or `invalid_argument` (what NVIDIA's device plugin also
    /// skips).
    pub empty_mig_slot: NvmlReturn,
    /// Whether the caller may read MIG instances (`/proc/driver/nvidia/capabilities/mig/monitor`,
    /// world-readable by default); without it the instance-listing calls answer `NO_PERMISSION`.
    pub mig_monitor: bool,
    /// Whether the caller may change MIG (`mig/config`, root only by default); without it mode
    /// changes, creations and destructions answer `NO_PERMISSION`.
    pub mig_config: bool,
}

impl Default for DriverTraits {
    fn default() -> Self {
        DriverTraits {
            version: "580.159.04".into(),
            process_info_bytes: 24,
            empty_mig_slot: NvmlReturn::NotFound,
            mig_monitor: true,
            mig_config: true,
        }
    }
}

/// A GPU instance of a profile tessera's catalog does not know (made by hand with
/// `nvidia-smi`, or one of the newer profile enums), with one compute instance. The stand-in
/// lists it, reports its profile and keeps its memory slices occupied; it does not change it.
/// Its id must be 8 or more, clear of the ids [`MigDevice`] hands out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForeignInstance {
    pub id: u32,
    pub profile_id: u32,
    /// Its `NVML_GPU_INSTANCE_PROFILE_*` value.
    pub nvml_enum: u32,
    pub start: u8,
    /// Memory slices.
    pub size: u8,
    pub compute_slices: u8,
    /// Its compute instance's MIG device UUID.
    pub uuid: String,
}

/// One GPU as NVML describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeGpu {
    /// What `nvmlDeviceGetName` answers, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// What `nvmlDeviceGetMemoryInfo` reports as total, in bytes.
    pub memory_total: u64,
    pub device: MigDevice,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign: Vec<ForeignInstance>,
    /// What `nvmlDeviceGetUtilizationRates` answers; absent: `NOT_SUPPORTED`, as a GPU in MIG
    /// mode answers (so does this stand-in while MIG is on, whatever is set here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<FakeUtilization>,
    /// What GPM (`nvmlGpm*`) measures on this GPU; absent: the GPU has no GPM (as every GPU
    /// before Hopper), and `nvmlGpmQueryDeviceSupport` says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpm: Option<FakeGpm>,
}

/// The SM activity GPM reports for a GPU and its MIG instances. A sample records the figures
/// set here when it is taken; `nvmlGpmMetricsGet` answers the later sample's figures as the
/// activity over the interval (the stand-in has no counters to difference).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeGpm {
    /// The whole GPU (`nvmlGpmSampleGet`).
    pub gpu: FakeSmActivity,
    /// Per GPU instance id (`nvmlGpmMigSampleGet`). An instance that exists but is not listed
    /// answers `NOT_SUPPORTED`: the stand-in has no figure for it and makes none up.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub instances: std::collections::BTreeMap<u32, FakeSmActivity>,
}

/// Percentages, as GPM's metrics report them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeSmActivity {
    /// `NVML_GPM_METRIC_SM_UTIL`.
    pub sm_util: f64,
    /// `NVML_GPM_METRIC_SM_OCCUPANCY`.
    pub sm_occupancy: f64,
}

/// Percentages over NVML's sample period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeUtilization {
    pub gpu: u32,
    pub memory: u32,
}

/// A fault, fired by counting: `after` matching calls pass first. Counters are kept in the file,
/// so a fault fires once however many processes call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FakeFault {
    /// The NVML function `function` (e.g. `nvmlGpuInstanceDestroy`) returns `code`, changing
    /// nothing, `times` times; `gpu` restricts it to one device index.
    Fail {
        function: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<u32>,
        code: NvmlReturn,
        #[serde(default = "one")]
        times: u32,
        #[serde(default)]
        after: u32,
    },
    /// GPU `gpu` falls off the bus at a call on it: it and every later call on it answer
    /// `NVML_ERROR_GPU_IS_LOST`, and the file remembers it.
    Lose {
        gpu: u32,
        #[serde(default)]
        after: u32,
    },
    /// The reset that `nvmlDeviceSetMigMode` attempts to activate the mode is refused with
    /// `NVML_ERROR_IN_USE` (a client the caller cannot see holds the GPU), `times` times; the
    /// mode stays pending.
    RefuseReset {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<u32>,
        #[serde(default = "one")]
        times: u32,
        #[serde(default)]
        after: u32,
    },
}

fn one() -> u32 {
    1
}

/// Counts one matching call against a fault; true when the fault fires now. A spent fault is
/// left with `times: 0` and removed by `FakeState::prune`.
fn count(after: &mut u32, times: &mut u32) -> bool {
    if *times == 0 {
        return false;
    }
    if *after > 0 {
        *after -= 1;
        return false;
    }
    *times -= 1;
    true
}

impl FakeState {
    pub fn load(path: &Path) -> Result<FakeState, String> {
        let bytes = fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let state: FakeState =
            serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        state
            .check()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(state)
    }

    /// What serde cannot say about a state: knobs out of range, foreign ids that collide.
    fn check(&self) -> Result<(), String> {
        if ![24, 32].contains(&self.driver.process_info_bytes) {
            return Err(format!(
                "driver.process_info_bytes is {}; drivers write 24 or 32",
                self.driver.process_info_bytes
            ));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if let Some(f) = g.foreign.iter().find(|f| f.id < 8) {
                return Err(format!(
                    "gpus[{i}].foreign: id {} is below 8, where tessera_mig::device hands out ids",
                    f.id
                ));
            }
        }
        Ok(())
    }

    /// Writes to a temporary file, then renames it over the state, so a reader never sees half
    /// a file.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        let mut tmp = PathBuf::from(path);
        tmp.set_extension(format!("tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&json)?;
            f.sync_all()?;
            fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            format!("{}: {e}", path.display())
        })
    }

    /// Runs the faults for a call to `function` on `gpu` (None: a call on no device): `lose`
    /// first; then, with `live_only`, a lost GPU answers `NVML_ERROR_GPU_IS_LOST` before any
    /// `fail` is counted against it; then `fail`. Returns the code the call fails with.
    pub fn gate(
        &mut self,
        function: &str,
        gpu: Option<u32>,
        live_only: bool,
    ) -> Option<NvmlReturn> {
        let mut lost = Vec::new();
        self.faults.retain_mut(|f| match f {
            FakeFault::Lose { gpu: g, after } if Some(*g) == gpu => {
                if *after > 0 {
                    *after -= 1;
                    true
                } else {
                    lost.push(*g);
                    false
                }
            }
            _ => true,
        });
        for g in lost {
            if let Some(d) = self.gpus.get_mut(g as usize) {
                d.device.set_lost(true);
            }
        }
        if live_only
            && let Some(g) = gpu
            && self
                .gpus
                .get(g as usize)
                .is_some_and(|d| d.device.is_lost())
        {
            return Some(NvmlReturn::GpuIsLost);
        }
        let mut failed = None;
        for f in &mut self.faults {
            if let FakeFault::Fail {
                function: name,
                gpu: g,
                code,
                times,
                after,
            } = f
                && name == function
                && (g.is_none() || *g == gpu)
                && failed.is_none()
                && count(after, times)
            {
                failed = Some(*code);
            }
        }
        self.prune();
        failed
    }

    /// Whether a `refuse_reset` fault refuses this reset of `gpu`.
    pub fn reset_refused(&mut self, gpu: u32) -> bool {
        let mut refused = false;
        for f in &mut self.faults {
            if let FakeFault::RefuseReset {
                gpu: g,
                times,
                after,
            } = f
                && g.is_none_or(|g| g == gpu)
                && !refused
                && count(after, times)
            {
                refused = true;
            }
        }
        self.prune();
        refused
    }

    fn prune(&mut self) {
        self.faults.retain(|f| match f {
            FakeFault::Fail { times, .. } | FakeFault::RefuseReset { times, .. } => *times > 0,
            FakeFault::Lose { .. } => true,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_mig::builtin_model;

    fn state(faults: Vec<FakeFault>) -> FakeState {
        let model = builtin_model("H100-SXM5-80GB").unwrap();
        FakeState {
            gpus: vec![FakeGpu {
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total: 85_520_809_984,
                device: MigDevice::new("GPU-00000000-0000-0000-0000-000000000000", model),
                foreign: Vec::new(),
                utilization: None,
                gpm: None,
            }],
            faults,
            driver: DriverTraits::default(),
        }
    }

    #[test]
    fn a_fail_fault_fires_after_its_count_then_is_spent() {
        let mut s = state(vec![FakeFault::Fail {
            function: "nvmlGpuInstanceDestroy".into(),
            gpu: Some(0),
            code: NvmlReturn::InUse,
            times: 2,
            after: 1,
        }]);
        assert_eq!(s.gate("nvmlGpuInstanceDestroy", Some(0), true), None);
        assert_eq!(s.gate("nvmlGpuInstanceDestroy", Some(1), true), None);
        assert_eq!(s.gate("nvmlDeviceGetName", Some(0), true), None);
        assert_eq!(
            s.gate("nvmlGpuInstanceDestroy", Some(0), true),
            Some(NvmlReturn::InUse)
        );
        assert_eq!(
            s.gate("nvmlGpuInstanceDestroy", Some(0), true),
            Some(NvmlReturn::InUse)
        );
        assert_eq!(s.gate("nvmlGpuInstanceDestroy", Some(0), true), None);
        assert!(s.faults.is_empty());
    }

    #[test]
    fn a_lose_fault_marks_the_gpu_lost_once() {
        let mut s = state(vec![FakeFault::Lose { gpu: 0, after: 1 }]);
        s.gate("nvmlDeviceGetName", Some(0), true);
        assert!(!s.gpus[0].device.is_lost());
        s.gate("nvmlDeviceGetName", Some(0), true);
        assert!(s.gpus[0].device.is_lost());
        assert!(s.faults.is_empty());
    }

    #[test]
    fn refused_resets_count_down() {
        let mut s = state(vec![FakeFault::RefuseReset {
            gpu: None,
            times: 1,
            after: 0,
        }]);
        assert!(s.reset_refused(0));
        assert!(!s.reset_refused(0));
    }

    #[test]
    fn a_code_is_read_by_name_or_number_and_bad_knobs_are_refused() {
        let mut s = state(Vec::new());
        let dir = std::env::temp_dir().join(format!("fake-nvml-knobs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let mut json = serde_json::to_value(&s).unwrap();
        json["faults"] = serde_json::json!([
            {"fail": {"function": "f", "code": 19}},
            {"fail": {"function": "g", "code": "no_permission"}},
        ]);
        fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        let codes: Vec<NvmlReturn> = FakeState::load(&path)
            .unwrap()
            .faults
            .iter()
            .filter_map(|f| match f {
                FakeFault::Fail { code, .. } => Some(*code),
                _ => None,
            })
            .collect();
        assert_eq!(codes, [NvmlReturn::InUse, NvmlReturn::NoPermission]);

        s.driver.process_info_bytes = 28;
        s.save(&path).unwrap();
        let err = FakeState::load(&path).unwrap_err();
        assert!(err.contains("process_info_bytes is 28"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_file_round_trips() {
        let dir = std::env::temp_dir().join(format!("fake-nvml-state-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let s = state(vec![FakeFault::Lose { gpu: 0, after: 3 }]);
        s.save(&path).unwrap();
        assert_eq!(FakeState::load(&path).unwrap(), s);
        fs::remove_dir_all(&dir).unwrap();
    }
}
