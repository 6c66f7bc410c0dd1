//! Fault injection for the simulated driver: NVML calls that fail, GPUs that fall off the bus,
//! resets that are refused, calls that are slow.
//!
//! Faults fire by counting, never by chance, so that a test (or a demo) that injects "the
//! second `create_gpu_instance` on infer-0 GPU 3 fails with `INSUFFICIENT_RESOURCES`" sees
//! exactly that on every run. A plan is written in YAML or JSON:
//!
//! ```yaml
//! faults:
//!   - fail: {call: create_gpu_instance, node: infer-0, gpu: 3, code: insufficient_resources, after: 1}
//!   - lose: {node: infer-0, gpu: 5, after: 2}
//!   - refuse_reset: {node: train-1, times: 2}
//!   - slow: {call: observe, ms: 250}
//! ```

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{GpuRef, NvmlReturn};

/// The driver calls a fault can target, named as the [`super::NodeDriver`] methods are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    Observe,
    SetMigMode,
    ResetGpu,
    CreateGpuInstance,
    DestroyGpuInstance,
    CreateComputeInstance,
    DestroyComputeInstance,
}

impl Call {
    /// The NVML function the call stands for, as errors name it. NVML has no reset call: the
    /// reset that activates a pending mode is the one `nvmlDeviceSetMigMode` attempts (the
    /// `nvml` driver names it the same way).
    pub fn nvml_function(self) -> &'static str {
        match self {
            Call::Observe => "nvmlDeviceGetMigMode",
            Call::SetMigMode => "nvmlDeviceSetMigMode",
            Call::ResetGpu => "nvmlDeviceSetMigMode (activation)",
            Call::CreateGpuInstance => "nvmlDeviceCreateGpuInstanceWithPlacement",
            Call::DestroyGpuInstance => "nvmlGpuInstanceDestroy",
            Call::CreateComputeInstance => "nvmlGpuInstanceCreateComputeInstance",
            Call::DestroyComputeInstance => "nvmlComputeInstanceDestroy",
        }
    }
}

/// Whether a GPU is one a fault names: any GPU, a node's GPUs, or one GPU.
fn targets(node: &Option<String>, index: &Option<u32>, gpu: &GpuRef) -> bool {
    node.as_ref().is_none_or(|n| *n == gpu.node) && index.is_none_or(|i| i == gpu.index)
}

fn one() -> u32 {
    1
}

/// One injected fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// The call fails with `code`, changing nothing, on the matching calls after the first
    /// `after`, `times` times.
    Fail {
        call: Call,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<u32>,
        code: NvmlReturn,
        #[serde(default = "one")]
        times: u32,
        #[serde(default)]
        after: u32,
    },
    /// The GPU falls off the bus at its call number `after` + 1 (any call on it, an observation
    /// included) and stays lost: every later call fails with `GPU_IS_LOST` and observations
    /// report it `lost`. The state file remembers it, as a real lost GPU stays lost.
    Lose {
        node: String,
        gpu: u32,
        #[serde(default)]
        after: u32,
    },
    /// A reset fails with `IN_USE`, as when a client the driver cannot see (a monitoring agent,
    /// the persistence daemon) holds the GPU.
    RefuseReset {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<u32>,
        #[serde(default = "one")]
        times: u32,
        #[serde(default)]
        after: u32,
    },
    /// The call sleeps `ms` before doing its work, `times` times (every time when absent).
    Slow {
        call: Call,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<u32>,
        ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        times: Option<u32>,
    },
}

/// A list of faults, checked in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPlan {
    #[serde(default)]
    pub faults: Vec<Fault>,
}

/// Why a fault plan could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FaultPlanError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
}

impl FaultPlan {
    pub fn new(faults: Vec<Fault>) -> Self {
        FaultPlan { faults }
    }

    /// Reads a plan from YAML (JSON being YAML, a `.json` file reads the same way).
    pub fn load(path: &Path) -> Result<FaultPlan, FaultPlanError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| FaultPlanError::Io {
            path: shown.clone(),
            source,
        })?;
        FaultPlan::parse(&text).map_err(|message| FaultPlanError::Parse {
            path: shown,
            message,
        })
    }

    /// Parses a plan; the error text carries the line and column serde-saphyr reports.
    pub fn parse(text: &str) -> Result<FaultPlan, String> {
        serde_saphyr::from_str(text).map_err(|e| e.to_string())
    }
}

/// What the faults say about one call.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Sleep this long first.
    pub delay: Duration,
    /// Fail with this code, changing nothing; the GPU is the first of the call's GPUs that the
    /// failing fault names (an observation covers many).
    pub fail: Option<(NvmlReturn, GpuRef)>,
}

/// A plan with its counters: how many matching calls each fault has seen and how many times it
/// has fired.
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    plan: FaultPlan,
    seen: Vec<u32>,
    fired: Vec<u32>,
}

