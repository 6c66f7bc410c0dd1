//! The leader's side of the node protocol: writing a cycle's planned actions and bindings to
//! the nodes ([`Dispatcher::dispatch`]), collecting how the agents settled them
//! ([`Dispatcher::collect`]), and deleting what is settled once its outcome was consumed
//! ([`Dispatcher::prune`]), so that a node's prefix holds only what is still in flight.
//!
//! **Ids.** Action ids come from one counter, `state/action-ids`, written in the same fenced
//! transaction as the actions that use them and guarded on its own revision. A new leader reads
//! it when it starts, so ids only grow across failover whatever the previous leader pruned; the
//! guard makes a dispatcher whose view is stale (another one of the same term wrote, or a
//! transaction's answer was lost) fail with [`FleetError::Conflict`] instead of reusing ids.
//!
//! **Transactions.** A plan's ids are reserved first, in one fenced transaction that sets the
//! counter past all of them (guarded on its revision). Then each node's writes (its `bound`
//! where it differs from what the node holds, then its actions in plan order) are cut into
//! pieces of at most `max_txn_ops` operations (etcd's `--max-txn-ops`, 128 by default): piece
//! `k` of every node goes in wave `k`, packed with other nodes' pieces into fenced
//! transactions, and the transactions of a wave are written up to eight at a time. A wave
//! starts once the one before it is written whole.
//!
//! **Why their order does not matter, and a partly written plan is safe.** Nodes apply their
//! actions independently (an agent sees only its own), so the only order that matters is
//! each node's own, and a node's pieces are written one wave after another. When a
//! transaction fails (the leader was deposed, etcd went away), no later wave is written, so
//! what each node received is a prefix of its actions, and its `bound` came with or before
//! its first action. An agent applies its actions in id order and never sees a gap it must
//! fill; the unwritten rest is not lost but re-planned: the next cycle (of this leader or the
//! next) plans from what the nodes report in `observed`, and its actions get ids past the
//! reservation, larger than anything written before. Every transaction is fenced, so a
//! deposed leader's wave in flight is refused by etcd, whatever order its requests arrive in.
//!
//! **Pruning.** Once the caller has consumed an outcome (recorded it in its own state), it
//! hands it to [`Dispatcher::prune`], which deletes the action and its journal entry, fenced.
//! Of each node's settled ids the largest keeps its journal entry (its action is deleted): it
//! is the agent's floor, so that an agent restarted after the pruning still refuses an
//! unsettled id below one it settled (see [`crate::actions`]). The previous floor is deleted
//! with it, so a node keeps at most one settled entry.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{Client, GetOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};

use crate::actions::JournalRecord;
use crate::election::{Fence, Guard, Write};
use crate::error::{FleetError, etcd};
use crate::keys::{Keys, NodeKey};
use crate::protocol::{self, ActionMessage, Bound, VERSION};

/// etcd's default `--max-txn-ops`: the most operations (and the most compares) one
/// transaction may hold.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// How many of a wave's transactions are in flight at once.
const PIPELINE: usize = 8;

/// The transactions a plan is written in, in waves: a node's writes, cut into pieces of at
/// most `max_txn_ops`, go piece `k` in wave `k`, and each wave's pieces are packed into
/// transactions of at most `max_txn_ops` writes. A node's pieces are thus written in order,
/// one wave after the other; within a wave no two pieces are of the same node.
fn waves(per_node: BTreeMap<String, Vec<Write>>, max_txn_ops: usize) -> Vec<Vec<Vec<Write>>> {
    let mut waves: Vec<Vec<Vec<Write>>> = Vec::new();
    for writes in per_node.into_values() {
        for (rank, piece) in writes.chunks(max_txn_ops).enumerate() {
            if waves.len() == rank {
                waves.push(vec![Vec::new()]);
            }
            let wave = &mut waves[rank];
            if wave
                .last()
                .is_some_and(|t| t.len() + piece.len() > max_txn_ops)
            {
                wave.push(Vec::new());
            }
            if let Some(transaction) = wave.last_mut() {
                transaction.extend_from_slice(piece);
            }
        }
    }
    waves
}

/// The counter of action ids, under `state/`.
const COUNTER: &str = "action-ids";

/// `state/action-ids`: the next action id to hand out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Counter {
    version: u32,
    next: u64,
}

/// One planned action and the node it is for.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeAction {
    pub node: String,
    pub message: ActionMessage,
}

/// What one cycle sends to the nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// In the order they are to be applied (per node; nodes apply independently).
    pub actions: Vec<NodeAction>,
    /// The workloads bound to each node after the plan; a node left out keeps what it has.
    pub bound: BTreeMap<String, Bound>,
}

