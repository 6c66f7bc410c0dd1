//! The plan: what `tessera plan` computed, in the shape `--output json` and `--out` write.
//!
//! The JSON is versioned by [`FORMAT_VERSION`]; fields keep their order, and new information
//! arrives as new fields, so a reader written for version 1 keeps working:
//!
//! ```json
//! {"format_version": 1,
//!  "mode": "git",                      // or "directory" (`--policy DIR`: no base)
//!  "valid": true,                      // the head compiled without errors, state included
//!  "changed": true,                    // the policy or the decisions differ
//!  "summary": "Plan: 1 tenant changed, 0 added, 0 removed.",
//!  "base": {"rev": "main", "commit": "…", "path": "policies", "valid": true, "empty": false,
//!           "files": 2, "documents": 9, "errors": 0, "warnings": 0},
//!  "head": {…the same…},
//!  "state": {"path": "state.yaml", "digest": "sha256:…", "snapshots": ["snapshot"]},
//!  "policy": {"tenants": [ItemChange…], "pools": […], "slo_classes": […], "tiers": […],
//!             "workloads": […]},        // null when not computed (no base, or an invalid side)
//!  "counts": {"tenants": {"added": 0, "removed": 0, "renamed": 0, "moved": 0, "changed": 1},
//!             "pools": {…}, "slo_classes": {…}, "tiers": {…}, "workloads": {…}},  // or null
//!  "decisions": {"computed": true,     // the state solved under both revisions
//!                "diff": {"workloads": [{"name", "tenant", "change": "preempted", "before": Fate,
//!                                        "after": Fate}],
//!                         "geometry": [{"node", "gpu", "pool", "before", "after", "destroy",
//!                                       "drain"}],
//!                         "usage": [{"tenant", "pool", "guaranteed": [b, a], "borrowed": [b, a]}],
//!                         "pools": [{"pool", "allocation": [b, a], "stranded": [b, a],
//!                                    "free_nodes": [b, a]}]}},
//!              // or {"computed": false, "reason": "…"}
//!  "locations": [{"kind": "tenant", "name": "research", "file": "…", "line": 7}],
//!  "diagnostics": [{"code": "TSR102", …, "file": "…", "line": 5, "column": 11, …}]}
//! ```
//!
//! `base` is `null` in directory mode (`tessera plan --policy DIR --state FILE`): the plan then
//! reports the head's validity, the state's consistency with it, and what the head's decision
//! changes in the fleet as observed (admissions, preemptions, re-partitions; no usage or pool
//! "before"); `policy` is `null` (a diff against nothing would list everything as added, which
//! says nothing a reviewer can use), and `changed` says whether the decision changes anything. A Git base without any policy file (a new repository or a new
//! `--path`) is different: it is an empty policy (`"empty": true`) and everything is added.
//! `valid: false` means no plan: `policy` is `null` and `diagnostics` says why; a base that
//! does not compile cannot be diffed either, and a valid head over it counts as a change.
//! The head's `files` and `documents` include the state file.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tessera_compiler::{Compilation, CompiledPolicy, Diagnostic, SourceFile};

use tessera_compiler::model::ClusterStateSpec;
use tessera_solver::SolveOptions;

use crate::decision_diff::{DecisionDiff, decision_diff};
use crate::policy_diff::{ItemChange, PolicyDiff, policy_diff};

/// The version of the plan JSON; bumped only for a change an old reader would misread.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub format_version: u32,
    pub mode: Mode,
    pub valid: bool,
    pub changed: bool,
    pub summary: String,
    pub base: Option<Revision>,
    pub head: Revision,
    pub state: StateRef,
    pub policy: Option<PolicyDiff>,
    /// `None` when `policy` is.
    pub counts: Option<GroupCounts>,
    pub decisions: Decisions,
    pub locations: Vec<ItemLocation>,
    pub diagnostics: Vec<PlanDiagnostic>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Two Git revisions.
    Git,
    /// One directory (`--policy DIR`): validity and state consistency, no diff.
    Directory,
}

