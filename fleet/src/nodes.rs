//! Fleet mode's node side of the service ([`NodeSide`]): the leader observes the fleet through
//! [`FleetView`] and carries out its plans on the agents through [`PlanRunner`].
//!
//! **Journal and outcomes.** Each action's intent is in the service's store before the action
//! is written to etcd (a start's `Starting` with it, in one commit), and the outcome is
//! recorded from the agents' journals: first what the action did to the workload's record (a
//! start's `Running`, a checkpoint's signal, a stop's requeue), then the journal entry closed.
//! Only then are the agents' entries pruned (`PlanRunner::consumed`). A leader that dies in
//! between leaves them to its successor, which gets the same outcome again: it finds the
//! intent still open (matched by the action it names) and records it, each effect guarded by
//! the record's phase, or finds the intent closed and only prunes. Recording twice changes
//! nothing.
//!
//! **In flight.** An action the agents have not settled by the cycle's wait stays in flight:
//! its intent stays open, a start's workload stays `Starting` (so no plan starts it again),
//! and no new action on the same key (a workload, a GPU) is sent until it settles; a later
//! cycle records its outcome. A new term takes over its predecessor's in-flight actions the
//! same way ([`NodeSide::in_flight_at_start`]).
//!
//! **A gang start that reached only some nodes.** A dispatch cut part-way can leave a start's
//! copies on some of its nodes and not on others. The start's bindings, in every copy, name
//! all its nodes, so the term that matches the open intent knows the copies are not the whole
//! action: the start fails once the copies that were sent have settled, naming the nodes that
//! got none, and the usual failure path runs (the started replicas stopped, the workload
//! queued again). No gang is ever recorded `Running` with replicas that were never started.
//!
//! **A stop or checkpoint that reached only some nodes** is completed instead: the nodes the
//! workload's record binds it to and no copy reached are sent the same action by the next
//! dispatch, and it is recorded once every copy has settled. Recorded on some nodes' word, a
//! stop would requeue the workload while a replica that never got its copy runs on.
//!
//! **Exits and lost nodes.** A workload ended when the nodes report every replica of its
//! attempt exited ([`exits`]); the agents are then told to forget it (a stop). A node away
//! longer than the grace is reported lost only once its `bound` is emptied (fenced, guarded on
//! its registration being absent): the service then requeues its workloads, and an agent that
//! registers again reads the empty `bound` and stops them before it takes any action. Copies in
//! flight on such a node are failed, so that a start there fails rather than waiting for ever,
//! and a gang's replicas on its other nodes are stopped, since the whole gang is requeued.
//!
//! The service's loop is a plain thread and the fleet library is async: every call here runs
//! its future on a runtime this side owns, with `block_on` from the loop's thread, never on a
//! tokio worker.

pub mod exits;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::Binding;
use tessera_reconciler::actions::Action;
use tessera_reconciler::driver::{DriverError, Observation};
use tessera_reconciler::service::error::CycleError;
use tessera_reconciler::service::nodes::{
    Carry, InFlight, LaunchContext, Launched, Launching, NodeSide, OnSettled, Unsettled,
    WorkloadExit,
};
use tessera_reconciler::store::starts::StartIntent;
use tessera_reconciler::store::{
    ActionId, Ended, Phase, ReplicaProcess, StateStore, StateStoreExt, StoreError, WorkloadRecord,
};
use tracing::{info, warn};

use crate::FleetError;
use crate::election::Fence;
use crate::keys::Keys;
use crate::protocol::{Bound, Launch, VERSION};
use crate::runner::{ActionOutcome, EarlierOutcome, PlanRunner, PlannedAction, RunReport, Settled};
use crate::store::StoreRuntime;
use crate::view::{FleetSnapshot, FleetView};

/// How fleet mode's node side runs.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// How long a node may be away before it is lost and its workloads placed elsewhere.
    pub grace: Duration,
    /// How long a cycle waits for the agents to settle its actions; what is not settled by
    /// then stays in flight.
    pub settle: Duration,
    /// etcd's `--max-txn-ops`.
    pub max_txn_ops: usize,
}

/// The leader's view of the fleet and its runner, once started.
struct Started {
    view: FleetView,
    runner: PlanRunner,
}

/// An action sent and not yet recorded.
#[derive(Debug, Clone)]
struct Sent {
    action: Action,
    /// Each copy (node, id) and how it ended, once it has.
    copies: BTreeMap<(String, u64), Option<Result<(), String>>>,
    /// Nodes of a gang start that no copy reached (a dispatch cut part-way): the start fails
    /// once the copies that were sent have settled (see [`AgentNodes::match_open`]).
    missing: BTreeSet<String>,
    /// Nodes of a stop or checkpoint that no copy reached (a dispatch cut part-way): the next
    /// dispatch sends them one, and the action is recorded only once those have settled too.
    resend: BTreeSet<String>,
    /// Copies failed because their node was lost before settling them: left in etcd rather
    /// than pruned (pruning takes a copy for settled), so that the agent, if it comes back,
    /// settles them itself and that outcome is pruned then.
    abandoned: BTreeSet<(String, u64)>,
}

/// The leader's node side: the agents, through etcd.
pub struct AgentNodes {
    runtime: Arc<StoreRuntime>,
    client: Client,
    keys: Keys,
    fence: Fence,
    options: AgentOptions,
    started: Option<Started>,
    /// Why the view or the runner could not be started, or the last dispatch failed.
    trouble: Option<String>,
    /// Actions sent and not recorded, by their journal entry.
    in_flight: BTreeMap<ActionId, Sent>,
    /// Stops sent with the next dispatch that no journal entry stands for: a cancel, a run
    /// past its `maxDuration`, a gang's copies after another copy failed, an ended workload
    /// its agent may forget.
    housekeeping: Vec<PlannedAction>,
    /// Exits (workload, attempt) looked at already, so that `has_exits` wakes the loop once.
    seen_exits: BTreeSet<(String, u32)>,
    /// What `bound` was last computed as: written again only when it changes.
    last_bound: BTreeMap<String, Bound>,
    /// Open intents not known to be in etcd (a dispatch failed part-way): matched against
    /// what is in flight by the next call that reaches etcd.
    unsure: bool,
    /// Settled copies the arrival path records after `launch` returns: pruned by the next
    /// call, once recorded.
    to_prune: Vec<EarlierOutcome>,
    /// Lost nodes whose `bound` this term has emptied (see [`NodeSide::lost`]): only these are
    /// reported lost, and their copies in flight are failed.
    unbound: BTreeSet<String>,
}

