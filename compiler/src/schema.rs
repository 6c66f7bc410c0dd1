//! JSON Schemas generated from the document types, and validation against them with positions.

use std::sync::OnceLock;

use jsonschema::Validator;
use jsonschema::error::{TypeKind, ValidationErrorKind};
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Value, json};

use crate::diagnostic::{Code, Diagnostic, Location, did_you_mean};
use crate::model::*;
use crate::yaml::{ParsedDocument, escape};

/// Where the schemas are published; editors resolve `$id`s relative to it.
pub const SCHEMA_BASE: &str = "https://tessera.dev/schemas/v1alpha1";

/// The JSON Schema (draft 2020-12) of one kind's documents.
pub fn schema_for(kind: Kind) -> Value {
    match kind {
        Kind::GpuModel => envelope::<GpuModelSpec>(kind),
        Kind::MigLayout => envelope::<MigLayoutSpec>(kind),
        Kind::Pool => envelope::<PoolSpec>(kind),
        Kind::PriorityTiers => envelope::<PriorityTiersSpec>(kind),
        Kind::SloClass => envelope::<SloClassSpec>(kind),
        Kind::Tenant => envelope::<TenantSpec>(kind),
        Kind::Workload => envelope::<WorkloadSpec>(kind),
        Kind::ClusterState => envelope::<ClusterStateSpec>(kind),
    }
}

/// The file name a kind's schema is written to.
pub fn file_name(kind: Kind) -> String {
    format!("{}.schema.json", kind.as_str())
}

fn envelope<S: JsonSchema>(kind: Kind) -> Value {
    let generator = SchemaGenerator::new(SchemaSettings::draft2020_12());
    let mut schema = generator.into_root_schema_for::<Envelope<S>>().to_value();
    let obj = schema
        .as_object_mut()
        .expect("a struct's schema is an object");
    obj.insert(
        "$id".into(),
        json!(format!("{SCHEMA_BASE}/{}", file_name(kind))),
    );
    obj.insert("title".into(), json!(kind.as_str()));
    obj.insert(
        "description".into(),
        json!(format!(
            "A tessera `{kind}` document (apiVersion {API_VERSION}). Generated from the Rust types by `tessera schema`; do not edit."
        )),
    );
    if kind == Kind::GpuModel {
        // Models keep NVIDIA's spelling (`B300-SXM-288GB`), like the built-in ones.
        if let Some(name) = obj
            .get_mut("$defs")
            .and_then(|d| d.pointer_mut("/Metadata/properties/name"))
        {
            name["pattern"] = json!(r"^[A-Za-z0-9]([-A-Za-z0-9.]{0,61}[A-Za-z0-9])?$");
            name["description"] = json!(
                "The model's name as workloads and pools write it, e.g. `B300-SXM-288GB`: letters, digits, `-` and `.`."
            );
        }
    }
    let props = obj
        .get_mut("properties")
        .and_then(Value::as_object_mut)
        .expect("the envelope has properties");
    props.insert(
        "apiVersion".into(),
        json!({"const": API_VERSION, "description": "Always `tessera/v1alpha1`."}),
    );
    props.insert(
        "kind".into(),
        json!({"const": kind.as_str(), "description": "The kind of document."}),
    );
    schema
}

fn validators() -> &'static [(Kind, Validator)] {
    static VALIDATORS: OnceLock<Vec<(Kind, Validator)>> = OnceLock::new();
    VALIDATORS.get_or_init(|| {
        Kind::ALL
            .iter()
            .map(|&k| {
                let v = jsonschema::draft202012::new(&schema_for(k))
                    .expect("generated schemas are valid JSON Schema");
                (k, v)
            })
            .collect()
    })
}

fn schemas() -> &'static [(Kind, Value)] {
    static SCHEMAS: OnceLock<Vec<(Kind, Value)>> = OnceLock::new();
    SCHEMAS.get_or_init(|| Kind::ALL.iter().map(|&k| (k, schema_for(k))).collect())
}

