use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::DiagnosticFormat;
use crate::output;

pub fn run(
    paths: &[PathBuf],
    format: DiagnosticFormat,
    deny_warnings: bool,
) -> anyhow::Result<ExitCode> {
    let (compilation, sources) = super::compile_paths(paths)?;
    let text = match format {
        DiagnosticFormat::Human => {
            output::human::render(&compilation, &sources, output::color_stdout())
        }
        DiagnosticFormat::Json => output::json::render(&compilation),
        DiagnosticFormat::Github => output::github::render(&compilation),
        DiagnosticFormat::Sarif => output::sarif::render(&compilation),
    };
    crate::output::emit(&text)?;
    let failed = compilation.errors() > 0 || (deny_warnings && compilation.warnings() > 0);
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