impl AgentNodes {
    /// The node side of the term `fence` names. Nothing is read until the service starts
    /// (`in_flight_at_start`, on its loop's thread).
    pub fn new(
        client: Client,
        keys: Keys,
        fence: Fence,
        options: AgentOptions,
    ) -> std::io::Result<AgentNodes> {
        Ok(AgentNodes {
            runtime: StoreRuntime::new()?,
            client,
            keys,
            fence,
            options,
            started: None,
            trouble: None,
            in_flight: BTreeMap::new(),
            housekeeping: Vec::new(),
            seen_exits: BTreeSet::new(),
            last_bound: BTreeMap::new(),
            unsure: false,
            to_prune: Vec::new(),
            unbound: BTreeSet::new(),
        })
    }

    /// Starts the view (reading the nodes `expected` as well as the registered ones) and the
    /// runner, once.
    fn ensure(&mut self, expected: BTreeSet<String>) -> Result<&mut Started, String> {
        if self.started.is_none() {
            let (client, keys, fence) =
                (self.client.clone(), self.keys.clone(), self.fence.clone());
            let (grace, ops) = (self.options.grace, self.options.max_txn_ops);
            let started = self.runtime.block_on(async move {
                let view = FleetView::start(&client, &keys, grace, expected).await?;
                let runner = PlanRunner::start(&client, &keys, fence, ops).await?;
                Ok::<_, FleetError>(Started { view, runner })
            });
            match started {
                Ok(started) => {
                    self.started = Some(started);
                    self.trouble = None;
                }
                Err(e) => {
                    let message = format!("cannot follow the fleet in etcd: {e}");
                    self.trouble = Some(message.clone());
                    return Err(message);
                }
            }
        }
        Ok(self.started.as_mut().expect("started above"))
    }

    fn snapshot(&mut self) -> Option<Arc<FleetSnapshot>> {
        self.ensure(BTreeSet::new()).ok().map(|s| s.view.snapshot())
    }

    /// Sends `plan` (after the housekeeping stops) with every node's `bound`, waits for the
    /// agents up to the settle time, and records whatever settled of earlier actions. Returns
    /// the plan's outcomes, in order, for the caller to record (`own`: their intents).
    fn run(
        &mut self,
        store: &dyn StateStore,
        plan: Vec<PlannedAction>,
        own: &BTreeSet<ActionId>,
        now: i64,
    ) -> Result<Vec<ActionOutcome>, String> {
        if self.unsure {
            // Matched before anything new is sent, so that only what was in etcd matches.
            self.match_open(store, own, true, now)
                .map_err(|e| format!("matching open intents: {e}"))?;
        }
        let bound = bound(store, self.snapshot().as_deref(), &self.unbound)
            .map_err(|e| format!("reading the workloads: {e}"))?;
        let quiet = plan.is_empty()
            && self.housekeeping.is_empty()
            && self.to_prune.is_empty()
            && self.in_flight.values().all(|s| s.resend.is_empty())
            && bound == self.last_bound
            && self
                .started
                .as_ref()
                .is_none_or(|s| s.runner.in_flight().is_empty());
        if quiet {
            return Ok(Vec::new());
        }
        let housekeeping = std::mem::take(&mut self.housekeeping);
        let settle = self.options.settle;
        let runtime = self.runtime.clone();
        if let Err(e) = self.ensure(BTreeSet::new()) {
            // Intents may be open for what was not sent: matched once etcd answers.
            self.housekeeping = housekeeping;
            self.unsure = true;
            return Err(e);
        }
        // The copies partly-sent stops and checkpoints still owe, sent first.
        let owed = self.take_owed();
        let skip = housekeeping.len() + owed.len();
        let mut all = housekeeping.clone();
        all.extend(owed.iter().map(|(_, p)| p.clone()));
        all.extend(plan);
        let started = self.started.as_mut().expect("ensured");
        let report = {
            let runner = &mut started.runner;
            let deadline = tokio::time::Instant::now() + settle;
            runtime.block_on(runner.run(&all, &bound, deadline))
        };
        let report = match report {
            Ok(report) => report,
            Err(e) => {
                // What was written is a prefix of each node's actions: the next call matches
                // the open intents against what is in flight. The owed copies are sent again
                // (a stop or checkpoint copy that did go is then sent twice: see
                // `take_owed`).
                self.housekeeping = housekeeping;
                self.give_back_owed(owed);
                self.unsure = true;
                let message = format!("sending the plan to the agents: {e}");
                self.trouble = Some(message.clone());
                return Err(message);
            }
        };
        self.trouble = None;
        self.last_bound = bound;
        let hk = housekeeping.len();
        for ((id, _), outcome) in owed.iter().zip(&report.outcomes[hk..skip]) {
            if let Some(sent) = self.in_flight.get_mut(id) {
                for c in &outcome.copies {
                    sent.copies
                        .insert((c.node.clone(), c.id), settled_result(&c.settled));
                }
            }
        }
        let outcomes: Vec<ActionOutcome> = report.outcomes[skip..].to_vec();
        // The housekeeping's outcomes need no record: pruned once settled.
        let mut consumable: Vec<EarlierOutcome> = report.outcomes[..hk]
            .iter()
            .flat_map(|o| o.copies.iter())
            .filter_map(|c| settled_copy(&c.node, c.id, &c.settled))
            .collect();
        self.note_earlier(store, &report.earlier, &mut consumable, now)
            .map_err(|e| format!("recording the agents' outcomes: {e}"))?;
        consumable.append(&mut self.to_prune);
        self.consume_now(consumable)?;
        Ok(outcomes)
    }

