//! The HTTP API (axum).
//!
//! | route | who | what |
//! |---|---|---|
//! | `POST /v1/workloads` | tenant, admin | submit `{name, spec}` (a `WorkloadSpec`) |
//! | `GET /v1/workloads` | tenant, admin | the caller's workloads (admin: all) |
//! | `GET /v1/workloads/{name}` | tenant, admin | one workload |
//! | `DELETE /v1/workloads/{name}` | tenant, admin | cancel |
//! | `POST /v1/reconcile` | admin | run a cycle now |
//! | `POST /v1/suspend`, `POST /v1/resume` | admin | stop and restart applying changes |
//! | `GET /status` | anyone | sync, health, revision, last error |
//! | `GET /state` | admin | the `ClusterState` that `tessera plan` reads |
//! | `GET /metrics` | anyone | Prometheus |
//! | `GET /healthz` | anyone | liveness |
//! | `POST /v1/hooks/git` | the forge (HMAC or token) | fetch now ([`hooks`]) |
//!
//! A missing or unknown token is 401, a tenant reaching for another tenant's workload gets 404
//! (the name is not confirmed to exist) or 403 for a submission in another tenant's name, and
//! neither leaves a trace in the store. Bodies over [`MAX_BODY_BYTES`] are 413. Every error is a
//! JSON body `{"error": "..."}` that says what to fix.

pub mod hooks;

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tessera_compiler::model::WorkloadSpec;

use crate::auth::{Principal, Tokens};
use crate::service::{Handle, ServiceError};

/// Request bodies larger than this are refused before they are read.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

#[derive(Clone)]
struct AppState {
    handle: Handle,
    tokens: Arc<Tokens>,
}

/// The router, ready to serve.
pub fn router(handle: Handle, tokens: Tokens) -> Router {
    let state = AppState {
        handle,
        tokens: Arc::new(tokens),
    };
    Router::new()
        .route("/v1/workloads", post(submit).get(list))
        .route("/v1/workloads/{name}", get(show).delete(cancel))
        .route("/v1/reconcile", post(reconcile_now))
        .route("/v1/suspend", post(suspend))
        .route("/v1/resume", post(resume))
        .route("/status", get(status))
        .route("/state", get(cluster_state))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
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
            ServiceError::Forbidden(_) => StatusCode::FORBIDDEN,
            ServiceError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            ServiceError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

fn principal(state: &AppState, headers: &HeaderMap) -> Result<Principal, ApiError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing `Authorization: Bearer <token>` header",
            )
        })?;
    let token = value
        .strip_prefix("Bearer ")
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "expected a Bearer token"))?;
    state
        .tokens
        .authenticate(token.trim())
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unknown token"))
}

fn admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    match principal(state, headers)? {
        Principal::Admin => Ok(()),
        Principal::Tenant(_) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "this needs the operator's token",
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submission {
    pub name: String,
    pub spec: WorkloadSpec,
}

async fn submit(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<Submission>, JsonRejection>,
) -> Result<Response, ApiError> {
    let who = principal(&state, &headers)?;
    let Json(submission) = body.map_err(|e| match e {
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
    let handle = state.handle.clone();
    let record = blocking(move || handle.submit(&who, &submission.name, submission.spec)).await?;
    Ok((StatusCode::CREATED, Json(record)).into_response())
}

async fn list(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let who = principal(&state, &headers)?;
    let handle = state.handle.clone();
    let records = blocking(move || handle.list(&who)).await?;
    Ok(Json(json!({ "workloads": records })).into_response())
}

async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let who = principal(&state, &headers)?;
    let handle = state.handle.clone();
    let record = blocking(move || handle.get(&who, &name)).await?;
    Ok(Json(record).into_response())
}

async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let who = principal(&state, &headers)?;
    let handle = state.handle.clone();
    let record = blocking(move || handle.cancel(&who, &name)).await?;
    Ok(Json(record).into_response())
}

async fn reconcile_now(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin(&state, &headers)?;
    state.handle.reconcile_now();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "reconcile": "requested" })),
    )
        .into_response())
}

async fn suspend(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    set_suspended(&state, &headers, true)
}

async fn resume(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    set_suspended(&state, &headers, false)
}

fn set_suspended(
    state: &AppState,
    headers: &HeaderMap,
    suspended: bool,
) -> Result<Response, ApiError> {
    admin(state, headers)?;
    state.handle.set_suspended(suspended);
    Ok(Json(state.handle.status()).into_response())
}

async fn status(State(state): State<AppState>) -> Response {
    Json(state.handle.status()).into_response()
}

async fn cluster_state(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin(&state, &headers)?;
    let snapshot = state.handle.cluster_state().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no cycle has observed the fleet yet; retry in a moment",
        )
    })?;
    // A whole document, so that `curl .../state > state.json` is what `tessera plan --state`
    // reads.
    Ok(Json(json!({
        "apiVersion": tessera_compiler::model::API_VERSION,
        "kind": "ClusterState",
        "metadata": { "name": "observed" },
        "spec": snapshot,
    }))
    .into_response())
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
