//! A standby's writes, forwarded to the leader: the request goes on as the caller sent it
//! (method, path, query, body, and every end-to-end header, the bearer token among them, so
//! the leader authorizes the caller and not the standby), and the leader's answer comes back
//! as it is.
//!
//! A forwarded request carries `x-tessera-forwarded-by`; a replica that does not lead answers
//! such a request itself rather than forward it again, so a request crosses at most one hop
//! even while replicas disagree about who leads.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::uri::{PathAndQuery, Uri};
use axum::response::Response;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The header a forwarded request carries: the id of the replica that forwarded it.
pub const FORWARDED_BY: &str = "x-tessera-forwarded-by";

/// How long a standby waits to connect to the leader.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a write was not forwarded; the standby then answers 503 with where the leader is.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("the leader's address {url} is not an http:// URL this replica can forward to")]
    Address { url: String },
    #[error("cannot reach the leader at {url}: {reason}; the write was not applied")]
    Unreachable { url: String, reason: String },
    #[error(
        "the leader at {url} did not answer within {}s; the write may have been applied: \
         read it back before sending it again",
        .after.as_secs()
    )]
    NoAnswer { url: String, after: Duration },
}

/// Forwards requests to the leader over one pool of HTTP/1 connections.
#[derive(Clone)]
pub struct Forwarder {
    client: Client<HttpConnector, Body>,
    /// This replica's id, sent in `FORWARDED_BY`.
    replica: HeaderValue,
    /// The longest wait for the leader's answer (its status and headers).
    answer_within: Duration,
}

impl Forwarder {
    /// `replica`: this replica's id (a header value; characters that cannot be one are
    /// replaced). `answer_within`: how long the leader may take to answer.
    pub fn new(replica: &str, answer_within: Duration) -> Forwarder {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        let printable: String = replica
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '_' })
            .collect();
        Forwarder {
            client,
            replica: HeaderValue::from_str(&printable)
                .unwrap_or_else(|_| HeaderValue::from_static("replica")),
            answer_within,
        }
    }

    /// Sends `request` to the leader at `leader` (its advertised URL, e.g.
    /// `http://10.0.0.5:8080`) and returns its answer.
    pub async fn forward(&self, leader: &str, request: Request) -> Result<Response, ForwardError> {
        let (mut parts, body) = request.into_parts();
        parts.uri = leader_uri(leader, parts.uri.path_and_query())?;
        parts.headers = end_to_end(&parts.headers);
        parts
            .headers
            .insert(HeaderName::from_static(FORWARDED_BY), self.replica.clone());
        // hyper sets Host from the URI; the caller's Host named this replica.
        parts.version = axum::http::Version::HTTP_11;
        let sent = self
            .client
            .request(axum::http::Request::from_parts(parts, body));
        let answer = match tokio::time::timeout(self.answer_within, sent).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) if e.is_connect() => {
                return Err(ForwardError::Unreachable {
                    url: leader.to_string(),
                    reason: error_chain(&e),
                });
            }
            // The request may have reached the leader before the connection broke.
            Ok(Err(e)) => {
                tracing::warn!("forwarding to {leader}: {}", error_chain(&e));
                return Err(ForwardError::NoAnswer {
                    url: leader.to_string(),
                    after: self.answer_within,
                });
            }
            Err(_) => {
                return Err(ForwardError::NoAnswer {
                    url: leader.to_string(),
                    after: self.answer_within,
                });
            }
        };
        let (mut parts, body) = answer.into_parts();
        parts.headers = end_to_end(&parts.headers);
        Ok(Response::from_parts(parts, Body::new(body)))
    }
}

/// Whether `request` was forwarded by another replica already.
pub fn was_forwarded(request: &Request) -> Option<String> {
    request
        .headers()
        .get(FORWARDED_BY)
        .map(|by| String::from_utf8_lossy(by.as_bytes()).into_owned())
}

/// The leader's URL with the request's path and query; `leader` may carry a path prefix of
/// its own (a reverse proxy's), which the request's path follows.
fn leader_uri(leader: &str, path: Option<&PathAndQuery>) -> Result<Uri, ForwardError> {
    let refused = || ForwardError::Address {
        url: leader.to_string(),
    };
    let base: Uri = leader.parse().map_err(|_| refused())?;
    if base.scheme_str() != Some("http") || base.authority().is_none() {
        return Err(refused());
    }
    let path = path.map_or("/", PathAndQuery::as_str);
    format!("{}{path}", leader.trim_end_matches('/'))
        .parse()
        .map_err(|_| refused())
}

