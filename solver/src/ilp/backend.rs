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
    /// Stopped at the node limit; `values` is the best solution found. (good_lp reports
    /// HiGHS's node limit as a time limit, so only microlp says this.)
    #[cfg_attr(feature = "highs", allow(dead_code))]
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
    #[cfg_attr(feature = "highs", allow(dead_code))]
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
        variable,
    };

    use super::{Answer, BackendError, Limits, Model, Stop};

    /// The start point is not offered: through good_lp 1.15, HiGHS given the heuristic's
    /// solution as a start returned it as optimal where microlp (and HiGHS without it) found
    /// better (`solver/tests/exact.rs`). HiGHS's own presolve and heuristics make up for it,
    /// and the caller keeps the incumbent unless the answer is strictly better.
    pub fn solve(
        m: &Model,
        _start: Option<&[f64]>,
        limits: Limits,
    ) -> Result<Answer, BackendError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ilp::model::{Linear, Var};

    fn limits() -> Limits {
        Limits {
            nodes: 1_000,
            time: Duration::from_secs(30),
        }
    }

    /// max 5a + 4b + 3c, 2a + 3b + c ≤ 5, 4a + b + 2c ≤ 11, 3a + 4b + 2c ≤ 8, integers in 0..=2:
    /// the optimum (by enumeration) is a = 2, b = 0, c = 1, value 13.
    fn knapsack() -> Model {
        let mut m = Model::default();
        let (a, b, c) = (m.integer(2, 5.0), m.integer(2, 4.0), m.integer(2, 3.0));
        for (k, rhs) in [
            ([2.0, 3.0, 1.0], 5.0),
            ([4.0, 1.0, 2.0], 11.0),
            ([3.0, 4.0, 2.0], 8.0),
        ] {
            let mut e = Linear::default();
            e.add(a, k[0]);
            e.add(b, k[1]);
            e.add(c, k[2]);
            m.le(&e, &Linear::constant(rhs));
        }
        m
    }

    #[test]
    fn solves_to_the_integer_optimum_from_a_start_point() {
        let mut m = knapsack();
        m.start = vec![1.0, 1.0, 0.0];
        assert!(m.feasible(&m.start, 1e-9));
        let answer = solve(&m, limits()).unwrap();
        assert_eq!(answer.stop, Stop::Optimal);
        assert_eq!(answer.values, vec![2.0, 0.0, 1.0]);
        assert_eq!(m.objective(&answer.values), 13.0);
    }

    #[test]
    fn an_infeasible_model_is_an_error_not_an_answer() {
        let mut m = knapsack();
        m.le(&Linear::constant(1.0), &Linear::constant(0.0));
        assert!(m.trivially_infeasible());
        assert_eq!(solve(&m, limits()).unwrap_err(), BackendError::Infeasible);
        let mut m = knapsack();
        let mut e = Linear::default();
        e.add(Var(0), 1.0);
        m.ge(&e, &Linear::constant(3.0));
        assert_eq!(solve(&m, limits()).unwrap_err(), BackendError::Infeasible);
    }
}
