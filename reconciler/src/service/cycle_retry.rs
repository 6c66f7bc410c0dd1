//! When the loop tries a failing cycle again: the service's one exponential back-off
//! ([`Backoff`]), from [`FIRST_RETRY`] up to [`LAST_RETRY`], reset by a cycle that succeeds.
//! Without it a cycle that fails (etcd away or hung, a store error) is tried again at every
//! tick of the loop while exits wait for it, each attempt as costly as the failure it repeats
//! and logged again. The status keeps the failure meanwhile: only a cycle changes it.

use std::time::{Duration, Instant};

use super::backoff::Backoff;

/// The wait after the first failure in a row.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The longest wait: short enough that a service whose trouble is over is back within a few
/// seconds.
pub const LAST_RETRY: Duration = Duration::from_secs(5);

/// The failures in a row of the loop's cycles, and when the next may start.
#[derive(Debug, Clone)]
pub struct CycleRetry {
    backoff: Backoff,
    failures: u32,
    not_before: Option<Instant>,
}

impl Default for CycleRetry {
    fn default() -> Self {
        CycleRetry {
            backoff: Backoff::new(FIRST_RETRY, LAST_RETRY),
            failures: 0,
            not_before: None,
        }
    }
}

impl CycleRetry {
    /// Records how the cycle that ended at `at` went. After a failure, returns how long the
    /// next cycle waits; a success clears the back-off.
    pub fn record(&mut self, failed: bool, at: Instant) -> Option<Duration> {
        if !failed {
            self.failures = 0;
            self.not_before = None;
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        let wait = Duration::from_secs(self.backoff.delay(self.failures));
        self.not_before = Some(at + wait);
        Some(wait)
    }

    /// Whether a cycle may start at `now`: always, unless failures in a row put it later.
    pub fn ready(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|at| now >= at)
    }

    /// Cycles failed in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_doubles_the_wait_up_to_a_few_seconds_and_a_success_resets_it() {
        let start = Instant::now();
        let mut retry = CycleRetry::default();
        assert!(retry.ready(start));
        let waits: Vec<u64> = (0..6)
            .map(|_| retry.record(true, start).unwrap().as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 5, 5, 5]);
        assert_eq!(retry.failures(), 6);
        assert_eq!(retry.record(false, start), None);
        assert_eq!(retry.failures(), 0);
        assert!(retry.ready(start));
        assert_eq!(retry.record(true, start), Some(FIRST_RETRY));
    }

    #[test]
    fn after_a_failure_no_cycle_starts_before_its_wait_is_over() {
        let failed_at = Instant::now();
        let mut retry = CycleRetry::default();
        retry.record(true, failed_at);
        retry.record(true, failed_at);
        assert!(!retry.ready(failed_at));
        assert!(!retry.ready(failed_at + Duration::from_millis(1999)));
        assert!(retry.ready(failed_at + Duration::from_secs(2)));
    }
}
