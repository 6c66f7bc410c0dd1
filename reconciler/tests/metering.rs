//! Metering over a simulated week, driven through the store the way the reconcile loop drives
//! it (meter at the start of each cycle, then the cycle's transitions, then meter again), with
//! an injected clock, preemptions and restarts (the store closed and reopened, sometimes between
//! a transition and the metering that follows it). The chargeback report must add up to the
//! fleet's GPU-seconds, known independently from the simulation, exactly.

use std::collections::BTreeMap;

use serde_json::json;
use tessera_compiler::model::{Binding, Node, WorkloadSpec};
use tessera_compiler::units::Gpus;
use tessera_reconciler::metering::report::{self, By, TenantPath, UsageReport};
use tessera_reconciler::metering::{self as metering, rates::Rates};
use tessera_reconciler::store::usage::RunKey;
use tessera_reconciler::store::{Durability, EndReason, Origin, Phase, Store};

const MODEL: &str = "A100-SXM4-40GB";
const WEEK: i64 = 7 * 24 * 3600;
const CYCLE: i64 = 600;
const T0: i64 = 1_790_000_000;

fn nodes() -> Vec<Node> {
    (0..4)
        .map(|n| {
            serde_json::from_value(json!({
                "name": format!("node-{n}"),
                "pool": "train",
                "cpu": "64",
                "memory": "512Gi",
                "gpus": (0..8).map(|i| json!({
                    "index": i,
                    "uuid": format!("GPU-0000000{n}-0000-0000-0000-00000000000{i}"),
                    "model": MODEL,
                })).collect::<Vec<_>>(),
            }))
            .expect("a valid node")
        })
        .collect()
}

fn spec(tenant: &str, shape: u64) -> WorkloadSpec {
    let gpu = match shape % 3 {
        0 => json!({"count": 1}),
        1 => json!({"count": 2}),
        _ => json!({"fraction": 0.25}),
    };
    serde_json::from_value(json!({
        "tenant": tenant, "sloClass": "batch", "replicas": 1 + shape % 2,
        "gpu": gpu, "cpu": "4", "memory": "16Gi",
    }))
    .expect("a valid spec")
}

/// Bindings for `spec` on node `node` (capacity is not the point here), with its exact units.
fn place(spec: &WorkloadSpec, node: usize) -> (Vec<Binding>, Gpus) {
    let mut units = Gpus::ZERO;
    let bindings = (0..spec.replicas)
        .map(|r| {
            let b = match (spec.gpu.count, spec.gpu.fraction) {
                (Some(c), _) => {
                    units += Gpus::whole(i64::from(c));
                    json!({"node": format!("node-{node}"), "gpus": (0..c).map(|i| i + 2 * r).collect::<Vec<_>>()})
                }
                _ => {
                    units += Gpus::milli(250);
                    json!({"node": format!("node-{node}"), "gpus": [r], "share": 0.25})
                }
            };
            serde_json::from_value(b).expect("a valid binding")
        })
        .collect();
    (bindings, units)
}

/// A small deterministic generator: the schedule is the same on every run.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Meters as the service does (`meter_store`), checking on the way that the store's placed
/// runs are exactly the live workloads' runs (what `meter_placed` meters from full records).
fn meter(store: &Store, now: i64) {
    let live = store.live().expect("live");
    let mut from_records: Vec<RunKey> = live.iter().filter_map(metering::runs::run_key).collect();
    let mut placed = store.placed_runs().expect("placed runs");
    from_records.sort();
    placed.sort();
    assert_eq!(placed, from_records);
    metering::meter_store(store, || Ok::<_, String>(nodes()), now).expect("meter");
}

struct Truth {
    /// Per tenant: unit-seconds held.
    held: BTreeMap<String, i64>,
    /// Live runs: name → (tenant, started_at, units).
    running: BTreeMap<String, (String, i64, i64)>,
}

impl Truth {
    fn end(&mut self, name: &str, at: i64) {
        let (tenant, start, units) = self.running.remove(name).expect("a running run");
        *self.held.entry(tenant).or_default() += units * (at - start);
    }
}

