//! `tessera submit`, `cancel`, `get`, `describe` and `status`: small clients of the service's
//! HTTP API.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tessera_compiler::model::Document;
use tessera_compiler::{SourceFile, load, yaml};

use crate::cli::{GetFormat, ServerArgs, TextOrJson};
use crate::output::emit;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// Sends a request and returns the status and the JSON body.
pub(super) fn call(
    server: &ServerArgs,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> anyhow::Result<(u16, Value)> {
    let url = format!("{}{}", server.server.trim_end_matches('/'), path);
    let agent = agent();
    let auth = server.token.as_ref().map(|t| format!("Bearer {t}"));
    let result = match (method, body) {
        ("POST", Some(body)) => {
            let mut req = agent.post(&url);
            if let Some(a) = &auth {
                req = req.header("Authorization", a);
            }
            req.content_type("application/json")
                .send(serde_json::to_string(body)?)
        }
        ("DELETE", _) => {
            let mut req = agent.delete(&url);
            if let Some(a) = &auth {
                req = req.header("Authorization", a);
            }
            req.call()
        }
        _ => {
            let mut req = agent.get(&url);
            if let Some(a) = &auth {
                req = req.header("Authorization", a);
            }
            req.call()
        }
    };
    let mut response =
        result.with_context(|| format!("cannot reach the service at {}", server.server))?;
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, value))
}

fn error_of(value: &Value) -> String {
    value
        .get("error")
        .and_then(Value::as_str)
        .map_or_else(|| value.to_string(), str::to_string)
}

/// Status 2xx → Ok; 4xx → the input is wrong (exit 1); anything else → exit 2.
pub(super) fn refused(status: u16, value: &Value) -> anyhow::Result<ExitCode> {
    eprintln!("error: {} (HTTP {status})", error_of(value));
    if (400..500).contains(&status) {
        Ok(ExitCode::from(1))
    } else {
        bail!("the service failed (HTTP {status})")
    }
}

