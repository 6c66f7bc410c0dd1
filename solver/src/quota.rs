//! Hierarchical quota accounting: usage per tenant per pool, where a tenant's usage includes its
//! descendants'.
//!
//! - **Limit** (invariant 3): a workload's amount must keep usage ≤ limit at its tenant and at
//!   every ancestor, for GPUs and, where the limit sets them, CPU and memory.
//! - **Guaranteed / borrowed**: the part of a tenant's usage up to its guarantee is guaranteed,
//!   the rest is borrowed.
//! - **Reservations**: a tenant's idle guarantee (`guarantee − usage`) beyond its lending limit is
//!   reserved for it; borrowing may only use free capacity that no other tenant reserves. "Other
//!   tenants" are the siblings of the borrower and of each of its ancestors: disjoint subtrees
//!   that together cover everything outside the borrower's lineage.
//! - **Fair share**: borrowers compete by `(s + h) / w`: `s` the borrowed dominant share now (of
//!   the pool), `h` the decayed dominant borrowed share of the past (of the fleet,
//!   [`crate::fairshare::history_share`], 0 without a `fairShare` setting), `w` the weight. The
//!   lowest key gets freed capacity first. When two tenants both want everything, capacity flows
//!   to the lower key until the keys meet, so `(s_a + h_a) / w_a ≈ (s_b + h_b) / w_b`; `h` is a
//!   decayed average of `s`, so in a steady state `h = s` and the shares settle at the weights'
//!   ratio. After a burst, `h` is high and decays with the half-life: the tenant yields idle
//!   capacity to the others until its past fades, as Slurm's `PriorityDecayHalfLife` and Kueue's
//!   `usageHalfLifeTime` do. Adding (rather than, say, multiplying) keeps a tenant with no
//!   history ordered by its current share alone, as before. Only borrowing is ordered this way:
//!   admissions within a guarantee come first whatever the history (the queue key puts them
//!   ahead), and the history counts borrowed usage only.

use std::rc::Rc;

use tessera_compiler::compiled::{Amounts, PoolQuota};
use tessera_compiler::units::{Bytes, Gpus, Millicores};

use crate::cow::CowVec;
use crate::decision::{Reason, Resource};
use crate::problem::Problem;
use crate::undo::{LedgerJournalSlot, Mark};

/// Usage per tenant and pool. Cloned for every what-if of the preemption search, which
/// changes a few tenants' usage: a clone copies a pointer per chunk of tenants (see `cow.rs`)
/// and shares what never changes.
#[derive(Debug, Clone)]
pub struct Ledger {
    /// `usage[tenant × pools + pool]`, descendants included.
    usage: CowVec<Amounts>,
    pools: usize,
    /// Direct children of each tenant.
    children: Rc<Vec<Vec<usize>>>,
    /// Per pool: GPUs, CPU and memory of its nodes in the snapshot.
    capacity: Rc<Vec<Amounts>>,
    roots: Rc<Vec<usize>>,
    /// Levels of the deepest tenant (a root is at level 1).
    depth: usize,
    /// The values replaced while a what-if's mark is open (see `undo.rs`).
    journal: LedgerJournalSlot,
}

fn add(a: Amounts, b: Amounts) -> Amounts {
    Amounts {
        gpus: a.gpus + b.gpus,
        cpu: Some(Millicores(
            a.cpu.unwrap_or_default().0 + b.cpu.unwrap_or_default().0,
        )),
        memory: Some(Bytes(
            a.memory.unwrap_or_default().0 + b.memory.unwrap_or_default().0,
        )),
    }
}

fn sub(a: Amounts, b: Amounts) -> Amounts {
    Amounts {
        gpus: a.gpus - b.gpus,
        cpu: Some(Millicores(
            a.cpu
                .unwrap_or_default()
                .0
                .saturating_sub(b.cpu.unwrap_or_default().0),
        )),
        memory: Some(Bytes(
            a.memory
                .unwrap_or_default()
                .0
                .saturating_sub(b.memory.unwrap_or_default().0),
        )),
    }
}

