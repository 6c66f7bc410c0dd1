//! `tessera plan`'s pure core: what changes between two revisions of a policy.
//!
//! [`policy_diff()`] compares two `CompiledPolicy` values semantically (by name and field, never
//! as text), so that renaming a file or reordering documents shows no change, and a raised
//! guarantee shows as exactly that. [`plan()`] wraps it with both revisions, the cluster
//! state's digest and the head's diagnostics into a versioned [`Plan`], which [`render`] turns
//! into a terminal view, a pull-request comment or GitHub annotations, and [`SavedPlan`] reads
//! back and checks against the current commit and state (a stale plan is refused).
//! [`decision_diff()`] compares the solver's decisions for the same state under both revisions
//! (who is admitted, preempted, moved, which GPUs re-partition); [`Plan::decisions`] carries it,
//! or says why it could not be computed.

pub mod decision_diff;
pub mod plan;
pub mod policy_diff;
pub mod render;
pub mod workflow_command;

pub use decision_diff::{DecisionDiff, decision_diff};
pub use plan::{
    Counts, Decisions, FORMAT_VERSION, ItemLocation, LoadError, Mode, Plan, PlanDiagnostic,
    PlanInput, ReplacedSnapshot, Revision, RevisionInfo, SavedPlan, Side, Stale, StateRef, plan,
    state_digest,
};
pub use policy_diff::{FieldChange, ItemChange, PolicyDiff, policy_diff};
