//! `export mig-parted` writes what NVIDIA mig-parted reads (`../shared/reference/mig.md`, "mig-parted's
//! configuration file"): `version: v1` and `mig-configs` only; each config a non-empty list of
//! entries with `devices` (`all` or indices), `mig-enabled`, `mig-devices` (profile name to
//! count) and optionally `device-filter` (PCI ids `0x….10DE`); counts that fit one GPU of the
//! pool's model, since mig-parted places them itself.

mod common;

use serde_json::Value;
use tessera_interop::mig_parted;

fn check(config: &Value, policy: &tessera_compiler::CompiledPolicy) -> Vec<String> {
    let mut problems = Vec::new();
    let top = config.as_object().expect("a mapping");
    let keys: Vec<&str> = top.keys().map(String::as_str).collect();
    if keys != ["version", "mig-configs"] {
        problems.push(format!("top-level keys {keys:?}"));
    }
    if config["version"] != "v1" {
        problems.push("version is not v1".into());
    }
    for (name, entries) in config["mig-configs"]
        .as_object()
        .expect("mig-configs is a map")
    {
        let entries = entries.as_array().expect("a config is a list");
        if entries.is_empty() {
            problems.push(format!("{name}: empty"));
        }
        let (pool, layout) = policy
            .pools
            .iter()
            .flat_map(|p| p.layouts.iter().map(move |l| (p, l)))
            .find(|(p, l)| format!("{}-{}", p.name, l.name) == *name)
            .unwrap_or_else(|| panic!("{name} names no pool layout"));
        let model =
            tessera_compiler::mig::builtin_model(&pool.gpu_model).expect("a built-in model");
        for entry in entries {
            let entry = entry.as_object().expect("an entry is a map");
            for key in entry.keys() {
                if !["devices", "mig-enabled", "mig-devices", "device-filter"]
                    .contains(&key.as_str())
                {
                    problems.push(format!("{name}: unknown key {key}"));
                }
            }
            let devices_ok = entry["devices"] == "all"
                || entry["devices"]
                    .as_array()
                    .is_some_and(|d| d.iter().all(Value::is_u64));
            if !devices_ok {
                problems.push(format!("{name}: devices"));
            }
            if entry["mig-enabled"] != true {
                problems.push(format!("{name}: mig-enabled"));
            }
            let filters: Vec<&str> = match entry.get("device-filter") {
                Some(Value::String(s)) => vec![s.as_str()],
                Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            for f in filters {
                let ok = f.len() == 10
                    && f.starts_with("0x")
                    && f.ends_with("10DE")
                    && f[2..].bytes().all(|b| b.is_ascii_hexdigit());
                if !ok {
                    problems.push(format!("{name}: device-filter {f}"));
                }
            }
            let mut ids = Vec::new();
            for (profile, count) in entry["mig-devices"]
                .as_object()
                .expect("mig-devices is a map")
            {
                let id = model
                    .resolve_profile(profile)
                    .unwrap_or_else(|| panic!("{name}: {profile} is no profile of {}", model.name));
                let count = count.as_u64().filter(|c| *c > 0).expect("a positive count");
                ids.extend(std::iter::repeat_n(id, count as usize));
            }
            if tessera_compiler::mig::place(&ids).is_err() {
                problems.push(format!("{name}: the instances do not fit one GPU"));
            }
            let mut want: Vec<u32> = layout.instances.iter().map(|i| i.profile_id).collect();
            want.sort();
            ids.sort();
            if ids != want {
                problems.push(format!("{name}: not the layout's instances"));
            }
        }
    }
    problems
}

#[test]
fn the_examples_export_valid_mig_parted_configs_one_per_layout() {
    for example in ["quickstart", "acme"] {
        let policy = common::example(example);
        let (config, _) = mig_parted::export(&policy);
        let problems = check(&config, &policy);
        assert!(problems.is_empty(), "{example}: {problems:#?}");
        let layouts: usize = policy
            .pools
            .iter()
            .filter(|p| p.sharing == tessera_compiler::model::Sharing::Mig)
            .map(|p| p.layouts.len())
            .sum();
        assert_eq!(
            config["mig-configs"].as_object().unwrap().len(),
            layouts,
            "{example}"
        );
    }
    let (config, _) = mig_parted::export(&common::example("quickstart"));
    assert_eq!(
        config["mig-configs"]["h100-infer-balanced"][0]["device-filter"],
        serde_json::json!(["0x233010DE"])
    );
}