/// Where one side's policy came from, and how it compiled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revision {
    /// As given on the command line (`origin/main`); `None` for a directory.
    pub rev: Option<String>,
    /// The commit's full id; `None` for a directory.
    pub commit: Option<String>,
    /// The policy directory: `--path` inside the repository, or `--policy`.
    pub path: Option<String>,
    pub valid: bool,
    /// No policy file at all at this revision (a new repository, a new `--path`): the diff
    /// treats it as an empty policy, so everything at the other side is added.
    pub empty: bool,
    pub files: usize,
    pub documents: usize,
    pub errors: usize,
    pub warnings: usize,
}

/// Where a side came from, before compiling.
#[derive(Debug, Clone, Default)]
pub struct RevisionInfo {
    pub rev: Option<String>,
    pub commit: Option<String>,
    pub path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRef {
    pub path: String,
    /// `sha256:` and the hex digest of the file's bytes.
    pub digest: String,
    /// The names of the `ClusterState` documents checked against the head policy.
    pub snapshots: Vec<String>,
    /// The head tree's own `ClusterState` documents, which the state file replaced: the
    /// state file is the fleet as observed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<ReplacedSnapshot>,
}

/// A `ClusterState` of the policy tree that the state file replaced, and where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacedSnapshot {
    pub name: String,
    pub file: String,
    pub line: u32,
}

/// [`Counts`] per group of a [`PolicyDiff`], in its order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCounts {
    pub tenants: Counts,
    pub pools: Counts,
    pub slo_classes: Counts,
    pub tiers: Counts,
    pub workloads: Counts,
}

impl GroupCounts {
    pub fn of(d: &PolicyDiff) -> GroupCounts {
        GroupCounts {
            tenants: Counts::of(&d.tenants),
            pools: Counts::of(&d.pools),
            slo_classes: Counts::of(&d.slo_classes),
            tiers: Counts::of(&d.tiers),
            workloads: Counts::of(&d.workloads),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub added: usize,
    pub removed: usize,
    pub renamed: usize,
    pub moved: usize,
    pub changed: usize,
}

impl Counts {
    pub fn of(changes: &[ItemChange]) -> Counts {
        let mut c = Counts::default();
        for change in changes {
            match change {
                ItemChange::Added { .. } => c.added += 1,
                ItemChange::Removed { .. } => c.removed += 1,
                ItemChange::Renamed { .. } => c.renamed += 1,
                ItemChange::Moved { .. } => c.moved += 1,
                ItemChange::Changed { .. } => c.changed += 1,
            }
        }
        c
    }

    /// Renamed, moved and changed items: what exists at both sides and differs.
    pub fn modified(&self) -> usize {
        self.renamed + self.moved + self.changed
    }

    pub fn total(&self) -> usize {
        self.added + self.removed + self.modified()
    }
}

/// The decision diff: the solver's decisions for the state under each revision, compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decisions {
    /// Whether both decisions were made; when not, `reason` says why.
    pub computed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<DecisionDiff>,
}

impl Decisions {
    fn not(reason: impl Into<String>) -> Decisions {
        Decisions {
            computed: false,
            reason: Some(reason.into()),
            diff: None,
        }
    }
}

/// Solves the snapshot under both policies and compares the decisions.
fn decide(
    base: Option<&CompiledPolicy>,
    head: &CompiledPolicy,
    state: Option<&ClusterStateSpec>,
) -> Decisions {
    let Some(state) = state else {
        return Decisions::not("the state file holds no ClusterState");
    };
    let options = SolveOptions::default();
    let Some(base) = base else {
        // A directory alone: what the head would change in the fleet as observed.
        return match tessera_solver::solve(head, state, &options) {
            Ok(d) => Decisions {
                computed: true,
                reason: None,
                diff: Some(crate::decision_diff::against_observed(&d)),
            },
            Err(e) => Decisions::not(format!("the state cannot be solved: {e}")),
        };
    };
    let before = match tessera_solver::solve(base, state, &options) {
        Ok(d) => d,
        Err(e) => return Decisions::not(format!("the state cannot be solved under the base: {e}")),
    };
    let after = match tessera_solver::solve(head, state, &options) {
        Ok(d) => d,
        Err(e) => return Decisions::not(format!("the state cannot be solved under the head: {e}")),
    };
    Decisions {
        computed: true,
        reason: None,
        diff: Some(decision_diff(&before, &after)),
    }
}

/// The head file and line of a changed item's document, for annotations and links.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemLocation {
    /// `tenant`, `pool`, `slo_class`, `tier` or `workload`: the group in `policy`.
    pub kind: String,
    pub name: String,
    pub file: String,
    pub line: u32,
}