impl FaultState {
    pub fn new(plan: FaultPlan) -> Self {
        let n = plan.faults.len();
        FaultState {
            plan,
            seen: vec![0; n],
            fired: vec![0; n],
        }
    }

    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }

    /// Counts one call touching `gpus` (one GPU for a device call, every GPU for an
    /// observation) against the `lose` faults; returns the GPUs that are lost from now on.
    /// Asked before [`FaultState::on_call`], so that a call on a GPU that just got lost fails
    /// with `GPU_IS_LOST` without spending another fault's budget.
    pub fn lose(&mut self, gpus: &[GpuRef]) -> Vec<GpuRef> {
        let mut lost = Vec::new();
        for (i, fault) in self.plan.faults.iter().enumerate() {
            let Fault::Lose { node, gpu, after } = fault else {
                continue;
            };
            let Some(g) = gpus.iter().find(|g| g.node == *node && g.index == *gpu) else {
                continue;
            };
            self.seen[i] += 1;
            if self.seen[i] > *after && self.fired[i] == 0 {
                self.fired[i] = 1;
                lost.push(g.clone());
            }
        }
        lost
    }

    /// Counts one call of `call` on `gpus` and says what happens to it. Every fault counts the
    /// calls it matches; the first failing fault that is due fails the call, later ones keep
    /// their budget.
    pub fn on_call(&mut self, call: Call, gpus: &[GpuRef]) -> Verdict {
        let mut verdict = Verdict::default();
        for (i, fault) in self.plan.faults.iter().enumerate() {
            let (code, node, gpu, times, after) = match fault {
                Fault::Fail {
                    call: c,
                    node,
                    gpu,
                    code,
                    times,
                    after,
                } if *c == call => (*code, node, gpu, *times, *after),
                Fault::RefuseReset {
                    node,
                    gpu,
                    times,
                    after,
                } if call == Call::ResetGpu => (NvmlReturn::InUse, node, gpu, *times, *after),
                Fault::Slow {
                    call: c,
                    node,
                    gpu,
                    ms,
                    times,
                } if *c == call => {
                    if gpus.iter().any(|g| targets(node, gpu, g))
                        && times.is_none_or(|t| self.fired[i] < t)
                    {
                        self.fired[i] += 1;
                        verdict.delay += Duration::from_millis(*ms);
                    }
                    continue;
                }
                _ => continue,
            };
            let Some(target) = gpus.iter().find(|g| targets(node, gpu, g)) else {
                continue;
            };
            self.seen[i] += 1;
            if verdict.fail.is_none() && self.seen[i] > after && self.fired[i] < times {
                self.fired[i] += 1;
                verdict.fail = Some((code, target.clone()));
            }
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(v: Verdict) -> Option<NvmlReturn> {
        v.fail.map(|(code, _)| code)
    }

    fn gpu(node: &str, index: u32) -> GpuRef {
        GpuRef {
            node: node.into(),
            index,
        }
    }

    #[test]
    fn parses_the_documented_example() {
        let plan = FaultPlan::parse(
            "faults:\n\
             \x20 - fail: {call: create_gpu_instance, node: infer-0, gpu: 3, code: insufficient_resources, after: 1}\n\
             \x20 - lose: {node: infer-0, gpu: 5, after: 2}\n\
             \x20 - refuse_reset: {node: train-1, times: 2}\n\
             \x20 - slow: {call: observe, ms: 250}\n",
        )
        .unwrap();
        assert_eq!(
            plan.faults,
            [
                Fault::Fail {
                    call: Call::CreateGpuInstance,
                    node: Some("infer-0".into()),
                    gpu: Some(3),
                    code: NvmlReturn::InsufficientResources,
                    times: 1,
                    after: 1
                },
                Fault::Lose {
                    node: "infer-0".into(),
                    gpu: 5,
                    after: 2
                },
                Fault::RefuseReset {
                    node: Some("train-1".into()),
                    gpu: None,
                    times: 2,
                    after: 0
                },
                Fault::Slow {
                    call: Call::Observe,
                    node: None,
                    gpu: None,
                    ms: 250,
                    times: None
                },
            ]
        );
        let json = serde_json::to_string(&plan).unwrap();
        assert_eq!(FaultPlan::parse(&json).unwrap(), plan);
    }

    #[test]
    fn unknown_call_or_code_is_refused_with_a_location() {
        let err =
            FaultPlan::parse("faults:\n  - fail: {call: create_gi, code: in_use}\n").unwrap_err();
        assert!(err.contains("create_gi"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert!(FaultPlan::parse("faults:\n  - fail: {call: observe, code: busy}\n").is_err());
        assert!(FaultPlan::parse("faults:\n  - slow: {call: observe}\n").is_err());
        assert!(FaultPlan::parse("fault: []\n").is_err());
    }

    #[test]
    fn fail_fires_after_then_times() {
        let mut s = FaultState::new(FaultPlan::new(vec![Fault::Fail {
            call: Call::DestroyGpuInstance,
            node: Some("a".into()),
            gpu: None,
            code: NvmlReturn::Unknown,
            times: 2,
            after: 1,
        }]));
        let a0 = [gpu("a", 0)];
        let got: Vec<Option<NvmlReturn>> = (0..5)
            .map(|_| code(s.on_call(Call::DestroyGpuInstance, &a0)))
            .collect();
        assert_eq!(
            got,
            [
                None,
                Some(NvmlReturn::Unknown),
                Some(NvmlReturn::Unknown),
                None,
                None
            ]
        );
        // Other calls and other nodes do not count.
        let mut s = FaultState::new(s.plan().clone());
        assert_eq!(code(s.on_call(Call::CreateGpuInstance, &a0)), None);
        assert_eq!(
            code(s.on_call(Call::DestroyGpuInstance, &[gpu("b", 0)])),
            None
        );
        assert_eq!(code(s.on_call(Call::DestroyGpuInstance, &a0)), None);
        assert_eq!(
            code(s.on_call(Call::DestroyGpuInstance, &a0)),
            Some(NvmlReturn::Unknown)
        );
    }

    #[test]
    fn first_due_failure_wins_and_the_next_keeps_its_budget() {
        let fail = |code| Fault::Fail {
            call: Call::SetMigMode,
            node: None,
            gpu: None,
            code,
            times: 1,
            after: 0,
        };
        let mut s = FaultState::new(FaultPlan::new(vec![
            fail(NvmlReturn::NoPermission),
            fail(NvmlReturn::Unknown),
        ]));
        let g = [gpu("a", 0)];
        assert_eq!(
            code(s.on_call(Call::SetMigMode, &g)),
            Some(NvmlReturn::NoPermission)
        );
        assert_eq!(
            code(s.on_call(Call::SetMigMode, &g)),
            Some(NvmlReturn::Unknown)
        );
        assert_eq!(code(s.on_call(Call::SetMigMode, &g)), None);
    }

    #[test]
    fn lose_fires_once_at_its_call() {
        let mut s = FaultState::new(FaultPlan::new(vec![Fault::Lose {
            node: "a".into(),
            gpu: 1,
            after: 1,
        }]));
        let fleet = [gpu("a", 0), gpu("a", 1)];
        assert!(s.lose(&fleet).is_empty());
        assert!(s.lose(&fleet[..1]).is_empty());
        assert_eq!(s.lose(&fleet[1..]), [gpu("a", 1)]);
        assert!(s.lose(&fleet).is_empty());
    }

    #[test]
    fn an_observation_fails_at_the_first_gpu_the_fault_names() {
        let mut s = FaultState::new(FaultPlan::new(vec![Fault::Fail {
            call: Call::Observe,
            node: Some("b".into()),
            gpu: None,
            code: NvmlReturn::GpuIsLost,
            times: 1,
            after: 0,
        }]));
        let fleet = [gpu("a", 0), gpu("b", 0), gpu("b", 1)];
        assert_eq!(
            s.on_call(Call::Observe, &fleet).fail,
            Some((NvmlReturn::GpuIsLost, gpu("b", 0)))
        );
        assert_eq!(s.on_call(Call::Observe, &fleet).fail, None);
    }

    #[test]
    fn slow_adds_delay_times_times() {
        let mut s = FaultState::new(FaultPlan::new(vec![
            Fault::Slow {
                call: Call::ResetGpu,
                node: None,
                gpu: None,
                ms: 5,
                times: Some(1),
            },
            Fault::Slow {
                call: Call::ResetGpu,
                node: None,
                gpu: Some(0),
                ms: 7,
                times: None,
            },
        ]));
        let g = [gpu("a", 0)];
        assert_eq!(
            s.on_call(Call::ResetGpu, &g).delay,
            Duration::from_millis(12)
        );
        assert_eq!(
            s.on_call(Call::ResetGpu, &g).delay,
            Duration::from_millis(7)
        );
        assert_eq!(
            s.on_call(Call::ResetGpu, &[gpu("a", 1)]).delay,
            Duration::ZERO
        );
    }

    #[test]
    fn refuse_reset_is_in_use() {
        let mut s = FaultState::new(FaultPlan::new(vec![Fault::RefuseReset {
            node: None,
            gpu: None,
            times: 1,
            after: 0,
        }]));
        let g = [gpu("a", 0)];
        assert_eq!(code(s.on_call(Call::SetMigMode, &g)), None);
        assert_eq!(code(s.on_call(Call::ResetGpu, &g)), Some(NvmlReturn::InUse));
        assert_eq!(code(s.on_call(Call::ResetGpu, &g)), None);
    }
}
