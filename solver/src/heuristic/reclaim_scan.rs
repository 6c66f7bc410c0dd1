//! A pool's running candidates classified once for the requesters within their guarantee of
//! one priority and scope, and kept across their searches.
//!
//! A requester within its guarantee that no single victim makes room for (a project asking
//! for a whole node in a pool of small borrowed work) classifies every running workload of the
//! pool: at 50,000 GPUs twenty-odd such searches a cycle read twenty thousand candidates each,
//! to find about 1,400 eligible. What a candidate is to such a requester depends on the
//! requester only through its priority, its scope and one rule about its tenant: borrowed work
//! of its priority or higher is protected from its own tenant (reclaiming from oneself is no
//! reclaim) and eligible to every other. So the classification is kept for a requester of no
//! tenant, with each eligible candidate that rule would turn marked with its tenant, and each
//! requester reads the eligible list (a few percent of the pool) instead of the pool.
//!
//! Statuses, the one input that changes within a cycle, change only by a preemption: its
//! victims leave the kept eligible list (they are gone to every requester), and the kept
//! classification is dropped where a victim was counted among the protected (the list a
//! refusal shows could change) and wherever refusals are forgotten for another reason. Debug
//! builds classify the pool again at every use and assert the same result.

use super::preempt::{Requester, Scan};
use super::protected::{Blocked, Blocking};
use super::*;

/// What the classification depends on besides the statuses: (pool, scope, priority).
type Key = (usize, Option<usize>, i64);

/// The candidates of one pool as a requester within its guarantee of no tenant finds them.
#[derive(Debug, Clone)]
pub(super) struct ReclaimScan {
    key: Key,
    /// In key order, each with its tenant where it is borrowed work of the key's priority or
    /// higher: protected from a requester of that tenant, eligible to any other.
    eligible: Vec<(usize, Option<usize>)>,
    protected: Blocking,
    outside_scope: bool,
}

impl ReclaimScan {
    /// The scan as requester tenant `tenant` finds it.
    fn for_tenant(&self, p: &Problem, tenant: usize) -> Scan {
        let mut scan = Scan::new(Rc::clone(&self.protected.ranks));
        scan.eligible.reserve(self.eligible.len());
        let mut own = Vec::new();
        for &(v, owner) in &self.eligible {
            if owner == Some(tenant) {
                own.push(v);
            } else {
                scan.eligible.push(v);
            }
        }
        scan.protected = self.protected.with(
            p,
            own.iter().map(|&v| (v, Blocked::NotLowerPriority)),
            own.len(),
        );
        if !own.is_empty() {
            scan.own.insert(tenant);
        }
        scan.outside_scope = self.outside_scope;
        scan
    }

    /// The classification once `victims` of `pool` are preempted, or `None` where one of them
    /// was counted among the protected (the first listed could change).
    pub(super) fn without(mut self, p: &Problem, pool: usize, victims: &[usize]) -> Option<Self> {
        let (kept_pool, scope, _) = self.key;
        if kept_pool != pool {
            return Some(self);
        }
        // Each victim, and whether it was eligible here; a preemption's victims are few, and
        // the eligible list is about 1,400 long at 50,000 GPUs.
        let mut gone: Vec<(usize, bool)> = victims.iter().map(|&v| (v, false)).collect();
        gone.sort_unstable();
        self.eligible
            .retain(|&(v, _)| match gone.binary_search_by_key(&v, |g| g.0) {
                Ok(i) => {
                    gone[i].1 = true;
                    false
                }
                Err(_) => true,
            });
        // A victim not eligible here was outside the scope, and stays outside it (the scope
        // is read before the status), or it was protected.
        let outside = |v: usize| {
            scope.is_some_and(|x| !p.tenants[p.workloads[v].tenant].lineage.contains(&x))
        };
        gone.iter()
            .all(|&(v, eligible)| eligible || outside(v))
            .then_some(self)
    }
}

