//! The fleet the arrival benchmarks run on (`tessera bench service` and the solver's
//! `session_arrivals` bench): the solver benchmark's reference fleet
//! (`solver/benches/reference_fleet.rs`: H100 nodes of 8 GPUs, 64 in 500 of them in a MIG pool
//! cut in seven 1g instances per GPU, organisations of 29 projects with guarantees that split
//! each pool evenly) as a policy document and nodes, and the workloads submitted to it: one-GPU
//! training jobs and 1g inference replicas, spread evenly over the projects.
//!
//! Built with the crate's `bench-fleet` feature; it is benchmark support, never part of a
//! decision.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tessera_compiler::model::{
    Gpu, GpuRequest, Health, MigInstance, MigState, Node, Topology, WorkloadSpec,
};
use tessera_compiler::units::{Bytes, Millicores};

const PROJECTS_PER_ORG: usize = 29;
const GPUS_PER_NODE: usize = 8;
/// 1g instances of an H100 cut as `all-1g`.
const SLICES_PER_GPU: usize = 7;

/// The fleet's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub train_nodes: usize,
    pub infer_nodes: usize,
    pub orgs: usize,
}

impl Shape {
    /// `nodes` in the reference fleet's proportion (64 MIG nodes in 500), at least one of each.
    pub fn new(nodes: usize, orgs: usize) -> Shape {
        let infer_nodes = ((nodes * 64) as f64 / 500.0).round().max(1.0) as usize;
        Shape {
            train_nodes: nodes.saturating_sub(infer_nodes).max(1),
            infer_nodes,
            orgs: orgs.max(1),
        }
    }

    /// Whole GPUs in the training pool.
    pub fn train_gpus(&self) -> usize {
        self.train_nodes * GPUS_PER_NODE
    }

    /// 1g instances in the inference pool.
    pub fn infer_slices(&self) -> usize {
        self.infer_nodes * GPUS_PER_NODE * SLICES_PER_GPU
    }

    /// Every project tenant, in the order submissions rotate through them.
    pub fn projects(&self) -> Vec<String> {
        (0..PROJECTS_PER_ORG)
            .flat_map(|p| (0..self.orgs).map(move |o| format!("p-{o}-{p}")))
            .collect()
    }
}

/// The policy tree, one multi-document file. Guarantees split each pool evenly down the tree;
/// a project's inference guarantee is counted in 1g slices (sevenths of a GPU) so that the
/// projects together hold all of their organisation's.
pub fn policy(shape: Shape) -> String {
    let train = shape.train_gpus();
    let infer = shape.infer_nodes * GPUS_PER_NODE;
    let org_train = train / shape.orgs;
    let org_infer_slices = infer * SLICES_PER_GPU / shape.orgs;
    let project_train = org_train / PROJECTS_PER_ORG;
    let project_infer_slices = org_infer_slices / PROJECTS_PER_ORG;
    let sevenths = |slices: usize| format!("{:.6}", slices as f64 / SLICES_PER_GPU as f64);
    let h = "apiVersion: tessera/v1alpha1\n";
    let mut s = String::new();
    let _ = write!(
        s,
        "{h}kind: PriorityTiers\nmetadata: {{name: tiers}}\nspec: {{tiers: [{{name: serving, value: 1000}}, {{name: batch, value: 100}}]}}\n---\n\
         {h}kind: SloClass\nmetadata: {{name: serving}}\nspec: {{tier: serving, preemptible: false, isolation: {{minimum: mig}}}}\n---\n\
         {h}kind: SloClass\nmetadata: {{name: training}}\nspec: {{tier: batch, preemptible: true, isolation: {{minimum: exclusive}}, preemption: {{signal: SIGUSR1, gracePeriod: 5m, minRuntime: 30m}}}}\n---\n\
         {h}kind: MigLayout\nmetadata: {{name: all-1g}}\nspec: {{gpuModel: H100-SXM5-80GB, instances: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}}\n---\n\
         {h}kind: Pool\nmetadata: {{name: train}}\nspec: {{gpuModel: H100-SXM5-80GB, sharing: exclusive, capacity: {{nodes: {}, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}}}}\n---\n\
         {h}kind: Pool\nmetadata: {{name: infer}}\nspec: {{gpuModel: H100-SXM5-80GB, sharing: mig, migLayouts: [all-1g], capacity: {{nodes: {}, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}}}}\n---\n\
         {h}kind: Tenant\nmetadata: {{name: root}}\nspec: {{guarantee: {{train: {train}, infer: {infer}}}, sloClasses: [serving, training]}}\n",
        shape.train_nodes, shape.infer_nodes,
    );
    for o in 0..shape.orgs {
        let _ = write!(
            s,
            "---\n{h}kind: Tenant\nmetadata: {{name: org-{o}}}\nspec: {{parent: root, guarantee: {{train: {org_train}, infer: {}}}, trustDomain: org-{o}}}\n",
            sevenths(org_infer_slices)
        );
        for p in 0..PROJECTS_PER_ORG {
            let _ = write!(
                s,
                "---\n{h}kind: Tenant\nmetadata: {{name: p-{o}-{p}}}\nspec: {{parent: org-{o}, guarantee: {{train: {project_train}, infer: {}}}, weight: {}}}\n",
                sevenths(project_infer_slices),
                1 + p % 3
            );
        }
    }
    s
}

