//! The common case of a policy file read straight from the parser's events.
//!
//! serde-saphyr reads a file as serde data: every node passes through its deserializer, a
//! `Spanned` wrapper (whose location is itself deserialized, as a map) and our `Node` tree
//! before it is lowered to JSON. For a fleet's snapshot (a 65,000-workload document at
//! 50,000 GPUs) that machinery is most of the compile. Most policy files use a small part of
//! YAML: block and flow collections of scalars, no anchors, aliases, tags or merge keys. This
//! module lowers such a file directly from the events of the parser serde-saphyr itself runs
//! (granit-parser, with the options serde-saphyr gives it), and gives up, for the whole file,
//! on anything outside that part or anything it cannot prove serde-saphyr reads the same way: a
//! syntax error, a duplicate key, a budget reached, a scalar whose type it does not know. The
//! caller then parses the file with serde-saphyr, whose answer (value or diagnostic) stands.
//! So this path never reports an error, and whatever it accepts it reads as serde-saphyr does:
//! `tests::the_fast_path_reads_what_serde_saphyr_reads` compares the two on every YAML file in
//! the repository and on a table of scalars chosen to sit on the edges of YAML's types.

use granit_parser::{Event, Parser, ScalarStyle, Span, StrInput};
use serde_json::{Map, Number, Value};

use super::{
    MAX_DEPTH, MAX_DOCUMENTS, MAX_EVENTS, MAX_NODES, NodePos, ParsedDocument, Pos, SpanIndex,
    escape_into,
};
use std::fmt::Write as _;

/// serde-saphyr's default cap on the bytes of scalar text in one file (64 MiB).
const MAX_SCALAR_BYTES: usize = 64 * 1024 * 1024;

/// Why this path gave the file back: nothing to report, serde-saphyr reads it instead.
struct GiveUp;

type Read<T> = Result<T, GiveUp>;

/// Every document of `text`, or `None` when serde-saphyr must read the file.
pub(super) fn parse(text: &str) -> Option<Vec<ParsedDocument>> {
    Reader::new(text).documents().ok()
}

