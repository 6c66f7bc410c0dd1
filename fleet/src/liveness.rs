//! Which nodes the control plane may count on: Ready while a node's registration exists,
//! NotReady from the moment it disappears, Lost once it has stayed away for the grace period.
//! Lost is what the service acts on (it requeues the node's workloads); NotReady alone is
//! not, since an agent paused for a moment or cut off from etcd comes back with its workloads
//! still running, and requeueing them would run them twice.
//!
//! The tracker is plain state fed with [`NodeEvent`]s and the time: no clock, no etcd, so a
//! cycle drives it and a test gives it any sequence of events and instants. Its grace is
//! counted on the leader that observes the disappearance: after a failover a node already
//! missing is NotReady from the new leader's start, so a failover delays a node's loss by up
//! to one grace period and never hastens it.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::registration::NodeEvent;

/// Where a node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Its registration exists: its agent renews its lease.
    Ready,
    /// Its registration disappeared at `since` and has not come back.
    NotReady { since: Instant },
    /// Away for the whole grace period since `since`: its workloads are to be requeued.
    Lost { since: Instant },
}

/// The liveness of every node the control plane knows.
#[derive(Debug, Clone)]
pub struct LivenessTracker {
    grace: Duration,
    nodes: BTreeMap<String, Liveness>,
}