/// A head diagnostic, as `tessera validate --output json` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanDiagnostic {
    pub code: String,
    pub name: String,
    pub severity: String,
    pub message: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub column: Option<u32>,
    pub field: Option<String>,
    pub help: Option<String>,
}

impl From<&Diagnostic> for PlanDiagnostic {
    fn from(d: &Diagnostic) -> Self {
        PlanDiagnostic {
            code: d.code.as_str().to_owned(),
            name: d.code.name().to_owned(),
            severity: d.severity.as_str().to_owned(),
            message: d.message.clone(),
            file: d.location.as_ref().map(|l| l.file.clone()),
            line: d.location.as_ref().map(|l| l.line),
            column: d.location.as_ref().map(|l| l.column),
            field: d.field.clone(),
            help: d.help.clone(),
        }
    }
}

/// `sha256:<hex>` of a file's bytes: what a saved plan pins the state to.
pub fn state_digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in hash {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// One side of the plan as compiled.
pub struct Side<'a> {
    pub info: RevisionInfo,
    /// `None`: no policy file at all at this revision (see [`Revision::empty`]).
    pub compilation: Option<&'a Compilation>,
}

/// What to plan: the base (absent with `--policy DIR`), the head compiled together with the
/// state file, and the head's sources (to locate changed documents).
pub struct PlanInput<'a> {
    pub base: Option<Side<'a>>,
    pub head: Side<'a>,
    pub head_sources: &'a [SourceFile],
    pub state_path: String,
    pub state_digest: String,
    /// The head tree's `ClusterState` documents that the state file replaced.
    pub replaced_states: Vec<ReplacedSnapshot>,
}

