//! `import ∘ export` is the identity on what both tessera and Kueue express (a [`Fleet`]): on
//! random tenant trees with guarantees, limits, lending limits and weights, over random pools
//! and tiers. And the imported documents compile back to the same fleet.

mod common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use tessera_compiler::units::{Bytes, Gpus, Millicores};
use tessera_interop::fleet::{Fleet, Pool, Quota, Tenant, Tier};
use tessera_interop::kueue;

/// A quantity in half GPUs, so that both whole and fractional amounts are drawn.
fn halves(n: i64) -> Gpus {
    Gpus::milli(n * 500)
}

#[derive(Debug, Clone)]
struct Draw {
    tiers: Vec<i64>,
    pools: Vec<(u32, String)>,
    /// Per tenant after the root: its parent's index among those before it.
    parents: Vec<usize>,
    /// Per tenant and pool: fractions (0..=100) of what is left for the guarantee, of the room
    /// between guarantee and the parent's limit for the limit, of the guarantee for lending;
    /// and whether the tenant has the pool at all.
    shares: Vec<Vec<(u8, u8, u8, bool)>>,
    weights: Vec<u8>,
}

fn draw() -> impl Strategy<Value = Draw> {
    (1usize..=3, 1usize..=3, 0usize..=6).prop_flat_map(|(tiers, pools, tenants)| {
        (
            prop::collection::btree_set(0i64..1000, tiers).prop_map(|s| s.into_iter().collect()),
            prop::collection::vec(
                (
                    1u32..=4,
                    prop::sample::select(vec!["H100-SXM5-80GB", "A100-SXM4-80GB", "L4-24GB"]),
                ),
                pools,
            )
            .prop_map(|v| v.into_iter().map(|(n, m)| (n, m.to_string())).collect()),
            (0..tenants).map(|i| 0..=i).collect::<Vec<_>>(),
            prop::collection::vec(
                prop::collection::vec(
                    (0u8..=100, 0u8..=100, 0u8..=100, prop::bool::weighted(0.85)),
                    pools,
                ),
                tenants + 1,
            ),
            prop::collection::vec(0u8..4, tenants + 1),
        )
            .prop_map(|(tiers, pools, parents, shares, weights)| Draw {
                tiers,
                pools,
                parents,
                shares,
                weights,
            })
    })
}

/// A fleet the compiler accepts: children's guarantees fit their parent's, limits within the
/// parent's, lending within the guarantee; the root's limit is the capacity.
fn fleet(d: &Draw) -> Fleet {
    let tiers = d
        .tiers
        .iter()
        .enumerate()
        .map(|(i, v)| Tier {
            name: format!("tier-{i}"),
            value: *v,
        })
        .collect();
    let pools: Vec<Pool> = d
        .pools
        .iter()
        .enumerate()
        .map(|(i, (nodes, model))| Pool {
            name: format!("pool-{i}"),
            gpu_model: model.clone(),
            node_selector: BTreeMap::from([("tessera/pool".to_string(), format!("pool-{i}"))]),
            nodes: *nodes,
            gpus_per_node: 8,
            cpu_per_node: Millicores(128_000),
            memory_per_node: Bytes::gib(1024),
        })
        .collect();
    let weights = [1.0, 2.0, 0.5, 3.25];
    let mut tenants: Vec<Tenant> = Vec::new();
    // What each tenant still has to hand to children, per pool (in halves).
    let mut left: Vec<BTreeMap<String, i64>> = Vec::new();
    let count = d.parents.len() + 1;
    for t in 0..count {
        let parent = (t > 0).then(|| d.parents[t - 1]);
        let mut quota = BTreeMap::new();
        let mut mine = BTreeMap::new();
        for (p, pool) in pools.iter().enumerate() {
            let (g, l, lend, has) = d.shares[t][p];
            let capacity = i64::from(pool.nodes) * 8 * 2;
            let (room, parent_limit) = match parent {
                None => (capacity, capacity),
                Some(pi) => match tenants[pi].quota.get(&pool.name) {
                    Some(q) if has => (left[pi][&pool.name], q.limit.units() / 3500),
                    _ => continue,
                },
            };
            let guarantee = room * i64::from(g) / 100;
            let limit = if parent.is_none() {
                capacity
            } else {
                guarantee + (parent_limit - guarantee).max(0) * i64::from(l) / 100
            };
            if limit == 0 {
                continue;
            }
            let lending = guarantee * i64::from(lend) / 100;
            if let Some(pi) = parent {
                *left[pi].get_mut(&pool.name).unwrap() -= guarantee;
            }
            mine.insert(pool.name.clone(), guarantee);
            quota.insert(
                pool.name.clone(),
                Quota {
                    guarantee: halves(guarantee),
                    limit: halves(limit),
                    lending_limit: halves(lending),
                },
            );
        }
        tenants.push(Tenant {
            name: format!("team-{t}"),
            parent: parent.map(|pi| format!("team-{pi}")),
            weight: weights[usize::from(d.weights[t])],
            quota,
        });
        left.push(mine);
    }
    Fleet {
        tiers,
        pools,
        tenants,
    }
    .normalized()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn import_of_export_is_the_identity(d in draw()) {
        let fleet = fleet(&d);
        let mut warnings = Vec::new();
        let objects = kueue::export::export_fleet(&fleet, &mut warnings);
        prop_assert!(warnings.is_empty(), "{warnings:?}");
        for o in &objects {
            let v = common::violations(o, "v1beta2");
            prop_assert!(v.is_empty(), "{v:?}");
        }
        let import = kueue::import(&[("kueue.yaml".into(), common::as_yaml(&objects))])
            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        prop_assert_eq!(&import.fleet, &fleet);

        // The documents written for it compile to the same fleet.
        let sources: Vec<_> = import
            .documents
            .iter()
            .enumerate()
            .map(|(i, d)| tessera_compiler::SourceFile::new(format!("doc{i}.yaml"), serde_json::to_string(d).unwrap()))
            .collect();
        let compilation = tessera_compiler::compile(&sources);
        let errors: Vec<_> = compilation.diagnostics.iter().filter(|d| d.is_error()).collect();
        prop_assert!(errors.is_empty(), "{errors:#?}");
        let (again, _) = Fleet::from_policy(compilation.policy.as_ref().unwrap());
        prop_assert_eq!(&again, &fleet);
    }
}

#[test]
fn the_examples_round_trip_on_their_fleet() {
    for example in ["quickstart", "acme"] {
        let policy = common::example(example);
        let (fleet, _) = Fleet::from_policy(&policy);
        let export = kueue::export(&policy);
        let import =
            kueue::import(&[("kueue.yaml".into(), common::as_yaml(&export.objects))]).unwrap();
        assert_eq!(import.fleet, fleet, "{example}");
    }
}
