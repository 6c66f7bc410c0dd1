//! Unique names per kind.

use std::collections::BTreeMap;

use super::{Repo, Sink};
use crate::diagnostic::{Code, Diagnostic};
use crate::model::Kind;

pub(crate) fn check(repo: &Repo, sink: &mut Sink) {
    let mut first: BTreeMap<(Kind, &str), &crate::load::LoadedDocument> = BTreeMap::new();
    for d in repo.docs {
        match first.get(&(d.kind(), d.name.as_str())) {
            None => {
                first.insert((d.kind(), d.name.as_str()), d);
            }
            Some(original) => {
                let at = original
                    .loc("/metadata/name")
                    .map(|l| l.to_string())
                    .unwrap_or_default();
                sink.push(
                    Diagnostic::new(
                        Code::DuplicateName,
                        format!(
                            "a {} named `{}` is already defined at {at}",
                            d.kind(),
                            d.name
                        ),
                    )
                    .at(d.value_loc("/metadata/name"))
                    .field("metadata.name")
                    .help("names are unique per kind: rename one of the two, or merge them"),
                );
            }
        }
    }
}
