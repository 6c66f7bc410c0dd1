//! Retention: how long the service keeps what has ended, and the prune step that deletes the
//! rest, as slurmdbd's `Purge*After` settings do for Slurm's accounting database.
//!
//! Each kind has its own keeping time ([`Retention`]): closed journal entries (7 days by
//! default: recovery needs only open intents, and a week covers looking into an incident),
//! events (30 days), ended workload records (30 days: `GET /v1/workloads/{name}` and
//! `describe` answer for an ended workload until then), and metered usage, kept unless the
//! operator sets a time: it is billing data, and `tessera report usage` over a past month must
//! keep adding up. What each store may never delete (open intents, live workloads, usage
//! still being metered) is in `store/retention.rs`.
//!
//! The loop runs a step at start-up and then every [`Retention::interval`], not every cycle
//! ([`PruneSchedule`]). A step deletes at most [`STEP_ROWS`] rows of each kind; one that
//! found more runs again after the next cycle, so a backlog (a first start on a year of
//! history) is worked off a bounded batch at a time between cycles instead of stalling one.

use std::time::{Duration, Instant};

use crate::store::{StateStore, StoreError};

/// How long each kind is kept once it has ended; `None`: forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Closed journal entries, from when they closed.
    pub journal: Option<Duration>,
    /// Events, from when they were recorded.
    pub events: Option<Duration>,
    /// Ended workload records (succeeded, failed, cancelled), from when they ended.
    pub workloads: Option<Duration>,
    /// Metered usage (runs, reserved-idle spells, preemptions), from when it ended.
    pub usage: Option<Duration>,
    /// How often a prune step runs.
    pub interval: Duration,
}

const DAY: u64 = 86_400;

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            journal: Some(Duration::from_secs(7 * DAY)),
            events: Some(Duration::from_secs(30 * DAY)),
            workloads: Some(Duration::from_secs(30 * DAY)),
            usage: None,
            interval: Duration::from_secs(3600),
        }
    }
}

/// The most rows of one kind a step deletes.
pub const STEP_ROWS: usize = 1000;

/// How soon a step that failed (the store away) is tried again.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(60);

/// What one step deleted, per kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub journal: usize,
    pub events: usize,
    pub workloads: usize,
    pub usage: usize,
    /// Some kind had more to delete than one step's batch.
    pub more: bool,
}

impl Pruned {
    pub fn total(&self) -> usize {
        self.journal + self.events + self.workloads + self.usage
    }

    /// Each kind with its count, as the metrics label them.
    pub fn by_kind(&self) -> [(&'static str, usize); 4] {
        [
            ("journal", self.journal),
            ("events", self.events),
            ("workloads", self.workloads),
            ("usage", self.usage),
        ]
    }
}

/// The cutoff of a kind kept for `keep`: what ended before it goes.
fn cutoff(now: i64, keep: Duration) -> i64 {
    now.saturating_sub(i64::try_from(keep.as_secs()).unwrap_or(i64::MAX))
}

/// Deletes, of each kind with a keeping time, at most `rows` rows that ended before `now`
/// minus that time. Ended workloads go before the events and usage: nothing of theirs is read
/// once they are gone.
pub fn prune_step(
    store: &dyn StateStore,
    retention: &Retention,
    now: i64,
    rows: usize,
) -> Result<Pruned, StoreError> {
    let mut pruned = Pruned::default();
    let mut kind = |keep: Option<Duration>,
                    prune: &dyn Fn(i64, usize) -> Result<usize, StoreError>|
     -> Result<usize, StoreError> {
        let Some(keep) = keep else { return Ok(0) };
        let n = prune(cutoff(now, keep), rows)?;
        pruned.more |= n >= rows;
        Ok(n)
    };
    let journal = kind(retention.journal, &|t, n| store.prune_journal(t, n))?;
    let workloads = kind(retention.workloads, &|t, n| store.prune_workloads(t, n))?;
    let events = kind(retention.events, &|t, n| store.prune_events(t, n))?;
    let usage = kind(retention.usage, &|t, n| store.prune_usage(t, n))?;
    Ok(Pruned {
        journal,
        events,
        workloads,
        usage,
        ..pruned
    })
}

/// When the loop runs its next prune step: at start-up, then every interval; after the next
/// cycle where a step left more; a minute after a step that failed.
#[derive(Debug, Clone)]
pub struct PruneSchedule {
    interval: Duration,
    due: Instant,
    /// A step left more: the next one follows the next cycle.
    backlog: bool,
}

impl PruneSchedule {
    /// Due at once (`now`, the start).
    pub fn new(interval: Duration, now: Instant) -> PruneSchedule {
        PruneSchedule {
            interval,
            due: now,
            backlog: false,
        }
    }

    /// Whether a step is due at `now`, given whether a cycle has run since the last step.
    pub fn due(&self, now: Instant, cycled: bool) -> bool {
        if self.backlog {
            cycled
        } else {
            now >= self.due
        }
    }

