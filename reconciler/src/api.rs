//! The HTTP API (axum).
//!
//! | route | who | what |
//! |---|---|---|
//! | `POST /v1/workloads` | tenant, admin | submit `{name, spec}` or a `kind: Workload` document |
//! | `GET /v1/workloads[?tenant=T]` | tenant, admin | the caller's workloads (admin: all, or T's) |
//! | `GET /v1/workloads/{name}[?tenant=T]` | tenant, admin | one workload, with its recent events |
//! | `DELETE /v1/workloads/{name}[?tenant=T]` | tenant, admin | cancel |
//! | `POST /v1/reconcile` | admin | run a cycle now |
//! | `POST /v1/suspend`, `POST /v1/resume` | admin | stop and restart applying changes |
//! | `GET /v1/usage?since=T&until=T` | tenant, admin | metered usage in a window: a tenant's subtree, or everything |
//! | `GET /status` | anyone | sync and health; a tenant's token adds its own conditions, the operator's everything |
//! | `GET /state` | admin | the `ClusterState` that `tessera plan` reads |
//! | `GET /metrics` | anyone | Prometheus |
//! | `GET /healthz` | anyone | liveness |
//! | `POST /v1/hooks/git` | the forge (HMAC or token) | fetch now ([`hooks`]) |
//! | `GET /ui`, `/ui/login`, `POST /v1/ui/links` | a browser session, or a token for a link | the fleet page ([`ui`]) |
//!
//! Workload names are per tenant. `{name}` with a tenant's token is that tenant's workload; the
//! operator adds `?tenant=T`, or leaves it out for a name only one tenant has used (several:
//! 400, saying which tenants).
//!
//! Workloads are shown as [`WorkloadView`]s: every instant in RFC 3339, with the reason the last
//! decision gave for a waiting one.
//!
//! Who calls is settled by extractors before a handler runs: [`Caller`] (any valid token),
//! [`Operator`] (the operator's token) and [`MaybeCaller`] (no token, or a valid one). A missing
//! or unknown token is 401, a tenant reaching for another tenant's workload gets 404 (the name
//! is not confirmed to exist) or 403 for a submission in another tenant's name, and neither
//! leaves a trace in the store. A tenant at its cap of live submissions gets 429. Bodies over
//! [`MAX_BODY_BYTES`] are 413. Every error is a JSON body `{"error": "..."}` that says what to
//! fix.

pub mod hooks;
mod stream_json;
pub mod ui;
mod usage;

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tessera_compiler::model::{API_VERSION, Metadata, WorkloadSpec};

use crate::auth::{Principal, Tokens};
use crate::service::{Handle, ServiceError, WorkloadView};
use crate::ui::Sessions;

/// Request bodies larger than this are refused before they are read.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    handle: Handle,
    tokens: Arc<Tokens>,
    /// The fleet page's browser sessions and one-time login codes.
    sessions: Arc<Sessions>,
}

/// The router, ready to serve.
pub fn router(handle: Handle, tokens: Tokens) -> Router {
    let state = AppState {
        handle,
        tokens: Arc::new(tokens),
        sessions: Arc::new(Sessions::new()),
    };
    Router::new()
        .route("/v1/workloads", post(submit).get(list))
        .route("/v1/workloads/{name}", get(show).delete(cancel))
        .route("/v1/reconcile", post(reconcile_now))
        .route("/v1/suspend", post(suspend))
        .route("/v1/resume", post(resume))
        .route("/v1/usage", get(usage::usage))
        .route("/status", get(status))
        .route("/state", get(cluster_state))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/ui", get(ui::page))
        .route("/ui/login", get(ui::login_page).post(ui::login))
        .route("/ui/logout", post(ui::logout))
        .route("/v1/ui/links", post(ui::mint_link))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// An error response: status and a message that says what to fix.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "error": self.message }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("static"));
        }
        response
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        let status = match &e {
            ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
            ServiceError::Conflict(_) => StatusCode::CONFLICT,
            ServiceError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ServiceError::Ambiguous(_) => StatusCode::BAD_REQUEST,
            ServiceError::Forbidden(_) => StatusCode::FORBIDDEN,
            ServiceError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServiceError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            ServiceError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

/// The principal of the request's bearer token; `None` without an `Authorization` header.
fn bearer(tokens: &Tokens, headers: &HeaderMap) -> Result<Option<Principal>, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "expected a Bearer token"))?;
    tokens
        .authenticate(token.trim())
        .map(Some)
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unknown token"))
}

