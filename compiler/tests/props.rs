//! Properties of the compiler over random tenant trees: valid trees compile, the result does
//! not depend on how documents are split into files or ordered, guarantees nest in the output,
//! and over-committing any child is caught at that child's parent.

use proptest::prelude::*;
use tessera_compiler::{Code, CompiledPolicy, SourceFile, compile};

const FLEET: &str = "apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {name: tiers}
spec: {tiers: [{name: batch, value: 100}]}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: training}
spec: {tier: batch, preemptible: true, isolation: {minimum: exclusive}}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: train}
spec:
  gpuModel: H100-SXM5-80GB
  sharing: exclusive
  capacity: {nodes: 64, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}
";

/// A tree as parent indices (tenant 0 is the root) and guarantees in whole GPUs that nest:
/// each child takes part of what its parent has left.
#[derive(Debug, Clone)]
struct Tree {
    parents: Vec<usize>,
    guarantees: Vec<u32>,
}

fn tree() -> impl Strategy<Value = Tree> {
    (1usize..40)
        .prop_flat_map(|n| {
            let parents: Vec<BoxedStrategy<usize>> = (1..n).map(|i| (0..i).boxed()).collect();
            (parents, prop::collection::vec(0u32..=100, n))
        })
        .prop_map(|(mut parents, percents)| {
            parents.insert(0, 0);
            let n = parents.len();
            let mut guarantees = vec![0u32; n];
            let mut left = vec![0u32; n];
            guarantees[0] = 512;
            left[0] = 512;
            for i in 1..n {
                let p = parents[i];
                let g = left[p] * percents[i] / 100;
                guarantees[i] = g;
                left[p] -= g;
                left[i] = g;
            }
            Tree {
                parents,
                guarantees,
            }
        })
}

fn document(t: &Tree, i: usize, guarantee: u32) -> String {
    let parent = if i == 0 {
        String::new()
    } else {
        format!("  parent: t{}\n", t.parents[i])
    };
    format!(
        "apiVersion: tessera/v1alpha1\nkind: Tenant\nmetadata: {{name: t{i}}}\nspec:\n{parent}  guarantee: {{train: {guarantee}}}\n"
    )
}

/// The tenants spread over `files` files in the order given by `order`.
fn sources(t: &Tree, order: &[usize], files: usize, bump: Option<usize>) -> Vec<SourceFile> {
    let mut texts = vec![String::new(); files];
    for (k, &i) in order.iter().enumerate() {
        let g = t.guarantees[i] + u32::from(bump == Some(i));
        let text = &mut texts[k % files];
        if !text.is_empty() {
            text.push_str("---\n");
        }
        text.push_str(&document(t, i, g));
    }
    let mut out = vec![SourceFile::new("fleet.yaml", FLEET)];
    out.extend(
        texts
            .into_iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .map(|(i, t)| SourceFile::new(format!("tenants/{i}.yaml"), t)),
    );
    out
}

fn compiled(sources: &[SourceFile]) -> CompiledPolicy {
    let c = compile(sources);
    c.policy
        .unwrap_or_else(|| panic!("a valid tree must compile: {:#?}", c.diagnostics))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn valid_trees_compile_the_same_however_they_are_split(
        t in tree(),
        seed in any::<u64>(),
        files in 1usize..6,
    ) {
        let n = t.parents.len();
        let identity: Vec<usize> = (0..n).collect();
        let mut shuffled = identity.clone();
        // A deterministic shuffle from the seed.
        let mut s = seed | 1;
        for i in (1..n).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            shuffled.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let a = compiled(&sources(&t, &identity, 1, None));
        let b = compiled(&sources(&t, &shuffled, files, None));
        prop_assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());

        // Guarantees nest in the output, and every tenant is listed after its parent.
        prop_assert_eq!(a.tenants.len(), n);
        for (k, tenant) in a.tenants.iter().enumerate() {
            if let Some(p) = &tenant.parent {
                prop_assert!(a.tenants[..k].iter().any(|x| &x.name == p));
            }
            let own = tenant.quota["train"].guarantee.gpus;
            let children = tenant
                .children
                .iter()
                .map(|c| a.tenant(c).unwrap().quota["train"].guarantee.gpus)
                .sum();
            prop_assert!(own >= children);
        }
    }

    #[test]
    fn over_committing_a_child_is_caught_at_its_parent(t in tree(), pick in any::<prop::sample::Index>()) {
        let n = t.parents.len();
        prop_assume!(n > 1);
        let i = 1 + pick.index(n - 1);
        let p = t.parents[i];
        let siblings: u32 = (1..n).filter(|&j| t.parents[j] == p).map(|j| t.guarantees[j]).sum();
        let order: Vec<usize> = (0..n).collect();
        let c = compile(&sources(&t, &order, 3, Some(i)));
        let over = c
            .diagnostics
            .iter()
            .filter(|d| d.code == Code::ChildGuaranteesExceedParent)
            .count();
        if siblings == t.guarantees[p] {
            // The parent had nothing left: one more GPU over-commits it, and only it.
            prop_assert_eq!(over, 1, "{:#?}", c.diagnostics);
            prop_assert!(c.policy.is_none());
        } else {
            prop_assert_eq!(over, 0, "{:#?}", c.diagnostics);
        }
        // Nothing else is reported, except that a child holding the whole fleet also goes over
        // its limit (the pool's 512 GPUs).
        let over_limit = t.guarantees[i] + 1 > 512;
        prop_assert!(c.diagnostics.iter().all(|d| d.code == Code::ChildGuaranteesExceedParent
            || (over_limit && d.code == Code::GuaranteeExceedsLimit)), "{:#?}", c.diagnostics);
    }
}
