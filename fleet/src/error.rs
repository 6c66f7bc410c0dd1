//! What a fleet operation fails with. etcd's own errors are sorted into what a caller acts on
//! differently: refused by etcd's access control, deposed (the fence held), a conflict, an
//! action out of order, or etcd unreachable or failing.

use std::time::Duration;

use crate::access::REQUEST_TIMEOUT;
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

    /// etcd did not answer within [`REQUEST_TIMEOUT`]. The
    /// request may still be applied once etcd answers again: a write's outcome is unknown
    /// (as after a broken connection), and only its fence and guards, checked by etcd when it
    /// applies it, say whether it can take effect.
    #[error("etcd {op} on {key} {source}")]
    TimedOut {
        op: &'static str,
        key: String,
        source: TimedOut,
    },

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

/// A request etcd did not answer in time: what a store error or a condition says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("timed out after {after:?}: etcd did not answer (it is hung, overloaded or unreachable)")]
pub struct TimedOut {
    pub after: Duration,
}

impl TimedOut {
    /// The timeout of `source` when it is one: the client gave up on the request after
    /// [`REQUEST_TIMEOUT`] (tonic's `TimeoutExpired`, somewhere in the error's causes).
    pub fn of(source: &etcd_client::Error) -> Option<TimedOut> {
        let etcd_client::Error::GRpcStatus(status) = source else {
            return None;
        };
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(status);
        while let Some(e) = cause {
            if e.is::<tonic::TimeoutExpired>() {
                return Some(TimedOut {
                    after: REQUEST_TIMEOUT,
                });
            }
            cause = e.source();
        }
        None
    }
}

/// Sorts an etcd client error for the operation `op` on `key`.
pub(crate) fn etcd(op: &'static str, key: &str, source: etcd_client::Error) -> FleetError {
    if let Some(timed_out) = TimedOut::of(&source) {
        return FleetError::TimedOut {
            op,
            key: key.to_string(),
            source: timed_out,
        };
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_the_client_gave_up_on_is_sorted_as_timed_out() {
        // How tonic reports its own per-request timeout: a status built from the error.
        let status = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
        let e = etcd(
            "read",
            "/tessera/c/state/x",
            etcd_client::Error::GRpcStatus(status),
        );
        assert!(
            matches!(&e, FleetError::TimedOut { op: "read", key, .. } if key == "/tessera/c/state/x"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "etcd read on /tessera/c/state/x timed out after 5s: etcd did not answer (it is \
             hung, overloaded or unreachable)"
        );
    }

    #[test]
    fn a_status_etcd_answered_is_not_a_timeout() {
        // etcd's own cancellation (a request it cancelled) carries no client timeout.
        let status = tonic::Status::cancelled("context canceled");
        let e = etcd("read", "k", etcd_client::Error::GRpcStatus(status));
        assert!(matches!(e, FleetError::Etcd { .. }), "{e:?}");
    }
}