impl Ledger {
    pub fn new(problem: &Problem) -> Ledger {
        let mut children = vec![Vec::new(); problem.tenants.len()];
        let mut roots = Vec::new();
        for (i, t) in problem.tenants.iter().enumerate() {
            match t.parent {
                Some(p) => children[p].push(i),
                None => roots.push(i),
            }
        }
        let capacity: Vec<Amounts> = problem
            .pools
            .iter()
            .map(|p| {
                let mut a = Amounts::default();
                for &n in &p.nodes {
                    let node = &problem.nodes[n];
                    a = add(
                        a,
                        Amounts {
                            gpus: Gpus::whole(node.gpus.len() as i64),
                            cpu: Some(node.cpu),
                            memory: Some(node.memory),
                        },
                    );
                }
                a
            })
            .collect();
        Ledger {
            usage: vec![Amounts::default(); problem.tenants.len() * problem.pools.len()].into(),
            pools: problem.pools.len(),
            children: Rc::new(children),
            capacity: Rc::new(capacity),
            roots: Rc::new(roots),
            depth: problem
                .tenants
                .iter()
                .map(|t| t.lineage.len())
                .max()
                .unwrap_or(0),
            journal: LedgerJournalSlot::default(),
        }
    }

    /// Opens a mark: the changes from here on can be undone by [`Ledger::rollback`].
    pub(crate) fn mark(&mut self) -> Mark {
        self.journal.mark()
    }

    /// Undoes every change since `mark` opened, and closes it and the marks opened after it.
    pub(crate) fn rollback(&mut self, mark: Mark) {
        for (i, old) in self.journal.rollback(mark) {
            self.usage[i] = old;
        }
    }

    /// Whether a mark is open.
    #[cfg(debug_assertions)]
    pub(crate) fn journaling(&self) -> bool {
        self.journal.is_open()
    }

    /// Whether both ledgers hold the same usage everywhere.
    #[cfg(debug_assertions)]
    pub(crate) fn same_usage(&self, other: &Ledger) -> bool {
        self.usage.len() == other.usage.len()
            && (0..self.usage.len()).all(|i| self.usage[i] == other.usage[i])
    }

    /// Usage of `tenant` (with descendants) in `pool`.
    pub fn usage(&self, tenant: usize, pool: usize) -> Amounts {
        debug_assert!(pool < self.pools, "pool {pool} of {}", self.pools);
        self.usage[tenant * self.pools + pool]
    }

    /// GPUs, CPU and memory of the pool's nodes.
    pub fn capacity(&self, pool: usize) -> Amounts {
        self.capacity[pool]
    }

    /// Usage of the whole pool.
    pub fn pool_usage(&self, pool: usize) -> Gpus {
        self.roots.iter().map(|&r| self.usage(r, pool).gpus).sum()
    }

    pub fn add(&mut self, problem: &Problem, tenant: usize, pool: usize, amount: Amounts) {
        for &t in &problem.tenants[tenant].lineage {
            let i = t * self.pools + pool;
            self.journal.save(i, self.usage[i]);
            let e = &mut self.usage[i];
            *e = add(*e, amount);
        }
    }

    pub fn remove(&mut self, problem: &Problem, tenant: usize, pool: usize, amount: Amounts) {
        for &t in &problem.tenants[tenant].lineage {
            let i = t * self.pools + pool;
            self.journal.save(i, self.usage[i]);
            let e = &mut self.usage[i];
            *e = sub(*e, amount);
        }
    }

    /// Whether `amount` more keeps usage ≤ limit at the tenant and every ancestor.
    /// [`Ledger::check_limit`] says why not; a search that only asks whether (how many
    /// replicas fit, whether a set of victims makes room) asks this, which writes nothing.
    pub fn within_limits(
        &self,
        problem: &Problem,
        tenant: usize,
        pool: usize,
        amount: Amounts,
    ) -> bool {
        self.refusal(problem, tenant, pool, amount).is_none()
    }

    /// Whether `amount` more keeps usage ≤ limit at the tenant and every ancestor; the first
    /// level (from the tenant up) that refuses, otherwise.
    pub fn check_limit(
        &self,
        problem: &Problem,
        tenant: usize,
        pool: usize,
        amount: Amounts,
    ) -> Result<(), Reason> {
        match self.refusal(problem, tenant, pool, amount) {
            None => Ok(()),
            Some((t, resource)) => Err(self.refusal_reason(problem, t, pool, amount, resource)),
        }
    }