/// Builds the plan. Pure and deterministic: the same input gives the same plan.
pub fn plan(input: PlanInput<'_>) -> Plan {
    let head = revision(&input.head);
    let head_policy = input.head.compilation.and_then(|c| c.policy.as_ref());
    let valid = head.valid && head_policy.is_some();
    let mode = if input.base.is_some() {
        Mode::Git
    } else {
        Mode::Directory
    };
    let base = input.base.as_ref().map(revision);

    let empty = empty_policy();
    let base_policy = input.base.as_ref().and_then(|b| match b.compilation {
        None => Some(&empty),
        Some(c) => c.policy.as_ref(),
    });
    let policy = match (valid, head_policy, base_policy) {
        (true, Some(h), Some(b)) => Some(policy_diff(b, h)),
        _ => None,
    };
    let decisions = match head_policy {
        Some(h) if valid => decide(
            base_policy,
            h,
            input
                .head
                .compilation
                .and_then(|c| c.states.first().map(|(_, s)| s)),
        ),
        _ => Decisions::not("the head is invalid"),
    };
    let fleet_changes = decisions.diff.as_ref().is_some_and(|d| !d.is_empty());
    let changed = match (&policy, &base) {
        (Some(d), _) => !d.is_empty() || fleet_changes,
        // A valid head over an invalid base repairs it: that is a change.
        (None, Some(b)) => valid && !b.valid,
        (None, None) => fleet_changes,
    };
    let counts = policy.as_ref().map(GroupCounts::of);
    let locations = match &policy {
        Some(d) => locate(d, input.head_sources),
        None => Vec::new(),
    };
    let snapshots = input
        .head
        .compilation
        .map(|c| c.states.iter().map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    let diagnostics = input
        .head
        .compilation
        .map(|c| c.diagnostics.iter().map(PlanDiagnostic::from).collect())
        .unwrap_or_default();
    let mut plan = Plan {
        format_version: FORMAT_VERSION,
        mode,
        valid,
        changed,
        summary: String::new(),
        base,
        head,
        state: StateRef {
            path: input.state_path,
            digest: input.state_digest,
            snapshots,
            replaces: input.replaced_states,
        },
        policy,
        counts,
        decisions,
        locations,
        diagnostics,
    };
    plan.summary = summary_line(&plan);
    plan
}

fn revision(side: &Side<'_>) -> Revision {
    let (valid, files, documents, errors, warnings) = match side.compilation {
        None => (true, 0, 0, 0, 0),
        Some(c) => (
            c.errors() == 0 && c.policy.is_some(),
            c.files,
            c.documents,
            c.errors(),
            c.warnings(),
        ),
    };
    Revision {
        rev: side.info.rev.clone(),
        commit: side.info.commit.clone(),
        path: side.info.path.clone(),
        valid,
        empty: side.compilation.is_none(),
        files,
        documents,
        errors,
        warnings,
    }
}

fn empty_policy() -> CompiledPolicy {
    CompiledPolicy {
        format_version: tessera_compiler::compiled::FORMAT_VERSION,
        api_version: String::new(),
        gpu_models: Vec::new(),
        pools: Vec::new(),
        tiers: Vec::new(),
        slo_classes: Vec::new(),
        tenants: Vec::new(),
        workloads: Vec::new(),
    }
}

/// One group of a [`PolicyDiff`]'s changes, with the words to show it.
pub struct Group<'a> {
    /// The key in `policy` and `counts`.
    pub key: &'static str,
    /// The item's kind in [`ItemLocation::kind`].
    pub item: &'static str,
    pub one: &'static str,
    pub many: &'static str,
    pub title: &'static str,
    /// The document kind that defines the item.
    pub kind: tessera_compiler::model::Kind,
    pub changes: &'a [ItemChange],
}

/// The groups in display order.
pub fn groups(d: &PolicyDiff) -> [Group<'_>; 5] {
    use tessera_compiler::model::Kind;
    let g = |key, item, one, many, title, kind, changes| Group {
        key,
        item,
        one,
        many,
        title,
        kind,
        changes,
    };
    [
        g(
            "tenants",
            "tenant",
            "tenant",
            "tenants",
            "Tenants",
            Kind::Tenant,
            &d.tenants,
        ),
        g(
            "pools",
            "pool",
            "pool",
            "pools",
            "Pools",
            Kind::Pool,
            &d.pools,
        ),
        g(
            "slo_classes",
            "slo_class",
            "SLO class",
            "SLO classes",
            "SLO classes",
            Kind::SloClass,
            &d.slo_classes,
        ),
        g(
            "tiers",
            "tier",
            "tier",
            "tiers",
            "Priority tiers",
            Kind::PriorityTiers,
            &d.tiers,
        ),
        g(
            "workloads",
            "workload",
            "workload",
            "workloads",
            "Workloads",
            Kind::Workload,
            &d.workloads,
        ),
    ]
}

