//! Priority tiers, SLO classes, and whether each class's isolation minimum is offered.

use std::collections::BTreeMap;

use super::{Repo, Sink};
use crate::compiled::{CompiledPool, CompiledSloClass, CompiledTenant, CompiledTier};
use crate::diagnostic::{Code, Diagnostic, did_you_mean};
use crate::model::{Document, Kind};

pub(crate) fn resolve(repo: &Repo, sink: &mut Sink) -> (Vec<CompiledTier>, Vec<CompiledSloClass>) {
    // In source order, so that the document reported as extra is the one added later.
    let tier_docs: Vec<_> = repo
        .docs
        .iter()
        .filter(|d| d.kind() == Kind::PriorityTiers)
        .collect();
    for extra in tier_docs.iter().skip(1) {
        sink.push(
            Diagnostic::new(
                Code::MissingPriorityTiers,
                format!(
                    "a second PriorityTiers document `{}`; the fleet has one list of tiers (`{}`)",
                    extra.name, tier_docs[0].name
                ),
            )
            .at(extra.value_loc("/metadata/name"))
            .field("metadata.name")
            .help(format!(
                "move these tiers into `{}` at {}",
                tier_docs[0].name,
                tier_docs[0]
                    .loc("/metadata/name")
                    .map(|l| l.to_string())
                    .unwrap_or_default()
            )),
        );
    }
    // Every document's tiers count, so that one misplaced document does not make every class
    // that uses its tiers an error too.
    let mut tiers: BTreeMap<String, i64> = BTreeMap::new();
    let mut values: BTreeMap<i64, String> = BTreeMap::new();
    for doc in &tier_docs {
        let Document::PriorityTiers(spec) = &doc.document else {
            continue;
        };
        for (i, t) in spec.tiers.iter().enumerate() {
            if tiers.contains_key(&t.name) {
                sink.push(
                    Diagnostic::new(
                        Code::DuplicatePriorityValue,
                        format!("tier `{}` is listed twice", t.name),
                    )
                    .at(doc.value_loc(&format!("/spec/tiers/{i}/name")))
                    .field(format!("spec.tiers[{i}].name"))
                    .help("give each tier its own name"),
                );
                continue;
            }
            if let Some(other) = values.get(&t.value) {
                sink.push(
                    Diagnostic::new(
                        Code::DuplicatePriorityValue,
                        format!(
                            "tier `{}` has value {}, the same as tier `{other}`",
                            t.name, t.value
                        ),
                    )
                    .at(doc.value_loc(&format!("/spec/tiers/{i}/value")))
                    .field(format!("spec.tiers[{i}].value"))
                    .help("priority values order admission, so each tier needs its own value"),
                );
            }
            values.insert(t.value, t.name.clone());
            tiers.insert(t.name.clone(), t.value);
        }
    }
    let mut classes = Vec::new();
    for doc in repo.of(Kind::SloClass) {
        let Document::SloClass(spec) = &doc.document else {
            continue;
        };
        let Some(&priority) = tiers.get(&spec.tier) else {
            let help = if tier_docs.is_empty() {
                "add a PriorityTiers document listing the tiers".to_owned()
            } else {
                let names: Vec<&str> = tiers.keys().map(String::as_str).collect();
                match did_you_mean(&spec.tier, names.iter().copied()) {
                    Some(s) => format!("did you mean `{s}`? tiers: {}", names.join(", ")),
                    None => format!("tiers: {}", names.join(", ")),
                }
            };
            let code = if tier_docs.is_empty() {
                Code::MissingPriorityTiers
            } else {
                Code::UnknownTier
            };
            sink.push(
                Diagnostic::new(code, format!("unknown tier `{}`", spec.tier))
                    .at(doc.value_loc("/spec/tier"))
                    .field("spec.tier")
                    .help(help),
            );
            continue;
        };
        classes.push(CompiledSloClass {
            name: doc.name.clone(),
            tier: spec.tier.clone(),
            priority,
            preemptible: spec.preemptible,
            isolation_minimum: spec.isolation.minimum,
            checkpoint_signal: spec.preemption.signal.clone(),
            grace_period_seconds: spec.preemption.grace_period.seconds(),
            min_runtime_seconds: spec.preemption.min_runtime.seconds(),
        });
    }
    let mut ordered: Vec<CompiledTier> = tiers
        .into_iter()
        .map(|(name, value)| CompiledTier { name, value })
        .collect();
    ordered.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.name.cmp(&b.name)));
    (ordered, classes)
}