pub fn submit(file: &Path, server: &ServerArgs) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let name = file.display().to_string();
    let source = SourceFile::new(name.clone(), text);
    let mut diagnostics = Vec::new();
    let mut workloads = Vec::new();
    match yaml::parse(&name, &source.text) {
        Err(d) => diagnostics.push(d),
        Ok(docs) => {
            for doc in docs {
                match load::load(&name, doc) {
                    Ok(loaded) => match loaded.document {
                        Document::Workload(spec) => workloads.push((loaded.name, spec)),
                        other => bail!(
                            "{name}: holds a {:?} document; submit takes `kind: Workload`",
                            other.kind()
                        ),
                    },
                    Err(ds) => diagnostics.extend(ds),
                }
            }
        }
    }
    if !diagnostics.is_empty() {
        let compilation = tessera_compiler::Compilation {
            policy: None,
            states: Vec::new(),
            diagnostics,
            files: 1,
            documents: 0,
        };
        eprint!(
            "{}",
            crate::output::human::render(&compilation, std::slice::from_ref(&source), false)
        );
        return Ok(ExitCode::from(1));
    }
    if workloads.is_empty() {
        bail!("{name}: holds no Workload document");
    }
    for (name, spec) in workloads {
        let body = json!({ "name": name, "spec": spec });
        let (status, value) = call(server, "POST", "/v1/workloads", Some(&body))?;
        if !(200..300).contains(&status) {
            return refused(status, &value);
        }
        println!(
            "submitted {name} (tenant {}, {})",
            value["tenant"].as_str().unwrap_or("?"),
            value["phase"].as_str().unwrap_or("pending")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `/v1/workloads/{name}`, with `?tenant=` when the caller says whose (names are per tenant).
fn workload_path(name: &str, tenant: Option<&str>) -> String {
    let mut path = format!("/v1/workloads/{}", percent_encode(name));
    if let Some(t) = tenant {
        path.push_str(&format!("?tenant={}", percent_encode(t)));
    }
    path
}

pub fn cancel(name: &str, tenant: Option<&str>, server: &ServerArgs) -> anyhow::Result<ExitCode> {
    let (status, value) = call(server, "DELETE", &workload_path(name, tenant), None)?;
    if !(200..300).contains(&status) {
        return refused(status, &value);
    }
    println!("cancelled {name}");
    Ok(ExitCode::SUCCESS)
}

pub fn status(server: &ServerArgs, output: TextOrJson) -> anyhow::Result<ExitCode> {
    let (code, value) = call(server, "GET", "/status", None)?;
    if !(200..300).contains(&code) {
        return refused(code, &value);
    }
    match output {
        TextOrJson::Json => emit(&(serde_json::to_string_pretty(&value)? + "\n"))?,
        TextOrJson::Human => emit(&human_status(&value))?,
    }
    let good = value["sync"] == "Synced" && value["health"] == "Healthy";
    Ok(if good {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn human_status(v: &Value) -> String {
    let s = |k: &str| v[k].as_str().unwrap_or("-").to_string();
    let mut out = format!(
        "sync:      {}\nhealth:    {}{}\nrevision:  {}\nhead:      {}\n",
        s("sync"),
        s("health"),
        if v["suspended"] == true {
            " (suspended)"
        } else {
            ""
        },
        s("revision"),
        s("head"),
    );
    // Only the operator's token shows the driver.
    if v["driver"].is_string() {
        out.push_str(&format!("driver:    {}\n", s("driver")));
    }
    out.push_str(&format!(
        "cycles:    {} (last at {})\n",
        v["cycles"],
        s("lastCycleAt")
    ));
    if let Some(e) = v["lastError"].as_str() {
        out.push_str(&format!("error:     {e}\n"));
    }
    if let Some(ds) = v["diagnostics"].as_array() {
        for d in ds {
            out.push_str(&format!("  {}\n", d.as_str().unwrap_or("")));
        }
    }
    out
}

pub fn get(
    tenant: Option<&str>,
    output: GetFormat,
    server: &ServerArgs,
) -> anyhow::Result<ExitCode> {
    let path = match tenant {
        Some(t) => format!("/v1/workloads?tenant={}", percent_encode(t)),
        None => "/v1/workloads".to_string(),
    };
    let (status, value) = call(server, "GET", &path, None)?;
    if !(200..300).contains(&status) {
        return refused(status, &value);
    }
    let empty = Vec::new();
    let workloads = value["workloads"].as_array().unwrap_or(&empty);
    match output {
        GetFormat::Json => emit(&(serde_json::to_string_pretty(&value)? + "\n"))?,
        GetFormat::Human | GetFormat::Wide => {
            emit(&workload_table(workloads, output == GetFormat::Wide, now()))?
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn describe(
    name: &str,
    tenant: Option<&str>,
    output: TextOrJson,
    server: &ServerArgs,
) -> anyhow::Result<ExitCode> {
    let (status, value) = call(server, "GET", &workload_path(name, tenant), None)?;
    if !(200..300).contains(&status) {
        return refused(status, &value);
    }
    match output {
        TextOrJson::Json => emit(&(serde_json::to_string_pretty(&value)? + "\n"))?,
        TextOrJson::Human => emit(&describe_text(&value))?,
    }
    Ok(ExitCode::SUCCESS)
}

fn now() -> jiff::Timestamp {
    tessera_compiler::units::now()
}

/// Percent-encodes everything but unreserved characters (RFC 3986), for a path segment or a
/// query value.
pub(super) fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn text<'v>(v: &'v Value, key: &str) -> &'v str {
    v[key].as_str().unwrap_or("-")
}

/// How long ago an RFC 3339 instant was, as kubectl shows ages (`45s`, `3m`, `2h`, `5d`).
fn age(at: &str, now: jiff::Timestamp) -> String {
    match tessera_compiler::units::parse_rfc3339(at) {
        Some(t) => {
            let s = now.as_second().saturating_sub(t.as_second()).max(0);
            match s {
                0..60 => format!("{s}s"),
                60..3600 => format!("{}m", s / 60),
                3600..86400 => format!("{}h", s / 3600),
                _ => format!("{}d", s / 86400),
            }
        }
        None => "-".to_string(),
    }
}

/// The `tessera get` table; `now` is the instant ages are counted to.
fn workload_table(workloads: &[Value], wide: bool, now: jiff::Timestamp) -> String {
    let mut header = vec![
        "NAME", "TENANT", "CLASS", "POOL", "PHASE", "AGE", "GPUS", "REASON",
    ];
    if wide {
        header.extend([
            "ORIGIN",
            "NODES",
            "ATTEMPTS",
            "QUEUE",
            "EXPECTED-START",
            "MESSAGE",
        ]);
    }
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for w in workloads {
        let reason = match (w["reason"].as_str(), w["end"]["kind"].as_str()) {
            (Some(r), _) => r.to_string(),
            (None, Some(end)) if w["phase"] != "succeeded" => end.to_string(),
            _ => "-".to_string(),
        };
        let mut row = vec![
            text(w, "name").to_string(),
            text(w, "tenant").to_string(),
            text(w, "sloClass").to_string(),
            text(w, "pool").to_string(),
            text(w, "phase").to_string(),
            age(text(w, "submittedAt"), now),
            text(w, "gpus").to_string(),
            reason,
        ];
        if wide {
            let mut nodes: Vec<&str> = w["bindings"]
                .as_array()
                .map(|bs| bs.iter().filter_map(|b| b["node"].as_str()).collect())
                .unwrap_or_default();
            nodes.dedup();
            let message = w["message"]
                .as_str()
                .or(w["endMessage"].as_str())
                .unwrap_or("-");
            row.extend([
                text(w, "origin").to_string(),
                if nodes.is_empty() {
                    "-".to_string()
                } else {
                    nodes.join(",")
                },
                w["attempts"].as_u64().unwrap_or(0).to_string(),
                w["queuePosition"]["position"]
                    .as_u64()
                    .map_or_else(|| "-".to_string(), |p| p.to_string()),
                text(w, "expectedStart").to_string(),
                one_line(message),
            ]);
        }
        rows.push(row);
    }
    if rows.len() == 1 {
        return "No workloads.\n".to_string();
    }
    columns(&rows)
}

/// Control characters (a name or message is the service's, but may carry a command's text)
/// never reach the terminal.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Left-aligned columns, three spaces apart; the last column is not padded.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let c = one_line(c);
                if i + 1 == row.len() {
                    c
                } else {
                    format!("{c:<width$}", width = widths[i])
                }
            })
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// The `tessera describe` text: kubectl's layout, `Key:  value` then sections.
fn describe_text(w: &Value) -> String {
    let mut out = String::new();
    let mut field = |key: &str, value: String| {
        out.push_str(&format!("{:<17}{}\n", format!("{key}:"), one_line(&value)));
    };
    let opt = |key: &str| w[key].as_str().map(str::to_string);
    field("Name", text(w, "name").to_string());
    field("Tenant", text(w, "tenant").to_string());
    field("SLO class", text(w, "sloClass").to_string());
    field("Origin", text(w, "origin").to_string());
    field("Phase", text(w, "phase").to_string());
    field("Pool", text(w, "pool").to_string());
    field("GPUs", text(w, "gpus").to_string());
    field("Submitted", text(w, "submittedAt").to_string());
    if let Some(t) = opt("startedAt") {
        field("Started", t);
    }
    if let Some(t) = opt("endedAt") {
        field("Ended", t);
    }
    if let Some(m) = opt("endMessage") {
        field("Ended how", m);
    }
    if let Some(t) = opt("cancelRequestedAt") {
        field("Cancel requested", t);
    }
    field("Attempts", w["attempts"].as_u64().unwrap_or(0).to_string());
    if let Some(r) = opt("reason") {
        field("Reason", r);
    }
    if let Some(m) = opt("message") {
        field("Message", m);
    }
    if let Some(d) = opt("decidedAt") {
        field("Decided at", d);
    }
    if let (Some(position), Some(of)) = (
        w["queuePosition"]["position"].as_u64(),
        w["queuePosition"]["of"].as_u64(),
    ) {
        field("Queue position", format!("{position} of {of} waiting"));
    }
    if let Some(e) = opt("expectedStart") {
        field("Expected start", e);
    }
    if let Some(d) = opt("checkpointDir") {
        field("Checkpoint", d);
    }
    if let Some(t) = opt("lastCheckpointAt") {
        field("Last checkpoint", t);
    }
    if let Some(t) = opt("graceDeadline") {
        field("Stop at", t);
    }
    out.push_str("Spec:\n");
    let spec = serde_json::to_string_pretty(&w["spec"]).unwrap_or_default();
    for line in spec.lines() {
        out.push_str(&format!("  {}\n", one_line(line)));
    }
    out.push_str("Bindings:\n");
    match w["bindings"].as_array() {
        Some(bs) if !bs.is_empty() => {
            for (i, b) in bs.iter().enumerate() {
                let pid = w["replicas"][i]["pid"]
                    .as_u64()
                    .map_or_else(String::new, |p| format!(", pid {p}"));
                out.push_str(&format!(
                    "  replica {i}: {}{pid}\n",
                    one_line(&serde_json::to_string(b).unwrap_or_default())
                ));
            }
        }
        _ => out.push_str("  <none>\n"),
    }
    out.push_str("Events:\n");
    match w["events"].as_array() {
        Some(es) if !es.is_empty() => {
            let rows: Vec<Vec<String>> = std::iter::once(vec![
                "AT".to_string(),
                "KIND".to_string(),
                "MESSAGE".to_string(),
            ])
            .chain(es.iter().map(|e| {
                vec![
                    text(e, "at").to_string(),
                    text(e, "kind").to_string(),
                    text(e, "message").to_string(),
                ]
            }))
            .collect();
            for line in columns(&rows).lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
        _ => out.push_str("  <none>\n"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let now = tessera_compiler::units::parse_rfc3339("2026-01-02T00:00:00Z").unwrap();
        assert_eq!(age("2026-01-01T23:59:15Z", now), "45s");
        assert_eq!(age("2026-01-01T23:57:00Z", now), "3m");
        assert_eq!(age("2026-01-01T21:00:00Z", now), "3h");
        assert_eq!(age("2025-12-28T00:00:00Z", now), "5d");
        assert_eq!(age("not a time", now), "-");
    }

    #[test]
    fn the_table_lines_up_and_shows_why_a_workload_waits() {
        let now = tessera_compiler::units::parse_rfc3339("2026-01-02T00:00:00Z").unwrap();
        let w = serde_json::json!([
            {"name": "train", "tenant": "research", "sloClass": "batch", "pool": "a100",
             "phase": "pending", "submittedAt": "2026-01-01T23:58:00Z", "gpus": "2x8",
             "reason": "no_capacity", "message": "needs 16 GPUs,\nhas 4", "origin": "submitted",
             "attempts": 0, "bindings": []},
            {"name": "serve", "tenant": "product", "sloClass": "online", "pool": "a100",
             "phase": "running", "submittedAt": "2026-01-01T22:00:00Z", "gpus": "1x1g.10gb",
             "origin": "committed", "attempts": 1, "bindings": [{"node": "n1", "gpus": [0]}]}
        ]);
        let table = workload_table(w.as_array().unwrap(), false, now);
        assert_eq!(
            table,
            "NAME    TENANT     CLASS    POOL   PHASE     AGE   GPUS        REASON\n\
             train   research   batch    a100   pending   2m    2x8         no_capacity\n\
             serve   product    online   a100   running   2h    1x1g.10gb   -\n"
        );
        let wide = workload_table(w.as_array().unwrap(), true, now);
        assert!(wide.contains("needs 16 GPUs, has 4"), "{wide}");
        assert!(wide.contains("n1"), "{wide}");
        assert_eq!(workload_table(&[], false, now), "No workloads.\n");
    }

    #[test]
    fn names_are_encoded_for_a_url() {
        assert_eq!(percent_encode("team-a"), "team-a");
        assert_eq!(percent_encode("a b/c?d"), "a%20b%2Fc%3Fd");
    }
}
