//! The standing decision kept between cycles, so that workloads submitted since are decided
//! against it (the solver's [`Session`]) instead of re-deciding the whole queue.
//!
//! A full cycle observes, solves and applies. When everything it decided was carried out (no
//! action failed or was skipped, nothing waits, nobody was preempted) the fleet is what its
//! decision says, and the session the solve kept stands for it. The next cycle may then use
//! the session, but only when the snapshot it builds is the one the last cycle left with
//! new submissions added: the same revision, nodes, running work, waiting work, usage record
//! and reservations. Anything else (an exit, a cancellation, a node that changed, a commit)
//! and the standing decision is dropped for a full cycle. So is one older than the cycle
//! period: time alone moves `minRuntime`, fair-share history and the integer program's
//! chances, and the periodic full cycle is where those are weighed.
//!
//! What a cycle carried out moves the session on (`Session::carried_out`): the workloads it
//! admitted run in the session as in the next snapshot, so that the next arrival is decided
//! as a full cycle on that snapshot would decide it, and not ordered against admissions
//! already made. The session declines when its decision leaves work waiting, changes a
//! geometry or moves fair-share history; it then keeps standing for the snapshot it opened on
//! with the arrivals since, as decided (still the heuristic cycle's decision there, the
//! arrivals decided as if they had come then), until an arrival would be ordered before one
//! of its admissions and a full cycle decides.
//!
//! What was submitted while a cycle ran is not part of what its decision stands for: the
//! snapshot it leaves holds only the waiting work the decision saw, and the next cycle finds
//! the rest as arrivals. Within one cycle, an arrival the session would order before another
//! arrival of that cycle, already admitted, is left to the next cycle (which runs at once),
//! where it is decided after the admissions of this one, as a full cycle would.
//!
//! Arrivals are never decided by the integer program.
//!
//! Between full cycles the service decides submissions by the arrival path
//! (`cycle/arrivals.rs`), which checks "nothing but submissions changed" from the store's
//! events and the nodes instead of comparing snapshots, decides with [`Standing::decide`] and
//! moves the session on with [`Standing::started`]. It leaves `after` as the full cycle left
//! it: a full cycle that follows finds the new runs in its snapshot and solves the whole queue.

use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{ClusterStateSpec, PendingWorkload, RunningWorkload};
use tessera_solver::Decision;
use tessera_solver::decision::Outcome;
use tessera_solver::session::{Admission, ArrivalOrder, FullCycle, Session, SessionError};

/// At most this many submissions are decided by the session in one cycle; a burst goes to a
/// full cycle. An arrival the session places ahead of waiting work decides that work again
/// behind it, so a burst decided one arrival at a time costs up to its size times the queue,
/// where a full cycle decides the queue once.
pub const MAX_ARRIVALS: usize = 16;

/// A full cycle's session, and the snapshot its decision left.
pub struct Standing {
    session: Session,
    /// The commit the decision was made under.
    revision: String,
    /// The snapshot the next cycle builds if nothing but submissions happened.
    after: ClusterStateSpec,
    /// When the full cycle that opened the session ran, Unix seconds.
    since: i64,
    /// Runs the arrival path started that the session does not hold as running yet (it
    /// declined to move on, see [`Standing::started`]).
    unsettled: Vec<RunningWorkload>,
}

/// What the session decided for one cycle.
pub struct Admitted {
    /// The standing decision whole, arrivals included, for the planner.
    pub decision: Decision,
    /// Arrivals decided.
    pub arrivals: usize,
    /// Arrivals left for the next cycle: each would be decided before another arrival of this
    /// cycle that was admitted (see [`Standing::admit`]). The decision does not name them.
    pub deferred: Vec<PendingWorkload>,
}

