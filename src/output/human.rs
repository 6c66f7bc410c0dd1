//! rustc-style diagnostics, drawn by `annotate-snippets`: the message, the location, the source
//! line with a caret under the token, the help.
//!
//! Everything shown comes from the repository, which a pull request's author controls: control
//! characters (ESC, OSC, NUL, bidirectional overrides) are shown as visible symbols (`␛`), never
//! written to the terminal or CI log as they are.

use std::collections::HashMap;
use std::fmt::Write;

use annotate_snippets::{
    AnnotationKind, Group, Level, Origin, Renderer, Snippet, normalize_untrusted_str,
};
use tessera_compiler::{Compilation, Diagnostic, Severity, SourceFile};

pub fn render(c: &Compilation, sources: &[SourceFile], color: bool) -> String {
    let files: HashMap<&str, &str> = sources
        .iter()
        .map(|s| (s.path.as_str(), s.text.as_str()))
        .collect();
    let renderer = if color {
        Renderer::styled()
    } else {
        Renderer::plain()
    };
    let mut out = String::new();
    for d in &c.diagnostics {
        out.push_str(&renderer.render(&[group(d, &files)]));
        out.push_str("\n\n");
    }
    let verdict = match (c.errors() > 0, color) {
        (true, true) => "\x1b[1;31minvalid\x1b[0m",
        (true, false) => "invalid",
        (false, true) => "\x1b[1;32mvalid\x1b[0m",
        (false, false) => "valid",
    };
    let _ = writeln!(out, "{verdict}: {}", super::summary(c));
    out
}

/// One diagnostic as a report group: title, then the source line (or only the location when
/// the file's text is not at hand), then the help.
fn group<'a>(d: &'a Diagnostic, files: &HashMap<&str, &'a str>) -> Group<'a> {
    let level = match d.severity {
        Severity::Error => Level::ERROR,
        Severity::Warning => Level::WARNING,
    };
    let mut group = Group::with_title(level.primary_title(d.message.as_str()).id(d.code.as_str()));
    if let Some(loc) = &d.location {
        let path = normalize_untrusted_str(&loc.file);
        let line = files
            .get(loc.file.as_str())
            .and_then(|t| t.lines().nth(loc.line.saturating_sub(1) as usize));
        group = match line {
            Some(text) => {
                let text = text.trim_end();
                let col = loc.column.saturating_sub(1) as usize;
                let span = token_span(text, col);
                group.element(
                    Snippet::source(text)
                        .line_start(loc.line as usize)
                        .path(path)
                        .annotation(AnnotationKind::Primary.span(span)),
                )
            }
            None => group.element(
                Origin::path(path)
                    .line(loc.line as usize)
                    .char_column(loc.column as usize),
            ),
        };
    }
    if let Some(help) = &d.help {
        // Messages are drawn as given (they may be styled): the help's names come from the
        // repository, so it is made safe here.
        group = group.element(Level::HELP.message(normalize_untrusted_str(help)));
    }
    group
}

/// The byte range of the token at character `col`: a quoted string to its closing quote, else
/// up to the next space or flow punctuation; a `key:` without its colon. At least one
/// character, or the end of the line when `col` is past it.
fn token_span(line: &str, col: usize) -> std::ops::Range<usize> {
    let start = line.char_indices().nth(col).map_or(line.len(), |(i, _)| i);
    let rest: Vec<char> = line[start..].chars().collect();
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
        None => 0,
    };
    let width = if width > 1 && rest.get(width - 1) == Some(&':') {
        width - 1
    } else {
        width
    };
    let bytes: usize = rest.iter().take(width.max(1)).map(|c| c.len_utf8()).sum();
    start..start + bytes
}

#[cfg(test)]
mod tests {
    use super::{render, token_span};
    use tessera_compiler::{Code, Compilation, Diagnostic, Location, SourceFile};

    #[test]
    fn control_characters_from_the_repository_never_reach_the_terminal() {
        let file = "evil\x1b[2J.yaml";
        let d = Diagnostic::new(Code::UnknownPool, "unknown pool `a\x1b]0;title\x07`")
            .at(Some(Location {
                file: file.to_owned(),
                line: 2,
                column: 3,
            }))
            .help("did you mean `b\u{202e}`?\0");
        let c = Compilation {
            policy: None,
            states: Vec::new(),
            diagnostics: vec![d],
            files: 1,
            documents: 1,
        };
        let sources = [SourceFile::new(file, "a: 1\nb: x\x1b[31m\0\n")];
        for color in [false, true] {
            let text = render(&c, &sources, color);
            // Colour is the renderer's own SGR sequences (`ESC [ … m`); nothing else.
            let stripped = text.split('\x1b').skip(1).all(|rest| {
                rest.starts_with('[')
                    && rest[1..]
                        .trim_start_matches(|c: char| c.is_ascii_digit() || c == ';')
                        .starts_with('m')
            });
            assert!(stripped, "{text:?}");
            assert!(
                !text.contains('\0') && !text.contains('\x07') && !text.contains('\u{202e}'),
                "{text:?}"
            );
        }
        let plain = render(&c, &sources, false);
        assert!(!plain.contains('\x1b'), "{plain:?}");
        assert!(plain.contains("x␛[31m␀"), "{plain}");
        assert!(plain.contains("evil␛[2J.yaml:2:3"), "{plain}");
    }

    #[test]
    fn carets_cover_the_token() {
        assert_eq!(token_span("  parent: reserch", 10), 10..17);
        assert_eq!(token_span("  parent: reserch", 2), 2..8);
        assert_eq!(token_span("x: \"a b\" # c", 3), 3..8);
        assert_eq!(token_span("{a: 1, b: 2}", 4), 4..5);
        assert_eq!(token_span("", 0), 0..0);
        assert_eq!(token_span("é: ü", 3), 4..6);
    }
}
