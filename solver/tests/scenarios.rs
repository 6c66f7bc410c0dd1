//! Scenarios on small fleets: each checks one rule of the policy, and the sentence that
//! explains a workload left waiting.

mod common;

use common::*;
use tessera_compiler::units::Gpus;
use tessera_solver::decision::{Outcome, PreemptReason, Reason};

const EARLY: &str = "2026-11-20T06:00:00Z";
const RECENT: &str = "2026-11-20T07:50:00Z";

fn admitted(
    d: &tessera_solver::Decision,
    name: &str,
) -> Vec<tessera_solver::decision::ReplicaBinding> {
    match &get(d, name).outcome {
        Outcome::Admit { bindings, .. } => bindings.clone(),
        other => panic!("{name} not admitted: {other:?}"),
    }
}

#[test]
fn empty_state_decides_nothing() {
    let d = run(&state(&[node("t0", "train", 8)], "", ""));
    assert!(d.workloads.is_empty());
    assert_eq!((d.objective, d.bound, d.gap), (0.0, Some(0.0), Some(0.0)));
}

#[test]
fn a_gang_is_placed_whole_or_not_at_all() {
    // 5 and 7 GPUs free: one replica of 6 fits, two do not, and none is placed; two of 5 fit.
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let run_ = [
        running(
            "hold-0",
            "{tenant: b, sloClass: critical, gpu: {count: 3}}",
            &[&gpus("t0", 0, 3)],
            EARLY,
        ),
        running(
            "hold-1",
            "{tenant: b, sloClass: critical, gpu: {count: 1}}",
            &[&gpus("t1", 0, 1)],
            EARLY,
        ),
    ]
    .concat();
    let pend = [
        pending(
            "big",
            "{tenant: a, sloClass: batch, replicas: 2, gpu: {count: 6}}",
            RECENT,
        ),
        pending(
            "pair",
            "{tenant: a, sloClass: batch, replicas: 2, gpu: {count: 5}}",
            RECENT,
        ),
    ]
    .concat();
    let d = run(&state(&nodes, &run_, &pend));
    assert_eq!(
        message(&d, "big"),
        "pool `train` has room for 1 of the 2 replicas the gang needs (12 GPUs free); \
         preemption not allowed: `b/hold-0` is non-preemptible, `b/hold-1` is non-preemptible"
    );
    let pair = admitted(&d, "pair");
    assert_eq!(pair.len(), 2);
    assert!(pair.iter().all(|b| b.gpus.len() == 5));
}

#[test]
fn min_member_places_what_fits_between_min_and_replicas() {
    let nodes = [node("t0", "train", 8)];
    let run_ = running(
        "hold",
        "{tenant: b, sloClass: critical, gpu: {count: 5}}",
        &[&gpus("t0", 0, 5)],
        EARLY,
    );
    let pend = pending(
        "sweep",
        "{tenant: a, sloClass: batch, replicas: 6, minMember: 2, gpu: {count: 1}}",
        RECENT,
    );
    let d = run(&state(&nodes, &run_, &pend));
    assert_eq!(admitted(&d, "sweep").len(), 3);
}

#[test]
fn required_topology_never_splits_a_gang_across_domains() {
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let run_ = [
        running(
            "hold-0",
            "{tenant: b, sloClass: critical, gpu: {count: 4}}",
            &[&gpus("t0", 0, 4)],
            EARLY,
        ),
        running(
            "hold-1",
            "{tenant: b, sloClass: critical, gpu: {count: 4}}",
            &[&gpus("t1", 0, 4)],
            EARLY,
        ),
    ]
    .concat();
    let tp = "{tenant: a, sloClass: batch, replicas: 8, gpu: {count: 1}, topology: {sameNvlinkDomain: required}}";
    let d = run(&state(&nodes, &run_, &pending("tp8", tp, RECENT)));
    let Outcome::Pending { reason } = &get(&d, "tp8").outcome else {
        panic!("tp8 placed");
    };
    let message = reason.to_string();
    assert!(
        matches!(reason, Reason::PreemptionNotAllowed { capacity, .. } if matches!(**capacity, Reason::NoNvlinkDomain { .. })),
        "{reason:?}"
    );
    assert!(
        message.starts_with(
            "no NVLink domain in pool `train` with 8 free GPUs for the gang (best has 4)"
        ),
        "{message}"
    );
    // The same gang without the requirement is split across the two nodes.
    let free = "{tenant: a, sloClass: batch, replicas: 8, gpu: {count: 1}}";
    let d = run(&state(&nodes, &run_, &pending("tp8", free, RECENT)));
    let nodes_used: std::collections::BTreeSet<String> =
        admitted(&d, "tp8").into_iter().map(|b| b.node).collect();
    assert_eq!(nodes_used.len(), 2);
}

#[test]
fn best_fit_keeps_a_whole_node_free() {
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let run_ = running(
        "hold",
        "{tenant: b, sloClass: critical, gpu: {count: 4}}",
        &[&gpus("t0", 0, 4)],
        EARLY,
    );
    let d = run(&state(
        &nodes,
        &run_,
        &pending(
            "two",
            "{tenant: a, sloClass: batch, gpu: {count: 2}}",
            RECENT,
        ),
    ));
    assert_eq!(admitted(&d, "two")[0].node, "t0");
    let train = d.pools.iter().find(|p| p.pool == "train").unwrap();
    assert_eq!(train.free_nodes, 1);
}

#[test]
fn a_cpu_light_replica_goes_where_the_cpu_is_short() {
    // t0 has 192 cores, t1 64. Each runs two 1-GPU replicas, one asking 2 cores (A) and one
    // 30 (B): the mix asks 16 cores per GPU, so t1 (6 GPUs free, 32 cores left) can feed 2 of
    // its free GPUs and t0 (6 free, 160 cores) all of them. A 1-GPU, 2-core replica scores the
    // same on both (FGD's tier and the hosting lost tie; so do their free GPUs), and best fit
    // alone would take t0, the first node. On t1 it feeds what t1's CPU could not, and leaves
    // t0's CPU to work that needs it; a 30-core replica goes to t0.
    let nodes = [
        node("t0", "train", 8),
        node("t1", "train", 8).replace("cpu: 192", "cpu: 64"),
    ];
    let spec =
        |cpu: u32| format!("{{tenant: b, sloClass: critical, gpu: {{count: 1}}, cpu: {cpu}}}");
    let run_ = [
        running("a0", &spec(2), &[&gpus("t0", 0, 1)], EARLY),
        running("b0", &spec(30), &[&gpus("t0", 1, 2)], EARLY),
        running("a1", &spec(2), &[&gpus("t1", 0, 1)], EARLY),
        running("b1", &spec(30), &[&gpus("t1", 1, 2)], EARLY),
    ]
    .concat();
    let ask = |cpu: u32| format!("{{tenant: a, sloClass: batch, gpu: {{count: 1}}, cpu: {cpu}}}");
    let d = run(&state(&nodes, &run_, &pending("light", &ask(2), RECENT)));
    assert_eq!(admitted(&d, "light")[0].node, "t1");
    let d = run(&state(&nodes, &run_, &pending("heavy", &ask(30), RECENT)));
    assert_eq!(admitted(&d, "heavy")[0].node, "t0");
}

