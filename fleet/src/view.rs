//! The control plane's view of the fleet: every node's registration, last observation and
//! utilisation, and its liveness, kept up to date by watches and handed out as an immutable
//! [`FleetSnapshot`] that the cycle reads as the single-process service reads its driver's
//! [`Observation`].
//!
//! **What is watched.** One gRPC watch stream carries everything: the `registrations/` prefix
//! (liveness, as [`crate::registration::NodeWatch`] reads it), and per known node the key range
//! from `nodes/<node>/observed` to `nodes/<node>/utilization` ([`Keys::view_range`]), which holds
//! those two keys and none of the node's actions, journal or `bound`. A watch of `nodes/` would
//! deliver the whole protocol's traffic (every action and journal entry) to filter away; a
//! range per node costs the view only what it keeps. A node that registers later is read and
//! watched from the revision of that read, so no change falls between the two.
//!
//! **Cheap snapshots.** The nodes are an `Arc` of a map of `Arc`ed nodes: a snapshot is a
//! pointer copy, and a change copies the map's spine (a pointer per node) only while an older
//! snapshot is still held, never a node's observation.
//!
//! **When etcd is away** the view keeps the last snapshot, says since when and why it may be
//! stale ([`FleetSnapshot::trouble`]), and reads everything again once etcd answers: liveness
//! carries over (a node that stayed registered stays Ready; one whose registration is gone now
//! is NotReady from the moment the view learns it), so an outage of etcd never makes a node
//! Lost by itself.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, Txn, TxnOp, TxnOpResponse};
use etcd_client::{WatchOptions, WatchStream};
use jiff::Timestamp;
use tessera_reconciler::driver::Observation;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{FleetError, etcd};
use crate::keys::{Keys, NodeKey};
use crate::liveness::{Liveness, LivenessTracker};
use crate::protocol::{self, Observed};
use crate::registration::{NodeEvent, Registration};
use crate::utilization::{self, Utilization};

/// One node as the control plane sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub name: String,
    /// `None` while the node is not registered (its agent's lease is gone, or it never
    /// registered since the view started).
    pub registration: Option<Registration>,
    /// What the agent last wrote to `observed` (kept while the node is away: its workloads
    /// may still run).
    pub observed: Option<Observed>,
    /// What the agent last wrote to `utilization`.
    pub utilization: Option<Utilization>,
    pub liveness: Liveness,
    /// When the liveness last changed, on the wall clock (for status); `None` for a node
    /// Ready since the view started.
    pub since: Option<Timestamp>,
    /// A key of the node that could not be read (written by an agent of another protocol
    /// version): the node is unavailable until it is written again.
    pub unreadable: Option<String>,
}

/// Why a node cannot take new work, as [`FleetSnapshot::unavailable`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    pub node: String,
    pub state: Availability,
    /// Since when, where known (the moment the registration went, for NotReady and Lost).
    pub since: Option<Timestamp>,
    /// A sentence for the fleet's status.
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// Away for less than the grace: its workloads are kept, nothing new is placed there.
    NotReady,
    /// Away for the grace or longer: its workloads are to be requeued.
    Lost,
    /// Registered, but its observation is missing or unreadable.
    NotObserved,
}

/// etcd could not be read: the snapshot is the last one read before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trouble {
    pub since: Timestamp,
    pub message: String,
}

/// The fleet at one moment: cheap to take, never changes.
#[derive(Debug, Clone)]
pub struct FleetSnapshot {
    nodes: Arc<BTreeMap<String, Arc<NodeView>>>,
    /// The etcd revision the snapshot reflects.
    pub revision: i64,
    pub trouble: Option<Trouble>,
    /// The grace after which a NotReady node is Lost.
    pub grace: Duration,
}

impl FleetSnapshot {
    pub fn node(&self, name: &str) -> Option<&NodeView> {
        self.nodes.get(name).map(Arc::as_ref)
    }

