//! Baseline placement under the same quota rules: the production solver still decides who is
//! admitted and who is preempted (quota, guarantees, borrowing, fair share, priority, queue
//! order), and the pool each admission goes to; a baseline placer of the openb harness
//! ([`crate::openb::BestFit`], [`crate::openb::Fgd`], ...) then chooses the node and GPUs inside
//! that pool, on the fleet as the baseline's own earlier choices left it. Only the node/GPU
//! choice differs from the solver's run.
//!
//! What the baselines cannot do is left to the solver: a workload on a MIG instance keeps the
//! solver's binding (the openb placers know no MIG geometry). A gang is placed whole or not at
//! all; an admission the baseline finds no room for waits for the next cycle (counted as
//! `unplaced_admissions`). The baselines check CPU, memory and GPU room per node, as in the
//! openb harness, but not a time-sliced pool's `maxClientsPerGpu` or the one-trust-domain rule
//! of shared GPUs, which only the solver knows.

use std::collections::HashMap;

use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::{Binding, Node, Sharing, WorkloadSpec};
use tessera_compiler::units::Gpus;
use tessera_solver::decision::ReplicaBinding;

use super::engine::{Job, JobState};
use crate::openb::{
    BestFit, Choice, Cluster, Fgd, FirstFit, ModelMask, NodeSpec, Placer, PolicyKind,
    PolicyOptions, Random, Task, TaskSpec, TypicalConfig, TypicalShapes,
};

/// A baseline placer for a replay.
pub trait BaselinePlacer {
    fn name(&self) -> &str;
    /// A placer for one cycle on `cluster` (one pool), which holds what runs there now.
    fn placer(&mut self, pool: &str, cluster: &Cluster) -> Box<dyn Placer>;
}

/// The openb harness's baselines (FirstFit, BestFit, FGD, Random) with the fgd.md options
/// (exact scores, ties to the first node); FGD's typical shapes are those of the whole trace.
pub struct OpenbBaseline {
    kind: PolicyKind,
    seed: u64,
    tasks: Vec<TaskSpec>,
    typical: HashMap<String, TypicalShapes>,
}

impl OpenbBaseline {
    /// `kind` must not be [`PolicyKind::Tessera`] (the openb harness's own policy is not a
    /// baseline: the replay's Tessera run is the production solver); `None` then.
    pub fn new(kind: PolicyKind, seed: u64, trace: &[super::TraceWorkload]) -> Option<Self> {
        if kind == PolicyKind::Tessera {
            return None;
        }
        Some(OpenbBaseline {
            kind,
            seed,
            tasks: trace.iter().filter_map(|w| task_spec(&w.spec)).collect(),
            typical: HashMap::new(),
        })
    }
}

impl BaselinePlacer for OpenbBaseline {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn placer(&mut self, pool: &str, cluster: &Cluster) -> Box<dyn Placer> {
        let options = PolicyOptions::default();
        match self.kind {
            PolicyKind::FirstFit => Box::new(FirstFit::new()),
            PolicyKind::BestFit => Box::new(BestFit::new(options, self.seed)),
            PolicyKind::Random => Box::new(Random::new(self.seed)),
            PolicyKind::Fgd | PolicyKind::Tessera => {
                let tasks = &self.tasks;
                let typical = self
                    .typical
                    .entry(pool.to_owned())
                    .or_insert_with(|| {
                        TypicalShapes::from_tasks(cluster, tasks, &TypicalConfig::fgd_md())
                    })
                    .clone();
                // No shape ids: every task is scored afresh (a placer lives one cycle).
                Box::new(Fgd::new(typical, 0, options, self.seed))
            }
        }
    }
}

/// One admission to place.
pub(crate) struct Request<'a> {
    pub(crate) spec: &'a WorkloadSpec,
    pub(crate) pool: &'a str,
    pub(crate) solver: &'a [ReplicaBinding],
}

const MIB: u64 = 1 << 20;

/// A workload's replica as an openb task: `None` for a MIG instance.
fn task_spec(spec: &WorkloadSpec) -> Option<TaskSpec> {
    let (num_gpu, gpu_milli) = match (spec.gpu.count, spec.gpu.fraction) {
        // A CPU-only workload is a CPU-only task.
        (Some(0), _) => (0, 0),
        (Some(n), _) => (n, 1000),
        (None, Some(f)) => (1, ((f * 1000.0).round() as u32).clamp(1, 1000)),
        _ => return None,
    };
    Some(TaskSpec {
        name: String::new(),
        cpu_milli: spec.cpu.0,
        memory_mib: spec.memory.0.div_ceil(MIB),
        num_gpu,
        gpu_milli,
        gpu_spec: Vec::new(),
        creation_time: None,
    })
}

fn task(spec: &TaskSpec) -> Task {
    Task {
        cpu_milli: spec.cpu_milli,
        memory_mib: spec.memory_mib,
        num_gpu: spec.num_gpu,
        gpu_milli: spec.gpu_milli,
        models: ModelMask::ANY,
        shape: u32::MAX,
    }
}

