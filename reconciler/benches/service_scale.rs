//! The service around the solver at fleet scale (issue 23): what a cycle spends outside the
//! solver, and what a `/metrics` scrape and a `GET /state` cost, on the solver's benchmark fleet
//! (`tessera_solver::bench_fleet`) grown X times: nodes × X (the 436:64 training/MIG
//! proportion), organisations of 29 projects × √X, 5,116·X running workloads and a queue of
//! max(2,000, 400·X). 1× is the reference fleet (500 nodes, 4,000 GPUs, 301 tenants); 12.5× is
//! 6,250 nodes, 50,000 GPUs, 1,051 tenants, about 64,000 running and 5,000 pending.
//!
//! Per scale, the median (min–max) of `--runs` runs of each stage, through the production
//! functions:
//! - the snapshot: the stored records to what the snapshot tracks (`service::cycle::tracked`),
//!   the `ClusterStateSpec` (`snapshot::cluster_state`), and the copy the cycle publishes for
//!   `/state`;
//! - action planning: the cycle's views of the records (`service::cycle::view`) and
//!   `actions::plan`, on the steady fleet's decision (everything kept: nothing to do) and on a
//!   cycle's (the solver's decision for the fleet with its queue: the queue starts, while one
//!   running workload in a hundred, signalled by an earlier cycle, is past its grace and stops);
//! - `/metrics`: the gauges a cycle sets (utilization and SM activity of every GPU and
//!   instance, each running workload's; the decision's figures), then the scrape's encoding;
//! - `GET /state` through the service's router on loopback (`api::router`, streamed by
//!   `api/stream_json.rs`): bytes, time to the first and the last byte, and how far peak RSS
//!   grows while it streams, beside the growth for the same document serialized whole (what a
//!   `Json` body would hold).
//!
//! `cargo bench -p tessera-reconciler --bench service_scale [-- --scale X] [--runs N]`; without
//! `--scale` it runs 1, 4 and 12.5, 5 runs each. Figures only; no assertion on time.
//! `cargo test -p tessera-reconciler --bench service_scale` (no `--bench` argument) runs it once
//! at 0.1× in the debug profile: a check that it works, not a measurement.

// The production binaries' allocator, so that the figures describe what users run.
#[global_allocator]
static ALLOCATOR: tessera_alloc::Allocator = tessera_alloc::Allocator;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tessera_compiler::model::{Binding, ClusterStateSpec, WorkloadSpec};
use tessera_compiler::{CompiledPolicy, SourceFile, compile};
use tessera_reconciler::actions::{self, Action, ActionPlan, Throttle, WorkloadView};
use tessera_reconciler::auth::Tokens;
use tessera_reconciler::driver::sim::SimDriver;
use tessera_reconciler::driver::{GpuUtilization, NodeDriver, Observation, SmActivity};
use tessera_reconciler::metrics::Metrics;
use tessera_reconciler::service::cycle;
use tessera_reconciler::service::{Handle, Limits, Shared, Wake};
use tessera_reconciler::snapshot::{self, Tracked};
use tessera_reconciler::store::carried::Carried;
use tessera_reconciler::store::{Origin, Phase, ReplicaProcess, Store, WorkloadRecord};
use tessera_solver::bench_fleet::{self as fleet, Shape, Submissions};
use tessera_solver::decision::Outcome;
use tessera_solver::{Decision, SolveOptions, solve};

const NOW: i64 = 1_795_000_000;
const ADMIN: &str = "bench-admin-token-0123456789";
const GPUS_PER_NODE: usize = 8;
/// 1g instances per GPU of the MIG pool (`all-1g`).
const SLICES_PER_GPU: usize = 7;
/// One running workload in this many is checkpointing past its deadline in the cycle's records.
const STOPPING_ONE_IN: usize = 100;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; `cargo test` does not, and then a small fleet, once.
    let measuring = args.iter().any(|a| a == "--bench");
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1)?.parse::<f64>().ok())
    };
    let scales = match value("--scale") {
        Some(x) => vec![x],
        None if measuring => vec![1.0, 4.0, 12.5],
        None => vec![0.1],
    };
    let runs = value("--runs").map_or(if measuring { 5 } else { 1 }, |n| (n as usize).max(1));
    for scale in scales {
        bench(scale, runs);
    }
}

