//! The reconcile service: a loop that fetches the policy, observes the nodes, solves and applies,
//! on a period and on events; and the [`Handle`] the HTTP API works through.
//!
//! One thread owns the driver, the runtime and the store connection that writes the fleet's
//! state ([`cycle::Reconciler`]); the API has its own store connection (SQLite in WAL mode lets
//! both work at once) and wakes the loop through a channel. Nothing the API does touches a GPU:
//! a submission or a cancellation is recorded, and the next cycle acts on it.

pub mod apply;
pub mod cycle;
pub mod restart;
pub mod run;
pub mod standing;
pub mod status;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tessera_compiler::model::{ClusterStateSpec, WorkloadSpec};

use crate::auth::Principal;
use crate::metrics::Metrics;
use crate::repo::Source;
use crate::store::{Origin, Store, StoreError, WorkloadRecord};

pub use cycle::{CycleReport, Reconciler};
pub use run::{OnceOptions, ServeError, ServeOptions, run_once, serve};
pub use status::{Health, Status, Sync};

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
    /// Apply only commits signed by one of these keys (`--verify-signatures`); `None`: any
    /// commit on the branch.
    pub trusted_signers: Option<crate::repo::TrustedSigners>,
}

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
            trusted_signers: None,
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
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotReady(String),
    #[error("{0}")]
    Internal(String),
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> ServiceError {
        match e {
            StoreError::NotFound(_) => ServiceError::NotFound(e.to_string()),
            StoreError::Conflict(_) => ServiceError::Conflict(e.to_string()),
            other => ServiceError::Internal(other.to_string()),
        }
    }
}

/// What the loop publishes for the API, and what the API hands the loop.
pub struct Shared {
    pub status: RwLock<Status>,
    pub state: RwLock<Option<ClusterStateSpec>>,
    /// Tenants and their SLO classes under the revision in force, for checking submissions.
    pub tenants: RwLock<Option<Vec<TenantView>>>,
    pub metrics: Metrics,
    pub suspended: AtomicBool,
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
}

impl Shared {
    pub fn new(driver: &str, wake: Sender<Wake>) -> Shared {
        Shared {
            status: RwLock::new(Status::starting(driver)),
            state: RwLock::new(None),
            tenants: RwLock::new(None),
            metrics: Metrics::new(),
            suspended: AtomicBool::new(false),
            fetch_requested: AtomicBool::new(false),
            wake: Mutex::new(wake),
        }
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
    store: Arc<Mutex<Store>>,
}

impl Handle {
    pub fn new(shared: Arc<Shared>, store: Store) -> Handle {
        Handle {
            shared,
            store: Arc::new(Mutex::new(store)),
        }
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn submit(
        &self,
        who: &Principal,
        name: &str,
        spec: WorkloadSpec,
    ) -> Result<WorkloadRecord, ServiceError> {
        if !who.may_act_for(&spec.tenant) {
            return Err(ServiceError::Forbidden(format!(
                "your token is not tenant {:?}'s: submit under your own tenant",
                spec.tenant
            )));
        }
        check_name(name)?;
        self.check_spec(&spec)?;
        let record = self
            .store()
            .submit(name, &spec, Origin::Submitted, crate::snapshot::now())?;
        self.shared.wake(Wake::Workloads);
        Ok(record)
    }

    fn check_spec(&self, spec: &WorkloadSpec) -> Result<(), ServiceError> {
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

    pub fn list(&self, who: &Principal) -> Result<Vec<WorkloadRecord>, ServiceError> {
        let tenant = match who {
            Principal::Admin => None,
            Principal::Tenant(t) => Some(t.as_str()),
        };
        Ok(self.store().list(tenant)?)
    }

    pub fn get(&self, who: &Principal, name: &str) -> Result<WorkloadRecord, ServiceError> {
        let record = self.store().get(name)?;
        // Another tenant's workload reads as absent: its existence is not confirmed.
        match record {
            Some(r) if who.may_act_for(&r.tenant) => Ok(r),
            _ => Err(ServiceError::NotFound(format!("no workload {name:?}"))),
        }
    }

    pub fn cancel(&self, who: &Principal, name: &str) -> Result<WorkloadRecord, ServiceError> {
        let record = self.get(who, name)?;
        if record.origin == Origin::Committed {
            return Err(ServiceError::Invalid(format!(
                "{name:?} is committed to the policy repository: remove it there"
            )));
        }
        let record = self.store().cancel(name, crate::snapshot::now())?;
        self.shared.wake(Wake::Workloads);
        Ok(record)
    }

    pub fn status(&self) -> Status {
        self.shared
            .status
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn cluster_state(&self) -> Option<ClusterStateSpec> {
        self.shared
            .state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn metrics(&self) -> String {
        self.shared.metrics.encode()
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
