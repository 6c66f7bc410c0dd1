//! Where the service keeps its state: the SQLite file (the embedded default) or a backend the
//! caller opens (fleet mode's etcd store, which this crate does not know).

use std::path::{Path, PathBuf};

use crate::store::{StateStore, Store, StoreError};

/// Opens one connection to a backend the caller provides.
pub type OpenStore = Box<dyn Fn() -> Result<Box<dyn StateStore>, StoreError> + Send>;

/// How the service opens its store. The service opens it twice, one connection for the
/// reconcile loop and one for the API, so that neither waits on the other's calls.
pub enum StoreSource {
    /// The SQLite database at this path.
    Sqlite(PathBuf),
    /// Another backend: `open` is called once per connection; `name` says which backend in
    /// errors (`etcd://10.0.0.1:2379`).
    Custom { name: String, open: OpenStore },
}

impl StoreSource {
    /// One connection to the store.
    pub fn open(&self) -> Result<Box<dyn StateStore>, StoreError> {
        match self {
            StoreSource::Sqlite(path) => Ok(Box::new(Store::open(path)?)),
            StoreSource::Custom { open, .. } => open(),
        }
    }

    /// What errors call the store: its path, or the backend's name.
    pub fn name(&self) -> String {
        match self {
            StoreSource::Sqlite(path) => path.display().to_string(),
            StoreSource::Custom { name, .. } => name.clone(),
        }
    }

    /// The file a workload's sandbox must hide, where the store is one on this machine.
    pub fn local_file(&self) -> Option<&Path> {
        match self {
            StoreSource::Sqlite(path) => Some(path),
            StoreSource::Custom { .. } => None,
        }
    }
}

impl std::fmt::Debug for StoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSource::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            StoreSource::Custom { name, .. } => {
                f.debug_struct("Custom").field("name", name).finish()
            }
        }
    }
}
