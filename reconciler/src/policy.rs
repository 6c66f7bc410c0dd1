//! Which revision of the policy the service applies.
//!
//! A revision that does not compile is never applied: the last good one stays in force, the
//! service reports itself Degraded with the new revision's diagnostics, and the next good
//! commit clears it. This is the whole of the rollback story, and it needs no rollback: nothing
//! of a bad revision is ever half-applied, because nothing of it is applied.

use std::collections::BTreeMap;

use serde::Serialize;
use tessera_compiler::model::WorkloadSpec;
use tessera_compiler::{CompiledPolicy, Diagnostic, Loaded, WorkloadKey};

/// A compiled revision in force.
#[derive(Debug, Clone)]
pub struct Applied {
    pub commit: String,
    pub policy: CompiledPolicy,
    /// Warnings the revision compiled with.
    pub warnings: Vec<String>,
}

/// A revision that failed to compile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejected {
    pub commit: String,
    /// `file:line:col: error[TSR…]: message`, one per finding.
    pub diagnostics: Vec<String>,
}

/// What offering a revision did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// The revision is the one in force already (or was already rejected).
    Unchanged,
    Applied {
        commit: String,
    },
    Rejected(Rejected),
}

#[derive(Debug, Default)]
pub struct PolicyTracker {
    applied: Option<Applied>,
    /// The newest revision seen, when it failed: cleared by the next good one.
    rejected: Option<Rejected>,
}

impl PolicyTracker {
    pub fn applied(&self) -> Option<&Applied> {
        self.applied.as_ref()
    }

    pub fn rejected(&self) -> Option<&Rejected> {
        self.rejected.as_ref()
    }

    /// The newest commit seen, good or bad.
    pub fn latest_commit(&self) -> Option<&str> {
        self.rejected
            .as_ref()
            .map(|r| r.commit.as_str())
            .or(self.applied.as_ref().map(|a| a.commit.as_str()))
    }

    /// Compiles `loaded` (the files of `commit`; `None` when the policy directory does not exist
    /// there) and, when it is good, puts it in force.
    pub fn offer(&mut self, commit: &str, loaded: Option<Vec<Loaded>>) -> Offer {
        if self.latest_commit() == Some(commit) {
            return Offer::Unchanged;
        }
        let Some(loaded) = loaded else {
            return self.reject(
                commit,
                vec!["the policy directory does not exist at this revision".to_string()],
            );
        };
        let compilation = tessera_compiler::compile_loaded(loaded);
        let (errors, warnings): (Vec<&Diagnostic>, Vec<&Diagnostic>) =
            compilation.diagnostics.iter().partition(|d| d.is_error());
        match compilation.policy {
            Some(policy) if errors.is_empty() => {
                self.applied = Some(Applied {
                    commit: commit.to_string(),
                    policy,
                    warnings: warnings.into_iter().map(render).collect(),
                });
                self.rejected = None;
                Offer::Applied {
                    commit: commit.to_string(),
                }
            }
            _ => {
                let mut lines: Vec<String> = errors.into_iter().map(render).collect();
                if lines.is_empty() {
                    lines.push("the revision holds no policy".to_string());
                }
                self.reject(commit, lines)
            }
        }
    }

    /// Refuses `commit` without compiling it (its signature is not trusted): the revision in
    /// force stays, as for one that does not compile.
    pub fn refuse(&mut self, commit: &str, reason: String) -> Offer {
        if self.latest_commit() == Some(commit) {
            return Offer::Unchanged;
        }
        self.reject(commit, vec![reason])
    }

    fn reject(&mut self, commit: &str, diagnostics: Vec<String>) -> Offer {
        let rejected = Rejected {
            commit: commit.to_string(),
            diagnostics,
        };
        self.rejected = Some(rejected.clone());
        Offer::Rejected(rejected)
    }
}

/// One diagnostic on one line, as a CI log or `tessera status` shows it.
pub fn render(d: &Diagnostic) -> String {
    let mut s = String::new();
    if let Some(loc) = &d.location {
        s.push_str(&format!("{loc}: "));
    }
    s.push_str(&format!(
        "{}[{}]: {}",
        d.severity.as_str(),
        d.code,
        d.message
    ));
    if let Some(field) = &d.field {
        s.push_str(&format!(" (field {field})"));
    }
    if let Some(help) = &d.help {
        s.push_str(&format!("; help: {help}"));
    }
    s
}

/// Per committed workload key (tenant and name), its spec under the policy in force.
pub fn committed(policy: &CompiledPolicy) -> BTreeMap<WorkloadKey, WorkloadSpec> {
    policy
        .workloads
        .iter()
        .map(|w| (WorkloadKey::new(&w.tenant, &w.name), w.spec()))
        .collect()
}
