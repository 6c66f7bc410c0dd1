//! Fair share over time: each tenant's usage, decayed continuously with its half-life.
//!
//! The reconciler calls [`accrue`] once per cycle and keeps the result; it travels in
//! `ClusterState.usage`, so a plan in CI weighs the same history as the service. A tenant's
//! figures include its descendants', decayed with the tenant's own half-life (a subtree may
//! set its own).
//!
//! Between two observations the running set is taken as constant (the one observed at the end
//! of the interval), which makes the integral exact for that set:
//! `U(t + Δ) = U(t)·2^(−Δ/h) + r·(h/ln 2)·(1 − 2^(−Δ/h))`, with `r` the rate in units per hour.
//!
//! What fair share weighs is the *borrowed* part of usage: in each pool, what a tenant used
//! above its guarantee (GPUs always; CPU and memory where the guarantee names them, as the
//! current-usage share does). Using one's guarantee costs nothing later.
//!
//! The cycle weighs the record once, when the problem is built: each tenant's [`history_share`]
//! `h` joins its current borrowed share `s` in the borrowers' order, `(s + h) / weight` (see
//! `quota.rs`). The decision reports it ([`report`]) with the share of borrowable capacity that
//! order leads to among siblings: the water-filling `s_i = max(0, w_i·K − h_i)` with `K` such that
//! the shares of a family sum to 1. It is the point where every sibling that gets anything has
//! the same `(s_i + h_i) / w_i`, which is what the order converges to when all of them want more
//! than they get: a sibling whose history alone exceeds `w_i·K` gets nothing until it decays.
//! Without history the shares are the weights' proportions. Roots are siblings of one another,
//! so a single root gets 1.
//!
//! The history is a fraction of the whole fleet's capacity over the decay horizon (`h / ln 2`),
//! while the current share is of the pool: the two agree for a one-pool fleet and keep their
//! meaning (a steady tenth borrowed reads 0.1) elsewhere. It is computed at the tenant's own
//! level only, as the current share is; siblings compare their subtrees' figures.
//!
//! The integer program's refinement (`ilp/`) values priority × GPUs placed and replaces the
//! heuristic's decision only when strictly better: it may trade the fair order for more work
//! placed, as it already could with the current share alone, and never on a tie; its replay
//! leaves every gang it does not choose to the queue, which uses the same fair order.

use std::collections::BTreeMap;

use tessera_compiler::compiled::CompiledFairShare;
use tessera_compiler::model::{TenantUsageRecord, UsageHours, UsageRecord};

use crate::decision::{FairShareReport, TenantShare};
use crate::problem::{Phase, Problem, unix};

const GIB: f64 = (1u64 << 30) as f64;

/// Usage rates of one tenant, per hour of wall clock: GPUs (weighted), cores, GiB.
#[derive(Debug, Clone, Copy, Default)]
struct Rates {
    used: [f64; 3],
    borrowed: [f64; 3],
}

/// The usage record of `p.now`: `previous` decayed from its `asOf`, plus what the running
/// workloads of `p` used since. Tenants without a fair-share setting are left out; a previous
/// record that is missing or unreadable starts the clock at `p.now`. A record later than
/// `p.now` (a clock stepped back, a plan run for an earlier instant) is kept as it is, neither
/// decayed nor added to, and keeps its `asOf`, so that no interval is counted twice.
pub fn accrue(p: &Problem, previous: Option<&UsageRecord>) -> UsageRecord {
    let since = previous.map(|r| r.as_of.as_second());
    let elapsed = since.map_or(0, |t| (p.now - t).max(0)) as f64;
    let as_of = since.map_or(p.now, |t| t.max(p.now));
    let rates = rates(p);
    let mut tenants = BTreeMap::new();
    for (t, info) in p.tenants.iter().enumerate() {
        let Some(fs) = &info.fair_share else {
            continue;
        };
        let before = since
            .and(previous)
            .and_then(|r| r.tenants.get(&info.name))
            .copied()
            .unwrap_or_default();
        let half_life = fs.usage_half_life_seconds.max(1) as f64;
        let decay = (-elapsed / half_life).exp2();
        // Hours of accrual per unit rate over the interval, decay included.
        let gain = half_life / std::f64::consts::LN_2 * (1.0 - decay) / 3600.0;
        let mask = [fs.gpu, fs.cpu, fs.memory];
        let advance = |old: UsageHours, rate: [f64; 3]| {
            let v = |i: usize, o: f64| {
                if mask[i] {
                    o * decay + rate[i] * gain
                } else {
                    0.0
                }
            };
            UsageHours {
                gpu_hours: v(0, old.gpu_hours),
                cpu_hours: v(1, old.cpu_hours),
                memory_gib_hours: v(2, old.memory_gib_hours),
            }
        };
        let r = rates[t];
        tenants.insert(
            info.name.clone(),
            TenantUsageRecord {
                used: advance(before.used, r.used),
                borrowed: advance(before.borrowed, r.borrowed),
            },
        );
    }
    UsageRecord {
        as_of: unix(as_of),
        tenants,
    }
}