/// The simulated nodes: training nodes with whole GPUs, inference nodes with MIG on and every
/// GPU already cut in seven 1g instances (the layout the pool allows), so that the benchmark
/// measures admissions rather than re-partitioning.
pub fn nodes(shape: Shape) -> Vec<Node> {
    let node = |name: String, pool: &str, gpus: Vec<Gpu>| Node {
        name,
        pool: pool.to_owned(),
        labels: Default::default(),
        rack: None,
        nvlink_domain: None,
        cpu: Millicores(192_000),
        memory: Bytes(2 << 40),
        health: Health::Healthy,
        gpus,
    };
    let gpu = |index: usize, uuid: String, mig: bool| Gpu {
        index: index as u32,
        uuid,
        model: "H100-SXM5-80GB".to_owned(),
        health: Health::Healthy,
        mig: MigState {
            enabled: mig,
            pending: None,
        },
        instances: if mig {
            (0..SLICES_PER_GPU as u8)
                .map(|start| MigInstance {
                    profile: "1g.10gb".to_owned(),
                    start,
                    uuid: None,
                })
                .collect()
        } else {
            Vec::new()
        },
    };
    let train = (0..shape.train_nodes).map(|n| {
        let gpus = (0..GPUS_PER_NODE)
            .map(|g| gpu(g, format!("GPU-a{n:05x}{g:x}"), false))
            .collect();
        node(format!("t{n}"), "train", gpus)
    });
    let infer = (0..shape.infer_nodes).map(|n| {
        let gpus = (0..GPUS_PER_NODE)
            .map(|g| gpu(g, format!("GPU-b{n:05x}{g:x}"), true))
            .collect();
        node(format!("m{n}"), "infer", gpus)
    });
    train.chain(infer).collect()
}

/// What one submission asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One whole GPU in the training pool (preemptible).
    Training,
    /// One 1g instance in the inference pool (not preemptible).
    Serving,
}

impl Kind {
    /// The workload `tenant` submits.
    pub fn spec(self, tenant: String) -> WorkloadSpec {
        let (slo_class, pool, gpu, cpu, memory) = match self {
            Kind::Training => (
                "training",
                "train",
                GpuRequest {
                    count: Some(1),
                    mig_profile: None,
                    fraction: None,
                },
                8_000,
                64 << 30,
            ),
            Kind::Serving => (
                "serving",
                "infer",
                GpuRequest {
                    count: None,
                    mig_profile: Some("1g.10gb".to_owned()),
                    fraction: None,
                },
                2_000,
                16 << 30,
            ),
        };
        WorkloadSpec {
            tenant,
            slo_class: slo_class.to_owned(),
            pool: Some(pool.to_owned()),
            replicas: 1,
            min_member: None,
            gpu,
            cpu: Millicores(cpu),
            memory: Bytes(memory),
            topology: Topology::default(),
            max_duration: None,
            command: Vec::new(),
            env: BTreeMap::new(),
        }
    }
}

/// Hands out submissions: kinds in proportion to each pool's capacity, and tenants in turn
/// within each kind, so that no project runs far past its guarantee.
pub struct Submissions {
    projects: Vec<String>,
    train_share: f64,
    issued: usize,
    training: usize,
    serving: usize,
}

impl Submissions {
    pub fn new(shape: Shape) -> Submissions {
        let train = shape.train_gpus() as f64;
        Submissions {
            projects: shape.projects(),
            train_share: train / (train + shape.infer_slices() as f64),
            issued: 0,
            training: 0,
            serving: 0,
        }
    }

    /// How many submissions were handed out.
    pub fn issued(&self) -> usize {
        self.issued
    }

    /// The next submission's spec (its tenant in it).
    pub fn next_spec(&mut self) -> WorkloadSpec {
        let kind = if (self.training as f64) <= self.train_share * self.issued as f64 {
            Kind::Training
        } else {
            Kind::Serving
        };
        self.issued += 1;
        let turn = match kind {
            Kind::Training => &mut self.training,
            Kind::Serving => &mut self.serving,
        };
        let tenant = self.projects[*turn % self.projects.len()].clone();
        *turn += 1;
        kind.spec(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_size_has_the_reference_proportions() {
        let shape = Shape::new(500, 10);
        assert_eq!((shape.train_nodes, shape.infer_nodes), (436, 64));
        assert_eq!(shape.projects().len(), 290);
        assert_eq!(nodes(shape).len(), 500);
    }

    #[test]
    fn the_policy_compiles_cleanly() {
        let shape = Shape::new(20, 2);
        let text = policy(shape);
        let compiled =
            tessera_compiler::compile(&[tessera_compiler::SourceFile::new("fleet.yaml", text)]);
        let errors: Vec<_> = compiled
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.message.clone())
            .collect();
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn submissions_follow_capacity_and_rotate_tenants() {
        let shape = Shape::new(500, 10);
        let mut subs = Submissions::new(shape);
        let specs: Vec<WorkloadSpec> = (0..1000).map(|_| subs.next_spec()).collect();
        assert_eq!(subs.issued(), 1000);
        let training = specs.iter().filter(|s| s.slo_class == "training").count();
        // 3,488 GPUs against 3,584 slices.
        assert!((480..=500).contains(&training), "{training}");
        let first_tenants: std::collections::BTreeSet<&str> =
            specs.iter().take(580).map(|s| s.tenant.as_str()).collect();
        assert_eq!(first_tenants.len(), 290);
    }
}