struct Reader<'a> {
    parser: Parser<'a, StrInput<'a>>,
    /// What serde-saphyr's budget counts, counted the same way or more: reaching a limit here
    /// hands the file to serde-saphyr, which reports it if its own count reaches it too.
    events: usize,
    nodes: usize,
    scalar_bytes: usize,
    depth: usize,
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Self {
        // The options serde-saphyr's `Budget::parser_options` gives its parser for our budget,
        // so that both parsers accept the same texts.
        let block_nesting_limit = granit_parser::Options::default()
            .block_nesting_limit
            .max(MAX_DEPTH + 1);
        let options = granit_parser::options! {
            simple_key_max_lookahead: 1024,
            flow_nesting_limit: MAX_DEPTH,
            block_nesting_limit: block_nesting_limit,
            emit_comments: false,
        };
        Reader {
            parser: Parser::new_from_str_with_options(text, options),
            events: 0,
            nodes: 0,
            scalar_bytes: 0,
            depth: 0,
        }
    }

    fn next(&mut self) -> Read<(Event<'a>, Span)> {
        let (event, span) = self.parser.next().ok_or(GiveUp)?.map_err(|_| GiveUp)?;
        self.events += 1;
        if self.events > MAX_EVENTS {
            return Err(GiveUp);
        }
        Ok((event, span))
    }

    fn documents(mut self) -> Read<Vec<ParsedDocument>> {
        let Event::StreamStart = self.next()?.0 else {
            return Err(GiveUp);
        };
        let mut docs = Vec::new();
        let mut count = 0;
        loop {
            match self.next()?.0 {
                Event::StreamEnd => return Ok(docs),
                // A `%YAML` directive is left to serde-saphyr, whatever it makes of the version.
                Event::DocumentStart(_, None) => {}
                _ => return Err(GiveUp),
            }
            count += 1;
            if count > MAX_DOCUMENTS {
                return Err(GiveUp);
            }
            let mut spans = SpanIndex::default();
            let (event, span) = self.next()?;
            let value = self.node(event, &span, None, None, &mut spans)?;
            let Event::DocumentEnd = self.next()?.0 else {
                return Err(GiveUp);
            };
            if !value.is_null() {
                docs.push(ParsedDocument { value, spans });
            }
        }
    }

    /// The node that `event` starts, recorded in `spans` (the caller has appended its pointer
    /// segment), in the order and at the positions serde-saphyr's path records it.
    fn node(
        &mut self,
        event: Event<'a>,
        span: &Span,
        key: Option<Pos>,
        parent: Option<u32>,
        spans: &mut SpanIndex,
    ) -> Read<Value> {
        let me = spans.record(
            parent,
            NodePos {
                value: at(span),
                key,
            },
        );
        match event {
            Event::Scalar(text, style, 0, None) => {
                self.count_scalar(&text)?;
                match style {
                    ScalarStyle::Plain => plain_scalar(&text).ok_or(GiveUp),
                    _ => Ok(Value::String(text.into_owned())),
                }
            }
            Event::SequenceStart(_, 0, None) => {
                self.enter()?;
                let mut items = Vec::new();
                loop {
                    let (event, span) = self.next()?;
                    if let Event::SequenceEnd = event {
                        break;
                    }
                    // Writing to a `String` cannot fail.
                    let _ = write!(spans.segments, "{}", items.len());
                    items.push(self.node(event, &span, None, Some(me), spans)?);
                }
                self.depth -= 1;
                Ok(Value::Array(items))
            }
            Event::MappingStart(_, 0, None) => {
                self.enter()?;
                let mut entries = Map::new();
                loop {
                    let (event, span) = self.next()?;
                    let name = match event {
                        Event::MappingEnd => break,
                        Event::Scalar(name, style, 0, None) => {
                            self.count_scalar(&name)?;
                            // A plain key is read as text only when it could be nothing else
                            // (`<<` is a merge key, `~` a null key, `1` a number).
                            if style == ScalarStyle::Plain
                                && (name == "<<"
                                    || !matches!(plain_scalar(&name), Some(Value::String(_))))
                            {
                                return Err(GiveUp);
                            }
                            name.into_owned()
                        }
                        _ => return Err(GiveUp),
                    };
                    escape_into(&mut spans.segments, &name);
                    let (event, value_span) = self.next()?;
                    let value = self.node(event, &value_span, Some(at(&span)), Some(me), spans)?;
                    if entries.insert(name, value).is_some() {
                        return Err(GiveUp); // serde-saphyr reports the duplicate
                    }
                }
                self.depth -= 1;
                Ok(Value::Object(entries))
            }
            _ => Err(GiveUp),
        }
    }

    fn count_scalar(&mut self, text: &str) -> Read<()> {
        self.nodes += 1;
        self.scalar_bytes += text.len();
        if self.nodes > MAX_NODES || self.scalar_bytes > MAX_SCALAR_BYTES {
            return Err(GiveUp);
        }
        Ok(())
    }

    fn enter(&mut self) -> Read<()> {
        self.nodes += 1;
        self.depth += 1;
        if self.nodes > MAX_NODES || self.depth >= MAX_DEPTH {
            return Err(GiveUp);
        }
        Ok(())
    }
}

/// Where serde-saphyr places a node: its event's first character (`location_from_span`).
fn at(span: &Span) -> Pos {
    Pos {
        line: u32::try_from(span.start.line()).unwrap_or(u32::MAX).max(1),
        column: u32::try_from(span.start.col() + 1)
            .unwrap_or(u32::MAX)
            .max(1),
    }
}

