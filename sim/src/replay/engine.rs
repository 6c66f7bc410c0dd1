//! The discrete-event replay: cycles of the production solver over simulated time.
//!
//! Time is in seconds from the start of the replay; instants given to the solver are that plus
//! [`ReplayConfig::epoch`]. A cycle runs at every multiple of [`ReplayConfig::cycle`] at which
//! something happened since the last one that could change a decision: an arrival; while work
//! waits, a departure, an admission or preemption in the last cycle (the victim is queued
//! again), or a running workload passing its class's `minRuntime` (it may be preempted from
//! then on). A cycle with none of these would see the snapshot the last cycle left, whose
//! decision has been carried out, with nothing new to place, and is skipped; a departure with
//! nothing waiting is recorded at its own instant and decided at the next cycle that runs.
//! This is what makes a months-long trace replayable, and it is where the replay differs from
//! a service that solves every period: time alone moves fair-share decay, which the replay
//! weighs at the next cycle it runs.
//!
//! Each cycle builds a `ClusterState` snapshot (nodes with their MIG geometry, running work
//! with bindings, waiting work in submission order, and the usage record, reservations and
//! reconfiguration records the last decision carried forward, as the service carries them) and
//! runs [`tessera_solver::solve`], the full cycle the service runs at each period. (The
//! service's incremental session answers only submissions that arrive between two periods;
//! a replay that decides once per period has none.) The decision is then applied as the service
//! applies it:
//!
//! - `admit`: the workload starts at the cycle's instant on the decision's bindings (or, under
//!   a baseline placement, where the baseline puts it: see [`super::baseline`]);
//! - `preempt`: the GPU-seconds the decision reports lost since the workload's last checkpoint
//!   are counted lost, and that much run time is owed again; the workload records a checkpoint
//!   at the stop and is queued again with its original submission instant (the service's
//!   `requeue`). The grace period is not simulated: the capacity is free at once, as the
//!   decision counts it;
//! - MIG geometry: every GPU whose target differs from its current instances takes the target
//!   (one reconfiguration each).
//!
//! A workload departs when it has run its duration; its GPUs are free from that instant, and
//! the next cycle may use them.
//!
//! The policy's committed workloads (`kind: Workload` in the repository) that the trace does
//! not name join it as workloads arriving at the start, running for their `maxDuration` or
//! until the end: the service submits what the repository declares, and a snapshot without
//! them would show them waiting at every cycle.

use std::collections::HashMap;
use std::time::Duration as WallDuration;

use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::{
    Binding, ClusterStateSpec, MigInstance, Node, PendingWorkload, ReconfigurationRecord,
    ReservationRecord, RunningWorkload, UsageRecord,
};
use tessera_compiler::units::{Gpus, unix};
use tessera_solver::decision::{Outcome, RefineStatus, ReplicaBinding};
use tessera_solver::{Listing, SolveError, SolveOptions};

use super::baseline::BaselinePlacer;
use super::metrics::{Metrics, RunReport};
use super::trace::TraceWorkload;

/// How to replay.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayConfig {
    /// Seconds between two cycles.
    pub cycle: i64,
    /// The refinement budget of one cycle's solve (the heuristic ignores it).
    pub time_limit: WallDuration,
    /// The Unix instant of time 0, for the snapshots' instants.
    pub epoch: i64,
    /// Stop at this many seconds; `None`: when every workload has left or can no longer start.
    pub horizon: Option<i64>,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            cycle: 10,
            time_limit: WallDuration::from_secs(2),
            // 2026-01-01T00:00:00Z
            epoch: 1_767_225_600,
            horizon: None,
        }
    }
}

/// Where admitted work goes: where the solver says, or where a baseline placer says (the
/// solver still decides who is admitted and who is preempted).
pub enum Placement<'a> {
    Solver,
    Baseline(&'a mut dyn BaselinePlacer),
}

/// Why a replay stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cycle at {at}s: {source}")]
    Solve {
        at: i64,
        #[source]
        source: SolveError,
    },
    #[error("the trace has no workloads")]
    EmptyTrace,
    #[error("the cycle must be at least one second")]
    BadCycle,
    #[error("workload `{tenant}/{name}` appears twice in the trace")]
    Duplicate { tenant: String, name: String },
}

