//! `--store`: where the service keeps its state.

use std::path::PathBuf;

/// A parsed `--store` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreArg {
    /// `sqlite:PATH`: the embedded default, one process.
    Sqlite(PathBuf),
    /// `etcd://HOST:PORT[,HOST:PORT...]`: fleet mode, any number of replicas; the client URLs
    /// (`http://HOST:PORT`) of etcd's members.
    Etcd(Vec<String>),
}

/// Why a `--store` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreArgError {
    #[error("`{0}` names no store: write sqlite:PATH or etcd://HOST:PORT[,HOST:PORT...]")]
    Scheme(String),
    #[error("`{0}`: sqlite: needs a path (sqlite:.tessera/tessera.db)")]
    EmptyPath(String),
    #[error("`{value}`: `{member}` is not HOST:PORT (etcd://10.0.0.1:2379,10.0.0.2:2379)")]
    Member { value: String, member: String },
}

impl StoreArg {
    /// Parses `sqlite:PATH` or `etcd://HOST:PORT[,HOST:PORT...]`.
    pub fn parse(value: &str) -> Result<StoreArg, StoreArgError> {
        if let Some(path) = value.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(StoreArgError::EmptyPath(value.to_string()));
            }
            return Ok(StoreArg::Sqlite(PathBuf::from(path)));
        }
        let Some(members) = value.strip_prefix("etcd://") else {
            return Err(StoreArgError::Scheme(value.to_string()));
        };
        members
            .split(',')
            .map(|member| match member.rsplit_once(':') {
                Some((host, port))
                    if !host.is_empty()
                        && !host.contains('/')
                        && port.parse::<u16>().is_ok_and(|p| p > 0) =>
                {
                    Ok(format!("http://{member}"))
                }
                _ => Err(StoreArgError::Member {
                    value: value.to_string(),
                    member: member.to_string(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(StoreArg::Etcd)
    }

    /// As the flag spells it.
    pub fn to_flag(&self) -> String {
        match self {
            StoreArg::Sqlite(path) => format!("sqlite:{}", path.display()),
            StoreArg::Etcd(urls) => {
                let members: Vec<&str> = urls
                    .iter()
                    .map(|u| u.strip_prefix("http://").unwrap_or(u))
                    .collect();
                format!("etcd://{}", members.join(","))
            }
        }
    }
}

impl std::str::FromStr for StoreArg {
    type Err = StoreArgError;

    fn from_str(value: &str) -> Result<StoreArg, StoreArgError> {
        StoreArg::parse(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_and_etcd_parse_and_spell_back() {
        assert_eq!(
            StoreArg::parse("sqlite:/var/lib/tessera.db").unwrap(),
            StoreArg::Sqlite(PathBuf::from("/var/lib/tessera.db"))
        );
        let etcd = StoreArg::parse("etcd://127.0.0.1:2379,[::1]:2380").unwrap();
        assert_eq!(
            etcd,
            StoreArg::Etcd(vec![
                "http://127.0.0.1:2379".to_string(),
                "http://[::1]:2380".to_string()
            ])
        );
        assert_eq!(etcd.to_flag(), "etcd://127.0.0.1:2379,[::1]:2380");
        assert_eq!(
            StoreArg::parse(&etcd.to_flag()).unwrap(),
            etcd,
            "what to_flag writes parses back"
        );
    }

    #[test]
    fn bad_values_say_what_to_write() {
        for (value, expected) in [
            ("postgres://x", "names no store"),
            ("/tmp/tessera.db", "names no store"),
            ("sqlite:", "needs a path"),
            ("etcd://", "is not HOST:PORT"),
            ("etcd://127.0.0.1", "is not HOST:PORT"),
            ("etcd://127.0.0.1:2379,", "is not HOST:PORT"),
            ("etcd://127.0.0.1:0", "is not HOST:PORT"),
            ("etcd://h:2379/path", "is not HOST:PORT"),
        ] {
            let e = StoreArg::parse(value).unwrap_err().to_string();
            assert!(e.contains(expected), "{value}: {e}");
        }
    }

    proptest::proptest! {
        /// Any list of members parses to their client URLs, in order, and spells back.
        #[test]
        fn etcd_members_round_trip(
            members in proptest::collection::vec(
                ("[a-z0-9][a-z0-9.-]{0,20}", 1u16..=65535),
                1..5,
            )
        ) {
            let spelt: Vec<String> =
                members.iter().map(|(host, port)| format!("{host}:{port}")).collect();
            let value = format!("etcd://{}", spelt.join(","));
            let parsed = StoreArg::parse(&value).unwrap();
            let urls: Vec<String> = spelt.iter().map(|m| format!("http://{m}")).collect();
            proptest::prop_assert_eq!(&parsed, &StoreArg::Etcd(urls));
            proptest::prop_assert_eq!(parsed.to_flag(), value);
        }
    }
}
