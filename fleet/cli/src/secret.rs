//! Passwords read from files: a password on the command line is visible to every user of the
//! machine (`ps`, `/proc/PID/cmdline`), a file can be readable by its owner only.

use std::path::Path;

use anyhow::{Context, bail};
use tessera_fleet::access::Credentials;

/// The password on the first line of `path` (its line ending not part of it).
pub fn read_password(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the password file {}", path.display()))?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        bail!(
            "{}:1: the first line is empty; write the password there",
            path.display()
        );
    }
    Ok(line.to_string())
}

/// `user` with the password of `password_file`, where both are given.
pub fn credentials(
    user: Option<&str>,
    password_file: Option<&Path>,
) -> anyhow::Result<Option<Credentials>> {
    match (user, password_file) {
        (Some(user), Some(file)) => Ok(Some(Credentials {
            user: user.to_string(),
            password: read_password(file)?,
        })),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_the_first_line_without_its_line_ending() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret word\r\nignored\n").unwrap();
        assert_eq!(read_password(&file).unwrap(), "s3cret word");
        std::fs::write(&file, "no newline").unwrap();
        assert_eq!(read_password(&file).unwrap(), "no newline");
    }

    #[test]
    fn an_empty_or_missing_file_says_which_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "\nsecond line\n").unwrap();
        let e = read_password(&file).unwrap_err().to_string();
        assert!(e.contains("password:1:") && e.contains("empty"), "{e}");
        let missing = dir.path().join("absent");
        let e = format!("{:#}", read_password(&missing).unwrap_err());
        assert!(e.contains("cannot read the password file"), "{e}");
    }
}