    /// The limits' rule: the first level from `tenant` up whose limit in `pool` `amount` more
    /// would pass, and on which resource (a level without quota in the pool refuses GPUs).
    /// [`Ledger::check_limit`] words it; [`Ledger::within_limits`] answers yes or no.
    pub(crate) fn refusal(
        &self,
        problem: &Problem,
        tenant: usize,
        pool: usize,
        amount: Amounts,
    ) -> Option<(usize, Resource)> {
        problem.tenants[tenant].lineage.iter().find_map(|&t| {
            let used = self.usage(t, pool);
            let Some(q) = problem.tenants[t].quota.get(&pool) else {
                return Some((t, Resource::Gpus));
            };
            let over = |used: Option<u64>, amount: Option<u64>, limit: Option<u64>| {
                limit.is_some_and(|l| used.unwrap_or(0) + amount.unwrap_or(0) > l)
            };
            if used.gpus + amount.gpus > q.limit.gpus {
                Some((t, Resource::Gpus))
            } else if over(
                used.cpu.map(|c| c.0),
                amount.cpu.map(|c| c.0),
                q.limit.cpu.map(|c| c.0),
            ) {
                Some((t, Resource::Cpu))
            } else if over(
                used.memory.map(|m| m.0),
                amount.memory.map(|m| m.0),
                q.limit.memory.map(|m| m.0),
            ) {
                Some((t, Resource::Memory))
            } else {
                None
            }
        })
    }

    /// Why level `t`'s limit on `resource` refuses `amount` more in `pool`, in the words of
    /// the decision: a quota, or, at a root whose limit is at least the pool's capacity, the
    /// pool being full (a root's usage is the pool's, so that limit refuses only what the pool
    /// cannot hold). A lower tenant's limit stays a quota, whatever its size.
    fn refusal_reason(
        &self,
        problem: &Problem,
        t: usize,
        pool: usize,
        amount: Amounts,
        resource: Resource,
    ) -> Reason {
        let info = &problem.tenants[t];
        let pool_name = &problem.pools[pool].name;
        let capacity = self.capacity[pool];
        let used = self.usage(t, pool);
        let (usage, request, limit, full) = match (info.quota.get(&pool), resource) {
            (None, _) => (
                used.gpus.to_string(),
                amount.gpus.to_string(),
                "0".to_owned(),
                false,
            ),
            (Some(q), Resource::Gpus) => (
                used.gpus.to_string(),
                amount.gpus.to_string(),
                q.limit.gpus.to_string(),
                q.limit.gpus >= capacity.gpus,
            ),
            (Some(q), Resource::Cpu) => {
                let l = q.limit.cpu.unwrap_or_default();
                (
                    used.cpu.unwrap_or_default().to_string(),
                    amount.cpu.unwrap_or_default().to_string(),
                    l.to_string(),
                    capacity.cpu.is_some_and(|c| l.0 >= c.0),
                )
            }
            (Some(q), Resource::Memory) => {
                let l = q.limit.memory.unwrap_or_default();
                (
                    used.memory.unwrap_or_default().to_string(),
                    amount.memory.unwrap_or_default().to_string(),
                    l.to_string(),
                    capacity.memory.is_some_and(|c| l.0 >= c.0),
                )
            }
        };
        if !(full && info.parent.is_none()) {
            return Reason::QuotaExceeded {
                tenant: info.name.clone(),
                pool: pool_name.clone(),
                resource,
                usage,
                request,
                limit,
            };
        }
        let in_pool = self
            .roots
            .iter()
            .fold(Amounts::default(), |a, &r| add(a, self.usage(r, pool)));
        let (usage, capacity) = match resource {
            Resource::Gpus => (in_pool.gpus.to_string(), capacity.gpus.to_string()),
            Resource::Cpu => (
                in_pool.cpu.unwrap_or_default().to_string(),
                capacity.cpu.unwrap_or_default().to_string(),
            ),
            Resource::Memory => (
                in_pool.memory.unwrap_or_default().to_string(),
                capacity.memory.unwrap_or_default().to_string(),
            ),
        };
        Reason::PoolFull {
            tenant: info.name.clone(),
            pool: pool_name.clone(),
            resource,
            usage,
            request,
            capacity,
        }
    }

