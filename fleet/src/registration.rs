//! A node's registration: the agent writes what its driver observes of the node under
//! `registrations/<node>`, attached to a lease it keeps alive. When the agent dies, hangs
//! or loses etcd for longer than the lease's TTL, etcd deletes the key by itself, and the
//! control plane's watch ([`NodeWatch`]) reports the node NotReady: liveness is etcd's lease
//! expiry, not a timer of the control plane's that a failover would reset.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, PutOptions, WatchOptions, WatchStream};
use serde::{Deserialize, Serialize};
use tessera_compiler::model::Node;
use tessera_reconciler::driver::{GpuDetail, NodeDriver};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{FleetError, etcd};
use crate::keys::{Keys, NodeKey};
use crate::lease::KeepAlive;

/// What an agent registers: the node as its driver observes it (name, pool, CPU, memory,
/// labels, the GPUs and their MIG mode and instances) and which driver observed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Registration {
    pub node: Node,
    /// `sim` or `nvml`.
    pub driver: String,
    /// The agent's version (`CARGO_PKG_VERSION` of this crate).
    pub agent_version: String,
}

/// What an agent observed of its node beyond the registration: NVML ids of the instances,
/// the processes on each GPU, utilisation. Written to `nodes/<node>/observed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeObservation {
    pub node: Node,
    pub details: Vec<GpuDetail>,
}

impl Registration {
    /// Observes `node` through `driver`: its registration and its full observation.
    pub fn observe(
        driver: &mut dyn NodeDriver,
        node: &str,
    ) -> Result<(Registration, NodeObservation), FleetError> {
        let observation = driver.observe().map_err(|source| FleetError::Driver {
            node: node.to_string(),
            source,
        })?;
        let names: Vec<&str> = observation.nodes.iter().map(|n| n.name.as_str()).collect();
        let Some(found) = observation.nodes.iter().find(|n| n.name == node) else {
            return Err(FleetError::NodeNotObserved {
                node: node.to_string(),
                observed: if names.is_empty() {
                    "no node".to_string()
                } else {
                    names.join(", ")
                },
            });
        };
        let details = observation
            .details
            .into_iter()
            .filter(|d| d.gpu.node == node)
            .collect();
        let registration = Registration {
            node: found.clone(),
            driver: driver.kind().to_string(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        Ok((
            registration,
            NodeObservation {
                node: found.clone(),
                details,
            },
        ))
    }
}

/// Where an agent's registration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationState {
    /// Written, on a lease being kept alive.
    Registered { lease: i64 },
    /// The lease went (expired while the agent could not renew it): registering again.
    Lost,
}

/// An agent's registration, kept alive in a background task; re-registered on a fresh lease
/// whenever the lease is lost (the agent was paused past its TTL, or etcd was away), so that
/// the node comes back by itself. Dropping it stops renewing (the key then expires).
pub struct Registrar {
    task: JoinHandle<()>,
    state: watch::Receiver<RegistrationState>,
    client: Client,
    key: String,
}

impl Registrar {
    /// Registers `registration` under its node's key on a lease of `ttl_secs`, and keeps it
    /// there. Fails when the first registration cannot be written (no etcd, no permission).
    pub async fn start(
        client: &Client,
        keys: &Keys,
        registration: &Registration,
        ttl_secs: i64,
    ) -> Result<Registrar, FleetError> {
        let key = keys.registration(&registration.node.name)?;
        let value = serde_json::to_vec(registration).expect("a registration serialises");
        let mut client = client.clone();
        let (lease, keepalive) = register(&mut client, &key, &value, ttl_secs).await?;
        let (tx, state) = watch::channel(RegistrationState::Registered { lease });
        let task = tokio::spawn(keep_registered(
            client.clone(),
            key.clone(),
            value,
            ttl_secs,
            keepalive,
            tx,
        ));
        Ok(Registrar {
            task,
            state,
            client,
            key,
        })
    }

    pub fn state(&self) -> RegistrationState {
        *self.state.borrow()
    }

    /// Resolves at the next change of [`Registrar::state`] that satisfies `f`.
    pub async fn wait_for(
        &mut self,
        f: impl FnMut(&RegistrationState) -> bool,
    ) -> RegistrationState {
        if let Ok(state) = self.state.wait_for(f).await {
            return *state;
        }
        // The task ended (it was stopped): the state stays as it last was.
        *self.state.borrow()
    }

    /// Stops renewing without deleting anything, as a hung agent would: the registration
    /// expires after its TTL. For tests of node loss.
    pub fn stop_renewing(&self) {
        self.task.abort();
    }

