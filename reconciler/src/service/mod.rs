//! The reconcile service: a loop that fetches the policy, observes the nodes, solves and applies,
//! on a period and on events; and the [`Handle`] the HTTP API works through.
//!
//! One thread owns the driver, the runtime and the store connection that writes the fleet's
//! state ([`cycle::Reconciler`]); the API has its own store connection (SQLite in WAL mode lets
//! both work at once) and wakes the loop through a channel. Nothing the API does touches a GPU:
//! a submission or a cancellation is recorded, and the next cycle acts on it.

pub mod apply;
#[cfg(test)]
mod arrivals_tests;
pub mod backoff;
pub mod cycle;
pub mod cycle_retry;
#[cfg(test)]
mod cycle_tests;
pub mod error;
pub mod nodes;
pub mod restart;
pub mod retention;
pub mod run;
pub mod standing;
pub mod status;
pub mod store_source;
mod submissions;
mod usage;
pub mod view;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{ClusterStateSpec, WorkloadSpec};
use tessera_solver::Decision;
use tracing::info;

use crate::auth::Principal;
use crate::metrics::Metrics;
use crate::repo::Source;
use crate::runtime::{Confinement, SandboxConfig};
use crate::store::{Origin, StateStore, StoreError};

pub use cycle::{CycleReport, Reconciler};
pub use run::{NodeSource, OnceOptions, ServeError, ServeOptions, run_once, serve};
pub use status::{Condition, Health, Status, StatusView, Sync};
pub use store_source::{OpenStore, StoreSource};
pub use view::{DecisionIndex, EventView, WorkloadView};

/// How the service runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub source: Source,
    /// The bare mirror, workload logs and checkpoints live here.
    pub state_dir: PathBuf,
    /// A cycle runs at least this often.
    pub cycle_period: Duration,
    /// The remote is fetched this often (a local repository is also watched).
    pub fetch_interval: Duration,
    /// Failed actions are retried after `backoff_base × 2^(failures − 1)`, at most `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// A committed workload that keeps ending after short runs is queued again after
    /// `restart_backoff_base × 2^(short runs − 1)`, at most `restart_backoff_max`.
    pub restart_backoff_base: Duration,
    pub restart_backoff_max: Duration,
    /// The solver's time budget per cycle.
    pub solve_time_limit: Duration,
    /// Start the workloads' commands; when false, workloads are placed and their devices made
    /// but nothing is run (a dry fleet simulation).
    pub run_commands: bool,
    /// Decide workloads submitted since the last full cycle against its standing decision
    /// (the solver's session) when nothing else changed, instead of re-deciding the queue;
    /// see `standing.rs`.
    pub incremental: bool,
    /// How workloads run: confined (the default, its `hidden` paths extended with the state
    /// directory and the store), or unconfined where the operator asked for it.
    pub confinement: Confinement,
    /// What one tenant may ask of the API.
    pub limits: Limits,
    /// Apply only commits signed by one of these keys (`--verify-signatures`); `None`: any
    /// commit on the branch.
    pub trusted_signers: Option<crate::repo::TrustedSigners>,
    /// How long what has ended is kept, and how often the rest is pruned.
    pub retention: retention::Retention,
}

/// What one tenant may ask of the API, so that one tenant cannot fill the store or the queue
/// for everyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Submitted workloads of one tenant that have not ended (committed ones are the
    /// repository's business and not counted). A submission past it is refused with 429.
    pub max_live_submitted_per_tenant: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_live_submitted_per_tenant: 1000,
        }
    }
}

/// How many of a workload's recent events `GET /v1/workloads/{name}` shows.
pub const RECENT_EVENTS: u32 = 20;

impl Config {
    pub fn new(source: Source, state_dir: PathBuf) -> Config {
        Config {
            source,
            state_dir,
            cycle_period: Duration::from_secs(10),
            fetch_interval: Duration::from_secs(30),
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(300),
            restart_backoff_base: Duration::from_secs(10),
            restart_backoff_max: Duration::from_secs(300),
            solve_time_limit: Duration::from_secs(2),
            run_commands: true,
            incremental: true,
            confinement: Confinement::Sandbox(SandboxConfig::default()),
            limits: Limits::default(),
            trusted_signers: None,
            retention: retention::Retention::default(),
        }
    }
}

