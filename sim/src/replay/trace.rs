//! What a replay replays: workloads with an arrival instant and a run time, and the tessera
//! trace format that writes them down.
//!
//! A tessera trace is a YAML stream of `Workload` documents, each with two fields beside the
//! usual `metadata` and `spec` (the `Workload` spec of the policy language):
//!
//! ```yaml
//! apiVersion: tessera/v1alpha1
//! kind: Workload
//! metadata: {name: train-7}
//! spec: {tenant: nlp, sloClass: batch-training, gpu: {count: 8}}
//! arrival: 90s     # after the start of the replay
//! duration: 2h     # run time once started, without preemption
//! ```
//!
//! A mistake is reported at its file, line and column, as the compiler reports a policy's.

use std::path::Path;

use serde_json::Value;
use tessera_compiler::model::WorkloadSpec;
use tessera_compiler::units::Duration;
use tessera_compiler::yaml;

/// One workload of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceWorkload {
    /// Unique per tenant.
    pub name: String,
    pub spec: WorkloadSpec,
    /// Seconds after the start of the replay.
    pub arrival: i64,
    /// Seconds of running it needs; `None`: it runs until the replay ends.
    pub duration: Option<i64>,
}

/// A trace workload for tests: tenant `t`, class `c`, no CPU or memory, `replicas` of `gpu`.
#[cfg(test)]
pub(crate) fn test_workload(
    name: &str,
    replicas: u32,
    gpu: tessera_compiler::model::GpuRequest,
    arrival: i64,
    duration: i64,
) -> TraceWorkload {
    TraceWorkload {
        name: name.into(),
        spec: WorkloadSpec {
            tenant: "t".into(),
            slo_class: "c".into(),
            pool: None,
            replicas,
            min_member: None,
            gpu,
            cpu: tessera_compiler::units::Millicores(0),
            memory: tessera_compiler::units::Bytes(0),
            topology: tessera_compiler::model::Topology::default(),
            max_duration: None,
            command: Vec::new(),
            env: std::collections::BTreeMap::new(),
        },
        arrival,
        duration: Some(duration),
    }
}

/// Why a trace could not be read. Each names the file, and a mistake in it the line and
/// column.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    At {
        path: String,
        line: u32,
        column: u32,
        message: String,
    },
    #[error("{path}: {message}")]
    File { path: String, message: String },
}

/// Reads a tessera trace file.
pub fn load_tessera_trace(path: &Path) -> Result<Vec<TraceWorkload>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_tessera_trace(&path.display().to_string(), &text)
}

/// Parses tessera trace text; `file` names it in errors.
pub fn parse_tessera_trace(file: &str, text: &str) -> Result<Vec<TraceWorkload>, TraceError> {
    let docs = yaml::parse(file, text).map_err(|d| match &d.location {
        Some(l) => TraceError::At {
            path: file.to_owned(),
            line: l.line,
            column: l.column,
            message: d.message.clone(),
        },
        None => TraceError::File {
            path: file.to_owned(),
            message: d.message.clone(),
        },
    })?;
    let mut out: Vec<TraceWorkload> = Vec::with_capacity(docs.len());
    for doc in docs {
        let at = |pointer: &str, message: String| {
            let pos = doc.spans.key_or_value(pointer);
            TraceError::At {
                path: file.to_owned(),
                line: pos.line,
                column: pos.column,
                message,
            }
        };
        let w = workload(&doc.value, &at)?;
        if out
            .iter()
            .any(|o| o.name == w.name && o.spec.tenant == w.spec.tenant)
        {
            return Err(at(
                "/metadata/name",
                format!(
                    "workload `{}` of tenant `{}` appears twice: names are unique per tenant",
                    w.name, w.spec.tenant
                ),
            ));
        }
        out.push(w);
    }
    Ok(out)
}

const FIELDS: [&str; 6] = [
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "arrival",
    "duration",
];

