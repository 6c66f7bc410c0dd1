//! What a hostile or careless repository cannot do to the compiler: overflow its stack with a
//! deep tenant chain, make it quadratic with a long cycle, or make it compile without end.
//! Each test asserts the outcome, never the time it took.

use std::fmt::Write as _;

use tessera_compiler::{Code, Compilation, SourceFile, compile};

fn tenant(name: &str, parent: Option<&str>) -> String {
    let mut doc = format!(
        "---\napiVersion: tessera/v1alpha1\nkind: Tenant\nmetadata: {{name: {name}}}\nspec:"
    );
    match parent {
        Some(p) => {
            let _ = write!(doc, "\n  parent: {p}\n");
        }
        None => doc.push_str(" {}\n"),
    }
    doc
}

/// `t0` at the root and `t1` … `t{levels-1}` each the child of the one before.
fn chain(levels: usize) -> Vec<SourceFile> {
    let mut text = tenant("t0", None);
    for i in 1..levels {
        text.push_str(&tenant(&format!("t{i}"), Some(&format!("t{}", i - 1))));
    }
    vec![SourceFile::new("chain.yaml", text)]
}

fn codes(c: &Compilation) -> Vec<Code> {
    c.diagnostics.iter().map(|d| d.code).collect()
}

#[test]
fn a_chain_at_the_depth_limit_compiles() {
    let c = compile(&chain(64));
    assert_eq!(codes(&c), vec![], "{:?}", c.diagnostics);
    let policy = c.policy.expect("a policy");
    assert_eq!(policy.tenants.len(), 64);
    let deepest = policy.tenants.iter().find(|t| t.name == "t63").unwrap();
    assert_eq!(deepest.path.len(), 64);
}

#[test]
fn deep_chains_are_refused_once_at_the_first_tenant_too_deep() {
    for levels in [65, 1_500, 10_000] {
        let c = compile(&chain(levels));
        assert_eq!(codes(&c), vec![Code::TenantTreeTooDeep], "{levels} levels");
        let d = &c.diagnostics[0];
        assert!(
            d.message.contains("tenant `t64` is at level 65"),
            "{}",
            d.message
        );
        assert_eq!(d.location.as_ref().unwrap().line, 64 * 6 + 5);
        assert!(c.policy.is_none());
    }
}

#[test]
fn a_long_cycle_is_reported_once_at_its_smallest_member() {
    // `t0` is the root; t1 … t1999 form one cycle (t1's parent is the last).
    let n = 2_000;
    let mut text = tenant("t0", None);
    text.push_str(&tenant("t1", Some(&format!("t{}", n - 1))));
    for i in 2..n {
        text.push_str(&tenant(&format!("t{i}"), Some(&format!("t{}", i - 1))));
    }
    let c = compile(&[SourceFile::new("cycle.yaml", text)]);
    assert_eq!(codes(&c), vec![Code::TenantCycle]);
    let message = &c.diagnostics[0].message;
    // Read from the smallest name (`t1`) along parent links: t1 → t1999 → t1998 → … → t1.
    assert!(
        message.starts_with("tenants form a cycle: t1 → t1999 → t1998 → "),
        "{}",
        &message[..80]
    );
    assert!(message.ends_with("→ t2 → t1"));
    assert_eq!(message.matches('→').count(), n - 1);
}

#[test]
fn tenants_hanging_below_a_cycle_are_not_reported_with_it() {
    let mut text = tenant("root", None);
    text.push_str(&tenant("a", Some("b")));
    text.push_str(&tenant("b", Some("a")));
    text.push_str(&tenant("c", Some("a")));
    text.push_str(&tenant("d", Some("c")));
    let c = compile(&[SourceFile::new("t.yaml", text)]);
    assert_eq!(codes(&c), vec![Code::TenantCycle]);
    assert_eq!(c.diagnostics[0].message, "tenants form a cycle: a → b → a");
}

#[test]
fn too_many_documents_stop_the_compilation_with_one_diagnostic() {
    let limit = tessera_compiler::MAX_DOCUMENTS;
    // Empty documents: the cap is checked before any document is loaded.
    let text = "--- {}\n".repeat(limit + 1);
    let c = compile(&[
        SourceFile::new("a.yaml", tenant("first", None)),
        SourceFile::new("b.yaml", text),
    ]);
    assert_eq!(codes(&c), vec![Code::InputTooLarge], "{:?}", c.diagnostics);
    assert!(
        c.diagnostics[0].message.contains(&format!(
            "more than {limit} documents; those from b.yaml on"
        )),
        "{}",
        c.diagnostics[0].message
    );
    assert!(c.policy.is_none());
}
