//! `tessera-fleet agent`: the node side of fleet mode.
//!
//! An agent registers its node ([`Registrar`], on a lease), stops whatever it runs that is no
//! longer bound to it (`nodes/<node>/bound`; again each time it registers again after losing
//! its lease, since its node may have been lost meanwhile), then takes the actions the leader addresses to
//! it in id order ([`ActionFeed`]) and applies each through the same node-local code as the
//! single-process service (`tessera_reconciler::node`), journaling intent before and the
//! outcome after. An action whose journal stops at intent (the previous agent died applying
//! it) is settled from what the node shows, never applied again. After the actions that
//! arrived together are through, and whenever a workload ends, it writes
//! `nodes/<node>/observed`, only when that changed, and its GPUs' utilisation apart, under
//! `nodes/<node>/utilization`, only when it moved meaningfully ([`crate::utilization`]).
//!
//! Its workloads are local processes: they keep running while etcd or the control plane is
//! away, and across a restart of the agent itself (the runtime adopts them; the agent's
//! record in its state directory says what it started). Every etcd failure is retried with
//! a growing back-off; only a refusal by etcd's access control (these credentials may not
//! act for this node) ends the agent, since waiting cannot fix it.

mod node;
mod record;

use std::future::Future;
use std::time::Duration;

use etcd_client::Client;
use tracing::{error, info, info_span, warn};

pub use node::{INTERRUPTED, NodeState};
pub use record::{LocalReplica, LocalWorkload, Record, RecordError};

use crate::FleetError;
use crate::access::{self, Credentials};
use crate::actions::{ActionFeed, PendingAction};
use crate::error::etcd;
use crate::keys::Keys;
use crate::protocol::{self, Bound};
use crate::registration::{Registrar, RegistrationState};
use crate::utilization::{self, Cadence, Utilization};

/// How an agent reaches etcd and keeps its registration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub keys: Keys,
    pub endpoints: Vec<String>,
    pub credentials: Option<Credentials>,
    /// The registration lease's TTL: how long after the agent stops answering its node is
    /// NotReady.
    pub lease_ttl_secs: i64,
    /// How often exits are collected and the observation refreshed between actions.
    pub observe_every: Duration,
    /// When the GPUs' utilisation is written.
    pub utilization: Cadence,
}

