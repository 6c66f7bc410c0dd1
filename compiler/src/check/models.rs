//! GPU models (built-in and `GpuModel` documents) and `MigLayout`s expanded to placements.

use std::collections::{BTreeMap, BTreeSet};

use tessera_mig as mig;

use super::{Repo, Sink};
use crate::compiled::{CompiledGpuModel, CompiledLayout, CompiledMigProfile};
use crate::diagnostic::{Code, Diagnostic, did_you_mean};
use crate::load::LoadedDocument;
use crate::model::{Document, Kind};
use crate::units::Bytes;

pub(crate) struct Model {
    pub info: mig::GpuModel,
    pub builtin: bool,
}

pub(crate) type Models = BTreeMap<String, Model>;

pub(crate) struct Layout {
    pub gpu_model: String,
    pub compiled: CompiledLayout,
}

pub(crate) fn resolve_models(repo: &Repo, sink: &mut Sink) -> Models {
    let mut models: Models = mig::builtin_models()
        .into_iter()
        .map(|info| {
            (
                info.name.clone(),
                Model {
                    info,
                    builtin: true,
                },
            )
        })
        .collect();
    for doc in repo.of(Kind::GpuModel) {
        let Document::GpuModel(spec) = &doc.document else {
            continue;
        };
        if models.contains_key(&doc.name) {
            sink.push(
                Diagnostic::new(
                    Code::InvalidGpuModel,
                    format!(
                        "`{}` is a built-in GPU model and cannot be redefined",
                        doc.name
                    ),
                )
                .at(doc.value_loc("/metadata/name"))
                .field("metadata.name")
                .help("use the built-in model as it is, or give the custom model another name"),
            );
            continue;
        }
        let mut names = BTreeMap::new();
        let mut ok = true;
        if let Some(m) = &spec.mig {
            let mut seen_names = BTreeSet::new();
            for (i, p) in m.profiles.iter().enumerate() {
                let ptr = format!("/spec/mig/profiles/{i}");
                if mig::shape(p.id).is_none() {
                    let known: Vec<String> = mig::SHAPES
                        .iter()
                        .map(|s| s.profile_id.to_string())
                        .collect();
                    sink.push(
                        Diagnostic::new(
                            Code::InvalidGpuModel,
                            format!("{} is not a MIG GPU instance profile ID", p.id),
                        )
                        .at(doc.value_loc(&format!("{ptr}/id")))
                        .field(format!("spec.mig.profiles[{i}].id"))
                        .help(format!(
                            "use one of the IDs `nvidia-smi mig -lgip` prints: {}",
                            known.join(", ")
                        )),
                    );
                    ok = false;
                } else if names.insert(p.id, p.name.clone()).is_some() {
                    sink.push(
                        Diagnostic::new(
                            Code::InvalidGpuModel,
                            format!("profile ID {} is listed twice", p.id),
                        )
                        .at(doc.value_loc(&format!("{ptr}/id")))
                        .field(format!("spec.mig.profiles[{i}].id"))
                        .help("list each profile once"),
                    );
                    ok = false;
                }
                if !seen_names.insert(p.name.to_ascii_lowercase()) {
                    sink.push(
                        Diagnostic::new(
                            Code::InvalidGpuModel,
                            format!("profile name `{}` is used twice", p.name),
                        )
                        .at(doc.value_loc(&format!("{ptr}/name")))
                        .field(format!("spec.mig.profiles[{i}].name"))
                        .help("profile names must tell profiles apart"),
                    );
                    ok = false;
                }
            }
        }
        if ok {
            let info = mig::GpuModel {
                name: doc.name.clone(),
                memory_mib: spec.memory.0 / (1 << 20),
                mig: spec.mig.as_ref().map(|_| mig::MigProfiles { names }),
            };
            models.insert(
                doc.name.clone(),
                Model {
                    info,
                    builtin: false,
                },
            );
        }
    }
    models
}

