//! One reconcile cycle: fetch → observe → `ClusterState` → solve → plan → apply → record; and
//! recovery from the journal at start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tessera_compiler::WorkloadKey;
use tessera_solver::session::Session;
use tessera_solver::{Decision, SolveOptions};

use tracing::{Span, info, info_span, warn};

use super::backoff::Backoff;
use super::error::{CycleError, FetchError, RecoveryError};
use super::nodes::{Carry, LocalNodes, NodeSide};
use super::retention::{Pruned, prune_step};
use super::standing::{Stale, Standing};
use super::status::{Condition, Health, Status, Sync};
use super::{Config, Shared, TenantView};

mod arrivals;
use crate::actions::{self, Action, ActionPlan, LivePhase, Throttle, Wait, WorkloadView};
use crate::driver::{GpuRef, NodeDriver, Observation};
use crate::policy::{self, Offer, PolicyTracker};
use crate::repo::Mirror;
use crate::runtime::{ExitStatus, Runtime};
use crate::snapshot::{self, RunningFacts, Tracked};
use crate::store::carried::Carried;
use crate::store::{
    EndReason, Origin, Phase, RevisionStatus, StateStore, StateStoreExt, WorkloadRecord,
};
pub use arrivals::Arrivals;

/// How recovery closes an action the service stopped during.
const INTERRUPTED: &str = "interrupted: the service stopped before this action completed";

/// Starts of one workload the service may die during before the workload is failed instead.
pub const MAX_INTERRUPTED_STARTS: u32 = 3;

/// What a cycle's decision leaves for the next.
enum Next {
    /// A full cycle's session, kept if its decision is carried out whole. Both are boxed: each
    /// holds a whole problem.
    Fresh(Box<Session>),
    /// The standing decision, used by this cycle.
    Standing(Box<Standing>),
    /// The integer program improved the heuristic's decision: no session stands for it.
    None,
}

/// What one cycle did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CycleReport {
    pub cycle: u64,
    /// The commit in force during the cycle.
    pub revision: Option<String>,
    pub plan: ActionPlan,
    /// Actions that failed, with their errors.
    pub failed: Vec<(Action, String)>,
    /// Actions not attempted because an earlier one on the same GPU failed.
    pub skipped: Vec<Action>,
    /// Actions sent to the nodes and not settled by the end of the cycle (fleet mode): their
    /// outcomes are recorded by a later cycle.
    pub in_flight: Vec<Action>,
    /// Workloads whose processes ended this cycle, with how.
    pub exits: Vec<(String, String)>,
    pub decision: Option<Decision>,
    /// How the decision was reached.
    pub decided: Decided,
    /// Submissions (tenant and name) the session left for the next cycle, which runs at once.
    pub deferred: Vec<(String, String)>,
    pub error: Option<String>,
}

impl std::fmt::Display for Decided {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decided::Not => f.write_str("not"),
            Decided::Full { why: None } => f.write_str("full"),
            Decided::Full { why: Some(why) } => write!(f, "full ({why})"),
            Decided::Session { arrivals } => write!(f, "session ({arrivals} arrivals)"),
        }
    }
}

/// How a cycle reached its decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Decided {
    /// It did not: the cycle stopped before solving.
    #[default]
    Not,
    /// Solved from the snapshot; `why` says why the standing decision could not be used, when
    /// there was one.
    Full { why: Option<String> },
    /// The workloads submitted since the last full cycle, decided against its standing
    /// decision (`standing.rs`).
    Session { arrivals: usize },
}

pub struct Reconciler {
    config: Config,
    store: Box<dyn StateStore>,
    /// The nodes: this machine's driver and runtime, or fleet mode's agents.
    nodes: Box<dyn NodeSide>,
    mirror: Mirror,
    tracker: PolicyTracker,
    throttle: Throttle,
    /// Per action key, consecutive failures and the last error: the service stays Degraded
    /// until the key's next action succeeds.
    failures: BTreeMap<String, Failure>,
    /// GPUs waiting to drain, with the instant their pool's drain timeout runs out.
    drain_deadline: BTreeMap<GpuRef, i64>,
    shared: Arc<Shared>,
    cycle: u64,
    /// Committed workloads that keep ending after short runs, with when they are queued again,
    /// how the last run ended and their tenant.
    restarts: BTreeMap<String, (i64, String, String)>,
    /// The last full cycle's decision, while it stands (`standing.rs`).
    standing: Option<Standing>,
    /// Why the last cycle's decision could not stand, for the next cycle's report.
    dropped: Option<Stale>,
    /// The last fetch's error: held (the service Degraded) until a fetch succeeds, so that the
    /// condition does not come and go with the cycles in between.
    fetch_error: Option<String>,
    /// Conditions from outside a cycle (the recovery), shown by the next cycle's status.
    notes: Vec<Condition>,
    /// GPUs the last observation reported lost (`node/index`), and whole nodes lost.
    lost: Vec<String>,
    /// What the last decision holds idle for waiting gangs, and when it was made: metered up to
    /// the next decision (`metering`).
    reserved: Option<(i64, Vec<crate::store::usage::ReservedSpell>)>,
    /// What the arrival path (`arrivals.rs`) compares with to know that nothing but
    /// submissions changed since the standing decision.
    watch: arrivals::Watch,
}

/// Consecutive failures of the actions on one key.
#[derive(Debug, Clone, Default)]
struct Failure {
    count: u32,
    message: String,
    /// The tenant of the workload the key is about; `None` for a GPU.
    tenant: Option<String>,
}

