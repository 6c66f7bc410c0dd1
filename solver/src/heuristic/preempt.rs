//! (d) The preemption search: which allowed victims make room for a gang that does not fit.
//! Its what-ifs write on the solver's own fleet and ledger and roll back (`journal.rs`), and
//! the pruning of an accumulated set asks a witness before it places the gang again (see
//! [`Solver::prune`]).

use super::*;
use crate::undo::Mark;

impl Solver<'_> {
    /// (d) Finds the cheapest sufficient set of allowed victims in `pool` and admits `w`; the
    /// protected workloads otherwise. Debug builds run the search as it was before its undo
    /// journal and witnesses (`scratch.rs`) beside it and assert the same outcome and state.
    pub(super) fn preempt_for(
        &mut self,
        w: usize,
        pool: usize,
        scope: Option<usize>,
    ) -> Result<Status, (Arc<[Protected]>, usize)> {
        #[cfg(debug_assertions)]
        let reference = {
            let mut from_scratch = self.clone_for_search(pool);
            let result = from_scratch.preempt_for_scratch(w, pool, scope);
            (self.fleet.clone(), from_scratch, result)
        };
        let result = self.search_victims(w, pool, scope);
        #[cfg(debug_assertions)]
        self.assert_same(pool, &result, reference);
        result
    }

    /// [`Solver::preempt_for`]'s search.
    fn search_victims(
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
        let guaranteed_key = requester_guaranteed.then_some((pool, scope, prio));
        if let (Some(key), Some((k, own, refusal))) = (guaranteed_key, &self.refused_guaranteed)
            && key == *k
            && own.iter().all(|&t| t == wl.tenant)
        {
            return Err(refusal.clone());
        }
        // Whether each tenant is in the scope: a borrower's scan visits thousands of
        // candidates, a fleet has hundreds of tenants.
        let in_scope: Option<Vec<bool>> =
            scope.map(|x| p.tenants.iter().map(|t| t.lineage.contains(&x)).collect());
        let requester = Requester {
            tenant: wl.tenant,
            prio,
            guaranteed: requester_guaranteed,
            fair,
            in_scope: in_scope.as_deref(),
        };
        let cap = self.replicas_cap(w, pool, requester_guaranteed);
        let needed = amount.units();
        let min_member = i64::from(wl.min_member);
        // One victim, the cheapest that suffices, first. Without fair share the candidates'
        // costs do not depend on the requester, so a requester within its guarantee walks
        // them in the pool's cost order, and the scan of every candidate below is left for
        // the searches that no single victim ends: at 50,000 GPUs the training pool's tens of
        // thousands of running workloads were scanned whole for each of 550 reclaims a cycle,
        // each ended by a single victim. A borrower scans: its search mostly ends in a
        // refusal, which lists the protected work in key order and which the next borrowers
        // reuse, and a walk in cost order would visit every candidate before the scan did so
        // again.
        let walked = !fair && requester_guaranteed;
        let mut room = None;
        let mut chosen = None;
        if walked {
            chosen = self
                .cheapest_single(w, pool, &requester, cap, &mut room)
                .map(|(v, admitted)| (vec![v], admitted));
        }
        let Scan {
            protected,
            eligible,
            fair_victims,
            owners,
            own,
            outside_scope,
        } = if chosen.is_some() {
            Scan::new(self.tenant_ranks())
        } else if walked {
            // The same classification for each requester within its guarantee of one
            // priority, kept until a preemption changes it (`reclaim_scan.rs`).
            self.reclaim_scan(w, pool, scope, &requester)
        } else {
            self.scan(w, pool, &requester)
        };
        let cost = |v: usize| cost_of(p, v);
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
        // No victim allowed: nothing below could succeed, and the pool's free room (a scan of
        // its GPUs) is not needed.
        if chosen.is_none() && eligible.is_empty() {
            let refusal = self.listed(protected);
            if let Some(key) = refusal_key {
                self.refused = Some((key, owners, refusal.clone()));
            }
            if let Some(key) = guaranteed_key {
                self.refused_guaranteed = Some((key, own, refusal.clone()));
            }
            return Err(refusal);
        }
        let room = &*room.get_or_insert_with(|| Room::new(self, pool, wl.demand.gpus().units()));
        let holds = |v: usize| held_units(p, v);
        let replicas_on = |n: usize, freed: i64| room.replicas_on(n, freed);
        let (pool_free, base_fit) = (room.pool_free, room.base_fit);
        // What `v` frees, by node: one entry per placement, read while `v` holds them.
        let frees_of = |fleet: &Fleet, v: usize| -> Vec<(usize, i64)> {
            let units = p.workloads[v].demand.gpus().units();
            fleet.placed[v]
                .iter()
                .flat_map(|s| s.iter())
                .map(|slot| (slot.node, units))
                .collect()
        };
        // With fair share, one victim, the cheapest that suffices, here: borrowed work of the
        // requester's priority last, from the side furthest above its share first (the walk
        // above tried the others' singles in this order).
        // The cheap checks come first and do not depend on the order: only the victims that
        // pass them are ordered (a pool holds thousands of candidates, few of which make room).
        let singles: Vec<usize> = if walked {
            Vec::new()
        } else {
            eligible
                .iter()
                .copied()
                .filter(|&v| room.may_suffice(p, &self.fleet, v, needed, min_member))
                .collect()
        };
        // Tried cheapest first. The cheapest nearly always suffices (it passed the bounds
        // above): it is found by a scan, and the others are keyed and sorted only when it does
        // not. Keys are distinct (they end with the workload's key), so the order is the
        // sort's.
        let single_key = |v: usize| ((fair_victims.get(&v), cost(v)), v);
        let cheapest = singles.iter().map(|&v| single_key(v)).min().map(|(_, v)| v);
        let mut rest = Vec::new();
        let mut sorted = false;
        let mut next = cheapest;
        while let Some(v) = next {
            let (fm, lm) = (self.fleet.mark(), self.ledger.mark());
            self.release_victim(pool, v);
            let attempt = attempt_on(&mut self.fleet, &mut self.ledger, &[v]);
            self.fleet.rollback(fm);
            self.ledger.rollback(lm);
            if let Ok(admitted) = attempt {
                chosen = Some((vec![v], admitted));
                break;
            }
            if !sorted {
                // Descending, so that the cheapest left is popped from the end.
                rest = singles
                    .iter()
                    .filter(|&&s| Some(s) != cheapest)
                    .map(|&s| single_key(s))
                    .collect();
                rest.sort_unstable_by(|a, b| b.cmp(a));
                sorted = true;
            }
            next = rest.pop().map(|(_, v)| v);
        }
        // Every candidate released at once gives the highest bounds any set of them reaches
        // (both grow with the set): when even those refuse, no what-if can succeed, and the
        // accumulation below is not tried. A gang that no victim here makes room for
        // otherwise walked the whole candidate list in cost order.
        let hopeless = || {
            let mut all = Bound::new(base_fit, &replicas_on);
            let mut frees = Vec::new();
            for &v in &eligible {
                frees.extend(frees_of(&self.fleet, v));
            }
            all.add(&frees);
            let freed: i64 = eligible.iter().map(|&v| holds(v)).sum();
            pool_free + freed < needed || all.fit < min_member
        };
        // Otherwise accumulate, borrowed and low tiers first, then drop the unneeded.
        if chosen.is_none() && !hopeless() {
            // Among borrowed work of the requester's priority, the side furthest above its
            // share gives first. Drawn from a heap, lowest first: the set is mostly far smaller
            // than the pool's candidates, which a sort would order whole. The workload breaks
            // ties as the stable sort of candidates by index did.
            let mut order: std::collections::BinaryHeap<_> = eligible
                .iter()
                .map(|&v| {
                    let c = cost(v);
                    std::cmp::Reverse((
                        (
                            self.within_guarantee[v],
                            c.2,
                            fair_victims.get(&v).cloned(),
                            c.0,
                            c.1,
                            c.3,
                        ),
                        v,
                    ))
                })
                .collect();
            // The set grows on the solver's own fleet and ledger, a mark before each victim's
            // release, so that the pruning below can go back to any prefix of it.
            let (mut base_fleet, base_ledger) = (self.fleet.mark(), self.ledger.mark());
            let mut set = Vec::new();
            let (mut fleet_marks, mut ledger_marks) = (Vec::new(), Vec::new());
            let mut frees = Vec::new();
            // Whether the fleet is released only on the nodes that could host a replica with
            // the whole set released. A reclaim for a large replica on a pool of small work
            // accumulates most of the pool's borrowed work before one node has the room (1,400
            // victims at 50,000 GPUs, pruned to two), and the what-ifs place only where a node
            // can host: every other node is as unable to host released as not, and nothing
            // else of a node's state reaches a placement without topology (`fill` keys each
            // node by its own state). A gang with a topology sums every node's free room to
            // order its domains, and only whole GPUs are bounded exactly by free units (see
            // `Room`), so the others release everything.
            let lazy =
                wl.topology == TopologyMode::None && matches!(wl.demand, Demand::Whole { .. });
            let mut bound = Bound::new(base_fit, &replicas_on);
            let mut freed = 0;
            while let Some(std::cmp::Reverse((_, v))) = order.pop() {
                // What `v` frees is read from its own placements, which no other victim's
                // release changes.
                let f = frees_of(&self.fleet, v);
                bound.add(&f);
                frees.push(f);
                set.push(v);
                freed += holds(v);
                if pool_free + freed < needed {
                    continue;
                }
                if bound.fit < min_member {
                    continue;
                }
                // Released only when a what-if is due, in the set's order, each after its
                // mark, as if released one by one: a search whose bounds never allow a
                // what-if (a gang no set of these victims makes room for) releases none, where
                // it released every candidate of the pool and rolled them all back.
                for &u in &set[ledger_marks.len()..] {
                    ledger_marks.push(self.ledger.mark());
                    self.release_quota(pool, u);
                }
                if lazy {
                    // The nodes that can host grow with the set: released again from the
                    // base, so that each mark still stands before its victim's release.
                    self.fleet.rollback(base_fleet);
                    base_fleet = self.fleet.mark();
                    fleet_marks.clear();
                    for (&u, f) in set.iter().zip(&frees) {
                        fleet_marks.push(self.fleet.mark());
                        if f.iter().any(|&(n, _)| bound.hosts(n)) {
                            self.fleet.release(p, u, true);
                        }
                    }
                } else {
                    for &u in &set[fleet_marks.len()..] {
                        fleet_marks.push(self.fleet.mark());
                        self.fleet.release(p, u, true);
                    }
                }
                let attempt = attempt_on(&mut self.fleet, &mut self.ledger, &set);
                #[cfg(debug_assertions)]
                if lazy {
                    let mut whole = self.fleet.clone();
                    for &u in &set {
                        whole.release(p, u, true);
                    }
                    let full = attempt_on(&mut whole, &mut self.ledger, &set);
                    assert_eq!(
                        attempt.as_ref().map(|a| &a.0.placed[w]).ok(),
                        full.as_ref().map(|a| &a.0.placed[w]).ok(),
                        "a what-if released only where a node can host placed otherwise"
                    );
                }
                if let Ok(admitted) = attempt {
                    let marks = fleet_marks.drain(..).zip(ledger_marks.drain(..)).collect();
                    let search = Pruning {
                        set: &set,
                        frees: &frees,
                        marks,
                        bound,
                        min_member,
                        witness_holds: fair_victims.is_empty(),
                        base: (base_fleet, base_ledger),
                    };
                    chosen = Some(self.prune(w, pool, search, admitted, &attempt_on));
                    break;
                }
            }
            if chosen.is_none() {
                self.fleet.rollback(base_fleet);
                self.ledger.rollback(base_ledger);
            }
        }
        // The what-if of the victims chosen is the fleet that admits `w`.
        let Some((victims, (fleet, ledger, guaranteed, borrowed))) = chosen else {
            let refusal = self.listed(protected);
            // The scope's own work, released, gives back the quota but not the room: work
            // outside the scope may be allowed to make the room, as for any gang short of
            // capacity (Kueue weighs a queue's own and its cohort's candidates together). The
            // search without a scope keeps the scope's victims only where the limit needs them.
            // (Only the ledger tells: the fleet is not released.)
            if scope.is_some() && outside_scope {
                let mut released = self.ledger.clone();
                for &v in &eligible {
                    let vl = &p.workloads[v];
                    released.remove(p, vl.tenant, pool, vl.amount(vl.replicas));
                }
                if released.within_limits(p, wl.tenant, pool, wl.amount(wl.min_member))
                    && let Ok(status) = self.preempt_for(w, pool, None)
                {
                    return Ok(status);
                }
            }
            return Err(refusal);
        };
        // Written once: a gang may displace hundreds of victims, each naming it.
        let for_workload = wl.key.to_string();
        for &v in &victims {
            // Drains are recorded on the fleet that admits `w`.
            let reason = if fair_victims.contains_key(&v) {
                let (a, b) = quota::sides(p, wl.tenant, p.workloads[v].tenant)
                    .expect("a fair victim has a side");
                PreemptReason::FairShare {
                    for_workload: for_workload.clone(),
                    from: p.tenants[b].name.clone(),
                    to: p.tenants[a].name.clone(),
                }
            } else if requester_guaranteed && !self.within_guarantee[v] {
                PreemptReason::Reclaim {
                    for_workload: for_workload.clone(),
                    owner: p.tenants[wl.tenant].name.clone(),
                }
            } else {
                PreemptReason::Priority {
                    for_workload: for_workload.clone(),
                    priority: prio,
                }
            };
            self.status[v] = Some(Status::Preempt(reason));
        }
        // The kept classification loses the victims, now gone, and stays (`reclaim_scan.rs`).
        let kept = self.reclaim_scan.take();
        self.forget_refusals();
        self.reclaim_scan = kept.and_then(|k| k.without(p, pool, &victims));
        self.victims = victims;
        self.fleet = fleet;
        self.ledger = ledger;
        Ok(Status::Admit {
            guaranteed,
            borrowed,
        })
    }

    /// Releases victim `v` of `pool` on the solver's own fleet and ledger (a what-if's write:
    /// undone by the marks open).
    pub(super) fn release_victim(&mut self, pool: usize, v: usize) {
        self.fleet.release(self.p, v, true);
        self.release_quota(pool, v);
    }

    /// [`Solver::release_victim`] on the ledger alone.
    fn release_quota(&mut self, pool: usize, v: usize) {
        let p = self.p;
        let vl = &p.workloads[v];
        self.ledger
            .remove(p, vl.tenant, pool, vl.amount(vl.replicas));
    }

    /// The most replicas of `w` a search may make room for in `pool`: preempting
    /// within-guarantee work is only for work that stays within guarantee, so a requester
    /// within its guarantee takes no more replicas than its guarantee covers.
    pub(super) fn replicas_cap(&self, w: usize, pool: usize, guaranteed: bool) -> u32 {
        let p = self.p;
        let wl = &p.workloads[w];
        if !guaranteed {
            return wl.replicas;
        }
        (wl.min_member..=wl.replicas)
            .rev()
            .find(|&n| {
                self.ledger
                    .split(p, wl.tenant, pool, wl.demand.gpus() * i64::from(n))
                    .1
                    == Gpus::ZERO
            })
            .unwrap_or(wl.min_member)
    }

    /// Every running candidate of `pool` classified for requester `r` of `w`, in key order.
    pub(super) fn scan(&self, w: usize, pool: usize, r: &Requester<'_>) -> Scan {
        let p = self.p;
        let mut found = Scan::new(self.tenant_ranks());
        for run in &self.running_by_pool[pool] {
            // Names are cloned only for the few candidates a reason lists (see `listed`).
            let v = run.workload;
            match self.candidate(r, run) {
                Candidate::Outside => found.outside_scope = true,
                Candidate::Gone => {}
                Candidate::Eligible => found.eligible.push(v),
                Candidate::Protected(why, note) => {
                    match note {
                        Note::Owner(t) => {
                            found.owners.insert(t);
                        }
                        Note::Own(t) => {
                            found.own.insert(t);
                        }
                        Note::None => {}
                    }
                    found.protected.push(p, v, why);
                }
                Candidate::FairShare => match self.fairly_yields(w, v, pool) {
                    Some(Ok(rank)) => {
                        found.fair_victims.insert(v, rank);
                        found.eligible.push(v);
                    }
                    Some(Err(())) => found.protected.push(p, v, Blocked::FairShare),
                    None => found.protected.push(p, v, Blocked::NotLowerPriority),
                },
            }
        }
        found
    }

    /// What running candidate `run` is to `r`: the classification of the search's scan and
    /// of its walk alike.
    pub(super) fn candidate(&self, r: &Requester<'_>, run: &Running) -> Candidate {
        let p = self.p;
        let v = run.workload;
        if r.in_scope.is_some_and(|s| !s[run.tenant]) {
            return Candidate::Outside;
        }
        if !matches!(self.status[v], Some(Status::Keep)) {
            return Candidate::Gone;
        }
        let class = &p.classes[run.class];
        let within = self.within_guarantee[v];
        if let Some(why) = protected_from_all(p, run) {
            Candidate::Protected(why, Note::None)
        } else if within && !(class.priority < r.prio && (r.guaranteed || run.tenant == r.tenant)) {
            // Guarantee protection guards against other tenants' borrowing; within one
            // tenant, priority alone decides.
            let note = if class.priority < r.prio {
                Note::Owner(run.tenant)
            } else {
                Note::None
            };
            Candidate::Protected(Blocked::WithinGuarantee, note)
        } else if !within && !r.guaranteed && class.priority >= r.prio {
            if r.fair && class.priority == r.prio {
                Candidate::FairShare
            } else {
                Candidate::Protected(Blocked::NotLowerPriority, Note::None)
            }
        } else if !within && r.guaranteed && class.priority >= r.prio && run.tenant == r.tenant {
            // Reclaiming from oneself is no reclaim.
            Candidate::Protected(Blocked::NotLowerPriority, Note::Own(run.tenant))
        } else {
            Candidate::Eligible
        }
    }

    /// The search's first phase for a requester within its guarantee, without fair share:
    /// `pool`'s candidates walked cheapest first ([`Solver::by_cost`]), each allowed one that
    /// passes the bounds of `room` released in a what-if, until one admits `w`: the what-ifs,
    /// in the order, that the scan's single victims would take, without visiting the
    /// candidates past the one that succeeds, nor those before it that hold too few GPUs to
    /// pass the pool's bound (the order is by GPUs first: a reclaim of 8 GPUs skips the
    /// pool's thousands of 1-GPU runs by a binary search).
    fn cheapest_single(
        &mut self,
        w: usize,
        pool: usize,
        requester: &Requester<'_>,
        cap: u32,
        room: &mut Option<Room>,
    ) -> Option<(usize, Admitted)> {
        let p = self.p;
        let wl = &p.workloads[w];
        let needed = (wl.demand.gpus() * i64::from(wl.min_member)).units();
        let min_member = i64::from(wl.min_member);
        let order = self.by_cost(pool);
        let room = room.get_or_insert_with(|| Room::new(self, pool, wl.demand.gpus().units()));
        let running = &self.running_by_pool[pool];
        let first = order.partition_point(|&i| {
            room.pool_free + held_units(p, running[i as usize].workload) < needed
        });
        for &i in &order[first..] {
            let run = self.running_by_pool[pool][i as usize];
            if !matches!(self.candidate(requester, &run), Candidate::Eligible) {
                continue;
            }
            let v = run.workload;
            if !room.may_suffice(p, &self.fleet, v, needed, min_member) {
                continue;
            }
            let (fm, lm) = (self.fleet.mark(), self.ledger.mark());
            self.release_victim(pool, v);
            let attempt = try_pool(p, &mut self.fleet, &mut self.ledger, w, pool, cap);
            self.fleet.rollback(fm);
            self.ledger.rollback(lm);
            if let Ok(admitted) = attempt {
                return Some((v, admitted));
            }
        }
        None
    }

    /// `pool`'s running workloads cheapest to preempt first ([`cost_order`]), ordered on the
    /// first walk of the pool and kept while its running list stands.
    fn by_cost(&mut self, pool: usize) -> Rc<[u32]> {
        let order = self.by_cost[pool]
            .get_or_insert_with(|| cost_order(self.p, &self.running_by_pool[pool]));
        Rc::clone(order)
    }

    /// Drops the victims an accumulated set does not need, last added first: a victim goes
    /// when the gang still fits without it. `search.marks[i]` was opened before `set[i]` was
    /// released, so the what-if of the prefix before `i` plus the victims kept so far is a
    /// rollback and a release of the kept ones (they are few), where releasing each smaller
    /// set from scratch cost set² releases.
    ///
    /// Most victims of a large set are nowhere near where the gang lands. The last what-if
    /// that admitted the gang is a witness: the nodes it placed on, with their state. Every
    /// node's capacity for the gang's identical replicas depends on that node alone (`fill`
    /// asks each node for one replica at a time until none fits), so a set that leaves the
    /// witness's nodes as they were hosts at least as many replicas there, and the gang fits
    /// whenever the quota allows it (with no fair-share victim, nothing else is checked).
    /// Only a victim on the witness's nodes needs a what-if with placement; debug builds
    /// check every conclusion drawn from a witness against one. Closes `search.base`.
    fn prune<F, A>(
        &mut self,
        w: usize,
        pool: usize,
        search: Pruning<'_, F>,
        first: Admitted,
        attempt_on: &A,
    ) -> (Vec<usize>, Admitted)
    where
        F: Fn(usize, i64) -> i64,
        A: Fn(&mut Fleet, &mut Ledger, &[usize]) -> Result<Admitted, ()>,
    {
        let p = self.p;
        let Pruning {
            set,
            frees,
            mut marks,
            mut bound,
            min_member,
            witness_holds,
            base,
        } = search;
        let placed_nodes = |a: &Admitted| -> BTreeSet<usize> {
            a.0.placed[w]
                .iter()
                .flat_map(|s| s.iter())
                .map(|s| s.node)
                .collect()
        };
        let mut witness = placed_nodes(&first);
        // The what-if of the set as it stands, unless a witness decided the last removal.
        let mut admitted = Some(first);
        // Indexes into `set` of the victims kept, in order.
        let mut kept: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
        for i in (0..set.len()).rev() {
            // The set without `set[i]`: the prefix before it, then the victims kept after it.
            let without = |kept: &std::collections::VecDeque<usize>| -> Vec<usize> {
                set[..i]
                    .iter()
                    .copied()
                    .chain(kept.iter().map(|&k| set[k]))
                    .collect()
            };
            if i == 0 && kept.is_empty() {
                kept.push_front(i);
                continue;
            }
            bound.remove(&frees[i]);
            if bound.fit < min_member {
                bound.add(&frees[i]);
                kept.push_front(i);
                continue;
            }
            let (fm, lm) = marks[i];
            self.ledger.rollback(lm);
            marks.truncate(i);
            for &k in &kept {
                self.release_quota(pool, set[k]);
            }
            let by_witness = witness_holds && frees[i].iter().all(|(n, _)| !witness.contains(n));
            // The fleet follows the ledger only where a what-if reads it (debug builds check
            // the witness with one): a large set's victims are mostly decided by the witness,
            // and each step re-released every victim kept so far on the fleet. Rolling back
            // to `fm` from wherever the fleet stands restores the prefix before `set[i]`: the
            // steps go back through the set, so the fleet never stands before `fm`.
            if !by_witness || cfg!(debug_assertions) {
                self.fleet.rollback(fm);
                for &k in &kept {
                    self.fleet.release(p, set[k], true);
                }
            }
            let fits = if by_witness {
                let fits = quota_fits(p, &self.ledger, w, pool);
                debug_assert_eq!(
                    fits,
                    attempt_on(&mut self.fleet, &mut self.ledger, &without(&kept)).is_ok(),
                    "the witness decided otherwise than the what-if"
                );
                if fits {
                    admitted = None;
                }
                fits
            } else {
                match attempt_on(&mut self.fleet, &mut self.ledger, &without(&kept)) {
                    Ok(a) => {
                        witness = placed_nodes(&a);
                        admitted = Some(a);
                        true
                    }
                    Err(()) => false,
                }
            };
            if !fits {
                bound.add(&frees[i]);
                kept.push_front(i);
            }
        }
        self.fleet.rollback(base.0);
        self.ledger.rollback(base.1);
        let victims: Vec<usize> = kept.iter().map(|&k| set[k]).collect();
        let admitted = match admitted {
            // A what-if released the victims only where a node could host (`lazy` in
            // `search_victims`): the others are released on its fleet now, on nodes the gang
            // did not use, as they would have been before it was placed.
            Some(mut a) => {
                for &v in &victims {
                    if a.0.placed[v].is_some() {
                        a.0.release(p, v, true);
                    }
                }
                a
            }
            None => {
                // The what-if of the set chosen, which its witness says admits the gang.
                let (fm, lm) = (self.fleet.mark(), self.ledger.mark());
                for &v in &victims {
                    self.release_victim(pool, v);
                }
                let a = attempt_on(&mut self.fleet, &mut self.ledger, &victims);
                self.fleet.rollback(fm);
                self.ledger.rollback(lm);
                a.expect("a set whose witness holds admits the gang")
            }
        };
        (victims, admitted)
    }
}