/// The diagnostic for a GPU model name that resolves to nothing.
pub(crate) fn unknown_model(
    models: &Models,
    doc: &LoadedDocument,
    pointer: &str,
    name: &str,
) -> Diagnostic {
    let mut help = format!(
        "use a built-in model ({}) or define it with a `GpuModel` document",
        models
            .values()
            .filter(|m| m.builtin)
            .map(|m| m.info.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(s) = did_you_mean(name, models.keys().map(String::as_str)) {
        help = format!("did you mean `{s}`? {help}");
    }
    Diagnostic::new(Code::UnknownGpuModel, format!("unknown GPU model `{name}`"))
        .at(doc.value_loc(pointer))
        .field(crate::schema::dotted(pointer))
        .help(help)
}

/// The diagnostic for a MIG profile the model does not offer.
pub(crate) fn unknown_profile(
    model: &mig::GpuModel,
    doc: &LoadedDocument,
    pointer: &str,
    profile: &str,
) -> Diagnostic {
    let names: Vec<&str> = model
        .mig
        .as_ref()
        .map(|m| m.names.values().map(String::as_str).collect())
        .unwrap_or_default();
    let mut help = format!("{} offers: {}", model.name, names.join(", "));
    if let Some(s) = did_you_mean(profile, names.iter().copied()) {
        help = format!("did you mean `{s}`? {help}");
    }
    Diagnostic::new(
        Code::UnknownMigProfile,
        format!("`{profile}` is not a MIG profile of {}", model.name),
    )
    .at(doc.value_loc(pointer))
    .field(crate::schema::dotted(pointer))
    .help(help)
}

pub(crate) fn not_mig_capable(doc: &LoadedDocument, pointer: &str, model: &str) -> Diagnostic {
    Diagnostic::new(
        Code::MigNotSupported,
        format!("{model} has no MIG: it cannot be partitioned"),
    )
    .at(doc.value_loc(pointer))
    .field(crate::schema::dotted(pointer))
    .help("use a MIG-capable model (A100, H100, H200, B200), or share this model with mps or timeslice")
}

pub(crate) fn resolve_layouts(
    repo: &Repo,
    models: &Models,
    sink: &mut Sink,
) -> BTreeMap<String, Layout> {
    let mut layouts = BTreeMap::new();
    for doc in repo.of(Kind::MigLayout) {
        let Document::MigLayout(spec) = &doc.document else {
            continue;
        };
        let Some(model) = models.get(&spec.gpu_model) else {
            if !repo.defined(Kind::GpuModel, &spec.gpu_model) {
                sink.push(unknown_model(
                    models,
                    doc,
                    "/spec/gpuModel",
                    &spec.gpu_model,
                ));
            }
            continue;
        };
        if !model.info.is_mig_capable() {
            sink.push(not_mig_capable(doc, "/spec/gpuModel", &spec.gpu_model));
            continue;
        }
        let mut ids = Vec::new();
        for (i, name) in spec.instances.iter().enumerate() {
            match model.info.resolve_profile(name) {
                Some(id) => ids.push(id),
                None => sink.push(unknown_profile(
                    &model.info,
                    doc,
                    &format!("/spec/instances/{i}"),
                    name,
                )),
            }
        }
        if ids.len() != spec.instances.len() {
            continue;
        }
        match mig::place(&ids) {
            Ok(placements) => {
                layouts.insert(
                    doc.name.clone(),
                    Layout {
                        gpu_model: spec.gpu_model.clone(),
                        compiled: CompiledLayout::from_placements(
                            &doc.name,
                            &model.info,
                            &placements,
                        ),
                    },
                );
            }
            Err(e) => sink.push(
                Diagnostic::new(
                    Code::MigLayoutNoPlacement,
                    format!(
                        "the instances [{}] cannot all be placed on one {} GPU: {e}",
                        spec.instances.join(", "),
                        spec.gpu_model
                    ),
                )
                .at(doc.loc("/spec/instances"))
                .field("spec.instances")
                .help(
                    "a GPU has 7 compute and 8 memory slices and each profile may start only at \
                     certain slices; `tessera mig layouts MODEL` lists every layout that fits",
                ),
            ),
        }
    }
    layouts
}

pub(crate) fn compile_model(model: &Model) -> CompiledGpuModel {
    CompiledGpuModel {
        name: model.info.name.clone(),
        memory: Bytes(model.info.memory_mib << 20),
        builtin: model.builtin,
        mig_profiles: model
            .info
            .mig
            .as_ref()
            .map(|m| {
                m.names
                    .iter()
                    .filter_map(|(id, name)| {
                        mig::shape(*id).map(|s| CompiledMigProfile {
                            id: *id,
                            name: name.clone(),
                            compute_slices: s.compute_slices,
                            memory_slices: s.memory_slices,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

pub(crate) fn warn_unused_layouts(repo: &Repo, sink: &mut Sink) {
    let used: BTreeSet<&str> = repo
        .of(Kind::Pool)
        .filter_map(|d| match &d.document {
            Document::Pool(p) => Some(p.mig_layouts.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    for doc in repo.of(Kind::MigLayout) {
        if !used.contains(doc.name.as_str()) {
            sink.push(
                Diagnostic::new(
                    Code::UnusedMigLayout,
                    format!("MigLayout `{}` is not used by any pool", doc.name),
                )
                .at(doc.value_loc("/metadata/name"))
                .field("metadata.name")
                .help("add it to a mig pool's `migLayouts`, or delete it"),
            );
        }
    }
}
