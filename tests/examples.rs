//! The example repositories stay valid, warning-free and compile to a stable policy.

mod common;

use common::tessera;

#[test]
fn quickstart_is_valid_without_warnings() {
    let (code, stdout, _) = tessera(&[
        "validate",
        "--deny-warnings",
        "examples/policies/quickstart",
    ]);
    assert_eq!(code, 0, "{stdout}");
}

#[test]
fn acme_is_valid_without_warnings() {
    let (code, stdout, _) = tessera(&["validate", "--deny-warnings", "examples/policies/acme"]);
    assert_eq!(code, 0, "{stdout}");
}

#[test]
fn quickstart_compiles_to_this_policy() {
    let (code, stdout, stderr) = tessera(&["compile", "examples/policies/quickstart"]);
    assert_eq!(code, 0, "{stderr}");
    insta::assert_snapshot!(stdout);
}

#[test]
fn acme_compiles_with_every_tenant_resolved() {
    let (code, stdout, stderr) = tessera(&["compile", "examples/policies/acme"]);
    assert_eq!(code, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let tenants = v["tenants"].as_array().unwrap();
    assert!(
        tenants.len() >= 30,
        "acme has an org → team → project tree of 30+ tenants"
    );
    // Pre-order: every parent comes before its children.
    let mut seen = std::collections::BTreeSet::new();
    for t in tenants {
        if let Some(p) = t["parent"].as_str() {
            assert!(seen.contains(p), "{} before its parent {p}", t["name"]);
        }
        seen.insert(t["name"].as_str().unwrap().to_owned());
    }
    let gpus: f64 = v["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["capacity"]["gpus"].as_f64().unwrap())
        .sum();
    assert!(
        gpus >= 4000.0,
        "acme is a fleet of about 4,000 GPUs, has {gpus}"
    );
}
