//! [`Problem`]: the policy and one cluster snapshot, resolved and indexed once, immutable.
//!
//! Everything the solver needs is looked up here by index (pool, tenant, node, GPU, workload), so
//! that the heuristic and the integer program that will refine it read the same facts. Building
//! it checks the snapshot for contradictions the solver cannot decide around ([`ProblemError`]);
//! workloads whose tenant, class or pool left the policy are kept as [`Orphan`]s so that the
//! decision explains them instead of dropping them.
//!
//! Committed workloads of the policy (`kind: Workload`) that the snapshot neither runs nor
//! queues are demand too: they join the queue after the snapshot's pending work, submitted at
//! `observedAt`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use jiff::Timestamp;

use tessera_compiler::compiled::{Amounts, CompiledFairShare, PoolQuota};
use tessera_compiler::mig::{self, Placement};
use tessera_compiler::model::{
    Binding, ClusterStateSpec, Health, PendingWorkload, ReconfigurationRecord, Sharing,
    TopologyMode, UsageRecord, WorkloadSpec,
};
use tessera_compiler::units::{Bytes, Gpus, Millicores};
use tessera_compiler::{CompiledPolicy, WorkloadKey};

use crate::decision::Listing;

/// Why a snapshot cannot be solved: it contradicts itself or the policy in a way no decision can
/// repair.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProblemError {
    #[error("node `{0}` is listed twice")]
    DuplicateNode(String),
    #[error("GPU index {index} appears twice on node `{node}`")]
    DuplicateGpu { node: String, index: u32 },
    #[error("workload `{0}` is listed twice")]
    DuplicateWorkload(String),
    #[error("GPU {index} of node `{node}`: unknown MIG profile `{profile}` for model {model}")]
    UnknownInstanceProfile {
        node: String,
        index: u32,
        profile: String,
        model: String,
    },
    #[error("GPU {index} of node `{node}` has an impossible MIG geometry: {error}")]
    InvalidGeometry {
        node: String,
        index: u32,
        error: String,
    },
    #[error("workload `{workload}`: {message}")]
    InvalidRequest { workload: String, message: String },
    #[error("workload `{workload}` has {replicas} replicas but {bindings} bindings")]
    BindingCount {
        workload: String,
        replicas: u32,
        bindings: usize,
    },
    #[error("workload `{workload}`: binding {binding}: {message}")]
    InvalidBinding {
        workload: String,
        binding: usize,
        message: String,
    },
}

/// Why a workload can no longer be solved for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrphanCause {
    Tenant(String),
    SloClass(String),
    Pool(String),
    /// The tenant may no longer use the class.
    ClassNotAllowed {
        tenant: String,
        class: String,
    },
    /// The pool of the node a running workload is bound to left the policy.
    NodePool {
        node: String,
        pool: String,
    },
}

#[derive(Debug, Clone)]
pub struct PoolInfo {
    pub name: String,
    pub sharing: Sharing,
    pub gpu_model: String,
    /// MIG profile ID → this model's name.
    pub profiles: mig::MigProfiles,
    /// For mig pools: the allowed geometries, each sorted.
    pub layouts: Vec<Vec<Placement>>,
    pub max_clients_per_gpu: u32,
    pub max_changes_per_gpu: u32,
    pub drain_timeout_seconds: u64,
    /// Nodes of the snapshot in this pool, by name.
    pub nodes: Vec<usize>,
    /// NVLink domain ids of those nodes, sorted.
    pub domains: Vec<String>,
    pub gpus_per_node: u32,
    /// At most this many GPUs held for waiting gangs (see `reserve.rs`); `None`: none.
    pub reservation_max_gpus: Option<u32>,
    /// Borrowers may preempt other tenants' borrowed work of their priority to even out the
    /// weighted borrowed shares (see `Ledger::borrowed_share` in the solver's quota module).
    pub fair_share_preemption: bool,
    /// Each of the model's profile names as the catalog spells it, resolved once (see
    /// [`PoolInfo::resolve_profile`]).
    spelled: HashMap<String, Option<u32>, foldhash::fast::FixedState>,
}

impl PoolInfo {
    /// Resolves each of the model's names once: a fleet's snapshot and queue spell their
    /// instances' and requests' profiles as the catalog does, hundreds of thousands of times a
    /// cycle at 50,000 GPUs, and the catalog's rule (case-insensitive, or an ID) compares the
    /// name with every profile's.
    fn spell(&mut self) {
        self.spelled = self
            .profiles
            .names
            .values()
            .map(|name| (name.clone(), self.profiles.resolve(name)))
            .collect();
    }

    /// The model's name of a profile, or its ID.
    pub fn profile_name(&self, id: u32) -> String {
        self.profiles
            .names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("profile {id}"))
    }

    /// A profile of the pool's model by name or ID, under the rules of `tessera_mig`.
    pub fn resolve_profile(&self, name_or_id: &str) -> Option<u32> {
        let resolved = match self.spelled.get(name_or_id) {
            Some(&id) => id,
            None => self.profiles.resolve(name_or_id),
        };
        debug_assert_eq!(resolved, self.profiles.resolve(name_or_id));
        resolved
    }

    /// Whether the pool's GPUs can hold a replica of `demand`'s kind: whole GPUs anywhere but
    /// on a MIG pool without a 7g layout (a shared GPU with no share on it is held whole, as
    /// a Kubernetes device plugin hands it out), an instance on a MIG pool with a layout that
    /// has its profile, a share on an MPS or time-sliced pool; a replica asking no GPU (a
    /// CPU-only workload) anywhere. The one statement of the rule: admission (`demand_on`,
    /// which says why not) and the fragmentation scoring's pool versatility both ask it. Node
    /// sizes are not its concern.
    pub fn takes(&self, demand: Demand) -> bool {
        match demand {
            Demand::Whole { count: 0 } => true,
            Demand::Whole { .. } => match self.sharing {
                Sharing::Exclusive | Sharing::Mps | Sharing::Timeslice => true,
                Sharing::Mig => self.layouts.iter().any(|l| has_whole(l)),
            },
            Demand::Mig { profile_id } => {
                self.sharing == Sharing::Mig
                    && self
                        .layouts
                        .iter()
                        .any(|l| l.iter().any(|pl| pl.profile_id == profile_id))
            }
            Demand::Share { .. } => matches!(self.sharing, Sharing::Mps | Sharing::Timeslice),
        }
    }
}