/// `/spec/tiers/2/value` as people read it: `spec.tiers[2].value`.
pub fn dotted(pointer: &str) -> String {
    let mut out = String::new();
    for seg in pointer.split('/').skip(1) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&seg);
        }
    }
    out
}

/// Every schema violation of one document of `kind`, each at its line and column.
pub fn validate(file: &str, doc: &ParsedDocument, kind: Kind) -> Vec<Diagnostic> {
    let validator = &validators()
        .iter()
        .find(|(k, _)| *k == kind)
        .expect("every kind has a validator")
        .1;
    let root = &schemas()
        .iter()
        .find(|(k, _)| *k == kind)
        .expect("every kind has a schema")
        .1;
    let at = |pos: crate::yaml::Pos| {
        Some(Location {
            file: file.to_owned(),
            line: pos.line,
            column: pos.column,
        })
    };
    let mut out = Vec::new();
    let mut queue: std::collections::VecDeque<_> = validator.iter_errors(&doc.value).collect();
    while let Some(err) = queue.pop_front() {
        // An optional mapping (`fairShare`, `usage`) is `anyOf: [its schema, null]`. When the
        // value is not null, the mapping's own errors say what is wrong and where; the anyOf's
        // would only show the whole value at its first key.
        let one_real_branch = match err.kind() {
            ValidationErrorKind::AnyOf { context } if !err.instance().is_null() => {
                context.iter().filter(|b| !is_null_branch(b)).count() == 1
            }
            _ => false,
        };
        if one_real_branch {
            if let ValidationErrorKind::AnyOf { context } = err.into_parts().kind {
                let only = context.into_iter().find(|b| !is_null_branch(b));
                for e in only.into_iter().flatten().rev() {
                    queue.push_front(e);
                }
            }
            continue;
        }
        let ptr = err.instance_path().as_str().to_owned();
        let field = dotted(&ptr);
        let shown = if field.is_empty() {
            "the document".to_owned()
        } else {
            format!("`{field}`")
        };
        let d = match err.kind() {
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                let allowed = allowed_fields(root, &doc.value, &ptr);
                for key in unexpected {
                    let child = format!("{ptr}/{}", escape(key));
                    let mut help = format!("{shown} accepts: {}", allowed.join(", "));
                    if let Some(s) = did_you_mean(key, allowed.iter().map(String::as_str)) {
                        help = format!("did you mean `{s}`? {help}");
                    }
                    out.push(
                        Diagnostic::new(
                            Code::UnknownField,
                            format!("unknown field `{key}` in {shown}"),
                        )
                        .at(at(doc.spans.key_or_value(&child)))
                        .field(dotted(&child))
                        .help(help),
                    );
                }
                continue;
            }
            ValidationErrorKind::Required { property } => {
                let name = property.as_str().unwrap_or_default();
                let full = if field.is_empty() {
                    name.to_owned()
                } else {
                    format!("{field}.{name}")
                };
                let desc = describe(root, &doc.value, &format!("{ptr}/{}", escape(name)));
                Diagnostic::new(
                    Code::MissingField,
                    format!("missing required field `{full}`"),
                )
                .at(at(doc.spans.key_or_value(&ptr)))
                .field(full)
                .help(match desc {
                    Some(d) => format!("add `{name}`: {d}"),
                    None => format!("add `{name}`"),
                })
            }
            ValidationErrorKind::Type { kind } => {
                // An optional field's schema allows null, but nobody means to write null.
                let expected = match kind {
                    TypeKind::Single(t) => t.to_string(),
                    TypeKind::Multiple(ts) => ts
                        .iter()
                        .map(|t| t.to_string())
                        .filter(|t| t != "null")
                        .collect::<Vec<_>>()
                        .join(" or "),
                };
                Diagnostic::new(
                    Code::WrongType,
                    format!(
                        "{shown} must be {} {expected}, found {}",
                        article(&expected),
                        type_name(err.instance())
                    ),
                )
                .at(at(doc.spans.value(&ptr)))
                .field(field.clone())
                .help(
                    describe(root, &doc.value, &ptr)
                        .unwrap_or_else(|| format!("write {shown} as {expected}")),
                )
            }
            ValidationErrorKind::Enum { options } => {
                let choices: Vec<String> = options
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|v| v.as_str().map(str::to_owned).unwrap_or(v.to_string()))
                            .collect()
                    })
                    .unwrap_or_default();
                not_one_of(&shown, err.instance(), &choices)
                    .at(at(doc.spans.value(&ptr)))
                    .field(field.clone())
            }
            ValidationErrorKind::Constant { expected_value } => {
                if ptr == "/apiVersion" || ptr == "/kind" {
                    continue; // checked before the schema, with a better message
                }
                Diagnostic::new(
                    Code::InvalidValue,
                    format!("{shown} must be {expected_value}"),
                )
                .at(at(doc.spans.value(&ptr)))
                .field(field.clone())
            }
            ValidationErrorKind::AnyOf { .. } | ValidationErrorKind::OneOfNotValid { .. } => {
                let choices = constants(root, &doc.value, &ptr);
                if !choices.is_empty() {
                    out.push(
                        not_one_of(&shown, err.instance(), &choices)
                            .at(at(doc.spans.value(&ptr)))
                            .field(field.clone()),
                    );
                    continue;
                }
                Diagnostic::new(
                    Code::InvalidValue,
                    format!("{shown} has an invalid value {}", err.instance()),
                )
                .at(at(doc.spans.value(&ptr)))
                .field(field.clone())
                .help(describe(root, &doc.value, &ptr).unwrap_or_else(|| {
                    "see the kind's JSON Schema in schemas/ for the accepted forms".to_owned()
                }))
            }
            _ => Diagnostic::new(Code::InvalidValue, format!("{shown}: {err}"))
                .at(at(doc.spans.value(&ptr)))
                .field(field.clone())
                .help(describe(root, &doc.value, &ptr).unwrap_or_else(|| {
                    "see the kind's JSON Schema in schemas/ for the accepted values".to_owned()
                })),
        };
        out.push(d);
    }
    out
}