/// One workload's life in the replay.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) trace: usize,
    pub(crate) state: JobState,
    /// Seconds of run still owed, at `since` while running; `None`: runs forever.
    pub(crate) remaining: Option<i64>,
    pub(crate) first_start: Option<i64>,
    pub(crate) last_checkpoint: Option<i64>,
}

#[derive(Debug, Clone)]
pub(crate) enum JobState {
    Future,
    Waiting,
    Running {
        since: i64,
        bindings: Vec<Binding>,
        gpus: Gpus,
        pool: String,
    },
    Done {
        at: i64,
    },
}

impl Job {
    fn end(&self) -> Option<i64> {
        match (&self.state, self.remaining) {
            (JobState::Running { since, .. }, Some(r)) => Some(since + r),
            _ => None,
        }
    }
}

/// Replays `trace` on `nodes` under `policy`. `progress` is told the simulated second of each
/// cycle (for a progress bar; it cannot change the run).
pub fn replay(
    policy: &CompiledPolicy,
    nodes: &[Node],
    trace: &[TraceWorkload],
    config: &ReplayConfig,
    mut placement: Placement<'_>,
    progress: &mut dyn FnMut(i64),
) -> Result<RunReport, ReplayError> {
    if trace.is_empty() {
        return Err(ReplayError::EmptyTrace);
    }
    if config.cycle < 1 {
        return Err(ReplayError::BadCycle);
    }
    let committed = committed_jobs(policy, trace);
    let extended: Vec<TraceWorkload>;
    let trace = if committed.is_empty() {
        trace
    } else {
        extended = [trace, &committed].concat();
        &extended
    };
    // Arrival order, stable: the queue's submission order.
    let mut order: Vec<usize> = (0..trace.len()).collect();
    order.sort_by_key(|&i| (trace[i].arrival, i));
    let mut by_key: HashMap<(String, String), usize> = HashMap::with_capacity(trace.len());
    for (i, w) in trace.iter().enumerate() {
        if by_key
            .insert((w.spec.tenant.clone(), w.name.clone()), i)
            .is_some()
        {
            return Err(ReplayError::Duplicate {
                tenant: w.spec.tenant.clone(),
                name: w.name.clone(),
            });
        }
    }
    let mut jobs: Vec<Job> = trace
        .iter()
        .enumerate()
        .map(|(i, w)| Job {
            trace: i,
            state: JobState::Future,
            remaining: w.duration,
            first_start: None,
            last_checkpoint: None,
        })
        .collect();
    let mut nodes: Vec<Node> = nodes.to_vec();
    let mut carried = Carried::default();
    let mut metrics = Metrics::new(policy, &nodes, trace);
    // The waiting queue, in submission order (indices into `trace`).
    let mut queue: Vec<usize> = Vec::new();
    // Each workload's rank in the order the service's snapshot lists running work in (tenant,
    // then name: `tessera_reconciler::snapshot::cluster_state`), which the solver sorts by:
    // each cycle's sort of the running list is then one pass.
    let rank = {
        let mut keyed: Vec<usize> = (0..trace.len()).collect();
        keyed.sort_by(|&a, &b| {
            (&trace[a].spec.tenant, &trace[a].name).cmp(&(&trace[b].spec.tenant, &trace[b].name))
        });
        let mut rank = vec![0; trace.len()];
        for (r, i) in keyed.into_iter().enumerate() {
            rank[i] = r;
        }
        rank
    };
    // Each workload's class's minRuntime where the class is preemptible, looked up once (the
    // next cycle is sought over every job at every cycle).
    let min_runtime: Vec<Option<i64>> = trace
        .iter()
        .map(|w| {
            policy
                .slo_class(&w.spec.slo_class)
                .filter(|c| c.preemptible && c.min_runtime_seconds > 0)
                .map(|c| i64::try_from(c.min_runtime_seconds).unwrap_or(i64::MAX))
        })
        .collect();
    // The last snapshot's running work, taken back for the next (see `running_list`).
    let mut lent = Lent::default();
    let mut next_arrival = 0usize;
    // The instant of the last cycle; the first may come at 0.
    let mut now = -1i64;
    // Something happened since the last cycle.
    let mut dirty = false;
    loop {
        // The next cycle: the first boundary at or after the next thing that can change a
        // decision.
        let next_event = next_event(
            &jobs,
            trace,
            &order,
            next_arrival,
            &queue,
            &min_runtime,
            now,
            dirty,
            config.cycle,
        );
        let Some(at) = next_event else { break };
        let cycle_at = ceil_to(at, config.cycle);
        if config.horizon.is_some_and(|h| cycle_at > h) {
            break;
        }
        // Departures up to the cycle, each at its own instant.
        depart(&mut jobs, cycle_at, &mut metrics);
        while next_arrival < order.len() && trace[order[next_arrival]].arrival <= cycle_at {
            let i = order[next_arrival];
            jobs[i].state = JobState::Waiting;
            queue.push(i);
            next_arrival += 1;
        }
        now = cycle_at;
        progress(now);
        // The nodes lent to the snapshot and taken back: the replay's own state between cycles
        // (copying every node into each snapshot was a few per cent of a day's replay).
        let state = snapshot(
            std::mem::take(&mut nodes),
            running_list(&jobs, &rank, trace, config.epoch, &mut lent),
            trace,
            &queue,
            &carried,
            config.epoch,
            now,
        );
        let decision = tessera_solver::solve(
            policy,
            &state,
            &SolveOptions {
                time_limit: config.time_limit,
                now: Some(config.epoch + now),
                // The replay carries out admissions and preemptions only.
                listing: Listing::Changes,
            },
        );
        nodes = state.nodes;
        lent.entries = state.running;
        let decision = decision.map_err(|source| ReplayError::Solve { at: now, source })?;
        metrics.cycle(
            decision
                .pools
                .iter()
                .filter_map(|p| p.refinement.as_ref())
                .any(|r| matches!(r.status, RefineStatus::TimeLimit)),
        );
        dirty = false;

        // Preemptions first: their capacity is what admissions may use.
        for wd in &decision.workloads {
            let Outcome::Preempt {
                lost_gpu_seconds, ..
            } = &wd.outcome
            else {
                continue;
            };
            let Some(&i) = by_key.get(&(wd.tenant.clone(), wd.name.clone())) else {
                continue;
            };
            let job = &mut jobs[i];
            let JobState::Running { since, gpus, .. } = &job.state else {
                continue;
            };
            let (since, gpus) = (*since, *gpus);
            let gpu_count = gpus.units() as f64 / Gpus::UNITS_PER_GPU as f64;
            let lost = lost_gpu_seconds.max(0.0);
            // The run time since the last checkpoint is owed again.
            let lost_span = if gpu_count > 0.0 {
                (lost / gpu_count).round() as i64
            } else {
                0
            };
            job.remaining = job
                .remaining
                .map(|r| (r - (now - since)).max(0) + lost_span.min(now - since));
            job.last_checkpoint = Some(now);
            job.state = JobState::Waiting;
            queue.push(i);
            metrics.stop(i, now, gpus);
            metrics.preempted(i, lost);
            dirty = true;
        }
        queue.sort_by_key(|&i| (trace[i].arrival, i));

        let admitted: Vec<(usize, &Vec<ReplicaBinding>, Gpus, String)> = decision
            .workloads
            .iter()
            .filter_map(|wd| match &wd.outcome {
                Outcome::Admit {
                    bindings,
                    guaranteed,
                    borrowed,
                } => by_key.get(&(wd.tenant.clone(), wd.name.clone())).map(|&i| {
                    (
                        i,
                        bindings,
                        Gpus::from_units(guaranteed.units() + borrowed.units()),
                        wd.pool.clone().unwrap_or_default(),
                    )
                }),
                _ => None,
            })
            .collect();
        let placed: Vec<Option<Vec<Binding>>> = match &mut placement {
            Placement::Solver => admitted
                .iter()
                .map(|(_, b, _, _)| Some(b.iter().map(ReplicaBinding::binding).collect()))
                .collect(),
            Placement::Baseline(placer) => {
                let requests: Vec<super::baseline::Request<'_>> = admitted
                    .iter()
                    .map(|(i, b, _, pool)| super::baseline::Request {
                        spec: &trace[*i].spec,
                        pool,
                        solver: b,
                    })
                    .collect();
                super::baseline::place(*placer, policy, &nodes, &jobs, trace, &requests)
            }
        };
        for ((i, _, gpus, pool), bindings) in admitted.into_iter().zip(placed) {
            let Some(bindings) = bindings else {
                metrics.unplaced();
                continue;
            };
            let job = &mut jobs[i];
            if job.first_start.is_none() {
                job.first_start = Some(now);
                metrics.started(i, now - trace[i].arrival);
            }
            job.state = JobState::Running {
                since: now,
                bindings,
                gpus,
                pool,
            };
            metrics.start(i, now, gpus);
            queue.retain(|&q| q != i);
            dirty = true;
        }

        // With nothing waiting, the decision just carried out stands until the next arrival.
        dirty &= !queue.is_empty();
        for g in &decision.geometry {
            if !g.changes() {
                continue;
            }
            metrics.reconfigured();
            if let Some(node) = nodes.iter_mut().find(|n| n.name == g.node)
                && let Some(gpu) = node.gpus.iter_mut().find(|x| x.index == g.gpu)
            {
                gpu.mig.enabled = true;
                gpu.mig.pending = None;
                gpu.instances = g
                    .target
                    .iter()
                    .map(|i| MigInstance {
                        profile: i.profile.clone(),
                        start: i.start,
                        uuid: None,
                    })
                    .collect();
            }
        }
        carried = Carried {
            usage: decision.fair_share.as_ref().map(|f| f.record.clone()),
            reservations: decision.reservations.iter().map(|r| r.record()).collect(),
            reconfigurations: decision.reconfigurations.clone(),
        };
    }
    let end = match config.horizon {
        Some(h) => h,
        // The last departure, of work still running too (nothing waits that could start).
        None => jobs
            .iter()
            .filter_map(|j| match j.state {
                JobState::Done { at } => Some(at),
                _ => j.end(),
            })
            .max()
            .unwrap_or(now)
            .max(now)
            .max(0),
    };
    depart(&mut jobs, end, &mut metrics);
    Ok(metrics.finish(end, &jobs))
}

