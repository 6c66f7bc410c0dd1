//! What a fleet operation fails with. etcd's own errors are sorted into what a caller acts on
//! differently: refused by etcd's access control, deposed (the fence held), a conflict, an
//! action out of order, or etcd unreachable or failing.

use crate::keys::NameError;

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(transparent)]
    Name(#[from] NameError),

    #[error("cannot connect to etcd at {endpoints}: {source}")]
    Connect {
        endpoints: String,
        #[source]
        source: etcd_client::Error,
    },

    /// etcd's access control refused the user name or password at connection.
    #[error(
        "etcd at {endpoints} refused user {user}: wrong user name or password (etcd says: \
         {message})"
    )]
    Unauthenticated {
        endpoints: String,
        user: String,
        message: String,
    },

    /// Credentials were given but etcd's access control is off, so etcd takes no user.
    #[error(
        "etcd at {endpoints} has access control off and takes no user: connect without \
         credentials, or turn access control on first (`tessera-fleet access enable`)"
    )]
    AuthDisabled { endpoints: String },

    /// etcd's access control refused the request: the credentials in use have no permission
    /// on the key (an agent writing outside its node's prefix).
    #[error("etcd refused {op} on {key}: permission denied ({message})")]
    PermissionDenied {
        op: &'static str,
        key: String,
        message: String,
    },

    /// This process is no longer the leader: its leader key is gone or belongs to another
    /// lease, so the write was not applied (fencing).
    #[error(
        "not the leader any more: the write to {key} was refused{}",
        match now { Some(l) => format!("; {l} leads now"), None => "; no leader now".to_string() }
    )]
    Deposed { key: String, now: Option<String> },

    /// A fenced write's own conditions failed (the leader still leads): someone changed the
    /// keys it was based on.
    #[error("conflict: {key} changed since it was read")]
    Conflict { key: String },

    /// The control plane wrote an action with an id below one the agent already took: ids
    /// must only grow, or the agent could not tell a new action from a replayed one.
    #[error("node {node}: action {id} arrived after action {after}; action ids must only grow")]
    ActionOutOfOrder { node: String, id: u64, after: u64 },

    #[error("etcd {op} on {key} failed: {source}")]
    Etcd {
        op: &'static str,
        key: String,
        #[source]
        source: etcd_client::Error,
    },

    #[error("{key} holds a value tessera cannot read: {source}")]
    Decode {
        key: String,
        #[source]
        source: serde_json::Error,
    },

    /// A protocol payload (see [`crate::protocol`]) of another version or shape.
    #[error("{key} holds a value tessera cannot read: {source}")]
    Protocol {
        key: String,
        #[source]
        source: crate::protocol::ProtocolError,
    },

    #[error("the driver does not observe node {node} (it observes {observed})")]
    NodeNotObserved { node: String, observed: String },

    #[error("observing node {node} failed: {source}")]
    Driver {
        node: String,
        #[source]
        source: tessera_reconciler::driver::DriverError,
    },
}

/// Sorts an etcd client error for the operation `op` on `key`.
pub(crate) fn etcd(op: &'static str, key: &str, source: etcd_client::Error) -> FleetError {
    if let etcd_client::Error::GRpcStatus(status) = &source
        && status.code() == tonic_code_permission_denied()
    {
        return FleetError::PermissionDenied {
            op,
            key: key.to_string(),
            message: status.message().to_string(),
        };
    }
    FleetError::Etcd {
        op,
        key: key.to_string(),
        source,
    }
}

/// etcd answers a missing permission with gRPC's `PERMISSION_DENIED`.
fn tonic_code_permission_denied() -> tonic::Code {
    tonic::Code::PermissionDenied
}
