//! Semantic checks, and the lowering to [`CompiledPolicy`] they make possible.
//!
//! Each pass reads the typed documents, reports what is wrong at its exact place, and resolves
//! what later passes need. Passes never stop at the first problem: a repository's every error
//! is reported in one run. A pass whose inputs were broken by an earlier error skips the
//! affected item rather than reporting a consequence of it twice.

mod classes;
mod models;
mod names;
mod pools;
mod state;
mod tenants;
mod workloads;

use std::collections::{BTreeMap, BTreeSet};

use crate::compiled::{CompiledPolicy, FORMAT_VERSION};
use crate::diagnostic::{Code, Diagnostic};
use crate::load::LoadedDocument;
use crate::model::{API_VERSION, Kind};

/// Documents by kind and name: the first of each name (later ones are duplicates, reported).
pub(crate) struct Repo<'a> {
    pub docs: &'a [LoadedDocument],
    by_name: BTreeMap<(Kind, &'a str), &'a LoadedDocument>,
    /// Names declared by documents that failed their schema: defined, though unusable.
    broken: BTreeSet<(Kind, &'a str)>,
}

impl<'a> Repo<'a> {
    fn new(docs: &'a [LoadedDocument], broken: &'a [(Kind, String)]) -> Self {
        let mut by_name = BTreeMap::new();
        for d in docs {
            by_name.entry((d.kind(), d.name.as_str())).or_insert(d);
        }
        let broken = broken.iter().map(|(k, n)| (*k, n.as_str())).collect();
        Repo {
            docs,
            by_name,
            broken,
        }
    }

    /// Whether a document of this kind and name exists, valid or not. A reference to a document
    /// that failed its schema is not reported as unknown: its own errors say what to fix, and
    /// one typo must not add an error at every reference.
    pub fn defined(&self, kind: Kind, name: &str) -> bool {
        self.by_name.contains_key(&(kind, name)) || self.broken.contains(&(kind, name))
    }

    /// The documents of one kind, first of each name only, in name order.
    pub fn of(&self, kind: Kind) -> impl Iterator<Item = &'a LoadedDocument> + '_ {
        self.by_name
            .range((kind, "")..)
            .take_while(move |((k, _), _)| *k == kind)
            .map(|(_, d)| *d)
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<&'a LoadedDocument> {
        self.by_name.get(&(kind, name)).copied()
    }

    pub fn names(&self, kind: Kind) -> impl Iterator<Item = &'a str> + '_ {
        self.of(kind).map(|d| d.name.as_str())
    }

    /// The `Workload` documents, first of each `(tenant, name)` only, in that order: workload
    /// names are per tenant, so [`Repo::of`] (first of each name) would drop another tenant's.
    pub fn workloads(&self) -> Vec<&'a LoadedDocument> {
        let mut first: BTreeMap<(&str, &str), &'a LoadedDocument> = BTreeMap::new();
        for d in self.docs {
            if let crate::model::Document::Workload(spec) = &d.document {
                first
                    .entry((spec.tenant.as_str(), d.name.as_str()))
                    .or_insert(d);
            }
        }
        first.into_values().collect()
    }
}

/// "unknown X `name`" at the value at `pointer`, with a did-you-mean among `candidates` when one
/// is close, else `otherwise` as help.
pub(crate) fn unknown_reference<'a>(
    code: Code,
    what: &str,
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    otherwise: &str,
    doc: &LoadedDocument,
    pointer: &str,
) -> Diagnostic {
    let help = match crate::diagnostic::did_you_mean(name, candidates) {
        Some(s) => format!("did you mean `{s}`?"),
        None => otherwise.to_owned(),
    };
    Diagnostic::new(code, format!("unknown {what} `{name}`"))
        .at(doc.value_loc(pointer))
        .field(crate::schema::dotted(pointer))
        .help(help)
}

/// Diagnostics of a pass.
#[derive(Default)]
pub(crate) struct Sink {
    pub diagnostics: Vec<Diagnostic>,
}

impl Sink {
    pub fn push(&mut self, d: Diagnostic) {
        self.diagnostics.push(d);
    }
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Runs every check over schema-valid documents; `broken` names the documents that failed their
/// schema. The policy is returned when no check found an error (warnings do not stop it).
pub fn check(
    docs: &[LoadedDocument],
    broken: &[(Kind, String)],
) -> (Option<CompiledPolicy>, Vec<Diagnostic>) {
    let repo = Repo::new(docs, broken);
    let mut sink = Sink::default();
    names::check(&repo, &mut sink);
    let models = models::resolve_models(&repo, &mut sink);
    let layouts = models::resolve_layouts(&repo, &models, &mut sink);
    let pools = pools::resolve(&repo, &models, &layouts, &mut sink);
    let (tiers, classes) = classes::resolve(&repo, &mut sink);
    let tenants = tenants::resolve(&repo, &models, &pools, &classes, &mut sink);
    let workloads = workloads::resolve(&repo, &models, &pools, &classes, &tenants, &mut sink);
    state::check(
        &workloads::Ctx::new(&repo, &models, &pools, &classes, &tenants),
        &mut sink,
    );
    models::warn_unused_layouts(&repo, &mut sink);
    classes::check_isolation(&repo, &pools, &classes, &tenants, &mut sink);

    if sink.has_errors() {
        return (None, sink.diagnostics);
    }
    let mut used_models: Vec<_> = pools
        .iter()
        .map(|p| p.gpu_model.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter_map(|m| models.get(&m).map(models::compile_model))
        .collect();
    used_models.sort_by(|a, b| a.name.cmp(&b.name));
    let policy = CompiledPolicy {
        format_version: FORMAT_VERSION,
        api_version: API_VERSION.to_owned(),
        gpu_models: used_models,
        pools,
        tiers,
        slo_classes: classes,
        tenants,
        workloads,
    };
    (Some(policy), sink.diagnostics)
}
