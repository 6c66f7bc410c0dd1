//! How busy a node's GPUs are, kept apart from the state the control plane decides on.
//!
//! NVML's utilisation and GPM's SM activity move on every sample, whatever the fleet does. Were
//! they part of `nodes/<node>/observed`, every node would write `observed` on every
//! observation, and a fleet that changes nothing would cost etcd a write per node and period:
//! writes growing with the fleet, not with what changed, and every one of them waking the
//! control plane's view of the fleet. So `observed` carries the figures stripped ([`split`]),
//! and the agent writes them to `nodes/<node>/utilization` ([`Utilization`]) only when they
//! moved meaningfully, and at most once per interval ([`Cadence`]).
//!
//! Why both rules: the figures feed gauges scraped every 15 to 60 s and an idle detector with
//! a 30-minute window (`tessera_reconciler::metrics::utilization`), so a figure that is a few
//! points or a few tens of seconds old shows nothing different. The dead band keeps noise
//! around a steady level from being written at all; the interval bounds what a fleet whose
//! load really swings can cost, per node, whatever the swing. A crossing of the idle threshold
//! is always meaningful, since that is what the idle detector counts.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessera_reconciler::driver::{GpuDetail, GpuUtilization, SmActivity};
use tessera_reconciler::metrics::utilization::IDLE_BELOW_PERCENT;

use crate::protocol::VERSION;

/// `nodes/<node>/utilization`: the figures `observed` leaves out, per GPU by index.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Utilization {
    pub version: u32,
    pub gpus: Vec<GpuUse>,
}

/// One GPU's figures; a GPU that reports none is left out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuUse {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<GpuUtilization>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_activity: Option<SmActivity>,
    /// SM activity per MIG GPU instance, by instance id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub instances: BTreeMap<u32, SmActivity>,
}

impl GpuUse {
    fn is_empty(&self) -> bool {
        self.utilization.is_none() && self.sm_activity.is_none() && self.instances.is_empty()
    }
}

/// Takes the figures out of `details` (left as a driver reports a GPU without them) and
/// returns them.
pub fn split(details: &mut [GpuDetail]) -> Utilization {
    let mut gpus = Vec::new();
    for detail in details {
        let instances = detail
            .instances
            .iter_mut()
            .filter_map(|gi| Some((gi.id, gi.sm_activity.take()?)))
            .collect();
        let gpu = GpuUse {
            index: detail.gpu.index,
            utilization: detail.utilization.take(),
            sm_activity: detail.sm_activity.take(),
            instances,
        };
        if !gpu.is_empty() {
            gpus.push(gpu);
        }
    }
    Utilization {
        version: VERSION,
        gpus,
    }
}

/// Puts `figures` back into `details` (one node's), as the driver reported them: a GPU or
/// instance the figures name that `details` no longer has is skipped.
pub fn merge(details: &mut [GpuDetail], figures: &Utilization) {
    for gpu in &figures.gpus {
        let Some(detail) = details.iter_mut().find(|d| d.gpu.index == gpu.index) else {
            continue;
        };
        detail.utilization = gpu.utilization;
        detail.sm_activity = gpu.sm_activity;
        for gi in &mut detail.instances {
            if let Some(activity) = gpu.instances.get(&gi.id) {
                gi.sm_activity = Some(*activity);
            }
        }
    }
}

/// When an agent writes its utilisation: only a meaningful change, at most once per interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cadence {
    /// The least time between two writes.
    pub interval: Duration,
    /// The least move of a figure, in percentage points, that is worth writing.
    pub dead_band: f64,
}

impl Default for Cadence {
    /// 30 s and 10 points: within a scrape interval and well inside the idle window.
    fn default() -> Cadence {
        Cadence {
            interval: Duration::from_secs(30),
            dead_band: 10.0,
        }
    }
}

impl Cadence {
    /// Every change, at once: what writing the figures inside `observed` cost (for the
    /// benchmark's comparison).
    pub fn every_change() -> Cadence {
        Cadence {
            interval: Duration::ZERO,
            dead_band: 0.0,
        }
    }

    /// Whether `now` differs meaningfully from `written`: a figure appeared or went, one
    /// moved by the dead band or more, or a GPU crossed the idle threshold.
    pub fn is_meaningful(&self, written: &Utilization, now: &Utilization) -> bool {
        if written.gpus.len() != now.gpus.len() {
            return true;
        }
        written.gpus.iter().zip(&now.gpus).any(|(a, b)| {
            a.index != b.index
                || utilization_moved(a.utilization, b.utilization, self.dead_band)
                || activity_moved(a.sm_activity, b.sm_activity, self.dead_band)
                || a.instances.len() != b.instances.len()
                || a.instances
                    .iter()
                    .zip(&b.instances)
                    .any(|((ia, sa), (ib, sb))| {
                        ia != ib || activity_moved(Some(*sa), Some(*sb), self.dead_band)
                    })
        })
    }
}

