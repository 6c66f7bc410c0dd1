//! Results (serde-serialisable, for a JSON output), the published figures
//! (`fgd-paper-results.csv`) and the side-by-side table.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::protocol::{CHECKPOINTS, SimConfig};
use super::trace::TraceError;

/// One policy, one seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedResult {
    pub seed: u64,
    /// Allocation ratio (%) at each checkpoint, in [`SimConfig::checkpoints`] order.
    pub alloc_at: Vec<f64>,
    /// Arrived GPU request at the end, % of capacity.
    pub arrived_pct: f64,
    pub final_alloc_pct: f64,
    /// Tasks in the scaled list.
    pub tasks: usize,
    pub placed: usize,
    pub skipped: usize,
    /// Where the idle GPU capacity is at the end of the run.
    #[serde(default)]
    pub idle_at_end: IdleAtEnd,
    /// The cluster when the first GPU task was refused; `None` if every one was placed.
    #[serde(default)]
    pub first_refusal: Option<FirstRefusal>,
}

/// The cluster when a run first refused a GPU task, per GPU model: where the CPU had gone by
/// then, to GPU tasks or to CPU-only tasks, and how much idle GPU capacity sat on nodes out of
/// CPU. Two policies whose GPU tasks took about the same cores per model, but whose CPU-only
/// tasks did not, differ in where the CPU-only tasks were placed, not the GPU tasks
/// (BENCHMARKS.md, openb: "Where the CPU went by the first refusal").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstRefusal {
    /// Arrived GPU request at the refusal, % of capacity.
    pub arrived_pct: f64,
    /// Allocated GPU at the refusal, % of capacity.
    pub alloc_pct: f64,
    /// One per GPU model, in the cluster's order.
    pub models: Vec<ModelState>,
}

/// One GPU model's nodes (see [`FirstRefusal`]). GPUs and cores, not milli.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelState {
    pub model: String,
    /// Idle GPU capacity.
    pub idle_gpus: f64,
    /// Of it, on nodes with less CPU left than any GPU task of the trace that may use the
    /// model asks ([`IdleAtEnd::cpu_stranded`]'s rule).
    pub cpu_stranded_gpus: f64,
    pub cores_left: f64,
    /// Cores taken by GPU tasks.
    pub cores_of_gpu_tasks: f64,
    /// Cores taken by CPU-only tasks.
    pub cores_of_cpu_only_tasks: f64,
}

/// Where a run's idle GPU capacity is at its end, in GPUs: what the arrivals that did not fit
/// were refused with. A policy that ends with idle capacity on free GPUs or on nodes out of CPU
/// placed earlier work where it strands what later work needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct IdleAtEnd {
    /// All the idle GPU capacity.
    pub idle: f64,
    /// Of it, on GPUs that hold nothing.
    pub on_free_gpus: f64,
    /// Of it, on nodes with less CPU left than any GPU task of the trace that may use the
    /// node's GPU model asks: no task of the trace could use it, whatever its GPUs offer.
    pub cpu_stranded: f64,
}

/// One policy over its seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyResult {
    pub policy: String,
    pub seeds: Vec<u64>,
    pub checkpoints: Vec<u32>,
    /// Mean over the seeds at each checkpoint (seeds with no value there left out; NaN, written
    /// as `null`, if none has one).
    pub mean_alloc_at: Vec<f64>,
    pub per_seed: Vec<SeedResult>,
}

impl PolicyResult {
    pub fn from_seeds(policy: &str, checkpoints: &[u32], per_seed: Vec<SeedResult>) -> Self {
        let mean_alloc_at = (0..checkpoints.len())
            .map(|j| {
                let vals: Vec<f64> = per_seed
                    .iter()
                    .map(|s| s.alloc_at[j])
                    .filter(|v| !v.is_nan())
                    .collect();
                if vals.is_empty() {
                    f64::NAN
                } else {
                    vals.iter().sum::<f64>() / vals.len() as f64
                }
            })
            .collect();
        Self {
            policy: policy.to_string(),
            seeds: per_seed.iter().map(|s| s.seed).collect(),
            checkpoints: checkpoints.to_vec(),
            mean_alloc_at,
            per_seed,
        }
    }

    /// [`SeedResult::idle_at_end`], the mean over the seeds.
    pub fn mean_idle_at_end(&self) -> IdleAtEnd {
        let n = self.per_seed.len().max(1) as f64;
        let sum = |f: fn(&IdleAtEnd) -> f64| {
            self.per_seed.iter().map(|s| f(&s.idle_at_end)).sum::<f64>() / n
        };
        IdleAtEnd {
            idle: sum(|i| i.idle),
            on_free_gpus: sum(|i| i.on_free_gpus),
            cpu_stranded: sum(|i| i.cpu_stranded),
        }
    }