/// One pool as an openb cluster, with what runs there placed.
struct PoolCluster {
    cluster: Cluster,
    /// Per cluster node: its NVML GPU indices, by position.
    gpus: Vec<Vec<u32>>,
    names: Vec<String>,
}

fn pool_cluster(
    pool: &str,
    policy: &CompiledPolicy,
    nodes: &[Node],
    jobs: &[Job],
    trace: &[super::TraceWorkload],
) -> Option<PoolCluster> {
    let model = policy.pool(pool)?.gpu_model.clone();
    let members: Vec<&Node> = nodes.iter().filter(|n| n.pool == pool).collect();
    let list: Vec<NodeSpec> = members
        .iter()
        .map(|n| NodeSpec {
            name: n.name.clone(),
            cpu_milli: n.cpu.0,
            memory_mib: n.memory.0 / MIB,
            num_gpu: n.gpus.len() as u32,
            model: model.clone(),
        })
        .collect();
    let mut cluster = Cluster::new(&list, true).ok()?;
    let index: HashMap<String, usize> = members
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    let gpus: Vec<Vec<u32>> = members
        .iter()
        .map(|n| n.gpus.iter().map(|g| g.index).collect())
        .collect();
    for job in jobs {
        let JobState::Running {
            bindings, pool: p, ..
        } = &job.state
        else {
            continue;
        };
        if p != pool {
            continue;
        }
        let Some(spec) = task_spec(&trace[job.trace].spec) else {
            continue;
        };
        let t = task(&spec);
        for b in bindings {
            let Some(&node) = index.get(&b.node) else {
                continue;
            };
            let positions: Vec<usize> = b
                .gpus
                .iter()
                .filter_map(|g| gpus[node].iter().position(|x| x == g))
                .collect();
            // What the solver or an earlier cycle placed fits by construction; a binding that
            // does not (it cannot happen) is left out rather than stopping the run.
            let _ = cluster.place(
                &t,
                &Choice {
                    node,
                    gpus: positions,
                },
            );
        }
    }
    Some(PoolCluster {
        cluster,
        gpus,
        names: members.iter().map(|n| n.name.clone()).collect(),
    })
}

/// A pool's cluster and the placer deciding in it this cycle.
type PoolPlacer = (PoolCluster, Box<dyn Placer>);

/// Places the solver's admissions with `placer`, in decision order: per admission, its
/// bindings, or `None` when the baseline finds no room for the whole gang.
pub(crate) fn place(
    placer: &mut dyn BaselinePlacer,
    policy: &CompiledPolicy,
    nodes: &[Node],
    jobs: &[Job],
    trace: &[super::TraceWorkload],
    requests: &[Request<'_>],
) -> Vec<Option<Vec<Binding>>> {
    // Per pool, built at its first admission; `None`: not a pool the baseline can place in.
    let mut pools: HashMap<String, Option<PoolPlacer>> = HashMap::new();
    let solver_bindings = |r: &Request<'_>| -> Vec<Binding> {
        r.solver.iter().map(ReplicaBinding::binding).collect()
    };
    let mut out = Vec::with_capacity(requests.len());
    for r in requests {
        let Some(spec) = task_spec(r.spec) else {
            out.push(Some(solver_bindings(r)));
            continue;
        };
        if policy
            .pool(r.pool)
            .is_none_or(|p| p.sharing == Sharing::Mig)
        {
            out.push(Some(solver_bindings(r)));
            continue;
        }
        let entry = pools.entry(r.pool.to_owned()).or_insert_with(|| {
            pool_cluster(r.pool, policy, nodes, jobs, trace).map(|pc| {
                let p = placer.placer(r.pool, &pc.cluster);
                (pc, p)
            })
        });
        let Some((pc, p)) = entry else {
            out.push(Some(solver_bindings(r)));
            continue;
        };
        let t = task(&spec);
        let before = pc.cluster.clone();
        let mut bindings = Vec::with_capacity(r.solver.len());
        for _ in 0..r.solver.len() {
            let Some(choice) = p.choose(&pc.cluster, &t) else {
                break;
            };
            if pc.cluster.place(&t, &choice).is_err() {
                break;
            }
            bindings.push(Binding {
                node: pc.names[choice.node].clone(),
                gpus: choice
                    .gpus
                    .iter()
                    .map(|&g| pc.gpus[choice.node][g])
                    .collect(),
                mig_start: None,
                share: (t.num_gpu == 1 && t.gpu_milli < 1000)
                    .then(|| Gpus::milli(i64::from(t.gpu_milli))),
            });
        }
        if bindings.len() == r.solver.len() {
            out.push(Some(bindings));
        } else {
            // The placer's caches saw the gang's partial placement: a fresh one for the rest.
            pc.cluster = before;
            *p = placer.placer(r.pool, &pc.cluster);
            out.push(None);
        }
    }
    out
}
