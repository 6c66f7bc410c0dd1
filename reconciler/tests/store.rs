//! What only the SQLite store has: the journal across a reopen after a kill, migrations,
//! corrupt columns and the file's mode. The behaviour every backend shares (lifecycle, journal,
//! events, revisions, metering) is the contract in `store::contract`, run on SQLite by the
//! crate's unit tests.

use serde_json::json;
use tessera_reconciler::store::contract::{a, spec};
use tessera_reconciler::store::{ActionState, Durability, Origin, Phase, Store, StoreError};

#[test]
fn the_journal_shows_open_intents_after_a_reopen() {
    for durability in [Durability::PowerLoss, Durability::ProcessCrash] {
        journal_survives_a_killed_service(durability);
    }
}

fn journal_survives_a_killed_service(durability: Durability) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (done, failed, open1, open2);
    {
        let store = Store::open_with(&path, durability).unwrap();
        done = store
            .begin_action(7, &json!({"createGpuInstance": {"gpu": 0}}), 10)
            .unwrap();
        failed = store.begin_action(7, &json!({"start": "w"}), 11).unwrap();
        open1 = store
            .begin_action(7, &json!({"destroyGpuInstance": 3}), 12)
            .unwrap();
        open2 = store.begin_action(8, &json!({"signal": "w"}), 13).unwrap();
        store.complete_action(done, 14).unwrap();
        store.fail_action(failed, "NVML_ERROR_IN_USE", 15).unwrap();
        store
            .submit("w", &spec("a"), Origin::Submitted, 16)
            .unwrap();
        // Never closed, as with a killed service: what was committed sits in the WAL file.
        std::mem::forget(store);
    }
    let store = Store::open(&path).unwrap();
    let open = store.open_actions().unwrap();
    assert_eq!(
        open.iter().map(|e| e.id).collect::<Vec<_>>(),
        [open1, open2]
    );
    assert_eq!(open[0].cycle, 7);
    assert_eq!(open[0].action, json!({"destroyGpuInstance": 3}));
    assert_eq!(open[1].begun_at, 13);
    assert_eq!(store.workload(&a("w")).unwrap().phase, Phase::Pending);

    // The closed entries survived too, each in the state it was closed in. (Closing,
    // pruning and ids on a live store are the contract's, `store::contract`.)
    assert!(matches!(
        store.complete_action(done, 20),
        Err(StoreError::ActionClosed {
            state: ActionState::Done,
            ..
        })
    ));
    assert!(matches!(
        store.fail_action(failed, "again", 20),
        Err(StoreError::ActionClosed {
            state: ActionState::Failed,
            ..
        })
    ));
    let next = store.begin_action(9, &json!(null), 30).unwrap();
    assert!(next > open2, "ids are never reused after a reopen");
    assert!(matches!(
        store.begin_action(u64::MAX, &json!(null), 30),
        Err(StoreError::OutOfRange { .. })
    ));
}

#[test]
fn migrations_run_once_and_a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let version = {
        let store = Store::open(&path).unwrap();
        store.submit("w", &spec("a"), Origin::Submitted, 1).unwrap();
        store.schema_version().unwrap()
    };
    assert!(version >= 1);
    {
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), version);
        assert_eq!(
            store.list(None).unwrap().len(),
            1,
            "reopening keeps the data"
        );
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", version + 1)
        .unwrap();
    drop(conn);
    match Store::open(&path) {
        Err(StoreError::SchemaTooNew { found, supported }) => {
            assert_eq!((found, supported), (version + 1, version));
        }
        Err(e) => panic!("expected SchemaTooNew, got {e}"),
        Ok(_) => panic!("expected SchemaTooNew, the database opened"),
    }
}

#[test]
fn corrupt_json_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    Store::open(&path)
        .unwrap()
        .submit("w", &spec("a"), Origin::Submitted, 1)
        .unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("UPDATE workloads SET spec = '{not json'", [])
        .unwrap();
    drop(conn);
    let store = Store::open(&path).unwrap();
    assert!(matches!(
        store.workload(&a("w")),
        Err(StoreError::CorruptJson { column: "spec", .. })
    ));
}

#[test]
fn the_database_is_private_to_the_service() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    // A file left world-readable (an older build, a copy) is narrowed on open.
    std::fs::write(&path, "").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = Store::open(&path).unwrap();
    store.begin_action(1, &json!({"action": "x"}), 1).unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let file = dir.path().join(format!("t.db{suffix}"));
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }
}
