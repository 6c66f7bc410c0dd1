//! `POST /v1/hooks/git` over real HTTP on loopback, with no reconcile loop behind it: what the
//! route asks of the loop is exactly what arrives on the wake-up channel. A refused hook asks
//! nothing; a flood of accepted hooks asks for one fetch until the loop begins it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tessera_reconciler::api::hooks::{self, HookSecret};
use tessera_reconciler::service::{Shared, Wake};

const SECRET: &str = "0123456789abcdef-hook-secret";

struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    rx: Receiver<Wake>,
    _runtime: tokio::runtime::Runtime,
}

fn server() -> Server {
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(Shared::new("sim", tx));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let app = hooks::router(
        HookSecret::new(SECRET).unwrap(),
        "main".into(),
        shared.clone(),
    );
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move { axum::serve(listener, app).await });
    Server {
        addr,
        shared,
        rx,
        _runtime: runtime,
    }
}

/// One HTTP/1.1 request; returns the status code once the response is complete.
fn post(addr: SocketAddr, body: &str, headers: &[(&str, String)]) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    let mut request = format!(
        "POST /v1/hooks/git HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
}

fn github_signature(body: &str) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

fn wakes(rx: &Receiver<Wake>) -> Vec<Wake> {
    rx.try_iter().collect()
}

const PUSH: &str =
    r#"{"ref":"refs/heads/main","after":"0000000000000000000000000000000000000000"}"#;

#[test]
fn a_refused_hook_is_401_and_asks_for_nothing() {
    let s = server();
    let forged = [
        vec![("X-Hub-Signature-256", github_signature("{}"))],
        vec![(
            "X-Hub-Signature-256",
            "sha256=".to_string() + &"0".repeat(64),
        )],
        vec![("X-Gitlab-Token", "0123456789abcdef-hook-secreT".to_string())],
        vec![],
    ];
    for headers in &forged {
        assert_eq!(post(s.addr, PUSH, headers), 401, "{headers:?}");
    }
    assert!(wakes(&s.rx).is_empty());
}

#[test]
fn a_flood_of_hooks_asks_for_one_fetch() {
    let s = server();
    let signed = vec![
        ("X-GitHub-Event", "push".to_string()),
        ("X-Hub-Signature-256", github_signature(PUSH)),
    ];
    for _ in 0..25 {
        assert_eq!(post(s.addr, PUSH, &signed), 202);
    }
    let gitlab = vec![
        ("X-Gitlab-Event", "Push Hook".to_string()),
        ("X-Gitlab-Token", SECRET.to_string()),
    ];
    for _ in 0..25 {
        assert_eq!(post(s.addr, PUSH, &gitlab), 202);
    }
    assert_eq!(wakes(&s.rx), [Wake::Repository]);
    // Once the loop begins its fetch, a later push asks again.
    s.shared.fetch_begins();
    assert_eq!(post(s.addr, PUSH, &signed), 202);
    assert_eq!(wakes(&s.rx), [Wake::Repository]);
}

#[test]
fn pushes_to_other_branches_and_pings_fetch_nothing() {
    let s = server();
    let other = r#"{"ref":"refs/heads/feature"}"#;
    let headers = vec![
        ("X-GitHub-Event", "push".to_string()),
        ("X-Hub-Signature-256", github_signature(other)),
    ];
    assert_eq!(post(s.addr, other, &headers), 202);
    let ping = r#"{"zen":"Design for failure."}"#;
    let headers = vec![
        ("X-GitHub-Event", "ping".to_string()),
        ("X-Hub-Signature-256", github_signature(ping)),
    ];
    assert_eq!(post(s.addr, ping, &headers), 202);
    assert!(wakes(&s.rx).is_empty());
}