/// A successful what-if: the fleet and ledger with the gang admitted, and the (guaranteed,
/// borrowed) split of what was admitted.
pub(super) type Admitted = (Fleet, Ledger, Gpus, Gpus);

/// An accumulated victim set that admits the gang, to prune (see [`Solver::prune`]).
pub(super) struct Pruning<'s, F> {
    /// The victims in the order they were added, all released on the solver's ledger, and on
    /// its fleet wherever a node could host a replica (all of them, unless the search is
    /// `lazy`).
    set: &'s [usize],
    /// What each frees, by node (one entry per placement).
    frees: &'s [Vec<(usize, i64)>],
    /// The marks opened before each was released.
    marks: Vec<(Mark, Mark)>,
    bound: Bound<'s, F>,
    min_member: i64,
    /// Whether a witness decides (no fair-share victim among the candidates).
    witness_holds: bool,
    /// The marks opened before the first release.
    base: (Mark, Mark),
}

/// What a scan of a pool's running candidates found for one requester.
#[derive(Debug, PartialEq)]
pub(super) struct Scan {
    pub(super) protected: Blocking,
    pub(super) eligible: Vec<usize>,
    /// Eligible by fair share alone, with how far above its share each level of its side
    /// is (see `fairly_yields`).
    pub(super) fair_victims: BTreeMap<usize, Vec<u64>>,
    /// Tenants whose borrower could displace protected work here (their own, within
    /// guarantee, of lower priority): a refusal holds for every other tenant's borrower.
    pub(super) owners: BTreeSet<usize>,
    /// Tenants whose borrowed work a requester within guarantee found protected because it
    /// was its own: another tenant's requester could reclaim it.
    pub(super) own: BTreeSet<usize>,
    /// Whether the scope left a candidate out: when it left none (the scope is the pool's
    /// root, say), the search without it would be the same search again.
    pub(super) outside_scope: bool,
}