/// Terraform's one line: `Plan: 1 tenant changed, 1 added, 0 removed; 1 pool changed, 0
/// added, 0 removed.` Tenants are always counted; other groups when they changed.
fn summary_line(plan: &Plan) -> String {
    if !plan.valid {
        return format!(
            "No plan: the head has {}.",
            plural(plan.head.errors.max(1), "error")
        );
    }
    let Some(d) = &plan.policy else {
        return match &plan.base {
            None => match &plan.decisions.diff {
                Some(d) => {
                    let count = |c: crate::decision_diff::Change| {
                        d.workloads.iter().filter(|w| w.change == c).count()
                    };
                    format!(
                        "Policy valid and consistent with the state; against the fleet as observed it would admit {}, preempt {} and re-partition {}.",
                        plural(count(crate::decision_diff::Change::Admitted), "workload"),
                        plural(count(crate::decision_diff::Change::Preempted), "workload"),
                        plural(d.geometry.len(), "GPU")
                    )
                }
                None => "Policy valid and consistent with the state; no base to compare against."
                    .to_owned(),
            },
            Some(b) => format!(
                "Plan: the base has {} and cannot be compared; the head repairs it.",
                plural(b.errors.max(1), "error")
            ),
        };
    };
    if d.is_empty() {
        return "No changes. The policy at the head is the same as at the base.".to_owned();
    }
    let mut parts = Vec::new();
    for g in groups(d) {
        let c = Counts::of(g.changes);
        if g.key != "tenants" && c.total() == 0 {
            continue;
        }
        let noun = if c.modified() == 1 { g.one } else { g.many };
        parts.push(format!(
            "{} {noun} changed, {} added, {} removed",
            c.modified(),
            c.added,
            c.removed
        ));
    }
    format!("Plan: {}.", parts.join("; "))
}

pub(crate) fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// The head file and line of every changed item that still exists at the head: the line of its
/// document's `metadata.name` (a tier's: its `PriorityTiers` document).
fn locate(d: &PolicyDiff, sources: &[SourceFile]) -> Vec<ItemLocation> {
    use tessera_compiler::model::Kind;
    let mut found: BTreeMap<(Kind, String), (String, u32)> = BTreeMap::new();
    for file in sources {
        let Ok(docs) = tessera_compiler::yaml::parse(&file.path, &file.text) else {
            continue;
        };
        for doc in docs {
            let Ok(loaded) = tessera_compiler::load::load(&file.path, doc) else {
                continue;
            };
            if let Some(loc) = loaded.loc("/metadata/name") {
                // A workload's changes name it by key, `tenant/name` (see `policy_diff`).
                let name = match &loaded.document {
                    tessera_compiler::model::Document::Workload(spec) => {
                        tessera_compiler::WorkloadKey::new(&spec.tenant, &loaded.name).to_string()
                    }
                    _ => loaded.name.clone(),
                };
                found
                    .entry((loaded.kind(), name))
                    .or_insert((loc.file, loc.line));
            }
        }
    }
    // Tiers are entries of the one `PriorityTiers` document.
    let tiers_doc = found
        .iter()
        .find(|((kind, _), _)| *kind == Kind::PriorityTiers)
        .map(|(_, v)| v.clone());
    let mut out = Vec::new();
    for g in groups(d) {
        for change in g.changes {
            let name = match change {
                ItemChange::Removed { .. } => continue,
                ItemChange::Added { name }
                | ItemChange::Moved { name, .. }
                | ItemChange::Changed { name, .. } => name,
                ItemChange::Renamed { to, .. } => to,
            };
            let at = if g.kind == Kind::PriorityTiers {
                tiers_doc.clone()
            } else {
                found.get(&(g.kind, name.clone())).cloned()
            };
            if let Some((file, line)) = at {
                out.push(ItemLocation {
                    kind: g.item.to_owned(),
                    name: name.clone(),
                    file,
                    line,
                });
            }
        }
    }
    out
}

/// A plan read back from `--out PLAN.json`, for a later `apply` to check before acting.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedPlan {
    pub plan: Plan,
}

