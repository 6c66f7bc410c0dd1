//! `--output github`: workflow commands that GitHub Actions turns into annotations on the pull
//! request's files.

use std::fmt::Write;

use tessera_compiler::{Compilation, Severity};
use tessera_plan::workflow_command::{escape_data, escape_property};

pub fn render(c: &Compilation) -> String {
    let mut out = String::new();
    for d in &c.diagnostics {
        let command = match d.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let mut props = Vec::new();
        if let Some(l) = &d.location {
            props.push(format!("file={}", escape_property(&l.file)));
            props.push(format!("line={}", l.line));
            props.push(format!("col={}", l.column));
        }
        props.push(format!(
            "title={}",
            escape_property(&format!("{} {}", d.code, d.code.name()))
        ));
        let mut message = d.message.clone();
        if let Some(help) = &d.help {
            message.push_str("\nhelp: ");
            message.push_str(help);
        }
        let _ = writeln!(
            out,
            "::{command} {}::{}",
            props.join(","),
            escape_data(&message)
        );
    }
    let _ = writeln!(out, "tessera validate: {}", super::summary(c));
    out
}