/// What a decision carries to the next snapshot, as the service carries it.
#[derive(Debug, Clone, Default)]
struct Carried {
    usage: Option<UsageRecord>,
    reservations: Vec<ReservationRecord>,
    reconfigurations: Vec<ReconfigurationRecord>,
}

/// The policy's committed workloads (`kind: Workload` in the repository) that `trace` does
/// not name, as trace workloads: each arrives at the start and runs for its `maxDuration`, or
/// until the replay ends, as the service submits what the repository declares. Left out, the
/// solver would find them waiting in every snapshot and admit them at every cycle: capacity
/// each decision hands out (and may preempt for) that the replay never starts.
fn committed_jobs(policy: &CompiledPolicy, trace: &[TraceWorkload]) -> Vec<TraceWorkload> {
    let named: std::collections::HashSet<(&str, &str)> = trace
        .iter()
        .map(|w| (w.spec.tenant.as_str(), w.name.as_str()))
        .collect();
    policy
        .workloads
        .iter()
        .filter(|w| !named.contains(&(w.tenant.as_str(), w.name.as_str())))
        .map(|w| TraceWorkload {
            name: w.name.clone(),
            spec: w.spec(),
            arrival: 0,
            duration: w
                .max_duration_seconds
                .map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
        })
        .collect()
}

