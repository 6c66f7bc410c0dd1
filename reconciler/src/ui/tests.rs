//! The page's data and HTML on a small fleet: who sees what, geometry, queue order, usage, and
//! escaping of everything a tenant or the repository can name.

use serde_json::json;
use tessera_compiler::model::ClusterStateSpec;
use tessera_compiler::units::Gpus;
use tessera_solver::Decision;

use super::model::{Holder, Waiting};
use super::{FleetPage, Sources, render};
use crate::auth::Principal;
use crate::metering::report::{TenantPath, UsageReport};
use crate::service::{Condition, DecisionIndex, Health, Status};
use crate::store::usage::UsageRow;

const T: i64 = 1_790_000_000;

/// Two pools: `train` (one node, whole GPUs) and `infer` (one node, GPU 0 in MIG mode).
fn state(hostile: &str) -> ClusterStateSpec {
    serde_json::from_value(json!({
        "observedAt": "2026-11-20T08:00:00Z",
        "nodes": [
            {"name": "train-0", "pool": "train", "cpu": "64", "memory": "512Gi", "gpus": [
                {"index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000", "model": "H100-SXM5-80GB"},
                {"index": 1, "uuid": "GPU-00000000-0000-0000-0000-000000000001", "model": "H100-SXM5-80GB"},
            ]},
            {"name": "infer-0", "pool": "infer", "cpu": "64", "memory": "512Gi", "gpus": [
                {"index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000002", "model": "H100-SXM5-80GB",
                 "mig": {"enabled": true},
                 "instances": [{"profile": "3g.40gb", "start": 0}, {"profile": "1g.10gb", "start": 4},
                               {"profile": "1g.10gb", "start": 5}]},
            ]},
        ],
        "running": [
            {"name": "trainer", "spec": {"tenant": "research", "sloClass": "batch", "gpu": {"count": 1}},
             "bindings": [{"node": "train-0", "gpus": [0]}], "startedAt": "2026-11-20T07:00:00Z"},
            {"name": hostile, "spec": {"tenant": "product", "sloClass": "online", "gpu": {"migProfile": "3g.40gb"}},
             "bindings": [{"node": "infer-0", "gpus": [0], "migStart": 0}], "startedAt": "2026-11-20T07:00:00Z"},
            {"name": "embedder", "spec": {"tenant": "product", "sloClass": "online", "gpu": {"migProfile": "1g.10gb"}},
             "bindings": [{"node": "infer-0", "gpus": [0], "migStart": 5}], "startedAt": "2026-11-20T07:00:00Z"},
        ],
        "pending": [
            {"name": "big-run", "spec": {"tenant": "research", "sloClass": "batch", "pool": "train",
             "gpu": {"count": 2}}, "submittedAt": "2026-11-20T07:30:00Z"},
        ],
    }))
    .unwrap()
}

fn decision() -> Decision {
    let keep = |tenant: &str, name: &str, pool: &str| {
        json!({"name": name, "tenant": tenant, "slo_class": "batch", "priority": 0, "pool": pool,
               "outcome": "keep", "bindings": []})
    };
    // A waiting workload's message is its reason's sentence: the decision's JSON carries it,
    // and reading the decision back derives it from the reason again.
    let no_capacity =
        json!({"kind": "no_capacity", "pool": "train", "needed": 2, "fit": 1, "free": 1.0});
    let pending = |tenant: &str, name: &str, reason: &serde_json::Value| {
        json!({"name": name, "tenant": tenant, "slo_class": "batch", "priority": 0, "pool": null,
               "outcome": "pending", "reason": reason,
               "message": "a message the reason does not say is not shown"})
    };
    let usage = |tenant: &str, pool: &str, total: f64| {
        json!({"tenant": tenant, "pool": pool, "guarantee": 1.0, "limit": 2.0, "total": total,
               "guaranteed": total.min(1.0), "borrowed": (total - 1.0).max(0.0)})
    };
    serde_json::from_value(json!({
        "format_version": 1, "now": "2026-11-20T08:00:01Z", "method": "heuristic",
        "objective": 0.0, "bound": null, "gap": null,
        "workloads": [
            keep("research", "trainer", "train"),
            keep("product", "embedder", "infer"),
            pending("research", "big-run", &no_capacity),
            pending(
                "product",
                "queued",
                &json!({"kind": "reserved_for", "pool": "train", "gang": "research/big-run",
                        "capacity": no_capacity}),
            ),
            pending("research", "stuck", &no_capacity),
        ],
        "geometry": [],
        "usage": [usage("org", "train", 1.0), usage("research", "train", 1.0),
                  usage("product", "infer", 1.571)],
        "pools": [
            {"pool": "infer", "sharing": "mig", "capacity": 1.0, "allocated": 0.571,
             "allocation": 0.571, "free": 0.429, "stranded": 0.0, "free_nodes": 0, "free_domains": 0},
            {"pool": "train", "sharing": "exclusive", "capacity": 2.0, "allocated": 1.0,
             "allocation": 0.5, "free": 1.0, "stranded": 0.0, "free_nodes": 0, "free_domains": 0},
        ],
        "queue": ["product/queued", "research/big-run"],
    }))
    .unwrap()
}

