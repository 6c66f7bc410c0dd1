//! The load: submissions over real HTTP, each as its tenant, and what the API then shows of
//! them. A steady run submits on a fixed schedule (open loop: a slow service does not slow the
//! arrivals) and follows each workload by polling `GET /v1/workloads/{name}`; a burst submits
//! as fast as a few clients can and counts the workloads running.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tessera_solver::bench_fleet::Submissions;

/// How often a followed workload is polled: the resolution of the steady run's latencies.
pub const POLL: Duration = Duration::from_millis(5);
/// How often the burst counts running workloads.
pub const BURST_POLL: Duration = Duration::from_millis(500);
/// How long a workload the service left waiting is still followed, in case it starts.
const WAITING_GRACE: Duration = Duration::from_secs(5);
/// The most a steady submission is followed, and a burst waited for without progress.
const GIVE_UP: Duration = Duration::from_secs(120);

/// The next submission as `POST /v1/workloads` takes it: its tenant and the request body.
fn request(submissions: &mut Submissions, name: &str) -> (String, Value) {
    let spec = submissions.next_spec();
    (spec.tenant.clone(), json!({"name": name, "spec": spec}))
}

/// An HTTP client of the service under test, with every tenant's token.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    admin: String,
    tokens: BTreeMap<String, String>,
}

impl Client {
    pub fn new(base: String, admin: String, tokens: BTreeMap<String, String>) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Client {
            base,
            agent,
            admin,
            tokens,
        }
    }

    fn token(&self, tenant: Option<&str>) -> anyhow::Result<&str> {
        match tenant {
            None => Ok(&self.admin),
            Some(t) => self
                .tokens
                .get(t)
                .map(String::as_str)
                .with_context(|| format!("no token for tenant {t}")),
        }
    }

    /// `GET path` as `tenant` (the operator when `None`): the status and the body's text.
    pub fn get(&self, tenant: Option<&str>, path: &str) -> anyhow::Result<(u16, String)> {
        let mut response = self
            .agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token(tenant)?))
            .call()
            .with_context(|| format!("GET {path}"))?;
        let text = response.body_mut().read_to_string()?;
        Ok((response.status().as_u16(), text))
    }

    pub fn get_json(&self, tenant: Option<&str>, path: &str) -> anyhow::Result<Value> {
        let (status, text) = self.get(tenant, path)?;
        if status != 200 {
            bail!("GET {path}: HTTP {status}: {text}");
        }
        serde_json::from_str(&text).with_context(|| format!("GET {path}: not JSON"))
    }

    /// `POST /v1/workloads` as `tenant`: the status and the body's text.
    pub fn submit(&self, tenant: &str, body: &Value) -> anyhow::Result<(u16, String)> {
        let mut response = self
            .agent
            .post(format!("{}/v1/workloads", self.base))
            .header(
                "Authorization",
                format!("Bearer {}", self.token(Some(tenant))?),
            )
            .content_type("application/json")
            .send(serde_json::to_string(body)?)
            .context("POST /v1/workloads")?;
        let text = response.body_mut().read_to_string()?;
        Ok((response.status().as_u16(), text))
    }
}

/// One steady submission as measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The POST's round trip.
    pub post: Duration,
    /// From the POST to the first poll that showed a decision about it (admitted, or left
    /// waiting with a reason).
    pub decided: Option<Duration>,
    /// From the POST to the first poll that showed it running.
    pub running: Option<Duration>,
    /// The reason it was left waiting, when it never ran while followed.
    pub waiting: Option<String>,
}

/// Submits `rate` workloads a second for `duration`, each on its own thread, and follows each
/// until it runs (or waits for a reason longer than [`WAITING_GRACE`]).
pub fn steady(
    client: &Client,
    submissions: &mut Submissions,
    rate: u32,
    duration: Duration,
) -> anyhow::Result<Vec<Sample>> {
    let count = (f64::from(rate) * duration.as_secs_f64()).round() as usize;
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    std::thread::scope(|scope| {
        for i in 0..count {
            let due = start + interval * i as u32;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let name = format!("steady-{i}");
            let (tenant, body) = request(submissions, &name);
            let tx = tx.clone();
            scope.spawn(move || {
                let _ = tx.send(follow(client, &tenant, &name, &body));
            });
        }
    });
    drop(tx);
    rx.into_iter().collect()
}

fn follow(client: &Client, tenant: &str, name: &str, body: &Value) -> anyhow::Result<Sample> {
    let t0 = Instant::now();
    let (status, text) = client.submit(tenant, body)?;
    if status != 201 {
        bail!("submitting {tenant}/{name}: HTTP {status}: {text}");
    }
    let mut sample = Sample {
        post: t0.elapsed(),
        decided: None,
        running: None,
        waiting: None,
    };
    let path = format!("/v1/workloads/{name}");
    loop {
        let view = client.get_json(Some(tenant), &path)?;
        let at = t0.elapsed();
        let phase = view["phase"].as_str().unwrap_or_default();
        if sample.decided.is_none() && (phase != "pending" || !view["decidedAt"].is_null()) {
            sample.decided = Some(at);
        }
        if phase == "running" {
            sample.running = Some(at);
            return Ok(sample);
        }
        if phase != "pending" && phase != "starting" {
            bail!("{tenant}/{name} is {phase}, not running");
        }
        if let Some(decided) = sample.decided
            && phase == "pending"
            && at > decided + WAITING_GRACE
        {
            sample.waiting = Some(view["reason"].as_str().unwrap_or("unknown").to_owned());
            return Ok(sample);
        }
        if at > GIVE_UP {
            bail!("{tenant}/{name} was not decided within {GIVE_UP:?}: {view}");
        }
        std::thread::sleep(POLL);
    }
}