impl Reconciler {
    pub fn new(
        config: Config,
        store: Box<dyn StateStore>,
        driver: Box<dyn NodeDriver>,
        runtime: Runtime,
        mirror: Mirror,
        shared: Arc<Shared>,
    ) -> Reconciler {
        let nodes = LocalNodes::new(driver, runtime, config.state_dir.clone());
        Reconciler::with_nodes(config, store, Box::new(nodes), mirror, shared)
    }

    /// A reconciler whose actions reach the nodes through `nodes` (fleet mode's agents).
    pub fn with_nodes(
        config: Config,
        store: Box<dyn StateStore>,
        nodes: Box<dyn NodeSide>,
        mirror: Mirror,
        shared: Arc<Shared>,
    ) -> Reconciler {
        Reconciler {
            config,
            store,
            nodes,
            mirror,
            tracker: PolicyTracker::default(),
            throttle: Throttle::default(),
            failures: BTreeMap::new(),
            drain_deadline: BTreeMap::new(),
            shared,
            cycle: 0,
            restarts: BTreeMap::new(),
            standing: None,
            dropped: None,
            fetch_error: None,
            notes: Vec::new(),
            lost: Vec::new(),
            reserved: None,
            watch: arrivals::Watch::default(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Runs one retention step (`retention.rs`) on the loop's store: logs what it deleted and
    /// counts it in the metrics. A failure is logged and left to the next step: nothing is
    /// half-deleted, and the cycle does not depend on it.
    pub fn prune(&mut self, now: i64) -> Result<Pruned, crate::store::StoreError> {
        let started = Instant::now();
        let outcome = prune_step(
            &*self.store,
            &self.config.retention,
            now,
            super::retention::STEP_ROWS,
        );
        match &outcome {
            Ok(pruned) => {
                for (kind, n) in pruned.by_kind() {
                    self.shared.metrics.record_pruned(kind, n);
                }
                if pruned.total() > 0 {
                    info!(
                        journal = pruned.journal,
                        events = pruned.events,
                        workloads = pruned.workloads,
                        usage = pruned.usage,
                        more = pruned.more,
                        seconds = started.elapsed().as_secs_f64(),
                        "retention: pruned what aged past its keeping time"
                    );
                }
            }
            Err(e) => warn!("retention: the prune step failed (tried again later): {e}"),
        }
        outcome
    }

    /// Whether a process has ended since the last cycle (polled now).
    pub fn has_exits(&mut self) -> bool {
        self.nodes.has_exits()
    }

    /// Reports a condition from outside a cycle (the recovery): logged now, in the status
    /// until the next cycle has published it.
    pub fn note(&mut self, condition: Condition) {
        warn!(
            tenant = condition.tenant.as_deref(),
            "{}", condition.message
        );
        {
            let mut s = self.status_mut();
            s.health = Health::Degraded;
            let mut conditions = s.conditions.clone();
            conditions.push(condition.clone());
            s.set_conditions(conditions);
        }
        self.notes.push(condition);
    }

    /// At start: close what a killed predecessor left open. Intents without an outcome are
    /// marked interrupted (the next cycle re-plans from what the nodes show, which is the only
    /// truth about a half-applied step), and the processes of running workloads are adopted.
    pub fn recover(&mut self, now: i64) -> Result<usize, RecoveryError> {
        // What the nodes may still carry out (fleet mode's agents) is the node side's to settle.
        let in_flight = self.nodes.in_flight_at_start(&*self.store, now)?;
        let observation = self.nodes.observe().ok();
        // The runs the store still holds kept their GPUs claimed while the service was down.
        self.meter(now, observation.as_ref().map(|o| o.nodes.clone()))?;
        let open: Vec<_> = self
            .store
            .open_actions()?
            .into_iter()
            .filter(|entry| !in_flight.actions.contains(&entry.id))
            .collect();
        let mut interrupted_starts = BTreeSet::new();
        for entry in &open {
            self.store.fail_action(entry.id, INTERRUPTED, now)?;
            if let Ok(Action::Start { workload, .. }) =
                serde_json::from_value::<Action>(entry.action.clone())
            {
                interrupted_starts.insert(workload);
            }
        }
        for record in self.store.live()? {
            for message in self.nodes.adopt(&record, observation.as_ref()) {
                self.note(Condition::tenant(record.tenant.clone(), message));
            }
            if record.phase == Phase::Starting && !in_flight.starts.contains(&record.key()) {
                // Killed between recording the start and recording its processes: whatever
                // started is stopped, and the workload waits for the next cycle.
                self.nodes.stop_strays(&record);
                // A start journaled before names were per tenant names the workload alone.
                if interrupted_starts.contains(&record.key().to_string())
                    || interrupted_starts.contains(&record.name)
                {
                    self.after_interrupted_start(&record, now)?;
                } else {
                    self.store
                        .requeue(&record.key(), "interrupted while starting", now)?;
                    info!(workload = %record.key(), "requeued: interrupted while starting");
                }
            }
        }
        if !open.is_empty() {
            info!(
                interrupted = open.len(),
                "recovery: journal actions left open by the previous run marked interrupted"
            );
        }
        Ok(open.len())
    }

    /// A start the service died during may be what killed it: it is counted (in the journal),
    /// retried after a back-off that doubles with each such start, and after
    /// [`MAX_INTERRUPTED_STARTS`] the workload fails with the reason instead of taking the
    /// service down again.
    fn after_interrupted_start(
        &mut self,
        record: &WorkloadRecord,
        now: i64,
    ) -> Result<(), crate::store::StoreError> {
        let count =
            self.store
                .interrupted_starts(&record.key(), record.submitted_at, INTERRUPTED)?;
        if count >= MAX_INTERRUPTED_STARTS {
            let error = format!(
                "the service stopped during each of its last {count} starts; not started again \
                 (submit it anew once the cause is found)"
            );
            self.store
                .finish(&record.key(), EndReason::StartFailed { error }, now)?;
            return Ok(());
        }
        self.store.requeue(
            &record.key(),
            &format!("interrupted while starting ({count} so far)"),
            now,
        )?;
        let key = format!("workload/{}", record.key());
        self.throttle
            .backoff
            .insert(key.clone(), self.action_backoff().after(now, count.max(1)));
        self.failures.insert(
            key,
            Failure {
                count,
                message: format!("start: the service stopped while starting it ({count} times)"),
                tenant: Some(record.tenant.clone()),
            },
        );
        warn!(workload = %record.key(), count, "the service stopped during this workload's start; backing off");
        Ok(())
    }

    /// Fetches the branch and offers its head to the tracker; the revision in force stays
    /// whatever happens. A failure is held in the status until a fetch succeeds; a branch that
    /// no longer exists also clears the head, so the service reads OutOfSync.
    pub fn sync_repository(&mut self, now: i64) -> Result<Offer, FetchError> {
        let result = self.fetch_and_offer(now);
        match &result {
            Ok(_) => {
                if self.fetch_error.take().is_some() {
                    info!("fetch: the branch can be fetched again");
                }
            }
            Err(e) => {
                let message = e.to_string();
                if self.fetch_error.as_deref() != Some(message.as_str()) {
                    warn!("{message}");
                }
                self.fetch_error = Some(message);
                if e.branch_gone() {
                    self.status_mut().head = None;
                }
            }
        }
        result
    }

    fn fetch_and_offer(&mut self, now: i64) -> Result<Offer, FetchError> {
        self.shared.fetch_begins();
        let head = self.mirror.fetch()?;
        self.status_mut().head = Some(head.clone());
        if self.tracker.latest_commit() == Some(head.as_str()) {
            return Ok(Offer::Unchanged);
        }
        let verdict = match &self.config.trusted_signers {
            Some(trusted) => {
                let signature = self.mirror.signature(&head)?;
                Some(trusted.verify(&signature.as_signed()))
            }
            None => None,
        };
        self.status_mut().head_signature = verdict.as_ref().map(|v| v.to_string());
        let offer = match &verdict {
            // Not compiled, not even read: an untrusted commit's files are nobody's policy.
            Some(v) if !v.is_trusted() => self.tracker.refuse(&head, v.to_string()),
            _ => {
                let snapshot = self.mirror.snapshot(&head)?;
                self.tracker.offer(&head, snapshot.loaded)
            }
        };
        let record = match &offer {
            Offer::Applied { commit } => {
                info!(revision = %short(commit), "revision applied");
                self.publish_tenants();
                Some((commit.clone(), RevisionStatus::Applied, Vec::new()))
            }
            Offer::Rejected(r) => {
                warn!(
                    revision = %short(&r.commit),
                    errors = r.diagnostics.len(),
                    "revision rejected; the revision in force stays"
                );
                for d in &r.diagnostics {
                    warn!(revision = %short(&r.commit), "{d}");
                }
                Some((
                    r.commit.clone(),
                    RevisionStatus::Rejected,
                    r.diagnostics.clone(),
                ))
            }
            Offer::Unchanged => None,
        };
        if let Some((commit, status, diagnostics)) = record {
            self.store
                .record_revision(&commit, status, &diagnostics, now)?;
        }
        Ok(offer)
    }

    fn publish_tenants(&self) {
        let Some(applied) = self.tracker.applied() else {
            return;
        };
        let mut committed: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for w in &applied.policy.workloads {
            committed
                .entry(w.tenant.as_str())
                .or_default()
                .insert(w.name.clone());
        }
        let views = applied
            .policy
            .tenants
            .iter()
            .map(|t| TenantView {
                name: t.name.clone(),
                slo_classes: t.slo_classes.clone(),
                pools: t.quota.keys().cloned().collect(),
                path: t.path.clone(),
                committed: committed.remove(t.name.as_str()).unwrap_or_default(),
            })
            .collect();
        *self
            .shared
            .tenants
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(views);
    }

    fn status_mut(&self) -> std::sync::RwLockWriteGuard<'_, Status> {
        self.shared
            .status
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// One cycle at `now`.
    pub fn cycle(&mut self, now: i64) -> CycleReport {
        let started = Instant::now();
        self.cycle += 1;
        let span = info_span!(
            "cycle",
            cycle = self.cycle,
            revision = tracing::field::Empty
        );
        let _entered = span.enter();
        let mut report = CycleReport {
            cycle: self.cycle,
            ..CycleReport::default()
        };
        let result = self.cycle_inner(now, &mut report);
        if let Err(e) = &result {
            warn!("cycle stopped: {e}");
            report.error = Some(e.to_string());
        }
        self.publish(now, &report, started.elapsed().as_secs_f64());
        log_outcome(&report);
        report
    }

    fn cycle_inner(&mut self, now: i64, report: &mut CycleReport) -> Result<(), CycleError> {
        self.throttle.backoff.retain(|_, &mut until| until > now);
        // Before any run ends at `now`: every run is counted up to the cycle that ends it.
        self.meter(now, None)?;
        if let Some((decided_at, spells)) = &self.reserved {
            self.store.meter_reserved(spells, *decided_at, now)?;
        }
        self.reap(now, report)?;
        self.stop_overdue(now, report)?;
        let Some(applied) = self.tracker.applied().cloned() else {
            return Err(match self.tracker.rejected() {
                Some(r) => CycleError::RejectedWithoutFallback {
                    commit: short(&r.commit).to_string(),
                },
                None => CycleError::NoRevision,
            });
        };
        Span::current().record("revision", short(&applied.commit));
        report.revision = Some(applied.commit.clone());
        self.sync_committed(&applied.policy, now)?;

        let mut observation = self.nodes.observe().map_err(CycleError::Observe)?;
        self.note_lost(&observation);
        self.requeue_lost(now)?;
        // Before the snapshot is read: what is recorded from here on, the arrival path reads
        // (and a submission recorded meanwhile that the snapshot holds, it finds decided).
        let events_before = self.store.last_event_id()?;
        let records = self.store.live()?;
        self.shared
            .metrics
            .record_utilization(&observation, &records, now);
        let tracked: Vec<Tracked> = records.iter().map(self::tracked).collect();
        let carried = self.store.carried()?;
        // Published as it is, not copied: at 50,000 GPUs the copy cost 12-19 ms a cycle.
        let state = Arc::new(snapshot::cluster_state(
            &observation,
            &tracked,
            &carried,
            now,
        ));
        *self.shared.state.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&state));

        let solve_started = Instant::now();
        let period = i64::try_from(self.config.cycle_period.as_secs()).unwrap_or(i64::MAX);
        let dropped = self.dropped.take();
        let standing = match self.standing.take() {
            Some(s) if self.config.incremental => {
                Some(s.admit(&state, &applied.commit, now, period))
            }
            _ => dropped.map(Err),
        };
        let mut full_because = None;
        let (decision, next) = match standing {
            Some(Ok((standing, admitted))) => {
                report.decided = Decided::Session {
                    arrivals: admitted.arrivals,
                };
                report.deferred = admitted
                    .deferred
                    .iter()
                    .map(|p| (p.spec.tenant.clone(), p.name.clone()))
                    .collect();
                (admitted.decision, Next::Standing(Box::new(standing)))
            }
            stale => {
                full_because = Some(match &stale {
                    Some(Err(why)) => why.kind(),
                    _ => "none",
                });
                let (decision, session) = Session::refined(
                    &applied.policy,
                    &state,
                    &SolveOptions {
                        time_limit: self.config.solve_time_limit,
                        now: Some(now),
                        ..SolveOptions::default()
                    },
                )?;
                report.decided = Decided::Full {
                    why: stale.and_then(|r| r.err()).map(|e| e.to_string()),
                };
                (
                    decision,
                    session.map_or(Next::None, |s| Next::Fresh(Box::new(s))),
                )
            }
        };
        let solve_seconds = solve_started.elapsed().as_secs_f64();
        self.shared.metrics.record_decision(&decision, now);
        self.shared
            .metrics
            .record_solve(solve_seconds, full_because);
        // Usage accrues and reservations hold whether or not the service is suspended.
        let mut carried_next = Carried {
            usage: decision.fair_share.as_ref().map(|f| f.record.clone()),
            reservations: decision.reservations.iter().map(|r| r.record()).collect(),
            reconfigurations: carried.reconfigurations.clone(),
        };
        carried_next.spend([], now);
        if carried_next != carried {
            self.store.set_carried(&carried_next, now)?;
        }

        let views: Vec<WorkloadView> = records
            .iter()
            .map(|r| {
                let mut v = view(r, &applied.policy);
                if let Some(alive) = self.nodes.alive(r) {
                    v.alive_processes = alive;
                }
                v
            })
            .collect();
        let plan = actions::plan(&decision, &observation, &views, &self.throttle, now);
        self.track_drains(&plan, &applied.policy, &observation, now);
        // A failure the decision no longer needs overcome (the workload left, the GPU's target
        // changed) no longer degrades the service.
        let wanted: BTreeSet<String> = plan
            .actions
            .iter()
            .map(Action::key)
            .chain(plan.waits.iter().filter_map(|w| match w {
                Wait::Backoff { key, .. } => Some(key.clone()),
                _ => None,
            }))
            .collect();
        self.failures.retain(|k, _| wanted.contains(k));
        self.shared.publish_decision(&decision);
        self.reserved = Some((now, crate::metering::reserved_spells(&decision)));
        report.decision = Some(decision);

        if self.shared.suspended.load(Ordering::SeqCst) {
            report.plan = plan;
            return Ok(());
        }
        let mut reconfigured: BTreeSet<GpuRef> = BTreeSet::new();
        let mut started = BTreeSet::new();
        let decision = report.decision.as_ref();
        let mut failed = Vec::new();
        let (failures, throttle, shared) = (&mut self.failures, &mut self.throttle, &self.shared);
        let store = &*self.store;
        let backoff = Backoff::new(self.config.backoff_base, self.config.backoff_max);
        let mut settled = |action: &Action, outcome: &Result<(), String>| {
            let name = action_name(action);
            match outcome {
                Ok(()) => {
                    if let Action::Start { workload, .. } = action
                        && let Some(key) = WorkloadKey::parse(workload)
                    {
                        started.insert(key);
                    }
                    match preempted_because(decision, action) {
                        Some(why) => info!("applied: {action}: {why}"),
                        None => info!("applied: {action}"),
                    }
                    failures.remove(&action.key());
                    throttle.backoff.remove(&action.key());
                    if is_disruptive(action)
                        && let Some(gpu) = gpu_of(action)
                        && reconfigured.insert(gpu.clone())
                    {
                        // Spent from the pool's `maxPerGpuPerHour` once per GPU and cycle,
                        // however many steps the change takes, and stored at once: a service
                        // killed before the cycle ends still counts it after the restart.
                        carried_next.spend([(gpu.node.as_str(), gpu.index)], now);
                        store.set_carried(&carried_next, now)?;
                    }
                    shared
                        .metrics
                        .record_action(name, true, action.is_geometry());
                }
                Err(message) => {
                    let tenant = workload_of(action)
                        .and_then(|w| records.iter().find(|r| r.key().to_string() == w))
                        .map(|r| r.tenant.clone());
                    back_off(failures, throttle, backoff, action, message, tenant, now);
                    warn!("failed: {action}: {message}");
                    shared
                        .metrics
                        .record_action(name, false, action.is_geometry());
                    failed.push((action.clone(), message.clone()));
                }
            }
            Ok(())
        };
        let mut cx = Carry {
            store,
            cycle: self.cycle,
            now,
            run_commands: self.config.run_commands,
            records: &records,
            observation: &mut observation,
        };
        let unsettled = self.nodes.carry_out(&plan.actions, &mut cx, &mut settled)?;
        report.failed = failed;
        report.skipped = unsettled.skipped;
        report.in_flight = unsettled.in_flight;
        if let Some(decision) = report.decision.as_ref() {
            let done: Vec<&Action> = plan
                .actions
                .iter()
                .filter(|a| {
                    !report.skipped.contains(a)
                        && !report.in_flight.contains(a)
                        && !report.failed.iter().any(|(f, _)| f == *a)
                })
                .collect();
            crate::metering::record_applied(&*self.store, decision, &done, &records, now)?;
        }
        if !plan.actions.is_empty() {
            // Runs started by this cycle's actions, with the split just recorded.
            self.meter(now, Some(observation.nodes.clone()))?;
        }
        // The decision stands for the fleet only if all of it was carried out.
        let whole = report.failed.is_empty()
            && report.skipped.is_empty()
            && report.in_flight.is_empty()
            && plan.waits.is_empty();
        let keep = self.config.incremental && whole && !matches!(next, Next::None);
        if self.config.incremental && !whole {
            self.dropped = Some(Stale::Unfinished);
        }
        if !plan.actions.is_empty() || keep {
            // `/state` shows the fleet as this cycle left it, not as it found it. The generation
            // first: a change while observing then shows as one to the arrival path.
            let generation = self.nodes.generation();
            let observation = self.nodes.observe().map_err(CycleError::Observe)?;
            let records = self.store.live()?;
            let tracked: Vec<Tracked> = records.iter().map(self::tracked).collect();
            let after = snapshot::cluster_state(&observation, &tracked, &carried_next, now);
            *self.shared.state.write().unwrap_or_else(|e| e.into_inner()) =
                Some(Arc::new(after.clone()));
            if keep && let Some(decision) = report.decision.as_ref() {
                // Submitted while this cycle ran, or deferred by it: not decided yet, so not
                // part of what the decision stands for; the next cycle finds them as arrivals.
                let decided: BTreeSet<(&str, &str)> = state
                    .pending
                    .iter()
                    .map(|p| (p.spec.tenant.as_str(), p.name.as_str()))
                    .filter(|&(t, n)| !report.deferred.iter().any(|(dt, dn)| dt == t && dn == n))
                    .collect();
                let mut after = after;
                after
                    .pending
                    .retain(|p| decided.contains(&(p.spec.tenant.as_str(), p.name.as_str())));
                let kept = match next {
                    Next::Fresh(session) => Some(Standing::keep(
                        *session,
                        decision,
                        &applied.commit,
                        after,
                        now,
                    )),
                    Next::Standing(standing) => Some((*standing).carried_out(decision, after)),
                    Next::None => None,
                };
                match kept {
                    Some(Ok(standing)) => {
                        self.watch = arrivals::Watch::after_cycle(
                            events_before,
                            started,
                            observation,
                            generation,
                            self.next_overdue()?,
                        );
                        self.standing = Some(standing);
                    }
                    Some(Err(why)) => self.dropped = Some(why),
                    None => {}
                }
            }
        }
        report.plan = plan;
        Ok(())
    }

    /// Meters the placed runs up to `now` (`metering`); `nodes` describes runs seen for the
    /// first time, else the driver is asked only when there are some.
    fn meter(
        &mut self,
        now: i64,
        nodes: Option<Vec<tessera_compiler::model::Node>>,
    ) -> Result<(), crate::store::StoreError> {
        let side = &mut self.nodes;
        crate::metering::meter_store(
            &*self.store,
            || match nodes {
                Some(nodes) => Ok(nodes),
                None => side.observe().map(|o| o.nodes),
            },
            now,
        )
    }

    /// Learns which processes ended and records how their workloads ended.
    fn reap(&mut self, now: i64, report: &mut CycleReport) -> Result<(), crate::store::StoreError> {
        for exit in self.nodes.exits(&*self.store, now)? {
            let record = exit.record;
            let key = record.key();
            let how = match (record.phase, exit.status) {
                (Phase::Checkpointing, _) => {
                    if let Some(dir) = &exit.checkpoint {
                        // What it saved bounds the work a later preemption loses.
                        self.store.record_checkpoint(&key, dir, now)?;
                    }
                    self.store.requeue(&key, "checkpointed", now)?;
                    "checkpointed and requeued".to_string()
                }
                (_, ExitStatus::Code(0)) => {
                    self.store
                        .finish(&key, EndReason::Exited { code: 0 }, now)?;
                    "succeeded".to_string()
                }
                (_, status) => {
                    self.store.finish(&key, EndReason::from_exit(status), now)?;
                    format!("failed ({status})")
                }
            };
            report.exits.push((key.to_string(), how));
        }
        self.stop_cancelled(now)
    }

    /// Workloads whose cancel waits on their processes: stopped, then ended as cancelled.
    /// Stops the workloads whose current run has reached its `maxDuration`, as a cancel stops
    /// (SIGKILL to each replica's process group): the solver lets work declared to end in time
    /// run ahead of a reservation, so the declaration must hold.
    fn stop_overdue(
        &mut self,
        now: i64,
        report: &mut CycleReport,
    ) -> Result<(), crate::store::StoreError> {
        for record in self.store.live_with_max_duration()? {
            let (Some(started), Some(limit)) = (record.started_at, record.spec.max_duration) else {
                continue;
            };
            let limit = limit.seconds();
            if !record.phase.holds_placement()
                || now.saturating_sub(started) < i64::try_from(limit).unwrap_or(i64::MAX)
            {
                continue;
            }
            // A process already gone is what the limit wants.
            self.nodes
                .stop(&record.key(), &record.bindings, &record.replicas);
            let end = EndReason::TimedOut {
                limit_seconds: limit,
            };
            report
                .exits
                .push((record.key().to_string(), end.to_string()));
            self.store.finish(&record.key(), end, now)?;
        }
        Ok(())
    }

    /// When the first placed run reaches its `maxDuration`, which [`Reconciler::stop_overdue`]
    /// acts on; `None` when no run declares one.
    fn next_overdue(&self) -> Result<Option<i64>, crate::store::StoreError> {
        Ok(self
            .store
            .live_with_max_duration()?
            .iter()
            .filter(|r| r.phase.holds_placement())
            .filter_map(|r| {
                let limit = i64::try_from(r.spec.max_duration?.seconds()).unwrap_or(i64::MAX);
                Some(r.started_at?.saturating_add(limit))
            })
            .min())
    }

    fn stop_cancelled(&mut self, now: i64) -> Result<(), crate::store::StoreError> {
        for record in self.store.cancel_requested()? {
            // A process already gone is what a cancel wants.
            self.nodes
                .stop(&record.key(), &record.bindings, &record.replicas);
            self.store
                .finish(&record.key(), EndReason::Cancelled, now)?;
        }
        Ok(())
    }

    /// Committed workloads follow the revision in force: new ones are queued, removed ones are
    /// cancelled (and stopped).
    /// Committed workloads follow the revision in force, as a Deployment follows its spec:
    /// one removed from the repository is cancelled (and stopped); one whose spec changed is
    /// replaced (the old one cancelled, the new one queued once the old one's processes are
    /// gone); one that ended (its process exited, its node was lost) is queued again.
    fn sync_committed(
        &mut self,
        policy: &tessera_compiler::CompiledPolicy,
        now: i64,
    ) -> Result<(), crate::store::StoreError> {
        let wanted = policy::committed(policy);
        for r in self.store.committed()? {
            let stale = wanted.get(&r.key()).is_none_or(|spec| *spec != r.spec);
            if !r.phase.is_ended() && r.cancel_requested_at.is_none() && stale {
                self.store.cancel(&r.key(), now)?;
            }
        }
        let live: BTreeSet<WorkloadKey> = self
            .store
            .committed()?
            .into_iter()
            .filter(|r| !r.phase.is_ended())
            .map(|r| r.key())
            .collect();
        self.restarts.clear();
        for (key, spec) in &wanted {
            if live.contains(key) {
                continue;
            }
            // Enough history to reach the cap: every doubling needs one record.
            let history = self.store.ended(key, 24)?;
            let at = super::restart::restart_at(
                &history,
                Backoff::new(
                    self.config.restart_backoff_base,
                    self.config.restart_backoff_max,
                ),
            );
            match at {
                Some(at) if at > now => {
                    let how = history[0]
                        .end
                        .as_ref()
                        .map_or_else(|| "ended".to_string(), ToString::to_string);
                    self.restarts
                        .insert(key.to_string(), (at, how, spec.tenant.clone()));
                }
                _ => {
                    self.store.submit(&key.name, spec, Origin::Committed, now)?;
                    info!(workload = %key, "committed workload queued");
                }
            }
        }
        Ok(())
    }

    fn back_off(&mut self, action: &Action, message: &str, tenant: Option<String>, now: i64) {
        let backoff = self.action_backoff();
        back_off(
            &mut self.failures,
            &mut self.throttle,
            backoff,
            action,
            message,
            tenant,
            now,
        );
    }

    /// Moves the workloads placed on nodes gone for longer than their grace back to the
    /// queue, each with the node and why, so that the solver places them elsewhere. Only
    /// fleet mode's node side reports such nodes.
    fn requeue_lost(&mut self, now: i64) -> Result<(), crate::store::StoreError> {
        let lost = self.nodes.lost();
        if lost.is_empty() {
            return Ok(());
        }
        for record in self.store.live()? {
            if !record.phase.holds_placement() {
                continue;
            }
            let Some((node, why)) = lost
                .iter()
                .find(|(node, _)| record.bindings.iter().any(|b| &b.node == node))
            else {
                continue;
            };
            let reason = format!("node {node} lost: {why}");
            self.store.requeue(&record.key(), &reason, now)?;
            warn!(workload = %record.key(), node = %node, "requeued: its node is lost");
        }
        Ok(())
    }

    /// How long a failed action (or a start the service died during) waits to be retried.
    fn action_backoff(&self) -> Backoff {
        Backoff::new(self.config.backoff_base, self.config.backoff_max)
    }

    /// Remembers since when each GPU has waited to drain, and the deadline its pool's
    /// `drainTimeout` sets.
    fn track_drains(
        &mut self,
        plan: &ActionPlan,
        policy: &tessera_compiler::CompiledPolicy,
        observation: &Observation,
        now: i64,
    ) {
        let draining: Vec<GpuRef> = plan
            .waits
            .iter()
            .filter_map(|w| match w {
                Wait::Drain { gpu, .. } => Some(gpu.clone()),
                _ => None,
            })
            .collect();
        self.drain_deadline.retain(|g, _| draining.contains(g));
        for g in draining {
            let timeout = pool_of(policy, observation, &g)
                .map_or(600, |p| p.reconfiguration.drain_timeout_seconds);
            let deadline = now.saturating_add(i64::try_from(timeout).unwrap_or(i64::MAX));
            self.drain_deadline.entry(g).or_insert(deadline);
        }
    }

    fn publish(&mut self, now: i64, report: &CycleReport, seconds: f64) {
        let stuck: Vec<String> = self
            .drain_deadline
            .iter()
            .filter(|&(_, &deadline)| now >= deadline)
            .map(|(g, _)| g.to_string())
            .collect();
        let rejected = self.tracker.rejected().cloned();
        let notes = std::mem::take(&mut self.notes);
        let node_conditions = self.nodes.conditions(self.config.run_commands);
        let mut s = self.status_mut();
        s.cycles = self.cycle;
        s.last_cycle_at = Some(snapshot::rfc3339(now));
        s.revision = self.tracker.applied().map(|a| a.commit.clone());
        s.last_actions = report.plan.actions.len();
        s.waiting = report.plan.waits.len();
        s.diagnostics = rejected
            .as_ref()
            .map(|r| r.diagnostics.clone())
            .unwrap_or_default();
        let mut errors = notes;
        if let Some(e) = &self.fetch_error {
            errors.push(Condition::service(e.clone()));
        }
        if let Some(r) = &rejected {
            let kept = s.revision.as_deref().map(short).unwrap_or("nothing");
            errors.push(Condition::service(match r.diagnostics.as_slice() {
                [one] => format!(
                    "revision {} rejected: {one}; {kept} stays in force",
                    short(&r.commit)
                ),
                many => format!(
                    "revision {} rejected ({} errors); {kept} stays in force",
                    short(&r.commit),
                    many.len()
                ),
            }));
        }
        if let Some(e) = &report.error {
            errors.push(Condition::service(e.clone()));
        }
        if !self.lost.is_empty() {
            errors.push(Condition::service(format!(
                "lost hardware: {} (the driver reports it lost: replace or reset it)",
                self.lost.join(", ")
            )));
        }
        // A host that cannot confine workloads runs none, a node away takes no work, a
        // coordination store away takes no action: the service is not healthy meanwhile.
        for why in node_conditions {
            errors.push(Condition::service(why));
        }
        // Failures not yet overcome, this cycle's and earlier ones waiting out their backoff.
        for (key, f) in &self.failures {
            let times = if f.count > 1 {
                format!(" ({} attempts)", f.count)
            } else {
                String::new()
            };
            let message = format!("{key}: {}{times}", f.message);
            errors.push(match &f.tenant {
                Some(t) => Condition::tenant(t.clone(), message),
                None => Condition::service(message),
            });
        }
        for (name, (at, how, tenant)) in &self.restarts {
            errors.push(Condition::tenant(
                tenant.clone(),
                format!(
                    "committed workload {name} keeps ending after short runs (last: {how}): \
                     back-off, queued again at {}",
                    snapshot::rfc3339(*at)
                ),
            ));
        }
        if !stuck.is_empty() {
            errors.push(Condition::service(format!(
                "not drained within the pool's drainTimeout: {}",
                stuck.join(", ")
            )));
        }
        s.health = if !errors.is_empty() {
            Health::Degraded
        } else if !report.plan.actions.is_empty() || !report.plan.waits.is_empty() {
            Health::Progressing
        } else {
            Health::Healthy
        };
        s.set_conditions(errors);
        s.lost_gpus = self.lost.clone();
        let at_head = s.revision.is_some() && s.revision == s.head;
        s.sync = if at_head && report.plan.actions.is_empty() && report.plan.waits.is_empty() {
            Sync::Synced
        } else {
            Sync::OutOfSync
        };
        s.suspended = self.shared.suspended.load(Ordering::SeqCst);
        let (sync, health) = (s.sync_label(), s.health_label());
        drop(s);
        self.shared.metrics.record_status(sync, health);
        self.shared.metrics.record_cycle(seconds);
    }
}

/// The lost GPUs (and nodes) of an observation, for the status and the metric.
impl Reconciler {
    fn note_lost(&mut self, observation: &Observation) {
        use tessera_compiler::model::Health as Hw;
        let mut lost = Vec::new();
        for node in &observation.nodes {
            if node.health == Hw::Lost {
                lost.push(format!("node {}", node.name));
                continue;
            }
            for g in node.gpus.iter().filter(|g| g.health == Hw::Lost) {
                lost.push(format!("{}/{}", node.name, g.index));
            }
        }
        if lost != self.lost && !lost.is_empty() {
            warn!(lost = %lost.join(", "), "hardware reported lost");
        }
        self.shared.metrics.record_lost(observation);
        self.lost = lost;
    }
}

/// One line per cycle that did something, and one per workload that ended.
fn log_outcome(report: &CycleReport) {
    for (name, how) in &report.exits {
        info!(workload = %name, "ended: {how}");
    }
    let changed = !report.plan.actions.is_empty() || !report.exits.is_empty();
    if changed {
        info!(
            actions = report.plan.actions.len(),
            failed = report.failed.len(),
            skipped = report.skipped.len(),
            waiting = report.plan.waits.len(),
            decided = %report.decided,
            "cycle done"
        );
    } else {
        tracing::debug!(
            waiting = report.plan.waits.len(),
            "cycle done, nothing to do"
        );
    }
}

/// Counts a failure of `action`'s key and holds the key back for the back-off's wait: the
/// service stays Degraded until the key's next action succeeds.
fn back_off(
    failures: &mut BTreeMap<String, Failure>,
    throttle: &mut Throttle,
    backoff: Backoff,
    action: &Action,
    message: &str,
    tenant: Option<String>,
    now: i64,
) {
    let key = action.key();
    let entry = failures.entry(key.clone()).or_default();
    entry.count += 1;
    entry.message = format!("{}: {message}", action_name(action));
    entry.tenant = tenant;
    let count = entry.count;
    let until = backoff.after(now, count);
    throttle.backoff.insert(key, until);
}

/// For a checkpoint signal, the decision's sentence on why the workload is preempted, so that
/// the log says why as well as what.
fn preempted_because(decision: Option<&Decision>, action: &Action) -> Option<String> {
    let Action::Checkpoint { workload, .. } = action else {
        return None;
    };
    decision?
        .workloads
        .iter()
        .find(|w| WorkloadKey::new(&w.tenant, &w.name).to_string() == *workload)
        .and_then(|w| match &w.outcome {
            tessera_solver::decision::Outcome::Preempt { reason, .. } => Some(reason.to_string()),
            _ => None,
        })
}

pub(super) fn workload_of(action: &Action) -> Option<&str> {
    match action {
        Action::Checkpoint { workload, .. }
        | Action::Stop { workload, .. }
        | Action::Start { workload, .. } => Some(workload),
        _ => None,
    }
}

/// What the snapshot needs of a stored workload. Public for the `service_scale` bench, which
/// builds the snapshot from stored records as the cycle does.
pub fn tracked(r: &WorkloadRecord) -> Tracked {
    let holds = matches!(
        r.phase,
        Phase::Starting | Phase::Running | Phase::Checkpointing
    );
    Tracked {
        name: r.name.clone(),
        spec: r.spec.clone(),
        submitted_at: snapshot::unix(r.submitted_at),
        running: holds.then(|| RunningFacts {
            bindings: r.bindings.clone(),
            started_at: snapshot::unix(r.started_at.unwrap_or(r.submitted_at)),
            last_checkpoint_at: r.last_checkpoint_at.map(snapshot::unix),
        }),
    }
}

/// What the action planner needs of a stored workload (its live processes as the store
/// records them). Public for the `service_scale` bench, which plans from stored records.
pub fn view(r: &WorkloadRecord, policy: &tessera_compiler::CompiledPolicy) -> WorkloadView {
    let phase = match r.phase {
        Phase::Pending => LivePhase::Pending,
        Phase::Checkpointing => LivePhase::Checkpointing {
            deadline: r.grace_deadline.unwrap_or(0),
        },
        _ => LivePhase::Running,
    };
    let signal = policy
        .slo_classes
        .iter()
        .find(|c| c.name == r.spec.slo_class)
        .map_or_else(|| "SIGTERM".to_string(), |c| c.checkpoint_signal.clone());
    WorkloadView {
        key: r.key().to_string(),
        phase,
        alive_processes: r.replicas.iter().filter(|p| p.pid.is_some()).count(),
        bindings: r.bindings.clone(),
        checkpoint_signal: signal,
    }
}

fn pool_of<'p>(
    policy: &'p tessera_compiler::CompiledPolicy,
    observation: &Observation,
    gpu: &GpuRef,
) -> Option<&'p tessera_compiler::compiled::CompiledPool> {
    let node = observation.nodes.iter().find(|n| n.name == gpu.node)?;
    policy.pools.iter().find(|p| p.name == node.pool)
}