fn row(tenant: &str, pool: &str, gpu_hours: i64) -> UsageRow {
    serde_json::from_value(json!({
        "tenant": tenant, "pool": pool, "model": "H100-SXM5-80GB",
        "gpuUnitSeconds": gpu_hours * 3600 * Gpus::UNITS_PER_GPU,
        "guaranteedUnitSeconds": 0, "borrowedUnitSeconds": 0, "unclassifiedUnitSeconds": 0,
        "reservedIdleUnitSeconds": 0, "preemptionLostUnitSeconds": 0,
        "cpuMillicoreSeconds": 0, "memoryMibSeconds": 0,
    }))
    .unwrap()
}

fn day() -> UsageReport {
    let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    UsageReport {
        since: T - 86_400,
        until: T,
        tenants: vec![
            TenantPath {
                name: "org".into(),
                path: path(&["org"]),
            },
            TenantPath {
                name: "research".into(),
                path: path(&["org", "research"]),
            },
            TenantPath {
                name: "product".into(),
                path: path(&["org", "product"]),
            },
        ],
        rows: vec![row("research", "train", 5), row("product", "infer", 2)],
    }
}

fn status(hostile: &str) -> Status {
    let mut s = Status::starting("sim");
    s.health = Health::Degraded;
    s.revision = Some("0123456789abcdef".into());
    s.diagnostics = vec![format!("policy/t.yaml:3:7: tenant {hostile}")];
    s.set_conditions(vec![
        Condition::service("fetch: /srv/policy is gone"),
        Condition::tenant("product", format!("workload/{hostile}: exit 1")),
    ]);
    s
}

fn build(viewer: &Principal, hostile: &str) -> FleetPage {
    let state = state(hostile);
    let index = DecisionIndex::of(&decision());
    let status = status(hostile);
    let day = day();
    FleetPage::build(&Sources {
        viewer,
        now: T,
        status: &status,
        state: Some(&state),
        decisions: Some(&index),
        day: Some(&day),
    })
}

fn holders(page: &FleetPage, node: &str) -> Vec<(u32, u8, u8, Vec<Holder>)> {
    page.pools
        .iter()
        .flat_map(|p| &p.nodes)
        .filter(|n| n.name == node)
        .flat_map(|n| &n.gpus)
        .flat_map(|g| {
            g.blocks
                .iter()
                .map(|b| (g.index, b.start, b.slices, b.holders.clone()))
        })
        .collect()
}

fn workload(tenant: &str, name: &str) -> Holder {
    Holder::Workload {
        tenant: tenant.into(),
        name: name.into(),
    }
}

#[test]
fn the_operator_sees_every_pool_gpu_instance_and_who_holds_it() {
    let page = build(&Principal::Admin, "chat");
    let pools: Vec<(&str, usize)> = page
        .pools
        .iter()
        .map(|p| (p.name.as_str(), p.nodes.len()))
        .collect();
    assert_eq!(pools, [("infer", 1), ("train", 1)]);
    assert_eq!(page.pools[1].capacity, Some(Gpus::whole(2)));
    // Whole GPUs are one block over all 8 memory slices; MIG instances span their profile's.
    assert_eq!(
        holders(&page, "train-0"),
        [
            (0, 0, 8, vec![workload("research", "trainer")]),
            (1, 0, 8, vec![])
        ]
    );
    assert_eq!(
        holders(&page, "infer-0"),
        [
            (0, 0, 4, vec![workload("product", "chat")]),
            (0, 4, 1, vec![]),
            (0, 5, 1, vec![workload("product", "embedder")]),
        ]
    );
    assert_eq!(page.status.conditions.len(), 2);
    assert_eq!(page.status.diagnostics.len(), 1);
}

#[test]
fn the_queue_is_in_line_order_with_reasons_and_the_unplaceable_last() {
    let page = build(&Principal::Admin, "chat");
    type Place<'a> = (&'a str, Option<(u32, u32)>, &'a str);
    let line: Vec<Place<'_>> = page
        .queue
        .iter()
        .map(|w: &Waiting| (w.name.as_str(), w.position, w.reason.as_str()))
        .collect();
    assert_eq!(
        line,
        [
            ("queued", Some((1, 2)), "reserved_for"),
            ("big-run", Some((2, 2)), "no_capacity"),
            ("stuck", None, "no_capacity"),
        ]
    );
    // The pool a waiting workload asked for, where it asked for one.
    let pools: Vec<Option<&str>> = page.queue.iter().map(|w| w.pool.as_deref()).collect();
    assert_eq!(pools, [None, Some("train"), None]);
}