#[test]
fn an_idle_pool_is_scored_against_the_fleets_mix() {
    // `big` (one node of 256 cores) runs nothing; `train` runs a 4-GPU replica on t0 (4 GPUs
    // free) and an 8-GPU one on t1. A 4-GPU replica that may use either pool fills t0 and
    // leaves `big`'s node whole for the 8-GPU shape the fleet runs. Scoring nothing in an idle
    // pool made it every placement's first choice, and the replica broke `big`'s node.
    let fleet = FLEET
        .replace(
            "guarantee: {train: 16, infer: 2, share: 2}",
            "guarantee: {train: 16, infer: 2, share: 2, big: 8}",
        )
        .replace(
            "guarantee: {train: 8, infer: 1, share: 1}",
            "guarantee: {train: 8, infer: 1, share: 1, big: 4}",
        )
        .replace("limit: {train: 16}", "limit: {train: 16, big: 8}")
        + "---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {name: big}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {nodes: 1, gpusPerNode: 8, cpuPerNode: 256, memoryPerNode: 2Ti}
  sharing: exclusive
";
    let nodes = [
        node("t0", "train", 8),
        node("t1", "train", 8),
        node("b0", "big", 8).replace("cpu: 192", "cpu: 256"),
    ];
    let run_ = [
        running(
            "four",
            "{tenant: a, sloClass: critical, gpu: {count: 4}}",
            &[&gpus("t0", 0, 4)],
            EARLY,
        ),
        running(
            "eight",
            "{tenant: b, sloClass: critical, gpu: {count: 8}}",
            &[&gpus("t1", 0, 8)],
            EARLY,
        ),
    ]
    .concat();
    let pend = pending(
        "more",
        "{tenant: a, sloClass: batch, gpu: {count: 4}}",
        RECENT,
    );
    let d = run_with(&fleet, &state(&nodes, &run_, &pend));
    assert_eq!(admitted(&d, "more")[0].node, "t0");

    // The pools' reports still measure a pool against its own running work only: with 100
    // cores, `big`'s node could not host the 8-GPU replica if it asked 150, so against the
    // fleet's mix half of it would count as fragmented (4 GPUs).
    let nodes = [
        node("t0", "train", 8),
        node("t1", "train", 8),
        node("b0", "big", 8).replace("cpu: 192", "cpu: 100"),
    ];
    let run_ = run_.replace(
        "{tenant: b, sloClass: critical, gpu: {count: 8}}",
        "{tenant: b, sloClass: critical, gpu: {count: 8}, cpu: 150}",
    );
    let d = run_with(
        &fleet.replace("cpuPerNode: 256", "cpuPerNode: 100"),
        &state(&nodes, &run_, ""),
    );
    let big = d.pools.iter().find(|p| p.pool == "big").unwrap();
    assert_eq!(big.fragmentation.as_f64(), 0.0);
}

/// The test fleet with one more pool of one H100 node, `gpus` GPUs and `cpu` cores, that both
/// tenants are guaranteed all of (an MPS pool takes 4 clients a GPU).
fn fleet_with_pool(name: &str, gpus: u32, cpu: u32, sharing: &str) -> String {
    let clients = if sharing == "mps" {
        "  maxClientsPerGpu: 4\n"
    } else {
        ""
    };
    FLEET
        .replace(
            "guarantee: {train: 16, infer: 2, share: 2}",
            &format!("guarantee: {{train: 16, infer: 2, share: 2, {name}: {gpus}}}"),
        )
        .replacen(
            "guarantee: {train: 8, infer: 1, share: 1}",
            &format!("guarantee: {{train: 8, infer: 1, share: 1, {name}: {gpus}}}"),
            1,
        )
        + &format!(
            "---
apiVersion: tessera/v1alpha1
kind: Pool
metadata: {{name: {name}}}
spec:
  gpuModel: H100-SXM5-80GB
  capacity: {{nodes: 1, gpusPerNode: {gpus}, cpuPerNode: {cpu}, memoryPerNode: 2Ti}}
  sharing: {sharing}
{clients}"
        )
}

/// The test fleet with a `weak` pool of one exclusive 8-GPU node, `w0`, of `weak_cpu` cores,
/// and its nodes: `t0` and `t1` in `train` (192 cores each), then `w0`.
fn train_and_weak(weak_cpu: u32) -> (String, [String; 3]) {
    let nodes = [
        node("t0", "train", 8),
        node("t1", "train", 8),
        node("w0", "weak", 8).replace("cpu: 192", &format!("cpu: {weak_cpu}")),
    ];
    (fleet_with_pool("weak", 8, weak_cpu, "exclusive"), nodes)
}

#[test]
fn among_pools_that_tie_the_least_versatile_takes_the_work() {
    // `train` (192 cores a node) and `weak` (32 cores, listed after it: pools are listed by
    // name) each run one 1-GPU, 4-core replica on their first node; the `share` pool runs a 1-GPU replica asking 100
    // cores, a shape `train` could host and `weak` could not. A 1-GPU, 4-core arrival ties in
    // both pools on FGD's tier (each pool's own mix is the 4-core shape, which both nodes
    // still host after it) and on the GPUs it feeds at the fleet's 36 cores a GPU (one less
    // unfed GPU's worth on either). The tie went to the pool listed first; the least
    // versatile pool now takes it, and `train`'s cores stay for the 100-core shape.
    let fleet = fleet_with_pool("weak", 8, 32, "exclusive");
    let nodes = [
        node("t0", "train", 8),
        node("t1", "train", 8),
        node("s0", "share", 2),
        node("w0", "weak", 8).replace("cpu: 192", "cpu: 32"),
    ];
    let light = "{tenant: a, sloClass: critical, gpu: {count: 1}, cpu: 4}";
    let run_ = [
        running("light-t", light, &[&gpus("t0", 0, 1)], EARLY),
        running("light-w", light, &[&gpus("w0", 0, 1)], EARLY),
        running(
            "heavy",
            "{tenant: b, sloClass: notebook, gpu: {count: 1}, cpu: 100}",
            &[&gpus("s0", 0, 1)],
            EARLY,
        ),
    ]
    .concat();
    let d = run_with(
        &fleet,
        &state(&nodes, &run_, &pending("one", light, RECENT)),
    );
    assert_eq!(admitted(&d, "one")[0].node, "w0");
}

#[test]
fn the_pool_that_outclasses_the_other_is_kept_for_last() {
    // `train` (192 cores a node) and `weak` (96) each run one 1-GPU, 4-core replica. Every
    // `weak` node is matched by a `train` node and more, and only `train` has nodes of 192
    // cores: work either pool can take goes to `weak`, and `train` stays for work only it can
    // host. A 1-GPU, 60-core arrival ties in both on the unfed GPUs (none), the tier and the
    // versatility; the tie went to the pool listed first, `train`.
    let (fleet, nodes) = train_and_weak(96);
    let light = "{tenant: a, sloClass: critical, gpu: {count: 1}, cpu: 4}";
    let run_ = [
        running("light-t", light, &[&gpus("t0", 0, 1)], EARLY),
        running("light-w", light, &[&gpus("w0", 0, 1)], EARLY),
    ]
    .concat();
    let arrival = "{tenant: a, sloClass: critical, gpu: {count: 1}, cpu: 60}";
    let d = run_with(
        &fleet,
        &state(&nodes, &run_, &pending("one", arrival, RECENT)),
    );
    assert_eq!(admitted(&d, "one")[0].node, "w0");
}

#[test]
fn small_work_goes_to_the_pool_a_large_running_shape_cannot_use() {
    // `train` (192 cores a node) runs a 4-GPU, 100-core replica and a 1-GPU one on `t0`;
    // `weak` (32 cores) runs a 1-GPU one on `w0`. Against its own work alone, `weak` scores a
    // 1-GPU arrival at 50 (it packs the pool's one shape exactly) and `train` better, at 38
    // (it lowers the room the 4-GPU shape cannot use on `t0`). The 4-GPU shape is the fleet's
    // and no `weak` node has its cores: `weak` is scored with it too, where all of a node's
    // idle room is a fragment for it, so the arrival scores 38 there as well, and the pool
    // choice's next criterion sends it to `weak`, whose GPUs it feeds.
    let (fleet, nodes) = train_and_weak(32);
    let light = "{tenant: a, sloClass: critical, gpu: {count: 1}, cpu: 4}";
    let run_ = [
        running(
            "large",
            "{tenant: b, sloClass: notebook, gpu: {count: 4}, cpu: 100}",
            &[&gpus("t0", 0, 4)],
            EARLY,
        ),
        running("light-t", light, &[&gpus("t0", 4, 5)], EARLY),
        running("light-w", light, &[&gpus("w0", 0, 1)], EARLY),
    ]
    .concat();
    let d = run_with(
        &fleet,
        &state(&nodes, &run_, &pending("one", light, RECENT)),
    );
    assert_eq!(admitted(&d, "one")[0].node, "w0");
    // The pool's report measures its own work only: the 1-GPU shape can use all 6 idle GPUs
    // of `w0` (24 cores left), and the 4-GPU shape is not `weak`'s.
    let weak = d.pools.iter().find(|p| p.pool == "weak").unwrap();
    assert_eq!(weak.fragmentation.as_f64(), 0.0);
}

