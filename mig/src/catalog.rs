//! GPU models and their MIG profile names.
//!
//! Names are per model (`3g.40gb` on an 80 GB part is `3g.20gb` on a 40 GB
//! one) and have changed between driver releases (A100-80GB's 3g was printed
//! as `3g.39gb`), so they are display strings and input aliases only; the
//! profile ID is the identifier.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::shape::SHAPES;

/// A GPU model as the policy language names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuModel {
    pub name: String,
    /// Framebuffer in MiB (marketing GB x 1024).
    pub memory_mib: u64,
    /// `None` for GPUs without MIG.
    pub mig: Option<MigProfiles>,
}

/// The MIG profile names of one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfiles {
    /// Profile ID -> display name.
    pub names: BTreeMap<u32, String>,
}

impl MigProfiles {
    /// See [`GpuModel::resolve_profile`].
    pub fn resolve(&self, name_or_id: &str) -> Option<u32> {
        let key = name_or_id.trim();
        if !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) {
            return key
                .parse::<u32>()
                .ok()
                .filter(|id| self.names.contains_key(id));
        }
        self.names
            .iter()
            .find(|(_, name)| name.eq_ignore_ascii_case(key))
            .map(|(&id, _)| id)
    }
}

impl GpuModel {
    /// Accepts a profile name of this model (`"3g.40gb"`, case-insensitive)
    /// or a profile ID as a decimal string (`"9"`). `None` when the model
    /// has no such profile or no MIG at all.
    pub fn resolve_profile(&self, name_or_id: &str) -> Option<u32> {
        self.mig.as_ref()?.resolve(name_or_id)
    }

    /// This model's display name for a profile ID.
    pub fn profile_name(&self, profile_id: u32) -> Option<&str> {
        self.mig
            .as_ref()?
            .names
            .get(&profile_id)
            .map(String::as_str)
    }

    pub fn is_mig_capable(&self) -> bool {
        self.mig.is_some()
    }
}

/// One built-in model: name, marketing GB, and MIG profile names in
/// [`SHAPES`] order (IDs 19, 20, 15, 14, 9, 5, 0).
type Builtin = (&'static str, u64, Option<[&'static str; 7]>);

const A100_40: [&str; 7] = [
    "1g.5gb",
    "1g.5gb+me",
    "1g.10gb",
    "2g.10gb",
    "3g.20gb",
    "4g.20gb",
    "7g.40gb",
];
const GB80: [&str; 7] = [
    "1g.10gb",
    "1g.10gb+me",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
];
const H100_NVL: [&str; 7] = [
    "1g.12gb",
    "1g.12gb+me",
    "1g.24gb",
    "2g.24gb",
    "3g.47gb",
    "4g.47gb",
    "7g.94gb",
];
/// H200 and B200: names from NVIDIA's documentation; the placement rules are
/// assumed to equal H100's and have not been verified on hardware.
const H200: [&str; 7] = [
    "1g.18gb",
    "1g.18gb+me",
    "1g.35gb",
    "2g.35gb",
    "3g.71gb",
    "4g.71gb",
    "7g.141gb",
];
/// See [`H200`]: unverified on hardware.
const B200: [&str; 7] = [
    "1g.23gb",
    "1g.23gb+me",
    "1g.45gb",
    "2g.45gb",
    "3g.90gb",
    "4g.90gb",
    "7g.180gb",
];

const BUILTINS: [Builtin; 10] = [
    ("A100-SXM4-40GB", 40, Some(A100_40)),
    ("A100-SXM4-80GB", 80, Some(GB80)),
    ("H100-SXM5-80GB", 80, Some(GB80)),
    ("H100-PCIe-80GB", 80, Some(GB80)),
    ("H100-NVL-94GB", 94, Some(H100_NVL)),
    ("H200-SXM-141GB", 141, Some(H200)),
    ("B200-SXM-180GB", 180, Some(B200)),
    ("L40S-48GB", 48, None),
    ("L4-24GB", 24, None),
    ("A10-24GB", 24, None),
];

fn build((name, gb, names): &Builtin) -> GpuModel {
    GpuModel {
        name: (*name).to_owned(),
        memory_mib: gb * 1024,
        mig: names.map(|names| MigProfiles {
            names: SHAPES
                .iter()
                .zip(names)
                .map(|(s, n)| (s.profile_id, n.to_owned()))
                .collect(),
        }),
    }
}

/// The built-in models, oldest generation first, MIG-capable before not.
///
/// The H200 and B200 entries assume H100's placement rules (unverified on
/// hardware).
pub fn builtin_models() -> Vec<GpuModel> {
    builtins().to_vec()
}

/// [`builtin_models`], built once and borrowed: resolving a profile name against every model
/// is done per workload of a snapshot, and building the catalog each time was most of reading
/// a 65,000-workload snapshot.
pub fn builtins() -> &'static [GpuModel] {
    static MODELS: std::sync::OnceLock<Vec<GpuModel>> = std::sync::OnceLock::new();
    MODELS.get_or_init(|| BUILTINS.iter().map(build).collect())
}