impl Scan {
    pub(super) fn new(ranks: Rc<[u32]>) -> Scan {
        Scan {
            protected: Blocking::new(ranks),
            eligible: Vec::new(),
            fair_victims: BTreeMap::new(),
            owners: BTreeSet::new(),
            own: BTreeSet::new(),
            outside_scope: false,
        }
    }
}

/// What a preemption search asks of each candidate about its requester.
pub(super) struct Requester<'a> {
    pub(super) tenant: usize,
    pub(super) prio: i64,
    /// Whether the requester's gang stays within its tenant's guarantee.
    pub(super) guaranteed: bool,
    /// Whether borrowers of one priority compete by fair share here.
    pub(super) fair: bool,
    /// Whether each tenant is in the search's scope (`None`: no scope).
    pub(super) in_scope: Option<&'a [bool]>,
}

/// One running candidate, to a [`Requester`].
pub(super) enum Candidate {
    /// Outside the search's scope.
    Outside,
    /// Not running on in this decision (already preempted, or gone).
    Gone,
    Eligible,
    /// Borrowed work of the requester's priority that fair share may give up or keep
    /// (`Solver::fairly_yields` decides).
    FairShare,
    Protected(Blocked, Note),
}

/// What a protected candidate tells a refusal about the tenants it holds for.
pub(super) enum Note {
    None,
    /// The candidate's tenant, whose own borrower could displace it (lower-priority work of
    /// its own, within guarantee).
    Owner(usize),
    /// The candidate's tenant, the requester's own: another tenant's requester within
    /// guarantee could reclaim it.
    Own(usize),
}

