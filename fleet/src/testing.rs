//! A real etcd for tests: one member on free loopback ports, its data in a temporary
//! directory, killed and removed on drop. Tests run against the etcd the fleet runs against
//! (Debian's `etcd-server`), not a stand-in: leases, watches, transactions and access control
//! are etcd's own.
//!
//! Where `etcd` is not installed, [`TestEtcd::start`] fails with an error that says what to
//! install; a test never skips silently.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The program started: `TESSERA_TEST_ETCD` when set, else `etcd` on the `PATH`.
pub const ETCD_ENV: &str = "TESSERA_TEST_ETCD";

/// How long a fresh single-member etcd may take to elect itself and answer `/health`.
const READY_WITHIN: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(
        "etcd is not installed ({program} not found): install Debian's etcd-server \
         (apt-get install etcd-server) or set {ETCD_ENV} to an etcd 3.4 or newer binary"
    )]
    Missing { program: String },
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot prepare etcd's directory: {0}")]
    Io(#[from] std::io::Error),
    #[error("etcd exited ({status}) before it was ready; its log:\n{log}")]
    Exited { status: String, log: String },
    #[error("etcd did not answer /health within {waited:?}; its log:\n{log}")]
    NotReady { waited: Duration, log: String },
}

/// One etcd member serving `http://127.0.0.1:<port>`.
pub struct TestEtcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

impl TestEtcd {
    /// Starts etcd and waits until it answers `/health`. Ports are picked free just before the
    /// start; should another process take one in between, etcd exits and the start is retried
    /// on fresh ports.
    pub fn start() -> Result<TestEtcd, HarnessError> {
        let mut last = None;
        for _ in 0..3 {
            let mut etcd = TestEtcd {
                child: None,
                client_port: free_port()?,
                peer_port: free_port()?,
                dir: tempfile::Builder::new().prefix("tessera-etcd-").tempdir()?,
            };
            match etcd.spawn().and_then(|()| etcd.wait_ready()) {
                Ok(()) => return Ok(etcd),
                Err(HarnessError::Exited { status, log })
                    if log.contains("address already in use") =>
                {
                    last = Some(HarnessError::Exited { status, log });
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("the loop ran at least once"))
    }

    /// The client URL, as `etcd_client::Client::connect` takes it.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// What etcd logged so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Kills etcd (SIGKILL: no goodbye to clients) and keeps its data, so that
    /// [`TestEtcd::restart`] brings the same store back on the same port.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Pauses etcd (SIGSTOP): its connections stay open and nothing answers, as with a hung
    /// or cut-off member. [`TestEtcd::resume`] lets it go on where it stopped. Returns once
    /// every thread of etcd is stopped: `kill` only queues the signal, and on a loaded machine
    /// a thread that was running answered a read sent after it returned.
    pub fn pause(&self) -> Result<(), HarnessError> {
        let pid = self.signal(nix::sys::signal::Signal::SIGSTOP)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !all_threads_stopped(pid)? {
            if Instant::now() > deadline {
                return Err(
                    std::io::Error::other("etcd's threads did not stop within 10 s").into(),
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Resumes a paused etcd (SIGCONT). etcd then answers what waited on its connections and
    /// expires the leases whose TTL ran out meanwhile.
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.signal(nix::sys::signal::Signal::SIGCONT).map(drop)
    }

    /// Sends `signal` to etcd and returns the pid it went to.
    fn signal(&self, signal: nix::sys::signal::Signal) -> Result<u32, HarnessError> {
        let child = self
            .child
            .as_ref()
            .ok_or_else(|| std::io::Error::other("etcd is not running"))?;
        let id = child.id();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(id).map_err(std::io::Error::other)?);
        nix::sys::signal::kill(pid, signal).map_err(std::io::Error::from)?;
        Ok(id)
    }

    /// Starts etcd again on its data directory and ports after [`TestEtcd::kill`].
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill();
        self.spawn()?;
        self.wait_ready()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn spawn(&mut self) -> Result<(), HarnessError> {
        let program = std::env::var(ETCD_ENV).unwrap_or_else(|_| "etcd".to_string());
        if !is_runnable(&program) {
            return Err(HarnessError::Missing { program });
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(&program)
            .arg("--name=test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|source| HarnessError::Spawn {
                program: program.clone(),
                source,
            })?;
        self.child = Some(child);
        Ok(())
    }

    fn wait_ready(&mut self) -> Result<(), HarnessError> {
        let started = Instant::now();
        while started.elapsed() < READY_WITHIN {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Err(HarnessError::Exited {
                    status: status.to_string(),
                    log: self.log(),
                });
            }
            if healthy(self.client_port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(HarnessError::NotReady {
            waited: READY_WITHIN,
            log: self.log(),
        })
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn is_runnable(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// etcd's `/health` answers `{"health":"true"}` once the member has a leader and serves.
fn healthy(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}

/// Whether every thread of process `pid` is stopped (state `T` or `t` in
/// `/proc/PID/task/TID/stat`). A thread that exits while it is read is not running.
fn all_threads_stopped(pid: u32) -> std::io::Result<bool> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = match std::fs::read_to_string(task?.path().join("stat")) {
            Ok(stat) => stat,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // The state follows the command, which is in parentheses and may hold any character.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if !matches!(state, Some('T' | 't')) {
            return Ok(false);
        }
    }
    Ok(true)
}
