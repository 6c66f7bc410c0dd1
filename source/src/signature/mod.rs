//! Signed revisions: whether a commit is signed by a key the operator trusts.
//!
//! Pure: a commit's signed bytes, its signature and the trusted signers in, a [`Verdict`] out.
//! Nothing here reads Git or the file system; [`crate::commit`] extracts the signature from a commit
//! object and callers read the trust files. Signatures are verified in process: SSH signatures
//! (`ssh-keygen -Y sign -n git`, what Git makes with `gpg.format = ssh`) against entries in Git's
//! `allowed_signers` format, and OpenPGP signatures against armored public keys.
//!
//! A trust file may hold both: armored `PGP PUBLIC KEY BLOCK`s are OpenPGP keys, every other
//! line that is not blank or a `#` comment is an `allowed_signers` entry.

mod openpgp;
mod ssh;

use std::fmt;

pub use openpgp::TrustedKey;
pub use ssh::AllowedSigner;

/// The namespace Git signs commits in (`ssh-keygen -Y sign -n git`); a signature made for
/// another namespace (a file, an email) is not a commit signature, whatever it covers.
pub const GIT_NAMESPACE: &str = "git";

/// Why a trust file cannot be used. Each names the file and line and says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    #[error("{file}:{line}: {message}")]
    Invalid {
        file: String,
        line: usize,
        message: String,
    },
    #[error(
        "{file}: holds no trusted signer; list `allowed_signers` entries or armored OpenPGP public keys"
    )]
    Empty { file: String },
}

/// The keys whose signatures are trusted.
#[derive(Debug, Clone, Default)]
pub struct TrustedSigners {
    ssh: Vec<AllowedSigner>,
    openpgp: Vec<TrustedKey>,
}

impl TrustedSigners {
    /// Parses one trust file (`file` names it in errors) and adds its signers.
    pub fn add(&mut self, file: &str, text: &str) -> Result<(), TrustError> {
        let before = self.len();
        let mut lines = text.lines().enumerate().peekable();
        while let Some((index, line)) = lines.next() {
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            if trimmed.starts_with("-----BEGIN PGP PUBLIC KEY BLOCK-----") {
                let start = index + 1;
                let mut block = String::from(trimmed);
                block.push('\n');
                let mut closed = false;
                for (_, l) in lines.by_ref() {
                    block.push_str(l.trim_end());
                    block.push('\n');
                    if l.trim().starts_with("-----END PGP PUBLIC KEY BLOCK-----") {
                        closed = true;
                        break;
                    }
                }
                if !closed {
                    return Err(invalid(
                        file,
                        start,
                        "an armored OpenPGP key block is not closed by `-----END PGP PUBLIC KEY BLOCK-----`",
                    ));
                }
                let keys = openpgp::parse_block(&block).map_err(|m| invalid(file, start, &m))?;
                self.openpgp.extend(keys);
                continue;
            }
            let signer = ssh::parse_line(trimmed).map_err(|m| invalid(file, index + 1, &m))?;
            self.ssh.push(signer);
        }
        if self.len() == before {
            return Err(TrustError::Empty {
                file: file.to_string(),
            });
        }
        Ok(())
    }

    /// Signers of both kinds.
    pub fn len(&self) -> usize {
        self.ssh.len() + self.openpgp.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `commit` is signed by a trusted key.
    pub fn verify(&self, commit: &SignedCommit<'_>) -> Verdict {
        let outcome = match commit.signature {
            None => Err(Refusal::Unsigned),
            Some(signature) => {
                let text = String::from_utf8_lossy(signature);
                let text = text.trim_start();
                if text.starts_with("-----BEGIN SSH SIGNATURE-----") {
                    ssh::verify(&self.ssh, text, commit.signed_data, commit.committed_at)
                } else if text.starts_with("-----BEGIN PGP SIGNATURE-----") {
                    openpgp::verify(&self.openpgp, text, commit.signed_data)
                } else {
                    Err(Refusal::UnsupportedFormat {
                        first_line: text.lines().next().unwrap_or_default().to_string(),
                    })
                }
            }
        };
        Verdict {
            commit: commit.id.to_string(),
            outcome,
        }
    }
}

fn invalid(file: &str, line: usize, message: &str) -> TrustError {
    TrustError::Invalid {
        file: file.to_string(),
        line,
        message: message.to_string(),
    }
}

/// What a verification needs of a commit.
#[derive(Debug, Clone, Copy)]
pub struct SignedCommit<'a> {
    /// The commit's id, for messages.
    pub id: &'a str,
    /// The `gpgsig` header's value; `None` when the commit is unsigned.
    pub signature: Option<&'a [u8]>,
    /// The commit object without its signature header: what was signed.
    pub signed_data: &'a [u8],
    /// The committer's time (Unix seconds): an `allowed_signers` entry's validity is checked at
    /// it, as Git does.
    pub committed_at: i64,
}

