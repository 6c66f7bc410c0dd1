//! Browser sessions and one-time login codes for the fleet page.
//!
//! A browser cannot send the API's bearer header, so a person signs in once (the login form
//! takes the token, or a script mints a one-time code with its token and opens
//! `/ui/login?once=CODE`) and the service hands the browser a cookie holding a random session
//! id. The cookie never holds the token, and no token is ever put in a URL.
//!
//! Ids and codes are 256 random bits from the OS's CSPRNG; only their SHA-256 digests are kept
//! (like the tokens), so a memory dump gives no live session away. A code is good for
//! [`CODE_TTL_SECONDS`] and once; a session for [`SESSION_TTL_SECONDS`]. Everything lives in
//! memory: a restart signs everyone out, which costs a person one login. Both tables are
//! bounded, so a token holder minting codes in a loop cannot exhaust the service's memory.
//!
//! Every call takes the current instant, so that expiry is tested without waiting.

use std::collections::HashMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::auth::Principal;

/// How long a one-time code may be redeemed after it is minted.
pub const CODE_TTL_SECONDS: i64 = 60;
/// How long a session lasts after login.
pub const SESSION_TTL_SECONDS: i64 = 12 * 3600;
/// Live codes at most; minting past it is refused until some expire or are used.
pub const MAX_CODES: usize = 1_000;
/// Live sessions at most; a login past it ends the session closest to its expiry.
pub const MAX_SESSIONS: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error(
        "this login link was already used, has expired (links last {CODE_TTL_SECONDS} s) or was \
         never issued: mint a new one with `POST /v1/ui/links`, or sign in with your token"
    )]
    BadCode,
    #[error(
        "{MAX_CODES} login links are waiting to be used: use one, or retry in \
         {CODE_TTL_SECONDS} s when they have expired"
    )]
    TooManyCodes,
    #[error("the system's random number generator failed: {0}")]
    Random(String),
}

struct Entry {
    who: Principal,
    expires_at: i64,
}

#[derive(Default)]
struct Tables {
    codes: HashMap<[u8; 32], Entry>,
    sessions: HashMap<[u8; 32], Entry>,
}

/// The live sessions and codes.
#[derive(Default)]
pub struct Sessions {
    tables: Mutex<Tables>,
}

/// A freshly minted code and when it stops working (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minted {
    pub code: String,
    pub expires_at: i64,
}

/// A new session's id (the cookie's value) and when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub id: String,
    pub expires_at: i64,
}

impl Sessions {
    pub fn new() -> Sessions {
        Sessions::default()
    }

    fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A one-time code for `who`, good for [`CODE_TTL_SECONDS`] from `now`.
    pub fn mint_code(&self, who: Principal, now: i64) -> Result<Minted, SessionError> {
        let code = random_id()?;
        let mut tables = self.tables();
        tables.codes.retain(|_, e| e.expires_at > now);
        if tables.codes.len() >= MAX_CODES {
            return Err(SessionError::TooManyCodes);
        }
        let expires_at = now + CODE_TTL_SECONDS;
        tables
            .codes
            .insert(digest(&code), Entry { who, expires_at });
        Ok(Minted { code, expires_at })
    }

    /// Uses `code` up: its principal when it was minted and has not expired or been used.
    pub fn redeem_code(&self, code: &str, now: i64) -> Result<Principal, SessionError> {
        let entry = self
            .tables()
            .codes
            .remove(&digest(code))
            .ok_or(SessionError::BadCode)?;
        if entry.expires_at <= now {
            return Err(SessionError::BadCode);
        }
        Ok(entry.who)
    }

    /// A new session for `who`.
    pub fn open(&self, who: Principal, now: i64) -> Result<Opened, SessionError> {
        let id = random_id()?;
        let mut tables = self.tables();
        tables.sessions.retain(|_, e| e.expires_at > now);
        if tables.sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = tables
                .sessions
                .iter()
                .min_by_key(|(_, e)| e.expires_at)
                .map(|(k, _)| *k)
        {
            tables.sessions.remove(&oldest);
        }
        let expires_at = now + SESSION_TTL_SECONDS;
        tables
            .sessions
            .insert(digest(&id), Entry { who, expires_at });
        Ok(Opened { id, expires_at })
    }

