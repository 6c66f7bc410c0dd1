//! The etcd primitives the store is written in: reads (one key, several keys at one revision,
//! a prefix in pages at one revision) and fenced commits, each a blocking call on the store's
//! own runtime.

use std::future::Future;
use std::sync::Arc;

use etcd_client::{Client, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use tessera_reconciler::store::StoreError;

use crate::FleetError;
use crate::election::{Fence, Guard, Write, current_leader};
use crate::error::TimedOut;
use crate::keys::Keys;

/// etcd's default `--max-txn-ops`: the most operations (and, separately, compares) one
/// transaction may carry.
pub const MAX_TXN_OPS: usize = 128;

/// etcd's default `--max-request-bytes` (1.5 MiB). A commit stays under it with room for the
/// keys and framing the payload sizes do not count.
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;

/// Room left under [`MAX_REQUEST_BYTES`] for what a commit's value sizes do not count.
const REQUEST_MARGIN: usize = 64 * 1024;

/// Keys read per page of a range: pages stay far below gRPC's message limit whatever a value
/// holds, while a range of thousands of keys takes a handful of round trips.
const PAGE: i64 = 500;

/// The runtime the blocking facade runs etcd's async client on. The store owns one instead of
/// borrowing the caller's: its callers are a plain thread (the reconcile cycle) and tokio's
/// blocking pool (the API's `spawn_blocking`), neither of which may drive a future on the
/// caller's runtime, and a store call must neither wait for nor starve the API's workers. One
/// worker thread is enough: every call blocks its caller until etcd answers, so the runtime
/// only carries the gRPC connection's own tasks and the futures being waited on.
pub struct StoreRuntime {
    runtime: Option<tokio::runtime::Runtime>,
}

impl StoreRuntime {
    pub fn new() -> std::io::Result<Arc<StoreRuntime>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tessera-etcd-store")
            .enable_all()
            .build()?;
        Ok(Arc::new(StoreRuntime {
            runtime: Some(runtime),
        }))
    }

    /// Runs `future` to completion, blocking this thread. Not from inside an async task (tokio
    /// refuses that); the service calls the store from threads that may block.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime
            .as_ref()
            .expect("the runtime lives until drop")
            .block_on(future)
    }
}

