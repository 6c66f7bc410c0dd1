//! Fair-share preemption between borrowers (`Pool.spec.preemption.borrowers: FairShare`): a
//! borrower may take another tenant's borrowed work of its own priority when, after the swap,
//! its side of the tenant tree still borrows no more of the pool, per unit of weight, than the
//! other side. One pool of 2 × 6 GPUs, one-GPU jobs; driven over cycles (`common::cycles`) so
//! that what the cycle preempts is carried out and decided again. Admission follows the same
//! sides without the knob: free capacity goes first to the borrower whose side of the tree
//! borrows least.

mod common;

use common::cycles::Cycles;
use common::{compile_with, node, pending, running, state};
use tessera_solver::decision::{Decision, Outcome, PreemptReason, Protected, Reason};

const EARLY: &str = "2026-11-20T06:00:00Z";
const NOW: &str = "2026-11-20T08:00:00Z";

/// `org` → `x` → {`x1`, `x2`}, and `org` → `y`; `weights` for `x` and `y`, `guarantee_x1` in
/// the pool (the others have none); `batch` (low) and `urgent` (high), both preemptible.
fn policy(fair: bool, weights: (u32, u32), guarantee_x1: u32) -> String {
    let preemption = if fair {
        "  preemption: {borrowers: FairShare}\n"
    } else {
        ""
    };
    format!(
        r#"
apiVersion: tessera/v1alpha1
kind: PriorityTiers
metadata: {{name: tiers}}
spec: {{tiers: [{{name: low, value: 100}}, {{name: high, value: 500}}]}}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {{name: batch}}
spec: {{tier: low, preemptible: true, isolation: {{minimum: exclusive}}}}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {{name: urgent}}
spec: {{tier: high, preemptible: true, isolation: {{minimum: exclusive}}}}
---
apiVersion: tessera/v1alpha1
kind: SloClass
metadata: {{name: settled}}
spec:
  tier: low
  preemptible: true
  isolation: {{minimum: exclusive}}
  preemption: {{minRuntime: 4h}}
---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {{name: p}}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {{nodes: 2, gpusPerNode: 6, cpuPerNode: 192, memoryPerNode: 2Ti}}
  sharing: exclusive
{preemption}---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: org}}
spec: {{guarantee: {{p: 12}}, sloClasses: [batch, urgent, settled]}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: x}}
spec: {{parent: org, guarantee: {{p: {guarantee_x1}}}, weight: {wx}}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: x1}}
spec: {{parent: x, guarantee: {{p: {guarantee_x1}}}}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: x2}}
spec: {{parent: x, guarantee: {{p: 0}}}}
---
apiVersion: tessera/v1alpha1
kind: Tenant
metadata: {{name: y}}
spec: {{parent: org, guarantee: {{p: 0}}, weight: {wy}}}
"#,
        wx = weights.0,
        wy = weights.1,
    )
}

/// `holders` run one-GPU jobs filling the pool (in order, `count` each, on t0 then t1), started
/// early; `waiting` queue one-GPU jobs of `class`.
fn fleet(holders: &[(&str, &str, u32)], waiting: &[(&str, &str, u32)]) -> String {
    let mut run = String::new();
    let mut slot = 0;
    for (tenant, class, count) in holders {
        for i in 0..*count {
            let node = if slot < 6 { "t0" } else { "t1" };
            let gpu = slot % 6;
            run += &running(
                &format!("{tenant}-run-{i}"),
                &format!("{{tenant: {tenant}, sloClass: {class}, gpu: {{count: 1}}}}"),
                &[&format!("{{node: {node}, gpus: [{gpu}]}}")],
                EARLY,
            );
            slot += 1;
        }
    }
    let mut queue = String::new();
    for (tenant, class, count) in waiting {
        for i in 0..*count {
            queue += &pending(
                &format!("{tenant}-new-{i}"),
                &format!("{{tenant: {tenant}, sloClass: {class}, gpu: {{count: 1}}}}"),
                NOW,
            );
        }
    }
    // Observed at `NOW`.
    state(&[node("t0", "p", 6), node("t1", "p", 6)], &run, &queue)
}

fn cycles(fair: bool, weights: (u32, u32), guarantee_x1: u32, snapshot: &str) -> Cycles {
    let (policy, state) = compile_with(&policy(fair, weights, guarantee_x1), snapshot);
    Cycles::new(policy, state)
}

