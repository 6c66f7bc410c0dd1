//! Group commit of the API's submissions. Each `POST /v1/workloads` is answered only once its
//! workload is committed (durable as the store's [`crate::store::Durability`] says), and a
//! commit on SQLite costs an fsync. Submissions that arrive while another commit is under way
//! are therefore queued and committed together by whichever of their threads takes the store
//! next: one transaction and one fsync for all of them (`store/submissions.rs`), each answered
//! after that commit.
//!
//! The store's lock is the only wait. A submission queues its ticket, then takes the lock;
//! holding it, it finds its ticket either answered (a batch taken by another thread while it
//! waited) or still queued, and then commits every queued ticket itself. Tickets are answered
//! before the lock is released, so none is left behind.

use std::sync::{Arc, Mutex};

use tessera_compiler::model::WorkloadSpec;
use tracing::info;

use super::{Handle, ServiceError};
use crate::store::WorkloadRecord;
use crate::store::submissions::{NewSubmission, Submitted};
use crate::store::{Origin, StateStore};

/// One submission waiting for its commit.
struct Ticket {
    name: String,
    spec: WorkloadSpec,
    answer: Mutex<Option<Result<WorkloadRecord, ServiceError>>>,
}

impl Ticket {
    fn answer(&self, answer: Result<WorkloadRecord, ServiceError>) {
        *self.answer.lock().unwrap_or_else(|e| e.into_inner()) = Some(answer);
    }

    fn take(&self) -> Option<Result<WorkloadRecord, ServiceError>> {
        self.answer.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The submissions checked and waiting for a commit, in arrival order.
#[derive(Default)]
pub(super) struct Queue {
    waiting: Mutex<Vec<Arc<Ticket>>>,
}

impl Queue {
    fn push(&self, ticket: Arc<Ticket>) {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ticket);
    }

    fn drain(&self) -> Vec<Arc<Ticket>> {
        std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Handle {
    /// Queues a checked submission and returns once it is committed, with every submission
    /// queued meanwhile (see the module documentation).
    pub(super) fn commit_submission(
        &self,
        name: &str,
        spec: WorkloadSpec,
    ) -> Result<WorkloadRecord, ServiceError> {
        let ticket = Arc::new(Ticket {
            name: name.to_owned(),
            spec,
            answer: Mutex::new(None),
        });
        self.submissions.push(Arc::clone(&ticket));
        let store = self.store();
        if let Some(answer) = ticket.take() {
            return answer;
        }
        let batch = self.submissions.drain();
        let cap = self.limits.max_live_submitted_per_tenant;
        commit(&**store, &batch, cap, crate::snapshot::now());
        drop(store);
        self.shared.wake(super::Wake::Workloads);
        ticket.take().unwrap_or_else(|| {
            Err(ServiceError::Internal(
                "a submission was not answered".into(),
            ))
        })
    }
}

/// Commits `batch` in one transaction and answers every ticket of it.
fn commit(store: &dyn StateStore, batch: &[Arc<Ticket>], most_live: usize, now: i64) {
    let new: Vec<NewSubmission<'_>> = batch
        .iter()
        .map(|t| NewSubmission {
            name: &t.name,
            spec: &t.spec,
            origin: Origin::Submitted,
            most_live: Some(most_live),
        })
        .collect();
    match store.submit_many(&new, now) {
        Ok(answers) => {
            for (ticket, answer) in batch.iter().zip(answers) {
                ticket.answer(match answer {
                    Submitted::Queued(record) => {
                        info!(workload = %record.key(), "submitted");
                        Ok(*record)
                    }
                    Submitted::AtLimit { live } => Err(ServiceError::TooMany(format!(
                        "tenant {:?} has {live} submitted workloads that have not ended, the most \
                         it may have: wait for some to end or cancel some (`tessera cancel NAME`), \
                         or ask the operator to raise --max-submitted-per-tenant",
                        ticket.spec.tenant
                    ))),
                    Submitted::Refused(e) => Err(e.into()),
                });
            }
        }
        Err(e) => {
            let e = ServiceError::from(e);
            for ticket in batch {
                ticket.answer(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::auth::Principal;
    use crate::service::{Limits, Shared, TenantView, WorkloadView};
    use crate::store::Store;

    fn handle(most_live: usize) -> Handle {
        let (tx, _rx) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared::new("sim", tx));
        *shared.tenants.write().unwrap() = Some(
            ["a", "b"]
                .iter()
                .map(|t| TenantView {
                    name: (*t).to_owned(),
                    slo_classes: vec!["batch".to_owned()],
                    pools: vec![],
                    path: vec![(*t).to_owned()],
                    committed: Default::default(),
                })
                .collect(),
        );
        let store = Store::open_in_memory().unwrap();
        Handle::new(
            shared,
            Box::new(store),
            Limits {
                max_live_submitted_per_tenant: most_live,
            },
        )
    }

    fn spec(tenant: &str) -> WorkloadSpec {
        serde_json::from_value(serde_json::json!({
            "tenant": tenant, "sloClass": "batch", "gpu": {"count": 1}
        }))
        .unwrap()
    }

    /// Submissions from many threads at once, some taking the same name and more than the
    /// limit allows: each is answered once, after its commit, as one at a time would answer
    /// it (names and the limit hold across batches), and what was answered queued is stored.
    #[test]
    fn concurrent_submissions_are_each_answered_as_committed() {
        let handle = handle(12);
        let answers: Vec<(String, Result<WorkloadView, ServiceError>)> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..40)
                .map(|i| {
                    let handle = handle.clone();
                    s.spawn(move || {
                        // Tenant `a` asks for 20 distinct names, past its limit of 12; tenant
                        // `b` for 10 names twice each.
                        let (tenant, name) = if i % 2 == 0 {
                            ("a", format!("w{i}"))
                        } else {
                            ("b", format!("w{}", (i / 2) % 10))
                        };
                        let answer = handle.submit(&Principal::Admin, &name, spec(tenant));
                        (format!("{tenant}/{name}"), answer)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let queued: BTreeSet<&str> = answers
            .iter()
            .filter(|(_, a)| a.is_ok())
            .map(|(k, _)| k.as_str())
            .collect();
        let too_many = answers
            .iter()
            .filter(|(_, a)| matches!(a, Err(ServiceError::TooMany(_))))
            .count();
        let conflicts = answers
            .iter()
            .filter(|(_, a)| matches!(a, Err(ServiceError::Conflict(_))))
            .count();
        assert_eq!(queued.iter().filter(|k| k.starts_with("a/")).count(), 12);
        assert_eq!(too_many, 8);
        assert_eq!(queued.iter().filter(|k| k.starts_with("b/")).count(), 10);
        assert_eq!(conflicts, 10);
        let stored: BTreeSet<String> = handle
            .store()
            .list(None)
            .unwrap()
            .iter()
            .map(|r| format!("{}/{}", r.tenant, r.name))
            .collect();
        assert_eq!(stored, queued.iter().map(|k| k.to_string()).collect());
    }
}