fn bench(scale: f64, runs: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let setup = Instant::now();
    let f = Fleet::new(scale, dir.path());
    let count = |phase: Phase| f.records.iter().filter(|r| r.phase == phase).count();
    println!(
        "{scale}×: {} nodes ({} MIG), {} GPUs, {} tenants, {} running ({} of them past their \
         checkpoint grace), {} pending; set up in {:.1} s",
        thousands(f.shape.train_nodes + f.shape.infer_nodes),
        f.shape.infer_nodes,
        thousands((f.shape.train_nodes + f.shape.infer_nodes) * GPUS_PER_NODE),
        thousands(f.policy.tenants.len()),
        thousands(f.records.len() - count(Phase::Pending)),
        count(Phase::Checkpointing),
        thousands(count(Phase::Pending)),
        setup.elapsed().as_secs_f64()
    );

    // The snapshot, as the cycle builds it from the records it read.
    let (mut tracking, mut building, mut publishing) = (vec![], vec![], vec![]);
    for _ in 0..runs {
        let t = Instant::now();
        let tracked: Vec<Tracked> = f.records.iter().map(cycle::tracked).collect();
        let tracked_at = t.elapsed();
        let state = snapshot::cluster_state(&f.observation, &tracked, &f.carried, NOW);
        let built_at = t.elapsed();
        // The cycle publishes the snapshot it solves, behind an `Arc`, not a copy.
        let published = Arc::new(state);
        let published_at = t.elapsed();
        tracking.push(tracked_at);
        building.push(built_at - tracked_at);
        publishing.push(published_at - built_at);
        drop((published, tracked));
    }
    println!(
        "  snapshot: records to tracked {}, ClusterStateSpec {}, published for /state {}",
        spread(tracking),
        spread(building),
        spread(publishing)
    );

    for (what, records, decision) in [
        ("steady decision", &f.steady, &f.steady_decision),
        ("a cycle's decision", &f.records, &f.decision),
    ] {
        let (mut viewing, mut planning) = (vec![], vec![]);
        let mut last = ActionPlan::default();
        for _ in 0..runs {
            let t = Instant::now();
            let views: Vec<WorkloadView> =
                records.iter().map(|r| cycle::view(r, &f.policy)).collect();
            let viewed_at = t.elapsed();
            last = actions::plan(decision, &f.observation, &views, &Throttle::default(), NOW);
            planning.push(t.elapsed() - viewed_at);
            viewing.push(viewed_at);
        }
        println!(
            "  plan, {what} ({}): views {}, actions::plan {}",
            summary(&last),
            spread(viewing),
            spread(planning)
        );
    }

    // `/metrics` on the fleet as it stands; a cycle before, so that every series exists.
    let metrics = Metrics::new();
    metrics.record_utilization(&f.observation, &f.steady, NOW - 10);
    metrics.record_decision(&f.steady_decision, NOW - 10);
    let (mut gauges, mut encoding) = (vec![], vec![]);
    let mut bytes = 0;
    for k in 0..runs {
        let now = NOW + 10 * k as i64;
        let t = Instant::now();
        metrics.record_utilization(&f.observation, &f.steady, now);
        metrics.record_decision(&f.steady_decision, now);
        let recorded_at = t.elapsed();
        let text = metrics.encode();
        encoding.push(t.elapsed() - recorded_at);
        gauges.push(recorded_at);
        bytes = text.len();
    }
    println!(
        "  /metrics: a cycle's gauges {}, encode {} ({} bytes, {} series)",
        spread(gauges),
        spread(encoding),
        thousands(bytes),
        thousands(
            metrics
                .encode()
                .lines()
                .filter(|l| !l.starts_with('#'))
                .count()
        )
    );

    // `GET /state` of the fleet as the cycle left it (the steady records).
    let tracked: Vec<Tracked> = f.steady.iter().map(cycle::tracked).collect();
    let state = snapshot::cluster_state(&f.observation, &tracked, &f.carried, NOW);
    drop(tracked);
    let server = Server::start(state, dir.path());
    let (mut firsts, mut totals, mut peaks) = (vec![], vec![], vec![]);
    let mut streamed = None;
    for _ in 0..runs {
        let base = reset_peak();
        let got = get_state(server.addr);
        if let Some(base) = base {
            peaks.push(kb("VmHWM:").saturating_sub(base));
        }
        firsts.push(got.first_byte);
        totals.push(got.total);
        streamed = Some((got.bytes, got.digest));
    }
    let (bytes, digest) = streamed.expect("at least one run");
    // The same document serialized whole, last: the allocator keeps some of what it frees.
    let spec = server.state();
    let base = reset_peak();
    let whole = serde_json::to_vec(&snapshot::document(&spec)).expect("serializes");
    let whole_peak = base.map(|b| kb("VmHWM:").saturating_sub(b));
    assert_eq!(whole.len() as u64, bytes, "the stream is the document");
    assert_eq!(<[u8; 32]>::from(Sha256::digest(&whole)), digest);
    drop(whole);
    let peak = |kb: Option<u64>| kb.map_or("not measured".to_owned(), |kb| mb(kb * 1024));
    println!(
        "  /state: {} in {} (first byte {}); peak RSS while streaming +{} (max of {}), \
         the document built whole +{}",
        mb(bytes),
        spread(totals),
        spread(firsts),
        peak(peaks.iter().max().copied()),
        peaks.len(),
        peak(whole_peak)
    );
}

