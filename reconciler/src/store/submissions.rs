//! Group commit for submissions: many workloads queued in one commit, so that a burst of
//! `POST /v1/workloads` pays one fsync rather than one each. Each submission is checked as
//! [`Store::submit`] checks it (a live workload of its tenant by that name is a conflict) and,
//! for those that come through the API, against its tenant's most live submissions, counting
//! the batch's own submissions before it. A submission that fails a check is answered so and
//! writes nothing; the others are committed together. An error of the store itself writes
//! nothing of the batch.

use tessera_compiler::model::WorkloadSpec;

use super::workloads::{count_live_submitted, insert_submission};
use super::{Origin, Store, StoreError, WorkloadRecord};

/// One submission of a batch.
#[derive(Debug, Clone, Copy)]
pub struct NewSubmission<'a> {
    pub name: &'a str,
    pub spec: &'a WorkloadSpec,
    pub origin: Origin,
    /// The most workloads submitted through the API its tenant may have that have not ended
    /// (this one included); `None` for no limit.
    pub most_live: Option<usize>,
}

/// What became of one submission of a batch.
#[derive(Debug)]
pub enum Submitted {
    /// Queued; the record as stored.
    Queued(Box<WorkloadRecord>),
    /// Its tenant already has `live` workloads submitted that have not ended, the most it may
    /// have; nothing was written.
    AtLimit { live: usize },
    /// Refused by the store's checks (`Conflict`); nothing was written.
    Refused(StoreError),
}

impl Store {
    /// Queues `batch` in one commit; one answer per submission, in order. See the module
    /// documentation.
    pub fn submit_many(
        &self,
        batch: &[NewSubmission<'_>],
        now: i64,
    ) -> Result<Vec<Submitted>, StoreError> {
        let tx = self.write()?;
        let mut answers = Vec::with_capacity(batch.len());
        for s in batch {
            if let Some(most) = s.most_live
                && s.origin == Origin::Submitted
            {
                // Inside the transaction: the batch's earlier submissions count.
                let live = count_live_submitted(&tx, &s.spec.tenant)?;
                if live >= most {
                    answers.push(Submitted::AtLimit { live });
                    continue;
                }
            }
            match insert_submission(&tx, s.name, s.spec, s.origin, now) {
                Ok(record) => answers.push(Submitted::Queued(Box::new(record))),
                Err(e @ StoreError::Conflict(_)) => answers.push(Submitted::Refused(e)),
                Err(e) => return Err(e),
            }
        }
        tx.commit()?;
        Ok(answers)
    }
}

/// [`Store::submit_many`] for a store that commits one submission at a time: the same checks
/// and answers, each submission its own commit (a limit counted and a workload queued in two
/// calls, so the caller must keep other submissions out between them, as the API's lock does).
pub fn submit_each(
    store: &(impl super::StateStore + ?Sized),
    batch: &[NewSubmission<'_>],
    now: i64,
) -> Result<Vec<Submitted>, StoreError> {
    let mut answers = Vec::with_capacity(batch.len());
    for s in batch {
        if let Some(most) = s.most_live
            && s.origin == Origin::Submitted
        {
            let live = store.live_submitted(&s.spec.tenant)?;
            if live >= most {
                answers.push(Submitted::AtLimit { live });
                continue;
            }
        }
        match store.submit(s.name, s.spec, s.origin, now) {
            Ok(record) => answers.push(Submitted::Queued(Box::new(record))),
            Err(e @ StoreError::Conflict(_)) => answers.push(Submitted::Refused(e)),
            Err(e) => return Err(e),
        }
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tessera_compiler::model::WorkloadSpec;

    use super::*;

    fn spec(tenant: &str) -> WorkloadSpec {
        serde_json::from_value(serde_json::json!({
            "tenant": tenant, "sloClass": "batch", "gpu": {"count": 1}
        }))
        .unwrap()
    }

    /// An answer as comparable text: what was queued (tenant, name, phase, instant), or why not.
    fn outcome(a: &Submitted) -> String {
        match a {
            Submitted::Queued(r) => format!(
                "queued {}/{} {} at {}",
                r.tenant, r.name, r.phase, r.submitted_at
            ),
            Submitted::AtLimit { live } => format!("at limit {live}"),
            Submitted::Refused(e) => format!("refused: {e}"),
        }
    }

    /// Every record and event a store holds, as comparable text.
    fn contents(store: &Store) -> (Vec<String>, Vec<String>) {
        let records = store
            .list(None)
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{}/{} {:?} {} {}",
                    r.tenant, r.name, r.origin, r.phase, r.submitted_at
                )
            })
            .collect();
        let events = store
            .events(0, 1_000)
            .unwrap()
            .iter()
            .map(|e| {
                format!(
                    "{} {} {:?} {:?} {}",
                    e.id, e.kind, e.tenant, e.workload, e.message
                )
            })
            .collect();
        (records, events)
    }