    /// Records the earlier outcomes of actions in flight; those no open intent stands for
    /// are only pruned.
    fn note_earlier(
        &mut self,
        store: &dyn StateStore,
        earlier: &[EarlierOutcome],
        consumable: &mut Vec<EarlierOutcome>,
        now: i64,
    ) -> Result<(), StoreError> {
        for outcome in earlier {
            let copy = (outcome.node.clone(), outcome.id);
            let entry = self
                .in_flight
                .iter_mut()
                .find(|(_, sent)| sent.copies.contains_key(&copy));
            match entry {
                Some((_, sent)) => {
                    sent.copies.insert(copy, Some(outcome.result.clone()));
                }
                None => consumable.push(outcome.clone()),
            }
        }
        self.fail_copies_on_lost_nodes();
        let complete: Vec<ActionId> = self
            .in_flight
            .iter()
            .filter(|(_, sent)| sent.resend.is_empty() && sent.copies.values().all(Option::is_some))
            .map(|(id, _)| *id)
            .collect();
        for id in complete {
            let sent = self.in_flight.remove(&id).expect("listed above");
            let result = whole(&sent);
            self.record(store, id, &sent.action, &result, &sent.copies, now)?;
            info!(
                journal = id,
                "recorded: {} ({})",
                sent.action,
                describe(&result)
            );
            for ((node, copy), how) in sent.copies {
                if sent.abandoned.contains(&(node.clone(), copy)) {
                    continue;
                }
                let result = how.expect("complete");
                consumable.push(EarlierOutcome {
                    node,
                    id: copy,
                    message: None,
                    result,
                });
            }
        }
        Ok(())
    }

    /// Records what a settled action did: its effect on the workload's record (guarded by
    /// the record's phase, so that a second recording does nothing), then its journal entry.
    fn record(
        &mut self,
        store: &dyn StateStore,
        id: ActionId,
        action: &Action,
        result: &Result<(), String>,
        copies: &BTreeMap<(String, u64), Option<Result<(), String>>>,
        now: i64,
    ) -> Result<(), StoreError> {
        effect(store, action, result, now)?;
        if let (Action::Start { workload, .. }, Err(_)) = (action, result) {
            self.stop_started_copies(workload, copies);
        }
        let how = match result {
            Ok(()) => Ended::Done,
            Err(message) => Ended::Failed(message),
        };
        match store.close(id, how, now) {
            // Closed already (by a predecessor that died before pruning): nothing to add.
            Err(e) if still_open(store, id)? => Err(e),
            _ => Ok(()),
        }
    }