/// Why a cycle could not use the standing decision; for the cycle's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    Revision,
    Expired,
    /// The snapshot differs from the one the standing decision left, beyond new submissions:
    /// which part of it (`nodes`, `running`, `pending`, `usage`, `reservations`).
    Changed(&'static str),
    NoArrival,
    /// More than [`MAX_ARRIVALS`] submissions at once.
    Burst(usize),
    /// The last decision was not carried out whole: an action failed or was skipped, or
    /// something waits (a drain, a back-off).
    Unfinished,
    /// The session could not decide an arrival alone (see `FullCycle`), or refused it.
    Session(String),
    /// The store recorded a change to a workload other than a submission or the service's
    /// own starts (an exit, a cancellation, a requeue): event `kind` of `workload`.
    Event {
        kind: String,
        workload: Option<String>,
    },
    /// A workload's process ended.
    Exited,
    /// Reconciliation is suspended: the full cycle decides without acting.
    Suspended,
    /// Something only a full cycle does is due at this instant: a committed workload's
    /// restart, or a run reaching its `maxDuration`.
    Due(&'static str),
    /// The arrival path could not carry out its decision (a device not found, the store
    /// refused a start), with what went wrong.
    Apply(String),
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stale::Revision => f.write_str("a new revision"),
            Stale::Expired => f.write_str("the cycle period passed"),
            Stale::Changed(what) => write!(f, "the snapshot's {what} changed"),
            Stale::NoArrival => f.write_str("nothing was submitted"),
            Stale::Burst(n) => write!(f, "{n} submissions at once"),
            Stale::Unfinished => f.write_str("the last decision was not carried out whole"),
            Stale::Session(why) => write!(f, "the session asks for a full cycle: {why}"),
            Stale::Event { kind, workload } => match workload {
                Some(w) => write!(f, "the store recorded `{kind}` for `{w}`"),
                None => write!(f, "the store recorded `{kind}`"),
            },
            Stale::Exited => f.write_str("a process ended"),
            Stale::Suspended => f.write_str("reconciliation is suspended"),
            Stale::Due(what) => write!(f, "{what} is due"),
            Stale::Apply(why) => write!(f, "the arrival path could not apply: {why}"),
        }
    }
}

impl Stale {
    /// The kind of reason, as a metric's label.
    pub fn kind(&self) -> &'static str {
        match self {
            Stale::Revision => "revision",
            Stale::Expired => "expired",
            Stale::Changed(_) => "changed",
            Stale::NoArrival => "no_arrival",
            Stale::Burst(_) => "burst",
            Stale::Unfinished => "unfinished",
            Stale::Session(_) => "session",
            Stale::Event { .. } => "event",
            Stale::Exited => "exited",
            Stale::Suspended => "suspended",
            Stale::Due(_) => "due",
            Stale::Apply(_) => "apply",
        }
    }
}

impl Standing {
    /// Keeps `session` when `decision` was carried out whole; `after` is the snapshot the
    /// cycle left (its `observedAt` is not compared), without what was submitted while the
    /// cycle ran. `Err` says why the decision cannot stand.
    pub fn keep(
        mut session: Session,
        decision: &Decision,
        revision: &str,
        after: ClusterStateSpec,
        since: i64,
    ) -> Result<Standing, Stale> {
        no_preemption(decision)?;
        rebase(&mut session, &after);
        Ok(Standing {
            session,
            revision: revision.to_owned(),
            after,
            since,
            unsettled: Vec::new(),
        })
    }

    /// Decides the workloads submitted since, against the standing decision. `Err` when a
    /// full cycle must decide instead; the standing decision is then spent.
    pub fn admit(
        mut self,
        state: &ClusterStateSpec,
        revision: &str,
        now: i64,
        period_seconds: i64,
    ) -> Result<(Standing, Admitted), Stale> {
        if revision != self.revision {
            return Err(Stale::Revision);
        }
        if now < self.since || now - self.since >= period_seconds {
            return Err(Stale::Expired);
        }
        let arrivals = arrivals(&self.after, state)?;
        if arrivals.is_empty() {
            return Err(Stale::NoArrival);
        }
        if arrivals.len() > MAX_ARRIVALS {
            return Err(Stale::Burst(arrivals.len()));
        }
        let mut decided: Vec<String> = Vec::with_capacity(arrivals.len());
        let mut deferred = Vec::new();
        // In the order the full cycle would pick them, so that none is ordered before
        // another arrival of this cycle (see `ArrivalOrder`).
        let mut order = ArrivalOrder::new(&mut self.session, &arrivals);
        while let Some(i) = order.next(&mut self.session, &arrivals) {
            let arrival = &arrivals[i];
            let key = WorkloadKey::new(&arrival.spec.tenant, &arrival.name).to_string();
            match self.session.admit(arrival) {
                Ok(Admission::Decided { .. }) => decided.push(key),
                // The full cycle would pick it before another arrival of this cycle: once that
                // one runs, the next cycle decides it after all admissions, as a full cycle
                // on that fleet would.
                Ok(Admission::NeedsFullCycle(FullCycle::Reorders { before }))
                    if decided.contains(&before) =>
                {
                    deferred.push(arrival.clone());
                }
                Ok(Admission::NeedsFullCycle(why)) => {
                    return Err(Stale::Session(why.to_string()));
                }
                Err(e) => return Err(Stale::Session(e.to_string())),
            }
        }
        let decision = self.session.decision();
        Ok((
            self,
            Admitted {
                decision,
                arrivals: decided.len(),
                deferred,
            },
        ))
    }

