//! tessera's simulations and benchmarks, kept apart from the decision engine (`tessera-solver`):
//! nothing here decides a fleet.
//!
//! - [`openb`]: the openb GPU-sharing trace under the FGD paper's arrival protocol, its baseline
//!   placement policies (FirstFit, BestFit, FGD, Random) and the production solver as the Tessera row,
//!   with the paper's figures to compare against.
//! - [`replay`]: a workload trace replayed over time through the production solver (arrivals,
//!   departures, preemption, re-layouts), beside baseline placers under the same quota rules.

pub mod openb;
pub mod replay;