/// Why running `run` is protected from every requester, if it is: its class is not
/// preemptible, or it has not run its minimum yet (both read the problem's clock only).
fn protected_from_all(p: &Problem, run: &Running) -> Option<Blocked> {
    let class = &p.classes[run.class];
    let ran = (p.now - run.started_at).max(0) as u64;
    if !class.preemptible {
        Some(Blocked::NonPreemptible)
    } else if ran < class.min_runtime_seconds {
        Some(Blocked::MinRuntime(class.min_runtime_seconds - ran))
    } else {
        None
    }
}

/// The GPU units workload `v` holds with all its replicas: what preempting it frees.
fn held_units(p: &Problem, v: usize) -> i64 {
    let vl = &p.workloads[v];
    vl.amount(vl.replicas).gpus.units()
}

/// What preempting `v` costs, cheapest first: the GPUs it holds, the GPU-seconds since its
/// last checkpoint, its priority, then its key.
fn cost_of(p: &Problem, v: usize) -> (Gpus, i64, i64, &tessera_compiler::key::WorkloadKey) {
    let vl = &p.workloads[v];
    (
        vl.amount(vl.replicas).gpus,
        lost_units_seconds(p, v),
        p.classes[vl.class].priority,
        &vl.key,
    )
}

/// A pool's running workloads that any requester may preempt, as places in `running` (the
/// pool's list, by key), cheapest first ([`cost_of`]): work no search can take (its class is
/// not preemptible, or it has not run its minimum) is left out, since the cheapest work is
/// mostly the newest. The costs and the runtimes read the problem's clock, which a session
/// keeps; a session orders its pools when it opens and again when it adds runs, so that an
/// arrival finds them ordered (a sort of 60,000 candidates at 50,000 GPUs is a millisecond or
/// more).
pub(crate) fn cost_order(p: &Problem, running: &[Running]) -> Rc<[u32]> {
    // The list is by key, so a place ranks the key: compared as numbers, not names.
    debug_assert!(
        running
            .windows(2)
            .all(|r| p.workloads[r[0].workload].key < p.workloads[r[1].workload].key)
    );
    let mut keyed: Vec<_> = running
        .iter()
        .enumerate()
        .filter(|(_, r)| protected_from_all(p, r).is_none())
        .map(|(i, r)| {
            let (gpus, lost, priority, _) = cost_of(p, r.workload);
            let place = u32::try_from(i).expect("fewer than 2³² running workloads a pool");
            (gpus, lost, priority, place)
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|k| k.3).collect()
}

/// The pool's free GPU units by node, read before any what-if writes on the fleet, and the
/// bounds they give. A what-if cannot succeed unless the pool's free GPU units plus what the
/// victims hold reach the gang's minimum, nor unless enough nodes then have a replica's units
/// free: searches skip those that cannot (units freed are over-counted for partial gangs and
/// unhealthy GPUs, and a node's free units bound what one replica finds there, so nothing is
/// skipped that could succeed; the search from scratch that debug builds run beside this one
/// asserts it).
pub(super) struct Room {
    /// The free units of the pool's open nodes (`open.rs`) as the search began; a node not
    /// here had none.
    free_at: HashMap<usize, i64, foldhash::fast::FixedState>,
    /// The pool's free units.
    pool_free: i64,
    /// Replicas of the gang the pool's nodes could take as they are (see `replicas_on`).
    base_fit: i64,
    /// A replica's units.
    per_replica: i64,
}

impl Room {
    fn new(s: &Solver<'_>, pool: usize, per_replica: i64) -> Room {
        let p = s.p;
        // A node with nothing free adds nothing to either sum, and a search asks for a few
        // nodes' room: the open ones are all it reads (a gang of no units fits everywhere,
        // and is counted over every node).
        let nodes = if per_replica > 0 {
            s.fleet.open_in(p, pool)
        } else {
            p.pools[pool].nodes.clone()
        };
        let free_at: HashMap<usize, i64, foldhash::fast::FixedState> = nodes
            .iter()
            .map(|&n| (n, s.fleet.node_free(p, n)))
            .collect();
        let mut room = Room {
            pool_free: nodes.iter().map(|n| free_at[n]).sum(),
            free_at,
            base_fit: 0,
            per_replica,
        };
        room.base_fit = nodes
            .iter()
            .fold(0i64, |a, &n| a.wrapping_add(room.replicas_on(n, 0)));
        room
    }

    /// Replicas node `n` could take with `freed` more units free.
    fn replicas_on(&self, n: usize, freed: i64) -> i64 {
        if self.per_replica > 0 {
            (self.free_at.get(&n).copied().unwrap_or(0) + freed) / self.per_replica
        } else {
            i64::MAX / 4
        }
    }

    /// The bound with `v` alone released, from its placements on `fleet` (where it holds
    /// them still).
    fn single_fit(&self, p: &Problem, fleet: &Fleet, v: usize) -> i64 {
        let units = p.workloads[v].demand.gpus().units();
        let slots = fleet.placed[v].as_deref().map_or(&[][..], Vec::as_slice);
        let mut fit = self.base_fit;
        for (i, s) in slots.iter().enumerate() {
            if slots[..i].iter().any(|x| x.node == s.node) {
                continue;
            }
            let freed = slots[i..].iter().filter(|x| x.node == s.node).count() as i64 * units;
            fit = fit
                .wrapping_add(self.replicas_on(s.node, freed))
                .wrapping_sub(self.replicas_on(s.node, 0));
        }
        fit
    }

    /// Whether releasing `v` alone passes both bounds for a gang of `needed` units and
    /// `min_member` replicas.
    fn may_suffice(
        &self,
        p: &Problem,
        fleet: &Fleet,
        v: usize,
        needed: i64,
        min_member: i64,
    ) -> bool {
        self.pool_free + held_units(p, v) >= needed && self.single_fit(p, fleet, v) >= min_member
    }
}

/// How many replicas of the gang the pool's nodes could host with a set of victims released:
/// per node, its free units plus what the victims free there, over a replica's units, summed
/// (a bound: see `Solver::search_victims`). Kept as victims join and leave the set: summing it
/// again over the set per candidate cost set² per search.
pub(super) struct Bound<'f, F> {
    replicas_on: &'f F,
    /// Hashed with a fixed fast hasher: node numbers are not attacker-chosen, and the
    /// accumulation of a large reclaim changes it once per victim.
    freed: HashMap<usize, i64, foldhash::fast::FixedState>,
    pub(super) fit: i64,
}

