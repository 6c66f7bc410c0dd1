//! Where everything lives in etcd: one prefix per cluster, `/tessera/<cluster>/`, and under it
//!
//! ```text
//! /tessera/<cluster>/leader                          the control plane's leader (its lease)
//! /tessera/<cluster>/state/<name>                    control-plane state, written by the leader
//! /tessera/<cluster>/registrations/<node>           the agent's registration (its lease)
//! /tessera/<cluster>/nodes/<node>/observed           what the agent last observed
//! /tessera/<cluster>/nodes/<node>/utilization        how busy its GPUs are (when it moved)
//! /tessera/<cluster>/nodes/<node>/bound              the workloads bound to the node (leader)
//! /tessera/<cluster>/nodes/<node>/actions/<id>       actions addressed to the node, in id order
//! /tessera/<cluster>/nodes/<node>/journal/<id>       the agent's intent, then outcome, per action
//! ```
//!
//! Everything a node's agent may touch is under `nodes/<node>/`, but for its registration: one
//! etcd permission on that prefix and one on that key are its whole access (see
//! [`crate::access`]). Registrations have a prefix of their own so that the control plane's
//! view of which nodes are alive is a read and a watch of registrations alone; under `nodes/`
//! it would carry every action, journal entry and observation of the fleet as well. Action ids are written as twenty
//! decimal digits so that etcd's byte order of keys is the numeric order of ids: a range read or
//! a watch of `actions/` delivers them in the order they must be applied.
//!
//! Names are checked before they become keys: a `/` or an empty name would make one node's
//! prefix contain another's keys, which is exactly what the per-node permissions must rule out.

/// A cluster or node name that cannot be a key segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} name {name:?} cannot be used in etcd keys: {reason}")]
pub struct NameError {
    /// `cluster` or `node`.
    pub what: &'static str,
    pub name: String,
    pub reason: &'static str,
}

/// The longest cluster or node name accepted (a Kubernetes object name's limit).
pub const MAX_NAME: usize = 253;

