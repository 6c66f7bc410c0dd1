//! `tessera verify`: whether a commit is signed by a trusted key, decided exactly as
//! `reconcile --verify-signatures` decides it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessera_source::signature::{TrustedSigners, Verdict};

use crate::cli::TextOrJson;
use crate::output::emit;

/// Reads the trust files (each error names its file and line).
pub fn load_trust(paths: &[PathBuf]) -> anyhow::Result<TrustedSigners> {
    Ok(tessera_service_cli::load_trust(paths)?)
}

/// The verdict on `rev` in the repository at `repo`.
pub fn verdict(
    repo: &git2::Repository,
    rev: &str,
    trusted: &TrustedSigners,
) -> anyhow::Result<Verdict> {
    let signature = tessera_source::commit::signature(repo, rev)?;
    Ok(trusted.verify(&signature.as_signed()))
}

/// The verdict as JSON: `{commit, trusted, signer | refusal, message}`.
pub fn verdict_json(v: &Verdict) -> serde_json::Value {
    let mut value = serde_json::json!({
        "commit": v.commit,
        "trusted": v.is_trusted(),
        "key": v.key(),
        "message": v.to_string(),
    });
    match &v.outcome {
        Ok(signer) => value["signer"] = serde_json::json!(signer),
        Err(refusal) => value["refusal"] = serde_json::json!(refusal),
    }
    value
}

pub fn run(
    repo: &Path,
    rev: &str,
    trusted_signers: &[PathBuf],
    output: TextOrJson,
) -> anyhow::Result<ExitCode> {
    let trusted = load_trust(trusted_signers)?;
    let repo = crate::git::open(repo)?;
    let v = verdict(&repo, rev, &trusted)?;
    match output {
        TextOrJson::Human => emit(&format!(
            "{}: {v}\n",
            if v.is_trusted() { "trusted" } else { "refused" }
        ))?,
        TextOrJson::Json => emit(&(serde_json::to_string_pretty(&verdict_json(&v))? + "\n"))?,
    }
    Ok(if v.is_trusted() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
