//! `tessera plan`: what a policy change would do, from two Git revisions (or one directory)
//! and a cluster-state snapshot.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use tessera_compiler::{
    Code, Compilation, Diagnostic, Loaded, Refusal, ReplacedState, Severity, SourceFile,
};
use tessera_plan::{PlanInput, ReplacedSnapshot, RevisionInfo, Side};

use crate::cli::PlanFormat;
use crate::output;

pub struct Args {
    pub repo: Option<PathBuf>,
    pub base: Option<String>,
    pub head: Option<String>,
    pub path: Option<String>,
    pub policy: Option<PathBuf>,
    pub state: PathBuf,
    pub output: PlanFormat,
    pub detailed_exitcode: bool,
    pub out: Option<PathBuf>,
    pub signatures: crate::cli::SignatureArgs,
}

/// With `--detailed-exitcode`, every error is exit 1 (Terraform's contract: 2 means changes);
/// without it, I/O and usage errors keep the project's exit 2.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let detailed = args.detailed_exitcode;
    match plan(args) {
        Err(e) if detailed => {
            eprintln!("error: {e:#}");
            Ok(ExitCode::from(1))
        }
        other => other,
    }
}

/// Why the state file was not read, for a usage error.
fn refused(refusal: Refusal) -> String {
    match refusal {
        Refusal::TooLarge { limit, .. } | Refusal::TreeTooLarge { limit } => {
            format!("larger than {limit} bytes")
        }
        Refusal::NotUtf8 => "not UTF-8 text".to_owned(),
        Refusal::Symlink => "a symbolic link; give the path of the file itself".to_owned(),
        Refusal::NotRegular { kind } => format!("a {kind}, not a regular file"),
        Refusal::TooManyFiles { limit } => format!("more than {limit} files"),
    }
}

fn display(p: &Path) -> String {
    let s = p.to_string_lossy().replace('\\', "/");
    s.strip_prefix("./").map(str::to_owned).unwrap_or(s)
}

/// Diagnostics about the snapshot that only say its workloads or nodes name a tenant, class or
/// pool the head no longer has. A plan must show what becomes of that work (a rename or removal
/// is exactly what a reviewer needs to see), not refuse the head.
const ORPHANING: [Code; 4] = [
    Code::UnknownTenant,
    Code::UnknownSloClass,
    Code::UnknownPool,
    Code::SloClassNotAllowed,
];

/// Compiles the head with the state, which replaces any `ClusterState` of the head's tree.
/// When the policy itself is valid and the state's only errors are references the head
/// dropped, those become warnings and the policy stands: the solver reports the work they
/// concern as orphaned.
fn with_orphans(tree: Vec<Loaded>, state: SourceFile) -> (Compilation, Vec<ReplacedState>) {
    let state_path = state.path.clone();
    let policy_only: Vec<Loaded> = tree.to_vec();
    let (mut combined, replaced) = tessera_compiler::compile_observed(tree, Some(state));
    if combined.policy.is_some() {
        return (combined, replaced);
    }
    let orphaning = |d: &Diagnostic| {
        d.is_error()
            && ORPHANING.contains(&d.code)
            && d.location.as_ref().is_some_and(|l| l.file == state_path)
    };
    let only_orphans = combined
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .all(orphaning);
    if !only_orphans {
        return (combined, replaced);
    }
    let policy = tessera_compiler::compile_observed(policy_only, None)
        .0
        .policy;
    if policy.is_none() {
        return (combined, replaced);
    }
    for d in combined.diagnostics.iter_mut().filter(|d| orphaning(d)) {
        d.severity = Severity::Warning;
        d.message = format!(
            "{}: the work it concerns is orphaned under this policy",
            d.message
        );
    }
    combined.policy = policy;
    (combined, replaced)
}

/// The name the directory's discovery gave the state file when it reached the same file, so
/// that the file is read once however it was spelt on the command line.
fn same_file_as_state(tree: &[Loaded], state: &Path) -> Option<String> {
    let state = std::fs::canonicalize(state).ok()?;
    tree.iter().find_map(|l| match l {
        Loaded::File(f) if std::fs::canonicalize(&f.path).ok().as_ref() == Some(&state) => {
            Some(f.path.clone())
        }
        _ => None,
    })
}