/// What a burst measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Burst {
    pub submitted: usize,
    /// Until the last POST returned.
    pub submitting: Duration,
    /// Until every submission was seen running (at [`BURST_POLL`] resolution), or until it
    /// stopped progressing.
    pub settled: Duration,
    pub running: usize,
    /// Left waiting, by reason.
    pub waiting: BTreeMap<String, usize>,
}

/// Submits `count` workloads named `{prefix}-{i}` from `clients` threads as fast as they are
/// answered, and counts those running until all are, or until none has started for
/// [`GIVE_UP`].
pub fn burst(
    client: &Client,
    submissions: &mut Submissions,
    prefix: &str,
    count: usize,
    clients: usize,
) -> anyhow::Result<Burst> {
    let work: Vec<(String, String, Value)> = (0..count)
        .map(|i| {
            let name = format!("{prefix}-{i}");
            let (tenant, body) = request(submissions, &name);
            (tenant, name, body)
        })
        .collect();
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let submitting = std::thread::scope(|scope| -> anyhow::Result<Duration> {
        let workers: Vec<_> = (0..clients.max(1))
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((tenant, name, body)) = work.get(i) else {
                            return Ok(());
                        };
                        let (status, text) = client.submit(tenant, body)?;
                        if status != 201 {
                            bail!("submitting {tenant}/{name}: HTTP {status}: {text}");
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        }
        Ok(start.elapsed())
    })?;

    let prefix = format!("{prefix}-");
    let mut last = (0usize, Instant::now());
    loop {
        let listed = client.get_json(None, "/v1/workloads")?;
        let at = start.elapsed();
        let mut running = 0;
        let mut waiting: BTreeMap<String, usize> = BTreeMap::new();
        for w in listed["workloads"].as_array().into_iter().flatten() {
            if !w["name"].as_str().is_some_and(|n| n.starts_with(&prefix)) {
                continue;
            }
            match w["phase"].as_str() {
                Some("running") => running += 1,
                Some("pending") => {
                    let reason = w["reason"].as_str().unwrap_or("undecided").to_owned();
                    *waiting.entry(reason).or_default() += 1;
                }
                _ => {}
            }
        }
        if running > last.0 {
            last = (running, Instant::now());
        }
        let undecided = waiting.get("undecided").copied().unwrap_or(0);
        if running == count || (last.1.elapsed() > GIVE_UP && undecided == 0) {
            return Ok(Burst {
                submitted: count,
                submitting,
                settled: at,
                running,
                waiting,
            });
        }
        if last.1.elapsed() > GIVE_UP {
            bail!(
                "the burst stopped progressing: {running} of {count} running, {undecided} undecided"
            );
        }
        std::thread::sleep(BURST_POLL);
    }
}

/// The `q` quantile (0 to 1) of `values` by nearest rank; `None` when empty.
pub fn quantile(values: &[Duration], q: f64) -> Option<Duration> {
    let mut sorted = values.to_vec();
    sorted.sort();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

/// The sum over every series of metric `name` in a Prometheus text exposition.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The series of counter `name` by the value of its one label, e.g.
/// `tessera_full_solves_total{reason="changed"} 3`.
pub fn metric_by_label(text: &str, name: &str) -> BTreeMap<String, f64> {
    let mut by = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(labels) = line.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((labels, value)) = labels.split_once("} ") else {
            continue;
        };
        let Some(label) = labels.split_once('=').map(|(_, v)| v.trim_matches('"')) else {
            continue;
        };
        if let Ok(value) = value.trim().parse::<f64>() {
            *by.entry(label.to_owned()).or_default() += value;
        }
    }
    by
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let ms: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(quantile(&ms, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&ms, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(quantile(&ms, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(
            quantile(&[Duration::from_millis(7)], 0.99),
            Some(Duration::from_millis(7))
        );
    }

    #[test]
    fn labelled_series_by_their_label() {
        let text = "# HELP x\ntessera_full_solves_total{reason=\"changed\"} 3\n\
                    tessera_full_solves_total{reason=\"none\"} 1\n\
                    tessera_full_solves_totally{reason=\"x\"} 9\n";
        let by = metric_by_label(text, "tessera_full_solves_total");
        assert_eq!(by.len(), 2);
        assert_eq!(by["changed"], 3.0);
        assert_eq!(by["none"], 1.0);
    }

    #[test]
    fn metrics_sum_over_series_and_match_whole_names() {
        let text = "# HELP tessera_cycles Reconcile cycles run\n\
                    tessera_cycles_total 12\n\
                    tessera_cycles_total_extra 5\n\
                    tessera_actions_total{kind=\"start\",result=\"ok\"} 3\n\
                    tessera_actions_total{kind=\"stop\",result=\"ok\"} 4.5\n";
        assert_eq!(metric(text, "tessera_cycles_total"), 12.0);
        assert_eq!(metric(text, "tessera_actions_total"), 7.5);
        assert_eq!(metric(text, "tessera_absent"), 0.0);
    }
}
