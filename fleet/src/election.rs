//! Leader election on one key and a lease, and the fence every control-plane write passes.
//!
//! A candidate grants itself a lease and creates the leader key with it in a transaction that
//! succeeds only where the key does not exist (`create_revision == 0`). Exactly one candidate's
//! transaction succeeds; the others watch the key and try again when it is deleted, which etcd
//! does itself when the leader's lease expires or is revoked. The leader's term is named by the
//! key's create revision, which etcd never hands out twice.
//!
//! The fence: every write of the leader is a transaction guarded by `create_revision(leader
//! key) == the create revision of my term`. Once the term's lease is gone, the key is gone or
//! belongs to a later term with a larger create revision, so the guard fails and etcd applies
//! nothing, whatever the deposed process believes and however late its request arrives. The
//! guard is checked by etcd in the same serialised transaction as the write, so there is no
//! window between the check and the write.
//!
//! Why not etcd's election API (`v3election.Campaign`): it is the same mechanism (a key per
//! candidate on its lease, the lowest create revision leads), but `Campaign` is a server-side
//! blocking call whose cancellation, on a dropped connection, leaves cleanup to the server;
//! one key with a plain transaction gives the same guarantee with requests that are each
//! complete, lets standbys and clients find the leader with a single read of a well-known key,
//! and makes the fence's compare visibly the same key and revision as the election.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::error::{FleetError, etcd};
use crate::keys::Keys;
use crate::lease::KeepAlive;

/// Who leads, as the leader key holds it: what standbys answer a write with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaderInfo {
    /// The replica's identity (unique among replicas; e.g. its host name).
    pub id: String,
    /// Where the leader serves its API, for standbys to forward to or name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
}

impl std::fmt::Display for LeaderInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.advertise {
            Some(at) => write!(f, "{} (at {at})", self.id),
            None => write!(f, "{}", self.id),
        }
    }
}

/// One control-plane replica that wants to lead.
#[derive(Clone)]
pub struct Candidate {
    client: Client,
    keys: Keys,
    info: LeaderInfo,
    ttl_secs: i64,
}

impl Candidate {
    /// `ttl_secs` is the lease period: how long after a leader stops renewing (a crash, a
    /// partition) another replica may lead. etcd raises a TTL below its minimum (about 2 s
    /// with default timings) to that minimum.
    pub fn new(client: Client, keys: Keys, info: LeaderInfo, ttl_secs: i64) -> Candidate {
        Candidate {
            client,
            keys,
            info,
            ttl_secs,
        }
    }

    /// Waits until this candidate leads, and returns its term.
    pub async fn campaign(&self) -> Result<Leadership, FleetError> {
        let key = self.keys.leader();
        let value = serde_json::to_vec(&self.info).expect("LeaderInfo serialises");
        let mut client = self.client.clone();
        loop {
            let granted = Instant::now();
            let lease = client
                .lease_grant(self.ttl_secs, None)
                .await
                .map_err(|e| etcd("lease grant", &key, e))?;
            // The term's local deadline counts from the grant's sending (see `lease`). A grant
            // answered only after half its TTL (etcd slow, or resuming from a hang with the
            // request queued) leaves a term too little time for its first renewal, or none:
            // it would count itself over at once and hold the key, unrenewed, for a lease
            // period. The lease is given back and asked for again.
            let ttl = Duration::from_secs(lease.ttl().max(1) as u64);
            if granted.elapsed() >= ttl / 2 {
                let _ = client.lease_revoke(lease.id()).await;
                continue;
            }
            let claim = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(lease.id())),
                )])
                .or_else([TxnOp::get(key.as_str(), None)]);
            let answer = match client.txn(claim).await {
                Ok(answer) => answer,
                Err(e) => {
                    // The claim's outcome is unknown (etcd may apply it once it answers again,
                    // a timed-out request included): the lease is given back, so that a claim
                    // that did apply deletes itself instead of holding the key, with no one
                    // leading, for a lease period. If this revoke is lost too, the lease
                    // expires unrenewed: a delay, never two leaders.
                    let _ = client.lease_revoke(lease.id()).await;
                    return Err(etcd("campaign", &key, e));
                }
            };
            let revision = answer.header().map_or(0, |h| h.revision());
            if answer.succeeded() {
                return Ok(Leadership {
                    client: client.clone(),
                    fence: Fence {
                        key,
                        term: revision,
                    },
                    lease: lease.id(),
                    keepalive: KeepAlive::start(client, lease.id(), ttl, granted),
                });
            }
            // Someone leads: give the unused lease back and wait for the key to go.
            let _ = client.lease_revoke(lease.id()).await;
            wait_for_delete(&mut client, &key, revision + 1).await?;
        }
    }
}

/// The leader as the leader key names it now; `None` while no one leads.
pub async fn current_leader(
    client: &Client,
    keys: &Keys,
) -> Result<Option<LeaderInfo>, FleetError> {
    let key = keys.leader();
    let mut client = client.clone();
    let answer = client
        .get(key.as_str(), None)
        .await
        .map_err(|e| etcd("get", &key, e))?;
    answer
        .kvs()
        .first()
        .map(|kv| {
            serde_json::from_slice(kv.value()).map_err(|source| FleetError::Decode { key, source })
        })
        .transpose()
}

/// Returns once `key` is deleted at or after `from`, or when the watch cannot tell (compacted,
/// cancelled, broken): the caller's transaction then finds out.
async fn wait_for_delete(client: &mut Client, key: &str, from: i64) -> Result<(), FleetError> {
    let mut watch = client
        .watch(key, Some(WatchOptions::new().with_start_revision(from)))
        .await
        .map_err(|e| etcd("watch", key, e))?;
    while let Ok(Some(answer)) = watch.message().await {
        if answer.canceled() {
            return Ok(());
        }
        if answer
            .events()
            .iter()
            .any(|e| e.event_type() == etcd_client::EventType::Delete)
        {
            return Ok(());
        }
    }
    Ok(())
}