    /// The tenant's guarantee in the pool (GPUs).
    pub fn guarantee(problem: &Problem, tenant: usize, pool: usize) -> Gpus {
        problem.tenants[tenant]
            .quota
            .get(&pool)
            .map_or(Gpus::ZERO, |q| q.guarantee.gpus)
    }

    /// How `gpus` more for `tenant` split into (guaranteed, borrowed) at the tenant's own level.
    pub fn split(&self, problem: &Problem, tenant: usize, pool: usize, gpus: Gpus) -> (Gpus, Gpus) {
        Self::split_with(problem, tenant, pool, gpus, self.usage(tenant, pool).gpus)
    }

    /// [`Ledger::split`] were the tenant's GPUs in use in the pool `used`.
    pub fn split_with(
        problem: &Problem,
        tenant: usize,
        pool: usize,
        gpus: Gpus,
        used: Gpus,
    ) -> (Gpus, Gpus) {
        let room = Self::guarantee(problem, tenant, pool).saturating_sub(used);
        let guaranteed = room.min(gpus);
        (guaranteed, gpus - guaranteed)
    }

    /// Idle guarantee beyond the lending limit of tenant `t` in the pool.
    fn reserved(&self, problem: &Problem, t: usize, pool: usize) -> Gpus {
        let Some(q) = problem.tenants[t].quota.get(&pool) else {
            return Gpus::ZERO;
        };
        let idle = q.guarantee.gpus.saturating_sub(self.usage(t, pool).gpus);
        idle.saturating_sub(q.lending_limit.gpus)
    }

    /// Capacity reserved in the pool by tenants outside `tenant`'s lineage.
    pub fn reserved_by_others(&self, problem: &Problem, tenant: usize, pool: usize) -> Gpus {
        let lineage = &problem.tenants[tenant].lineage;
        let mut total = Gpus::ZERO;
        for &a in &lineage[1..] {
            for &c in &self.children[a] {
                if !lineage.contains(&c) {
                    total += self.reserved(problem, c, pool);
                }
            }
        }
        for &r in self.roots.iter() {
            if !lineage.contains(&r) {
                total += self.reserved(problem, r, pool);
            }
        }
        total
    }

    /// Whether borrowing for a request of `gpus` (of which `borrowed` above guarantee) respects
    /// other tenants' reservations.
    pub fn check_borrow(
        &self,
        problem: &Problem,
        tenant: usize,
        pool: usize,
        gpus: Gpus,
        borrowed: Gpus,
    ) -> Result<(), Reason> {
        if borrowed == Gpus::ZERO {
            return Ok(());
        }
        let free = self.capacity[pool]
            .gpus
            .saturating_sub(self.pool_usage(pool));
        let reserved = self.reserved_by_others(problem, tenant, pool);
        if gpus + reserved > free {
            return Err(Reason::BorrowReserved {
                pool: problem.pools[pool].name.clone(),
                borrow: borrowed,
                free,
                reserved,
            });
        }
        Ok(())
    }

    /// Borrowed dominant share of the tenant in the pool plus its history, divided by its
    /// weight (the queue reads it through [`Ledger::fair_share_path`]).
    #[cfg(test)]
    pub fn fair_share(&self, problem: &Problem, tenant: usize, pool: usize) -> f64 {
        self.fair_share_with(problem, tenant, pool, self.usage(tenant, pool))
    }

    /// The tenant's borrowed dominant share in the pool plus its history, divided by its
    /// weight, were its usage in the pool `used`.
    pub fn fair_share_with(
        &self,
        problem: &Problem,
        tenant: usize,
        pool: usize,
        used: Amounts,
    ) -> f64 {
        let info = &problem.tenants[tenant];
        let Some(q) = info.quota.get(&pool) else {
            return 0.0;
        };
        (dominant_borrowed(q, used, self.capacity[pool]) + info.history) / info.weight
    }

    /// The fair share of each tenant from the root of the tenant's tree down to the tenant, in
    /// billionths, then the tenant's own again down to the depth of the deepest tenant.
    /// Borrowers compared by it are compared first by the shares of the two children of their
    /// lowest common ancestor, so that siblings split by weight at every level (Slurm's fair
    /// tree, Kueue's hierarchical cohorts), and a tenant's own work and its descendant's by
    /// their own shares. `used(t)` is the usage of `t` in the pool.
    pub fn fair_share_path(
        &self,
        problem: &Problem,
        tenant: usize,
        pool: usize,
        used: impl Fn(usize) -> Amounts,
    ) -> Vec<u64> {
        self.share_path(problem, tenant, |t| {
            billionths(self.fair_share_with(problem, t, pool, used(t)))
        })
    }

