//! Bearer tokens: one per tenant, and one for the operator.
//!
//! Tokens come from a YAML file the operator keeps out of the policy repository (like a
//! Kubernetes Secret):
//!
//! ```yaml
//! admin: 4f1c...            # suspend, resume, reconcile now, GET /state, every workload
//! tenants:
//!   team-a: 9b2e...         # team-a's own workloads only
//! ```
//!
//! Only SHA-256 digests are kept in memory, and a presented token is compared by digest in
//! constant time (`subtle`), so neither the comparison's timing nor a memory dump gives a token
//! away.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Who a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Tenant(String),
}

impl Principal {
    /// Whether this principal may see and act on `tenant`'s workloads.
    pub fn may_act_for(&self, tenant: &str) -> bool {
        match self {
            Principal::Admin => true,
            Principal::Tenant(t) => t == tenant,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("{path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    admin: Option<String>,
    #[serde(default)]
    tenants: BTreeMap<String, String>,
}

/// The token digests.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<([u8; 32], Principal)>,
}

/// Tokens shorter than this are refused at load: a guessable token is no authentication.
pub const MIN_TOKEN_LEN: usize = 16;

impl Tokens {
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| TokensError::Read {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        Tokens::parse(&text).map_err(|reason| TokensError::Invalid {
            path: shown,
            reason,
        })
    }

    /// Parses the YAML text of a tokens file.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let file: TokensFile = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let mut tokens = Tokens::default();
        if let Some(admin) = file.admin {
            tokens.insert(&admin, Principal::Admin, "admin")?;
        }
        for (tenant, token) in file.tenants {
            let field = format!("tenants.{tenant}");
            tokens.insert(&token, Principal::Tenant(tenant), &field)?;
        }
        Ok(tokens)
    }

    fn insert(&mut self, token: &str, who: Principal, field: &str) -> Result<(), String> {
        if token.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "{field}: a token needs at least {MIN_TOKEN_LEN} characters (try `openssl rand -hex 32`)"
            ));
        }
        let digest = digest(token);
        if self.entries.iter().any(|(d, _)| *d == digest) {
            return Err(format!("{field}: the same token is given twice"));
        }
        self.entries.push((digest, who));
        Ok(())
    }

    /// The principal a bearer token belongs to. Every entry is compared, so the time taken does
    /// not depend on which one matched.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let presented = digest(token);
        let mut found = None;
        for (d, who) in &self.entries {
            if bool::from(d.ct_eq(&presented)) {
                found = Some(who.clone());
            }
        }
        found
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Equal digests, compared in constant time (the webhook secret shares it).
pub(crate) fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_principals() {
        let t = Tokens::parse(
            "admin: aaaaaaaaaaaaaaaaaaaa\ntenants:\n  team-a: bbbbbbbbbbbbbbbbbbbb\n",
        )
        .unwrap();
        assert_eq!(
            t.authenticate("aaaaaaaaaaaaaaaaaaaa"),
            Some(Principal::Admin)
        );
        assert_eq!(
            t.authenticate("bbbbbbbbbbbbbbbbbbbb"),
            Some(Principal::Tenant("team-a".into()))
        );
        assert_eq!(t.authenticate("bbbbbbbbbbbbbbbbbbbc"), None);
        assert_eq!(t.authenticate(""), None);
    }

    #[test]
    fn short_and_duplicate_tokens_are_refused() {
        let e = Tokens::parse("tenants:\n  team-a: short\n").unwrap_err();
        assert!(e.contains("tenants.team-a"), "{e}");
        let e = Tokens::parse("tenants:\n  a: cccccccccccccccccccc\n  b: cccccccccccccccccccc\n")
            .unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(Tokens::parse("tenant:\n  a: cccccccccccccccccccc\n").is_err());
    }

    #[test]
    fn admin_acts_for_everyone_tenants_for_themselves() {
        assert!(Principal::Admin.may_act_for("x"));
        assert!(Principal::Tenant("x".into()).may_act_for("x"));
        assert!(!Principal::Tenant("x".into()).may_act_for("y"));
    }
}
