//! OpenPGP commit signatures (what `git commit -S` makes with GnuPG) against armored public keys.
//!
//! A key is trusted with its subkeys once its self-signatures and subkey bindings verify (checked
//! at load, so a key block that does not hold together is an error, not a silent distrust). A
//! signature is matched to the primary key or a signing subkey by its issuer fingerprint or key
//! id, and must verify over the commit with that key.

use pgp::composed::{Deserializable, DetachedSignature, SignedPublicKey};
use pgp::types::KeyDetails;

use super::{Method, Refusal, Signer};

/// One trusted certificate.
#[derive(Debug, Clone)]
pub struct TrustedKey {
    key: SignedPublicKey,
}

impl TrustedKey {
    /// The primary key's fingerprint, upper-case hex as `gpg --list-keys` prints it.
    pub fn fingerprint(&self) -> String {
        hex(self.key.primary_key.fingerprint().as_bytes())
    }

    fn identity(&self) -> String {
        self.key
            .details
            .users
            .first()
            .map(|u| String::from_utf8_lossy(u.id.id()).into_owned())
            .unwrap_or_else(|| "no user id".to_string())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// The keys of one armored block.
pub fn parse_block(armored: &str) -> Result<Vec<TrustedKey>, String> {
    let (keys, _headers) =
        SignedPublicKey::from_armor_many(std::io::Cursor::new(armored.as_bytes()))
            .map_err(|e| format!("the OpenPGP key block cannot be read: {e}"))?;
    let mut out = Vec::new();
    for key in keys {
        let key = key.map_err(|e| format!("the OpenPGP key block cannot be read: {e}"))?;
        key.verify_bindings().map_err(|e| {
            format!(
                "OpenPGP key {}: its self-signatures do not verify ({e}); export it again with `gpg --export --armor`",
                hex(key.primary_key.fingerprint().as_bytes())
            )
        })?;
        if !key.details.revocation_signatures.is_empty() {
            return Err(format!(
                "OpenPGP key {} is revoked; remove it from the trusted signers",
                hex(key.primary_key.fingerprint().as_bytes())
            ));
        }
        out.push(TrustedKey { key });
    }
    if out.is_empty() {
        return Err("the OpenPGP key block holds no key".into());
    }
    Ok(out)
}

pub fn verify(keys: &[TrustedKey], armored: &str, signed_data: &[u8]) -> Result<Signer, Refusal> {
    let malformed = |detail: String| Refusal::Malformed {
        method: Method::Openpgp,
        detail,
    };
    let (sig, _) =
        DetachedSignature::from_string(armored.trim()).map_err(|e| malformed(e.to_string()))?;
    let fingerprints: Vec<String> = sig
        .signature
        .issuer_fingerprint()
        .iter()
        .map(|f| hex(f.as_bytes()))
        .collect();
    let key_ids: Vec<String> = sig
        .signature
        .issuer_key_id()
        .iter()
        .map(|id| hex(id.as_ref()))
        .collect();
    let issuer = fingerprints
        .first()
        .or(key_ids.first())
        .cloned()
        .unwrap_or_else(|| "unknown".to_string());
    let issued_by = |fingerprint: String, key_id: String| {
        fingerprints.contains(&fingerprint) || key_ids.contains(&key_id)
    };
    for trusted in keys {
        let primary = &trusted.key.primary_key;
        let primary_matches = issued_by(
            hex(primary.fingerprint().as_bytes()),
            hex(primary.legacy_key_id().as_ref()),
        );
        if primary_matches {
            return check(&sig, primary, trusted, signed_data);
        }
        for sub in &trusted.key.public_subkeys {
            let matches = issued_by(
                hex(sub.key.fingerprint().as_bytes()),
                hex(sub.key.legacy_key_id().as_ref()),
            );
            if !matches {
                continue;
            }
            // Only a subkey bound for signing speaks for the key.
            if !sub.signatures.iter().any(|s| s.key_flags().sign()) {
                return Err(Refusal::NotAllowed {
                    method: Method::Openpgp,
                    key: trusted.fingerprint(),
                    detail: format!(
                        "subkey {} is not bound for signing",
                        hex(sub.key.fingerprint().as_bytes())
                    ),
                });
            }
            return check(&sig, &sub.key, trusted, signed_data);
        }
    }
    Err(Refusal::UnknownKey {
        method: Method::Openpgp,
        key: issuer,
    })
}

fn check(
    sig: &DetachedSignature,
    key: &impl pgp::types::VerifyingKey,
    trusted: &TrustedKey,
    signed_data: &[u8],
) -> Result<Signer, Refusal> {
    sig.verify(key, signed_data)
        .map_err(|e| Refusal::BadSignature {
            method: Method::Openpgp,
            key: trusted.fingerprint(),
            detail: e.to_string(),
        })?;
    Ok(Signer {
        method: Method::Openpgp,
        key: trusted.fingerprint(),
        identity: trusted.identity(),
    })
}