#[derive(Debug, Clone)]
pub struct TenantInfo {
    pub name: String,
    pub parent: Option<usize>,
    /// This tenant first, then its parent, up to the root.
    pub lineage: Vec<usize>,
    pub trust_domain: String,
    pub weight: f64,
    /// Effective quota per pool index; absent: the tenant may not use the pool.
    pub quota: BTreeMap<usize, PoolQuota>,
    /// Fair share over time in force for the tenant; `None`: past usage does not count.
    pub fair_share: Option<CompiledFairShare>,
    /// Decayed dominant borrowed share as of `now` ([`crate::fairshare::history_share`]); 0
    /// without a fair-share setting.
    pub history: f64,
}

#[derive(Debug, Clone)]
pub struct ClassInfo {
    pub name: String,
    pub priority: i64,
    pub preemptible: bool,
    pub isolation_minimum: Sharing,
    pub grace_period_seconds: u64,
    pub min_runtime_seconds: u64,
}

#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    /// `None`: the node's pool is not in the policy; nothing new is placed on it.
    pub pool: Option<usize>,
    /// The pool the snapshot names.
    pub pool_name: String,
    /// `nvlinkDomain` of the node, or the node's name.
    pub domain: String,
    pub cpu: Millicores,
    pub memory: Bytes,
    pub healthy: bool,
    /// GPU indices into [`Problem::gpus`], by device index.
    pub gpus: Vec<usize>,
    /// Whether `gpus[i]` is the GPU of device index `i` for every `i` (the node's indices run
    /// 0, 1, … without a gap, as NVML numbers them), so that a binding's GPU is found without
    /// reading the GPUs.
    pub gpus_by_position: bool,
}

#[derive(Debug, Clone)]
pub struct GpuInfo {
    pub node: usize,
    pub index: u32,
    pub uuid: String,
    /// The GPU and its node are healthy: new work may be placed here.
    pub healthy: bool,
    pub mig_enabled: bool,
    /// Current MIG instances, sorted.
    pub instances: Vec<Placement>,
    /// Changes the snapshot records for this GPU in the hour before `now`: spent from its
    /// pool's `max_changes_per_gpu`.
    pub spent: u32,
}

/// What one replica asks of a GPU, resolved against the pool's model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demand {
    Whole { count: u32 },
    Mig { profile_id: u32 },
    Share { fraction: Gpus },
}

impl Demand {
    /// What one replica counts against quota.
    pub fn gpus(self) -> Gpus {
        match self {
            Demand::Whole { count } => Gpus::whole(i64::from(count)),
            Demand::Mig { profile_id } => Gpus::sevenths(i64::from(
                mig::shape(profile_id).map_or(7, |s| s.compute_slices),
            )),
            Demand::Share { fraction } => fraction,
        }
    }
}

/// One replica's place, as resolved from a snapshot binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub node: usize,
    /// Indices into [`Problem::gpus`].
    pub gpus: Vec<usize>,
    pub mig_start: Option<u8>,
    pub share: Option<Gpus>,
}

#[derive(Debug, Clone)]
pub enum Phase {
    Running {
        slots: Vec<Slot>,
        started_at: i64,
        last_checkpoint_at: Option<i64>,
    },
    Pending {
        submitted_at: i64,
    },
}

#[derive(Debug, Clone)]
pub struct WorkloadInfo {
    /// `(tenant, name)`: what identifies the workload (names are per tenant). Its name is
    /// `key.name`.
    pub key: WorkloadKey,
    pub tenant: usize,
    pub class: usize,
    pub demand: Demand,
    pub replicas: u32,
    pub min_member: u32,
    pub cpu: Millicores,
    pub memory: Bytes,
    pub topology: TopologyMode,
    /// Pools it may be placed on, by index; for a running workload, the pool it runs in.
    pub pools: Vec<usize>,
    /// Why each other pool was ruled out, for the pending explanation.
    pub excluded: Vec<(usize, Exclusion)>,
    pub phase: Phase,
    /// Declared upper bound on its run time: what lets it backfill ahead of a reservation.
    pub max_duration_seconds: Option<u64>,
}

impl WorkloadInfo {
    pub fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Running { .. })
    }
    /// Quota amount of `n` replicas.
    pub fn amount(&self, n: u32) -> Amounts {
        Amounts {
            gpus: self.demand.gpus() * i64::from(n),
            cpu: Some(Millicores(self.cpu.0 * u64::from(n))),
            memory: Some(Bytes(self.memory.0 * u64::from(n))),
        }
    }
}

/// Why a pool cannot hold a workload at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exclusion {
    Isolation { sharing: Sharing, minimum: Sharing },
    NoQuota,
    Shape(String),
}

#[derive(Debug, Clone)]
pub struct Orphan {
    pub name: String,
    pub cause: OrphanCause,
    pub was_running: bool,
    pub tenant: String,
    /// The SLO class it names (which may be the one that left the policy).
    pub class: String,
    /// GPUs it holds, for a running orphan.
    pub gpus: Gpus,
    /// Last checkpoint (or start) of a running orphan, Unix seconds.
    pub since: Option<i64>,
}

