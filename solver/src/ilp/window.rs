//! The bounded sub-problem of one pool: the gangs that wait (the highest priority first, at
//! most [`Caps::gangs`]), the nodes where room could be made for them (whole NVLink domains,
//! the most reclaimable first, at most [`Caps::nodes`]), the gangs the incumbent admitted on
//! those nodes and the running workloads there that could be preempted. Everything else stays
//! as the incumbent has it and enters the sub-problem as fixed usage and fixed room.

use std::collections::{BTreeMap, BTreeSet};

use tessera_compiler::compiled::Amounts;
use tessera_compiler::model::Sharing;

use super::incumbent::{Placement, State};
use crate::heuristic::{KeepPhase, lost_units_seconds};
use crate::problem::{Demand, Phase, Problem};
use crate::quota::Ledger;

/// How large a window may grow.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub gangs: usize,
    pub nodes: usize,
}

/// A gang the sub-problem decides: admitted (where) or not.
#[derive(Debug, Clone)]
pub struct Gang {
    pub workload: usize,
    /// Its place in the incumbent, when admitted there.
    pub incumbent: Option<Placement>,
    /// Admitted by the incumbent within its tenant's guarantee: an entitlement, which stays
    /// admitted with at least as many replicas (the objective alone would trade a guarantee
    /// away for the lost work of the borrower it reclaims from).
    pub entitled: bool,
}

/// A running workload the sub-problem may preempt.
#[derive(Debug, Clone)]
pub struct Victim {
    pub workload: usize,
    pub placement: Placement,
    pub preempted: bool,
}

/// What a window node has for the sub-problem's workloads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Room {
    pub gpus: u32,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct Window {
    pub pool: usize,
    /// Healthy nodes, by index.
    pub nodes: Vec<usize>,
    pub gangs: Vec<Gang>,
    pub victims: Vec<Victim>,
    /// Per window node: room once every gang and victim of the window is gone.
    pub room: BTreeMap<usize, Room>,
    /// Usage in the pool of everything that stays as it is.
    pub fixed: Ledger,
}

/// Why a pool has no sub-problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoWindow {
    #[error(
        "`{0}` sharing: MIG instances and shares are placed per GPU, which the integer program does not model yet"
    )]
    Sharing(&'static str),
    #[error("no gang waits for this pool or was admitted to it")]
    NothingWaits,
    #[error("no node of the pool could make room")]
    NoRoom,
}

/// Whether a running workload may be preempted at all (class and minRuntime).
pub fn preemptible(p: &Problem, w: usize) -> bool {
    let wl = &p.workloads[w];
    let class = &p.classes[wl.class];
    match wl.phase {
        Phase::Running { started_at, .. } => {
            class.preemptible && (p.now - started_at).max(0) as u64 >= class.min_runtime_seconds
        }
        Phase::Pending { .. } => false,
    }
}

