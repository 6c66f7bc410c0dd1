//! `POST /v1/hooks/git`: push webhooks from GitHub and GitLab, so that a push is fetched at once
//! instead of at the next fetch interval.
//!
//! A hook is authenticated before anything else is read: GitHub's `X-Hub-Signature-256`
//! (`sha256=` and the hex HMAC-SHA256 of the raw body under the shared secret) or GitLab's
//! `X-Gitlab-Token` (the secret itself). Both are compared in constant time. A hook that fails is
//! 401 and triggers nothing. A push to another branch, a ping and other events are answered and
//! ignored. A hook only asks for a fetch: what is fetched is still verified and compiled as any
//! other revision, so a hook can make tessera look sooner, never apply something else. Requests
//! that arrive before the loop begins its fetch make one fetch ([`Shared::request_fetch`]).

use std::path::Path;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::ApiError;
use crate::service::Shared;

/// Push payloads list the commits pushed; GitHub caps them at 25 MB, but a policy repository's
/// pushes are small. Larger bodies are 413.
pub const MAX_HOOK_BYTES: usize = 4 * 1024 * 1024;

/// Secrets shorter than this are refused at load: a guessable secret authenticates nobody.
pub const MIN_SECRET_LEN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum HookSecretError {
    #[error("{path}: {reason}")]
    Read { path: String, reason: String },
    #[error(
        "{path}: the webhook secret needs at least {MIN_SECRET_LEN} characters (try `openssl rand -hex 32`)"
    )]
    TooShort { path: String },
}

/// The shared secret, as configured at the forge.
pub struct HookSecret {
    secret: Vec<u8>,
    digest: [u8; 32],
}

impl HookSecret {
    /// Reads the secret from `path`; surrounding whitespace (a trailing newline) is not part of it.
    pub fn load(path: &Path) -> Result<HookSecret, HookSecretError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| HookSecretError::Read {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        HookSecret::new(text.trim()).ok_or(HookSecretError::TooShort { path: shown })
    }

    pub fn new(secret: &str) -> Option<HookSecret> {
        (secret.len() >= MIN_SECRET_LEN).then(|| HookSecret {
            secret: secret.as_bytes().to_vec(),
            digest: Sha256::digest(secret.as_bytes()).into(),
        })
    }

    /// GitHub: `sha256=<hex HMAC-SHA256 of the body>`.
    fn github_signature_matches(&self, header: &str, body: &[u8]) -> bool {
        let Some(hex) = header.trim().strip_prefix("sha256=") else {
            return false;
        };
        let Some(expected) = decode_hex(hex) else {
            return false;
        };
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret)
            .expect("HMAC takes a key of any length");
        mac.update(body);
        // `verify_slice` compares in constant time.
        mac.verify_slice(&expected).is_ok()
    }

    /// GitLab: the secret itself, compared by digest in constant time.
    fn gitlab_token_matches(&self, token: &str) -> bool {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        crate::auth::constant_time_eq(&presented, &self.digest)
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Which forge sent an authenticated hook, and what it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hook {
    /// A push (GitHub `push`, GitLab `Push Hook`) to `git_ref`, when the body names one.
    Push { git_ref: Option<String> },
    /// GitHub's `ping` on creation, or another event: answered, nothing fetched.
    Other { event: String },
}

/// Authenticates a hook and reads what it is about. `Err` is the 401 to answer.
pub fn authenticate(secret: &HookSecret, headers: &HeaderMap, body: &[u8]) -> Result<Hook, String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let event = if let Some(signature) = header("x-hub-signature-256") {
        if !secret.github_signature_matches(signature, body) {
            return Err(
                "X-Hub-Signature-256 does not match the body under the webhook secret".into(),
            );
        }
        let event = header("x-github-event").unwrap_or("push");
        (event == "push", event.to_string())
    } else if let Some(token) = header("x-gitlab-token") {
        if !secret.gitlab_token_matches(token) {
            return Err("X-Gitlab-Token is not the webhook secret".into());
        }
        let event = header("x-gitlab-event").unwrap_or("Push Hook");
        (event == "Push Hook", event.to_string())
    } else {
        return Err(
            "unsigned hook: send GitHub's X-Hub-Signature-256 or GitLab's X-Gitlab-Token".into(),
        );
    };
    match event {
        (true, _) => {
            let git_ref = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.get("ref").and_then(|r| r.as_str()).map(str::to_string));
            Ok(Hook::Push { git_ref })
        }
        (false, event) => Ok(Hook::Other { event }),
    }
}