    /// The mean at checkpoint `k` (percent), if it is one of this result's checkpoints.
    pub fn at(&self, k: u32) -> Option<f64> {
        let j = self.checkpoints.iter().position(|&c| c == k)?;
        Some(self.mean_alloc_at[j])
    }
}

/// Every policy on one trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceResult {
    pub trace: String,
    pub config: SimConfig,
    pub nodes: usize,
    pub gpu_capacity_milli: u64,
    pub tasks_in_trace: usize,
    pub trace_gpu_request_milli: u64,
    /// Number of FGD typical shapes.
    pub typical_shapes: usize,
    pub policies: Vec<PolicyResult>,
    /// The LP upper bound on allocation at each checkpoint, mean over the seeds, when computed
    /// ([`super::mean_bound_at`]): no policy can do better.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<Vec<f64>>,
}

impl TraceResult {
    pub fn policy(&self, name: &str) -> Option<&PolicyResult> {
        self.policies.iter().find(|p| p.policy == name)
    }
}

/// One row of `fgd-paper-results.csv`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaperRow {
    pub trace: String,
    pub policy: String,
    pub seeds: u32,
    /// Allocation ratio (%) at [`CHECKPOINTS`].
    pub alloc_at: [f64; 7],
}

/// The published figures.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PaperResults {
    pub rows: Vec<PaperRow>,
}

impl PaperResults {
    /// Reads `fgd-paper-results.csv` (`trace,policy,seeds,alloc_at_50,...,alloc_at_130`).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses the CSV text; `path` only names the file in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, TraceError> {
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let header: Vec<&str> = match lines.next() {
            Some((_, h)) => h.split(',').map(str::trim).collect(),
            None => {
                return Err(TraceError::Empty {
                    path: path.to_path_buf(),
                });
            }
        };
        let col = |name: &'static str| {
            header
                .iter()
                .position(|h| *h == name)
                .ok_or(TraceError::MissingColumn {
                    path: path.to_path_buf(),
                    column: name,
                })
        };
        let c_trace = col("trace")?;
        let c_policy = col("policy")?;
        let c_seeds = col("seeds")?;
        let names = [
            "alloc_at_50",
            "alloc_at_80",
            "alloc_at_90",
            "alloc_at_100",
            "alloc_at_110",
            "alloc_at_120",
            "alloc_at_130",
        ];
        let mut c_alloc = [0usize; 7];
        for (c, name) in c_alloc.iter_mut().zip(names) {
            *c = col(name)?;
        }
        let mut rows = Vec::new();
        for (i, line) in lines {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            let bad = |message: String| TraceError::BadRow {
                path: path.to_path_buf(),
                line: i + 1,
                message,
            };
            if f.len() != header.len() {
                return Err(bad(format!(
                    "expected {} fields, found {}",
                    header.len(),
                    f.len()
                )));
            }
            let mut alloc_at = [0.0; 7];
            for (v, &c) in alloc_at.iter_mut().zip(&c_alloc) {
                *v = f[c]
                    .parse()
                    .map_err(|_| bad(format!("`{}` is not a number: {:?}", header[c], f[c])))?;
            }
            rows.push(PaperRow {
                trace: f[c_trace].to_string(),
                policy: f[c_policy].to_string(),
                seeds: f[c_seeds]
                    .parse()
                    .map_err(|_| bad(format!("`seeds` is not an integer: {:?}", f[c_seeds])))?,
                alloc_at,
            });
        }
        Ok(Self { rows })
    }

    pub fn get(&self, trace: &str, policy: &str) -> Option<&PaperRow> {
        self.rows
            .iter()
            .find(|r| r.trace == trace && r.policy.eq_ignore_ascii_case(policy))
    }

    /// The published value at checkpoint `k`, if `k` is one of [`CHECKPOINTS`].
    pub fn at(&self, trace: &str, policy: &str, k: u32) -> Option<f64> {
        let j = CHECKPOINTS.iter().position(|&c| c == k)?;
        self.get(trace, policy).map(|r| r.alloc_at[j])
    }
}

fn fmt_val(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:7.2}"),
        _ => format!("{:>7}", "-"),
    }
}

fn fmt_diff(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:+7.2}"),
        _ => format!("{:>7}", "-"),
    }
}

