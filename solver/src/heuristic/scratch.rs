//! The preemption search as it was before the undo journal (`journal.rs`) and the witness
//! of `preempt.rs`: every candidate set tried on a fresh copy of the fleet and ledger, the
//! pruning releasing each smaller set from scratch. Debug builds run it beside every search
//! and assert the same outcome, victims, fleet and ledger (see [`Solver::preempt_for`]).

use super::*;

/// What a preemption search answers: the requester's status, or the protected candidates.
type SearchResult = Result<Status, (Arc<[Protected]>, usize)>;

impl Solver<'_> {
    /// [`Solver::preempt_for`] from scratch: finds the cheapest sufficient set of allowed victims in `pool` and admits `w`; the
    /// protected workloads otherwise.
    pub(super) fn preempt_for_scratch(
        &mut self,
        w: usize,
        pool: usize,
        scope: Option<usize>,
    ) -> Result<Status, (Arc<[Protected]>, usize)> {
        let p = self.p;
        let wl = &p.workloads[w];
        let prio = p.classes[wl.class].priority;
        let amount = wl.demand.gpus() * i64::from(wl.min_member);
        let requester_guaranteed = self.ledger.split(p, wl.tenant, pool, amount).1 == Gpus::ZERO;
        // Borrowers compete for borrowed work of their own priority here: whether one may take
        // another's depends on both tenants' shares, so a refusal holds for no one else.
        let fair = p.pools[pool].fair_share_preemption && !requester_guaranteed;
        let refusal_key = (!requester_guaranteed && !fair).then_some((pool, scope, prio));
        if let (Some(key), Some((k, owners, refusal))) = (refusal_key, &self.refused)
            && key == *k
            && !owners.contains(&wl.tenant)
        {
            return Err(refusal.clone());
        }
        let mut protected = Blocking::new(self.tenant_ranks());
        let mut eligible = Vec::new();
        // Eligible by fair share alone, with how far above its share each level of its side
        // is (see `fairly_yields`).
        let mut fair_victims: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        // Tenants whose borrower could displace protected work here (their own, within
        // guarantee, of lower priority): a refusal holds for every other tenant's borrower.
        let mut owners = BTreeSet::new();
        // Whether each tenant is in the scope: a borrower's scan visits thousands of
        // candidates, a fleet has hundreds of tenants.
        let in_scope: Option<Vec<bool>> =
            scope.map(|x| p.tenants.iter().map(|t| t.lineage.contains(&x)).collect());
        for &Running {
            workload: v,
            tenant,
            ..
        } in &self.running_by_pool[pool]
        {
            if in_scope.as_ref().is_some_and(|s| !s[tenant]) {
                continue;
            }
            if !matches!(self.status[v], Some(Status::Keep)) {
                continue;
            }
            let vl = &p.workloads[v];
            let class = &p.classes[vl.class];
            // Names are cloned only for the few candidates a reason lists (see `listed`).
            let name = v;
            let Phase::Running { started_at, .. } = vl.phase else {
                continue;
            };
            let ran = (p.now - started_at).max(0) as u64;
            if !class.preemptible {
                protected.push(p, name, Blocked::NonPreemptible);
            } else if ran < class.min_runtime_seconds {
                protected.push(
                    p,
                    name,
                    Blocked::MinRuntime(class.min_runtime_seconds - ran),
                );
            } else if self.within_guarantee[v]
                && !(class.priority < prio && (requester_guaranteed || vl.tenant == wl.tenant))
            {
                // Guarantee protection guards against other tenants' borrowing; within one
                // tenant, priority alone decides.
                if class.priority < prio {
                    owners.insert(vl.tenant);
                }
                protected.push(p, name, Blocked::WithinGuarantee);
            } else if !self.within_guarantee[v] && !requester_guaranteed && class.priority >= prio {
                match (fair && class.priority == prio)
                    .then(|| self.fairly_yields(w, v, pool))
                    .flatten()
                {
                    Some(Ok(rank)) => {
                        fair_victims.insert(v, rank);
                        eligible.push(v);
                    }
                    Some(Err(())) => protected.push(p, name, Blocked::FairShare),
                    None => protected.push(p, name, Blocked::NotLowerPriority),
                }
            } else if !self.within_guarantee[v]
                && requester_guaranteed
                && class.priority >= prio
                && vl.tenant == wl.tenant
            {
                // Reclaiming from oneself is no reclaim.
                protected.push(p, name, Blocked::NotLowerPriority);
            } else {
                eligible.push(v);
            }
        }
        let cost = |v: usize| {
            let vl = &p.workloads[v];
            (
                vl.amount(vl.replicas).gpus,
                lost_units_seconds(p, v),
                p.classes[vl.class].priority,
                &vl.key,
            )
        };
        let cap = self.replicas_cap(w, pool, requester_guaranteed);
        // A what-if on the fleet and ledger with `victims` released.
        let attempt_on = |fleet: &mut Fleet, ledger: &mut Ledger, victims: &[usize]| {
            let admitted = try_pool(p, fleet, ledger, w, pool, cap).map_err(|_| ())?;
            // Taken together, each side that gives up work by fair share still holds at least
            // what the requester's side holds with the gang admitted.
            let fair_ok = victims
                .iter()
                .filter(|v| fair_victims.contains_key(v))
                .all(|&v| {
                    let (a, b) = quota::sides(p, wl.tenant, p.workloads[v].tenant)
                        .expect("a fair victim has a side");
                    let none = Amounts::default();
                    match (
                        admitted.1.borrowed_share(p, a, pool, none, none),
                        admitted.1.borrowed_share(p, b, pool, none, none),
                    ) {
                        (Some(mine), Some(theirs)) => at_most(mine, theirs),
                        _ => false,
                    }
                });
            if fair_ok { Ok(admitted) } else { Err(()) }
        };
        let attempt = |victims: &[usize]| {
            let (mut fleet, mut ledger) = self.without(pool, victims);
            attempt_on(&mut fleet, &mut ledger, victims)
        };
        // No victim allowed: nothing below could succeed, and the pool's free room (a scan of
        // its GPUs) is not needed.
        if eligible.is_empty() {
            let refusal = self.listed(protected);
            if let Some(key) = refusal_key {
                self.refused = Some((key, owners, refusal.clone()));
            }
            return Err(refusal);
        }
        // A what-if costs a fleet clone. It cannot succeed unless the pool's free GPU units plus
        // what the victims hold reach the gang's minimum, nor unless enough nodes then have a
        // replica's units free: skip those that cannot (units freed are over-counted for
        // partial gangs and unhealthy GPUs, and a node's free units bound what one replica
        // finds there, so nothing is skipped that could succeed).
        // (The fleet keeps each node's free units: no map of the pool's nodes per search.)
        let pool_nodes = &p.pools[pool].nodes;
        let node_free = |n: usize| {
            if p.nodes[n].pool == Some(pool) {
                self.fleet.node_free(p, n)
            } else {
                0
            }
        };
        let pool_free: i64 = pool_nodes.iter().map(|&n| node_free(n)).sum();
        let needed = amount.units();
        let holds = |v: usize| {
            let vl = &p.workloads[v];
            vl.amount(vl.replicas).gpus.units()
        };
        let per_replica = wl.demand.gpus().units();
        let replicas_on = |n: usize, freed: i64| {
            let free = node_free(n);
            if per_replica > 0 {
                (free + freed) / per_replica
            } else {
                i64::MAX / 4
            }
        };
        let base_fit: i64 = pool_nodes.iter().map(|&n| replicas_on(n, 0)).sum();
        // What each victim frees, by node.
        let frees = |v: usize, freed: &mut BTreeMap<usize, i64>| {
            let units = p.workloads[v].demand.gpus().units();
            for slot in self.fleet.placed[v].iter().flat_map(|s| s.iter()) {
                *freed.entry(slot.node).or_default() += units;
            }
        };
        let fit_with = |freed: &BTreeMap<usize, i64>| {
            base_fit
                + freed
                    .iter()
                    .map(|(&n, &f)| replicas_on(n, f) - replicas_on(n, 0))
                    .sum::<i64>()
        };
        let could_fit = |victims: &[usize]| {
            let mut freed = BTreeMap::new();
            for &v in victims {
                frees(v, &mut freed);
            }
            let fit = fit_with(&freed) >= i64::from(wl.min_member);
            // The bound is only worth having if it never skips a what-if that succeeds.
            debug_assert!(
                fit || attempt(victims).is_err(),
                "a what-if skipped would succeed"
            );
            fit
        };
        // One victim, the cheapest that suffices; borrowed work of the requester's priority
        // last, from the side furthest above its share first.
        let mut singles: Vec<usize> = eligible.clone();
        singles.sort_by_cached_key(|&v| (fair_victims.get(&v).cloned(), cost(v)));
        let mut chosen = None;
        for &v in &singles {
            if pool_free + holds(v) < needed || !could_fit(&[v]) {
                continue;
            }
            if let Ok(admitted) = attempt(&[v]) {
                chosen = Some((vec![v], admitted));
                break;
            }
        }
        // Otherwise accumulate, borrowed and low tiers first, then drop the unneeded.
        if chosen.is_none() {
            let mut order = eligible.clone();
            // Among borrowed work of the requester's priority, the side furthest above its
            // share gives first.
            order.sort_by_cached_key(|&v| {
                let c = cost(v);
                (
                    self.within_guarantee[v],
                    c.2,
                    fair_victims.get(&v).cloned(),
                    c.0,
                    c.1,
                    c.3,
                )
            });
            let mut set = Vec::new();
            let mut freed = 0;
            let mut freed_by_node = BTreeMap::new();
            // The fleet and ledger with `set` released, grown a victim at a time as `without`
            // would release them (the same releases in the same order): a what-if per victim
            // added released the whole set again, (set²) releases per search.
            let (mut released_fleet, mut released_ledger) =
                (self.fleet.clone(), self.ledger.clone());
            for v in order {
                set.push(v);
                freed += holds(v);
                frees(v, &mut freed_by_node);
                let vl = &p.workloads[v];
                released_fleet.release(p, v, true);
                released_ledger.remove(p, vl.tenant, pool, vl.amount(vl.replicas));
                if pool_free + freed < needed {
                    continue;
                }
                if fit_with(&freed_by_node) < i64::from(wl.min_member) {
                    debug_assert!(attempt(&set).is_err(), "a what-if skipped would succeed");
                    continue;
                }
                if let Ok(mut admitted) =
                    attempt_on(&mut released_fleet, &mut released_ledger, &set)
                {
                    let mut i = set.len();
                    while i > 0 {
                        i -= 1;
                        let mut without = set.clone();
                        without.remove(i);
                        if without.is_empty() || !could_fit(&without) {
                            continue;
                        }
                        if let Ok(smaller) = attempt(&without) {
                            set = without;
                            admitted = smaller;
                        }
                    }
                    chosen = Some((set, admitted));
                    break;
                }
            }
        }
        // The what-if of the victims chosen is the fleet that admits `w`.
        let Some((victims, (fleet, ledger, guaranteed, borrowed))) = chosen else {
            let refusal = self.listed(protected);
            // The scope's own work, released, gives back the quota but not the room: work
            // outside the scope may be allowed to make the room, as for any gang short of
            // capacity (Kueue weighs a queue's own and its cohort's candidates together). The
            // search without a scope keeps the scope's victims only where the limit needs them.
            if scope.is_some() {
                let (_, released) = self.without(pool, &eligible);
                if released.within_limits(p, wl.tenant, pool, wl.amount(wl.min_member))
                    && let Ok(status) = self.preempt_for_scratch(w, pool, None)
                {
                    return Ok(status);
                }
            }
            return Err(refusal);
        };
        for &v in &victims {
            // Drains are recorded on the fleet that admits `w`.
            let reason = if fair_victims.contains_key(&v) {
                let (a, b) = quota::sides(p, wl.tenant, p.workloads[v].tenant)
                    .expect("a fair victim has a side");
                PreemptReason::FairShare {
                    for_workload: wl.key.to_string(),
                    from: p.tenants[b].name.clone(),
                    to: p.tenants[a].name.clone(),
                }
            } else if requester_guaranteed && !self.within_guarantee[v] {
                PreemptReason::Reclaim {
                    for_workload: wl.key.to_string(),
                    owner: p.tenants[wl.tenant].name.clone(),
                }
            } else {
                PreemptReason::Priority {
                    for_workload: wl.key.to_string(),
                    priority: prio,
                }
            };
            self.status[v] = Some(Status::Preempt(reason));
        }
        self.refused = None;
        self.victims = victims;
        self.fleet = fleet;
        self.ledger = ledger;
        Ok(Status::Admit {
            guaranteed,
            borrowed,
        })
    }
}

