//! Who may touch which keys: etcd's own users and roles, one pair per node, each role holding
//! one read-write permission on the key range of `nodes/<node>/`. An agent connects with its
//! node's user, so etcd itself refuses anything it sends outside its node's keys (another
//! node's actions, the leader key, the control plane's state), whatever the agent's code does.
//! The control plane connects as its own user with read-write on the cluster's whole prefix.
//!
//! These functions are the control plane's administration: they run with the credentials of
//! etcd's `root` user (or before access control is enabled). They are idempotent, so a
//! provisioning that failed half-way is finished by running it again, and provisioning a node
//! that exists sets its password anew (rotation).

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, Permission, RoleRevokePermissionOptions};

use crate::error::{FleetError, etcd};
use crate::keys::{Keys, prefix_end};

/// The user name etcd requires for its administrator; access control cannot be enabled
/// without it.
pub const ROOT_USER: &str = "root";

/// A user name and password to connect to etcd with.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    /// The password is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// How long any one request to etcd may take before it fails with
/// [`FleetError::TimedOut`]: etcdctl's own `--command-timeout`. A healthy etcd answers in
/// milliseconds, and even a cluster electing a new leader answers (or refuses) within its
/// election timeout; one that takes longer is hung (a stopped process keeps its TCP
/// connections open, so nothing else would ever end the wait), overloaded, or cut off.
/// Without this bound a leader's cycle blocked on such a call would hold its loop, and its
/// stepping down, for as long as etcd stays silent.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long opening a connection may take (TCP, before any request).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 pings on a connection with streams open (watches, lease keepalives): a connection
/// whose ping goes unanswered for [`PING_TIMEOUT`] is closed, which ends its watches with an
/// error (their owners read again and watch anew) and makes the next request open a fresh
/// connection. Request timeouts alone leave a half-dead connection (a partition, a hung
/// peer) in place, and a watch on it silent. etcd's `--grpc-keepalive-min-time` (5 s)
/// closes the connection of a client that pings more often, and a ping with no stream open
/// counts against that too: hence the interval above it, and no pings while idle.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// The options every tessera connection to etcd uses: the bounds above, and `credentials`
/// where access control is on.
pub fn connect_options(credentials: Option<&Credentials>) -> ConnectOptions {
    let options = ConnectOptions::new()
        .with_timeout(REQUEST_TIMEOUT)
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_keep_alive(PING_INTERVAL, PING_TIMEOUT)
        .with_keep_alive_while_idle(false);
    match credentials {
        // etcd's token expires after `--auth-token-ttl` unused (300 s by default): a standby
        // that only campaigns, or an idle agent, would find it gone on its next request.
        Some(c) => options
            .with_user(c.user.clone(), c.password.clone())
            .with_auto_token_refresh(true),
        None => options,
    }
}

/// Connects to etcd at `endpoints` (URLs such as `http://127.0.0.1:2379`), as `credentials`
/// where access control is on, with [`connect_options`]. A wrong user name or password is
/// `Unauthenticated`, and credentials given to an etcd whose access control is off
/// `AuthDisabled`: neither is worth retrying.
pub async fn connect(
    endpoints: &[String],
    credentials: Option<&Credentials>,
) -> Result<Client, FleetError> {
    Client::connect(endpoints, Some(connect_options(credentials)))
        .await
        .map_err(|source| connect_error(endpoints, credentials, source))
}

/// Sorts a failed connection: etcd answers a wrong password with `INVALID_ARGUMENT`
/// ("authentication failed") and a user given while access control is off with
/// `FAILED_PRECONDITION` ("authentication is not enabled").
fn connect_error(
    endpoints: &[String],
    credentials: Option<&Credentials>,
    source: etcd_client::Error,
) -> FleetError {
    let endpoints = endpoints.join(",");
    if let Some(timed_out) = crate::error::TimedOut::of(&source) {
        return FleetError::TimedOut {
            op: "connect",
            key: endpoints,
            source: timed_out,
        };
    }
    if let (Some(who), etcd_client::Error::GRpcStatus(status)) = (credentials, &source) {
        let message = status.message();
        if status.code() == tonic::Code::InvalidArgument
            && message.contains("authentication failed")
        {
            return FleetError::Unauthenticated {
                endpoints,
                user: who.user.clone(),
                message: message.to_string(),
            };
        }
        if status.code() == tonic::Code::FailedPrecondition
            && message.contains("authentication is not enabled")
        {
            return FleetError::AuthDisabled { endpoints };
        }
    }
    FleetError::Connect { endpoints, source }
}

/// The etcd user (and role) of one node's agent: `tessera.<cluster>.node.<node>`.
pub fn node_user(keys: &Keys, node: &str) -> Result<String, FleetError> {
    crate::keys::check_name("node", node)?;
    Ok(format!("tessera.{}.node.{node}", keys.cluster()))
}

/// The etcd user (and role) of the control plane: `tessera.<cluster>.control`.
pub fn control_user(keys: &Keys) -> String {
    format!("tessera.{}.control", keys.cluster())
}

