//! SM activity of allocated GPUs (NVML GPM: Hopper and later), per pool and tenant and per
//! running workload: how much of what is allocated computes, finer than the utilization rate
//! (a single busy kernel on one SM reads 100% utilization, and a few percent SM activity).
//!
//! The unit measured is what GPM samples: a whole GPU, or one MIG instance of a GPU in MIG
//! mode. Units weigh what they hold in GPUs (an instance its compute slices / 7), so a mean
//! over a pool counts a 7g instance seven times a 1g one. A GPU shared by MPS or time slicing
//! is measured whole; each holder's part weighs its share, and no workload figure is given for
//! it (the GPU's activity is all its holders' together). Units that report nothing (no GPM, or
//! the first sample of a new instance) are left out of the mean and counted apart, never taken
//! as idle. The free slices of a GPU in MIG mode hold no instance and are not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tessera_mig::{COMPUTE_SLICES, shape};

use super::utilization::AllocationLabels;
use crate::driver::{GpuRef, Observation, SmActivity};
use crate::store::WorkloadRecord;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct WorkloadLabels {
    pub pool: String,
    pub tenant: String,
    pub workload: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The SM activity families, and the label sets set last so that one that disappears reads 0
/// (pool and tenant) or is removed (a workload that stopped).
#[derive(Default)]
pub struct SmActivityMetrics {
    active: Family<AllocationLabels, FloatGauge>,
    occupancy: Family<AllocationLabels, FloatGauge>,
    reporting: Family<AllocationLabels, FloatGauge>,
    unreported: Family<AllocationLabels, FloatGauge>,
    workload_active: Family<WorkloadLabels, FloatGauge>,
    seen: Mutex<(Vec<AllocationLabels>, Vec<WorkloadLabels>)>,
}

/// Weighted sums of one group's units: `weight` in GPUs.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sums {
    /// Σ weight × SM_UTIL / 100 over the reporting units.
    pub active: f64,
    /// Σ weight × SM_OCCUPANCY / 100 over the reporting units.
    pub occupancy: f64,
    /// GPUs that report.
    pub reporting: f64,
    /// GPUs that do not.
    pub unreported: f64,
}

impl Sums {
    fn add(&mut self, weight: f64, activity: Option<SmActivity>) {
        match activity {
            Some(a) => {
                self.active += weight * a.sm_util_percent / 100.0;
                self.occupancy += weight * a.sm_occupancy_percent / 100.0;
                self.reporting += weight;
            }
            None => self.unreported += weight,
        }
    }

    /// The mean SM activity of the reporting units; `None` when none reports.
    pub fn active_ratio(&self) -> Option<f64> {
        (self.reporting > 0.0).then(|| self.active / self.reporting)
    }

    pub fn occupancy_ratio(&self) -> Option<f64> {
        (self.reporting > 0.0).then(|| self.occupancy / self.reporting)
    }
}

/// What [`groups`] computes: per pool and tenant, and per running workload (its exclusive GPUs
/// and MIG instances).
#[derive(Debug, Default)]
pub struct Groups {
    pub allocations: BTreeMap<AllocationLabels, Sums>,
    pub workloads: BTreeMap<WorkloadLabels, Sums>,
}

/// Who holds a unit: (tenant, workload, the share of the unit held; `None`: all of it).
type Holder<'a> = (&'a str, &'a str, Option<f64>);