    /// Every node, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeView> {
        self.nodes.values().map(Arc::as_ref)
    }

    /// The fleet as a driver would observe it, for the cycle: every node with an
    /// observation, by name, with its GPUs' utilisation put back. A NotReady node is
    /// `Degraded` (its workloads are kept, the solver places nothing new there) and a Lost one
    /// `Lost`; both keep their last observed GPUs, so the fleet's capacity does not seem to
    /// shrink and grow with every pause of an agent.
    pub fn observation(&self) -> Observation {
        let mut observation = Observation {
            nodes: Vec::with_capacity(self.nodes.len()),
            details: Vec::new(),
        };
        for view in self.nodes.values() {
            let Some(observed) = &view.observed else {
                continue;
            };
            let mut node = observed.node.clone();
            match view.liveness {
                Liveness::Ready => {}
                Liveness::NotReady { .. } => {
                    node.health = tessera_compiler::model::Health::Degraded;
                }
                Liveness::Lost { .. } => node.health = tessera_compiler::model::Health::Lost,
            }
            observation.nodes.push(node);
            let first = observation.details.len();
            observation.details.extend(observed.details.iter().cloned());
            if let Some(figures) = &view.utilization {
                utilization::merge(&mut observation.details[first..], figures);
            }
        }
        observation
    }

    /// The nodes Lost now, by name: those whose workloads the service requeues.
    pub fn lost(&self) -> Vec<&str> {
        self.nodes
            .values()
            .filter(|v| matches!(v.liveness, Liveness::Lost { .. }))
            .map(|v| v.name.as_str())
            .collect()
    }

    /// Every node that cannot take new work now, with since when and why: what the fleet's
    /// status shows while it is Degraded.
    pub fn unavailable(&self) -> Vec<Unavailable> {
        let grace = self.grace;
        self.nodes
            .values()
            .filter_map(|v| {
                let since = v.since;
                let at = since.map_or_else(String::new, |t| {
                    format!(" since {}", tessera_compiler::units::format_rfc3339(t))
                });
                let (state, reason) = match v.liveness {
                    Liveness::NotReady { .. } => (
                        Availability::NotReady,
                        format!(
                            "its agent's registration is gone{at} (lease expired or revoked: \
                             the agent stopped, hangs or cannot reach etcd); its workloads are \
                             kept until it has been away for {grace:?}"
                        ),
                    ),
                    Liveness::Lost { .. } => (
                        Availability::Lost,
                        format!(
                            "its agent has been away{at}, longer than the grace of {grace:?}: \
                             its workloads are to be placed elsewhere"
                        ),
                    ),
                    Liveness::Ready => match (&v.unreadable, &v.observed) {
                        (Some(why), _) => (Availability::NotObserved, why.clone()),
                        (None, None) => (
                            Availability::NotObserved,
                            "registered, but its agent has not written an observation yet"
                                .to_string(),
                        ),
                        (None, Some(_)) => return None,
                    },
                };
                Some(Unavailable {
                    node: v.name.clone(),
                    state,
                    since,
                    reason,
                })
            })
            .collect()
    }
}

