//! Both readers against one table of trees: what the directory reader finds on disk, the Git
//! reader finds in a commit of the same tree. Plus what only a file system can hold (FIFOs,
//! devices) for the directory reader.

use std::collections::BTreeMap;
use std::path::Path;

use git2::{FileMode, Oid, Repository, Signature};
use tessera_source::{Limits, Loaded, Refusal, discover_with, git};

#[derive(Clone, Copy)]
enum Entry {
    File(&'static [u8]),
    Link(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Read(String),
    Refused(Refusal),
}

struct Case {
    name: &'static str,
    tree: Vec<(String, Entry)>,
    limits: Limits,
    expected: Vec<(String, Outcome)>,
}

fn read(path: &str, text: &str) -> (String, Outcome) {
    (path.to_owned(), Outcome::Read(text.to_owned()))
}

fn refused(path: &str, refusal: Refusal) -> (String, Outcome) {
    (path.to_owned(), Outcome::Refused(refusal))
}

fn tree(entries: &[(&str, Entry)]) -> Vec<(String, Entry)> {
    entries.iter().map(|(p, e)| (p.to_string(), *e)).collect()
}

fn cases() -> Vec<Case> {
    let deep = format!("{}x.yaml", "d/".repeat(400));
    vec![
        Case {
            name: "policy files in path order; hidden entries and other files skipped",
            tree: tree(&[
                ("b/c.yml", Entry::File(b"c")),
                ("a.yaml", Entry::File(b"a")),
                ("b/notes.txt", Entry::File(b"n")),
                (".github/ci.yaml", Entry::File(b"h")),
                (".local.yaml", Entry::File(b"h")),
                ("b.yaml/inner.yaml", Entry::File(b"i")),
            ]),
            limits: Limits::default(),
            expected: vec![
                read("a.yaml", "a"),
                // Component by component: `b` sorts before `b.yaml`.
                read("b/c.yml", "c"),
                read("b.yaml/inner.yaml", "i"),
            ],
        },
        Case {
            name: "a link named like policy is refused unread; other links are skipped",
            tree: tree(&[
                ("tokens.txt", Entry::File(b"operator-secret")),
                ("zz.yaml", Entry::Link("tokens.txt")),
                ("escape.yml", Entry::Link("/etc/passwd")),
                ("real/a.yaml", Entry::File(b"a")),
                ("alias", Entry::Link("real")),
            ]),
            limits: Limits::default(),
            expected: vec![
                refused("escape.yml", Refusal::Symlink),
                read("real/a.yaml", "a"),
                refused("zz.yaml", Refusal::Symlink),
            ],
        },
        Case {
            name: "text that is not UTF-8 is refused",
            tree: tree(&[("bad.yaml", Entry::File(b"\xff\xfe"))]),
            limits: Limits::default(),
            expected: vec![refused("bad.yaml", Refusal::NotUtf8)],
        },
        Case {
            name: "a file over its cap is refused and the rest still read",
            tree: tree(&[
                ("big.yaml", Entry::File(b"123456789")),
                ("small.yaml", Entry::File(b"1")),
            ]),
            limits: Limits {
                file_bytes: 8,
                ..Limits::default()
            },
            expected: vec![
                refused("big.yaml", Refusal::TooLarge { bytes: 9, limit: 8 }),
                read("small.yaml", "1"),
            ],
        },
        Case {
            name: "past the tree's byte cap nothing more is read",
            tree: tree(&[
                ("a.yaml", Entry::File(b"123456")),
                ("b.yaml", Entry::File(b"123456")),
                ("c.yaml", Entry::File(b"1")),
            ]),
            limits: Limits {
                tree_bytes: 10,
                ..Limits::default()
            },
            expected: vec![
                read("a.yaml", "123456"),
                refused("b.yaml", Refusal::TreeTooLarge { limit: 10 }),
            ],
        },
        Case {
            name: "past the tree's file cap nothing more is read",
            tree: tree(&[
                ("a.yaml", Entry::File(b"a")),
                ("b.yaml", Entry::File(b"b")),
                ("c.yaml", Entry::File(b"c")),
                ("d.yaml", Entry::File(b"d")),
            ]),
            limits: Limits {
                files: 2,
                ..Limits::default()
            },
            expected: vec![
                read("a.yaml", "a"),
                read("b.yaml", "b"),
                refused("c.yaml", Refusal::TooManyFiles { limit: 2 }),
            ],
        },
        Case {
            name: "directories nested hundreds deep are walked",
            tree: vec![(deep.clone(), Entry::File(b"x"))],
            limits: Limits::default(),
            expected: vec![read(&deep, "x")],
        },
    ]
}

fn outcomes(loaded: Vec<Loaded>, strip: &str) -> Vec<(String, Outcome)> {
    loaded
        .into_iter()
        .map(|l| match l {
            Loaded::File(f) => (
                f.path.strip_prefix(strip).unwrap_or(&f.path).to_owned(),
                Outcome::Read(f.text),
            ),
            Loaded::Refused { path, refusal } => (
                path.strip_prefix(strip).unwrap_or(&path).to_owned(),
                Outcome::Refused(refusal),
            ),
        })
        .collect()
}

fn on_disk(root: &Path, tree: &[(String, Entry)]) {
    for (path, entry) in tree {
        let full = root.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        match entry {
            Entry::File(bytes) => std::fs::write(&full, bytes).unwrap(),
            Entry::Link(target) => std::os::unix::fs::symlink(target, &full).unwrap(),
        }
    }
}

/// A nested map of the tree, written as Git trees bottom up.
#[derive(Default)]
struct Dir {
    entries: BTreeMap<String, Node>,
}

enum Node {
    Dir(Dir),
    Leaf(Entry),
}

fn write_tree(repo: &Repository, dir: &Dir) -> Oid {
    let mut builder = repo.treebuilder(None).unwrap();
    for (name, node) in &dir.entries {
        match node {
            Node::Dir(d) => {
                let oid = write_tree(repo, d);
                builder.insert(name, oid, FileMode::Tree.into()).unwrap();
            }
            Node::Leaf(Entry::File(bytes)) => {
                let oid = repo.blob(bytes).unwrap();
                builder.insert(name, oid, FileMode::Blob.into()).unwrap();
            }
            Node::Leaf(Entry::Link(target)) => {
                let oid = repo.blob(target.as_bytes()).unwrap();
                builder.insert(name, oid, FileMode::Link.into()).unwrap();
            }
        }
    }
    builder.write().unwrap()
}

fn in_git(repo: &Repository, tree: &[(String, Entry)]) {
    let mut root = Dir::default();
    for (path, entry) in tree {
        let parts: Vec<&str> = path.split('/').collect();
        let mut dir = &mut root;
        for part in &parts[..parts.len() - 1] {
            let node = dir
                .entries
                .entry(part.to_string())
                .or_insert_with(|| Node::Dir(Dir::default()));
            let Node::Dir(d) = node else { unreachable!() };
            dir = d;
        }
        dir.entries
            .insert(parts[parts.len() - 1].to_owned(), Node::Leaf(*entry));
    }
    let oid = write_tree(repo, &root);
    let tree = repo.find_tree(oid).unwrap();
    let sig = Signature::now("t", "t@example.invalid").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "tree", &tree, &[])
        .unwrap();
}

#[test]
fn both_readers_follow_one_table() {
    for case in cases() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        on_disk(&root, &case.tree);
        let prefix = format!("{}/", root.to_string_lossy());
        let disk = outcomes(
            discover_with(std::slice::from_ref(&root), case.limits).unwrap(),
            &prefix,
        );
        assert_eq!(disk, case.expected, "on disk: {}", case.name);

        let repo = Repository::init_bare(dir.path().join("repo.git")).unwrap();
        in_git(&repo, &case.tree);
        let snapshot = git::load_with(&repo, "HEAD", None, case.limits).unwrap();
        let from_git = outcomes(snapshot.loaded.unwrap(), "");
        assert_eq!(from_git, case.expected, "in Git: {}", case.name);
    }
}