/// A request with a valid token, tenant's or operator's.
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        bearer(&state.tokens, &parts.headers)?
            .map(Caller)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "missing `Authorization: Bearer <token>` header",
                )
            })
    }
}

/// A request with the operator's token.
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match Caller::from_request_parts(parts, state).await?.0 {
            Principal::Admin => Ok(Operator),
            Principal::Tenant(_) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "this needs the operator's token",
            )),
        }
    }
}

/// A request with no token, or a valid one (an invalid token is still 401: a typo should not
/// read as "no details").
pub struct MaybeCaller(pub Option<Principal>);

impl FromRequestParts<AppState> for MaybeCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        bearer(&state.tokens, &parts.headers).map(MaybeCaller)
    }
}

/// `POST /v1/workloads`: `{name, spec}`, or the `kind: Workload` document `tessera submit`
/// reads (as JSON).
#[derive(Debug)]
pub enum Submission {
    Document(WorkloadDocument),
    Named(NamedSpec),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedSpec {
    pub name: String,
    pub spec: WorkloadSpec,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadDocument {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: WorkloadSpec,
}

impl Submission {
    /// The name and spec, once a document's envelope is checked.
    fn into_parts(self) -> Result<(String, WorkloadSpec), ApiError> {
        match self {
            Submission::Named(n) => Ok((n.name, n.spec)),
            Submission::Document(d) => {
                if d.kind != "Workload" {
                    return Err(ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        format!(
                            "kind: {:?} cannot be submitted; send `kind: Workload`",
                            d.kind
                        ),
                    ));
                }
                if d.api_version != API_VERSION {
                    return Err(ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        format!(
                            "apiVersion: {:?} is not supported; use {API_VERSION:?}",
                            d.api_version
                        ),
                    ));
                }
                Ok((d.metadata.name, d.spec))
            }
        }
    }
}

/// Reads a body as JSON, as `serde_json` says what is wrong with it (an untagged enum's own
/// error would only say that no shape matched).
fn parse_submission(value: serde_json::Value) -> Result<Submission, ApiError> {
    let malformed = |e: serde_json::Error| {
        ApiError::new(StatusCode::BAD_REQUEST, format!("malformed workload: {e}"))
    };
    if value.get("kind").is_some() || value.get("apiVersion").is_some() {
        serde_json::from_value(value)
            .map(Submission::Document)
            .map_err(malformed)
    } else {
        serde_json::from_value(value)
            .map(Submission::Named)
            .map_err(malformed)
    }
}

async fn submit(
    State(state): State<AppState>,
    Caller(who): Caller,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body.map_err(|e| match e {
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the workload as `Content-Type: application/json`",
        ),
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {MAX_BODY_BYTES} bytes"),
        ),
        other => ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("malformed workload: {}", other.body_text()),
        ),
    })?;
    let (name, spec) = parse_submission(body)?.into_parts()?;
    let handle = state.handle.clone();
    let view: WorkloadView = blocking(move || handle.submit(&who, &name, spec)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    tenant: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    Caller(who): Caller,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{}; the only parameter is `tenant`", e.body_text()),
        )
    })?;
    let handle = state.handle.clone();
    let views = blocking(move || handle.list(&who, query.tenant.as_deref())).await?;
    Ok(Json(json!({ "workloads": views })).into_response())
}

/// `?tenant=T` of one workload's routes: whose workload `{name}` is (names are per tenant).
fn tenant_query(
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Option<String>, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{}; the only parameter is `tenant`", e.body_text()),
        )
    })?;
    Ok(query.tenant)
}

