//! Replay over time: a workload trace run cycle by cycle through the production solver, with
//! arrivals, departures, queueing, preemption and MIG re-layouts, and the same replay with the
//! placement step swapped for a baseline placer.
//!
//! - [`trace`]: the workloads to replay and the tessera trace format (YAML `Workload`
//!   documents with `arrival` and `duration`).
//! - [`openb`]: the openb CSV traces and node lists as replay input.
//! - [`generate`]: a day of arrivals drawn from a policy's tenants.
//! - [`speed`]: time compression of a trace, and the load it offers.
//! - [`demand`]: demand scaling of a trace, drawn from it with replacement.
//! - [`engine`]: the discrete-event loop ([`replay`]).
//! - [`baseline`]: baseline placers under the solver's admission decisions.
//! - [`metrics`]: what a run measures ([`RunReport`]).
//! - [`report`]: the runs side by side ([`Summary`]), as JSON or a table; [`html`]: as a page.
//!
//! Replaying is pure and deterministic: the same inputs give the same report, as long as no
//! cycle's refinement reaches its time limit (the report counts those that do).

pub mod baseline;
pub mod demand;
pub mod engine;
pub mod generate;
pub mod html;
pub mod metrics;
pub mod openb;
pub mod report;
pub mod speed;
pub mod trace;

pub use baseline::{BaselinePlacer, OpenbBaseline};
pub use engine::{Placement, ReplayConfig, ReplayError, replay};
pub use metrics::{ClassReport, Delays, RunReport, TenantReport};
pub use report::Summary;
pub use trace::{TraceError, TraceWorkload, load_tessera_trace, parse_tessera_trace};
