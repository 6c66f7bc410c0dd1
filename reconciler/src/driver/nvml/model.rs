//! From what NVML says a GPU is (`nvmlDeviceGetName`, total memory) to a catalog model.
//!
//! NVML's names are marketing strings (`NVIDIA H100 80GB HBM3` for the SXM5 part,
//! `NVIDIA H100 PCIe`, `NVIDIA A100-SXM4-40GB`) and change between drivers; the catalog names a
//! model by family, form factor and memory. So the match is by those three: the family
//! token (`H100`), the form factor when the name says one (`PCIe`, `NVL`; otherwise the SXM
//! part), and the memory size within 10 %. Exactly one catalog model must match: a GPU the
//! catalog does not know is an error, never a guess.

use tessera_mig::{GpuModel, builtin_models};

/// Memory NVML reports is a little under the nominal size (reserved regions); 10 % tolerates
/// that and still separates 40 from 80 GB, 80 from 94 GB.
const MEMORY_TOLERANCE: f64 = 0.10;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error(
        "NVML reports `{name}` with {memory_mib} MiB, which matches no GPU model in tessera's \
         catalog ({known})"
    )]
    Unknown {
        name: String,
        memory_mib: u64,
        known: String,
    },
    #[error(
        "NVML reports `{name}` with {memory_mib} MiB, which matches several catalog models: {matches}"
    )]
    Ambiguous {
        name: String,
        memory_mib: u64,
        matches: String,
    },
}

fn tokens(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_ascii_uppercase)
        .collect()
}

/// The form factors a name may state; a catalog model without one of them is the SXM part.
const FORMS: [&str; 2] = ["PCIE", "NVL"];

fn matches(model: &GpuModel, name_tokens: &[String], memory_mib: u64) -> bool {
    let model_tokens = tokens(&model.name);
    let Some(family) = model_tokens.first() else {
        return false;
    };
    if !name_tokens.contains(family) {
        return false;
    }
    let same_form = FORMS
        .iter()
        .all(|f| name_tokens.iter().any(|t| t == f) == model_tokens.iter().any(|t| t == f));
    let nominal = model.memory_mib as f64;
    same_form && ((memory_mib as f64 - nominal).abs() / nominal) <= MEMORY_TOLERANCE
}

/// The catalog model of a GPU NVML names `name` with `memory_total` bytes.
pub fn catalog_model(name: &str, memory_total: u64) -> Result<GpuModel, ModelError> {
    let memory_mib = memory_total / (1024 * 1024);
    let name_tokens = tokens(name);
    let all = builtin_models();
    let mut found: Vec<GpuModel> = all
        .iter()
        .filter(|m| matches(m, &name_tokens, memory_mib))
        .cloned()
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(ModelError::Unknown {
            name: name.to_owned(),
            memory_mib,
            known: all
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
        _ => Err(ModelError::Ambiguous {
            name: name.to_owned(),
            memory_mib,
            matches: found
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn nvml_names_map_to_catalog_models() {
        // Names as drivers print them; memory as NVML reports it (a little under nominal).
        let cases = [
            ("NVIDIA H100 80GB HBM3", 81_559, "H100-SXM5-80GB"),
            ("NVIDIA H100 PCIe", 81_559, "H100-PCIe-80GB"),
            ("NVIDIA H100 NVL", 95_830, "H100-NVL-94GB"),
            ("NVIDIA A100-SXM4-40GB", 40_536, "A100-SXM4-40GB"),
            ("NVIDIA A100-SXM4-80GB", 81_920, "A100-SXM4-80GB"),
            ("NVIDIA H200", 143_771, "H200-SXM-141GB"),
            ("NVIDIA B200", 183_359, "B200-SXM-180GB"),
            ("NVIDIA L40S", 46_068, "L40S-48GB"),
            ("NVIDIA L4", 23_034, "L4-24GB"),
            ("NVIDIA A10", 23_028, "A10-24GB"),
        ];
        for (name, mib, want) in cases {
            let got = catalog_model(name, mib * MIB).map(|m| m.name);
            assert_eq!(got.as_deref(), Ok(want), "{name}");
        }
    }

    #[test]
    fn an_unknown_gpu_is_an_error_naming_it() {
        for (name, mib) in [
            ("NVIDIA A100 80GB PCIe", 81_920),
            ("NVIDIA GeForce RTX 4090", 24_564),
            // Right family, wrong memory: not silently the 80 GB part.
            ("NVIDIA H100 80GB HBM3", 40_000),
        ] {
            let err = catalog_model(name, mib * MIB).unwrap_err();
            assert!(matches!(err, ModelError::Unknown { .. }), "{err}");
            assert!(err.to_string().contains(name), "{err}");
        }
    }
}
