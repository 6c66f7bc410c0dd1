//! `tessera-fleet access`: etcd's users and roles for a cluster, without etcdctl. `enable`
//! turns access control on (creating etcd's `root`); `control-plane` and `node` create or
//! update the control plane's user and one node's (a new password rotates it); `revoke-node`
//! removes a node's. Each step is idempotent (`tessera_fleet::access`), so running a
//! provisioning again finishes one that failed half-way.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use etcd_client::Client;
use tessera_fleet::access::{self, Credentials, ROOT_USER};
use tessera_fleet::keys::Keys;

use crate::secret::read_password;

#[derive(Debug, Subcommand)]
pub enum AccessCommand {
    /// Turn etcd's access control on, creating its `root` user with the password in
    /// `--root-password-file`. Run once, before any other step; every client must
    /// authenticate afterwards.
    Enable(EnableArgs),
    /// Create or update the control plane's user, `tessera.<cluster>.control`: read-write on
    /// `/tessera/<cluster>/` and nothing else. Its replicas take `--etcd-user` and
    /// `--etcd-password-file`.
    ControlPlane(UserArgs),
    /// Create or update node NODE's user, `tessera.<cluster>.node.<NODE>`: it reads its
    /// node's keys and writes only its registration, observation, utilisation and journal.
    /// Its agent takes `--credentials FILE` holding `USER:PASSWORD`.
    Node(NodeArgs),
    /// Remove node NODE's user and role: its agent can no longer authenticate.
    RevokeNode(RevokeArgs),
}

#[derive(Debug, Args)]
pub struct EnableArgs {
    /// etcd's client URLs, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    etcd: Vec<String>,
    /// The password `root` gets: the first line of FILE.
    #[arg(long, value_name = "FILE")]
    root_password_file: PathBuf,
}

/// How the administration connects: as `root`, to one cluster's keys.
#[derive(Debug, Args)]
pub struct Admin {
    /// etcd's client URLs, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    etcd: Vec<String>,
    /// The cluster: its keys live under `/tessera/<cluster>/`.
    #[arg(long, default_value = "default")]
    cluster: String,
    /// etcd's `root` password: the first line of FILE.
    #[arg(long, value_name = "FILE")]
    root_password_file: PathBuf,
}

#[derive(Debug, Args)]
pub struct UserArgs {
    #[command(flatten)]
    admin: Admin,
    /// The user's password: the first line of FILE.
    #[arg(long, value_name = "FILE")]
    password_file: PathBuf,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The node's name, as its agent's `--node` gives it.
    node: String,
    #[command(flatten)]
    user: UserArgs,
}

#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The node's name.
    node: String,
    #[command(flatten)]
    admin: Admin,
}

pub fn run(command: AccessCommand) -> anyhow::Result<()> {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    tokio.block_on(async {
        match command {
            AccessCommand::Enable(args) => {
                let password = read_password(&args.root_password_file)?;
                let client = access::connect(&args.etcd, None).await?;
                access::enable_auth(&client, &password).await.context(
                    "cannot turn access control on (is it on already? then this step is done)",
                )?;
                println!("access control is on; etcd's administrator is `{ROOT_USER}`");
            }
            AccessCommand::ControlPlane(args) => {
                let (root, keys) = args.admin.connect().await?;
                let password = read_password(&args.password_file)?;
                let made = access::provision_control_plane(&root, &keys, &password).await?;
                println!(
                    "etcd user `{}`: read-write on {}; give each replica --etcd-user {} \
                     --etcd-password-file FILE",
                    made.user,
                    keys.root(),
                    made.user
                );
            }
            AccessCommand::Node(args) => {
                let (root, keys) = args.user.admin.connect().await?;
                let password = read_password(&args.user.password_file)?;
                let made = access::provision_node(&root, &keys, &args.node, &password).await?;
                println!(
                    "etcd user `{}`: node {}'s keys; give its agent --credentials FILE \
                     holding `{}:PASSWORD`",
                    made.user, args.node, made.user
                );
            }
            AccessCommand::RevokeNode(args) => {
                let (root, keys) = args.admin.connect().await?;
                access::revoke_node(&root, &keys, &args.node).await?;
                println!(
                    "node {}'s etcd user is removed (tokens etcd issued it stay valid until \
                     they expire: etcd's --auth-token-ttl)",
                    args.node
                );
            }
        }
        Ok(())
    })
}

impl Admin {
    async fn connect(&self) -> anyhow::Result<(Client, Keys)> {
        let keys = Keys::new(&self.cluster)?;
        let root = Credentials {
            user: ROOT_USER.to_string(),
            password: read_password(&self.root_password_file)?,
        };
        Ok((access::connect(&self.etcd, Some(&root)).await?, keys))
    }
}