    /// Takes over the open intents of actions in flight in etcd (a predecessor's, or a
    /// dispatch that failed part-way), matched by the action they name; those not in etcd are
    /// returned.
    /// `close_orphans`: an open intent not in etcd was never sent and is closed as failed
    /// here (between cycles); at start it is left to the service's recovery.
    fn match_open(
        &mut self,
        store: &dyn StateStore,
        own: &BTreeSet<ActionId>,
        close_orphans: bool,
        now: i64,
    ) -> Result<Vec<(ActionId, Action)>, String> {
        let runtime = self.runtime.clone();
        let started = self.ensure(BTreeSet::new())?;
        let messages = runtime
            .block_on(started.runner.in_flight_messages())
            .map_err(|e| e.to_string())?;
        let tracked: BTreeSet<(String, u64)> = self
            .in_flight
            .values()
            .flat_map(|s| s.copies.keys().cloned())
            .collect();
        let mut free: Vec<((String, u64), Action)> = messages
            .into_iter()
            .filter(|(copy, _)| !tracked.contains(copy))
            .filter_map(|(copy, m)| Some((copy, m?.action)))
            .collect();
        let mut orphans = Vec::new();
        for entry in store.open_actions().map_err(|e| e.to_string())? {
            if self.in_flight.contains_key(&entry.id) || own.contains(&entry.id) {
                continue;
            }
            let Ok(action) = serde_json::from_value::<Action>(entry.action.clone()) else {
                orphans.push((entry.id, None));
                continue;
            };
            let copies: BTreeMap<(String, u64), Option<Result<(), String>>> = free
                .iter()
                .filter(|(_, a)| *a == action)
                .map(|(copy, _)| (copy.clone(), None))
                .collect();
            if copies.is_empty() {
                orphans.push((entry.id, Some(action)));
                continue;
            }
            free.retain(|(copy, _)| !copies.contains_key(copy));
            // A gang start is whole only with a copy on every node its bindings name; the
            // bindings travel in each copy, so what a cut dispatch left out is known here.
            // Such a start is failed rather than completed: a cut dispatch leaves a prefix
            // of each node's actions, so a missing node may also lack the geometry steps
            // its copy was planned after, and the placement was decided from a view this
            // term has not checked. Failing runs the usual path of a failed start (the
            // started replicas stopped, the workload queued again), so no gang runs partly.
            // It waits for the copies that were sent to settle, so that the stop goes, after
            // the start in each node's order, to every node that may run one.
            let missing: BTreeSet<String> = gang_nodes(&action)
                .into_iter()
                .filter(|node| !copies.keys().any(|(sent_to, _)| sent_to == node))
                .collect();
            if !missing.is_empty() {
                warn!(
                    journal = entry.id,
                    "{action} reached only some of its nodes; it fails once those settle \
                     (never sent to {})",
                    missing.iter().cloned().collect::<Vec<_>>().join(", ")
                );
            }
            // A stop or checkpoint that reached only some of the nodes its workload runs on
            // is completed instead: a stop is idempotent, and recording it done short of a
            // node would requeue the workload while that node's replica runs on. A
            // checkpoint's copies carry one deadline, so a late copy is the same signal sent
            // late; failing it instead would have the next plan signal again the replicas
            // that got it (see ARCHITECTURE.md, "The leader's node side").
            let resend: BTreeSet<String> = running_nodes(store, &action)
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|node| !copies.keys().any(|(sent_to, _)| sent_to == node))
                .collect();
            if !resend.is_empty() {
                warn!(
                    journal = entry.id,
                    "{action} reached only some of its nodes; sending it to {} before it is \
                     recorded",
                    resend.iter().cloned().collect::<Vec<_>>().join(", ")
                );
            }
            self.in_flight.insert(
                entry.id,
                Sent {
                    action,
                    copies,
                    missing,
                    resend,
                    abandoned: BTreeSet::new(),
                },
            );
        }
        self.unsure = false;
        if close_orphans {
            for (id, action) in &orphans {
                let message = "not sent: the dispatch to the agents failed before it".to_string();
                if let Some(action) = action {
                    effect(store, action, &Err(message.clone()), now).map_err(|e| e.to_string())?;
                }
                store
                    .close(*id, Ended::Failed(&message), now)
                    .map_err(|e| e.to_string())?;
            }
            return Ok(Vec::new());
        }
        Ok(orphans
            .into_iter()
            .filter_map(|(id, a)| Some((id, a?)))
            .collect())
    }

    /// The copies partly-sent stops and checkpoints owe (see [`AgentNodes::match_open`]),
    /// each routed to the nodes that never got one, by journal entry. Should a dispatch that
    /// carried them fail part-way, they are all owed again ([`AgentNodes::give_back_owed`]):
    /// a node whose copy was written then gets a second one, which a stop does not mind and
    /// a checkpoint's replica takes as a second signal.
    fn take_owed(&mut self) -> Vec<(ActionId, PlannedAction)> {
        let mut owed = Vec::new();
        for (id, sent) in &mut self.in_flight {
            if sent.resend.is_empty() {
                continue;
            }
            let nodes: Vec<String> = std::mem::take(&mut sent.resend).into_iter().collect();
            match PlannedAction::new(sent.action.clone(), None, &nodes) {
                Ok(planned) => owed.push((*id, planned)),
                Err(e) => warn!(journal = id, "{e}"),
            }
        }
        owed
    }

    fn give_back_owed(&mut self, owed: Vec<(ActionId, PlannedAction)>) {
        for (id, planned) in owed {
            if let Some(sent) = self.in_flight.get_mut(&id) {
                sent.resend.extend(planned.nodes);
            }
        }
    }

    /// Fails the unsettled copies on nodes lost (and unbound) since they were sent: their
    /// agent may never settle them, and the action, a start above all, would otherwise stay
    /// in flight for ever, its workload's key busy. The failure takes the usual path (a
    /// start's other copies stopped, the workload queued again). The copies stay in etcd: an
    /// agent that comes back settles them itself, a start refused since `bound` no longer
    /// names it.
    fn fail_copies_on_lost_nodes(&mut self) {
        if self.unbound.is_empty() {
            return;
        }
        for (id, sent) in &mut self.in_flight {
            for ((node, copy), how) in &mut sent.copies {
                if how.is_none() && self.unbound.contains(node) {
                    warn!(
                        journal = id,
                        "{}: node {node} lost before it settled it", sent.action
                    );
                    *how = Some(Err(format!(
                        "node {node} lost before it settled the action"
                    )));
                    sent.abandoned.insert((node.clone(), *copy));
                }
            }
        }
    }

    /// The caller requeues every workload placed on the lost node `node`; a gang's replicas
    /// on its other nodes (bound there at the same attempt by the last dispatch) are stopped
    /// by the next dispatch, ahead of its actions on the same node. Their agents read
    /// `bound` only when they register again, so without the stop they would run on beside
    /// the gang placed afresh.
    fn stop_gangs_of_lost(&mut self, node: &str, lost: &BTreeSet<String>) {
        let Some(was) = self.last_bound.get(node) else {
            return;
        };
        for (workload, attempt) in &was.workloads {
            let others: Vec<String> = self
                .last_bound
                .iter()
                .filter(|(other, b)| {
                    !lost.contains(*other) && b.workloads.get(workload) == Some(attempt)
                })
                .map(|(other, _)| other.clone())
                .collect();
            if others.is_empty() {
                continue;
            }
            let stop = Action::Stop {
                workload: workload.clone(),
                reason: format!("node {node} of its gang lost"),
            };
            match PlannedAction::new(stop, None, &others) {
                Ok(stop) => self.housekeeping.push(stop),
                Err(e) => warn!("{workload}: {e}"),
            }
        }
    }

    /// Keys with an action in flight: nothing new is sent on them until it settles.
    fn busy(&self) -> BTreeSet<String> {
        self.in_flight.values().map(|s| s.action.key()).collect()
    }

    /// What the start of `record` launches.
    fn launch_of(record: &WorkloadRecord, run_commands: bool) -> Launch {
        Launch {
            attempt: record.attempts,
            command: if run_commands {
                record.spec.command.clone()
            } else {
                Vec::new()
            },
            env: record.spec.env.clone(),
            cpu_millis: record.spec.cpu.0,
            memory_bytes: record.spec.memory.0,
        }
    }

    /// Remembers a sent action whose copies were not all settled.
    fn remember(&mut self, id: ActionId, action: &Action, copies: &[crate::runner::NodeCopy]) {
        self.in_flight.insert(
            id,
            Sent {
                action: action.clone(),
                copies: copies
                    .iter()
                    .map(|c| {
                        let how = match &c.settled {
                            Settled::Done => Some(Ok(())),
                            Settled::Failed(m) => Some(Err(m.clone())),
                            Settled::Pending => None,
                        };
                        ((c.node.clone(), c.id), how)
                    })
                    .collect(),
                // Sent by this term to every node it routed the action to.
                missing: BTreeSet::new(),
                resend: BTreeSet::new(),
                abandoned: BTreeSet::new(),
            },
        );
    }
}

impl NodeSide for AgentNodes {
    fn kind(&self) -> String {
        format!("agents (etcd, {})", self.keys.root())
    }

    // No `generation`: the view's etcd revision moves with every agent's report (its
    // processes, its utilisation), so it would send nearly every pass to a full cycle, and not
    // with the liveness deadlines (a node NotReady, then Lost, changes its health without a
    // write), so it could not vouch for an observation. The arrival path observes and compares.
    fn observe(&mut self) -> Result<Observation, DriverError> {
        self.snapshot()
            .map(|s| s.observation())
            .ok_or_else(|| DriverError::Other(self.trouble.clone().unwrap_or_default()))
    }

