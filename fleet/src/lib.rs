//! Fleet mode's foundation on etcd: where everything lives ([`keys`]), which control-plane
//! replica leads and the fence that keeps a deposed one from writing ([`election`]), the
//! agents' registrations kept alive by leases and watched by the control plane
//! ([`registration`]), the actions addressed to a node and the agent's journal of applying
//! them ([`actions`]), the etcd users and roles that confine each agent to its own node's
//! keys ([`access`]), and the service's state in etcd ([`store`]). The control plane's node
//! side: the whole fleet's observation kept up to date by watches ([`view`]) and a cycle's plan
//! carried out on the nodes with each action's outcome ([`runner`], over [`dispatch`]); the
//! agents' utilisation written apart from the state decided on ([`utilization`]).
//!
//! `tessera-fleet reconcile` runs the service on [`store`] under [`election`], its node side
//! the agents through [`view`] and [`runner`] ([`nodes`]). See ARCHITECTURE.md ("Fleet mode on
//! etcd") for the protocol and the fencing argument.

pub mod access;
pub mod actions;
pub mod agent;
pub mod dispatch;
pub mod election;
pub mod error;
pub mod keys;
mod lease;
pub mod liveness;
pub mod nodes;
pub mod protocol;
pub mod registration;
pub mod runner;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod utilization;
pub mod view;
mod watch;

pub use error::FleetError;