/// What wakes the loop before its period ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A workload was submitted or cancelled.
    Workloads,
    /// The repository may have a new commit.
    Repository,
    /// Someone asked for a cycle now.
    Forced,
    /// The service is shutting down.
    Shutdown,
}

/// Why an API call was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    /// The request does not say which workload it means (an operator's bare name that several
    /// tenants use).
    #[error("{0}")]
    Ambiguous(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotReady(String),
    /// A tenant's limit is reached; retrying later (after some of its work ends) succeeds.
    #[error("{0}")]
    TooMany(String),
    #[error("{0}")]
    Internal(String),
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> ServiceError {
        match e {
            StoreError::NotFound(_) => ServiceError::NotFound(e.to_string()),
            StoreError::Conflict(_) => ServiceError::Conflict(e.to_string()),
            // Fleet mode: a standby (or a deposed leader) refuses writes; the client retries at
            // the leader the message names.
            StoreError::NotLeader { .. } => ServiceError::NotReady(e.to_string()),
            other => ServiceError::Internal(other.to_string()),
        }
    }
}

/// What the loop publishes for the API, and what the API hands the loop.
pub struct Shared {
    pub status: RwLock<Status>,
    pub state: RwLock<Option<Arc<ClusterStateSpec>>>,
    /// Tenants and their SLO classes under the revision in force, for checking submissions.
    pub tenants: RwLock<Option<Vec<TenantView>>>,
    pub metrics: Metrics,
    pub suspended: AtomicBool,
    /// What the last decision said about each workload, for the API's reasons.
    pub decisions: RwLock<Option<Arc<DecisionIndex>>>,
    /// A fetch was asked for (a push webhook) and the loop has not begun it yet.
    fetch_requested: AtomicBool,
    wake: Mutex<Sender<Wake>>,
}

/// What a submission is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantView {
    pub name: String,
    pub slo_classes: Vec<String>,
    pub pools: Vec<String>,
    /// Names from the root down to this tenant.
    pub path: Vec<String>,
    /// The tenant's workloads committed to the revision in force: a submission may not take
    /// one of their names, or it would hold the name when the committed one comes to run.
    pub committed: std::collections::BTreeSet<String>,
}

impl Shared {
    pub fn new(driver: &str, wake: Sender<Wake>) -> Shared {
        Shared {
            status: RwLock::new(Status::starting(driver)),
            state: RwLock::new(None),
            tenants: RwLock::new(None),
            metrics: Metrics::new(),
            suspended: AtomicBool::new(false),
            decisions: RwLock::new(None),
            fetch_requested: AtomicBool::new(false),
            wake: Mutex::new(wake),
        }
    }

    /// Keeps what `decision` says about each workload for the API.
    pub fn publish_decision(&self, decision: &Decision) {
        let index = Arc::new(DecisionIndex::of(decision));
        *self.decisions.write().unwrap_or_else(|e| e.into_inner()) = Some(index);
    }

    /// Records what the arrival path decided for each of `decided` at `at` in the published
    /// decision, without rebuilding it: copied only while an API call holds the last one.
    pub fn publish_arrivals(
        &self,
        decided: &[tessera_solver::decision::WorkloadDecision],
        at: jiff::Timestamp,
    ) {
        let mut slot = self.decisions.write().unwrap_or_else(|e| e.into_inner());
        let index = Arc::make_mut(slot.get_or_insert_with(|| Arc::new(DecisionIndex::default())));
        for w in decided {
            index.record(w, at);
        }
    }

    fn decisions(&self) -> Option<Arc<DecisionIndex>> {
        self.decisions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Asks the loop for a fetch. Requests that arrive before the loop begins it make one fetch:
    /// only the first wakes the loop (`true`); the loop clears the request as its fetch begins,
    /// so a push that lands during a fetch is fetched once more.
    pub fn request_fetch(&self) -> bool {
        let first = !self.fetch_requested.swap(true, Ordering::SeqCst);
        if first {
            self.wake(Wake::Repository);
        }
        first
    }

    /// Called as a fetch begins: later requests need another.
    pub fn fetch_begins(&self) {
        self.fetch_requested.store(false, Ordering::SeqCst);
    }

    pub fn wake(&self, why: Wake) {
        let sender = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        // A closed channel means the loop has stopped; there is no one left to wake.
        let _ = sender.send(why);
    }
}

/// The API's view of the service.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
    store: Arc<Mutex<Box<dyn StateStore>>>,
    /// Submissions waiting for their group commit (`submissions.rs`).
    submissions: Arc<submissions::Queue>,
    limits: Limits,
}