/// An untagged plain scalar as serde-saphyr's `deserialize_any` reads it with our options
/// (YAML 1.2 core schema, strict booleans), for the spellings whose reading is certain;
/// `None` for the rest (`0x1f`, `1e3`, `007`, `.inf`, `+1`, ...).
fn plain_scalar(text: &str) -> Option<Value> {
    let bytes = text.as_bytes();
    let first = *bytes.first().unwrap_or(&b' ');
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Some(Value::Null),
        "true" | "True" | "TRUE" => return Some(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Some(Value::Bool(false)),
        _ => {}
    }
    if first.is_ascii_alphabetic() {
        // Rust's float parser reads these; serde-saphyr 2.1 keeps them as text, a choice this
        // path leaves to it rather than copy.
        let non_finite = ["inf", "infinity", "nan"]
            .iter()
            .any(|word| text.eq_ignore_ascii_case(word));
        return (!non_finite).then(|| Value::String(text.to_owned()));
    }
    let (negative, magnitude) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = match magnitude.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (magnitude, None),
    };
    let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    // No redundant leading zero: serde-saphyr reads `007` as a float and `-0` is ambiguous.
    let canonical = decimal(whole) && (whole == "0" || !whole.starts_with('0'));
    match fraction {
        None if canonical && !negative => return text.parse::<u64>().ok().map(Value::from),
        None if canonical && whole != "0" => return text.parse::<i64>().ok().map(Value::from),
        Some(f) if canonical && decimal(f) => {
            let v = text.parse::<f64>().ok()?;
            return Number::from_f64(v).map(Value::Number);
        }
        _ => {}
    }
    // Text that starts with a digit and holds a character no YAML number can (`2Ti`, `64Gi`,
    // `1g.10gb`): integers in any radix, floats with exponents and sexagesimal spellings are
    // all made of the characters below.
    let numeric = |b: u8| b.is_ascii_hexdigit() || b"+-._:xXoO".contains(&b);
    let proven_text = first.is_ascii_digit()
        && bytes
            .iter()
            .any(|&b| !numeric(b) && !b.is_ascii_whitespace() && b.is_ascii_graphic());
    proven_text.then(|| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use proptest::prelude::*;

    use super::*;

    /// The full path's reading of `text`, or `None` when it rejects it.
    fn full(text: &str) -> Option<Vec<ParsedDocument>> {
        super::super::parse_with_serde_saphyr("t.yaml", text).ok()
    }

    fn positions(doc: &ParsedDocument) -> &HashMap<String, NodePos> {
        doc.spans.by_pointer()
    }

    /// Asserts the fast path either gives `text` up or reads it exactly as serde-saphyr does;
    /// true when it read it.
    fn agrees(what: &str, text: &str) -> bool {
        let Some(fast) = parse(text) else {
            return false;
        };
        let Some(full) = full(text) else {
            panic!("{what}: the fast path accepted a text serde-saphyr rejects:\n{text}");
        };
        assert_eq!(fast.len(), full.len(), "{what}: documents");
        for (f, s) in fast.iter().zip(&full) {
            assert_eq!(f.value, s.value, "{what}: values\n{text}");
            assert_eq!(f.spans.count, s.spans.count, "{what}: nodes recorded");
            assert_eq!(positions(f), positions(s), "{what}: positions\n{text}");
        }
        true
    }

    fn yaml_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    yaml_files(&path, out);
                }
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                out.push(path);
            }
        }
    }

    #[test]
    fn the_fast_path_reads_what_serde_saphyr_reads() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        yaml_files(&root, &mut files);
        let mut read = 0;
        for path in &files {
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            read += usize::from(agrees(&path.display().to_string(), &text));
        }
        // Not vacuous: the repository's policies, examples and fixtures are mostly plain YAML.
        assert!(files.len() > 50, "{} YAML files found", files.len());
        assert!(
            read * 2 > files.len(),
            "the fast path read {read} of {} files",
            files.len()
        );
    }

    /// Scalars on the edges of YAML 1.2's types, in value and key positions, plain, quoted and
    /// in flow and block collections.
    const SCALARS: &[&str] = &[
        "",
        "~",
        "null",
        "Null",
        "NULL",
        "nULL",
        "true",
        "True",
        "TRUE",
        "tRUE",
        "false",
        "yes",
        "no",
        "on",
        "off",
        "y",
        "n",
        "inf",
        "Inf",
        "-inf",
        ".inf",
        "-.inf",
        ".NaN",
        "nan",
        "infinity",
        "0",
        "-0",
        "00",
        "007",
        "-007",
        "1",
        "-1",
        "+1",
        "42",
        "1_000",
        "0x1f",
        "0X1F",
        "0o17",
        "0b101",
        "0.5",
        "-0.5",
        "1.",
        ".5",
        "1.0e3",
        "1e3",
        "1E-3",
        "12:30",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        "-9223372036854775809",
        "3.14159",
        "2Ti",
        "64Gi",
        "500m",
        "1g.10gb",
        "1g",
        "1x",
        "0x",
        "0xg",
        "1 2",
        "2026-11-20",
        "2026-11-20T08:00:00Z",
        "a b",
        "é",
        "<<",
        "-",
        "-a",
        "_a",
        "a:b",
        "H100-SXM5-80GB",
        "GPU-a00010",
        "1e",
        "9e999",
        "0.1e1",
    ];

    #[test]
    fn scalars_on_the_edges_of_yaml_types_read_as_serde_saphyr_reads_them() {
        let mut read = 0;
        for s in SCALARS {
            let quoted = format!("\"{s}\"");
            for text in [
                format!("a: {s}\n"),
                format!("{s}: 1\n"),
                format!("a: [{s}, x]\n"),
                format!("a: {{k: {s}}}\n"),
                format!("- {s}\n- {quoted}\n"),
                format!("{quoted}: {quoted}\n"),
                format!("'{s}': '{s}'\n"),
            ] {
                read += usize::from(agrees(s, &text));
            }
        }
        assert!(read > SCALARS.len() * 3, "read {read}");
    }

    /// A YAML tree to render, from the table's scalars and short random ones.
    #[derive(Debug, Clone)]
    enum Tree {
        Scalar(String),
        Seq(Vec<Tree>),
        Map(Vec<(String, Tree)>),
    }

    fn tree() -> impl Strategy<Value = Tree> {
        let scalar = prop_oneof![
            proptest::sample::select(SCALARS).prop_map(str::to_owned),
            "[a-zA-Z0-9._:+~-]{0,6}",
        ];
        scalar
            .prop_map(Tree::Scalar)
            .prop_recursive(4, 40, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4).prop_map(Tree::Seq),
                    // Few key names, so that some mappings repeat a key.
                    proptest::collection::vec(("[a-c0-1~]{0,2}", inner), 0..4).prop_map(Tree::Map),
                ]
            })
    }

    fn flow(t: &Tree, out: &mut String) {
        match t {
            Tree::Scalar(s) => out.push_str(s),
            Tree::Seq(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    out.push_str(if i > 0 { ", " } else { "" });
                    flow(item, out);
                }
                out.push(']');
            }
            Tree::Map(entries) => {
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    out.push_str(if i > 0 { ", " } else { "" });
                    out.push_str(k);
                    out.push_str(": ");
                    flow(v, out);
                }
                out.push('}');
            }
        }
    }

    /// `t` as the block value that follows `- ` or `key:` (or the document's root).
    fn block(t: &Tree, indent: usize, out: &mut String) {
        let empty = |t: &Tree| match t {
            Tree::Scalar(_) => true,
            Tree::Seq(v) => v.is_empty(),
            Tree::Map(v) => v.is_empty(),
        };
        let item = |head: &str, v: &Tree, out: &mut String| {
            out.push_str(&" ".repeat(indent));
            out.push_str(head);
            if empty(v) {
                out.push(' ');
                flow(v, out);
                out.push('\n');
            } else {
                out.push('\n');
                block(v, indent + 2, out);
            }
        };
        match t {
            Tree::Scalar(_) => {
                flow(t, out);
                out.push('\n');
            }
            Tree::Seq(items) if !items.is_empty() => items.iter().for_each(|v| item("-", v, out)),
            Tree::Map(entries) if !entries.is_empty() => entries
                .iter()
                .for_each(|(k, v)| item(&format!("{k}:"), v, out)),
            _ => {
                flow(t, out);
                out.push('\n');
            }
        }
    }

    proptest! {
        /// Random trees in block and in flow style: whatever the fast path reads, it reads as
        /// serde-saphyr does (duplicate keys, odd scalars and broken flow text included).
        #[test]
        fn random_documents_read_as_serde_saphyr_reads_them(t in tree()) {
            let mut text = String::new();
            block(&t, 0, &mut text);
            agrees("block", &text);
            let mut text = String::from("root: ");
            flow(&t, &mut text);
            text.push('\n');
            agrees("flow", &text);
        }
    }

    #[test]
    fn what_the_fast_path_leaves_to_serde_saphyr() {
        for text in [
            "a: &x 1\nb: *x\n",
            "a: !!str 1\n",
            "base: {x: 1}\nc:\n  <<: {x: 2}\n",
            "a: 1\na: 2\n",
            "a: [1\n",
            "? [a, b]\n: c\n",
            "a: 1e3\n",
            "%YAML 1.1\n---\na: yes\n",
        ] {
            assert!(parse(text).is_none(), "{text}");
            agrees(text, text);
        }
    }

    #[test]
    fn structure_reads_the_same() {
        for text in [
            "",
            "# only a comment\n",
            "---\n",
            "---\n...\n",
            "a: 1\n---\nb: 2\n",
            "---\n---\na: 1\n",
            "x\n",
            "a:\nb:\n  - c:\n    d: e\n",
            "a: |\n  text\n  more\nb: >-\n  folded\n  text\n",
            "a: {}\nb: []\nc: [{}, []]\n",
            "a:\n- 1\n- - 2\n  - 3\n",
            "a: plain\n  continued\n",
            "k: \"esc\\n\\t\\u00e9\"\n",
            "a/b: {c~d: [1, 2]}\n",
        ] {
            assert!(agrees(text, text), "the fast path gave up on {text:?}");
        }
    }
}
