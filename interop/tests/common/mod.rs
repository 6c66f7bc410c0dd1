//! Shared by the interop tests: the examples compiled, Kueue's CRD schemas loaded strictly.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera_compiler::CompiledPolicy;

pub fn example(name: &str) -> CompiledPolicy {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/policies")
        .join(name);
    let loaded = tessera_compiler::source::discover(&[dir]).expect("the example is readable");
    let policy_only: Vec<_> = loaded
        .into_iter()
        .filter(|l| !matches!(l, tessera_compiler::Loaded::File(f) if f.path.contains("state")))
        .collect();
    let compilation = tessera_compiler::compile_loaded(policy_only);
    compilation
        .policy
        .unwrap_or_else(|| panic!("{name} compiles: {:?}", compilation.diagnostics))
}

pub fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file)
}

/// The OpenAPI schema Kueue's CRD serves for `kind` at `version` (`v1beta1`, `v1beta2`), made
/// strict: every object schema that lists its properties refuses others, as the API server's
/// strict field validation (`kubectl apply --validate=strict`) does. Without it a misspelt
/// field would pass, pruned in silence.
pub fn crd_schema(kind: &str, version: &str) -> Value {
    let singular = kind.to_lowercase();
    let plural = if singular.ends_with('s') {
        format!("{singular}es")
    } else {
        format!("{singular}s")
    };
    let file = format!("kueue.x-k8s.io_{plural}.yaml");
    let text = std::fs::read_to_string(data(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let crd: Value = serde_saphyr::from_str(&text).expect("the CRD is YAML");
    let versions = crd["spec"]["versions"].as_array().expect("versions");
    let served = versions
        .iter()
        .find(|v| v["name"] == version)
        .unwrap_or_else(|| panic!("{kind} serves {version}"));
    let mut schema = served["schema"]["openAPIV3Schema"].clone();
    strict(&mut schema);
    schema
}

fn strict(schema: &mut Value) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    let preserve = map
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if map.contains_key("properties") && !map.contains_key("additionalProperties") && !preserve {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in map.iter_mut() {
        match key.as_str() {
            "properties" => {
                if let Some(props) = value.as_object_mut() {
                    for (name, p) in props.iter_mut() {
                        // `metadata` is ObjectMeta, checked by the API server itself.
                        if name != "metadata" {
                            strict(p);
                        }
                    }
                }
            }
            "items" | "additionalProperties" => strict(value),
            "anyOf" | "allOf" | "oneOf" => {
                if let Some(list) = value.as_array_mut() {
                    list.iter_mut().for_each(strict);
                }
            }
            _ => {}
        }
    }
}

/// Every violation of the object's CRD schema, as `path: message`.
pub fn violations(object: &Value, version: &str) -> Vec<String> {
    let kind = object["kind"].as_str().expect("kind");
    let schema = crd_schema(kind, version);
    let validator = jsonschema::draft4::new(&schema).expect("the CRD schema compiles");
    validator
        .iter_errors(object)
        .map(|e| {
            format!(
                "{kind} {}: {}: {e}",
                object["metadata"]["name"],
                e.instance_path().as_str()
            )
        })
        .collect()
}

/// Objects as the YAML text `import` reads (JSON is YAML).
pub fn as_yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| serde_json::to_string_pretty(o).expect("JSON"))
        .collect::<Vec<_>>()
        .join("\n---\n")
}
