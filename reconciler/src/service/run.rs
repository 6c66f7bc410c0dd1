//! Running the service: the reconcile loop on its own thread, the HTTP API on tokio, a file
//! watcher on a local policy repository, and a clean stop on SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher};

use tracing::info;

use super::cycle_retry::CycleRetry;
use super::nodes::{LocalNodes, NodeSide};
use super::retention::PruneSchedule;
use super::status::Condition;
use super::store_source::StoreSource;
use super::{Config, Handle, Reconciler, Shared, Wake};
use crate::auth::Tokens;
use crate::driver::NodeDriver;
use crate::repo::Mirror;
use crate::runtime::{Confinement, Runtime};
use crate::snapshot;
use crate::store::Store;

/// Why the service could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("store {path}: {source}")]
    Store {
        path: String,
        source: crate::store::StoreError,
    },
    #[error(transparent)]
    Repo(#[from] crate::repo::RepoError),
    #[error("runtime: {0}")]
    Runtime(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the reconcile loop panicked")]
    LoopPanicked,
}

/// The service's node side.
pub enum NodeSource {
    /// This machine: its driver, with the embedded runtime `serve` builds.
    Local(Box<dyn NodeDriver>),
    /// One the caller built (fleet mode's agents).
    Custom(Box<dyn NodeSide>),
}

/// Everything `tessera reconcile` passes in.
pub struct ServeOptions {
    pub config: Config,
    /// Where the state is kept: SQLite (`tessera reconcile`) or a backend the caller opens
    /// (fleet mode's etcd).
    pub store: StoreSource,
    pub listen: SocketAddr,
    pub tokens: Tokens,
    /// Where the workloads run.
    pub nodes: NodeSource,
    /// Serve `POST /v1/hooks/git` with this shared secret; `None`: no webhook route.
    pub hooks: Option<crate::api::hooks::HookSecret>,
    /// Called with the bound address once the API listens (tests bind port 0).
    pub on_listen: Option<Box<dyn FnOnce(SocketAddr) + Send>>,
    /// Stops the service as SIGINT does when a message arrives or the sender is dropped
    /// (`tessera bench service` runs the service inside its own process); `None`: signals only.
    pub stop: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// Runs until SIGINT or SIGTERM, or until `stop` fires.
pub fn serve(options: ServeOptions) -> Result<(), ServeError> {
    let ServeOptions {
        config,
        store: source,
        listen,
        tokens,
        nodes,
        hooks,
        on_listen,
        stop,
    } = options;
    private_dir(&config.state_dir)?;
    let open_store = || {
        source.open().map_err(|e| ServeError::Store {
            path: source.name(),
            source: e,
        })
    };
    let store = open_store()?;
    let api_store = open_store()?;
    let mirror = Mirror::open(config.source.clone(), &config.state_dir.join("mirror.git"))?;
    let nodes: Box<dyn NodeSide> = match nodes {
        NodeSource::Local(driver) => {
            let runtime = runtime(&config, source.local_file())?;
            Box::new(LocalNodes::new(driver, runtime, config.state_dir.clone()))
        }
        NodeSource::Custom(nodes) => nodes,
    };
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(Shared::new(&nodes.kind(), tx));
    let handle = Handle::new(shared.clone(), api_store, config.limits);
    let branch = config.source.branch.clone();

    // A commit to a repository on this machine is seen at once, not at the next fetch.
    let _watcher = match mirror.local_git_dir() {
        Some(dir) => {
            let shared = shared.clone();
            let mut watcher =
                notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                    // Fetching from the repository opens its files; only a change (a new
                    // commit, a moved ref) is worth a fetch, or each fetch would wake the next.
                    use notify::EventKind::{Create, Modify, Remove};
                    use notify::event::ModifyKind;
                    if let Ok(event) = event
                        && matches!(
                            event.kind,
                            Create(_)
                                | Remove(_)
                                | Modify(ModifyKind::Data(_) | ModifyKind::Name(_))
                        )
                    {
                        shared.wake(Wake::Repository);
                    }
                })
                .map_err(|e| ServeError::Io(std::io::Error::other(e.to_string())))?;
            watcher
                .watch(&dir, RecursiveMode::Recursive)
                .map_err(|e| ServeError::Io(std::io::Error::other(e.to_string())))?;
            Some(watcher)
        }
        None => None,
    };

    // Built on its own thread: the solver's session it keeps between cycles shares its fleet
    // copies through `Rc`, so a `Reconciler` never moves between threads.
    let loop_shared = shared.clone();
    let loop_thread = std::thread::Builder::new()
        .name("reconcile".into())
        .spawn(move || {
            let reconciler = Reconciler::with_nodes(config, store, nodes, mirror, loop_shared);
            run_loop(reconciler, rx)
        })?;

    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let served = tokio.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| ServeError::Listen {
                addr: listen,
                source,
            })?;
        let bound = listener.local_addr()?;
        if let Some(f) = on_listen {
            f(bound);
        }
        let mut app = crate::api::router(handle, tokens);
        if let Some(secret) = hooks {
            app = app.merge(crate::api::hooks::router(secret, branch, shared.clone()));
        }
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                match stop {
                    Some(stop) => {
                        tokio::select! {
                            _ = shutdown_signal() => {},
                            _ = stop => {},
                        }
                    }
                    None => shutdown_signal().await,
                }
            })
            .await
            .map_err(ServeError::Io)
    });
    shared.wake(Wake::Shutdown);
    let joined = loop_thread.join();
    served?;
    joined.map_err(|_| ServeError::LoopPanicked)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// How often the loop looks for ended processes between cycles.
