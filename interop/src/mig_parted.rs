//! The MIG pools' layouts as NVIDIA mig-parted's `config.yaml` (`version: v1`, `mig-configs`).
//!
//! One named config per pool layout, `<pool>-<layout>`, each with one entry: `devices: all`,
//! `mig-enabled: true`, the layout's instances as counts per profile name (mig-parted places
//! them itself), and a `device-filter` with the PCI device id of the pool's GPU model so that a
//! config never lands on another model. The GPU Operator's mig-manager applies a config to a node
//! labelled `nvidia.com/mig.config=<name>`.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::Sharing;

use crate::Warning;

/// PCI device id and vendor id (`10DE`) per built-in GPU model, as mig-parted's
/// `device-filter` takes them (NVIDIA/mig-parted's default configs, the PCI ID repository).
const DEVICE_IDS: &[(&str, &str)] = &[
    ("A100-SXM4-40GB", "0x20B010DE"),
    ("A100-SXM4-80GB", "0x20B210DE"),
    ("H100-SXM5-80GB", "0x233010DE"),
    ("H100-PCIe-80GB", "0x233110DE"),
    ("H100-NVL-94GB", "0x232110DE"),
    ("H200-SXM-141GB", "0x233510DE"),
];

/// The PCI device filter of a GPU model, when it is known.
pub fn device_filter(gpu_model: &str) -> Option<&'static str> {
    DEVICE_IDS
        .iter()
        .find(|(m, _)| *m == gpu_model)
        .map(|(_, id)| *id)
}

/// The config file's document, and what it leaves out.
pub fn export(policy: &CompiledPolicy) -> (Value, Vec<Warning>) {
    let mut warnings = Vec::new();
    let mut configs = Map::new();
    for pool in &policy.pools {
        if pool.sharing != Sharing::Mig {
            continue;
        }
        let filter = device_filter(&pool.gpu_model);
        if filter.is_none() {
            warnings.push(Warning::new(
                format!("pool {}", pool.name),
                format!(
                    "no PCI device id is known for {}: its configs carry no device-filter and apply to any GPU of a node they are set on",
                    pool.gpu_model
                ),
            ));
        }
        if pool.layouts.len() > 1 {
            warnings.push(Warning::new(
                format!("pool {}", pool.name),
                format!(
                    "tessera picks among {} layouts per GPU as demand asks; mig-parted applies one named config to a whole node",
                    pool.layouts.len()
                ),
            ));
        }
        for layout in &pool.layouts {
            let mut devices: BTreeMap<&str, u32> = BTreeMap::new();
            for i in &layout.instances {
                *devices.entry(i.profile.as_str()).or_default() += 1;
            }
            let mut entry = Map::new();
            if let Some(id) = filter {
                entry.insert("device-filter".into(), json!([id]));
            }
            entry.insert("devices".into(), json!("all"));
            entry.insert("mig-enabled".into(), json!(true));
            entry.insert("mig-devices".into(), json!(devices));
            configs.insert(
                format!("{}-{}", pool.name, layout.name),
                json!([Value::Object(entry)]),
            );
        }
    }
    if configs.is_empty() {
        warnings.push(Warning::new(
            "pools",
            "no MIG pool: the config holds no MIG layout",
        ));
    }
    (json!({ "version": "v1", "mig-configs": configs }), warnings)
}
