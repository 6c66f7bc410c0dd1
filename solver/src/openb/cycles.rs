//! The openb protocol in cycles: tasks that arrive within one cycle are decided together, as
//! tessera runs (a solve per cycle), instead of one at a time as the paper's simulator does.
//!
//! Within a cycle the batch is placed largest first (GPUs per task, then milli-GPU per GPU, then
//! CPU; arrival order breaks ties), each task by the given policy, so that the effect of
//! batching is measured on its own, policy by policy. Measured on `default` (BENCHMARKS.md),
//! reordering alone does not help: largest first loses about two points for FGD at 100 arrivals
//! per cycle, smallest first more. A cycle needs a joint decision (the solver's integer
//! program), not a sort; this mode is the harness that will measure it.

use super::cluster::Cluster;
use super::policy::Placer;
use super::protocol::{Sample, SimOutcome, Workload};

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
    for batch in order.chunks(cycle.max(1)) {
        let mut sorted: Vec<(usize, usize)> = batch.iter().copied().enumerate().collect();
        sorted.sort_by(|&(ia, a), &(ib, b)| {
            let (ta, tb) = (&workload.tasks()[a], &workload.tasks()[b]);
            (tb.num_gpu, tb.gpu_milli, tb.cpu_milli, ia).cmp(&(
                ta.num_gpu,
                ta.gpu_milli,
                ta.cpu_milli,
                ib,
            ))
        });
        for &(_, i) in &sorted {
            let task = &workload.tasks()[i];
            match placer.choose(&cluster, task) {
                Some(choice) => {
                    if let Err(e) = cluster.place(task, &choice) {
                        panic!("policy {} made an invalid choice: {e}", placer.name());
                    }
                    placed += 1;
                }
                None => skipped += 1,
            }
        }
        arrived += batch
            .iter()
            .map(|&i| workload.tasks()[i].gpu_request())
            .sum::<u64>();
        samples.push(Sample {
            arrived_pct: 100.0 * arrived as f64 / capacity,
            alloc_pct: cluster.allocation_percent(),
        });
    }
    SimOutcome {
        samples,
        placed,
        skipped,
        cluster,
    }
}
