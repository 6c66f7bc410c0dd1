//! The contract every [`StateStore`] keeps, as test cases written once against the trait: the
//! SQLite [`Store`](super::Store) runs them in this crate's tests, fleet mode's etcd store in
//! `tessera-fleet`'s. Each case takes an empty store and panics (an assertion) where the
//! backend departs from the contract. [`CASES`] lists them for a backend that runs them in a
//! loop (one etcd for all, each case under its own prefix).
//!
//! Built with the crate's `contract` feature (and in its own tests); it is test code, never
//! part of a service.

use serde_json::json;
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{Binding, ReconfigurationRecord, ReservationRecord, WorkloadSpec};
use tessera_compiler::units::Gpus;

use super::carried::Carried;
use super::starts::{StartDone, StartIntent};
use super::usage::{NewRun, ReservedSpell, RunKey, UsageRow};
use super::{
    ActionState, EndReason, Ended, Origin, Phase, ReplicaProcess, RevisionStatus, StateStore,
    StateStoreExt, StoreError, WorkloadRecord,
};

/// Declares the cases: [`CASES`], and one test per case on an in-memory SQLite store.
macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        /// Every case, by name.
        pub const CASES: &[(&str, fn(&dyn StateStore))] = &[$((stringify!($case), $case)),*];

        #[cfg(test)]
        mod on_sqlite {
            $(
                #[test]
                fn $case() {
                    super::$case(&crate::store::Store::open_in_memory().unwrap());
                }
            )*
        }
    };
}

cases!(
    a_workload_runs_is_preempted_resumes_and_succeeds,
    end_reasons_give_their_phase,
    a_queued_workload_can_be_rejected_by_a_policy_change,
    illegal_transitions_are_refused_and_change_nothing,
    names_conflict_while_live_and_are_reusable_after,
    names_are_per_tenant,
    cancel_ends_a_queued_workload_and_waits_for_a_running_one,
    tenants_see_only_their_workloads,
    committed_lists_the_current_record_of_each_committed_name,
    the_journal_keeps_open_intents_and_closes_each_once,
    an_action_is_closed_with_the_next_ones_intent_or_not_at_all,
    interrupted_starts_are_counted_per_workload_since_its_submission,
    revisions_record_the_last_applied,
    events_page_by_id,
    events_are_in_commit_order_across_kinds,
    a_tenants_live_submissions_are_counted_apart_from_committed_and_ended_ones,
    a_workloads_recent_events_are_the_last_ones_oldest_first,
    only_started_workloads_with_a_max_duration_are_checked_against_it,
    carried_is_empty_before_the_first_decision_then_what_was_set,
    runs_are_metered_as_intervals_split_by_admission_and_clipped_to_the_window,
    metering_a_run_again_never_counts_a_second_twice,
    reserved_idle_is_charged_once_between_decisions,
    a_batch_of_starts_is_two_commits_and_ends_closed,
    a_batch_of_starts_with_a_workload_no_longer_pending_writes_nothing,
    retention_deletes_ended_workloads_and_old_events_and_keeps_the_live,
    retention_of_usage_keeps_every_window_after_the_cutoff_and_runs_still_metered,
);

/// Tenant `a`'s workload `name`. Public, with [`spec`], for the backends' own tests.
pub fn a(name: &str) -> WorkloadKey {
    WorkloadKey::new("a", name)
}

