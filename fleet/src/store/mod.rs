//! The service's state in etcd: [`EtcdStore`] implements the reconciler's
//! [`StateStore`](tessera_reconciler::store::StateStore) (everything the SQLite store holds) under the cluster's `state/` prefix.
//!
//! ```text
//! state/counters/<sequence>                       last id taken: workload, event, journal,
//!                                                 revision, reserved
//! state/workloads/live/<id>                       a live workload's record (JSON)
//! state/workloads/ended/<id>                      an ended one's: ending moves the record
//! state/workloads/current/<tenant>/<name>         the id of the key's current record
//! state/workloads/history/<tenant>/<name>/<id>    every record of the key (empty values)
//! state/events/all/<id>                           the event log
//! state/events/by-workload/<tenant>/<name>/<id>   the same events, per workload
//! state/journal/open/<id>                         an intent; closing moves it to
//! state/journal/closed/<id>                       ... with its outcome
//! state/revisions/all/<id>                        every evaluation of a commit
//! state/revisions/last-applied                    the revision in force
//! state/carried                                   what one decision hands to the next
//! state/usage/runs/<tenant>/<workload>/<submitted>/<started>   one metered run
//! state/usage/open/<tenant>/<workload>/<submitted>/<started>   a run the watermark extends
//! state/usage/runs-metered-until                  the runs' watermark
//! state/usage/admissions/<tenant>/<workload>/<submitted>      an admission's split
//! state/usage/preemptions/<tenant>/<workload>/<submitted>/<started>
//! state/usage/reserved/all/<id>                   a reserved-idle spell
//! state/usage/reserved/tail/<tenant>/<workload>/<pool>/<gpus>  the spell a metering extends
//! state/usage/clock                               the reserved-idle watermark
//! ```
//!
//! Ids are twenty digits, so a range read returns them in order; names are percent-encoded
//! segments. What a query filters on is in the key (live or ended, open or closed, whose
//! events), so the cycle's frequent reads (live workloads, open intents) are one range read
//! of exactly what they return.
//!
//! Every write is a read-check-write: read the keys it changes, check the change as the
//! SQLite store does (a workload's phase, a journal entry's state), then commit one
//! transaction that compares each read key's mod revision (or its absence) *and* the leader
//! key's create revision (the [`Fence`]), and puts the change, its event and the counters it
//! took ids from. etcd applies it only if nothing it read has changed and this term still
//! leads; otherwise it applies nothing. A compare that fails on a read key means another
//! writer of the same leader (the API beside the cycle) got there first: the write is read
//! and checked again (bounded). A failed fence is [`StoreError::NotLeader`](tessera_reconciler::store::StoreError::NotLeader): a deposed leader
//! never writes, however late its request arrives. Reads need no fence, so a standby's store
//! ([`EtcdStore::reader`]) serves them.
//!
//! etcd's limits (`--max-txn-ops` 128, 1.5 MiB per request) bound one transaction. The
//! writes that carry one key per row of a table are chunked, where each chunk is safe on its
//! own: metering the runs that start or end (`state/runs.rs`: a steady cycle writes only the
//! runs' watermark; a crash between chunks leaves some runs metered to the earlier instant,
//! never a second counted twice),
//! pruning the journal (each closed entry is deleted independently) and reserved-idle spells
//! (a spell is extended only over what it does not cover yet, and the watermark moves with
//! the last chunk). Every other write is a handful of keys; one that would exceed a limit
//! (a `carried` value over 1.5 MiB) is refused with an error, never half-applied.

mod etcd;
mod layout;
mod lifecycle;
mod state;

use std::sync::Arc;

pub use etcd::{MAX_REQUEST_BYTES, MAX_TXN_OPS, StoreRuntime};
use etcd_client::Client;

use crate::election::Fence;
use crate::keys::Keys;

/// The service's state in etcd, as a blocking [`StateStore`]. Cheap to clone: clones share
/// the runtime and the connection (the API and the cycle each hold one).
///
/// [`StateStore`]: tessera_reconciler::store::StateStore
#[derive(Clone)]
pub struct EtcdStore {
    etcd: etcd::Etcd,
    layout: layout::Layout,
}

impl EtcdStore {
    /// The leader's store: every write is fenced by `fence`, the term this replica won.
    pub fn leader(runtime: Arc<StoreRuntime>, client: Client, keys: Keys, fence: Fence) -> Self {
        EtcdStore::new(runtime, client, keys, Some(fence))
    }

    /// A standby's store: it reads what the leader wrote, and refuses every write with
    /// `NotLeader`, naming the leader.
    pub fn reader(runtime: Arc<StoreRuntime>, client: Client, keys: Keys) -> Self {
        EtcdStore::new(runtime, client, keys, None)
    }

    fn new(runtime: Arc<StoreRuntime>, client: Client, keys: Keys, fence: Option<Fence>) -> Self {
        EtcdStore {
            layout: layout::Layout::new(&keys),
            etcd: etcd::Etcd {
                runtime,
                client,
                keys,
                fence,
            },
        }
    }
}
