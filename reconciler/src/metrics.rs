//! Prometheus metrics (prometheus-client, OpenMetrics text): what a platform team graphs and
//! alerts on. Figures that describe the fleet now (allocation, fragmentation, pending by reason,
//! usage) are gauges replaced at every cycle; things that happen (preemptions,
//! reconfigurations, actions) are counters; durations are histograms.
//!
//! Hardware utilization ([`utilization`]) is NVML's utilization rate of allocated GPUs, per pool
//! and tenant, with the allocated GPUs that have sat idle; SM activity ([`sm_activity`]) is
//! NVML GPM's, per pool and tenant and per running workload, where the GPUs have GPM. Both
//! read who holds each GPU from one [`placements::Placements`] a cycle.

pub mod placements;
pub mod sm_activity;
pub mod utilization;

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
pub struct UsageLabels {
    pub tenant: String,
    /// `gpu_hours`, `cpu_hours` or `memory_gib_hours`.
    pub resource: String,
    /// `used` or `borrowed`.
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShareLabels {
    pub tenant: String,
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
pub struct KindLabels {
    /// `journal`, `events`, `workloads` or `usage`.
    pub kind: String,
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
    fragmentation_gpus: Family<PoolLabels, FloatGauge>,
    free_nodes: Family<PoolLabels, Gauge>,
    tenant_gpus: Family<TenantLabels, FloatGauge>,
    decayed_usage: Family<UsageLabels, FloatGauge>,
    fair_share: Family<ShareLabels, FloatGauge>,
    fair_share_history: Family<ShareLabels, FloatGauge>,
    reservations: Family<PoolLabels, Gauge>,
    lost_gpus: Family<PoolLabels, Gauge>,
    reserved_idle_gpus: Family<PoolLabels, Gauge>,
    reserved_idle_gpu_seconds: Family<PoolLabels, Counter<f64, AtomicU64>>,
    pending: Family<ReasonLabels, Gauge>,
    gap: FloatGauge,
    preemptions: Counter,
    reconfigurations: Counter,
    actions: Family<ActionLabels, Counter>,
    cycles: Counter,
    cycle_seconds: Histogram,
    solve_seconds: Histogram,
    session_decisions: Counter,
    full_solves: Family<ReasonLabels, Counter>,
    sync: Family<StatusLabels, Gauge>,
    health: Family<StatusLabels, Gauge>,
    pruned: Family<KindLabels, Counter>,
    utilization: utilization::UtilizationMetrics,
    sm_activity: sm_activity::SmActivityMetrics,
    /// Label sets set at the previous cycle, so that a pool or reason that disappears reads 0
    /// rather than its last value.
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    pools: Vec<PoolLabels>,
    tenants: Vec<TenantLabels>,
    usage: Vec<UsageLabels>,
    shares: Vec<ShareLabels>,
    reasons: Vec<ReasonLabels>,
    lost_pools: Vec<PoolLabels>,
    /// GPUs held idle per pool by the last decision, and its instant: held capacity is
    /// integrated over the time until the next decision.
    held: Vec<(PoolLabels, u32)>,
    held_since: Option<i64>,
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
            fragmentation_gpus: Family::default(),
            free_nodes: Family::default(),
            tenant_gpus: Family::default(),
            decayed_usage: Family::default(),
            fair_share: Family::default(),
            fair_share_history: Family::default(),
            reservations: Family::default(),
            lost_gpus: Family::default(),
            reserved_idle_gpus: Family::default(),
            reserved_idle_gpu_seconds: Family::default(),
            pending: Family::default(),
            gap: FloatGauge::default(),
            preemptions: Counter::default(),
            reconfigurations: Counter::default(),
            actions: Family::default(),
            cycles: Counter::default(),
            cycle_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            solve_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            session_decisions: Counter::default(),
            full_solves: Family::default(),
            sync: Family::default(),
            health: Family::default(),
            pruned: Family::default(),
            utilization: utilization::UtilizationMetrics::default(),
            sm_activity: sm_activity::SmActivityMetrics::default(),
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
            "pool_fragmentation_gpus",
            "FGD's fragmentation: free GPU capacity a replica of the running mix could not use, in expectation",
            m.fragmentation_gpus.clone(),
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
            "tenant_decayed_usage",
            "A tenant's usage (with its descendants') decayed by its fair-share half-life, \
             all of it or the part above its guarantee",
            m.decayed_usage.clone(),
        );
        registry.register(
            "tenant_fair_share",
            "A tenant's entitled fraction of borrowable capacity among its siblings, after history",
            m.fair_share.clone(),
        );
        registry.register(
            "tenant_fair_share_history",
            "A tenant's decayed dominant borrowed share of the fleet",
            m.fair_share_history.clone(),
        );
        registry.register(
            "pool_lost_gpus",
            "GPUs the driver reports lost (those of a lost node included), per pool",
            m.lost_gpus.clone(),
        );
        registry.register(
            "pool_reservations",
            "Waiting gangs holding capacity",
            m.reservations.clone(),
        );
        registry.register(
            "pool_reserved_idle_gpus",
            "GPUs held idle for waiting gangs",
            m.reserved_idle_gpus.clone(),
        );
        registry.register(
            "pool_reserved_idle_gpu_seconds",
            "GPU-seconds held idle for waiting gangs: the cost of not starving them",
            m.reserved_idle_gpu_seconds.clone(),
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
            "session_decisions",
            "Cycles that decided new submissions against the standing decision instead of solving the whole queue",
            m.session_decisions.clone(),
        );
        registry.register(
            "full_solves",
            "Cycles that solved the whole queue, by why the standing decision was not used (`none`: there was none)",
            m.full_solves.clone(),
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
        registry.register(
            "pruned",
            "Rows deleted by retention, by kind (journal, events, workloads, usage)",
            m.pruned.clone(),
        );
        m.utilization.register(&mut registry);
        m.sm_activity.register(&mut registry);
        Metrics { registry, ..m }
    }

    /// The utilization and SM activity of allocated GPUs as `observation` reports them (see
    /// [`utilization`] and [`sm_activity`]).
    pub fn record_utilization(
        &self,
        observation: &crate::driver::Observation,
        records: &[crate::store::WorkloadRecord],
        now: i64,
    ) {
        let placements = placements::Placements::new(observation, records);
        self.utilization
            .record(observation, records, &placements, now);
        self.sm_activity.record(observation, records, &placements);
    }

    /// Replaces the fleet gauges with the figures of `decision`, taken at `now` (unix seconds).
    pub fn record_decision(&self, decision: &Decision, now: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        self.record_fair_share(decision, &mut seen);
        self.record_reservations(decision, now, &mut seen);
        for labels in seen.pools.drain(..) {
            self.allocation.get_or_create(&labels).set(0.0);
            self.allocated_gpus.get_or_create(&labels).set(0.0);
            self.capacity_gpus.get_or_create(&labels).set(0.0);
            self.stranded_gpus.get_or_create(&labels).set(0.0);
            self.fragmentation_gpus.get_or_create(&labels).set(0.0);
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
            self.fragmentation_gpus
                .get_or_create(&labels)
                .set(p.fragmentation.as_f64());
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

    fn record_fair_share(&self, decision: &Decision, seen: &mut Seen) {
        for labels in seen.usage.drain(..) {
            self.decayed_usage.get_or_create(&labels).set(0.0);
        }
        for labels in seen.shares.drain(..) {
            self.fair_share.get_or_create(&labels).set(0.0);
            self.fair_share_history.get_or_create(&labels).set(0.0);
        }
        let Some(report) = &decision.fair_share else {
            return;
        };
        for (tenant, record) in &report.record.tenants {
            for (kind, hours) in [("used", record.used), ("borrowed", record.borrowed)] {
                for (resource, value) in [
                    ("gpu_hours", hours.gpu_hours),
                    ("cpu_hours", hours.cpu_hours),
                    ("memory_gib_hours", hours.memory_gib_hours),
                ] {
                    let labels = UsageLabels {
                        tenant: tenant.clone(),
                        resource: resource.to_string(),
                        kind: kind.to_string(),
                    };
                    self.decayed_usage.get_or_create(&labels).set(value);
                    seen.usage.push(labels);
                }
            }
        }
        for t in &report.tenants {
            let labels = ShareLabels {
                tenant: t.tenant.clone(),
            };
            self.fair_share.get_or_create(&labels).set(t.share);
            self.fair_share_history
                .get_or_create(&labels)
                .set(t.history);
            seen.shares.push(labels);
        }
    }

    /// Gauges of what is held now, and the GPU-seconds held idle since the last decision
    /// (what that decision held, for as long as it stood).
    fn record_reservations(&self, decision: &Decision, now: i64, seen: &mut Seen) {
        if let Some(since) = seen.held_since {
            let seconds = (now - since).max(0) as f64;
            for (labels, held) in &seen.held {
                self.reserved_idle_gpu_seconds
                    .get_or_create(labels)
                    .inc_by(f64::from(*held) * seconds);
            }
        }
        for (labels, _) in seen.held.drain(..) {
            self.reservations.get_or_create(&labels).set(0);
            self.reserved_idle_gpus.get_or_create(&labels).set(0);
        }
        let mut by_pool: BTreeMap<&str, (i64, u32)> = BTreeMap::new();
        for r in &decision.reservations {
            let e = by_pool.entry(r.pool.as_str()).or_default();
            e.0 += 1;
            e.1 += r.held_idle;
        }
        for (pool, (count, held)) in by_pool {
            let labels = PoolLabels {
                pool: pool.to_string(),
            };
            self.reservations.get_or_create(&labels).set(count);
            self.reserved_idle_gpus
                .get_or_create(&labels)
                .set(i64::from(held));
            seen.held.push((labels, held));
        }
        seen.held_since = Some(now);
    }

    /// The lost GPUs of an observation, per pool; a pool with none reads 0.
    pub fn record_lost(&self, observation: &crate::driver::Observation) {
        use tessera_compiler::model::Health;
        let mut per_pool: BTreeMap<String, i64> = BTreeMap::new();
        for node in &observation.nodes {
            let lost = if node.health == Health::Lost {
                node.gpus.len()
            } else {
                node.gpus
                    .iter()
                    .filter(|g| g.health == Health::Lost)
                    .count()
            };
            *per_pool.entry(node.pool.clone()).or_default() += i64::try_from(lost).unwrap_or(0);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for old in &seen.lost_pools {
            if !per_pool.contains_key(&old.pool) {
                self.lost_gpus.get_or_create(old).set(0);
            }
        }
        seen.lost_pools.clear();
        for (pool, lost) in per_pool {
            let labels = PoolLabels { pool };
            self.lost_gpus.get_or_create(&labels).set(lost);
            seen.lost_pools.push(labels);
        }
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

    /// The solver ran for `seconds` within a cycle (not every cycle gets that far): on the
    /// standing decision's session (`full_because` is `None`), or on the whole snapshot
    /// because of the reason's kind (`none`: no decision stood).
    pub fn record_solve(&self, seconds: f64, full_because: Option<&str>) {
        self.solve_seconds.observe(seconds);
        match full_because {
            None => {
                self.session_decisions.inc();
            }
            Some(why) => {
                self.full_solves
                    .get_or_create(&ReasonLabels {
                        reason: why.to_string(),
                    })
                    .inc();
            }
        }
    }

    /// A retention step deleted `rows` of `kind` (a kind is shown from the first step, at 0).
    pub fn record_pruned(&self, kind: &str, rows: usize) {
        self.pruned
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .inc_by(u64::try_from(rows).unwrap_or(u64::MAX));
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

    fn decision(extra: serde_json::Value) -> Decision {
        let mut d = serde_json::json!({
            "format_version": 1, "now": "2026-11-23T10:00:00Z", "method": "heuristic",
            "objective": 0.0, "bound": null, "gap": null,
            "workloads": [], "geometry": [], "usage": [], "pools": [],
        });
        d.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(d).unwrap()
    }

    fn reservation(pool: &str, held: u32) -> serde_json::Value {
        serde_json::json!({
            "workload": format!("gang-{pool}-{held}"), "pool": pool, "nodes": ["n1"],
            "since": "2026-11-23T09:00:00Z", "needed": 16, "held_idle": held, "backfilled": 0,
        })
    }

    #[test]
    fn capacity_held_idle_is_integrated_over_the_time_each_decision_stood() {
        let m = Metrics::new();
        let held = |r: Vec<serde_json::Value>| decision(serde_json::json!({"reservations": r}));
        m.record_decision(&held(vec![reservation("train", 6)]), 100);
        m.record_decision(&held(vec![reservation("train", 2)]), 160);
        let text = m.encode();
        assert!(
            text.contains("tessera_pool_reserved_idle_gpus{pool=\"train\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("tessera_pool_reserved_idle_gpu_seconds_total{pool=\"train\"} 360.0\n"),
            "{text}"
        );
        m.record_decision(&held(Vec::new()), 220);
        let text = m.encode();
        assert!(
            text.contains("tessera_pool_reserved_idle_gpus{pool=\"train\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("tessera_pool_reservations{pool=\"train\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("tessera_pool_reserved_idle_gpu_seconds_total{pool=\"train\"} 480.0\n"),
            "{text}"
        );
    }

    #[test]
    fn decayed_usage_and_shares_are_exported_and_cleared_when_gone() {
        let m = Metrics::new();
        let fair = decision(serde_json::json!({"fair_share": {
            "record": {"asOf": "2026-11-23T10:00:00Z", "tenants": {"a": {
                "used": {"gpuHours": 120.5, "cpuHours": 10.0, "memoryGibHours": 0.0},
                "borrowed": {"gpuHours": 20.0, "cpuHours": 0.0, "memoryGibHours": 0.0}}}},
            "tenants": [{"tenant": "a", "weight": 2.0, "history": 0.125, "share": 0.75}],
        }}));
        m.record_decision(&fair, 100);
        let text = m.encode();
        assert!(
            text.contains(
                "tessera_tenant_decayed_usage{tenant=\"a\",resource=\"gpu_hours\",kind=\"used\"} 120.5\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("tessera_tenant_fair_share{tenant=\"a\"} 0.75\n"),
            "{text}"
        );
        assert!(
            text.contains("tessera_tenant_fair_share_history{tenant=\"a\"} 0.125\n"),
            "{text}"
        );
        m.record_decision(&decision(serde_json::json!({})), 160);
        let text = m.encode();
        assert!(
            text.contains("tessera_tenant_fair_share{tenant=\"a\"} 0.0\n"),
            "{text}"
        );
    }

    #[test]
    fn a_cycle_counts_once_and_its_solve_apart() {
        let m = Metrics::new();
        m.record_solve(0.25, Some("none"));
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

    /// Every series the Grafana dashboard in `examples/` queries is one this exposition has
    /// (a renamed metric would leave a panel silently empty).
    #[test]
    fn the_grafana_dashboard_queries_only_exported_series() {
        let m = Metrics::new();
        m.record_decision(
            &decision(serde_json::json!({
                "pools": [{"pool": "p", "sharing": "exclusive", "capacity": 8, "allocated": 4,
                    "allocation": 0.5, "free": 4, "stranded": 1, "fragmentation": 2,
                    "free_nodes": 0, "free_domains": 0}],
                "usage": [{"tenant": "a", "pool": "p", "guarantee": 4, "limit": 8, "total": 4,
                    "guaranteed": 4, "borrowed": 0}],
                "workloads": [{"name": "w", "tenant": "a", "slo_class": "batch", "priority": 1,
                    "pool": null, "outcome": "pending",
                    "reason": {"kind": "no_capacity", "pool": "p", "needed": 1, "fit": 0, "free": 0},
                    "message": "m"}],
                "reservations": [reservation("p", 2)],
            })),
            100,
        );
        let node = serde_json::from_value(serde_json::json!({
            "name": "n", "pool": "p", "cpu": "8", "memory": "64Gi", "gpus": [],
        }))
        .unwrap();
        let observation = crate::driver::Observation {
            nodes: vec![node],
            details: vec![crate::driver::GpuDetail {
                gpu: crate::driver::GpuRef {
                    node: "n".into(),
                    index: 0,
                },
                instances: vec![],
                processes: vec![],
                utilization: Some(crate::driver::GpuUtilization {
                    gpu_percent: 3,
                    memory_percent: 1,
                }),
                sm_activity: crate::driver::SmActivity::checked(42.0, 21.0),
            }],
        };
        // One running workload on the GPU, so that the per-workload families have a series.
        let store = crate::store::Store::open_in_memory().unwrap();
        let spec = serde_json::from_value(serde_json::json!({
            "tenant": "a", "sloClass": "batch", "gpu": {"count": 1},
        }))
        .unwrap();
        store
            .submit("w", &spec, crate::store::Origin::Submitted, 0)
            .unwrap();
        let key = tessera_compiler::WorkloadKey::new("a", "w");
        let binding: Vec<tessera_compiler::model::Binding> =
            serde_json::from_value(serde_json::json!([{"node": "n", "gpus": [0]}])).unwrap();
        store.mark_starting(&key, &binding, 0).unwrap();
        let running = store.mark_running(&key, &[], 0).unwrap();
        m.record_lost(&observation);
        m.record_utilization(&observation, &[running], 100);
        m.record_status("Synced", "Healthy");
        let exposition = m.encode();
        assert!(
            exposition.contains("tessera_pool_fragmentation_gpus{pool=\"p\"} 2.0\n"),
            "{exposition}"
        );
        let families: Vec<&str> = exposition
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let exported = |series: &str| {
            ["", "_total", "_bucket", "_sum", "_count"]
                .iter()
                .any(|suffix| {
                    series
                        .strip_suffix(suffix)
                        .is_some_and(|base| families.contains(&base))
                })
        };
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/grafana/tessera-fleet.json"
        );
        let dashboard: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut queried = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                let mut rest = expr;
                while let Some(i) = rest.find("tessera_") {
                    let name: String = rest[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    assert!(
                        exported(&name),
                        "{name} (in {expr:?}) is not exported:\n{exposition}"
                    );
                    queried += 1;
                    rest = &rest[i + name.len()..];
                }
            }
        }
        assert!(queried > 10, "{queried}");
    }
}