/// The policy and a snapshot, indexed.
#[derive(Debug, Clone)]
pub struct Problem {
    /// Unix seconds of the decision.
    pub now: i64,
    /// The same instant, as decisions and snapshots carry it.
    pub now_at: Timestamp,
    pub pools: Vec<PoolInfo>,
    pub classes: Vec<ClassInfo>,
    /// Pre-order, as in the policy.
    pub tenants: Vec<TenantInfo>,
    /// By name.
    pub nodes: Vec<NodeInfo>,
    /// By node, then device index.
    pub gpus: Vec<GpuInfo>,
    /// Running workloads by (tenant, name), then pending ones in submission order (committed
    /// workloads of the policy absent from the snapshot last, by tenant and name).
    pub workloads: Vec<WorkloadInfo>,
    pub orphans: Vec<Orphan>,
    /// The snapshot's usage record brought to `now` ([`crate::fairshare::accrue`]); `None` when
    /// no tenant sets fair share.
    pub usage: Option<UsageRecord>,
    /// The previous decision's reservations still meaningful: their gang is pending here and
    /// their pool and nodes exist (see `reserve.rs`).
    pub reservations: Vec<PriorReservation>,
    /// The snapshot's reconfiguration records still counting at `now` (made in the hour
    /// before it, of a GPU it lists), sorted; each is also counted in its GPU's `spent`.
    pub reconfigurations: Vec<ReconfigurationRecord>,
    /// Which workloads the decision lists; [`Listing::All`] unless the caller says
    /// ([`crate::SolveOptions::listing`]).
    pub listing: Listing,
}

/// How long a geometry change counts against its GPU's budget (`maxPerGpuPerHour`).
pub const BUDGET_WINDOW_SECONDS: i64 = 3600;

/// A reservation carried by the snapshot, resolved.
#[derive(Debug, Clone)]
pub struct PriorReservation {
    pub workload: usize,
    pub pool: usize,
    /// By index, sorted.
    pub nodes: Vec<usize>,
    /// Unix seconds.
    pub since: i64,
}

impl Problem {
    /// Charges each GPU's budget with the records made in the hour before `now`. A record of a
    /// GPU the snapshot does not list, or with a bad or future instant, spends nothing
    /// (`tessera validate` warns about it).
    fn count_reconfigurations(&mut self, records: &[ReconfigurationRecord]) {
        for r in records {
            let at = r.at.as_second();
            if at > self.now || at <= self.now - BUDGET_WINDOW_SECONDS {
                continue;
            }
            let Ok(n) = self
                .nodes
                .binary_search_by(|x| x.name.as_str().cmp(&r.node))
            else {
                continue;
            };
            let Some(&g) = self.nodes[n]
                .gpus
                .iter()
                .find(|&&g| self.gpus[g].index == r.gpu)
            else {
                continue;
            };
            self.gpus[g].spent += 1;
            self.reconfigurations.push(r.clone());
        }
        self.reconfigurations.sort();
    }