pub fn groups(observation: &Observation, records: &[WorkloadRecord]) -> Groups {
    // (GPU, MIG instance start or None for the whole GPU) -> holders.
    let mut holders: BTreeMap<(GpuRef, Option<u8>), Vec<Holder>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.phase.holds_placement()) {
        for b in &r.bindings {
            for &index in &b.gpus {
                let gpu = GpuRef {
                    node: b.node.clone(),
                    index,
                };
                let share = b.share.map(|s| s.as_f64());
                holders
                    .entry((gpu, b.mig_start))
                    .or_default()
                    .push((&r.tenant, &r.name, share));
            }
        }
    }
    let pool_of: BTreeMap<&str, &str> = observation
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.pool.as_str()))
        .collect();
    let mut out = Groups::default();
    for d in &observation.details {
        let Some(&pool) = pool_of.get(d.gpu.node.as_str()) else {
            continue;
        };
        // The units GPM samples: the GPU's instances, or the whole GPU.
        let units: Vec<(Option<u8>, f64, Option<SmActivity>)> = if d.instances.is_empty() {
            vec![(None, 1.0, d.sm_activity)]
        } else {
            d.instances
                .iter()
                .map(|gi| {
                    // A profile the catalog does not know: its size is NVML's to say, and the
                    // observation does not carry it; it is left out rather than guessed.
                    let slices = shape(gi.profile_id).map_or(0, |s| s.compute_slices);
                    let weight = f64::from(slices) / f64::from(COMPUTE_SLICES);
                    (Some(gi.start), weight, gi.sm_activity)
                })
                .filter(|(_, w, _)| *w > 0.0)
                .collect()
        };
        for (start, weight, activity) in units {
            // An instance is held by the workload bound to it, or by one bound to the whole
            // GPU (a whole-GPU shape placed on a GPU laid out as one 7g instance).
            let held = holders
                .get(&(d.gpu.clone(), start))
                .or_else(|| start.and_then(|_| holders.get(&(d.gpu.clone(), None))))
                .map_or(&[][..], Vec::as_slice);
            let mut unheld = weight;
            for &(tenant, workload, share) in held {
                let part = share.map_or(weight, |s| (s * weight).min(unheld));
                unheld -= part;
                let labels = AllocationLabels {
                    pool: pool.to_owned(),
                    tenant: tenant.to_owned(),
                };
                out.allocations
                    .entry(labels)
                    .or_default()
                    .add(part, activity);
                if share.is_none() {
                    let labels = WorkloadLabels {
                        pool: pool.to_owned(),
                        tenant: tenant.to_owned(),
                        workload: workload.to_owned(),
                    };
                    out.workloads
                        .entry(labels)
                        .or_default()
                        .add(weight, activity);
                }
            }
            if unheld > 1e-9 {
                let labels = AllocationLabels {
                    pool: pool.to_owned(),
                    tenant: String::new(),
                };
                out.allocations
                    .entry(labels)
                    .or_default()
                    .add(unheld, activity);
            }
        }
    }
    out
}

