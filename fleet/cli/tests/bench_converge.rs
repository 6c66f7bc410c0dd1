//! `tessera-fleet bench converge` at a small size (4 nodes × 2 GPUs, two replicas, its own
//! etcd): the bench runs to the end and its own figures make sense. Every node converged,
//! every GPU counted, each GPU's change carried out as two actions (its 4g.40gb GPU instance
//! and that instance's compute instance) journaled done and none failed, steady windows with
//! cycles in them, and a failover measured. The figures' values (times, bytes) are not
//! checked: they are what the bench measures, not what it must find.

use std::process::Command;

#[test]
fn bench_converge_reports_a_converged_fleet() {
    let output = Command::new(env!("CARGO_BIN_EXE_tessera-fleet"))
        .args(["bench", "converge", "--nodes", "4", "--gpus", "2"])
        // Steady windows of three cycle periods (1 s each): a window of one period can end
        // before the cycle that was due in it (seen once: "0 cycles").
        .args(["--steady", "3s", "--replica-lease-ttl", "2s", "--failover"])
        .args(["--patience", "90s"])
        .env("NO_COLOR", "1")
        .output()
        .expect("tessera-fleet runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the bench failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let line = |prefix: &str| -> String {
        stdout
            .lines()
            .map(str::trim_start)
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line `{prefix}…`:\n{stdout}"))
            .to_string()
    };
    assert!(
        line("converged: ").starts_with("converged: 4 of 4 nodes, 8 GPUs "),
        "{stdout}"
    );
    assert!(
        line("last action in etcd").contains("(16 actions)"),
        "{stdout}"
    );
    assert!(
        line("last action journaled").contains("(16 done, 0 failed)"),
        "{stdout}"
    );
    for when in ["steady before the commit", "steady after convergence"] {
        let steady = line(when);
        assert!(!steady.contains(" 0 cycles"), "{steady}");
    }
    let memory = line("leading replica's memory");
    assert!(!memory.contains("VmRSS 0.0 MiB"), "{memory}");
    assert!(
        line("failover: ").contains("the standby leads after"),
        "{stdout}"
    );
}