    /// Builds the problem; `now` defaults to the snapshot's `observedAt`.
    pub fn new(
        policy: &CompiledPolicy,
        state: &ClusterStateSpec,
        now: Option<i64>,
    ) -> Result<Problem, ProblemError> {
        let observed = state.observed_at.as_second();
        let now = now.unwrap_or(observed);

        let mut pools: Vec<PoolInfo> = policy
            .pools
            .iter()
            .map(|p| PoolInfo {
                name: p.name.clone(),
                sharing: p.sharing,
                gpu_model: p.gpu_model.clone(),
                profiles: mig::MigProfiles {
                    names: policy
                        .gpu_model(&p.gpu_model)
                        .map(|m| {
                            m.mig_profiles
                                .iter()
                                .map(|x| (x.id, x.name.clone()))
                                .collect()
                        })
                        .unwrap_or_default(),
                },
                spelled: Default::default(),
                layouts: p
                    .layouts
                    .iter()
                    .map(|l| {
                        let mut v: Vec<Placement> = l
                            .instances
                            .iter()
                            .map(|i| Placement::new(i.profile_id, i.start))
                            .collect();
                        v.sort();
                        v
                    })
                    .collect(),
                max_clients_per_gpu: p.max_clients_per_gpu.unwrap_or(1).max(1),
                max_changes_per_gpu: p.reconfiguration.max_per_gpu_per_hour,
                drain_timeout_seconds: p.reconfiguration.drain_timeout_seconds,
                nodes: Vec::new(),
                domains: Vec::new(),
                gpus_per_node: p.gpus_per_node,
                reservation_max_gpus: p.reservation_max_gpus,
                fair_share_preemption: p.fair_share_preemption,
            })
            .collect();
        pools.iter_mut().for_each(PoolInfo::spell);
        let tables = Tables::new(policy);

        let classes: Vec<ClassInfo> = policy
            .slo_classes
            .iter()
            .map(|c| ClassInfo {
                name: c.name.clone(),
                priority: c.priority,
                preemptible: c.preemptible,
                isolation_minimum: c.isolation_minimum,
                grace_period_seconds: c.grace_period_seconds,
                min_runtime_seconds: c.min_runtime_seconds,
            })
            .collect();

        let mut tenants: Vec<TenantInfo> = Vec::with_capacity(policy.tenants.len());
        for t in &policy.tenants {
            let parent = t
                .parent
                .as_deref()
                .and_then(|p| tables.tenant_index.get(p).copied());
            let mut lineage = vec![tenants.len()];
            if let Some(p) = parent {
                lineage.extend(tenants[p].lineage.iter().copied());
            }
            tenants.push(TenantInfo {
                name: t.name.clone(),
                parent,
                lineage,
                trust_domain: t.trust_domain.clone(),
                weight: if t.weight > 0.0 { t.weight } else { 1.0 },
                quota: t
                    .quota
                    .iter()
                    .filter_map(|(p, q)| tables.pool_index.get(p.as_str()).map(|&i| (i, q.clone())))
                    .collect(),
                fair_share: t.fair_share.clone(),
                history: 0.0,
            });
        }

        // Nodes by name, GPUs by node then index.
        let mut node_specs: Vec<&tessera_compiler::model::Node> = state.nodes.iter().collect();
        node_specs.sort_by(|a, b| a.name.cmp(&b.name));
        let mut nodes = Vec::with_capacity(node_specs.len());
        let mut gpus = Vec::new();
        for (n, spec) in node_specs.iter().enumerate() {
            if n > 0 && node_specs[n - 1].name == spec.name {
                return Err(ProblemError::DuplicateNode(spec.name.clone()));
            }
            let pool = tables.pool_index.get(spec.pool.as_str()).copied();
            let mut gpu_specs: Vec<_> = spec.gpus.iter().collect();
            gpu_specs.sort_by_key(|g| g.index);
            let mut ids = Vec::new();
            for (k, g) in gpu_specs.iter().enumerate() {
                if k > 0 && gpu_specs[k - 1].index == g.index {
                    return Err(ProblemError::DuplicateGpu {
                        node: spec.name.clone(),
                        index: g.index,
                    });
                }
                let mut instances = Vec::new();
                for inst in &g.instances {
                    let id = pool
                        .and_then(|p| pools[p].resolve_profile(&inst.profile))
                        .or_else(|| {
                            mig::builtin_model(&g.model)
                                .and_then(|m| m.resolve_profile(&inst.profile))
                        });
                    match id {
                        Some(id) => instances.push(Placement::new(id, inst.start)),
                        // An instance made by hand in a profile the catalog lacks: the
                        // reconciler reports its GPU unhealthy, which keeps the GPU out of
                        // placement and re-partitioning, so the rest of the fleet is decided.
                        None if g.health != Health::Healthy => {}
                        None => {
                            return Err(ProblemError::UnknownInstanceProfile {
                                node: spec.name.clone(),
                                index: g.index,
                                profile: inst.profile.clone(),
                                model: g.model.clone(),
                            });
                        }
                    }
                }
                instances.sort();
                mig::validate(&instances).map_err(|e| ProblemError::InvalidGeometry {
                    node: spec.name.clone(),
                    index: g.index,
                    error: e.to_string(),
                })?;
                ids.push(gpus.len());
                gpus.push(GpuInfo {
                    node: n,
                    index: g.index,
                    uuid: g.uuid.clone(),
                    healthy: g.health == Health::Healthy && spec.health == Health::Healthy,
                    mig_enabled: g.mig.enabled,
                    instances,
                    spent: 0,
                });
            }
            if let Some(p) = pool {
                pools[p].nodes.push(n);
            }
            nodes.push(NodeInfo {
                name: spec.name.clone(),
                pool,
                pool_name: spec.pool.clone(),
                domain: spec
                    .nvlink_domain
                    .clone()
                    .unwrap_or_else(|| spec.name.clone()),
                cpu: spec.cpu,
                memory: spec.memory,
                healthy: spec.health == Health::Healthy,
                gpus_by_position: gpu_specs
                    .iter()
                    .enumerate()
                    .all(|(i, g)| usize::try_from(g.index).is_ok_and(|x| x == i)),
                gpus: ids,
            });
        }
        for p in &mut pools {
            let set: BTreeSet<String> = p.nodes.iter().map(|&n| nodes[n].domain.clone()).collect();
            p.domains = set.into_iter().collect();
        }

        let mut problem = Problem {
            now,
            now_at: unix(now),
            pools,
            classes,
            tenants,
            nodes,
            gpus,
            workloads: Vec::new(),
            orphans: Vec::new(),
            reservations: Vec::new(),
            reconfigurations: Vec::new(),
            usage: None,
            listing: Listing::All,
        };
        // Workloads are identified by (tenant, name): two tenants may each run a `train`.
        // The running list is sorted by that key below, so a running duplicate is its
        // neighbour and the others are found by halving it; the queue's and the policy's keys,
        // a few thousand, are hashed (a hashed set of all 70,000 keys of a 50,000-GPU snapshot
        // cost more than the halving).
        let mut keys: std::collections::HashSet<(&str, &str), foldhash::fast::FixedState> =
            std::collections::HashSet::with_capacity_and_hasher(
                state.pending.len() + policy.workloads.len(),
                foldhash::fast::FixedState::default(),
            );
        let duplicate = |tenant: &str, name: &str| {
            ProblemError::DuplicateWorkload(WorkloadKey::new(tenant, name).to_string())
        };
        // Sorted and resolved on the machine's cores (`split`): at 50,000 GPUs the running
        // list is 65,000 workloads, and resolving one reads only the policy, the nodes and the
        // pools. Checked and added in order, so the first error is the sequential loop's.
        problem
            .workloads
            .reserve(state.running.len() + state.pending.len() + policy.workloads.len());
        let mut running: Vec<_> = state.running.iter().collect();
        crate::split::sort_by(&mut running, |a, b| {
            (&a.spec.tenant, &a.name).cmp(&(&b.spec.tenant, &b.name))
        });
        let resolved = {
            // Nodes by name, hashed: a binding's node was found by halving the sorted nodes,
            // a dozen string comparisons per binding of 65,000 workloads at 50,000 GPUs.
            let node_index = problem.node_index();
            crate::split::map(&running, |run| {
                problem.resolve_running(&tables, &node_index, run)
            })
        };
        fn key_of(run: &tessera_compiler::model::RunningWorkload) -> (&str, &str) {
            (run.spec.tenant.as_str(), run.name.as_str())
        }
        let runs = |key: (&str, &str)| {
            running
                .binary_search_by(|run| key_of(run).cmp(&key))
                .is_ok()
        };
        for (i, (run, resolved)) in running.iter().zip(resolved).enumerate() {
            if i > 0 && key_of(running[i - 1]) == key_of(run) {
                return Err(duplicate(&run.spec.tenant, &run.name));
            }
            match resolved? {
                Resolved::Workload(w) => problem.workloads.push(w),
                Resolved::Orphan(o) => problem.orphans.push(o),
            }
        }
        let mut pending: Vec<(i64, usize, &str, &WorkloadSpec)> = Vec::new();
        for (i, p) in state.pending.iter().enumerate() {
            let key = (p.spec.tenant.as_str(), p.name.as_str());
            if runs(key) || !keys.insert(key) {
                return Err(duplicate(&p.spec.tenant, &p.name));
            }
            pending.push((p.submitted_at.as_second(), i, &p.name, &p.spec));
        }
        pending.sort_by_key(|(t, i, _, _)| (*t, *i));
        for (submitted_at, _, name, spec) in pending {
            problem.add_pending(&tables, name, spec, submitted_at)?;
        }
        // Committed workloads of the policy that the snapshot neither runs nor queues are demand
        // too (GitOps: what the repository declares should run).
        for w in &policy.workloads {
            let key = (w.tenant.as_str(), w.name.as_str());
            if !runs(key) && keys.insert(key) {
                problem.add_committed(w, observed);
            }
        }
        // A record that no longer fits the snapshot (the gang started or left, a node or the
        // pool went away) is dropped: the solver chooses afresh if the gang still waits. A record
        // names its gang as `tenant/name`, or by a bare name one workload has (older records).
        for r in &state.reservations {
            let known = problem.workloads.iter().map(|w| &w.key);
            let Some(key) = tessera_compiler::key::resolve_reference(&r.workload, known) else {
                continue;
            };
            let Some(workload) = problem
                .workloads
                .iter()
                .position(|w| w.key == key && !w.is_running())
            else {
                continue;
            };
            let Some(pool) = problem.pools.iter().position(|p| p.name == r.pool) else {
                continue;
            };
            let nodes: Option<Vec<usize>> = r
                .nodes
                .iter()
                .map(|n| {
                    problem
                        .nodes
                        .binary_search_by(|x| x.name.as_str().cmp(n))
                        .ok()
                        .filter(|&i| problem.nodes[i].pool == Some(pool))
                })
                .collect();
            let since = r.since.as_second();
            let Some(mut nodes) = nodes else {
                continue;
            };
            nodes.sort_unstable();
            nodes.dedup();
            if problem.workloads[workload].pools.contains(&pool) && !nodes.is_empty() {
                problem.reservations.push(PriorReservation {
                    workload,
                    pool,
                    nodes,
                    since,
                });
            }
        }
        problem.count_reconfigurations(&state.reconfigurations);
        // Past usage is weighed once per cycle, from the running set as resolved above: the
        // cycle itself must not change a tenant's history, or the order would depend on it.
        if problem.tenants.iter().any(|t| t.fair_share.is_some()) {
            let record = crate::fairshare::accrue(&problem, state.usage.as_ref());
            let shares = crate::fairshare::history_shares(&problem, Some(&record));
            for (t, h) in problem.tenants.iter_mut().zip(shares) {
                t.history = h;
            }
            problem.usage = Some(record);
        }
        Ok(problem)
    }