impl<'f, F: Fn(usize, i64) -> i64> Bound<'f, F> {
    pub(super) fn new(base_fit: i64, replicas_on: &'f F) -> Self {
        Bound {
            replicas_on,
            freed: HashMap::default(),
            fit: base_fit,
        }
    }

    fn change(&mut self, frees: &[(usize, i64)], sign: i64) {
        for &(n, units) in frees {
            let freed = self.freed.entry(n).or_insert(0);
            let before = *freed;
            *freed += sign * units;
            self.fit = self
                .fit
                .wrapping_add((self.replicas_on)(n, *freed))
                .wrapping_sub((self.replicas_on)(n, before));
        }
    }

    pub(super) fn add(&mut self, frees: &[(usize, i64)]) {
        self.change(frees, 1);
    }

    pub(super) fn remove(&mut self, frees: &[(usize, i64)]) {
        self.change(frees, -1);
    }

    /// Whether node `n` could take a replica with what the set frees there.
    fn hosts(&self, n: usize) -> bool {
        (self.replicas_on)(n, self.freed.get(&n).copied().unwrap_or(0)) > 0
    }
}

/// Whether the quota checks of admitting `w`'s smallest gang in `pool` on `ledger`, as
/// [`try_pool`] makes them before placing, pass: its tenant's limits, then what it may borrow.
pub(super) fn quota_fits(p: &Problem, ledger: &Ledger, w: usize, pool: usize) -> bool {
    let wl = &p.workloads[w];
    ledger.within_limits(p, wl.tenant, pool, wl.amount(wl.min_member))
        && borrow_allows(p, ledger, w, pool, wl.min_member).is_ok()
}

/// Whether `w`'s tenant may borrow what `n` replicas of it would borrow in `pool`.
pub(super) fn borrow_allows(
    p: &Problem,
    ledger: &Ledger,
    w: usize,
    pool: usize,
    n: u32,
) -> Result<(), Reason> {
    let wl = &p.workloads[w];
    let gpus = wl.amount(n).gpus;
    let (_, borrowed) = ledger.split(p, wl.tenant, pool, gpus);
    ledger.check_borrow(p, wl.tenant, pool, gpus, borrowed)
}
