//! YAML with a position for every node.
//!
//! serde-saphyr parses with hard budgets (aliases, depth, node count) and rejects duplicate keys;
//! each document becomes a `serde_json::Value` for schema validation plus a [`SpanIndex`] that
//! maps every JSON pointer in it back to a line and column. Files in the plain part of YAML
//! (most policy files, and a fleet's snapshot) are read straight from the parser's events by
//! `plain`, which gives any other file back to serde-saphyr.

mod plain;

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::OnceLock;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_saphyr::{Budget, DuplicateKeyPolicy, Options, Spanned};

use crate::diagnostic::{Code, Diagnostic, Location};

/// Line and column, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

impl Pos {
    fn of(loc: &serde_saphyr::Location) -> Pos {
        Pos {
            line: u32::try_from(loc.line()).unwrap_or(u32::MAX).max(1),
            column: u32::try_from(loc.column()).unwrap_or(u32::MAX).max(1),
        }
    }
}

/// Where a node of a document is: its value, and the key that names it in its mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePos {
    pub value: Pos,
    pub key: Option<Pos>,
}

/// JSON pointer (RFC 6901, as jsonschema reports instance paths) to position.
///
/// Recorded as a tree while the document is lowered (each node's parent and last pointer
/// segment) and indexed by pointer on the first lookup. Lookups happen only for diagnostics,
/// while a fleet's snapshot has millions of nodes: building and hashing every node's pointer
/// eagerly cost more than parsing the YAML.
#[derive(Debug, Clone, Default)]
pub struct SpanIndex {
    /// Every node in the order it was lowered, parents before children, in chunks of
    /// [`CHUNK`]: a large fleet's snapshot records millions, and one vector doubling to hold
    /// them copied every entry again at each doubling, into memory the kernel zeroed first.
    nodes: Vec<Vec<Recorded>>,
    /// How many nodes are recorded.
    count: usize,
    /// Each node's last pointer segment, escaped, one after the other in `nodes`' order.
    segments: String,
    by_pointer: OnceLock<HashMap<String, NodePos>>,
}

/// Nodes per chunk of [`SpanIndex::nodes`] (640 kB of them); a chunk's own growth up to it is
/// what a small document pays.
const CHUNK: usize = 1 << 14;

#[derive(Debug, Clone, Copy)]
struct Recorded {
    /// Index of the parent in [`SpanIndex::nodes`]; `None` for the document's root.
    parent: Option<u32>,
    /// Where this node's segment ends in [`SpanIndex::segments`] (it starts where the
    /// previous node's ends).
    segment_end: usize,
    pos: NodePos,
}

impl SpanIndex {
    /// The node at `pointer`, or the nearest ancestor that exists (a missing field is reported
    /// at the mapping that lacks it).
    pub fn lookup(&self, pointer: &str) -> NodePos {
        let nodes = self.by_pointer();
        let mut p = pointer;
        loop {
            if let Some(pos) = nodes.get(p) {
                return *pos;
            }
            match p.rfind('/') {
                Some(i) => p = &p[..i],
                None => {
                    return nodes.get("").copied().unwrap_or(NodePos {
                        value: Pos { line: 1, column: 1 },
                        key: None,
                    });
                }
            }
        }
    }

    /// The key's position when there is one (better for "this field is wrong"), else the value's.
    pub fn key_or_value(&self, pointer: &str) -> Pos {
        let node = self.lookup(pointer);
        node.key.unwrap_or(node.value)
    }

    pub fn value(&self, pointer: &str) -> Pos {
        self.lookup(pointer).value
    }

    /// Records the node whose segment was just appended to `segments`; its index.
    fn record(&mut self, parent: Option<u32>, pos: NodePos) -> u32 {
        let recorded = Recorded {
            parent,
            segment_end: self.segments.len(),
            pos,
        };
        match self.nodes.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(recorded),
            last => {
                // The first chunk grows as a vector does; the others are allocated whole.
                let mut chunk = Vec::with_capacity(if last.is_some() { CHUNK } else { 0 });
                chunk.push(recorded);
                self.nodes.push(chunk);
            }
        }
        self.count += 1;
        // `parse`'s budget bounds a file to millions of nodes, far from `u32::MAX`.
        u32::try_from(self.count - 1).unwrap_or(u32::MAX)
    }

    fn by_pointer(&self) -> &HashMap<String, NodePos> {
        self.by_pointer.get_or_init(|| {
            let mut pointers: Vec<String> = Vec::with_capacity(self.count);
            let mut start = 0;
            for r in self.nodes.iter().flatten() {
                let segment = &self.segments[start..r.segment_end];
                start = r.segment_end;
                pointers.push(match r.parent.and_then(|i| pointers.get(i as usize)) {
                    Some(parent) => format!("{parent}/{segment}"),
                    None => String::new(),
                });
            }
            pointers
                .into_iter()
                .zip(self.nodes.iter().flatten())
                .map(|(pointer, r)| (pointer, r.pos))
                .collect()
        })
    }
}