/// What [`Dispatcher::dispatch`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dispatched {
    /// The ids given to the plan's actions, in the plan's order.
    pub ids: Vec<u64>,
    /// The nodes whose `bound` was written (it changed).
    pub bound_written: Vec<String>,
    /// How many fenced transactions it took.
    pub transactions: usize,
}

/// How an agent settled one action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub node: String,
    pub id: u64,
    /// `Err` holds the agent's message.
    pub result: Result<(), String>,
}

/// The leader's writer of actions and bindings, and reader of outcomes, for one term.
pub struct Dispatcher {
    client: Client,
    keys: Keys,
    fence: Fence,
    max_txn_ops: usize,
    /// The next id to hand out, and the counter's revision as last read or written; `None`
    /// when it must be read again (a write failed, so its effect is unknown).
    counter: Option<(u64, i64)>,
    /// `bound` as last read or written per node (`None`: the node has none).
    bound: BTreeMap<String, Option<Vec<u8>>>,
    /// Ids written and not yet reported settled, per node.
    outstanding: BTreeMap<String, BTreeSet<u64>>,
    /// The settled id whose journal entry each node keeps (see the module's docs).
    floors: BTreeMap<String, u64>,
    /// Journal entries below a node's floor whose action is gone (a pruning cut short): the
    /// next pruning deletes them.
    strays: BTreeMap<String, BTreeSet<u64>>,
    /// A write failed, so its effect is unknown: read the counter, the bindings and what is
    /// in flight again before the next call.
    stale: bool,
}

impl Dispatcher {
    /// Starts the dispatcher of the term `fence` names: reads the id counter and, with a
    /// keys-only read of `nodes/`, the actions still in flight (a new leader collects the
    /// outcomes of its predecessor's actions) and each node's floor.
    pub async fn start(
        client: &Client,
        keys: &Keys,
        fence: Fence,
        max_txn_ops: usize,
    ) -> Result<Dispatcher, FleetError> {
        let mut dispatcher = Dispatcher {
            client: client.clone(),
            keys: keys.clone(),
            fence,
            // The counter and one write at least.
            max_txn_ops: max_txn_ops.max(2),
            counter: None,
            bound: BTreeMap::new(),
            outstanding: BTreeMap::new(),
            floors: BTreeMap::new(),
            strays: BTreeMap::new(),
            stale: true,
        };
        dispatcher.resync_if_needed().await?;
        Ok(dispatcher)
    }

    async fn resync_if_needed(&mut self) -> Result<(), FleetError> {
        if self.stale {
            self.bound.clear();
            self.read_counter().await?;
            self.read_in_flight().await?;
            self.stale = false;
        }
        Ok(())
    }

    /// Reads the counter, the bindings and what is in flight again where a write failed since
    /// they were last read (its effect unknown: a dispatch cut part-way wrote a prefix of each
    /// node's actions, which [`Dispatcher::outstanding`] does not hold until then).
    pub async fn refresh(&mut self) -> Result<(), FleetError> {
        self.resync_if_needed().await
    }

    /// The ids written and not yet reported settled, per node.
    pub fn outstanding(&self) -> &BTreeMap<String, BTreeSet<u64>> {
        &self.outstanding
    }

    async fn read_counter(&mut self) -> Result<(u64, i64), FleetError> {
        let key = self.keys.state(COUNTER);
        let answer = self
            .client
            .clone()
            .get(key.as_str(), None)
            .await
            .map_err(|e| etcd("get", &key, e))?;
        let counter = match answer.kvs().first() {
            Some(kv) => {
                let counter: Counter =
                    protocol::decode(kv.value()).map_err(|source| FleetError::Protocol {
                        key: key.clone(),
                        source,
                    })?;
                (counter.next, kv.mod_revision())
            }
            // Ids start at 1; revision 0 stands for "absent" in the guard.
            None => (1, 0),
        };
        self.counter = Some(counter);
        Ok(counter)
    }