    /// Records how the step begun at `now` went.
    pub fn record(&mut self, outcome: Result<&Pruned, &StoreError>, now: Instant) {
        let (backlog, wait) = match outcome {
            Ok(pruned) => (pruned.more, self.interval),
            Err(_) => (false, self.interval.min(RETRY_AFTER_ERROR)),
        };
        self.backlog = backlog;
        self.due = now + wait;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tessera_compiler::WorkloadKey;

    use super::*;
    use crate::store::{EndReason, Origin, Store};

    const DAY: i64 = 86_400;
    const NOW: i64 = 1_790_000_000;

    fn spec() -> tessera_compiler::model::WorkloadSpec {
        serde_json::from_value(json!({"tenant": "t", "sloClass": "batch", "gpu": {"count": 1}}))
            .unwrap()
    }

    /// `n` workloads submitted and cancelled `age` days ago, each with a closed journal entry.
    fn history(store: &Store, prefix: &str, n: usize, age: i64) {
        let at = NOW - age * DAY;
        for i in 0..n {
            let name = format!("{prefix}-{i}");
            store.submit(&name, &spec(), Origin::Submitted, at).unwrap();
            store.cancel(&WorkloadKey::new("t", &name), at).unwrap();
            let id = store.begin_action(1, &json!({"n": i}), at).unwrap();
            store.complete_action(id, at).unwrap();
        }
    }

    #[test]
    fn a_backlog_is_pruned_a_batch_at_a_time_and_the_recent_and_live_are_kept() {
        let store = Store::open_in_memory().unwrap();
        // In time order, as the service records it.
        store
            .submit("live", &spec(), Origin::Submitted, NOW - 90 * DAY)
            .unwrap();
        let open = store
            .begin_action(1, &json!("open"), NOW - 90 * DAY)
            .unwrap();
        history(&store, "old", 5, 40);
        history(&store, "week", 2, 10);
        history(&store, "new", 2, 1);
        let retention = Retention::default();

        // Batches of 2: the 11 events past 30 days take six steps (the last one finds none
        // left after five full ones), the 7 journal entries past 7 days four, the 5 records
        // three.
        let mut steps = Vec::new();
        loop {
            let pruned = prune_step(&store, &retention, NOW, 2).unwrap();
            steps.push(pruned);
            if !pruned.more {
                break;
            }
        }
        assert_eq!(steps.len(), 6, "{steps:?}");
        let sum = |f: fn(&Pruned) -> usize| steps.iter().map(f).sum::<usize>();
        assert_eq!(sum(|p| p.workloads), 5);
        assert_eq!(sum(|p| p.journal), 7, "the old and the week-old entries");
        // The old records' events, and the live workload's submission 90 days ago.
        assert_eq!(sum(|p| p.events), 11);
        assert_eq!(sum(|p| p.usage), 0, "usage is kept unless configured");
        assert!(steps.iter().all(|p| p.total() <= 2 * 4));

        let names: Vec<String> = store
            .list(None)
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["live", "week-0", "week-1", "new-0", "new-1"]);
        assert_eq!(
            store
                .open_actions()
                .unwrap()
                .iter()
                .map(|e| e.id)
                .collect::<Vec<_>>(),
            [open]
        );
        assert!(
            store
                .workload(&WorkloadKey::new("t", "week-0"))
                .unwrap()
                .end
                .is_some_and(|e| e == EndReason::Cancelled)
        );
        let events = store.events(0, 100).unwrap();
        assert_eq!(events.len(), 8, "the week-old and new records' events");
        assert!(events.iter().all(|e| e.at >= NOW - 30 * DAY));
        assert_eq!(
            prune_step(&store, &retention, NOW, 2).unwrap(),
            Pruned::default()
        );
    }

    #[test]
    fn a_kind_kept_forever_is_never_pruned() {
        let store = Store::open_in_memory().unwrap();
        history(&store, "old", 3, 400);
        let forever = Retention {
            journal: None,
            events: None,
            workloads: None,
            usage: None,
            ..Retention::default()
        };
        assert_eq!(
            prune_step(&store, &forever, NOW, 10).unwrap(),
            Pruned::default()
        );
        assert_eq!(store.list(None).unwrap().len(), 3);
    }

    #[test]
    fn steps_run_at_start_then_every_interval_and_after_the_next_cycle_while_a_backlog_lasts() {
        let start = Instant::now();
        let hour = Duration::from_secs(3600);
        let mut schedule = PruneSchedule::new(hour, start);
        assert!(schedule.due(start, false), "at start-up");

        let done = Pruned {
            journal: 3,
            ..Pruned::default()
        };
        schedule.record(Ok(&done), start);
        assert!(
            !schedule.due(start + hour / 2, true),
            "a cycle alone is not enough"
        );
        assert!(schedule.due(start + hour, false));

        let more = Pruned {
            events: 10,
            more: true,
            ..Pruned::default()
        };
        schedule.record(Ok(&more), start + hour);
        assert!(
            !schedule.due(start + hour, false),
            "not before a cycle has run"
        );
        assert!(schedule.due(start + hour, true), "after the next cycle");

        let failed = StoreError::NotFound("etcd away".into());
        schedule.record(Err(&failed), start + hour);
        assert!(!schedule.due(start + hour, true));
        assert!(schedule.due(start + hour + RETRY_AFTER_ERROR, false));
    }
}