    /// [`Ledger::fair_share_path`] from each level's fair share in billionths (`share(t)`, as
    /// [`Ledger::fair_share_billionths`] gives it): the queue keeps the levels' shares and
    /// builds a path again only when one of them moved.
    pub fn share_path(
        &self,
        problem: &Problem,
        tenant: usize,
        share: impl FnMut(usize) -> u64,
    ) -> Vec<u64> {
        let mut path: Vec<u64> = problem.tenants[tenant]
            .lineage
            .iter()
            .rev()
            .copied()
            .map(share)
            .collect();
        let own = path.last().copied().unwrap_or(0);
        path.resize(self.depth.max(path.len()), own);
        path
    }

    /// The fair share of `tenant` in the pool at its usage now, in billionths: one level of
    /// [`Ledger::fair_share_path`].
    pub fn fair_share_billionths(&self, problem: &Problem, tenant: usize, pool: usize) -> u64 {
        billionths(self.fair_share_with(problem, tenant, pool, self.usage(tenant, pool)))
    }

    /// What fair-share preemption compares: the tenant's borrowed dominant share of the pool
    /// now (descendants included), divided by its weight, were `add` more and `remove` less in
    /// use. No history: a preemption must not be undone by time passing, only by new work.
    /// `None` where the tenant has no quota in the pool.
    pub fn borrowed_share(
        &self,
        problem: &Problem,
        tenant: usize,
        pool: usize,
        add: Amounts,
        remove: Amounts,
    ) -> Option<f64> {
        let info = &problem.tenants[tenant];
        let q = info.quota.get(&pool)?;
        let used = sub(self::add(self.usage(tenant, pool), add), remove);
        Some(dominant_borrowed(q, used, self.capacity[pool]) / info.weight)
    }
}

/// A fair share in billionths, as share paths hold it (so that an even split is an exact tie).
fn billionths(share: f64) -> u64 {
    (share * 1e9).round() as u64
}

/// The two sides on which tenants `a` and `b` meet in the tree: the children of their lowest
/// common ancestor on `a`'s path and on `b`'s (the roots, for tenants of different trees).
/// `None` when one is the other or its ancestor: they are not competitors.
pub fn sides(problem: &Problem, a: usize, b: usize) -> Option<(usize, usize)> {
    let la = &problem.tenants[a].lineage;
    let lb = &problem.tenants[b].lineage;
    if la.contains(&b) || lb.contains(&a) {
        return None;
    }
    // Walk down from the roots while the paths agree.
    let (mut i, mut j) = (la.len(), lb.len());
    while i > 0 && j > 0 && la[i - 1] == lb[j - 1] {
        i -= 1;
        j -= 1;
    }
    Some((la[i - 1], lb[j - 1]))
}

/// The borrowed dominant share of `used` under quota `q` in a pool of capacity `cap`: GPUs, and
/// CPU and memory where the guarantee sets them.
fn dominant_borrowed(q: &PoolQuota, used: Amounts, cap: Amounts) -> f64 {
    let ratio = |num: u64, den: u64| {
        if den == 0 {
            0.0
        } else {
            num as f64 / den as f64
        }
    };
    let mut share = ratio(
        used.gpus.saturating_sub(q.guarantee.gpus).units().max(0) as u64,
        cap.gpus.units().max(0) as u64,
    );
    if let Some(g) = q.guarantee.cpu {
        let b = used.cpu.unwrap_or_default().0.saturating_sub(g.0);
        share = share.max(ratio(b, cap.cpu.unwrap_or_default().0));
    }
    if let Some(g) = q.guarantee.memory {
        let b = used.memory.unwrap_or_default().0.saturating_sub(g.0);
        share = share.max(ratio(b, cap.memory.unwrap_or_default().0));
    }
    share
}

#[cfg(test)]
mod tests {
    use tessera_compiler::{SourceFile, compile};

    use super::*;