/// Every class must be usable somewhere: some tenant allowed it may use a pool whose sharing is
/// at least the class's isolation minimum. And a leaf's guarantee in a pool none of its classes
/// accepts can never be used.
pub(crate) fn check_isolation(
    repo: &Repo,
    pools: &[CompiledPool],
    classes: &[CompiledSloClass],
    tenants: &[CompiledTenant],
    sink: &mut Sink,
) {
    let pool = |name: &str| pools.iter().find(|p| p.name == name);
    for class in classes {
        let Some(doc) = repo.get(Kind::SloClass, &class.name) else {
            continue;
        };
        let users: Vec<&CompiledTenant> = tenants
            .iter()
            .filter(|t| t.slo_classes.contains(&class.name))
            .collect();
        if users.is_empty() {
            if !tenants.is_empty() {
                sink.push(
                    Diagnostic::new(
                        Code::UnusedSloClass,
                        format!("no tenant may use SLO class `{}`", class.name),
                    )
                    .at(doc.value_loc("/metadata/name"))
                    .field("metadata.name")
                    .help("add it to a tenant's `sloClasses`, or delete it"),
                );
            }
            continue;
        }
        let offered = users.iter().any(|t| {
            t.quota
                .keys()
                .filter_map(|p| pool(p))
                .any(|p| p.sharing >= class.isolation_minimum)
        });
        if !offered {
            sink.push(
                Diagnostic::new(
                    Code::IsolationNotOffered,
                    format!(
                        "class `{}` needs at least `{}` isolation, but no pool its tenants may use offers it",
                        class.name,
                        class.isolation_minimum.as_str()
                    ),
                )
                .at(doc.value_loc("/spec/isolation/minimum"))
                .field("spec.isolation.minimum")
                .help("lower the minimum, or give the class's tenants quota in a pool shared that strictly (exclusive > mig > mps > timeslice)"),
            );
        }
    }
    let resolved = |c: &String| classes.iter().any(|k| &k.name == c);
    // A tenant whose classes did not all resolve has an error already; a warning about what it
    // may use would only repeat it.
    for t in tenants
        .iter()
        .filter(|t| t.children.is_empty() && t.slo_classes.iter().all(resolved))
    {
        let Some(doc) = repo.get(Kind::Tenant, &t.name) else {
            continue;
        };
        let Document::Tenant(spec) = &doc.document else {
            continue;
        };
        for (pool_name, q) in &spec.guarantee {
            let Some(p) = pool(pool_name) else { continue };
            if q.resources().gpus.units() == 0 {
                continue;
            }
            let usable = t.slo_classes.iter().any(|c| {
                classes
                    .iter()
                    .any(|k| &k.name == c && p.sharing >= k.isolation_minimum)
            });
            if !usable {
                sink.push(
                    Diagnostic::new(
                        Code::UnusableGuarantee,
                        format!(
                            "tenant `{}` is guaranteed GPUs in pool `{pool_name}` ({} sharing), but none of its SLO classes may run there",
                            t.name,
                            p.sharing.as_str()
                        ),
                    )
                    .at(doc.loc(&format!("/spec/guarantee/{}", crate::yaml::escape(pool_name))))
                    .field(format!("spec.guarantee.{pool_name}"))
                    .help("move the guarantee to a pool whose sharing meets one of the tenant's classes, or allow a class that fits this pool"),
                );
            }
        }
    }
}
