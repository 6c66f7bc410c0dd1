//! The schema and its forward migrations, versioned by `PRAGMA user_version`.
//!
//! `MIGRATIONS[i]` takes a database from version `i` to `i + 1`. A migration is never edited
//! once released: a change is a new entry. Each runs in one transaction together with the
//! version bump, so a service killed mid-migration reopens at the old version and runs it again.

use rusqlite::{Connection, TransactionBehavior};

use super::StoreError;

const MIGRATIONS: &[&str] = &[
    // 1: workloads, their replica processes, revisions, journal, events.
    r#"
    CREATE TABLE workloads (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        tenant TEXT NOT NULL,
        spec TEXT NOT NULL,
        origin TEXT NOT NULL CHECK (origin IN ('submitted', 'committed')),
        phase TEXT NOT NULL CHECK (phase IN ('pending', 'starting', 'running', 'checkpointing',
                                             'succeeded', 'failed', 'cancelled')),
        submitted_at INTEGER NOT NULL,
        started_at INTEGER,
        bindings TEXT NOT NULL DEFAULT '[]',
        checkpoint_dir TEXT,
        last_checkpoint_at INTEGER,
        signalled_at INTEGER,
        grace_deadline INTEGER,
        cancel_requested_at INTEGER,
        attempts INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
        ended_at INTEGER,
        end_reason TEXT,
        -- An ended workload says when and how; a live one says neither.
        CHECK ((phase IN ('succeeded', 'failed', 'cancelled'))
               = (ended_at IS NOT NULL AND end_reason IS NOT NULL)),
        CHECK ((ended_at IS NULL) = (end_reason IS NULL))
    );
    -- A name is taken while its workload lives; once it has ended the name may be reused and
    -- the old record stays as history.
    CREATE UNIQUE INDEX workloads_live_name ON workloads (name) WHERE ended_at IS NULL;
    CREATE INDEX workloads_name ON workloads (name, id);
    CREATE INDEX workloads_tenant ON workloads (tenant, id);

    CREATE TABLE replicas (
        workload_id INTEGER NOT NULL REFERENCES workloads (id) ON DELETE CASCADE,
        replica INTEGER NOT NULL CHECK (replica >= 0),
        pid INTEGER CHECK (pid > 0),
        devices TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (workload_id, replica)
    ) WITHOUT ROWID;
    CREATE INDEX replicas_pid ON replicas (pid) WHERE pid IS NOT NULL;

    CREATE TABLE revisions (
        id INTEGER PRIMARY KEY,
        commit_id TEXT NOT NULL,
        seen_at INTEGER NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('applied', 'rejected')),
        diagnostics TEXT NOT NULL DEFAULT '[]'
    );
    CREATE INDEX revisions_applied ON revisions (id) WHERE status = 'applied';

    -- AUTOINCREMENT: ids are never reused, even after pruning, so an id in a log stays unique.
    CREATE TABLE journal (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        cycle INTEGER NOT NULL CHECK (cycle >= 0),
        action TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('intent', 'done', 'failed')),
        begun_at INTEGER NOT NULL,
        ended_at INTEGER,
        error TEXT,
        CHECK ((state = 'intent') = (ended_at IS NULL)),
        CHECK ((state = 'failed') = (error IS NOT NULL))
    );
    CREATE INDEX journal_open ON journal (id) WHERE state = 'intent';

    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        kind TEXT NOT NULL,
        -- By name, not id: the log outlives pruned workload records.
        workload TEXT,
        message TEXT NOT NULL
    );
    CREATE INDEX events_workload ON events (workload, id) WHERE workload IS NOT NULL;
    "#,
    // 2: what one decision hands to the next: decayed fair-share usage and reservations.
    r#"
    CREATE TABLE carried (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        usage TEXT,
        reservations TEXT NOT NULL DEFAULT '[]',
        updated_at INTEGER NOT NULL
    );
    "#,
    // 3: a tenant's live workloads counted without reading its history (the API's cap on
    // submissions per tenant).
    r#"
    CREATE INDEX workloads_live_tenant ON workloads (tenant, origin) WHERE ended_at IS NULL;
    "#,
    // 4: workload names are per tenant. A live workload is unique by (tenant, name), no longer
    // by name; events say whose workload they are about. Rows written before keep working:
    // their live names were unique across tenants, so they are unique per tenant too, and an
    // event gets the tenant of the workload of its name that was submitted last at or before
    // it (the one it was about, since a name was held by one workload at a time).
    r#"
    DROP INDEX workloads_live_name;
    CREATE UNIQUE INDEX workloads_live_key ON workloads (tenant, name) WHERE ended_at IS NULL;
    DROP INDEX workloads_name;
    CREATE INDEX workloads_key ON workloads (tenant, name, id);
    ALTER TABLE events ADD COLUMN tenant TEXT;
    UPDATE events SET tenant = (
        SELECT w.tenant FROM workloads w
        WHERE w.name = events.workload AND w.submitted_at <= events.at
        ORDER BY w.id DESC LIMIT 1)
    WHERE workload IS NOT NULL;
    DROP INDEX events_workload;
    CREATE INDEX events_workload ON events (tenant, workload, id) WHERE workload IS NOT NULL;
    "#,
    // 5: the geometry changes of the last hour, so that a restart does not reset a GPU's
    // `maxPerGpuPerHour` budget.
    r#"
    ALTER TABLE carried ADD COLUMN reconfigurations TEXT NOT NULL DEFAULT '[]';
    "#,
    // 6: metering (`usage.rs`). A run is one placement of one workload record, from its start
    // to `metered_until`, which only moves forward: usage is never a sum of increments, so no
    // crash can count a second twice.
    r#"
    CREATE TABLE usage_runs (
        id INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        workload TEXT NOT NULL,
        submitted_at INTEGER NOT NULL,
        started_at INTEGER NOT NULL,
        pool TEXT NOT NULL,
        model TEXT NOT NULL,
        -- The MIG profile of its instances; NULL for whole GPUs and shares.
        profile TEXT,
        -- GPUs held, in the compiler's exact units (7000 per GPU).
        gpu_units INTEGER NOT NULL CHECK (gpu_units >= 0),
        -- Of which within the tenant's guarantee when admitted; NULL: not known (a run that
        -- began before this build metered it).
        guaranteed_units INTEGER CHECK (guaranteed_units BETWEEN 0 AND gpu_units),
        cpu_millicores INTEGER NOT NULL CHECK (cpu_millicores >= 0),
        memory_mib INTEGER NOT NULL CHECK (memory_mib >= 0),
        metered_until INTEGER NOT NULL CHECK (metered_until >= started_at),
        UNIQUE (tenant, workload, submitted_at, started_at)
    );
    CREATE INDEX usage_runs_until ON usage_runs (metered_until);

    -- The solver's split of an admission, kept until the run it starts is metered.
    CREATE TABLE usage_admissions (
        tenant TEXT NOT NULL,
        workload TEXT NOT NULL,
        submitted_at INTEGER NOT NULL,
        guaranteed_units INTEGER NOT NULL CHECK (guaranteed_units >= 0),
        borrowed_units INTEGER NOT NULL CHECK (borrowed_units >= 0),
        PRIMARY KEY (tenant, workload, submitted_at)
    ) WITHOUT ROWID;

    -- Free GPUs held idle for a waiting gang, charged to the gang's tenant. A spell is extended
    -- while the count stays the same.
    CREATE TABLE usage_reserved (
        id INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        workload TEXT NOT NULL,
        pool TEXT NOT NULL,
        gpus INTEGER NOT NULL CHECK (gpus > 0),
        start INTEGER NOT NULL,
        until INTEGER NOT NULL CHECK (until >= start)
    );
    CREATE INDEX usage_reserved_open ON usage_reserved (workload, pool, until);

    -- Work lost to a preemption: once per run.
    CREATE TABLE usage_preemptions (
        tenant TEXT NOT NULL,
        workload TEXT NOT NULL,
        submitted_at INTEGER NOT NULL,
        started_at INTEGER NOT NULL,
        pool TEXT NOT NULL,
        at INTEGER NOT NULL,
        -- GPU-seconds of work since the last checkpoint, in units (7000 per GPU).
        lost_unit_seconds INTEGER NOT NULL CHECK (lost_unit_seconds >= 0),
        PRIMARY KEY (tenant, workload, submitted_at, started_at)
    ) WITHOUT ROWID;

    -- The fleet-wide watermark of reserved-idle metering.
    CREATE TABLE usage_clock (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        reserved_until INTEGER NOT NULL
    );
    "#,
    // 7: retention (`retention.rs`) finds what ended before a cutoff without reading every
    // record or entry.
    r#"
    CREATE INDEX workloads_ended ON workloads (ended_at) WHERE ended_at IS NOT NULL;
    CREATE INDEX journal_closed ON journal (ended_at) WHERE state != 'intent';
    "#,
];

