//! `tessera submit`, `cancel` and `status`: small clients of the service's HTTP API.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tessera_compiler::model::Document;
use tessera_compiler::{SourceFile, load, yaml};

use crate::cli::{ServerArgs, TextOrJson};
use crate::output::emit;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// Sends a request and returns the status and the JSON body.
fn call(
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
fn refused(status: u16, value: &Value) -> anyhow::Result<ExitCode> {
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

pub fn cancel(name: &str, server: &ServerArgs) -> anyhow::Result<ExitCode> {
    let (status, value) = call(server, "DELETE", &format!("/v1/workloads/{name}"), None)?;
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
        "sync:      {}\nhealth:    {}{}\nrevision:  {}\nhead:      {}\ndriver:    {}\ncycles:    {} (last at {})\n",
        s("sync"),
        s("health"),
        if v["suspended"] == true {
            " (suspended)"
        } else {
            ""
        },
        s("revision"),
        s("head"),
        s("driver"),
        v["cycles"],
        s("lastCycleAt"),
    );
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
