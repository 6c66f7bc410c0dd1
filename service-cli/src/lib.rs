//! `tessera reconcile`'s flags, parsed once for the two binaries that run the service: `tessera`
//! (SQLite, the embedded default) and `tessera-fleet reconcile` (a replica on etcd), which
//! `tessera reconcile --store etcd://…` execs. Both turn the same [`ReconcileArgs`] into the
//! same [`Config`](tessera_reconciler::service::Config) and driver here ([`setup`]); only how
//! the store is opened and who may cycle differ.
//!
//! A crate of its own, rather than the `tessera` package's, because that package is a binary
//! with git, plotting and the benchmarks behind it, none of which `tessera-fleet` needs, and
//! rather than the reconciler's, which has no command line.

pub mod args;
pub mod setup;
pub mod store;

pub use args::{
    DriverKind, FleetArgs, Keep, NodesKind, ReconcileArgs, RetentionArgs, RuntimeKind,
    SignatureArgs, TextOrJson,
};
pub use setup::{SetupError, config, driver, load_trust};
pub use store::{StoreArg, StoreArgError};
