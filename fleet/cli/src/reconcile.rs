//! `tessera-fleet reconcile`: one control-plane replica on etcd. `tessera reconcile --store
//! etcd://…` execs it with its own arguments, parsed by the same `ReconcileArgs`.
//!
//! A replica campaigns for leadership. While it stands by it serves the API's reads from etcd
//! (`EtcdStore::reader`) and forwards every other request to the leader (`forward`), or, where
//! no leader is known or it does not answer, answers 503 with where the leader is; its
//! `/status` carries the leader's (`leaderStatus`). It touches no node, runtime or mirror.
//! Once it leads it runs the service (`serve`) on an `EtcdStore` fenced by its term, its
//! actions carried out by the nodes' agents (`AgentNodes`; `--fleet-nodes local`: this
//! machine's driver); when the term may be over it stops
//! the service (writes of the old term are refused by the fence in any case) and stands by
//! again. Only one phase listens at a time, on the same address.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use etcd_client::Client;
use tessera_fleet::election::{Candidate, LeaderInfo, Leadership, current_leader};
use tessera_fleet::keys::Keys;
use tessera_fleet::nodes::{AgentNodes, AgentOptions};
use tessera_fleet::store::{EtcdStore, StoreRuntime};
use tessera_reconciler::api::hooks::HookSecret;
use tessera_reconciler::auth::Tokens;
use tessera_reconciler::service::status::Health;
use tessera_reconciler::service::{
    Condition, Config, Handle, NodeSource, ServeOptions, Shared, StoreSource, serve,
};
use tessera_service_cli::{NodesKind, ReconcileArgs, StoreArg, setup};

use crate::forward::{Forwarder, was_forwarded};

/// How long a replica waits before campaigning again after etcd failed it.
const RETRY: Duration = Duration::from_secs(1);

/// How long a standby waits for the leader's answer to a write it forwarded.
const FORWARD_ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// How long a standby's `/status` waits for the leader's, which it includes.
const LEADER_STATUS_WITHIN: Duration = Duration::from_secs(2);

/// The most bytes of a `/status` answer a standby reads to add the leader's to it.
const MAX_STATUS_BYTES: usize = 4 << 20;

/// How long a cycle waits for the agents to settle its actions before it leaves them in
/// flight: long enough for a start or a geometry step on a node, short enough that a node
/// away holds the cycle up only briefly.
const SETTLE: Duration = Duration::from_secs(5);

