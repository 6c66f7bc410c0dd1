use std::fmt::Write as _;
use std::process::ExitCode;

use serde::Serialize;
use tessera_compiler::compiled::{CompiledInstance, CompiledLayout};
use tessera_compiler::mig::{self, GpuModel, Placement};

use crate::cli::TextOrJson;
use crate::output::emit;

fn model(name: &str) -> anyhow::Result<GpuModel> {
    let Some(m) = mig::builtin_model(name) else {
        let names: Vec<String> = mig::builtin_models().into_iter().map(|m| m.name).collect();
        anyhow::bail!(
            "unknown GPU model `{name}`; built-in models: {}",
            names.join(", ")
        );
    };
    if !m.is_mig_capable() {
        anyhow::bail!(
            "{} has no MIG: it can be shared only with mps or timeslice",
            m.name
        );
    }
    Ok(m)
}

fn instances(model: &GpuModel, placements: &[Placement]) -> Vec<CompiledInstance> {
    CompiledLayout::from_placements("", model, placements).instances
}

fn line(instances: &[CompiledInstance]) -> String {
    instances
        .iter()
        .map(|i| format!("{}@{}", i.profile, i.start))
        .collect::<Vec<_>>()
        .join("  ")
}

/// Media-extension profiles (`+me`) exist once per GPU and are asked for by name when wanted;
/// listing them would double the layouts for a feature few use.
fn layout_profiles(model: &GpuModel) -> Vec<u32> {
    let mut ids: Vec<u32> = model
        .mig
        .as_ref()
        .map(|m| {
            m.names
                .keys()
                .copied()
                .filter(|id| *id != mig::PROFILE_1G_ME)
                .collect()
        })
        .unwrap_or_default();
    ids.sort_unstable();
    ids
}

pub fn layouts(name: &str, output: TextOrJson) -> anyhow::Result<ExitCode> {
    let model = model(name)?;
    let ids = layout_profiles(&model);
    let layouts: Vec<Vec<CompiledInstance>> = mig::maximal_layouts(&ids)
        .iter()
        .map(|l| instances(&model, l))
        .collect();
    match output {
        TextOrJson::Json => {
            #[derive(Serialize)]
            struct Layout {
                compute_slices: u8,
                instances: Vec<CompiledInstance>,
            }
            #[derive(Serialize)]
            struct Out {
                format_version: u32,
                gpu_model: String,
                profiles: Vec<(u32, String)>,
                layouts: Vec<Layout>,
            }
            let out = Out {
                format_version: 1,
                gpu_model: model.name.clone(),
                profiles: ids
                    .iter()
                    .map(|id| (*id, model.profile_name(*id).unwrap_or_default().to_owned()))
                    .collect(),
                layouts: layouts
                    .into_iter()
                    .map(|instances| Layout {
                        compute_slices: instances.iter().map(|i| i.compute_slices).sum(),
                        instances,
                    })
                    .collect(),
            };
            emit(&(serde_json::to_string_pretty(&out)? + "\n"))?;
        }
        TextOrJson::Human => {
            let names: Vec<String> = ids
                .iter()
                .map(|id| format!("{} ({id})", model.profile_name(*id).unwrap_or_default()))
                .collect();
            let mut text = format!(
                "{}: {} maximal layouts over {}\neach instance is shown as profile@first-memory-slice\n",
                model.name,
                layouts.len(),
                names.join(", ")
            );
            for (i, l) in layouts.iter().enumerate() {
                let slices: u8 = l.iter().map(|i| i.compute_slices).sum();
                let _ = writeln!(text, "{:>4}  {}/7  {}", i + 1, slices, line(l));
            }
            emit(&text)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn check(name: &str, profiles: &[String], output: TextOrJson) -> anyhow::Result<ExitCode> {
    let model = model(name)?;
    let mut ids = Vec::with_capacity(profiles.len());
    for p in profiles {
        match model.resolve_profile(p) {
            Some(id) => ids.push(id),
            None => {
                let known: Vec<&str> = model
                    .mig
                    .as_ref()
                    .map(|m| m.names.values().map(String::as_str).collect())
                    .unwrap_or_default();
                anyhow::bail!(
                    "`{p}` is not a MIG profile of {}; it offers: {}",
                    model.name,
                    known.join(", ")
                );
            }
        }
    }
    let result = mig::place(&ids);
    match output {
        TextOrJson::Json => {
            let value = match &result {
                Ok(p) => {
                    serde_json::json!({"format_version": 1, "gpu_model": model.name, "fits": true, "instances": instances(&model, p)})
                }
                Err(e) => {
                    serde_json::json!({"format_version": 1, "gpu_model": model.name, "fits": false, "reason": e.to_string()})
                }
            };
            emit(&(serde_json::to_string_pretty(&value)? + "\n"))?;
        }
        TextOrJson::Human => match &result {
            Ok(p) => emit(&format!(
                "fits on one {}: {}\n",
                model.name,
                line(&instances(&model, p))
            ))?,
            Err(e) => emit(&format!("does not fit on one {}: {e}\n", model.name))?,
        },
    }
    Ok(if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
