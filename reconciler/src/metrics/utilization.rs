//! Hardware utilization of allocated GPUs, per pool and tenant: how busy what is allocated
//! really is, and which allocated GPUs have sat idle (the "zombie" jobs that hold GPUs and do
//! nothing).
//!
//! The figure is NVML's utilization rate (the share of time a kernel ran), read by the driver
//! for every GPU that reports it. A GPU that does not (one in MIG mode, a driver without the
//! counters) is left out of the mean and counted apart, never taken as idle.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::placements::Placements;
use crate::driver::{GpuRef, Observation};
use crate::store::WorkloadRecord;

/// Below this utilization (percent) an allocated GPU counts as idle.
pub const IDLE_BELOW_PERCENT: u32 = 5;
/// An allocated GPU idle for this long (seconds) is reported as idle.
pub const IDLE_WINDOW_SECONDS: i64 = 30 * 60;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct AllocationLabels {
    pub pool: String,
    /// The tenant the GPU is allocated to; `""` for GPUs allocated to no one.
    pub tenant: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The utilization families and what they need to remember between cycles.
#[derive(Default)]
pub struct UtilizationMetrics {
    ratio: Family<AllocationLabels, FloatGauge>,
    reporting: Family<AllocationLabels, Gauge>,
    not_reporting: Family<AllocationLabels, Gauge>,
    idle: Family<AllocationLabels, Gauge>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Per GPU: the tenant holding it and since when it has been under the threshold.
    idle_since: BTreeMap<GpuRef, (String, i64)>,
    seen: Vec<AllocationLabels>,
}

/// Per pool and tenant: the sum of utilization percentages and the GPUs reporting one, the
/// GPUs not reporting, and the GPUs idle for the window.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Group {
    pub percent_sum: u64,
    pub reporting: i64,
    pub not_reporting: i64,
    pub idle: i64,
}

impl UtilizationMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "gpu_utilization_ratio",
            "Mean NVML utilization (share of time a kernel ran, 0 to 1) of the allocated GPUs \
             that report it, per pool and tenant (tenant \"\": unallocated GPUs)",
            self.ratio.clone(),
        );
        registry.register(
            "gpu_utilization_reporting_gpus",
            "GPUs whose utilization the mean covers",
            self.reporting.clone(),
        );
        registry.register(
            "gpu_utilization_unreported_gpus",
            "GPUs that report no utilization (MIG mode, or no counters): left out of the mean",
            self.not_reporting.clone(),
        );
        registry.register(
            "idle_allocated_gpus",
            "Allocated GPUs under 5% utilization for at least 30 minutes",
            self.idle.clone(),
        );
    }

    /// Replaces the gauges with `observation`'s figures, at `now` (`placements` are its GPUs'
    /// holders among `records`).
    pub fn record(
        &self,
        observation: &Observation,
        records: &[WorkloadRecord],
        placements: &Placements,
        now: i64,
    ) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let groups = groups(observation, records, placements, now, &mut state.idle_since);
        for old in std::mem::take(&mut state.seen) {
            if !groups.contains_key(&old) {
                self.ratio.get_or_create(&old).set(0.0);
                self.reporting.get_or_create(&old).set(0);
                self.not_reporting.get_or_create(&old).set(0);
                self.idle.get_or_create(&old).set(0);
            }
        }
        for (labels, g) in groups {
            let ratio = if g.reporting > 0 {
                g.percent_sum as f64 / (100.0 * g.reporting as f64)
            } else {
                0.0
            };
            self.ratio.get_or_create(&labels).set(ratio);
            self.reporting.get_or_create(&labels).set(g.reporting);
            self.not_reporting
                .get_or_create(&labels)
                .set(g.not_reporting);
            self.idle.get_or_create(&labels).set(g.idle);
            state.seen.push(labels);
        }
    }
}

