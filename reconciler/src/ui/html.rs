//! Escaping: text from the repository or a tenant (names, messages, diagnostics) goes into the
//! page only through [`push_text`], so it can never become markup.

/// Appends `s` made safe for element content and for quoted attribute values (single or
/// double quotes): `&`, `<`, `>`, `"` and `'` become entities. The rule is `html-escape`'s, which
/// the replay page (`tessera-sim`) uses too.
pub fn push_text(out: &mut String, s: &str) {
    html_escape::encode_quoted_attribute_to_string(s, out);
}

/// `s` escaped, as a new string.
pub fn escape(s: &str) -> String {
    html_escape::encode_quoted_attribute(s).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(
            escape(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#x27;y&#x27;"
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
                    ["&amp;", "&lt;", "&gt;", "&quot;", "&#x27;"].iter().any(|x| rest.starts_with(x))
                );
            }
        }
    }
}