#[test]
fn a_week_with_preemptions_and_restarts_adds_up_to_the_fleet_to_the_second() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let open = || Store::open_with(&db, Durability::ProcessCrash).expect("open");
    let mut store = open();
    let tenants = ["a1", "a2", "b"];
    let mut rng = Lcg(7);
    let mut truth = Truth {
        held: BTreeMap::new(),
        running: BTreeMap::new(),
    };
    let mut submitted = 0u64;
    let (mut preemptions, mut restarts, mut unmetered_restarts) = (0, 0, 0);
    let mut now = T0;
    while now < T0 + WEEK {
        meter(&store, now);
        let live = store.live().unwrap();
        let mut started_now = false;
        for record in &live {
            match record.phase {
                Phase::Running => match rng.next(100) {
                    0..=2 => {
                        store
                            .finish(&record.key(), EndReason::Exited { code: 0 }, now)
                            .unwrap();
                        truth.end(&record.name, now);
                    }
                    3 => {
                        let key = metering::runs::run_key(record).unwrap();
                        store
                            .record_preemption(&key, "train", 3600 * Gpus::UNITS_PER_GPU, now)
                            .unwrap();
                        store.requeue(&record.key(), "preempted", now).unwrap();
                        truth.end(&record.name, now);
                        preemptions += 1;
                    }
                    _ => {}
                },
                Phase::Pending if rng.next(4) == 0 => {
                    let (bindings, units) = place(&record.spec, rng.next(4) as usize);
                    // Half guaranteed, half borrowed, as the solver's ledger would say.
                    let g = Gpus::from_units(units.units() / 2);
                    store
                        .record_admission(
                            &record.tenant,
                            &record.name,
                            record.submitted_at,
                            g,
                            units - g,
                        )
                        .unwrap();
                    store.mark_starting(&record.key(), &bindings, now).unwrap();
                    store.mark_running(&record.key(), &[], now).unwrap();
                    truth.running.insert(
                        record.name.clone(),
                        (record.tenant.clone(), now, units.units()),
                    );
                    started_now = true;
                }
                _ => {}
            }
        }
        if rng.next(3) == 0 {
            let tenant = tenants[rng.next(3) as usize];
            submitted += 1;
            store
                .submit(
                    &format!("w{submitted}"),
                    &spec(tenant, rng.next(1000)),
                    Origin::Submitted,
                    now,
                )
                .unwrap();
        }
        let crash = rng.next(200) == 0;
        if crash && started_now {
            // Killed between the starts and the metering that would describe them: recovery
            // meters them from their start.
            unmetered_restarts += 1;
        } else {
            meter(&store, now);
        }
        if crash {
            drop(store);
            restarts += 1;
            // Down for a while; the runs keep their GPUs meanwhile.
            now += CYCLE * (1 + rng.next(12) as i64);
            store = open();
            meter(&store, now);
        }
        now += CYCLE;
    }
    let end = now;
    meter(&store, end);
    for name in truth.running.keys().cloned().collect::<Vec<_>>() {
        truth.end(&name, end);
    }
    assert!(
        preemptions > 5 && restarts > 5 && unmetered_restarts > 0,
        "{preemptions} {restarts} {unmetered_restarts}"
    );

    let fleet: i64 = truth.held.values().sum();
    let paths = |name: &str, path: &[&str]| TenantPath {
        name: name.into(),
        path: path.iter().map(|s| s.to_string()).collect(),
    };
    let report = UsageReport {
        since: T0,
        until: end,
        tenants: vec![
            paths("org", &["org"]),
            paths("a", &["org", "a"]),
            paths("a1", &["org", "a", "a1"]),
            paths("a2", &["org", "a", "a2"]),
            paths("b", &["org", "b"]),
        ],
        rows: store.usage(T0, end).unwrap(),
    };
    let rates = Rates::parse(
        "rates.yaml",
        &format!("currency: EUR\ngpuHour:\n  {MODEL}: 2.5\n"),
    )
    .unwrap();
    let summary = report::summarize(&report, By::Tenant, Some(&rates));
    // To the second: unit-seconds are exact, 7000 per GPU-second.
    assert_eq!(summary.total.gpu_unit_seconds, fleet);
    let line = |name: &str| {
        summary
            .lines
            .iter()
            .find(|l| l.name == name)
            .unwrap()
            .clone()
    };
    for t in tenants {
        assert_eq!(line(t).gpu_unit_seconds, truth.held[t], "tenant {t}");
    }
    assert_eq!(line("org").gpu_unit_seconds, fleet);
    assert_eq!(
        line("a").gpu_unit_seconds,
        line("a1").gpu_unit_seconds + line("a2").gpu_unit_seconds
    );
    assert_eq!(line("org").cost_micros, summary.total.cost_micros);
    assert_eq!(
        line("a").cost_micros.unwrap(),
        line("a1").cost_micros.unwrap() + line("a2").cost_micros.unwrap()
    );
    let t = &summary.total;
    assert_eq!(
        t.guaranteed_unit_seconds + t.borrowed_unit_seconds + t.unclassified_unit_seconds,
        t.gpu_unit_seconds
    );
    assert_eq!(t.unclassified_unit_seconds, 0);
    assert_eq!(
        t.preemption_lost_unit_seconds,
        preemptions * 3600 * Gpus::UNITS_PER_GPU
    );

    // Windows add up: the first half and the second half are the whole.
    let mid = T0 + WEEK / 2 + 17;
    let sum = |rows: Vec<tessera_reconciler::store::usage::UsageRow>| {
        rows.iter().map(|r| r.gpu_unit_seconds).sum::<i64>()
    };
    assert_eq!(
        sum(store.usage(T0, mid).unwrap()) + sum(store.usage(mid, end).unwrap()),
        fleet
    );
    // By team (a and b, at depth 1), pool and model the lines add up to the same total.
    for by in [By::Team { depth: 1 }, By::Pool, By::Model] {
        let s = report::summarize(&report, by, Some(&rates));
        assert_eq!(
            s.lines.iter().map(|l| l.gpu_unit_seconds).sum::<i64>(),
            fleet
        );
    }
}

