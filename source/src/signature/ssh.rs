//! SSH commit signatures (`SSHSIG`, namespace `git`) against Git's `allowed_signers` entries.
//!
//! An entry is `principals [options] keytype base64 [comment]` (ssh-keygen(1), "ALLOWED
//! SIGNERS"). The options honoured are `namespaces="…"` (patterns; the signature's namespace
//! must match one) and `valid-after`/`valid-before` (checked at the committer's time, as Git
//! passes `-Overify-time`; times without a zone are read as UTC). `cert-authority` is refused at
//! load: certificates are not verified, so a CA entry would trust nothing or too much.

use ssh_key::{PublicKey, SshSig};

use super::{GIT_NAMESPACE, Method, Refusal, Signer};

/// One `allowed_signers` entry.
#[derive(Debug, Clone)]
pub struct AllowedSigner {
    pub principals: String,
    key: PublicKey,
    namespaces: Option<Vec<String>>,
    valid_after: Option<i64>,
    valid_before: Option<i64>,
}

impl AllowedSigner {
    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    pub fn fingerprint(&self) -> String {
        self.key.fingerprint(Default::default()).to_string()
    }
}

const KEY_TYPES: &[&str] = &[
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// Parses one non-blank, non-comment line.
pub fn parse_line(line: &str) -> Result<AllowedSigner, String> {
    let (principals, rest) = field(line)?;
    if principals.is_empty() {
        return Err("an allowed_signers entry starts with its principals (e.g. an email)".into());
    }
    let rest = rest.trim_start();
    let first = rest.split_whitespace().next().unwrap_or_default();
    let (options, key_text) = if KEY_TYPES.contains(&first) {
        ("", rest)
    } else {
        let (options, after) = field(rest)?;
        (options, after.trim_start())
    };
    let (mut namespaces, mut valid_after, mut valid_before) = (None, None, None);
    // Options first: an unsupported one is the thing to fix, whatever the key.
    for option in split_options(options) {
        let (name, value) = match option.split_once('=') {
            Some((n, v)) => (
                n.to_ascii_lowercase(),
                Some(v.trim_matches('"').to_string()),
            ),
            None => (option.to_ascii_lowercase(), None),
        };
        match (name.as_str(), value) {
            ("namespaces", Some(v)) => {
                namespaces = Some(v.split(',').map(|s| s.trim().to_string()).collect())
            }
            ("valid-after", Some(v)) => valid_after = Some(parse_time(&v)?),
            ("valid-before", Some(v)) => valid_before = Some(parse_time(&v)?),
            ("cert-authority", _) => {
                return Err(
                    "`cert-authority` entries are not supported: list the signing keys themselves"
                        .into(),
                );
            }
            (other, _) => {
                return Err(format!(
                    "unknown option `{other}`; known: namespaces=\"…\", valid-after=\"…\", valid-before=\"…\""
                ));
            }
        }
    }
    Ok(AllowedSigner {
        principals: principals.trim_matches('"').to_string(),
        key: parse_key(key_text)?,
        namespaces,
        valid_after,
        valid_before,
    })
}

fn parse_key(text: &str) -> Result<PublicKey, String> {
    let mut parts = text.split_whitespace();
    let (Some(kind), Some(data)) = (parts.next(), parts.next()) else {
        return Err("expected `keytype base64-key` after the principals and options".into());
    };
    PublicKey::from_openssh(&format!("{kind} {data}")).map_err(|e| {
        format!("the public key cannot be read ({e}); paste it as `ssh-keygen -y` prints it")
    })
}

/// The first whitespace-separated field, where `"…"` quotes keep spaces and commas together.
fn field(text: &str) -> Result<(&str, &str), String> {
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => return Ok((&text[..i], &text[i..])),
            _ => {}
        }
    }
    if quoted {
        return Err("a quoted field is not closed".into());
    }
    Ok((text, ""))
}

