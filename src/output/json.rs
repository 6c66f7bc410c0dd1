//! `--output json`: a versioned report whose field order never changes.
//!
//! ```json
//! {"format_version": 1, "valid": false,
//!  "summary": {"files": 3, "documents": 9, "errors": 1, "warnings": 0},
//!  "diagnostics": [{"code": "TSR102", "name": "unknown-parent", "severity": "error",
//!                   "message": "...", "file": "t.yaml", "line": 5, "column": 11,
//!                   "field": "spec.parent", "help": "..."}]}
//! ```

use serde::Serialize;
use tessera_compiler::{Compilation, Diagnostic};

pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize)]
struct Report<'a> {
    format_version: u32,
    valid: bool,
    summary: Summary,
    diagnostics: Vec<Item<'a>>,
}

#[derive(Serialize)]
struct Summary {
    files: usize,
    documents: usize,
    errors: usize,
    warnings: usize,
}

#[derive(Serialize)]
pub struct Item<'a> {
    code: &'static str,
    name: &'static str,
    severity: &'static str,
    message: &'a str,
    file: Option<&'a str>,
    line: Option<u32>,
    column: Option<u32>,
    field: Option<&'a str>,
    help: Option<&'a str>,
}

pub fn item(d: &Diagnostic) -> Item<'_> {
    Item {
        code: d.code.as_str(),
        name: d.code.name(),
        severity: d.severity.as_str(),
        message: &d.message,
        file: d.location.as_ref().map(|l| l.file.as_str()),
        line: d.location.as_ref().map(|l| l.line),
        column: d.location.as_ref().map(|l| l.column),
        field: d.field.as_deref(),
        help: d.help.as_deref(),
    }
}

pub fn render(c: &Compilation) -> String {
    let report = Report {
        format_version: FORMAT_VERSION,
        valid: c.errors() == 0,
        summary: Summary {
            files: c.files,
            documents: c.documents,
            errors: c.errors(),
            warnings: c.warnings(),
        },
        diagnostics: c.diagnostics.iter().map(item).collect(),
    };
    let mut text = serde_json::to_string_pretty(&report).expect("the report serializes");
    text.push('\n');
    text
}