#[test]
fn work_keeps_off_the_last_node_of_a_shape_only_one_pool_can_host() {
    // `train` (192 cores a node) runs a 4-GPU, 150-core replica and four 1-GPU ones on `t0`,
    // which they fill; `t1` is empty. No `weak` node (64 cores) has the cores for the 150-core
    // shape: `train` is its only home, and `t1` the last node that could host one more. A
    // 1-GPU, 50-core arrival scores better in `train` (tier 65 on `t1`: of its mix's five
    // replicas, the one 150-core replica loses its room) than in `weak` (96 on `w0`: against
    // the fleet's mix, its 14 cores left would feed 3 of the 7 GPUs left for the 1-GPU shape),
    // but on `t1` it would break the 150-core shape's last home: it goes to `weak`.
    let (fleet, nodes) = train_and_weak(64);
    let small = "{tenant: b, sloClass: critical, gpu: {count: 1}, cpu: 4}";
    let mut run_ = running(
        "large",
        "{tenant: b, sloClass: notebook, gpu: {count: 4}, cpu: 150}",
        &[&gpus("t0", 0, 4)],
        EARLY,
    );
    for i in 4..8 {
        run_ += &running(
            &format!("small-{i}"),
            small,
            &[&gpus("t0", i, i + 1)],
            EARLY,
        );
    }
    let arrival = "{tenant: a, sloClass: critical, gpu: {count: 1}, cpu: 50}";
    let d = run_with(
        &fleet,
        &state(&nodes, &run_, &pending("one", arrival, RECENT)),
    );
    assert_eq!(admitted(&d, "one")[0].node, "w0");
}

#[test]
fn a_fraction_of_a_gpu_left_unfed_does_not_outweigh_the_tier() {
    // `weak`: three 8-GPU nodes of 192 cores. `w0` runs an 8-GPU, 150-core replica, `w1` a
    // 1-GPU, 48-core one, `w2` nothing: the running work asks 22 cores a GPU, at which `w1`'s
    // 144 cores feed 6.5 of its 7 free GPUs. A 1-GPU, 40-core arrival would leave 0.82 more
    // GPUs unfed on `w1` and 0.09 on `w2`, whose 192 cores feed all 8 before: both are part
    // of a GPU, so the tier decides. On `w2` it would take the last node that could host the
    // 8-GPU shape (tier 98); on `w1` it fragments less (38). Compared in GPU units, the 0.09
    // won and the empty node was broken.
    let fleet = fleet_with_pool("weak", 8, 192, "exclusive")
        .replace("weak: 8}", "weak: 24}")
        .replace("{nodes: 1, gpusPerNode: 8", "{nodes: 3, gpusPerNode: 8");
    let nodes = ["w0", "w1", "w2"].map(|n| node(n, "weak", 8));
    let run_ = [
        running(
            "large",
            "{tenant: a, sloClass: critical, gpu: {count: 8}, cpu: 150}",
            &[&gpus("w0", 0, 8)],
            EARLY,
        ),
        running(
            "small",
            "{tenant: a, sloClass: critical, gpu: {count: 1}, cpu: 48}",
            &[&gpus("w1", 0, 1)],
            EARLY,
        ),
    ]
    .concat();
    let arrival = "{tenant: a, sloClass: critical, gpu: {count: 1}, cpu: 40}";
    let d = run_with(
        &fleet,
        &state(&nodes, &run_, &pending("one", arrival, RECENT)),
    );
    assert_eq!(admitted(&d, "one")[0].node, "w1");
}

#[test]
fn a_share_goes_to_the_pool_whose_gpus_its_cpu_feeds() {
    // Two MPS pools: `share` (192 cores a node) runs a half, `lean` (8 cores, listed first)
    // a 0.3; the fleet's running work asks 50 cores a GPU (the 100-core replica on `t0` over
    // 2 GPUs). On FGD's tier `share` wins for a half asking 4 cores: there it packs the
    // pool's own mix exactly, in `lean` it leaves room no 0.3 can use. On `lean`'s node, whose
    // 8 cores feed 0.16 of its 1.7 free GPUs, it leaves 0.42 fewer GPUs unfed (it takes half
    // a GPU and the CPU of 0.08): a share's pool is chosen by the unfed GPUs first, as its
    // node is.
    let fleet = fleet_with_pool("lean", 2, 8, "mps");
    let nodes = [
        node("t0", "train", 8),
        node("s0", "share", 2),
        node("l0", "lean", 2).replace("cpu: 192", "cpu: 8"),
    ];
    let run_ = [
        running(
            "heavy",
            "{tenant: b, sloClass: notebook, gpu: {count: 1}, cpu: 100}",
            &[&gpus("t0", 0, 1)],
            EARLY,
        ),
        running(
            "half",
            "{tenant: b, sloClass: notebook, gpu: {fraction: 0.5}}",
            &["{node: s0, gpus: [0], share: 0.5}"],
            EARLY,
        ),
        running(
            "third",
            "{tenant: b, sloClass: notebook, gpu: {fraction: 0.3}}",
            &["{node: l0, gpus: [0], share: 0.3}"],
            EARLY,
        ),
    ]
    .concat();
    let pend = pending(
        "one",
        "{tenant: a, sloClass: notebook, gpu: {fraction: 0.5}, cpu: 4}",
        RECENT,
    );
    let d = run_with(&fleet, &state(&nodes, &run_, &pend));
    assert_eq!(admitted(&d, "one")[0].node, "l0");
}

#[test]
fn a_pool_reports_fgd_fragmentation_against_its_running_mix() {
    // Running: two 4-GPU replicas and one 1-GPU replica. t0 has 3 GPUs idle, which a 4-GPU
    // replica (2 of the mix's 3) cannot use and a 1-GPU replica can; t1 has 4, which both can.
    // Expected fragmentation: (2 x 3 GPUs + 1 x 0) / 3 replicas = 2 GPUs.
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let spec = |n: u32| format!("{{tenant: b, sloClass: critical, gpu: {{count: {n}}}}}");
    let run_ = [
        running("four-a", &spec(4), &[&gpus("t0", 0, 4)], EARLY),
        running("one", &spec(1), &[&gpus("t0", 4, 5)], EARLY),
        running("four-b", &spec(4), &[&gpus("t1", 0, 4)], EARLY),
    ]
    .concat();
    let d = run(&state(&nodes, &run_, ""));
    let pool = |name: &str| d.pools.iter().find(|p| p.pool == name).unwrap();
    assert_eq!(pool("train").fragmentation.as_f64(), 2.0);
    assert_eq!(pool("train").stranded.as_f64(), 0.0, "nothing is pending");
    // A pool that runs nothing has no mix to measure against.
    assert_eq!(pool("infer").fragmentation.as_f64(), 0.0);
}

/// A 3-GPU replica on `t0` and a 4-GPU one on `t1`, neither asking CPU: 5 and 4 GPUs free.
fn three_and_four_running() -> String {
    [
        running(
            "three",
            "{tenant: b, sloClass: critical, gpu: {count: 3}}",
            &[&gpus("t0", 0, 3)],
            EARLY,
        ),
        running(
            "four",
            "{tenant: b, sloClass: critical, gpu: {count: 4}}",
            &[&gpus("t1", 0, 4)],
            EARLY,
        ),
    ]
    .concat()
}

#[test]
fn a_replica_goes_where_it_strands_least_of_the_running_mix() {
    // 5 and 4 GPUs free, with 3- and 4-GPU work running. Best fit would put one more GPU on
    // the node with 4 free and leave 5 and 3 (room for one 4-GPU replica); the mix-aware score
    // leaves 4 and 4 (room for two).
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let run_ = three_and_four_running();
    let pend = pending(
        "one",
        "{tenant: a, sloClass: batch, gpu: {count: 1}}",
        RECENT,
    );
    let d = run(&state(&nodes, &run_, &pend));
    assert_eq!(admitted(&d, "one")[0].node, "t0");
}