    /// Resolves one more pending workload as [`Problem::new`] would have with it in the
    /// snapshot's queue: pushed on `workloads`, or on `orphans` when it names what `policy`
    /// lacks. `policy` must be the one the problem was built from. What a session's arrival
    /// costs: the policy's names looked up, rather than a problem built again from the whole
    /// policy for one workload.
    pub(crate) fn add_arrival(
        &mut self,
        policy: &CompiledPolicy,
        arrival: &PendingWorkload,
    ) -> Result<(), ProblemError> {
        self.add_pending(
            &Tables::new(policy),
            &arrival.name,
            &arrival.spec,
            arrival.submitted_at.as_second(),
        )
    }

    fn orphan(
        &mut self,
        name: &str,
        (tenant, class): (&str, &str),
        cause: OrphanCause,
        run: Option<(Gpus, i64)>,
    ) {
        self.orphans
            .push(orphan_of(name, (tenant, class), cause, run));
    }

    /// Tenant and class of a spec, or why it is orphaned.
    fn references(&self, t: &Tables, spec: &WorkloadSpec) -> Result<(usize, usize), OrphanCause> {
        let tenant = *t
            .tenant_index
            .get(spec.tenant.as_str())
            .ok_or_else(|| OrphanCause::Tenant(spec.tenant.clone()))?;
        let class = *t
            .class_index
            .get(spec.slo_class.as_str())
            .ok_or_else(|| OrphanCause::SloClass(spec.slo_class.clone()))?;
        if t.allowed_classes.binary_search(&(tenant, class)).is_err() {
            return Err(OrphanCause::ClassNotAllowed {
                tenant: spec.tenant.clone(),
                class: spec.slo_class.clone(),
            });
        }
        if let Some(p) = &spec.pool
            && !t.pool_index.contains_key(p.as_str())
        {
            return Err(OrphanCause::Pool(p.clone()));
        }
        Ok((tenant, class))
    }

