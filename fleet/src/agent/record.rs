//! The agent's own record of what it started, in its private state directory: which
//! workloads, at which attempt, with which replicas, pids and bindings. A restarted agent
//! reads it to know what it runs (the runtime adopts the processes themselves from its pid
//! files), and it is what `observed` reports.
//!
//! The file is written whole to a temporary file and renamed over the old one, so a kill
//! mid-write leaves the previous record intact; the directory is 0700 and the file 0600.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tessera_solver::decision::ReplicaBinding;

use crate::protocol::{ReplicaState, RunState};

/// What the record failed with.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{}: not an agent record ({source}); it is the agent's own file: move it away only if \
         no workload it started still runs",
        path.display()
    )]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// One workload the agent started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalWorkload {
    pub attempt: u32,
    pub replicas: Vec<LocalReplica>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalReplica {
    pub replica: u32,
    pub binding: ReplicaBinding,
    /// The GPU instance of a MIG replica (what the driver is told the process holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// How it ended, once the runtime reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exited: Option<String>,
}

impl LocalReplica {
    /// Its pid while it runs.
    pub fn live_pid(&self) -> Option<u32> {
        self.pid.filter(|_| self.exited.is_none())
    }
}

/// Every workload the agent started and has not stopped, by key (`tenant/name`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    pub workloads: BTreeMap<String, LocalWorkload>,
}

impl Record {
    /// The record in `dir` (created 0700 if missing); empty where none was written yet.
    pub fn load(dir: &Path) -> Result<Record, RecordError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| RecordError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        let path = Record::path(dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| RecordError::Decode { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Record::default()),
            Err(source) => Err(RecordError::Io { path, source }),
        }
    }

    /// Writes the record to `dir`, replacing the previous one in one rename.
    pub fn save(&self, dir: &Path) -> Result<(), RecordError> {
        let path = Record::path(dir);
        let tmp = dir.join("agent.json.tmp");
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RecordError::Io { path, source }
        };
        let bytes = serde_json::to_vec_pretty(self).expect("the record serialises");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp))?;
        file.write_all(&bytes).map_err(io(&tmp))?;
        file.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
    }

    fn path(dir: &Path) -> PathBuf {
        dir.join("agent.json")
    }

    /// Every replica, as `observed` reports it.
    pub fn replica_states(&self) -> Vec<ReplicaState> {
        self.workloads
            .iter()
            .flat_map(|(key, w)| {
                w.replicas.iter().map(move |r| ReplicaState {
                    workload: key.clone(),
                    attempt: w.attempt,
                    replica: r.replica,
                    pid: r.pid,
                    state: match &r.exited {
                        None => RunState::Running,
                        Some(status) => RunState::Exited {
                            status: status.clone(),
                        },
                    },
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_saved_record_loads_back_and_stays_private() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        assert_eq!(Record::load(&state).unwrap(), Record::default());
        let mode = std::fs::metadata(&state).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let mut record = Record::default();
        record.workloads.insert(
            "a/train".into(),
            LocalWorkload {
                attempt: 3,
                replicas: vec![LocalReplica {
                    replica: 0,
                    binding: ReplicaBinding {
                        node: "n".into(),
                        gpus: vec![1],
                        mig_profile: None,
                        mig_start: None,
                        share: None,
                    },
                    gpu_instance: None,
                    pid: Some(42),
                    exited: None,
                }],
            },
        );
        record.save(&state).unwrap();
        assert_eq!(Record::load(&state).unwrap(), record);
        let mode = std::fs::metadata(state.join("agent.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(state.join("agent.json"), b"{").unwrap();
        let err = Record::load(&state).unwrap_err().to_string();
        assert!(err.contains("agent.json: not an agent record"), "{err}");
    }
}