/// The first multiple of `step` at or after `t`.
fn ceil_to(t: i64, step: i64) -> i64 {
    t.div_euclid(step) * step + if t.rem_euclid(step) == 0 { 0 } else { step }
}

/// The earliest instant after `now` at which a cycle could decide something new; `None` when
/// nothing can happen any more.
#[allow(clippy::too_many_arguments)]
fn next_event(
    jobs: &[Job],
    trace: &[TraceWorkload],
    order: &[usize],
    next_arrival: usize,
    queue: &[usize],
    min_runtime: &[Option<i64>],
    now: i64,
    dirty: bool,
    cycle: i64,
) -> Option<i64> {
    let mut best: Option<i64> = None;
    let mut take = |t: i64| best = Some(best.map_or(t, |b: i64| b.min(t)));
    if dirty {
        take(now + cycle);
    }
    if let Some(&i) = order.get(next_arrival) {
        take(trace[i].arrival.max(now + 1));
    }
    if !queue.is_empty() {
        // A departure frees capacity that waiting work may take; with nothing waiting it is
        // recorded at its instant and decides nothing.
        for j in jobs {
            if let Some(end) = j.end() {
                take(end.max(now + 1));
            }
        }
        // A running workload becomes a possible victim once it has run its class's minRuntime.
        for j in jobs {
            if let (JobState::Running { since, .. }, Some(min)) = (&j.state, min_runtime[j.trace]) {
                let t = since.saturating_add(min);
                if t > now {
                    take(t);
                }
            }
        }
    }
    best
}

