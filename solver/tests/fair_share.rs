//! Fair share over time, driven through the solver over many cycles with a deterministic clock
//! (`common::cycles`): a 12-GPU pool, 15-minute cycles, 1-GPU jobs of varied durations, tenants
//! that keep the queue flooded. Kept small so that the file runs in seconds in debug builds.

mod common;

use common::cycles::Cycles;
use common::{compile_with, node, pending, state};
use tessera_compiler::model::{PendingWorkload, TenantUsageRecord, UsageHours, UsageRecord};
use tessera_compiler::units::Gpus;
use tessera_solver::decision::{Decision, Outcome};
use tessera_solver::fairshare::{accrue, history_share, water_fill};
use tessera_solver::problem::{Problem, unix};

const CYCLE: i64 = 15 * 60;
const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;
const GPUS: usize = 12;

/// One pool of 2 × 6 GPUs; `org` sets fair share for the tree; `a` and `b` under it.
fn policy(half_life: &str, weight_a: u32, weight_b: u32, guarantee_a: u32) -> String {
    let fair = if half_life.is_empty() {
        String::new()
    } else {
        format!(", fairShare: {{usageHalfLife: {half_life}, resources: [gpu]}}")
    };
    format!(
        r#"
apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {{name: tiers}}
spec: {{tiers: [{{name: low, value: 100}}]}}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {{name: batch}}
spec: {{tier: low, preemptible: true, isolation: {{minimum: exclusive}}}}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {{name: p}}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {{nodes: 2, gpusPerNode: 6, cpuPerNode: 192, memoryPerNode: 2Ti}}
  sharing: exclusive
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: org}}
spec: {{guarantee: {{p: 12}}, sloClasses: [batch]{fair}}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: a}}
spec: {{parent: org, guarantee: {{p: {guarantee_a}}}, weight: {weight_a}}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: b}}
spec: {{parent: org, guarantee: {{p: 0}}, weight: {weight_b}}}
"#
    )
}

fn job(tenant: &str) -> String {
    format!("{{tenant: {tenant}, sloClass: batch, replicas: 1, gpu: {{count: 1}}}}")
}

/// Compiles the fleet with one template job per tenant, taken out of the queue.
fn fleet(policy_yaml: &str) -> (Cycles, [PendingWorkload; 2]) {
    let nodes = [node("n0", "p", 6), node("n1", "p", 6)];
    let queued = [
        pending("tpl-a", &job("a"), "2026-11-20T08:00:00Z"),
        pending("tpl-b", &job("b"), "2026-11-20T08:00:00Z"),
    ]
    .concat();
    let (policy, mut st) = compile_with(policy_yaml, &state(&nodes, "", &queued));
    let b = st.pending.pop().expect("tpl-b");
    let a = st.pending.pop().expect("tpl-a");
    (Cycles::new(policy, st), [a, b])
}

/// Keeps each tenant in `flooding` with at least a fleet's worth of jobs waiting; durations run
/// deterministically through 30 to 180 minutes.
struct Flood {
    templates: [PendingWorkload; 2],
    next: usize,
}

impl Flood {
    fn top_up(&mut self, c: &mut Cycles, flooding: &[usize]) {
        for &t in flooding {
            let tenant = self.templates[t].spec.tenant.clone();
            let waiting = c
                .state
                .pending
                .iter()
                .filter(|w| w.spec.tenant == tenant)
                .count();
            for _ in waiting..GPUS {
                let mut w = self.templates[t].clone();
                w.name = format!("{tenant}-{:06}", self.next);
                let minutes = 30 + (self.next as i64 * 37) % 151;
                self.next += 1;
                c.submit(w, Some(minutes * 60));
            }
        }
    }

    /// Cycles for `seconds`, returning the GPU-hours each tenant ran meanwhile.
    fn run(&mut self, c: &mut Cycles, flooding: &[usize], seconds: i64) -> [f64; 2] {
        let before = ran(c);
        for _ in 0..seconds / CYCLE {
            self.top_up(c, flooding);
            c.cycle();
            c.advance(CYCLE);
        }
        let after = ran(c);
        [after[0] - before[0], after[1] - before[1]]
    }
}

fn ran(c: &Cycles) -> [f64; 2] {
    let h = |t: &str| c.gpu_seconds.get(t).copied().unwrap_or(0.0) / 3600.0;
    [h("a"), h("b")]
}

fn share_of(d: &Decision, tenant: &str) -> (f64, f64) {
    let r = d.fair_share.as_ref().expect("fair share is reported");
    let t = r
        .tenants
        .iter()
        .find(|t| t.tenant == tenant)
        .expect("tenant");
    (t.history, t.share)
}