#[derive(Clone)]
struct HookState {
    secret: Arc<HookSecret>,
    branch: String,
    shared: Arc<Shared>,
}

/// The hook route, to merge into the API's router.
pub fn router(secret: HookSecret, branch: String, shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/hooks/git", post(receive))
        .layer(DefaultBodyLimit::max(MAX_HOOK_BYTES))
        .with_state(HookState {
            secret: Arc::new(secret),
            branch,
            shared,
        })
}

async fn receive(
    State(state): State<HookState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let hook = authenticate(&state.secret, &headers, &body)
        .map_err(|m| ApiError::new(StatusCode::UNAUTHORIZED, m))?;
    let ours = format!("refs/heads/{}", state.branch);
    let answer = match hook {
        Hook::Push { git_ref: Some(r) } if r != ours => {
            json!({ "fetch": "ignored", "why": format!("a push to {r}; tessera follows {ours}") })
        }
        Hook::Push { .. } => {
            let first = state.shared.request_fetch();
            json!({ "fetch": if first { "requested" } else { "already requested" } })
        }
        Hook::Other { event } => {
            json!({ "fetch": "ignored", "why": format!("event {event:?} is not a push") })
        }
    };
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn secret() -> HookSecret {
        HookSecret::new("0123456789abcdef-secret").unwrap()
    }

    fn github(signature: &str, event: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            "x-hub-signature-256",
            HeaderValue::from_str(signature).unwrap(),
        );
        h.insert("x-github-event", HeaderValue::from_str(event).unwrap());
        h
    }

    fn sign(body: &[u8]) -> String {
        let mut mac =
            <Hmac<Sha256> as KeyInit>::new_from_slice(b"0123456789abcdef-secret").unwrap();
        mac.update(body);
        let bytes = mac.finalize().into_bytes();
        format!(
            "sha256={}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    }

    #[test]
    fn a_github_push_signed_with_the_secret_is_accepted() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        let hook = authenticate(&secret(), &github(&sign(body), "push"), body).unwrap();
        assert_eq!(
            hook,
            Hook::Push {
                git_ref: Some("refs/heads/main".into())
            }
        );
    }

    #[test]
    fn a_signature_over_other_bytes_or_under_another_secret_is_refused() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        let other = br#"{"ref":"refs/heads/evil"}"#;
        assert!(authenticate(&secret(), &github(&sign(other), "push"), body).is_err());
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(b"another-secret-of-16+").unwrap();
        mac.update(body);
        let wrong = format!(
            "sha256={}",
            mac.finalize()
                .into_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        assert!(authenticate(&secret(), &github(&wrong, "push"), body).is_err());
        assert!(authenticate(&secret(), &github("sha256=zz", "push"), body).is_err());
        assert!(authenticate(&secret(), &github("sha1=00", "push"), body).is_err());
        assert!(authenticate(&secret(), &HeaderMap::new(), body).is_err());
    }

    #[test]
    fn gitlab_tokens_are_the_secret() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-gitlab-token",
            HeaderValue::from_static("0123456789abcdef-secret"),
        );
        h.insert("x-gitlab-event", HeaderValue::from_static("Push Hook"));
        assert!(matches!(
            authenticate(&secret(), &h, b"{}"),
            Ok(Hook::Push { git_ref: None })
        ));
        h.insert(
            "x-gitlab-token",
            HeaderValue::from_static("0123456789abcdef-secreT"),
        );
        assert!(authenticate(&secret(), &h, b"{}").is_err());
    }

    #[test]
    fn pings_are_answered_not_fetched() {
        let body = br#"{"zen":"Keep it logically awesome."}"#;
        let hook = authenticate(&secret(), &github(&sign(body), "ping"), body).unwrap();
        assert_eq!(
            hook,
            Hook::Other {
                event: "ping".into()
            }
        );
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(HookSecret::new("short").is_none());
    }
}