#[test]
fn a_git_subdirectory_is_read_with_its_path_from_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init_bare(dir.path().join("repo.git")).unwrap();
    in_git(
        &repo,
        &tree(&[
            ("policy/a.yaml", Entry::File(b"a")),
            ("other/b.yaml", Entry::File(b"b")),
        ]),
    );
    let s = git::load(&repo, "HEAD", Some("./policy/")).unwrap();
    assert_eq!(
        outcomes(s.loaded.unwrap(), ""),
        vec![read("policy/a.yaml", "a")]
    );
    assert!(
        git::load(&repo, "HEAD", Some("absent"))
            .unwrap()
            .loaded
            .is_none()
    );
    assert!(matches!(
        git::load(&repo, "HEAD", Some("policy/a.yaml")),
        Err(git::TreeError::NotADirectory { .. })
    ));
    assert!(matches!(
        git::load(&repo, "no-such-branch", None),
        Err(git::TreeError::NoSuchRevision(_))
    ));
}

#[test]
fn fifos_and_devices_are_refused_without_blocking_or_reading() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    std::fs::create_dir(&root).unwrap();
    let fifo = root.join("pipe.yaml");
    let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path and mode; mkfifo touches nothing else.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    std::os::unix::fs::symlink("/dev/zero", root.join("zero.yaml")).unwrap();
    std::fs::write(root.join("ok.yaml"), "ok").unwrap();

    let prefix = format!("{}/", root.to_string_lossy());
    let found = outcomes(
        discover_with(std::slice::from_ref(&root), Limits::default()).unwrap(),
        &prefix,
    );
    assert_eq!(
        found,
        vec![
            read("ok.yaml", "ok"),
            refused("pipe.yaml", Refusal::NotRegular { kind: "FIFO" }),
            refused("zero.yaml", Refusal::Symlink),
        ]
    );

    // Named explicitly, they are refused all the same.
    let explicit = discover_with(
        &[fifo.clone(), root.join("zero.yaml"), "/dev/zero".into()],
        Limits::default(),
    )
    .unwrap();
    let kinds: Vec<Outcome> = outcomes(explicit, "").into_iter().map(|(_, o)| o).collect();
    assert_eq!(
        kinds,
        vec![
            Outcome::Refused(Refusal::NotRegular {
                kind: "character device"
            }),
            Outcome::Refused(Refusal::NotRegular { kind: "FIFO" }),
            Outcome::Refused(Refusal::Symlink),
        ]
    );
}

#[test]
fn a_path_that_does_not_exist_is_an_error() {
    let err = discover_with(&["/no/such/policy".into()], Limits::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "/no/such/policy: no such file or directory"
    );
}
