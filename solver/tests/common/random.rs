//! Random small fleets for property tests (`invariants.rs`, `incremental.rs`): a policy of an
//! exclusive, a MIG and an MPS pool with a tenant tree, nodes with random geometry, random
//! workloads, and a decision applied to get the next running state.

use std::collections::{BTreeMap, BTreeSet};

use tessera_compiler::compiled::CompiledPolicy;
use tessera_compiler::mig;
use tessera_compiler::model::{
    ClusterStateSpec, Gpu, GpuRequest, Health, MigInstance, MigState, Node, PendingWorkload,
    Topology, TopologyMode, WorkloadSpec,
};
use tessera_compiler::units::{Bytes, Millicores};
use tessera_compiler::{SourceFile, compile};
use tessera_solver::carry::carry_out;
use tessera_solver::decision::Decision;
use tessera_solver::problem::unix;

pub const NOW: &str = "2026-11-20T08:00:00Z";

/// splitmix64: the case's seed drives every choice.
pub struct Seeded(pub u64);

impl Seeded {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + self.below(u64::from(hi - lo + 1)) as u32
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

pub struct Fleet {
    pub policy_yaml: String,
    /// (pool, nodes, gpus per node)
    pub pools: Vec<(&'static str, u32, u32)>,
    pub node_cpu: u32,
}

pub const LAYOUTS: [&[&str]; 4] = [
    &["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
    &["3g.40gb", "3g.40gb"],
    &["7g.80gb"],
    &[
        "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb",
    ],
];

pub fn fleet(rng: &mut Seeded) -> Fleet {
    let pools = vec![
        ("train", rng.range(1, 3), rng.range(2, 8)),
        ("infer", rng.range(1, 2), rng.range(2, 4)),
        ("share", rng.range(1, 2), rng.range(2, 4)),
    ];
    let node_cpu = rng.range(6, 32);
    let mut y = String::from(
        "apiVersion: tessera/v1alpha1\nkind: PriorityTiers\nmetadata: {name: tiers}\nspec:\n  tiers:\n    - {name: high, value: 1000}\n    - {name: mid, value: 500}\n    - {name: low, value: 100}\n",
    );
    for (name, tier, preemptible, min, grace, runtime) in [
        ("critical", "high", false, "exclusive", "1m", "0s"),
        ("serving", "high", false, "mig", "1m", "0s"),
        ("urgent", "mid", true, "timeslice", "2m", "0s"),
        ("batch", "low", true, "exclusive", "5m", "30m"),
        ("notebook", "low", true, "timeslice", "30s", "10m"),
    ] {
        y += &format!(
            "---\napiVersion: tessera/v1alpha1\nkind: SloClass\nmetadata: {{name: {name}}}\nspec: {{tier: {tier}, preemptible: {preemptible}, isolation: {{minimum: {min}}}, preemption: {{gracePeriod: {grace}, minRuntime: {runtime}}}}}\n"
        );
    }
    for (i, l) in LAYOUTS.iter().enumerate() {
        y += &format!(
            "---\napiVersion: tessera/v1alpha1\nkind: MigLayout\nmetadata: {{name: layout-{i}}}\nspec: {{gpuModel: H100-SXM5-80GB, instances: [{}]}}\n",
            l.join(", ")
        );
    }
    for &(name, nodes, gpus) in &pools {
        let extra = match name {
            "train" if nodes >= 2 => "  sharing: exclusive\n  nvlinkDomain: rack\n".to_owned(),
            "train" => "  sharing: exclusive\n".to_owned(),
            "infer" => format!(
                "  sharing: mig\n  migLayouts: [layout-0, layout-1, layout-2, layout-3]\n  reconfiguration: {{maxPerGpuPerHour: {}}}\n",
                rng.range(1, 2)
            ),
            _ => "  sharing: mps\n  maxClientsPerGpu: 3\n".to_owned(),
        };
        let rack = if name == "train" && nodes >= 2 {
            ", nodesPerNvlinkDomain: 2"
        } else {
            ""
        };
        y += &format!(
            "---\napiVersion: tessera/v1alpha1\nkind: Pool\nmetadata: {{name: {name}}}\nspec:\n  gpuModel: H100-SXM5-80GB\n  capacity: {{nodes: {nodes}, gpusPerNode: {gpus}, cpuPerNode: {node_cpu}, memoryPerNode: 1Ti{rack}}}\n{extra}"
        );
    }
    // Guarantees in whole GPUs: a + b ≤ capacity, a1 ≤ a; limits between guarantee and capacity.
    let quota = |rng: &mut Seeded| {
        let mut a = BTreeMap::new();
        let mut a1 = BTreeMap::new();
        let mut b = BTreeMap::new();
        for &(name, nodes, gpus) in &pools {
            let cap = nodes * gpus;
            let ga = rng.range(0, cap / 2);
            let gb = rng.range(0, cap - ga);
            let ga1 = rng.range(0, ga);
            let la = rng.range(ga.max(1), cap);
            let la1 = rng.range(ga1.max(1), la);
            let lb = rng.range(gb.max(1), cap);
            // Some CPU limits (cores), below the pool's: a1's within a's.
            let cores = node_cpu * nodes;
            let ca = rng.chance(50).then(|| rng.range(2, cores));
            let ca1 = match ca {
                Some(c) => rng.chance(50).then(|| rng.range(1, c)),
                None => rng.chance(50).then(|| rng.range(2, cores)),
            };
            let cb = rng.chance(50).then(|| rng.range(2, cores));
            a.insert(name, (ga, la, rng.range(0, ga), ca));
            a1.insert(name, (ga1, la1, rng.range(0, ga1), ca1));
            b.insert(name, (gb, lb, rng.range(0, gb), cb));
        }
        (a, a1, b)
    };
    let (a, a1, b) = quota(rng);
    let root_guarantee: Vec<String> = pools
        .iter()
        .map(|&(n, nodes, gpus)| format!("{n}: {}", nodes * gpus))
        .collect();
    y += &format!(
        "---\napiVersion: tessera/v1alpha1\nkind: Tenant\nmetadata: {{name: org}}\nspec:\n  guarantee: {{{}}}\n  sloClasses: [critical, serving, urgent, batch, notebook]\n",
        root_guarantee.join(", ")
    );
    for (name, parent, q, trust) in [
        ("a", "org", &a, "ta"),
        ("a1", "a", &a1, "ta1"),
        ("b", "org", &b, "tb"),
    ] {
        let g: Vec<String> = q.iter().map(|(p, v)| format!("{p}: {}", v.0)).collect();
        let l: Vec<String> = q
            .iter()
            .map(|(p, v)| match v.3 {
                Some(cpu) => format!("{p}: {{gpus: {}, cpu: {cpu}}}", v.1),
                None => format!("{p}: {}", v.1),
            })
            .collect();
        let ll: Vec<String> = q.iter().map(|(p, v)| format!("{p}: {}", v.2)).collect();
        y += &format!(
            "---\napiVersion: tessera/v1alpha1\nkind: Tenant\nmetadata: {{name: {name}}}\nspec:\n  parent: {parent}\n  guarantee: {{{}}}\n  limit: {{{}}}\n  lendingLimit: {{{}}}\n  weight: {}\n  trustDomain: {trust}\n",
            g.join(", "),
            l.join(", "),
            ll.join(", "),
            rng.range(1, 3)
        );
    }
    Fleet {
        policy_yaml: y,
        pools,
        node_cpu,
    }
}

impl Fleet {
    /// Every pool lets borrowers preempt each other by fair share (nothing drawn).
    pub fn with_fair_preemption(&mut self) {
        for (name, _, _) in &self.pools {
            self.policy_yaml = self.policy_yaml.replace(
                &format!("metadata: {{name: {name}}}\nspec:\n"),
                &format!(
                    "metadata: {{name: {name}}}\nspec:\n  preemption: {{borrowers: FairShare}}\n"
                ),
            );
        }
    }
}

pub fn nodes(rng: &mut Seeded, f: &Fleet) -> Vec<Node> {
    let mut out = Vec::new();
    let mut uuid = 0u32;
    for &(pool, count, gpus) in &f.pools {
        for n in 0..count {
            let name = format!("{pool}-{n}");
            let mut list = Vec::new();
            for i in 0..gpus {
                uuid += 1;
                let mig = pool == "infer";
                let instances = if mig && rng.chance(60) {
                    let layout = rng.pick(&LAYOUTS);
                    let ids: Vec<u32> = layout
                        .iter()
                        .map(|p| {
                            mig::builtin_model("H100-SXM5-80GB")
                                .unwrap()
                                .resolve_profile(p)
                                .unwrap()
                        })
                        .collect();
                    mig::place(&ids)
                        .unwrap()
                        .into_iter()
                        .map(|p| MigInstance {
                            profile: p.profile_id.to_string(),
                            start: p.start,
                            uuid: None,
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                list.push(Gpu {
                    index: i,
                    uuid: format!("GPU-{uuid:08x}-0000-0000-0000-000000000000"),
                    model: "H100-SXM5-80GB".into(),
                    health: if rng.chance(5) {
                        Health::Degraded
                    } else {
                        Health::Healthy
                    },
                    mig: MigState {
                        enabled: mig,
                        pending: None,
                    },
                    instances,
                });
            }
            out.push(Node {
                name,
                pool: pool.into(),
                labels: BTreeMap::new(),
                rack: None,
                nvlink_domain: (pool == "train" && count >= 2).then(|| format!("rack-{}", n / 2)),
                cpu: Millicores(u64::from(f.node_cpu) * 1000),
                memory: Bytes(1 << 40),
                health: Health::Healthy,
                gpus: list,
            });
        }
    }
    out
}

pub fn workload(rng: &mut Seeded) -> WorkloadSpec {
    let tenant = rng.pick(&["a", "a1", "b"]).to_string();
    let replicas = rng.range(1, 3);
    let min_member = rng.chance(30).then(|| rng.range(1, replicas));
    let (class, gpu) = match rng.below(3) {
        0 => (
            *rng.pick(&["critical", "batch", "urgent"]),
            GpuRequest {
                count: Some(rng.range(1, 4)),
                mig_profile: None,
                fraction: None,
            },
        ),
        1 => (
            *rng.pick(&["serving", "urgent", "notebook"]),
            GpuRequest {
                count: None,
                mig_profile: Some(
                    rng.pick(&["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"])
                        .to_string(),
                ),
                fraction: None,
            },
        ),
        _ => (
            *rng.pick(&["urgent", "notebook"]),
            GpuRequest {
                count: None,
                mig_profile: None,
                fraction: Some(*rng.pick(&[0.1, 0.25, 0.5])),
            },
        ),
    };
    WorkloadSpec {
        tenant,
        slo_class: class.into(),
        pool: None,
        replicas,
        min_member,
        gpu,
        cpu: Millicores(u64::from(rng.range(1, 4)) * 1000),
        memory: Bytes(u64::from(rng.range(1, 64)) << 30),
        topology: Topology {
            same_nvlink_domain: *rng.pick(&[
                TopologyMode::None,
                TopologyMode::Preferred,
                TopologyMode::Required,
            ]),
        },
        max_duration: None,
        command: Vec::new(),
        env: BTreeMap::new(),
    }
}

/// `n` waiting workloads named `prefix-i`; a quarter of them take the name of an earlier one
/// of another tenant instead (names are per tenant: the solver must tell the two apart).
pub fn pending(rng: &mut Seeded, prefix: &str, n: u32, now: i64) -> Vec<PendingWorkload> {
    let mut out: Vec<PendingWorkload> = Vec::with_capacity(n as usize);
    for i in 0..n {
        let spec = workload(rng);
        let taken = |name: &str| {
            out.iter()
                .any(|q| q.spec.tenant == spec.tenant && q.name == name)
        };
        let shared = rng
            .chance(25)
            .then(|| {
                out.iter()
                    .find(|p| p.spec.tenant != spec.tenant && !taken(&p.name))
                    .map(|p| p.name.clone())
            })
            .flatten();
        out.push(PendingWorkload {
            name: shared.unwrap_or_else(|| format!("{prefix}-{i}")),
            spec,
            submitted_at: unix(now - i64::from(rng.range(0, 30)) * 60),
        });
    }
    out
}

pub fn document(state: &ClusterStateSpec) -> String {
    serde_json::json!({
        "apiVersion": "tessera/v1alpha1",
        "kind": "ClusterState",
        "metadata": {"name": "snap"},
        "spec": state,
    })
    .to_string()
}

/// Compiles the policy with the snapshot; panics on any error (the compiler's state checks are
/// the oversubscription oracle).
pub fn checked(
    policy_yaml: &str,
    state: &ClusterStateSpec,
    what: &str,
) -> (CompiledPolicy, ClusterStateSpec) {
    let c = compile(&[
        SourceFile::new("policy.yaml", policy_yaml),
        SourceFile::new("state.json", document(state)),
    ]);
    let errors: Vec<String> = c
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("{d:?}"))
        .collect();
    assert!(errors.is_empty(), "{what}: {errors:#?}");
    (
        c.policy.expect("policy"),
        c.states.into_iter().next().expect("state").1,
    )
}

/// The snapshot after applying a decision ([`carry_out`]), with the waiting work dropped and
/// the admitted work given random start and checkpoint times within the last four hours.
pub fn apply(
    before: &ClusterStateSpec,
    d: &Decision,
    rng: &mut Seeded,
    now: i64,
) -> ClusterStateSpec {
    let mut after = carry_out(before, d);
    let old: BTreeSet<(&str, &str)> = before
        .running
        .iter()
        .map(|r| (r.spec.tenant.as_str(), r.name.as_str()))
        .collect();
    // By tenant and name, as the decision lists them, so the draws keep their order.
    for r in after
        .running
        .iter_mut()
        .filter(|r| !old.contains(&(r.spec.tenant.as_str(), r.name.as_str())))
    {
        let started = now - i64::from(rng.range(0, 240)) * 60;
        r.started_at = unix(started);
        r.last_checkpoint_at = rng.chance(50).then(|| unix(started + (now - started) / 2));
    }
    after.observed_at = unix(now);
    after.pending.clear();
    after.usage = None;
    after.reservations.clear();
    after
}