/// Ends every running workload whose run is complete by `until`, at its own instant.
fn depart(jobs: &mut [Job], until: i64, metrics: &mut Metrics) {
    let mut ending: Vec<(i64, usize)> = jobs
        .iter()
        .enumerate()
        .filter_map(|(i, j)| j.end().filter(|&e| e <= until).map(|e| (e, i)))
        .collect();
    ending.sort_unstable();
    for (at, i) in ending {
        if let JobState::Running { gpus, .. } = jobs[i].state {
            metrics.stop(i, at, gpus);
        }
        jobs[i].state = JobState::Done { at };
        jobs[i].remaining = Some(0);
    }
}

/// The last snapshot's running work: its entries, taken back from the snapshot after the
/// cycle, and their ranks, kept by [`running_list`].
#[derive(Default)]
struct Lent {
    ranks: Vec<usize>,
    entries: Vec<RunningWorkload>,
}

/// The running work a cycle observes, ordered by `rank` (tenant and name, as the service lists
/// it). An entry `lent` holds is moved into this list where its job still runs on the same
/// bindings since the same instant, and built afresh otherwise: building every running
/// workload's spec at every cycle was 4 % of a day's replay. `lent.ranks` become this list's.
fn running_list(
    jobs: &[Job],
    rank: &[usize],
    trace: &[TraceWorkload],
    epoch: i64,
    lent: &mut Lent,
) -> Vec<RunningWorkload> {
    let mut ranked: Vec<(usize, &Job)> = jobs
        .iter()
        .filter(|j| matches!(j.state, JobState::Running { .. }))
        .map(|j| (rank[j.trace], j))
        .collect();
    ranked.sort_unstable_by_key(|&(r, _)| r);
    // `lent` is in rank order too: walked once beside `ranked`.
    let mut old = std::mem::take(&mut lent.ranks)
        .into_iter()
        .zip(std::mem::take(&mut lent.entries))
        .peekable();
    let ranks = &mut lent.ranks;
    let mut running = Vec::with_capacity(ranked.len());
    for (r, j) in ranked {
        let JobState::Running {
            since, bindings, ..
        } = &j.state
        else {
            continue;
        };
        let w = &trace[j.trace];
        let started_at = unix(epoch + since);
        while old.next_if(|&(o, _)| o < r).is_some() {}
        // A job's bindings are set when it starts, so an entry of the same job started at the
        // same instant has them (comparing them was 2.5 % of a day's replay).
        let kept = old
            .next_if(|(o, entry)| *o == r && entry.started_at == started_at)
            .map(|(_, entry)| entry);
        debug_assert!(kept.as_ref().is_none_or(|e| e.bindings == *bindings));
        let mut entry = kept.unwrap_or_else(|| RunningWorkload {
            name: w.name.clone(),
            spec: w.spec.running_as(bindings.len() as u32),
            bindings: bindings.clone(),
            started_at,
            last_checkpoint_at: None,
        });
        entry.last_checkpoint_at = j.last_checkpoint.map(|c| unix(epoch + c));
        ranks.push(r);
        running.push(entry);
    }
    running
}