pub fn run(args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    crate::agent::init_logging("info");
    let StoreArg::Etcd(endpoints) = args.store() else {
        bail!(
            "tessera-fleet reconcile keeps its state in etcd: give --store \
             etcd://HOST:PORT[,HOST:PORT...] (SQLite is `tessera reconcile`'s)"
        );
    };
    if args.once {
        bail!("--once runs without replicas: use `tessera reconcile --store sqlite:PATH`");
    }
    let advertise = advertised_url(args.listen, args.fleet.advertise.as_deref())?;
    let keys = Keys::new(&args.fleet.cluster)?;
    let credentials = crate::secret::credentials(
        args.fleet.etcd_user.as_deref(),
        args.fleet.etcd_password_file.as_deref(),
    )?;
    let config = setup::config(&args)?;
    setup::prepare_state_dir(&args.state_dir)?;
    let tokens = match &args.tokens {
        Some(path) => Tokens::load(path)?,
        None => Tokens::default(),
    };
    let info = LeaderInfo {
        id: match &args.fleet.replica_id {
            Some(id) => id.clone(),
            None => format!("{}/{}", host_name(), args.listen),
        },
        advertise: Some(advertise),
    };
    let ttl = i64::try_from(args.fleet.lease_ttl.as_secs().max(1)).unwrap_or(i64::MAX);
    let store_runtime = StoreRuntime::new().context("cannot start the store's runtime")?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    tokio.block_on(async {
        let client = tessera_fleet::access::connect(&endpoints, credentials.as_ref()).await?;
        let replica = Replica {
            args: &args,
            config,
            tokens,
            keys,
            client,
            store_runtime,
            candidate_info: info,
            ttl,
        };
        replica.run().await
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The URL other replicas reach this one's API at, which standbys forward writes to and name
/// in their answers: `--advertise`, else `http://` and `--listen`. A replica listening on
/// every address (`0.0.0.0`, `::`) has no such default: `http://0.0.0.0:8080` would send a
/// remote standby's forwarded writes to itself. It refuses to start without `--advertise`, as
/// etcd refuses `--listen-client-urls` without `--advertise-client-urls`: the operator knows
/// which of the machine's names and addresses the other replicas reach, a guess (the host
/// name, the first interface) would be wrong on many networks and fail only at failover.
fn advertised_url(listen: SocketAddr, advertise: Option<&str>) -> anyhow::Result<String> {
    if let Some(url) = advertise {
        let host = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .filter(|rest| !rest.is_empty());
        let Some(host) = host else {
            bail!("--advertise {url:?}: write the API's URL as clients reach it, http://HOST:PORT");
        };
        if let Ok(addr) = host.trim_end_matches('/').parse::<SocketAddr>()
            && addr.ip().is_unspecified()
        {
            bail!(
                "--advertise {url:?} names every address, not one other replicas can reach: \
                 give this machine's name or address"
            );
        }
        return Ok(url.to_string());
    }
    if listen.ip().is_unspecified() {
        bail!(
            "--listen {listen} listens on every address of this machine, so the replicas \
             cannot tell which one reaches it: give --advertise http://HOST:{port} with the \
             name or address the other replicas reach this one at",
            port = listen.port()
        );
    }
    Ok(format!("http://{listen}"))
}

struct Replica<'a> {
    args: &'a ReconcileArgs,
    config: Config,
    tokens: Tokens,
    keys: Keys,
    client: Client,
    store_runtime: Arc<StoreRuntime>,
    candidate_info: LeaderInfo,
    ttl: i64,
}

impl Replica<'_> {
    /// Stands by and leads in turn until SIGTERM or SIGINT.
    async fn run(&self) -> anyhow::Result<()> {
        loop {
            let Some(leadership) = self.stand_by().await? else {
                return Ok(());
            };
            if !self.lead(leadership).await? {
                return Ok(());
            }
        }
    }

    /// Serves reads until this replica leads (`Some`) or a signal stops it (`None`).
    async fn stand_by(&self) -> anyhow::Result<Option<Leadership>> {
        let listener = tokio::net::TcpListener::bind(self.args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", self.args.listen))?;
        let bound = listener.local_addr()?;
        println!("tessera-fleet reconcile: standing by; API (reads) listening on http://{bound}");
        let reader = EtcdStore::reader(
            self.store_runtime.clone(),
            self.client.clone(),
            self.keys.clone(),
        );
        // No loop runs here: what the API would wake goes nowhere.
        let (wake, _asleep) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared::new("none (standing by)", wake));
        // What the operator's /status says here: no cycle runs on this replica.
        standby_status(&shared, None);
        let handle = Handle::new(shared.clone(), Box::new(reader), self.config.limits);
        let leader = LeaderLookup {
            shared,
            client: self.client.clone(),
            keys: self.keys.clone(),
            me: self.candidate_info.id.clone(),
            forwarder: Forwarder::new(&self.candidate_info.id, FORWARD_ANSWER_WITHIN),
            status_forwarder: Forwarder::new(&self.candidate_info.id, LEADER_STATUS_WITHIN),
        };
        let app = tessera_reconciler::api::router(handle, self.tokens.clone())
            .layer(axum::middleware::from_fn_with_state(leader, refuse_writes));
        let (elected_tx, elected_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = elected_rx.await;
                })
                .await
        });
        let candidate = Candidate::new(
            self.client.clone(),
            self.keys.clone(),
            self.candidate_info.clone(),
            self.ttl,
        );
        let outcome = tokio::select! {
            leadership = campaign(&candidate) => Some(leadership),
            () = signalled() => None,
        };
        // The listener is released before the service binds the same address.
        let _ = elected_tx.send(());
        server
            .await
            .context("the standby's API stopped")?
            .context("the standby's API failed")?;
        Ok(outcome)
    }

    /// Runs the service for one term. `Ok(true)`: the term ended and the replica stands by
    /// again; `Ok(false)`: a signal stopped the service.
    async fn lead(&self, mut leadership: Leadership) -> anyhow::Result<bool> {
        let term = leadership.fence().term();
        let fence = leadership.fence().clone();
        let (runtime, client, keys) = (
            self.store_runtime.clone(),
            self.client.clone(),
            self.keys.clone(),
        );
        let store = StoreSource::Custom {
            name: format!("etcd ({})", self.keys.root()),
            open: Box::new(move || {
                Ok(Box::new(EtcdStore::leader(
                    runtime.clone(),
                    client.clone(),
                    keys.clone(),
                    fence.clone(),
                )))
            }),
        };
        let hooks = match &self.args.webhook_secret_file {
            Some(path) => Some(HookSecret::load(path)?),
            None => None,
        };
        // Each term starts from what the nodes are now, as a restarted service does.
        let nodes = match self.args.fleet.fleet_nodes {
            NodesKind::Local => NodeSource::Local(setup::driver(self.args)?),
            NodesKind::Agents => NodeSource::Custom(Box::new(
                AgentNodes::new(
                    self.client.clone(),
                    self.keys.clone(),
                    leadership.fence().clone(),
                    AgentOptions {
                        grace: self.args.fleet.node_grace,
                        settle: SETTLE,
                        max_txn_ops: tessera_fleet::dispatch::DEFAULT_MAX_TXN_OPS,
                    },
                )
                .context("cannot start the fleet's node side")?,
            )),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
        let options = ServeOptions {
            config: self.config.clone(),
            store,
            listen: self.args.listen,
            tokens: self.tokens.clone(),
            nodes,
            hooks,
            on_listen: Some(Box::new(move |addr: SocketAddr| {
                println!(
                    "tessera-fleet reconcile: leading (term {term}); API listening on http://{addr}"
                );
            })),
            stop: Some(stop_rx),
        };
        std::thread::Builder::new()
            .name("service".into())
            .spawn(move || {
                let _ = done_tx.send(serve(options));
            })?;
        tokio::select! {
            () = leadership.lost() => {
                tracing::warn!(term, "leadership lost: stopping the service and standing by");
                let _ = stop_tx.send(());
                // The loop finishes the cycle it is in, whose writes the fence refuses; each
                // of its etcd calls is bounded (`access::REQUEST_TIMEOUT`), so a hung etcd
                // delays this by a request at most.
                let served = done_rx.await.context("the service's thread ended")?;
                // The term is given up: where its lease still holds the leader key (the term
                // was counted over because renewals went unanswered, not because etcd expired
                // it), revoking it lets a replica lead now rather than after the TTL. Where
                // etcd does not answer this fails, and the lease expires by itself; it runs
                // beside the standby, which need not wait for it.
                tokio::spawn(async move {
                    if let Err(e) = leadership.resign().await {
                        tracing::info!(term, "the abandoned term's lease is left to expire: {e}");
                    }
                });
                served.context("the service failed")?;
                Ok(true)
            }
            served = &mut done_rx => {
                // The service stopped by itself: a signal, or a failure. Either way another
                // replica leads at once rather than after the lease period.
                let resigned = leadership.resign().await;
                served.context("the service's thread ended")?.context("the service failed")?;
                resigned.context("cannot resign the leadership")?;
                Ok(false)
            }
        }
    }
}