    async fn read_in_flight(&mut self) -> Result<(), FleetError> {
        let prefix = self.keys.nodes_prefix();
        let answer = self
            .client
            .clone()
            .get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(|e| etcd("get", &prefix, e))?;
        let mut actions: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        let mut journals: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        for kv in answer.kvs() {
            match self.keys.parse_node_key(kv.key()) {
                Some(NodeKey::Action { node, id }) => {
                    actions.entry(node).or_default().insert(id);
                }
                Some(NodeKey::Journal { node, id }) => {
                    journals.entry(node).or_default().insert(id);
                }
                _ => {}
            }
        }
        // A journal entry without its action is a floor a leader kept, or the remains of a
        // pruning cut short: the largest is the floor, the others are deleted later.
        self.floors.clear();
        self.strays.clear();
        for (node, ids) in journals {
            let with_action = actions.get(&node);
            let mut without: Vec<u64> = ids
                .into_iter()
                .filter(|id| with_action.is_none_or(|a| !a.contains(id)))
                .collect();
            if let Some(floor) = without.pop() {
                self.floors.insert(node.clone(), floor);
            }
            if !without.is_empty() {
                self.strays.insert(node, without.into_iter().collect());
            }
        }
        self.outstanding = actions;
        Ok(())
    }

    /// Writes `plan`: each node's changed `bound`, then the actions with fresh ids, in fenced
    /// transactions of at most `max_txn_ops` operations. On an error, what each node received
    /// is a prefix of its actions (see the module's docs) and the next call reads the counter
    /// again.
    pub async fn dispatch(&mut self, plan: &Plan) -> Result<Dispatched, FleetError> {
        self.resync_if_needed().await?;
        let (start, _) = self.counter.expect("the counter was read");
        let mut next = start;
        // Per node: its `bound` where it changed, then its actions in plan order.
        let mut per_node: BTreeMap<String, Vec<Write>> = BTreeMap::new();
        let mut bound_written = Vec::new();
        self.read_unknown_bound(plan.bound.keys()).await?;
        let mut bound_after = Vec::new();
        for (node, bound) in &plan.bound {
            let bytes = protocol::encode(bound);
            if self.bound.get(node).cloned().flatten().as_deref() == Some(bytes.as_slice()) {
                continue;
            }
            let write = Write::Put {
                key: self.keys.bound(node)?,
                value: bytes.clone(),
            };
            per_node.entry(node.clone()).or_default().push(write);
            bound_written.push(node.clone());
            bound_after.push((node.clone(), bytes));
        }
        let mut ids = Vec::with_capacity(plan.actions.len());
        for action in &plan.actions {
            let write = Write::Put {
                key: self.keys.action(&action.node, next)?,
                value: protocol::encode(&action.message),
            };
            per_node.entry(action.node.clone()).or_default().push(write);
            ids.push(next);
            next += 1;
        }

        let mut transactions = 0;
        if !ids.is_empty() {
            // The plan's ids reserved at once: the counter past all of them, guarded on its
            // revision, so that whatever part of the plan is written, no id is handed out twice.
            self.write_chunk(&[], next).await?;
            transactions += 1;
        }
        for wave in waves(per_node, self.max_txn_ops) {
            transactions += self.write_wave(wave).await?;
        }
        for (node, bytes) in bound_after {
            self.bound.insert(node, Some(bytes));
        }
        for (action, id) in plan.actions.iter().zip(&ids) {
            self.outstanding
                .entry(action.node.clone())
                .or_default()
                .insert(*id);
        }
        Ok(Dispatched {
            ids,
            bound_written,
            transactions,
        })
    }

    /// Empties the `bound` of `node`, which the leader has seen away past its grace, in one
    /// fenced transaction guarded on the node's registration being absent. Returns whether
    /// it was written: `false` when the agent has registered again meanwhile (the node is
    /// back, not lost). Once written, an agent that registers again reads this `bound` (it
    /// reads `bound` after its registration, and etcd orders the two), so it stops what the
    /// leader is about to place elsewhere; that is why the leader requeues a lost node's
    /// workloads only after this write.
    pub async fn unbind_lost(&mut self, node: &str) -> Result<bool, FleetError> {
        let bytes = protocol::encode(&Bound {
            version: VERSION,
            workloads: BTreeMap::new(),
        });
        let guard = Guard::Absent {
            key: self.keys.registration(node)?,
        };
        let write = Write::Put {
            key: self.keys.bound(node)?,
            value: bytes.clone(),
        };
        match self.fence.write(&self.client, &[guard], &[write]).await {
            Ok(_) => {
                self.bound.insert(node.to_string(), Some(bytes));
                Ok(true)
            }
            Err(FleetError::Conflict { .. }) => Ok(false),
            Err(e) => {
                // Whether it was applied is unknown: read the node's `bound` again.
                self.bound.remove(node);
                Err(e)
            }
        }
    }

