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

use std::borrow::Borrow;
#[cfg(test)]
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tessera_mig::{COMPUTE_SLICES, shape};

use super::placements::Placements;
use super::utilization::AllocationLabels;
#[cfg(test)]
use crate::driver::GpuRef;
use crate::driver::{GpuDetail, Observation, SmActivity};
use crate::store::WorkloadRecord;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct WorkloadLabels {
    pub pool: String,
    pub tenant: String,
    pub workload: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The SM activity families, and the series the last cycle set in them, so that one that
/// disappears reads 0 (pool and tenant) or is removed (a workload that stopped).
#[derive(Default)]
pub struct SmActivityMetrics {
    active: Family<AllocationLabels, FloatGauge>,
    occupancy: Family<AllocationLabels, FloatGauge>,
    reporting: Family<AllocationLabels, FloatGauge>,
    unreported: Family<AllocationLabels, FloatGauge>,
    workload_active: Family<WorkloadLabels, FloatGauge>,
    kept: Mutex<Kept>,
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

/// The units GPM samples on one GPU, in the order their figures are summed: the GPU's
/// instances (each with its start and its weight in GPUs), or the whole GPU.
fn units(d: &GpuDetail) -> impl Iterator<Item = (Option<u8>, f64, Option<SmActivity>)> + '_ {
    let whole = d.instances.is_empty().then_some((None, 1.0, d.sm_activity));
    let instances = d.instances.iter().map(|gi| {
        // A profile the catalog does not know: its size is NVML's to say, and the observation
        // does not carry it; it is left out rather than guessed.
        let slices = shape(gi.profile_id).map_or(0, |s| s.compute_slices);
        let weight = f64::from(slices) / f64::from(COMPUTE_SLICES);
        (Some(gi.start), weight, gi.sm_activity)
    });
    whole
        .into_iter()
        .chain(instances.filter(|(_, w, _)| *w > 0.0))
}

/// The figures per pool and tenant and per running workload, computed from scratch by
/// ordered maps: what [`SmActivityMetrics::record`] must agree with, which its tests check.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct Groups {
    pub allocations: BTreeMap<AllocationLabels, Sums>,
    pub workloads: BTreeMap<WorkloadLabels, Sums>,
}

/// Who holds a unit: (tenant, workload, the share of the unit held; `None`: all of it).
#[cfg(test)]
type Holder<'a> = (&'a str, &'a str, Option<f64>);

