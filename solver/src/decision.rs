//! [`Decision`]: what the solver decided for one cycle, serializable and byte-stable.
//!
//! Collections are in a fixed order (workloads by tenant and name, GPUs by node and index, tenants in the
//! policy's pre-order, pools by name) so that the same inputs serialize to the same bytes.

use std::fmt;
use std::sync::Arc;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tessera_compiler::model::{
    Binding, ReconfigurationRecord, ReservationRecord, Sharing, UsageRecord,
};
use tessera_compiler::units::Gpus;

/// Bumped on any change a consumer of the JSON could notice.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub format_version: u32,
    /// The instant the decision is for (RFC 3339, UTC).
    pub now: Timestamp,
    /// Which method produced the decision.
    pub method: Method,
    /// The value of the decision: the sum over placed workloads (kept and admitted) of
    /// `priority × GPUs`, minus the GPU-hours of work lost to preemptions times the victim's
    /// priority. Higher is better.
    pub objective: f64,
    /// An upper bound on `objective`: the optimum of the LP relaxation of admission into pools
    /// (see `bound.rs`: solved exactly, as a flow; placement detail relaxed away). The solver
    /// always sets it; `None` is for a decision without one. No bound is ever estimated.
    pub bound: Option<f64>,
    /// `(bound − objective) / |bound|` when a bound exists; `None` otherwise.
    pub gap: Option<f64>,
    /// Every workload of the snapshot and every committed workload of the policy, by tenant and
    /// name (a workload is identified by both: names are per tenant); with [`Listing::Changes`],
    /// only those admitted or preempted.
    pub workloads: Vec<WorkloadDecision>,
    /// Which workloads `workloads` lists. Absent from the JSON when every one is.
    #[serde(default, skip_serializing_if = "Listing::is_all")]
    pub listing: Listing,
    /// Every GPU of a MIG pool, by node and index: its geometry now and after the decision;
    /// with [`Listing::Changes`], only those whose instances change or that switch to MIG.
    pub geometry: Vec<GeometryPlan>,
    /// Per tenant (pre-order) and pool (by name) the tenant may use: usage after the decision.
    pub usage: Vec<TenantUsage>,
    /// Per pool, by name.
    pub pools: Vec<PoolReport>,
    /// Fair share over time: each tenant's decayed usage brought to `now` (the next snapshot's
    /// `usage`) and what it leads to. Absent when no tenant sets `fairShare`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_share: Option<FairShareReport>,
    /// Capacity held for waiting gangs (the next snapshot's `reservations`), by workload key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<ReservationReport>,
    /// The workloads left waiting, in the order this decision considered them (priority,
    /// within guarantee before borrowing, fair share, submission): a waiting workload's place
    /// in line. A workload no pool may hold (its pools, classes or shape rule every pool out)
    /// waits for a policy change, not its turn, and is absent. By workload key (`tenant/name`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue: Vec<String>,
    /// The next snapshot's `reconfigurations`: the snapshot's records still counting, and one
    /// at `now` for each GPU this decision destroys instances on or switches to MIG, by node,
    /// GPU and instant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reconfigurations: Vec<ReconfigurationRecord>,
}

/// Which workloads and GPUs a decision lists. The decision itself is the same either way: the
/// same admissions, preemptions, geometry changes, usage, pool reports, queue and objective.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Listing {
    /// Every workload, kept and pending ones too: what `plan`, the service's status and its
    /// API show.
    #[default]
    All,
    /// Only the workloads the decision changes, admitted or preempted (orphans preempted
    /// included). A running workload it does not list is kept; a waiting one stays waiting.
    /// Likewise only the GPUs whose geometry changes: one it does not list keeps its instances.
    /// For a caller that only carries decisions out, such as `tessera simulate`'s replay,
    /// where building, then dropping, a decision for each of thousands of kept workloads
    /// every cycle was a sixth of a simulated day.
    Changes,
}

impl Listing {
    pub fn is_all(&self) -> bool {
        *self == Listing::All
    }
}

/// Fair share over time, as this decision weighed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FairShareReport {
    /// Decayed usage as of `now`, for the next snapshot.
    pub record: UsageRecord,
    /// Per tenant with a fair-share setting, pre-order.
    pub tenants: Vec<TenantShare>,
}

