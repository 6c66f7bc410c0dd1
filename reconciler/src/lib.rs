//! tessera's reconcile service: follows a branch of the policy repository, observes the nodes
//! through a [`driver::NodeDriver`], solves each cycle and moves the fleet toward the decision.
//!
//! - [`driver`]: the node driver trait and its `sim` implementation (`nvml` beside it).
//! - [`store`]: SQLite: workloads and their lifecycle, applied revisions, the write-ahead action
//!   journal, events.
//! - [`runtime`]: the embedded workload runtime: processes, checkpoint signals, exits.

pub mod driver;
pub mod runtime;
pub mod store;