    fn in_flight_at_start(
        &mut self,
        store: &dyn StateStore,
        now: i64,
    ) -> Result<InFlight, StoreError> {
        // The nodes workloads are bound to are followed whether or not they are registered
        // now: one that is not is NotReady from this term's start.
        let expected: BTreeSet<String> = store
            .live()?
            .iter()
            .flat_map(|r| r.bindings.iter().map(|b| b.node.clone()))
            .collect();
        if let Err(e) = self.ensure(expected) {
            // Nothing can be known in flight: every open intent stays open until etcd
            // answers, and is matched then.
            warn!("{e}");
            self.unsure = true;
            return everything_open(store);
        }
        // What is not in etcd is the recovery's to close, as a restarted service closes it.
        if let Err(e) = self.match_open(store, &BTreeSet::new(), false, now) {
            warn!("matching the journal with the actions in flight: {e}");
            self.unsure = true;
            return everything_open(store);
        }
        // Outcomes the agents settled since are recorded now.
        if let Err(e) = self.run(store, Vec::new(), &BTreeSet::new(), now) {
            warn!("{e}");
        }
        let mut out = InFlight::default();
        for (id, sent) in &self.in_flight {
            out.actions.insert(*id);
            if let Action::Start { workload, .. } = &sent.action
                && let Some(key) = WorkloadKey::parse(workload)
            {
                out.starts.insert(key);
            }
        }
        Ok(out)
    }

    fn adopt(
        &mut self,
        _record: &WorkloadRecord,
        _observation: Option<&Observation>,
    ) -> Vec<String> {
        // The agents run the workloads and keep running them across a failover.
        Vec::new()
    }

    fn stop_strays(&mut self, _record: &WorkloadRecord) {
        // A start whose intent no action in etcd stands for never reached an agent.
    }

    fn stop(&mut self, key: &WorkloadKey, bindings: &[Binding], _replicas: &[ReplicaProcess]) {
        let nodes: Vec<String> = bindings.iter().map(|b| b.node.clone()).collect();
        match PlannedAction::new(
            Action::Stop {
                workload: key.to_string(),
                reason: "stopped by the control plane".into(),
            },
            None,
            &nodes,
        ) {
            Ok(stop) => self.housekeeping.push(stop),
            Err(e) => warn!("{key}: {e}"),
        }
    }

    fn carry_out(
        &mut self,
        plan: &[Action],
        cx: &mut Carry<'_>,
        settled: &mut OnSettled<'_>,
    ) -> Result<Unsettled, CycleError> {
        let mut out = Unsettled::default();
        let busy = self.busy();
        let records: BTreeMap<String, &WorkloadRecord> = cx
            .records
            .iter()
            .map(|r| (r.key().to_string(), r))
            .collect();
        // Routed first: an action that cannot go anywhere fails before anything is written.
        let mut routed: Vec<(Action, PlannedAction)> = Vec::new();
        let mut failed: Vec<(Action, String)> = Vec::new();
        for action in plan {
            if busy.contains(&action.key()) {
                out.skipped.push(action.clone());
                continue;
            }
            let record = workload_key(action).and_then(|w| records.get(w.as_str()).copied());
            let launch = match (action, record) {
                (Action::Start { .. }, Some(r)) => Some(Self::launch_of(r, cx.run_commands)),
                _ => None,
            };
            let running_on: Vec<String> = record
                .map(|r| r.bindings.iter().map(|b| b.node.clone()).collect())
                .unwrap_or_default();
            match PlannedAction::new(action.clone(), launch, &running_on) {
                Ok(planned) => routed.push((action.clone(), planned)),
                Err(e) => failed.push((action.clone(), e.to_string())),
            }
        }
        // The intents, a start's `Starting` with its intent; the other actions' together, in
        // as few commits as the store allows (a fleet-wide geometry change is thousands).
        let mut ids = vec![0; routed.len()];
        let batch = cx.store.max_start_batch().max(1);
        let mut starts: Vec<(usize, WorkloadKey, Vec<Binding>)> = Vec::new();
        let mut others: Vec<(usize, &Action)> = Vec::new();
        for (i, (action, _)) in routed.iter().enumerate() {
            match action {
                Action::Start { workload, bindings } => {
                    let key = WorkloadKey::parse(workload).ok_or_else(|| {
                        CycleError::Nodes(format!("`{workload}` is not a workload key"))
                    })?;
                    let plain = bindings.iter().map(|b| b.binding()).collect();
                    starts.push((i, key, plain));
                }
                other => others.push((i, other)),
            }
        }
        let actions: Vec<&Action> = others.iter().map(|&(_, a)| a).collect();
        let begun = cx.store.begin_actions(cx.cycle, &actions, cx.now)?;
        for (&(i, _), id) in others.iter().zip(begun) {
            ids[i] = id;
        }
        for chunk in starts.chunks(batch) {
            let intents: Vec<StartIntent<'_, Action>> = chunk
                .iter()
                .map(|(i, key, plain)| StartIntent {
                    workload: key,
                    bindings: plain,
                    action: &routed[*i].0,
                })
                .collect();
            let begun = cx.store.begin_starts(cx.cycle, &intents, cx.now)?;
            for ((i, _, _), id) in chunk.iter().zip(begun) {
                ids[*i] = id;
            }
        }
        for (action, message) in &failed {
            let id = cx.store.begin_action(cx.cycle, action, cx.now)?;
            cx.store.close(id, Ended::Failed(message), cx.now)?;
            settled(action, &Err(message.clone()))?;
        }
        let planned: Vec<PlannedAction> = routed.iter().map(|(_, p)| p.clone()).collect();
        let own: BTreeSet<ActionId> = ids.iter().copied().collect();
        let report = self
            .run(cx.store, planned, &own, cx.now)
            .map_err(CycleError::Nodes)?;
        // Pruned together once every settled action is recorded.
        let mut consumable = Vec::new();
        let mut outcomes = Vec::new();
        for (((action, _), id), outcome) in routed.iter().zip(ids).zip(report) {
            match outcome.settled {
                Settled::Pending => {
                    self.remember(id, action, &outcome.copies);
                    out.in_flight.push(action.clone());
                }
                ref done_or_failed => {
                    let result = match done_or_failed {
                        Settled::Failed(message) => Err(message.clone()),
                        _ => Ok(()),
                    };
                    outcomes.push((action, id, result, outcome));
                }
            }
        }
        // A GPU's step changes no workload's record: only its journal entry is closed, with
        // the other steps' together (see `close_steps`), before anything is reported.
        let steps: Vec<(ActionId, Result<(), String>)> = outcomes
            .iter()
            .filter(|(action, ..)| workload_key(action).is_none())
            .map(|(_, id, result, _)| (*id, result.clone()))
            .collect();
        close_steps(cx.store, &steps, cx.now)?;
        for (action, id, result, outcome) in outcomes {
            if workload_key(action).is_some() {
                let copies = outcome
                    .copies
                    .iter()
                    .map(|c| ((c.node.clone(), c.id), settled_result(&c.settled)))
                    .collect();
                self.record(cx.store, id, action, &result, &copies, cx.now)?;
            }
            settled(action, &result)?;
            consumable.extend(
                outcome
                    .copies
                    .iter()
                    .filter_map(|c| settled_copy(&c.node, c.id, &c.settled)),
            );
        }
        self.consume_now(consumable).map_err(CycleError::Nodes)?;
        Ok(out)
    }

