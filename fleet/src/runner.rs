//! Carrying out a cycle's plan on the fleet: the leader's counterpart of the single-process
//! service applying its actions one at a time. [`PlanRunner::run`] sends every node its
//! actions and bindings through the [`Dispatcher`] (fenced), waits up to a deadline for the
//! agents to settle them, and returns each action's outcome in plan order: done, failed with
//! the agent's message, or not settled by the deadline.
//!
//! **An action for several nodes.** A gang's start goes to every node its replicas are bound
//! to, and a stop or checkpoint to every node its workload runs on; each node gets its own
//! copy (its own id) and starts or signals its own replicas. The action is done when every copy
//! is, failed when any copy failed (the message names the node), and otherwise not settled.
//! A dispatch cut part-way may write only some of the copies; the runner reports what it
//! finds, and the node side (`crate::nodes`) fails a start whose bindings name a node no copy
//! reached.
//!
//! **Not settled is not forgotten.** An action the deadline cut off stays in flight: the agent
//! may still apply it (it is in etcd, in order). Its outcome is reported by a later call, among
//! [`RunReport::earlier`], and so are a previous leader's: a runner that starts in a new term
//! takes over whatever its predecessor left in flight, and its first call (an empty plan will
//! do) reports those outcomes as the agents settle them.
//!
//! **Outcomes are pruned only once consumed.** The caller records a report's outcomes in its
//! own state first, then calls [`PlanRunner::consumed`], which deletes those actions and journal
//! entries (fenced). A leader that dies in between leaves them to its successor, which reports
//! them again: an outcome may be reported twice across a failover, never lost.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use etcd_client::{Client, Txn, TxnOp, TxnOpResponse};
use tessera_reconciler::actions::Action;
use tokio::time::Instant;

use crate::dispatch::{Dispatched, Dispatcher, NodeAction, Outcome, Plan};
use crate::election::Fence;
use crate::error::{FleetError, etcd};
use crate::keys::Keys;
use crate::protocol::{self, ActionMessage, Bound, Launch, VERSION};

/// One action of a cycle's plan, and where it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedAction {
    pub action: Action,
    /// For a start: how to launch the workload.
    pub launch: Option<Launch>,
    /// The nodes it is sent to (see [`PlannedAction::new`]).
    pub nodes: Vec<String>,
}

/// Why an action cannot be routed to a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("{action} names no node: a start needs at least one binding")]
    NoBinding { action: String },
    #[error(
        "{action}: {workload} runs on no node the control plane knows; give the nodes it is bound to"
    )]
    NotRunning { action: String, workload: String },
    #[error("the start of {workload} carries no launch (command, attempt)")]
    NoLaunch { workload: String },
}

impl PlannedAction {
    /// Routes `action`: a GPU's step to the GPU's node, a start to every node its replicas are
    /// bound to, a stop or checkpoint to `running_on` (the nodes its workload is bound to
    /// now, which the action does not name).
    pub fn new(
        action: Action,
        launch: Option<Launch>,
        running_on: &[String],
    ) -> Result<PlannedAction, RouteError> {
        let nodes: Vec<String> = match &action {
            Action::Start { workload, bindings } => {
                if launch.is_none() {
                    return Err(RouteError::NoLaunch {
                        workload: workload.clone(),
                    });
                }
                let nodes: BTreeSet<&String> = bindings.iter().map(|b| &b.node).collect();
                if nodes.is_empty() {
                    return Err(RouteError::NoBinding {
                        action: action.to_string(),
                    });
                }
                nodes.into_iter().cloned().collect()
            }
            Action::Stop { workload, .. } | Action::Checkpoint { workload, .. } => {
                let nodes: BTreeSet<&String> = running_on.iter().collect();
                if nodes.is_empty() {
                    return Err(RouteError::NotRunning {
                        action: action.to_string(),
                        workload: workload.clone(),
                    });
                }
                nodes.into_iter().cloned().collect()
            }
            Action::DestroyComputeInstance { gpu, .. }
            | Action::DestroyGpuInstance { gpu, .. }
            | Action::SetMigMode { gpu, .. }
            | Action::ResetGpu { gpu }
            | Action::CreateGpuInstance { gpu, .. }
            | Action::CreateComputeInstance { gpu, .. } => vec![gpu.node.clone()],
        };
        Ok(PlannedAction {
            action,
            launch,
            nodes,
        })
    }
}

/// How one copy of an action, or the action, ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    Done,
    /// The agent's message.
    Failed(String),
    /// Not settled by the deadline: still in flight.
    Pending,
}

/// One action of the plan after the run.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionOutcome {
    pub action: Action,
    /// Each node's copy: its id and how it ended.
    pub copies: Vec<NodeCopy>,
    /// The action as a whole (see the module's docs).
    pub settled: Settled,
}

