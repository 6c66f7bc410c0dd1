//! `tessera export kueue`, `tessera export mig-parted`, `tessera import kueue`: thin layers over
//! `tessera_interop`, which holds the translation; here are the files.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::Value;
use tessera_compiler::{CompiledPolicy, Loaded, SourceFile};
use tessera_interop::Warning;

use crate::output::{self, emit};

/// Compiles the policy; its diagnostics go to stderr, and `None` means it has errors.
fn compiled(paths: &[PathBuf]) -> anyhow::Result<Option<CompiledPolicy>> {
    let (compilation, sources) = super::compile_paths(paths)?;
    if compilation.errors() > 0 {
        eprint!("{}", output::human::render(&compilation, &sources, false));
        return Ok(None);
    }
    Ok(compilation.policy)
}

fn warn(warnings: &[Warning]) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

/// Documents as one multi-document YAML text.
fn yaml(documents: &[&Value]) -> anyhow::Result<String> {
    let mut text = String::new();
    for (i, d) in documents.iter().enumerate() {
        if i > 0 {
            text.push_str("---\n");
        }
        text.push_str(&serde_saphyr::to_string(d).context("cannot write YAML")?);
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    Ok(text)
}

fn write(dir: &Path, file: &str, text: &str) -> anyhow::Result<()> {
    let path = dir.join(file);
    std::fs::write(&path, text).with_context(|| format!("{}: cannot write", path.display()))
}

pub fn export_kueue(policy: &[PathBuf], out: &Path) -> anyhow::Result<ExitCode> {
    let Some(policy) = compiled(policy)? else {
        return Ok(ExitCode::from(1));
    };
    let export = tessera_interop::kueue::export(&policy);
    std::fs::create_dir_all(out).with_context(|| format!("{}: cannot create", out.display()))?;
    let mut written = 0;
    for (kind, file) in [
        ("ResourceFlavor", "resourceflavors.yaml"),
        ("WorkloadPriorityClass", "workloadpriorityclasses.yaml"),
        ("Cohort", "cohorts.yaml"),
        ("ClusterQueue", "clusterqueues.yaml"),
        ("LocalQueue", "localqueues.yaml"),
    ] {
        let objects: Vec<&Value> = export.of_kind(kind).collect();
        let path = out.join(file);
        if objects.is_empty() {
            // A file left from an earlier export would apply objects this policy no longer has.
            if path.exists() {
                std::fs::remove_file(&path)
                    .with_context(|| format!("{}: cannot remove", path.display()))?;
            }
            continue;
        }
        written += objects.len();
        write(out, file, &yaml(&objects)?)?;
    }
    warn(&export.warnings);
    emit(&format!(
        "wrote {written} Kueue objects (kueue.x-k8s.io/v1beta2) to {}; {} warning(s) about what Kueue cannot express\n",
        out.display(),
        export.warnings.len()
    ))?;
    Ok(ExitCode::SUCCESS)
}

pub fn export_mig_parted(policy: &[PathBuf], out: Option<&Path>) -> anyhow::Result<ExitCode> {
    let Some(policy) = compiled(policy)? else {
        return Ok(ExitCode::from(1));
    };
    let (config, warnings) = tessera_interop::mig_parted::export(&policy);
    let text = yaml(&[&config])?;
    warn(&warnings);
    match out {
        Some(path) => std::fs::write(path, &text)
            .with_context(|| format!("{}: cannot write", path.display()))?,
        None => emit(&text)?,
    }
    Ok(ExitCode::SUCCESS)
}

pub fn import_kueue(paths: &[PathBuf], out: &Path) -> anyhow::Result<ExitCode> {
    let mut files = Vec::new();
    for loaded in tessera_compiler::source::discover(paths)? {
        match loaded {
            Loaded::File(f) => files.push((f.path.clone(), f.text.clone())),
            Loaded::Refused { path, refusal } => {
                let d = tessera_compiler::refusal_diagnostic(path.clone(), refusal);
                let message = if d.message.contains(&path) {
                    d.message
                } else {
                    format!("{path}: {}", d.message)
                };
                match d.help {
                    Some(help) => bail!("{message} ({help})"),
                    None => bail!("{message}"),
                }
            }
        }
    }
    if files.is_empty() {
        bail!("no *.yaml or *.yml files in the paths given");
    }
    let import = match tessera_interop::kueue::import(&files) {
        Ok(i) => i,
        Err(errors) => {
            for e in &errors {
                eprintln!("error: {e}");
            }
            eprintln!("nothing written: {} error(s)", errors.len());
            return Ok(ExitCode::from(1));
        }
    };
    // Grouped by what a platform team owns: the fleet, the tenants.
    let of = |kinds: &[&str]| -> Vec<&Value> {
        import
            .documents
            .iter()
            .filter(|d| kinds.contains(&d["kind"].as_str().unwrap_or_default()))
            .collect()
    };
    let fleet_text = yaml(&of(&["PriorityTiers", "SloClass", "Pool"]))?;
    let tenants_text = yaml(&of(&["Tenant"]))?;
    // The documents are compiled before anything is written: an import that does not make a
    // valid policy (a lending limit above a guarantee, say) writes nothing.
    let sources = vec![
        SourceFile::new(
            out.join("fleet.yaml").display().to_string(),
            fleet_text.clone(),
        ),
        SourceFile::new(
            out.join("tenants.yaml").display().to_string(),
            tenants_text.clone(),
        ),
    ];
    let compilation = tessera_compiler::compile(&sources);
    if compilation.errors() > 0 {
        eprint!("{}", output::human::render(&compilation, &sources, false));
        eprintln!("nothing written: the imported objects do not make a valid policy (above)");
        return Ok(ExitCode::from(1));
    }
    std::fs::create_dir_all(out).with_context(|| format!("{}: cannot create", out.display()))?;
    write(out, "fleet.yaml", &fleet_text)?;
    write(out, "tenants.yaml", &tenants_text)?;
    warn(&import.warnings);
    emit(&format!(
        "wrote {} policy documents to {} ({} tenants, {} pools, {} tiers); check them with `tessera validate {}`\n",
        import.documents.len(),
        out.display(),
        import.fleet.tenants.len(),
        import.fleet.pools.len(),
        import.fleet.tiers.len(),
        out.display()
    ))?;
    Ok(ExitCode::SUCCESS)
}