#[test]
fn a_replica_goes_first_where_its_cpu_leaves_no_gpu_unfed() {
    // The setting of the test above, with `t0` short of CPU: 64 cores, where the fleet's
    // running work asks 12.5 cores a GPU (the 100-core replica on `s0` over 8 GPUs). The score
    // (against the train pool's mix, which asks no CPU) would still take `t0` and leave 4 GPUs
    // with 24 cores, 2 GPUs' worth more than they can feed; `t1` has the CPU for all of its
    // GPUs after it, so the 40-core replica goes there.
    let nodes = [
        node("t0", "train", 8).replace("cpu: 192", "cpu: 64"),
        node("t1", "train", 8),
        node("s0", "share", 2),
    ];
    let run_ = three_and_four_running()
        + &running(
            "heavy",
            "{tenant: b, sloClass: notebook, gpu: {count: 1}, cpu: 100}",
            &[&gpus("s0", 0, 1)],
            EARLY,
        );
    let pend = pending(
        "one",
        "{tenant: a, sloClass: batch, gpu: {count: 1}, cpu: 40}",
        RECENT,
    );
    let d = run(&state(&nodes, &run_, &pend));
    assert_eq!(admitted(&d, "one")[0].node, "t1");
}

#[test]
fn a_share_goes_where_it_keeps_room_for_the_running_shapes() {
    // GPU 0 holds a quarter, GPU 1 a half, and both shapes run. The most loaded GPU (1) would
    // leave room for one more half; GPU 0 leaves room for two.
    let nodes = [node("s0", "share", 2)];
    let run_ = [
        running(
            "quarter",
            "{tenant: a, sloClass: notebook, gpu: {fraction: 0.25}}",
            &["{node: s0, gpus: [0], share: 0.25}"],
            EARLY,
        ),
        running(
            "half",
            "{tenant: a, sloClass: notebook, gpu: {fraction: 0.5}}",
            &["{node: s0, gpus: [1], share: 0.5}"],
            EARLY,
        ),
    ]
    .concat();
    let pend = pending(
        "another-quarter",
        "{tenant: a, sloClass: notebook, gpu: {fraction: 0.25}}",
        RECENT,
    );
    let d = run(&state(&nodes, &run_, &pend));
    assert_eq!(admitted(&d, "another-quarter")[0].gpus, vec![0]);
}

#[test]
fn a_share_fills_a_shared_gpu_before_it_breaks_an_empty_one() {
    // s0's GPU holds a half, s1's is empty, and halves are the running mix. A quarter on
    // either costs its node one half it could host and a quarter of idle room no half fits,
    // so the node is best fit's: s0, which keeps s1's GPU whole for what comes next, a
    // whole-GPU replica or two halves. (Where FGD's score and best fit disagree on a share's
    // node, best fit decides: `fragmentation.rs`; that case needs a mix the size of a trace.)
    let fleet = FLEET.replace(
        "capacity: {nodes: 1, gpusPerNode: 2, cpuPerNode: 192, memoryPerNode: 2Ti}\n  sharing: mps",
        "capacity: {nodes: 2, gpusPerNode: 1, cpuPerNode: 192, memoryPerNode: 2Ti}\n  sharing: mps",
    );
    assert_ne!(fleet, FLEET, "the share pool's capacity line moved");
    let nodes = [node("s0", "share", 1), node("s1", "share", 1)];
    let run_ = running(
        "half",
        "{tenant: a, sloClass: notebook, gpu: {fraction: 0.5}}",
        &["{node: s0, gpus: [0], share: 0.5}"],
        EARLY,
    );
    let pend = pending(
        "quarter",
        "{tenant: a, sloClass: notebook, gpu: {fraction: 0.25}}",
        RECENT,
    );
    let d = run_with(&fleet, &state(&nodes, &run_, &pend));
    assert_eq!(admitted(&d, "quarter")[0].node, "s0");
}

const BALANCED: &[(&str, u8)] = &[
    ("2g.20gb", 0),
    ("1g.10gb", 2),
    ("1g.10gb", 3),
    ("3g.40gb", 4),
];

#[test]
fn a_mig_request_takes_a_free_existing_instance_without_reconfiguring() {
    let nodes = [mig_node("m0", "infer", &[BALANCED, BALANCED])];
    let run_ = running(
        "api",
        "{tenant: b, sloClass: serving, gpu: {migProfile: 3g.40gb}}",
        &["{node: m0, gpus: [0], migStart: 4}"],
        EARLY,
    );
    let pend = pending(
        "embed",
        "{tenant: a, sloClass: serving, gpu: {migProfile: 1g.10gb}}",
        RECENT,
    );
    let d = run(&state(&nodes, &run_, &pend));
    let b = &admitted(&d, "embed")[0];
    assert_eq!(b.mig_profile.as_deref(), Some("1g.10gb"));
    assert!(b.mig_start == Some(2) || b.mig_start == Some(3));
    // The tightest GPU: the one already partly used.
    assert_eq!(b.gpus, vec![0]);
    assert!(
        d.geometry
            .iter()
            .all(|g| g.create.is_empty() && g.destroy.is_empty())
    );
}

#[test]
fn a_mig_profile_is_the_same_in_any_case_or_by_its_id() {
    // The catalog's rule: a profile by its name in any case, or by its ID as a decimal. The
    // snapshot's instances and the requests below spell them every way, and the decision is
    // the one the catalog's spelling gives (the test above).
    const SPELLED: &[(&str, u8)] = &[
        ("2G.20GB", 0),
        ("\"19\"", 2),
        ("1g.10GB", 3),
        ("\" 3g.40gb\"", 4),
    ];
    let nodes = [mig_node("m0", "infer", &[SPELLED, BALANCED])];
    let run_ = running(
        "api",
        "{tenant: b, sloClass: serving, gpu: {migProfile: 3G.40GB}}",
        &["{node: m0, gpus: [0], migStart: 4}"],
        EARLY,
    );
    for asked in ["1G.10GB", "19", "1g.10gb"] {
        let pend = pending(
            "embed",
            &format!("{{tenant: a, sloClass: serving, gpu: {{migProfile: \"{asked}\"}}}}"),
            RECENT,
        );
        let d = run(&state(&nodes, &run_, &pend));
        let b = &admitted(&d, "embed")[0];
        assert_eq!(
            b.mig_profile.as_deref(),
            Some("1g.10gb"),
            "asked as {asked}"
        );
        assert!(b.mig_start == Some(2) || b.mig_start == Some(3));
        assert_eq!(b.gpus, vec![0], "asked as {asked}");
        assert!(
            d.geometry
                .iter()
                .all(|g| g.create.is_empty() && g.destroy.is_empty()),
            "asked as {asked}: {:?}",
            d.geometry
        );
    }
}

#[test]
fn a_mig_request_reconfigures_an_idle_part_and_keeps_busy_instances() {
    // Both 3g instances are busy; a second 3g needs a GPU re-laid out as two-3g around its
    // busy 3g@4. GPU 0's 2g is busy too and blocks it; GPU 1 is re-laid out.
    let nodes = [mig_node("m0", "infer", &[BALANCED, BALANCED])];
    let run_ = [
        running(
            "api-0",
            "{tenant: b, sloClass: serving, gpu: {migProfile: 3g.40gb}}",
            &["{node: m0, gpus: [0], migStart: 4}"],
            EARLY,
        ),
        running(
            "api-1",
            "{tenant: b, sloClass: serving, gpu: {migProfile: 3g.40gb}}",
            &["{node: m0, gpus: [1], migStart: 4}"],
            EARLY,
        ),
        running(
            "small",
            "{tenant: b, sloClass: serving, gpu: {migProfile: 2g.20gb}}",
            &["{node: m0, gpus: [0], migStart: 0}"],
            EARLY,
        ),
    ]
    .concat();
    let pend = pending(
        "chat",
        "{tenant: a, sloClass: serving, gpu: {migProfile: 3g.40gb}}",
        RECENT,
    );
    let d = run(&state(&nodes, &run_, &pend));
    let b = &admitted(&d, "chat")[0];
    assert_eq!((b.gpus.clone(), b.mig_start), (vec![1], Some(0)));
    let g0 = &d.geometry[0];
    let g1 = &d.geometry[1];
    assert!(g0.create.is_empty() && g0.destroy.is_empty());
    let starts = |v: &[tessera_solver::decision::Instance]| {
        v.iter()
            .map(|i| (i.profile.clone(), i.start))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        starts(&g1.target),
        vec![("3g.40gb".to_owned(), 0), ("3g.40gb".to_owned(), 4)]
    );
    assert_eq!(starts(&g1.create), vec![("3g.40gb".to_owned(), 0)]);
    assert_eq!(g1.destroy.len(), 3);
    assert!(!g1.drain);
    for g in &d.geometry {
        let target: Vec<_> = g
            .target
            .iter()
            .map(|i| tessera_compiler::mig::Placement::new(i.profile_id, i.start))
            .collect();
        assert_eq!(tessera_compiler::mig::validate(&target), Ok(()));
    }
}

