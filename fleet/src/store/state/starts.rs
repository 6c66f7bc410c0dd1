//! Batches of starts on etcd ([`StateStore::begin_starts_value`],
//! [`StateStore::finish_starts`]): each batch one fenced commit, as each is one SQLite
//! transaction, bounded by what one etcd transaction may carry ([`MAX_STARTS`], which the
//! service reads through [`StateStore::max_start_batch`] and cuts its batches to).

use super::*;

/// The most starts one batch may carry. Beginning a start guards its record and current
/// pointer (2) and writes the record, two events and the intent (4); finishing one guards
/// those and the open intent (3) and writes the record, two events, the intent's move and the
/// admission (6). With the two counters and the fence, 16 starts stay within etcd's 128
/// compares and 128 writes either way.
pub(super) const MAX_STARTS: usize = 16;

/// Refuses a batch that one commit cannot carry, or that names a workload twice (the second
/// change would be computed from a record the first has already changed).
fn check_batch<'a>(
    what: &str,
    workloads: impl ExactSizeIterator<Item = &'a WorkloadKey>,
) -> Result<(), StoreError> {
    if workloads.len() > MAX_STARTS {
        return Err(StoreError::Backend {
            what: format!("etcd: {what}"),
            source: format!(
                "{} starts in one batch; one etcd transaction carries at most {MAX_STARTS} \
                 (the store's max_start_batch)",
                workloads.len()
            )
            .into(),
        });
    }
    let mut seen = BTreeSet::new();
    for key in workloads {
        if !seen.insert(key) {
            return Err(StoreError::Conflict(format!(
                "workload `{key}` appears twice in one batch of starts"
            )));
        }
    }
    Ok(())
}

impl EtcdStore {
    /// `key`'s current record and the key it is at, with the guards that pin both it and the
    /// pointer to it added to `batch`.
    fn staged(
        &self,
        batch: &mut Batch,
        key: &WorkloadKey,
    ) -> Result<(String, WorkloadRecord), Attempt> {
        let (id, pointer) = self.current_id(key)?;
        let not_found = || StoreError::NotFound(format!("workload `{key}`"));
        let id = id.ok_or_else(not_found)?;
        let mut found = self
            .etcd
            .get_many(&[self.layout.live(id), self.layout.ended(id)])?;
        let Some((at, kv, record)) = self.record_at(id, &mut found)? else {
            return Err(not_found().into());
        };
        batch.guard(&self.layout.current(key), pointer.as_ref());
        batch.guard(&at, Some(&kv));
        Ok((at, record))
    }

    pub(super) fn begin_starts_in(
        &self,
        cycle: u64,
        starts: &[StartIntent<'_, serde_json::Value>],
        now: i64,
    ) -> Result<Vec<ActionId>, StoreError> {
        to_i64("cycle", cycle)?;
        check_batch("batch of starts", starts.iter().map(|s| s.workload))?;
        self.etcd.retrying("batch of starts", || {
            let mut found = self.etcd.get_many(&[
                self.layout.counter(Sequence::Event),
                self.layout.counter(Sequence::Journal),
            ])?;
            let mut events = self.counter(Sequence::Event, found.remove(0))?;
            let mut journal = self.counter(Sequence::Journal, found.remove(0))?;
            let mut batch = Batch::default();
            let mut ids = Vec::with_capacity(starts.len());
            for s in starts {
                let id = journal.next();
                batch.put(
                    self.layout.open(id),
                    &StoredAction::intent(cycle, s.action.clone(), now),
                )?;
                let (at, mut record) = self.staged(&mut batch, s.workload)?;
                let draft = lifecycle::mark_starting(&mut record, s.bindings)?;
                batch.put(at, &record)?;
                if let Some((kind, message)) = draft {
                    push_event(
                        &self.layout,
                        &mut batch,
                        &mut events,
                        now,
                        kind,
                        Some(s.workload),
                        &message,
                    )?;
                }
                ids.push(id);
            }
            events.close(&mut batch);
            journal.close(&mut batch);
            self.etcd.commit(&batch.guards, &batch.writes)?;
            Ok(ids)
        })
    }

    pub(super) fn finish_starts_in(
        &self,
        started: &[StartDone<'_>],
        now: i64,
    ) -> Result<(), StoreError> {
        check_batch(
            "batch of started workloads",
            started.iter().map(|s| s.workload),
        )?;
        let admissions = started
            .iter()
            .map(|s| {
                Ok(put(
                    self.layout
                        .admission(&s.workload.tenant, &s.workload.name, s.submitted_at),
                    encode(&StoredAdmission {
                        guaranteed_units: s.guaranteed.units().max(0),
                        borrowed_units: s.borrowed.units().max(0),
                    })?,
                ))
            })
            .collect::<Result<Vec<Write>, StoreError>>()?;
        self.etcd.retrying("batch of started workloads", || {
            let found = self.etcd.get(&self.layout.counter(Sequence::Event))?;
            let mut events = self.counter(Sequence::Event, found)?;
            let mut batch = Batch::default();
            for s in started {
                let (at, mut record) = self.staged(&mut batch, s.workload)?;
                let draft = lifecycle::mark_running(&mut record, s.replicas, now)?;
                batch.put(at, &record)?;
                if let Some((kind, message)) = draft {
                    push_event(
                        &self.layout,
                        &mut batch,
                        &mut events,
                        now,
                        kind,
                        Some(s.workload),
                        &message,
                    )?;
                }
                self.close_into(&mut batch, s.action, Ended::Done, now)?;
            }
            events.close(&mut batch);
            batch.writes.extend(admissions.iter().cloned());
            self.etcd.commit(&batch.guards, &batch.writes)
        })
    }

    pub(super) fn last_event_id_in(&self) -> Result<i64, StoreError> {
        let found = self.etcd.get(&self.layout.counter(Sequence::Event))?;
        Ok(self.counter(Sequence::Event, found)?.last)
    }
}