/// One node's copy of an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCopy {
    pub node: String,
    pub id: u64,
    pub settled: Settled,
}

/// An action written before this run (by an earlier run, or by a previous leader) that the
/// agent settled since.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlierOutcome {
    pub node: String,
    pub id: u64,
    /// The action as written; `None` where it could not be read back (already pruned by a
    /// deposed leader's late request, or of another protocol version).
    pub message: Option<ActionMessage>,
    /// The agent's outcome: `Err` holds its message.
    pub result: Result<(), String>,
}

/// What one run did.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// In plan order.
    pub outcomes: Vec<ActionOutcome>,
    /// Outcomes of actions written before this run, settled since.
    pub earlier: Vec<EarlierOutcome>,
    pub dispatched: Dispatched,
}

impl RunReport {
    /// The actions that failed, with the agents' messages: the cycle's `failed`.
    pub fn failed(&self) -> Vec<(Action, String)> {
        self.outcomes
            .iter()
            .filter_map(|o| match &o.settled {
                Settled::Failed(message) => Some((o.action.clone(), message.clone())),
                _ => None,
            })
            .collect()
    }

    /// The actions done.
    pub fn done(&self) -> Vec<&Action> {
        self.outcomes
            .iter()
            .filter(|o| o.settled == Settled::Done)
            .map(|o| &o.action)
            .collect()
    }

    /// The actions not settled by the deadline (still in flight).
    pub fn pending(&self) -> Vec<&Action> {
        self.outcomes
            .iter()
            .filter(|o| o.settled == Settled::Pending)
            .map(|o| &o.action)
            .collect()
    }
}

/// The leader's runner of plans, for one term.
pub struct PlanRunner {
    client: Client,
    keys: Keys,
    dispatcher: Dispatcher,
    /// The messages this runner wrote that are still in flight, by (node, id): what an
    /// earlier outcome is reported with.
    written: BTreeMap<(String, u64), ActionMessage>,
}

/// How often the journals are read while waiting: from the first to the last, doubling while
/// nothing settles.
const FIRST_POLL: Duration = Duration::from_millis(20);
const LAST_POLL: Duration = Duration::from_millis(500);

impl PlanRunner {
    /// Starts the runner of the term `fence` names; it takes over the actions in flight.
    pub async fn start(
        client: &Client,
        keys: &Keys,
        fence: Fence,
        max_txn_ops: usize,
    ) -> Result<PlanRunner, FleetError> {
        Ok(PlanRunner {
            client: client.clone(),
            keys: keys.clone(),
            dispatcher: Dispatcher::start(client, keys, fence, max_txn_ops).await?,
            written: BTreeMap::new(),
        })
    }

    /// Writes `plan` and every node's `bound` (those left out keep theirs), then waits until
    /// `deadline` at most for the agents to settle it. On an error, what was written is a
    /// prefix of each node's actions (see [`crate::dispatch`]); their outcomes come with a
    /// later call.
    pub async fn run(
        &mut self,
        plan: &[PlannedAction],
        bound: &BTreeMap<String, Bound>,
        deadline: Instant,
    ) -> Result<RunReport, FleetError> {
        let mut actions = Vec::new();
        let mut copies_of = Vec::with_capacity(plan.len());
        for planned in plan {
            let message = ActionMessage {
                version: VERSION,
                action: planned.action.clone(),
                launch: planned.launch.clone(),
            };
            let first = actions.len();
            for node in &planned.nodes {
                actions.push(NodeAction {
                    node: node.clone(),
                    message: message.clone(),
                });
            }
            copies_of.push(first..actions.len());
        }
        let earlier_ids: BTreeSet<(String, u64)> = self
            .dispatcher
            .outstanding()
            .iter()
            .flat_map(|(node, ids)| ids.iter().map(move |id| (node.clone(), *id)))
            .collect();
        let dispatched = self
            .dispatcher
            .dispatch(&Plan {
                actions: actions.clone(),
                bound: bound.clone(),
            })
            .await?;
        for (action, id) in actions.iter().zip(&dispatched.ids) {
            self.written
                .insert((action.node.clone(), *id), action.message.clone());
        }
        let mine: BTreeSet<(String, u64)> = actions
            .iter()
            .zip(&dispatched.ids)
            .map(|(a, id)| (a.node.clone(), *id))
            .collect();
        let settled = self.wait(&mine, deadline).await?;

        let mut outcomes = Vec::with_capacity(plan.len());
        for (planned, range) in plan.iter().zip(copies_of) {
            let copies: Vec<NodeCopy> = range
                .map(|i| {
                    let key = (actions[i].node.clone(), dispatched.ids[i]);
                    let settled = match settled.get(&key) {
                        Some(Ok(())) => Settled::Done,
                        Some(Err(message)) => Settled::Failed(message.clone()),
                        None => Settled::Pending,
                    };
                    NodeCopy {
                        node: key.0,
                        id: key.1,
                        settled,
                    }
                })
                .collect();
            outcomes.push(ActionOutcome {
                action: planned.action.clone(),
                settled: whole(&copies),
                copies,
            });
        }
        let mut earlier = Vec::new();
        let mut unread = Vec::new();
        for ((node, id), result) in settled {
            if !earlier_ids.contains(&(node.clone(), id)) {
                continue;
            }
            let message = self.written.get(&(node.clone(), id)).cloned();
            if message.is_none() {
                unread.push((node.clone(), id));
            }
            earlier.push(EarlierOutcome {
                node,
                id,
                message,
                result,
            });
        }
        if !unread.is_empty() {
            let bodies = self.read_actions(&unread).await?;
            for outcome in &mut earlier {
                if outcome.message.is_none() {
                    outcome.message = bodies.get(&(outcome.node.clone(), outcome.id)).cloned();
                }
            }
        }
        Ok(RunReport {
            outcomes,
            earlier,
            dispatched,
        })
    }

