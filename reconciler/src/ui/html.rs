//! Escaping: text from the repository or a tenant (names, messages, diagnostics) goes into the
//! page only through [`push_text`], so it can never become markup.

/// Appends `s` made safe for element content and for quoted attribute values.
pub fn push_text(out: &mut String, s: &str) {
    // Most names need nothing; copying them whole keeps a 4,000-GPU page fast.
    if !s
        .bytes()
        .any(|b| matches!(b, b'&' | b'<' | b'>' | b'"' | b'\''))
    {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

/// `s` escaped, as a new string.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    push_text(&mut out, s);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(
            escape(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        assert_eq!(escape("team-a/job.1 ünï"), "team-a/job.1 ünï");
    }

    proptest::proptest! {
        /// Whatever the text, the escaped form holds no character that could open a tag, an
        /// attribute or an entity of its own.
        #[test]
        fn escaped_text_opens_no_markup(s in ".*") {
            let e = escape(&s);
            proptest::prop_assert!(!e.contains(['<', '>', '"', '\'']));
            for (i, _) in e.match_indices('&') {
                let rest = &e[i..];
                proptest::prop_assert!(
                    ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"].iter().any(|x| rest.starts_with(x))
                );
            }
        }
    }
}