    /// Writes one wave's transactions, up to [`PIPELINE`] in flight at once (they concern
    /// different nodes, or different nodes' pieces of the same rank, so their order does not
    /// matter); returns how many. After a failure the rest of the plan is not written.
    async fn write_wave(&mut self, wave: Vec<Vec<Write>>) -> Result<usize, FleetError> {
        let count = wave.len();
        let mut pending = wave.into_iter();
        let mut running = tokio::task::JoinSet::new();
        let mut failed = None;
        loop {
            while failed.is_none() && running.len() < PIPELINE {
                let Some(chunk) = pending.next() else { break };
                let (fence, client) = (self.fence.clone(), self.client.clone());
                running.spawn(async move { fence.write(&client, &[], &chunk).await });
            }
            let Some(joined) = running.join_next().await else {
                break;
            };
            let result = joined.unwrap_or_else(|e| {
                Err(FleetError::Etcd {
                    op: "fenced write",
                    key: self.keys.nodes_prefix(),
                    source: etcd_client::Error::IoError(std::io::Error::other(e.to_string())),
                })
            });
            if let Err(e) = result {
                failed.get_or_insert(e);
            }
        }
        match failed {
            None => Ok(count),
            Some(e) => {
                // Whether each was applied is unknown (a lost answer): read everything again.
                self.stale = true;
                Err(e)
            }
        }
    }

    /// One fenced transaction: `chunk` and the counter set to `next`.
    async fn write_chunk(&mut self, chunk: &[Write], next: u64) -> Result<(), FleetError> {
        let key = self.keys.state(COUNTER);
        let (_, revision) = self.counter.expect("read before any write");
        let guard = if revision == 0 {
            Guard::Absent { key: key.clone() }
        } else {
            Guard::Unchanged {
                key: key.clone(),
                mod_revision: revision,
            }
        };
        let mut writes = chunk.to_vec();
        writes.push(Write::Put {
            key,
            value: protocol::encode(&Counter {
                version: VERSION,
                next,
            }),
        });
        match self.fence.write(&self.client, &[guard], &writes).await {
            Ok(revision) => {
                self.counter = Some((next, revision));
                Ok(())
            }
            Err(e) => {
                // Whether it was applied is unknown (a lost answer): read everything again.
                self.stale = true;
                Err(e)
            }
        }
    }

