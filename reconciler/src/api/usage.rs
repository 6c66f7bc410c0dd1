//! `GET /v1/usage?since=...&until=...`: metered usage in a window (RFC 3339 instants), for
//! `tessera report usage`. A tenant's token sees its own subtree, the operator's everything.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tessera_compiler::units::parse_rfc3339;

use super::{ApiError, AppState, Caller, blocking};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UsageQuery {
    since: String,
    until: String,
}

pub(super) async fn usage(
    State(state): State<AppState>,
    Caller(who): Caller,
    query: Result<Query<UsageQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{}; give `since` and `until` as RFC 3339 instants",
                e.body_text()
            ),
        )
    })?;
    let instant = |field: &str, value: &str| {
        // The store counts in Unix seconds: the instant becomes one at this edge.
        parse_rfc3339(value).map(|t| t.as_second()).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("{field}: {value:?} is not an RFC 3339 instant (2026-11-01T00:00:00Z)"),
            )
        })
    };
    let since = instant("since", &query.since)?;
    let until = instant("until", &query.until)?;
    let handle = state.handle.clone();
    let report = blocking(move || handle.usage(&who, since, until)).await?;
    Ok(Json(report).into_response())
}