/// The worst checkpoint of `policy` against `baseline` in the same run: the least of
/// `policy − baseline` over the checkpoints where both have a value, and that checkpoint.
/// `None` if either policy is missing or no checkpoint has both.
pub fn worst_vs(result: &TraceResult, policy: &str, baseline: &str) -> Option<(f64, u32)> {
    let (p, b) = (result.policy(policy)?, result.policy(baseline)?);
    result
        .config
        .checkpoints
        .iter()
        .filter_map(|&k| {
            let d = p.at(k)? - b.at(k)?;
            d.is_finite().then_some((d, k))
        })
        .min_by(|x, y| x.0.total_cmp(&y.0))
}

/// The side-by-side table: per policy three lines (ours, paper, ours − paper) over the
/// checkpoints of `result`, paper lines only where the paper has the trace and policy; the last
/// column is the policy's worst checkpoint against FGD in this run ([`worst_vs`]).
pub fn comparison_table(result: &TraceResult, paper: &PaperResults) -> String {
    let checkpoints = &result.config.checkpoints;
    let mut out = String::new();
    let _ = write!(out, "{:<10} {:<6}", "policy", "");
    for k in checkpoints {
        let _ = write!(out, " {:>6}%", k);
    }
    out.push_str("   worst vs FGD\n");
    for p in &result.policies {
        let _ = write!(out, "{:<10} {:<6}", p.policy, "ours");
        for &k in checkpoints {
            let _ = write!(out, " {}", fmt_val(p.at(k)));
        }
        if p.policy != "FGD"
            && let Some((d, k)) = worst_vs(result, &p.policy, "FGD")
        {
            let _ = write!(out, "   {d:+.2} at {k}%");
        }
        out.push('\n');
        if paper.get(&result.trace, &p.policy).is_some() {
            let _ = write!(out, "{:<10} {:<6}", "", "paper");
            for &k in checkpoints {
                let _ = write!(out, " {}", fmt_val(paper.at(&result.trace, &p.policy, k)));
            }
            out.push('\n');
            let _ = write!(out, "{:<10} {:<6}", "", "diff");
            for &k in checkpoints {
                let d = match (p.at(k), paper.at(&result.trace, &p.policy, k)) {
                    (Some(a), Some(b)) => Some(a - b),
                    _ => None,
                };
                let _ = write!(out, " {}", fmt_diff(d));
            }
            out.push('\n');
        }
    }
    if let Some(bound) = &result.bound {
        let _ = write!(out, "{:<10} {:<6}", "LP bound", "");
        for b in bound {
            let _ = write!(out, " {}", fmt_val(Some(*b)));
        }
        out.push('\n');
    }
    out
}

/// Each policy's [`PolicyResult::mean_idle_at_end`], one row each.
pub fn idle_table(result: &TraceResult) -> String {
    let mut out = format!(
        "{:<11} {:>14} {:>14} {:>14} {:>16}\n",
        "idle at end", "GPUs idle", "on free GPUs", "on used GPUs", "on nodes no CPU"
    );
    for p in &result.policies {
        let i = p.mean_idle_at_end();
        let _ = writeln!(
            out,
            "{:<11} {:>14.1} {:>14.1} {:>14.1} {:>16.1}",
            p.policy,
            i.idle,
            i.on_free_gpus,
            i.idle - i.on_free_gpus,
            i.cpu_stranded
        );
    }
    out
}

