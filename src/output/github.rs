//! `--output github`: workflow commands that GitHub Actions turns into annotations on the pull
//! request's files.

use std::fmt::Write;

use tessera_compiler::{Compilation, Severity};

/// Escaping of a command's message (`%`, CR, LF, as the Actions toolkit does). Every other
/// control character comes from the repository, which a pull request's author controls, and
/// would reach the CI log as it is: it is shown as a visible symbol (`␛`), as `human` does.
pub fn escape_data(s: &str) -> String {
    let escaped = s
        .replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A");
    annotate_snippets::normalize_untrusted_str(&escaped)
}

/// Escaping of a property value: the message's plus `:` and `,`.
pub fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_follow_the_toolkit() {
        assert_eq!(escape_data("100%\nnext\r"), "100%25%0Anext%0D");
        assert_eq!(escape_property("a:b,c%"), "a%3Ab%2Cc%25");
    }

    #[test]
    fn control_characters_from_the_repository_never_reach_the_log() {
        assert_eq!(
            escape_data("x\u{1b}]8;;evil\u{7}\0\u{202e}y"),
            "x␛]8;;evil␇␀�y"
        );
        assert_eq!(escape_property("a\u{1b}[2J"), "a␛[2J");
    }
}
