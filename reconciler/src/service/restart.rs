//! When a committed workload that ended is queued again: a service whose command keeps
//! failing must not be restarted at every cycle (Kubernetes' CrashLoopBackOff). Each run that
//! ended after less than [`STABLE`] doubles the wait before the next ([`Backoff`]);
//! a run of [`STABLE`] or more, a cancellation (its spec changed or left the repository) or a
//! lost node (not the workload's doing) starts the count afresh.

use super::backoff::Backoff;
use crate::store::{EndReason, WorkloadRecord};

/// A run this long shows the workload can run: the next failure is a first one again (ten
/// minutes, as Kubernetes resets its restart backoff).
pub const STABLE: i64 = 600;

/// The instant a committed workload may be queued again, given its ended records, most recent
/// first; `None`: at once.
pub fn restart_at(history: &[WorkloadRecord], backoff: Backoff) -> Option<i64> {
    let failures = history
        .iter()
        .take_while(|r| {
            let ran = match (r.started_at, r.ended_at) {
                (Some(start), Some(end)) => end - start,
                _ => 0,
            };
            !matches!(
                r.end,
                None | Some(EndReason::Cancelled | EndReason::Lost { .. })
            ) && ran < STABLE
        })
        .count();
    if failures == 0 {
        return None;
    }
    let last = history[0].ended_at?;
    Some(backoff.after(last, u32::try_from(failures).unwrap_or(u32::MAX)))
}

#[cfg(test)]
mod tests {
    use tessera_compiler::model::WorkloadSpec;

    use std::time::Duration;

    use super::*;
    use crate::store::{Origin, Phase};

    fn backoff() -> Backoff {
        Backoff::new(Duration::from_secs(10), Duration::from_secs(300))
    }

    fn ended(started: Option<i64>, ended: i64, end: EndReason) -> WorkloadRecord {
        let spec: WorkloadSpec = serde_json::from_value(serde_json::json!({
            "tenant": "t", "sloClass": "c", "gpu": {"count": 1}
        }))
        .unwrap();
        WorkloadRecord {
            phase: end.phase(),
            started_at: started,
            ended_at: Some(ended),
            end: Some(end),
            ..WorkloadRecord::submitted(
                "svc",
                &spec,
                Origin::Committed,
                started.unwrap_or(ended) - 1,
            )
        }
    }

    const CRASH: EndReason = EndReason::Exited { code: 1 };

    #[test]
    fn each_short_run_doubles_the_wait_up_to_the_cap() {
        let mut history = Vec::new();
        let mut waits = Vec::new();
        for k in 0..8 {
            let t = 1_000 + k * 100;
            history.insert(0, ended(Some(t), t + 5, CRASH));
            waits.push(restart_at(&history, backoff()).unwrap() - (t + 5));
        }
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn a_long_run_a_cancel_or_a_lost_node_starts_afresh() {
        assert_eq!(restart_at(&[], backoff()), None);
        // Exiting cleanly after a short run is a restart loop too.
        let clean = ended(Some(0), 5, EndReason::Exited { code: 0 });
        assert_eq!(restart_at(&[clean], backoff()), Some(15));
        let long = ended(Some(0), STABLE, CRASH);
        assert_eq!(restart_at(std::slice::from_ref(&long), backoff()), None);
        let short = ended(Some(STABLE + 10), STABLE + 20, CRASH);
        assert_eq!(
            restart_at(&[short.clone(), long], backoff()),
            Some(STABLE + 30)
        );
        let cancelled = ended(Some(0), 5, EndReason::Cancelled);
        assert_eq!(restart_at(&[cancelled], backoff()), None);
        let lost = ended(Some(0), 5, EndReason::Lost { node: "n1".into() });
        assert_eq!(
            restart_at(&[short.clone(), lost], backoff()),
            Some(STABLE + 30)
        );
        // Never started (it could not be): counts, with no run at all.
        let never = ended(None, 50, EndReason::StartFailed { error: "x".into() });
        assert_eq!(restart_at(&[never, short], backoff()), Some(70));
        assert!(Phase::Failed.is_ended());
    }
}
