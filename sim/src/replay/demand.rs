//! Demand scaling of a trace: more (or fewer) of its workloads, drawn from it.
//!
//! Compressing time (`speed.rs`) cannot make a trace contend when all of its workloads at once
//! fit the fleet: the openb `default` trace asks 61 % of its cluster's GPUs in all, so every
//! placer starts everything whatever the compression. The FGD protocol inflates demand by
//! sampling the trace's tasks with replacement until arrivals reach a share of the cluster
//! (`fgd.md`). Over time, with departures, the same draw is `factor × n` workloads taken with
//! replacement, each keeping its shape, its arrival instant and its run time: the trace's
//! arrival process `factor` times as dense, with its mix of shapes and run times and its
//! bursts. A factor, as `--speed` is, so that the report can say exactly what was replayed; it
//! gives what the drawn workloads ask of the fleet all at once ([`asked_share`]).

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::speed::gpus_per_replica;
use super::trace::TraceWorkload;

/// Mixed into the seed so that the draw does not repeat the stream that spread an openb
/// trace's tasks over tenants with the same `--seed`.
const STREAM: u64 = 0xd3a1_5ca1_e000_0001;

/// `round(factor × n)` workloads drawn uniformly with replacement from `trace` (seeded), each
/// a copy of its original renamed `<name>-x<k>` (`k` the draw's number, so names stay unique
/// per tenant), in arrival order (draws of one instant in draw order). A factor of 1 returns
/// the trace as it is. `factor` must be finite and above 0.
pub fn scale(trace: &[TraceWorkload], factor: f64, seed: u64) -> Vec<TraceWorkload> {
    debug_assert!(factor.is_finite() && factor > 0.0);
    if factor == 1.0 || trace.is_empty() {
        return trace.to_vec();
    }
    let draws = (factor * trace.len() as f64).round() as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ STREAM);
    let mut out: Vec<TraceWorkload> = (0..draws)
        .map(|k| {
            let original = &trace[rng.random_range(0..trace.len())];
            TraceWorkload {
                name: format!("{}-x{k}", original.name),
                ..original.clone()
            }
        })
        .collect();
    // Stable: draws of one instant stay in draw order.
    out.sort_by_key(|w| w.arrival);
    out
}

/// The share of `gpus` GPUs that every workload of `trace` would hold at once (replicas ×
/// GPUs each, a MIG profile's compute slices over 7): above 1, the trace cannot all run
/// together and placement decides who waits. Workloads whose MIG profile does not name its
/// slices are left out. `None` for a fleet without GPUs.
pub fn asked_share(trace: &[TraceWorkload], gpus: usize) -> Option<f64> {
    if gpus == 0 {
        return None;
    }
    let asked: f64 = trace
        .iter()
        .filter_map(|w| Some(gpus_per_replica(w)? * f64::from(w.spec.replicas)))
        .sum();
    Some(asked / gpus as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use crate::replay::trace::test_workload;
    use tessera_compiler::model::GpuRequest;

    fn workload(name: &str, arrival: i64, gpus: u32) -> TraceWorkload {
        let gpu = GpuRequest {
            count: Some(gpus),
            mig_profile: None,
            fraction: None,
        };
        test_workload(name, 1, gpu, arrival, 60 * i64::from(gpus))
    }

    fn trace() -> Vec<TraceWorkload> {
        (0..40)
            .map(|i| workload(&format!("w{i}"), i * 10, 1 + (i % 4) as u32))
            .collect()
    }

    #[test]
    fn a_factor_of_one_is_the_trace() {
        assert_eq!(scale(&trace(), 1.0, 7), trace());
    }

    #[test]
    fn draws_are_copies_renamed_in_arrival_order_and_seeded() {
        let t = trace();
        let scaled = scale(&t, 2.5, 7);
        assert_eq!(scaled.len(), 100);
        let names: BTreeSet<&str> = scaled.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names.len(), 100, "names are unique");
        for w in &scaled {
            let (original, _) = w.name.rsplit_once("-x").expect("renamed");
            let o = t.iter().find(|o| o.name == original).expect("a copy");
            assert_eq!(
                (&w.spec, w.arrival, w.duration),
                (&o.spec, o.arrival, o.duration)
            );
        }
        assert!(scaled.windows(2).all(|p| p[0].arrival <= p[1].arrival));
        assert_eq!(scale(&t, 2.5, 7), scaled, "the same seed draws the same");
        assert_ne!(scale(&t, 2.5, 8), scaled, "another seed draws otherwise");
        assert_eq!(scale(&t, 0.5, 7).len(), 20);
        assert!(scale(&[], 3.0, 7).is_empty());
    }

    #[test]
    fn the_asked_share_is_every_workload_at_once() {
        // 10 × (1 + 2 + 3 + 4) = 100 GPUs asked of 50.
        assert_eq!(asked_share(&trace(), 50), Some(2.0));
        assert_eq!(asked_share(&trace(), 0), None);
        // Drawing 3 times as many asks about 3 times as much.
        let drawn = asked_share(&scale(&trace(), 3.0, 1), 50).unwrap();
        assert!((4.5..=7.5).contains(&drawn), "{drawn}");
    }
}