async fn show(
    State(state): State<AppState>,
    Caller(who): Caller,
    Path(name): Path<String>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let tenant = tenant_query(query)?;
    let handle = state.handle.clone();
    let view = blocking(move || handle.get(&who, &name, tenant.as_deref())).await?;
    Ok(Json(view).into_response())
}

async fn cancel(
    State(state): State<AppState>,
    Caller(who): Caller,
    Path(name): Path<String>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let tenant = tenant_query(query)?;
    let handle = state.handle.clone();
    let view = blocking(move || handle.cancel(&who, &name, tenant.as_deref())).await?;
    Ok(Json(view).into_response())
}

async fn reconcile_now(State(state): State<AppState>, _: Operator) -> Result<Response, ApiError> {
    state.handle.reconcile_now();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "reconcile": "requested" })),
    )
        .into_response())
}

async fn suspend(State(state): State<AppState>, _: Operator) -> Response {
    set_suspended(&state, true)
}

async fn resume(State(state): State<AppState>, _: Operator) -> Response {
    set_suspended(&state, false)
}

fn set_suspended(state: &AppState, suspended: bool) -> Response {
    state.handle.set_suspended(suspended);
    Json(state.handle.status()).into_response()
}

async fn status(State(state): State<AppState>, MaybeCaller(who): MaybeCaller) -> Response {
    Json(state.handle.status().view_for(who.as_ref())).into_response()
}

async fn cluster_state(State(state): State<AppState>, _: Operator) -> Result<Response, ApiError> {
    let spec = state.handle.cluster_state().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no cycle has observed the fleet yet; retry in a moment",
        )
    })?;
    // A whole document, so that `curl .../state > state.json` is what `tessera plan --state`
    // reads; serialized from the shared snapshot, with no copy of it as a JSON tree, and
    // streamed: tens of MB on a large fleet, never held whole ([`stream_json`]).
    let body =
        stream_json::body(move |out| serde_json::to_writer(out, &crate::snapshot::document(&spec)));
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.handle.metrics(),
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok"
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such route; see the API table in the docs",
    )
}

/// Store calls are synchronous SQLite; they run off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ServiceError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(ApiError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> serde_json::Value {
        json!({"tenant": "a", "sloClass": "batch", "gpu": {"count": 1}})
    }

    #[test]
    fn a_submission_is_a_name_and_spec_or_a_workload_document() {
        let named = parse_submission(json!({"name": "w", "spec": spec()})).unwrap();
        assert_eq!(named.into_parts().unwrap().0, "w");
        let document = json!({
            "apiVersion": API_VERSION,
            "kind": "Workload",
            "metadata": {"name": "w", "labels": {"team": "x"}},
            "spec": spec(),
        });
        let (name, parsed) = parse_submission(document).unwrap().into_parts().unwrap();
        assert_eq!((name.as_str(), parsed.tenant.as_str()), ("w", "a"));
    }

    #[test]
    fn a_document_of_another_kind_or_version_is_refused_with_what_to_send() {
        let refuse = |body: serde_json::Value| {
            parse_submission(body)
                .and_then(Submission::into_parts)
                .unwrap_err()
        };
        let e = refuse(json!({
            "apiVersion": API_VERSION, "kind": "Tenant", "metadata": {"name": "w"}, "spec": spec(),
        }));
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.contains("kind: Workload"), "{}", e.message);
        let e = refuse(json!({
            "apiVersion": "tessera/v0", "kind": "Workload", "metadata": {"name": "w"},
            "spec": spec(),
        }));
        assert!(e.message.contains(API_VERSION), "{}", e.message);
        let e = refuse(json!({"name": "w", "spec": spec(), "extra": 1}));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("extra"), "{}", e.message);
        let e = refuse(json!({"kind": "Workload", "metadata": {"name": "w"}, "spec": spec()}));
        assert!(e.message.contains("apiVersion"), "{}", e.message);
    }
}