/// One document of a file, ready for validation.
#[derive(Debug, Clone)]
pub struct ParsedDocument {
    pub value: Value,
    pub spans: SpanIndex,
}

/// Escapes one JSON pointer segment.
pub fn escape(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    escape_into(&mut out, segment);
    out
}

fn escape_into(out: &mut String, segment: &str) {
    for c in segment.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
}

/// The policy language nests a dozen levels at most; 48 leaves room for free-form annotations.
const MAX_DEPTH: usize = 48;
/// Nodes that alias expansion may produce in one file.
const MAX_ALIAS_EVENTS: usize = 100_000;
/// Nodes (scalars, sequences and mappings), parser events and documents in one file.
const MAX_NODES: usize = 4_000_000;
const MAX_EVENTS: usize = 8_000_000;
const MAX_DOCUMENTS: usize = 100_000;

/// Bounds on what one file may make the parser do. Generous for real fleets (the acme example
/// snapshot of 4,000 GPUs uses a few percent), tight enough that an alias bomb or a
/// ten-thousand-deep nesting fails in milliseconds.
fn options() -> Options {
    let mut budget = Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.flow_nesting_limit = MAX_DEPTH;
    budget.max_aliases = 10_000;
    budget.max_anchors = 10_000;
    budget.max_nodes = MAX_NODES;
    budget.max_events = MAX_EVENTS;
    budget.max_documents = MAX_DOCUMENTS;
    let mut options = Options::default();
    options.budget = Some(budget);
    options.duplicate_keys = DuplicateKeyPolicy::Error;
    options.strict_booleans = true;
    options.alias_limits.max_total_replayed_events = MAX_ALIAS_EVENTS;
    options.alias_limits.max_replay_stack_depth = 16;
    options
}

/// Parses every document of `text`. A file that is not valid YAML yields one diagnostic and no
/// documents: its other documents cannot be trusted to be what the author meant either.
pub fn parse(file: &str, text: &str) -> Result<Vec<ParsedDocument>, Diagnostic> {
    match plain::parse(text) {
        Some(docs) => Ok(docs),
        None => parse_with_serde_saphyr(file, text),
    }
}

/// [`parse`] through serde-saphyr's deserializer: any YAML, and every diagnostic.
fn parse_with_serde_saphyr(file: &str, text: &str) -> Result<Vec<ParsedDocument>, Diagnostic> {
    let nodes: Vec<Spanned<Node>> = serde_saphyr::from_str_multiple_with_options(text, options())
        .map_err(|e| parse_error(file, &e))?;
    let mut docs = Vec::with_capacity(nodes.len());
    for node in nodes {
        let mut spans = SpanIndex::default();
        let value = lower(node, None, None, &mut spans).map_err(|(pos, message)| {
            Diagnostic::new(Code::InvalidValue, message).at(Some(Location {
                file: file.to_owned(),
                line: pos.line,
                column: pos.column,
            }))
        })?;
        if value.is_null() {
            continue; // an empty document (`---` alone) is no document
        }
        docs.push(ParsedDocument { value, spans });
    }
    Ok(docs)
}