#[test]
fn a_mig_gpu_is_stranded_where_no_layout_could_host_what_waits() {
    // Both GPUs hold a busy 3g@4, GPU 0 a busy 2g@0 too: 2/7 and 4/7 of a GPU free. A waiting
    // 7g could use neither, laid out as they are or re-laid out around the busy instances: the
    // free room is stranded. A waiting gang of eight 1g instances does not fit either, but
    // each GPU has a free 1g: with it waiting too, nothing is stranded.
    let nodes = [mig_node("m0", "infer", &[BALANCED, BALANCED])];
    let serving = |tenant: &str, profile: &str| {
        format!(
            "{{tenant: {tenant}, sloClass: serving, replicas: 1, gpu: {{migProfile: {profile}}}}}"
        )
    };
    let run_ = [
        running(
            "api-0",
            &serving("b", "3g.40gb"),
            &["{node: m0, gpus: [0], migStart: 4}"],
            EARLY,
        ),
        running(
            "api-1",
            &serving("b", "3g.40gb"),
            &["{node: m0, gpus: [1], migStart: 4}"],
            EARLY,
        ),
        running(
            "small",
            &serving("b", "2g.20gb"),
            &["{node: m0, gpus: [0], migStart: 0}"],
            EARLY,
        ),
    ]
    .concat();
    let whole = pending("whole", &serving("a", "7g.80gb"), RECENT);
    let gang = pending(
        "gang",
        &serving("a", "1g.10gb").replace("replicas: 1", "replicas: 8"),
        RECENT,
    );
    let infer = |pend: &str| {
        let d = run(&state(&nodes, &run_, pend));
        assert!(
            d.workloads
                .iter()
                .all(|w| w.tenant == "b" || matches!(w.outcome, Outcome::Pending { .. }))
        );
        d.pools.into_iter().find(|p| p.pool == "infer").unwrap()
    };
    let alone = infer(&whole);
    assert_eq!(
        (alone.free, alone.stranded),
        (Gpus::sevenths(6), Gpus::sevenths(6))
    );
    let beside = infer(&(whole + &gang));
    assert_eq!(
        (beside.free, beside.stranded),
        (Gpus::sevenths(6), Gpus::ZERO)
    );
}

#[test]
fn a_degraded_gpu_is_left_as_it_is_and_the_rest_of_the_fleet_is_decided() {
    // GPU 0 holds an instance made by hand in a profile the catalog lacks (NVML shows its
    // profile ID, and the reconciler reports the GPU degraded); GPU 1 is degraded with half a
    // layout. Neither may be re-partitioned or receive work; GPU 2 takes the request.
    let degraded = |yaml: String, index: u32| {
        let at = format!("        - index: {index}\n");
        let (head, tail) = yaml.split_at(yaml.find(&at).expect("the GPU"));
        let tail = tail.replacen(
            "          mig: {enabled: true}\n",
            "          health: degraded\n          mig: {enabled: true}\n",
            1,
        );
        format!("{head}{tail}")
    };
    let node = mig_node(
        "m0",
        "infer",
        &[&[("'10'", 0), ("3g.40gb", 4)], &[("3g.40gb", 4)], BALANCED],
    );
    let nodes = [degraded(degraded(node, 0), 1)];
    let pend = pending(
        "chat",
        "{tenant: a, sloClass: serving, gpu: {migProfile: 3g.40gb}}",
        RECENT,
    );
    let d = run(&state(&nodes, "", &pend));
    let b = &admitted(&d, "chat")[0];
    assert_eq!((b.gpus.clone(), b.mig_start), (vec![2], Some(4)));
    for g in d.geometry.iter().filter(|g| g.gpu < 2) {
        assert!(
            g.create.is_empty() && g.destroy.is_empty() && !g.enable_mig,
            "a degraded GPU was re-partitioned: {g:?}"
        );
    }
}

#[test]
fn reconfiguration_budget_is_per_gpu_per_decision() {
    // GPU 0 is empty, GPU 1 holds a busy 7g. The first 2g lays GPU 0 out as `balanced`; the
    // second would need it re-laid out again as `three-2g` around the busy 2g, but the pool
    // allows one change per GPU.
    let nodes = [mig_node("m0", "infer", &[&[], &[("7g.80gb", 0)]])];
    let run_ = running(
        "big",
        "{tenant: b, sloClass: serving, gpu: {migProfile: 7g.80gb}}",
        &["{node: m0, gpus: [1], migStart: 0}"],
        EARLY,
    );
    let pend = [
        pending(
            "first",
            "{tenant: a, sloClass: serving, gpu: {migProfile: 2g.20gb}}",
            "2026-11-20T07:00:00Z",
        ),
        pending(
            "second",
            "{tenant: a, sloClass: serving, gpu: {migProfile: 2g.20gb}}",
            RECENT,
        ),
    ]
    .concat();
    let d = run(&state(&nodes, &run_, &pend));
    let b = &admitted(&d, "first")[0];
    assert_eq!((b.gpus.clone(), b.mig_start), (vec![0], Some(0)));
    assert_eq!(d.geometry[0].target.len(), 4);
    assert_eq!(d.geometry[0].create.len(), 4);
    assert!(d.geometry[0].destroy.is_empty() && !d.geometry[0].drain);
    assert_eq!(
        message(&d, "second"),
        "reconfiguration budget spent on GPU m0/0 of pool `infer`; preemption not allowed: \
         `b/big` is non-preemptible"
    );
}

fn reclaim_state(b2_class: &str, b2_started: &str) -> String {
    reclaim_state2("batch", b2_class, b2_started)
}

fn reclaim_state2(b1_class: &str, b2_class: &str, b2_started: &str) -> String {
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let run_ = [
        running(
            "b-1",
            &format!("{{tenant: b, sloClass: {b1_class}, gpu: {{count: 8}}}}"),
            &[&gpus("t0", 0, 8)],
            "2026-11-20T05:00:00Z",
        ),
        running(
            "b-2",
            &format!("{{tenant: b, sloClass: {b2_class}, gpu: {{count: 8}}}}"),
            &[&gpus("t1", 0, 8)],
            b2_started,
        ),
    ]
    .concat();
    state(
        &nodes,
        &run_,
        &pending(
            "a-job",
            "{tenant: a, sloClass: batch, gpu: {count: 8}}",
            RECENT,
        ),
    )
}

#[test]
fn a_borrower_is_preempted_when_the_owner_needs_its_guarantee() {
    // b is guaranteed 8 and runs 16: b-2 (newer) is borrowed; a's job is within a's guarantee.
    let d = run(&reclaim_state("batch", EARLY));
    assert!(matches!(get(&d, "b-1").outcome, Outcome::Keep { .. }));
    match &get(&d, "b-2").outcome {
        Outcome::Preempt {
            grace_seconds,
            lost_gpu_seconds,
            reason,
        } => {
            assert_eq!(*grace_seconds, 300);
            assert_eq!(*lost_gpu_seconds, 8.0 * 7200.0);
            assert!(matches!(reason, PreemptReason::Reclaim { .. }));
            assert_eq!(
                reason.to_string(),
                "its borrowed capacity is reclaimed for `a/a-job`, within tenant `a`'s guarantee"
            );
        }
        other => panic!("b-2 not preempted: {other:?}"),
    }
    assert_eq!(admitted(&d, "a-job")[0].node, "t1");
    let b = d
        .usage
        .iter()
        .find(|u| u.tenant == "b" && u.pool == "train")
        .unwrap();
    assert_eq!(
        (b.total.to_string(), b.borrowed.to_string()),
        ("8".into(), "0".into())
    );
}

#[test]
fn a_non_preemptible_workload_is_never_preempted() {
    let d = run(&reclaim_state2("critical", "critical", EARLY));
    assert!(
        matches!(get(&d, "b-1").outcome, Outcome::Keep { .. }),
        "{:?}",
        get(&d, "b-1")
    );
    assert!(matches!(get(&d, "b-2").outcome, Outcome::Keep { .. }));
    assert_eq!(
        message(&d, "a-job"),
        "pool `train` is full: GPUs in use 16 of 16, request 8; \
         preemption not allowed: `b/b-1` is non-preemptible, `b/b-2` is non-preemptible"
    );
    // With b-2 non-preemptible and of a higher tier, it is b's guaranteed work: the older but
    // lower-tier b-1 is the borrowed part, and is reclaimed instead.
    let d = run(&reclaim_state("critical", EARLY));
    assert!(matches!(get(&d, "b-2").outcome, Outcome::Keep { .. }));
    assert!(matches!(
        get(&d, "b-1").outcome,
        Outcome::Preempt {
            reason: PreemptReason::Reclaim { .. },
            ..
        }
    ));
}