/// Turns on etcd's access control, creating the `root` user (with etcd's `root` role) where it
/// does not exist. Every client must authenticate afterwards.
pub async fn enable_auth(admin: &Client, root_password: &str) -> Result<(), FleetError> {
    let mut admin = admin.clone();
    ensure_role(&mut admin, ROOT_USER).await?;
    ensure_user(&mut admin, ROOT_USER, root_password).await?;
    admin
        .user_grant_role(ROOT_USER, ROOT_USER)
        .await
        .map_err(|e| etcd("user grant role", ROOT_USER, e))?;
    admin
        .auth_enable()
        .await
        .map_err(|e| etcd("auth enable", ROOT_USER, e))?;
    Ok(())
}

/// Creates (or updates) the user of `node`'s agent. It may read everything under
/// `nodes/<node>/` (its actions, the workloads bound to it, its own keys) and write only what
/// the agent writes: its registration (`registrations/<node>`, the one key it holds outside
/// that prefix), its observation, its utilisation and its journal. The actions and the
/// bound set are the leader's to write, so an agent cannot give itself work.
pub async fn provision_node(
    admin: &Client,
    keys: &Keys,
    node: &str,
    password: &str,
) -> Result<Credentials, FleetError> {
    let user = node_user(keys, node)?;
    let prefix = keys.node_prefix(node)?;
    let journal = keys.journal_prefix(node)?;
    let permissions = [
        Permission::read(prefix.as_str()).with_range_end(prefix_end(&prefix)),
        Permission::read_write(keys.registration(node)?),
        Permission::read_write(keys.observed(node)?),
        Permission::read_write(keys.utilization(node)?),
        Permission::read_write(journal.as_str()).with_range_end(prefix_end(&journal)),
    ];
    provision(admin, &user, password, &prefix, permissions).await
}

/// Creates (or updates) the control plane's user: read-write on the cluster's whole prefix.
pub async fn provision_control_plane(
    admin: &Client,
    keys: &Keys,
    password: &str,
) -> Result<Credentials, FleetError> {
    let root = keys.root();
    let everything = Permission::read_write(root).with_range_end(prefix_end(root));
    provision(admin, &control_user(keys), password, root, [everything]).await
}

/// Removes `node`'s user and role: its agent can no longer authenticate. (etcd keeps tokens it
/// already issued valid until they expire: `--auth-token-ttl`, 300 s by default.)
pub async fn revoke_node(admin: &Client, keys: &Keys, node: &str) -> Result<(), FleetError> {
    let user = node_user(keys, node)?;
    let mut admin = admin.clone();
    if users(&mut admin).await?.contains(&user) {
        admin
            .user_delete(user.as_str())
            .await
            .map_err(|e| etcd("user delete", &user, e))?;
    }
    if roles(&mut admin).await?.contains(&user) {
        admin
            .role_delete(user.as_str())
            .await
            .map_err(|e| etcd("role delete", &user, e))?;
    }
    Ok(())
}

async fn provision(
    admin: &Client,
    user: &str,
    password: &str,
    prefix: &str,
    permissions: impl IntoIterator<Item = Permission>,
) -> Result<Credentials, FleetError> {
    let mut admin = admin.clone();
    ensure_role(&mut admin, user).await?;
    let wanted: Vec<Permission> = permissions.into_iter().collect();
    // What the role holds beyond what it should (an older provisioning's, or a hand-made
    // grant) goes first, so that provisioning again leaves exactly `wanted`.
    let held = admin
        .role_get(user)
        .await
        .map_err(|e| etcd("role get", user, e))?
        .permissions();
    let same = |a: &Permission, b: &Permission| {
        a.key() == b.key() && a.range_end() == b.range_end() && a.get_type() == b.get_type()
    };
    for old in held.iter().filter(|h| !wanted.iter().any(|w| same(w, h))) {
        let options = RoleRevokePermissionOptions::new().with_range_end(old.range_end());
        admin
            .role_revoke_permission(user, old.key(), Some(options))
            .await
            .map_err(|e| etcd("role revoke permission", user, e))?;
    }
    for permission in wanted {
        admin
            .role_grant_permission(user, permission)
            .await
            .map_err(|e| etcd("role grant permission", prefix, e))?;
    }
    ensure_user(&mut admin, user, password).await?;
    admin
        .user_grant_role(user, user)
        .await
        .map_err(|e| etcd("user grant role", user, e))?;
    Ok(Credentials {
        user: user.to_string(),
        password: password.to_string(),
    })
}

async fn ensure_role(admin: &mut Client, role: &str) -> Result<(), FleetError> {
    if !roles(admin).await?.iter().any(|r| r == role) {
        admin
            .role_add(role)
            .await
            .map_err(|e| etcd("role add", role, e))?;
    }
    Ok(())
}

/// Adds `user`, or sets its password where it exists.
async fn ensure_user(admin: &mut Client, user: &str, password: &str) -> Result<(), FleetError> {
    if users(admin).await?.iter().any(|u| u == user) {
        admin
            .user_change_password(user, password)
            .await
            .map_err(|e| etcd("user change password", user, e))?;
    } else {
        admin
            .user_add(user, password, None)
            .await
            .map_err(|e| etcd("user add", user, e))?;
    }
    Ok(())
}

async fn users(admin: &mut Client) -> Result<Vec<String>, FleetError> {
    Ok(admin
        .user_list()
        .await
        .map_err(|e| etcd("user list", "", e))?
        .users()
        .to_vec())
}

async fn roles(admin: &mut Client) -> Result<Vec<String>, FleetError> {
    Ok(admin
        .role_list()
        .await
        .map_err(|e| etcd("role list", "", e))?
        .roles()
        .to_vec())
}