pub fn build(
    p: &Problem,
    states: &[State],
    keep: &KeepPhase,
    pool: usize,
    caps: Caps,
) -> Result<Window, NoWindow> {
    let info = &p.pools[pool];
    if info.sharing != Sharing::Exclusive {
        return Err(NoWindow::Sharing(info.sharing.as_str()));
    }
    // A CPU-only workload (no GPU) is worth nothing to the objective, which counts GPUs: in
    // the window it could be dropped or stopped at no cost. It stays as the heuristic placed
    // it, its CPU and memory taken off the window's room.
    let whole = |w: usize| matches!(p.workloads[w].demand, Demand::Whole { count } if count > 0);
    let mut waiting: Vec<usize> = (0..p.workloads.len())
        .filter(|&w| {
            matches!(states[w], State::Pending)
                && !p.workloads[w].is_running()
                && p.workloads[w].pools.contains(&pool)
                && whole(w)
        })
        .collect();
    let admitted_here =
        |w: usize| matches!(&states[w], State::Admitted(pl, _) if pl.pool == pool) && whole(w);
    if waiting.is_empty() && !(0..states.len()).any(admitted_here) {
        return Err(NoWindow::NothingWaits);
    }
    let value = |w: usize| {
        let wl = &p.workloads[w];
        p.classes[wl.class].priority * wl.amount(wl.min_member).gpus.units()
    };
    waiting.sort_by_cached_key(|&w| {
        let wl = &p.workloads[w];
        (
            -p.classes[wl.class].priority,
            -value(w),
            wl.key.name.clone(),
        )
    });
    waiting.truncate(caps.gangs);

    // What each node could give: free healthy GPUs plus those held by work the window may move.
    let movable = |w: usize| {
        whole(w)
            && match &states[w] {
                State::Admitted(pl, _) => pl.pool == pool,
                State::Kept(pl) => pl.pool == pool && keep.kept[w] && preemptible(p, w),
                State::Preempted => {
                    keep.kept[w] && preemptible(p, w) && p.workloads[w].pools[0] == pool
                }
                State::Pending => false,
            }
    };
    // By node index: a pool's running work is tens of thousands of placements.
    let mut held = vec![0u32; p.nodes.len()];
    let mut reclaimable = vec![0u32; p.nodes.len()];
    for (w, st) in states.iter().enumerate() {
        if let Some(pl) = st.placement().filter(|pl| pl.pool == pool) {
            for (&n, h) in &pl.nodes {
                held[n] += h.healthy_gpus;
                if movable(w) {
                    reclaimable[n] += h.healthy_gpus;
                }
            }
        }
    }
    // A node that cannot give one replica of the smallest gang is no use to the window.
    let mut in_window = vec![false; states.len()];
    for &w in &waiting {
        in_window[w] = true;
    }
    let smallest = (0..states.len())
        .filter(|&w| in_window[w] || admitted_here(w))
        .filter_map(|w| match p.workloads[w].demand {
            Demand::Whole { count } => Some(count),
            _ => None,
        })
        .min()
        .unwrap_or(1);
    let mut domains: BTreeMap<&str, (u32, Vec<usize>)> = BTreeMap::new();
    for &n in &info.nodes {
        let node = &p.nodes[n];
        if !node.healthy {
            continue;
        }
        let healthy = node.gpus.iter().filter(|&&g| p.gpus[g].healthy).count() as u32;
        let gain = healthy.saturating_sub(held[n]) + reclaimable[n];
        if gain < smallest.max(1) {
            continue;
        }
        let e = domains.entry(node.domain.as_str()).or_default();
        e.0 += gain;
        e.1.push(n);
    }
    let mut order: Vec<(&str, (u32, Vec<usize>))> = domains.into_iter().collect();
    order.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(b.0)));
    let mut nodes: Vec<usize> = Vec::new();
    for (_, (_, members)) in order {
        if !nodes.is_empty() && nodes.len() + members.len() > caps.nodes {
            continue;
        }
        nodes.extend(members.into_iter().take(caps.nodes));
    }
    if nodes.is_empty() {
        return Err(NoWindow::NoRoom);
    }
    nodes.sort_unstable();
    let inside: BTreeSet<usize> = nodes.iter().copied().collect();
    let within = |pl: &Placement| pl.nodes.keys().all(|n| inside.contains(n));

    let mut gangs: Vec<Gang> = waiting
        .into_iter()
        .map(|w| Gang {
            workload: w,
            incumbent: None,
            entitled: false,
        })
        .collect();
    let mut victims = Vec::new();
    for (w, st) in states.iter().enumerate() {
        match st {
            State::Admitted(pl, guaranteed) if admitted_here(w) && within(pl) => gangs.push(Gang {
                workload: w,
                incumbent: Some(pl.clone()),
                entitled: *guaranteed,
            }),
            State::Kept(pl) if movable(w) && within(pl) => victims.push(Victim {
                workload: w,
                placement: pl.clone(),
                preempted: false,
            }),
            State::Preempted if movable(w) => {
                if let Some(pl) = running_placement(p, w).filter(&within) {
                    victims.push(Victim {
                        workload: w,
                        placement: pl,
                        preempted: true,
                    });
                }
            }
            _ => {}
        }
    }
    victims.extend(quota_victims(p, states, pool, &gangs, &victims, &movable));
    let variable: BTreeSet<usize> = gangs
        .iter()
        .map(|g| g.workload)
        .chain(victims.iter().map(|v| v.workload))
        .collect();

    let mut room: BTreeMap<usize, Room> = BTreeMap::new();
    for &n in &nodes {
        let node = &p.nodes[n];
        room.insert(
            n,
            Room {
                gpus: node.gpus.iter().filter(|&&g| p.gpus[g].healthy).count() as u32,
                cpu_millis: node.cpu.0,
                memory_bytes: node.memory.0,
            },
        );
    }
    let mut fixed = Ledger::new(p);
    for (w, st) in states.iter().enumerate() {
        let Some(pl) = st.placement() else { continue };
        if pl.pool != pool || variable.contains(&w) {
            continue;
        }
        let wl = &p.workloads[w];
        let replicas: u32 = pl.nodes.values().map(|h| h.replicas).sum();
        fixed.add(p, wl.tenant, pool, wl.amount(replicas));
        for (n, h) in &pl.nodes {
            if let Some(r) = room.get_mut(n) {
                r.gpus = r.gpus.saturating_sub(h.healthy_gpus);
                r.cpu_millis = r
                    .cpu_millis
                    .saturating_sub(wl.cpu.0 * u64::from(h.replicas));
                r.memory_bytes = r
                    .memory_bytes
                    .saturating_sub(wl.memory.0 * u64::from(h.replicas));
            }
        }
    }
    Ok(Window {
        pool,
        nodes,
        gangs,
        victims,
        room,
        fixed,
    })
}