#[test]
fn min_runtime_is_honoured() {
    let d = run(&reclaim_state("batch", RECENT));
    assert!(matches!(get(&d, "b-2").outcome, Outcome::Keep { .. }));
    assert!(
        message(&d, "a-job").contains("`b/b-2` has not reached its minRuntime (20m left)"),
        "{}",
        message(&d, "a-job")
    );
}

#[test]
fn trust_domains_never_share_an_mps_gpu() {
    let nodes = [node("s0", "share", 1)];
    let run_ = running(
        "nb-a",
        "{tenant: a, sloClass: notebook, gpu: {fraction: 0.25}}",
        &["{node: s0, gpus: [0], share: 0.25}"],
        RECENT,
    );
    let pend = [
        pending(
            "nb-b",
            "{tenant: b, sloClass: notebook, gpu: {fraction: 0.25}}",
            RECENT,
        ),
        pending(
            "nb-a2",
            "{tenant: a, sloClass: notebook, gpu: {fraction: 0.5}}",
            RECENT,
        ),
    ]
    .concat();
    let d = run(&state(&nodes, &run_, &pend));
    assert_eq!(
        admitted(&d, "nb-a2")[0].share.map(|s| s.to_string()),
        Some("0.5".into())
    );
    assert!(message(&d, "nb-b").starts_with(
        "every GPU of pool `share` with room is shared with a trust domain other than `b`"
    ));
}

#[test]
fn quota_and_isolation_reasons_are_precise() {
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let pend = [
        pending(
            "huge",
            "{tenant: a, sloClass: batch, pool: train, replicas: 3, gpu: {count: 8}}",
            RECENT,
        ),
        pending(
            "sliced",
            "{tenant: a, sloClass: batch, gpu: {migProfile: 1g.10gb}}",
            RECENT,
        ),
    ]
    .concat();
    let d = run(&state(&nodes, "", &pend));
    assert_eq!(
        message(&d, "huge"),
        "quota exhausted at tenant `a` for pool `train`: GPUs usage 0 + request 24 > limit 16"
    );
    assert_eq!(
        message(&d, "sliced"),
        "isolation: only pools below class `batch`'s minimum `exclusive` could hold it (infer)"
    );
}

#[test]
fn a_workload_whose_tenant_left_the_policy_is_orphaned_not_dropped() {
    let nodes = [node("t0", "train", 8)];
    let (policy, mut st) = compile_all(&state(
        &nodes,
        &running(
            "old",
            "{tenant: b, sloClass: batch, gpu: {count: 2}}",
            &[&gpus("t0", 0, 2)],
            EARLY,
        ),
        &pending(
            "queued",
            "{tenant: a, sloClass: batch, gpu: {count: 1}}",
            RECENT,
        ),
    ));
    st.running[0].spec.tenant = "gone".into();
    st.pending[0].spec.tenant = "gone".into();
    let d = tessera_solver::solve(&policy, &st, &Default::default()).unwrap();
    assert_eq!(
        message(&d, "queued"),
        "orphaned: tenant `gone` was removed from the policy"
    );
    assert!(matches!(
        get(&d, "old").outcome,
        Outcome::Preempt {
            reason: PreemptReason::Orphaned { .. },
            ..
        }
    ));
}

#[test]
fn inconsistent_input_is_a_typed_error() {
    let nodes = [node("t0", "train", 8)];
    let (policy, mut st) = compile_all(&state(
        &nodes,
        &running(
            "old",
            "{tenant: b, sloClass: batch, gpu: {count: 2}}",
            &[&gpus("t0", 0, 2)],
            EARLY,
        ),
        "",
    ));
    st.running[0].bindings[0].gpus = vec![0, 9];
    let err = tessera_solver::solve(&policy, &st, &Default::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "inconsistent input: workload `b/old`: binding 0: GPU 9 of node `t0` does not exist"
    );
}

#[test]
fn a_gpu_is_found_by_its_device_index_when_the_indices_have_gaps() {
    let nodes = [node("t0", "train", 4)];
    let (policy, mut st) = compile_all(&state(
        &nodes,
        &running(
            "old",
            "{tenant: b, sloClass: batch, gpu: {count: 1}}",
            &["{node: t0, gpus: [3]}"],
            EARLY,
        ),
        "",
    ));
    // NVML numbers 0, 2, 5 and 7 here (devices hidden or failed between them).
    for (g, index) in st.nodes[0].gpus.iter_mut().zip([0, 2, 5, 7]) {
        g.index = index;
    }
    st.running[0].bindings[0].gpus = vec![5];
    let d = tessera_solver::solve(&policy, &st, &Default::default()).unwrap();
    match &get(&d, "old").outcome {
        Outcome::Keep { bindings } => assert_eq!(bindings[0].gpus, vec![5]),
        other => panic!("old should keep its GPU: {other:?}"),
    }
    // Position 1 exists, index 1 does not.
    st.running[0].bindings[0].gpus = vec![1];
    let err = tessera_solver::solve(&policy, &st, &Default::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "inconsistent input: workload `b/old`: binding 0: GPU 1 of node `t0` does not exist"
    );
}

#[test]
fn a_workload_listed_twice_is_a_typed_error_wherever_the_two_are() {
    // The compiler refuses a snapshot file that lists a workload twice; a snapshot the
    // service builds reaches the solver without it, and is checked there.
    let nodes = [node("t0", "train", 8)];
    let spec = |tenant: &str| format!("{{tenant: {tenant}, sloClass: batch, gpu: {{count: 1}}}}");
    // (running, pending, as (tenant, name); the workload named twice, if any)
    type Keys<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Keys, Keys, Option<&str>); 5] = [
        (&[("b", "x"), ("b", "y")], &[], None),
        (&[("a", "x"), ("b", "w")], &[("b", "x")], None),
        (&[("b", "x"), ("b", "x")], &[], Some("b/x")),
        (&[("b", "y"), ("a", "z")], &[("b", "y")], Some("b/y")),
        (&[("b", "y")], &[("a", "q"), ("a", "q")], Some("a/q")),
    ];
    for (run, wait, twice) in cases {
        let running_yaml: String = run
            .iter()
            .enumerate()
            .map(|(i, (t, _))| {
                running(
                    &format!("r{i}"),
                    &spec(t),
                    &[&gpus("t0", i as u32, i as u32 + 1)],
                    EARLY,
                )
            })
            .collect();
        let pending_yaml: String = wait
            .iter()
            .enumerate()
            .map(|(i, (t, _))| pending(&format!("p{i}"), &spec(t), RECENT))
            .collect();
        let (policy, mut st) = compile_all(&state(&nodes, &running_yaml, &pending_yaml));
        for (r, (_, name)) in st.running.iter_mut().zip(run) {
            r.name = (*name).into();
        }
        for (p, (_, name)) in st.pending.iter_mut().zip(wait) {
            p.name = (*name).into();
        }
        let got = tessera_solver::solve(&policy, &st, &Default::default());
        match twice {
            None => assert!(got.is_ok(), "{run:?} {wait:?}: {:?}", got.err()),
            Some(key) => assert_eq!(
                got.unwrap_err().to_string(),
                format!("inconsistent input: workload `{key}` is listed twice"),
                "{run:?} {wait:?}"
            ),
        }
    }
}

#[test]
fn the_quickstart_snapshot_solves_deterministically() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policies/quickstart"
    );
    let mut files = Vec::new();
    for name in [
        "cluster-state.yaml",
        "fleet.yaml",
        "tenants.yaml",
        "workloads.yaml",
    ] {
        let text = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
        files.push(tessera_compiler::SourceFile::new(name, text));
    }
    let c = tessera_compiler::compile(&files);
    let policy = c.policy.expect("quickstart compiles");
    let st = &c.states[0].1;
    let a =
        serde_json::to_string(&tessera_solver::solve(&policy, st, &Default::default()).unwrap())
            .unwrap();
    let b =
        serde_json::to_string(&tessera_solver::solve(&policy, st, &Default::default()).unwrap())
            .unwrap();
    assert_eq!(a, b);
    let d = tessera_solver::solve(&policy, st, &Default::default()).unwrap();
    // The 16-GPU gang waits: pretrain-7b runs within research's guarantee.
    assert!(matches!(
        get(&d, "pretrain-13b").outcome,
        Outcome::Pending { .. }
    ));
    assert!(matches!(get(&d, "chat-api").outcome, Outcome::Keep { .. }));
}