    /// The commit the standing decision was made under.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// Whether the standing decision is older than `period_seconds` at `now` (or `now` is
    /// before it): the periodic full cycle is due.
    pub fn expired(&self, now: i64, period_seconds: i64) -> bool {
        now < self.since || now - self.since >= period_seconds
    }

    /// Whether the session holds workload `key` already: the cycle that opened it saw it, or
    /// the arrival path decided it.
    pub fn knows(&self, key: &WorkloadKey) -> bool {
        self.session.contains(key)
    }

    /// The arrival path: decides one workload submitted since, against the standing
    /// decision, as [`Session::admit`] does. The caller makes sure it is new
    /// ([`Standing::knows`]) and that nothing but submissions changed since the standing
    /// decision was made; on `NeedsFullCycle` or `Err` the session is unchanged.
    pub fn decide(&mut self, arrival: &PendingWorkload) -> Result<Admission, SessionError> {
        self.session.admit(arrival)
    }

    /// The arrival path's order for a batch of new workloads: the order the full cycle would
    /// pick them in, so that none is ordered before an admission of its own batch
    /// ([`ArrivalOrder`]). Hand them out with [`Standing::next_arrival`].
    pub fn arrival_order(&mut self, arrivals: &[PendingWorkload]) -> ArrivalOrder {
        ArrivalOrder::new(&mut self.session, arrivals)
    }

    /// The next arrival of `order` to decide, against the session as the decisions before
    /// left it.
    pub fn next_arrival(
        &mut self,
        order: &mut ArrivalOrder,
        arrivals: &[PendingWorkload],
    ) -> Option<usize> {
        order.next(&mut self.session, arrivals)
    }

    /// The arrival path started `runs` (admitted by [`Standing::decide`]): the session stands
    /// for the fleet with them running, when it can move on (see `rebase`); otherwise they
    /// are kept and carried with the next batch's.
    ///
    /// The snapshot handed to the session holds only these runs: `Session::carried_out` reads
    /// the runs of the workloads it admitted from its snapshot and nothing else. `after` is not
    /// changed: a full cycle compares its snapshot with it and, finding the new runs, solves.
    pub fn started(&mut self, runs: Vec<RunningWorkload>) {
        self.unsettled.extend(runs);
        let snapshot = ClusterStateSpec {
            observed_at: self.after.observed_at,
            nodes: Vec::new(),
            running: std::mem::take(&mut self.unsettled),
            pending: Vec::new(),
            usage: None,
            reservations: Vec::new(),
            reconfigurations: Vec::new(),
        };
        if self.session.carried_out(&snapshot).is_err() {
            self.unsettled = snapshot.running;
        }
    }

    /// The snapshot the cycle that used the standing decision left, when it too was carried
    /// out whole; `Err` drops the standing decision.
    pub fn carried_out(
        mut self,
        decision: &Decision,
        after: ClusterStateSpec,
    ) -> Result<Self, Stale> {
        no_preemption(decision)?;
        rebase(&mut self.session, &after);
        self.after = after;
        Ok(self)
    }
}

/// What the cycle admitted now runs: the session stands for `after` from here on, so that a
/// later arrival is not ordered against admissions already carried out (which would send it
/// to a full cycle). When the session cannot (something waits, a geometry changed), it keeps
/// standing for the snapshot it opened on with the arrivals since, as decided: still the
/// decision the heuristic cycle would make there.
fn rebase(session: &mut Session, after: &ClusterStateSpec) {
    let _ = session.carried_out(after);
}

