//! The openb benchmark harness: the production GPU-sharing trace of "Beware of Fragmentation:
//! Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent" (Weng et al., USENIX
//! ATC 2023; data CC BY 4.0, Alibaba `cluster-trace-gpu-v2023`), its arrival protocol and the
//! baseline placement policies (FirstFit, BestFit, FGD, Random), reproducing the paper's
//! allocation-ratio figures, and tessera's production solver ([`Production`], the "Tessera"
//! row) run beside them.
//!
//! ```no_run
//! use tessera_sim::openb::{self, PolicyKind, SimConfig};
//! let dir = std::path::Path::new("../shared/data/openb");
//! let nodes = openb::load_nodes(dir.join("openb_node_list_gpu_node.csv")).unwrap();
//! let tasks = openb::load_tasks(dir.join("openb_pod_list_default.csv")).unwrap();
//! let config = SimConfig::fgd_md();
//! let workload = openb::Workload::new(&nodes, tasks, config.check_memory).unwrap();
//! let result = openb::run_trace("default", &workload, &PolicyKind::ALL, &config);
//! let paper = openb::PaperResults::load(dir.join("fgd-paper-results.csv")).unwrap();
//! println!("{}", openb::comparison_table(&result, &paper));
//! ```
//!
//! Two configurations are provided: [`SimConfig::fgd_md`] (the default) follows the protocol
//! document (`shared/reference/fgd.md`) to the letter; [`SimConfig::published_runs`] reproduces
//! what the paper's simulator (`hkust-adsl/kubernetes-scheduler-simulator`) and its run scripts
//! actually did where the two differ:
//!
//! | setting | fgd.md | published runs |
//! |---|---|---|
//! | arrival order | creation time | shuffled (`--shuffle-pod=true`; the integer `creation_time` fails the simulator's RFC 3339 parse), copies last |
//! | score comparison | exact | `int64` truncation of the 0–100 score |
//! | ties | first node in node-list order | first node in a per-seed shuffled node order |
//! | typical shapes | GPU tasks, 60 %, 10 at a time | CPU tasks too, 95 %, 1 at a time |
//! | memory | not checked | checked (Kubernetes `NodeResourcesFit`) |
//!
//! On `default` (10 seeds, 130 % arrived) the published-runs configuration lands within 0.05 of
//! the paper for FGD and BestFit and 0.11 for Random (and within about 0.2 on every other trace);
//! fgd.md's reading gives FGD 1.2 points and BestFit 0.4 below it. Of the differences, the
//! truncation and the shuffled arrival matter most for FGD; drawing ties at random at every
//! decision (stock Kubernetes) instead of a fixed per-seed order costs FGD about 5 points.
//!
//! Conventions (both configurations): a sharing task takes, under BestFit, the GPU with the
//! least room that still fits, under FGD the GPU with the best score (lowest index among
//! equals), under FirstFit the first GPU with room; a whole-GPU task always takes the first
//! completely free GPUs. CPU-only tasks arrive and are placed like the others (they use CPU);
//! the allocation ratio counts GPU only.

mod best_fit;
mod bound;
mod cluster;
mod cycles;
mod fgd;
mod first_fit;
mod gpu_spec;
mod kube_default;
mod policy;
mod production;
mod protocol;
mod random;
mod report;
mod trace;

pub use best_fit::score as best_fit_score;
pub use best_fit::{BestFit, MAX_SPEC_CPU, MAX_SPEC_GPU, leftover, tightest_gpu};
pub use bound::{allocation_bound, mean_bound_at};
pub use cluster::{
    Choice, Cluster, ClusterError, MAX_MODELS, ModelId, ModelMask, Node, PlaceError, Task,
};
pub use cycles::simulate_cycles;
pub use fgd::{Fgd, TypicalConfig, TypicalShape, TypicalShapes, fgd_score, sigmoid};
pub use first_fit::FirstFit;
pub use gpu_spec::{GpuSpecError, pin_gpu_spec};
pub use kube_default::KubeDefault;
pub use policy::{Placer, PolicyKind, PolicyOptions, ScoreRounding, TieBreak, permuted_ranks};
pub use production::{Production, ProductionError, RENEW_EVERY};
pub use protocol::{
    ArrivalOrder, Arrivals, CHECKPOINTS, Checkpointing, CpuOnlyRows, CpuOnlyRule, DEFAULT_SEEDS,
    Sample, SimConfig, SimOutcome, Workload, first_refusal_at, idle_at_end, make_placer,
    make_placer_with, read_checkpoints, run_policy, run_seed, run_trace, scale, simulate,
};
pub use random::Random;
pub use report::{
    FirstRefusal, IdleAtEnd, ModelState, PaperResults, PaperRow, PolicyResult, SeedResult,
    TraceResult, comparison_table, first_refusal_table, idle_table, worst_vs,
};
pub use trace::{
    MILLI, NodeSpec, TaskSpec, TraceError, load_nodes, load_tasks, parse_nodes, parse_tasks,
};

/// The node list and pod-list file names of the openb data set.
pub const NODE_LIST: &str = "openb_node_list_gpu_node.csv";
pub const PAPER_RESULTS: &str = "fgd-paper-results.csv";

/// The pod-list file of a trace name (`default`, `gpushare40`, `multigpu20`, ...).
pub fn pod_list_file(trace: &str) -> String {
    format!("openb_pod_list_{trace}.csv")
}
