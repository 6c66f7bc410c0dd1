//! A fleet driven through the solver over many cycles with a deterministic clock: each cycle
//! finishes the work whose run time is up, queues the arrivals, solves and carries the decision
//! out ([`tessera_solver::carry::carry_out`]). What each tenant ran is integrated on the way.

use std::collections::BTreeMap;

use tessera_compiler::CompiledPolicy;
use tessera_compiler::model::{ClusterStateSpec, PendingWorkload};
use tessera_solver::carry::carry_out;
use tessera_solver::decision::Decision;
use tessera_solver::problem::unix;
use tessera_solver::{SolveOptions, solve};

pub struct Cycles {
    pub policy: CompiledPolicy,
    pub state: ClusterStateSpec,
    /// Unix seconds.
    pub now: i64,
    /// How long each workload runs once started, by name; absent: until the end.
    run_for: BTreeMap<String, i64>,
    /// GPU-seconds each tenant ran, by tenant name.
    pub gpu_seconds: BTreeMap<String, f64>,
    /// Every decision, in order.
    pub decisions: Vec<Decision>,
}

impl Cycles {
    pub fn new(policy: CompiledPolicy, state: ClusterStateSpec) -> Cycles {
        let now = state.observed_at.as_second();
        Cycles {
            policy,
            state,
            now,
            run_for: BTreeMap::new(),
            gpu_seconds: BTreeMap::new(),
            decisions: Vec::new(),
        }
    }

    /// Queues `w`, submitted now; once started it runs `run_seconds` (`None`: forever).
    pub fn submit(&mut self, mut w: PendingWorkload, run_seconds: Option<i64>) {
        w.submitted_at = unix(self.now);
        if let Some(s) = run_seconds {
            self.run_for.insert(w.name.clone(), s);
        }
        self.state.pending.push(w);
    }

    /// Lets `seconds` pass: running work accrues GPU-seconds and ends when its run time is up
    /// (a preempted and restarted workload runs its whole time again).
    pub fn advance(&mut self, seconds: i64) {
        let end = self.now + seconds;
        for r in &self.state.running {
            let started = r.started_at.as_second();
            let stop = self
                .run_for
                .get(&r.name)
                .map_or(end, |d| (started + d).min(end));
            let ran = (stop - self.now.max(started)).max(0) as f64;
            *self.gpu_seconds.entry(r.spec.tenant.clone()).or_default() += ran * gpus(r);
        }
        let run_for = &self.run_for;
        self.state.running.retain(|r| {
            let started = r.started_at.as_second();
            run_for.get(&r.name).is_none_or(|d| started + d > end)
        });
        self.now = end;
        self.state.observed_at = unix(end);
    }

    /// One cycle at the current instant: solve, then carry the decision out.
    pub fn cycle(&mut self) -> &Decision {
        let d = solve(&self.policy, &self.state, &SolveOptions::default()).expect("solves");
        self.state = carry_out(&self.state, &d);
        self.decisions.push(d);
        self.decisions.last().expect("just pushed")
    }
}

/// GPUs a running workload holds: whole GPUs and shares as bound; a MIG instance counts as
/// the one GPU it is on (the tests that integrate usage run exclusive pools).
fn gpus(r: &tessera_compiler::model::RunningWorkload) -> f64 {
    r.bindings
        .iter()
        .map(|b| match b.share {
            Some(s) => s.as_f64(),
            None => b.gpus.len() as f64,
        })
        .sum()
}