/// The snapshot a cycle at `now` observes.
fn snapshot(
    nodes: Vec<Node>,
    running: Vec<RunningWorkload>,
    trace: &[TraceWorkload],
    queue: &[usize],
    carried: &Carried,
    epoch: i64,
    now: i64,
) -> ClusterStateSpec {
    let pending = queue
        .iter()
        .map(|&i| {
            let w = &trace[i];
            PendingWorkload {
                name: w.name.clone(),
                spec: w.spec.clone(),
                submitted_at: unix(epoch + w.arrival),
            }
        })
        .collect();
    ClusterStateSpec {
        observed_at: unix(epoch + now),
        nodes,
        running,
        pending,
        usage: carried.usage.clone(),
        reservations: carried.reservations.clone(),
        reconfigurations: carried.reconfigurations.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `running_list` moves the last list's entries where a job runs as it did, and builds
    /// afresh the ones that started, restarted or moved: the list is the one built from
    /// scratch either way.
    #[test]
    fn the_running_list_reuses_what_still_runs_and_rebuilds_the_rest() {
        use crate::replay::trace::test_workload;
        let gpu = tessera_compiler::model::GpuRequest {
            count: Some(1),
            mig_profile: None,
            fraction: None,
        };
        let trace: Vec<TraceWorkload> = ["d", "b", "c", "a"]
            .iter()
            .map(|n| test_workload(n, 1, gpu.clone(), 0, 100))
            .collect();
        let rank = [3, 1, 2, 0];
        let on = |node: &str| {
            vec![Binding {
                node: node.into(),
                gpus: vec![0],
                mig_start: None,
                share: None,
            }]
        };
        let job = |trace: usize, state: JobState, checkpoint: Option<i64>| Job {
            trace,
            state,
            remaining: Some(100),
            first_start: Some(0),
            last_checkpoint: checkpoint,
        };
        let running = |since: i64, node: &str| JobState::Running {
            since,
            bindings: on(node),
            gpus: Gpus::whole(1),
            pool: "p".into(),
        };
        let fresh = |jobs: &[Job]| running_list(jobs, &rank, &trace, 0, &mut Lent::default());
        let mut lent = Lent::default();
        let first = vec![
            job(0, running(10, "n0"), None),
            job(1, running(10, "n1"), None),
            job(2, running(10, "n2"), None),
            job(3, JobState::Waiting, None),
        ];
        let list = running_list(&first, &rank, &trace, 0, &mut lent);
        assert_eq!(list, fresh(&first));
        let names: Vec<&str> = list.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["b", "c", "d"]);
        lent.entries = list;
        // `b` keeps running and checkpoints, `c` restarts elsewhere, `d` ends, `a` starts.
        let second = vec![
            job(0, JobState::Done { at: 20 }, None),
            job(1, running(10, "n1"), Some(15)),
            job(2, running(20, "n3"), None),
            job(3, running(20, "n0"), None),
        ];
        let list = running_list(&second, &rank, &trace, 0, &mut lent);
        assert_eq!(list, fresh(&second));
        assert_eq!(lent.ranks, [0, 1, 2]);
        let rows: Vec<(&str, &str, i64, Option<i64>)> = list
            .iter()
            .map(|w| {
                (
                    w.name.as_str(),
                    w.bindings[0].node.as_str(),
                    w.started_at.as_second(),
                    w.last_checkpoint_at.map(|t| t.as_second()),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("a", "n0", 20, None),
                ("b", "n1", 10, Some(15)),
                ("c", "n3", 20, None)
            ]
        );
    }

    #[test]
    fn cycles_fall_on_boundaries() {
        assert_eq!(ceil_to(0, 10), 0);
        assert_eq!(ceil_to(1, 10), 10);
        assert_eq!(ceil_to(10, 10), 10);
        assert_eq!(ceil_to(11, 10), 20);
    }
}