    /// Collects until every action of `mine` is settled or `deadline` passes; returns every
    /// outcome seen, of `mine` and of earlier actions.
    async fn wait(
        &mut self,
        mine: &BTreeSet<(String, u64)>,
        deadline: Instant,
    ) -> Result<BTreeMap<(String, u64), Result<(), String>>, FleetError> {
        let mut poll = FIRST_POLL;
        let mut seen = 0;
        loop {
            let settled: BTreeMap<(String, u64), Result<(), String>> = self
                .dispatcher
                .collect()
                .await?
                .into_iter()
                .map(|o| ((o.node, o.id), o.result))
                .collect();
            let done = mine.iter().filter(|k| settled.contains_key(*k)).count();
            let now = Instant::now();
            if done == mine.len() || now >= deadline {
                return Ok(settled);
            }
            if done > seen {
                seen = done;
                poll = FIRST_POLL;
            } else {
                poll = (poll * 2).min(LAST_POLL);
            }
            tokio::time::sleep_until((now + poll).min(deadline)).await;
        }
    }

    /// Reads back actions this runner did not write (a predecessor's), 128 to a transaction.
    async fn read_actions(
        &self,
        ids: &[(String, u64)],
    ) -> Result<BTreeMap<(String, u64), ActionMessage>, FleetError> {
        let mut bodies = BTreeMap::new();
        for chunk in ids.chunks(128) {
            let keys: Vec<String> = chunk
                .iter()
                .map(|(node, id)| self.keys.action(node, *id))
                .collect::<Result<_, _>>()?;
            let answer = self
                .client
                .clone()
                .txn(
                    Txn::new().and_then(
                        keys.iter()
                            .map(|k| TxnOp::get(k.as_str(), None))
                            .collect::<Vec<_>>(),
                    ),
                )
                .await
                .map_err(|e| etcd("read", &keys[0], e))?;
            for (id, response) in chunk.iter().zip(answer.op_responses()) {
                let TxnOpResponse::Get(get) = response else {
                    continue;
                };
                if let Some(kv) = get.kvs().first()
                    && let Ok(message) = protocol::decode::<ActionMessage>(kv.value())
                {
                    bodies.insert(id.clone(), message);
                }
            }
        }
        Ok(bodies)
    }

    /// Deletes what `report` settled (its own actions' settled copies and the earlier
    /// outcomes), once the caller has recorded it; returns how many transactions it took.
    pub async fn consumed(&mut self, report: &RunReport) -> Result<usize, FleetError> {
        let mut outcomes: Vec<Outcome> = Vec::new();
        for outcome in &report.outcomes {
            for copy in &outcome.copies {
                let result = match &copy.settled {
                    Settled::Done => Ok(()),
                    Settled::Failed(message) => Err(message.clone()),
                    Settled::Pending => continue,
                };
                outcomes.push(Outcome {
                    node: copy.node.clone(),
                    id: copy.id,
                    result,
                });
            }
        }
        for earlier in &report.earlier {
            outcomes.push(Outcome {
                node: earlier.node.clone(),
                id: earlier.id,
                result: earlier.result.clone(),
            });
        }
        if outcomes.is_empty() {
            return Ok(0);
        }
        let transactions = self.dispatcher.prune(&outcomes).await?;
        for outcome in &outcomes {
            self.written.remove(&(outcome.node.clone(), outcome.id));
        }
        Ok(transactions)
    }

    /// Empties the `bound` of a node lost to the leader, unless its agent has registered
    /// again (see [`Dispatcher::unbind_lost`]); whether it was written.
    pub async fn unbind_lost(&mut self, node: &str) -> Result<bool, FleetError> {
        self.dispatcher.unbind_lost(node).await
    }

