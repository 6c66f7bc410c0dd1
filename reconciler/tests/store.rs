//! The SQLite store: workload lifecycle, refused transitions, journal across a reopen,
//! migrations, tenant filtering, revisions and events.

use serde_json::json;
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{Binding, WorkloadSpec};
use tessera_reconciler::store::{
    ActionState, Durability, EndReason, Ended, Origin, Phase, ReplicaProcess, RevisionStatus,
    Store, StoreError, WorkloadRecord,
};

/// Tenant `a`'s workload `name`.
fn a(name: &str) -> WorkloadKey {
    WorkloadKey::new("a", name)
}

fn spec(tenant: &str) -> WorkloadSpec {
    serde_json::from_value(json!({
        "tenant": tenant,
        "sloClass": "batch",
        "replicas": 2,
        "gpu": {"migProfile": "1g.10gb"},
        "cpu": 4,
        "memory": "16Gi",
        "maxDuration": "2h",
        "command": ["python3", "train.py"],
        "env": {"EPOCHS": "3"}
    }))
    .expect("a valid workload spec")
}

fn bindings() -> Vec<Binding> {
    serde_json::from_value(json!([
        {"node": "node-a", "gpus": [0], "migStart": 0},
        {"node": "node-b", "gpus": [3], "migStart": 4}
    ]))
    .expect("valid bindings")
}

fn replicas(pids: [u32; 2]) -> Vec<ReplicaProcess> {
    pids.iter()
        .enumerate()
        .map(|(i, &pid)| ReplicaProcess {
            replica: i as u32,
            pid: Some(pid),
            devices: vec![format!("MIG-{i}")],
        })
        .collect()
}

