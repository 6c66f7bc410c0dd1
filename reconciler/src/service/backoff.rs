//! Exponential backoff, the one rule behind every wait that grows with repeated failure: a
//! failed action retried, a start the service died during, a committed workload that keeps
//! ending early (CrashLoopBackOff). The `n`-th failure in a row waits `base × 2^(n − 1)`, at
//! most `max`.

use std::time::Duration;

/// A doubling wait, in whole seconds (the service's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: u64,
    max: u64,
}

impl Backoff {
    /// `base` counts as at least a second, and `max` as at least `base`: a wait never shrinks
    /// to nothing, and the cap never undercuts the first wait.
    pub fn new(base: Duration, max: Duration) -> Backoff {
        let base = base.as_secs().max(1);
        Backoff {
            base,
            max: max.as_secs().max(base),
        }
    }

    /// Seconds to wait after `failures` failures in a row; none before the first.
    pub fn delay(self, failures: u32) -> u64 {
        if failures == 0 {
            return 0;
        }
        // 2^20 × one second already exceeds any sensible cap; the shift stays defined.
        self.base
            .saturating_mul(1u64 << (failures - 1).min(20))
            .min(self.max)
    }

    /// The instant (Unix seconds) the next attempt may be made, `failures` failures in a row
    /// after `last`.
    pub fn after(self, last: i64, failures: u32) -> i64 {
        last.saturating_add(i64::try_from(self.delay(failures)).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn secs(base: u64, max: u64) -> Backoff {
        Backoff::new(Duration::from_secs(base), Duration::from_secs(max))
    }

    #[test]
    fn each_failure_doubles_the_wait_up_to_the_cap() {
        let b = secs(10, 300);
        let waits: Vec<u64> = (0..9).map(|n| b.delay(n)).collect();
        assert_eq!(waits, [0, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(b.after(1_000, 2), 1_020);
    }

    #[test]
    fn a_zero_base_waits_a_second_and_a_low_cap_is_the_base() {
        assert_eq!(secs(0, 0).delay(1), 1);
        assert_eq!(secs(30, 5).delay(1), 30);
        assert_eq!(secs(30, 5).delay(4), 30);
    }

    #[test]
    fn nothing_overflows() {
        let b = secs(u64::MAX / 2, u64::MAX);
        assert_eq!(b.delay(u32::MAX), u64::MAX);
        assert_eq!(b.after(i64::MAX - 1, 3), i64::MAX);
    }

    proptest! {
        /// The wait never shrinks with another failure, never exceeds the cap, and starts at
        /// the base.
        #[test]
        fn the_wait_grows_to_the_cap(base in 0u64..10_000, max in 0u64..100_000, n in 1u32..64) {
            let b = secs(base, max);
            prop_assert!(b.delay(n) <= b.delay(n + 1));
            prop_assert!(b.delay(n) <= max.max(base.max(1)));
            prop_assert_eq!(b.delay(1), base.max(1));
        }
    }
}
