//! Cluster state for the openb simulation: per node the CPU left and, per GPU, the milli-GPU left.
//!
//! Placement rules (those of the paper's simulator, `Open-Gpu-Share` filter):
//! - a task with `num_gpu > 1` takes that many GPUs that are completely free (`gpu_left == 1000`);
//! - a task with `num_gpu == 1` takes one GPU with `gpu_left >= gpu_milli` (for a whole-GPU task
//!   that means a free GPU);
//! - a CPU-only task takes CPU only, on any node;
//! - the CPU request must fit in `cpu_left`, and a GPU task's allowed models must include the
//!   node's model. Memory is checked only when the cluster is built with memory checking on (the
//!   simulator's Kubernetes `NodeResourcesFit` filter checks it; fgd.md does not mention it).
//!
//! [`Cluster::place`] re-checks every rule, so a buggy policy cannot oversubscribe anything.

use super::trace::{MILLI, NodeSpec, TaskSpec};

/// Index of a GPU model in [`Cluster::models`].
pub type ModelId = u8;

/// The most distinct models a cluster may have (one bit each in a [`ModelMask`]).
pub const MAX_MODELS: usize = 64;

/// A set of allowed GPU models, one bit per [`ModelId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelMask(pub u64);

impl ModelMask {
    /// Any model (an empty `gpu_spec`).
    pub const ANY: ModelMask = ModelMask(u64::MAX);

    pub fn allows(self, model: ModelId) -> bool {
        (self.0 >> model) & 1 == 1
    }
}

/// A task resolved against a cluster (its models turned into a [`ModelMask`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u32,
    /// Per GPU; 0 for a CPU-only task.
    pub gpu_milli: u32,
    pub models: ModelMask,
    /// Id of the task's shape `(cpu, num_gpu, gpu_milli, models)`: equal shapes, equal ids
    /// (dense from 0, assigned by [`super::protocol::Workload`]). Policies may cache per shape.
    pub shape: u32,
}

impl Task {
    /// Total GPU request in milli-GPU.
    pub fn gpu_request(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// A GPU-sharing task: one GPU, less than all of it.
    pub fn is_fractional(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli < MILLI
    }

    pub fn is_cpu_only(&self) -> bool {
        self.num_gpu == 0
    }
}

/// Where a task goes: a node (index in node-list order) and the GPU indices it takes on it
/// (empty for a CPU-only task).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub node: usize,
    pub gpus: Vec<usize>,
}

/// One node's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub model: ModelId,
    pub cpu_capacity: u64,
    pub cpu_left: u64,
    pub memory_capacity: u64,
    pub memory_left: u64,
    /// Milli-GPU left on each GPU, by device index.
    pub gpu_left: Vec<u32>,
    gpu_left_total: u64,
    /// CPU (milli) taken by CPU-only tasks.
    cpu_of_cpu_only: u64,
    version: u64,
}

impl Node {
    /// Sum of `gpu_left`.
    pub fn gpu_left_total(&self) -> u64 {
        self.gpu_left_total
    }

    /// Number of completely free GPUs.
    pub fn free_gpus(&self) -> usize {
        self.gpu_left.iter().filter(|&&g| g == MILLI).count()
    }

    /// CPU (milli) that CPU-only tasks took on this node: the rest of what is taken went to
    /// GPU tasks.
    pub fn cpu_of_cpu_only(&self) -> u64 {
        self.cpu_of_cpu_only
    }

    /// Bumped on every placement on this node: a cache keyed by `(node, version)` is valid as
    /// long as the version is unchanged.
    pub fn version(&self) -> u64 {
        self.version
    }
}

/// Why [`Cluster::place`] refused a choice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error("node {0} does not exist")]
    NoSuchNode(usize),
    #[error("node {node}: not enough CPU ({need}m asked, {left}m left)")]
    Cpu { node: usize, need: u64, left: u64 },
    #[error("node {node}: not enough memory ({need} MiB asked, {left} MiB left)")]
    Memory { node: usize, need: u64, left: u64 },
    #[error("node {node}: GPU model not allowed for this task")]
    Model { node: usize },
    #[error("node {node}: the task needs {need} GPU(s), the choice names {named}")]
    GpuCount {
        node: usize,
        need: usize,
        named: usize,
    },
    #[error("node {node}: GPU {gpu} is named twice or does not exist")]
    BadGpu { node: usize, gpu: usize },
    #[error("node {node}: GPU {gpu} has {left} milli-GPU left, the task needs {need}")]
    GpuRoom {
        node: usize,
        gpu: usize,
        need: u32,
        left: u32,
    },
}