/// `headers` without the hop-by-hop ones (RFC 9110 §7.6.1: `Connection` and what it names,
/// and the fixed list) and without `Host`, which names the hop.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named_by_connection: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let hop_by_hop = [
        header::CONNECTION,
        header::HOST,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("keep-alive"),
    ];
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if hop_by_hop.contains(name) || named_by_connection.iter().any(|n| n == name.as_str()) {
            continue;
        }
        kept.append(name.clone(), value.clone());
    }
    kept
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::http::{Method, StatusCode};
    use axum::routing::any;

    use super::*;

    /// A stand-in leader on a loopback port that answers with what it received.
    async fn echo_leader() -> String {
        async fn echo(request: Request) -> Response {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let headers: serde_json::Map<String, serde_json::Value> = parts
                .headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().into()))
                .collect();
            let answer = serde_json::json!({
                "method": parts.method.as_str(),
                "uri": parts.uri.to_string(),
                "headers": headers,
                "body": String::from_utf8_lossy(&body),
            });
            Response::builder()
                .status(StatusCode::CREATED)
                .header("x-leader", "yes")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(answer.to_string()))
                .unwrap()
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(axum::serve(listener, Router::new().fallback(any(echo))).into_future());
        url
    }

    fn post(path: &str) -> Request {
        axum::http::Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::HOST, "standby.example:8080")
            .header(header::AUTHORIZATION, "Bearer tenant-token")
            .header(header::CONNECTION, "keep-alive, x-private")
            .header("x-private", "for the first hop only")
            .header("x-hub-signature-256", "sha256=abc")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"name":"w"}"#))
            .unwrap()
    }

    async fn json(response: Response) -> serde_json::Value {
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    #[tokio::test]
    async fn the_leader_receives_the_callers_request_and_the_caller_its_answer() {
        let leader = echo_leader().await;
        let forwarder = Forwarder::new("standby-1", Duration::from_secs(30));
        let answer = forwarder
            .forward(&leader, post("/v1/workloads?dry=1"))
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED);
        assert_eq!(answer.headers()["x-leader"], "yes");
        let seen = json(answer).await;
        assert_eq!(seen["method"], "POST");
        assert_eq!(seen["uri"], "/v1/workloads?dry=1");
        assert_eq!(seen["body"], r#"{"name":"w"}"#);
        let headers = &seen["headers"];
        assert_eq!(headers["authorization"], "Bearer tenant-token");
        assert_eq!(headers["x-hub-signature-256"], "sha256=abc");
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers[FORWARDED_BY], "standby-1");
        // Host names the leader now; what was for the first hop only stayed there.
        assert_eq!(headers["host"], leader.trim_start_matches("http://"));
        assert!(headers.get("x-private").is_none(), "{headers}");
    }

    #[tokio::test]
    async fn a_leader_behind_a_path_prefix_gets_the_path_after_it() {
        let leader = echo_leader().await;
        let forwarder = Forwarder::new("standby-1", Duration::from_secs(30));
        let answer = forwarder
            .forward(&format!("{leader}/tessera/"), post("/v1/reconcile"))
            .await
            .unwrap();
        assert_eq!(json(answer).await["uri"], "/tessera/v1/reconcile");
    }

    #[tokio::test]
    async fn a_leader_no_one_listens_for_is_unreachable_and_nothing_was_applied() {
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", listener.local_addr().unwrap())
        };
        let forwarder = Forwarder::new("standby-1", Duration::from_secs(30));
        match forwarder.forward(&closed, post("/v1/workloads")).await {
            Err(e @ ForwardError::Unreachable { .. }) => {
                assert!(e.to_string().contains("was not applied"), "{e}")
            }
            other => panic!("expected unreachable, got {:?}", other.map(|r| r.status())),
        }
    }

    #[tokio::test]
    async fn a_leader_that_accepts_and_never_answers_is_given_up_on() {
        // Accepts connections (the kernel's backlog) and never reads or answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", silent.local_addr().unwrap());
        let forwarder = Forwarder::new("standby-1", Duration::from_millis(300));
        match forwarder.forward(&url, post("/v1/workloads")).await {
            Err(e @ ForwardError::NoAnswer { .. }) => {
                assert!(e.to_string().contains("may have been applied"), "{e}")
            }
            other => panic!("expected no answer, got {:?}", other.map(|r| r.status())),
        }
        drop(silent);
    }

    #[test]
    fn only_http_urls_with_a_host_are_forwarded_to() {
        for bad in ["https://leader:8443", "leader:8080", "/v1", "http://", ""] {
            assert!(
                matches!(leader_uri(bad, None), Err(ForwardError::Address { .. })),
                "{bad}"
            );
        }
        let path = PathAndQuery::from_static("/v1/workloads/a?x=1");
        assert_eq!(
            leader_uri("http://10.0.0.5:8080", Some(&path))
                .unwrap()
                .to_string(),
            "http://10.0.0.5:8080/v1/workloads/a?x=1"
        );
    }
}