impl LivenessTracker {
    /// Starts from a read of the registrations (`registered`, as [`crate::registration::NodeWatch::start`]
    /// returns them) and the nodes the control plane expects (those it bound workloads to):
    /// an expected node without a registration is NotReady from `now`.
    pub fn new<'a>(
        grace: Duration,
        registered: impl IntoIterator<Item = &'a String>,
        expected: impl IntoIterator<Item = &'a String>,
        now: Instant,
    ) -> LivenessTracker {
        let mut nodes: BTreeMap<String, Liveness> = expected
            .into_iter()
            .map(|n| (n.clone(), Liveness::NotReady { since: now }))
            .collect();
        for node in registered {
            nodes.insert(node.clone(), Liveness::Ready);
        }
        LivenessTracker { grace, nodes }
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Takes one event of the registrations' watch, seen at `now`; the node's liveness after.
    pub fn observe(&mut self, event: &NodeEvent, now: Instant) -> Liveness {
        match event {
            NodeEvent::Ready(registration) => {
                let node = registration.node.name.clone();
                self.nodes.insert(node, Liveness::Ready);
                Liveness::Ready
            }
            NodeEvent::NotReady { node } => {
                let state = self
                    .nodes
                    .entry(node.clone())
                    .or_insert(Liveness::NotReady { since: now });
                // A second delete changes nothing: the node has been away since the first.
                if *state == Liveness::Ready {
                    *state = Liveness::NotReady { since: now };
                }
                *state
            }
        }
    }

    /// Marks Lost every node NotReady for the grace period or longer at `now`; those nodes,
    /// in name order (each is returned once, when it becomes Lost).
    pub fn tick(&mut self, now: Instant) -> Vec<String> {
        let mut lost = Vec::new();
        for (node, state) in &mut self.nodes {
            if let Liveness::NotReady { since } = *state
                && now.saturating_duration_since(since) >= self.grace
            {
                *state = Liveness::Lost { since };
                lost.push(node.clone());
            }
        }
        lost
    }

    /// When the next NotReady node becomes Lost, if any: when to call [`LivenessTracker::tick`].
    pub fn next_deadline(&self) -> Option<Instant> {
        self.nodes
            .values()
            .filter_map(|state| match state {
                Liveness::NotReady { since } => Some(*since + self.grace),
                _ => None,
            })
            .min()
    }

    pub fn get(&self, node: &str) -> Option<Liveness> {
        self.nodes.get(node).copied()
    }

    /// The nodes Lost now: the ones whose workloads the service requeues.
    pub fn lost(&self) -> impl Iterator<Item = &str> {
        self.nodes
            .iter()
            .filter(|(_, s)| matches!(s, Liveness::Lost { .. }))
            .map(|(n, _)| n.as_str())
    }

    /// Forgets a node (it left the fleet on purpose).
    pub fn forget(&mut self, node: &str) {
        self.nodes.remove(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration::Registration;
    use proptest::prelude::*;
    use tessera_compiler::model::Node;

    fn ready(node: &str) -> NodeEvent {
        let node: Node = serde_json::from_value(serde_json::json!({
            "name": node, "pool": "p", "cpu": 2, "memory": "1Gi", "gpus": [],
        }))
        .unwrap_or_else(|e| panic!("a node: {e}"));
        NodeEvent::Ready(Box::new(Registration {
            node,
            driver: "sim".into(),
            agent_version: "0".into(),
        }))
    }

    fn gone(node: &str) -> NodeEvent {
        NodeEvent::NotReady {
            node: node.to_string(),
        }
    }

    const GRACE: Duration = Duration::from_secs(30);

    #[test]
    fn a_node_away_for_the_grace_is_lost_and_one_back_in_time_is_not() {
        let t0 = Instant::now();
        let names = ["a".to_string(), "b".to_string(), "c".to_string()];
        let mut t = LivenessTracker::new(GRACE, &names[..2], &names, t0);
        assert_eq!(t.get("a"), Some(Liveness::Ready));
        assert_eq!(t.get("c"), Some(Liveness::NotReady { since: t0 }));
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(t.observe(&gone("a"), t1), Liveness::NotReady { since: t1 });
        assert_eq!(t.observe(&gone("b"), t1), Liveness::NotReady { since: t1 });
        assert_eq!(t.next_deadline(), Some(t0 + GRACE));
        // c, missing since the start, is lost first; b comes back in time.
        assert_eq!(t.tick(t0 + GRACE), ["c"]);
        assert_eq!(t.observe(&ready("b"), t0 + GRACE), Liveness::Ready);
        assert_eq!(t.tick(t1 + GRACE), ["a"]);
        assert_eq!(t.tick(t1 + GRACE * 2), Vec::<String>::new());
        assert_eq!(t.lost().collect::<Vec<_>>(), ["a", "c"]);
        // A lost node that registers again is Ready (its agent stops what was moved away).
        assert_eq!(t.observe(&ready("a"), t1 + GRACE * 2), Liveness::Ready);
        assert_eq!(t.lost().collect::<Vec<_>>(), ["c"]);
    }

    proptest! {
        /// Whatever the events and their timing: a node is Ready exactly when its last event
        /// was Ready, Lost only when it has been away for at least the grace, and after a tick
        /// no node is still NotReady past its grace.
        #[test]
        fn liveness_follows_the_last_event_and_the_grace(
            steps in proptest::collection::vec((0usize..3, any::<bool>(), 0u64..40), 1..40)
        ) {
            let names = ["a", "b", "c"];
            let t0 = Instant::now();
            let mut now = t0;
            let none: [String; 0] = [];
            let mut t = LivenessTracker::new(GRACE, &none, &none, t0);
            let mut last_ready: BTreeMap<&str, bool> = BTreeMap::new();
            let mut away_since: BTreeMap<&str, Instant> = BTreeMap::new();
            for (node, up, advance) in steps {
                now += Duration::from_secs(advance);
                let name = names[node];
                if up {
                    t.observe(&ready(name), now);
                    away_since.remove(name);
                } else {
                    t.observe(&gone(name), now);
                    away_since.entry(name).or_insert(now);
                }
                last_ready.insert(name, up);
                let newly_lost = t.tick(now);
                for name in names {
                    let state = t.get(name);
                    match last_ready.get(name) {
                        None => prop_assert_eq!(state, None),
                        Some(true) => prop_assert_eq!(state, Some(Liveness::Ready)),
                        Some(false) => {
                            let since = away_since[name];
                            let lost = now.duration_since(since) >= GRACE;
                            let expected = if lost {
                                Liveness::Lost { since }
                            } else {
                                Liveness::NotReady { since }
                            };
                            prop_assert_eq!(state, Some(expected));
                        }
                    }
                }
                for name in &newly_lost {
                    let lost = matches!(t.get(name), Some(Liveness::Lost { .. }));
                    prop_assert!(lost, "{} was returned as lost", name);
                }
            }
        }
    }
}
