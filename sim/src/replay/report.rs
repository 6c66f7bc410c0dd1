//! The runs of one replay side by side: the JSON document (stable field names) and the table.

use std::fmt::Write;

use serde::{Deserialize, Serialize};
use tessera_compiler::model::Node;

use super::engine::ReplayConfig;
use super::metrics::{Delays, RunReport};
use super::trace::TraceWorkload;

/// Version of the JSON document; bumped when a field changes meaning or goes away.
pub const FORMAT_VERSION: u32 = 1;

/// Every run of one replay: the solver's first, then each baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub format_version: u32,
    /// Workloads in the trace (each run counts those that arrived before its end).
    pub workloads: usize,
    pub nodes: usize,
    pub gpus: usize,
    pub cycle_seconds: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizon_seconds: Option<i64>,
    /// The factor the trace's arrival instants were divided by (see [`super::speed`]).
    #[serde(default = "one")]
    pub speed: f64,
    /// The load the trace (as replayed, after compression) offers the fleet's GPUs: see
    /// [`super::speed::offered_load`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered_load: Option<f64>,
    /// How many times the trace's workloads were drawn (see [`super::demand`]); 1: the trace
    /// as it is.
    #[serde(default = "one")]
    pub demand: f64,
    /// The share of the fleet's GPUs every workload replayed would hold at once: see
    /// [`super::demand::asked_share`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_share: Option<f64>,
    pub runs: Vec<RunReport>,
}

fn one() -> f64 {
    1.0
}

impl Summary {
    pub fn new(
        trace: &[TraceWorkload],
        nodes: &[Node],
        config: &ReplayConfig,
        runs: Vec<RunReport>,
    ) -> Self {
        Summary {
            format_version: FORMAT_VERSION,
            workloads: trace.len(),
            nodes: nodes.len(),
            gpus: nodes.iter().map(|n| n.gpus.len()).sum(),
            cycle_seconds: config.cycle,
            horizon_seconds: config.horizon,
            speed: 1.0,
            offered_load: super::speed::offered_load(
                trace,
                nodes.iter().map(|n| n.gpus.len()).sum(),
            ),
            demand: 1.0,
            asked_share: super::demand::asked_share(
                trace,
                nodes.iter().map(|n| n.gpus.len()).sum(),
            ),
            runs,
        }
    }
}

/// Seconds as the policy language writes durations, to the second.
pub fn seconds(s: Option<i64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 60 => format!("{s}s"),
        Some(s) if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        Some(s) => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The table for a terminal.
pub fn human(s: &Summary) -> String {
    let mut out = String::new();
    let span = s.runs.first().map_or(0, |r| r.duration_seconds);
    let _ = writeln!(
        out,
        "Replay of {} workloads on {} nodes ({} GPUs), a cycle every {}s, {:.1} hours simulated\n",
        s.workloads,
        s.nodes,
        s.gpus,
        s.cycle_seconds,
        span as f64 / 3600.0
    );
    if s.speed != 1.0 || s.offered_load.is_some() {
        let load = s
            .offered_load
            .map_or_else(|| "unknown".to_owned(), |l| format!("{:.1} %", l * 100.0));
        let _ = writeln!(
            out,
            "Arrivals {}× faster than the trace; offered load {load} of the GPUs\n",
            s.speed
        );
    }
    if let Some(asked) = s.asked_share {
        let drawn = if s.demand == 1.0 {
            String::new()
        } else {
            format!(", drawn {}× from the trace", s.demand)
        };
        let _ = writeln!(
            out,
            "All {} workloads{drawn} at once would ask {:.1} % of the GPUs\n",
            s.workloads,
            asked * 100.0
        );
    }
    let width = 12;
    let _ = write!(out, "{:<28}", "");
    for r in &s.runs {
        let _ = write!(out, "{:>width$}", r.placement);
    }
    out.push('\n');
    let row = |out: &mut String, name: &str, f: &dyn Fn(&RunReport) -> String| {
        let _ = write!(out, "{name:<28}");
        for r in &s.runs {
            let _ = write!(out, "{:>width$}", f(r));
        }
        out.push('\n');
    };
    row(&mut out, "mean GPU allocation", &|r| {
        format!("{:.2} %", r.mean_allocation * 100.0)
    });
    row(&mut out, "queueing delay p50", &|r| {
        seconds(r.queueing_delay.p50)
    });
    row(&mut out, "queueing delay p99", &|r| {
        seconds(r.queueing_delay.p99)
    });
    row(&mut out, "wait p99, waiting counted", &|r| {
        seconds(r.waiting.p99)
    });
    row(&mut out, "started", &|r| r.started.to_string());
    row(&mut out, "never started", &|r| r.never_started.to_string());
    row(&mut out, "GPU-hours used", &|r| {
        format!("{:.1}", r.gpu_hours_used)
    });
    row(&mut out, "preemptions", &|r| r.preemptions.to_string());
    row(&mut out, "GPU-hours lost to preemption", &|r| {
        format!("{:.1}", r.gpu_hours_lost)
    });
    row(&mut out, "MIG reconfigurations", &|r| {
        r.reconfigurations.to_string()
    });
    row(&mut out, "admissions left unplaced", &|r| {
        r.unplaced_admissions.to_string()
    });
    row(&mut out, "cycles solved", &|r| r.cycles.to_string());
    row(&mut out, "cycles at the time limit", &|r| {
        r.cycles_time_limited.to_string()
    });
    for r in &s.runs {
        let _ = writeln!(out, "\n{} per tenant:", r.placement);
        let _ = writeln!(
            out,
            "  {:<20} {:>9} {:>8} {:>9} {:>9} {:>11} {:>8} {:>8} {:>11}",
            "tenant",
            "workloads",
            "started",
            "p50",
            "p99",
            "GPU-hours",
            "share",
            "weight",
            "preempted"
        );
        for t in &r.tenants {
            let _ = writeln!(
                out,
                "  {:<20} {:>9} {:>8} {:>9} {:>9} {:>11.1} {:>6.1} % {:>6.1} % {:>11}",
                t.tenant,
                t.workloads,
                t.started,
                seconds(t.queueing_delay.p50),
                seconds(t.queueing_delay.p99),
                t.gpu_hours,
                t.share * 100.0,
                t.weight_share * 100.0,
                t.preemptions
            );
        }
        let _ = writeln!(out, "{} per SLO class:", r.placement);
        for c in &r.slo_classes {
            let Delays { p50, p99, .. } = c.queueing_delay;
            let _ = writeln!(
                out,
                "  {:<20} {:>9} {:>8} {:>9} {:>9}",
                c.slo_class,
                c.workloads,
                c.started,
                seconds(p50),
                seconds(p99)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_the_language_writes_them() {
        assert_eq!(seconds(None), "-");
        assert_eq!(seconds(Some(9)), "9s");
        assert_eq!(seconds(Some(125)), "2m05s");
        assert_eq!(seconds(Some(7320)), "2h02m");
    }
}
