//! Following the policy repository: a bare mirror fetched on an interval (and at once when a
//! local repository changes or a push webhook arrives). The files of any of its revisions are
//! read by `tessera_source::git` (under the same rules as `tessera validate` on disk), and
//! whether a revision is signed by a trusted key is decided by `tessera_source::signature`, as
//! `tessera plan` and `tessera verify` decide it.

pub mod mirror;

pub use mirror::{Mirror, RepoError, Source};
pub use tessera_source::commit;
pub use tessera_source::signature::{self, TrustError, TrustedSigners, Verdict};
