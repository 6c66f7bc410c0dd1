//! rustc-style diagnostics: the message, the location, the source line with a caret, the help.

use std::collections::HashMap;
use std::fmt::Write;

use tessera_compiler::{Compilation, Severity, SourceFile};

struct Paint(bool);

impl Paint {
    fn wrap(&self, code: &str, text: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
}

pub fn render(c: &Compilation, sources: &[SourceFile], color: bool) -> String {
    let paint = Paint(color);
    let files: HashMap<&str, &str> = sources
        .iter()
        .map(|s| (s.path.as_str(), s.text.as_str()))
        .collect();
    let mut out = String::new();
    for d in &c.diagnostics {
        let (label, style) = match d.severity {
            Severity::Error => ("error", "1;31"),
            Severity::Warning => ("warning", "1;33"),
        };
        let _ = writeln!(
            out,
            "{}{} {}",
            paint.wrap(style, &format!("{label}[{}]", d.code)),
            paint.wrap("1", ":"),
            paint.wrap("1", &d.message)
        );
        if let Some(loc) = &d.location {
            let line_text = files
                .get(loc.file.as_str())
                .and_then(|t| t.lines().nth(loc.line.saturating_sub(1) as usize));
            let gutter = loc.line.to_string().len();
            let pad = " ".repeat(gutter);
            let _ = writeln!(out, "{pad}{} {loc}", paint.wrap("1;34", "-->"));
            if let Some(text) = line_text {
                let bar = paint.wrap("1;34", "|");
                let _ = writeln!(out, "{pad} {bar}");
                let _ = writeln!(
                    out,
                    "{} {bar} {}",
                    paint.wrap("1;34", &loc.line.to_string()),
                    text.trim_end()
                );
                let col = loc.column.saturating_sub(1) as usize;
                let width = token_width(text, col);
                let lead: String = text
                    .chars()
                    .take(col)
                    .map(|c| if c == '\t' { '\t' } else { ' ' })
                    .collect();
                let _ = writeln!(
                    out,
                    "{pad} {bar} {lead}{}",
                    paint.wrap(style, &"^".repeat(width))
                );
            }
        }
        if let Some(help) = &d.help {
            let pad = d.location.as_ref().map_or(0, |l| l.line.to_string().len());
            let _ = writeln!(
                out,
                "{} {} {help}",
                " ".repeat(pad),
                paint.wrap("1;36", "= help:")
            );
        }
        out.push('\n');
    }
    let verdict = if c.errors() > 0 {
        paint.wrap("1;31", "invalid")
    } else {
        paint.wrap("1;32", "valid")
    };
    let _ = writeln!(out, "{verdict}: {}", super::summary(c));
    out
}

/// How many characters the token at `col` spans: a quoted string to its closing quote, else up
/// to the next space or flow punctuation. At least one.
fn token_width(line: &str, col: usize) -> usize {
    let rest: Vec<char> = line.chars().skip(col).collect();
    let width = match rest.first() {
        // A flow collection: point at its opening bracket, not at everything inside.
        Some('[' | '{') => 1,
        Some(q @ ('"' | '\'')) => rest[1..]
            .iter()
            .position(|c| c == q)
            .map_or(rest.len(), |i| i + 2),
        Some(_) => rest
            .iter()
            .position(|c| c.is_whitespace() || matches!(c, ',' | '}' | ']' | '#'))
            .unwrap_or(rest.len()),
        None => 1,
    };
    // A `key:` token points at the key alone.
    let token: String = rest.iter().take(width).collect();
    let width = if token.ends_with(':') {
        width - 1
    } else {
        width
    };
    width.max(1)
}

#[cfg(test)]
mod tests {
    use super::token_width;

    #[test]
    fn carets_cover_the_token() {
        assert_eq!(token_width("  parent: reserch", 10), 7);
        assert_eq!(token_width("  parent: reserch", 2), 6);
        assert_eq!(token_width("x: \"a b\" # c", 3), 5);
        assert_eq!(token_width("{a: 1, b: 2}", 4), 1);
        assert_eq!(token_width("", 0), 1);
    }
}