    /// The nodes by name, hashed.
    pub(crate) fn node_index(&self) -> NodeIndex<'_> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect()
    }

    /// The GPU of node `n` with NVML index `index`. A node's GPUs are nearly always numbered
    /// from 0 without a gap, and then the index is the position: scanning the node's GPUs
    /// read up to eight of them, each likely a cache miss at 50,000 GPUs, for every binding
    /// of the snapshot.
    fn gpu_id(&self, n: usize, index: u32) -> Option<usize> {
        let node = &self.nodes[n];
        if node.gpus_by_position {
            return usize::try_from(index)
                .ok()
                .and_then(|i| node.gpus.get(i).copied());
        }
        node.gpus
            .iter()
            .copied()
            .find(|&id| self.gpus[id].index == index)
    }

    /// A running workload of the snapshot resolved against the policy, the nodes and the
    /// pools (built before it): the workload, or the orphan it is.
    fn resolve_running(
        &self,
        t: &Tables,
        nodes: &NodeIndex,
        run: &tessera_compiler::model::RunningWorkload,
    ) -> Result<Resolved, ProblemError> {
        let started_at = run.started_at.as_second();
        let last_checkpoint_at = run.last_checkpoint_at.map(|t| t.as_second());
        let spec = &run.spec;
        if run.bindings.len() != spec.replicas as usize {
            return Err(ProblemError::BindingCount {
                workload: format!("{}/{}", spec.tenant, run.name),
                replicas: spec.replicas,
                bindings: run.bindings.len(),
            });
        }
        let since = last_checkpoint_at.unwrap_or(started_at).max(started_at);
        // Node names are unique (`DuplicateNode`).
        let node_of = |b: &Binding| nodes.get(b.node.as_str()).copied();
        // Most workloads have one replica: its node is looked up once, for the pool and the
        // binding both.
        let first_node = run.bindings.first().and_then(node_of);
        let pool = first_node.and_then(|n| self.nodes[n].pool);
        // What an orphan held, for its report: only orphans read it, and a MIG profile's
        // name is looked up in every built-in model.
        let rough = || rough_gpus(spec) * i64::from(spec.replicas);
        let (tenant, class) = match self.references(t, spec) {
            Ok(x) => x,
            Err(cause) => {
                return Ok(Resolved::Orphan(orphan_of(
                    &run.name,
                    (&spec.tenant, &spec.slo_class),
                    cause,
                    Some((rough(), since)),
                )));
            }
        };
        let Some(pool) = pool else {
            let Some(node) = first_node else {
                return Err(ProblemError::InvalidBinding {
                    workload: format!("{}/{}", spec.tenant, run.name),
                    binding: 0,
                    message: match run.bindings.first() {
                        Some(b) => format!("unknown node `{}`", b.node),
                        None => "a running workload has at least one binding".into(),
                    },
                });
            };
            let cause = OrphanCause::NodePool {
                node: self.nodes[node].name.clone(),
                pool: self.nodes[node].pool_name.clone(),
            };
            return Ok(Resolved::Orphan(orphan_of(
                &run.name,
                (&spec.tenant, &spec.slo_class),
                cause,
                Some((rough(), since)),
            )));
        };
        let demand =
            demand_on(&self.pools[pool], spec).map_err(|message| ProblemError::InvalidRequest {
                workload: format!("{}/{}", spec.tenant, run.name),
                message,
            })?;
        let mut slots = Vec::with_capacity(run.bindings.len());
        for (i, b) in run.bindings.iter().enumerate() {
            let bad = |message: String| ProblemError::InvalidBinding {
                workload: format!("{}/{}", spec.tenant, run.name),
                binding: i,
                message,
            };
            let node = if i == 0 { first_node } else { node_of(b) }
                .ok_or_else(|| bad(format!("unknown node `{}`", b.node)))?;
            if self.nodes[node].pool != Some(pool) {
                return Err(bad(format!(
                    "node `{}` is not in pool `{}` like the first replica's",
                    b.node, self.pools[pool].name
                )));
            }
            let mut ids = Vec::new();
            for g in &b.gpus {
                let id = self
                    .gpu_id(node, *g)
                    .ok_or_else(|| bad(format!("GPU {g} of node `{}` does not exist", b.node)))?;
                if ids.contains(&id) {
                    return Err(bad(format!("GPU {g} is listed twice")));
                }
                ids.push(id);
            }
            match demand {
                Demand::Whole { count: 0 } => {
                    if !ids.is_empty() || b.mig_start.is_some() || b.share.is_some() {
                        return Err(bad("a CPU-only replica names no GPU".into()));
                    }
                }
                Demand::Whole { count } => {
                    if ids.len() != count as usize {
                        return Err(bad(format!("a replica holds {count} whole GPUs")));
                    }
                }
                Demand::Mig { profile_id } => {
                    let ok = ids.len() == 1
                        && b.mig_start.is_some_and(|s| {
                            self.gpus[ids[0]]
                                .instances
                                .contains(&Placement::new(profile_id, s))
                        });
                    if !ok {
                        return Err(bad(
                            "a MIG replica names one GPU and the start of an existing instance of its profile"
                                .into(),
                        ));
                    }
                }
                Demand::Share { fraction } => {
                    if ids.len() != 1 || b.share.is_some_and(|s| s != fraction) {
                        return Err(bad("a shared replica names one GPU and its share".into()));
                    }
                }
            }
            slots.push(Slot {
                node,
                gpus: ids,
                mig_start: b.mig_start,
                share: match demand {
                    Demand::Share { fraction } => Some(fraction),
                    _ => None,
                },
            });
        }
        Ok(Resolved::Workload(WorkloadInfo {
            key: WorkloadKey::new(&spec.tenant, &run.name),
            tenant,
            class,
            demand,
            replicas: spec.replicas,
            min_member: spec.min_member.unwrap_or(spec.replicas).min(spec.replicas),
            cpu: spec.cpu,
            memory: spec.memory,
            topology: spec.topology.same_nvlink_domain,
            pools: vec![pool],
            excluded: Vec::new(),
            phase: Phase::Running {
                slots,
                started_at,
                last_checkpoint_at,
            },
            max_duration_seconds: spec.max_duration.map(|d| d.seconds()),
        }))
    }

    fn add_pending(
        &mut self,
        t: &Tables,
        name: &str,
        spec: &WorkloadSpec,
        submitted_at: i64,
    ) -> Result<(), ProblemError> {
        let (tenant, class) = match self.references(t, spec) {
            Ok(x) => x,
            Err(cause) => {
                self.orphan(name, (&spec.tenant, &spec.slo_class), cause, None);
                return Ok(());
            }
        };
        let candidates: Vec<usize> = match &spec.pool {
            Some(p) => vec![t.pool_index[p.as_str()]],
            None => (0..self.pools.len()).collect(),
        };
        let mut pools = Vec::new();
        let mut excluded = Vec::new();
        let mut demand = None;
        let minimum = self.classes[class].isolation_minimum;
        for p in candidates {
            let pool = &self.pools[p];
            let d = match demand_on(pool, spec) {
                Ok(d) => d,
                Err(e) => {
                    excluded.push((p, Exclusion::Shape(e)));
                    continue;
                }
            };
            if pool.sharing < minimum {
                excluded.push((
                    p,
                    Exclusion::Isolation {
                        sharing: pool.sharing,
                        minimum,
                    },
                ));
                continue;
            }
            if !self.tenants[tenant].quota.contains_key(&p) {
                excluded.push((p, Exclusion::NoQuota));
                continue;
            }
            // One demand per workload: a MIG profile may resolve to different IDs on different
            // models; the first pool's resolution wins and pools that disagree are ruled out.
            match demand {
                None => demand = Some(d),
                Some(first) if first != d => {
                    excluded.push((
                        p,
                        Exclusion::Shape("the profile differs on this model".into()),
                    ));
                    continue;
                }
                Some(_) => {}
            }
            pools.push(p);
        }
        let demand = match demand {
            Some(d) => d,
            None => fallback_demand(spec).ok_or_else(|| ProblemError::InvalidRequest {
                workload: format!("{}/{name}", spec.tenant),
                message: "`gpu` must set exactly one of count, migProfile, fraction".into(),
            })?,
        };
        self.workloads.push(WorkloadInfo {
            key: WorkloadKey::new(&spec.tenant, name),
            tenant,
            class,
            demand,
            replicas: spec.replicas.max(1),
            min_member: spec
                .min_member
                .unwrap_or(spec.replicas)
                .clamp(1, spec.replicas.max(1)),
            cpu: spec.cpu,
            memory: spec.memory,
            topology: spec.topology.same_nvlink_domain,
            pools,
            excluded,
            phase: Phase::Pending { submitted_at },
            max_duration_seconds: spec.max_duration.map(|d| d.seconds()),
        });
        Ok(())
    }

    fn add_committed(&mut self, w: &tessera_compiler::compiled::CompiledWorkload, observed: i64) {
        let Some(tenant) = self.tenants.iter().position(|t| t.name == w.tenant) else {
            self.orphan(
                &w.name,
                (&w.tenant, &w.slo_class),
                OrphanCause::Tenant(w.tenant.clone()),
                None,
            );
            return;
        };
        let Some(class) = self.classes.iter().position(|c| c.name == w.slo_class) else {
            self.orphan(
                &w.name,
                (&w.tenant, &w.slo_class),
                OrphanCause::SloClass(w.slo_class.clone()),
                None,
            );
            return;
        };
        let demand = match &w.gpu {
            tessera_compiler::compiled::GpuDemand::Whole { count } => {
                Demand::Whole { count: *count }
            }
            tessera_compiler::compiled::GpuDemand::Mig { profile_id } => Demand::Mig {
                profile_id: *profile_id,
            },
            tessera_compiler::compiled::GpuDemand::Share { fraction } => Demand::Share {
                fraction: *fraction,
            },
        };
        let pools = w
            .pools
            .iter()
            .filter_map(|p| self.pools.iter().position(|x| &x.name == p))
            .collect();
        self.workloads.push(WorkloadInfo {
            key: WorkloadKey::new(&w.tenant, &w.name),
            tenant,
            class,
            demand,
            replicas: w.replicas.max(1),
            min_member: w.min_member.clamp(1, w.replicas.max(1)),
            cpu: w.cpu,
            memory: w.memory,
            topology: w.topology,
            pools,
            excluded: Vec::new(),
            phase: Phase::Pending {
                submitted_at: observed,
            },
            max_duration_seconds: w.max_duration_seconds,
        });
    }

    pub fn node_of_gpu(&self, gpu: usize) -> &NodeInfo {
        &self.nodes[self.gpus[gpu].node]
    }

    /// `node/index` of a GPU, for messages.
    pub fn gpu_label(&self, gpu: usize) -> String {
        format!("{}/{}", self.node_of_gpu(gpu).name, self.gpus[gpu].index)
    }
}