#[test]
fn metering_a_run_again_never_counts_a_second_twice() {
    let store = Store::open_in_memory().unwrap();
    store
        .submit("w", &spec("a1", 0), Origin::Submitted, T0)
        .unwrap();
    let (bindings, _) = place(&spec("a1", 0), 0);
    let key = tessera_compiler::WorkloadKey::new("a1", "w");
    store.mark_starting(&key, &bindings, T0).unwrap();
    store.mark_running(&key, &[], T0).unwrap();
    for now in [T0 + 10, T0 + 10, T0 + 5, T0 + 20, T0 + 20] {
        meter(&store, now);
    }
    let rows = store.usage(T0 - 100, T0 + 100).unwrap();
    assert_eq!(rows.len(), 1);
    // One whole GPU (shape 0) for 20 seconds, whatever order and repetition of meterings.
    assert_eq!(rows[0].gpu_unit_seconds, 20 * Gpus::UNITS_PER_GPU);
    assert_eq!(rows[0].unclassified_unit_seconds, rows[0].gpu_unit_seconds);
    let key = RunKey {
        tenant: "a1".into(),
        workload: "w".into(),
        submitted_at: T0,
        started_at: T0,
    };
    store.record_preemption(&key, "train", 70, T0 + 20).unwrap();
    store.record_preemption(&key, "train", 70, T0 + 30).unwrap();
    let lost: i64 = store
        .usage(T0, T0 + 100)
        .unwrap()
        .iter()
        .map(|r| r.preemption_lost_unit_seconds)
        .sum();
    assert_eq!(lost, 70);
}

#[test]
fn reserved_idle_is_charged_once_between_decisions() {
    use tessera_reconciler::store::usage::ReservedSpell;
    let store = Store::open_in_memory().unwrap();
    let spell = ReservedSpell {
        tenant: "b".into(),
        workload: "gang".into(),
        pool: "train".into(),
        gpus: 4,
    };
    store
        .meter_reserved(std::slice::from_ref(&spell), T0, T0 + 10)
        .unwrap();
    // The same interval again (a repeated cycle) adds nothing; the next one extends the spell.
    store
        .meter_reserved(std::slice::from_ref(&spell), T0, T0 + 10)
        .unwrap();
    store.meter_reserved(&[spell], T0 + 10, T0 + 30).unwrap();
    let rows = store.usage(T0, T0 + 100).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].reserved_idle_unit_seconds,
        4 * 30 * Gpus::UNITS_PER_GPU
    );
}
