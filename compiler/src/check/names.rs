//! Unique names per kind; a `Workload`'s name is unique within its tenant, as workload names
//! are per tenant everywhere (see `WorkloadKey`).

use std::collections::BTreeMap;

use super::{Repo, Sink};
use crate::diagnostic::{Code, Diagnostic};
use crate::model::{Document, Kind};

pub(crate) fn check(repo: &Repo, sink: &mut Sink) {
    // The scope a name is unique in: the kind, and for a workload its tenant too.
    let mut first: BTreeMap<(Kind, &str, &str), &crate::load::LoadedDocument> = BTreeMap::new();
    for d in repo.docs {
        let tenant = match &d.document {
            Document::Workload(spec) => spec.tenant.as_str(),
            _ => "",
        };
        let key = (d.kind(), tenant, d.name.as_str());
        match first.get(&key) {
            None => {
                first.insert(key, d);
            }
            Some(original) => {
                let at = original
                    .loc("/metadata/name")
                    .map(|l| l.to_string())
                    .unwrap_or_default();
                let (message, help) = if tenant.is_empty() {
                    (
                        format!(
                            "a {} named `{}` is already defined at {at}",
                            d.kind(),
                            d.name
                        ),
                        "names are unique per kind: rename one of the two, or merge them",
                    )
                } else {
                    (
                        format!(
                            "tenant `{tenant}` already has a {} named `{}` at {at}",
                            d.kind(),
                            d.name
                        ),
                        "workload names are unique per tenant: rename one of the two, or merge them",
                    )
                };
                sink.push(
                    Diagnostic::new(Code::DuplicateName, message)
                        .at(d.value_loc("/metadata/name"))
                        .field("metadata.name")
                        .help(help),
                );
            }
        }
    }
}