fn parse_error(file: &str, e: &serde_saphyr::Error) -> Diagnostic {
    let location = e.location().map(|l| {
        let p = Pos::of(&l);
        Location {
            file: file.to_owned(),
            line: p.line,
            column: p.column,
        }
    });
    let full = e.without_snippet().to_string();
    let first = full.lines().next().unwrap_or("").trim();
    let first = first.strip_prefix("error:").unwrap_or(first).trim();
    // "line 3 column 1: message" repeats what the location says.
    let message = match first.split_once(": ") {
        Some((head, rest)) if head.starts_with("line ") => rest,
        _ => first,
    };
    // "... at line 5, column 2" repeats the location the diagnostic carries.
    let message = match message.rfind(" at line ") {
        Some(i) if message[i..].contains("column") && !message[i..].contains('(') => &message[..i],
        _ => message,
    };
    let (code, message, help) = match root_cause(e) {
        serde_saphyr::Error::DuplicateMappingKey { key, .. } => (
            Code::DuplicateKey,
            match key {
                Some(k) => format!("duplicate key `{k}` in one mapping"),
                None => "duplicate key in one mapping".to_owned(),
            },
            "remove or rename one of the two entries; YAML keeps only one of them".to_owned(),
        ),
        serde_saphyr::Error::Budget { breach, .. } => (
            Code::InputTooLarge,
            match breach {
                serde_saphyr::budget::BudgetBreach::Depth { .. } => {
                    format!("the YAML nests deeper than {MAX_DEPTH} levels")
                }
                other => format!("the file exceeds a parser limit: {other:?}"),
            },
            TOO_LARGE_HELP.to_owned(),
        ),
        serde_saphyr::Error::ExternalMessage { source, .. }
            if matches!(
                source.as_ref(),
                serde_saphyr::ExternalMessageSource::Parser(scan)
                    if matches!(scan.kind(), serde_saphyr::granit_parser::ErrorKind::RecursionLimitExceeded)
            ) =>
        {
            (
                Code::InputTooLarge,
                format!("the YAML nests deeper than {MAX_DEPTH} levels"),
                TOO_LARGE_HELP.to_owned(),
            )
        }
        serde_saphyr::Error::AliasReplayLimitExceeded { .. }
        | serde_saphyr::Error::AliasExpansionLimitExceeded { .. }
        | serde_saphyr::Error::AliasReplayStackDepthExceeded { .. }
        | serde_saphyr::Error::AliasReplayCounterOverflow { .. } => (
            Code::InputTooLarge,
            format!("aliases expand to more than {MAX_ALIAS_EVENTS} nodes (an alias bomb?)"),
            TOO_LARGE_HELP.to_owned(),
        ),
        _ => (
            Code::YamlSyntax,
            format!("invalid YAML: {message}"),
            "check indentation, quoting and that every `key:` is followed by a value".to_owned(),
        ),
    };
    Diagnostic::new(code, message).at(location).help(help)
}

const TOO_LARGE_HELP: &str =
    "policy files need no deep nesting or alias expansion; split the file or write the values out";

/// The error under serde-saphyr's snippet and alias-location wrappers.
fn root_cause(mut e: &serde_saphyr::Error) -> &serde_saphyr::Error {
    loop {
        match e {
            serde_saphyr::Error::WithSnippet { error, .. }
            | serde_saphyr::Error::AliasError { error, .. } => e = error,
            other => return other,
        }
    }
}

/// Converts the span-carrying tree to JSON, recording every node's position. The caller has
/// appended the node's pointer segment to `spans.segments`; `parent` is its parent's index.
fn lower(
    node: Spanned<Node>,
    key: Option<Pos>,
    parent: Option<u32>,
    spans: &mut SpanIndex,
) -> Result<Value, (Pos, String)> {
    let pos = Pos::of(&node.referenced);
    let me = spans.record(parent, NodePos { value: pos, key });
    Ok(match node.value {
        Node::Null => Value::Null,
        Node::Bool(b) => Value::Bool(b),
        Node::Int(i) => Value::from(i),
        Node::UInt(u) => Value::from(u),
        Node::Float(f) => match serde_json::Number::from_f64(f) {
            Some(n) => Value::Number(n),
            None => return Err((pos, format!("{f} is not a finite number"))),
        },
        Node::Str(s) => Value::String(s),
        Node::Seq(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                // Writing to a `String` cannot fail.
                let _ = write!(spans.segments, "{i}");
                out.push(lower(item, None, Some(me), spans)?);
            }
            Value::Array(out)
        }
        Node::Map(entries) => {
            let mut out = serde_json::Map::with_capacity(entries.len());
            for (k, v) in entries {
                escape_into(&mut spans.segments, &k.value);
                let value = lower(v, Some(Pos::of(&k.referenced)), Some(me), spans)?;
                out.insert(k.value, value);
            }
            Value::Object(out)
        }
    })
}

