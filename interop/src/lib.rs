//! Translation between tessera's policy and the formats of its peers, with plain data in and
//! out (no I/O: the binary reads and writes the files).
//!
//! - [`kueue::export()`]: a compiled policy as Kueue objects (`kueue.x-k8s.io/v1beta2`), and
//!   [`kueue::import()`]: Kueue objects (v1beta1 or v1beta2) as policy documents. Both go through
//!   [`Fleet`], the part of a policy both can express; `import ∘ export` is the identity on it.
//! - [`mig_parted::export`]: the MIG pools' layouts as NVIDIA mig-parted's `config.yaml`.
//!
//! What a target cannot express is returned as [`Warning`]s, never dropped silently.

pub mod fleet;
pub mod kueue;
pub mod mig_parted;
pub mod quantity;

use std::fmt;

pub use fleet::Fleet;

/// Something the target format cannot express, or a value it holds less exactly.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Warning {
    /// What it is about: `pool h100-infer`, `tenant research`, `tiers`.
    pub subject: String,
    pub message: String,
}

impl Warning {
    pub fn new(subject: impl Into<String>, message: impl Into<String>) -> Warning {
        Warning {
            subject: subject.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.message)
    }
}
