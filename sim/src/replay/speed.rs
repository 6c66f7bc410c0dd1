//! Time compression of a trace, and the load it offers.
//!
//! A trace replayed in real time may never contend for the fleet (the openb `default` trace
//! holds 0.6 % of its cluster at its peak), and then every placer decides alike. Dividing the
//! arrival instants by a factor while keeping each workload's run time multiplies the offered
//! load by that factor and keeps the trace's mix of shapes and run times, its arrival order,
//! and its bursts (compressed with it). A factor rather than a target load: the trace's load is
//! not even over its span (openb's is nearly all in its last month), so a target load would
//! name an average the replay never sees, while the factor is exact; the report gives the
//! offered load it comes to.

use super::trace::TraceWorkload;

/// Divides every arrival instant by `speed` (rounded to the second; order is kept), run times
/// unchanged. `speed` must be finite and above 0; 1 leaves the trace as it is.
pub fn compress(trace: &mut [TraceWorkload], speed: f64) {
    debug_assert!(speed.is_finite() && speed > 0.0);
    if speed == 1.0 {
        return;
    }
    for w in trace {
        w.arrival = (w.arrival as f64 / speed).round() as i64;
    }
}

/// The GPUs one replica of `w` holds: its count, its fraction, or a MIG profile's compute
/// slices over 7 (`3g.40gb`: 3/7). `None` for a profile name that does not say.
pub(super) fn gpus_per_replica(w: &TraceWorkload) -> Option<f64> {
    let gpu = &w.spec.gpu;
    if let Some(count) = gpu.count {
        return Some(f64::from(count));
    }
    if let Some(fraction) = gpu.fraction {
        return Some(fraction);
    }
    let profile = gpu.mig_profile.as_deref()?;
    let slices: u32 = profile.split_once('g')?.0.parse().ok()?;
    Some(f64::from(slices) / 7.0)
}

/// The load the trace offers a fleet of `gpus` GPUs: the GPU-seconds its workloads ask for
/// (replicas × GPUs × run time) over the GPU-seconds of the fleet from 0 to the last arrival.
/// Workloads that run until the end, or whose MIG profile does not name its slices, are left
/// out. `None` when the trace is empty, arrives at one instant, or the fleet has no GPU.
pub fn offered_load(trace: &[TraceWorkload], gpus: usize) -> Option<f64> {
    let span = trace.iter().map(|w| w.arrival).max()?;
    if span <= 0 || gpus == 0 {
        return None;
    }
    let asked: f64 = trace
        .iter()
        .filter_map(|w| {
            let per = gpus_per_replica(w)?;
            Some(per * f64::from(w.spec.replicas) * w.duration? as f64)
        })
        .sum();
    Some(asked / (span as f64 * gpus as f64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::trace::test_workload;
    use tessera_compiler::model::GpuRequest;

    fn workload(arrival: i64, duration: i64, gpu: GpuRequest) -> TraceWorkload {
        test_workload(&format!("w{arrival}"), 2, gpu, arrival, duration)
    }

    fn count(n: u32) -> GpuRequest {
        GpuRequest {
            count: Some(n),
            mig_profile: None,
            fraction: None,
        }
    }

    #[test]
    fn compression_divides_arrivals_and_keeps_run_times() {
        let mut trace = vec![workload(0, 50, count(1)), workload(1_000, 70, count(1))];
        compress(&mut trace, 10.0);
        assert_eq!(
            trace
                .iter()
                .map(|w| (w.arrival, w.duration))
                .collect::<Vec<_>>(),
            vec![(0, Some(50)), (100, Some(70))]
        );
    }

    #[test]
    fn compression_multiplies_the_offered_load() {
        let mig = GpuRequest {
            count: None,
            mig_profile: Some("3g.40gb".into()),
            fraction: None,
        };
        let half = GpuRequest {
            count: None,
            mig_profile: None,
            fraction: Some(0.5),
        };
        let mut trace = vec![
            workload(0, 700, mig),
            workload(500, 100, count(4)),
            workload(1_000, 200, half),
        ];
        // 2 replicas each: 2 × (3/7 × 700 + 4 × 100 + 0.5 × 200) = 1,600 GPU-seconds over
        // 1,000 s × 8 GPUs.
        let before = offered_load(&trace, 8).unwrap();
        assert!((before - 0.2).abs() < 1e-9, "{before}");
        compress(&mut trace, 4.0);
        let after = offered_load(&trace, 8).unwrap();
        assert!((after - 0.8).abs() < 1e-9, "{after}");
        assert_eq!(offered_load(&trace, 0), None);
        assert_eq!(offered_load(&[], 8), None);
    }
}