    fn launch(&mut self, starts: &[Launching<'_>], cx: &LaunchContext<'_>) -> Vec<Launched> {
        let mut planned = Vec::with_capacity(starts.len());
        let mut routed = Vec::with_capacity(starts.len());
        for s in starts {
            let launch = Self::launch_of(s.record, cx.run_commands);
            match PlannedAction::new(s.action.clone(), Some(launch), &[]) {
                Ok(p) => {
                    routed.push(Some(planned.len()));
                    planned.push(p);
                }
                Err(_) => routed.push(None),
            }
        }
        let own: BTreeSet<ActionId> = starts.iter().map(|s| s.id).collect();
        let report = match self.run(cx.store, planned, &own, cx.now) {
            Ok(report) => report,
            Err(e) => {
                warn!("{e}");
                // Not known to be sent: matched against etcd by the next call.
                return starts.iter().map(|_| Launched::InFlight).collect();
            }
        };
        let mut consumable = Vec::new();
        let launched: Vec<Launched> = starts
            .iter()
            .zip(routed)
            .map(|(s, at)| {
                let Some(at) = at else {
                    return Launched::Failed(format!("{} names no node", s.action));
                };
                let outcome = &report[at];
                match &outcome.settled {
                    Settled::Done => {
                        // Recorded by the arrival path (`finish_starts`) right after: pruned
                        // once it is, by the next call (an outcome is only ever reported
                        // again, never lost).
                        consumable.extend(
                            outcome
                                .copies
                                .iter()
                                .filter_map(|c| settled_copy(&c.node, c.id, &c.settled)),
                        );
                        Launched::Started(replicas(s.action))
                    }
                    Settled::Failed(message) => {
                        // Recorded by the arrival path; pruned with the next outcomes.
                        self.remember_failed(outcome);
                        Launched::Failed(message.clone())
                    }
                    Settled::Pending => {
                        self.remember(s.id, s.action, &outcome.copies);
                        Launched::InFlight
                    }
                }
            })
            .collect();
        self.to_prune.extend(consumable);
        launched
    }

    fn has_exits(&mut self) -> bool {
        let Some(snapshot) = self.snapshot() else {
            return false;
        };
        let reports = snapshot
            .nodes()
            .filter_map(|v| Some((v.name.as_str(), v.observed.as_ref()?)));
        let exited =
            exits::exited(reports.flat_map(|(n, o)| o.workloads.iter().map(move |w| (n, w))));
        exited.iter().any(|e| !self.seen_exits.contains(e))
    }

    fn exits(
        &mut self,
        store: &dyn StateStore,
        _now: i64,
    ) -> Result<Vec<WorkloadExit>, StoreError> {
        let Some(snapshot) = self.snapshot() else {
            return Ok(Vec::new());
        };
        let reports: Vec<(&str, &crate::protocol::ReplicaState)> = snapshot
            .nodes()
            .filter_map(|v| Some((v.name.as_str(), v.observed.as_ref()?)))
            .flat_map(|(n, o)| o.workloads.iter().map(move |w| (n, w)))
            .collect();
        let live = store.live()?;
        let ended = exits::ended(&live, reports.iter().copied());
        self.seen_exits = exits::exited(reports.iter().copied());
        let mut out = Vec::with_capacity(ended.len());
        for e in ended {
            // The agents forget it once the service has recorded how it ended.
            if let Ok(stop) = PlannedAction::new(
                Action::Stop {
                    workload: e.record.key().to_string(),
                    reason: "ended".into(),
                },
                None,
                &e.nodes,
            ) {
                self.housekeeping.push(stop);
            }
            out.push(WorkloadExit {
                record: e.record,
                status: e.status,
                checkpoint: None,
            });
        }
        Ok(out)
    }

    fn alive(&self, record: &WorkloadRecord) -> Option<usize> {
        // What the agents last reported, whether or not the node is reachable now (a node
        // away keeps its workloads until it is lost).
        let snapshot = self.started.as_ref()?.view.snapshot();
        let reports = snapshot
            .nodes()
            .filter_map(|v| Some((v.name.as_str(), v.observed.as_ref()?)))
            .flat_map(|(n, o)| o.workloads.iter().map(move |w| (n, w)));
        Some(exits::alive(record, reports))
    }

    fn lost(&mut self) -> Vec<(String, String)> {
        let Some(snapshot) = self.snapshot() else {
            return Vec::new();
        };
        let reasons: BTreeMap<String, String> = snapshot
            .unavailable()
            .into_iter()
            .map(|u| (u.node, u.reason))
            .collect();
        let lost: BTreeSet<String> = snapshot.lost().into_iter().map(str::to_string).collect();
        // A node back (Ready or NotReady again) is bound as any other by the next dispatch.
        self.unbound.retain(|node| lost.contains(node));
        // A lost node's workloads are requeued by the caller, so its `bound` is emptied
        // first, guarded on its registration being absent: an agent that registers again
        // after that reads the empty `bound` and stops them, and one that registered before
        // it makes the write fail, and its node is not lost after all. A node whose write
        // fails or cannot be made now is not reported: its workloads stay where they are
        // until a later call manages it.
        let runtime = self.runtime.clone();
        let fresh: Vec<String> = lost.difference(&self.unbound).cloned().collect();
        for node in fresh {
            let Some(started) = self.started.as_mut() else {
                break;
            };
            match runtime.block_on(started.runner.unbind_lost(&node)) {
                Ok(true) => {
                    info!(node = %node, "lost: its bound workloads emptied before they are requeued");
                    self.stop_gangs_of_lost(&node, &lost);
                    self.unbound.insert(node);
                }
                Ok(false) => info!(node = %node, "registered again before it was unbound"),
                Err(e) => warn!(node = %node, "cannot unbind the lost node yet: {e}"),
            }
        }
        lost.into_iter()
            .filter(|node| self.unbound.contains(node))
            .map(|node| {
                let why = reasons.get(&node).cloned().unwrap_or_default();
                (node, why)
            })
            .collect()
    }

    fn conditions(&mut self, _run_commands: bool) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(trouble) = &self.trouble {
            out.push(trouble.clone());
        }
        if let Some(snapshot) = self.started.as_ref().map(|s| s.view.snapshot()) {
            if let Some(t) = &snapshot.trouble {
                out.push(format!(
                    "etcd: {} (since {}); the fleet as last read is used",
                    t.message,
                    tessera_compiler::units::format_rfc3339(t.since)
                ));
            }
            for u in snapshot.unavailable() {
                out.push(format!("node {}: {}", u.node, u.reason));
            }
        }
        out
    }
}