/// Why a cluster could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error("the node list has more than {MAX_MODELS} distinct GPU models")]
    TooManyModels,
}

/// The whole cluster, nodes in node-list order (the scheduler's node order).
#[derive(Debug, Clone)]
pub struct Cluster {
    nodes: Vec<Node>,
    models: Vec<String>,
    check_memory: bool,
    total_gpu_milli: u64,
    allocated_gpu_milli: u64,
}

impl Cluster {
    /// An empty (nothing placed) cluster from a node list. `check_memory`: whether a task's
    /// memory must fit too.
    pub fn new(nodes: &[NodeSpec], check_memory: bool) -> Result<Self, ClusterError> {
        let mut models: Vec<String> = Vec::new();
        let mut out = Vec::with_capacity(nodes.len());
        for spec in nodes {
            let model = match models.iter().position(|m| *m == spec.model) {
                Some(i) => i,
                None => {
                    if models.len() == MAX_MODELS {
                        return Err(ClusterError::TooManyModels);
                    }
                    models.push(spec.model.clone());
                    models.len() - 1
                }
            };
            out.push(Node {
                name: spec.name.clone(),
                model: model as ModelId,
                cpu_capacity: spec.cpu_milli,
                cpu_left: spec.cpu_milli,
                memory_capacity: spec.memory_mib,
                memory_left: spec.memory_mib,
                gpu_left: vec![MILLI; spec.num_gpu as usize],
                gpu_left_total: u64::from(spec.num_gpu) * u64::from(MILLI),
                cpu_of_cpu_only: 0,
                version: 0,
            });
        }
        let total_gpu_milli = out.iter().map(|n| n.gpu_left_total).sum();
        Ok(Self {
            nodes: out,
            models,
            check_memory,
            total_gpu_milli,
            allocated_gpu_milli: 0,
        })
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// The distinct GPU models, indexed by [`ModelId`].
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// The mask of the allowed models named in `spec` (empty = [`ModelMask::ANY`]); a name no
    /// node has adds nothing, so a task asking only unknown models fits nowhere.
    pub fn model_mask(&self, spec: &[String]) -> ModelMask {
        if spec.is_empty() {
            return ModelMask::ANY;
        }
        let mut bits = 0u64;
        for name in spec {
            if let Some(i) = self.models.iter().position(|m| m == name) {
                bits |= 1 << i;
            }
        }
        ModelMask(bits)
    }

    /// Resolves a task of the trace against this cluster.
    pub fn resolve(&self, spec: &TaskSpec, shape: u32) -> Task {
        Task {
            cpu_milli: spec.cpu_milli,
            memory_mib: spec.memory_mib,
            num_gpu: spec.num_gpu,
            gpu_milli: if spec.num_gpu == 0 { 0 } else { spec.gpu_milli },
            models: self.model_mask(&spec.gpu_spec),
            shape,
        }
    }

    pub fn check_memory(&self) -> bool {
        self.check_memory
    }

    /// Total GPU capacity in milli-GPU.
    pub fn total_gpu_milli(&self) -> u64 {
        self.total_gpu_milli
    }

    /// Milli-GPU allocated so far.
    pub fn allocated_gpu_milli(&self) -> u64 {
        self.allocated_gpu_milli
    }

    /// Allocated over total GPU, in percent.
    pub fn allocation_percent(&self) -> f64 {
        if self.total_gpu_milli == 0 {
            return 0.0;
        }
        100.0 * self.allocated_gpu_milli as f64 / self.total_gpu_milli as f64
    }

    /// Whether the node's CPU (and memory, when checked) and model admit the task, ignoring
    /// its GPUs.
    pub fn admits(&self, node: usize, task: &Task) -> bool {
        let n = &self.nodes[node];
        task.cpu_milli <= n.cpu_left
            && (!self.check_memory || task.memory_mib <= n.memory_left)
            && (task.num_gpu == 0 || task.models.allows(n.model))
    }

    /// Whether the task can be placed on the node.
    pub fn fits(&self, node: usize, task: &Task) -> bool {
        if !self.admits(node, task) {
            return false;
        }
        let n = &self.nodes[node];
        match task.num_gpu {
            0 => true,
            1 => n.gpu_left.iter().any(|&g| g >= task.gpu_milli),
            k => n.free_gpus() >= k as usize,
        }
    }

    /// The first `k` completely free GPUs of a node, by index (how every policy places a
    /// whole-GPU task); `None` if there are fewer.
    pub fn first_free_gpus(&self, node: usize, k: u32) -> Option<Vec<usize>> {
        let picked: Vec<usize> = self.nodes[node]
            .gpu_left
            .iter()
            .enumerate()
            .filter(|(_, g)| **g == MILLI)
            .map(|(i, _)| i)
            .take(k as usize)
            .collect();
        (picked.len() == k as usize).then_some(picked)
    }

    /// Places the task, after checking every rule; on error nothing changes.
    pub fn place(&mut self, task: &Task, choice: &Choice) -> Result<(), PlaceError> {
        let node = choice.node;
        let check_memory = self.check_memory;
        let n = self
            .nodes
            .get_mut(node)
            .ok_or(PlaceError::NoSuchNode(node))?;
        if task.cpu_milli > n.cpu_left {
            return Err(PlaceError::Cpu {
                node,
                need: task.cpu_milli,
                left: n.cpu_left,
            });
        }
        if check_memory && task.memory_mib > n.memory_left {
            return Err(PlaceError::Memory {
                node,
                need: task.memory_mib,
                left: n.memory_left,
            });
        }
        if task.num_gpu > 0 && !task.models.allows(n.model) {
            return Err(PlaceError::Model { node });
        }
        if choice.gpus.len() != task.num_gpu as usize {
            return Err(PlaceError::GpuCount {
                node,
                need: task.num_gpu as usize,
                named: choice.gpus.len(),
            });
        }
        for (i, &g) in choice.gpus.iter().enumerate() {
            if g >= n.gpu_left.len() || choice.gpus[..i].contains(&g) {
                return Err(PlaceError::BadGpu { node, gpu: g });
            }
            // Several GPUs: whole GPUs only.
            let need = if task.num_gpu > 1 {
                MILLI
            } else {
                task.gpu_milli
            };
            if n.gpu_left[g] < need {
                return Err(PlaceError::GpuRoom {
                    node,
                    gpu: g,
                    need,
                    left: n.gpu_left[g],
                });
            }
        }
        n.cpu_left -= task.cpu_milli;
        if task.is_cpu_only() {
            n.cpu_of_cpu_only += task.cpu_milli;
        }
        if check_memory {
            n.memory_left -= task.memory_mib;
        }
        for &g in &choice.gpus {
            n.gpu_left[g] -= task.gpu_milli;
        }
        let taken = task.gpu_request();
        n.gpu_left_total -= taken;
        n.version += 1;
        self.allocated_gpu_milli += taken;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cpu: u64, gpus: u32, model: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            cpu_milli: cpu,
            memory_mib: 1000,
            num_gpu: gpus,
            model: model.into(),
        }
    }