const TICK: Duration = Duration::from_millis(250);

/// The reconcile loop: recovery, then cycles on the period, on wake-ups, and when a process
/// ends, a failing one tried again after a back-off ([`CycleRetry`]); fetches on the fetch
/// interval and when the local repository changes; retention's prune steps at start-up and on
/// their own interval ([`PruneSchedule`]), never inside a cycle.
pub fn run_loop(mut reconciler: Reconciler, rx: Receiver<Wake>) {
    let now = snapshot::now();
    if let Err(e) = reconciler.recover(now) {
        reconciler.note(Condition::service(e.to_string()));
    }
    let period = reconciler.config().cycle_period;
    let fetch_interval = reconciler.config().fetch_interval;
    let incremental = reconciler.config().incremental;
    let mut fetch_due = true;
    let mut cycle_due = true;
    // Submissions to decide by the arrival path (`cycle/arrivals.rs`), when no full cycle is
    // due: it falls back to one when anything else changed.
    let mut arrivals_due = false;
    let mut last_cycle = Instant::now();
    let mut last_fetch = Instant::now();
    let mut retry = CycleRetry::default();
    let mut prune = PruneSchedule::new(reconciler.config().retention.interval, Instant::now());
    // A cycle has run since the last prune step (a backlog's next step waits for one).
    let mut cycled = false;
    loop {
        if prune.due(Instant::now(), cycled) {
            let outcome = reconciler.prune(snapshot::now());
            prune.record(outcome.as_ref(), Instant::now());
            cycled = false;
        }
        if fetch_due {
            // A failure is held in the status and logged by the reconciler.
            let _ = reconciler.sync_repository(snapshot::now());
            last_fetch = Instant::now();
            fetch_due = false;
            cycle_due = true;
        }
        // Only a pass that ran and left more goes on without a wait: `arrivals_due` alone
        // would spin the loop on cycles while exits keep the arrival path from running (a
        // cycle that fails before it takes the exits in, etcd away, ran back to back).
        let mut more_arrivals = false;
        if !cycle_due && arrivals_due && !reconciler.has_exits() {
            arrivals_due = false;
            match reconciler.arrivals(snapshot::now()) {
                Some(pass) => {
                    arrivals_due = pass.more;
                    more_arrivals = pass.more;
                }
                None => cycle_due = true,
            }
        }
        // A failing cycle is tried again after its back-off, whatever asks for it meanwhile.
        if retry.ready(Instant::now()) && (cycle_due || reconciler.has_exits()) {
            let report = reconciler.cycle(snapshot::now());
            last_cycle = Instant::now();
            cycled = true;
            // Submissions the cycle left undecided are the next one's, now.
            cycle_due = !report.deferred.is_empty();
            if let Some(wait) = retry.record(report.error.is_some(), last_cycle) {
                // The cycle logged its error; what is left to say is when it is tried again.
                info!(
                    failures = retry.failures(),
                    retry_in = ?wait,
                    "the cycle failed; trying again after a back-off"
                );
                cycle_due = true;
            }
        }
        if more_arrivals {
            // More of the same pass: no wait.
            continue;
        }
        let mut wake = |w: Wake, fetch_due: &mut bool, cycle_due: &mut bool| match w {
            Wake::Shutdown => false,
            Wake::Repository => {
                *fetch_due = true;
                true
            }
            Wake::Workloads if incremental => {
                arrivals_due = true;
                true
            }
            Wake::Workloads | Wake::Forced => {
                *cycle_due = true;
                true
            }
        };
        match rx.recv_timeout(TICK) {
            Ok(w) => {
                if !wake(w, &mut fetch_due, &mut cycle_due) {
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        // Several wake-ups in a burst make one cycle.
        while let Ok(w) = rx.try_recv() {
            if !wake(w, &mut fetch_due, &mut cycle_due) {
                return;
            }
        }
        if last_fetch.elapsed() >= fetch_interval {
            fetch_due = true;
        }
        if last_cycle.elapsed() >= period {
            cycle_due = true;
        }
    }
}

/// What `tessera reconcile --once` runs with.
pub struct OnceOptions {
    pub config: Config,
    pub db: PathBuf,
    pub driver: Box<dyn NodeDriver>,
    /// At most this many cycles.
    pub max_cycles: usize,
}

/// Recovers, fetches, and runs cycles until one has nothing left to do now (or `max_cycles`):
/// the service's work without the service, for CI and for trying tessera out. Returns the
/// status and every cycle's report.
pub fn run_once(
    options: OnceOptions,
) -> Result<(super::Status, Vec<super::CycleReport>), ServeError> {
    let OnceOptions {
        config,
        db,
        driver,
        max_cycles,
    } = options;
    private_dir(&config.state_dir)?;
    let store = Store::open(&db).map_err(|source| ServeError::Store {
        path: db.display().to_string(),
        source,
    })?;
    let mirror = Mirror::open(config.source.clone(), &config.state_dir.join("mirror.git"))?;
    let runtime = runtime(&config, Some(&db))?;
    let (tx, _rx) = mpsc::channel();
    let shared = Arc::new(Shared::new(driver.kind(), tx));
    let mut reconciler = Reconciler::new(
        config,
        Box::new(store),
        driver,
        runtime,
        mirror,
        shared.clone(),
    );
    if let Err(e) = reconciler.recover(snapshot::now()) {
        reconciler.note(Condition::service(e.to_string()));
    }
    // A failure is logged by the reconciler and left to the next run.
    let _ = reconciler.prune(snapshot::now());
    // A failure is held in the status and logged by the reconciler.
    let _ = reconciler.sync_repository(snapshot::now());
    let mut reports = Vec::new();
    for _ in 0..max_cycles.max(1) {
        let report = reconciler.cycle(snapshot::now());
        let done = (report.plan.actions.is_empty() && report.deferred.is_empty())
            || report.error.is_some();
        reports.push(report);
        if done {
            break;
        }
    }
    let status = shared
        .status
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    Ok((status, reports))
}

/// The workload runtime, confined unless the operator chose otherwise; the sandbox hides the
/// state directory and the store wherever they are.
fn runtime(config: &Config, db: Option<&std::path::Path>) -> Result<Runtime, ServeError> {
    let confinement = match &config.confinement {
        Confinement::Insecure => Confinement::Insecure,
        Confinement::Sandbox(sandbox) => {
            let mut sandbox = sandbox.clone();
            sandbox.hidden.push(config.state_dir.clone());
            sandbox.hidden.extend(db.map(std::path::Path::to_path_buf));
            Confinement::Sandbox(sandbox)
        }
    };
    Runtime::new(config.state_dir.join("runtime"), confinement)
        .map_err(|e| ServeError::Runtime(e.to_string()))
}

/// Creates the state directory, or narrows an existing one, to the service alone (0700): it
/// holds the mirror, the workloads' logs and checkpoints.
fn private_dir(dir: &std::path::Path) -> Result<(), ServeError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(())
}
