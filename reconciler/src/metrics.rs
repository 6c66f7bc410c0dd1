//! Prometheus metrics (prometheus-client, OpenMetrics text): what a platform team graphs and
//! alerts on. Figures that describe the fleet now (allocation, fragmentation, pending by reason,
//! usage) are gauges replaced at every cycle; things that happen (preemptions,
//! reconfigurations, actions) are counters; durations are histograms.
//!
//! Hardware utilization (SM activity of what is allocated) needs DCGM or NVML GPM samples that
//! neither driver reads yet; it is left out rather than reported as a duty cycle that means
//! nothing (see `shared/reference/mig.md`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tessera_solver::Decision;
use tessera_solver::decision::{Outcome, Reason};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
    pub pool: String,
    /// `guaranteed` or `borrowed`.
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: String,
    /// `ok` or `failed`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

pub struct Metrics {
    registry: Registry,
    allocation: Family<PoolLabels, FloatGauge>,
    allocated_gpus: Family<PoolLabels, FloatGauge>,
    capacity_gpus: Family<PoolLabels, FloatGauge>,
    stranded_gpus: Family<PoolLabels, FloatGauge>,
    free_nodes: Family<PoolLabels, Gauge>,
    tenant_gpus: Family<TenantLabels, FloatGauge>,
    pending: Family<ReasonLabels, Gauge>,
    gap: FloatGauge,
    preemptions: Counter,
    reconfigurations: Counter,
    actions: Family<ActionLabels, Counter>,
    cycles: Counter,
    cycle_seconds: Histogram,
    solve_seconds: Histogram,
    sync: Family<StatusLabels, Gauge>,
    health: Family<StatusLabels, Gauge>,
    /// Label sets set at the previous cycle, so that a pool or reason that disappears reads 0
    /// rather than its last value.
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    pools: Vec<PoolLabels>,
    tenants: Vec<TenantLabels>,
    reasons: Vec<ReasonLabels>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tessera");
        let m = Metrics {
            allocation: Family::default(),
            allocated_gpus: Family::default(),
            capacity_gpus: Family::default(),
            stranded_gpus: Family::default(),
            free_nodes: Family::default(),
            tenant_gpus: Family::default(),
            pending: Family::default(),
            gap: FloatGauge::default(),
            preemptions: Counter::default(),
            reconfigurations: Counter::default(),
            actions: Family::default(),
            cycles: Counter::default(),
            cycle_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            solve_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            sync: Family::default(),
            health: Family::default(),
            seen: Mutex::new(Seen::default()),
            registry: Registry::default(),
        };
        registry.register(
            "pool_allocation_ratio",
            "GPUs allocated over capacity, per pool",
            m.allocation.clone(),
        );
        registry.register(
            "pool_allocated_gpus",
            "GPUs allocated (MIG instances count compute slices / 7, shares their fraction)",
            m.allocated_gpus.clone(),
        );
        registry.register(
            "pool_capacity_gpus",
            "GPUs of healthy nodes",
            m.capacity_gpus.clone(),
        );
        registry.register(
            "pool_stranded_gpus",
            "Free GPU capacity that no pending shape can use (fragmentation)",
            m.stranded_gpus.clone(),
        );
        registry.register(
            "pool_free_nodes",
            "Healthy nodes with every GPU free",
            m.free_nodes.clone(),
        );
        registry.register(
            "tenant_gpus",
            "GPUs a tenant (with its descendants) uses per pool, within its guarantee or borrowed",
            m.tenant_gpus.clone(),
        );
        registry.register(
            "pending_workloads",
            "Workloads left waiting, by reason",
            m.pending.clone(),
        );
        registry.register(
            "solver_gap",
            "Relative gap between the decision's objective and the LP bound",
            m.gap.clone(),
        );
        registry.register(
            "preemptions",
            "Workloads signalled to checkpoint and stop",
            m.preemptions.clone(),
        );
        registry.register(
            "reconfigurations",
            "GPU geometry actions applied (instances created or destroyed, mode changes, resets)",
            m.reconfigurations.clone(),
        );
        registry.register(
            "actions",
            "Actions applied, by kind and result",
            m.actions.clone(),
        );
        registry.register("cycles", "Reconcile cycles run", m.cycles.clone());
        registry.register(
            "cycle_duration_seconds",
            "Wall time of a reconcile cycle",
            m.cycle_seconds.clone(),
        );
        registry.register(
            "solve_duration_seconds",
            "Wall time of the solver within a cycle",
            m.solve_seconds.clone(),
        );
        registry.register(
            "sync_status",
            "1 for the current sync status (Synced, OutOfSync)",
            m.sync.clone(),
        );
        registry.register(
            "health_status",
            "1 for the current health (Healthy, Progressing, Degraded)",
            m.health.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Replaces the fleet gauges with the figures of `decision`.
    pub fn record_decision(&self, decision: &Decision) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for labels in seen.pools.drain(..) {
            self.allocation.get_or_create(&labels).set(0.0);
            self.allocated_gpus.get_or_create(&labels).set(0.0);
            self.capacity_gpus.get_or_create(&labels).set(0.0);
            self.stranded_gpus.get_or_create(&labels).set(0.0);
            self.free_nodes.get_or_create(&labels).set(0);
        }
        for labels in seen.tenants.drain(..) {
            self.tenant_gpus.get_or_create(&labels).set(0.0);
        }
        for labels in seen.reasons.drain(..) {
            self.pending.get_or_create(&labels).set(0);
        }
        for p in &decision.pools {
            let labels = PoolLabels {
                pool: p.pool.clone(),
            };
            self.allocation.get_or_create(&labels).set(p.allocation);
            self.allocated_gpus
                .get_or_create(&labels)
                .set(p.allocated.as_f64());
            self.capacity_gpus
                .get_or_create(&labels)
                .set(p.capacity.as_f64());
            self.stranded_gpus
                .get_or_create(&labels)
                .set(p.stranded.as_f64());
            self.free_nodes
                .get_or_create(&labels)
                .set(i64::from(p.free_nodes));
            seen.pools.push(labels);
        }
        for u in &decision.usage {
            for (kind, value) in [("guaranteed", u.guaranteed), ("borrowed", u.borrowed)] {
                let labels = TenantLabels {
                    tenant: u.tenant.clone(),
                    pool: u.pool.clone(),
                    kind: kind.to_string(),
                };
                self.tenant_gpus.get_or_create(&labels).set(value.as_f64());
                seen.tenants.push(labels);
            }
        }
        let mut pending: BTreeMap<String, i64> = BTreeMap::new();
        for w in &decision.workloads {
            if let Outcome::Pending { reason, .. } = &w.outcome {
                *pending.entry(reason_kind(reason)).or_default() += 1;
            }
        }
        for (reason, count) in pending {
            let labels = ReasonLabels { reason };
            self.pending.get_or_create(&labels).set(count);
            seen.reasons.push(labels);
        }
        self.gap.set(decision.gap.unwrap_or(0.0));
    }