/// The schema version this build writes.
pub const CURRENT: u32 = MIGRATIONS.len() as u32;

pub fn version(conn: &Connection) -> Result<u32, StoreError> {
    let v: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    // user_version is a signed 32-bit header field; a negative one was not written by us.
    u32::try_from(v).map_err(|_| StoreError::CorruptValue {
        table: "pragma",
        column: "user_version",
        row: 0,
        value: v.to_string(),
    })
}

/// Applies every migration the database lacks; refuses a database from a newer build.
pub fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let found = version(conn)?;
    if found > CURRENT {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: CURRENT,
        });
    }
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
        // Another process may have migrated between our read and our lock.
        if version(&tx)? > from as u32 {
            continue;
        }
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", from as u32 + 1)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;
    use tessera_compiler::WorkloadKey;

    use super::MIGRATIONS;
    use crate::store::{Origin, Phase, Store, StoreError};

    const SPEC: &str = r#"{"tenant": "a", "sloClass": "batch", "gpu": {"count": 1}}"#;

    /// A database as the build before per-tenant names left it (schema version 3), with a
    /// live workload, an ended one of another tenant and their events.
    fn version_3(path: &std::path::Path) {
        let conn = Connection::open(path).unwrap();
        for sql in &MIGRATIONS[..3] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 3).unwrap();
        let spec_b = SPEC.replace(r#""a""#, r#""b""#);
        conn.execute_batch(&format!(
            "INSERT INTO workloads (name, tenant, spec, origin, phase, submitted_at, ended_at,
                                    end_reason)
             VALUES ('train', 'b', '{spec_b}', 'submitted', 'cancelled', 1, 2,
                     '{{\"kind\": \"cancelled\"}}');
             INSERT INTO workloads (name, tenant, spec, origin, phase, submitted_at)
             VALUES ('train', 'a', '{SPEC}', 'committed', 'pending', 3);
             INSERT INTO events (at, kind, workload, message)
             VALUES (1, 'submitted', 'train', 'b''s'), (2, 'cancelled', 'train', 'b''s'),
                    (3, 'submitted', 'train', 'a''s'), (4, 'revision-applied', NULL, 'x');"
        ))
        .unwrap();
    }

    #[test]
    fn a_version_3_database_migrates_to_names_per_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        version_3(&path);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), super::CURRENT);

        // The existing rows keep working, under their keys.
        let a = WorkloadKey::new("a", "train");
        let b = WorkloadKey::new("b", "train");
        assert_eq!(store.workload(&a).unwrap().phase, Phase::Pending);
        assert_eq!(store.workload(&b).unwrap().phase, Phase::Cancelled);
        // Each event got the tenant of the workload it was about.
        let about = |key: &WorkloadKey| -> Vec<String> {
            let events = store.workload_events(key, 0, 10).unwrap();
            events.into_iter().map(|e| e.message).collect()
        };
        assert_eq!(about(&a), ["a's"]);
        assert_eq!(about(&b), ["b's", "b's"]);
        let all = store.events(0, 10).unwrap();
        assert_eq!(
            all[3].tenant, None,
            "an event about no workload has no tenant"
        );

        // Live names are unique per tenant now, no longer across tenants.
        let spec_b = serde_json::from_str(&SPEC.replace(r#""a""#, r#""b""#)).unwrap();
        store
            .submit("train", &spec_b, Origin::Submitted, 5)
            .unwrap();
        let spec_a = serde_json::from_str(SPEC).unwrap();
        assert!(matches!(
            store.submit("train", &spec_a, Origin::Submitted, 6),
            Err(StoreError::Conflict(_))
        ));
    }
}