/// One tenant's standing for idle capacity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantShare {
    pub tenant: String,
    pub weight: f64,
    /// Decayed dominant borrowed share (see `fairshare::history_share`): 0.1 for a tenant that
    /// borrowed a steady tenth of the fleet.
    pub history: f64,
    /// The share of borrowable capacity this tenant is entitled to among the tenants it
    /// competes with, after history (0 to 1).
    pub share: f64,
}

/// Capacity held for one waiting gang.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReservationReport {
    /// The gang's key, `tenant/name`.
    pub workload: String,
    pub pool: String,
    /// The nodes it will land on.
    pub nodes: Vec<String>,
    /// When the reservation was first made (RFC 3339).
    pub since: Timestamp,
    /// GPUs the gang needs.
    pub needed: u32,
    /// Free GPUs held idle for it after this decision.
    pub held_idle: u32,
    /// GPUs of the reservation lent to preemptible backfill, which yields when it completes.
    pub backfilled: u32,
    /// When the running work in the way is declared to end (RFC 3339); `None` when some of it
    /// declares no `maxDuration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<Timestamp>,
}

impl ReservationReport {
    /// What the next snapshot carries.
    pub fn record(&self) -> ReservationRecord {
        ReservationRecord {
            workload: self.workload.clone(),
            pool: self.pool.clone(),
            nodes: self.nodes.clone(),
            since: self.since,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// The greedy heuristic alone.
    Heuristic,
    /// The heuristic's decision, improved by the integer program in at least one pool.
    Refined,
}

/// The integer program's work on one pool (see `ilp/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolRefinement {
    /// Gangs, running workloads and nodes the sub-problem decided about (0 when none was built).
    pub gangs: u32,
    pub running: u32,
    pub nodes: u32,
    pub variables: u32,
    pub constraints: u32,
    #[serde(flatten)]
    pub status: RefineStatus,
}

/// How a pool's refinement ended. Every status but `improved` leaves the heuristic's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum RefineStatus {
    /// A strictly better decision was found and rebuilt through the heuristic's steps.
    Improved { gain: f64 },
    /// The heuristic's decision is optimal for the sub-problem.
    Optimal,
    /// The search stopped at its node limit (deterministic) with nothing better.
    NodeLimit,
    /// The search stopped at the cycle's time limit: the one outcome that depends on the clock.
    TimeLimit,
    /// No sub-problem was solved; `reason` says why.
    Skipped { reason: String },
    /// The integer program's answer did not survive the rebuild; `reason` says where it failed.
    Rejected { reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadDecision {
    pub name: String,
    pub tenant: String,
    pub slo_class: String,
    pub priority: i64,
    /// The pool it runs (or will run) in; `None` while it waits or is stopped.
    pub pool: Option<String>,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// What the decision does with one workload.
///
/// Serialized by hand (the layout `#[serde(tag = "outcome")]` would write) to add each reason's
/// `message`, its sentence: derived from the reason when written, not kept beside it, since a
/// fleet's decision has thousands of waiting workloads and most decisions are never written.
/// Reading a decision back ignores the `message` and keeps the reason it came from.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Outcome {
    /// Running, and stays where it is.
    Keep { bindings: Vec<ReplicaBinding> },
    /// Starts now, on these bindings (at least `minMember` replicas).
    Admit {
        bindings: Vec<ReplicaBinding>,
        /// Part of its GPUs within its tenant's guarantee, and part borrowed above it.
        guaranteed: Gpus,
        borrowed: Gpus,
    },
    /// Running, and stopped after a checkpoint signal: its capacity is counted free in this
    /// decision, but is really released only after `grace_seconds`.
    Preempt {
        grace_seconds: u64,
        /// GPUs × seconds since the last checkpoint (or the start).
        lost_gpu_seconds: f64,
        reason: PreemptReason,
    },
    /// Not placed this cycle.
    Pending { reason: Reason },
}

impl Outcome {
    /// The sentence that explains a preemption or a wait (the reason's `Display`); `None` for
    /// work that runs.
    pub fn message(&self) -> Option<String> {
        match self {
            Outcome::Keep { .. } | Outcome::Admit { .. } => None,
            Outcome::Preempt { reason, .. } => Some(reason.to_string()),
            Outcome::Pending { reason } => Some(reason.to_string()),
        }
    }
}

impl Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        // The message is written through `collect_str`, straight from the reason's `Display`.
        struct Sentence<'a, T: fmt::Display>(&'a T);
        impl<T: fmt::Display> Serialize for Sentence<'_, T> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self.0)
            }
        }
        match self {
            Outcome::Keep { bindings } => {
                let mut st = serializer.serialize_struct("Outcome", 2)?;
                st.serialize_field("outcome", "keep")?;
                st.serialize_field("bindings", bindings)?;
                st.end()
            }
            Outcome::Admit {
                bindings,
                guaranteed,
                borrowed,
            } => {
                let mut st = serializer.serialize_struct("Outcome", 4)?;
                st.serialize_field("outcome", "admit")?;
                st.serialize_field("bindings", bindings)?;
                st.serialize_field("guaranteed", guaranteed)?;
                st.serialize_field("borrowed", borrowed)?;
                st.end()
            }
            Outcome::Preempt {
                grace_seconds,
                lost_gpu_seconds,
                reason,
            } => {
                let mut st = serializer.serialize_struct("Outcome", 5)?;
                st.serialize_field("outcome", "preempt")?;
                st.serialize_field("grace_seconds", grace_seconds)?;
                st.serialize_field("lost_gpu_seconds", lost_gpu_seconds)?;
                st.serialize_field("reason", reason)?;
                st.serialize_field("message", &Sentence(reason))?;
                st.end()
            }
            Outcome::Pending { reason } => {
                let mut st = serializer.serialize_struct("Outcome", 3)?;
                st.serialize_field("outcome", "pending")?;
                st.serialize_field("reason", reason)?;
                st.serialize_field("message", &Sentence(reason))?;
                st.end()
            }
        }
    }
}