/// The view: a background task that follows etcd, and the latest snapshot.
pub struct FleetView {
    latest: Arc<Mutex<Arc<FleetSnapshot>>>,
    updates: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl FleetView {
    /// Reads every registration, and the observation and utilisation of every registered
    /// node and of every node in `expected` (those the control plane bound workloads to; one
    /// not registered is NotReady from now), then follows their changes in the background.
    /// `grace`: how long a node may be away before it is Lost.
    pub async fn start(
        client: &Client,
        keys: &Keys,
        grace: Duration,
        expected: impl IntoIterator<Item = String>,
    ) -> Result<FleetView, FleetError> {
        let expected: BTreeSet<String> = expected.into_iter().collect();
        for node in &expected {
            crate::keys::check_name("node", node)?;
        }
        let mut follower = Follower {
            client: client.clone(),
            keys: keys.clone(),
            grace,
            nodes: Arc::new(BTreeMap::new()),
            tracker: None,
            expected,
            revision: 0,
            trouble: None,
        };
        let stream = follower.sync().await?;
        let latest = Arc::new(Mutex::new(Arc::new(follower.snapshot())));
        let (tx, updates) = watch::channel(0);
        let task = tokio::spawn(follower.run(stream, latest.clone(), tx));
        Ok(FleetView {
            latest,
            updates,
            task,
        })
    }

    /// The fleet now: a pointer copy.
    pub fn snapshot(&self) -> Arc<FleetSnapshot> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Resolves with the first snapshot (this one or a later one) for which `f` holds.
    pub async fn wait_for(
        &mut self,
        mut f: impl FnMut(&FleetSnapshot) -> bool,
    ) -> Arc<FleetSnapshot> {
        loop {
            let snapshot = self.snapshot();
            if f(&snapshot) {
                return snapshot;
            }
            if self.updates.changed().await.is_err() {
                // The task ended (it only does when dropped): nothing will change any more.
                return self.snapshot();
            }
        }
    }
}

impl Drop for FleetView {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The task's state: the nodes and their liveness.
struct Follower {
    client: Client,
    keys: Keys,
    grace: Duration,
    nodes: Arc<BTreeMap<String, Arc<NodeView>>>,
    /// `None` until the first read of the registrations.
    tracker: Option<LivenessTracker>,
    expected: BTreeSet<String>,
    revision: i64,
    trouble: Option<Trouble>,
}

/// Waits that double from 100 ms to 5 s while etcd does not answer.
fn backoff(failures: u32) -> Duration {
    (Duration::from_millis(100) * 2u32.saturating_pow(failures.min(6))).min(Duration::from_secs(5))
}

impl Follower {
    fn snapshot(&self) -> FleetSnapshot {
        FleetSnapshot {
            nodes: self.nodes.clone(),
            revision: self.revision,
            trouble: self.trouble.clone(),
            grace: self.grace,
        }
    }

    async fn run(
        mut self,
        mut stream: WatchStream,
        latest: Arc<Mutex<Arc<FleetSnapshot>>>,
        tx: watch::Sender<u64>,
    ) {
        let mut generation = 0u64;
        let publish = |this: &Follower, generation: &mut u64| {
            *latest.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(this.snapshot());
            *generation += 1;
            let _ = tx.send(*generation);
        };
        loop {
            let ended = self
                .follow(&mut stream, &mut |this| publish(this, &mut generation))
                .await;
            let message = match ended {
                Ok(()) => "etcd ended the watch".to_string(),
                Err(e) => e.to_string(),
            };
            if self.trouble.is_none() {
                self.trouble = Some(Trouble {
                    since: tessera_compiler::units::now(),
                    message: message.clone(),
                });
                publish(&self, &mut generation);
            }
            tracing::warn!("the fleet view reads etcd again: {message}");
            let mut failures = 0;
            stream = loop {
                tokio::time::sleep(backoff(failures)).await;
                match self.sync().await {
                    Ok(stream) => break stream,
                    Err(e) => {
                        failures += 1;
                        if let Some(trouble) = &mut self.trouble {
                            trouble.message = e.to_string();
                        }
                    }
                }
            };
            self.trouble = None;
            publish(&self, &mut generation);
        }
    }

    /// Applies the watch's answers and the liveness deadlines until the watch ends.
    async fn follow(
        &mut self,
        stream: &mut WatchStream,
        publish: &mut impl FnMut(&Follower),
    ) -> Result<(), FleetError> {
        loop {
            let deadline = self
                .tracker
                .as_ref()
                .and_then(LivenessTracker::next_deadline);
            let answer = tokio::select! {
                answer = crate::watch::next_answer(stream, self.keys.root()) => answer?,
                () = sleep_until(deadline) => {
                    self.tick(Instant::now());
                    publish(self);
                    continue;
                }
            };
            let Some(answer) = answer else {
                return Ok(());
            };
            let mut new_nodes = Vec::new();
            for event in answer.events() {
                let Some(kv) = event.kv() else { continue };
                self.revision = self.revision.max(kv.mod_revision());
                let value = (event.event_type() == EventType::Put).then(|| kv.value());
                if let Some(node) = self.apply(kv.key(), value) {
                    new_nodes.push(node);
                }
            }
            if let Some(header) = answer.header() {
                self.revision = self.revision.max(header.revision());
            }
            if !new_nodes.is_empty() {
                self.watch_nodes(stream, &new_nodes).await?;
            }
            self.tick(Instant::now());
            publish(self);
        }
    }

