//! From parsed YAML to typed documents: envelope checks, schema validation, deserialization.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::diagnostic::{Code, Diagnostic, Location, did_you_mean};
use crate::model::{API_VERSION, Document, Envelope, Kind};
use crate::schema::{self, dotted};
use crate::yaml::{ParsedDocument, Pos, SpanIndex};

/// A document that passed the schema, with what checks need to point back into its file.
#[derive(Debug, Clone)]
pub struct LoadedDocument {
    pub file: String,
    pub name: String,
    pub document: Document,
    pub spans: SpanIndex,
}

impl LoadedDocument {
    pub fn kind(&self) -> Kind {
        self.document.kind()
    }

    /// The location of the node at a JSON pointer (`/spec/parent`), its key when it has one.
    pub fn loc(&self, pointer: &str) -> Option<Location> {
        Some(self.location(self.spans.key_or_value(pointer)))
    }

    /// The location of the value at a JSON pointer, for "this value is wrong".
    pub fn value_loc(&self, pointer: &str) -> Option<Location> {
        Some(self.location(self.spans.value(pointer)))
    }

    fn location(&self, pos: Pos) -> Location {
        Location {
            file: self.file.clone(),
            line: pos.line,
            column: pos.column,
        }
    }
}

/// The kind and name a document declares (`kind`, `metadata.name`), read before any
/// validation, when both are there to read.
pub fn declared(parsed: &ParsedDocument) -> Option<(Kind, String)> {
    let kind = Kind::parse(parsed.value.get("kind")?.as_str()?)?;
    let name = parsed.value.get("metadata")?.get("name")?.as_str()?;
    Some((kind, name.to_owned()))
}

/// Checks the envelope, validates against the kind's schema and deserializes. Every problem is
/// reported; the document is returned only when it has none.
pub fn load(file: &str, parsed: ParsedDocument) -> Result<LoadedDocument, Vec<Diagnostic>> {
    let at = |pos: Pos| {
        Some(Location {
            file: file.to_owned(),
            line: pos.line,
            column: pos.column,
        })
    };
    let spans = &parsed.spans;
    let Value::Object(map) = &parsed.value else {
        return Err(vec![
            Diagnostic::new(
                Code::NotADocument,
                "a document must be a mapping with apiVersion, kind, metadata and spec",
            )
            .at(at(spans.value("")))
            .help(format!(
                "start the document with `apiVersion: {API_VERSION}` and `kind: ...`"
            )),
        ]);
    };
    let mut envelope_errors = Vec::new();
    match map.get("apiVersion") {
        None => envelope_errors.push(
            Diagnostic::new(Code::MissingField, "missing required field `apiVersion`")
                .at(at(spans.value("")))
                .field("apiVersion")
                .help(format!("add `apiVersion: {API_VERSION}`")),
        ),
        Some(Value::String(v)) if v == API_VERSION => {}
        Some(other) => envelope_errors.push(
            Diagnostic::new(
                Code::UnknownApiVersion,
                format!("unknown apiVersion {other}"),
            )
            .at(at(spans.value("/apiVersion")))
            .field("apiVersion")
            .help(format!("this compiler reads `{API_VERSION}`")),
        ),
    }
    let kind = match map.get("kind") {
        None => {
            envelope_errors.push(
                Diagnostic::new(Code::MissingField, "missing required field `kind`")
                    .at(at(spans.value("")))
                    .field("kind")
                    .help(kinds_help()),
            );
            None
        }
        Some(Value::String(k)) => match Kind::parse(k) {
            Some(kind) => Some(kind),
            None => {
                let mut help = kinds_help();
                if let Some(s) = did_you_mean(k, Kind::ALL.iter().map(|k| k.as_str())) {
                    help = format!("did you mean `{s}`? {help}");
                }
                envelope_errors.push(
                    Diagnostic::new(Code::UnknownKind, format!("unknown kind `{k}`"))
                        .at(at(spans.value("/kind")))
                        .field("kind")
                        .help(help),
                );
                None
            }
        },
        Some(other) => {
            envelope_errors.push(
                Diagnostic::new(
                    Code::UnknownKind,
                    format!("kind must be a string, found {other}"),
                )
                .at(at(spans.value("/kind")))
                .field("kind")
                .help(kinds_help()),
            );
            None
        }
    };
    let Some(kind) = kind else {
        return Err(envelope_errors);
    };
    let mut errors = envelope_errors;
    errors.extend(schema::validate(file, &parsed, kind));
    if !errors.is_empty() {
        return Err(errors);
    }
    let typed = match kind {
        Kind::GpuModel => typed(&parsed, file, Document::GpuModel),
        Kind::MigLayout => typed(&parsed, file, Document::MigLayout),
        Kind::Pool => typed(&parsed, file, Document::Pool),
        Kind::PriorityTiers => typed(&parsed, file, Document::PriorityTiers),
        Kind::SloClass => typed(&parsed, file, Document::SloClass),
        Kind::Tenant => typed(&parsed, file, Document::Tenant),
        Kind::Workload => typed(&parsed, file, Document::Workload),
        Kind::ClusterState => typed(&parsed, file, |s| Document::ClusterState(Box::new(s))),
    };
    let (name, document) = typed.map_err(|d| vec![d])?;
    Ok(LoadedDocument {
        file: file.to_owned(),
        name,
        document,
        spans: parsed.spans,
    })
}

fn kinds_help() -> String {
    let kinds: Vec<_> = Kind::ALL.iter().map(|k| k.as_str()).collect();
    format!("the kinds are: {}", kinds.join(", "))
}

/// Deserializes a schema-valid document. What the schema cannot say (a GPU amount finer than a
/// thousandth, say) fails here, still at its exact place.
fn typed<S: DeserializeOwned>(
    parsed: &ParsedDocument,
    file: &str,
    wrap: impl FnOnce(S) -> Document,
) -> Result<(String, Document), Diagnostic> {
    // Tracking the path costs a key copy per field, and a fleet's snapshot has millions: it is
    // done only when the plain deserialization fails, to say where (the same deserializer, so
    // the same outcome).
    if let Ok(env) = Envelope::<S>::deserialize(&parsed.value) {
        return Ok((env.metadata.name, wrap(env.spec)));
    }
    match serde_path_to_error::deserialize::<_, Envelope<S>>(&parsed.value) {
        Ok(env) => Ok((env.metadata.name, wrap(env.spec))),
        Err(e) => {
            let pointer = to_pointer(e.path());
            let pos = parsed.spans.value(&pointer);
            let field = dotted(&pointer);
            Err(
                Diagnostic::new(Code::InvalidValue, format!("`{field}`: {}", e.inner()))
                    .at(Some(Location {
                        file: file.to_owned(),
                        line: pos.line,
                        column: pos.column,
                    }))
                    .field(field),
            )
        }
    }
}

fn to_pointer(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("/{index}")),
            Segment::Map { key } => out.push_str(&format!("/{}", crate::yaml::escape(key))),
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    out
}