    #[test]
    fn a_batch_checks_each_submission_against_the_ones_before_it() {
        let store = Store::open_in_memory().unwrap();
        store
            .submit("old", &spec("a"), Origin::Submitted, 1)
            .unwrap();
        let (a, b) = (spec("a"), spec("b"));
        let batch = [
            // A live workload of that name: refused.
            NewSubmission {
                name: "old",
                spec: &a,
                origin: Origin::Submitted,
                most_live: None,
            },
            NewSubmission {
                name: "x",
                spec: &a,
                origin: Origin::Submitted,
                most_live: Some(2),
            },
            // Its tenant's second live submission is this batch's `x`: at the limit.
            NewSubmission {
                name: "y",
                spec: &a,
                origin: Origin::Submitted,
                most_live: Some(2),
            },
            // The same name twice in one batch: the second conflicts with the first.
            NewSubmission {
                name: "x",
                spec: &b,
                origin: Origin::Submitted,
                most_live: None,
            },
            NewSubmission {
                name: "x",
                spec: &b,
                origin: Origin::Submitted,
                most_live: None,
            },
            // Committed workloads are not counted against the limit.
            NewSubmission {
                name: "c",
                spec: &a,
                origin: Origin::Committed,
                most_live: Some(1),
            },
        ];
        let answers: Vec<String> = store
            .submit_many(&batch, 5)
            .unwrap()
            .iter()
            .map(outcome)
            .collect();
        assert_eq!(
            answers,
            [
                "refused: conflict: workload \"old\" of tenant \"a\" exists and has not ended",
                "queued a/x pending at 5",
                "at limit 2",
                "queued b/x pending at 5",
                "refused: conflict: workload \"x\" of tenant \"b\" exists and has not ended",
                "queued a/c pending at 5",
            ]
        );
        let (records, events) = contents(&store);
        assert_eq!(records.len(), 4);
        assert_eq!(events.iter().filter(|e| e.contains("submitted")).count(), 4);
    }

    proptest! {
        /// One commit for the batch answers and writes exactly what one commit per submission
        /// does (the records, their events, in order).
        #[test]
        fn one_commit_agrees_with_one_commit_each(
            before in proptest::collection::vec((0..2usize, 0..4usize), 0..5),
            batch in proptest::collection::vec(
                (0..2usize, 0..4usize, any::<bool>(), proptest::option::of(1..4usize)),
                0..12,
            ),
        ) {
            let tenants = [spec("a"), spec("b")];
            let names = ["w0", "w1", "w2", "w3"];
            let (grouped, each) = (Store::open_in_memory().unwrap(), Store::open_in_memory().unwrap());
            for store in [&grouped, &each] {
                for &(t, n) in &before {
                    let _ = store.submit(names[n], &tenants[t], Origin::Submitted, 1);
                }
            }
            let batch: Vec<NewSubmission<'_>> = batch
                .iter()
                .map(|&(t, n, api, most_live)| NewSubmission {
                    name: names[n],
                    spec: &tenants[t],
                    origin: if api { Origin::Submitted } else { Origin::Committed },
                    most_live,
                })
                .collect();
            let a: Vec<String> = grouped.submit_many(&batch, 7).unwrap().iter().map(outcome).collect();
            let b: Vec<String> = submit_each(&each, &batch, 7).unwrap().iter().map(outcome).collect();
            prop_assert_eq!(a, b);
            prop_assert_eq!(contents(&grouped), contents(&each));
        }
    }
}
