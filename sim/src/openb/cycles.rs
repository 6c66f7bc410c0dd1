//! The openb protocol in cycles: tasks that arrive within one cycle are decided together, as
//! tessera runs (a solve per cycle), instead of one at a time as the paper's simulator does.
//!
//! How a cycle is decided is the policy's ([`Placer::place_cycle`]): the baselines place it
//! largest first (GPUs per task, then milli-GPU per GPU, then CPU; arrival order breaks ties),
//! each task by their online rule, so that the effect of batching is measured on its own. Measured
//! on `default` (BENCHMARKS.md), that reordering does not help them: largest first loses about two
//! points for FGD at 100 arrivals per cycle. Tessera solves each cycle as one full cycle of the
//! production solver ([`super::Production`]).

use super::cluster::{Cluster, Task};
use super::policy::Placer;
use super::protocol::{Sample, SimOutcome, Workload, first_refusal_at};

/// Runs `order` in cycles of `cycle` arrivals. One sample is recorded per cycle, at its end:
/// everything that arrived by then against the allocation once the cycle is decided (a sample
/// per arrival would credit early arrivals of a cycle with capacity placed for later ones).
pub fn simulate_cycles(
    workload: &Workload,
    placer: &mut dyn Placer,
    order: &[usize],
    cycle: usize,
) -> SimOutcome {
    let mut cluster: Cluster = workload.cluster().clone();
    let capacity = cluster.total_gpu_milli().max(1) as f64;
    let mut arrived = 0u64;
    let mut samples = Vec::with_capacity(order.len());
    let (mut placed, mut skipped) = (0usize, 0usize);
    let mut first_refusal = None;
    for batch in order.chunks(cycle.max(1)) {
        let tasks: Vec<&Task> = batch.iter().map(|&i| &workload.tasks()[i]).collect();
        let refused_gpu_task = match placer.place_cycle(&mut cluster, &tasks) {
            Ok(done) => {
                let n = done.iter().filter(|&&p| p).count();
                placed += n;
                skipped += done.len() - n;
                done.iter()
                    .zip(&tasks)
                    .any(|(&p, t)| !p && !t.is_cpu_only())
            }
            Err(e) => panic!("policy {} made an invalid choice: {e}", placer.name()),
        };
        arrived += batch
            .iter()
            .map(|&i| workload.tasks()[i].gpu_request())
            .sum::<u64>();
        let sample = Sample {
            arrived_pct: 100.0 * arrived as f64 / capacity,
            alloc_pct: cluster.allocation_percent(),
        };
        samples.push(sample);
        if refused_gpu_task && first_refusal.is_none() {
            first_refusal = Some(first_refusal_at(&cluster, workload.tasks(), sample));
        }
    }
    SimOutcome {
        samples,
        placed,
        skipped,
        cluster,
        first_refusal,
    }
}