    /// Reads `bound` of the nodes this dispatcher has not read or written yet.
    async fn read_unknown_bound<'a>(
        &mut self,
        nodes: impl Iterator<Item = &'a String>,
    ) -> Result<(), FleetError> {
        let unknown: Vec<String> = nodes
            .filter(|n| !self.bound.contains_key(*n))
            .cloned()
            .collect();
        for chunk in unknown.chunks(self.max_txn_ops) {
            let keys: Vec<String> = chunk
                .iter()
                .map(|n| self.keys.bound(n))
                .collect::<Result<_, _>>()?;
            let reads = self
                .read(keys.iter().map(|k| TxnOp::get(k.as_str(), None)).collect())
                .await?;
            for (node, read) in chunk.iter().zip(reads) {
                let value = read.into_iter().next().map(|(_, v)| v);
                self.bound.insert(node.clone(), value);
            }
        }
        Ok(())
    }

    /// The outcomes of the actions in flight that the agents settled since the last call:
    /// one read of each node's journal (range reads, `max_txn_ops` to a transaction). An
    /// outcome is reported again until it is pruned.
    pub async fn collect(&mut self) -> Result<Vec<Outcome>, FleetError> {
        self.resync_if_needed().await?;
        let nodes: Vec<String> = self
            .outstanding
            .iter()
            .filter(|(_, ids)| !ids.is_empty())
            .map(|(n, _)| n.clone())
            .collect();
        let mut outcomes = Vec::new();
        for chunk in nodes.chunks(self.max_txn_ops) {
            let prefixes: Vec<String> = chunk
                .iter()
                .map(|n| self.keys.journal_prefix(n))
                .collect::<Result<_, _>>()?;
            let reads = self
                .read(
                    prefixes
                        .iter()
                        .map(|p| TxnOp::get(p.as_str(), Some(GetOptions::new().with_prefix())))
                        .collect(),
                )
                .await?;
            for (node, read) in chunk.iter().zip(reads) {
                let outstanding = &self.outstanding[node];
                for (key, value) in read {
                    let Some(NodeKey::Journal { id, .. }) = self.keys.parse_node_key(&key) else {
                        continue;
                    };
                    if !outstanding.contains(&id) {
                        continue;
                    }
                    let record: JournalRecord =
                        serde_json::from_slice(&value).map_err(|source| FleetError::Decode {
                            key: String::from_utf8_lossy(&key).into_owned(),
                            source,
                        })?;
                    let result = match record {
                        JournalRecord::Intent => continue,
                        JournalRecord::Done => Ok(()),
                        JournalRecord::Failed { error } => Err(error),
                    };
                    outcomes.push(Outcome {
                        node: node.clone(),
                        id,
                        result,
                    });
                }
            }
        }
        Ok(outcomes)
    }

    /// Deletes the actions of `consumed` outcomes and their journal entries, fenced, keeping
    /// each node's largest settled id's journal entry as its floor (and deleting the floor it
    /// replaces). Returns how many transactions it took.
    ///
    /// Every action is deleted before any journal entry: a pruning cut short leaves journal
    /// entries without actions (deleted by a later pruning), never an action without the
    /// journal entry that says it is settled, which an agent would take for a new action.
    pub async fn prune(&mut self, consumed: &[Outcome]) -> Result<usize, FleetError> {
        self.resync_if_needed().await?;
        let mut settled: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
        for outcome in consumed {
            settled
                .entry(outcome.node.as_str())
                .or_default()
                .insert(outcome.id);
        }
        let mut actions = Vec::new();
        let mut journals = Vec::new();
        let mut floors = Vec::new();
        for (node, ids) in &settled {
            let newest = *ids.last().expect("a node here has an id");
            let old = self.floors.get(*node).copied();
            let floor = old.map_or(newest, |old| old.max(newest));
            for id in ids {
                actions.push(Write::Delete {
                    key: self.keys.action(node, *id)?,
                });
            }
            let strays = self.strays.get(*node).into_iter().flatten();
            for id in ids.iter().chain(old.iter()).chain(strays) {
                if *id != floor {
                    journals.push(Write::Delete {
                        key: self.keys.journal(node, *id)?,
                    });
                }
            }
            floors.push((node.to_string(), floor, ids.clone()));
        }
        actions.extend(journals);
        let mut transactions = 0;
        for chunk in actions.chunks(self.max_txn_ops) {
            if let Err(e) = self.fence.write(&self.client, &[], chunk).await {
                self.stale = true;
                return Err(e);
            }
            transactions += 1;
        }
        for (node, floor, ids) in floors {
            self.floors.insert(node.clone(), floor);
            self.strays.remove(&node);
            if let Some(outstanding) = self.outstanding.get_mut(&node) {
                outstanding.retain(|id| !ids.contains(id));
                if outstanding.is_empty() {
                    self.outstanding.remove(&node);
                }
            }
        }
        Ok(transactions)
    }

    /// One unfenced read transaction: the keys and values each of `ops` (gets) found.
    async fn read(&self, ops: Vec<TxnOp>) -> Result<Vec<Vec<(Vec<u8>, Vec<u8>)>>, FleetError> {
        let nodes = self.keys.nodes_prefix();
        let answer = self
            .client
            .clone()
            .txn(Txn::new().and_then(ops))
            .await
            .map_err(|e| etcd("read", &nodes, e))?;
        Ok(answer
            .op_responses()
            .into_iter()
            .map(|r| match r {
                TxnOpResponse::Get(get) => get
                    .kvs()
                    .iter()
                    .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                    .collect(),
                _ => Vec::new(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every write is in exactly one transaction of at most `max` writes; a node's writes
        /// come in their order, wave after wave, and no wave holds two pieces of one node.
        #[test]
        fn waves_keep_each_nodes_order_within_the_limit(
            counts in proptest::collection::vec(0usize..300, 1..12),
            max in 2usize..130,
        ) {
            let per_node: BTreeMap<String, Vec<Write>> = counts
                .iter()
                .enumerate()
                .map(|(n, count)| {
                    let writes = (0..*count)
                        .map(|i| Write::Delete { key: format!("n{n:02}/{i:05}") })
                        .collect();
                    (format!("n{n:02}"), writes)
                })
                .collect();
            let waves = waves(per_node, max);
            let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for wave in &waves {
                let mut nodes_in_wave = BTreeSet::new();
                for transaction in wave {
                    prop_assert!(!transaction.is_empty() && transaction.len() <= max);
                    let mut nodes_in_txn = BTreeSet::new();
                    for write in transaction {
                        let Write::Delete { key } = write else { unreachable!() };
                        let node = key[..3].to_string();
                        nodes_in_txn.insert(node.clone());
                        seen.entry(node).or_default().push(key.clone());
                    }
                    for node in nodes_in_txn {
                        prop_assert!(nodes_in_wave.insert(node), "a node twice in one wave");
                    }
                }
            }
            for (n, count) in counts.iter().enumerate() {
                let expected: Vec<String> = (0..*count).map(|i| format!("n{n:02}/{i:05}")).collect();
                prop_assert_eq!(seen.remove(&format!("n{n:02}")).unwrap_or_default(), expected);
            }
        }
    }
}
