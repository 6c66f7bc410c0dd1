//! `--output sarif`: SARIF 2.1.0 for code-scanning tools. Rule ids are the diagnostic codes and
//! the rule list is every code, in a fixed order, so `ruleIndex` is stable across runs.

use serde_json::{Value, json};
use tessera_compiler::{Code, Compilation, Severity};

pub fn render(c: &Compilation) -> String {
    let rules: Vec<Value> = Code::ALL
        .iter()
        .map(|code| {
            json!({
                "id": code.as_str(),
                "name": code.name(),
                "shortDescription": {"text": code.summary()},
                "defaultConfiguration": {"level": level(code.severity())},
            })
        })
        .collect();
    let results: Vec<Value> = c
        .diagnostics
        .iter()
        .map(|d| {
            let mut text = d.message.clone();
            if let Some(help) = &d.help {
                text.push_str("\nhelp: ");
                text.push_str(help);
            }
            let mut result = json!({
                "ruleId": d.code.as_str(),
                "ruleIndex": Code::ALL.iter().position(|c| *c == d.code).expect("every code is listed"),
                "level": level(d.severity),
                "message": {"text": text},
            });
            if let Some(l) = &d.location {
                result["locations"] = json!([{
                    "physicalLocation": {
                        "artifactLocation": {"uri": l.file},
                        "region": {"startLine": l.line, "startColumn": l.column},
                    }
                }]);
            }
            result
        })
        .collect();
    let log = json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "tessera",
                "version": env!("CARGO_PKG_VERSION"),
                "informationUri": "https://tessera.dev",
                "rules": rules,
            }},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    });
    let mut text = serde_json::to_string_pretty(&log).expect("SARIF serializes");
    text.push('\n');
    text
}

fn level(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}
