//! Escaping for GitHub Actions workflow commands (`::error file=…::message`), the one place
//! both `tessera plan --output github` and `tessera validate --output github` take it from.
//!
//! The toolkit's own escaping covers `%`, CR and LF (and `:` and `,` in a property). Every other
//! control character comes from the repository, which a pull request's author controls, and
//! would reach the CI log as it is (a terminal escape can rewrite what a reviewer sees): it is
//! shown as a visible symbol (`␛`), as the human output does.

/// Escapes a command's message.
pub fn escape_data(s: &str) -> String {
    let escaped = s
        .replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A");
    annotate_snippets::normalize_untrusted_str(&escaped)
}

/// Escapes a property value (`file=`, `title=`): the message's escaping plus `:` and `,`.
pub fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
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
