//! What the fleet tests share: a real etcd, clients, the key space, a leader, and a bound on
//! waiting.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, KeyValue};
use tessera_fleet::access::Credentials;
use tessera_fleet::election::{Candidate, LeaderInfo, Leadership};
use tessera_fleet::keys::Keys;
use tessera_fleet::testing::TestEtcd;

/// The lease period the tests use: etcd's minimum with its default timings (a TTL of 1 s is
/// raised to it), so that expiry tests take seconds.
pub const TTL_SECS: i64 = 2;

/// The key space every test writes under.
pub fn keys() -> Keys {
    Keys::new("test").unwrap()
}

/// Leader `id`, elected on a lease of `ttl_secs`.
pub async fn leader(client: &Client, id: &str, ttl_secs: i64) -> Leadership {
    let info = LeaderInfo {
        id: id.to_string(),
        advertise: None,
    };
    Candidate::new(client.clone(), keys(), info, ttl_secs)
        .campaign()
        .await
        .unwrap()
}

/// Every key under `prefix`, with its value, as etcd holds them now.
pub async fn read_prefix(client: &Client, prefix: &str) -> Vec<KeyValue> {
    let mut answer = client
        .clone()
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap_or_else(|e| panic!("reading {prefix}: {e}"));
    answer.take_kvs()
}

pub fn etcd() -> TestEtcd {
    TestEtcd::start().unwrap_or_else(|e| panic!("{e}"))
}

pub async fn connect(etcd: &TestEtcd) -> Client {
    Client::connect([etcd.endpoint()], None)
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", etcd.endpoint()))
}

pub async fn connect_as(etcd: &TestEtcd, who: &Credentials) -> Client {
    Client::connect(
        [etcd.endpoint()],
        Some(ConnectOptions::new().with_user(who.user.clone(), who.password.clone())),
    )
    .await
    .unwrap_or_else(|e| panic!("connecting to {} as {}: {e}", etcd.endpoint(), who.user))
}

/// Awaits `future`, failing the test with `what` if it takes longer than `limit`. The limit
/// is a bound the behaviour promises (a lease period), never a guess at how fast it runs.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {limit:?}"))
}

/// Two lease periods: how long a failover or an expiry may take.
pub fn two_lease_periods() -> Duration {
    Duration::from_secs(2 * TTL_SECS as u64)
}