/// Any YAML node, with children that carry their positions.
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<String>, Spanned<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::UInt(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
        Err(E::custom(
            "binary values are not part of the policy language",
        ))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
        let mut items = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = a.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
        let mut entries = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1024));
        while let Some(entry) = a.next_entry()? {
            entries.push(entry);
        }
        Ok(Node::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_has_a_position() {
        let docs = parse(
            "t.yaml",
            "kind: Tenant\nspec:\n  guarantee: {a: 1}\n  list: [x, y]\n---\nkind: Pool\n",
        )
        .unwrap();
        assert_eq!(docs.len(), 2);
        let s = &docs[0].spans;
        assert_eq!(
            s.value("/spec/guarantee/a"),
            Pos {
                line: 3,
                column: 18
            }
        );
        assert_eq!(
            s.key_or_value("/spec/guarantee"),
            Pos { line: 3, column: 3 }
        );
        assert_eq!(
            s.value("/spec/list/1"),
            Pos {
                line: 4,
                column: 13
            }
        );
        // A missing node resolves to its nearest ancestor.
        assert_eq!(s.value("/spec/nope/deeper"), Pos { line: 3, column: 3 });
        assert_eq!(
            docs[1].spans.key_or_value("/kind"),
            Pos { line: 6, column: 1 }
        );
    }

    #[test]
    fn nodes_past_the_first_chunks_are_found() {
        // Three nodes per item (the item, `name`, `gpus`) and the root and `items`: the last
        // items are recorded chunks after the first.
        let items = 3 * CHUNK / 2;
        let mut text = String::from("items:\n");
        for i in 0..items {
            let _ = writeln!(text, "  - {{name: w-{i}, gpus: {i}}}");
        }
        let docs = parse("big.yaml", &text).unwrap();
        let s = &docs[0].spans;
        assert!(s.count > 2 * CHUNK, "{} nodes", s.count);
        for i in [0, CHUNK / 3, CHUNK, items - 1] {
            let line = u32::try_from(i + 2).unwrap();
            assert_eq!(s.value(&format!("/items/{i}")), Pos { line, column: 5 });
            assert_eq!(
                s.key_or_value(&format!("/items/{i}/gpus")),
                Pos {
                    line,
                    column: u32::try_from(16 + i.to_string().len()).unwrap()
                }
            );
        }
    }

    #[test]
    fn keys_with_pointer_characters_are_found_escaped() {
        let docs = parse("e.yaml", "a/b:\n  c~d: [1, 2]\n").unwrap();
        let s = &docs[0].spans;
        assert_eq!(
            s.value("/a~1b/c~0d/1"),
            Pos {
                line: 2,
                column: 12
            }
        );
        assert_eq!(s.key_or_value("/a~1b/c~0d"), Pos { line: 2, column: 3 });
        assert_eq!(s.key_or_value("/a~1b"), Pos { line: 1, column: 1 });
        // Unescaped, the same characters name nothing: the nearest ancestor is the root.
        assert_eq!(s.value("/a/b"), Pos { line: 1, column: 1 });
    }

    #[test]
    fn duplicate_keys_are_rejected_at_the_second_key() {
        let e = parse("d.yaml", "a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(e.code, Code::DuplicateKey);
        assert_eq!(e.location.unwrap().line, 3);
    }

    #[test]
    fn yes_and_no_stay_strings() {
        let docs = parse("b.yaml", "a: yes\nb: true\n").unwrap();
        assert_eq!(docs[0].value["a"], Value::String("yes".into()));
        assert_eq!(docs[0].value["b"], Value::Bool(true));
    }

    #[test]
    fn alias_bombs_fail_fast() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        // The budget refuses the expansion (a test never judges how long it took).
        let e = parse("bomb.yaml", &text).unwrap_err();
        assert_eq!(e.code, Code::InputTooLarge, "{e:?}");
    }

    #[test]
    fn an_undefined_alias_is_a_syntax_error_not_an_alias_bomb() {
        let e = parse("a.yaml", "a: *nope\n").unwrap_err();
        assert_eq!(e.code, Code::YamlSyntax, "{e:?}");
    }

    #[test]
    fn deep_nesting_fails_cleanly() {
        let text = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
        let e = parse("deep.yaml", &text).unwrap_err();
        assert_eq!(e.code, Code::InputTooLarge, "{e:?}");
    }
}