/// `a,b="x,y",c` → `a`, `b="x,y"`, `c`.
fn split_options(options: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in options.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&options[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < options.len() {
        out.push(&options[start..]);
    }
    out.into_iter().filter(|o| !o.is_empty()).collect()
}

/// `YYYYMMDD[HHMM[SS]][Z]` → Unix seconds (UTC).
fn parse_time(text: &str) -> Result<i64, String> {
    let digits = text.strip_suffix('Z').unwrap_or(text);
    let bad = || format!("time {text:?}: write YYYYMMDD, YYYYMMDDHHMM or YYYYMMDDHHMMSS");
    if !matches!(digits.len(), 8 | 12 | 14) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n = |range: std::ops::Range<usize>| digits[range].parse::<i64>().map_err(|_| bad());
    let (y, m, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (hh, mm) = if digits.len() >= 12 {
        (n(8..10)?, n(10..12)?)
    } else {
        (0, 0)
    };
    let ss = if digits.len() == 14 { n(12..14)? } else { 0 };
    // jiff knows the calendar (no 31 February); a leap second reads as :59.
    let narrow = |v: i64| i8::try_from(v).map_err(|_| bad());
    let datetime = jiff::civil::DateTime::new(
        i16::try_from(y).map_err(|_| bad())?,
        narrow(m)?,
        narrow(d)?,
        narrow(hh)?,
        narrow(mm)?,
        narrow(ss.min(59))?,
        0,
    )
    .map_err(|_| bad())?;
    let zoned = datetime
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map_err(|_| bad())?;
    Ok(zoned.timestamp().as_second())
}

/// `*` and `?` patterns, as OpenSSH's `match_pattern`.
fn matches(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], t) || (!t.is_empty() && go(p, &t[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &t[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

pub fn verify(
    signers: &[AllowedSigner],
    armored: &str,
    signed_data: &[u8],
    committed_at: i64,
) -> Result<Signer, Refusal> {
    let sig = SshSig::from_pem(armored.trim()).map_err(|e| Refusal::Malformed {
        method: Method::Ssh,
        detail: e.to_string(),
    })?;
    let key = PublicKey::from(sig.public_key().clone());
    let fingerprint = key.fingerprint(Default::default()).to_string();
    let entries: Vec<&AllowedSigner> = signers
        .iter()
        .filter(|s| s.key.key_data() == sig.public_key())
        .collect();
    if entries.is_empty() {
        return Err(Refusal::UnknownKey {
            method: Method::Ssh,
            key: fingerprint,
        });
    }
    // The namespace is part of what is signed: a signature made for `file` does not verify as
    // one for `git`, so this also refuses signatures lifted from elsewhere.
    key.verify(GIT_NAMESPACE, signed_data, &sig)
        .map_err(|e| Refusal::BadSignature {
            method: Method::Ssh,
            key: fingerprint.clone(),
            detail: e.to_string(),
        })?;
    let mut why = Vec::new();
    for entry in &entries {
        match allows(entry, committed_at) {
            Ok(()) => {
                return Ok(Signer {
                    method: Method::Ssh,
                    key: fingerprint,
                    identity: entry.principals.clone(),
                });
            }
            Err(e) => why.push(e),
        }
    }
    Err(Refusal::NotAllowed {
        method: Method::Ssh,
        key: fingerprint,
        detail: why.join("; "),
    })
}

fn allows(entry: &AllowedSigner, committed_at: i64) -> Result<(), String> {
    if let Some(namespaces) = &entry.namespaces
        && !namespaces.iter().any(|p| matches(p, GIT_NAMESPACE))
    {
        return Err(format!(
            "its entry for {} allows namespaces {:?}, not `git`",
            entry.principals,
            namespaces.join(",")
        ));
    }
    if let Some(after) = entry.valid_after
        && committed_at < after
    {
        return Err(format!(
            "its entry for {} is valid only after {after} (Unix time); the commit is from {committed_at}",
            entry.principals
        ));
    }
    if let Some(before) = entry.valid_before
        && committed_at >= before
    {
        return Err(format!(
            "its entry for {} expired at {before} (Unix time); the commit is from {committed_at}",
            entry.principals
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILXPkJPI4TMFWZP4xRBQjNeizUG99KuZCt9G23rX48kz";

    #[test]
    fn entries_with_and_without_options_parse() {
        let plain = parse_line(&format!("alice@example.com {KEY} laptop")).unwrap();
        assert_eq!(plain.principals, "alice@example.com");
        assert!(plain.namespaces.is_none());
        let with = parse_line(&format!(
            "\"alice@example.com,bob@example.com\" namespaces=\"git,file\",valid-after=\"20240101\" {KEY}"
        ))
        .unwrap();
        assert_eq!(with.principals, "alice@example.com,bob@example.com");
        assert_eq!(with.namespaces.as_deref().unwrap(), ["git", "file"]);
        assert_eq!(with.valid_after, Some(1_704_067_200));
    }

    #[test]
    fn bad_entries_say_what_to_fix() {
        let e = parse_line("alice@example.com cert-authority ssh-ed25519 AAAA").unwrap_err();
        assert!(e.contains("cert-authority"), "{e}");
        let e = parse_line("alice@example.com ssh-ed25519 not-base64").unwrap_err();
        assert!(e.contains("public key"), "{e}");
        let e = parse_line(&format!("alice@example.com frobnicate {KEY}")).unwrap_err();
        assert!(e.contains("unknown option"), "{e}");
        let e = parse_line(&format!("alice@example.com valid-before=\"2024\" {KEY}")).unwrap_err();
        assert!(e.contains("YYYYMMDD"), "{e}");
    }

    #[test]
    fn times_are_read_as_utc() {
        assert_eq!(parse_time("19700101").unwrap(), 0);
        assert_eq!(parse_time("20000301000001Z").unwrap(), 951_868_801);
        assert!(parse_time("20241301").is_err());
        assert!(parse_time("20260231").is_err(), "no 31 February");
    }

    #[test]
    fn namespace_patterns_match_like_openssh() {
        assert!(matches("git", "git"));
        assert!(matches("g*", "git"));
        assert!(matches("g?t", "git"));
        assert!(!matches("file", "git"));
    }
}