/// Per tenant (descendants included): what its running work uses now, and the part above its
/// guarantee, pool by pool. GPUs are weighted by each tenant's own model weights.
fn rates(p: &Problem) -> Vec<Rates> {
    // usage[t][pool] = (GPUs, cores, GiB), descendants included.
    let mut usage: Vec<BTreeMap<usize, [f64; 3]>> = vec![BTreeMap::new(); p.tenants.len()];
    for wl in &p.workloads {
        let Phase::Running { .. } = wl.phase else {
            continue;
        };
        let Some(&pool) = wl.pools.first() else {
            continue;
        };
        let a = wl.amount(wl.replicas);
        let amount = [
            a.gpus.as_f64(),
            a.cpu.unwrap_or_default().0 as f64 / 1000.0,
            a.memory.unwrap_or_default().0 as f64 / GIB,
        ];
        for &t in &p.tenants[wl.tenant].lineage {
            let u = usage[t].entry(pool).or_default();
            for i in 0..3 {
                u[i] += amount[i];
            }
        }
    }
    p.tenants
        .iter()
        .zip(&usage)
        .map(|(info, pools)| {
            let mut r = Rates::default();
            let Some(fs) = &info.fair_share else {
                return r;
            };
            for (&pool, u) in pools {
                let weight = fs.gpu_weight(&p.pools[pool].gpu_model);
                let q = info.quota.get(&pool);
                let guarantee = [
                    q.map_or(0.0, |q| q.guarantee.gpus.as_f64()),
                    q.and_then(|q| q.guarantee.cpu)
                        .map_or(f64::INFINITY, |c| c.0 as f64 / 1000.0),
                    q.and_then(|q| q.guarantee.memory)
                        .map_or(f64::INFINITY, |m| m.0 as f64 / GIB),
                ];
                for i in 0..3 {
                    let w = if i == 0 { weight } else { 1.0 };
                    r.used[i] += u[i] * w;
                    r.borrowed[i] += (u[i] - guarantee[i]).max(0.0) * w;
                }
            }
            r
        })
        .collect()
}

/// The snapshot's nodes: GPUs per pool (the last entry for nodes outside any pool), cores and
/// GiB. Counted once per cycle; each tenant weighs the GPUs with its own model weights.
struct Fleet {
    gpus: Vec<f64>,
    cores: f64,
    gib: f64,
}

impl Fleet {
    fn of(p: &Problem) -> Fleet {
        let mut f = Fleet {
            gpus: vec![0.0; p.pools.len() + 1],
            cores: 0.0,
            gib: 0.0,
        };
        for n in &p.nodes {
            f.gpus[n.pool.unwrap_or(p.pools.len())] += n.gpus.len() as f64;
            f.cores += n.cpu.0 as f64 / 1000.0;
            f.gib += n.memory.0 as f64 / GIB;
        }
        f
    }

    /// Capacity per hour in the units of usage under `fs`: weighted GPUs, cores, GiB.
    fn capacity(&self, p: &Problem, fs: &CompiledFairShare) -> [f64; 3] {
        let gpus = self
            .gpus
            .iter()
            .enumerate()
            .map(|(pool, &n)| {
                n * p
                    .pools
                    .get(pool)
                    .map_or(1.0, |x| fs.gpu_weight(&x.gpu_model))
            })
            .sum();
        [gpus, self.cores, self.gib]
    }
}

/// Every tenant's [`history_share`], pre-order, counting the fleet once.
pub fn history_shares(p: &Problem, usage: Option<&UsageRecord>) -> Vec<f64> {
    let fleet = Fleet::of(p);
    (0..p.tenants.len())
        .map(|t| share_of_history(p, t, usage, &fleet))
        .collect()
}

