//! The service's state in SQLite: workloads and their lifecycle ([`workloads`]), the policy
//! revisions seen ([`revisions`]), the write-ahead action journal ([`journal`]), the event
//! log ([`events`]), what one decision hands to the next ([`carried`]), metered usage
//! ([`usage`]), a batch of starts in two commits ([`starts`]), a batch of submissions in
//! one ([`submissions`]) and what retention deletes ([`retention`]).
//!
//! [`StateStore`] ([`state`]) is that state as one interface: the service, the API and metering
//! use it, and fleet mode implements it on etcd. What follows is the SQLite [`Store`].
//!
//! Every write is one `IMMEDIATE` transaction that checks what it changes (a workload's phase,
//! a journal entry's state) and appends its event before committing, so a service killed at
//! any point finds either the whole change or none of it. Nothing here reads a clock: every
//! call that records a time takes `now` (unix seconds), which keeps tests deterministic and
//! lets the caller use one instant for a whole cycle.
//!
//! Methods take `&self`: a [`Store`] is one connection, `Send` but not `Sync`, so callers that
//! share it across threads wrap it in a mutex, which already serialises the transactions.

pub mod carried;
#[cfg(any(test, feature = "contract"))]
pub mod contract;
pub mod events;
pub mod journal;
pub mod retention;
pub mod revisions;
mod schema;
pub mod starts;
pub mod state;
pub mod submissions;
pub mod usage;
pub mod workloads;

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, Transaction, TransactionBehavior};

pub use events::Event;
pub use journal::{ActionId, ActionState, Ended, JournalEntry};
pub use revisions::{RevisionRecord, RevisionStatus};
pub use state::{StateStore, StateStoreExt};
pub use workloads::{EndReason, Origin, Phase, ReplicaProcess, WorkloadRecord};

/// How long a write waits for another connection's transaction (a `sqlite3` shell, a second
/// service instance misconfigured onto the same file) before failing with `SQLITE_BUSY`.
/// Prepared statements kept per connection: more than the store has.
const STATEMENT_CACHE: usize = 256;

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// What a store call failed with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be created (or narrowed to) mode 0600.
    #[error("{path}: cannot make it private to the service (0600): {source}")]
    Private {
        path: String,
        source: std::io::Error,
    },
    /// The named workload (or journal action) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A workload of that name exists and has not ended.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The workload's phase does not allow the change; nothing was written.
    #[error("workload {workload:?} is {from}: cannot {action}")]
    IllegalTransition {
        workload: String,
        action: &'static str,
        from: Phase,
    },
    /// The journal action was already closed; nothing was written.
    #[error("journal action {id} is already {state}")]
    ActionClosed { id: ActionId, state: ActionState },
    /// The file was written by a newer build; opening it could lose what that build stores.
    #[error(
        "the database has schema version {found}, newer than this build's {supported}: \
         run the newer build or restore a backup"
    )]
    SchemaTooNew { found: u32, supported: u32 },
    /// A value does not fit SQLite's 64-bit signed integers.
    #[error("{what} is out of range: {value}")]
    OutOfRange { what: &'static str, value: u64 },
    /// A JSON column does not parse as what it should hold.
    #[error("corrupt JSON in {table}.{column} (row {row}): {source}")]
    CorruptJson {
        table: &'static str,
        column: &'static str,
        row: i64,
        source: serde_json::Error,
    },
    /// A text column holds a value outside its enumeration.
    #[error("corrupt value {value:?} in {table}.{column} (row {row})")]
    CorruptValue {
        table: &'static str,
        column: &'static str,
        row: i64,
        value: String,
    },
    /// A value could not be serialised to JSON.
    #[error("cannot encode {what} as JSON: {source}")]
    Encode {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// This replica does not lead (fleet mode), so the write was refused and nothing of it was
    /// applied: a deposed leader can never write.
    #[error(
        "this replica is not the leader: the write was refused{}",
        match leader { Some(l) => format!("; {l} leads now"), None => "; no leader now".to_string() }
    )]
    NotLeader { leader: Option<String> },
    /// A stored value (fleet mode: an etcd key) does not parse as what it should hold.
    #[error("corrupt value at {location}: {message}")]
    Corrupt { location: String, message: String },
    /// The backend that holds the state failed (fleet mode: etcd unreachable or failing, or
    /// writes that kept conflicting with another writer's).
    #[error("{what}: {source}")]
    Backend {
        what: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What a committed write survives. Both keep the file consistent whatever happens; they differ
/// in whether the last commits may be lost when the machine (not the service) goes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every commit survives a power cut: one fsync per commit (`synchronous=FULL`).
    #[default]
    PowerLoss,
    /// Every commit survives the service being killed at any point; a power cut may lose the
    /// last ones (`synchronous=NORMAL` in WAL mode: no fsync per commit). What the journal
    /// guards (processes, MIG instances) does not outlive a power cut either, but an
    /// acknowledged submission would be lost with it.
    ProcessCrash,
}