/// Checks that `name` is one key segment: 1 to 253 characters of lowercase ASCII letters,
/// digits, `-` and `.`, starting and ending with a letter or digit (the DNS subdomain names
/// Kubernetes uses for nodes, so that every real node name fits).
pub fn check_name(what: &'static str, name: &str) -> Result<(), NameError> {
    let fail = |reason| {
        Err(NameError {
            what,
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return fail("it is empty");
    }
    if name.len() > MAX_NAME {
        return fail("it is longer than 253 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return fail("use only lowercase letters, digits, '-' and '.'");
    }
    let edge = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !edge(name.as_bytes()[0]) || !edge(name.as_bytes()[name.len() - 1]) {
        return fail("it must start and end with a letter or digit");
    }
    Ok(())
}

/// The keys of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    cluster: String,
    /// `/tessera/<cluster>/`
    root: String,
}

/// What a key under `nodes/` is, as [`Keys::parse_node_key`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKey {
    Registration { node: String },
    Observed { node: String },
    Utilization { node: String },
    Bound { node: String },
    Action { node: String, id: u64 },
    Journal { node: String, id: u64 },
}

impl NodeKey {
    /// The node the key belongs to.
    pub fn node(&self) -> &str {
        match self {
            NodeKey::Registration { node }
            | NodeKey::Observed { node }
            | NodeKey::Utilization { node }
            | NodeKey::Bound { node }
            | NodeKey::Action { node, .. }
            | NodeKey::Journal { node, .. } => node,
        }
    }
}

impl Keys {
    pub fn new(cluster: &str) -> Result<Keys, NameError> {
        check_name("cluster", cluster)?;
        Ok(Keys {
            cluster: cluster.to_string(),
            root: format!("/tessera/{cluster}/"),
        })
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// `/tessera/<cluster>/`: every key of the cluster starts with it.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The leader's key; it exists exactly while a leader holds its lease.
    pub fn leader(&self) -> String {
        format!("{}leader", self.root)
    }

    /// `state/`: control-plane state, written only through the leader's fence.
    pub fn state_prefix(&self) -> String {
        format!("{}state/", self.root)
    }

    /// One control-plane state document, e.g. `state/workloads/<name>`.
    pub fn state(&self, path: &str) -> String {
        format!("{}{path}", self.state_prefix())
    }

    /// `nodes/`: every node's keys.
    pub fn nodes_prefix(&self) -> String {
        format!("{}nodes/", self.root)
    }

    /// `nodes/<node>/`: the one prefix a node's agent may read and write.
    pub fn node_prefix(&self, node: &str) -> Result<String, NameError> {
        check_name("node", node)?;
        Ok(format!("{}{node}/", self.nodes_prefix()))
    }

    /// `registrations/`: every node's registration, and nothing else.
    pub fn registrations_prefix(&self) -> String {
        format!("{}registrations/", self.root)
    }

    pub fn registration(&self, node: &str) -> Result<String, NameError> {
        check_name("node", node)?;
        Ok(format!("{}{node}", self.registrations_prefix()))
    }

    pub fn observed(&self, node: &str) -> Result<String, NameError> {
        Ok(format!("{}observed", self.node_prefix(node)?))
    }

    /// How busy the node's GPUs are, written by the agent apart from `observed` (see
    /// [`crate::utilization`]).
    pub fn utilization(&self, node: &str) -> Result<String, NameError> {
        Ok(format!("{}utilization", self.node_prefix(node)?))
    }

    /// The key range `[start, end)` that holds the node's `observed` and `utilization` and
    /// nothing else of it (its actions, journal and `bound` sort before `observed`): what the
    /// control plane's view of the fleet reads and watches per node.
    pub fn view_range(&self, node: &str) -> Result<(String, Vec<u8>), NameError> {
        let mut end = self.utilization(node)?.into_bytes();
        end.push(0);
        Ok((self.observed(node)?, end))
    }

    /// The workloads bound to the node, written by the leader (see [`crate::protocol::Bound`]).
    pub fn bound(&self, node: &str) -> Result<String, NameError> {
        Ok(format!("{}bound", self.node_prefix(node)?))
    }

    pub fn actions_prefix(&self, node: &str) -> Result<String, NameError> {
        Ok(format!("{}actions/", self.node_prefix(node)?))
    }

    pub fn action(&self, node: &str, id: u64) -> Result<String, NameError> {
        Ok(format!("{}{id:020}", self.actions_prefix(node)?))
    }

    pub fn journal_prefix(&self, node: &str) -> Result<String, NameError> {
        Ok(format!("{}journal/", self.node_prefix(node)?))
    }

    /// The agent's journal entry for action `id` (see [`crate::actions`]).
    pub fn journal(&self, node: &str, id: u64) -> Result<String, NameError> {
        Ok(format!("{}{id:020}", self.journal_prefix(node)?))
    }

    /// Reads a key of one node (under `nodes/` or `registrations/`) back; `None` for any
    /// other key (or a malformed one, which tessera never writes).
    pub fn parse_node_key(&self, key: &[u8]) -> Option<NodeKey> {
        let key = std::str::from_utf8(key).ok()?;
        if let Some(node) = key.strip_prefix(&self.registrations_prefix()) {
            check_name("node", node).ok()?;
            return Some(NodeKey::Registration {
                node: node.to_string(),
            });
        }
        let rest = key.strip_prefix(&self.nodes_prefix())?;
        let (node, rest) = rest.split_once('/')?;
        check_name("node", node).ok()?;
        let node = node.to_string();
        match rest {
            "observed" => Some(NodeKey::Observed { node }),
            "utilization" => Some(NodeKey::Utilization { node }),
            "bound" => Some(NodeKey::Bound { node }),
            _ => {
                let (kind, id) = rest.split_once('/')?;
                if id.len() != 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let id = id.parse().ok()?;
                match kind {
                    "actions" => Some(NodeKey::Action { node, id }),
                    "journal" => Some(NodeKey::Journal { node, id }),
                    _ => None,
                }
            }
        }
    }
}

/// The end of the range of keys that start with `prefix` (etcd's `range_end` for a prefix).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Only for a prefix of 0xff bytes, which no name check lets through: the whole keyspace.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_layout_is_the_documented_one() {
        let keys = Keys::new("prod").unwrap();
        assert_eq!(keys.leader(), "/tessera/prod/leader");
        assert_eq!(keys.state("workloads/a"), "/tessera/prod/state/workloads/a");
        assert_eq!(
            keys.registration("gpu-1").unwrap(),
            "/tessera/prod/registrations/gpu-1"
        );
        assert_eq!(
            keys.observed("gpu-1").unwrap(),
            "/tessera/prod/nodes/gpu-1/observed"
        );
        assert_eq!(
            keys.action("gpu-1", 42).unwrap(),
            "/tessera/prod/nodes/gpu-1/actions/00000000000000000042"
        );
    }

    #[test]
    fn names_that_would_break_the_prefixes_are_refused() {
        let keys = Keys::new("prod").unwrap();
        for bad in ["", "a/b", "..", "-a", "a-", "A", "a b", "ä"] {
            let err = keys.registration(bad).unwrap_err();
            assert_eq!(err.what, "node", "{bad:?}");
        }
        assert!(Keys::new("x/y").is_err());
        assert!(keys.registration(&"a".repeat(254)).is_err());
        assert!(keys.registration(&"a".repeat(253)).is_ok());
    }

    #[test]
    fn foreign_and_malformed_keys_do_not_parse() {
        let keys = Keys::new("prod").unwrap();
        for key in [
            "/tessera/prod/leader",
            "/tessera/other/registrations/a",
            "/tessera/prod/nodes/a/registration",
            "/tessera/prod/registrations/a/x",
            "/tessera/prod/nodes/a/actions/12",
            "/tessera/prod/nodes/a/actions/0000000000000000001x",
            "/tessera/prod/nodes/a/other/00000000000000000001",
            "/tessera/prod/registrations/A",
        ] {
            assert_eq!(keys.parse_node_key(key.as_bytes()), None, "{key}");
        }
    }

    #[test]
    fn prefix_end_is_the_next_prefix() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?"
    }

    proptest! {
        #[test]
        fn node_keys_parse_back(node in name(), id in any::<u64>()) {
            let keys = Keys::new("c").unwrap();
            let reg = keys.registration(&node).unwrap();
            prop_assert_eq!(keys.parse_node_key(reg.as_bytes()), Some(NodeKey::Registration { node: node.clone() }));
            let obs = keys.observed(&node).unwrap();
            prop_assert_eq!(keys.parse_node_key(obs.as_bytes()), Some(NodeKey::Observed { node: node.clone() }));
            let busy = keys.utilization(&node).unwrap();
            prop_assert_eq!(keys.parse_node_key(busy.as_bytes()), Some(NodeKey::Utilization { node: node.clone() }));
            let bound = keys.bound(&node).unwrap();
            prop_assert_eq!(keys.parse_node_key(bound.as_bytes()), Some(NodeKey::Bound { node: node.clone() }));
            let action = keys.action(&node, id).unwrap();
            prop_assert_eq!(keys.parse_node_key(action.as_bytes()), Some(NodeKey::Action { node: node.clone(), id }));
            let journal = keys.journal(&node, id).unwrap();
            prop_assert_eq!(keys.parse_node_key(journal.as_bytes()), Some(NodeKey::Journal { node, id }));
        }

        /// A node's view range holds its observation and utilisation, and none of its other
        /// keys nor any key of another node.
        #[test]
        fn the_view_range_holds_observed_and_utilization_only(a in name(), b in name(), id in any::<u64>()) {
            let keys = Keys::new("c").unwrap();
            let (start, end) = keys.view_range(&a).unwrap();
            let inside = |k: &str| k.as_bytes() >= start.as_bytes() && k.as_bytes() < end.as_slice();
            prop_assert!(inside(&keys.observed(&a).unwrap()));
            prop_assert!(inside(&keys.utilization(&a).unwrap()));
            for other in [keys.bound(&a).unwrap(), keys.action(&a, id).unwrap(), keys.journal(&a, id).unwrap(), keys.registration(&a).unwrap()] {
                prop_assert!(!inside(&other), "{}", other);
            }
            if a != b {
                for other in [keys.observed(&b).unwrap(), keys.utilization(&b).unwrap()] {
                    prop_assert!(!inside(&other), "{}", other);
                }
            }
        }

        /// Byte order of action keys is numeric order of ids: a range read applies in order.
        #[test]
        fn action_keys_sort_by_id(a in any::<u64>(), b in any::<u64>()) {
            let keys = Keys::new("c").unwrap();
            let (ka, kb) = (keys.action("n", a).unwrap(), keys.action("n", b).unwrap());
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
        }

        /// No node's prefix holds another node's keys: the per-node permission is exact.
        #[test]
        fn node_prefixes_do_not_nest(a in name(), b in name()) {
            prop_assume!(a != b);
            let keys = Keys::new("c").unwrap();
            let pa = keys.node_prefix(&a).unwrap();
            let end = prefix_end(&pa);
            for key in [keys.registration(&b).unwrap(), keys.action(&b, 1).unwrap(), keys.leader(), keys.state("x")] {
                prop_assert!(!(key.as_bytes() >= pa.as_bytes() && key.as_bytes() < end.as_slice()), "{} in {}", key, pa);
            }
        }
    }
}