#[cfg(test)]
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
        for (start, weight, activity) in units(d) {
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

/// What the families hold, kept between cycles with each series' label set and gauges, made
/// once when the series appears: a cycle finds its series by borrowed names, sums into them
/// and sets their gauges, and goes to a family only for a series that appears or goes. At
/// 50,000 GPUs some 64,000 workloads run, and making, ordering and looking up their label
/// sets at every cycle was most of the cost of a cycle's metrics.
#[derive(Default)]
struct Kept {
    /// Counts cycles: a row that the current cycle has not touched is of a series gone.
    cycle: u64,
    /// Per pool and tenant: active, occupancy, reporting, unreported.
    allocations: Table<AllocationLabels, [FloatGauge; 4]>,
    workloads: Table<WorkloadLabels, FloatGauge>,
}

/// Series by label set: each a row, found by its names without making a label set.
struct Table<L, G> {
    index: HashMap<Keyed<L>, u32>,
    /// By slot; `None` where a series went and its slot waits in `free` for another.
    rows: Vec<Option<Row<L, G>>>,
    free: Vec<u32>,
}

struct Row<L, G> {
    /// Shared with the index's key: a series' label set is made once.
    labels: Arc<L>,
    /// The series' gauges in the families; `None` while it has none (it has just appeared, or
    /// it is a workload that reports nothing).
    gauges: Option<G>,
    /// This cycle's sums, once `cycle` is the current one.
    sums: Sums,
    cycle: u64,
}

impl<L, G> Default for Table<L, G> {
    fn default() -> Self {
        Table {
            index: HashMap::new(),
            rows: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<L: Names + 'static, G> Table<L, G> {
    /// The slot of the series named `names`, made the first time it is seen (its label set by
    /// `labels`), with sums that start over when a cycle first touches it.
    fn touch(&mut self, names: Key<'_>, cycle: u64, labels: impl FnOnce() -> L) -> u32 {
        let slot = match self.index.get(&names as &dyn Names) {
            Some(&slot) => slot,
            None => {
                let labels = Arc::new(labels());
                let row = Row {
                    labels: labels.clone(),
                    gauges: None,
                    sums: Sums::default(),
                    cycle,
                };
                let slot = match self.free.pop() {
                    Some(slot) => {
                        self.rows[slot as usize] = Some(row);
                        slot
                    }
                    None => {
                        self.rows.push(Some(row));
                        u32::try_from(self.rows.len() - 1).expect("fewer than 2³² series")
                    }
                };
                self.index.insert(Keyed(labels), slot);
                slot
            }
        };
        let row = self.row(slot);
        if row.cycle != cycle {
            row.cycle = cycle;
            row.sums = Sums::default();
        }
        slot
    }

    fn row(&mut self, slot: u32) -> &mut Row<L, G> {
        self.rows[slot as usize]
            .as_mut()
            .expect("the index names live rows only")
    }

    /// Visits every row; those `keep` refuses are forgotten.
    fn retain(&mut self, mut keep: impl FnMut(&mut Row<L, G>) -> bool) {
        for (slot, entry) in self.rows.iter_mut().enumerate() {
            let Some(row) = entry else {
                continue;
            };
            if !keep(row) {
                self.index.remove(&*row.labels as &dyn Names);
                *entry = None;
                self.free.push(slot as u32);
            }
        }
    }
}

/// A series' names: pool, tenant and workload (`""` for a pool and tenant).
type Key<'a> = (&'a str, &'a str, &'a str);

/// A label set seen as its names, so that [`Table`]'s index is looked up with borrowed
/// strings.
trait Names {
    fn names(&self) -> Key<'_>;
}

impl Names for Key<'_> {
    fn names(&self) -> Key<'_> {
        *self
    }
}

impl Names for AllocationLabels {
    fn names(&self) -> Key<'_> {
        (&self.pool, &self.tenant, "")
    }
}

impl Names for WorkloadLabels {
    fn names(&self) -> Key<'_> {
        (&self.pool, &self.tenant, &self.workload)
    }
}

impl Hash for dyn Names + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.names().hash(state);
    }
}

impl PartialEq for dyn Names + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.names() == other.names()
    }
}

impl Eq for dyn Names + '_ {}

/// A kept label set as [`Table`]'s index holds it: hashed and compared as its names, as the
/// borrowed names it is looked up by are.
struct Keyed<L>(Arc<L>);

impl<L: Names> Hash for Keyed<L> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.names().hash(state);
    }
}

impl<L: Names> PartialEq for Keyed<L> {
    fn eq(&self, other: &Self) -> bool {
        self.0.names() == other.0.names()
    }
}

impl<L: Names> Eq for Keyed<L> {}

impl<'a, L: Names + 'a> Borrow<dyn Names + 'a> for Keyed<L> {
    fn borrow(&self) -> &(dyn Names + 'a) {
        &*self.0
    }
}

/// A record's rows, found once a cycle for the pool they are in.
#[derive(Clone, Copy)]
struct RecordRows {
    pool: u32,
    allocation: u32,
    /// `NONE` until a whole unit of the record is summed.
    workload: u32,
}

const NONE: u32 = u32::MAX;

