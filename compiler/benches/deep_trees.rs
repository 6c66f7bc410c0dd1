//! Compile time of tenant trees a repository writer can make pathological: a long chain, a long
//! cycle, and a wide tree. A figure to read, never an assertion:
//! `cargo bench -p tessera-compiler --bench deep_trees` (add `-- N...` for other sizes).

// The production binaries' allocator, so that the figures describe what users run.
#[global_allocator]
static ALLOCATOR: tessera_alloc::Allocator = tessera_alloc::Allocator;

use std::fmt::Write as _;
use std::time::Instant;

use tessera_compiler::{SourceFile, compile};

fn tenant(out: &mut String, name: &str, parent: Option<&str>) {
    let _ = write!(
        out,
        "---\napiVersion: tessera/v1alpha1\nkind: Tenant\nmetadata: {{name: {name}}}\nspec:"
    );
    match parent {
        Some(p) => {
            let _ = writeln!(out, "\n  parent: {p}");
        }
        None => out.push_str(" {}\n"),
    }
}

/// `t0` the root, each `t{i}` the child of `t{i-1}`.
fn chain(n: usize) -> String {
    let mut s = String::new();
    tenant(&mut s, "t0", None);
    for i in 1..n {
        tenant(&mut s, &format!("t{i}"), Some(&format!("t{}", i - 1)));
    }
    s
}

/// `root`, and `c0` … `c{n-1}` in one cycle.
fn cycle(n: usize) -> String {
    let mut s = String::new();
    tenant(&mut s, "root", None);
    for i in 0..n {
        tenant(&mut s, &format!("c{i}"), Some(&format!("c{}", (i + 1) % n)));
    }
    s
}

/// `root` with `n` children.
fn wide(n: usize) -> String {
    let mut s = String::new();
    tenant(&mut s, "root", None);
    for i in 0..n {
        tenant(&mut s, &format!("w{i}"), Some("root"));
    }
    s
}

fn time(label: &str, text: String) {
    let files = [SourceFile::new("t.yaml", text)];
    let start = Instant::now();
    let c = compile(&files);
    println!(
        "  {label:<22} {:>8.3} s   ({} documents, {} diagnostics)",
        start.elapsed().as_secs_f64(),
        c.documents,
        c.diagnostics.len()
    );
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 2_000, 3_000, 10_000]
    } else {
        sizes
    };
    println!("deep_trees: compile() of one file, wall time");
    for n in sizes {
        time(&format!("chain of {n}"), chain(n));
        time(&format!("cycle of {n}"), cycle(n));
        time(&format!("{n} children of a root"), wide(n));
    }
}
