//! tessera's simulations and benchmarks, kept apart from the decision engine (`tessera-solver`):
//! nothing here decides a fleet.
//!
//! - [`openb`]: the openb GPU-sharing trace under the FGD paper's arrival protocol, its baseline
//!   placement policies (FirstFit, BestFit, FGD, Random) and the production solver as the Tessera row,
//!   with the paper's figures to compare against.

pub mod openb;