/// At most this many running workloads outside the window's nodes enter it for their quota.
const QUOTA_VICTIMS: usize = 12;

/// Running work elsewhere in the pool that a gang of the window may need stopped, not for
/// its room but for quota: work of a tenant under a level whose limit the whole gang would
/// pass with everything else as the incumbent has it (work it preempted counted back), or
/// of the gang's own tenant where the whole gang would borrow. Such work enters the window as a
/// victim whose room the window does not use (its nodes are outside, or only partly inside).
/// Without it, a gang blocked by its own tenant's limit and by room at once looks impossible
/// to the program, and a preemption the incumbent made for a limit looks fixed. The work the
/// incumbent preempted comes first (so that the program may undo it), then the cheapest.
fn quota_victims(
    p: &Problem,
    states: &[State],
    pool: usize,
    gangs: &[Gang],
    inside: &[Victim],
    movable: &dyn Fn(usize) -> bool,
) -> Vec<Victim> {
    // What the window may bring back counts too: work the incumbent preempted for a limit.
    let mut usage = Ledger::new(p);
    for (w, st) in states.iter().enumerate() {
        let wl = &p.workloads[w];
        let replicas = match st {
            State::Preempted if wl.pools.first() == Some(&pool) => wl.replicas,
            _ => match st.placement().filter(|pl| pl.pool == pool) {
                Some(pl) => pl.nodes.values().map(|h| h.replicas).sum(),
                None => continue,
            },
        };
        usage.add(p, wl.tenant, pool, wl.amount(replicas));
    }
    let mut tight: BTreeSet<usize> = BTreeSet::new();
    for g in gangs {
        let wl = &p.workloads[g.workload];
        let own = g.incumbent.as_ref().map_or(Amounts::default(), |pl| {
            wl.amount(pl.nodes.values().map(|h| h.replicas).sum())
        });
        // All its replicas: a limit that holds an elastic gang at fewer is tight too.
        let need = wl.amount(wl.replicas);
        for &t in &p.tenants[wl.tenant].lineage {
            let Some(q) = p.tenants[t].quota.get(&pool) else {
                continue;
            };
            let used = usage.usage(t, pool);
            let over = |used: u64, own: u64, need: u64, limit: u64| {
                used.saturating_sub(own).saturating_add(need) > limit
            };
            let cpu = |a: Amounts| a.cpu.unwrap_or_default().0;
            let memory = |a: Amounts| a.memory.unwrap_or_default().0;
            let gpus_over = used.gpus - own.gpus + need.gpus > q.limit.gpus;
            let cpu_over = q
                .limit
                .cpu
                .is_some_and(|l| over(cpu(used), cpu(own), cpu(need), l.0));
            let memory_over = q
                .limit
                .memory
                .is_some_and(|l| over(memory(used), memory(own), memory(need), l.0));
            // At the gang's own tenant, borrowing is tight too: what it borrows must leave
            // other tenants' idle guarantees free, and its own work can make way.
            let borrows = t == wl.tenant && used.gpus - own.gpus + need.gpus > q.guarantee.gpus;
            if gpus_over || cpu_over || memory_over || borrows {
                tight.insert(t);
            }
        }
    }
    if tight.is_empty() {
        return Vec::new();
    }
    let taken: BTreeSet<usize> = inside.iter().map(|v| v.workload).collect();
    let mut out: Vec<Victim> = states
        .iter()
        .enumerate()
        .filter(|&(w, _)| {
            !taken.contains(&w)
                && movable(w)
                && p.tenants[p.workloads[w].tenant]
                    .lineage
                    .iter()
                    .any(|t| tight.contains(t))
        })
        .filter_map(|(w, st)| match st {
            State::Kept(pl) => Some(Victim {
                workload: w,
                placement: pl.clone(),
                preempted: false,
            }),
            State::Preempted => running_placement(p, w).map(|pl| Victim {
                workload: w,
                placement: pl,
                preempted: true,
            }),
            _ => None,
        })
        .collect();
    out.sort_by_cached_key(|v| {
        let wl = &p.workloads[v.workload];
        (
            !v.preempted,
            p.classes[wl.class].priority,
            lost_units_seconds(p, v.workload),
            wl.key.clone(),
        )
    });
    out.truncate(QUOTA_VICTIMS);
    out
}

