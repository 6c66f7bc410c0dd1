//! The actions the control plane addresses to a node, and the agent's journal of applying them.
//!
//! The leader writes each action under `nodes/<node>/actions/<id>` (through its fence), with
//! ids that only grow. The agent takes them in id order ([`ActionFeed::next`]) and, around
//! applying each, records intent and then the outcome under `nodes/<node>/journal/<id>`, its
//! own keys: the single-process mode's write-ahead journal, kept in etcd. An id the journal
//! records as done or failed is never handed out again, however often the agent restarts or
//! the watch replays (idempotent ids). An id whose journal stops at intent was being applied
//! when the agent died; it is handed out marked [`PendingAction::interrupted`], for the
//! caller to settle from what its driver observes, as the reconciler's recovery settles open
//! intents.
//!
//! The leader deletes settled actions and their journal entries once it has consumed their
//! outcomes ([`crate::dispatch`]); a deleted action is simply no longer there to take. It keeps
//! the journal entry of each node's largest settled id, and a feed starts with that id as its
//! floor: an unsettled action at or below the largest id settled, within one feed or across
//! restarts, is not applied (applying it late could undo what later actions did) but settled
//! as failed with [`FleetError::ActionOutOfOrder`]'s message, so the leader learns of it.

use std::collections::BTreeMap;

use etcd_client::{Client, EventType, GetOptions, Txn, TxnOp, WatchOptions, WatchStream};
use serde::{Deserialize, Serialize};

use crate::error::{FleetError, etcd};
use crate::keys::{Keys, NodeKey};

/// One entry of a node's journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", deny_unknown_fields)]
pub enum JournalRecord {
    /// About to be applied.
    Intent,
    Done,
    Failed {
        error: String,
    },
}

impl JournalRecord {
    /// Done or failed: never to be applied again.
    pub fn is_settled(&self) -> bool {
        !matches!(self, JournalRecord::Intent)
    }
}

/// An action to apply, as the control plane wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingAction {
    pub id: u64,
    /// The action's document, as the control plane wrote it (the agent decodes it).
    pub body: Vec<u8>,
    /// The journal holds an intent for it: an earlier run of the agent began applying it and
    /// did not record how that ended.
    pub interrupted: bool,
}

/// A node's actions in id order, each handed out until its journal settles it.
pub struct ActionFeed {
    client: Client,
    keys: Keys,
    node: String,
    stream: WatchStream,
    /// Actions written and not yet handed out.
    queue: BTreeMap<u64, Vec<u8>>,
    journal: BTreeMap<u64, JournalRecord>,
    /// The highest id handed out: a later action must have a larger one.
    last: Option<u64>,
}

