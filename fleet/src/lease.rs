//! Keeping an etcd lease alive, and knowing locally when it may be gone.
//!
//! A keepalive is sent every third of the TTL. The local deadline is the instant the last
//! answered keepalive was *sent* plus the TTL: etcd renewed the lease after that instant, so
//! etcd's own expiry is never earlier than the local deadline, and a holder that stops acting
//! at its deadline stops no later than etcd hands the key to someone else (up to clock rate
//! drift between the two machines over one TTL). That is the courtesy; the fence
//! ([`crate::election::Fence`]) is the guarantee.

use std::time::Duration;

use etcd_client::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

/// Keeps one lease alive while it exists; aborts its task on drop.
#[derive(Debug)]
pub(crate) struct KeepAlive {
    task: JoinHandle<()>,
    gone: watch::Receiver<bool>,
}

impl KeepAlive {
    /// Starts keeping `lease` (of `ttl`, granted by a request sent at `granted`) alive.
    pub(crate) fn start(client: Client, lease: i64, ttl: Duration, granted: Instant) -> KeepAlive {
        let (tx, gone) = watch::channel(false);
        let task = tokio::spawn(async move {
            run(client, lease, ttl, granted).await;
            let _ = tx.send(true);
        });
        KeepAlive { task, gone }
    }

    /// Whether the lease is known gone, or may be (its local deadline passed unrenewed, or
    /// renewing was stopped).
    pub(crate) fn is_gone(&self) -> bool {
        *self.gone.borrow() || self.gone.has_changed().is_err()
    }

    /// Resolves when [`KeepAlive::is_gone`] becomes true.
    pub(crate) async fn gone(&mut self) {
        // An error means the task ended without saying: it was stopped, which is gone too.
        let _ = self.gone.wait_for(|gone| *gone).await;
    }

    /// Stops renewing (the lease then expires at its TTL); for tests of an agent that stalls.
    pub(crate) fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(client: Client, lease: i64, ttl: Duration, granted: Instant) {
    let period = ttl / 3;
    let mut deadline = granted + ttl;
    let mut stream = None;
    loop {
        let sent = Instant::now();
        if sent >= deadline {
            return;
        }
        // No attempt runs past the deadline: a holder learns it may have lost the lease then,
        // not a slow request later.
        let give_up = (sent + period).min(deadline);
        if stream.is_none() {
            let mut client = client.clone();
            if let Ok(Ok(pair)) = timeout_at(give_up, client.lease_keep_alive(lease)).await {
                stream = Some(pair);
            }
        }
        if let Some((keeper, answers)) = stream.as_mut() {
            let renewed = timeout_at(give_up, async {
                keeper.keep_alive().await?;
                answers.message().await
            })
            .await;
            match renewed {
                // Renewed by a request sent after `sent`: etcd's expiry is at least `sent + ttl`.
                Ok(Ok(Some(answer))) if answer.ttl() > 0 => deadline = sent + ttl,
                // etcd answers TTL 0 for a lease that expired or was revoked: it is gone for good.
                Ok(Ok(Some(_))) => return,
                // The stream broke or etcd did not answer in time: open a new one next round,
                // until the deadline says the lease may be gone.
                _ => stream = None,
            }
        }
        sleep_until(give_up).await;
    }
}