/// The fleet, its records and decisions at one scale.
struct Fleet {
    shape: Shape,
    policy: CompiledPolicy,
    /// The simulated driver's observation, with utilization and SM activity on every GPU and
    /// instance (H100s have GPM), so that every series `/metrics` can hold is there.
    observation: Observation,
    /// What the last decision carried forward (usage per tenant): part of the snapshot.
    carried: Carried,
    /// The cycle's records: the running fleet (one in [`STOPPING_ONE_IN`] checkpointing past
    /// its deadline) and the queue.
    records: Vec<WorkloadRecord>,
    /// The solver's decision for `records`.
    decision: Decision,
    /// The fleet once that decision is carried out (the stopping ones left running), and the
    /// solver's decision for it: everything kept.
    steady: Vec<WorkloadRecord>,
    steady_decision: Decision,
}

impl Fleet {
    fn new(scale: f64, dir: &Path) -> Fleet {
        let shape = Shape::new(
            (500.0 * scale).round() as usize,
            (10.0 * scale.sqrt()).round() as usize,
        );
        let compiled = compile(&[SourceFile::new("fleet.yaml", fleet::policy(shape))]);
        let policy = compiled.policy.expect("the bench fleet's policy compiles");
        let nodes = fleet::nodes(shape);
        let mut driver =
            SimDriver::from_nodes(&nodes, &dir.join("sim.json")).expect("the simulated nodes");
        let mut observation = driver.observe().expect("observed");
        for (i, d) in observation.details.iter_mut().enumerate() {
            let percent = |salt: usize| ((i * 37 + salt * 11) % 101) as u32;
            if d.instances.is_empty() {
                d.utilization = Some(GpuUtilization {
                    gpu_percent: percent(0),
                    memory_percent: percent(1),
                });
                d.sm_activity = SmActivity::checked(f64::from(percent(2)), f64::from(percent(3)));
            }
            for (j, gi) in d.instances.iter_mut().enumerate() {
                gi.sm_activity =
                    SmActivity::checked(f64::from(percent(j)), f64::from(percent(j + 4)));
            }
        }

        // The running fleet, placed in order (training GPUs node by node, 1g instances GPU by
        // GPU), then the queue.
        let running = (5_116.0 * scale).round() as usize;
        let pending = ((400.0 * scale).round() as usize).max(2_000);
        let mut submissions = Submissions::new(shape);
        let (mut train, mut infer) = (0, 0);
        let mut records = Vec::with_capacity(running + pending);
        for i in 0..running {
            let spec = submissions.next_spec();
            let binding = if spec.slo_class == "training" {
                train += 1;
                assert!(train <= shape.train_gpus(), "the training pool is full");
                whole_gpu(train - 1)
            } else {
                infer += 1;
                assert!(infer <= shape.infer_slices(), "the MIG pool is full");
                one_slice(infer - 1)
            };
            let mut r = record(format!("w-{i}"), spec, NOW - 7_200, Some(binding));
            if i % STOPPING_ONE_IN == STOPPING_ONE_IN / 2 {
                r.phase = Phase::Checkpointing;
                r.signalled_at = Some(NOW - 400);
                r.grace_deadline = Some(NOW - 100);
            }
            records.push(r);
        }
        for i in 0..pending {
            let spec = submissions.next_spec();
            let at = NOW - 600 + (i * 600 / pending) as i64;
            records.push(record(format!("q-{i}"), spec, at, None));
        }
        let options = SolveOptions {
            now: Some(NOW),
            ..SolveOptions::default()
        };
        let tracked: Vec<Tracked> = records.iter().map(cycle::tracked).collect();
        let state = snapshot::cluster_state(&observation, &tracked, &Carried::default(), NOW);
        let decision = solve(&policy, &state, &options).expect("the cycle solves");
        let carried = Carried {
            usage: decision.fair_share.as_ref().map(|f| f.record.clone()),
            reservations: decision.reservations.iter().map(|r| r.record()).collect(),
            reconfigurations: Vec::new(),
        };

        let admitted: BTreeMap<(&str, &str), Vec<Binding>> = decision
            .workloads
            .iter()
            .filter_map(|w| match &w.outcome {
                Outcome::Admit { bindings, .. } => Some((
                    (w.tenant.as_str(), w.name.as_str()),
                    bindings.iter().map(|b| b.binding()).collect(),
                )),
                _ => None,
            })
            .collect();
        let steady: Vec<WorkloadRecord> = records
            .iter()
            .map(|r| {
                let admit = admitted.get(&(r.tenant.as_str(), r.name.as_str()));
                let mut r = r.clone();
                if let Some(bindings) = admit {
                    r.phase = Phase::Running;
                    r.started_at = Some(NOW);
                    r.replicas = vec![replica()];
                    r.bindings = bindings.clone();
                } else if r.phase == Phase::Checkpointing {
                    r.phase = Phase::Running;
                    (r.signalled_at, r.grace_deadline) = (None, None);
                }
                r
            })
            .collect();
        let tracked: Vec<Tracked> = steady.iter().map(cycle::tracked).collect();
        let state = snapshot::cluster_state(&observation, &tracked, &carried, NOW);
        let steady_decision = solve(&policy, &state, &options).expect("the steady fleet solves");
        Fleet {
            shape,
            policy,
            observation,
            carried,
            records,
            decision,
            steady,
            steady_decision,
        }
    }
}