    /// Applies one key's change (`value` `None`: deleted); returns a node registered for the
    /// first time (to be read and watched).
    fn apply(&mut self, key: &[u8], value: Option<&[u8]>) -> Option<String> {
        let key = self.keys.parse_node_key(key)?;
        let deleted = value.is_none();
        let value = value.unwrap_or_default();
        let now = Instant::now();
        match key {
            NodeKey::Registration { node } => {
                let event = if deleted {
                    NodeEvent::NotReady { node: node.clone() }
                } else {
                    match serde_json::from_slice::<Registration>(value) {
                        Ok(registration) => NodeEvent::Ready(Box::new(registration)),
                        Err(e) => {
                            let why = format!("its registration cannot be read: {e}");
                            self.edit(&node, |v| v.unreadable = Some(why));
                            return None;
                        }
                    }
                };
                let new = !self.nodes.contains_key(&node);
                // The tracker exists from the first read of the registrations on, which is
                // where the first registration is applied.
                let liveness = self.tracker.as_mut()?.observe(&event, now);
                let registration = match event {
                    NodeEvent::Ready(registration) => Some(*registration),
                    NodeEvent::NotReady { .. } => None,
                };
                self.edit(&node, |v| {
                    if v.liveness != liveness {
                        v.since = Some(tessera_compiler::units::now());
                    }
                    v.liveness = liveness;
                    v.registration = registration;
                });
                new.then_some(node)
            }
            NodeKey::Observed { node } => {
                let observed = (!deleted).then(|| protocol::decode::<Observed>(value));
                self.edit(&node, |v| match observed {
                    None => v.observed = None,
                    Some(Ok(observed)) => {
                        v.observed = Some(observed);
                        v.unreadable = None;
                    }
                    Some(Err(e)) => {
                        v.observed = None;
                        v.unreadable = Some(format!("its observation cannot be read: {e}"));
                    }
                });
                None
            }
            NodeKey::Utilization { node } => {
                // Figures that cannot be read are left out rather than making the node
                // unavailable: they are reports, not state anything is decided on.
                let figures = (!deleted)
                    .then(|| protocol::decode::<Utilization>(value).ok())
                    .flatten();
                self.edit(&node, |v| v.utilization = figures);
                None
            }
            _ => None,
        }
    }

    /// Changes one node, copying only that node (and the map's spine while a snapshot holds
    /// the old one).
    fn edit(&mut self, node: &str, f: impl FnOnce(&mut NodeView)) {
        let liveness = self
            .tracker
            .as_ref()
            .and_then(|t| t.get(node))
            .unwrap_or(Liveness::Ready);
        let nodes = Arc::make_mut(&mut self.nodes);
        let view = nodes.entry(node.to_string()).or_insert_with(|| {
            Arc::new(NodeView {
                name: node.to_string(),
                registration: None,
                observed: None,
                utilization: None,
                liveness,
                since: None,
                unreadable: None,
            })
        });
        f(Arc::make_mut(view));
    }

    /// Marks Lost the nodes whose grace ran out by `now`.
    fn tick(&mut self, now: Instant) {
        let Some(tracker) = self.tracker.as_mut() else {
            return;
        };
        let lost = tracker.tick(now);
        for node in lost {
            let liveness = self.tracker.as_ref().and_then(|t| t.get(&node));
            if let Some(liveness) = liveness {
                self.edit(&node, |v| v.liveness = liveness);
            }
        }
    }