/// A two-replica MIG workload of `tenant`, with a maximum duration, a command and an
/// environment.
pub fn spec(tenant: &str) -> WorkloadSpec {
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

fn kinds(store: &dyn StateStore, workload: &str) -> Vec<String> {
    store
        .workload_events(&a(workload), 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

pub fn a_workload_runs_is_preempted_resumes_and_succeeds(store: &dyn StateStore) {
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
        kinds(store, "train"),
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

pub fn end_reasons_give_their_phase(store: &dyn StateStore) {
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

pub fn a_queued_workload_can_be_rejected_by_a_policy_change(store: &dyn StateStore) {
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

pub fn illegal_transitions_are_refused_and_change_nothing(store: &dyn StateStore) {
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

pub fn names_conflict_while_live_and_are_reusable_after(store: &dyn StateStore) {
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
    let ended = store.ended(&a("w"), 10).unwrap();
    assert_eq!(
        ended
            .iter()
            .map(|r| (r.phase, r.submitted_at))
            .collect::<Vec<_>>(),
        [(Phase::Cancelled, 1)]
    );
    assert!(store.ended(&a("w"), 0).unwrap().is_empty());
}

pub fn names_are_per_tenant(store: &dyn StateStore) {
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
    assert_eq!(kinds(store, "train"), ["submitted"]);
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

pub fn cancel_ends_a_queued_workload_and_waits_for_a_running_one(store: &dyn StateStore) {
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
        kinds(store, "busy"),
        [
            "submitted",
            "starting",
            "running",
            "cancel-requested",
            "cancelled"
        ]
    );
}

pub fn tenants_see_only_their_workloads(store: &dyn StateStore) {
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

pub fn committed_lists_the_current_record_of_each_committed_name(store: &dyn StateStore) {
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

pub fn revisions_record_the_last_applied(store: &dyn StateStore) {
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

pub fn events_page_by_id(store: &dyn StateStore) {
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

pub fn interrupted_starts_are_counted_per_workload_since_its_submission(store: &dyn StateStore) {
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

pub fn a_tenants_live_submissions_are_counted_apart_from_committed_and_ended_ones(
    store: &dyn StateStore,
) {
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

pub fn a_workloads_recent_events_are_the_last_ones_oldest_first(store: &dyn StateStore) {
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

pub fn only_started_workloads_with_a_max_duration_are_checked_against_it(store: &dyn StateStore) {
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

pub fn an_action_is_closed_with_the_next_ones_intent_or_not_at_all(store: &dyn StateStore) {
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

/// Open intents are listed oldest first until closed; each is closed once; pruning drops only
/// closed entries; ids only grow.
pub fn the_journal_keeps_open_intents_and_closes_each_once(store: &dyn StateStore) {
    let done = store
        .begin_action(7, &json!({"createGpuInstance": {"gpu": 0}}), 10)
        .unwrap();
    let failed = store.begin_action(7, &json!({"start": "w"}), 11).unwrap();
    let open1 = store
        .begin_action(7, &json!({"destroyGpuInstance": 3}), 12)
        .unwrap();
    let open2 = store.begin_action(8, &json!({"signal": "w"}), 13).unwrap();
    assert!(done < failed && failed < open1 && open1 < open2, "ids grow");
    store.complete_action(done, 14).unwrap();
    store.fail_action(failed, "NVML_ERROR_IN_USE", 15).unwrap();

    let open = store.open_actions().unwrap();
    assert_eq!(
        open.iter().map(|e| e.id).collect::<Vec<_>>(),
        [open1, open2]
    );
    assert_eq!(open[0].cycle, 7);
    assert_eq!(open[0].action, json!({"destroyGpuInstance": 3}));
    assert_eq!(open[1].begun_at, 13);

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
    let open3 = store.begin_action(9, &json!({"start": "v"}), 22).unwrap();
    assert_eq!(
        store.prune_journal(15, usize::MAX).unwrap(),
        1,
        "only the entry closed before 15"
    );
    assert_eq!(
        store.prune_journal(100, 2).unwrap(),
        2,
        "no more than the limit at a time"
    );
    assert_eq!(
        store.prune_journal(100, usize::MAX).unwrap(),
        1,
        "open intents are kept"
    );
    assert_eq!(
        store
            .open_actions()
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect::<Vec<_>>(),
        [open3]
    );
    let next = store.begin_action(9, &json!(null), 30).unwrap();
    assert!(next > open3, "ids are never reused");
    assert!(matches!(
        store.begin_action(u64::MAX, &json!(null), 30),
        Err(StoreError::OutOfRange { .. })
    ));
}

/// One log for every kind of event, in the order of the commits that wrote them.
pub fn events_are_in_commit_order_across_kinds(store: &dyn StateStore) {
    store
        .record_revision("aaa", RevisionStatus::Applied, &json!([]), 1)
        .unwrap();
    store.submit("w", &spec("a"), Origin::Submitted, 2).unwrap();
    store
        .record_event("node-lost", None, "node-a stopped answering", 3)
        .unwrap();
    let own = store
        .record_event("preempted", Some(&a("w")), "for a higher class", 4)
        .unwrap();
    store.cancel(&a("w"), 5).unwrap();
    let all = store.events(0, 100).unwrap();
    assert_eq!(
        all.iter()
            .map(|e| (e.kind.as_str(), e.at))
            .collect::<Vec<_>>(),
        [
            ("revision-applied", 1),
            ("submitted", 2),
            ("node-lost", 3),
            ("preempted", 4),
            ("cancelled", 5)
        ]
    );
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "ids grow");
    let mine = all.iter().find(|e| e.id == own).unwrap();
    assert_eq!(
        (mine.workload.as_deref(), mine.tenant.as_deref()),
        (Some("w"), Some("a"))
    );
    assert_eq!(all[0].message, "aaa (0 diagnostics)");
    assert_eq!(all[1].message, "submitted by tenant a");
    assert_eq!(all[4].message, "cancelled while pending");
    // A limit of zero reads nothing; the most a read returns is capped.
    assert!(store.events(0, 0).unwrap().is_empty());
    assert_eq!(store.events(all[2].id, 1).unwrap()[0].kind, "preempted");
}

pub fn carried_is_empty_before_the_first_decision_then_what_was_set(store: &dyn StateStore) {
    assert_eq!(store.carried().unwrap(), Carried::default());
    let carried = Carried {
        usage: Some(
            serde_json::from_value(json!({
                "asOf": "2026-11-23T10:00:00Z",
                "tenants": {"a": {"used": {"gpuHours": 12.5, "cpuHours": 3.0,
                                           "memoryGibHours": 40.0}}}
            }))
            .unwrap(),
        ),
        reservations: vec![ReservationRecord {
            workload: "big".into(),
            pool: "train".into(),
            nodes: vec!["n1".into(), "n2".into()],
            since: "2026-11-23T09:00:00Z".parse().unwrap(),
        }],
        reconfigurations: vec![ReconfigurationRecord {
            node: "n1".into(),
            gpu: 3,
            at: "2026-11-23T09:30:00Z".parse().unwrap(),
        }],
    };
    store.set_carried(&carried, 100).unwrap();
    assert_eq!(store.carried().unwrap(), carried);
    store.set_carried(&Carried::default(), 200).unwrap();
    assert_eq!(store.carried().unwrap(), Carried::default());
}

fn run_key(tenant: &str, workload: &str, submitted_at: i64, started_at: i64) -> RunKey {
    RunKey {
        tenant: tenant.into(),
        workload: workload.into(),
        submitted_at,
        started_at,
    }
}

fn new_run(key: RunKey, gpus: Gpus, profile: Option<&str>) -> NewRun {
    NewRun {
        key,
        pool: "train".into(),
        model: "A100".into(),
        profile: profile.map(str::to_string),
        gpus,
        cpu_millicores: 4000,
        memory_mib: 1024,
    }
}

/// Placed runs are the live placed workloads' runs; a run's row is created once and extended;
/// the admission split follows the run; a window counts only what lies inside it.
pub fn runs_are_metered_as_intervals_split_by_admission_and_clipped_to_the_window(
    store: &dyn StateStore,
) {
    store
        .submit("w", &spec("a"), Origin::Submitted, 100)
        .unwrap();
    store
        .submit("v", &spec("b"), Origin::Submitted, 100)
        .unwrap();
    store
        .submit("queued", &spec("a"), Origin::Submitted, 100)
        .unwrap();
    assert!(store.placed_runs().unwrap().is_empty(), "nothing is placed");
    for key in [a("w"), WorkloadKey::new("b", "v")] {
        store.mark_starting(&key, &bindings(), 110).unwrap();
        store.mark_running(&key, &replicas([1, 2]), 120).unwrap();
    }
    let w = run_key("a", "w", 100, 120);
    let v = run_key("b", "v", 100, 120);
    assert_eq!(store.placed_runs().unwrap(), [w.clone(), v.clone()]);
    assert_eq!(
        store.unmetered_runs(&[w.clone(), v.clone()]).unwrap(),
        [w.clone(), v.clone()]
    );
    // Tenant a's run was admitted with one of its two GPUs within its guarantee.
    store
        .record_admission("a", "w", 100, Gpus::whole(1), Gpus::whole(1))
        .unwrap();
    store
        .meter_runs(
            &[],
            &[
                new_run(w.clone(), Gpus::whole(2), None),
                new_run(v.clone(), Gpus::whole(1), Some("1g.10gb")),
            ],
            130,
        )
        .unwrap();
    assert!(
        store
            .unmetered_runs(&[w.clone(), v.clone()])
            .unwrap()
            .is_empty()
    );
    store.meter_runs(&[w.clone(), v.clone()], &[], 220).unwrap();
    // An extension to an earlier instant does not move a run back.
    store
        .meter_runs(std::slice::from_ref(&w), &[], 150)
        .unwrap();

    let unit = Gpus::UNITS_PER_GPU;
    let rows = store.usage(0, 1000).unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| (r.tenant.as_str(), r.profile.as_deref()))
            .collect::<Vec<_>>(),
        [("a", None), ("b", Some("1g.10gb"))]
    );
    let (ra, rb) = (&rows[0], &rows[1]);
    assert_eq!(ra.gpu_unit_seconds, 2 * unit * 100);
    assert_eq!(ra.guaranteed_unit_seconds, unit * 100);
    assert_eq!(ra.borrowed_unit_seconds, unit * 100);
    assert_eq!(ra.unclassified_unit_seconds, 0);
    assert_eq!(ra.cpu_millicore_seconds, 4000 * 100);
    assert_eq!(ra.memory_mib_seconds, 1024 * 100);
    assert_eq!(ra.model.as_deref(), Some("A100"));
    assert_eq!(rb.gpu_unit_seconds, unit * 100);
    assert_eq!(
        rb.unclassified_unit_seconds,
        unit * 100,
        "no admission split"
    );
    // [170, 200) holds 30 of each run's seconds; a window after the runs holds nothing.
    let window = store.usage(170, 200).unwrap();
    assert_eq!(window[0].gpu_unit_seconds, 2 * unit * 30);
    assert_eq!(window[1].gpu_unit_seconds, unit * 30);
    assert!(store.usage(220, 300).unwrap().is_empty());

    // An ended run is no longer placed.
    store
        .finish(&a("w"), EndReason::Exited { code: 0 }, 230)
        .unwrap();
    assert_eq!(store.placed_runs().unwrap(), [v]);
}

pub fn metering_a_run_again_never_counts_a_second_twice(store: &dyn StateStore) {
    const T0: i64 = 1_790_000_000;
    store
        .submit("w", &spec("a"), Origin::Submitted, T0)
        .unwrap();
    store.mark_starting(&a("w"), &bindings(), T0).unwrap();
    store.mark_running(&a("w"), &[], T0).unwrap();
    let key = run_key("a", "w", T0, T0);
    store
        .meter_runs(&[], &[new_run(key.clone(), Gpus::whole(1), None)], T0 + 10)
        .unwrap();
    for now in [T0 + 10, T0 + 5, T0 + 20, T0 + 20] {
        store
            .meter_runs(std::slice::from_ref(&key), &[], now)
            .unwrap();
    }
    // A run created again (a cycle repeated after a restart) only extends its row.
    store
        .meter_runs(&[], &[new_run(key.clone(), Gpus::whole(1), None)], T0 + 15)
        .unwrap();
    let rows = store.usage(T0 - 100, T0 + 100).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].gpu_unit_seconds, 20 * Gpus::UNITS_PER_GPU);
    assert_eq!(rows[0].unclassified_unit_seconds, rows[0].gpu_unit_seconds);
    store.record_preemption(&key, "train", 70, T0 + 20).unwrap();
    store.record_preemption(&key, "train", 70, T0 + 30).unwrap();
    let lost: i64 = store
        .usage(T0, T0 + 100)
        .unwrap()
        .iter()
        .map(|r| r.preemption_lost_unit_seconds)
        .sum();
    assert_eq!(lost, 70);
    assert!(
        store
            .usage(T0 + 21, T0 + 100)
            .unwrap()
            .iter()
            .all(|r| r.preemption_lost_unit_seconds == 0),
        "a preemption counts in the window of its instant"
    );
}

pub fn reserved_idle_is_charged_once_between_decisions(store: &dyn StateStore) {
    const T0: i64 = 1_790_000_000;
    let spell = ReservedSpell {
        tenant: "b".into(),
        workload: "gang".into(),
        pool: "train".into(),
        gpus: 4,
    };
    store
        .meter_reserved(std::slice::from_ref(&spell), T0, T0 + 10)
        .unwrap();
    // The same interval again (a repeated cycle) adds nothing; the next one extends the spell.
    store
        .meter_reserved(std::slice::from_ref(&spell), T0, T0 + 10)
        .unwrap();
    store
        .meter_reserved(std::slice::from_ref(&spell), T0 + 10, T0 + 30)
        .unwrap();
    // Another count is another spell, from the watermark on.
    let more = ReservedSpell { gpus: 6, ..spell };
    store.meter_reserved(&[more], T0 + 30, T0 + 40).unwrap();
    let rows = store.usage(T0, T0 + 100).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].reserved_idle_unit_seconds,
        (4 * 30 + 6 * 10) * Gpus::UNITS_PER_GPU
    );
    let window = store.usage(T0 + 25, T0 + 35).unwrap();
    assert_eq!(
        window[0].reserved_idle_unit_seconds,
        (4 * 5 + 6 * 5) * Gpus::UNITS_PER_GPU
    );
}

fn start_spec(tenant: &str) -> WorkloadSpec {
    serde_json::from_value(json!({
        "tenant": tenant, "sloClass": "training", "gpu": {"count": 1}
    }))
    .unwrap()
}

fn start_binding(gpu: u32) -> Vec<Binding> {
    vec![Binding {
        node: "n0".into(),
        gpus: vec![gpu],
        mig_start: None,
        share: None,
    }]
}

pub fn a_batch_of_starts_is_two_commits_and_ends_closed(store: &dyn StateStore) {
    let a = WorkloadKey::new("t", "a");
    let b = WorkloadKey::new("u", "b");
    store
        .submit("a", &start_spec("t"), Origin::Submitted, 10)
        .unwrap();
    store
        .submit("b", &start_spec("u"), Origin::Submitted, 11)
        .unwrap();
    let (ba, bb) = (start_binding(0), start_binding(1));
    let intents = [
        StartIntent {
            workload: &a,
            bindings: &ba,
            action: "start a",
        },
        StartIntent {
            workload: &b,
            bindings: &bb,
            action: "start b",
        },
    ];
    let ids = store.begin_starts(1, &intents, 20).unwrap();
    assert_eq!(store.open_actions().unwrap().len(), 2);
    assert_eq!(store.workload(&a).unwrap().phase, Phase::Starting);
    assert_eq!(store.workload(&b).unwrap().bindings, bb);

    let replicas = [ReplicaProcess {
        replica: 0,
        pid: None,
        devices: vec!["GPU-0".into()],
    }];
    let done: Vec<StartDone<'_>> = [(&a, 10), (&b, 11)]
        .iter()
        .zip(&ids)
        .map(|(&(key, submitted_at), &action)| StartDone {
            action,
            workload: key,
            replicas: &replicas,
            submitted_at,
            guaranteed: Gpus::from_units(Gpus::UNITS_PER_GPU),
            borrowed: Gpus::from_units(0),
        })
        .collect();
    store.finish_starts(&done, 21).unwrap();
    assert!(store.open_actions().unwrap().is_empty());
    for key in [&a, &b] {
        let record = store.workload(key).unwrap();
        assert_eq!(record.phase, Phase::Running);
        assert_eq!(record.started_at, Some(21));
        assert_eq!(record.replicas, replicas);
    }
    let kinds: Vec<String> = store
        .workload_events(&a, 0, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["submitted", "starting", "running"]);
    // Closing the same intents again is refused, and nothing of that batch is written.
    assert!(store.finish_starts(&done, 22).is_err());
    assert_eq!(store.workload(&a).unwrap().started_at, Some(21));
}

pub fn a_batch_of_starts_with_a_workload_no_longer_pending_writes_nothing(store: &dyn StateStore) {
    let a = WorkloadKey::new("t", "a");
    let b = WorkloadKey::new("t", "b");
    store
        .submit("a", &start_spec("t"), Origin::Submitted, 10)
        .unwrap();
    store
        .submit("b", &start_spec("t"), Origin::Submitted, 10)
        .unwrap();
    store.cancel(&b, 11).unwrap();
    let before = store.last_event_id().unwrap();
    let (ba, bb) = (start_binding(0), start_binding(1));
    let intents = [
        StartIntent {
            workload: &a,
            bindings: &ba,
            action: "start a",
        },
        StartIntent {
            workload: &b,
            bindings: &bb,
            action: "start b",
        },
    ];
    let err = store.begin_starts(1, &intents, 12).unwrap_err();
    assert!(matches!(err, StoreError::IllegalTransition { .. }), "{err}");
    assert_eq!(store.workload(&a).unwrap().phase, Phase::Pending);
    assert!(store.open_actions().unwrap().is_empty());
    assert_eq!(store.last_event_id().unwrap(), before);
}

/// Events recorded and workloads ended before the cutoff go, a limited batch at a time; live
/// workloads (however old), later ones and the id sequences stay.
pub fn retention_deletes_ended_workloads_and_old_events_and_keeps_the_live(store: &dyn StateStore) {
    // Ended at 20 and 21: pruned at 25. Live since 12 (running) and 14 (queued): kept.
    // Ended at 40: kept.
    store
        .submit("old", &spec("a"), Origin::Submitted, 10)
        .unwrap();
    store
        .submit("older", &spec("b"), Origin::Submitted, 10)
        .unwrap();
    store
        .submit("run", &spec("a"), Origin::Committed, 12)
        .unwrap();
    store
        .submit("queued", &spec("a"), Origin::Submitted, 14)
        .unwrap();
    store.mark_starting(&a("old"), &bindings(), 15).unwrap();
    store
        .mark_running(&a("old"), &replicas([7, 8]), 16)
        .unwrap();
    store.mark_starting(&a("run"), &bindings(), 17).unwrap();
    store
        .mark_running(&a("run"), &replicas([9, 10]), 18)
        .unwrap();
    store
        .finish(&a("old"), EndReason::Exited { code: 0 }, 20)
        .unwrap();
    let older = WorkloadKey::new("b", "older");
    store.cancel(&older, 21).unwrap();
    store
        .submit("late", &spec("a"), Origin::Submitted, 30)
        .unwrap();
    store.cancel(&a("late"), 40).unwrap();
    let last = store.last_event_id().unwrap();

    // One at a time when asked for one; then the rest.
    assert_eq!(store.prune_workloads(25, 1).unwrap(), 1);
    assert_eq!(store.prune_workloads(25, 100).unwrap(), 1);
    assert_eq!(store.prune_workloads(25, 100).unwrap(), 0, "nothing left");
    assert_eq!(store.get(&a("old")).unwrap(), None);
    assert_eq!(store.get(&older).unwrap(), None);
    assert!(store.ended(&a("old"), 10).unwrap().is_empty());
    assert!(store.tenants_with("old").unwrap().is_empty());
    assert!(store.tenants_with("older").unwrap().is_empty());
    let names: Vec<String> = store
        .list(None)
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["run", "queued", "late"]);
    assert_eq!(store.live().unwrap().len(), 2);
    assert_eq!(store.workload(&a("run")).unwrap().phase, Phase::Running);
    assert_eq!(
        store.workload_by_pid(9).unwrap().map(|r| r.name),
        Some("run".into())
    );
    assert_eq!(store.committed().unwrap().len(), 1);
    assert_eq!(store.live_submitted("a").unwrap(), 1);

    // Events before 25 go, oldest first; the others and the sequence stay.
    let before: Vec<i64> = store
        .events(0, 100)
        .unwrap()
        .iter()
        .filter(|e| e.at < 25)
        .map(|e| e.id)
        .collect();
    assert_eq!(store.prune_events(25, 2).unwrap(), 2);
    assert_eq!(store.prune_events(25, 100).unwrap(), before.len() - 2);
    let left = store.events(0, 100).unwrap();
    assert!(left.iter().all(|e| e.at >= 25), "{left:?}");
    assert_eq!(
        left.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        ["submitted", "cancelled"]
    );
    assert!(store.workload_events(&a("old"), 0, 100).unwrap().is_empty());
    assert!(
        store
            .recent_workload_events(&a("run"), 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(kinds(store, "late"), ["submitted", "cancelled"]);
    assert_eq!(store.last_event_id().unwrap(), last, "ids are never reused");
    assert_eq!(store.prune_events(1000, 100).unwrap(), 2);
    assert_eq!(
        store.last_event_id().unwrap(),
        last,
        "even with no event left"
    );

    // A pruned name is free and starts a history of its own.
    store
        .submit("old", &spec("a"), Origin::Submitted, 50)
        .unwrap();
    assert_eq!(store.workload(&a("old")).unwrap().submitted_at, 50);
    assert!(store.events(0, 100).unwrap()[0].id > last);
    assert_eq!(
        store.prune_workloads(1000, 100).unwrap(),
        1,
        "late, ended at 40"
    );
    assert_eq!(store.list(None).unwrap().len(), 3);
}

/// Pruning usage before `T` deletes what ended before `T` and never changes the usage of a
/// window that starts at or after `T`; a run still placed is kept however long ago it was last
/// metered, so that metering it again counts it once.
pub fn retention_of_usage_keeps_every_window_after_the_cutoff_and_runs_still_metered(
    store: &dyn StateStore,
) {
    for name in ["done", "live"] {
        store
            .submit(name, &spec("a"), Origin::Submitted, 100)
            .unwrap();
        store.mark_starting(&a(name), &bindings(), 110).unwrap();
        store
            .mark_running(&a(name), &replicas([1, 2]), 120)
            .unwrap();
    }
    let done = run_key("a", "done", 100, 120);
    let live = run_key("a", "live", 100, 120);
    store
        .record_admission("a", "live", 100, Gpus::whole(1), Gpus::whole(0))
        .unwrap();
    store
        .meter_runs(
            &[],
            &[
                new_run(done.clone(), Gpus::whole(2), None),
                new_run(live.clone(), Gpus::whole(1), None),
            ],
            130,
        )
        .unwrap();
    store
        .meter_runs(&[done.clone(), live.clone()], &[], 200)
        .unwrap();
    store
        .finish(&a("done"), EndReason::Exited { code: 0 }, 200)
        .unwrap();
    // The metering that sees the run gone (as the cycle's next one would).
    store
        .meter_runs(std::slice::from_ref(&live), &[], 200)
        .unwrap();
    let spell = ReservedSpell {
        tenant: "b".into(),
        workload: "gang".into(),
        pool: "train".into(),
        gpus: 4,
    };
    store
        .meter_reserved(std::slice::from_ref(&spell), 100, 150)
        .unwrap();
    store.meter_reserved(&[], 150, 160).unwrap();
    store
        .meter_reserved(std::slice::from_ref(&spell), 300, 320)
        .unwrap();
    store.record_preemption(&done, "train", 7000, 150).unwrap();
    store.record_preemption(&live, "train", 3500, 310).unwrap();

    let windows = [(250, 400), (300, 310), (320, 1000), (400, 500)];
    let kept: Vec<_> = windows
        .iter()
        .map(|&(s, u)| store.usage(s, u).unwrap())
        .collect();
    let all = store.usage(0, 1000).unwrap();

    // The ended run (to 200), the spell of [100, 150) and the preemption at 150 go; the live
    // run, metered to 200 but still placed, stays.
    assert_eq!(store.prune_usage(250, 1).unwrap(), 1);
    assert_eq!(store.prune_usage(250, 100).unwrap(), 2);
    assert_eq!(store.prune_usage(250, 100).unwrap(), 0);
    for (&(s, u), before) in windows.iter().zip(&kept) {
        assert_eq!(
            &store.usage(s, u).unwrap(),
            before,
            "[{s}, {u}) is unchanged"
        );
    }
    let unit = Gpus::UNITS_PER_GPU;
    let sum = |rows: &[UsageRow], tenant: &str, field: fn(&UsageRow) -> i64| -> i64 {
        rows.iter().filter(|r| r.tenant == tenant).map(field).sum()
    };
    let rows = store.usage(0, 1000).unwrap();
    assert_ne!(rows, all);
    assert_eq!(
        sum(&rows, "a", |r| r.gpu_unit_seconds),
        unit * 80,
        "the live run alone, [120, 200)"
    );
    assert_eq!(sum(&rows, "a", |r| r.guaranteed_unit_seconds), unit * 80);
    assert_eq!(sum(&rows, "a", |r| r.preemption_lost_unit_seconds), 3500);
    assert_eq!(
        sum(&rows, "b", |r| r.reserved_idle_unit_seconds),
        4 * unit * 20,
        "[300, 320) only"
    );

    // The live run keeps being metered from where it was, counted once.
    assert!(
        store
            .unmetered_runs(std::slice::from_ref(&live))
            .unwrap()
            .is_empty()
    );
    store
        .meter_runs(std::slice::from_ref(&live), &[], 500)
        .unwrap();
    let rows = store.usage(0, 1000).unwrap();
    assert_eq!(
        sum(&rows, "a", |r| r.gpu_unit_seconds),
        unit * 380,
        "[120, 500)"
    );
    // Once it has ended and aged past the cutoff, it goes too.
    store
        .finish(&a("live"), EndReason::Exited { code: 0 }, 500)
        .unwrap();
    store.meter_runs(&[], &[], 510).unwrap();
    assert_eq!(
        store.prune_usage(1000, 100).unwrap(),
        3,
        "run, spell, preemption"
    );
    assert!(store.usage(0, 2000).unwrap().is_empty());
}