/// The `k`-th GPU of the training pool (nodes `t0`, `t1`, ...).
fn whole_gpu(k: usize) -> Binding {
    Binding {
        node: format!("t{}", k / GPUS_PER_NODE),
        gpus: vec![(k % GPUS_PER_NODE) as u32],
        mig_start: None,
        share: None,
    }
}

/// The `k`-th 1g instance of the MIG pool (nodes `m0`, `m1`, ...; seven a GPU).
fn one_slice(k: usize) -> Binding {
    let gpu = k / SLICES_PER_GPU;
    Binding {
        node: format!("m{}", gpu / GPUS_PER_NODE),
        gpus: vec![(gpu % GPUS_PER_NODE) as u32],
        mig_start: Some((k % SLICES_PER_GPU) as u8),
        share: None,
    }
}

/// A replica whose process lives (the planner counts them).
fn replica() -> ReplicaProcess {
    ReplicaProcess {
        replica: 0,
        pid: Some(10_000),
        devices: Vec::new(),
    }
}

/// A stored workload: running on `binding` since two hours, or pending.
fn record(
    name: String,
    spec: WorkloadSpec,
    submitted_at: i64,
    binding: Option<Binding>,
) -> WorkloadRecord {
    let running = binding.is_some();
    let submitted = WorkloadRecord::submitted(&name, &spec, Origin::Submitted, submitted_at);
    if !running {
        return submitted;
    }
    WorkloadRecord {
        phase: Phase::Running,
        started_at: Some(NOW - 7_000),
        replicas: vec![replica()],
        bindings: binding.into_iter().collect(),
        ..submitted
    }
}