/// `t`'s decayed dominant borrowed share: for each counted resource, its borrowed hours over
/// what the whole fleet would have accrued under the same decay (capacity × h / ln 2), the
/// largest of them. A tenant that borrowed a steady tenth of the fleet's GPUs converges to 0.1.
pub fn history_share(p: &Problem, t: usize, usage: Option<&UsageRecord>) -> f64 {
    share_of_history(p, t, usage, &Fleet::of(p))
}

fn share_of_history(p: &Problem, t: usize, usage: Option<&UsageRecord>, fleet: &Fleet) -> f64 {
    let info = &p.tenants[t];
    let (Some(fs), Some(rec)) = (
        &info.fair_share,
        usage.and_then(|u| u.tenants.get(&info.name)),
    ) else {
        return 0.0;
    };
    let horizon = fs.usage_half_life_seconds.max(1) as f64 / std::f64::consts::LN_2 / 3600.0;
    let cap = fleet.capacity(p, fs);
    let b = rec.borrowed;
    [
        (fs.gpu, b.gpu_hours, cap[0]),
        (fs.cpu, b.cpu_hours, cap[1]),
        (fs.memory, b.memory_gib_hours, cap[2]),
    ]
    .into_iter()
    .filter(|&(on, _, c)| on && c > 0.0)
    .map(|(_, h, c)| h / (c * horizon))
    .fold(0.0, f64::max)
}

/// The decision's fair-share report: the record as of `now` and every tenant with a setting,
/// pre-order. `None` when no tenant sets fair share.
pub fn report(p: &Problem) -> Option<FairShareReport> {
    let record = p.usage.as_ref()?;
    let shares = sibling_shares(p);
    let tenants = p
        .tenants
        .iter()
        .enumerate()
        .filter(|(_, t)| t.fair_share.is_some())
        .map(|(i, t)| TenantShare {
            tenant: t.name.clone(),
            weight: t.weight,
            history: round(t.history),
            share: round(shares[i]),
        })
        .collect();
    let hours = |u: UsageHours| UsageHours {
        gpu_hours: round(u.gpu_hours),
        cpu_hours: round(u.cpu_hours),
        memory_gib_hours: round(u.memory_gib_hours),
    };
    Some(FairShareReport {
        record: UsageRecord {
            as_of: record.as_of,
            tenants: record
                .tenants
                .iter()
                .map(|(name, r)| {
                    (
                        name.clone(),
                        TenantUsageRecord {
                            used: hours(r.used),
                            borrowed: hours(r.borrowed),
                        },
                    )
                })
                .collect(),
        },
        tenants,
    })
}

/// Six decimals, as the decision's other figures.
fn round(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Each tenant's share of borrowable capacity among its siblings, after history.
fn sibling_shares(p: &Problem) -> Vec<f64> {
    let mut families: BTreeMap<Option<usize>, Vec<usize>> = BTreeMap::new();
    for (i, t) in p.tenants.iter().enumerate() {
        families.entry(t.parent).or_default().push(i);
    }
    let mut out = vec![0.0; p.tenants.len()];
    for members in families.values() {
        let wh: Vec<(f64, f64)> = members
            .iter()
            .map(|&i| (p.tenants[i].weight, p.tenants[i].history))
            .collect();
        for (&i, s) in members.iter().zip(water_fill(&wh)) {
            out[i] = s;
        }
    }
    out
}

/// `s_i = max(0, w_i·K − h_i)` with `Σ s_i = 1`, for `(w_i, h_i)` with `w_i > 0`.
///
/// Siblings enter in order of `h_i / w_i` (the level of `K` at which each starts to get
/// something); with the first `k` in, `K = (1 + Σ h) / Σ w`, valid once it does not reach the
/// next one's threshold.
pub fn water_fill(wh: &[(f64, f64)]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..wh.len()).collect();
    let threshold = |i: usize| wh[i].1 / wh[i].0;
    order.sort_by(|&a, &b| threshold(a).total_cmp(&threshold(b)).then(a.cmp(&b)));
    let (mut w, mut h) = (0.0, 0.0);
    let mut level = 0.0;
    for (k, &i) in order.iter().enumerate() {
        w += wh[i].0;
        h += wh[i].1;
        level = (1.0 + h) / w;
        if order
            .get(k + 1)
            .is_none_or(|&next| level <= threshold(next))
        {
            break;
        }
    }
    wh.iter()
        .map(|&(wi, hi)| (wi * level - hi).max(0.0))
        .collect()
}