fn kinds(store: &Store, workload: &str) -> Vec<String> {
    store
        .workload_events(&a(workload), 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

#[test]
fn a_workload_runs_is_preempted_resumes_and_succeeds() {
    let store = Store::open_in_memory().unwrap();
    let submitted = store
        .submit("train", &spec("a"), Origin::Submitted, 100)
        .unwrap();
    assert_eq!(submitted.phase, Phase::Pending);
    assert_eq!(submitted.tenant, "a");
    assert_eq!(
        submitted.spec,
        spec("a"),
        "the spec survives its JSON column"
    );

    let starting = store.mark_starting(&a("train"), &bindings(), 110).unwrap();
    assert_eq!(starting.phase, Phase::Starting);
    assert_eq!(starting.bindings, bindings());

    let running = store
        .mark_running(&a("train"), &replicas([41, 42]), 111)
        .unwrap();
    assert_eq!(running.phase, Phase::Running);
    assert_eq!(running.started_at, Some(111));
    assert_eq!(running.replicas, replicas([41, 42]));
    assert_eq!(
        store.workload_by_pid(42).unwrap().map(|r| r.name),
        Some("train".to_string())
    );

    let checkpointing = store.mark_checkpointing(&a("train"), 150, 120).unwrap();
    assert_eq!(checkpointing.phase, Phase::Checkpointing);
    assert_eq!(
        (checkpointing.signalled_at, checkpointing.grace_deadline),
        (Some(120), Some(150))
    );
    store
        .record_checkpoint(&a("train"), "/ckpt/train", 125)
        .unwrap();
    assert_eq!(store.replica_exited(&a("train"), 41, 126).unwrap(), 1);
    assert_eq!(store.replica_exited(&a("train"), 42, 127).unwrap(), 0);

    let requeued = store.requeue(&a("train"), "preempted", 128).unwrap();
    assert_eq!(requeued.phase, Phase::Pending);
    assert_eq!(requeued.attempts, 1);
    assert_eq!(requeued.checkpoint_dir.as_deref(), Some("/ckpt/train"));
    assert_eq!(requeued.last_checkpoint_at, Some(125));
    assert!(requeued.bindings.is_empty() && requeued.replicas.is_empty());
    assert_eq!(
        (
            requeued.started_at,
            requeued.signalled_at,
            requeued.grace_deadline
        ),
        (None, None, None)
    );
    assert_eq!(store.workload_by_pid(42).unwrap(), None);

    store.mark_starting(&a("train"), &bindings(), 200).unwrap();
    store
        .mark_running(&a("train"), &replicas([51, 52]), 201)
        .unwrap();
    let done = store
        .finish(&a("train"), EndReason::Exited { code: 0 }, 300)
        .unwrap();
    assert_eq!(done.phase, Phase::Succeeded);
    assert_eq!(done.ended_at, Some(300));
    assert_eq!(done.end, Some(EndReason::Exited { code: 0 }));
    assert_eq!(done.checkpoint_dir.as_deref(), Some("/ckpt/train"));
    assert!(store.live().unwrap().is_empty());

    assert_eq!(
        kinds(&store, "train"),
        [
            "submitted",
            "starting",
            "running",
            "checkpointing",
            "checkpointed",
            "replica-exited",
            "replica-exited",
            "requeued",
            "starting",
            "running",
            "succeeded"
        ]
    );
}

#[test]
fn end_reasons_give_their_phase() {
    let store = Store::open_in_memory().unwrap();
    let cases = [
        (EndReason::Exited { code: 3 }, Phase::Failed),
        (EndReason::Signalled { signal: 9 }, Phase::Failed),
        (EndReason::Unknown, Phase::Failed),
        (
            EndReason::Lost {
                node: "node-a".into(),
            },
            Phase::Failed,
        ),
        (EndReason::Cancelled, Phase::Cancelled),
    ];
    for (i, (reason, phase)) in cases.into_iter().enumerate() {
        let name = format!("w{i}");
        store
            .submit(&name, &spec("a"), Origin::Submitted, 1)
            .unwrap();
        store.mark_starting(&a(&name), &bindings(), 2).unwrap();
        store.mark_running(&a(&name), &replicas([7, 8]), 3).unwrap();
        let ended = store.finish(&a(&name), reason.clone(), 4).unwrap();
        assert_eq!((ended.phase, ended.end), (phase, Some(reason)));
    }
}

#[test]
fn a_queued_workload_can_be_rejected_by_a_policy_change() {
    let store = Store::open_in_memory().unwrap();
    store
        .submit("w", &spec("gone"), Origin::Submitted, 1)
        .unwrap();
    let reason = EndReason::Rejected {
        reason: "tenant gone was removed".into(),
    };
    let gone = WorkloadKey::new("gone", "w");
    let ended = store.finish(&gone, reason.clone(), 2).unwrap();
    assert_eq!((ended.phase, ended.end), (Phase::Failed, Some(reason)));
    let kinds: Vec<String> = store
        .workload_events(&gone, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["submitted", "failed"]);
}

#[test]
fn illegal_transitions_are_refused_and_change_nothing() {
    let store = Store::open_in_memory().unwrap();
    store.submit("w", &spec("a"), Origin::Submitted, 1).unwrap();
    let before = store.workload(&a("w")).unwrap();
    let events_before = store.events(0, 1000).unwrap();

    let refused: Vec<(&str, Result<WorkloadRecord, StoreError>)> = vec![
        (
            "run before start",
            store.mark_running(&a("w"), &replicas([1, 2]), 5),
        ),
        (
            "checkpoint while pending",
            store.mark_checkpointing(&a("w"), 9, 5),
        ),
        ("requeue while pending", store.requeue(&a("w"), "x", 5)),
        (
            "exit while pending",
            store.finish(&a("w"), EndReason::Exited { code: 0 }, 5),
        ),
        (
            "lost while pending",
            store.finish(&a("w"), EndReason::Lost { node: "n".into() }, 5),
        ),
        (
            "checkpoint recorded while pending",
            store.record_checkpoint(&a("w"), "/c", 5),
        ),
    ];
    for (what, result) in refused {
        match result {
            Err(StoreError::IllegalTransition { from, .. }) => {
                assert_eq!(from, Phase::Pending, "{what}")
            }
            other => panic!("{what}: expected an illegal transition, got {other:?}"),
        }
    }
    assert!(matches!(
        store.replica_exited(&a("w"), 1, 5),
        Err(StoreError::IllegalTransition { .. })
    ));
    assert_eq!(store.workload(&a("w")).unwrap(), before);
    assert_eq!(store.events(0, 1000).unwrap(), events_before);

    // Ended is final.
    store.mark_starting(&a("w"), &bindings(), 6).unwrap();
    store.mark_running(&a("w"), &replicas([1, 2]), 7).unwrap();
    store
        .finish(&a("w"), EndReason::Exited { code: 1 }, 8)
        .unwrap();
    let ended = store.workload(&a("w")).unwrap();
    let events_before = store.events(0, 1000).unwrap();
    assert!(matches!(
        store.mark_starting(&a("w"), &bindings(), 9),
        Err(StoreError::IllegalTransition {
            from: Phase::Failed,
            ..
        })
    ));
    assert!(matches!(
        store.finish(&a("w"), EndReason::Exited { code: 0 }, 9),
        Err(StoreError::IllegalTransition { .. })
    ));
    assert!(matches!(
        store.cancel(&a("w"), 9),
        Err(StoreError::IllegalTransition { .. })
    ));
    assert_eq!(store.workload(&a("w")).unwrap(), ended);
    assert_eq!(store.events(0, 1000).unwrap(), events_before);

    // An unknown pid of a running workload is refused too.
    store
        .submit("v", &spec("a"), Origin::Submitted, 10)
        .unwrap();
    store.mark_starting(&a("v"), &bindings(), 11).unwrap();
    store.mark_running(&a("v"), &replicas([3, 4]), 12).unwrap();
    assert!(matches!(
        store.replica_exited(&a("v"), 99, 13),
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.mark_running(&a("missing"), &[], 1),
        Err(StoreError::NotFound(_))
    ));
}

#[test]
fn names_conflict_while_live_and_are_reusable_after() {
    let store = Store::open_in_memory().unwrap();
    store.submit("w", &spec("a"), Origin::Submitted, 1).unwrap();
    assert!(matches!(
        store.submit("w", &spec("a"), Origin::Submitted, 2),
        Err(StoreError::Conflict(_))
    ));
    store.cancel(&a("w"), 3).unwrap();
    let again = store.submit("w", &spec("a"), Origin::Submitted, 4).unwrap();
    assert_eq!(again.phase, Phase::Pending);
    // The key's current record is the live one; the ended one stays as history.
    assert_eq!(store.workload(&a("w")).unwrap().phase, Phase::Pending);
    let all = store.list(None).unwrap();
    assert_eq!(
        all.iter().map(|r| r.phase).collect::<Vec<_>>(),
        [Phase::Cancelled, Phase::Pending]
    );
}

#[test]
fn names_are_per_tenant() {
    let store = Store::open_in_memory().unwrap();
    store
        .submit("train", &spec("a"), Origin::Committed, 1)
        .unwrap();
    // Another tenant's live `train` is no conflict, and says nothing of tenant a's.
    let theirs = store
        .submit("train", &spec("b"), Origin::Submitted, 2)
        .unwrap();
    assert_eq!(
        (theirs.tenant.as_str(), theirs.phase),
        ("b", Phase::Pending)
    );
    match store.submit("train", &spec("b"), Origin::Submitted, 3) {
        Err(StoreError::Conflict(message)) => {
            assert!(message.contains("\"b\""), "{message}");
            assert!(!message.contains("\"a\""), "{message}");
        }
        other => panic!("expected a conflict in tenant b, got {other:?}"),
    }
    let b = WorkloadKey::new("b", "train");
    // Each key's transitions and events are its own.
    store.cancel(&b, 4).unwrap();
    assert_eq!(store.workload(&a("train")).unwrap().phase, Phase::Pending);
    assert_eq!(store.workload(&b).unwrap().phase, Phase::Cancelled);
    assert_eq!(kinds(&store, "train"), ["submitted"]);
    assert_eq!(
        store
            .workload_events(&b, 0, 100)
            .unwrap()
            .into_iter()
            .map(|e| (e.kind, e.tenant))
            .collect::<Vec<_>>(),
        [
            ("submitted".to_string(), Some("b".to_string())),
            ("cancelled".to_string(), Some("b".to_string()))
        ]
    );
    assert_eq!(store.tenants_with("train").unwrap(), ["a", "b"]);
    assert!(store.tenants_with("nothing").unwrap().is_empty());
    // Committed records are per key too: tenant b's submission is not tenant a's history.
    let committed: Vec<String> = store
        .committed()
        .unwrap()
        .iter()
        .map(|r| r.key().to_string())
        .collect();
    assert_eq!(committed, ["a/train"]);
}

#[test]
fn cancel_ends_a_queued_workload_and_waits_for_a_running_one() {
    let store = Store::open_in_memory().unwrap();
    store
        .submit("queued", &spec("a"), Origin::Submitted, 1)
        .unwrap();
    let c = store.cancel(&a("queued"), 2).unwrap();
    assert_eq!(
        (c.phase, c.end.clone(), c.ended_at),
        (Phase::Cancelled, Some(EndReason::Cancelled), Some(2))
    );
    // Cancelling again is harmless.
    assert_eq!(store.cancel(&a("queued"), 3).unwrap(), c);

    store
        .submit("busy", &spec("a"), Origin::Submitted, 1)
        .unwrap();
    store.mark_starting(&a("busy"), &bindings(), 2).unwrap();
    store
        .mark_running(&a("busy"), &replicas([5, 6]), 3)
        .unwrap();
    let requested = store.cancel(&a("busy"), 4).unwrap();
    assert_eq!(
        requested.phase,
        Phase::Running,
        "it holds its GPUs until stopped"
    );
    assert_eq!(requested.cancel_requested_at, Some(4));
    assert_eq!(
        store.cancel(&a("busy"), 5).unwrap().cancel_requested_at,
        Some(4)
    );
    assert_eq!(
        store
            .cancel_requested()
            .unwrap()
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["busy"]
    );
    // Stopped through a requeue (a preemption racing the cancel): it ends cancelled.
    let stopped = store.requeue(&a("busy"), "stopped", 6).unwrap();
    assert_eq!(
        (stopped.phase, stopped.end.clone()),
        (Phase::Cancelled, Some(EndReason::Cancelled))
    );
    assert!(store.cancel_requested().unwrap().is_empty());
    assert_eq!(
        kinds(&store, "busy"),
        [
            "submitted",
            "starting",
            "running",
            "cancel-requested",
            "cancelled"
        ]
    );
}

#[test]
fn tenants_see_only_their_workloads() {
    let store = Store::open_in_memory().unwrap();
    for (name, tenant) in [("a1", "a"), ("b1", "b"), ("a2", "a")] {
        store
            .submit(name, &spec(tenant), Origin::Submitted, 1)
            .unwrap();
    }
    let names = |tenant| {
        store
            .list(tenant)
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(names(Some("a")), ["a1", "a2"]);
    assert_eq!(names(Some("b")), ["b1"]);
    assert!(names(Some("c")).is_empty());
    assert_eq!(names(None), ["a1", "b1", "a2"]);
}

#[test]
fn committed_lists_the_current_record_of_each_committed_name() {
    let store = Store::open_in_memory().unwrap();
    store
        .submit("nightly", &spec("a"), Origin::Committed, 1)
        .unwrap();
    store
        .submit("adhoc", &spec("a"), Origin::Submitted, 1)
        .unwrap();
    store.cancel(&a("nightly"), 2).unwrap();
    store
        .submit("nightly", &spec("a"), Origin::Committed, 3)
        .unwrap();
    store
        .submit("done", &spec("a"), Origin::Committed, 4)
        .unwrap();
    store.cancel(&a("done"), 5).unwrap();
    let committed: Vec<(String, Phase)> = store
        .committed()
        .unwrap()
        .into_iter()
        .map(|r| (r.name, r.phase))
        .collect();
    assert_eq!(
        committed,
        [
            ("nightly".to_string(), Phase::Pending),
            ("done".to_string(), Phase::Cancelled)
        ]
    );
}

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

    // Closing twice is refused; an unknown id is not found.
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
    assert!(matches!(
        store.complete_action(9999, 20),
        Err(StoreError::NotFound(_))
    ));

    store.fail_action(open1, "interrupted", 21).unwrap();
    store.complete_action(open2, 21).unwrap();
    assert!(store.open_actions().unwrap().is_empty());
    assert_eq!(
        store.prune_journal(15).unwrap(),
        1,
        "only the entry closed before 15"
    );
    assert_eq!(store.prune_journal(100).unwrap(), 3);
    let next = store.begin_action(9, &json!(null), 30).unwrap();
    assert!(next > open2, "ids are never reused");
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
fn revisions_record_the_last_applied() {
    let store = Store::open_in_memory().unwrap();
    assert_eq!(store.last_applied().unwrap(), None);
    store
        .record_revision("aaa", RevisionStatus::Applied, &json!([]), 1)
        .unwrap();
    store
        .record_revision(
            "bbb",
            RevisionStatus::Rejected,
            &json!([{"code": "E001", "message": "bad"}]),
            2,
        )
        .unwrap();
    let last = store.last_applied().unwrap().unwrap();
    assert_eq!((last.commit.as_str(), last.seen_at), ("aaa", 1));
    let all = store.revisions(10).unwrap();
    assert_eq!(
        all.iter()
            .map(|r| (r.commit.as_str(), r.status))
            .collect::<Vec<_>>(),
        [
            ("bbb", RevisionStatus::Rejected),
            ("aaa", RevisionStatus::Applied)
        ]
    );
    assert_eq!(all[0].diagnostics[0]["code"], "E001");
    let kinds: Vec<String> = store
        .events(0, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["revision-applied", "revision-rejected"]);
}

#[test]
fn events_page_by_id() {
    let store = Store::open_in_memory().unwrap();
    for i in 0..5 {
        store
            .record_event("node-lost", None, &format!("node-{i}"), i)
            .unwrap();
    }
    let first = store.events(0, 2).unwrap();
    assert_eq!(
        first.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(),
        ["node-0", "node-1"]
    );
    let rest = store.events(first[1].id, 10).unwrap();
    assert_eq!(rest.len(), 3);
    assert_eq!((rest[0].at, rest[0].workload.as_deref()), (2, None));
}

#[test]
fn interrupted_starts_are_counted_per_workload_since_its_submission() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("t.db")).unwrap();
    let interrupted = "interrupted: the service stopped";
    let start = |w: &str| json!({"action": "start", "workload": format!("a/{w}"), "bindings": []});
    let close = |action: serde_json::Value, at: i64, error: &str| {
        let id = store.begin_action(1, &action, at).unwrap();
        store.fail_action(id, error, at).unwrap();
    };
    close(start("crasher"), 5, interrupted); // before this submission: not counted
    close(start("crasher"), 10, interrupted);
    close(start("crasher"), 11, "start failed: no such command"); // failed, not interrupted
    close(start("other"), 12, interrupted);
    close(
        json!({"action": "stop", "workload": "a/crasher", "reason": "x"}),
        13,
        interrupted,
    );
    close(start("crasher"), 14, interrupted);
    let done = store.begin_action(1, &start("crasher"), 15).unwrap();
    store.complete_action(done, 15).unwrap();
    assert_eq!(
        store
            .interrupted_starts(&a("crasher"), 10, interrupted)
            .unwrap(),
        2
    );
    assert_eq!(
        store
            .interrupted_starts(&a("other"), 0, interrupted)
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .interrupted_starts(&a("nobody"), 0, interrupted)
            .unwrap(),
        0
    );
    // Another tenant's workload of the same name has its own count.
    assert_eq!(
        store
            .interrupted_starts(&WorkloadKey::new("b", "crasher"), 0, interrupted)
            .unwrap(),
        0
    );
    // A start journaled before names were per tenant names the workload alone.
    close(
        json!({"action": "start", "workload": "old", "bindings": []}),
        20,
        interrupted,
    );
    assert_eq!(
        store.interrupted_starts(&a("old"), 0, interrupted).unwrap(),
        1
    );
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

#[test]
fn a_tenants_live_submissions_are_counted_apart_from_committed_and_ended_ones() {
    let store = Store::open_in_memory().unwrap();
    store
        .submit("a1", &spec("a"), Origin::Submitted, 1)
        .unwrap();
    store
        .submit("a2", &spec("a"), Origin::Submitted, 1)
        .unwrap();
    store
        .submit("a3", &spec("a"), Origin::Committed, 1)
        .unwrap();
    store
        .submit("b1", &spec("b"), Origin::Submitted, 1)
        .unwrap();
    assert_eq!(store.live_submitted("a").unwrap(), 2);
    store.cancel(&a("a1"), 2).unwrap();
    assert_eq!(store.live_submitted("a").unwrap(), 1);
    assert_eq!(store.live_submitted("b").unwrap(), 1);
    assert_eq!(store.live_submitted("nobody").unwrap(), 0);
}

#[test]
fn a_workloads_recent_events_are_the_last_ones_oldest_first() {
    let store = Store::open_in_memory().unwrap();
    store.submit("w", &spec("a"), Origin::Submitted, 1).unwrap();
    store.cancel(&a("w"), 2).unwrap();
    store.submit("w", &spec("a"), Origin::Submitted, 3).unwrap();
    store
        .submit("other", &spec("a"), Origin::Submitted, 4)
        .unwrap();
    let kinds = |limit| -> Vec<String> {
        store
            .recent_workload_events(&a("w"), limit)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect()
    };
    assert_eq!(kinds(10), ["submitted", "cancelled", "submitted"]);
    assert_eq!(kinds(2), ["cancelled", "submitted"]);
}

/// A cycle checks only the started workloads that declare a `maxDuration` against it.
#[test]
fn only_started_workloads_with_a_max_duration_are_checked_against_it() {
    let store = Store::open_in_memory().unwrap();
    let mut unlimited = spec("a");
    unlimited.max_duration = None;
    store
        .submit("limited", &spec("a"), Origin::Submitted, 100)
        .unwrap();
    store
        .submit("unlimited", &unlimited, Origin::Submitted, 100)
        .unwrap();
    store
        .submit("waiting", &spec("a"), Origin::Submitted, 100)
        .unwrap();
    assert!(store.live_with_max_duration().unwrap().is_empty());
    for name in ["limited", "unlimited"] {
        store.mark_starting(&a(name), &bindings(), 110).unwrap();
        store
            .mark_running(&a(name), &replicas([7, 8]), 110)
            .unwrap();
    }
    let names: Vec<String> = store
        .live_with_max_duration()
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["limited"]);
}

/// One commit closes an action and opens the next; a close that is refused opens nothing.
#[test]
fn an_action_is_closed_with_the_next_ones_intent_or_not_at_all() {
    let store = Store::open_in_memory().unwrap();
    let first = store.begin_action(1, &json!({"start": "a"}), 10).unwrap();
    let second = store
        .close_and_begin((first, Ended::Done), 1, &json!({"start": "b"}), 11)
        .unwrap();
    let third = store
        .close_and_begin(
            (second, Ended::Failed("no such device")),
            1,
            &json!({"start": "c"}),
            12,
        )
        .unwrap();
    let open: Vec<i64> = store.open_actions().unwrap().iter().map(|e| e.id).collect();
    assert_eq!(open, [third]);
    // `first` is closed already: nothing is recorded, `third` stays the only open action.
    let e = store
        .close_and_begin((first, Ended::Done), 1, &json!({"start": "d"}), 13)
        .unwrap_err();
    assert!(
        matches!(e, StoreError::ActionClosed { id, state: ActionState::Done } if id == first),
        "{e}"
    );
    let open: Vec<i64> = store.open_actions().unwrap().iter().map(|e| e.id).collect();
    assert_eq!(open, [third]);
    store.close(third, Ended::Done, 14).unwrap();
    assert!(store.open_actions().unwrap().is_empty());
}