/// How a signature was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Ssh,
    Openpgp,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Ssh => "SSH",
            Method::Openpgp => "OpenPGP",
        })
    }
}

/// A signature that verified against a trusted key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Signer {
    pub method: Method,
    /// `SHA256:…` for SSH keys, the hex fingerprint of the primary key for OpenPGP.
    pub key: String,
    /// The `allowed_signers` principals, or the OpenPGP key's first user id.
    pub identity: String,
}

/// Why a commit is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Refusal {
    /// The commit carries no signature.
    Unsigned,
    /// Signed by a key that is not among the trusted signers.
    UnknownKey { method: Method, key: String },
    /// The signature does not verify over the commit (the commit was altered after signing, or
    /// the signature is corrupt).
    BadSignature {
        method: Method,
        key: String,
        detail: String,
    },
    /// A trusted key, but its entry does not allow this signature (namespace, validity period).
    NotAllowed {
        method: Method,
        key: String,
        detail: String,
    },
    /// The signature cannot be read.
    Malformed { method: Method, detail: String },
    /// Neither an SSH nor an OpenPGP signature (an X.509 one, say).
    UnsupportedFormat { first_line: String },
}

/// The outcome of verifying one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub commit: String,
    pub outcome: Result<Signer, Refusal>,
}

impl Verdict {
    pub fn is_trusted(&self) -> bool {
        self.outcome.is_ok()
    }

    /// The key that signed, trusted or not, when it is known.
    pub fn key(&self) -> Option<&str> {
        match &self.outcome {
            Ok(s) => Some(&s.key),
            Err(
                Refusal::UnknownKey { key, .. }
                | Refusal::BadSignature { key, .. }
                | Refusal::NotAllowed { key, .. },
            ) => Some(key),
            Err(_) => None,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let commit = &self.commit[..self.commit.len().min(12)];
        match &self.outcome {
            Ok(s) => write!(
                f,
                "commit {commit} is signed by trusted {} key {} ({})",
                s.method, s.key, s.identity
            ),
            Err(Refusal::Unsigned) => write!(
                f,
                "commit {commit} is not signed (key: none); sign it with a trusted key (git commit -S)"
            ),
            Err(Refusal::UnknownKey { method, key }) => write!(
                f,
                "commit {commit} is signed by {method} key {key}, which is not a trusted signer"
            ),
            Err(Refusal::BadSignature {
                method,
                key,
                detail,
            }) => write!(
                f,
                "commit {commit}: its {method} signature by key {key} does not match the commit \
                 (altered after signing?): {detail}"
            ),
            Err(Refusal::NotAllowed {
                method,
                key,
                detail,
            }) => write!(
                f,
                "commit {commit} is signed by {method} key {key}, whose trust entry does not allow it: {detail}"
            ),
            Err(Refusal::Malformed { method, detail }) => write!(
                f,
                "commit {commit}: its {method} signature cannot be read (key: unknown): {detail}"
            ),
            Err(Refusal::UnsupportedFormat { first_line }) => write!(
                f,
                "commit {commit} has a signature of a kind tessera does not verify ({first_line:?}); \
                 sign with an SSH or OpenPGP key"
            ),
        }
    }
}