#[test]
fn a_tenant_sees_its_own_workloads_named_and_no_one_elses() {
    let page = build(&Principal::Tenant("product".into()), "chat");
    assert_eq!(page.viewer, "tenant product");
    assert_eq!(
        holders(&page, "train-0"),
        [(0, 0, 8, vec![Holder::Other]), (1, 0, 8, vec![])]
    );
    assert_eq!(
        holders(&page, "infer-0")[0].3,
        [workload("product", "chat")]
    );
    let queue: Vec<(&str, &str)> = page
        .queue
        .iter()
        .map(|w| (w.name.as_str(), w.message.as_str()))
        .collect();
    assert_eq!(
        queue,
        [(
            "queued",
            "pool `train` has room for 1 of the 2 replicas the gang needs (1 GPUs free); the rest \
             is reserved for gang (another tenant's workload) (only preemptible work or work \
             whose maxDuration ends before the gang can start may use it)"
        )]
    );
    // Its own usage only, and only the conditions about its own workloads.
    let usage: Vec<&str> = page.usage.iter().map(|u| u.tenant.as_str()).collect();
    assert_eq!(usage, ["product"]);
    assert_eq!(page.status.conditions, ["workload/chat: exit 1"]);
    assert!(page.status.diagnostics.is_empty());
    let html = render::page(&page);
    for hidden in [
        "trainer",
        "research",
        "big-run",
        "/srv/policy",
        "policy/t.yaml",
    ] {
        assert!(!html.contains(hidden), "{hidden} shown to product:\n{html}");
    }
}

#[test]
fn usage_rolls_the_days_metering_up_the_tenant_tree() {
    let page = build(&Principal::Admin, "chat");
    let lines: Vec<(&str, &str, Option<i64>, Gpus)> = page
        .usage
        .iter()
        .map(|u| {
            (
                u.tenant.as_str(),
                u.pool.as_str(),
                u.day_unit_seconds.map(|s| s / 3600 / Gpus::UNITS_PER_GPU),
                u.borrowed,
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            ("org", "train", Some(5), Gpus::ZERO),
            ("product", "infer", Some(2), Gpus::from_f64(0.571).unwrap()),
            ("research", "train", Some(5), Gpus::ZERO),
        ]
    );
    let html = render::page(&page);
    assert!(html.contains("<td>5.000</td>"), "{html}");
}

#[test]
fn hostile_names_and_messages_are_escaped_everywhere() {
    let hostile = "<script>alert('x')</script>";
    for viewer in [Principal::Admin, Principal::Tenant("product".into())] {
        let html = render::page(&build(&viewer, hostile));
        assert!(
            !html.contains("<script"),
            "unescaped for {viewer:?}:\n{html}"
        );
        assert!(!html.contains("alert('x')"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"),
            "escaped form missing for {viewer:?}:\n{html}"
        );
    }
    let login = render::login(Some("<b>bad</b>"));
    assert!(
        login.contains("&lt;b&gt;bad&lt;/b&gt;") && !login.contains("<b>"),
        "{login}"
    );
}

#[test]
fn the_page_shows_status_pools_nodes_queue_and_usage() {
    let html = render::page(&build(&Principal::Admin, "chat"));
    for wanted in [
        "Signed in as operator",
        "0123456789abcdef",
        "Degraded",
        "fetch: /srv/policy is gone",
        "policy/t.yaml:3:7",
        "Pool infer",
        "Pool train",
        "infer-0",
        "train-0",
        "research/trainer",
        "product/embedder",
        "3g.40gb",
        "1 of 2",
        "no_capacity",
        "pool `train` has room for 1 of the 2 replicas the gang needs (1 GPUs free)",
        "reserved for gang `research/big-run`",
        "1 of 2 allocated",
    ] {
        assert!(html.contains(wanted), "{wanted} missing:\n{html}");
    }
    assert!(!html.contains("<script"), "no script on the page");
}

#[test]
fn before_the_first_cycle_the_page_says_so() {
    let status = Status::starting("sim");
    let page = FleetPage::build(&Sources {
        viewer: &Principal::Admin,
        now: T,
        status: &status,
        state: None,
        decisions: None,
        day: None,
    });
    let html = render::page(&page);
    for wanted in [
        "No fleet observed yet.",
        "Nothing is waiting.",
        "No decision yet.",
        "none yet",
    ] {
        assert!(html.contains(wanted), "{wanted} missing:\n{html}");
    }
}
