//! `tessera-fleet bench metering`: the control plane's metering of a steady fleet on a real
//! etcd. It places one run per GPU (`--nodes` × `--gpus`, one whole GPU each) through the
//! `StateStore` trait on a fenced `EtcdStore`, meters them as the cycle does
//! (`metering::meter_store`), then meters `--cycles` steady cycles (nothing starts or ends) and
//! prints etcd's puts per steady cycle, counted from etcd's `/metrics` as `bench agents` does.
//! One run is ended before the last cycle, to show what a change costs. It asserts nothing.

use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde_json::json;
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{Binding, Gpu, Health, MigState, Node, WorkloadSpec};
use tessera_compiler::units::{Bytes, Millicores};
use tessera_fleet::election::{Candidate, LeaderInfo};
use tessera_fleet::keys::Keys;
use tessera_fleet::store::{EtcdStore, StoreRuntime};
use tessera_fleet::testing::TestEtcd;
use tessera_reconciler::store::{EndReason, Origin, StateStore};

use crate::bench::Metrics;

#[derive(Debug, Args)]
pub struct BenchMeteringArgs {
    /// Nodes of the steady fleet.
    #[arg(long, default_value_t = 500)]
    pub nodes: usize,
    /// GPUs per node, one run on each.
    #[arg(long, default_value_t = 8)]
    pub gpus: u32,
    /// Steady cycles to meter and count.
    #[arg(long, default_value_t = 5)]
    pub cycles: u32,
}

pub fn run(args: BenchMeteringArgs) -> anyhow::Result<()> {
    let etcd = TestEtcd::start().context("cannot start etcd")?;
    let endpoint = etcd.endpoint();
    let runtime = StoreRuntime::new()?;
    let keys = Keys::new("bench")?;
    let client = runtime.block_on(tessera_fleet::access::connect(
        std::slice::from_ref(&endpoint),
        None,
    ))?;
    let leadership = runtime.block_on(
        Candidate::new(
            client.clone(),
            keys.clone(),
            LeaderInfo {
                id: "bench".into(),
                advertise: None,
            },
            60,
        )
        .campaign(),
    )?;
    let store = EtcdStore::leader(runtime.clone(), client, keys, leadership.fence().clone());
    let nodes = fleet(args.nodes, args.gpus);
    let spec: WorkloadSpec = serde_json::from_value(json!({
        "tenant": "bench",
        "sloClass": "batch",
        "gpu": {"count": 1},
        "cpu": 1,
        "memory": "1Gi",
        "command": ["sleep", "infinity"],
    }))?;
    let t0: i64 = 1_790_000_000;
    let placing = Instant::now();
    let mut names = Vec::new();
    for node in &nodes {
        for gpu in &node.gpus {
            let name = format!("{}-gpu{}", node.name, gpu.index);
            let key = WorkloadKey::new("bench", &name);
            store.submit(&name, &spec, Origin::Submitted, t0)?;
            let binding = Binding {
                node: node.name.clone(),
                gpus: vec![gpu.index],
                mig_start: None,
                share: None,
            };
            store.mark_starting(&key, &[binding], t0)?;
            store.mark_running(&key, &[], t0)?;
            names.push(key);
        }
    }
    println!(
        "placed {} runs on {} nodes × {} GPUs in {:.1} s",
        names.len(),
        args.nodes,
        args.gpus,
        placing.elapsed().as_secs_f64()
    );
    let observe = || Ok::<_, std::convert::Infallible>(nodes.clone());
    let first = Metrics::read(&endpoint)?;
    tessera_reconciler::metering::meter_store(&store, observe, t0 + 10)?;
    let created = Metrics::read(&endpoint)?;
    println!(
        "first metering (every run's row created): {} puts",
        created.puts - first.puts
    );
    let mut last = created;
    let mut steady = Vec::new();
    for cycle in 1..=args.cycles {
        let started = Instant::now();
        tessera_reconciler::metering::meter_store(
            &store,
            observe,
            t0 + 10 + 10 * i64::from(cycle),
        )?;
        let now = Metrics::read(&endpoint)?;
        steady.push(now.puts - last.puts);
        println!(
            "steady cycle {cycle}: {} puts, {} client bytes, {:.0} ms",
            now.puts - last.puts,
            now.received_bytes - last.received_bytes,
            started.elapsed().as_secs_f64() * 1000.0
        );
        last = now;
    }
    // One run ends: the next cycle's writes are what that changes.
    let at = t0 + 20 + 10 * i64::from(args.cycles);
    store.finish(&names[0], EndReason::Exited { code: 0 }, at)?;
    let before = Metrics::read(&endpoint)?;
    tessera_reconciler::metering::meter_store(&store, observe, at + 10)?;
    let after = Metrics::read(&endpoint)?;
    println!(
        "cycle after one run ended: {} puts (steady cycles: {steady:?})",
        after.puts - before.puts
    );
    let usage = store.usage(0, i64::MAX)?;
    let held: i64 = usage.iter().map(|r| r.gpu_unit_seconds).sum();
    println!(
        "usage reported: {} GPU-seconds",
        held / tessera_compiler::units::Gpus::UNITS_PER_GPU
    );
    drop(etcd);
    Ok(())
}

/// `nodes` nodes of `gpus` H100s each, in one pool.
fn fleet(nodes: usize, gpus: u32) -> Vec<Node> {
    (0..nodes)
        .map(|n| Node {
            name: format!("node-{n:04}"),
            pool: "train".into(),
            labels: Default::default(),
            rack: None,
            nvlink_domain: None,
            cpu: Millicores(64_000),
            memory: Bytes(512 << 30),
            health: Health::default(),
            gpus: (0..gpus)
                .map(|i| Gpu {
                    index: i,
                    uuid: format!("GPU-{n:08x}-{i:04x}"),
                    model: "H100-80GB".into(),
                    health: Health::default(),
                    mig: MigState::default(),
                    instances: Vec::new(),
                })
                .collect(),
        })
        .collect()
}