/// Campaigns until this replica leads; a failing etcd is retried, the standby serving on.
async fn campaign(candidate: &Candidate) -> Leadership {
    loop {
        match candidate.campaign().await {
            Ok(leadership) => return leadership,
            Err(e) => {
                tracing::warn!("campaign: {e}; trying again");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

#[derive(Clone)]
struct LeaderLookup {
    /// The standby's own status, which says whether etcd answers.
    shared: Arc<Shared>,
    client: Client,
    keys: Keys,
    /// This replica's id: a leader key naming it is stale and not forwarded to.
    me: String,
    forwarder: Forwarder,
    /// Asks the leader for its `/status` (a shorter wait than a write's).
    status_forwarder: Forwarder,
}

/// A standby passes reads on to the API and forwards everything else to the leader, whose
/// answer it returns. Where no leader is known, the request was forwarded to this replica
/// already, or the leader cannot be reached, it answers 503 with where the leader is
/// (`leader`: its advertised URL) and `Retry-After`.
async fn refuse_writes(
    State(lookup): State<LeaderLookup>,
    request: Request,
    next: Next,
) -> Response {
    if *request.method() == Method::GET
        && request.uri().path() == "/status"
        && was_forwarded(&request).is_none()
    {
        let asked = request.headers().clone();
        let leader = read_leader(&lookup).await;
        standby_status(&lookup.shared, leader.as_ref().err().map(String::as_str));
        let own = next.run(request).await;
        return with_leader_status(&lookup, leader, asked, own).await;
    }
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        return next.run(request).await;
    }
    let (message, at) = match current_leader(&lookup.client, &lookup.keys).await {
        Ok(Some(leader)) => {
            let url = leader.advertise.clone();
            let message = match (&url, was_forwarded(&request)) {
                (_, Some(by)) => format!(
                    "this replica stands by and takes no write forwarded by {by}: {leader} \
                     leads; send writes there"
                ),
                (Some(url), None) if leader.id != lookup.me => {
                    match lookup.forwarder.forward(url, request).await {
                        Ok(answer) => return answer,
                        Err(e) => format!("this replica stands by: {leader} leads, but {e}"),
                    }
                }
                _ => format!("this replica stands by: {leader} leads; send writes there"),
            };
            (message, url)
        }
        Ok(None) => (
            "this replica stands by and no replica leads now; retry shortly".to_string(),
            None,
        ),
        Err(e) => (
            format!("this replica stands by and cannot read who leads: {e}"),
            None,
        ),
    };
    let body = serde_json::json!({ "error": message, "leader": at });
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    response
}

/// A standby's `/status` with the leader's own under `leaderStatus` (asked with the caller's
/// headers, so it is the view the caller would get there): the fleet's last cycle, which a
/// standby does not run. Where the leader cannot be asked, `leaderStatus` says why.
async fn with_leader_status(
    lookup: &LeaderLookup,
    leader: Result<Option<LeaderInfo>, String>,
    asked: axum::http::HeaderMap,
    own: Response,
) -> Response {
    if own.status() != StatusCode::OK {
        return own;
    }
    let (parts, body) = own.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_STATUS_BYTES).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let Ok(serde_json::Value::Object(mut status)) = serde_json::from_slice(&bytes) else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    let leader_status = match leader_status(lookup, leader, asked).await {
        Ok(value) => value,
        Err(why) => serde_json::json!({ "error": why }),
    };
    status.insert("leaderStatus".to_string(), leader_status);
    (parts.status, axum::Json(serde_json::Value::Object(status))).into_response()
}

/// The leader's `/status`, or why it cannot be had.
async fn leader_status(
    lookup: &LeaderLookup,
    leader: Result<Option<LeaderInfo>, String>,
    asked: axum::http::HeaderMap,
) -> Result<serde_json::Value, String> {
    let leader = match leader {
        Ok(Some(leader)) => leader,
        Ok(None) => return Err("no replica leads now".to_string()),
        Err(e) => return Err(format!("cannot read who leads: {e}")),
    };
    let Some(url) = leader
        .advertise
        .as_deref()
        .filter(|_| leader.id != lookup.me)
    else {
        return Err(format!("{leader} leads; its address is not known here"));
    };
    let mut request = Request::new(axum::body::Body::empty());
    *request.uri_mut() = axum::http::Uri::from_static("/status");
    *request.headers_mut() = asked;
    let answer = lookup
        .status_forwarder
        .forward(url, request)
        .await
        .map_err(|e| e.to_string())?;
    if answer.status() != StatusCode::OK {
        return Err(format!("{leader} answered {}", answer.status()));
    }
    let bytes = axum::body::to_bytes(answer.into_body(), MAX_STATUS_BYTES)
        .await
        .map_err(|e| format!("reading {leader}'s status: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{leader}'s status is not JSON: {e}"))
}

/// Who leads, as etcd says within [`LEADER_STATUS_WITHIN`]; why etcd cannot say.
async fn read_leader(lookup: &LeaderLookup) -> Result<Option<LeaderInfo>, String> {
    match tokio::time::timeout(
        LEADER_STATUS_WITHIN,
        current_leader(&lookup.client, &lookup.keys),
    )
    .await
    {
        Ok(answer) => answer.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "etcd did not answer within {LEADER_STATUS_WITHIN:?}"
        )),
    }
}

