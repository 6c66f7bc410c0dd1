use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::CompileFormat;
use crate::output;

pub fn run(paths: &[PathBuf], format: CompileFormat) -> anyhow::Result<ExitCode> {
    let (compilation, sources) = super::compile_paths(paths)?;
    let Some(policy) = &compilation.policy else {
        // The diagnostics go to stderr so that stdout never holds a partial policy.
        let text = output::human::render(&compilation, &sources, output::color_stderr());
        eprint!("{text}");
        return Ok(ExitCode::from(1));
    };
    if compilation.warnings() > 0 {
        eprint!(
            "{}",
            output::human::render(&compilation, &sources, output::color_stderr())
        );
    }
    match format {
        CompileFormat::Json => {
            let mut text = serde_json::to_string_pretty(policy)?;
            text.push('\n');
            crate::output::emit(&text)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
