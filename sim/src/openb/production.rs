//! The production solver as an openb policy: the "Tessera" row is `tessera-solver` deciding
//! every arrival, through the same compiled policy, snapshot and incremental [`Session`] that
//! `tessera reconcile` runs, not a placer written for the benchmark.
//!
//! How the trace becomes a fleet:
//!
//! - One pool per GPU model of the node list (`openb-<model>`), shared by CUDA MPS with more
//!   client slots than the smallest share needs, so that only room limits sharing. A GPU of
//!   such a pool holds shares or, when none is on it, one whole-GPU task: the openb
//!   simulator's rule, which the solver follows (a whole-GPU request on an MPS pool).
//! - One tenant whose guarantee is every pool's capacity, one non-preemptible class: quota never
//!   binds, so only placement is measured, as it is for the baselines.
//! - A GPU task becomes a pending workload of one replica: `count` GPUs, or a `fraction` of
//!   one in thousandths, its CPU, its memory when the run checks memory (else none), and a pool
//!   restriction when `gpu_spec` pins it to models (each allowed model's pool in turn when it
//!   names several).
//! - A CPU-only task becomes a workload asking no GPU (`gpu: {count: 0}`), its CPU and memory
//!   as a GPU task's: the solver places it as it places any workload, by the same criteria (the
//!   GPUs its CPU would leave unfed first, then the fragmentation score against the running
//!   mix), and it runs in the next snapshots. For comparison, [`Production::with_cpu_only`]
//!   (the bench's `--cpu-only best-fit|fgd|kube`) places them by a baseline's rule instead, the
//!   next snapshot showing the node with that much less CPU (and memory): what a cluster whose
//!   own scheduler places its CPU-only pods would give the solver.
//!
//! Online, each arrival is decided by the standing [`Session`]. A task the solver leaves
//! waiting is removed again (openb drops what does not fit). Every [`RENEW_EVERY`] arrivals, and
//! whenever the session asks for a full cycle or its answer no longer fits the cluster (a
//! CPU-only pod placed by a rule took the CPU since the session opened), the session is opened
//! again on a fresh snapshot of the cluster: as the service runs a full cycle every period.
//! The fresh snapshot is also what the solver's fragmentation scoring measures against (the mix
//! of running work), so the cadence decides how current that mix is. In cycles
//! ([`Placer::place_cycle`]) each cycle is one full solve of the snapshot with the cycle's tasks
//! pending (those a rule places aside).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use tessera_compiler::model::{
    Binding, ClusterStateSpec, Gpu, GpuRequest, Health, MigState, Node as StateNode,
    PendingWorkload, RunningWorkload, Topology, WorkloadSpec,
};
use tessera_compiler::units::{Bytes, Gpus, Millicores};
use tessera_compiler::{CompiledPolicy, SourceFile, WorkloadKey, compile};
use tessera_solver::decision::{ReplicaBinding, WorkloadDecision};
use tessera_solver::session::{Admission, Removal, Session};
use tessera_solver::{Outcome, SolveOptions};

use super::best_fit::BestFit;
use super::cluster::{Choice, Cluster, PlaceError, Task};
use super::policy::{Placer, PolicyOptions};
use super::trace::MILLI;

/// Arrivals decided by one session before it is opened again on a fresh snapshot.
pub const RENEW_EVERY: usize = 100;

/// The snapshot's instant; every arrival is submitted at it (names order them).
/// When every generated snapshot is observed (2026-01-01T00:00:00Z): the trace's own times do
/// not matter to online placement, only its order.
const OBSERVED_AT: jiff::Timestamp = jiff::Timestamp::constant(1_767_225_600, 0);
const TENANT: &str = "openb";
const CLASS: &str = "batch";

/// Why the production policy could not be set up for a cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProductionError {
    #[error("the generated policy does not compile: {0}")]
    Policy(String),
}