impl Drop for StoreRuntime {
    fn drop(&mut self) {
        // The last handle may be dropped on an async worker (an API handler's state), where
        // a blocking shutdown would panic.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Why one attempt at a read-check-write did not commit.
pub(super) enum Attempt {
    /// A key it read changed before the commit (another writer of this leader, e.g. the API
    /// and the cycle): read again and retry.
    Conflict,
    Failed(StoreError),
}

impl From<StoreError> for Attempt {
    fn from(e: StoreError) -> Attempt {
        Attempt::Failed(e)
    }
}

/// How often a write is retried after conflicts before giving up: writers are one leader's
/// API and cycle, so a conflict is rare and a second one rarer still.
const ATTEMPTS: usize = 16;

/// The connection, the key layout and the fence of one store.
#[derive(Clone)]
pub(super) struct Etcd {
    pub runtime: Arc<StoreRuntime>,
    pub client: Client,
    pub keys: Keys,
    /// `None` for a standby's store: it reads, and refuses every write.
    pub fence: Option<Fence>,
}

/// A read of several keys at one revision: the value found for each (`None`: absent).
pub(super) type Found = Vec<Option<KeyValue>>;

impl Etcd {
    fn block<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Runs `attempt` until it commits, fails, or has conflicted [`ATTEMPTS`] times.
    pub fn retrying<T>(
        &self,
        what: &str,
        mut attempt: impl FnMut() -> Result<T, Attempt>,
    ) -> Result<T, StoreError> {
        for _ in 0..ATTEMPTS {
            match attempt() {
                Ok(value) => return Ok(value),
                Err(Attempt::Conflict) => continue,
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
        Err(StoreError::Backend {
            what: format!("etcd: {what}"),
            source: format!("{ATTEMPTS} attempts in a row conflicted with other writes").into(),
        })
    }

    /// The keys `keys`, all at one revision (one read-only transaction per
    /// [`MAX_TXN_OPS`] keys; later chunks are pinned to the first one's revision).
    pub fn get_many(&self, keys: &[String]) -> Result<Found, StoreError> {
        let mut found = Vec::with_capacity(keys.len());
        let mut revision = 0;
        for chunk in keys.chunks(MAX_TXN_OPS) {
            let options = (revision > 0).then(|| GetOptions::new().with_revision(revision));
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|k| TxnOp::get(k.as_str(), options.clone()))
                .collect();
            let mut client = self.client.clone();
            let first = chunk.first().map_or("", String::as_str);
            let answer = self
                .block(client.txn(Txn::new().and_then(ops)))
                .map_err(|e| backend("read", first, e))?;
            if revision == 0 {
                revision = answer.header().map_or(0, |h| h.revision());
            }
            for response in answer.op_responses() {
                found.push(match response {
                    TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                    _ => None,
                });
            }
        }
        Ok(found)
    }

    pub fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        Ok(self.get_many(&[key.to_string()])?.pop().flatten())
    }

    /// Every key under `prefix`, in key order (descending when `newest_first`), at most `limit`
    /// (`None`: all), read in pages at the first page's revision.
    pub fn range(
        &self,
        prefix: &str,
        limit: Option<usize>,
        newest_first: bool,
    ) -> Result<Vec<KeyValue>, StoreError> {
        Ok(self
            .pages(prefix, prefix.as_bytes().to_vec(), limit, newest_first, 0)?
            .0)
    }

    /// `key` and the revision it was read at, so that a later read can be pinned to it.
    pub fn get_with_revision(&self, key: &str) -> Result<(Option<KeyValue>, i64), StoreError> {
        let mut client = self.client.clone();
        let answer = self
            .block(client.get(key, None))
            .map_err(|e| backend("read", key, e))?;
        let revision = answer.header().map_or(0, |h| h.revision());
        Ok((answer.kvs().first().cloned(), revision))
    }

    /// Every key under `prefix`, ascending, at `revision` (as etcd held it then).
    pub fn range_at(&self, prefix: &str, revision: i64) -> Result<Vec<KeyValue>, StoreError> {
        Ok(self
            .pages(prefix, prefix.as_bytes().to_vec(), None, false, revision)?
            .0)
    }

    /// Like [`Etcd::range`] ascending, from `start` (inclusive, a key under `prefix`) on.
    pub fn range_from(
        &self,
        prefix: &str,
        start: &str,
        limit: Option<usize>,
    ) -> Result<Vec<KeyValue>, StoreError> {
        Ok(self
            .pages(prefix, start.as_bytes().to_vec(), limit, false, 0)?
            .0)
    }

    fn pages(
        &self,
        prefix: &str,
        mut low: Vec<u8>,
        limit: Option<usize>,
        newest_first: bool,
        mut revision: i64,
    ) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let mut high = prefix_end(prefix);
        let mut out: Vec<KeyValue> = Vec::new();
        loop {
            let want = limit.map_or(PAGE, |l| (l - out.len()).min(PAGE as usize) as i64);
            if want == 0 {
                break;
            }
            let mut options = GetOptions::new()
                .with_range(high.clone())
                .with_limit(want)
                .with_sort(
                    SortTarget::Key,
                    if newest_first {
                        SortOrder::Descend
                    } else {
                        SortOrder::Ascend
                    },
                );
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut client = self.client.clone();
            let answer = self
                .block(client.get(low.clone(), Some(options)))
                .map_err(|e| backend("range read", prefix, e))?;
            if revision == 0 {
                revision = answer.header().map_or(0, |h| h.revision());
            }
            let kvs = answer.kvs();
            let more = answer.more();
            let Some(last) = kvs.last() else { break };
            if newest_first {
                high = last.key().to_vec();
            } else {
                low = last.key().to_vec();
                low.push(0);
            }
            out.extend_from_slice(kvs);
            if !more {
                break;
            }
        }
        Ok((out, revision))
    }

    /// Applies `writes` if this store's term still leads and every guard holds. Refuses what
    /// etcd would refuse (too many operations, too large a request) before sending it.
    pub fn commit(&self, guards: &[Guard], writes: &[Write]) -> Result<(), Attempt> {
        let Some(fence) = &self.fence else {
            return Err(Attempt::Failed(self.not_leader()));
        };
        if writes.is_empty() {
            return Ok(());
        }
        let first = match &writes[0] {
            Write::Put { key, .. } | Write::Delete { key } => key.clone(),
        };
        // The fence is one compare more than the guards.
        if writes.len() > MAX_TXN_OPS || guards.len() + 1 > MAX_TXN_OPS {
            return Err(Attempt::Failed(StoreError::Backend {
                what: format!("etcd: write at {first}"),
                source: format!(
                    "{} writes and {} guards exceed etcd's {MAX_TXN_OPS} operations per \
                     transaction",
                    writes.len(),
                    guards.len()
                )
                .into(),
            }));
        }
        let bytes: usize = writes
            .iter()
            .map(|w| match w {
                Write::Put { key, value } => key.len() + value.len(),
                Write::Delete { key } => key.len(),
            })
            .sum();
        if bytes + REQUEST_MARGIN > MAX_REQUEST_BYTES {
            return Err(Attempt::Failed(StoreError::Backend {
                what: format!("etcd: write at {first}"),
                source: format!(
                    "{bytes} bytes exceed etcd's request limit of {MAX_REQUEST_BYTES} bytes"
                )
                .into(),
            }));
        }
        match self.block(fence.write(&self.client, guards, writes)) {
            Ok(_) => Ok(()),
            Err(FleetError::Conflict { .. }) => Err(Attempt::Conflict),
            Err(FleetError::Deposed { now, .. }) => {
                Err(Attempt::Failed(StoreError::NotLeader { leader: now }))
            }
            Err(FleetError::TimedOut { source, .. }) => Err(Attempt::Failed(StoreError::Backend {
                what: format!("etcd write at {first}"),
                source: Box::new(source),
            })),
            Err(e) => Err(Attempt::Failed(StoreError::Backend {
                what: format!("etcd: write at {first}"),
                source: Box::new(e),
            })),
        }
    }

    /// The refusal of a write by a store without a fence, naming the leader when there is one.
    fn not_leader(&self) -> StoreError {
        let leader = self
            .block(current_leader(&self.client, &self.keys))
            .ok()
            .flatten()
            .map(|l| l.to_string());
        StoreError::NotLeader { leader }
    }
}

/// The first key after every key that starts with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A failed request as the store reports it; one etcd did not answer in time says so
/// ([`TimedOut`]), whatever tonic's error would.
pub(super) fn backend(op: &str, key: &str, e: etcd_client::Error) -> StoreError {
    let source: Box<dyn std::error::Error + Send + Sync> = match TimedOut::of(&e) {
        Some(timed_out) => Box::new(timed_out),
        None => Box::new(e),
    };
    StoreError::Backend {
        what: format!("etcd {op} at {key}"),
        source,
    }
}

/// The guard for a key as it was read: unchanged since, or still absent.
pub(super) fn unchanged(key: &str, found: Option<&KeyValue>) -> Guard {
    match found {
        Some(kv) => Guard::Unchanged {
            key: key.to_string(),
            mod_revision: kv.mod_revision(),
        },
        None => Guard::Absent {
            key: key.to_string(),
        },
    }
}

pub(super) fn put(key: String, value: Vec<u8>) -> Write {
    Write::Put { key, value }
}

pub(super) fn delete(key: String) -> Write {
    Write::Delete { key }
}