/// A standby's own status: it runs no cycle; while etcd does not answer (`etcd_trouble`) no
/// replica can lead or write, which is Degraded, with etcd's error as the reason. Set before
/// each `/status` is answered, from the read of who leads that the answer makes anyway.
fn standby_status(shared: &Shared, etcd_trouble: Option<&str>) {
    let mut conditions = vec![Condition::service(
        "this replica stands by: it runs no cycle and serves reads from etcd; the leader's \
         /status describes the fleet",
    )];
    let mut status = shared.status.write().unwrap_or_else(|e| e.into_inner());
    status.health = match etcd_trouble {
        Some(why) => {
            conditions.push(Condition::service(format!(
                "etcd: cannot read who leads ({why}); no replica can lead until etcd answers"
            )));
            Health::Degraded
        }
        None => Health::Progressing,
    };
    status.set_conditions(conditions);
}

/// Resolves at SIGTERM or SIGINT.
async fn signalled() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "replica".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(listen: &str, advertise: Option<&str>) -> Result<String, String> {
        advertised_url(listen.parse().unwrap(), advertise).map_err(|e| e.to_string())
    }

    #[test]
    fn a_replica_advertises_its_listen_address_or_the_url_it_is_given() {
        assert_eq!(
            url("127.0.0.1:8080", None).unwrap(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(url("[::1]:8080", None).unwrap(), "http://[::1]:8080");
        assert_eq!(url("10.0.0.7:8080", None).unwrap(), "http://10.0.0.7:8080");
        assert_eq!(
            url("0.0.0.0:8080", Some("https://cp-1.example:8443")).unwrap(),
            "https://cp-1.example:8443"
        );
    }

    #[test]
    fn a_replica_on_every_address_needs_an_advertised_url_that_names_one() {
        for listen in ["0.0.0.0:8080", "[::]:8080"] {
            let e = url(listen, None).unwrap_err();
            assert!(e.contains("--advertise http://HOST:8080"), "{e}");
        }
        for bad in [
            "cp-1:8080",
            "http://",
            "http://0.0.0.0:8080",
            "http://[::]:80/",
        ] {
            let e = url("0.0.0.0:8080", Some(bad)).unwrap_err();
            assert!(e.contains("--advertise"), "{bad}: {e}");
        }
    }
}