/// The failed `null` branch of an optional value's `anyOf`.
fn is_null_branch(branch: &[jsonschema::ValidationError<'static>]) -> bool {
    matches!(
        branch,
        [e] if matches!(
            e.kind(),
            ValidationErrorKind::Type { kind: TypeKind::Single(t) }
                if *t == jsonschema::JsonType::Null
        )
    )
}

/// A value outside an enumeration, with the closest allowed value suggested.
fn not_one_of(shown: &str, got: &Value, choices: &[String]) -> Diagnostic {
    let mut help = format!("use one of: {}", choices.join(", "));
    if let Some(s) = did_you_mean(
        got.as_str().unwrap_or_default(),
        choices.iter().map(String::as_str),
    ) {
        help = format!("did you mean `{s}`? {help}");
    }
    Diagnostic::new(
        Code::InvalidValue,
        format!("{shown} is {got}, which is not one of its values"),
    )
    .help(help)
}

fn article(word: &str) -> &'static str {
    match word.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u') => "an",
        _ => "a",
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing (null)",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// The subschema that describes the instance at `pointer`, following `$ref`s, properties,
/// items and the branch of an `anyOf` that has the property.
fn schema_at<'a>(root: &'a Value, instance: &Value, pointer: &str) -> Option<&'a Value> {
    let mut schema = resolve(root, root)?;
    let mut value = Some(instance);
    for seg in pointer.split('/').skip(1) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        schema = step(root, schema, &seg)?;
        value = value.and_then(|v| match v {
            Value::Object(m) => m.get(&seg),
            Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
            _ => None,
        });
    }
    Some(schema)
}