/// A built-in model by exact name, else by case-insensitive name.
pub fn builtin_model(name: &str) -> Option<GpuModel> {
    BUILTINS
        .iter()
        .find(|b| b.0 == name)
        .or_else(|| BUILTINS.iter().find(|b| b.0.eq_ignore_ascii_case(name)))
        .map(build)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::shape;

    fn model(name: &str) -> GpuModel {
        builtin_model(name).unwrap_or_else(|| panic!("{name} missing"))
    }

    #[test]
    fn catalog_names_and_order() {
        let names: Vec<String> = builtin_models().into_iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            [
                "A100-SXM4-40GB",
                "A100-SXM4-80GB",
                "H100-SXM5-80GB",
                "H100-PCIe-80GB",
                "H100-NVL-94GB",
                "H200-SXM-141GB",
                "B200-SXM-180GB",
                "L40S-48GB",
                "L4-24GB",
                "A10-24GB",
            ]
        );
    }

    #[test]
    fn memory_in_mib() {
        assert_eq!(model("A100-SXM4-40GB").memory_mib, 40960);
        assert_eq!(model("H100-SXM5-80GB").memory_mib, 81920);
        assert_eq!(model("H100-NVL-94GB").memory_mib, 96256);
        assert_eq!(model("H200-SXM-141GB").memory_mib, 144384);
        assert_eq!(model("B200-SXM-180GB").memory_mib, 184320);
        assert_eq!(model("L40S-48GB").memory_mib, 49152);
        assert_eq!(model("A10-24GB").memory_mib, 24576);
    }

    #[test]
    fn mig_capability() {
        let mig: Vec<bool> = builtin_models()
            .iter()
            .map(|m| m.is_mig_capable())
            .collect();
        assert_eq!(
            mig,
            [
                true, true, true, true, true, true, true, false, false, false
            ]
        );
        let l4 = model("L4-24GB");
        assert_eq!(l4.resolve_profile("0"), None);
        assert_eq!(l4.resolve_profile("1g.10gb"), None);
        assert_eq!(l4.profile_name(19), None);
    }

    /// Each name must encode its profile's compute slices ("3g."), carry
    /// "+me" exactly on profile 20, and the 7g name must state the model's
    /// memory; catches names attached to the wrong profile ID.
    #[test]
    fn names_agree_with_the_profile_table() {
        for m in builtin_models().iter().filter(|m| m.is_mig_capable()) {
            let names = &m.mig.as_ref().unwrap().names;
            assert_eq!(names.len(), 7, "{}", m.name);
            for (&id, name) in names {
                let s = shape(id).unwrap();
                assert!(
                    name.starts_with(&format!("{}g.", s.compute_slices)),
                    "{}: {id} -> {name}",
                    m.name
                );
                assert_eq!(name.ends_with("+me"), id == 20, "{}: {name}", m.name);
            }
            assert_eq!(
                names[&0],
                format!("7g.{}gb", m.memory_mib / 1024),
                "{}",
                m.name
            );
            // The 2/8-memory 1g and the 2g have the same memory, distinct names.
            let gb = |id: u32| names[&id].split('.').nth(1).unwrap().to_owned();
            assert_eq!(gb(15), gb(14), "{}", m.name);
            assert_eq!(gb(9), gb(5), "{}", m.name);
        }
    }

    #[test]
    fn resolve_by_name_and_id() {
        let h100 = model("H100-SXM5-80GB");
        assert_eq!(h100.resolve_profile("3g.40gb"), Some(9));
        assert_eq!(h100.resolve_profile("3G.40GB"), Some(9));
        assert_eq!(h100.resolve_profile("1g.10gb"), Some(19));
        assert_eq!(h100.resolve_profile("1g.10gb+me"), Some(20));
        assert_eq!(h100.resolve_profile("1g.20gb"), Some(15));
        assert_eq!(h100.resolve_profile("9"), Some(9));
        assert_eq!(h100.resolve_profile("0"), Some(0));
        assert_eq!(h100.resolve_profile("1"), None);
        assert_eq!(h100.resolve_profile("+9"), None);
        assert_eq!(h100.resolve_profile("3g.20gb"), None);
        assert_eq!(h100.resolve_profile(""), None);
        assert_eq!(h100.profile_name(5), Some("4g.40gb"));
        // Same string, different profile on a different model.
        assert_eq!(model("A100-SXM4-40GB").resolve_profile("1g.10gb"), Some(15));
    }

    #[test]
    fn lookup_exact_then_case_insensitive() {
        assert_eq!(model("h100-pcie-80gb").name, "H100-PCIe-80GB");
        assert!(builtin_model("H100").is_none());
    }

    #[test]
    fn serializes_profile_ids_as_keys() {
        let json = serde_json::to_value(model("A100-SXM4-40GB")).unwrap();
        assert_eq!(json["mig"]["names"]["9"], "3g.20gb");
        assert_eq!(json["memory_mib"], 40960);
        let none = serde_json::to_value(model("L4-24GB")).unwrap();
        assert!(none["mig"].is_null());
    }
}