    const POLICY: &str = r#"
apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {name: tiers}
spec: {tiers: [{name: low, value: 1}]}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: batch}
spec: {tier: low, preemptible: true}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: p}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {nodes: 1, gpusPerNode: 8, cpuPerNode: 64, memoryPerNode: 1Ti}
  sharing: exclusive
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: org}
spec: {guarantee: {p: 8}, limit: {p: {gpus: 8, cpu: 32}}, sloClasses: [batch]}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: team}
spec: {parent: org, guarantee: {p: 4}, limit: {p: 8}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: leaf}
spec: {parent: team, guarantee: {p: 2}, limit: {p: 6}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: other}
spec: {parent: org, guarantee: {p: 4}, limit: {p: {gpus: 8, memory: 1Ti}}, lendingLimit: {p: 1}}
---
apiVersion: tessera/v1alpha1
kind: ClusterState
metadata: {name: s}
spec:
  observedAt: "2026-11-20T08:00:00Z"
  nodes:
    - name: n0
      pool: p
      cpu: 64
      memory: 1Ti
      gpus:
        - {index: 0, uuid: GPU-00000000-0000-0000-0000-000000000000, model: H100-SXM5-80GB}
        - {index: 1, uuid: GPU-00000001-0000-0000-0000-000000000000, model: H100-SXM5-80GB}
        - {index: 2, uuid: GPU-00000002-0000-0000-0000-000000000000, model: H100-SXM5-80GB}
        - {index: 3, uuid: GPU-00000003-0000-0000-0000-000000000000, model: H100-SXM5-80GB}
        - {index: 4, uuid: GPU-00000004-0000-0000-0000-000000000000, model: H100-SXM5-80GB}
        - {index: 5, uuid: GPU-00000005-0000-0000-0000-000000000000, model: H100-SXM5-80GB}
        - {index: 6, uuid: GPU-00000006-0000-0000-0000-000000000000, model: H100-SXM5-80GB}
        - {index: 7, uuid: GPU-00000007-0000-0000-0000-000000000000, model: H100-SXM5-80GB}