/// Where one replica runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaBinding {
    pub node: String,
    /// Device indices: whole GPUs, or the one GPU holding the instance or share.
    pub gpus: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_start: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<Gpus>,
}

impl ReplicaBinding {
    /// The binding a snapshot records once the replica runs (the profile is the pool's to
    /// resolve from the start and the GPU, so it is not kept).
    pub fn binding(&self) -> Binding {
        Binding {
            node: self.node.clone(),
            gpus: self.gpus.clone(),
            mig_start: self.mig_start,
            share: self.share,
        }
    }
}

/// One MIG instance on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Instance {
    pub start: u8,
    pub profile_id: u32,
    pub profile: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GeometryPlan {
    pub node: String,
    pub gpu: u32,
    pub pool: String,
    pub current: Vec<Instance>,
    pub target: Vec<Instance>,
    /// Instances of `current` not in `target`.
    pub destroy: Vec<Instance>,
    /// Instances of `target` not in `current`.
    pub create: Vec<Instance>,
    /// MIG mode must be switched on first (a GPU reset).
    pub enable_mig: bool,
    /// An instance to destroy is held by a workload preempted in this decision: it must drain
    /// (grace period) before the change.
    pub drain: bool,
}

impl GeometryPlan {
    /// Carrying the plan out touches the GPU: MIG switched on, or instances created or
    /// destroyed. A decision listing its changes lists only such plans.
    pub fn changes(&self) -> bool {
        self.enable_mig || !self.create.is_empty() || !self.destroy.is_empty()
    }