/// Each item's position, by its name.
/// Names to their position, hashed: the snapshot's 65,000 running workloads at 50,000 GPUs
/// each look up a tenant and a class, where a tree cost a string comparison per level.
type NameIndex<'a> = std::collections::HashMap<&'a str, usize, foldhash::fast::FixedState>;

fn index_by_name<T>(items: &[T], name: impl Fn(&T) -> &String) -> NameIndex<'_> {
    items
        .iter()
        .enumerate()
        .map(|(i, x)| (name(x).as_str(), i))
        .collect()
}

/// The problem's nodes by name.
pub(crate) type NodeIndex<'a> =
    std::collections::HashMap<&'a str, usize, foldhash::fast::FixedState>;

/// A running workload of the snapshot, resolved ([`Problem::resolve_running`]).
// Unboxed: each is moved once into the problem's list, where a box cost an allocation per
// workload of a 65,000-workload snapshot.
#[allow(clippy::large_enum_variant)]
enum Resolved {
    Workload(WorkloadInfo),
    Orphan(Orphan),
}

/// The orphan `name` of `tenant` in `class` is, with what it holds while it runs.
fn orphan_of(
    name: &str,
    (tenant, class): (&str, &str),
    cause: OrphanCause,
    run: Option<(Gpus, i64)>,
) -> Orphan {
    Orphan {
        name: name.to_owned(),
        cause,
        was_running: run.is_some(),
        tenant: tenant.to_owned(),
        class: class.to_owned(),
        gpus: run.map_or(Gpus::ZERO, |r| r.0),
        since: run.map(|r| r.1),
    }
}