    /// Who session `id` belongs to, while it lasts.
    pub fn principal(&self, id: &str, now: i64) -> Option<Principal> {
        let mut tables = self.tables();
        let key = digest(id);
        match tables.sessions.get(&key) {
            Some(e) if e.expires_at > now => Some(e.who.clone()),
            Some(_) => {
                tables.sessions.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends session `id` (sign out); unknown ids are ignored.
    pub fn close(&self, id: &str) {
        self.tables().sessions.remove(&digest(id));
    }
}

/// 256 random bits as 64 hex digits: safe in a cookie and a URL as they are.
fn random_id() -> Result<String, SessionError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| SessionError::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_790_000_000;

    fn tenant(t: &str) -> Principal {
        Principal::Tenant(t.into())
    }

    #[test]
    fn a_code_works_once_for_its_principal() {
        let s = Sessions::new();
        let minted = s.mint_code(tenant("a"), T).unwrap();
        assert_eq!(minted.code.len(), 64);
        assert_eq!(minted.expires_at, T + CODE_TTL_SECONDS);
        assert_eq!(s.redeem_code(&minted.code, T + 1), Ok(tenant("a")));
        assert_eq!(
            s.redeem_code(&minted.code, T + 2),
            Err(SessionError::BadCode)
        );
        assert_eq!(s.redeem_code("not-a-code", T), Err(SessionError::BadCode));
    }

    #[test]
    fn an_expired_code_is_refused_and_used_up() {
        let s = Sessions::new();
        let minted = s.mint_code(Principal::Admin, T).unwrap();
        assert_eq!(
            s.redeem_code(&minted.code, T + CODE_TTL_SECONDS),
            Err(SessionError::BadCode)
        );
        let minted = s.mint_code(Principal::Admin, T).unwrap();
        assert_eq!(
            s.redeem_code(&minted.code, T + CODE_TTL_SECONDS - 1),
            Ok(Principal::Admin)
        );
    }

    #[test]
    fn codes_and_ids_differ_every_time() {
        let s = Sessions::new();
        let a = s.mint_code(Principal::Admin, T).unwrap().code;
        let b = s.mint_code(Principal::Admin, T).unwrap().code;
        assert_ne!(a, b);
        let c = s.open(Principal::Admin, T).unwrap().id;
        assert!(c != a && c != b);
    }

    #[test]
    fn a_session_lasts_until_it_expires_or_is_closed() {
        let s = Sessions::new();
        let opened = s.open(tenant("a"), T).unwrap();
        assert_eq!(s.principal(&opened.id, T + 10), Some(tenant("a")));
        assert_eq!(s.principal(&opened.id, T + SESSION_TTL_SECONDS), None);
        let opened = s.open(tenant("b"), T).unwrap();
        s.close(&opened.id);
        assert_eq!(s.principal(&opened.id, T), None);
        // A code is not a session, nor a session id a code.
        let code = s.mint_code(tenant("c"), T).unwrap().code;
        assert_eq!(s.principal(&code, T), None);
        let id = s.open(tenant("c"), T).unwrap().id;
        assert_eq!(s.redeem_code(&id, T), Err(SessionError::BadCode));
    }

    #[test]
    fn live_codes_are_bounded_and_expired_ones_make_room() {
        let s = Sessions::new();
        for _ in 0..MAX_CODES {
            s.mint_code(Principal::Admin, T).unwrap();
        }
        assert_eq!(
            s.mint_code(Principal::Admin, T + 1),
            Err(SessionError::TooManyCodes)
        );
        assert!(s.mint_code(Principal::Admin, T + CODE_TTL_SECONDS).is_ok());
    }

    #[test]
    fn sessions_are_bounded_by_ending_the_oldest() {
        let s = Sessions::new();
        let first = s.open(tenant("a"), T).unwrap().id;
        for i in 1..MAX_SESSIONS as i64 {
            s.open(tenant("b"), T + i).unwrap();
        }
        assert_eq!(s.principal(&first, T + 1), Some(tenant("a")));
        let last = s.open(tenant("c"), T + 20_000).unwrap().id;
        assert_eq!(s.principal(&first, T + 20_000), None);
        assert_eq!(s.principal(&last, T + 20_000), Some(tenant("c")));
    }
}