impl Handle {
    pub fn new(shared: Arc<Shared>, store: Box<dyn StateStore>, limits: Limits) -> Handle {
        Handle {
            shared,
            store: Arc::new(Mutex::new(store)),
            submissions: Arc::default(),
            limits,
        }
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Box<dyn StateStore>> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn submit(
        &self,
        who: &Principal,
        name: &str,
        spec: WorkloadSpec,
    ) -> Result<WorkloadView, ServiceError> {
        if !who.may_act_for(&spec.tenant) {
            return Err(ServiceError::Forbidden(format!(
                "your token is not tenant {:?}'s: submit under your own tenant",
                spec.tenant
            )));
        }
        check_name(name)?;
        self.check_spec(name, &spec)?;
        // Committed with every submission that arrives meanwhile; answered once durable.
        let record = self.commit_submission(name, spec)?;
        Ok(WorkloadView::of(record, None))
    }

    fn check_spec(&self, name: &str, spec: &WorkloadSpec) -> Result<(), ServiceError> {
        if spec.gpu.kinds_set() != 1 {
            return Err(ServiceError::Invalid(
                "spec.gpu: set exactly one of count, migProfile, fraction".to_string(),
            ));
        }
        if spec.replicas == 0 || spec.min_member.is_some_and(|m| m == 0 || m > spec.replicas) {
            return Err(ServiceError::Invalid(
                "spec.replicas must be at least 1 and spec.minMember between 1 and replicas"
                    .to_string(),
            ));
        }
        if let Some(f) = spec.gpu.fraction
            && !(0.001..=1.0).contains(&f)
        {
            return Err(ServiceError::Invalid(format!(
                "spec.gpu.fraction: {f} is not between 0.001 and 1"
            )));
        }
        let tenants = self
            .shared
            .tenants
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let Some(tenants) = tenants.as_ref() else {
            return Err(ServiceError::NotReady(
                "no policy revision is in force yet; retry once `tessera status` shows one"
                    .to_string(),
            ));
        };
        let Some(tenant) = tenants.iter().find(|t| t.name == spec.tenant) else {
            return Err(ServiceError::Invalid(format!(
                "spec.tenant: no tenant {:?} in the policy in force",
                spec.tenant
            )));
        };
        if tenant.committed.contains(name) {
            return Err(ServiceError::Conflict(format!(
                "tenant {:?} has a workload {name:?} committed to the policy repository: submit \
                 under another name, or change the committed one there",
                spec.tenant
            )));
        }
        if !tenant.slo_classes.contains(&spec.slo_class) {
            return Err(ServiceError::Invalid(format!(
                "spec.sloClass: tenant {:?} may use {}, not {:?}",
                spec.tenant,
                tenant.slo_classes.join(", "),
                spec.slo_class
            )));
        }
        if let Some(pool) = &spec.pool
            && !tenant.pools.contains(pool)
        {
            return Err(ServiceError::Invalid(format!(
                "spec.pool: tenant {:?} has no quota in pool {pool:?}",
                spec.tenant
            )));
        }
        Ok(())
    }

    /// The workloads `who` may see (the operator: all; a tenant: its own, or only `tenant`'s
    /// when given), ended ones included, in submission order.
    pub fn list(
        &self,
        who: &Principal,
        tenant: Option<&str>,
    ) -> Result<Vec<WorkloadView>, ServiceError> {
        let tenant = match (who, tenant) {
            (Principal::Admin, t) => t,
            (Principal::Tenant(own), None) => Some(own.as_str()),
            (Principal::Tenant(own), Some(t)) if t == own => Some(t),
            (Principal::Tenant(_), Some(t)) => {
                return Err(ServiceError::Forbidden(format!(
                    "your token is not tenant {t:?}'s: list your own tenant's workloads"
                )));
            }
        };
        let records = self.store().list(tenant)?;
        let decisions = self.shared.decisions();
        Ok(records
            .into_iter()
            .map(|r| WorkloadView::for_viewer(r, decisions.as_deref(), viewer(who)))
            .collect())
    }

    /// Which workload `who` means by `name` (and `tenant`, when given): names are per tenant.
    /// A tenant means its own (naming another tenant is refused, whether or not that tenant
    /// has such a workload); the operator names the tenant, or a name only one tenant has
    /// ever used.
    fn resolve(
        &self,
        store: &dyn StateStore,
        who: &Principal,
        name: &str,
        tenant: Option<&str>,
    ) -> Result<WorkloadKey, ServiceError> {
        match (who, tenant) {
            (Principal::Tenant(own), None) => Ok(WorkloadKey::new(own, name)),
            (Principal::Tenant(own), Some(t)) if t == own => Ok(WorkloadKey::new(own, name)),
            (Principal::Tenant(_), Some(t)) => Err(ServiceError::Forbidden(format!(
                "your token is not tenant {t:?}'s: name your own tenant's workloads"
            ))),
            (Principal::Admin, Some(t)) => Ok(WorkloadKey::new(t, name)),
            (Principal::Admin, None) => {
                let tenants = store.tenants_with(name)?;
                match tenants.as_slice() {
                    [] => Err(ServiceError::NotFound(format!("no workload {name:?}"))),
                    [one] => Ok(WorkloadKey::new(one, name)),
                    several => Err(ServiceError::Ambiguous(format!(
                        "tenants {} each have a workload {name:?}: say whose with                          `?tenant=TENANT` (`--tenant` in the CLI)",
                        several.join(", ")
                    ))),
                }
            }
        }
    }

    /// One workload with its recent events.
    pub fn get(
        &self,
        who: &Principal,
        name: &str,
        tenant: Option<&str>,
    ) -> Result<WorkloadView, ServiceError> {
        let (record, events) = {
            let store = self.store();
            let key = self.resolve(&**store, who, name, tenant)?;
            let record = match store.get(&key)? {
                Some(r) => r,
                None => return Err(ServiceError::NotFound(format!("no workload {name:?}"))),
            };
            let events = store.recent_workload_events(&key, RECENT_EVENTS)?;
            (record, events)
        };
        let decisions = self.shared.decisions();
        let mut view = WorkloadView::for_viewer(record, decisions.as_deref(), viewer(who));
        view.events = Some(events.into_iter().map(EventView::from).collect());
        Ok(view)
    }

    pub fn cancel(
        &self,
        who: &Principal,
        name: &str,
        tenant: Option<&str>,
    ) -> Result<WorkloadView, ServiceError> {
        let (key, current) = {
            let store = self.store();
            let key = self.resolve(&**store, who, name, tenant)?;
            let current = store.get(&key)?;
            (key, current)
        };
        let Some(record) = current else {
            return Err(ServiceError::NotFound(format!("no workload {name:?}")));
        };
        if record.origin == Origin::Committed {
            return Err(ServiceError::Invalid(format!(
                "{name:?} is committed to the policy repository: remove it there"
            )));
        }
        let record = self.store().cancel(&key, crate::snapshot::now())?;
        info!(workload = %key, phase = %record.phase, "cancel requested");
        self.shared.wake(Wake::Workloads);
        Ok(WorkloadView::for_viewer(
            record,
            self.shared.decisions().as_deref(),
            viewer(who),
        ))
    }

    pub fn status(&self) -> Status {
        self.shared
            .status
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The fleet as the last cycle left it (`GET /state`), shared: a reader holds the
    /// snapshot without copying it, and the arrival path copies it only to change one a
    /// reader still holds.
    pub fn cluster_state(&self) -> Option<Arc<ClusterStateSpec>> {
        self.shared
            .state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn metrics(&self) -> String {
        self.shared.metrics.encode()
    }

    /// What the last decision said, for the fleet page; `None` before the first decision.
    pub fn decision_index(&self) -> Option<Arc<DecisionIndex>> {
        self.shared.decisions()
    }

    pub fn reconcile_now(&self) {
        self.shared.wake(Wake::Forced);
    }

    pub fn set_suspended(&self, suspended: bool) {
        self.shared.suspended.store(suspended, Ordering::SeqCst);
        self.shared
            .status
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .suspended = suspended;
        self.shared.wake(Wake::Forced);
    }
}

/// The tenant whose eyes a view is for; `None` for the operator, who sees everything.
fn viewer(who: &Principal) -> Option<&str> {
    match who {
        Principal::Admin => None,
        Principal::Tenant(t) => Some(t),
    }
}

/// Workload names are DNS labels with dots, as in the policy language.
fn check_name(name: &str) -> Result<(), ServiceError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(ServiceError::Invalid(format!(
            "name {name:?}: use lower-case letters, digits, '-' and '.', starting and ending \
             with a letter or digit (at most 253)"
        )))
    }
}