fn moved(a: f64, b: f64, dead_band: f64) -> bool {
    // With no dead band, any difference is a change (`>=` would call equal figures moved).
    if dead_band <= 0.0 {
        a != b
    } else {
        (a - b).abs() >= dead_band
    }
}

fn utilization_moved(a: Option<GpuUtilization>, b: Option<GpuUtilization>, band: f64) -> bool {
    match (a, b) {
        (None, None) => false,
        (Some(a), Some(b)) => {
            let idle = |u: GpuUtilization| u.gpu_percent < IDLE_BELOW_PERCENT;
            idle(a) != idle(b)
                || moved(a.gpu_percent.into(), b.gpu_percent.into(), band)
                || moved(a.memory_percent.into(), b.memory_percent.into(), band)
        }
        _ => true,
    }
}

fn activity_moved(a: Option<SmActivity>, b: Option<SmActivity>, band: f64) -> bool {
    match (a, b) {
        (None, None) => false,
        (Some(a), Some(b)) => {
            moved(a.sm_util_percent, b.sm_util_percent, band)
                || moved(a.sm_occupancy_percent, b.sm_occupancy_percent, band)
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tessera_reconciler::driver::{ComputeInstanceInfo, GpuInstanceInfo, GpuRef};

    fn detail(index: u32, percent: Option<u32>, instance_activity: Option<f64>) -> GpuDetail {
        GpuDetail {
            gpu: GpuRef {
                node: "n".into(),
                index,
            },
            instances: vec![GpuInstanceInfo {
                id: 1,
                profile_id: 9,
                start: 0,
                compute_instances: vec![ComputeInstanceInfo {
                    id: 0,
                    uuid: "MIG-x".into(),
                }],
                sm_activity: instance_activity.and_then(|a| SmActivity::checked(a, a / 2.0)),
            }],
            processes: Vec::new(),
            utilization: percent.map(|p| GpuUtilization {
                gpu_percent: p,
                memory_percent: p / 2,
            }),
            sm_activity: percent.and_then(|p| SmActivity::checked(p.into(), 10.0)),
        }
    }

    fn figures(percents: &[u32]) -> Utilization {
        let mut details: Vec<GpuDetail> = percents
            .iter()
            .enumerate()
            .map(|(i, p)| detail(i as u32, Some(*p), None))
            .collect();
        split(&mut details)
    }

    proptest! {
        /// Splitting leaves details without figures, and merging puts back exactly what the
        /// driver reported.
        #[test]
        fn split_then_merge_gives_back_the_details(
            gpus in proptest::collection::vec((proptest::option::of(0u32..=100), proptest::option::of(0.0f64..=100.0)), 0..8)
        ) {
            let original: Vec<GpuDetail> = gpus
                .iter()
                .enumerate()
                .map(|(i, (p, a))| detail(i as u32, *p, *a))
                .collect();
            let mut stripped = original.clone();
            let figures = split(&mut stripped);
            for d in &stripped {
                prop_assert!(d.utilization.is_none() && d.sm_activity.is_none());
                prop_assert!(d.instances.iter().all(|gi| gi.sm_activity.is_none()));
            }
            let bytes = crate::protocol::encode(&figures);
            let back: Utilization = crate::protocol::decode(&bytes).unwrap();
            merge(&mut stripped, &back);
            prop_assert_eq!(stripped, original);
        }

        /// Noise inside the dead band that does not cross the idle threshold is never
        /// meaningful; a move of the dead band or more always is.
        #[test]
        fn only_moves_beyond_the_dead_band_or_across_idle_are_meaningful(
            base in 15u32..=90, noise in -9i32..=9, jump in 10i32..=40
        ) {
            let cadence = Cadence::default();
            let written = figures(&[base, base]);
            let jittered = figures(&[base, (base as i32 + noise) as u32]);
            prop_assert!(!cadence.is_meaningful(&written, &jittered));
            let target = (base as i32 + jump).min(100) as u32;
            if target.abs_diff(base) >= 10 {
                prop_assert!(cadence.is_meaningful(&written, &figures(&[base, target])));
            }
        }
    }

    #[test]
    fn appearing_vanishing_and_idle_crossings_are_meaningful() {
        let cadence = Cadence::default();
        assert!(cadence.is_meaningful(&figures(&[50]), &figures(&[50, 50])));
        assert!(cadence.is_meaningful(&figures(&[6]), &figures(&[3])));
        assert!(!cadence.is_meaningful(&figures(&[3]), &figures(&[0])));
        let mut without = vec![detail(0, None, None)];
        assert!(cadence.is_meaningful(&figures(&[50]), &split(&mut without)));
        assert!(Cadence::every_change().is_meaningful(&figures(&[50]), &figures(&[51])));
        assert!(!Cadence::every_change().is_meaningful(&figures(&[50]), &figures(&[50])));
    }
}