#[test]
fn reconfiguring_around_a_preempted_instance_needs_a_drain() {
    // GPU 0: b's notebook holds the 2g, b's service the 3g@4; GPU 1: b's 7g. A 3g for a (within
    // its guarantee) needs GPU 0 as two-3g: the notebook's borrowed 2g is reclaimed and the GPU
    // drains before it is re-laid out.
    let nodes = [mig_node("m0", "infer", &[BALANCED, &[("7g.80gb", 0)]])];
    let run_ = [
        running(
            "svc",
            "{tenant: b, sloClass: serving, gpu: {migProfile: 3g.40gb}}",
            &["{node: m0, gpus: [0], migStart: 4}"],
            EARLY,
        ),
        running(
            "big",
            "{tenant: b, sloClass: serving, gpu: {migProfile: 7g.80gb}}",
            &["{node: m0, gpus: [1], migStart: 0}"],
            EARLY,
        ),
        running(
            "nb",
            "{tenant: b, sloClass: notebook, gpu: {migProfile: 2g.20gb}}",
            &["{node: m0, gpus: [0], migStart: 0}"],
            EARLY,
        ),
    ]
    .concat();
    let pend = pending(
        "chat",
        "{tenant: a, sloClass: serving, gpu: {migProfile: 3g.40gb}}",
        RECENT,
    );
    let d = run(&state(&nodes, &run_, &pend));
    assert!(matches!(
        get(&d, "nb").outcome,
        Outcome::Preempt {
            grace_seconds: 30,
            reason: PreemptReason::Reclaim { .. },
            ..
        }
    ));
    let b = &admitted(&d, "chat")[0];
    assert_eq!((b.gpus.clone(), b.mig_start), (vec![0], Some(0)));
    let g0 = &d.geometry[0];
    assert!(g0.drain);
    assert_eq!(g0.destroy.len(), 3);
    assert!(matches!(get(&d, "svc").outcome, Outcome::Keep { .. }));
}

#[test]
fn quickstart_decision_snapshot() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policies/quickstart"
    );
    let files: Vec<_> = [
        "cluster-state.yaml",
        "fleet.yaml",
        "tenants.yaml",
        "workloads.yaml",
    ]
    .iter()
    .map(|name| {
        let text = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
        tessera_compiler::SourceFile::new(*name, text)
    })
    .collect();
    let c = tessera_compiler::compile(&files);
    let d = tessera_solver::solve(&c.policy.unwrap(), &c.states[0].1, &Default::default()).unwrap();
    insta::assert_json_snapshot!(d);
}

#[test]
fn preferred_topology_takes_one_node_when_one_holds_the_gang() {
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let run_ = running(
        "hold",
        "{tenant: b, sloClass: critical, gpu: {count: 5}}",
        &[&gpus("t0", 0, 5)],
        EARLY,
    );
    let spec = |mode: &str| {
        format!(
            "{{tenant: a, sloClass: batch, replicas: 4, gpu: {{count: 1}}, topology: {{sameNvlinkDomain: {mode}}}}}"
        )
    };
    let nodes_of = |d: &tessera_solver::Decision| {
        admitted(d, "gang")
            .into_iter()
            .map(|b| b.node)
            .collect::<std::collections::BTreeSet<_>>()
    };
    let d = run(&state(
        &nodes,
        &run_,
        &pending("gang", &spec("preferred"), RECENT),
    ));
    assert_eq!(nodes_of(&d), ["t1".to_owned()].into());
    // Without a preference, best fit fills t0's 3 free GPUs first.
    let d = run(&state(
        &nodes,
        &run_,
        &pending("gang", &spec("none"), RECENT),
    ));
    assert_eq!(nodes_of(&d), ["t0".to_owned(), "t1".to_owned()].into());
}

#[test]
fn borrowers_are_served_by_fair_share_before_submission_time() {
    // Guarantees of 4 each leave 8 GPUs of org's unassigned; a already borrows 2, b nothing.
    // Room is left for one more 4-GPU job: b's, though a's was submitted first.
    let fleet = FLEET.replace(
        "guarantee: {train: 8, infer: 1, share: 1}",
        "guarantee: {train: 4, infer: 1, share: 1}",
    );
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let run_ = [
        running(
            "a-run",
            "{tenant: a, sloClass: batch, gpu: {count: 6}}",
            &[&gpus("t0", 0, 6)],
            EARLY,
        ),
        running(
            "b-run",
            "{tenant: b, sloClass: batch, gpu: {count: 4}}",
            &[&gpus("t1", 0, 4)],
            EARLY,
        ),
    ]
    .concat();
    let pend = [
        pending(
            "a-more",
            "{tenant: a, sloClass: batch, gpu: {count: 4}}",
            "2026-11-20T07:00:00Z",
        ),
        pending(
            "b-more",
            "{tenant: b, sloClass: batch, gpu: {count: 4}}",
            RECENT,
        ),
    ]
    .concat();
    let d = run_with(&fleet, &state(&nodes, &run_, &pend));
    match &get(&d, "b-more").outcome {
        Outcome::Admit { borrowed, .. } => assert_eq!(borrowed.to_string(), "4"),
        other => panic!("b-more: {other:?}"),
    }
    assert_eq!(
        message(&d, "a-more"),
        "pool `train` lacks room: GPUs in use 14 of 16, request 4; \
         preemption not allowed: `a/a-run` is within its tenant's guarantee, `b/b-run` is within its \
         tenant's guarantee"
    );
}

#[test]
fn work_on_a_node_whose_pool_left_the_policy_is_orphaned() {
    let nodes = [node("t0", "train", 8)];
    let (policy, mut st) = compile_all(&state(
        &nodes,
        &running(
            "old",
            "{tenant: b, sloClass: batch, gpu: {count: 2}}",
            &[&gpus("t0", 0, 2)],
            EARLY,
        ),
        "",
    ));
    st.nodes[0].pool = "retired".into();
    let d = tessera_solver::solve(&policy, &st, &Default::default()).unwrap();
    assert_eq!(
        message(&d, "old"),
        "orphaned: pool `retired` of node `t0` was removed from the policy"
    );
    match &get(&d, "old").outcome {
        // 2 GPUs × 2 h since the start.
        Outcome::Preempt {
            lost_gpu_seconds, ..
        } => assert_eq!(*lost_gpu_seconds, 14_400.0),
        other => panic!("{other:?}"),
    }
}

/// A MIG node whose GPU 0 holds a free 7g (a 2g needs it destroyed) and GPU 1 a busy one,
/// with a 2g waiting; `records` is appended to the snapshot as its `reconfigurations`.
fn budget_state(records: &str) -> String {
    let nodes = [mig_node(
        "m0",
        "infer",
        &[&[("7g.80gb", 0)], &[("7g.80gb", 0)]],
    )];
    let run_ = running(
        "big",
        "{tenant: b, sloClass: serving, gpu: {migProfile: 7g.80gb}}",
        &["{node: m0, gpus: [1], migStart: 0}"],
        EARLY,
    );
    let pend = pending(
        "small",
        "{tenant: a, sloClass: serving, gpu: {migProfile: 2g.20gb}}",
        RECENT,
    );
    state(&nodes, &run_, &pend) + records
}

