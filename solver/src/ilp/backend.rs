//! Solving a [`Model`]: microlp by default (pure Rust), HiGHS with the `highs` feature.
//!
//! microlp is driven directly rather than through good_lp because good_lp does not pass on its
//! branch-and-bound node limit, and the node limit is what keeps the result independent of the
//! clock: the same model explores the same nodes on any machine. The time limit is only a
//! safety net, and a search it stops is reported as such (the caller then keeps the
//! heuristic's decision). HiGHS is reached through good_lp's `highs` feature, single-threaded
//! with its own node limit, for the same reason.

use std::time::Duration;

use super::model::Model;

/// How a search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Proven optimal.
    Optimal,
    /// Stopped at the node limit; `values` is the best solution found.
    NodeLimit,
    /// Stopped at the time limit; depends on the clock.
    TimeLimit,
}

#[derive(Debug, Clone)]
pub struct Answer {
    pub values: Vec<f64>,
    pub stop: Stop,
}

/// Limits of one search.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub nodes: u64,
    pub time: Duration,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    #[error("the sub-problem has no solution (the heuristic's decision breaks one of its rules)")]
    Infeasible,
    #[error("the solver stopped before finding any solution")]
    NoSolution,
    #[error("the solver failed: {0}")]
    Failed(String),
}

/// Solves `m` (maximising), offering its start point when it is feasible.
pub fn solve(m: &Model, limits: Limits) -> Result<Answer, BackendError> {
    if m.trivially_infeasible() {
        return Err(BackendError::Infeasible);
    }
    let start = m.feasible(&m.start, 1e-7).then_some(m.start.as_slice());
    imp::solve(m, start, limits)
}

#[cfg(not(feature = "highs"))]
mod imp {
    use microlp::{ComparisonOp, LinearExpr, OptimizationDirection, Problem, TerminationReason};

    use super::{Answer, BackendError, Limits, Model, Stop};

    pub fn solve(m: &Model, start: Option<&[f64]>, limits: Limits) -> Result<Answer, BackendError> {
        let mut problem = Problem::new(OptimizationDirection::Maximize);
        let mut vars = Vec::with_capacity(m.vars.len());
        for d in &m.vars {
            vars.push(if d.integer {
                // Bounds are small counts (replicas, 0/1), well inside i32.
                problem.add_integer_var(d.gain, (d.lo as i32, d.hi as i32))
            } else {
                problem.add_var(d.gain, (d.lo, d.hi))
            });
        }
        for c in m.constraints.iter().filter(|c| !c.terms.is_empty()) {
            let mut e = LinearExpr::empty();
            for &(v, k) in &c.terms {
                e.add(vars[v.0], k);
            }
            problem.add_constraint(e, ComparisonOp::Le, c.rhs);
        }
        let mut options = microlp::SolveOptions::default();
        options.node_limit = Some(limits.nodes);
        options.time_limit = Some(limits.time);
        options.warm_start = start.map(|s| vars.iter().copied().zip(s.iter().copied()).collect());
        let outcome = problem.solve_with(options).map_err(|e| match e {
            microlp::Error::Infeasible => BackendError::Infeasible,
            other => BackendError::Failed(other.to_string()),
        })?;
        let stop = match outcome.termination_reason() {
            TerminationReason::ProvenOptimal | TerminationReason::MipGap => Stop::Optimal,
            TerminationReason::NodeLimit => Stop::NodeLimit,
            // And any reason a later microlp adds: treated as clock-dependent, never trusted.
            _ => Stop::TimeLimit,
        };
        let solution = outcome
            .into_solution()
            .map_err(|_| BackendError::NoSolution)?;
        Ok(Answer {
            values: vars.iter().map(|&v| solution.var_value(v)).collect(),
            stop,
        })
    }
}

#[cfg(feature = "highs")]
mod imp {
    use good_lp::{
        Expression, ProblemVariables, ResolutionError, Solution, SolutionStatus, SolverModel,
        WithInitialSolution, variable,
    };

    use super::{Answer, BackendError, Limits, Model, Stop};

    pub fn solve(m: &Model, start: Option<&[f64]>, limits: Limits) -> Result<Answer, BackendError> {
        let mut pv = ProblemVariables::new();
        let vars: Vec<good_lp::Variable> = m
            .vars
            .iter()
            .map(|d| {
                let def = variable().bounds(d.lo..=d.hi);
                pv.add(if d.integer { def.integer() } else { def })
            })
            .collect();
        let objective: Expression = m.vars.iter().zip(&vars).map(|(d, &v)| d.gain * v).sum();
        let mut problem = pv
            .maximise(objective)
            .using(good_lp::highs)
            .set_threads(1)
            .set_option("mip_max_nodes", limits.nodes.min(i32::MAX as u64) as i32)
            .set_time_limit(limits.time.as_secs_f64());
        if let Some(s) = start {
            problem = problem.with_initial_solution(vars.iter().copied().zip(s.iter().copied()));
        }
        for c in m.constraints.iter().filter(|c| !c.terms.is_empty()) {
            let lhs: Expression = c.terms.iter().map(|&(v, k)| k * vars[v.0]).sum();
            problem = problem.with(lhs.leq(c.rhs));
        }
        let solution = problem.solve().map_err(|e| match e {
            ResolutionError::Infeasible => BackendError::Infeasible,
            other => BackendError::Failed(other.to_string()),
        })?;
        let stop = match solution.status() {
            SolutionStatus::Optimal | SolutionStatus::GapLimit => Stop::Optimal,
            // good_lp reports HiGHS's node and time limits alike.
            _ => Stop::TimeLimit,
        };
        Ok(Answer {
            values: vars.iter().map(|&v| solution.value(v)).collect(),
            stop,
        })
    }
}