/// The production solver placing openb tasks. See the module documentation.
pub struct Production {
    /// `None` when the cluster has no GPU (no pool to write): every GPU task is skipped.
    policy: Option<CompiledPolicy>,
    /// Pool name per [`super::cluster::ModelId`].
    pools: Vec<String>,
    check_memory: bool,
    session: Option<Session>,
    /// Arrivals decided by the open session.
    decided: usize,
    /// Tasks the solver placed so far, as the snapshot lists them.
    running: Vec<RunningWorkload>,
    /// Per node: CPU and memory (MiB) taken by CPU-only tasks a rule placed.
    taken_cpu: Vec<u64>,
    taken_memory: Vec<u64>,
    node_index: HashMap<String, usize>,
    /// Places the CPU-only tasks when a baseline's rule does ([`Production::with_cpu_only`]);
    /// `None`: the solver places them, as workloads asking no GPU.
    cpu_only: Option<Box<dyn Placer>>,
    /// BestFit's rule, for the CPU-only tasks the solver cannot place: those of a cluster with
    /// no GPU (which has no policy to solve), those that ask nothing the run counts, and those
    /// that only a node without GPUs has room for ([`Production::off_the_fleet`]).
    fallback: BestFit,
    next: u64,
}

impl std::fmt::Debug for Production {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Production")
            .field("pools", &self.pools)
            .field("running", &self.running.len())
            .finish_non_exhaustive()
    }
}

/// The pool of a model: a lower-case name, as policy names must be.
fn pool_name(model: &str) -> String {
    let mut s = String::from("openb-");
    for c in model.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else {
            s.push('-');
        }
    }
    s
}

/// The GPU model name the policy uses for a node-list model.
fn model_name(model: &str) -> String {
    pool_name(model)
}

/// The policy of a cluster: a GPU model, a pool per node-list model, one tenant that may use
/// all of every pool.
fn policy_text(cluster: &Cluster) -> String {
    let h = "apiVersion: tessera/v1alpha1\n";
    let mut s = String::new();
    let _ = write!(
        s,
        "{h}kind: PriorityTiers\nmetadata: {{name: tiers}}\nspec: {{tiers: [{{name: {CLASS}, value: 100}}]}}\n---\n\
         {h}kind: SloClass\nmetadata: {{name: {CLASS}}}\nspec: {{tier: {CLASS}, preemptible: false, isolation: {{minimum: mps}}}}\n"
    );
    let mut guarantee = Vec::new();
    for (m, model) in cluster.models().iter().enumerate() {
        let nodes: Vec<_> = cluster
            .nodes()
            .iter()
            .filter(|n| usize::from(n.model) == m)
            .collect();
        let gpus = nodes.iter().map(|n| n.gpu_left.len()).max().unwrap_or(0);
        if gpus == 0 {
            continue;
        }
        let cpu = nodes.iter().map(|n| n.cpu_capacity).max().unwrap_or(0);
        let memory = nodes.iter().map(|n| n.memory_capacity).max().unwrap_or(0);
        let (pool, name) = (pool_name(model), model_name(model));
        let _ = write!(
            s,
            "---\n{h}kind: GpuModel\nmetadata: {{name: {name}}}\nspec: {{memory: 16Gi}}\n\
             ---\n{h}kind: Pool\nmetadata: {{name: {pool}}}\nspec: {{gpuModel: {name}, sharing: mps, maxClientsPerGpu: 48, \
             capacity: {{nodes: {}, gpusPerNode: {gpus}, cpuPerNode: {cpu}m, memoryPerNode: {memory}Mi}}}}\n",
            nodes.len()
        );
        guarantee.push(format!("{pool}: {}", nodes.len() * gpus));
    }
    let _ = write!(
        s,
        "---\n{h}kind: Tenant\nmetadata: {{name: {TENANT}}}\nspec: {{guarantee: {{{}}}, sloClasses: [{CLASS}]}}\n",
        guarantee.join(", ")
    );
    s
}

/// The generated policy of a cluster with at least one GPU, compiled.
fn compile_policy(cluster: &Cluster) -> Result<CompiledPolicy, ProductionError> {
    let c = compile(&[SourceFile::new("openb-policy.yaml", policy_text(cluster))]);
    c.policy.ok_or_else(|| {
        let errors: Vec<String> = c
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .take(3)
            .map(|d| d.message.clone())
            .collect();
        ProductionError::Policy(errors.join("; "))
    })
}