impl<'p> Solver<'p> {
    /// A copy of the solver for a search from scratch in `pool`: all it reads and writes. A
    /// search reads and writes the statuses of the pool's running work only, so the others are
    /// left out (waiting work's reasons are long), as is the trace of the cycle's picks.
    pub(super) fn clone_for_search(&self, pool: usize) -> Solver<'p> {
        let mut status = vec![None; self.status.len()];
        for r in &self.running_by_pool[pool] {
            status[r.workload] = self.status[r.workload].clone();
        }
        Solver {
            trace: Vec::new(),
            p: self.p,
            fleet: self.fleet.clone(),
            ledger: self.ledger.clone(),
            status,
            within_guarantee: self.within_guarantee.clone(),
            victims: self.victims.clone(),
            running_by_pool: self.running_by_pool.clone(),
            by_cost: self.by_cost.clone(),
            refused: self.refused.clone(),
            refused_guaranteed: self.refused_guaranteed.clone(),
            reclaim_scan: None,
            hold: self.hold.clone(),
            holds: self.holds.clone(),
            tenant_index: self.tenant_index.clone(),
            tenant_ranks: self.tenant_ranks.clone(),
            // Written afresh: the search from scratch shares nothing it could check.
            listed: protected::Listed::default(),
        }
    }

    /// Asserts that the search left the solver as the search from scratch left its copy:
    /// the same outcome, statuses, victims and remembered refusal, the same ledger, and the
    /// same fleet, down to which GPU states are still the ones `before` holds (the decision's
    /// assembly tells changed GPUs by pointer).
    pub(super) fn assert_same(
        &self,
        pool: usize,
        result: &SearchResult,
        (before, reference, expected): (Fleet, Solver<'p>, SearchResult),
    ) {
        let p = self.p;
        assert_eq!(
            result, &expected,
            "the search's outcome differs from scratch"
        );
        for r in &self.running_by_pool[pool] {
            let v = r.workload;
            assert_eq!(
                self.status[v], reference.status[v],
                "workload {v}'s status differs from scratch"
            );
        }
        assert_eq!(
            self.victims, reference.victims,
            "victims differ from scratch"
        );
        assert_eq!(
            self.refused, reference.refused,
            "refusals differ from scratch"
        );
        assert!(
            self.ledger.same_usage(&reference.ledger),
            "the ledger differs from scratch"
        );
        assert!(!self.fleet.journaling(), "a what-if's mark was left open");
        assert!(
            !self.ledger.journaling(),
            "a what-if's ledger mark was left open"
        );
        let (a, b) = (&self.fleet, &reference.fleet);
        for g in 0..p.gpus.len() {
            assert_eq!(a.gpu[g], b.gpu[g], "GPU {g} differs from scratch");
            assert_eq!(
                Rc::ptr_eq(&a.gpu[g], &before.gpu[g]),
                Rc::ptr_eq(&b.gpu[g], &before.gpu[g]),
                "GPU {g}'s state is shared with the fleet before in one search only"
            );
        }
        for n in 0..p.nodes.len() {
            assert_eq!(
                (a.cpu[n], a.memory[n], a.free[n]),
                (b.cpu[n], b.memory[n], b.free[n]),
                "node {n} differs from scratch"
            );
        }
        assert_eq!(a.placed.len(), b.placed.len());
        for w in 0..a.placed.len() {
            assert_eq!(a.placed[w], b.placed[w], "workload {w}'s placements differ");
        }
    }
}
