//! `tessera plan`'s pure core: what changes between two revisions of a policy.
//!
//! [`policy_diff`] compares two `CompiledPolicy` values semantically (by name and field, never
//! as text), so that renaming a file or reordering documents shows no change, and a raised
//! guarantee shows as exactly that. The decision diff (who is admitted, preempted, moved, which
//! GPUs re-partition) joins it once the solver lands.

pub mod policy_diff;

pub use policy_diff::{FieldChange, ItemChange, PolicyDiff, policy_diff};