impl ActionFeed {
    /// Reads the node's actions and journal in one consistent read, and watches its actions
    /// from that read's revision on.
    pub async fn start(client: &Client, keys: &Keys, node: &str) -> Result<ActionFeed, FleetError> {
        let prefix = keys.node_prefix(node)?;
        let actions = keys.actions_prefix(node)?;
        let mut client = client.clone();
        let answer = client
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| etcd("get", &prefix, e))?;
        let revision = answer.header().map_or(0, |h| h.revision());
        let mut queue = BTreeMap::new();
        let mut journal = BTreeMap::new();
        for kv in answer.kvs() {
            match keys.parse_node_key(kv.key()) {
                Some(NodeKey::Action { id, .. }) => {
                    queue.insert(id, kv.value().to_vec());
                }
                Some(NodeKey::Journal { id, .. }) => {
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    let record: JournalRecord = serde_json::from_slice(kv.value())
                        .map_err(|source| FleetError::Decode { key, source })?;
                    journal.insert(id, record);
                }
                _ => {}
            }
        }
        let stream = client
            .watch(
                actions.as_str(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision + 1),
                ),
            )
            .await
            .map_err(|e| etcd("watch", &actions, e))?;
        // The largest settled id is the floor: the leader prunes settled actions and their
        // journal entries but keeps the largest one's (see `crate::dispatch`), so a restarted
        // agent still knows which ids are behind it.
        let last = journal
            .iter()
            .rev()
            .find(|(_, record)| record.is_settled())
            .map(|(id, _)| *id);
        Ok(ActionFeed {
            client,
            keys: keys.clone(),
            node: node.to_string(),
            stream,
            queue,
            journal,
            last,
        })
    }

    /// Whether an action has arrived that [`ActionFeed::next`] has not handed out yet (some
    /// may turn out settled already): a caller can hold back reporting until the batch is
    /// through.
    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// What the journal records for `id`, as this feed knows it.
    pub fn journal(&self, id: u64) -> Option<&JournalRecord> {
        self.journal.get(&id)
    }

    /// The next action to apply, in id order, waiting for one when none is pending; `None`
    /// when etcd ended the watch (start a new feed: it resumes from the journal).
    pub async fn next(&mut self) -> Result<Option<PendingAction>, FleetError> {
        loop {
            if let Some(pending) = self.pop_queued().await? {
                return Ok(Some(pending));
            }
            if !self.receive().await? {
                return Ok(None);
            }
        }
    }

    /// The next action, and after it those already arrived, up to `max` in all (at least
    /// one): what one journal transaction of intents, and one of outcomes, covers. `None`
    /// when etcd ended the watch.
    pub async fn next_batch(
        &mut self,
        max: usize,
    ) -> Result<Option<Vec<PendingAction>>, FleetError> {
        let Some(first) = self.next().await? else {
            return Ok(None);
        };
        let mut batch = vec![first];
        while batch.len() < max.max(1) {
            match self.pop_queued().await? {
                Some(pending) => batch.push(pending),
                None => break,
            }
        }
        Ok(Some(batch))
    }

    /// The next queued action to hand out, without waiting.
    async fn pop_queued(&mut self) -> Result<Option<PendingAction>, FleetError> {
        {
            while let Some((id, body)) = self.queue.pop_first() {
                let record = self.journal.get(&id);
                if record.is_some_and(JournalRecord::is_settled) {
                    continue;
                }
                if let Some(last) = self.last
                    && id <= last
                {
                    // Applying it now could undo what later actions did. It is settled as
                    // failed, so the leader learns of it and this feed goes on.
                    let refused = FleetError::ActionOutOfOrder {
                        node: self.node.clone(),
                        id,
                        after: last,
                    };
                    tracing::warn!("{refused}");
                    self.finish(id, Err(refused.to_string())).await?;
                    continue;
                }
                self.last = Some(id);
                return Ok(Some(PendingAction {
                    id,
                    body,
                    interrupted: record.is_some(),
                }));
            }
        }
        Ok(None)
    }

    /// Takes the watch's next answer into the queue; `false` when etcd ended the watch.
    async fn receive(&mut self) -> Result<bool, FleetError> {
        {
            let actions = self.keys.actions_prefix(&self.node)?;
            let Some(answer) = crate::watch::next_answer(&mut self.stream, &actions).await? else {
                return Ok(false);
            };
            for event in answer.events() {
                let Some(kv) = event.kv() else { continue };
                let Some(NodeKey::Action { id, .. }) = self.keys.parse_node_key(kv.key()) else {
                    continue;
                };
                match event.event_type() {
                    EventType::Put => {
                        self.queue.insert(id, kv.value().to_vec());
                    }
                    // Withdrawn before it was handed out (or cleaned up after it was settled).
                    EventType::Delete => {
                        self.queue.remove(&id);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Records that `id` is about to be applied. Call before touching anything.
    pub async fn begin(&mut self, id: u64) -> Result<(), FleetError> {
        self.record(vec![(id, JournalRecord::Intent)]).await
    }

    /// Records, in one transaction, that each of `ids` is about to be applied. Call before
    /// touching anything: an agent that dies part-way through the batch leaves the rest at
    /// intent, settled afterwards from what the node shows (failed as interrupted where it
    /// shows no effect), never applied blind.
    pub async fn begin_all(&mut self, ids: &[u64]) -> Result<(), FleetError> {
        self.record(ids.iter().map(|id| (*id, JournalRecord::Intent)).collect())
            .await
    }

    /// Records how applying `id` ended; the id is settled for good.
    pub async fn finish(&mut self, id: u64, outcome: Result<(), String>) -> Result<(), FleetError> {
        self.finish_all(vec![(id, outcome)]).await
    }

    /// Records how applying each id ended, in one transaction; they are settled for good.
    pub async fn finish_all(
        &mut self,
        outcomes: Vec<(u64, Result<(), String>)>,
    ) -> Result<(), FleetError> {
        let records = outcomes
            .into_iter()
            .map(|(id, outcome)| {
                let record = match outcome {
                    Ok(()) => JournalRecord::Done,
                    Err(error) => JournalRecord::Failed { error },
                };
                (id, record)
            })
            .collect();
        self.record(records).await
    }

    /// Writes `records` in one transaction (a batch is at most etcd's `--max-txn-ops`: see
    /// [`ActionFeed::next_batch`]).
    async fn record(&mut self, records: Vec<(u64, JournalRecord)>) -> Result<(), FleetError> {
        let Some((first, _)) = records.first() else {
            return Ok(());
        };
        let first = self.keys.journal(&self.node, *first)?;
        let mut ops = Vec::with_capacity(records.len());
        for (id, record) in &records {
            let key = self.keys.journal(&self.node, *id)?;
            let value = serde_json::to_vec(record).expect("a journal record serialises");
            ops.push(TxnOp::put(key.as_str(), value, None));
        }
        self.client
            .txn(Txn::new().and_then(ops))
            .await
            .map_err(|e| etcd("put", &first, e))?;
        self.journal.extend(records);
        Ok(())
    }
}