impl Production {
    /// The production solver set up for `cluster` (nothing placed yet). `options` and `seed`
    /// are the run's: they decide the tie-breaks of the CPU-only tasks of a cluster with no
    /// GPU, which has no policy to solve (BestFit's rule places them).
    pub fn new(
        cluster: &Cluster,
        options: PolicyOptions,
        seed: u64,
    ) -> Result<Self, ProductionError> {
        let policy = if cluster.total_gpu_milli() == 0 {
            None
        } else {
            Some(compile_policy(cluster)?)
        };
        let n = cluster.nodes().len();
        Ok(Self {
            policy,
            pools: cluster.models().iter().map(|m| pool_name(m)).collect(),
            check_memory: cluster.check_memory(),
            session: None,
            decided: 0,
            running: Vec::new(),
            taken_cpu: vec![0; n],
            taken_memory: vec![0; n],
            node_index: cluster
                .nodes()
                .iter()
                .enumerate()
                .map(|(i, node)| (node.name.clone(), i))
                .collect(),
            cpu_only: None,
            fallback: BestFit::new(options, seed),
            next: 0,
        })
    }

    /// The cluster as a snapshot: the GPU tasks placed so far running, CPU-only tasks' CPU and
    /// memory taken off their nodes, and `pending` waiting.
    fn snapshot(&self, cluster: &Cluster, pending: Vec<PendingWorkload>) -> ClusterStateSpec {
        let nodes = cluster
            .nodes()
            .iter()
            .enumerate()
            .map(|(i, node)| StateNode {
                name: node.name.clone(),
                pool: self.pools[usize::from(node.model)].clone(),
                labels: BTreeMap::new(),
                rack: None,
                nvlink_domain: None,
                cpu: Millicores(node.cpu_capacity.saturating_sub(self.taken_cpu[i])),
                memory: Bytes(node.memory_capacity.saturating_sub(self.taken_memory[i]) << 20),
                health: Health::Healthy,
                gpus: (0..node.gpu_left.len())
                    .map(|g| Gpu {
                        index: g as u32,
                        uuid: format!("GPU-{i:x}-{g:x}"),
                        model: model_name(&cluster.models()[usize::from(node.model)]),
                        health: Health::Healthy,
                        mig: MigState::default(),
                        instances: Vec::new(),
                    })
                    .collect(),
            })
            .collect();
        ClusterStateSpec {
            observed_at: OBSERVED_AT,
            nodes,
            running: self.running.clone(),
            pending,
            usage: None,
            reservations: Vec::new(),
            reconfigurations: Vec::new(),
        }
    }

    /// Opens a session on the cluster as it is.
    fn renew(&mut self, cluster: &Cluster) {
        let Some(policy) = &self.policy else {
            return;
        };
        let state = self.snapshot(cluster, Vec::new());
        let (session, _) = Session::new(policy, &state, &SolveOptions::default())
            .expect("the snapshot of a cluster the harness placed is valid");
        self.session = Some(session);
        self.decided = 0;
    }

    /// The workload of a task, restricted to `pool` if given.
    fn workload(&mut self, task: &Task, pool: Option<String>) -> PendingWorkload {
        self.next += 1;
        let gpu = if task.is_cpu_only() {
            GpuRequest {
                count: Some(0),
                mig_profile: None,
                fraction: None,
            }
        } else if task.is_fractional() {
            GpuRequest {
                count: None,
                mig_profile: None,
                fraction: Some(f64::from(task.gpu_milli) / f64::from(MILLI)),
            }
        } else {
            GpuRequest {
                count: Some(task.num_gpu),
                mig_profile: None,
                fraction: None,
            }
        };
        PendingWorkload {
            name: format!("t{:07}", self.next),
            spec: WorkloadSpec {
                tenant: TENANT.into(),
                slo_class: CLASS.into(),
                pool,
                replicas: 1,
                min_member: None,
                gpu,
                cpu: Millicores(task.cpu_milli),
                memory: Bytes(if self.check_memory {
                    task.memory_mib << 20
                } else {
                    0
                }),
                topology: Topology::default(),
                max_duration: None,
                command: Vec::new(),
                env: BTreeMap::new(),
            },
            submitted_at: OBSERVED_AT,
        }
    }

