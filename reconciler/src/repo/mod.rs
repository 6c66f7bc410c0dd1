//! Following the policy repository: a bare mirror fetched on an interval (and at once when a
//! local repository changes), and the files of any of its revisions.

pub mod mirror;
pub mod tree;

pub use mirror::{Mirror, RepoError, Source};