    /// The actions in flight, per node (this runner's and a predecessor's).
    pub fn in_flight(&self) -> &BTreeMap<String, BTreeSet<u64>> {
        self.dispatcher.outstanding()
    }

    /// Every action in flight with what it says (`None` where it could not be read back),
    /// by node and id: what a new term matches its journal's open intents against, and the
    /// next call after a failed dispatch. After a failed write what is in flight is read from
    /// etcd again first: the part of the dispatch that was written is in flight too.
    pub async fn in_flight_messages(
        &mut self,
    ) -> Result<BTreeMap<(String, u64), Option<ActionMessage>>, FleetError> {
        self.dispatcher.refresh().await?;
        let mut out = BTreeMap::new();
        let mut unread = Vec::new();
        for (node, ids) in self.dispatcher.outstanding() {
            for &id in ids {
                let key = (node.clone(), id);
                match self.written.get(&key) {
                    Some(message) => {
                        out.insert(key, Some(message.clone()));
                    }
                    None => unread.push(key),
                }
            }
        }
        let bodies = self.read_actions(&unread).await?;
        for key in unread {
            let body = bodies.get(&key).cloned();
            out.insert(key, body);
        }
        Ok(out)
    }
}

/// An action's outcome from its copies': failed if any failed, done if all are, else pending.
fn whole(copies: &[NodeCopy]) -> Settled {
    let failed: Vec<String> = copies
        .iter()
        .filter_map(|c| match &c.settled {
            Settled::Failed(message) => Some(format!("{}: {message}", c.node)),
            _ => None,
        })
        .collect();
    if !failed.is_empty() {
        // One node's message as it is where only one node was involved.
        if let [only] = copies {
            return only.settled.clone();
        }
        return Settled::Failed(failed.join("; "));
    }
    if copies.iter().all(|c| c.settled == Settled::Done) {
        Settled::Done
    } else {
        Settled::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_reconciler::driver::GpuRef;
    use tessera_solver::decision::ReplicaBinding;

    fn copy(node: &str, settled: Settled) -> NodeCopy {
        NodeCopy {
            node: node.into(),
            id: 1,
            settled,
        }
    }

    #[test]
    fn an_action_is_as_settled_as_its_copies() {
        let failed = |m: &str| Settled::Failed(m.into());
        let cases = [
            (vec![copy("a", Settled::Done)], Settled::Done),
            (vec![copy("a", failed("lost"))], failed("lost")),
            (vec![copy("a", Settled::Pending)], Settled::Pending),
            (
                vec![copy("a", Settled::Done), copy("b", Settled::Done)],
                Settled::Done,
            ),
            (
                vec![copy("a", Settled::Done), copy("b", Settled::Pending)],
                Settled::Pending,
            ),
            (
                vec![copy("a", failed("x")), copy("b", Settled::Pending)],
                failed("a: x"),
            ),
            (
                vec![copy("a", failed("x")), copy("b", failed("y"))],
                failed("a: x; b: y"),
            ),
        ];
        for (copies, expected) in cases {
            assert_eq!(whole(&copies), expected, "{copies:?}");
        }
    }

    #[test]
    fn actions_go_to_the_nodes_they_concern() {
        let gpu = GpuRef {
            node: "n1".into(),
            index: 0,
        };
        let reset = PlannedAction::new(Action::ResetGpu { gpu }, None, &[]).unwrap();
        assert_eq!(reset.nodes, ["n1"]);
        let binding = |node: &str| ReplicaBinding {
            node: node.into(),
            gpus: vec![0],
            mig_profile: None,
            mig_start: None,
            share: None,
        };
        let launch = Launch {
            attempt: 0,
            command: Vec::new(),
            env: BTreeMap::new(),
            cpu_millis: 0,
            memory_bytes: 0,
        };
        let gang = Action::Start {
            workload: "t/w".into(),
            bindings: vec![binding("n2"), binding("n1"), binding("n2")],
        };
        let start = PlannedAction::new(gang.clone(), Some(launch), &[]).unwrap();
        assert_eq!(start.nodes, ["n1", "n2"]);
        assert_eq!(
            PlannedAction::new(gang, None, &[]).unwrap_err(),
            RouteError::NoLaunch {
                workload: "t/w".into()
            }
        );
        let stop = Action::Stop {
            workload: "t/w".into(),
            reason: "r".into(),
        };
        let routed = PlannedAction::new(stop.clone(), None, &["n3".into()]).unwrap();
        assert_eq!(routed.nodes, ["n3"]);
        let err = PlannedAction::new(stop, None, &[]).unwrap_err().to_string();
        assert!(err.contains("t/w runs on no node"), "{err}");
    }
}