/// The service's API on loopback with `state` as the last cycle's snapshot.
struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _wake: mpsc::Receiver<Wake>,
    _runtime: tokio::runtime::Runtime,
}

impl Server {
    fn start(state: ClusterStateSpec, dir: &Path) -> Server {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::new("sim", tx));
        *shared.state.write().expect("not poisoned") = Some(Arc::new(state));
        let store = Store::open(&dir.join("api.db")).expect("the API's store");
        let handle = Handle::new(shared.clone(), Box::new(store), Limits::default());
        let tokens = Tokens::parse(&format!("admin: {ADMIN}\n")).expect("tokens");
        // As `serve` builds it.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a port");
        let addr = listener.local_addr().expect("an address");
        let app = tessera_reconciler::api::router(handle, tokens);
        runtime.spawn(async move { axum::serve(listener, app).await });
        Server {
            addr,
            shared,
            _wake: rx,
            _runtime: runtime,
        }
    }

    fn state(&self) -> Arc<ClusterStateSpec> {
        self.shared
            .state
            .read()
            .expect("not poisoned")
            .clone()
            .expect("set at start")
    }
}

struct Got {
    bytes: u64,
    digest: [u8; 32],
    first_byte: Duration,
    total: Duration,
}

/// `GET /state` over HTTP/1.1, the body hashed as it arrives and never held whole.
fn get_state(addr: SocketAddr) -> Got {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).expect("connects");
    write!(
        stream,
        "GET /state HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ADMIN}\r\n\
         Connection: close\r\n\r\n"
    )
    .expect("sends");
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let mut line = String::new();
    reader.read_line(&mut line).expect("a status line");
    let first_byte = started.elapsed();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    let (mut chunked, mut length) = (false, None);
    loop {
        line.clear();
        reader.read_line(&mut line).expect("a header");
        let header = line.trim_end().to_ascii_lowercase();
        if header.is_empty() {
            break;
        }
        if header == "transfer-encoding: chunked" {
            chunked = true;
        } else if let Some(n) = header.strip_prefix("content-length: ") {
            length = n.parse::<u64>().ok();
        }
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut bytes = 0u64;
    let mut take = |reader: &mut BufReader<TcpStream>, mut left: u64| {
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = reader.read(&mut buf[..want]).expect("reads");
            assert!(n > 0, "the body ended early");
            hasher.update(&buf[..n]);
            left -= n as u64;
            bytes += n as u64;
        }
    };
    if chunked {
        loop {
            line.clear();
            reader.read_line(&mut line).expect("a chunk size");
            let size = line.trim_end().split(';').next().unwrap_or("");
            let size = u64::from_str_radix(size, 16).expect("a hexadecimal chunk size");
            if size == 0 {
                break;
            }
            take(&mut reader, size);
            line.clear();
            reader.read_line(&mut line).expect("the chunk's end");
        }
    } else {
        take(&mut reader, length.expect("a length or chunks"));
    }
    Got {
        bytes,
        digest: hasher.finalize().into(),
        first_byte,
        total: started.elapsed(),
    }
}

/// Resets the process's peak RSS to its current RSS (Linux's `clear_refs`) and returns the
/// current RSS in kB; `None` where that cannot be done.
fn reset_peak() -> Option<u64> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    Some(kb("VmRSS:"))
}

/// A `/proc/self/status` figure in kB.
fn kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0)
}

fn summary(plan: &ActionPlan) -> String {
    let count = |f: fn(&Action) -> bool| plan.actions.iter().filter(|a| f(a)).count();
    format!(
        "{} actions: {} starts, {} stops, {} checkpoints; {} waits",
        thousands(plan.actions.len()),
        thousands(count(|a| matches!(a, Action::Start { .. }))),
        thousands(count(|a| matches!(a, Action::Stop { .. }))),
        thousands(count(|a| matches!(a, Action::Checkpoint { .. }))),
        thousands(plan.waits.len())
    )
}

/// Median (min–max) in milliseconds.
fn spread(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let median = ms(&samples[samples.len() / 2]);
    if samples.len() == 1 {
        return format!("{median:.2} ms");
    }
    format!(
        "{median:.2} ms ({:.2}–{:.2})",
        ms(&samples[0]),
        ms(&samples[samples.len() - 1])
    )
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
