//! The tessera policy compiler: from a repository of YAML documents to one resolved
//! [`CompiledPolicy`], with every problem reported at `file:line:col`.
//!
//! The pipeline is parse ([`yaml`]) → envelope and schema ([`load`], [`schema`]) → meaning
//! (`check`) → [`CompiledPolicy`]. Reading the files is `tessera-source`'s (re-exported as
//! [`source`]); everything here is pure and deterministic, and every stage reports all it finds
//! rather than stopping at the first problem.

mod check;
pub mod compiled;
pub mod diagnostic;
pub mod key;
pub mod load;
pub mod model;
pub mod schema;
pub mod units;
pub mod yaml;

pub use tessera_mig as mig;
/// Reading a policy tree from disk (and, in `tessera-source` with its `git` feature, from a Git
/// revision).
pub use tessera_source as source;

pub use compiled::CompiledPolicy;
pub use diagnostic::{Code, Diagnostic, Location, Severity};
pub use key::WorkloadKey;
pub use source::{Loaded, Refusal, SourceFile};

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

/// The most documents a revision may hold, all files together: beyond it the rest are not
/// compiled, so that the time a revision takes stays bounded.
pub const MAX_DOCUMENTS: usize = 50_000;

/// Compiles what a reader of `tessera-source` found, reporting what it refused.
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
        read.broken.extend(snapshot.broken);
        read.diagnostics.extend(snapshot.diagnostics);
        read.files += snapshot.files;
        read.documents += snapshot.documents;
    }
    (finish(read), replaced)
}

/// Documents read and loaded from files, before the semantic checks.
struct Read {
    docs: Vec<LoadedDocument>,
    /// The kind and name of each document that failed to load, still defined for lookups.
    broken: Vec<(model::Kind, String)>,
    diagnostics: Vec<Diagnostic>,
    files: usize,
    documents: usize,
}

fn read_documents(loaded: Vec<Loaded>) -> Read {
    let mut diagnostics = Vec::new();
    let mut docs: Vec<LoadedDocument> = Vec::new();
    // The kind and name of each document that failed to load, still defined for lookups.
    let mut broken: Vec<(model::Kind, String)> = Vec::new();
    let files = loaded.len();
    let mut documents = 0;
    // Files handed over in memory are held to the readers' cap on the whole tree too.
    let mut tree_bytes: u64 = 0;
    for item in loaded {
        let file = match item {
            Loaded::File(f) => f,
            Loaded::Refused { path, refusal } => {
                diagnostics.push(refusal_diagnostic(path, refusal));
                continue;
            }
        };
        tree_bytes += file.text.len() as u64;
        if tree_bytes > source::MAX_TREE_BYTES {
            diagnostics.push(refusal_diagnostic(
                file.path,
                Refusal::TreeTooLarge {
                    limit: source::MAX_TREE_BYTES,
                },
            ));
            break;
        }
        match yaml::parse(&file.path, &file.text) {
            Err(d) => diagnostics.push(d),
            Ok(parsed) => {
                if documents + parsed.len() > MAX_DOCUMENTS {
                    diagnostics.push(too_many_documents(&file.path));
                    break;
                }
                for doc in parsed {
                    documents += 1;
                    let declared = load::declared(&doc);
                    match load::load(&file.path, doc) {
                        Ok(d) => docs.push(d),
                        Err(ds) => {
                            diagnostics.extend(ds);
                            broken.extend(declared);
                        }
                    }
                }
            }
        }
    }
    Read {
        docs,
        broken,
        diagnostics,
        files,
        documents,
    }
}

fn finish(read: Read) -> Compilation {
    let Read {
        docs,
        broken,
        mut diagnostics,
        files,
        documents,
    } = read;
    let loading_failed = diagnostics.iter().any(Diagnostic::is_error);
    let (policy, checks) = check::check(&docs, &broken);
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

fn at_start(path: String) -> Option<Location> {
    Some(Location {
        file: path,
        line: 1,
        column: 1,
    })
}

/// What a reader refused, as a diagnostic at the file.
pub fn refusal_diagnostic(path: String, refusal: Refusal) -> Diagnostic {
    match refusal {
        Refusal::TooLarge { bytes, limit } => Diagnostic::new(
            Code::InputTooLarge,
            format!("{path} is {bytes} bytes, more than the {limit} a policy file may have"),
        )
        .at(at_start(path))
        .help("split it into several files"),
        Refusal::NotUtf8 => Diagnostic::new(Code::YamlSyntax, "the file is not UTF-8 text")
            .at(at_start(path))
            .help("save it as UTF-8"),
        Refusal::Symlink => Diagnostic::new(
            Code::NotARegularFile,
            format!("{path} is a symbolic link; policy files are read only from regular files, never through links"),
        )
        .at(at_start(path))
        .help("replace the link with the file itself, or rename it so that it does not end in .yaml or .yml"),
        Refusal::NotRegular { kind } => Diagnostic::new(
            Code::NotARegularFile,
            format!("{path} is a {kind}, not a regular file; it was not read"),
        )
        .at(at_start(path))
        .help("policy files must be regular files; remove it or rename it so that it does not end in .yaml or .yml"),
        Refusal::TreeTooLarge { limit } => Diagnostic::new(
            Code::InputTooLarge,
            format!("the policy files add up to more than {limit} bytes; {path} and the files after it were not read"),
        )
        .at(at_start(path))
        .help("a policy tree this large is a mistake: point tessera at the policy's own directory, or remove generated files"),
        Refusal::TooManyFiles { limit } => Diagnostic::new(
            Code::InputTooLarge,
            format!("the policy tree holds more than {limit} files; {path} and the files after it were not read"),
        )
        .at(at_start(path))
        .help("point tessera at the policy's own directory, or merge small files"),
    }
}

fn too_many_documents(path: &str) -> Diagnostic {
    Diagnostic::new(
        Code::InputTooLarge,
        format!(
            "the policy holds more than {MAX_DOCUMENTS} documents; those from {path} on were not compiled"
        ),
    )
    .at(at_start(path.to_owned()))
    .help("a revision may hold at most this many documents; submit workloads through the service instead of committing them")
}