/// The guard of one leader's term: the leader key and the create revision it had when this
/// term began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    key: String,
    term: i64,
}

/// One change in a fenced transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Put { key: String, value: Vec<u8> },
    Delete { key: String },
}

/// A condition of a fenced transaction besides the fence, on keys the write read before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// The key does not exist.
    Absent { key: String },
    /// The key was last modified at this revision (it has not changed since it was read).
    Unchanged { key: String, mod_revision: i64 },
}

impl Guard {
    fn key(&self) -> &str {
        match self {
            Guard::Absent { key } | Guard::Unchanged { key, .. } => key,
        }
    }

    fn compare(&self) -> Compare {
        match self {
            Guard::Absent { key } => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
            Guard::Unchanged { key, mod_revision } => {
                Compare::mod_revision(key.as_str(), CompareOp::Equal, *mod_revision)
            }
        }
    }
}

impl Fence {
    /// The fence of the term that began at `term` (a leader key's create revision), as a
    /// request made during that term carries it.
    pub fn for_term(keys: Keys, term: i64) -> Fence {
        Fence {
            key: keys.leader(),
            term,
        }
    }

    /// The term: the leader key's create revision when this leader won.
    pub fn term(&self) -> i64 {
        self.term
    }

    /// Applies `writes` in one transaction if and only if this term still leads and every
    /// guard holds; returns the revision of the write. Nothing is applied otherwise:
    /// [`FleetError::Deposed`] when the term is over, [`FleetError::Conflict`] when a guard
    /// failed.
    pub async fn write(
        &self,
        client: &Client,
        guards: &[Guard],
        writes: &[Write],
    ) -> Result<i64, FleetError> {
        let mut compares = vec![Compare::create_revision(
            self.key.as_str(),
            CompareOp::Equal,
            self.term,
        )];
        compares.extend(guards.iter().map(Guard::compare));
        let ops: Vec<TxnOp> = writes
            .iter()
            .map(|w| match w {
                Write::Put { key, value } => TxnOp::put(key.as_str(), value.clone(), None),
                Write::Delete { key } => TxnOp::delete(key.as_str(), None),
            })
            .collect();
        let mut otherwise = vec![TxnOp::get(self.key.as_str(), None)];
        otherwise.extend(guards.iter().map(|g| TxnOp::get(g.key(), None)));
        let first = writes.first().map_or(self.key.as_str(), |w| match w {
            Write::Put { key, .. } | Write::Delete { key } => key.as_str(),
        });
        let mut client = client.clone();
        let answer = client
            .txn(Txn::new().when(compares).and_then(ops).or_else(otherwise))
            .await
            .map_err(|e| etcd("fenced write", first, e))?;
        if answer.succeeded() {
            return Ok(answer.header().map_or(0, |h| h.revision()));
        }
        let reads: Vec<_> = answer
            .op_responses()
            .into_iter()
            .map(|r| match r {
                TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                _ => None,
            })
            .collect();
        let leader = reads.first().cloned().flatten();
        if leader.as_ref().map(|kv| kv.create_revision()) != Some(self.term) {
            let now = leader
                .and_then(|kv| serde_json::from_slice::<LeaderInfo>(kv.value()).ok())
                .map(|l| l.to_string());
            return Err(FleetError::Deposed {
                key: first.to_string(),
                now,
            });
        }
        let failed = guards
            .iter()
            .zip(reads.iter().skip(1))
            .find(|(guard, kv)| match guard {
                Guard::Absent { .. } => kv.is_some(),
                Guard::Unchanged { mod_revision, .. } => {
                    kv.as_ref().map(|kv| kv.mod_revision()) != Some(*mod_revision)
                }
            })
            .map_or(first, |(guard, _)| guard.key());
        Err(FleetError::Conflict {
            key: failed.to_string(),
        })
    }
}

/// One term of leadership: the fence and the lease it rests on, kept alive until dropped or
/// resigned. Dropping it stops renewing, so a standby leads once the lease expires;
/// [`Leadership::resign`] hands over at once.
pub struct Leadership {
    client: Client,
    fence: Fence,
    lease: i64,
    keepalive: KeepAlive,
}

impl Leadership {
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// A fenced write with this term's client (see [`Fence::write`]).
    pub async fn write(&self, guards: &[Guard], writes: &[Write]) -> Result<i64, FleetError> {
        self.fence.write(&self.client, guards, writes).await
    }

    /// Whether this term may be over (its lease expired, was revoked, or went unrenewed past
    /// its local deadline): the leader stops acting then. Writes are fenced regardless.
    pub fn is_lost(&self) -> bool {
        self.keepalive.is_gone()
    }

    /// Resolves when [`Leadership::is_lost`] becomes true.
    pub async fn lost(&mut self) {
        self.keepalive.gone().await
    }

    /// Stops renewing the lease without revoking it, as a hung process would; the term ends
    /// when etcd expires the lease. For tests of failover.
    pub fn stop_renewing(&self) {
        self.keepalive.stop();
    }

    /// Ends the term now: revokes the lease, which deletes the leader key, so that a standby
    /// leads at once instead of after the TTL.
    pub async fn resign(self) -> Result<(), FleetError> {
        self.keepalive.stop();
        let mut client = self.client.clone();
        client
            .lease_revoke(self.lease)
            .await
            .map_err(|e| etcd("lease revoke", &self.fence.key, e))?;
        Ok(())
    }
}