/// One-GPU jobs running per tenant.
fn held(c: &Cycles, tenant: &str) -> usize {
    c.state
        .running
        .iter()
        .filter(|r| r.spec.tenant == tenant)
        .count()
}

fn fair_preemptions(d: &Decision) -> Vec<(&str, &str, &str)> {
    d.workloads
        .iter()
        .filter_map(|w| match &w.outcome {
            Outcome::Preempt {
                reason: PreemptReason::FairShare { from, to, .. },
                ..
            } => Some((w.name.as_str(), from.as_str(), to.as_str())),
            _ => None,
        })
        .collect()
}

/// Runs cycles until one preempts nothing; the number of cycles that did. A loop (work moving
/// back and forth) fails the test rather than hanging it.
fn settle(c: &mut Cycles) -> usize {
    for n in 0..10 {
        c.advance(60);
        let d = c.cycle().clone();
        let preempted = d
            .workloads
            .iter()
            .any(|w| matches!(w.outcome, Outcome::Preempt { .. }));
        if !preempted {
            return n;
        }
    }
    panic!("still preempting after 10 cycles: a loop");
}

#[test]
fn without_the_knob_the_first_borrower_keeps_the_pool() {
    let snapshot = fleet(&[("x1", "batch", 12)], &[("y", "batch", 12)]);
    let mut c = cycles(false, (1, 1), 0, &snapshot);
    let d = c.cycle().clone();
    assert!(fair_preemptions(&d).is_empty());
    assert_eq!((held(&c, "x1"), held(&c, "y")), (12, 0));
    let w = d.workloads.iter().find(|w| w.name == "y-new-0").unwrap();
    let Outcome::Pending { reason, .. } = &w.outcome else {
        panic!("{w:?}");
    };
    let Reason::PreemptionNotAllowed { protected, .. } = reason else {
        panic!("{reason:?}");
    };
    assert!(
        protected
            .iter()
            .all(|p| matches!(p, Protected::NotLowerPriority { .. })),
        "{protected:?}"
    );
}

#[test]
fn equal_weights_split_the_pool_evenly_in_one_cycle_and_stay_split() {
    let snapshot = fleet(&[("x1", "batch", 12)], &[("y", "batch", 12)]);
    let mut c = cycles(true, (1, 1), 0, &snapshot);
    let d = c.cycle().clone();
    let moved = fair_preemptions(&d);
    assert_eq!(moved.len(), 6, "{moved:?}");
    assert!(moved.iter().all(|&(_, from, to)| (from, to) == ("x", "y")));
    assert_eq!((held(&c, "x1"), held(&c, "y")), (6, 6));
    // The seventh waits and says why: taking one more would leave `x` below `y`.
    let message = &d
        .workloads
        .iter()
        .find(|w| w.name == "y-new-6")
        .unwrap()
        .outcome;
    let Outcome::Pending { reason } = message else {
        panic!("{message:?}");
    };
    let message = reason.to_string();
    assert!(
        message.contains("would borrow less than yours after the swap"),
        "{message}"
    );
    // The preempted jobs wait again; nothing moves back.
    assert_eq!(settle(&mut c), 0);
    assert_eq!((held(&c, "x1"), held(&c, "y")), (6, 6));
}

#[test]
fn weights_two_to_one_split_eight_to_four() {
    let snapshot = fleet(&[("x1", "batch", 12)], &[("y", "batch", 12)]);
    let mut c = cycles(true, (2, 1), 0, &snapshot);
    c.cycle();
    assert_eq!((held(&c, "x1"), held(&c, "y")), (8, 4));
    assert_eq!(settle(&mut c), 0);
    // The other way round: `y` holds the pool, `x` (weight 2) takes two thirds.
    let snapshot = fleet(&[("y", "batch", 12)], &[("x1", "batch", 12)]);
    let mut c = cycles(true, (2, 1), 0, &snapshot);
    c.cycle();
    assert_eq!((held(&c, "x1"), held(&c, "y")), (8, 4));
    assert_eq!(settle(&mut c), 0);
}

