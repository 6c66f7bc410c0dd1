//! The tessera policy compiler: from a repository of YAML documents to one resolved
//! [`CompiledPolicy`], with every problem reported at `file:line:col`.
//!
//! The pipeline is parse ([`yaml`]) → envelope and schema ([`load`], [`schema`]) → meaning
//! (`check`) → [`CompiledPolicy`]. Only [`source`] touches the file system; everything else is
//! pure and deterministic, and every stage reports all it finds rather than stopping at the
//! first problem.

mod check;
pub mod compiled;
pub mod diagnostic;
pub mod load;
pub mod model;
pub mod schema;
pub mod source;
pub mod units;
pub mod yaml;

pub use tessera_mig as mig;

pub use compiled::CompiledPolicy;
pub use diagnostic::{Code, Diagnostic, Location, Severity};
pub use source::{Loaded, SourceFile};

use load::LoadedDocument;
use model::{ClusterStateSpec, Document};

/// The result of compiling a repository.
#[derive(Debug)]
pub struct Compilation {
    /// Present when no error was found.
    pub policy: Option<CompiledPolicy>,
    /// The `ClusterState` snapshots found among the documents, by name, checked against the
    /// policy.
    pub states: Vec<(String, ClusterStateSpec)>,
    /// Sorted by file, line and column.
    pub diagnostics: Vec<Diagnostic>,
    pub files: usize,
    pub documents: usize,
}

impl Compilation {
    pub fn errors(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count()
    }
    pub fn warnings(&self) -> usize {
        self.diagnostics.len() - self.errors()
    }
}

/// Compiles files already in memory.
pub fn compile(sources: &[SourceFile]) -> Compilation {
    compile_loaded(sources.iter().cloned().map(Loaded::File).collect())
}

/// Compiles what [`source::discover`] found, reporting files it could not use.
pub fn compile_loaded(loaded: Vec<Loaded>) -> Compilation {
    let read = read_documents(loaded);
    finish(read)
}

/// A `ClusterState` of a policy tree that the snapshot observed from the fleet replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplacedState {
    pub name: String,
    pub location: Location,
}

/// Compiles a policy tree together with the snapshot observed from the fleet (`--state FILE`).
/// The observed snapshot is the fleet as it is: it replaces every `ClusterState` document of
/// the tree, which are returned so that the caller can say so. The snapshot's own file, when
/// the tree holds it too, is read once. Without `observed`, the tree's snapshots are dropped
/// all the same: what is left is the policy alone.
pub fn compile_observed(
    tree: Vec<Loaded>,
    observed: Option<SourceFile>,
) -> (Compilation, Vec<ReplacedState>) {
    let tree: Vec<Loaded> = match &observed {
        Some(state) => tree
            .into_iter()
            .filter(|l| !matches!(l, Loaded::File(f) if f.path == state.path))
            .collect(),
        None => tree,
    };
    let mut read = read_documents(tree);
    let mut replaced = Vec::new();
    read.docs.retain(|d| {
        if d.kind() != model::Kind::ClusterState {
            return true;
        }
        replaced.extend(d.loc("/metadata/name").map(|location| ReplacedState {
            name: d.name.clone(),
            location,
        }));
        false
    });
    if let Some(state) = observed {
        let snapshot = read_documents(vec![Loaded::File(state)]);
        read.docs.extend(snapshot.docs);
        read.diagnostics.extend(snapshot.diagnostics);
        read.files += snapshot.files;
        read.documents += snapshot.documents;
    }
    (finish(read), replaced)
}

/// Documents read and loaded from files, before the semantic checks.
struct Read {
    docs: Vec<LoadedDocument>,
    diagnostics: Vec<Diagnostic>,
    files: usize,
    documents: usize,
}

fn read_documents(loaded: Vec<Loaded>) -> Read {
    let mut diagnostics = Vec::new();
    let mut docs: Vec<LoadedDocument> = Vec::new();
    let files = loaded.len();
    let mut documents = 0;
    for item in loaded {
        let file = match item {
            Loaded::File(f) => f,
            Loaded::TooLarge { path, bytes } => {
                diagnostics.push(
                    Diagnostic::new(
                        Code::InputTooLarge,
                        format!(
                            "{path} is {bytes} bytes, more than the {} a policy file may have",
                            source::MAX_FILE_BYTES
                        ),
                    )
                    .at(Some(Location {
                        file: path,
                        line: 1,
                        column: 1,
                    }))
                    .help("split it into several files"),
                );
                continue;
            }
            Loaded::NotUtf8 { path } => {
                diagnostics.push(
                    Diagnostic::new(Code::YamlSyntax, "the file is not UTF-8 text")
                        .at(Some(Location {
                            file: path,
                            line: 1,
                            column: 1,
                        }))
                        .help("save it as UTF-8"),
                );
                continue;
            }
        };
        match yaml::parse(&file.path, &file.text) {
            Err(d) => diagnostics.push(d),
            Ok(parsed) => {
                for doc in parsed {
                    documents += 1;
                    match load::load(&file.path, doc) {
                        Ok(d) => docs.push(d),
                        Err(ds) => diagnostics.extend(ds),
                    }
                }
            }
        }
    }
    Read {
        docs,
        diagnostics,
        files,
        documents,
    }
}

fn finish(read: Read) -> Compilation {
    let Read {
        docs,
        mut diagnostics,
        files,
        documents,
    } = read;
    let loading_failed = diagnostics.iter().any(Diagnostic::is_error);
    let (policy, checks) = check::check(&docs);
    diagnostics.extend(checks);
    // Files that failed to load may have held the policy; saying there is none would mislead.
    let has_policy = docs.iter().any(|d| d.kind() != model::Kind::ClusterState);
    if !has_policy && !loading_failed {
        diagnostics.push(
            Diagnostic::new(Code::EmptyRepository, "no policy document was found")
                .help("point tessera at the directory that holds the policy's *.yaml files"),
        );
    }
    diagnostic::normalize(&mut diagnostics);
    let states = docs
        .into_iter()
        .filter_map(|d| match d.document {
            Document::ClusterState(s) => Some((d.name, *s)),
            _ => None,
        })
        .collect();
    Compilation {
        // A document that failed to load may have been a tenant or a pool the others rely on:
        // the policy is only whole when every document loaded.
        policy: if loading_failed { None } else { policy },
        states,
        diagnostics,
        files,
        documents,
    }
}