#[test]
fn weights_two_to_one_borrow_two_to_one_over_a_week() {
    let (mut c, templates) = fleet(&policy("24h", 2, 1, 0));
    let mut flood = Flood { templates, next: 0 };
    let [a, b] = flood.run(&mut c, &[0, 1], 7 * DAY);
    let ratio = a / b;
    eprintln!("week: a {a:.1} GPU-hours, b {b:.1}, ratio {ratio:.4}");
    assert!((ratio - 2.0).abs() / 2.0 < 0.05, "ratio {ratio}");
    // Nothing idles while both want more (up to a cycle of lag per job end).
    assert!(a + b > 0.9 * (GPUS as f64) * 7.0 * 24.0, "{a} + {b}");
    // Steady state: the histories settle at the shares, and so do the reported shares.
    let d = c.decisions.last().expect("decided");
    let (ha, sa) = share_of(d, "a");
    let (hb, sb) = share_of(d, "b");
    assert!((ha / hb - 2.0).abs() < 0.2, "history {ha} / {hb}");
    assert!(
        (sa - 2.0 / 3.0).abs() < 0.05 && (sb - 1.0 / 3.0).abs() < 0.05,
        "{sa} {sb}"
    );
    assert_eq!(share_of(d, "org").1, 1.0);
}

/// a's share of what both ran in each window of `hours` over the day after its burst.
fn day_after_burst(half_life: &str, hours: i64) -> Vec<f64> {
    let (mut c, templates) = fleet(&policy(half_life, 1, 1, 0));
    let mut flood = Flood { templates, next: 0 };
    let [burst, none] = flood.run(&mut c, &[0], DAY);
    assert_eq!(none, 0.0);
    assert!(burst > 0.9 * GPUS as f64 * 24.0, "{burst}");
    (0..24 / hours)
        .map(|_| {
            let [a, b] = flood.run(&mut c, &[0, 1], hours * HOUR);
            a / (a + b)
        })
        .collect()
}

#[test]
fn a_burst_yesterday_lowers_the_share_today_and_fades_with_the_half_life() {
    let with = day_after_burst("6h", 3);
    let without = day_after_burst("", 3);
    eprintln!("a's share per 3 h, half-life 6 h: {with:.3?}");
    eprintln!("a's share per 3 h, no history:    {without:.3?}");
    // Without history only the current share counts: a is back to half within hours (the
    // first window still holds yesterday's jobs running out).
    assert!(
        without[1..].iter().all(|s| (s - 0.5).abs() < 0.06),
        "{without:?}"
    );
    // With it, a yields: in the first hours after yesterday's jobs end, far below half ...
    // (theory: ½ − share = (h_a − h_b)/2, which starts near 0.47 and halves every 3 h).
    assert!(with[1] < 0.35, "{with:?}");
    assert!(with[1] < without[1] - 0.15, "{with:?} vs {without:?}");
    // ... recovering as the history fades: the deficit (½ − share) at least halves every
    // half-life (in theory it halves every half a half-life: both histories move toward each
    // other), and the day ends even.
    let deficit = |s: f64| 0.5 - s;
    assert!(deficit(with[3]) < deficit(with[1]) / 2.0, "{with:?}");
    assert!(deficit(with[5]) < deficit(with[3]) / 2.0 + 0.02, "{with:?}");
    assert!((with[7] - 0.5).abs() < 0.05, "{with:?}");
    // A longer half-life keeps the burst against a for longer.
    let slow = day_after_burst("24h", 3);
    eprintln!("a's share per 3 h, half-life 24 h: {slow:.3?}");
    assert!(slow[3] < with[3] - 0.05, "{slow:?} vs {with:?}");
}

#[test]
fn heavy_history_leaves_the_guarantee_alone() {
    let (mut c, templates) = fleet(&policy("24h", 1, 1, 4));
    // a borrowed the whole fleet for days; b has no history and floods the pool.
    c.state.usage = Some(UsageRecord {
        as_of: c.state.observed_at,
        tenants: [("a", 400.0), ("org", 400.0)]
            .into_iter()
            .map(|(t, h)| {
                let u = UsageHours {
                    gpu_hours: h,
                    ..UsageHours::default()
                };
                (
                    t.to_owned(),
                    TenantUsageRecord {
                        used: u,
                        borrowed: u,
                    },
                )
            })
            .collect(),
    });
    let mut flood = Flood { templates, next: 0 };
    flood.run(&mut c, &[1], 2 * HOUR);
    assert_eq!(c.state.running.len(), GPUS);
    assert!(c.state.running.iter().all(|r| r.spec.tenant == "b"));
    let (history, share) = share_of(c.decisions.last().expect("decided"), "a");
    assert!(history > 0.9, "{history}");
    // Of idle capacity a would get only what b's young history leaves: K = (1 + h_a + h_b) / 2.
    assert!(share < 0.1, "{share}");
    // a asks for its guarantee and one more: the four within it are admitted at once,
    // reclaiming from b; the fifth borrows and waits behind b.
    for i in 0..5 {
        let mut w = flood.templates[0].clone();
        w.name = format!("mine-{i}");
        c.submit(w, None);
    }
    let d = c.cycle().clone();
    for i in 0..5 {
        let o = &d
            .workloads
            .iter()
            .find(|w| w.name == format!("mine-{i}"))
            .unwrap()
            .outcome;
        match (i, o) {
            (0..4, Outcome::Admit { borrowed, .. }) => assert_eq!(*borrowed, Gpus::ZERO),
            (4, Outcome::Pending { .. }) => {}
            _ => panic!("mine-{i}: {o:?}"),
        }
    }
}