    fn task(cpu: u64, num_gpu: u32, gpu_milli: u32, models: ModelMask) -> Task {
        Task {
            cpu_milli: cpu,
            memory_mib: 100,
            num_gpu,
            gpu_milli,
            models,
            shape: 0,
        }
    }

    #[test]
    fn fits_and_places_by_the_rules() {
        let mut c =
            Cluster::new(&[node("a", 8000, 2, "T4"), node("b", 8000, 4, "G2")], false).unwrap();
        assert_eq!(c.total_gpu_milli(), 6000);
        let t4 = c.model_mask(&["T4".to_string()]);
        let frac = task(1000, 1, 600, ModelMask::ANY);
        c.place(
            &frac,
            &Choice {
                node: 0,
                gpus: vec![1],
            },
        )
        .unwrap();
        assert_eq!(c.node(0).gpu_left, vec![1000, 400]);
        assert_eq!(c.node(0).cpu_left, 7000);
        // a second 600 fits only on GPU 0
        let err = c
            .place(
                &frac,
                &Choice {
                    node: 0,
                    gpus: vec![1],
                },
            )
            .unwrap_err();
        assert!(matches!(err, PlaceError::GpuRoom { gpu: 1, .. }));
        // whole GPUs: node a has one free GPU left
        let two = task(1000, 2, 1000, t4);
        assert!(!c.fits(0, &two));
        assert!(!c.fits(1, &two), "model T4 only");
        assert!(c.fits(1, &task(1000, 2, 1000, ModelMask::ANY)));
        assert_eq!(c.first_free_gpus(0, 1), Some(vec![0]));
        assert_eq!(c.first_free_gpus(0, 2), None);
        // CPU
        assert!(!c.fits(0, &task(7001, 0, 0, ModelMask::ANY)));
        assert!(c.fits(0, &task(7000, 0, 0, t4)), "CPU-only ignores models");
        assert_eq!(c.allocated_gpu_milli(), 600);
        assert!((c.allocation_percent() - 10.0).abs() < 1e-9);
        assert_eq!(c.node(0).version(), 1);
        assert_eq!(c.node(1).version(), 0);
    }
}