    /// Removes the registration now (the node leaves on purpose): revokes its lease.
    pub async fn deregister(self) -> Result<(), FleetError> {
        self.task.abort();
        if let RegistrationState::Registered { lease } = *self.state.borrow() {
            let mut client = self.client.clone();
            client
                .lease_revoke(lease)
                .await
                .map_err(|e| etcd("lease revoke", &self.key, e))?;
        }
        Ok(())
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn register(
    client: &mut Client,
    key: &str,
    value: &[u8],
    ttl_secs: i64,
) -> Result<(i64, KeepAlive), FleetError> {
    let granted = Instant::now();
    let lease = client
        .lease_grant(ttl_secs, None)
        .await
        .map_err(|e| etcd("lease grant", key, e))?;
    client
        .put(key, value, Some(PutOptions::new().with_lease(lease.id())))
        .await
        .map_err(|e| etcd("put", key, e))?;
    let ttl = Duration::from_secs(lease.ttl().max(1) as u64);
    Ok((
        lease.id(),
        KeepAlive::start(client.clone(), lease.id(), ttl, granted),
    ))
}

async fn keep_registered(
    mut client: Client,
    key: String,
    value: Vec<u8>,
    ttl_secs: i64,
    mut keepalive: KeepAlive,
    state: watch::Sender<RegistrationState>,
) {
    let retry = Duration::from_millis((ttl_secs.max(1) as u64 * 1000) / 3);
    loop {
        keepalive.gone().await;
        let _ = state.send(RegistrationState::Lost);
        keepalive = loop {
            match register(&mut client, &key, &value, ttl_secs).await {
                Ok((lease, keepalive)) => {
                    let _ = state.send(RegistrationState::Registered { lease });
                    break keepalive;
                }
                Err(_) => tokio::time::sleep(retry).await,
            }
        };
    }
}

/// What the control plane learns of a node's liveness.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeEvent {
    /// Registered (or registered again, or its registration changed).
    Ready(Box<Registration>),
    /// Its registration is gone: the agent's lease expired or was revoked.
    NotReady { node: String },
}

/// The control plane's view of the registrations: a consistent read of them all, then every
/// change after that read, in etcd's order. It reads and watches `registrations/` only, so
/// its cost grows with the number of nodes and their comings and goings, not with the
/// actions and observations under `nodes/`.
pub struct NodeWatch {
    keys: Keys,
    stream: WatchStream,
    /// Events of a watch answer not yet returned; a registration that cannot be read is
    /// returned as its error in its place, and the events after it still follow.
    pending: VecDeque<Result<NodeEvent, FleetError>>,
}

impl NodeWatch {
    /// Reads every registration and starts watching from the revision of that read, so that
    /// no change falls between the two.
    pub async fn start(
        client: &Client,
        keys: &Keys,
    ) -> Result<(BTreeMap<String, Registration>, NodeWatch), FleetError> {
        let prefix = keys.registrations_prefix();
        let mut client = client.clone();
        let answer = client
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| etcd("get", &prefix, e))?;
        let revision = answer.header().map_or(0, |h| h.revision());
        let mut nodes = BTreeMap::new();
        for kv in answer.kvs() {
            if let Some(NodeKey::Registration { node }) = keys.parse_node_key(kv.key()) {
                nodes.insert(node, decode(kv.key(), kv.value())?);
            }
        }
        let stream = client
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
        Ok((
            nodes,
            NodeWatch {
                keys: keys.clone(),
                stream,
                pending: VecDeque::new(),
            },
        ))
    }

    /// The next change of a registration; `None` when etcd ended the watch (the caller starts
    /// a new one, which begins with a full read).
    pub async fn next(&mut self) -> Result<Option<NodeEvent>, FleetError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return event.map(Some);
            }
            let prefix = self.keys.registrations_prefix();
            let Some(answer) = crate::watch::next_answer(&mut self.stream, &prefix).await? else {
                return Ok(None);
            };
            for event in answer.events() {
                let Some(kv) = event.kv() else { continue };
                let Some(NodeKey::Registration { node }) = self.keys.parse_node_key(kv.key())
                else {
                    continue;
                };
                self.pending.push_back(match event.event_type() {
                    EventType::Put => {
                        decode(kv.key(), kv.value()).map(|r| NodeEvent::Ready(Box::new(r)))
                    }
                    EventType::Delete => Ok(NodeEvent::NotReady { node }),
                });
            }
        }
    }
}

fn decode(key: &[u8], value: &[u8]) -> Result<Registration, FleetError> {
    serde_json::from_slice(value).map_err(|source| FleetError::Decode {
        key: String::from_utf8_lossy(key).into_owned(),
        source,
    })
}
