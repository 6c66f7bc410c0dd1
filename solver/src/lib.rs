//! tessera's solver: from a [`CompiledPolicy`] and a [`ClusterStateSpec`] to a [`Decision`]:
//! what runs where, which GPUs take which MIG geometry, who is preempted, and why everything
//! left waiting waits.
//!
//! - [`problem`]: the inputs resolved and indexed once ([`Problem`]), with typed errors for
//!   snapshots that contradict themselves.
//! - `quota`: hierarchical accounting (limits, guaranteed and borrowed usage, reservations of
//!   idle guarantees, fair share).
//! - [`heuristic`]: the fast greedy cycle; its decision is valid on its own, and is the warm
//!   start and fallback of the integer program.
//! - `ilp`: the integer programs that refine the heuristic's decision, one bounded window per
//!   pool, rebuilt through the heuristic's own steps and kept only when strictly better.
//! - [`decision`]: the output, serializable and byte-stable.
//!
//! Solving is pure and deterministic (invariant 7): the instant is the snapshot's `observedAt`
//! or [`SolveOptions::now`], every collection in the output has a fixed order, and the integer
//! programs are bounded by node counts. The clock is read for one thing only: a refinement that
//! reaches [`SolveOptions::time_limit`] stops and keeps the best decision so far, which the
//! decision reports (`time_limit` in a pool's refinement).

#[cfg(feature = "bench-fleet")]
pub mod bench_fleet;
mod bound;
pub mod carry;
mod cow;
pub mod decision;
pub mod fairshare;
pub mod heuristic;
mod ilp;
pub mod problem;
pub(crate) mod quota;
pub mod session;
mod split;
mod undo;

use std::time::Duration;

use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::ClusterStateSpec;

pub use decision::{Decision, Listing, Outcome, PreemptReason, Reason};
pub use problem::{Problem, ProblemError};
pub use split::splitting_every_list;

/// How to solve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SolveOptions {
    /// Wall-clock budget for refinement. The heuristic ignores it (it runs one bounded greedy
    /// pass); the integer programs share it and stop at it, keeping the best decision so far.
    pub time_limit: Duration,
    /// The instant of the decision, as Unix seconds; defaults to the snapshot's `observedAt`.
    pub now: Option<i64>,
    /// Which workloads the decision lists ([`Listing::All`] by default).
    pub listing: Listing,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            time_limit: Duration::from_secs(10),
            now: None,
            listing: Listing::All,
        }
    }
}

/// Why no decision could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SolveError {
    #[error("inconsistent input: {0}")]
    Problem(#[from] ProblemError),
}

/// A method that turns a [`Problem`] into a [`Decision`] within a time budget. The heuristic is
/// one; [`Refined`] is another, taking the heuristic's decision as warm start and returning it
/// unchanged when it finds nothing better in time.
pub trait Solver {
    fn solve(&self, problem: &Problem, time_limit: Duration) -> Decision;
}

/// The greedy heuristic of [`heuristic`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Heuristic;

impl Solver for Heuristic {
    fn solve(&self, problem: &Problem, _time_limit: Duration) -> Decision {
        heuristic::solve(problem)
    }
}

/// The heuristic, then an integer program per pool that may improve it (see `ilp/`); each
/// pool's report says what happened there.
#[derive(Debug, Clone, Copy, Default)]
pub struct Refined;

impl Solver for Refined {
    fn solve(&self, problem: &Problem, time_limit: Duration) -> Decision {
        let (incumbent, keep) = heuristic::solve_keeping(problem);
        ilp::refine(problem, incumbent, &keep, ilp::Budget::new(time_limit))
    }
}

/// Decides one cycle for `state` under `policy`: the heuristic refined within
/// `options.time_limit`.
pub fn solve(
    policy: &CompiledPolicy,
    state: &ClusterStateSpec,
    options: &SolveOptions,
) -> Result<Decision, SolveError> {
    let mut problem = Problem::new(policy, state, options.now)?;
    problem.listing = options.listing;
    Ok(Refined.solve(&problem, options.time_limit))
}