/// Consumes (prunes) copies recorded outside [`AgentNodes::run`].
impl AgentNodes {
    fn consume_now(&mut self, consumable: Vec<EarlierOutcome>) -> Result<(), String> {
        if consumable.is_empty() {
            return Ok(());
        }
        let runtime = self.runtime.clone();
        let started = self.started.as_mut().ok_or("the fleet is not followed")?;
        let done = RunReport {
            outcomes: Vec::new(),
            earlier: consumable,
            dispatched: Default::default(),
        };
        runtime
            .block_on(started.runner.consumed(&done))
            .map(|_| ())
            .map_err(|e| format!("pruning recorded outcomes: {e}"))
    }

    /// After a failed start: the gang's copies that did not fail are stopped (the workload is
    /// queued again), on the next dispatch.
    fn stop_started_copies(
        &mut self,
        workload: &str,
        copies: &BTreeMap<(String, u64), Option<Result<(), String>>>,
    ) {
        let started: Vec<String> = copies
            .iter()
            .filter(|(_, how)| !matches!(how, Some(Err(_))))
            .map(|((node, _), _)| node.clone())
            .collect();
        if !started.is_empty()
            && let Ok(stop) = PlannedAction::new(
                Action::Stop {
                    workload: workload.to_owned(),
                    reason: "another replica of the gang failed to start".into(),
                },
                None,
                &started,
            )
        {
            self.housekeeping.push(stop);
        }
    }

    /// A failed start the arrival path records: its copies that did start are stopped, and
    /// its outcome pruned by the next call, once recorded.
    fn remember_failed(&mut self, outcome: &crate::runner::ActionOutcome) {
        let copies: BTreeMap<(String, u64), Option<Result<(), String>>> = outcome
            .copies
            .iter()
            .map(|c| ((c.node.clone(), c.id), settled_result(&c.settled)))
            .collect();
        if let Action::Start { workload, .. } = &outcome.action {
            self.stop_started_copies(workload, &copies);
        }
        self.to_prune.extend(
            outcome
                .copies
                .iter()
                .filter_map(|c| settled_copy(&c.node, c.id, &c.settled)),
        );
    }
}

/// What a settled action does to its workload's record. Each step is taken only from the
/// phase it leaves, so recording an outcome a second time does nothing.
fn effect(
    store: &dyn StateStore,
    action: &Action,
    result: &Result<(), String>,
    now: i64,
) -> Result<(), StoreError> {
    let Some(key) = workload_key(action).and_then(|w| WorkloadKey::parse(&w)) else {
        return Ok(());
    };
    let Some(record) = store.get(&key)? else {
        return Ok(());
    };
    match (action, result) {
        (Action::Start { .. }, Ok(())) if record.phase == Phase::Starting => {
            store.mark_running(&key, &replicas(action), now)?;
        }
        (Action::Start { .. }, Err(message)) if record.phase == Phase::Starting => {
            store.requeue(&key, &format!("start failed: {message}"), now)?;
        }
        (Action::Checkpoint { deadline, .. }, Ok(())) if record.phase == Phase::Running => {
            store.mark_checkpointing(&key, *deadline, now)?;
        }
        (Action::Stop { reason, .. }, Ok(())) if record.phase.holds_placement() => {
            store.requeue(&key, reason, now)?;
        }
        _ => {}
    }
    Ok(())
}

