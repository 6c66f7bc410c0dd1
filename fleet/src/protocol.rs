//! What the control plane and a node's agent write to each other, under `nodes/<node>/`.
//!
//! - `actions/<id>` ([`ActionMessage`], written by the leader through its fence): one
//!   [`Action`], and for a start, what the node needs to launch it ([`Launch`]).
//! - `observed` ([`Observed`], written by the agent when it changes): the node as its driver
//!   observes it, and the workloads it runs.
//! - `bound` ([`Bound`], written by the leader): the workloads bound to the node, with their
//!   attempt. An agent that starts again, or registers again after losing its lease, stops
//!   whatever it runs that is no longer bound to it before it takes new actions, so a workload the control plane moved elsewhere while the
//!   node was away never runs twice.
//!
//! Every payload is JSON with a `version`; a reader refuses a version it does not speak and,
//! within its version, any field it does not know (`deny_unknown_fields`), so a change of
//! meaning is never read as the old one.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tessera_compiler::model::Node;
use tessera_reconciler::actions::Action;
use tessera_reconciler::driver::GpuDetail;

/// The protocol version this crate writes and reads.
pub const VERSION: u32 = 1;

/// A payload that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("not a JSON object with a numeric `version`: {0}")]
    NoVersion(String),
    #[error("protocol version {found} is not spoken here (this agent speaks version {VERSION})")]
    Version { found: u64 },
    #[error("{0}")]
    Invalid(#[from] serde_json::Error),
}

/// `nodes/<node>/actions/<id>`: one step for the node to take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActionMessage {
    pub version: u32,
    pub action: Action,
    /// For [`Action::Start`] only: how to launch the workload's replicas on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<Launch>,
}

/// What a node needs to launch a workload, beyond the start's bindings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Launch {
    /// Which attempt of the workload this start is (0 for the first); the agent records it,
    /// and [`Bound`] names it, so an old attempt is told from a new one.
    pub attempt: u32,
    /// Program and arguments; empty: nothing to run (the devices are only claimed).
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Thousandths of a core; 0: no limit.
    #[serde(default)]
    pub cpu_millis: u64,
    /// Bytes; 0: no limit.
    #[serde(default)]
    pub memory_bytes: u64,
}

/// `nodes/<node>/observed`: what the agent last observed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Observed {
    pub version: u32,
    pub node: Node,
    pub details: Vec<GpuDetail>,
    /// The replicas the agent runs (or ran, until their exit is reported here), by workload
    /// key then replica.
    pub workloads: Vec<ReplicaState>,
}

/// One replica the agent started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaState {
    /// `tenant/name`.
    pub workload: String,
    pub attempt: u32,
    pub replica: u32,
    /// `None` where the start ran no command (runtime `none`, or an empty command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    pub state: RunState,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "phase", deny_unknown_fields)]
pub enum RunState {
    Running,
    /// It ended by itself: how (`exit code 0`, `signal 9`).
    Exited {
        status: String,
    },
}

/// `nodes/<node>/bound`: the workloads the control plane has bound to the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bound {
    pub version: u32,
    /// Workload key (`tenant/name`) to the attempt bound here.
    pub workloads: BTreeMap<String, u32>,
}

impl Bound {
    /// Whether the `attempt` of `workload` is still bound to the node.
    pub fn holds(&self, workload: &str, attempt: u32) -> bool {
        self.workloads.get(workload) == Some(&attempt)
    }
}

/// Reads a payload of this protocol version: the version first, so that a payload of another
/// version is refused for that reason rather than for its fields.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ProtocolError> {
    let value: serde_json::Value = serde_json::from_slice(bytes)?;
    let found = value
        .get("version")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| {
            let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(80)]).into_owned();
            ProtocolError::NoVersion(shown)
        })?;
    if found != u64::from(VERSION) {
        return Err(ProtocolError::Version { found });
    }
    Ok(serde_json::from_value(value)?)
}

/// Writes a payload.
pub fn encode<T: Serialize>(payload: &T) -> Vec<u8> {
    serde_json::to_vec(payload).expect("protocol payloads serialise")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_reconciler::driver::GpuRef;

    fn start() -> ActionMessage {
        let action: Action = serde_json::from_value(serde_json::json!({
            "action": "start",
            "workload": "research/train",
            "bindings": [{"node": "gpu-1", "gpus": [0], "migStart": 4}],
        }))
        .unwrap();
        ActionMessage {
            version: VERSION,
            action,
            launch: Some(Launch {
                attempt: 2,
                command: vec!["sleep".into(), "60".into()],
                env: BTreeMap::from([("A".into(), "1".into())]),
                cpu_millis: 500,
                memory_bytes: 1 << 30,
            }),
        }
    }

    #[test]
    fn messages_read_back_as_written() {
        let message = start();
        let back: ActionMessage = decode(&encode(&message)).unwrap();
        assert_eq!(back, message);
        let geometry = ActionMessage {
            version: VERSION,
            action: Action::CreateGpuInstance {
                gpu: GpuRef {
                    node: "gpu-1".into(),
                    index: 0,
                },
                profile_id: 9,
                start: 4,
            },
            launch: None,
        };
        assert_eq!(
            decode::<ActionMessage>(&encode(&geometry)).unwrap(),
            geometry
        );
        let bound = Bound {
            version: VERSION,
            workloads: BTreeMap::from([("research/train".into(), 2)]),
        };
        let back: Bound = decode(&encode(&bound)).unwrap();
        assert!(back.holds("research/train", 2));
        assert!(!back.holds("research/train", 1));
    }

    #[test]
    fn unreadable_payloads_say_why() {
        let cases: [(&[u8], &str); 5] = [
            (b"not json", "expected ident"),
            (b"{\"action\": {}}", "not a JSON object with a numeric `version`"),
            (b"{\"version\": 2}", "protocol version 2 is not spoken here"),
            (
                b"{\"version\": 1, \"action\": {\"action\": \"reset_gpu\", \"gpu\": {\"node\": \"n\", \"index\": 0}}, \"extra\": 1}",
                "unknown field `extra`",
            ),
            (
                b"{\"version\": 1, \"action\": {\"action\": \"melt\"}}",
                "unknown variant `melt`",
            ),
        ];
        for (bytes, expected) in cases {
            let err = decode::<ActionMessage>(bytes).unwrap_err().to_string();
            assert!(err.contains(expected), "{err:?} should say {expected:?}");
        }
    }
}
