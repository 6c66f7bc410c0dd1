//! Metering at the reference fleet's size (500 nodes × 8 GPUs, 5,116 running workloads, 301
//! tenants): what it adds to every cycle, what a month's report costs, and a `/metrics` scrape.
//! `cargo bench --workspace --bench metering`; prints medians. (`cargo test --workspace --bench
//! metering` runs it in the debug profile: an upper bound.)

// The production binaries' allocator, so that the figures describe what users run.
#[global_allocator]
static ALLOCATOR: tessera_alloc::Allocator = tessera_alloc::Allocator;

use std::time::{Duration, Instant};

use serde_json::json;
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{Binding, Node, WorkloadSpec};
use tessera_reconciler::driver::{GpuDetail, GpuRef, GpuUtilization, Observation};
use tessera_reconciler::metering;
use tessera_reconciler::metrics::Metrics;
use tessera_reconciler::store::{Durability, EndReason, Origin, Store};

const NODES: usize = 500;
const RUNNING: usize = 5_116;
const TENANTS: usize = 301;
const ENDED: usize = 20_000;
const T0: i64 = 1_790_000_000;

fn nodes() -> Vec<Node> {
    (0..NODES)
        .map(|n| {
            serde_json::from_value(json!({
                "name": format!("node-{n}"),
                "pool": if n < 436 { "train" } else { "infer" },
                "cpu": "192", "memory": "2Ti",
                "gpus": (0..8).map(|i| json!({
                    "index": i,
                    "uuid": format!("GPU-{n:08x}-0000-0000-0000-{i:012x}"),
                    "model": "H100-SXM5-80GB",
                })).collect::<Vec<_>>(),
            }))
            .unwrap()
        })
        .collect()
}

fn spec(tenant: usize, gpus: u32) -> WorkloadSpec {
    serde_json::from_value(json!({
        "tenant": format!("t{tenant}"), "sloClass": "batch",
        "gpu": {"count": gpus}, "cpu": "8", "memory": "64Gi",
    }))
    .unwrap()
}

fn binding(slot: usize, gpus: u32) -> Vec<Binding> {
    let node = slot % NODES;
    let first = (slot / NODES) as u32 % 8;
    serde_json::from_value(json!([{
        "node": format!("node-{node}"),
        "gpus": (0..gpus).map(|i| (first + i) % 8).collect::<Vec<_>>(),
    }]))
    .unwrap()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bench.db");
    // Filled without an fsync per commit; measured as the service runs by default (one per
    // commit), below.
    let store = Store::open_with(&db, Durability::ProcessCrash).unwrap();
    let nodes = nodes();
    // History: ended runs across a month.
    for i in 0..ENDED {
        let name = format!("old-{i}");
        let at = T0 + (i as i64 % (30 * 86_400));
        let spec = spec(i % TENANTS, 1);
        store.submit(&name, &spec, Origin::Submitted, at).unwrap();
        let name = WorkloadKey::new(&spec.tenant, &name);
        store.mark_starting(&name, &binding(i, 1), at).unwrap();
        store.mark_running(&name, &[], at).unwrap();
        let live = vec![store.get(&name).unwrap().unwrap()];
        metering::meter_placed(&store, &live, || Ok::<_, String>(nodes.clone()), at).unwrap();
        store
            .finish(&name, EndReason::Exited { code: 0 }, at + 3600)
            .unwrap();
    }
    let now = T0 + 30 * 86_400;
    for i in 0..RUNNING {
        let name = format!("run-{i}");
        let gpus = if i % 10 == 0 { 8 } else { 1 };
        let spec = spec(i % TENANTS, gpus);
        store.submit(&name, &spec, Origin::Submitted, now).unwrap();
        let name = WorkloadKey::new(&spec.tenant, &name);
        store.mark_starting(&name, &binding(i, gpus), now).unwrap();
        store.mark_running(&name, &[], now).unwrap();
    }
    drop(store);
    let store = Store::open(&db).unwrap();
    // The first metering describes every run (the cycle after a mass start).
    let started = Instant::now();
    let live = store.live().unwrap();
    metering::meter_placed(&store, &live, || Ok::<_, String>(nodes.clone()), now).unwrap();
    let first = started.elapsed();
    // A steady cycle: read the live workloads, extend every run.
    let steady = median(
        (1..=11)
            .map(|k| {
                let t = Instant::now();
                let live = store.live().unwrap();
                metering::meter_placed(
                    &store,
                    &live,
                    || Ok::<_, String>(nodes.clone()),
                    now + 10 * k,
                )
                .unwrap();
                t.elapsed()
            })
            .collect(),
    );
    // The same through the store's placed runs, as the service meters (no full records read).
    let steady_store = median(
        (1..=11)
            .map(|k| {
                let t = Instant::now();
                metering::meter_store(
                    &store,
                    || Ok::<_, String>(nodes.clone()),
                    now + 200 + 10 * k,
                )
                .unwrap();
                t.elapsed()
            })
            .collect(),
    );
    let live_only = median(
        (0..11)
            .map(|_| {
                let t = Instant::now();
                assert_eq!(store.live().unwrap().len(), RUNNING);
                t.elapsed()
            })
            .collect(),
    );
    let report = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let rows = store.usage(T0, now + 3600).unwrap();
                assert!(!rows.is_empty());
                t.elapsed()
            })
            .collect(),
    );

    // A scrape with every tenant and GPU labelled.
    let metrics = Metrics::new();
    let observation = Observation {
        details: nodes
            .iter()
            .flat_map(|n| {
                (0..8).map(move |i| GpuDetail {
                    gpu: GpuRef {
                        node: n.name.clone(),
                        index: i,
                    },
                    instances: vec![],
                    processes: vec![],
                    utilization: Some(GpuUtilization {
                        gpu_percent: i * 11,
                        memory_percent: 0,
                    }),
                    sm_activity: None,
                })
            })
            .collect(),
        nodes: nodes.clone(),
    };
    let live = store.live().unwrap();
    metrics.record_utilization(&observation, &live, now);
    let utilization = {
        let t = Instant::now();
        metrics.record_utilization(&observation, &live, now + 10);
        t.elapsed()
    };
    let scrape = median(
        (0..21)
            .map(|_| {
                let t = Instant::now();
                let text = metrics.encode();
                assert!(text.contains("tessera_gpu_utilization_ratio"));
                t.elapsed()
            })
            .collect(),
    );
    println!(
        "metering: {RUNNING} running workloads, {ENDED} ended runs, {TENANTS} tenants, {} GPUs",
        NODES * 8
    );
    println!("first metering of {RUNNING} new runs: {first:.2?}");
    println!("steady cycle (read live workloads + extend every run), median of 11: {steady:.2?}");
    println!(
        "  of which reading the live workloads (the cycle reads them anyway): {live_only:.2?}"
    );
    println!(
        "steady cycle as the service meters (placed runs from the store), median of 11: \
         {steady_store:.2?}"
    );
    println!("a month's usage report, median of 5: {report:.2?}");
    println!(
        "utilization gauges for {} GPUs: {utilization:.2?}",
        NODES * 8
    );
    println!(
        "/metrics encode, median of 21: {scrape:.2?} ({} bytes)",
        metrics.encode().len()
    );
}
