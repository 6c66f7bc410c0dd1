//! The service's node side: how the cycle observes the nodes, carries out a plan's actions on
//! them and learns which workloads ended. [`LocalNodes`] is the single-process service's (this
//! machine's driver and the embedded runtime, each action journaled in the store around its
//! call); fleet mode's (`tessera_fleet::nodes`) sends the actions to the nodes' agents through
//! etcd. The cycle decides; what crosses this seam is plain data (observations, actions,
//! outcomes, exits), so the decision code is one for both.
//!
//! Both keep the journal's rule: an action's intent is in the store before anything of it can
//! happen on a node, and its outcome is recorded once known. What the store records around an
//! action (a start's `Starting` and `Running`, a checkpoint's signal, a stop's requeue) is the
//! node side's to record, because only it knows when the action took effect.

mod local;

use std::collections::BTreeSet;

use tessera_compiler::WorkloadKey;
use tessera_compiler::model::Binding;

use super::error::CycleError;
use crate::actions::Action;
use crate::driver::{DriverError, Observation};
use crate::runtime::ExitStatus;
use crate::store::{ActionId, ReplicaProcess, StateStore, StoreError, WorkloadRecord};

pub use local::LocalNodes;

/// Told each action's outcome as soon as it is known (`Err`: the node's message); what it
/// records fails the cycle if it cannot be stored.
pub type OnSettled<'a> = dyn FnMut(&Action, &Result<(), String>) -> Result<(), StoreError> + 'a;

/// The nodes as the service drives them. Called only from the reconcile loop's thread.
pub trait NodeSide: Send {
    /// What the status names the node side by (the driver's kind, or the fleet's).
    fn kind(&self) -> String;

    /// The fleet now.
    fn observe(&mut self) -> Result<Observation, DriverError>;

    /// A number that changes whenever what [`NodeSide::observe`] reports of the nodes'
    /// geometry and health may have changed (`Observation::nodes`, and the GPU instances of
    /// `Observation::details`), however it changed; read before an observation, an unchanged
    /// number vouches that the observation still holds. `None` (the default): only an
    /// observation can tell. What the driver's [`crate::driver::NodeDriver::generation`]
    /// says, for the local node side.
    fn generation(&mut self) -> Option<u64> {
        None
    }

    /// At start, before recovery closes the journal's open intents as interrupted: those of
    /// actions the nodes may still carry out (and their workloads), which recovery leaves open
    /// for the node side to settle. Nothing survives a restart of the single-process service.
    fn in_flight_at_start(
        &mut self,
        store: &dyn StateStore,
        now: i64,
    ) -> Result<InFlight, StoreError>;

    /// At start: takes back the processes of a workload the store says runs. The messages of
    /// what could not be taken back.
    fn adopt(&mut self, record: &WorkloadRecord, observation: Option<&Observation>) -> Vec<String>;

    /// At start: stops whatever a start the previous run died during left running.
    fn stop_strays(&mut self, record: &WorkloadRecord);

    /// Stops a workload's replicas (a cancel, a `maxDuration`, a start not recorded): the
    /// store's record of them is the caller's.
    fn stop(&mut self, key: &WorkloadKey, bindings: &[Binding], replicas: &[ReplicaProcess]);

    /// Carries out `plan` in order, each action journaled in `cx.store`, and calls `settled`
    /// with each action's outcome as soon as it is known (a failure the cycle must count is
    /// recorded before the next action begins). Actions neither done nor failed are returned.
    fn carry_out(
        &mut self,
        plan: &[Action],
        cx: &mut Carry<'_>,
        settled: &mut OnSettled<'_>,
    ) -> Result<Unsettled, CycleError>;

    /// Starts the arrival path's batch, whose intents and `Starting` are recorded
    /// (`begin_starts`); one outcome per start, in order.
    fn launch(&mut self, starts: &[Launching<'_>], cx: &LaunchContext<'_>) -> Vec<Launched>;

    /// Whether a workload has ended since the last cycle (checked now).
    fn has_exits(&mut self) -> bool;

    /// The workloads whose last replica ended since the last call, each once.
    fn exits(&mut self, store: &dyn StateStore, now: i64) -> Result<Vec<WorkloadExit>, StoreError>;

    /// How many of a placed workload's replicas run now, where the store's pids do not say
    /// (fleet mode: the processes are the agents'); `None`: count the store's pids.
    fn alive(&self, _record: &WorkloadRecord) -> Option<usize> {
        None
    }

    /// Nodes gone for longer than their grace, with why: their workloads are requeued.
    fn lost(&mut self) -> Vec<(String, String)>;

    /// Why the node side cannot do all it should now (a runtime that cannot confine, nodes
    /// unavailable, the coordination store away): each a condition of the service's status.
    fn conditions(&mut self, run_commands: bool) -> Vec<String>;
}

/// Open intents left to the node side at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InFlight {
    pub actions: BTreeSet<ActionId>,
    /// Workloads whose start is among them: recovery leaves them `Starting`.
    pub starts: BTreeSet<WorkloadKey>,
}

/// What carrying out a plan needs from the cycle.
pub struct Carry<'a> {
    pub store: &'a dyn StateStore,
    pub cycle: u64,
    pub now: i64,
    pub run_commands: bool,
    /// The live workloads the plan was made from.
    pub records: &'a [WorkloadRecord],
    /// The latest observation; refreshed after geometry changes so that starts see new UUIDs.
    pub observation: &'a mut Observation,
}

/// What starting the arrival path's batch needs from the pass: its starts carry their devices
/// already resolved, so no observation travels with it.
pub struct LaunchContext<'a> {
    pub store: &'a dyn StateStore,
    pub cycle: u64,
    pub now: i64,
    pub run_commands: bool,
}

/// The actions of a plan that are neither done nor failed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Unsettled {
    /// Not attempted because an earlier one on the same GPU failed.
    pub skipped: Vec<Action>,
    /// Sent, and not settled yet: recorded when they are, by a later cycle.
    pub in_flight: Vec<Action>,
}

/// One start of the arrival path.
pub struct Launching<'a> {
    pub id: ActionId,
    pub key: &'a WorkloadKey,
    pub record: &'a WorkloadRecord,
    pub action: &'a Action,
    /// Its replicas' devices, resolved from the observation.
    pub plans: Vec<crate::node::ReplicaPlan>,
}

/// How one start of the arrival path went.
#[derive(Debug, Clone, PartialEq)]
pub enum Launched {
    Started(Vec<ReplicaProcess>),
    Failed(String),
    /// Sent, not settled yet: its intent stays open and the node side records it later.
    InFlight,
}

/// A workload whose last replica ended.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadExit {
    pub record: WorkloadRecord,
    pub status: ExitStatus,
    /// Where a checkpointing workload saved its work, when it saved any.
    pub checkpoint: Option<String>,
}