/// Why a saved plan cannot be read.
#[derive(Debug)]
pub enum LoadError {
    Json(serde_json::Error),
    /// Written by a tessera whose plan format this one does not read.
    Version {
        found: u64,
        supported: u32,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Json(e) => write!(f, "not a tessera plan: {e}"),
            LoadError::Version { found, supported } => write!(
                f,
                "plan format_version {found} is not supported (this tessera reads {supported})"
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// Why a saved plan no longer describes what would be applied (Terraform's "stale plan").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    /// The plan was not made for a valid head: there is nothing to apply.
    Invalid,
    /// The plan was made from a directory, not a commit, so it cannot be pinned.
    NoCommit,
    /// The policy moved: the head is another commit now.
    PolicyMoved { planned: String, current: String },
    /// The cluster state moved: the snapshot's digest differs.
    StateMoved { planned: String, current: String },
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stale::Invalid => write!(f, "stale plan: it was made for an invalid head"),
            Stale::NoCommit => write!(
                f,
                "stale plan: it was made from a directory, not a Git commit, and cannot be pinned"
            ),
            Stale::PolicyMoved { planned, current } => write!(
                f,
                "stale plan: the policy moved (planned at commit {planned}, now {current}); plan again"
            ),
            Stale::StateMoved { planned, current } => write!(
                f,
                "stale plan: the cluster state moved (planned against {planned}, now {current}); plan again"
            ),
        }
    }
}

impl std::error::Error for Stale {}

impl Plan {
    /// The JSON `--output json` prints and `--out` saves, with a final newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("plans serialize");
        s.push('\n');
        s
    }
}

