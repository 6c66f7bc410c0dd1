//! Following the policy repository: a bare mirror fetched on an interval (and at once when a
//! local repository changes), and the files of any of its revisions (read by
//! `tessera_source::git`, under the same rules as `tessera validate` on disk).

pub mod mirror;

pub use mirror::{Mirror, RepoError, Source};
