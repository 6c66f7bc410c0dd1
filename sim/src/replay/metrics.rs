//! What a replay measures, and the report it ends with.
//!
//! - Allocation: GPUs held (MIG instances count compute slices / 7, shares their fraction, as
//!   the solver's pool reports count them) over the fleet's GPUs, integrated exactly over time
//!   (it changes only at cycles and departures).
//! - Queueing delay: from a workload's arrival to its first start, in seconds. Workloads that
//!   never start are counted apart, not in the percentiles. Percentiles are nearest-rank.
//!   Beside it, the wait of every arrival: a workload still waiting at the end counts its wait
//!   up to then (a lower bound). When the fleet cannot start everything, the started ones'
//!   delays favour the placer that started fewer (the long waits it left out are not in them);
//!   the waits of every arrival compare placers on the same workloads.
//! - Fair share: each tenant's GPU-hours over all tenants', beside its entitlement: the
//!   product, down the tenant tree, of its weight over its siblings' (only subtrees with a
//!   workload in the trace count, as idle tenants lend what they do not use).
//! - Preemption: the GPU-hours the decisions report lost since the victims' last checkpoints.
//! - Reconfigurations: MIG GPUs whose geometry a decision changed.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::{Health, Node};
use tessera_compiler::units::Gpus;

use super::engine::{Job, JobState};
use super::trace::TraceWorkload;

/// At most this many points of the allocation curve are kept in a report.
const CURVE_POINTS: usize = 500;

/// One run of a replay, as reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// `Tessera` (the production solver's placement) or the baseline's name.
    pub placement: String,
    /// Simulated seconds covered.
    pub duration_seconds: i64,
    /// Cycles solved (cycles with nothing new are skipped).
    pub cycles: u64,
    /// Cycles whose refinement stopped at the time limit (their decisions depend on the
    /// machine's speed; zero for a reproducible run).
    pub cycles_time_limited: u64,
    pub capacity_gpus: f64,
    /// Time-weighted mean of the allocation, 0 to 1.
    pub mean_allocation: f64,
    /// The allocation curve: `[seconds, allocation]`, at most 500 points (the mean of each
    /// span when the run has more changes).
    pub allocation: Vec<[f64; 2]>,
    /// Workloads that arrived before the end.
    pub workloads: usize,
    pub started: usize,
    pub never_started: usize,
    /// Admissions the solver decided that the baseline placer found no room for (they wait
    /// for the next cycle); always 0 under the solver's own placement.
    pub unplaced_admissions: u64,
    pub queueing_delay: Delays,
    /// The wait of every workload that arrived: to its first start, or to the end for one
    /// still waiting (a lower bound for it).
    #[serde(default = "no_delays")]
    pub waiting: Delays,
    pub tenants: Vec<TenantReport>,
    pub slo_classes: Vec<ClassReport>,
    pub preemptions: u64,
    pub gpu_hours_lost: f64,
    pub gpu_hours_used: f64,
    pub reconfigurations: u64,
}

fn no_delays() -> Delays {
    Delays {
        p50: None,
        p99: None,
        max: None,
    }
}