/// What ends an agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(
        "{0}; the agent's etcd user may act only for its own node (see `tessera-fleet agent \
         --help` on credentials)"
    )]
    Refused(FleetError),
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// Runs the agent for `node` until `shutdown` resolves. Its workloads keep running after it
/// returns; its registration then expires after the lease's TTL.
pub async fn run(
    config: &AgentConfig,
    node: &mut NodeState,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    tokio::pin!(shutdown);
    let mut backoff = Backoff::default();
    let (client, mut registrar) = loop {
        let attempt = join(config, node);
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            joined = attempt => match joined {
                Ok(joined) => break joined,
                Err(e) => {
                    let e = match e {
                        Joined::Fleet(e) => fatal(e)?.to_string(),
                        Joined::Record(e) => return Err(AgentError::Record(e)),
                        other => other.to_string(),
                    };
                    let wait = backoff.next();
                    warn!(retry_in = ?wait, "cannot join the fleet yet: {e}");
                    tokio::select! {
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    };
    info!(node = node.name(), "joined the fleet");
    backoff = Backoff::default();
    let mut publisher = Publisher::new(config, node.name())?;
    let mut feed: Option<ActionFeed> = None;
    let mut tick = tokio::time::interval(config.observe_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether the registration was lost (the agent paused or cut off past its lease) and
    // what this node runs has not been compared with `bound` since: the control plane may
    // have moved its workloads away meanwhile, and they must not run twice.
    let mut lost = false;
    loop {
        if feed.is_none() {
            match ActionFeed::start(&client, &config.keys, node.name()).await {
                Ok(started) => feed = Some(started),
                Err(e) => {
                    let e = fatal(e)?;
                    let wait = backoff.next();
                    warn!(retry_in = ?wait, "cannot read this node's actions: {e}");
                    tokio::select! {
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
            }
        }
        let Some(current) = feed.as_mut() else {
            continue;
        };
        let next = tokio::select! {
            () = &mut shutdown => return Ok(()),
            state = registrar.wait_for(|s| lost != (*s == RegistrationState::Lost)) => {
                lost = state == RegistrationState::Lost;
                if lost {
                    warn!("the registration's lease was lost; registering again");
                    continue;
                }
                match stop_moved(&client, &config.keys, node).await {
                    Ok(()) => info!("registered again"),
                    Err(Joined::Record(e)) => return Err(AgentError::Record(e)),
                    Err(e) => {
                        // Compared again before anything else, after the back-off.
                        lost = true;
                        let wait = backoff.next();
                        warn!(retry_in = ?wait, "registered again, but {e}");
                        tokio::select! {
                            () = &mut shutdown => return Ok(()),
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                }
                continue;
            }
            next = current.next_batch(BATCH) => Some(next),
            _ = tick.tick() => None,
        };
        let failed = match next {
            None => {
                blocking(|| node.poll_exits())?;
                publisher.publish(&client, node).await.err()
            }
            Some(Ok(Some(batch))) => {
                let ids = format!(
                    "{}..={}",
                    batch.first().map_or(0, |p| p.id),
                    batch.last().map_or(0, |p| p.id)
                );
                // A start is taken only while the control plane still binds its workload
                // here: one it moved away while the start waited (this node was away) is
                // refused, not run beside its new placement.
                let bound = if batch.iter().any(|p| !p.interrupted && is_start(&p.body)) {
                    match read_bound(&client, &config.keys, node.name()).await {
                        Ok(bound) => bound,
                        Err(e) => {
                            warn!("reading this node's bound workloads: {e}; retrying");
                            let wait = backoff.next();
                            feed = None;
                            tokio::select! {
                                () = &mut shutdown => return Ok(()),
                                () = tokio::time::sleep(wait) => {}
                            }
                            continue;
                        }
                    }
                } else {
                    None
                };
                match take(current, node, batch, bound.as_ref()).await {
                    // Reported once the actions that arrived together are through.
                    Ok(()) if current.has_queued() => None,
                    Ok(()) => publisher.publish(&client, node).await.err(),
                    Err(e) => {
                        warn!(
                            ids,
                            "the journal could not be written; the actions are settled once etcd answers"
                        );
                        Some(e)
                    }
                }
            }
            Some(Ok(None)) => {
                info!("etcd ended the watch of this node's actions; watching again");
                feed = None;
                None
            }
            Some(Err(e)) => Some(e),
        };
        match failed {
            None => backoff = Backoff::default(),
            Some(e) => {
                let e = fatal(e)?;
                let wait = backoff.next();
                warn!(retry_in = ?wait, "etcd: {e}; the node's workloads keep running");
                feed = None;
                tokio::select! {
                    () = &mut shutdown => return Ok(()),
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

/// Connects, registers, and stops what is no longer bound to this node.
async fn join(config: &AgentConfig, node: &mut NodeState) -> Result<(Client, Registrar), Joined> {
    let client = access::connect(&config.endpoints, config.credentials.as_ref()).await?;
    let registration = node.registration()?;
    let registrar =
        Registrar::start(&client, &config.keys, &registration, config.lease_ttl_secs).await?;
    // Nothing was ever bound here (a new node, or a control plane that has not bound
    // anything yet): nothing it runs is bound.
    let bound = read_bound(&client, &config.keys, node.name())
        .await?
        .unwrap_or_default();
    let stopped = node.stop_unbound(&bound)?;
    if !stopped.is_empty() {
        info!(
            stopped = stopped.join(", "),
            "stopped workloads no longer bound to this node"
        );
    }
    Ok((client, registrar))
}

/// Registered again after the registration was lost: stops what is no longer bound here, as
/// joining does.
async fn stop_moved(client: &Client, keys: &Keys, node: &mut NodeState) -> Result<(), Joined> {
    let bound = read_bound(client, keys, node.name())
        .await?
        .unwrap_or_default();
    let stopped = blocking(|| node.stop_unbound(&bound))?;
    if !stopped.is_empty() {
        info!(
            stopped = stopped.join(", "),
            "stopped workloads moved away while the registration was lost"
        );
    }
    Ok(())
}

/// The workloads the control plane binds to `node` now; `None` where it never wrote any.
async fn read_bound(client: &Client, keys: &Keys, node: &str) -> Result<Option<Bound>, Joined> {
    let key = keys.bound(node).map_err(FleetError::from)?;
    let answer = client
        .clone()
        .get(key.as_str(), None)
        .await
        .map_err(|e| etcd("get", &key, e))?;
    answer
        .kvs()
        .first()
        .map(|kv| {
            protocol::decode::<Bound>(kv.value()).map_err(|e| Joined::Bound {
                key: key.clone(),
                reason: e.to_string(),
            })
        })
        .transpose()
}

/// Whether an action's document is a start (one that cannot be read is not).
fn is_start(body: &[u8]) -> bool {
    matches!(
        protocol::decode::<protocol::ActionMessage>(body),
        Ok(protocol::ActionMessage {
            action: tessera_reconciler::actions::Action::Start { .. },
            ..
        })
    )
}

/// Why joining failed.
#[derive(Debug, thiserror::Error)]
enum Joined {
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{key} cannot be read: {reason}")]
    Bound { key: String, reason: String },
}

/// The most actions journaled in one transaction: etcd's default `--max-txn-ops`.
const BATCH: usize = 128;

/// Applies a batch of actions under the journal: the intents of the new ones in one
/// transaction, then each applied (or, for an interrupted one, settled) in id order, then
/// every outcome in one transaction. Two journal writes per batch rather than per action; an
/// agent killed part-way leaves the batch at intent, settled from what the node shows.
async fn take(
    feed: &mut ActionFeed,
    node: &mut NodeState,
    batch: Vec<PendingAction>,
    bound: Option<&Bound>,
) -> Result<(), FleetError> {
    let fresh: Vec<u64> = batch
        .iter()
        .filter(|p| !p.interrupted)
        .map(|p| p.id)
        .collect();
    feed.begin_all(&fresh).await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for pending in batch {
        let span = info_span!("action", id = pending.id, interrupted = pending.interrupted);
        let _entered = span.enter();
        let outcome = if pending.interrupted {
            let outcome = blocking(|| node.settle(&pending.body));
            match &outcome {
                Ok(()) => info!("settled: the previous agent's interrupted action is done"),
                Err(e) => warn!("settled as failed: {e}"),
            }
            outcome
        } else {
            let outcome = blocking(|| node.apply_bound(&pending.body, bound));
            match &outcome {
                Ok(()) => info!("applied"),
                Err(e) => warn!("failed: {e}"),
            }
            outcome
        };
        outcomes.push((pending.id, outcome));
    }
    feed.finish_all(outcomes).await
}

/// Sorts an etcd failure into one to retry (returned) and one that ends the agent: a
/// refusal by access control (of a key, or of the credentials themselves) or a name that
/// cannot be a key, which waiting cannot fix.
fn fatal(e: FleetError) -> Result<FleetError, AgentError> {
    match e {
        e @ (FleetError::PermissionDenied { .. }
        | FleetError::Unauthenticated { .. }
        | FleetError::AuthDisabled { .. }
        | FleetError::Name(_)) => {
            error!("{e}");
            Err(AgentError::Refused(e))
        }
        other => Ok(other),
    }
}

/// Writes `observed` when it differs from what was last written, and the utilisation when
/// its cadence says so.
struct Publisher {
    observed_key: String,
    utilization_key: String,
    cadence: Cadence,
    last: Option<Vec<u8>>,
    /// The utilisation last written, and when.
    last_use: Option<(Utilization, tokio::time::Instant)>,
}

impl Publisher {
    fn new(config: &AgentConfig, node: &str) -> Result<Publisher, AgentError> {
        Ok(Publisher {
            observed_key: config.keys.observed(node).map_err(FleetError::from)?,
            utilization_key: config.keys.utilization(node).map_err(FleetError::from)?,
            cadence: config.utilization,
            last: None,
            last_use: None,
        })
    }

    async fn publish(&mut self, client: &Client, node: &mut NodeState) -> Result<(), FleetError> {
        let mut observed = match blocking(|| node.observe()) {
            Ok(observed) => observed,
            Err(e) => {
                // The driver's trouble is the node's to report, not a reason to stop.
                warn!("observing the node: {e}");
                return Ok(());
            }
        };
        let figures = utilization::split(&mut observed.details);
        let bytes = protocol::encode(&observed);
        if self.last.as_deref() != Some(bytes.as_slice()) {
            client
                .clone()
                .put(self.observed_key.as_str(), bytes.clone(), None)
                .await
                .map_err(|e| etcd("put", &self.observed_key, e))?;
            self.last = Some(bytes);
        }
        let now = tokio::time::Instant::now();
        let due = match &self.last_use {
            None => true,
            Some((written, at)) => {
                now.duration_since(*at) >= self.cadence.interval
                    && self.cadence.is_meaningful(written, &figures)
            }
        };
        if due {
            client
                .clone()
                .put(
                    self.utilization_key.as_str(),
                    protocol::encode(&figures),
                    None,
                )
                .await
                .map_err(|e| etcd("put", &self.utilization_key, e))?;
            self.last_use = Some((figures, now));
        }
        Ok(())
    }
}

/// Runs a driver or runtime call, which may block for seconds (an NVML reset), without
/// holding up the other tasks of a multi-threaded runtime (the registration's keepalive among
/// them); on a current-thread runtime there is no other worker to hand them to.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Waits that double from 100 ms to 5 s.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let wait = Duration::from_millis(100) * 2u32.saturating_pow(self.failures.min(6));
        self.failures += 1;
        wait.min(Duration::from_secs(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let mut b = Backoff::default();
        let waits: Vec<u64> = (0..9).map(|_| b.next().as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }
}
