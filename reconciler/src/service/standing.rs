//! The standing decision kept between cycles, so that workloads submitted since are decided
//! against it (the solver's [`Session`]) instead of re-deciding the whole queue.
//!
//! A full cycle observes, solves and applies. When everything it decided was carried out (no
//! action failed or was skipped, nothing waits, nobody was preempted) the fleet is what its
//! decision says, and the session the solve kept stands for it. The next cycle may then use
//! the session, but only when the snapshot it builds is the one the full cycle left with
//! new submissions added: the same revision, nodes, running work, waiting work, usage record
//! and reservations. Anything else (an exit, a cancellation, a node that changed, a commit)
//! and the standing decision is dropped for a full cycle. So is one older than the cycle
//! period: time alone moves `minRuntime`, fair-share history and the integer program's
//! chances, and the periodic full cycle is where those are weighed.
//!
//! What a session decides is what the heuristic cycle would decide on the full cycle's
//! snapshot with the arrivals in its queue (see `tessera_solver::session`): the arrival is
//! decided as if it had come one cycle earlier, and never by the integer program.

use tessera_compiler::model::{ClusterStateSpec, PendingWorkload};
use tessera_solver::Decision;
use tessera_solver::decision::Outcome;
use tessera_solver::session::{Admission, Session};

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
}

/// Why a cycle could not use the standing decision; for the cycle's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    Revision,
    Expired,
    /// The snapshot differs from the one the standing decision left, beyond new submissions.
    Changed,
    NoArrival,
    /// More than [`MAX_ARRIVALS`] submissions at once.
    Burst(usize),
    /// The session could not decide an arrival alone (see `FullCycle`), or refused it.
    Session(String),
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stale::Revision => f.write_str("a new revision"),
            Stale::Expired => f.write_str("the cycle period passed"),
            Stale::Changed => f.write_str("the fleet or the queue changed"),
            Stale::NoArrival => f.write_str("nothing was submitted"),
            Stale::Burst(n) => write!(f, "{n} submissions at once"),
            Stale::Session(why) => write!(f, "the session asks for a full cycle: {why}"),
        }
    }
}

impl Standing {
    /// Keeps `session` when `decision` was carried out whole; `after` is the snapshot the
    /// cycle left (its `observedAt` is not compared).
    pub fn keep(
        session: Session,
        decision: &Decision,
        revision: &str,
        after: ClusterStateSpec,
        since: i64,
    ) -> Option<Standing> {
        let preempts = decision
            .workloads
            .iter()
            .any(|w| matches!(w.outcome, Outcome::Preempt { .. }));
        // A preempted workload is queued again by the service, which the session (holding it
        // as preempted) would not decide again until a full cycle.
        (!preempts).then_some(Standing {
            session,
            revision: revision.to_owned(),
            after,
            since,
        })
    }

    /// Decides the workloads submitted since, against the standing decision: the decision
    /// whole, for the planner, and how many arrivals it decided. `Err` when a full cycle must decide instead; the standing
    /// decision is then spent.
    pub fn admit(
        mut self,
        state: &ClusterStateSpec,
        revision: &str,
        now: i64,
        period_seconds: i64,
    ) -> Result<(Standing, Decision, usize), Stale> {
        if revision != self.revision {
            return Err(Stale::Revision);
        }
        if now < self.since || now - self.since >= period_seconds {
            return Err(Stale::Expired);
        }
        let arrivals = arrivals(&self.after, state).ok_or(Stale::Changed)?;
        if arrivals.is_empty() {
            return Err(Stale::NoArrival);
        }
        if arrivals.len() > MAX_ARRIVALS {
            return Err(Stale::Burst(arrivals.len()));
        }
        for arrival in &arrivals {
            match self.session.admit(arrival) {
                Ok(Admission::Decided { .. }) => {}
                Ok(Admission::NeedsFullCycle(why)) => {
                    return Err(Stale::Session(why.to_string()));
                }
                Err(e) => return Err(Stale::Session(e.to_string())),
            }
        }
        let decision = self.session.decision();
        Ok((self, decision, arrivals.len()))
    }

    /// The snapshot the cycle that used the standing decision left, when it too was carried
    /// out whole (`None` drops the standing decision).
    pub fn carried_out(mut self, decision: &Decision, after: ClusterStateSpec) -> Option<Self> {
        let preempts = decision
            .workloads
            .iter()
            .any(|w| matches!(w.outcome, Outcome::Preempt { .. }));
        if preempts {
            return None;
        }
        self.after = after;
        Some(self)
    }
}

/// The workloads `now` waits for that `after` did not, in submission order, when that is all
/// that differs (`observedAt` aside); `None` otherwise.
fn arrivals(after: &ClusterStateSpec, now: &ClusterStateSpec) -> Option<Vec<PendingWorkload>> {
    if after.nodes != now.nodes
        || after.running != now.running
        || after.usage != now.usage
        || after.reservations != now.reservations
    {
        return None;
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
            return None;
        } else {
            new.push(p.clone());
        }
    }
    known.peek().is_none().then_some(new)
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
        assert_eq!(arrivals(&after, &now), Some(vec![c.clone()]));
        assert_eq!(arrivals(&after, &after), Some(Vec::new()));
        // A waiting workload left (cancelled): not only arrivals.
        assert_eq!(
            arrivals(&after, &snapshot(vec![a.clone(), c.clone()])),
            None
        );
        // A waiting workload changed.
        let mut b2 = b.clone();
        b2.submitted_at = "2026-11-24T10:00:02Z".parse().unwrap();
        assert_eq!(arrivals(&after, &snapshot(vec![a.clone(), c, b2])), None);
        // Anything else moved.
        let mut moved = snapshot(vec![a, b]);
        moved.usage = Some(
            serde_json::from_value(serde_json::json!({
                "asOf": "2026-11-24T10:00:00Z", "tenants": {}
            }))
            .unwrap(),
        );
        assert_eq!(arrivals(&after, &moved), None);
    }
}