/// A geometry step that takes something away (counted against the reconfiguration budget).
fn is_disruptive(action: &Action) -> bool {
    matches!(
        action,
        Action::DestroyComputeInstance { .. }
            | Action::DestroyGpuInstance { .. }
            | Action::SetMigMode { .. }
            | Action::ResetGpu { .. }
    )
}

pub(super) fn gpu_of(action: &Action) -> Option<&GpuRef> {
    match action {
        Action::DestroyComputeInstance { gpu, .. }
        | Action::DestroyGpuInstance { gpu, .. }
        | Action::SetMigMode { gpu, .. }
        | Action::ResetGpu { gpu }
        | Action::CreateGpuInstance { gpu, .. }
        | Action::CreateComputeInstance { gpu, .. } => Some(gpu),
        _ => None,
    }
}

pub fn action_name(action: &Action) -> &'static str {
    match action {
        Action::Checkpoint { .. } => "checkpoint",
        Action::Stop { .. } => "stop",
        Action::DestroyComputeInstance { .. } => "destroy_compute_instance",
        Action::DestroyGpuInstance { .. } => "destroy_gpu_instance",
        Action::SetMigMode { .. } => "set_mig_mode",
        Action::ResetGpu { .. } => "reset_gpu",
        Action::CreateGpuInstance { .. } => "create_gpu_instance",
        Action::CreateComputeInstance { .. } => "create_compute_instance",
        Action::Start { .. } => "start",
    }
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}