/// A preempted workload is queued again by the service, which the session (holding it as
/// preempted) would not decide again until a full cycle.
fn no_preemption(decision: &Decision) -> Result<(), Stale> {
    match decision
        .workloads
        .iter()
        .find(|w| matches!(w.outcome, Outcome::Preempt { .. }))
    {
        Some(w) => Err(Stale::Session(format!(
            "`{}/{}` was preempted",
            w.tenant, w.name
        ))),
        None => Ok(()),
    }
}

/// The workloads `now` waits for that `after` did not, in submission order, when that is all
/// that differs (`observedAt` aside); otherwise which part changed.
fn arrivals(
    after: &ClusterStateSpec,
    now: &ClusterStateSpec,
) -> Result<Vec<PendingWorkload>, Stale> {
    let changed = if after.nodes != now.nodes {
        Some("nodes")
    } else if after.running != now.running {
        Some("running")
    } else if after.usage != now.usage {
        Some("usage")
    } else if after.reservations != now.reservations {
        Some("reservations")
    } else {
        None
    };
    if let Some(what) = changed {
        return Err(Stale::Changed(what));
    }
    let mut known = after.pending.iter().peekable();
    let mut new = Vec::new();
    // Both lists are in submission order; the standing queue must appear in `now` whole and
    // unchanged, with only new workloads (by tenant and name) between.
    for p in &now.pending {
        if known.peek().is_some_and(|k| *k == p) {
            known.next();
        } else if after
            .pending
            .iter()
            .any(|k| k.name == p.name && k.spec.tenant == p.spec.tenant)
        {
            return Err(Stale::Changed("pending"));
        } else {
            new.push(p.clone());
        }
    }
    match known.peek() {
        None => Ok(new),
        Some(_) => Err(Stale::Changed("pending")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(name: &str, at: &str) -> PendingWorkload {
        PendingWorkload {
            name: name.to_owned(),
            spec: serde_json::from_value(serde_json::json!({
                "tenant": "t", "sloClass": "batch", "gpu": {"count": 1}
            }))
            .unwrap(),
            submitted_at: at.parse().unwrap(),
        }
    }

    fn snapshot(pending: Vec<PendingWorkload>) -> ClusterStateSpec {
        ClusterStateSpec {
            observed_at: "2026-11-24T10:00:00Z".parse().unwrap(),
            nodes: Vec::new(),
            running: Vec::new(),
            pending,
            usage: None,
            reservations: Vec::new(),
            reconfigurations: Vec::new(),
        }
    }

    #[test]
    fn only_new_submissions_are_arrivals() {
        let a = pending("a", "2026-11-24T09:00:00Z");
        let b = pending("b", "2026-11-24T09:30:00Z");
        let c = pending("c", "2026-11-24T10:00:01Z");
        let after = snapshot(vec![a.clone(), b.clone()]);
        let mut now = snapshot(vec![a.clone(), b.clone(), c.clone()]);
        now.observed_at = "2026-11-24T10:00:05Z".parse().unwrap();
        assert_eq!(arrivals(&after, &now), Ok(vec![c.clone()]));
        assert_eq!(arrivals(&after, &after), Ok(Vec::new()));
        // A waiting workload left (cancelled): not only arrivals.
        assert_eq!(
            arrivals(&after, &snapshot(vec![a.clone(), c.clone()])),
            Err(Stale::Changed("pending"))
        );
        // A waiting workload changed.
        let mut b2 = b.clone();
        b2.submitted_at = "2026-11-24T10:00:02Z".parse().unwrap();
        assert_eq!(
            arrivals(&after, &snapshot(vec![a.clone(), c, b2])),
            Err(Stale::Changed("pending"))
        );
        // Anything else moved.
        let mut moved = snapshot(vec![a, b]);
        moved.usage = Some(
            serde_json::from_value(serde_json::json!({
                "asOf": "2026-11-24T10:00:00Z", "tenants": {}
            }))
            .unwrap(),
        );
        assert_eq!(arrivals(&after, &moved), Err(Stale::Changed("usage")));
    }
}
