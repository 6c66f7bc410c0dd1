//! tessera's reconcile service: follows a branch of the policy repository, observes the nodes
//! through a [`driver::NodeDriver`], solves each cycle and moves the fleet toward the decision.
//!
//! - [`driver`]: the node driver trait and its `sim` implementation (`nvml` beside it).
//! - [`store`]: SQLite: workloads and their lifecycle, applied revisions, the write-ahead action
//!   journal, events.
//! - [`runtime`]: the embedded workload runtime: processes, checkpoint signals, exits.
//! - [`node`]: applying one action on a node: driver and runtime calls, no store (shared by
//!   the service and fleet mode's agent).
//! - [`repo`]: the bare mirror of the policy repository and the files of a revision.
//! - [`policy`]: which revision is in force; a bad one is never applied.
//! - [`snapshot`]: the observed fleet and tracked workloads as a `ClusterState`.
//! - [`metering`]: usage as it happens (GPU-seconds guaranteed and borrowed, reserved idle,
//!   preemptions, CPU, memory) and the chargeback report.
//! - [`metrics`]: the Prometheus exposition.
//! - [`auth`]: bearer tokens per tenant and for the operator.
//! - [`service`]: the loop, recovery, status, and the handle the API works through.
//! - [`api`]: the HTTP API (axum).
//! - [`ui`]: the fleet page (`/ui`): its data, its HTML, and browser sessions.
//! - [`actions`]: from a decision and the observed fleet to an ordered list of actions (pure).

pub mod actions;
pub mod api;
pub mod auth;
pub mod driver;
pub mod metering;
pub mod metrics;
pub mod node;
pub mod policy;
pub mod repo;
pub mod runtime;
pub mod service;
pub mod snapshot;
pub mod store;
pub mod ui;