"#;

    fn problem() -> Problem {
        let c = compile(&[SourceFile::new("p.yaml", POLICY)]);
        assert_eq!(c.errors(), 0, "{:#?}", c.diagnostics);
        Problem::new(c.policy.as_ref().unwrap(), &c.states[0].1, None).unwrap()
    }

    fn gpus(n: i64) -> Amounts {
        Amounts {
            gpus: Gpus::whole(n),
            cpu: Some(Millicores(n as u64 * 5000)),
            memory: None,
        }
    }

    fn tenant(p: &Problem, name: &str) -> usize {
        p.tenants.iter().position(|t| t.name == name).unwrap()
    }

    #[test]
    fn usage_counts_descendants_and_limits_hold_at_every_level() {
        let p = problem();
        let mut l = Ledger::new(&p);
        let (leaf, team, org) = (tenant(&p, "leaf"), tenant(&p, "team"), tenant(&p, "org"));
        l.add(&p, leaf, 0, gpus(5));
        assert_eq!(l.usage(team, 0).gpus, Gpus::whole(5));
        assert_eq!(l.usage(org, 0).gpus, Gpus::whole(5));
        // leaf's own limit (6) refuses 2 more.
        let err = l.check_limit(&p, leaf, 0, gpus(2)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("quota exhausted at tenant `leaf`"),
            "{err}"
        );
        // team may take 3 more GPUs, but the CPU limit it inherits from org (32 cores) refuses
        // 15 cores more.
        let err = l.check_limit(&p, team, 0, gpus(3)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "quota exhausted at tenant `team` for pool `p`: CPU usage 25 + request 15 > limit 32"
        );
        assert!(l.check_limit(&p, team, 0, gpus(1)).is_ok());
        l.remove(&p, leaf, 0, gpus(5));
        assert_eq!(l.usage(org, 0).gpus, Gpus::ZERO);
    }

    #[test]
    fn a_limit_of_the_pools_capacity_refuses_as_a_full_pool() {
        let p = problem();
        let mut l = Ledger::new(&p);
        let (leaf, other) = (tenant(&p, "leaf"), tenant(&p, "other"));
        let whole = |n| Amounts {
            gpus: Gpus::whole(n),
            cpu: None,
            memory: None,
        };
        l.add(&p, leaf, 0, whole(4));
        l.add(&p, other, 0, whole(4));
        // The root org's limit (8) is the pool's 8 GPUs: the pool is full, not org's quota.
        let org = tenant(&p, "org");
        let err = l.check_limit(&p, org, 0, whole(1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pool `p` is full: GPUs in use 8 of 8, request 1"
        );
        l.remove(&p, other, 0, whole(4));
        let err = l.check_limit(&p, org, 0, whole(5)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pool `p` lacks room: GPUs in use 4 of 8, request 5"
        );
        // team's limit is the pool's size too, but below the root a limit is a quota.
        let team = tenant(&p, "team");
        let err = l.check_limit(&p, team, 0, whole(5)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("quota exhausted at tenant `team`"),
            "{err}"
        );
        // leaf's own limit (6) is below the pool's size: that is quota.
        let err = l.check_limit(&p, leaf, 0, whole(3)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("quota exhausted at tenant `leaf`"),
            "{err}"
        );
    }

    #[test]
    fn within_limits_answers_as_check_limit_does() {
        let p = problem();
        let mut l = Ledger::new(&p);
        let mut refused = 0;
        for (used_by, used) in [(None, 0), (Some("leaf"), 5), (Some("other"), 4)] {
            if let Some(name) = used_by {
                l.add(&p, tenant(&p, name), 0, gpus(used));
            }
            for t in 0..p.tenants.len() {
                for n in 0..10 {
                    for cpu in [None, Some(Millicores(n as u64 * 9000))] {
                        for memory in [None, Some(Bytes((n as u64) << 38))] {
                            let amount = Amounts {
                                gpus: Gpus::whole(n),
                                cpu,
                                memory,
                            };
                            // The rule written out: every level's limit, each resource.
                            let fits = p.tenants[t].lineage.iter().all(|&a| {
                                let used = l.usage(a, 0);
                                let Some(q) = p.tenants[a].quota.get(&0) else {
                                    return false;
                                };
                                let within = |u: Option<u64>, r: Option<u64>, l: Option<u64>| {
                                    l.is_none_or(|l| u.unwrap_or(0) + r.unwrap_or(0) <= l)
                                };
                                used.gpus + amount.gpus <= q.limit.gpus
                                    && within(
                                        used.cpu.map(|c| c.0),
                                        cpu.map(|c| c.0),
                                        q.limit.cpu.map(|c| c.0),
                                    )
                                    && within(
                                        used.memory.map(|m| m.0),
                                        memory.map(|m| m.0),
                                        q.limit.memory.map(|m| m.0),
                                    )
                            });
                            let checked = l.check_limit(&p, t, 0, amount);
                            refused += usize::from(!fits);
                            let what = format!("{} asking {amount:?}", p.tenants[t].name);
                            assert_eq!(checked.is_ok(), fits, "{what}: {checked:?}");
                            assert_eq!(l.within_limits(&p, t, 0, amount), fits, "{what}");
                        }
                    }
                }
            }
        }
        assert!(refused > 100, "{refused} refused");
    }

    #[test]
    fn split_and_reservations() {
        let p = problem();
        let mut l = Ledger::new(&p);
        let (leaf, other) = (tenant(&p, "leaf"), tenant(&p, "other"));
        assert_eq!(
            l.split(&p, leaf, 0, Gpus::whole(3)),
            (Gpus::whole(2), Gpus::whole(1))
        );
        // `other` is guaranteed 4, idle, and lends 1: 3 are reserved against leaf's borrowing.
        assert_eq!(l.reserved_by_others(&p, leaf, 0), Gpus::whole(3));
        assert!(
            l.check_borrow(&p, leaf, 0, Gpus::whole(5), Gpus::whole(3))
                .is_ok()
        );
        let err = l
            .check_borrow(&p, leaf, 0, Gpus::whole(6), Gpus::whole(4))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "borrowing 4 GPUs in pool `p` would use capacity reserved by other tenants' idle guarantees: 8 free, 3 reserved"
        );
        // Once `other` runs 2, only 1 stays reserved.
        l.add(&p, other, 0, gpus(2));
        assert_eq!(l.reserved_by_others(&p, leaf, 0), Gpus::whole(1));
        // The fair share counts only what is borrowed, divided by the weight.
        l.add(&p, leaf, 0, gpus(4));
        assert!((l.fair_share(&p, leaf, 0) - 2.0 / 8.0).abs() < 1e-9);
    }
}