    /// The change takes something away (destroys instances or resets the GPU into MIG mode):
    /// it spends the pool's `maxPerGpuPerHour`. Adding instances on free slices does not.
    pub fn spends_budget(&self) -> bool {
        !self.destroy.is_empty() || self.enable_mig
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantUsage {
    pub tenant: String,
    pub pool: String,
    pub guarantee: Gpus,
    pub limit: Gpus,
    /// Usage of the tenant and its descendants after the decision.
    pub total: Gpus,
    /// `min(total, guarantee)`.
    pub guaranteed: Gpus,
    /// `total − guaranteed`.
    pub borrowed: Gpus,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolReport {
    pub pool: String,
    pub sharing: Sharing,
    /// GPUs of the snapshot's healthy nodes in the pool.
    pub capacity: Gpus,
    /// GPUs held after the decision (MIG instances count compute slices / 7, shares their
    /// fraction).
    pub allocated: Gpus,
    /// `allocated / capacity`, to four decimals (0 for an empty pool).
    pub allocation: f64,
    pub free: Gpus,
    /// Free capacity that no shape still pending on this pool can use (0 when none is pending).
    pub stranded: Gpus,
    /// FGD's fragmentation measure after the decision: the free GPU capacity of the pool's
    /// healthy nodes that a replica drawn from the running workload mix could not use, in
    /// expectation (each shape weighted by how many running replicas have it; absent when the
    /// pool runs nothing or nothing is fragmented). See the solver's placement scoring.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fragmentation: Gpus,
    /// Healthy nodes with every GPU free.
    pub free_nodes: u32,
    /// NVLink domains whose nodes are all free.
    pub free_domains: u32,
    /// Free GPUs left idle because reservations hold them for waiting gangs: the measured cost
    /// of not starving large work (absent when zero).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reserved_idle: Gpus,
    /// What the integer program did with the heuristic's decision in this pool; absent when
    /// no refinement ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refinement: Option<PoolRefinement>,
}

fn is_zero(g: &Gpus) -> bool {
    *g == Gpus::ZERO
}

/// Which resource a quota refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Gpus,
    Cpu,
    Memory,
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Gpus => "GPUs",
            Resource::Cpu => "CPU",
            Resource::Memory => "memory",
        })
    }
}

/// How many protected candidates a [`Reason::PreemptionNotAllowed`] lists.
pub const PROTECTED_LISTED: usize = 16;

/// Why a running workload's preemption was blocked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "why")]
pub enum Protected {
    NonPreemptible {
        workload: String,
    },
    MinRuntime {
        workload: String,
        remaining_seconds: u64,
    },
    WithinGuarantee {
        workload: String,
    },
    NotLowerPriority {
        workload: String,
    },
    /// Borrowed work of the requester's priority that its side keeps: after the swap it would
    /// borrow less, per unit of weight, than the requester's side.
    FairShare {
        workload: String,
    },
}

impl fmt::Display for Protected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Protected::NonPreemptible { workload } => write!(f, "`{workload}` is non-preemptible"),
            Protected::MinRuntime {
                workload,
                remaining_seconds,
            } => write!(
                f,
                "`{workload}` has not reached its minRuntime ({} left)",
                tessera_compiler::units::Duration(*remaining_seconds)
            ),
            Protected::WithinGuarantee { workload } => {
                write!(f, "`{workload}` is within its tenant's guarantee")
            }
            Protected::NotLowerPriority { workload } => {
                write!(f, "`{workload}` is not of lower priority")
            }
            Protected::FairShare { workload } => write!(
                f,
                "`{workload}` is not of lower priority, and its side of the tenant tree would borrow less than yours after the swap"
            ),
        }
    }
}

