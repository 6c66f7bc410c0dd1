//! Following the policy repository: a bare mirror fetched on an interval (and at once when a
//! local repository changes or a push webhook arrives), the files of any of its revisions
//! (read by `tessera_source::git`, under the same rules as `tessera validate` on disk), and
//! whether a revision is signed by a trusted key.

pub mod commit;
pub mod mirror;
pub mod signature;

pub use mirror::{Mirror, RepoError, Source};
pub use signature::{TrustError, TrustedSigners, Verdict};