fn workload(
    value: &Value,
    at: &dyn Fn(&str, String) -> TraceError,
) -> Result<TraceWorkload, TraceError> {
    let Some(map) = value.as_object() else {
        return Err(at("", "a trace document must be a mapping".into()));
    };
    for key in map.keys() {
        if !FIELDS.contains(&key.as_str()) {
            return Err(at(
                &format!("/{}", yaml::escape(key)),
                format!(
                    "unknown field `{key}`: a trace document has {}",
                    FIELDS.join(", ")
                ),
            ));
        }
    }
    match map.get("kind").and_then(Value::as_str) {
        Some("Workload") => {}
        Some(other) => {
            return Err(at(
                "/kind",
                format!("`kind: {other}`: a trace holds only `kind: Workload` documents"),
            ));
        }
        None => return Err(at("", "missing `kind: Workload`".into())),
    }
    let name = match map.get("metadata").and_then(|m| m.get("name")) {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(at("/metadata", "missing `metadata.name`".into())),
    };
    let Some(spec) = map.get("spec") else {
        return Err(at("", "missing `spec` (the Workload's spec)".into()));
    };
    let spec: WorkloadSpec = serde_path_to_error::deserialize(spec).map_err(|e| {
        // A missing field is reported at the mapping that lacks it (the nearest span).
        let pointer = format!("/spec{}", pointer_of(e.path()));
        at(&pointer, format!("`spec`: {}", e.inner()))
    })?;
    let arrival = match map.get("arrival") {
        Some(v) => seconds(v).ok_or_else(|| {
            at(
                "/arrival",
                format!(
                    "`arrival` must be a duration after the start (90s, 2h) or seconds, found {v}"
                ),
            )
        })?,
        None => {
            return Err(at(
                "",
                "missing `arrival` (when the workload is submitted)".into(),
            ));
        }
    };
    let duration = match map.get("duration") {
        None | Some(Value::Null) => None,
        Some(v) => Some(seconds(v).ok_or_else(|| {
            at(
                "/duration",
                format!("`duration` must be a duration (10m, 2h) or seconds, found {v}"),
            )
        })?),
    };
    Ok(TraceWorkload {
        name,
        spec,
        arrival,
        duration,
    })
}

/// A duration string (`90s`, `1h30m`) or a non-negative whole number of seconds.
fn seconds(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|s| i64::try_from(s).ok()),
        Value::String(s) => Duration::parse(s).and_then(|d| i64::try_from(d.seconds()).ok()),
        _ => None,
    }
}

/// The JSON pointer (below `spec`) of a serde path.
fn pointer_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("/{index}")),
            Segment::Map { key } => out.push_str(&format!("/{}", yaml::escape(key))),
            Segment::Enum { variant } => out.push_str(&format!("/{}", yaml::escape(variant))),
            Segment::Unknown => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
kind: Workload
metadata: {name: a}
spec: {tenant: t, sloClass: batch, gpu: {count: 2}}
arrival: 90s
duration: 3600
---
kind: Workload
metadata: {name: b}
spec: {tenant: t, sloClass: batch, gpu: {fraction: 0.25}}
arrival: 0
";

    #[test]
    fn reads_arrivals_and_durations() {
        let t = parse_tessera_trace("trace.yaml", GOOD).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].arrival, t[0].duration), (90, Some(3600)));
        assert_eq!(t[0].spec.gpu.count, Some(2));
        assert_eq!((t[1].arrival, t[1].duration), (0, None));
    }

    #[test]
    fn mistakes_name_file_line_and_column() {
        let bad = GOOD.replace("arrival: 90s", "arrival: soon");
        let e = parse_tessera_trace("trace.yaml", &bad)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("trace.yaml:4:1: `arrival`"), "{e}");

        let bad = GOOD.replace("gpu: {count: 2}", "gpu: {count: two}");
        let e = parse_tessera_trace("trace.yaml", &bad)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("trace.yaml:3:"), "{e}");
        assert!(e.contains("`spec`"), "{e}");

        let bad = GOOD.replace("metadata: {name: b}", "metadata: {name: a}");
        let e = parse_tessera_trace("trace.yaml", &bad)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("trace.yaml:8:") && e.contains("twice"), "{e}");

        let bad = GOOD.replace(
            "kind: Workload\nmetadata: {name: b}",
            "kind: Pool\nmetadata: {name: b}",
        );
        let e = parse_tessera_trace("trace.yaml", &bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("trace.yaml:7:1:") && e.contains("Pool"),
            "{e}"
        );
    }
}