/// Why a workload is left waiting. Each renders one precise sentence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Reason {
    /// Usage + request would exceed a limit at the tenant or an ancestor.
    QuotaExceeded {
        tenant: String,
        pool: String,
        resource: Resource,
        usage: String,
        request: String,
        limit: String,
    },
    /// Usage + request would exceed the root's limit, which is at least the pool's capacity:
    /// the pool cannot hold it, whatever the quotas below the root.
    PoolFull {
        /// The root tenant, whose usage is the pool's.
        tenant: String,
        pool: String,
        resource: Resource,
        usage: String,
        request: String,
        capacity: String,
    },
    /// Borrowing would take capacity other tenants reserve (idle guarantee beyond lending).
    BorrowReserved {
        pool: String,
        borrow: Gpus,
        free: Gpus,
        reserved: Gpus,
    },
    /// `required` topology: no domain has room for the gang.
    NoNvlinkDomain {
        pool: String,
        needed_gpus: Gpus,
        best_free: Gpus,
    },
    /// Not enough room for `minMember` replicas in the pool.
    NoCapacity {
        pool: String,
        needed: u32,
        fit: u32,
        free: Gpus,
    },
    /// No GPU has a free instance of the profile or can be given one.
    NoMigInstance { pool: String, profile: String },
    /// An instance could be created only by reconfiguring GPUs whose budget is spent.
    ReconfigurationBudget { pool: String, gpus: Vec<String> },
    /// Every GPU with room is shared with another trust domain.
    TrustDomain { pool: String, trust_domain: String },
    /// No node has the CPU or memory a replica needs next to free GPUs.
    NodeResources { pool: String, resource: Resource },
    /// The pools that could hold the shape are below the class's isolation minimum.
    Isolation {
        class: String,
        minimum: Sharing,
        pools: Vec<String>,
    },
    /// No pool the workload may use can hold its shape.
    NoPool { attempts: Vec<PoolAttempt> },
    /// Every usable pool refused it; one attempt per pool.
    Pools { attempts: Vec<PoolAttempt> },
    /// Preemption would have made room, but the candidates are protected.
    PreemptionNotAllowed {
        pool: String,
        capacity: Box<Reason>,
        /// The first candidates, in the order they were considered (at most
        /// [`PROTECTED_LISTED`]): on a large fleet every waiting workload would otherwise carry
        /// thousands of entries. Shared: every borrower a refusal holds for carries the same
        /// list.
        protected: Arc<[Protected]>,
        /// How many candidates were protected in all.
        protected_total: usize,
    },
    /// The workload's tenant, class or pool left the policy.
    Orphaned { cause: String },
    /// A gang blocked for capacity that holds capacity as it frees up (see `reserve.rs`).
    Reserving {
        pool: String,
        /// GPUs of the reservation free or held by backfill that yields.
        held: u32,
        needed: u32,
        /// The NVLink domains of the reservation's nodes, sorted.
        domains: Vec<String>,
        /// Its nodes, sorted.
        nodes: Vec<String>,
        /// When the work in the way is declared to end (RFC 3339); `None` when some of it
        /// declares no `maxDuration`.
        eta: Option<Timestamp>,
    },
    /// The room it would fit in is held for a waiting gang, and it is neither preemptible nor
    /// declared to end before that gang can start.
    ReservedFor {
        pool: String,
        gang: String,
        capacity: Box<Reason>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolAttempt {
    pub pool: String,
    pub reason: String,
}

impl Reason {
    /// `self == other`, with a protected list's total compared before the list: after one
    /// preemption a session compares thousands of waiting reasons whose lists agree entry by
    /// entry while their totals differ.
    pub(crate) fn same(&self, other: &Reason) -> bool {
        match (self, other) {
            (
                Reason::PreemptionNotAllowed {
                    protected: a,
                    protected_total: total_a,
                    ..
                },
                Reason::PreemptionNotAllowed {
                    protected: b,
                    protected_total: total_b,
                    ..
                },
            ) if total_a != total_b || a.len() != b.len() => false,
            _ => self == other,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::QuotaExceeded {
                tenant,
                pool,
                resource,
                usage,
                request,
                limit,
            } => write!(
                f,
                "quota exhausted at tenant `{tenant}` for pool `{pool}`: {resource} usage {usage} + request {request} > limit {limit}"
            ),
            Reason::PoolFull {
                pool,
                resource,
                usage,
                request,
                capacity,
                ..
            } if usage == capacity => write!(
                f,
                "pool `{pool}` is full: {resource} in use {usage} of {capacity}, request {request}"
            ),
            Reason::PoolFull {
                pool,
                resource,
                usage,
                request,
                capacity,
                ..
            } => write!(
                f,
                "pool `{pool}` lacks room: {resource} in use {usage} of {capacity}, request {request}"
            ),
            Reason::BorrowReserved {
                pool,
                borrow,
                free,
                reserved,
            } => write!(
                f,
                "borrowing {borrow} GPUs in pool `{pool}` would use capacity reserved by other tenants' idle guarantees: {free} free, {reserved} reserved"
            ),
            Reason::NoNvlinkDomain {
                pool,
                needed_gpus,
                best_free,
            } => write!(
                f,
                "no NVLink domain in pool `{pool}` with {needed_gpus} free GPUs for the gang (best has {best_free})"
            ),
            Reason::NoCapacity {
                pool,
                needed,
                fit,
                free,
            } => write!(
                f,
                "pool `{pool}` has room for {fit} of the {needed} replicas the gang needs ({free} GPUs free)"
            ),
            Reason::NoMigInstance { pool, profile } => write!(
                f,
                "no GPU in pool `{pool}` with a free or creatable `{profile}` instance"
            ),
            Reason::ReconfigurationBudget { pool, gpus } => write!(
                f,
                "reconfiguration budget spent on GPU {} of pool `{pool}`",
                gpus.join(", ")
            ),
            Reason::TrustDomain { pool, trust_domain } => write!(
                f,
                "every GPU of pool `{pool}` with room is shared with a trust domain other than `{trust_domain}`"
            ),
            Reason::NodeResources { pool, resource } => write!(
                f,
                "no node of pool `{pool}` has the {resource} a replica needs next to free GPUs"
            ),
            Reason::Isolation {
                class,
                minimum,
                pools,
            } => write!(
                f,
                "isolation: only pools below class `{class}`'s minimum `{}` could hold it ({})",
                minimum.as_str(),
                pools.join(", ")
            ),
            Reason::NoPool { attempts } => {
                f.write_str("no pool it may use can hold its shape")?;
                if !attempts.is_empty() {
                    f.write_str(": ")?;
                    write_attempts(f, attempts)?;
                }
                Ok(())
            }
            Reason::Pools { attempts } => {
                f.write_str("no pool can take it now: ")?;
                write_attempts(f, attempts)
            }
            Reason::PreemptionNotAllowed {
                pool: _,
                capacity,
                protected,
                protected_total,
            } => {
                write!(f, "{capacity}; preemption not allowed: ")?;
                // The typed list keeps every candidate; a sentence names a few, so that a
                // reason stays readable on a fleet with thousands of running workloads.
                const SHOWN: usize = 5;
                for (i, p) in protected.iter().take(SHOWN).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{p}")?;
                }
                let total = (*protected_total).max(protected.len());
                if total > SHOWN.min(protected.len()) {
                    write!(
                        f,
                        ", and {} more protected",
                        total - SHOWN.min(protected.len())
                    )?;
                }
                Ok(())
            }
            Reason::Orphaned { cause } => write!(f, "orphaned: {cause}"),
            Reason::Reserving {
                pool,
                held,
                needed,
                domains,
                nodes,
                eta,
            } => {
                write!(f, "reserving {held}/{needed} GPUs in pool `{pool}` on ")?;
                // A sentence names a few; the typed fields and the decision's reservations keep
                // every node.
                const SHOWN: usize = 4;
                let (what, list) = if domains.len() < nodes.len() {
                    ("domain", domains)
                } else {
                    ("node", nodes)
                };
                let plural = if list.len() == 1 { "" } else { "s" };
                write!(f, "{what}{plural} ")?;
                f.write_str(
                    &list
                        .iter()
                        .take(SHOWN)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", "),
                )?;
                if list.len() > SHOWN {
                    write!(f, " and {} more", list.len() - SHOWN)?;
                }
                match eta {
                    Some(eta) => write!(f, " (eta {eta})"),
                    None => f.write_str(" (eta unknown: work in the way declares no maxDuration)"),
                }
            }
            Reason::ReservedFor {
                pool: _,
                gang,
                capacity,
            } => write!(
                f,
                "{capacity}; the rest is reserved for gang `{gang}` (only preemptible work or work whose maxDuration ends before the gang can start may use it)"
            ),
        }
    }
}