impl SavedPlan {
    pub fn from_json(text: &str) -> Result<SavedPlan, LoadError> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(LoadError::Json)?;
        let found = value
            .get("format_version")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        if found != u64::from(FORMAT_VERSION) {
            return Err(LoadError::Version {
                found,
                supported: FORMAT_VERSION,
            });
        }
        let plan = serde_json::from_value(value).map_err(LoadError::Json)?;
        Ok(SavedPlan { plan })
    }

    /// Refuses the plan unless it was made for this head commit and this state digest
    /// (`sha256:…`, as [`state_digest`] computes it).
    pub fn check_current(&self, head_commit: &str, state_digest: &str) -> Result<(), Stale> {
        if !self.plan.valid {
            return Err(Stale::Invalid);
        }
        let Some(planned) = &self.plan.head.commit else {
            return Err(Stale::NoCommit);
        };
        if planned != head_commit {
            return Err(Stale::PolicyMoved {
                planned: planned.clone(),
                current: head_commit.to_owned(),
            });
        }
        if self.plan.state.digest != state_digest {
            return Err(Stale::StateMoved {
                planned: self.plan.state.digest.clone(),
                current: state_digest.to_owned(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_compiler::compile;

    const FLEET: &str = "apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {name: tiers}
spec: {tiers: [{name: batch, value: 100}]}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: train}
spec:
  gpuModel: H100-SXM5-80GB
  sharing: exclusive
  capacity: {nodes: 8, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: org}
spec: {guarantee: {train: 16}}
";

    fn sources(extra: &str) -> Vec<SourceFile> {
        vec![
            SourceFile::new("fleet.yaml", FLEET),
            SourceFile::new("more.yaml", extra),
        ]
    }

    fn tenant(name: &str, guarantee: u32) -> String {
        format!(
            "apiVersion: tessera/v1alpha1\nkind: Tenant\nmetadata: {{name: {name}}}\nspec: {{parent: org, guarantee: {{train: {guarantee}}}}}\n---\n"
        )
    }

    fn git_plan(base: &[SourceFile], head: &[SourceFile]) -> Plan {
        let (b, h) = (compile(base), compile(head));
        plan(PlanInput {
            base: Some(Side {
                info: RevisionInfo {
                    rev: Some("main".into()),
                    commit: Some("b".repeat(40)),
                    path: None,
                },
                compilation: Some(&b),
            }),
            head: Side {
                info: RevisionInfo {
                    rev: Some("pr".into()),
                    commit: Some("a".repeat(40)),
                    path: None,
                },
                compilation: Some(&h),
            },
            head_sources: head,
            state_path: "state.yaml".into(),
            state_digest: state_digest(b"state"),
            replaced_states: Vec::new(),
        })
    }

    #[test]
    fn the_digest_is_sha256_of_the_bytes() {
        assert_eq!(
            state_digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn a_plan_counts_locates_and_round_trips() {
        let p = git_plan(
            &sources(&tenant("a", 4)),
            &sources(&(tenant("a", 8) + &tenant("b", 2))),
        );
        assert!(p.valid && p.changed);
        assert_eq!(p.summary, "Plan: 1 tenant changed, 1 added, 0 removed.");
        let c = p.counts.unwrap().tenants;
        assert_eq!((c.added, c.changed, c.total()), (1, 1, 2));
        assert_eq!(
            p.locations
                .iter()
                .map(|l| (l.name.as_str(), l.file.as_str(), l.line))
                .collect::<Vec<_>>(),
            vec![("a", "more.yaml", 3), ("b", "more.yaml", 8)]
        );
        let saved = SavedPlan::from_json(&p.to_json()).unwrap();
        assert_eq!(saved.plan, p);
    }

    #[test]
    fn no_change_and_an_invalid_head() {
        let same = git_plan(&sources(&tenant("a", 4)), &sources(&tenant("a", 4)));
        assert!(same.valid && !same.changed);
        let broken = git_plan(&sources(&tenant("a", 4)), &sources(&tenant("a", 400)));
        assert!(!broken.valid && !broken.changed);
        assert!(broken.policy.is_none() && broken.counts.is_none());
        assert!(!broken.diagnostics.is_empty());
        assert!(broken.summary.starts_with("No plan: the head has"));
    }

    #[test]
    fn a_stale_plan_is_refused() {
        let p = git_plan(&sources(&tenant("a", 4)), &sources(&tenant("a", 8)));
        let saved = SavedPlan { plan: p.clone() };
        let head = "a".repeat(40);
        let digest = state_digest(b"state");
        assert_eq!(saved.check_current(&head, &digest), Ok(()));
        assert_eq!(
            saved.check_current(&"c".repeat(40), &digest),
            Err(Stale::PolicyMoved {
                planned: head.clone(),
                current: "c".repeat(40)
            })
        );
        assert!(matches!(
            saved.check_current(&head, &state_digest(b"moved")),
            Err(Stale::StateMoved { .. })
        ));

        let mut from_dir = p.clone();
        from_dir.head.commit = None;
        let from_dir = SavedPlan { plan: from_dir };
        assert_eq!(from_dir.check_current(&head, &digest), Err(Stale::NoCommit));
        let mut invalid = p;
        invalid.valid = false;
        let invalid = SavedPlan { plan: invalid };
        assert_eq!(invalid.check_current(&head, &digest), Err(Stale::Invalid));
    }

    #[test]
    fn another_format_version_is_not_read() {
        let p = git_plan(&sources(&tenant("a", 4)), &sources(&tenant("a", 8)));
        let text = p
            .to_json()
            .replace("\"format_version\": 1", "\"format_version\": 2");
        assert!(matches!(
            SavedPlan::from_json(&text),
            Err(LoadError::Version { found: 2, .. })
        ));
        assert!(matches!(
            SavedPlan::from_json("{}"),
            Err(LoadError::Version { found: 0, .. })
        ));
        assert!(matches!(
            SavedPlan::from_json("not json"),
            Err(LoadError::Json(_))
        ));
    }

    #[test]
    fn github_shows_at_most_ten_annotations() {
        let many: String = (0..12).map(|i| tenant(&format!("t{i:02}"), 1)).collect();
        let p = git_plan(&sources(""), &sources(&many));
        let text = crate::render::github(&p);
        let annotations = text.lines().filter(|l| l.starts_with("::")).count();
        assert_eq!(annotations, 10, "{text}");
        // The warnings (no SLO class fits the pool) come first, then twelve notices.
        assert!(text.starts_with("::warning "), "{text}");
        let more = p.diagnostics.len() + 12 - 10;
        assert!(
            text.contains(&format!("tessera plan: {more} more not annotated")),
            "{text}"
        );
    }
}