    pub fn record_action(&self, action: &str, ok: bool, geometry: bool) {
        self.actions
            .get_or_create(&ActionLabels {
                action: action.to_string(),
                result: if ok { "ok" } else { "failed" }.to_string(),
            })
            .inc();
        if ok && geometry {
            self.reconfigurations.inc();
        }
        if ok && action == "checkpoint" {
            self.preemptions.inc();
        }
    }

    /// One cycle ended, after `seconds` of wall time.
    pub fn record_cycle(&self, seconds: f64) {
        self.cycles.inc();
        self.cycle_seconds.observe(seconds);
    }

    /// The solver ran for `seconds` within a cycle (not every cycle gets that far).
    pub fn record_solve(&self, seconds: f64) {
        self.solve_seconds.observe(seconds);
    }

    pub fn record_status(&self, sync: &str, health: &str) {
        for s in ["Synced", "OutOfSync"] {
            self.sync
                .get_or_create(&StatusLabels {
                    status: s.to_string(),
                })
                .set(i64::from(s == sync));
        }
        for h in ["Healthy", "Progressing", "Degraded"] {
            self.health
                .get_or_create(&StatusLabels {
                    status: h.to_string(),
                })
                .set(i64::from(h == health));
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The `kind` tag of a reason (`quota_exceeded`, `no_capacity`, ...).
pub fn reason_kind(reason: &Reason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
        .unwrap_or_else(|| "unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cycle_counts_once_and_its_solve_apart() {
        let m = Metrics::new();
        m.record_solve(0.25);
        m.record_cycle(0.5);
        let text = m.encode();
        assert!(text.contains("tessera_cycles_total 1\n"), "{text}");
        assert!(
            text.contains("tessera_cycle_duration_seconds_count 1\n"),
            "{text}"
        );
        assert!(
            text.contains("tessera_cycle_duration_seconds_sum 0.5\n"),
            "{text}"
        );
        assert!(
            text.contains("tessera_solve_duration_seconds_count 1\n"),
            "{text}"
        );
    }
}