fn write_attempts(f: &mut fmt::Formatter<'_>, attempts: &[PoolAttempt]) -> fmt::Result {
    for (i, a) in attempts.iter().enumerate() {
        if i > 0 {
            f.write_str("; ")?;
        }
        write!(f, "{}: {}", a.pool, a.reason)?;
    }
    Ok(())
}

/// Why a running workload is stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum PreemptReason {
    /// Its GPUs were borrowed; their owner's work within guarantee reclaims them.
    Reclaim { for_workload: String, owner: String },
    /// A workload of a higher priority needs the room.
    Priority { for_workload: String, priority: i64 },
    /// Its tenant's limit no longer allows it (the policy changed).
    OverLimit { tenant: String, pool: String },
    /// Its tenant, class or pool left the policy.
    Orphaned { cause: String },
    /// It ran as backfill on capacity reserved for a gang, which can now start.
    Reservation { for_workload: String },
    /// Its side of the tenant tree (`from`) borrows more of the pool, per unit of weight, than
    /// `to`, the side of a waiting borrower of the same priority: it yields, and `from` still
    /// holds at least what `to` holds afterwards (`preemption.borrowers: FairShare`).
    FairShare {
        for_workload: String,
        from: String,
        to: String,
    },
}

impl fmt::Display for PreemptReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PreemptReason::Reclaim {
                for_workload,
                owner,
            } => write!(
                f,
                "its borrowed capacity is reclaimed for `{for_workload}`, within tenant `{owner}`'s guarantee"
            ),
            PreemptReason::Priority {
                for_workload,
                priority,
            } => write!(
                f,
                "preempted for `{for_workload}` of higher priority {priority}"
            ),
            PreemptReason::OverLimit { tenant, pool } => write!(
                f,
                "tenant `{tenant}`'s limit in pool `{pool}` no longer allows it"
            ),
            PreemptReason::Orphaned { cause } => write!(f, "orphaned: {cause}"),
            PreemptReason::Reservation { for_workload } => write!(
                f,
                "backfill on capacity reserved for gang `{for_workload}`, which starts now"
            ),
            PreemptReason::FairShare {
                for_workload,
                from,
                to,
            } => write!(
                f,
                "fair share: `{from}` borrows more of this pool per unit of weight than `{to}`, whose `{for_workload}` takes the room"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written `Serialize` writes what `#[serde(tag = "outcome")]` did, plus each
    /// reason's sentence; reading it back ignores the sentence and keeps the reason.
    #[test]
    fn an_outcome_is_written_with_its_sentence_and_read_back_without_it() {
        let preempt = Outcome::Preempt {
            grace_seconds: 300,
            lost_gpu_seconds: 7200.5,
            reason: PreemptReason::Priority {
                for_workload: "a/train".into(),
                priority: 100,
            },
        };
        let pending = Outcome::Pending {
            reason: Reason::Orphaned {
                cause: "tenant `b` was removed from the policy".into(),
            },
        };
        let keep = Outcome::Keep {
            bindings: vec![ReplicaBinding {
                node: "n1".into(),
                gpus: vec![0, 1],
                mig_profile: None,
                mig_start: None,
                share: None,
            }],
        };
        let admit = Outcome::Admit {
            bindings: Vec::new(),
            guaranteed: Gpus::whole(1),
            borrowed: Gpus::ZERO,
        };
        let text = |o: &Outcome| serde_json::to_string(o).unwrap();
        assert_eq!(
            text(&preempt),
            format!(
                r#"{{"outcome":"preempt","grace_seconds":300,"lost_gpu_seconds":7200.5,"reason":{{"kind":"priority","for_workload":"a/train","priority":100}},"message":{:?}}}"#,
                preempt.message().unwrap()
            )
        );
        assert_eq!(
            text(&pending),
            format!(
                r#"{{"outcome":"pending","reason":{{"kind":"orphaned","cause":"tenant `b` was removed from the policy"}},"message":{:?}}}"#,
                pending.message().unwrap()
            )
        );
        assert!(text(&keep).starts_with(r#"{"outcome":"keep","bindings":[{"node":"n1""#));
        assert!(text(&admit).starts_with(r#"{"outcome":"admit","bindings":[],"guaranteed":"#));
        for o in [&preempt, &pending, &keep, &admit] {
            let back: Outcome = serde_json::from_str(&text(o)).unwrap();
            assert_eq!(&back, o);
        }
        assert_eq!(keep.message(), None);
        assert_eq!(
            pending.message().unwrap(),
            match &pending {
                Outcome::Pending { reason } => reason.to_string(),
                _ => unreachable!(),
            }
        );
    }
}
