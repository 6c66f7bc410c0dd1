//! Renderers of diagnostics: one module per `--output` format, each a pure function to text;
//! `count` for numbers in running text.

pub mod count;
pub mod github;
pub mod human;
pub mod json;
pub mod sarif;

use std::io::{IsTerminal, Write};

/// Writes to stdout. A closed pipe (`tessera mig layouts X | head`) ends the output quietly
/// instead of failing: the reader has all it wanted.
pub fn emit(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Colour only on a terminal, and never when `NO_COLOR` is set (no-color.org).
pub fn color_stdout() -> bool {
    std::env::var_os("NO_COLOR").is_none() && std::io::stdout().is_terminal()
}

pub fn color_stderr() -> bool {
    std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal()
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// "2 errors and 1 warning in 12 files (40 documents)".
pub fn summary(c: &tessera_compiler::Compilation) -> String {
    let problems = match (c.errors(), c.warnings()) {
        (0, 0) => "no problems".to_owned(),
        (e, 0) => plural(e, "error"),
        (0, w) => plural(w, "warning"),
        (e, w) => format!("{} and {}", plural(e, "error"), plural(w, "warning")),
    };
    format!(
        "{problems} in {} ({})",
        plural(c.files, "file"),
        plural(c.documents, "document")
    )
}
