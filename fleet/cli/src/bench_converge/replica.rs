//! One `tessera-fleet reconcile` replica as the bench runs it: a child process of this
//! executable, its stdout lines read on a thread, its API asked over loopback.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{Bench, CLUSTER, Memory};
use crate::bench::{http_get, proc_status_bytes};

/// One `tessera-fleet reconcile` child process; killed on drop. Its stdout lines arrive on
/// `lines`; its log goes to `replica-ID.log` in the work directory.
pub(super) struct ReplicaProcess {
    /// Its `--replica-id`.
    pub(super) id: String,
    child: Child,
    pub(super) pid: u32,
    address: String,
    lines: mpsc::Receiver<String>,
    log: PathBuf,
}

impl ReplicaProcess {
    pub(super) fn spawn(bench: &Bench, repo: &Path, id: &str) -> anyhow::Result<ReplicaProcess> {
        let args = bench.args;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let address = format!("127.0.0.1:{port}");
        let member = bench
            .endpoint
            .strip_prefix("http://")
            .context("etcd's URL is not http://")?;
        let log = bench.work.join(format!("replica-{id}.log"));
        let mut child = Command::new(std::env::current_exe()?)
            .arg("reconcile")
            .args(["--store", &format!("etcd://{member}")])
            .args(["--cluster", CLUSTER, "--replica-id", id])
            .arg("--repo")
            .arg(repo)
            .args(["--branch", "main", "--path", "policy"])
            .arg("--state-dir")
            .arg(bench.work.join(format!("replica-{id}")))
            .args(["--listen", &address])
            .args([
                "--cycle-period",
                &format!("{}s", args.cycle_period.as_secs()),
                "--fetch-interval",
                &format!("{}s", args.fetch_interval.as_secs()),
                "--lease-ttl",
                &format!("{}s", args.replica_lease_ttl.as_secs()),
            ])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("cannot start `tessera-fleet reconcile`")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(ReplicaProcess {
            id: id.to_string(),
            pid: child.id(),
            child,
            address,
            lines,
            log,
        })
    }

    /// Waits for a stdout line starting with `prefix`.
    pub(super) fn await_line(&self, prefix: &str, within: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "the replica (pid {}) printed no `{prefix}…` within {within:?}; its log: {}",
                    self.pid,
                    self.log.display()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!(
                    "the replica (pid {}) exited before it printed `{prefix}…`; its log: {}",
                    self.pid,
                    self.log.display()
                ),
            }
        }
    }

    /// Forgets the lines printed so far.
    pub(super) fn drain(&self) {
        while self.lines.try_recv().is_ok() {}
    }

    /// Its public `/status`.
    pub(super) fn status(&self) -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_str(&http_get(&self.address, "/status")?)?)
    }

    /// Its `/metrics`.
    pub(super) fn metrics(&self) -> anyhow::Result<String> {
        http_get(&self.address, "/metrics")
    }

    /// Polls `/status` until `ready` answers, at most `within`.
    pub(super) fn await_status<T>(
        &self,
        what: &str,
        within: Duration,
        mut ready: impl FnMut(&serde_json::Value) -> Option<T>,
    ) -> anyhow::Result<T> {
        let deadline = Instant::now() + within;
        loop {
            let last = match self.status() {
                Ok(status) => {
                    if let Some(answer) = ready(&status) {
                        return Ok(answer);
                    }
                    status.to_string()
                }
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "waited {within:?} for {what} on the replica (pid {}); its /status: {last}; \
                     its log: {}",
                    self.pid,
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(super) fn memory(&self) -> Memory {
        Memory {
            rss: proc_status_bytes(Some(self.pid), "VmRSS:"),
            hwm: proc_status_bytes(Some(self.pid), "VmHWM:"),
        }
    }

    /// SIGKILL, and the exit reaped.
    pub(super) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