/// A started gang's replicas as the store records them: its processes are its agents'.
fn replicas(action: &Action) -> Vec<ReplicaProcess> {
    match action {
        Action::Start { bindings, .. } => (0..bindings.len() as u32)
            .map(|replica| ReplicaProcess {
                replica,
                pid: None,
                devices: Vec::new(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The nodes a gang start's copies go to, as its bindings name them; none for other actions
/// (their nodes are not in the action).
fn gang_nodes(action: &Action) -> BTreeSet<String> {
    match action {
        Action::Start { bindings, .. } => bindings.iter().map(|b| b.node.clone()).collect(),
        _ => BTreeSet::new(),
    }
}

/// The nodes a stop or checkpoint is meant for: those its workload's record binds it to, while
/// the workload is placed (its copies go there, as `carry_out` routes them); none for other
/// actions, or a workload no longer placed (a stop recorded already, a requeue since).
fn running_nodes(store: &dyn StateStore, action: &Action) -> Result<BTreeSet<String>, StoreError> {
    let (Action::Stop { workload, .. } | Action::Checkpoint { workload, .. }) = action else {
        return Ok(BTreeSet::new());
    };
    let Some(key) = WorkloadKey::parse(workload) else {
        return Ok(BTreeSet::new());
    };
    Ok(match store.get(&key)? {
        Some(record) if record.phase.holds_placement() => {
            record.bindings.iter().map(|b| b.node.clone()).collect()
        }
        _ => BTreeSet::new(),
    })
}

fn workload_key(action: &Action) -> Option<String> {
    match action {
        Action::Checkpoint { workload, .. }
        | Action::Stop { workload, .. }
        | Action::Start { workload, .. } => Some(workload.clone()),
        _ => None,
    }
}

/// The whole action's result from its copies': failed when any failed, or when a node it was
/// meant for got no copy.
fn whole(sent: &Sent) -> Result<(), String> {
    let failed: Vec<String> = sent
        .copies
        .iter()
        .filter_map(|((node, _), how)| match how {
            Some(Err(m)) => Some(format!("{node}: {m}")),
            _ => None,
        })
        .chain(sent.missing.iter().map(|node| {
            format!("{node}: never sent (the dispatch that carried the start was cut off)")
        }))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

fn describe(result: &Result<(), String>) -> String {
    match result {
        Ok(()) => "done".into(),
        Err(m) => format!("failed: {m}"),
    }
}

fn settled_result(settled: &Settled) -> Option<Result<(), String>> {
    match settled {
        Settled::Done => Some(Ok(())),
        Settled::Failed(m) => Some(Err(m.clone())),
        Settled::Pending => None,
    }
}

fn settled_copy(node: &str, id: u64, settled: &Settled) -> Option<EarlierOutcome> {
    Some(EarlierOutcome {
        node: node.to_string(),
        id,
        message: None,
        result: settled_result(settled)?,
    })
}

/// Whether journal entry `id` is still open.
/// Closes the journal entries of GPU steps that settled, in as few commits as the store
/// allows. Where that fails (an entry closed already by a predecessor that died before it
/// pruned, or a commit refused), each is closed on its own as [`AgentNodes::record`] closes
/// it: one closed already is left as it is.
fn close_steps(
    store: &dyn StateStore,
    steps: &[(ActionId, Result<(), String>)],
    now: i64,
) -> Result<(), StoreError> {
    let ended: Vec<(ActionId, Ended<'_>)> = steps
        .iter()
        .map(|(id, result)| {
            let how = match result {
                Ok(()) => Ended::Done,
                Err(message) => Ended::Failed(message),
            };
            (*id, how)
        })
        .collect();
    if store.close_all(&ended, now).is_ok() {
        return Ok(());
    }
    for &(id, how) in &ended {
        match store.close(id, how, now) {
            Err(e) if still_open(store, id)? => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

fn still_open(store: &dyn StateStore, id: ActionId) -> Result<bool, StoreError> {
    Ok(store.open_actions()?.iter().any(|e| e.id == id))
}

/// Every open intent, as in flight: what is left open while etcd cannot say.
fn everything_open(store: &dyn StateStore) -> Result<InFlight, StoreError> {
    let mut out = InFlight::default();
    for entry in store.open_actions()? {
        out.actions.insert(entry.id);
        if let Ok(Action::Start { workload, .. }) = serde_json::from_value(entry.action)
            && let Some(key) = WorkloadKey::parse(&workload)
        {
            out.starts.insert(key);
        }
    }
    Ok(out)
}

/// Every node's `bound`: the workloads placed on it (starting, running or checkpointing) at
/// their attempt; a node with none gets an empty one, so an agent coming back stops what was
/// moved away from it.
///
/// A lost node whose `bound` was emptied (`unbound`) keeps an empty one whatever the store
/// still places there, so that a dispatch between its emptying and the requeue of its
/// workloads does not bind them to it again.
fn bound(
    store: &dyn StateStore,
    snapshot: Option<&FleetSnapshot>,
    unbound: &BTreeSet<String>,
) -> Result<BTreeMap<String, Bound>, StoreError> {
    let mut out: BTreeMap<String, Bound> = BTreeMap::new();
    if let Some(snapshot) = snapshot {
        for node in snapshot.nodes() {
            out.entry(node.name.clone()).or_insert_with(empty_bound);
        }
    }
    for record in store.live()? {
        if !record.phase.holds_placement() {
            continue;
        }
        for b in record
            .bindings
            .iter()
            .filter(|b| !unbound.contains(&b.node))
        {
            out.entry(b.node.clone())
                .or_insert_with(empty_bound)
                .workloads
                .insert(record.key().to_string(), record.attempts);
        }
    }
    Ok(out)
}

fn empty_bound() -> Bound {
    Bound {
        version: VERSION,
        workloads: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_solver::decision::ReplicaBinding;

    fn start_on(nodes: &[&str]) -> Action {
        Action::Start {
            workload: "t/w".into(),
            bindings: nodes
                .iter()
                .map(|node| ReplicaBinding {
                    node: (*node).into(),
                    gpus: vec![0],
                    mig_profile: None,
                    mig_start: None,
                    share: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_start_is_whole_only_with_a_copy_on_every_node_of_its_gang() {
        let start = start_on(&["n1", "n2", "n1"]);
        assert_eq!(
            gang_nodes(&start),
            BTreeSet::from(["n1".to_string(), "n2".to_string()])
        );
        assert!(
            gang_nodes(&Action::ResetGpu {
                gpu: tessera_reconciler::driver::GpuRef {
                    node: "n1".into(),
                    index: 0,
                },
            })
            .is_empty()
        );
        let sent = |copies: &[(&str, Result<(), String>)], missing: &[&str]| Sent {
            action: start.clone(),
            copies: copies
                .iter()
                .enumerate()
                .map(|(i, (node, how))| (((*node).to_string(), i as u64), Some(how.clone())))
                .collect(),
            missing: missing.iter().map(|n| (*n).to_string()).collect(),
            resend: BTreeSet::new(),
            abandoned: BTreeSet::new(),
        };
        assert_eq!(whole(&sent(&[("n1", Ok(())), ("n2", Ok(()))], &[])), Ok(()));
        let short = whole(&sent(&[("n1", Ok(()))], &["n2"])).unwrap_err();
        assert!(short.starts_with("n2: never sent"), "{short}");
        let both = whole(&sent(&[("n1", Err("no GPU".into()))], &["n2"])).unwrap_err();
        assert!(both.starts_with("n1: no GPU; n2: never sent"), "{both}");
    }
}