/// Where a running workload ran, from the snapshot.
pub fn running_placement(p: &Problem, w: usize) -> Option<Placement> {
    Placement::running(p, &p.workloads[w])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ilp::incumbent;
    use tessera_compiler::{SourceFile, compile};

    const POLICY: &str = r#"
apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {name: tiers}
spec:
  tiers:
    - {name: high, value: 1000}
    - {name: low, value: 10}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: urgent}
spec: {tier: high, preemptible: false, isolation: {minimum: exclusive}}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {name: batch}
spec: {tier: low, preemptible: true, isolation: {minimum: exclusive}}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: train}
spec:
  gpuModel: H100-SXM5-80GB
  sharing: exclusive
  capacity: {nodes: 2, gpusPerNode: 4, cpuPerNode: 16, memoryPerNode: 1Ti}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {name: a}
spec:
  guarantee: {train: 4}
  sloClasses: [urgent, batch]
---
"#;

    fn node(name: &str) -> String {
        let mut s = format!(
            "    - name: {name}\n      pool: train\n      cpu: 16\n      memory: 1Ti\n      gpus:\n"
        );
        for i in 0..4 {
            s += &format!(
                "        - {{index: {i}, uuid: GPU-{}{i:07x}-0000-0000-0000-000000000000, model: H100-SXM5-80GB}}\n",
                &name[1..]
            );
        }
        s
    }

    fn work(name: &str, class: &str, gpus: u32, cpu: u32, bindings: Option<&str>) -> String {
        let spec = format!("{{tenant: a, sloClass: {class}, gpu: {{count: {gpus}}}, cpu: {cpu}}}");
        match bindings {
            Some(b) => format!(
                "    - name: {name}\n      spec: {spec}\n      bindings: [{b}]\n      startedAt: \"2026-11-20T06:00:00Z\"\n"
            ),
            None => format!(
                "    - name: {name}\n      spec: {spec}\n      submittedAt: \"2026-11-20T07:00:00Z\"\n"
            ),
        }
    }

    /// A CPU-only workload is worth nothing to the objective, which counts GPUs: the window
    /// takes none, running, admitted or waiting, while the GPU work beside it is taken.
    #[test]
    fn the_window_takes_no_cpu_only_workload() {
        // `big` (4 GPUs, high tier) takes `n1`; `gpu-run`, preemptible, runs on `n0`, and
        // `cpu-run`, preemptible too, beside `big`; `cpu-new` fits as it is; `cpu-wait` (16
        // cores) fits on no node that the others leave.
        let running = work("gpu-run", "batch", 1, 2, Some("{node: n0, gpus: [0]}"))
            + &work("cpu-run", "batch", 0, 4, Some("{node: n1, gpus: []}"));
        let pending = work("big", "urgent", 4, 2, None)
            + &work("cpu-new", "batch", 0, 2, None)
            + &work("cpu-wait", "batch", 0, 16, None);
        let state = format!(
            "apiVersion: tessera/v1alpha1\nkind: ClusterState\nmetadata: {{name: snap}}\nspec:\n  observedAt: \"2026-11-20T08:00:00Z\"\n  nodes:\n{}{}  running:\n{running}  pending:\n{pending}",
            node("n0"),
            node("n1")
        );
        let c = compile(&[SourceFile::new("p.yaml", format!("{POLICY}{state}"))]);
        assert_eq!(c.errors(), 0, "{:#?}", c.diagnostics);
        let p = Problem::new(c.policy.as_ref().unwrap(), &c.states[0].1, None).unwrap();
        let (d, keep) = crate::heuristic::solve_keeping(&p);
        let states = incumbent::read(&p, &d);
        let w = |name: &str| p.workloads.iter().position(|x| x.key.name == name).unwrap();
        let cpu_only = ["cpu-run", "cpu-new", "cpu-wait"].map(w);
        // Each CPU-only workload is in the state each case is about.
        assert!(
            matches!(states[cpu_only[0]], State::Kept(_)),
            "{:?}",
            states[cpu_only[0]]
        );
        assert!(
            matches!(states[cpu_only[1]], State::Admitted(..)),
            "{:?}",
            states[cpu_only[1]]
        );
        assert!(
            matches!(states[cpu_only[2]], State::Pending),
            "{:?}",
            states[cpu_only[2]]
        );
        let caps = Caps {
            gangs: 16,
            nodes: 8,
        };
        let win = build(&p, &states, &keep, 0, caps).expect("a window");
        let taken: Vec<usize> = win
            .gangs
            .iter()
            .map(|g| g.workload)
            .chain(win.victims.iter().map(|v| v.workload))
            .collect();
        assert!(taken.contains(&w("big")), "{taken:?}");
        assert!(taken.contains(&w("gpu-run")), "{taken:?}");
        for c in cpu_only {
            assert!(
                !taken.contains(&c),
                "{} is in the window",
                p.workloads[c].key
            );
        }
    }
}