/// The figures per pool and tenant (`placements` are the observation's GPUs' holders among
/// `records`). `idle_since` carries, per allocated GPU under the threshold, since when (and
/// for which tenant: a GPU handed to another tenant starts over).
pub fn groups(
    observation: &Observation,
    records: &[WorkloadRecord],
    placements: &Placements,
    now: i64,
    idle_since: &mut BTreeMap<GpuRef, (String, i64)>,
) -> BTreeMap<AllocationLabels, Group> {
    let mut out: HashMap<(&str, &str), Group> = HashMap::new();
    let mut still_idle = BTreeMap::new();
    for (i, d) in observation.details.iter().enumerate() {
        let Some((pool, holders)) = placements.gpu(i) else {
            continue;
        };
        let pool = placements.pools[pool as usize];
        // A GPU bound by several records is the last one's.
        let tenant = holders
            .last()
            .map_or("", |h| records[h.record as usize].tenant.as_str());
        let g = out.entry((pool, tenant)).or_default();
        let Some(u) = d.utilization else {
            g.not_reporting += 1;
            continue;
        };
        g.reporting += 1;
        g.percent_sum += u64::from(u.gpu_percent);
        if tenant.is_empty() || u.gpu_percent >= IDLE_BELOW_PERCENT {
            continue;
        }
        let since = match idle_since.get(&d.gpu) {
            Some((t, since)) if t == tenant => *since,
            _ => now,
        };
        if now - since >= IDLE_WINDOW_SECONDS {
            g.idle += 1;
        }
        still_idle.insert(d.gpu.clone(), (tenant.to_owned(), since));
    }
    *idle_since = still_idle;
    out.into_iter()
        .map(|((pool, tenant), g)| {
            let labels = AllocationLabels {
                pool: pool.to_owned(),
                tenant: tenant.to_owned(),
            };
            (labels, g)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{GpuDetail, GpuUtilization};
    use serde_json::json;

    fn observation(percent: &[Option<u32>]) -> Observation {
        let node = serde_json::from_value(json!({
            "name": "n", "pool": "p", "cpu": "8", "memory": "64Gi", "gpus": [],
        }))
        .unwrap();
        Observation {
            nodes: vec![node],
            details: percent
                .iter()
                .enumerate()
                .map(|(i, p)| GpuDetail {
                    gpu: GpuRef {
                        node: "n".into(),
                        index: i as u32,
                    },
                    instances: vec![],
                    processes: vec![],
                    utilization: p.map(|p| GpuUtilization {
                        gpu_percent: p,
                        memory_percent: 0,
                    }),
                    sm_activity: None,
                })
                .collect(),
        }
    }

    fn running(tenant: &str, gpus: &[u32]) -> WorkloadRecord {
        let store = crate::store::Store::open_in_memory().unwrap();
        let spec = serde_json::from_value(json!({
            "tenant": tenant, "sloClass": "batch", "gpu": {"count": gpus.len()},
        }))
        .unwrap();
        store
            .submit("w", &spec, crate::store::Origin::Submitted, 0)
            .unwrap();
        let binding: Vec<tessera_compiler::model::Binding> =
            serde_json::from_value(json!([{"node": "n", "gpus": gpus}])).unwrap();
        let key = tessera_compiler::WorkloadKey::new(tenant, "w");
        store.mark_starting(&key, &binding, 0).unwrap();
        store.mark_running(&key, &[], 0).unwrap()
    }

    #[test]
    fn an_allocated_gpu_is_idle_only_after_the_whole_window_under_the_threshold() {
        let records = [running("a", &[0, 1])];
        let mut since = BTreeMap::new();
        let key = AllocationLabels {
            pool: "p".into(),
            tenant: "a".into(),
        };
        // GPU 0 idle, GPU 1 busy, GPU 2 unallocated and idle, GPU 3 reports nothing.
        let o = observation(&[Some(1), Some(90), Some(0), None]);
        let g = groups(&o, &records, &Placements::new(&o, &records), 0, &mut since);
        assert_eq!(
            g[&key],
            Group {
                percent_sum: 91,
                reporting: 2,
                not_reporting: 0,
                idle: 0
            }
        );
        let free = AllocationLabels {
            pool: "p".into(),
            tenant: String::new(),
        };
        assert_eq!(
            (g[&free].reporting, g[&free].not_reporting, g[&free].idle),
            (1, 1, 0)
        );
        let g = groups(
            &o,
            &records,
            &Placements::new(&o, &records),
            IDLE_WINDOW_SECONDS - 1,
            &mut since,
        );
        assert_eq!(g[&key].idle, 0);
        let g = groups(
            &o,
            &records,
            &Placements::new(&o, &records),
            IDLE_WINDOW_SECONDS,
            &mut since,
        );
        assert_eq!(g[&key].idle, 1);
        // One busy sample starts the window over.
        let busy = observation(&[Some(50), Some(90), Some(0), None]);
        groups(
            &busy,
            &records,
            &Placements::new(&busy, &records),
            IDLE_WINDOW_SECONDS + 1,
            &mut since,
        );
        let g = groups(
            &o,
            &records,
            &Placements::new(&o, &records),
            IDLE_WINDOW_SECONDS + 2,
            &mut since,
        );
        assert_eq!(g[&key].idle, 0);
    }

    /// A GPU bound by two records is the last one's; a GPU of a node the observation does not
    /// list is left out; a pool and tenant left empty reads 0 while its GPU counts as
    /// unallocated.
    #[test]
    fn a_tenant_that_leaves_reads_0_and_its_gpus_are_unallocated() {
        let m = UtilizationMetrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let text = || {
            let mut s = String::new();
            prometheus_client::encoding::text::encode(&mut s, &registry).unwrap();
            s
        };
        let mut o = observation(&[Some(40), Some(80)]);
        let mut stray = o.details[0].clone();
        stray.gpu.node = "x".into();
        o.details.push(stray);
        let records = [running("a", &[0, 1]), running("b", &[1])];
        m.record(&o, &records, &Placements::new(&o, &records), 0);
        let t = text();
        assert!(
            t.contains("gpu_utilization_ratio{pool=\"p\",tenant=\"a\"} 0.4\n"),
            "{t}"
        );
        assert!(
            t.contains("gpu_utilization_ratio{pool=\"p\",tenant=\"b\"} 0.8\n"),
            "{t}"
        );
        assert!(!t.contains("tenant=\"\""), "{t}");

        let records = [running("b", &[1])];
        m.record(&o, &records, &Placements::new(&o, &records), 10);
        let t = text();
        assert!(
            t.contains("gpu_utilization_ratio{pool=\"p\",tenant=\"a\"} 0.0\n"),
            "{t}"
        );
        assert!(
            t.contains("gpu_utilization_reporting_gpus{pool=\"p\",tenant=\"a\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("gpu_utilization_ratio{pool=\"p\",tenant=\"\"} 0.4\n"),
            "{t}"
        );
        assert!(
            t.contains("gpu_utilization_reporting_gpus{pool=\"p\",tenant=\"b\"} 1\n"),
            "{t}"
        );
    }
}
