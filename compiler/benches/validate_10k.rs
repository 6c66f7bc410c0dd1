//! Validates a generated repository of 10,000 tenants, from files on disk, and prints the time
//! and peak memory. A figure to read, never an assertion: run it with
//! `cargo bench -p tessera-compiler --bench validate_10k` (add `-- --tenants N` for another
//! size).

// The production binaries' allocator, so that the figures describe what users run.
#[global_allocator]
static ALLOCATOR: tessera_alloc::Allocator = tessera_alloc::Allocator;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

const ORGS: usize = 20;
const TEAMS_PER_ORG: usize = 25;

fn main() {
    let mut tenants = 10_000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--tenants" {
            tenants = args
                .next()
                .and_then(|v| v.parse().ok())
                .expect("--tenants N");
        }
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (files, tenants) = generate(dir.path(), tenants);

    let runs = 5;
    let mut times = Vec::new();
    let mut outcome = None;
    for _ in 0..runs {
        let start = Instant::now();
        let loaded = tessera_compiler::source::discover(&[dir.path().to_path_buf()])
            .expect("the generated repository is readable");
        let c = tessera_compiler::compile_loaded(loaded);
        times.push(start.elapsed().as_secs_f64());
        outcome = Some((
            c.errors(),
            c.warnings(),
            c.documents,
            c.policy.map(|p| p.tenants.len()),
        ));
    }
    let (errors, warnings, documents, compiled) = outcome.expect("ran");
    times.sort_by(f64::total_cmp);
    println!("validate_10k: {tenants} tenants in {files} files, {documents} documents");
    println!(
        "  errors {errors}, warnings {warnings}, tenants in CompiledPolicy: {}",
        compiled.map_or("none".to_owned(), |n| n.to_string())
    );
    println!(
        "  wall time over {runs} runs: min {:.3} s, median {:.3} s, max {:.3} s (discover + parse + schema + checks + lowering)",
        times[0],
        times[runs / 2],
        times[runs - 1]
    );
    println!("  peak resident memory: {}", peak_rss());
    assert_eq!(errors, 0, "the generated repository must be valid");
}

/// `VmHWM` from /proc: the high-water mark of resident memory of this process.
fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l.trim_start_matches("VmHWM:").trim().to_owned())
        })
        .unwrap_or_else(|| "unavailable on this platform".to_owned())
}

/// A root, 20 orgs, 500 teams, and projects for the rest, one file per team, as teams would own
/// them. Guarantees nest exactly: root 4,000 GPUs, 200 per org, 8 per team, a share per project.
/// Returns the number of files and of tenants written.
fn generate(dir: &std::path::Path, tenants: usize) -> (usize, usize) {
    let header = "apiVersion: tessera/v1alpha1\n";
    let mut fleet = String::new();
    write!(
        fleet,
        "{header}kind: PriorityTiers\nmetadata: {{name: tiers}}\nspec:\n  tiers:\n    - {{name: production, value: 1000}}\n    - {{name: batch, value: 100}}\n---\n\
         {header}kind: SloClass\nmetadata: {{name: training}}\nspec: {{tier: batch, preemptible: true, isolation: {{minimum: exclusive}}}}\n---\n\
         {header}kind: SloClass\nmetadata: {{name: serving}}\nspec: {{tier: production, preemptible: false, isolation: {{minimum: mig}}}}\n---\n\
         {header}kind: MigLayout\nmetadata: {{name: halves}}\nspec: {{gpuModel: H100-SXM5-80GB, instances: [4g.40gb, 3g.40gb]}}\n---\n\
         {header}kind: Pool\nmetadata: {{name: train}}\nspec:\n  gpuModel: H100-SXM5-80GB\n  sharing: exclusive\n  capacity: {{nodes: 500, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}}\n---\n\
         {header}kind: Pool\nmetadata: {{name: infer}}\nspec:\n  gpuModel: H100-SXM5-80GB\n  sharing: mig\n  migLayouts: [halves]\n  capacity: {{nodes: 64, gpusPerNode: 8, cpuPerNode: 192, memoryPerNode: 2Ti}}\n---\n\
         {header}kind: Tenant\nmetadata: {{name: root}}\nspec:\n  guarantee: {{train: 4000, infer: 500}}\n  sloClasses: [training, serving]\n"
    )
    .unwrap();
    let mut files = vec![(PathBuf::from("fleet.yaml"), fleet)];
    let teams = ORGS * TEAMS_PER_ORG;
    let projects = tenants.saturating_sub(1 + ORGS + teams);
    // Team k gets `base` projects, one more for the first `extra` teams: exactly `tenants` in all.
    let (base, extra) = (projects / teams, projects % teams);
    let mut made = 1;
    for o in 0..ORGS {
        let mut org = String::new();
        write!(
            org,
            "{header}kind: Tenant\nmetadata: {{name: org-{o}}}\nspec:\n  parent: root\n  guarantee: {{train: 200, infer: 25}}\n  trustDomain: org-{o}\n"
        )
        .unwrap();
        made += 1;
        files.push((PathBuf::from(format!("org-{o}/org.yaml")), org));
        for t in 0..TEAMS_PER_ORG {
            let mut text = String::new();
            write!(
                text,
                "{header}kind: Tenant\nmetadata: {{name: team-{o}-{t}}}\nspec:\n  parent: org-{o}\n  guarantee: {{train: 8, infer: 1}}\n  limit: {{train: 64}}\n  weight: 2\n"
            )
            .unwrap();
            made += 1;
            let count = base + usize::from(o * TEAMS_PER_ORG + t < extra);
            let share = 8.0 / count.max(1) as f64;
            let share = (share * 1000.0).floor() / 1000.0;
            for p in 0..count {
                write!(
                    text,
                    "---\n{header}kind: Tenant\nmetadata: {{name: proj-{o}-{t}-{p}}}\nspec:\n  parent: team-{o}-{t}\n  guarantee: {{train: {share}}}\n  sloClasses: [training]\n"
                )
                .unwrap();
                made += 1;
            }
            files.push((PathBuf::from(format!("org-{o}/team-{t}.yaml")), text));
        }
    }
    for (path, text) in &files {
        let full = dir.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, text).unwrap();
    }
    (files.len(), made)
}