/// Queueing-delay percentiles, in seconds; `None` when nothing started.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Delays {
    pub p50: Option<i64>,
    pub p99: Option<i64>,
    pub max: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantReport {
    pub tenant: String,
    pub workloads: usize,
    pub started: usize,
    pub queueing_delay: Delays,
    pub gpu_hours: f64,
    /// Its GPU-hours over every tenant's.
    pub share: f64,
    /// Its entitlement by weight (see the module documentation).
    pub weight_share: f64,
    pub preemptions: u64,
    pub gpu_hours_lost: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassReport {
    pub slo_class: String,
    pub workloads: usize,
    pub started: usize,
    pub queueing_delay: Delays,
}

pub(crate) struct Metrics {
    capacity_units: i64,
    held_units: i64,
    last_change: i64,
    integral: f64,
    curve: Vec<(i64, f64)>,
    tenant_of: Vec<String>,
    class_of: Vec<String>,
    delays: Vec<Option<i64>>,
    arrival: Vec<i64>,
    running: HashMap<usize, (i64, Gpus)>,
    gpu_seconds: BTreeMap<String, f64>,
    preempted_by_tenant: BTreeMap<String, (u64, f64)>,
    weight_share: BTreeMap<String, f64>,
    cycles: u64,
    time_limited: u64,
    preemptions: u64,
    lost_gpu_seconds: f64,
    reconfigurations: u64,
    unplaced: u64,
}

impl Metrics {
    pub(crate) fn new(policy: &CompiledPolicy, nodes: &[Node], trace: &[TraceWorkload]) -> Self {
        let gpus: usize = nodes
            .iter()
            .filter(|n| n.health != Health::Lost)
            .map(|n| n.gpus.iter().filter(|g| g.health != Health::Lost).count())
            .sum();
        Metrics {
            capacity_units: gpus as i64 * Gpus::UNITS_PER_GPU,
            held_units: 0,
            last_change: 0,
            integral: 0.0,
            curve: vec![(0, 0.0)],
            tenant_of: trace.iter().map(|w| w.spec.tenant.clone()).collect(),
            class_of: trace.iter().map(|w| w.spec.slo_class.clone()).collect(),
            delays: vec![None; trace.len()],
            arrival: trace.iter().map(|w| w.arrival).collect(),
            running: HashMap::new(),
            gpu_seconds: BTreeMap::new(),
            preempted_by_tenant: BTreeMap::new(),
            weight_share: weight_shares(policy, trace),
            cycles: 0,
            time_limited: 0,
            preemptions: 0,
            lost_gpu_seconds: 0.0,
            reconfigurations: 0,
            unplaced: 0,
        }
    }

    fn change(&mut self, at: i64, delta: i64) {
        if self.capacity_units > 0 {
            self.integral += self.held_units as f64 / self.capacity_units as f64
                * (at - self.last_change) as f64;
        }
        self.last_change = at;
        self.held_units += delta;
        let a = self.allocation();
        match self.curve.last_mut() {
            Some(last) if last.0 == at => last.1 = a,
            _ => self.curve.push((at, a)),
        }
    }

    fn allocation(&self) -> f64 {
        if self.capacity_units == 0 {
            0.0
        } else {
            self.held_units as f64 / self.capacity_units as f64
        }
    }

    pub(crate) fn cycle(&mut self, time_limited: bool) {
        self.cycles += 1;
        self.time_limited += u64::from(time_limited);
    }

    pub(crate) fn start(&mut self, job: usize, at: i64, gpus: Gpus) {
        self.running.insert(job, (at, gpus));
        self.change(at, gpus.units());
    }

    fn stop_at(&mut self, job: usize, at: i64, gpus: Gpus) {
        if let Some((since, g)) = self.running.remove(&job) {
            *self
                .gpu_seconds
                .entry(self.tenant_of[job].clone())
                .or_default() +=
                g.units() as f64 / Gpus::UNITS_PER_GPU as f64 * (at - since) as f64;
        }
        self.change(at, -gpus.units());
    }

    /// The workload stopped (it departed, or was preempted) at `at`.
    pub(crate) fn stop(&mut self, job: usize, at: i64, gpus: Gpus) {
        self.stop_at(job, at, gpus);
    }

    pub(crate) fn preempted(&mut self, job: usize, lost_gpu_seconds: f64) {
        self.preemptions += 1;
        self.lost_gpu_seconds += lost_gpu_seconds;
        let e = self
            .preempted_by_tenant
            .entry(self.tenant_of[job].clone())
            .or_default();
        e.0 += 1;
        e.1 += lost_gpu_seconds;
    }

    pub(crate) fn started(&mut self, job: usize, delay: i64) {
        self.delays[job] = Some(delay);
    }

    pub(crate) fn reconfigured(&mut self) {
        self.reconfigurations += 1;
    }

    pub(crate) fn unplaced(&mut self) {
        self.unplaced += 1;
    }

    pub(crate) fn finish(mut self, end: i64, jobs: &[Job]) -> RunReport {
        // Work still running at the end counts up to the end.
        let running: Vec<(usize, Gpus)> = jobs
            .iter()
            .enumerate()
            .filter_map(|(i, j)| match j.state {
                JobState::Running { gpus, .. } => Some((i, gpus)),
                _ => None,
            })
            .collect();
        self.change(end, 0);
        for (i, gpus) in running {
            self.stop_at(i, end, gpus);
        }
        let span = end.max(1) as f64;
        let mean_allocation = self.integral / span;
        // Only what arrived by the end counts (a horizon cuts the trace).
        let arrived: Vec<usize> = (0..self.delays.len())
            .filter(|&i| self.arrival[i] <= end)
            .collect();
        let all: Vec<i64> = arrived.iter().filter_map(|&i| self.delays[i]).collect();
        let waits: Vec<i64> = arrived
            .iter()
            .map(|&i| self.delays[i].unwrap_or(end - self.arrival[i]))
            .collect();
        let used: f64 = self.gpu_seconds.values().sum();
        let mut tenants: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        let mut classes: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for &i in &arrived {
            tenants.entry(&self.tenant_of[i]).or_default().push(i);
            classes.entry(&self.class_of[i]).or_default().push(i);
        }
        let delays_of =
            |ids: &[usize]| -> Vec<i64> { ids.iter().filter_map(|&i| self.delays[i]).collect() };
        let tenant_reports = tenants
            .iter()
            .map(|(t, ids)| {
                let d = delays_of(ids);
                let gs = self.gpu_seconds.get(*t).copied().unwrap_or(0.0);
                let (p, lost) = self
                    .preempted_by_tenant
                    .get(*t)
                    .copied()
                    .unwrap_or_default();
                TenantReport {
                    tenant: (*t).to_owned(),
                    workloads: ids.len(),
                    started: d.len(),
                    queueing_delay: percentiles(d),
                    gpu_hours: round(gs / 3600.0),
                    share: round(if used > 0.0 { gs / used } else { 0.0 }),
                    weight_share: round(self.weight_share.get(*t).copied().unwrap_or(0.0)),
                    preemptions: p,
                    gpu_hours_lost: round(lost / 3600.0),
                }
            })
            .collect();
        let class_reports = classes
            .iter()
            .map(|(c, ids)| {
                let d = delays_of(ids);
                ClassReport {
                    slo_class: (*c).to_owned(),
                    workloads: ids.len(),
                    started: d.len(),
                    queueing_delay: percentiles(d),
                }
            })
            .collect();
        RunReport {
            placement: String::new(),
            duration_seconds: end,
            cycles: self.cycles,
            cycles_time_limited: self.time_limited,
            capacity_gpus: self.capacity_units as f64 / Gpus::UNITS_PER_GPU as f64,
            mean_allocation: round(mean_allocation),
            allocation: downsample(&self.curve, end),
            workloads: arrived.len(),
            started: all.len(),
            never_started: arrived.len() - all.len(),
            unplaced_admissions: self.unplaced,
            queueing_delay: percentiles(all),
            waiting: percentiles(waits),
            tenants: tenant_reports,
            slo_classes: class_reports,
            preemptions: self.preemptions,
            gpu_hours_lost: round(self.lost_gpu_seconds / 3600.0),
            gpu_hours_used: round(used / 3600.0),
            reconfigurations: self.reconfigurations,
        }
    }
}

/// Six decimals: enough for any figure, and a stable JSON text across platforms' last bits.
fn round(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Nearest-rank percentiles.
fn percentiles(mut d: Vec<i64>) -> Delays {
    d.sort_unstable();
    let rank = |q: f64| -> Option<i64> {
        if d.is_empty() {
            return None;
        }
        let k = ((q * d.len() as f64).ceil() as usize).clamp(1, d.len());
        Some(d[k - 1])
    };
    Delays {
        p50: rank(0.50),
        p99: rank(0.99),
        max: d.last().copied(),
    }
}

/// The step curve `points` (value from each instant to the next) over `[0, end]` as at most
/// [`CURVE_POINTS`] points: each the time-weighted mean over its equal span.
fn downsample(points: &[(i64, f64)], end: i64) -> Vec<[f64; 2]> {
    if end <= 0 || points.len() <= CURVE_POINTS {
        return points.iter().map(|&(t, a)| [t as f64, round(a)]).collect();
    }
    let n = CURVE_POINTS as i64;
    let mut out = Vec::with_capacity(CURVE_POINTS);
    let mut k = 0usize;
    for b in 0..n {
        let (lo, hi) = (end * b / n, end * (b + 1) / n);
        if hi <= lo {
            continue;
        }
        let mut sum = 0.0;
        while k + 1 < points.len() && points[k + 1].0 <= lo {
            k += 1;
        }
        let mut j = k;
        let mut t = lo;
        while t < hi {
            let next = points.get(j + 1).map_or(hi, |p| p.0.min(hi));
            sum += points[j].1 * (next - t) as f64;
            t = next;
            if t < hi {
                j += 1;
            }
        }
        out.push([lo as f64, round(sum / (hi - lo) as f64)]);
    }
    out
}

/// Each trace tenant's entitlement by weight: down the tree, weight over the weights of the
/// siblings whose subtree has a workload in the trace.
fn weight_shares(policy: &CompiledPolicy, trace: &[TraceWorkload]) -> BTreeMap<String, f64> {
    let active: std::collections::BTreeSet<&str> =
        trace.iter().map(|w| w.spec.tenant.as_str()).collect();
    // A tenant is live when it or a descendant is active.
    let live = |name: &str| {
        policy
            .tenants
            .iter()
            .any(|t| active.contains(t.name.as_str()) && t.path.iter().any(|p| p == name))
    };
    let mut out = BTreeMap::new();
    for name in &active {
        let Some(t) = policy.tenant(name) else {
            continue;
        };
        let mut share = 1.0;
        for pair in t.path.windows(2) {
            let (parent, child) = (&pair[0], &pair[1]);
            let Some(p) = policy.tenant(parent) else {
                continue;
            };
            let total: f64 = p
                .children
                .iter()
                .filter(|c| live(c))
                .filter_map(|c| policy.tenant(c))
                .map(|c| c.weight)
                .sum();
            let w = policy.tenant(child).map_or(0.0, |c| c.weight);
            share *= if total > 0.0 { w / total } else { 0.0 };
        }
        // An active tenant with active descendants shares its part with them; kept simple: a
        // trace names leaf tenants, and an inner one keeps its whole part.
        out.insert((*name).to_owned(), share);
    }
    // Several active roots: split by root weight.
    let roots: Vec<&str> = policy
        .tenants
        .iter()
        .filter(|t| t.parent.is_none() && live(&t.name))
        .map(|t| t.name.as_str())
        .collect();
    if roots.len() > 1 {
        let total: f64 = roots
            .iter()
            .filter_map(|r| policy.tenant(r))
            .map(|t| t.weight)
            .sum();
        for (name, share) in out.iter_mut() {
            if let Some(t) = policy.tenant(name) {
                let rw = policy.tenant(&t.path[0]).map_or(0.0, |r| r.weight);
                *share *= if total > 0.0 { rw / total } else { 0.0 };
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let d = percentiles((1..=100).collect());
        assert_eq!((d.p50, d.p99, d.max), (Some(50), Some(99), Some(100)));
        let d = percentiles(vec![7]);
        assert_eq!((d.p50, d.p99), (Some(7), Some(7)));
        assert_eq!(percentiles(vec![]).p50, None);
    }

    #[test]
    fn downsampling_keeps_the_time_weighted_mean() {
        let points: Vec<(i64, f64)> = (0..2000).map(|i| (i, (i % 2) as f64)).collect();
        let out = downsample(&points, 2000);
        assert_eq!(out.len(), CURVE_POINTS);
        for p in &out {
            assert!((p[1] - 0.5).abs() < 1e-9, "{p:?}");
        }
    }
}