#[test]
fn a_change_recorded_in_the_last_hour_spends_the_gpus_budget() {
    // No record: GPU 0 is re-laid out, and the decision records the change for the next
    // snapshot.
    let d = run(&budget_state(""));
    assert_eq!(admitted(&d, "small")[0].gpus, vec![0]);
    let changed: Vec<_> = d
        .reconfigurations
        .iter()
        .map(|r| (r.node.as_str(), r.gpu, r.at.to_string()))
        .collect();
    assert_eq!(changed, [("m0", 0, "2026-11-20T08:00:00Z".to_string())]);

    // The pool allows one change per GPU and hour: one 30 minutes ago spends it.
    let spent = "  reconfigurations:\n    - {node: m0, gpu: 0, at: \"2026-11-20T07:30:00Z\"}\n";
    let d = run(&budget_state(spent));
    assert_eq!(
        message(&d, "small"),
        "reconfiguration budget spent on GPU m0/0 of pool `infer`; preemption not allowed: \
         `b/big` is non-preemptible"
    );
    assert!(d.geometry.iter().all(|g| g.destroy.is_empty()));
    // The record still counts at the next snapshot.
    let kept: Vec<_> = d
        .reconfigurations
        .iter()
        .map(|r| r.at.to_string())
        .collect();
    assert_eq!(kept, ["2026-11-20T07:30:00Z"]);

    // An hour later it no longer counts, and is not carried on.
    let old = "  reconfigurations:\n    - {node: m0, gpu: 0, at: \"2026-11-20T07:00:00Z\"}\n";
    let d = run(&budget_state(old));
    assert_eq!(admitted(&d, "small")[0].gpus, vec![0]);
    let at: Vec<_> = d
        .reconfigurations
        .iter()
        .map(|r| r.at.to_string())
        .collect();
    assert_eq!(at, ["2026-11-20T08:00:00Z"]);
}

#[test]
fn instances_on_an_empty_gpu_are_not_barred_by_past_changes() {
    // GPU 0 has no instances: laying a layout out on it destroys nothing, so the change of 30
    // minutes ago does not bar it, and nothing new is recorded.
    let nodes = [mig_node("m0", "infer", &[&[], &[("7g.80gb", 0)]])];
    let run_ = running(
        "big",
        "{tenant: b, sloClass: serving, gpu: {migProfile: 7g.80gb}}",
        &["{node: m0, gpus: [1], migStart: 0}"],
        EARLY,
    );
    let pend = pending(
        "small",
        "{tenant: a, sloClass: serving, gpu: {migProfile: 2g.20gb}}",
        RECENT,
    );
    let spent = "  reconfigurations:\n    - {node: m0, gpu: 0, at: \"2026-11-20T07:30:00Z\"}\n";
    let d = run(&(state(&nodes, &run_, &pend) + spent));
    assert_eq!(admitted(&d, "small")[0].gpus, vec![0]);
    let at: Vec<_> = d
        .reconfigurations
        .iter()
        .map(|r| r.at.to_string())
        .collect();
    assert_eq!(at, ["2026-11-20T07:30:00Z"]);
}

#[test]
fn a_snapshot_that_contradicts_itself_fails_at_its_first_contradiction_however_split() {
    // Running workloads are checked in (tenant, name) order. The compiler refuses such
    // snapshots; the solver is called by libraries too, so the valid snapshot is broken here.
    let nodes = [node("t0", "train", 8)];
    let spec = "{tenant: b, sloClass: critical, gpu: {count: 1}}";
    let names = ["a", "b", "c", "d", "e"];
    let run_: String = names
        .iter()
        .zip(0..)
        .map(|(name, g)| running(name, spec, &[&gpus("t0", g, g + 1)], EARLY))
        .collect();
    let (policy, valid) = compile_all(&state(&nodes, &run_, ""));
    let error = |broken: &tessera_compiler::model::ClusterStateSpec| {
        let sequential = tessera_solver::Problem::new(&policy, broken, None).err();
        for threads in [2, 3] {
            let split = tessera_solver::splitting_every_list(threads, || {
                tessera_solver::Problem::new(&policy, broken, None).err()
            });
            assert_eq!(
                split.as_ref().map(ToString::to_string),
                sequential.as_ref().map(ToString::to_string),
                "split across {threads} threads"
            );
        }
        sequential.map(|e| e.to_string()).unwrap_or_default()
    };
    assert_eq!(error(&valid), "");
    let named = |s: &tessera_compiler::model::ClusterStateSpec, name: &str| {
        s.running.iter().position(|r| r.name == name).unwrap()
    };
    // `b` names a node the snapshot lacks; `d` is listed twice, later in the order.
    let mut broken = valid.clone();
    let b = named(&broken, "b");
    broken.running[b].bindings[0].node = "gone".into();
    let d = broken.running[named(&broken, "d")].clone();
    broken.running.insert(0, d);
    let message = error(&broken);
    assert!(message.contains("gone"), "{message}");
    // The other way round: `b` twice comes before `d`'s unknown node.
    let mut broken = valid.clone();
    let d = named(&broken, "d");
    broken.running[d].bindings[0].node = "gone".into();
    let b = broken.running[named(&broken, "b")].clone();
    broken.running.push(b);
    let message = error(&broken);
    assert!(message.contains("b/b"), "{message}");
}

/// A workload of tenant `a` asking no GPU (`gpu: {count: 0}`): `replicas` of `cpu` cores.
fn cpu_only(replicas: u32, cpu: u32) -> String {
    format!("{{tenant: a, sloClass: batch, replicas: {replicas}, gpu: {{count: 0}}, cpu: {cpu}}}")
}

#[test]
fn a_cpu_only_workload_takes_cpu_on_a_node_and_no_gpu() {
    // Two replicas of 80 cores and an 8-GPU replica of 100: they fit on two 192-core nodes
    // only as two and one, and the GPUs are all the GPU work's.
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let pend = pending("loader", &cpu_only(2, 80), RECENT)
        + &pending(
            "eight",
            "{tenant: a, sloClass: batch, gpu: {count: 8}, cpu: 100}",
            RECENT,
        );
    let d = run(&state(&nodes, "", &pend));
    let loader = admitted(&d, "loader");
    assert!(
        loader
            .iter()
            .all(|b| b.gpus.is_empty() && b.mig_start.is_none() && b.share.is_none())
    );
    let eight = admitted(&d, "eight");
    for n in ["t0", "t1"] {
        let cpu = 80 * loader.iter().filter(|b| b.node == n).count()
            + 100 * eight.iter().filter(|b| b.node == n).count();
        assert!(cpu <= 192, "{n} holds {cpu} cores");
    }
    let train = d.pools.iter().find(|p| p.pool == "train").unwrap();
    assert_eq!(train.allocated, Gpus::whole(8));
}

#[test]
fn a_cpu_only_replica_goes_where_it_leaves_no_gpu_unfed() {
    // `t0` has 4 GPUs free and 176 cores; `t1` 2 GPUs and 40 cores (the running work asks 10
    // cores a GPU). Best fit would take `t1`, the fuller node, and its 30 cores would leave 10
    // there: a GPU that the fleet's work could no longer be fed on. On `t0` every free GPU keeps
    // its CPU.
    let nodes = [
        node("t0", "train", 8),
        node("t1", "train", 8).replace("cpu: 192", "cpu: 100"),
    ];
    let spec = |gpus: u32, cpu: u32| {
        format!("{{tenant: b, sloClass: critical, gpu: {{count: {gpus}}}, cpu: {cpu}}}")
    };
    let run_ = running("four", &spec(4, 16), &[&gpus("t0", 0, 4)], EARLY)
        + &running("six", &spec(6, 60), &[&gpus("t1", 0, 6)], EARLY);
    let d = run(&state(
        &nodes,
        &run_,
        &pending("loader", &cpu_only(1, 30), RECENT),
    ));
    assert_eq!(admitted(&d, "loader")[0].node, "t0");
}

#[test]
fn a_running_cpu_only_workload_holds_its_cpu() {
    // Each node runs a CPU-only replica of 150 cores: a 64-core replica of either kind waits,
    // and says that the CPU is what is short.
    let nodes = [node("t0", "train", 8), node("t1", "train", 8)];
    let held = "{node: t0, gpus: []}";
    let held1 = "{node: t1, gpus: []}";
    let run_ = running("etl", &cpu_only(2, 150), &[held, held1], EARLY);
    let pend = pending("more", &cpu_only(1, 64), RECENT)
        + &pending(
            "gpu",
            "{tenant: a, sloClass: batch, gpu: {count: 1}, cpu: 64}",
            RECENT,
        );
    let d = run(&state(&nodes, &run_, &pend));
    assert!(matches!(get(&d, "etl").outcome, Outcome::Keep { .. }));
    for name in ["more", "gpu"] {
        let m = message(&d, name);
        assert!(m.contains("CPU"), "{name}: {m}");
    }
}
