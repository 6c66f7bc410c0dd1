//! House rules a reviewer should not have to enforce by hand: no stale wording in the docs and
//! comments (a promise of work outlives the change that made it), README and CI
//! run the same test command, and every crate of the workspace is on ARCHITECTURE.md's code map.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Phrases that promise work instead of describing what is there, as words (punctuation
/// aside, across line breaks). Split so that this file does not match itself.
const STALE: &[&[&str]] = &[
    &["to", "come"],
    &["comes", "later"],
    &["come", "later"],
    &["is", "next"],
    &["are", "next"],
    &["and", "next"],
    &["for", "now"],
    &["TO", "DO"],
    &["FIX", "ME"],
];

/// The prose lines of a file: every line of Markdown, the comments of code and scripts, a
/// manifest's comments and descriptions.
fn prose(path: &Path, text: &str) -> Vec<(usize, String)> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let comment = |line: &str| -> Option<String> {
        let t = line.trim_start();
        match ext {
            "md" => Some(line.to_string()),
            "rs" => t.starts_with("//").then(|| t.to_string()),
            "toml" => (t.starts_with('#') || t.starts_with("description")).then(|| t.to_string()),
            "py" | "" | "sh" | "yml" | "yaml" => t.starts_with('#').then(|| t.to_string()),
            _ => None,
        }
    };
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| comment(l).map(|c| (i + 1, c)))
        .collect()
}

/// Where each stale phrase occurs in a file's prose: the line it starts on and the phrase.
fn stale_phrases(path: &Path, text: &str) -> Vec<(usize, String)> {
    let words: Vec<(usize, String)> = prose(path, text)
        .into_iter()
        .flat_map(|(line, prose)| {
            prose
                .split(|c: char| !(c.is_alphanumeric() || c == '\''))
                .filter(|w| !w.is_empty())
                .map(|w| (line, w.to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut found = Vec::new();
    for parts in STALE {
        let phrase: Vec<String> = if parts.iter().all(|p| p.chars().all(char::is_uppercase)) {
            vec![parts.concat()]
        } else {
            parts.iter().map(|p| p.to_string()).collect()
        };
        let exact = phrase.len() == 1;
        for window in words.windows(phrase.len()) {
            let matches = window.iter().zip(&phrase).all(|((_, w), p)| {
                if exact {
                    w == p
                } else {
                    w.eq_ignore_ascii_case(p)
                }
            });
            if matches {
                found.push((window[0].0, phrase.join(" ")));
            }
        }
    }
    found
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            // Build output, history, snapshots of program output and test inputs are not prose.
            if !matches!(name.as_str(), "target" | ".git" | "snapshots" | "data")
                && !name.starts_with(".tessera")
            {
                files(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn docs_and_comments_have_no_stale_wording() {
    let mut all = Vec::new();
    files(root(), &mut all);
    let mut found = Vec::new();
    for path in all {
        let rel = path
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel == "CHANGELOG.md" {
            // Released entries are history: they said what was true then.
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (line, phrase) in stale_phrases(&path, &text) {
            found.push(format!("{rel}:{line}: `{phrase}`"));
        }
    }
    assert!(
        found.is_empty(),
        "stale wording: say what is there, or file an issue for what is not:\n{}",
        found.join("\n")
    );
}

#[test]
fn stale_wording_is_found_across_lines_and_punctuation() {
    let md = Path::new("x.md");
    assert_eq!(
        stale_phrases(md, "the integer program is\nnext).\n"),
        vec![(1, "is next".to_string())]
    );
    let toml = Path::new("Cargo.toml");
    assert_eq!(
        stale_phrases(
            toml,
            "description = \"diffs (and, next, of decisions)\"\nname = \"x\"\n"
        ),
        vec![(1, "and next".to_string())]
    );
    // Code is not prose; a comment is.
    let rs = Path::new("x.rs");
    assert!(stale_phrases(rs, "let to_come = 1; // the next cycle\n").is_empty());
    assert_eq!(stale_phrases(rs, "// more to come\n").len(), 1);
}

/// The command after `cargo test` on the line that runs it, without comments.
fn test_commands(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| l.starts_with("cargo test"))
        .map(normalize)
        .collect()
}

#[test]
fn readme_and_ci_run_the_same_test_command() {
    let readme = test_commands(&read("README.md"));
    let ci = test_commands(&read(".ci/run"));
    assert_eq!(
        readme.len(),
        1,
        "the README names one test command: {readme:?}"
    );
    // CI may run more (the solver's tests on HiGHS), never less.
    assert!(
        ci.contains(&readme[0]),
        "CI runs what the README tells contributors to run: {readme:?} is not among {ci:?}"
    );
    assert!(
        readme[0].contains("--locked"),
        "tests run against the committed lockfile"
    );
}

#[test]
fn every_workspace_crate_is_on_the_code_map() {
    let manifest = read("Cargo.toml");
    let members = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("the root manifest lists the workspace members");
    let map = read("ARCHITECTURE.md");
    let mut missing = Vec::new();
    for member in members
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
    {
        let crate_manifest = read(&format!("{member}/Cargo.toml"));
        let name = crate_manifest
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|n| n.strip_suffix('"'))
            .unwrap_or_else(|| panic!("{member}/Cargo.toml names its package"));
        let dir = member.rsplit('/').next().unwrap();
        if !(map.contains(&format!("`{dir}/` (`{name}`"))
            || map.contains(&format!("`{member}/` (`{name}`")))
        {
            missing.push(format!("{member} ({name})"));
        }
    }
    assert!(
        map.contains("### `src/` (the `tessera` binary)"),
        "the binary has its section"
    );
    assert!(
        missing.is_empty(),
        "crates missing from ARCHITECTURE.md's code map (a `### `dir/` (`name`)` entry): {missing:?}"
    );
}

/// `rust-version` of the workspace, as `(major, minor)`.
fn version(text: &str) -> (u32, u32) {
    let mut parts = text.trim_matches('"').split('.');
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

fn declared_msrv() -> String {
    read("Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("the workspace declares rust-version")
        .trim_matches('"')
        .to_string()
}

/// CI cannot build with the declared MSRV itself (no other toolchain is reachable from it), so
/// what can be checked is: the README promises the same version, no locked dependency declares
/// a newer one, and clippy's `incompatible_msrv` (denied in CI) flags newer standard-library
/// APIs in our code.
#[test]
fn the_declared_msrv_is_the_readmes_and_covers_every_locked_dependency() {
    let msrv = declared_msrv();
    assert!(
        read("README.md").contains(&format!("Rust toolchain ({msrv} or newer)")),
        "README.md states the MSRV {msrv}"
    );
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(root())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let newer: Vec<String> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| {
            let needs = p["rust_version"].as_str()?;
            (version(needs) > version(&msrv))
                .then(|| format!("{} {} needs {needs}", p["name"], p["version"]))
        })
        .collect();
    assert!(
        newer.is_empty(),
        "dependencies that need a newer Rust than the declared {msrv}: {newer:?}"
    );
}