/// The SQLite state of one service instance.
pub struct Store {
    conn: Connection,
}

impl Store {
    /// Opens (creating if needed) the database at `path` with [`Durability::PowerLoss`], in
    /// WAL mode with foreign keys on, and migrates its schema forward.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, Durability::PowerLoss)
    }

    /// Like [`Store::open`], choosing what a commit must survive.
    pub fn open_with(path: &Path, durability: Durability) -> Result<Store, StoreError> {
        make_private(path).map_err(|source| StoreError::Private {
            path: path.display().to_string(),
            source,
        })?;
        let conn = Connection::open(path)?;
        // WAL lets readers (the API) proceed while the cycle writes. SQLite answers with the
        // mode in force: a filesystem without shared-memory support keeps the rollback
        // journal, which is still correct, only readers wait for writers.
        let _mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "wal", |r| r.get(0))?;
        let synchronous = match durability {
            Durability::PowerLoss => "full",
            Durability::ProcessCrash => "normal",
        };
        conn.pragma_update(None, "synchronous", synchronous)?;
        Store::init(conn)
    }

    /// A private database in memory (tests, dry runs).
    pub fn open_in_memory() -> Result<Store, StoreError> {
        Store::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<Store, StoreError> {
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // Every statement is prepared through the cache; rusqlite keeps 16 by default, fewer
        // than one arrival pass uses, so they were parsed again and again (a sixth of a
        // pass's time at the reference fleet was SQLite's parser).
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        conn.pragma_update(None, "foreign_keys", "on")?;
        let mut store = Store { conn };
        schema::migrate(&mut store.conn)?;
        Ok(store)
    }

    /// The schema version the database is at (`PRAGMA user_version`).
    pub fn schema_version(&self) -> Result<u32, StoreError> {
        schema::version(&self.conn)
    }

    /// Starts a read transaction: a record and its replicas read inside one come from the same
    /// snapshot, whatever another connection commits meanwhile.
    fn read(&self) -> Result<Transaction<'_>, StoreError> {
        Ok(Transaction::new_unchecked(
            &self.conn,
            TransactionBehavior::Deferred,
        )?)
    }

    /// Starts a write transaction. `IMMEDIATE` takes the write lock at once, so a transaction
    /// that reads then writes never fails half-way on a lock upgrade.
    fn write(&self) -> Result<Transaction<'_>, StoreError> {
        Ok(Transaction::new_unchecked(
            &self.conn,
            TransactionBehavior::Immediate,
        )?)
    }
}

/// Converts a count or identifier to SQLite's integer.
fn to_sql_int(what: &'static str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { what, value })
}

fn to_json<T: serde::Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|source| StoreError::Encode { what, source })
}

fn from_json<T: serde::de::DeserializeOwned>(
    table: &'static str,
    column: &'static str,
    row: i64,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|source| StoreError::CorruptJson {
        table,
        column,
        row,
        source,
    })
}

/// Creates the database file 0600, or narrows an existing one, before SQLite opens it: SQLite
/// creates its `-wal` and `-shm` files with the database's own mode, so they follow.
fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if path.as_os_str().is_empty() || path == Path::new(":memory:") {
        return Ok(());
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    for suffix in ["-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        match std::fs::set_permissions(&side, std::fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}