/// Each policy's [`SeedResult::first_refusal`], per GPU model, the mean over the seeds that
/// refused a GPU task.
pub fn first_refusal_table(result: &TraceResult) -> String {
    let mut out = format!(
        "{:<13} {:>8} {:<9} {:>10} {:>16} {:>11} {:>16} {:>15}\n",
        "first refusal",
        "arrived",
        "model",
        "GPUs idle",
        "on nodes no CPU",
        "cores left",
        "cores GPU tasks",
        "cores CPU-only"
    );
    for p in &result.policies {
        let refusals: Vec<&FirstRefusal> = p
            .per_seed
            .iter()
            .filter_map(|s| s.first_refusal.as_ref())
            .collect();
        let Some(first) = refusals.first() else {
            let _ = writeln!(out, "{:<13} no GPU task refused", p.policy);
            continue;
        };
        let n = refusals.len() as f64;
        let mean =
            |f: &dyn Fn(&FirstRefusal) -> f64| refusals.iter().map(|r| f(r)).sum::<f64>() / n;
        let arrived = mean(&|r| r.arrived_pct);
        for (m, model) in first.models.iter().enumerate() {
            let of = |f: fn(&ModelState) -> f64| mean(&|r| r.models.get(m).map_or(0.0, f));
            let _ = writeln!(
                out,
                "{:<13} {:>8.2} {:<9} {:>10.1} {:>16.1} {:>11.0} {:>16.0} {:>15.0}",
                p.policy,
                arrived,
                model.model,
                of(|s| s.idle_gpus),
                of(|s| s.cpu_stranded_gpus),
                of(|s| s.cores_left),
                of(|s| s.cores_of_gpu_tasks),
                of(|s| s.cores_of_cpu_only_tasks)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAPER: &str = "trace,policy,seeds,alloc_at_50,alloc_at_80,alloc_at_90,alloc_at_100,alloc_at_110,alloc_at_120,alloc_at_130\n\
        default,BestFit,10,50.01,80.02,89.99,92.86,92.94,93.00,93.08\n\
        default,FGD,10,50.01,80.02,89.98,95.23,95.30,95.35,95.39\n";

    #[test]
    fn loads_paper_results_and_builds_the_table() {
        let paper = PaperResults::parse(Path::new("r.csv"), PAPER).unwrap();
        assert_eq!(paper.rows.len(), 2);
        assert_eq!(paper.at("default", "FGD", 130), Some(95.39));
        assert_eq!(paper.at("default", "fgd", 50), Some(50.01));
        assert_eq!(paper.at("default", "Random", 130), None);

        let seeds = vec![
            SeedResult {
                seed: 42,
                alloc_at: vec![50.0, 95.0, 95.0, 95.0, 95.0, 95.0, 95.0],
                arrived_pct: 129.9,
                final_alloc_pct: 95.0,
                tasks: 10,
                placed: 9,
                skipped: 1,
                idle_at_end: IdleAtEnd::default(),
                first_refusal: None,
            },
            SeedResult {
                seed: 43,
                alloc_at: vec![50.0, 95.0, 95.0, 95.0, 95.0, 95.0, 96.0],
                arrived_pct: 129.9,
                final_alloc_pct: 96.0,
                tasks: 10,
                placed: 9,
                skipped: 1,
                idle_at_end: IdleAtEnd::default(),
                first_refusal: None,
            },
        ];
        let fgd = PolicyResult::from_seeds("FGD", &CHECKPOINTS, seeds.clone());
        assert_eq!(fgd.at(130), Some(95.5));
        let ff = PolicyResult::from_seeds("FirstFit", &CHECKPOINTS, seeds);
        let result = TraceResult {
            trace: "default".into(),
            config: SimConfig::fgd_md(),
            nodes: 1,
            gpu_capacity_milli: 1000,
            tasks_in_trace: 10,
            trace_gpu_request_milli: 900,
            typical_shapes: 1,
            policies: vec![fgd, ff],
            bound: None,
        };
        let table = comparison_table(&result, &paper);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 1 + 3 + 1, "{table}");
        assert!(
            lines[1].starts_with("FGD") && lines[1].ends_with("95.50"),
            "{table}"
        );
        assert!(lines[2].contains("paper") && lines[2].ends_with("95.39"));
        assert!(lines[3].contains("diff") && lines[3].ends_with("+0.11"));
        assert!(lines[4].starts_with("FirstFit"));

        let json = serde_json::to_string(&result).unwrap();
        let back: TraceResult = serde_json::from_str(&json).unwrap();
        assert_eq!(back, result);

        // The first refusals: the mean over the seeds that refused, per model; a policy that
        // refused nothing says so.
        let mut result = result;
        let at = |arrived_pct: f64, cores: f64| FirstRefusal {
            arrived_pct,
            alloc_pct: arrived_pct,
            models: vec![ModelState {
                model: "G2".into(),
                idle_gpus: 2.0,
                cpu_stranded_gpus: 1.0,
                cores_left: 4.0,
                cores_of_gpu_tasks: cores,
                cores_of_cpu_only_tasks: 100.0 - cores,
            }],
        };
        result.policies[0].per_seed[0].first_refusal = Some(at(90.0, 60.0));
        result.policies[0].per_seed[1].first_refusal = Some(at(92.0, 80.0));
        let table = first_refusal_table(&result);
        let lines: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert_eq!(
            lines[1],
            ["FGD", "91.00", "G2", "2.0", "1.0", "4", "70", "30"],
            "{table}"
        );
        assert_eq!(lines[2].join(" "), "FirstFit no GPU task refused");
        // A report written before the record existed still reads.
        let old = json.replace(",\"first_refusal\":null", "");
        assert!(!old.contains("first_refusal"));
        assert!(serde_json::from_str::<TraceResult>(&old).is_ok());
    }

    #[test]
    fn bad_paper_rows_name_the_line() {
        let text = "trace,policy,seeds,alloc_at_50,alloc_at_80,alloc_at_90,alloc_at_100,alloc_at_110,alloc_at_120,alloc_at_130\n\
                    default,FGD,10,50,80,90,x,1,1,1\n";
        let msg = PaperResults::parse(Path::new("r.csv"), text)
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("r.csv:2:"), "{msg}");
    }
}