    /// The pools a task may go to: `None` for any (no pin, or every model allowed, or a
    /// CPU-only task, which `gpu_spec` does not bind: it names the GPU's model), else each
    /// allowed model's pool.
    fn pins(&self, cluster: &Cluster, task: &Task) -> Option<Vec<String>> {
        if task.is_cpu_only() {
            return None;
        }
        let allowed: Vec<String> = (0..cluster.models().len())
            .filter(|&m| task.models.allows(m as u8))
            .map(|m| self.pools[m].clone())
            .collect();
        (allowed.len() < cluster.models().len()).then_some(allowed)
    }

    /// Where an admitted decision put its replica, as a harness choice.
    fn choice_of(&self, bindings: &[ReplicaBinding]) -> Option<Choice> {
        let b = bindings.first()?;
        Some(Choice {
            node: *self.node_index.get(&b.node)?,
            gpus: b.gpus.iter().map(|&g| g as usize).collect(),
        })
    }

    /// Records a task the solver placed as running (the next snapshot lists it).
    fn record(&mut self, cluster: &Cluster, arrival: PendingWorkload, choice: &Choice) {
        let share = arrival
            .spec
            .gpu
            .fraction
            .map(|f| Gpus::milli((f * f64::from(MILLI)).round() as i64));
        self.running.push(RunningWorkload {
            name: arrival.name,
            spec: arrival.spec,
            bindings: vec![Binding {
                node: cluster.node(choice.node).name.clone(),
                gpus: choice.gpus.iter().map(|&g| g as u32).collect(),
                mig_start: None,
                share,
            }],
            started_at: OBSERVED_AT,
            last_checkpoint_at: None,
        });
    }

    /// Decides one arrival on the open session: `Ok(Some)` admitted there, `Ok(None)` left
    /// waiting (and removed again), `Err(())` the session cannot answer (open a new one).
    fn admit_once(&mut self, arrival: &PendingWorkload) -> Result<Option<Choice>, ()> {
        let session = self.session.as_mut().ok_or(())?;
        let answer = session
            .admit(arrival)
            .expect("an arrival of the harness is valid and its name new");
        match answer {
            Admission::NeedsFullCycle(_) => Err(()),
            Admission::Decided {
                decision, changed, ..
            } => {
                // One non-preemptible tenant and nothing left waiting: an admission moves no
                // other workload. If one did, the harness's view would be stale: start again.
                if !changed.is_empty() {
                    self.session = None;
                    return Err(());
                }
                match &decision.outcome {
                    Outcome::Admit { bindings, .. } => self.choice_of(bindings).map(Some).ok_or(()),
                    _ => {
                        let key = WorkloadKey::new(TENANT, &arrival.name);
                        if !matches!(session.finish(&key), Ok(Removal::Removed)) {
                            self.session = None;
                        }
                        Ok(None)
                    }
                }
            }
        }
    }

    /// Decides a task: each allowed pool in turn (all at once when not pinned), on the open
    /// session, opening a new one when it cannot answer or its answer does not fit the cluster.
    fn decide(&mut self, cluster: &Cluster, task: &Task) -> Option<Choice> {
        self.policy.as_ref()?;
        let pools: Vec<Option<String>> = match self.pins(cluster, task) {
            None => vec![None],
            Some(p) => p.into_iter().map(Some).collect(),
        };
        for pool in pools {
            let arrival = self.workload(task, pool);
            if self.session.is_none() || self.decided >= RENEW_EVERY {
                self.renew(cluster);
            }
            self.decided += 1;
            let mut answer = self.admit_once(&arrival);
            let stale = match &answer {
                Err(()) => true,
                Ok(Some(c)) => !valid(cluster, task, c),
                Ok(None) => false,
            };
            if stale {
                // Decided again on the cluster as it is: that answer is the solver's own.
                self.renew(cluster);
                answer = self.admit_once(&arrival);
            }
            match answer {
                Ok(Some(choice)) => {
                    self.record(cluster, arrival, &choice);
                    return Some(choice);
                }
                Ok(None) => {}
                Err(()) => panic!(
                    "a session opened on the current snapshot could not decide `{}`",
                    arrival.name
                ),
            }
        }
        None
    }

    /// The same solver with the trace's CPU-only tasks placed by `placer` (a baseline's rule):
    /// comparing against that baseline, the two rows then differ only in how GPU tasks are
    /// placed.
    pub fn with_cpu_only(self, placer: Box<dyn Placer>) -> Self {
        Self {
            cpu_only: Some(placer),
            ..self
        }
    }