#[test]
fn sides_meet_below_the_common_ancestor() {
    // `x1` and `x2` are siblings: they split `x`'s share between them. `y` against `x` compares
    // the subtrees, not the leaves.
    let snapshot = fleet(&[("x1", "batch", 12)], &[("x2", "batch", 12)]);
    let mut c = cycles(true, (1, 1), 0, &snapshot);
    let d = c.cycle().clone();
    assert!(
        fair_preemptions(&d)
            .iter()
            .all(|&(_, from, to)| (from, to) == ("x1", "x2"))
    );
    assert_eq!((held(&c, "x1"), held(&c, "x2")), (6, 6));

    let snapshot = fleet(
        &[("x1", "batch", 8), ("x2", "batch", 4)],
        &[("y", "batch", 12)],
    );
    let mut c = cycles(true, (1, 1), 0, &snapshot);
    let d = c.cycle().clone();
    assert!(
        fair_preemptions(&d)
            .iter()
            .all(|&(_, from, to)| (from, to) == ("x", "y"))
    );
    // Taken from the more over-served leaf first: `x1` and `x2` end even, nothing to redo.
    assert_eq!((held(&c, "x1"), held(&c, "x2"), held(&c, "y")), (3, 3, 6));
    assert_eq!(settle(&mut c), 0);
}

#[test]
fn only_borrowed_work_of_the_same_priority_past_its_min_runtime_yields() {
    // `x1` is guaranteed 4: those 4 jobs are its own, only the 8 above compete, and `y`
    // evens the borrowed part: 4 and 4.
    let snapshot = fleet(&[("x1", "batch", 12)], &[("y", "batch", 12)]);
    let mut c = cycles(true, (1, 1), 4, &snapshot);
    c.cycle();
    assert_eq!((held(&c, "x1"), held(&c, "y")), (8, 4));
    assert_eq!(settle(&mut c), 0);

    // Higher-priority borrowed work does not yield to a lower-priority borrower.
    let snapshot = fleet(&[("x1", "urgent", 12)], &[("y", "batch", 12)]);
    let mut c = cycles(true, (1, 1), 0, &snapshot);
    assert!(fair_preemptions(c.cycle()).is_empty());
    assert_eq!(held(&c, "y"), 0);

    // Nor does work inside its minRuntime (started at 06:00, 4 h).
    let snapshot = fleet(&[("x1", "settled", 12)], &[("y", "settled", 12)]);
    let mut c = cycles(true, (1, 1), 0, &snapshot);
    let d = c.cycle().clone();
    assert!(fair_preemptions(&d).is_empty());
    let message = format!("{:?}", d.workloads.iter().find(|w| w.name == "y-new-0"));
    assert!(message.contains("MinRuntime"), "{message}");
}

#[test]
fn a_lower_priority_borrower_never_takes_by_fair_share() {
    // `y` is urgent and holds the pool; `x1`'s batch jobs are of lower priority: they wait,
    // whatever the shares.
    let snapshot = fleet(&[("y", "urgent", 12)], &[("x1", "batch", 12)]);
    let mut c = cycles(true, (3, 1), 0, &snapshot);
    assert!(fair_preemptions(c.cycle()).is_empty());
    assert_eq!(held(&c, "y"), 12);
}

#[test]
fn free_capacity_goes_to_the_side_of_the_tree_that_borrows_least() {
    // `x` holds 6 through its two leaves (3 each), `y` holds 4; two GPUs are free and `x1`
    // and `y` each queue two jobs, submitted together. `x1` alone borrows less than `y`
    // (3 against 4), but its side, `x`, borrows more (6 against 4): `y` is served first,
    // and the pool ends split 6 and 6 between the two sides. No preemption is involved.
    let snapshot = fleet(
        &[("x1", "batch", 3), ("x2", "batch", 3), ("y", "batch", 4)],
        &[("x1", "batch", 2), ("y", "batch", 2)],
    );
    let mut c = cycles(false, (1, 1), 0, &snapshot);
    let d = c.cycle().clone();
    assert!(fair_preemptions(&d).is_empty());
    assert_eq!((held(&c, "x1"), held(&c, "x2"), held(&c, "y")), (3, 3, 6));

    // With weights 3 : 1, `x`'s 6 are 2 per unit of weight against `y`'s 4: `x1` first.
    let mut c = cycles(false, (3, 1), 0, &snapshot);
    c.cycle();
    assert_eq!((held(&c, "x1"), held(&c, "x2"), held(&c, "y")), (5, 3, 4));
}