    /// Reads the registrations and every known node's keys, and starts one watch stream for
    /// all of them from the revisions read. Liveness carries over from the previous sync.
    async fn sync(&mut self) -> Result<WatchStream, FleetError> {
        let prefix = self.keys.registrations_prefix();
        let answer = self
            .client
            .clone()
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| etcd("get", &prefix, e))?;
        let revision = answer.header().map_or(0, |h| h.revision());
        let mut registered = BTreeMap::new();
        for kv in answer.kvs() {
            if let Some(NodeKey::Registration { node }) = self.keys.parse_node_key(kv.key()) {
                registered.insert(node, kv.clone());
            }
        }
        let now = Instant::now();
        if self.tracker.is_none() {
            let names: Vec<String> = registered.keys().cloned().collect();
            let tracker = LivenessTracker::new(self.grace, &names, &self.expected, now);
            self.tracker = Some(tracker);
            let missing: Vec<String> = self
                .expected
                .iter()
                .filter(|n| !registered.contains_key(*n))
                .cloned()
                .collect();
            for node in missing {
                let since = Some(tessera_compiler::units::now());
                self.edit(&node, |v| v.since = since);
            }
        }
        // Whatever changed while the view could not read: a registration gone is NotReady
        // from now, one present is Ready.
        let known: Vec<String> = self.nodes.keys().cloned().collect();
        for node in known {
            if !registered.contains_key(&node) {
                let key = self.keys.registration(&node)?;
                self.apply(key.as_bytes(), None);
            }
        }
        for kv in registered.values() {
            self.apply(kv.key(), Some(kv.value()));
        }
        self.revision = revision;
        let mut stream = self
            .client
            .clone()
            .watch(
                prefix.as_str(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision + 1),
                ),
            )
            .await
            .map_err(|e| etcd("watch", &prefix, e))?;
        let nodes: Vec<String> = self.nodes.keys().cloned().collect();
        self.watch_nodes(&mut stream, &nodes).await?;
        Ok(stream)
    }

    /// Reads `nodes`' observation and utilisation (64 nodes, one range each, to a
    /// transaction) and adds a watch of each node's range from the revision of its read.
    async fn watch_nodes(
        &mut self,
        stream: &mut WatchStream,
        nodes: &[String],
    ) -> Result<(), FleetError> {
        for chunk in nodes.chunks(64) {
            let ranges: Vec<(String, Vec<u8>)> = chunk
                .iter()
                .map(|n| self.keys.view_range(n))
                .collect::<Result<_, _>>()?;
            let ops = ranges
                .iter()
                .map(|(start, end)| {
                    TxnOp::get(
                        start.as_str(),
                        Some(GetOptions::new().with_range(end.clone())),
                    )
                })
                .collect::<Vec<_>>();
            let answer = self
                .client
                .clone()
                .txn(Txn::new().and_then(ops))
                .await
                .map_err(|e| etcd("read", &ranges[0].0, e))?;
            let revision = answer.header().map_or(0, |h| h.revision());
            for (node, response) in chunk.iter().zip(answer.op_responses()) {
                let TxnOpResponse::Get(get) = response else {
                    continue;
                };
                // Absent keys read as deleted: a node whose agent never wrote them has none.
                let mut found: BTreeSet<Vec<u8>> = BTreeSet::new();
                for kv in get.kvs() {
                    found.insert(kv.key().to_vec());
                    self.apply(kv.key(), Some(kv.value()));
                }
                for key in [self.keys.observed(node)?, self.keys.utilization(node)?] {
                    if !found.contains(key.as_bytes()) {
                        self.apply(key.as_bytes(), None);
                    }
                }
            }
            for (start, end) in &ranges {
                stream
                    .watch(
                        start.as_str(),
                        Some(
                            WatchOptions::new()
                                .with_range(end.clone())
                                .with_start_revision(revision + 1),
                        ),
                    )
                    .await
                    .map_err(|e| etcd("watch", start, e))?;
            }
        }
        Ok(())
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