    /// Whether a rule places `task` rather than the solver: a CPU-only task when a rule is
    /// given, or the cluster has no GPU (and no policy), or the task asks nothing the run
    /// counts (no CPU, and no memory or memory unchecked: it takes nothing wherever it goes,
    /// and a tessera workload must ask for something).
    fn by_rule(&self, task: &Task) -> bool {
        let asks = task.cpu_milli > 0 || (self.check_memory && task.memory_mib > 0);
        task.is_cpu_only() && (self.cpu_only.is_some() || self.policy.is_none() || !asks)
    }

    /// Places a CPU-only task by the rule given ([`Production::with_cpu_only`]), or by the
    /// solver.
    fn place_cpu_only(&mut self, cluster: &Cluster, task: &Task) -> Option<Choice> {
        if !self.by_rule(task) {
            return self
                .decide(cluster, task)
                .or_else(|| self.off_the_fleet(cluster, task));
        }
        let choice = match &mut self.cpu_only {
            Some(rule) => rule.choose(cluster, task)?,
            None => self.fallback.choose(cluster, task)?,
        };
        self.take(task, &choice);
        Some(choice)
    }

    /// A CPU-only task the solver left waiting, on a node with no GPU if one has room: such
    /// nodes are no pool's (a pool has GPUs), so not tessera's fleet; the cluster's own
    /// scheduler places pods there (BestFit's rule). The solver found no room on the GPU
    /// nodes, so nothing else can take it.
    fn off_the_fleet(&mut self, cluster: &Cluster, task: &Task) -> Option<Choice> {
        let choice = self.fallback.choose(cluster, task)?;
        if !cluster.node(choice.node).gpu_left.is_empty() {
            return None;
        }
        self.take(task, &choice);
        Some(choice)
    }

    /// Books a CPU-only task placed outside the solver: the next snapshot shows its node with
    /// that much less CPU (and memory).
    fn take(&mut self, task: &Task, choice: &Choice) {
        self.taken_cpu[choice.node] += task.cpu_milli;
        if self.check_memory {
            self.taken_memory[choice.node] += task.memory_mib;
        }
    }
}

/// Whether `choice` is a valid placement of `task` on the cluster as it is.
fn valid(cluster: &Cluster, task: &Task, choice: &Choice) -> bool {
    if choice.node >= cluster.nodes().len() || !cluster.admits(choice.node, task) {
        return false;
    }
    let node = cluster.node(choice.node);
    let need = if task.num_gpu > 1 {
        MILLI
    } else {
        task.gpu_milli
    };
    choice.gpus.len() == task.num_gpu as usize
        && choice
            .gpus
            .iter()
            .all(|&g| node.gpu_left.get(g).is_some_and(|&left| left >= need))
}

impl Placer for Production {
    fn name(&self) -> &str {
        "Tessera"
    }

    fn choose(&mut self, cluster: &Cluster, task: &Task) -> Option<Choice> {
        if task.is_cpu_only() {
            return self.place_cpu_only(cluster, task);
        }
        self.decide(cluster, task)
    }