fn step<'a>(root: &'a Value, schema: &'a Value, seg: &str) -> Option<&'a Value> {
    let schema = resolve(root, schema)?;
    if let Some(p) = schema.get("properties").and_then(|p| p.get(seg)) {
        return resolve(root, p);
    }
    if let Some(items) = schema.get("items")
        && seg.parse::<usize>().is_ok()
    {
        return resolve(root, items);
    }
    if let Some(extra) = schema.get("additionalProperties")
        && extra.is_object()
    {
        return resolve(root, extra);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(branches) = schema.get(key).and_then(Value::as_array) {
            for b in branches {
                if let Some(found) = step(root, b, seg) {
                    return Some(found);
                }
            }
        }
    }
    None
}

fn resolve<'a>(root: &'a Value, schema: &'a Value) -> Option<&'a Value> {
    let mut s = schema;
    for _ in 0..16 {
        match s.get("$ref").and_then(Value::as_str) {
            Some(r) => s = root.pointer(r.strip_prefix('#')?)?,
            None => return Some(s),
        }
    }
    None
}

fn describe(root: &Value, instance: &Value, pointer: &str) -> Option<String> {
    let parent = pointer.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
    let last = pointer.rsplit('/').next().unwrap_or("");
    // The description may sit on the property (beside a $ref) rather than on its target.
    let on_property = schema_at(root, instance, parent).and_then(|owner| {
        owner
            .get("properties")?
            .get(last)?
            .get("description")?
            .as_str()
    });
    let on_type = schema_at(root, instance, pointer).and_then(|s| s.get("description")?.as_str());
    let text = match (on_property, on_type) {
        (Some(p), Some(t)) if p != t => format!("{p} {t}"),
        (Some(p), _) => p.to_owned(),
        (None, Some(t)) => t.to_owned(),
        (None, None) => return None,
    };
    Some(text.replace('\n', " "))
}

/// The allowed values of an enum-like field (`oneOf` of `const`s, or `enum`).
fn constants(root: &Value, instance: &Value, pointer: &str) -> Vec<String> {
    let Some(schema) = schema_at(root, instance, pointer) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        out.extend(values.iter().filter_map(Value::as_str).map(str::to_owned));
    }
    for key in ["oneOf", "anyOf"] {
        for b in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(b) = resolve(root, b) else { continue };
            if let Some(c) = b.get("const").and_then(Value::as_str) {
                out.push(c.to_owned());
            } else if let Some(values) = b.get("enum").and_then(Value::as_array) {
                out.extend(values.iter().filter_map(Value::as_str).map(str::to_owned));
            } else {
                return Vec::new(); // not enum-like
            }
        }
    }
    out
}

fn allowed_fields(root: &Value, instance: &Value, pointer: &str) -> Vec<String> {
    let Some(schema) = schema_at(root, instance, pointer) else {
        return Vec::new();
    };
    let mut keys: Vec<String> = Vec::new();
    collect_properties(root, schema, &mut keys);
    keys.sort();
    keys.dedup();
    keys
}

fn collect_properties(root: &Value, schema: &Value, out: &mut Vec<String>) {
    let Some(schema) = resolve(root, schema) else {
        return;
    };
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        out.extend(props.keys().cloned());
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(branches) = schema.get(key).and_then(Value::as_array) {
            for b in branches {
                collect_properties(root, b, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_valid_schema_with_its_kind_pinned() {
        for kind in Kind::ALL {
            let s = schema_for(kind);
            assert_eq!(s["properties"]["kind"]["const"], json!(kind.as_str()));
            assert!(jsonschema::draft202012::new(&s).is_ok());
        }
    }

    #[test]
    fn dotted_paths_read_like_yaml() {
        assert_eq!(dotted("/spec/tiers/2/value"), "spec.tiers[2].value");
        assert_eq!(
            dotted("/spec/nodeSelector/tessera~1pool"),
            "spec.nodeSelector.tessera/pool"
        );
        assert_eq!(dotted(""), "");
    }
}