impl SmActivityMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "gpu_sm_active_ratio",
            "Mean SM activity (NVML GPM SM_UTIL, 0 to 1) of the GPUs and MIG instances that \
             report it, weighted by GPUs held, per pool and tenant (tenant \"\": unallocated)",
            self.active.clone(),
        );
        registry.register(
            "gpu_sm_occupancy_ratio",
            "Mean SM occupancy (NVML GPM SM_OCCUPANCY, 0 to 1: warps resident over the most \
             the SMs hold) of the GPUs and MIG instances that report it, per pool and tenant",
            self.occupancy.clone(),
        );
        registry.register(
            "gpu_sm_active_reporting_gpus",
            "GPUs (MIG instances by compute slices / 7) whose SM activity the mean covers",
            self.reporting.clone(),
        );
        registry.register(
            "gpu_sm_active_unreported_gpus",
            "GPUs that report no SM activity (no GPM: before Hopper; or not sampled twice yet): \
             left out of the mean",
            self.unreported.clone(),
        );
        registry.register(
            "workload_sm_active_ratio",
            "Mean SM activity (0 to 1) of a running workload's whole GPUs and MIG instances that \
             report it (shared GPUs are not attributed)",
            self.workload_active.clone(),
        );
    }

    /// Replaces the gauges with `observation`'s figures.
    pub fn record(&self, observation: &Observation, records: &[WorkloadRecord]) {
        let g = groups(observation, records);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for old in std::mem::take(&mut seen.0) {
            if !g.allocations.contains_key(&old) {
                for family in [
                    &self.active,
                    &self.occupancy,
                    &self.reporting,
                    &self.unreported,
                ] {
                    family.get_or_create(&old).set(0.0);
                }
            }
        }
        for (labels, sums) in g.allocations {
            self.active
                .get_or_create(&labels)
                .set(sums.active_ratio().unwrap_or(0.0));
            self.occupancy
                .get_or_create(&labels)
                .set(sums.occupancy_ratio().unwrap_or(0.0));
            self.reporting.get_or_create(&labels).set(sums.reporting);
            self.unreported.get_or_create(&labels).set(sums.unreported);
            seen.0.push(labels);
        }
        // A workload's series lives while it runs and reports: workload names are not a
        // bounded set over time, the running workloads are.
        let now: BTreeSet<WorkloadLabels> = g
            .workloads
            .iter()
            .filter_map(|(l, s)| {
                let ratio = s.active_ratio()?;
                self.workload_active.get_or_create(l).set(ratio);
                Some(l.clone())
            })
            .collect();
        for old in std::mem::take(&mut seen.1) {
            if !now.contains(&old) {
                self.workload_active.remove(&old);
            }
        }
        seen.1 = now.into_iter().collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{GpuDetail, GpuInstanceInfo};
    use serde_json::json;

    fn sm(percent: f64) -> Option<SmActivity> {
        SmActivity::checked(percent, percent / 2.0)
    }

    fn instance(
        id: u32,
        profile: &str,
        start: u8,
        activity: Option<SmActivity>,
    ) -> GpuInstanceInfo {
        let model = tessera_mig::builtin_model("H100-SXM5-80GB").unwrap();
        GpuInstanceInfo {
            id,
            profile_id: model.resolve_profile(profile).unwrap(),
            start,
            compute_instances: vec![],
            sm_activity: activity,
        }
    }

    fn detail(
        index: u32,
        instances: Vec<GpuInstanceInfo>,
        activity: Option<SmActivity>,
    ) -> GpuDetail {
        GpuDetail {
            gpu: GpuRef {
                node: "n".into(),
                index,
            },
            instances,
            processes: vec![],
            utilization: None,
            sm_activity: activity,
        }
    }

    fn observation(details: Vec<GpuDetail>) -> Observation {
        let node = serde_json::from_value(json!({
            "name": "n", "pool": "p", "cpu": "8", "memory": "64Gi", "gpus": [],
        }))
        .unwrap();
        Observation {
            nodes: vec![node],
            details,
        }
    }

    fn running(tenant: &str, name: &str, bindings: serde_json::Value) -> WorkloadRecord {
        let store = crate::store::Store::open_in_memory().unwrap();
        let spec = serde_json::from_value(json!({
            "tenant": tenant, "sloClass": "batch", "gpu": {"count": 1},
        }))
        .unwrap();
        store
            .submit(name, &spec, crate::store::Origin::Submitted, 0)
            .unwrap();
        let binding: Vec<tessera_compiler::model::Binding> =
            serde_json::from_value(bindings).unwrap();
        let key = tessera_compiler::WorkloadKey::new(tenant, name);
        store.mark_starting(&key, &binding, 0).unwrap();
        store.mark_running(&key, &[], 0).unwrap()
    }

    fn alloc(tenant: &str) -> AllocationLabels {
        AllocationLabels {
            pool: "p".into(),
            tenant: tenant.into(),
        }
    }

    fn workload(tenant: &str, name: &str) -> WorkloadLabels {
        WorkloadLabels {
            pool: "p".into(),
            tenant: tenant.into(),
            workload: name.into(),
        }
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    /// Whole GPUs, MIG instances by their slices, shares by their fraction, and units that
    /// report nothing counted apart.
    #[test]
    fn units_weigh_what_they_hold_and_silence_is_not_idleness() {
        let o = observation(vec![
            // GPU 0: tenant a's whole GPU at 80%.
            detail(0, vec![], sm(80.0)),
            // GPU 1: MIG, a 4g instance of b at 50% and a 3g instance of a reporting nothing.
            detail(
                1,
                vec![
                    instance(1, "4g.40gb", 0, sm(50.0)),
                    instance(2, "3g.40gb", 4, None),
                ],
                sm(99.0),
            ),
            // GPU 2: shared, a quarter each to a and b, half free, at 40% as a whole.
            detail(2, vec![], sm(40.0)),
            // GPU 3: free and without GPM.
            detail(3, vec![], None),
            // GPU 4: one 7g instance, held by a whole-GPU binding of b, at 20%.
            detail(4, vec![instance(1, "7g.80gb", 0, sm(20.0))], sm(20.0)),
        ]);
        let records = [
            running("a", "whole", json!([{"node": "n", "gpus": [0]}])),
            running(
                "b",
                "mig",
                json!([{"node": "n", "gpus": [1], "migStart": 0}]),
            ),
            running(
                "a",
                "mig3",
                json!([{"node": "n", "gpus": [1], "migStart": 4}]),
            ),
            running(
                "a",
                "s1",
                json!([{"node": "n", "gpus": [2], "share": 0.25}]),
            ),
            running(
                "b",
                "s2",
                json!([{"node": "n", "gpus": [2], "share": 0.25}]),
            ),
            running("b", "whole7g", json!([{"node": "n", "gpus": [4]}])),
        ];
        let g = groups(&o, &records);
        let a = &g.allocations[&alloc("a")];
        // a: GPU 0 (1 GPU at 0.8) and a quarter of GPU 2 (at 0.4) report; 3/7 of GPU 1 not.
        assert!((a.reporting - 1.25).abs() < 1e-9, "{a:?}");
        assert!((a.unreported - 3.0 / 7.0).abs() < 1e-9, "{a:?}");
        assert!(close(a.active_ratio(), (0.8 + 0.25 * 0.4) / 1.25), "{a:?}");
        assert!(
            close(a.occupancy_ratio(), (0.4 + 0.25 * 0.2) / 1.25),
            "{a:?}"
        );
        let b = &g.allocations[&alloc("b")];
        assert!(
            (b.reporting - (4.0 / 7.0 + 0.25 + 1.0)).abs() < 1e-9,
            "{b:?}"
        );
        assert!(close(
            b.active_ratio(),
            (4.0 / 7.0 * 0.5 + 0.25 * 0.4 + 0.2) / (4.0 / 7.0 + 0.25 + 1.0)
        ));
        assert!(close(
            g.workloads[&workload("b", "whole7g")].active_ratio(),
            0.2
        ));
        // Unallocated: half of GPU 2 reports, GPU 3 does not.
        let free = &g.allocations[&alloc("")];
        assert!((free.reporting - 0.5).abs() < 1e-9, "{free:?}");
        assert!((free.unreported - 1.0).abs() < 1e-9, "{free:?}");
        // Workloads: exclusive units only; one reporting nothing has no figure.
        assert!(close(
            g.workloads[&workload("a", "whole")].active_ratio(),
            0.8
        ));
        assert!(close(
            g.workloads[&workload("b", "mig")].active_ratio(),
            0.5
        ));
        assert_eq!(g.workloads[&workload("a", "mig3")].active_ratio(), None);
        assert!(!g.workloads.contains_key(&workload("a", "s1")));
        // Every unit is counted once, in GPUs.
        let total: f64 = g
            .allocations
            .values()
            .map(|s| s.reporting + s.unreported)
            .sum();
        assert!((total - 5.0).abs() < 1e-9, "{total}");
    }

    /// A workload that stops has no series left; a pool and tenant that empties reads 0.
    #[test]
    fn a_stopped_workloads_series_is_removed() {
        let m = SmActivityMetrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let o = observation(vec![detail(0, vec![], sm(60.0))]);
        let records = [running("a", "w", json!([{"node": "n", "gpus": [0]}]))];
        m.record(&o, &records);
        let text = |r: &Registry| {
            let mut s = String::new();
            prometheus_client::encoding::text::encode(&mut s, r).unwrap();
            s
        };
        let before = text(&registry);
        assert!(
            before.contains("workload_sm_active_ratio{pool=\"p\",tenant=\"a\",workload=\"w\"} 0.6"),
            "{before}"
        );
        m.record(&o, &[]);
        let after = text(&registry);
        assert!(!after.contains("workload=\"w\""), "{after}");
        assert!(
            after.contains("gpu_sm_active_ratio{pool=\"p\",tenant=\"a\"} 0.0"),
            "{after}"
        );
        assert!(
            after.contains("gpu_sm_active_ratio{pool=\"p\",tenant=\"\"} 0.6"),
            "{after}"
        );
    }
}