struct Tables<'a> {
    pool_index: NameIndex<'a>,
    class_index: NameIndex<'a>,
    tenant_index: NameIndex<'a>,
    /// The (tenant, SLO class) pairs the policy allows, sorted: a running workload's class is
    /// checked by number, not by comparing its name with each of the tenant's.
    allowed_classes: Vec<(usize, usize)>,
}

impl<'a> Tables<'a> {
    fn new(policy: &'a CompiledPolicy) -> Tables<'a> {
        let class_index = index_by_name(&policy.slo_classes, |x| &x.name);
        let mut allowed_classes = Vec::new();
        for (t, tenant) in policy.tenants.iter().enumerate() {
            for c in &tenant.slo_classes {
                if let Some(&c) = class_index.get(c.as_str()) {
                    allowed_classes.push((t, c));
                }
            }
        }
        allowed_classes.sort_unstable();
        Tables {
            pool_index: index_by_name(&policy.pools, |x| &x.name),
            class_index,
            tenant_index: index_by_name(&policy.tenants, |x| &x.name),
            allowed_classes,
        }
    }
}

fn share_of(spec: &WorkloadSpec) -> Option<Gpus> {
    spec.gpu
        .fraction
        .and_then(Gpus::from_f64)
        .filter(|s| s.units() % 7 == 0 && s.units() > 0 && *s <= Gpus::whole(1))
}

fn rough_gpus(spec: &WorkloadSpec) -> Gpus {
    fallback_demand(spec).map_or(Gpus::ZERO, Demand::gpus)
}

fn fallback_demand(spec: &WorkloadSpec) -> Option<Demand> {
    if let Some(count) = spec.gpu.count {
        return Some(Demand::Whole { count });
    }
    if let Some(fraction) = share_of(spec) {
        return Some(Demand::Share { fraction });
    }
    let p = spec.gpu.mig_profile.as_deref()?;
    let id = p
        .parse()
        .ok()
        .or_else(|| mig::builtins().iter().find_map(|m| m.resolve_profile(p)))?;
    Some(Demand::Mig { profile_id: id })
}

/// The demand of one replica on `pool`, or why the pool cannot hold that shape.
fn demand_on(pool: &PoolInfo, spec: &WorkloadSpec) -> Result<Demand, String> {
    let g = &spec.gpu;
    let set = g.kinds_set();
    if set != 1 {
        return Err("`gpu` must set exactly one of count, migProfile, fraction".into());
    }
    let d = if let Some(count) = g.count {
        if count == 0 && spec.cpu.0 == 0 && spec.memory.0 == 0 {
            return Err("asks for no GPU, no CPU and no memory".into());
        }
        let d = Demand::Whole { count };
        if !pool.takes(d) {
            return Err("whole GPUs on a MIG pool need a layout with a 7g instance".into());
        }
        if count > pool.gpus_per_node {
            return Err(format!(
                "a replica asks {count} GPUs on one node, a node has {}",
                pool.gpus_per_node
            ));
        }
        d
    } else if let Some(profile) = &g.mig_profile {
        // Checked before the profile, so that the message names the pool's kind, not a
        // profile its model lacks.
        if pool.sharing != Sharing::Mig {
            return Err(format!(
                "MIG instances need a mig pool, not `{}`",
                pool.sharing.as_str()
            ));
        }
        let id = pool
            .resolve_profile(profile)
            .ok_or_else(|| format!("`{profile}` is not a MIG profile of {}", pool.gpu_model))?;
        let d = Demand::Mig { profile_id: id };
        if !pool.takes(d) {
            return Err(format!("none of its layouts has a `{profile}` instance"));
        }
        d
    } else {
        let fraction = share_of(spec).ok_or("the fraction is not a whole number of thousandths")?;
        let d = Demand::Share { fraction };
        if !pool.takes(d) {
            return Err(format!(
                "a GPU fraction needs an mps or timeslice pool, not `{}`",
                pool.sharing.as_str()
            ));
        }
        d
    };
    Ok(d)
}

/// Whether a layout is the whole GPU as one 7g instance.
fn has_whole(layout: &[Placement]) -> bool {
    layout.iter().any(|p| p.profile_id == mig::PROFILE_7G)
}

/// One reading and one writing of an instant everywhere: the compiler's, on jiff.
pub use tessera_compiler::units::{format_rfc3339, parse_rfc3339, unix};