fn plan(args: Args) -> anyhow::Result<ExitCode> {
    let trusted = if args.signatures.verify_signatures {
        if args.repo.is_none() {
            bail!("--verify-signatures needs --repo: a directory has no commits to verify");
        }
        Some(crate::cmd::verify::load_trust(
            &args.signatures.trusted_signers,
        )?)
    } else {
        None
    };
    let mut verdict = None;
    let mut state_path = display(&args.state);
    // Read by the policy tree's rules: no link, no FIFO or device, nothing over the cap.
    let state_file = match tessera_source::discover(std::slice::from_ref(&args.state))
        .with_context(|| format!("{state_path}: cannot read"))?
        .pop()
    {
        Some(Loaded::File(f)) => f,
        Some(Loaded::Refused { refusal, .. }) => bail!("{state_path}: {}", refused(refusal)),
        None => bail!("{state_path}: cannot read"),
    };
    let digest = tessera_plan::state_digest(state_file.text.as_bytes());

    // Each side: what it is, and its files (`None`: no policy files at all).
    let (base, head_info, head_loaded) = match (&args.repo, &args.policy) {
        (Some(repo), _) => {
            let (Some(base_rev), Some(head_rev)) = (&args.base, &args.head) else {
                bail!("--repo needs --base and --head");
            };
            let repo = crate::git::open(repo)?;
            if let Some(trusted) = &trusted {
                verdict = Some(crate::cmd::verify::verdict(&repo, head_rev, trusted)?);
            }
            let b = crate::git::load(&repo, base_rev, args.path.as_deref())?;
            let h = crate::git::load(&repo, head_rev, args.path.as_deref())?;
            let path = args
                .path
                .as_deref()
                .map(crate::git::normalize)
                .filter(|p| !p.is_empty());
            let info = |rev: &String, commit| RevisionInfo {
                rev: Some(rev.clone()),
                commit: Some(commit),
                path: path.clone(),
            };
            let Some(head_loaded) = h.loaded else {
                bail!(
                    "{}: no such directory at revision {head_rev}",
                    path.as_deref().unwrap_or(".")
                );
            };
            let base_loaded = b.loaded.filter(|l| !l.is_empty());
            (
                Some((info(base_rev, b.commit), base_loaded)),
                info(head_rev, h.commit),
                head_loaded,
            )
        }
        (None, Some(dir)) => {
            let loaded = tessera_compiler::source::discover(std::slice::from_ref(dir))?;
            // The state file may live in the policy directory: it is read once, under the
            // name discovery gave it.
            if let Some(path) = same_file_as_state(&loaded, &args.state) {
                state_path = path;
            }
            let info = RevisionInfo {
                rev: None,
                commit: None,
                path: Some(display(dir)),
            };
            (None, info, loaded)
        }
        (None, None) => bail!("give --repo with --base and --head, or --policy DIR"),
    };

    // Both sides are solved on the snapshot given with --state: the base's own snapshots,
    // if any, are not the fleet either.
    let base = base.map(|(info, l)| {
        let compiled = l.map(|l| tessera_compiler::compile_observed(l, None).0);
        (info, compiled)
    });
    let state_file = SourceFile::new(state_path.clone(), state_file.text);
    let mut head_sources: Vec<SourceFile> = head_loaded
        .iter()
        .filter_map(|l| match l {
            Loaded::File(f) if f.path != state_path => Some(f.clone()),
            _ => None,
        })
        .collect();
    head_sources.push(state_file.clone());
    let (head_compilation, replaced) = with_orphans(head_loaded, state_file);
    if head_compilation.errors() == 0 && head_compilation.states.is_empty() {
        bail!("{state_path}: holds no ClusterState document");
    }

    let plan = tessera_plan::plan(PlanInput {
        base: base.as_ref().map(|(info, c)| Side {
            info: info.clone(),
            compilation: c.as_ref(),
        }),
        head: Side {
            info: head_info,
            compilation: Some(&head_compilation),
        },
        head_sources: &head_sources,
        state_path,
        state_digest: digest,
        replaced_states: replaced
            .into_iter()
            .map(|r| ReplacedSnapshot {
                name: r.name,
                file: r.location.file,
                line: r.location.line,
            })
            .collect(),
    });

    let text = match args.output {
        PlanFormat::Human => {
            let color = output::color_stdout();
            let mut text = String::new();
            if !head_compilation.diagnostics.is_empty() {
                text.push_str(&output::human::render(
                    &head_compilation,
                    &head_sources,
                    color,
                ));
                text.push('\n');
            }
            if let Some(v) = &verdict {
                text.push_str(&signature_line(v));
                text.push('\n');
            }
            text.push_str(&tessera_plan::render::human(&plan, color));
            text
        }
        PlanFormat::Markdown => match &verdict {
            Some(v) => format!(
                "**Signature:** {}\n\n{}",
                signature_line(v),
                tessera_plan::render::markdown(&plan)
            ),
            None => tessera_plan::render::markdown(&plan),
        },
        PlanFormat::Json => match &verdict {
            Some(v) => {
                let mut value: serde_json::Value = serde_json::from_str(&plan.to_json())?;
                value["signature"] = crate::cmd::verify::verdict_json(v);
                serde_json::to_string_pretty(&value)? + "\n"
            }
            None => plan.to_json(),
        },
        PlanFormat::Github => {
            let mut text = String::new();
            if let Some(v) = &verdict {
                let level = if v.is_trusted() { "notice" } else { "error" };
                text.push_str(&format!(
                    "::{level} title=Signature::{}\n",
                    tessera_plan::workflow_command::escape_data(&signature_line(v))
                ));
            }
            text.push_str(&tessera_plan::render::github(&plan));
            text
        }
    };
    let refused = verdict.as_ref().is_some_and(|v| !v.is_trusted());
    if let Some(out) = &args.out {
        if plan.valid {
            std::fs::write(out, plan.to_json())
                .with_context(|| format!("{}: cannot write the plan", out.display()))?;
        } else {
            eprintln!(
                "{}: not written: there is no plan for an invalid head",
                out.display()
            );
        }
    }
    output::emit(&text)?;
    Ok(if !plan.valid || refused {
        ExitCode::from(1)
    } else if args.detailed_exitcode && plan.changed {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// Whether `reconcile --verify-signatures` would accept the head, in one line.
fn signature_line(v: &tessera_source::signature::Verdict) -> String {
    if v.is_trusted() {
        format!("accepted: {v}")
    } else {
        format!("would be refused by `reconcile --verify-signatures`: {v}")
    }
}