impl Solver<'_> {
    /// [`Solver::scan`] for requester `r` of `w`, within its guarantee and competing by no
    /// fair share, read from the classification kept for its (pool, scope, priority).
    pub(super) fn reclaim_scan(
        &mut self,
        w: usize,
        pool: usize,
        scope: Option<usize>,
        r: &Requester<'_>,
    ) -> Scan {
        debug_assert!(r.guaranteed && !r.fair);
        let key = (pool, scope, r.prio);
        if self.reclaim_scan.as_ref().is_none_or(|k| k.key != key) {
            self.reclaim_scan = Some(self.classify(key, w, r));
        }
        let kept = self.reclaim_scan.as_ref().expect("kept just above");
        let scan = kept.for_tenant(self.p, r.tenant);
        debug_assert_eq!(
            scan,
            self.scan(w, pool, r),
            "the kept classification differs from a scan of the pool"
        );
        scan
    }

    /// The pool's candidates as requester `r` of `w` finds them were it of no tenant: the
    /// scan of a requester no candidate belongs to, whose eligible candidates are then marked
    /// with their tenant where that tenant's own requester would find them protected.
    fn classify(&self, key: Key, w: usize, r: &Requester<'_>) -> ReclaimScan {
        let p = self.p;
        let (pool, _, prio) = key;
        // Competing by no fair share, the scan never asks `w` whether another yields to it.
        let nobody = Requester {
            tenant: usize::MAX,
            prio,
            guaranteed: true,
            fair: false,
            in_scope: r.in_scope,
        };
        let found = self.scan(w, pool, &nobody);
        debug_assert!(
            found.owners.is_empty() && found.own.is_empty() && found.fair_victims.is_empty()
        );
        let eligible = found
            .eligible
            .iter()
            .map(|&v| {
                let wl = &p.workloads[v];
                // The rule `Solver::candidate` applies to a requester's own tenant.
                let owned = !self.within_guarantee[v] && p.classes[wl.class].priority >= prio;
                (v, owned.then_some(wl.tenant))
            })
            .collect();
        ReclaimScan {
            key,
            eligible,
            protected: found.protected,
            outside_scope: found.outside_scope,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fmt::Write as _;
    use tessera_compiler::{SourceFile, compile};

    /// One pool of four 8-GPU nodes under a root, two organisations of three projects each,
    /// and 32 one-GPU running workloads of random projects, classes (three priorities, one
    /// not preemptible) and start times (some within the batch class's minimum runtime).
    fn problem(seed: u64) -> Problem {
        let mut rng = seed;
        let mut below = |n: u64| {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) % n
        };
        let h = "apiVersion: tessera/v1alpha1\n";
        let mut s = format!(
            "{h}kind: PriorityTiers\nmetadata: {{name: tiers}}\nspec: {{tiers: [{{name: high, value: 1000}}, {{name: mid, value: 500}}, {{name: low, value: 100}}]}}\n"
        );
        for (class, tier, preemptible) in [
            ("critical", "high", false),
            ("urgent", "mid", true),
            ("batch", "low", true),
        ] {
            let _ = write!(
                s,
                "---\n{h}kind: SloClass\nmetadata: {{name: {class}}}\nspec: {{tier: {tier}, preemptible: {preemptible}, preemption: {{gracePeriod: 1m, minRuntime: 30m}}}}\n"
            );
        }
        let _ = write!(
            s,
            "---\n{h}kind: Pool\nmetadata: {{name: train}}\nspec: {{gpuModel: H100-SXM5-80GB, sharing: exclusive, capacity: {{nodes: 4, gpusPerNode: 8, cpuPerNode: 64, memoryPerNode: 1Ti}}}}\n\
             ---\n{h}kind: Tenant\nmetadata: {{name: root}}\nspec: {{guarantee: {{train: 32}}, sloClasses: [critical, urgent, batch]}}\n"
        );
        for o in 0..2 {
            let _ = write!(
                s,
                "---\n{h}kind: Tenant\nmetadata: {{name: org-{o}}}\nspec: {{parent: root, guarantee: {{train: 12}}}}\n"
            );
            for j in 0..3 {
                let _ = write!(
                    s,
                    "---\n{h}kind: Tenant\nmetadata: {{name: p-{o}-{j}}}\nspec: {{parent: org-{o}, guarantee: {{train: {}}}}}\n",
                    below(5)
                );
            }
        }
        let _ = write!(
            s,
            "---\n{h}kind: ClusterState\nmetadata: {{name: snap}}\nspec:\n  observedAt: \"2026-11-20T08:00:00Z\"\n  nodes:\n"
        );
        for n in 0..4 {
            let gpus: Vec<String> = (0..8)
                .map(|g| format!("{{index: {g}, uuid: GPU-{n}{g}, model: H100-SXM5-80GB}}"))
                .collect();
            let _ = writeln!(
                s,
                "    - {{name: t{n}, pool: train, cpu: 64, memory: 1Ti, gpus: [{}]}}",
                gpus.join(", ")
            );
        }
        s += "  running:\n";
        for i in 0..32 {
            let class = ["critical", "urgent", "batch", "batch"][below(4) as usize];
            let started = if below(5) == 0 { "07:50" } else { "05:00" };
            let _ = writeln!(
                s,
                "    - {{name: run-{:02}-{i}, spec: {{tenant: p-{}-{}, sloClass: {class}, gpu: {{count: 1}}, cpu: 1, memory: 8Gi}}, bindings: [{{node: t{}, gpus: [{}]}}], startedAt: \"2026-11-20T{started}:00Z\"}}",
                below(100),
                below(2),
                below(3),
                i / 8,
                i % 8
            );
        }
        s += "  pending: []\n";
        let c = compile(&[SourceFile::new("p.yaml", s)]);
        assert_eq!(c.errors(), 0, "{:#?}", c.diagnostics);
        Problem::new(c.policy.as_ref().unwrap(), &c.states[0].1, None).unwrap()
    }

    /// What one walk met: reads of the kept classification, reads of one kept before (the
    /// others classified the pool), reads where the requester met its own borrowed work, and
    /// preemptions that dropped what was kept.
    #[derive(Debug, Default)]
    struct Met {
        reads: usize,
        kept: usize,
        own: usize,
        dropped: usize,
    }

    /// Requesters of tenants, priorities and scopes drawn from `steps` read the kept
    /// classification, asserted to be what a scan of the pool finds, while victims are
    /// preempted between them (some eligible to the kept key, some protected there, some
    /// outside its scope). Which running work counts as borrowed is drawn too, so that a
    /// requester meets its own borrowed work (a cycle gets there only after its work within
    /// guarantee was preempted).
    fn walk(seed: u64, borrowed: &[bool], steps: &[(usize, usize, usize, u64)]) -> Met {
        let p = problem(seed);
        let mut s = Solver::new(&p);
        s.keep_running();
        let running: Vec<usize> = s.running_by_pool[0].iter().map(|r| r.workload).collect();
        for (&v, &b) in running.iter().zip(borrowed) {
            s.within_guarantee[v] = !b;
        }
        let tenant = |name: &str| p.tenants.iter().position(|t| t.name == name).unwrap();
        let orgs = [tenant("org-0"), tenant("org-1")];
        let mut met = Met::default();
        for &(project, prio, scope, pick) in steps {
            let t = tenant(&format!("p-{}-{}", project / 3, project % 3));
            let prio = [100, 500, 1000][prio];
            let scope = [None, Some(orgs[0]), Some(orgs[1])][scope];
            let in_scope: Option<Vec<bool>> =
                scope.map(|x| p.tenants.iter().map(|t| t.lineage.contains(&x)).collect());
            let r = Requester {
                tenant: t,
                prio,
                guaranteed: true,
                fair: false,
                in_scope: in_scope.as_deref(),
            };
            if s.reclaim_scan
                .as_ref()
                .is_some_and(|k| k.key == (0, scope, prio))
            {
                met.kept += 1;
            }
            let found = s.reclaim_scan(0, 0, scope, &r);
            assert_eq!(found, s.scan(0, 0, &r), "the kept classification differs");
            met.reads += 1;
            met.own += usize::from(!found.own.is_empty());
            // A preemption: one or two victims, eligible here or any running workload.
            let candidates: Vec<usize> = if pick % 2 == 0 && !found.eligible.is_empty() {
                found.eligible.clone()
            } else {
                running
                    .iter()
                    .copied()
                    .filter(|&v| matches!(s.status[v], Some(Status::Keep)))
                    .collect()
            };
            if pick % 3 == 0 || candidates.is_empty() {
                continue;
            }
            let count = 1 + (pick as usize / 7) % 2;
            let victims: Vec<usize> = (0..count)
                .map(|i| candidates[(pick as usize / 11 + i * 5) % candidates.len()])
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            for &v in &victims {
                s.status[v] = Some(Status::Preempt(PreemptReason::Reservation {
                    for_workload: "test".into(),
                }));
            }
            let kept = s.reclaim_scan.take();
            let had = kept.is_some();
            s.reclaim_scan = kept.and_then(|k| k.without(&p, 0, &victims));
            met.dropped += usize::from(had && s.reclaim_scan.is_none());
        }
        met
    }

    /// The draws reach what the comparison is for: reads of a classification kept from an
    /// earlier requester and across preemptions, requesters meeting their own borrowed work,
    /// and preemptions of protected work that drop what was kept.
    #[test]
    fn the_walks_read_kept_classifications() {
        let mut all = Met::default();
        for seed in 0..40u64 {
            let borrowed: Vec<bool> = (0..32).map(|i| (seed + i) % 3 == 0).collect();
            let steps: Vec<(usize, usize, usize, u64)> = (0..16)
                .map(|i| {
                    let x = seed.wrapping_mul(31).wrapping_add(i * 17);
                    // The key (priority, scope) held for four requesters in a row.
                    let key = (seed + i / 4) as usize;
                    ((x % 6) as usize, key % 2, key / 2 % 3, x)
                })
                .collect();
            let met = walk(seed, &borrowed, &steps);
            all.reads += met.reads;
            all.kept += met.kept;
            all.own += met.own;
            all.dropped += met.dropped;
        }
        assert!(all.kept >= 20, "{all:?}");
        assert!(all.own >= 10, "{all:?}");
        assert!(all.dropped >= 5, "{all:?}");
    }

    proptest! {
        /// Every read of the kept classification is the scan's, on random pools, borrowed
        /// work, requesters and preemptions.
        #[test]
        fn the_kept_classification_is_the_scan(
            seed in any::<u64>(),
            borrowed in proptest::collection::vec(any::<bool>(), 32),
            steps in proptest::collection::vec((0usize..6, 0usize..3, 0usize..3, any::<u64>()), 1..24),
        ) {
            let met = walk(seed, &borrowed, &steps);
            prop_assert_eq!(met.reads, steps.len());
        }
    }
}