    /// One full cycle: the CPU-only tasks a rule places first (as a cluster's scheduler places
    /// them when they come), then the solver decides the cycle's other tasks together on the
    /// snapshot.
    fn place_cycle(
        &mut self,
        cluster: &mut Cluster,
        tasks: &[&Task],
    ) -> Result<Vec<bool>, PlaceError> {
        let mut placed = vec![false; tasks.len()];
        for (i, task) in tasks.iter().enumerate() {
            if self.by_rule(task)
                && let Some(choice) = self.place_cpu_only(cluster, task)
            {
                cluster.place(task, &choice)?;
                placed[i] = true;
            }
        }
        let mut pending: Vec<(usize, PendingWorkload)> = Vec::new();
        for (i, task) in tasks.iter().enumerate() {
            if self.by_rule(task) {
                continue;
            }
            // A task pinned to several models is offered to the first one's pool in a cycle.
            let pool = self
                .pins(cluster, task)
                .map(|p| p.into_iter().next().unwrap_or_default());
            pending.push((i, self.workload(task, pool)));
        }
        let Some(policy) = &self.policy else {
            return Ok(placed);
        };
        let state = self.snapshot(cluster, pending.iter().map(|(_, w)| w.clone()).collect());
        let (_, decision) = Session::new(policy, &state, &SolveOptions::default())
            .expect("the snapshot of a cluster the harness placed is valid");
        let by_name: HashMap<&str, &WorkloadDecision> = decision
            .workloads
            .iter()
            .map(|w| (w.name.as_str(), w))
            .collect();
        let mut admitted = Vec::new();
        for (i, arrival) in &pending {
            if let Some(WorkloadDecision {
                outcome: Outcome::Admit { bindings, .. },
                ..
            }) = by_name.get(arrival.name.as_str())
                && let Some(choice) = self.choice_of(bindings)
            {
                admitted.push((*i, arrival.clone(), choice));
            }
        }
        drop(by_name);
        for (i, arrival, choice) in admitted {
            cluster.place(tasks[i], &choice)?;
            self.record(cluster, arrival, &choice);
            placed[i] = true;
        }
        for (i, _) in &pending {
            if !placed[*i]
                && tasks[*i].is_cpu_only()
                && let Some(choice) = self.off_the_fleet(cluster, tasks[*i])
            {
                cluster.place(tasks[*i], &choice)?;
                placed[*i] = true;
            }
        }
        // The online path opens its own session on the next snapshot.
        self.session = None;
        Ok(placed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openb::trace::NodeSpec;

    #[test]
    fn pool_names_are_policy_names() {
        assert_eq!(pool_name("V100M16"), "openb-v100m16");
        assert_eq!(pool_name("A 10"), "openb-a-10");
    }

    #[test]
    fn the_policy_compiles_for_a_mixed_cluster() {
        let spec = |name: &str, gpus, model: &str| NodeSpec {
            name: name.into(),
            cpu_milli: 32_000,
            memory_mib: 1 << 17,
            num_gpu: gpus,
            model: model.into(),
        };
        let cluster = Cluster::new(
            &[spec("a", 8, "G2"), spec("b", 2, "T4"), spec("c", 4, "G2")],
            false,
        )
        .unwrap();
        let p = Production::new(&cluster, PolicyOptions::default(), 1).unwrap();
        assert_eq!(p.pools, vec!["openb-g2", "openb-t4"]);
    }

    #[test]
    fn cpu_only_tasks_are_the_solvers_unless_a_rule_is_given() {
        let spec = |name: &str, cpu_milli| NodeSpec {
            name: name.into(),
            cpu_milli,
            memory_mib: 1 << 17,
            num_gpu: 2,
            model: "G2".into(),
        };
        let cluster = Cluster::new(&[spec("a", 32_000), spec("b", 8_000)], false).unwrap();
        let task = Task {
            cpu_milli: 4_000,
            memory_mib: 1024,
            num_gpu: 0,
            gpu_milli: 0,
            models: super::super::cluster::ModelMask::ANY,
            shape: 0,
        };
        let options = PolicyOptions::default();
        let best_fit = BestFit::new(options, 1).choose(&cluster, &task);
        let first_fit = super::super::FirstFit::new().choose(&cluster, &task);
        // The two rules disagree here (best fit takes the smaller node), so each is told apart.
        assert_ne!(best_fit, first_fit);
        // By default the solver places it, as a workload asking no GPU: a node and no GPU, and
        // the next snapshot lists it as running work.
        let mut solver = Production::new(&cluster, options, 1).unwrap();
        let placed = solver.choose(&cluster, &task).expect("the task fits");
        assert!(placed.gpus.is_empty());
        assert_eq!(solver.running.len(), 1);
        assert_eq!(solver.running[0].spec.gpu.count, Some(0));
        assert_eq!(
            solver.running[0].bindings[0].node,
            cluster.node(placed.node).name
        );
        assert_eq!(solver.taken_cpu, [0, 0]);
        let mut told = Production::new(&cluster, options, 1)
            .unwrap()
            .with_cpu_only(Box::new(super::super::FirstFit::new()));
        assert_eq!(told.choose(&cluster, &task), first_fit);
        // The CPU a rule took shows in the next snapshot too.
        let node = first_fit.unwrap().node;
        assert_eq!(told.taken_cpu[node], 4_000);
    }
}
