//! The fleet page at the reference fleet's size (issue 19's goal: it renders 4,000 GPUs in
//! under a second): 500 nodes × 8 H100 (the last 64 nodes MIG-partitioned, four instances a
//! GPU), about 5,000 running workloads of 300 tenants, 2,000 waiting, usage of every tenant in
//! both pools and a day's metering. Times what `GET /ui` does once it holds the service's
//! state: copy the observed fleet, build the page's data, render the HTML; median of 11 runs,
//! and the page's size. Figures only; no assertion on time.
//!
//! `cargo bench --workspace --bench ui` (release). `cargo test --workspace --bench ui` runs
//! it in the debug profile: an upper bound.

// The production binaries' allocator, so that the figures describe what users run.
#[global_allocator]
static ALLOCATOR: tessera_alloc::Allocator = tessera_alloc::Allocator;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_compiler::model::ClusterStateSpec;
use tessera_compiler::units::Gpus;
use tessera_reconciler::auth::Principal;
use tessera_reconciler::metering::report::{TenantPath, UsageReport};
use tessera_reconciler::service::{Condition, DecisionIndex, Status};
use tessera_reconciler::ui::{FleetPage, Sources, render};
use tessera_solver::Decision;

const NODES: usize = 500;
const MIG_NODES: usize = 64;
const ORGS: usize = 10;
const PROJECTS: usize = 30;
const PENDING: usize = 2_000;
const T0: i64 = 1_790_000_000;

/// Tenant `i` of the projects (`org-K/p-K-J`): workloads belong to projects.
fn project(i: usize) -> String {
    let k = i % (ORGS * PROJECTS);
    format!("p-{}-{}", k / PROJECTS, k % PROJECTS)
}

/// The fleet, the running workloads on it and the decision's view of them.
fn fleet() -> (ClusterStateSpec, Vec<Value>) {
    let mut nodes = Vec::new();
    let mut running = Vec::new();
    let mut decided = Vec::new();
    let mut run = |tenant: String, gpu: Value, bindings: Value, pool: &str| {
        let name = format!("run-{}", running.len());
        decided.push(json!({"name": name, "tenant": tenant, "slo_class": "batch",
            "priority": 0, "pool": pool, "outcome": "keep", "bindings": []}));
        running.push(
            json!({"name": name, "spec": {"tenant": tenant, "sloClass": "batch",
            "gpu": gpu}, "bindings": bindings, "startedAt": "2026-11-20T07:00:00Z"}),
        );
    };
    for n in 0..NODES {
        let node = format!("node-{n:03}");
        let mig = n >= NODES - MIG_NODES;
        let gpus: Vec<Value> = (0..8)
            .map(|i| {
                let uuid = format!("GPU-{n:08x}-0000-0000-0000-{i:012x}");
                if mig {
                    json!({"index": i, "uuid": uuid, "model": "H100-SXM5-80GB",
                        "mig": {"enabled": true}, "instances": [
                            {"profile": "2g.20gb", "start": 0}, {"profile": "1g.10gb", "start": 2},
                            {"profile": "1g.10gb", "start": 3}, {"profile": "3g.40gb", "start": 4}]})
                } else {
                    json!({"index": i, "uuid": uuid, "model": "H100-SXM5-80GB"})
                }
            })
            .collect();
        nodes.push(
            json!({"name": node, "pool": if mig { "infer" } else { "train" },
            "cpu": "192", "memory": "2Ti", "gpus": gpus}),
        );
        let slot = n * 8;
        if mig {
            // Every instance but one a node taken.
            for gpu in 0..8u32 {
                for (start, profile) in [
                    (0, "2g.20gb"),
                    (2, "1g.10gb"),
                    (3, "1g.10gb"),
                    (4, "3g.40gb"),
                ] {
                    if gpu == 7 && start == 3 {
                        continue;
                    }
                    run(
                        project(slot + gpu as usize * 4 + start as usize),
                        json!({"migProfile": profile}),
                        json!([{"node": node, "gpus": [gpu], "migStart": start}]),
                        "infer",
                    );
                }
            }
        } else if n % 10 == 0 {
            run(
                project(n),
                json!({"count": 8}),
                json!([{"node": node, "gpus": [0, 1, 2, 3, 4, 5, 6, 7]}]),
                "train",
            );
        } else {
            // One-GPU workloads on every GPU, leaving one free on every fourth node.
            let taken = if n % 4 == 1 { 7 } else { 8 };
            for gpu in 0..taken {
                run(
                    project(slot + gpu as usize),
                    json!({"count": 1}),
                    json!([{"node": node, "gpus": [gpu]}]),
                    "train",
                );
            }
        }
    }
    let state = serde_json::from_value(json!({
        "observedAt": "2026-11-20T08:00:00Z", "nodes": nodes, "running": running,
    }))
    .unwrap();
    (state, decided)
}

