//! The fleet page's routes (see [`crate::ui`]):
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /ui` | a signed-in browser | the fleet page; without a session, a redirect to `/ui/login` |
//! | `GET /ui/login` | anyone | the login form |
//! | `POST /ui/login` | anyone | form field `token`: opens a session (cookie) and redirects to `/ui` |
//! | `GET /ui/login?once=CODE` | anyone | redeems a one-time code: a session, then `/ui` |
//! | `POST /ui/logout` | anyone | ends the session |
//! | `POST /v1/ui/links` | tenant, admin | mints a one-time login link (60 s, usable once) for the caller |
//!
//! The cookie holds a random session id only, `HttpOnly; SameSite=Strict; Path=/ui`, so no
//! script could read it and no other site's page can make the browser send it. HTML answers
//! carry a Content-Security-Policy that allows no script at all.

use axum::Json;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, AppState, Caller, blocking};
use crate::auth::Principal;
use crate::service::ServiceError;
use crate::snapshot::{now, rfc3339};
use crate::ui::sessions::{SESSION_TTL_SECONDS, SessionError};
use crate::ui::{FleetPage, Sources, render};

/// The session cookie's name.
pub const COOKIE: &str = "tessera_session";

/// The page's usage column covers this much time up to now.
const DAY_SECONDS: i64 = 86_400;

const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// An HTML answer with the headers every page carries.
fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CACHE_CONTROL, "no-store"),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn redirect(to: &'static str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    response
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The session ids the request's cookies carry, in order.
fn session_ids(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

/// Who the request's session belongs to, if it has a live one.
fn session(state: &AppState, headers: &HeaderMap) -> Option<Principal> {
    let now = now();
    session_ids(headers).find_map(|id| state.sessions.principal(id, now))
}

/// Opens a session for `who` and sends the browser to the page.
fn signed_in(state: &AppState, who: Principal) -> Response {
    match state.sessions.open(who, now()) {
        Ok(opened) => {
            let mut response = redirect("/ui");
            let cookie = format!(
                "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/ui; Max-Age={SESSION_TTL_SECONDS}",
                opened.id
            );
            // 64 hex digits and fixed attributes: always a valid header value.
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Err(e) => html(
            StatusCode::INTERNAL_SERVER_ERROR,
            render::login(Some(&e.to_string())),
        ),
    }
}

/// `GET /ui`.
pub(super) async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some(who) = session(&state, &headers) else {
        return Ok(redirect("/ui/login"));
    };
    let handle = state.handle.clone();
    let body = blocking(move || {
        let now = now();
        let status = handle.status();
        let cluster = handle.cluster_state();
        let decisions = handle.decision_index();
        let day = match handle.usage(&who, now - DAY_SECONDS, now) {
            Ok(report) => Some(report),
            // No revision in force yet: the page shows no metered figures.
            Err(ServiceError::NotReady(_)) => None,
            Err(e) => return Err(e),
        };
        let page = FleetPage::build(&Sources {
            viewer: &who,
            now,
            status: &status,
            state: cluster.as_deref(),
            decisions: decisions.as_deref(),
            day: day.as_ref(),
        });
        Ok(render::page(&page))
    })
    .await?;
    Ok(html(StatusCode::OK, body))
}

#[derive(Debug, Deserialize)]
pub(super) struct LoginQuery {
    once: Option<String>,
}

/// `GET /ui/login[?once=CODE]`.
pub(super) async fn login_page(
    State(state): State<AppState>,
    query: Result<Query<LoginQuery>, QueryRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return html(
            StatusCode::BAD_REQUEST,
            render::login(Some("the only parameter is `once`, a login link's code")),
        );
    };
    match query.once {
        None => html(StatusCode::OK, render::login(None)),
        Some(code) => match state.sessions.redeem_code(&code, now()) {
            Ok(who) => signed_in(&state, who),
            Err(e) => html(
                StatusCode::UNAUTHORIZED,
                render::login(Some(&e.to_string())),
            ),
        },
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct LoginForm {
    token: String,
}

/// `POST /ui/login` with the form field `token`.
pub(super) async fn login(
    State(state): State<AppState>,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return html(
            StatusCode::BAD_REQUEST,
            render::login(Some("send the form with its one field, `token`")),
        );
    };
    match state.tokens.authenticate(form.token.trim()) {
        Some(who) => signed_in(&state, who),
        None => html(
            StatusCode::UNAUTHORIZED,
            render::login(Some(
                "unknown token: give the operator's token or your tenant's, as the API takes",
            )),
        ),
    }
}

/// `POST /ui/logout`.
pub(super) async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
    for id in session_ids(&headers) {
        state.sessions.close(id);
    }
    let mut response = redirect("/ui/login");
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "tessera_session=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0",
        ),
    );
    response
}

/// `POST /v1/ui/links`: a one-time login link for the caller's principal.
pub(super) async fn mint_link(
    State(state): State<AppState>,
    Caller(who): Caller,
) -> Result<Response, ApiError> {
    let minted = state.sessions.mint_code(who, now()).map_err(|e| {
        let status = match e {
            SessionError::TooManyCodes => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    })?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "path": format!("/ui/login?once={}", minted.code),
            "expiresAt": rfc3339(minted.expires_at),
        })),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            "a=1; tessera_session=abc; b=2".parse().unwrap(),
        );
        headers.append(header::COOKIE, "tessera_session=def".parse().unwrap());
        headers.append(header::COOKIE, "tessera_sessionx=no".parse().unwrap());
        assert_eq!(session_ids(&headers).collect::<Vec<_>>(), ["abc", "def"]);
    }
}