impl Kept {
    /// Sums this cycle's units into the rows of their pools, tenants and workloads, as
    /// `groups` (the tests' reference) does: units in the observation's order, each unit's
    /// holders in the records'.
    fn sum(
        &mut self,
        observation: &Observation,
        records: &[WorkloadRecord],
        placements: &Placements,
    ) {
        let cycle = self.cycle;
        let mut rows = vec![
            RecordRows {
                pool: NONE,
                allocation: NONE,
                workload: NONE,
            };
            records.len()
        ];
        let mut unallocated = vec![NONE; placements.pools.len()];
        for (i, d) in observation.details.iter().enumerate() {
            let Some((pool, holders)) = placements.gpu(i) else {
                continue;
            };
            let name = placements.pools[pool as usize];
            for (start, weight, activity) in units(d) {
                // An instance is held by the workload bound to it, or by one bound to the
                // whole GPU (a whole-GPU shape placed on a GPU laid out as one 7g instance).
                let start = if holders.iter().any(|h| h.start == start) {
                    start
                } else {
                    None
                };
                let mut unheld = weight;
                for h in holders.iter().filter(|h| h.start == start) {
                    let part = h.share.map_or(weight, |s| (s * weight).min(unheld));
                    unheld -= part;
                    let r = &records[h.record as usize];
                    let at = &mut rows[h.record as usize];
                    if at.pool != pool {
                        let allocation =
                            self.allocations.touch((name, &r.tenant, ""), cycle, || {
                                AllocationLabels {
                                    pool: name.to_owned(),
                                    tenant: r.tenant.clone(),
                                }
                            });
                        *at = RecordRows {
                            pool,
                            allocation,
                            workload: NONE,
                        };
                    }
                    self.allocations.row(at.allocation).sums.add(part, activity);
                    if h.share.is_none() {
                        if at.workload == NONE {
                            at.workload =
                                self.workloads.touch((name, &r.tenant, &r.name), cycle, || {
                                    WorkloadLabels {
                                        pool: name.to_owned(),
                                        tenant: r.tenant.clone(),
                                        workload: r.name.clone(),
                                    }
                                });
                        }
                        self.workloads.row(at.workload).sums.add(weight, activity);
                    }
                }
                if unheld > 1e-9 {
                    let at = &mut unallocated[pool as usize];
                    if *at == NONE {
                        *at = self
                            .allocations
                            .touch((name, "", ""), cycle, || AllocationLabels {
                                pool: name.to_owned(),
                                tenant: String::new(),
                            });
                    }
                    self.allocations.row(*at).sums.add(unheld, activity);
                }
            }
        }
    }
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

    /// Replaces the gauges with `observation`'s figures (`placements` are its GPUs' holders
    /// among `records`).
    pub fn record(
        &self,
        observation: &Observation,
        records: &[WorkloadRecord],
        placements: &Placements,
    ) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.cycle += 1;
        let cycle = kept.cycle;
        kept.sum(observation, records, placements);
        let families = [
            &self.active,
            &self.occupancy,
            &self.reporting,
            &self.unreported,
        ];
        // A pool and tenant gone reads 0 once, and is then forgotten until it comes back.
        kept.allocations.retain(|row| {
            let now = row.cycle == cycle;
            let s = &row.sums;
            let figures = if now {
                [
                    s.active_ratio().unwrap_or(0.0),
                    s.occupancy_ratio().unwrap_or(0.0),
                    s.reporting,
                    s.unreported,
                ]
            } else {
                [0.0; 4]
            };
            let gauges = row
                .gauges
                .get_or_insert_with(|| families.map(|f| f.get_or_create_owned(&*row.labels)));
            for (gauge, figure) in gauges.iter().zip(figures) {
                gauge.set(figure);
            }
            now
        });
        // A workload's series lives while it runs and reports: workload names are not a
        // bounded set over time, the running workloads are.
        kept.workloads.retain(|row| {
            let now = row.cycle == cycle;
            match (now.then(|| row.sums.active_ratio()).flatten(), &row.gauges) {
                (Some(ratio), Some(gauge)) => {
                    gauge.set(ratio);
                }
                (Some(ratio), None) => {
                    let gauge = self.workload_active.get_or_create_owned(&*row.labels);
                    gauge.set(ratio);
                    row.gauges = Some(gauge);
                }
                (None, Some(_)) => {
                    self.workload_active.remove(&*row.labels);
                    row.gauges = None;
                }
                (None, None) => {}
            }
            now
        });
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::driver::{GpuInstanceInfo, GpuRef};

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