fn decision(mut workloads: Vec<Value>) -> Decision {
    let mut queue = Vec::new();
    for i in 0..PENDING {
        let tenant = project(i * 7);
        let name = format!("wait-{i}");
        // Three in four have a place in line; the rest no pool can hold.
        if i % 4 != 3 {
            queue.push(format!("{tenant}/{name}"));
        }
        workloads.push(json!({"name": name, "tenant": tenant, "slo_class": "batch",
            "priority": 0, "pool": null, "outcome": "pending",
            "reason": {"kind": "no_capacity", "pool": "train", "needed": 8, "fit": 1, "free": 436.0},
            "message": format!("needs 8 GPUs on one node in pool `train`; the best node has 1 free, behind `{}/wait-{}`", project(i + 1), i + 1)}));
    }
    let mut usage = Vec::new();
    for tenant in tenants() {
        for pool in ["infer", "train"] {
            usage.push(
                json!({"tenant": tenant.name, "pool": pool, "guarantee": 8.0,
                "limit": 16.0, "total": 10.0, "guaranteed": 8.0, "borrowed": 2.0}),
            );
        }
    }
    let pool = |name: &str, capacity: f64| {
        json!({"pool": name, "sharing": "exclusive",
        "capacity": capacity, "allocated": capacity * 0.9, "allocation": 0.9,
        "free": capacity * 0.1, "stranded": 0.0, "free_nodes": 0, "free_domains": 0})
    };
    serde_json::from_value(json!({
        "format_version": 1, "now": "2026-11-20T08:00:01Z", "method": "heuristic",
        "objective": 0.0, "bound": null, "gap": null, "workloads": workloads, "geometry": [],
        "usage": usage, "pools": [pool("infer", 512.0), pool("train", 3488.0)], "queue": queue,
    }))
    .unwrap()
}

fn tenants() -> Vec<TenantPath> {
    let mut out = vec![TenantPath {
        name: "root".into(),
        path: vec!["root".into()],
    }];
    for o in 0..ORGS {
        let org = format!("org-{o}");
        out.push(TenantPath {
            name: org.clone(),
            path: vec!["root".into(), org.clone()],
        });
        for p in 0..PROJECTS {
            let name = format!("p-{o}-{p}");
            out.push(TenantPath {
                name: name.clone(),
                path: vec!["root".into(), org.clone(), name],
            });
        }
    }
    out
}

fn day() -> UsageReport {
    let tenants = tenants();
    let rows = tenants
        .iter()
        .filter(|t| t.path.len() == 3)
        .flat_map(|t| {
            ["infer", "train"].map(|pool| {
                serde_json::from_value(json!({
                    "tenant": t.name, "pool": pool, "model": "H100-SXM5-80GB",
                    "gpuUnitSeconds": 10 * 86_400 * Gpus::UNITS_PER_GPU,
                    "guaranteedUnitSeconds": 0, "borrowedUnitSeconds": 0,
                    "unclassifiedUnitSeconds": 0, "reservedIdleUnitSeconds": 0,
                    "preemptionLostUnitSeconds": 0, "cpuMillicoreSeconds": 0,
                    "memoryMibSeconds": 0,
                }))
                .unwrap()
            })
        })
        .collect();
    UsageReport {
        since: T0 - 86_400,
        until: T0,
        tenants,
        rows,
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let (state, decided) = fleet();
    let index = DecisionIndex::of(&decision(decided));
    let day = day();
    let mut status = Status::starting("nvml");
    status.revision = Some("3639319c5ba61ea914e7f39272a17a3a7a847584".into());
    status.set_conditions(vec![Condition::tenant("p-1-1", "workload/run-7: exit 1")]);
    let gpus: usize = state.nodes.iter().map(|n| n.gpus.len()).sum();
    println!(
        "fleet: {} nodes, {gpus} GPUs, {} running, {} waiting ({} in line), {} usage lines",
        state.nodes.len(),
        state.running.len(),
        PENDING,
        index
            .workloads()
            .filter(|(_, w)| w.queue_position.is_some())
            .count(),
        index.usage.len(),
    );
    for (who, viewer) in [
        ("operator", Principal::Admin),
        ("tenant", Principal::Tenant("p-1-1".into())),
    ] {
        let mut build = Vec::new();
        let mut html = Vec::new();
        let mut total = Vec::new();
        let mut size = 0;
        for _ in 0..11 {
            let started = Instant::now();
            // What the handler does: copy the shared state out of its lock, then build.
            let copied = state.clone();
            let page = FleetPage::build(&Sources {
                viewer: &viewer,
                now: T0,
                status: &status,
                state: Some(&copied),
                decisions: Some(&index),
                day: Some(&day),
            });
            let built = started.elapsed();
            let text = render::page(&page);
            total.push(started.elapsed());
            html.push(started.elapsed() - built);
            build.push(built);
            size = text.len();
        }
        println!(
            "{who}'s page: {:.1} ms (copy the state and build the data {:.1} ms, render {:.1} ms), {} KB; median of 11",
            median(total).as_secs_f64() * 1e3,
            median(build).as_secs_f64() * 1e3,
            median(html).as_secs_f64() * 1e3,
            size / 1024,
        );
    }
}