// --- accrue ---------------------------------------------------------------------------------

fn problem_at(c: &Cycles, now: i64) -> Problem {
    Problem::new(&c.policy, &c.state, Some(now)).expect("problem")
}

fn record(as_of: i64, tenant: &str, used: f64, borrowed: f64) -> UsageRecord {
    let h = |x: f64| UsageHours {
        gpu_hours: x,
        ..UsageHours::default()
    };
    UsageRecord {
        as_of: unix(as_of),
        tenants: [(
            tenant.to_owned(),
            TenantUsageRecord {
                used: h(used),
                borrowed: h(borrowed),
            },
        )]
        .into_iter()
        .collect(),
    }
}

/// The fleet with `n` of a's jobs running, which never end.
fn running_a(guarantee_a: u32, n: usize) -> Cycles {
    let (mut c, [a, _]) = fleet(&policy("10h", 1, 1, guarantee_a));
    for i in 0..n {
        let mut w = a.clone();
        w.name = format!("a-{i}");
        c.submit(w, None);
    }
    c.cycle();
    assert_eq!(c.state.running.len(), n);
    c
}

#[test]
fn one_half_life_halves_the_record() {
    let c = running_a(0, 0);
    let t0 = c.now;
    let p = problem_at(&c, t0 + 10 * HOUR);
    let r = accrue(&p, Some(&record(t0, "a", 10.0, 6.0)));
    let a = r.tenants["a"];
    assert!((a.used.gpu_hours - 5.0).abs() < 1e-9, "{a:?}");
    assert!((a.borrowed.gpu_hours - 3.0).abs() < 1e-9, "{a:?}");
    assert_eq!(r.as_of, unix(t0 + 10 * HOUR));
    // Decay is continuous: ten steps of an hour give one step of ten hours.
    let mut stepped = record(t0, "a", 10.0, 6.0);
    for k in 1..=10 {
        stepped = accrue(&problem_at(&c, t0 + k * HOUR), Some(&stepped));
    }
    assert!((stepped.tenants["a"].used.gpu_hours - 5.0).abs() < 1e-9);
    // A record from the future (a clock stepped back) is kept as it is, with its instant, so
    // that history survives and no interval is counted twice.
    let r = accrue(
        &problem_at(&c, t0),
        Some(&record(t0 + HOUR, "a", 10.0, 6.0)),
    );
    assert_eq!(r.tenants["a"].used.gpu_hours, 10.0);
    assert_eq!(r.tenants["a"].borrowed.gpu_hours, 6.0);
    assert_eq!(r.as_of, unix(t0 + HOUR));
}

#[test]
fn constant_usage_converges_to_rate_times_half_life_over_ln2() {
    // 6 GPUs, 4 of them guaranteed: 2 borrowed.
    let c = running_a(4, 6);
    let t0 = c.state.observed_at.as_second();
    let mut r = accrue(&problem_at(&c, t0), None);
    assert_eq!(r.tenants["a"].used.gpu_hours, 0.0);
    for k in 1..=40 {
        r = accrue(&problem_at(&c, t0 + k * 5 * HOUR), Some(&r));
    }
    let limit = 10.0 / std::f64::consts::LN_2;
    let a = r.tenants["a"];
    assert!(
        (a.used.gpu_hours - 6.0 * limit).abs() < 1e-3 * limit,
        "{a:?}"
    );
    // Borrowed counts only above the guarantee.
    assert!(
        (a.borrowed.gpu_hours - 2.0 * limit).abs() < 1e-3 * limit,
        "{a:?}"
    );
    // The parent's figures include a's; its guarantee (12) covers them all.
    assert!((r.tenants["org"].used.gpu_hours - 6.0 * limit).abs() < 1e-3 * limit);
    assert_eq!(r.tenants["org"].borrowed.gpu_hours, 0.0);
    assert_eq!(r.tenants["b"].used.gpu_hours, 0.0);
    // The history share is the steady borrowed fraction of the fleet: 2 of 12.
    let p = problem_at(&c, t0 + 200 * HOUR);
    let a_index = p.tenants.iter().position(|t| t.name == "a").unwrap();
    let h = history_share(&p, a_index, Some(&r));
    assert!((h - 2.0 / 12.0).abs() < 1e-3, "{h}");
}

#[test]
fn water_filling_shares() {
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
    // No history: the weights' proportions.
    assert!(close(
        &water_fill(&[(2.0, 0.0), (1.0, 0.0)]),
        &[2.0 / 3.0, 1.0 / 3.0]
    ));
    // Equal weights, a's history 0.5: b gets 0.75, a 0.25 (both keys at 0.75).
    assert!(close(&water_fill(&[(1.0, 0.5), (1.0, 0.0)]), &[0.25, 0.75]));
    // A history beyond the whole level: nothing, the other everything.
    assert!(close(&water_fill(&[(1.0, 1.5), (1.0, 0.0)]), &[0.0, 1.0]));
    // Alone: everything.
    assert!(close(&water_fill(&[(3.0, 7.0)]), &[1.0]));
}