        // Through the kept series, the exposition recording from scratch gives.
        let (m, scratch) = (SmActivityMetrics::default(), SmActivityMetrics::default());
        let mut seen = Seen::default();
        record(&m, &o, &records);
        from_scratch(&scratch, &mut seen, &o, &records);
        assert_eq!(exposition(&m), exposition(&scratch));
    }

    fn record(m: &SmActivityMetrics, observation: &Observation, records: &[WorkloadRecord]) {
        m.record(observation, records, &Placements::new(observation, records));
    }

    /// The label sets set last, as recording each cycle from scratch remembers them.
    #[derive(Default)]
    struct Seen {
        allocations: Vec<AllocationLabels>,
        workloads: Vec<WorkloadLabels>,
    }

    /// Sets `m`'s families as recording from scratch did before label sets were kept: every
    /// figure from [`groups`], the pools and tenants seen last and gone set to 0, the
    /// workloads seen last and gone (or silent) removed.
    fn from_scratch(
        m: &SmActivityMetrics,
        seen: &mut Seen,
        observation: &Observation,
        records: &[WorkloadRecord],
    ) {
        let g = groups(observation, records);
        for old in std::mem::take(&mut seen.allocations) {
            if !g.allocations.contains_key(&old) {
                for family in [&m.active, &m.occupancy, &m.reporting, &m.unreported] {
                    family.get_or_create(&old).set(0.0);
                }
            }
        }
        for (labels, sums) in g.allocations {
            m.active
                .get_or_create(&labels)
                .set(sums.active_ratio().unwrap_or(0.0));
            m.occupancy
                .get_or_create(&labels)
                .set(sums.occupancy_ratio().unwrap_or(0.0));
            m.reporting.get_or_create(&labels).set(sums.reporting);
            m.unreported.get_or_create(&labels).set(sums.unreported);
            seen.allocations.push(labels);
        }
        let now: Vec<WorkloadLabels> = g
            .workloads
            .iter()
            .filter_map(|(l, s)| {
                let ratio = s.active_ratio()?;
                m.workload_active.get_or_create(l).set(ratio);
                Some(l.clone())
            })
            .collect();
        for old in std::mem::take(&mut seen.workloads) {
            if !now.contains(&old) {
                m.workload_active.remove(&old);
            }
        }
        seen.workloads = now;
    }

    /// The OpenMetrics text of `m`'s families, each family's series sorted: a family lists
    /// them in its hash map's order, which its hasher's random keys decide.
    fn exposition(m: &SmActivityMetrics) -> Vec<String> {
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let (mut out, mut family) = (Vec::new(), Vec::new());
        for line in text.lines() {
            if line.starts_with('#') {
                family.sort();
                out.append(&mut family);
                out.push(line.to_owned());
            } else {
                family.push(line.to_owned());
            }
        }
        family.sort();
        out.append(&mut family);
        out
    }

    fn has(text: &[String], line: &str) -> bool {
        text.iter().any(|l| l == line)
    }

    fn mentions(text: &[String], part: &str) -> bool {
        text.iter().any(|l| l.contains(part))
    }

    /// A workload's series appears when it first reports, follows its figure, and goes when
    /// it stops, goes silent or moves to another pool (coming back as a new series); a pool
    /// and tenant left empty reads 0 and comes back with its figures.
    #[test]
    fn series_appear_change_and_go_across_cycles() {
        let m = SmActivityMetrics::default();
        let w = running("a", "w", json!([{"node": "n", "gpus": [0]}]));
        let x = running("a", "x", json!([{"node": "n", "gpus": [1]}]));
        let y = running("b", "y", json!([{"node": "n", "gpus": [1]}]));
        let gpus = |a: Option<SmActivity>, b: Option<SmActivity>| {
            observation(vec![detail(0, vec![], a), detail(1, vec![], b)])
        };
        let series = |pool: &str, tenant: &str, name: &str, ratio: &str| {
            format!(
                "workload_sm_active_ratio{{pool=\"{pool}\",tenant=\"{tenant}\",\
                 workload=\"{name}\"}} {ratio}"
            )
        };
        let group = |pool: &str, tenant: &str, ratio: &str| {
            format!("gpu_sm_active_ratio{{pool=\"{pool}\",tenant=\"{tenant}\"}} {ratio}")
        };

        record(&m, &gpus(sm(75.0), sm(25.0)), &[w.clone(), x.clone()]);
        let t = exposition(&m);
        assert!(has(&t, &series("p", "a", "w", "0.75")), "{t:#?}");
        assert!(has(&t, &series("p", "a", "x", "0.25")), "{t:#?}");
        assert!(has(&t, &group("p", "a", "0.5")), "{t:#?}");

        // w's figure changes; x stops and y starts on its GPU.
        record(&m, &gpus(sm(25.0), sm(25.0)), &[w.clone(), y.clone()]);
        let t = exposition(&m);
        assert!(has(&t, &series("p", "a", "w", "0.25")), "{t:#?}");
        assert!(!mentions(&t, "workload=\"x\""), "{t:#?}");
        assert!(has(&t, &series("p", "b", "y", "0.25")), "{t:#?}");
        assert!(has(&t, &group("p", "a", "0.25")), "{t:#?}");

        // w stops: a holds nothing and reads 0; its GPU is unallocated.
        record(&m, &gpus(sm(25.0), sm(25.0)), std::slice::from_ref(&y));
        let t = exposition(&m);
        assert!(!mentions(&t, "workload=\"w\""), "{t:#?}");
        assert!(has(&t, &group("p", "a", "0.0")), "{t:#?}");
        assert!(has(&t, &group("p", "", "0.25")), "{t:#?}");

        // w comes back on a GPU that reports nothing: it runs, with no figure.
        record(&m, &gpus(None, sm(25.0)), &[w.clone(), y.clone()]);
        let t = exposition(&m);
        assert!(!mentions(&t, "workload=\"w\""), "{t:#?}");
        assert!(
            has(
                &t,
                "gpu_sm_active_unreported_gpus{pool=\"p\",tenant=\"a\"} 1.0"
            ),
            "{t:#?}"
        );
        assert!(has(&t, &group("p", "", "0.0")), "{t:#?}");

        // Its GPU reports again: the series is back.
        record(&m, &gpus(sm(50.0), sm(25.0)), &[w.clone(), y.clone()]);
        let t = exposition(&m);
        assert!(has(&t, &series("p", "a", "w", "0.5")), "{t:#?}");
        assert!(has(&t, &group("p", "a", "0.5")), "{t:#?}");

        // The node moves to pool q: the workloads' series of pool p go, its groups read 0.
        let mut moved = gpus(sm(50.0), sm(25.0));
        moved.nodes[0].pool = "q".into();
        record(&m, &moved, &[w, y]);
        let t = exposition(&m);
        assert!(has(&t, &series("q", "a", "w", "0.5")), "{t:#?}");
        assert!(has(&t, &series("q", "b", "y", "0.25")), "{t:#?}");
        assert!(!mentions(&t, "pool=\"p\",tenant=\"a\",workload"), "{t:#?}");
        assert!(!mentions(&t, "pool=\"p\",tenant=\"b\",workload"), "{t:#?}");
        assert!(has(&t, &group("p", "a", "0.0")), "{t:#?}");
        assert!(has(&t, &group("p", "b", "0.0")), "{t:#?}");
        assert!(has(&t, &group("q", "a", "0.5")), "{t:#?}");
    }

    /// One cycle of a small fleet: pool `p`'s node `n` (GPUs 0 and 1), node `m` (GPUs 0 and
    /// 1) in `p` or `q`, and GPU 0 of a node `o` the observation may not know.
    #[derive(Clone, Debug)]
    struct Cycle {
        /// Per GPU: 0 whole, 1 MIG 4g+3g, 2 MIG 7g, 3 MIG 1g+1g+2g+3g.
        layouts: [u8; 4],
        /// Per GPU: the activity of each unit, in order.
        activity: [[Option<u8>; 4]; 4],
        m_in_q: bool,
        o_known: bool,
        /// Per workload: how it is bound (see `binding`) and to which GPU.
        workloads: [Option<(u8, u8)>; 6],
    }

    fn cycle() -> impl Strategy<Value = Cycle> {
        let percent = prop::option::of(prop::sample::select(vec![0u8, 30, 55, 100]));
        (
            prop::array::uniform4(0u8..4),
            prop::array::uniform4(prop::array::uniform4(percent)),
            any::<bool>(),
            any::<bool>(),
            prop::array::uniform6(prop::option::of((0u8..7, 0u8..5))),
        )
            .prop_map(|(layouts, activity, m_in_q, o_known, workloads)| Cycle {
                layouts,
                activity,
                m_in_q,
                o_known,
                workloads,
            })
    }

    impl Cycle {
        fn observation(&self) -> Observation {
            let node = |name: &str, pool: &str| -> tessera_compiler::model::Node {
                serde_json::from_value(json!({
                    "name": name, "pool": pool, "cpu": "8", "memory": "64Gi", "gpus": [],
                }))
                .unwrap()
            };
            let mut nodes = vec![
                node("n", "p"),
                node("m", if self.m_in_q { "q" } else { "p" }),
            ];
            if self.o_known {
                nodes.push(node("o", "p"));
            }
            let layouts: [&[(&str, u8)]; 4] = [
                &[],
                &[("4g.40gb", 0), ("3g.40gb", 4)],
                &[("7g.80gb", 0)],
                &[
                    ("1g.10gb", 0),
                    ("1g.10gb", 1),
                    ("2g.20gb", 2),
                    ("3g.40gb", 4),
                ],
            ];
            let mut details = Vec::new();
            for (k, (node, index)) in [("n", 0), ("n", 1), ("m", 0), ("m", 1), ("o", 0)]
                .into_iter()
                .enumerate()
            {
                let k = k % 4;
                let percent = |unit: usize| self.activity[k][unit].and_then(|p| sm(f64::from(p)));
                let instances = layouts[usize::from(self.layouts[k])]
                    .iter()
                    .enumerate()
                    .map(|(i, &(profile, start))| instance(i as u32, profile, start, percent(i)))
                    .collect();
                let mut d = detail(index, instances, percent(3));
                d.gpu.node = node.into();
                details.push(d);
            }
            Observation { nodes, details }
        }

        fn records(&self, template: &WorkloadRecord) -> Vec<WorkloadRecord> {
            let gpus = [("n", 0), ("n", 1), ("m", 0), ("m", 1), ("o", 0)];
            let tenants = ["a", "a", "a", "b", "b", "c"];
            let mut out = Vec::new();
            for (i, w) in self.workloads.iter().enumerate() {
                let Some((how, gpu)) = *w else {
                    continue;
                };
                let (node, index) = gpus[usize::from(gpu)];
                let mut r = template.clone();
                r.tenant = tenants[i].into();
                r.name = format!("w{i}");
                r.bindings = serde_json::from_value(match how {
                    0 => json!([{"node": node, "gpus": [index]}]),
                    1 => json!([{"node": node, "gpus": [index], "migStart": 0}]),
                    2 => json!([{"node": node, "gpus": [index], "migStart": 4}]),
                    3 => json!([{"node": node, "gpus": [index], "share": 0.25}]),
                    4 => json!([{"node": node, "gpus": [index], "share": 0.5}]),
                    // Two GPUs, on the node and on another one.
                    _ => json!([{"node": node, "gpus": [0, 1]}, {"node": "m", "gpus": [1]}]),
                })
                .unwrap();
                if how == 6 {
                    r.phase = crate::store::Phase::Pending;
                }
                out.push(r);
            }
            out
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Recording cycle after cycle, with the label sets and gauges kept between cycles,
        /// exposes after every cycle exactly what recording each cycle from scratch does:
        /// series appearing, changing, going silent, moving pools and disappearing.
        #[test]
        fn kept_series_expose_what_recording_from_scratch_does(
            cycles in prop::collection::vec(cycle(), 1..10)
        ) {
            let template = running("a", "w", json!([{"node": "n", "gpus": [0]}]));
            let (m, scratch) = (SmActivityMetrics::default(), SmActivityMetrics::default());
            let mut seen = Seen::default();
            for c in &cycles {
                let (o, records) = (c.observation(), c.records(&template));
                record(&m, &o, &records);
                from_scratch(&scratch, &mut seen, &o, &records);
                prop_assert_eq!(exposition(&m), exposition(&scratch));
            }
        }
    }
}
