//! [`StateStore`] on etcd: each method as reads and one fenced commit (see [`super`]).

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::KeyValue;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tessera_compiler::WorkloadKey;
use tessera_compiler::model::{
    Binding, ReconfigurationRecord, ReservationRecord, UsageRecord, WorkloadSpec,
};
use tessera_compiler::units::Gpus;
use tessera_reconciler::store::carried::Carried;
use tessera_reconciler::store::events::MAX_LIMIT;
use tessera_reconciler::store::starts::{StartDone, StartIntent};
use tessera_reconciler::store::usage::{NewRun, ReservedSpell, RunKey, UsageRow};
use tessera_reconciler::store::{
    ActionId, ActionState, EndReason, Ended, Event, JournalEntry, Origin, ReplicaProcess,
    RevisionRecord, RevisionStatus, StateStore, StoreError, WorkloadRecord,
};

use super::EtcdStore;
use super::etcd::{Attempt, Found, delete, put, unchanged};
use super::layout::{Layout, Sequence, id_of};
use super::lifecycle::{self, Draft};
use crate::election::{Guard, Write};

mod retention;
mod runs;
mod starts;

/// One commit in the making: what it compares and what it writes.
#[derive(Default)]
struct Batch {
    guards: Vec<Guard>,
    writes: Vec<Write>,
}

impl Batch {
    fn guard(&mut self, key: &str, found: Option<&KeyValue>) {
        self.guards.push(unchanged(key, found));
    }

    fn put<T: Serialize + ?Sized>(&mut self, key: String, value: &T) -> Result<(), StoreError> {
        self.writes.push(put(key, encode(value)?));
        Ok(())
    }
}

/// Intents one commit carries ([`StateStore::begin_actions_value`]): a write each, with the
/// journal counter's write and guard and the fence well within etcd's 128 compares and 128
/// writes.
const MAX_INTENTS: usize = 100;

/// Closes one commit carries ([`StateStore::close_all`]): two writes (the open entry deleted,
/// the closed one written) and a guard each.
const MAX_CLOSES: usize = 50;

/// A counter as read: the last id taken, and the key's state for the guard.
struct Counter {
    key: String,
    last: i64,
    found: Option<KeyValue>,
    taken: bool,
}

impl Counter {
    fn read(key: String, found: Option<KeyValue>) -> Result<Counter, StoreError> {
        let last = match &found {
            Some(kv) => std::str::from_utf8(kv.value())
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| corrupt(kv.key(), "not a counter"))?,
            None => 0,
        };
        Ok(Counter {
            key,
            last,
            found,
            taken: false,
        })
    }

    fn next(&mut self) -> i64 {
        self.last += 1;
        self.taken = true;
        self.last
    }

    /// Guards the counter and writes what was taken.
    fn close(self, batch: &mut Batch) {
        if self.taken {
            batch.guard(&self.key, self.found.as_ref());
            batch
                .writes
                .push(put(self.key, self.last.to_string().into_bytes()));
        }
    }
}

fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|source| StoreError::Encode {
        what: "etcd value",
        source,
    })
}

fn decode<T: DeserializeOwned>(kv: &KeyValue) -> Result<T, StoreError> {
    serde_json::from_slice(kv.value()).map_err(|e| corrupt(kv.key(), &e.to_string()))
}

fn corrupt(key: &[u8], message: &str) -> StoreError {
    StoreError::Corrupt {
        location: String::from_utf8_lossy(key).into_owned(),
        message: message.to_string(),
    }
}

/// Appends an event to `batch`, taking its id from `events`.
fn push_event(
    layout: &Layout,
    batch: &mut Batch,
    events: &mut Counter,
    now: i64,
    kind: &str,
    workload: Option<&WorkloadKey>,
    message: &str,
) -> Result<i64, StoreError> {
    let id = events.next();
    let event = Event {
        id,
        at: now,
        kind: kind.to_string(),
        workload: workload.map(|k| k.name.clone()),
        tenant: workload.map(|k| k.tenant.clone()),
        message: message.to_string(),
    };
    batch.put(layout.event(id), &event)?;
    if let Some(key) = workload {
        batch.put(layout.workload_event(key, id), &event)?;
    }
    Ok(id)
}

/// A journal entry as stored: open (no `state`... `intent`) or closed with its outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredAction {
    cycle: u64,
    action: serde_json::Value,
    state: ActionState,
    begun_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ended_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl StoredAction {
    /// A journal entry that opens: the intent to carry out `action`.
    fn intent(cycle: u64, action: serde_json::Value, now: i64) -> StoredAction {
        StoredAction {
            cycle,
            action,
            state: ActionState::Intent,
            begun_at: now,
            ended_at: None,
            error: None,
        }
    }
}

/// [`Carried`] as stored.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredCarried {
    usage: Option<UsageRecord>,
    reservations: Vec<ReservationRecord>,
    reconfigurations: Vec<ReconfigurationRecord>,
    updated_at: i64,
}

/// One metered run as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredRun {
    tenant: String,
    workload: String,
    started_at: i64,
    pool: String,
    model: String,
    profile: Option<String>,
    gpu_units: i64,
    guaranteed_units: Option<i64>,
    cpu_millicores: i64,
    memory_mib: i64,
    metered_until: i64,
    /// Extended by the runs' watermark (`runs.rs`); a row written before there was one is
    /// closed.
    #[serde(default)]
    open: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredAdmission {
    guaranteed_units: i64,
    borrowed_units: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredPreemption {
    tenant: String,
    pool: String,
    at: i64,
    lost_unit_seconds: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredSpell {
    tenant: String,
    workload: String,
    pool: String,
    gpus: u32,
    start: i64,
    until: i64,
}

/// The most reserved-idle spells charged in one commit: two guards and two writes each, and
/// the counter and the watermark.
const SPELLS_PER_COMMIT: usize = 30;

fn to_i64(what: &'static str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { what, value })
}

fn origin_str(origin: Origin) -> &'static str {
    match origin {
        Origin::Submitted => "submitted",
        Origin::Committed => "committed",
    }
}

fn status_str(status: RevisionStatus) -> &'static str {
    match status {
        RevisionStatus::Applied => "applied",
        RevisionStatus::Rejected => "rejected",
    }
}

impl EtcdStore {
    fn counter(&self, sequence: Sequence, found: Option<KeyValue>) -> Result<Counter, StoreError> {
        Counter::read(self.layout.counter(sequence), found)
    }

    /// Every record under `prefix` with its id, in id order.
    fn records(&self, prefix: &str) -> Result<Vec<(i64, WorkloadRecord)>, StoreError> {
        self.etcd
            .range(prefix, None, false)?
            .iter()
            .map(|kv| Ok((id_of(kv.key())?, decode(kv)?)))
            .collect()
    }

    /// Live and ended records, in submission order.
    fn all_records(&self) -> Result<Vec<(i64, WorkloadRecord)>, StoreError> {
        let mut all = self.records(&self.layout.live_prefix())?;
        all.extend(self.records(&self.layout.ended_prefix())?);
        all.sort_by_key(|(id, _)| *id);
        Ok(all)
    }

    fn live_where(
        &self,
        keep: impl Fn(&WorkloadRecord) -> bool,
    ) -> Result<Vec<WorkloadRecord>, StoreError> {
        Ok(self
            .records(&self.layout.live_prefix())?
            .into_iter()
            .map(|(_, r)| r)
            .filter(|r| keep(r))
            .collect())
    }

    /// The id of `key`'s current record, with the pointer as read (for a guard).
    fn current_id(&self, key: &WorkloadKey) -> Result<(Option<i64>, Option<KeyValue>), StoreError> {
        let found = self.etcd.get(&self.layout.current(key))?;
        let id = found.as_ref().map(decode::<i64>).transpose()?;
        Ok((id, found))
    }

    /// A record by id, live or ended, with the key it was found at and its state.
    fn record_at(
        &self,
        id: i64,
        found: &mut Found,
    ) -> Result<Option<(String, KeyValue, WorkloadRecord)>, StoreError> {
        let live = found.remove(0);
        let ended = found.remove(0);
        let (key, kv) = match (live, ended) {
            (Some(kv), _) => (self.layout.live(id), kv),
            (None, Some(kv)) => (self.layout.ended(id), kv),
            (None, None) => return Ok(None),
        };
        let record = decode(&kv)?;
        Ok(Some((key, kv, record)))
    }

    /// One checked change of `key`'s current record, committed with its event; `change`
    /// returns the event (`None`: nothing changed, nothing written) and a value for the caller.
    fn transition<T>(
        &self,
        key: &WorkloadKey,
        now: i64,
        change: impl Fn(&mut WorkloadRecord) -> Result<(Option<Draft>, T), StoreError>,
    ) -> Result<(WorkloadRecord, T), StoreError> {
        self.etcd.retrying("workload transition", || {
            let (id, pointer) = self.current_id(key)?;
            let not_found = || StoreError::NotFound(format!("workload `{key}`"));
            let id = id.ok_or_else(not_found)?;
            let mut found = self.etcd.get_many(&[
                self.layout.live(id),
                self.layout.ended(id),
                self.layout.counter(Sequence::Event),
            ])?;
            let Some((at, kv, mut record)) = self.record_at(id, &mut found)? else {
                return Err(not_found().into());
            };
            let (draft, value) = change(&mut record)?;
            let Some((kind, message)) = draft else {
                return Ok((record, value));
            };
            let mut events = self.counter(Sequence::Event, found.remove(0))?;
            let mut batch = Batch::default();
            batch.guard(&self.layout.current(key), pointer.as_ref());
            batch.guard(&at, Some(&kv));
            let was_live = at == self.layout.live(id);
            if record.phase.is_ended() && was_live {
                batch.writes.push(delete(at));
                batch.put(self.layout.ended(id), &record)?;
            } else {
                batch.put(at, &record)?;
            }
            push_event(
                &self.layout,
                &mut batch,
                &mut events,
                now,
                kind,
                Some(key),
                &message,
            )?;
            events.close(&mut batch);
            self.etcd.commit(&batch.guards, &batch.writes)?;
            Ok((record, value))
        })
    }

    fn record_transition(
        &self,
        key: &WorkloadKey,
        now: i64,
        change: impl Fn(&mut WorkloadRecord) -> Result<Option<Draft>, StoreError>,
    ) -> Result<WorkloadRecord, StoreError> {
        Ok(self
            .transition(key, now, |record| Ok((change(record)?, ())))?
            .0)
    }

    /// Records an intent, closing `ended` first in the same commit when given.
    fn begin(
        &self,
        ended: Option<(ActionId, Ended<'_>)>,
        cycle: u64,
        action: &serde_json::Value,
        now: i64,
    ) -> Result<ActionId, StoreError> {
        to_i64("cycle", cycle)?;
        self.etcd.retrying("journal intent", || {
            let mut batch = Batch::default();
            let counter = self.etcd.get(&self.layout.counter(Sequence::Journal))?;
            if let Some((id, how)) = ended {
                self.close_into(&mut batch, id, how, now)?;
            }
            let mut journal = self.counter(Sequence::Journal, counter)?;
            let id = journal.next();
            batch.put(
                self.layout.open(id),
                &StoredAction::intent(cycle, action.clone(), now),
            )?;
            journal.close(&mut batch);
            self.etcd.commit(&batch.guards, &batch.writes)?;
            Ok(id)
        })
    }

    /// Adds the close of action `id` to `batch`: it must be open.
    fn close_into(
        &self,
        batch: &mut Batch,
        id: ActionId,
        how: Ended<'_>,
        now: i64,
    ) -> Result<(), Attempt> {
        match self.close_all_into(batch, &[(id, how)], now)? {
            Some(refused) => Err(refused.into()),
            None => Ok(()),
        }
    }

    /// Adds the close of each action to `batch`, their entries read together, up to the first
    /// that is not open: why that one cannot be closed (`ActionClosed`, `NotFound`), those
    /// before it in `batch`. An action named twice is closed once and refused the second time.
    fn close_all_into(
        &self,
        batch: &mut Batch,
        ended: &[(ActionId, Ended<'_>)],
        now: i64,
    ) -> Result<Option<StoreError>, Attempt> {
        let keys: Vec<String> = ended
            .iter()
            .flat_map(|&(id, _)| [self.layout.open(id), self.layout.closed(id)])
            .collect();
        let found = self.etcd.get_many(&keys)?;
        let mut closing: BTreeMap<ActionId, ActionState> = BTreeMap::new();
        for (&(id, how), entries) in ended.iter().zip(found.chunks(2)) {
            let [open, closed] = entries else {
                unreachable!("two keys read per action")
            };
            if let Some(&state) = closing.get(&id) {
                return Ok(Some(StoreError::ActionClosed { id, state }));
            }
            let Some(open) = open else {
                return Ok(Some(match closed {
                    Some(kv) => StoreError::ActionClosed {
                        id,
                        state: decode::<StoredAction>(kv)?.state,
                    },
                    None => StoreError::NotFound(format!("journal action {id}")),
                }));
            };
            let mut entry: StoredAction = decode(open)?;
            let (state, error) = match how {
                Ended::Done => (ActionState::Done, None),
                Ended::Failed(error) => (ActionState::Failed, Some(error.to_string())),
            };
            entry.state = state;
            entry.ended_at = Some(now);
            entry.error = error;
            closing.insert(id, state);
            let open_key = self.layout.open(id);
            batch.guard(&open_key, Some(open));
            batch.writes.push(delete(open_key));
            batch.put(self.layout.closed(id), &entry)?;
        }
        Ok(None)
    }

    /// The intents of `actions`, [`MAX_INTENTS`] to a commit; their ids in order.
    fn begin_all(
        &self,
        cycle: u64,
        actions: &[serde_json::Value],
        now: i64,
    ) -> Result<Vec<ActionId>, StoreError> {
        to_i64("cycle", cycle)?;
        let mut ids = Vec::with_capacity(actions.len());
        for chunk in actions.chunks(MAX_INTENTS) {
            let begun = self.etcd.retrying("journal intents", || {
                let mut batch = Batch::default();
                let counter = self.etcd.get(&self.layout.counter(Sequence::Journal))?;
                let mut journal = self.counter(Sequence::Journal, counter)?;
                let mut begun = Vec::with_capacity(chunk.len());
                for action in chunk {
                    let id = journal.next();
                    batch.put(
                        self.layout.open(id),
                        &StoredAction::intent(cycle, action.clone(), now),
                    )?;
                    begun.push(id);
                }
                journal.close(&mut batch);
                self.etcd.commit(&batch.guards, &batch.writes)?;
                Ok(begun)
            })?;
            ids.extend(begun);
        }
        Ok(ids)
    }

    fn journal(&self, prefix: &str) -> Result<Vec<(i64, StoredAction)>, StoreError> {
        self.etcd
            .range(prefix, None, false)?
            .iter()
            .map(|kv| Ok((id_of(kv.key())?, decode(kv)?)))
            .collect()
    }

    fn event_list(&self, kvs: Vec<KeyValue>) -> Result<Vec<Event>, StoreError> {
        kvs.iter().map(decode).collect()
    }

    /// Charges one chunk of spells over `[start, now)`; `last` moves the watermark too.
    fn reserve_chunk(
        &self,
        spells: &[&ReservedSpell],
        start_of: impl Fn(Option<i64>) -> i64,
        now: i64,
        last: bool,
    ) -> Result<(), StoreError> {
        self.etcd.retrying("reserved-idle metering", || {
            let clock_key = self.layout.clock();
            let tails: Vec<String> = spells
                .iter()
                .map(|s| {
                    self.layout
                        .reserved_tail(&s.tenant, &s.workload, &s.pool, s.gpus)
                })
                .collect();
            let mut keys = vec![clock_key.clone(), self.layout.counter(Sequence::Reserved)];
            keys.extend(tails.iter().cloned());
            let mut found = self.etcd.get_many(&keys)?;
            let tail_found = found.split_off(2);
            let counter_found = found.pop().flatten();
            let clock_found = found.pop().flatten();
            let watermark = clock_found.as_ref().map(decode::<i64>).transpose()?;
            let start = start_of(watermark);
            let mut batch = Batch::default();
            batch.guard(&clock_key, clock_found.as_ref());
            let mut counter = self.counter(Sequence::Reserved, counter_found)?;
            if now > start {
                let tail_ids: Vec<Option<i64>> = tail_found
                    .iter()
                    .map(|kv| kv.as_ref().map(decode::<i64>).transpose())
                    .collect::<Result<_, _>>()?;
                let spell_keys: Vec<String> = tail_ids
                    .iter()
                    .flatten()
                    .map(|id| self.layout.reserved(*id))
                    .collect();
                let mut spell_found = self.etcd.get_many(&spell_keys)?.into_iter();
                for ((spell, tail_key), (tail_kv, tail_id)) in spells
                    .iter()
                    .zip(&tails)
                    .zip(tail_found.iter().zip(&tail_ids))
                {
                    batch.guard(tail_key, tail_kv.as_ref());
                    let previous = match tail_id {
                        Some(id) => {
                            let kv = spell_found.next().flatten();
                            let key = self.layout.reserved(*id);
                            batch.guard(&key, kv.as_ref());
                            kv.map(|kv| decode::<StoredSpell>(&kv).map(|s| (key, s)))
                                .transpose()?
                        }
                        None => None,
                    };
                    match previous {
                        // The spell reaches this interval: it grows over what it does not
                        // cover yet (nothing, when a repeated call already charged it).
                        Some((key, mut s)) if s.until >= start => {
                            if s.until < now {
                                s.until = now;
                                batch.put(key, &s)?;
                            }
                        }
                        _ => {
                            let id = counter.next();
                            batch.put(
                                self.layout.reserved(id),
                                &StoredSpell {
                                    tenant: spell.tenant.clone(),
                                    workload: spell.workload.clone(),
                                    pool: spell.pool.clone(),
                                    gpus: spell.gpus,
                                    start,
                                    until: now,
                                },
                            )?;
                            batch.put(tail_key.clone(), &id)?;
                        }
                    }
                }
            }
            counter.close(&mut batch);
            if last {
                batch.put(clock_key, &watermark.map_or(now, |w| w.max(now)))?;
            }
            self.etcd.commit(&batch.guards, &batch.writes)?;
            Ok(())
        })
    }
}

impl StateStore for EtcdStore {
    fn last_event_id(&self) -> Result<i64, StoreError> {
        self.last_event_id_in()
    }

    fn max_start_batch(&self) -> usize {
        starts::MAX_STARTS
    }

    fn begin_starts_value(
        &self,
        cycle: u64,
        starts: &[StartIntent<'_, serde_json::Value>],
        now: i64,
    ) -> Result<Vec<ActionId>, StoreError> {
        self.begin_starts_in(cycle, starts, now)
    }

    fn finish_starts(&self, started: &[StartDone<'_>], now: i64) -> Result<(), StoreError> {
        self.finish_starts_in(started, now)
    }

    fn submit(
        &self,
        name: &str,
        spec: &WorkloadSpec,
        origin: Origin,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        let key = WorkloadKey::new(&spec.tenant, name);
        self.etcd.retrying("submit", || {
            let (current, pointer) = self.current_id(&key)?;
            let mut reads = vec![
                self.layout.counter(Sequence::Workload),
                self.layout.counter(Sequence::Event),
            ];
            if let Some(id) = current {
                reads.push(self.layout.live(id));
            }
            let mut found = self.etcd.get_many(&reads)?;
            if current.is_some() && found.pop().flatten().is_some() {
                return Err(StoreError::Conflict(format!(
                    "workload {name:?} of tenant {:?} exists and has not ended",
                    spec.tenant
                ))
                .into());
            }
            let mut events = self.counter(Sequence::Event, found.pop().flatten())?;
            let mut workloads = self.counter(Sequence::Workload, found.pop().flatten())?;
            let id = workloads.next();
            let record = WorkloadRecord::submitted(name, spec, origin, now);
            let mut batch = Batch::default();
            let current_key = self.layout.current(&key);
            batch.guard(&current_key, pointer.as_ref());
            batch.put(self.layout.live(id), &record)?;
            batch.put(current_key, &id)?;
            batch
                .writes
                .push(put(self.layout.history(&key, id), Vec::new()));
            push_event(
                &self.layout,
                &mut batch,
                &mut events,
                now,
                "submitted",
                Some(&key),
                &format!("{} by tenant {}", origin_str(origin), spec.tenant),
            )?;
            workloads.close(&mut batch);
            events.close(&mut batch);
            self.etcd.commit(&batch.guards, &batch.writes)?;
            Ok(record)
        })
    }

    fn get(&self, key: &WorkloadKey) -> Result<Option<WorkloadRecord>, StoreError> {
        let (Some(id), _) = self.current_id(key)? else {
            return Ok(None);
        };
        let mut found = self
            .etcd
            .get_many(&[self.layout.live(id), self.layout.ended(id)])?;
        Ok(self.record_at(id, &mut found)?.map(|(_, _, r)| r))
    }

    fn tenants_with(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let tenants: BTreeSet<String> = self
            .etcd
            .range(&self.layout.current_prefix(), None, false)?
            .iter()
            .filter_map(|kv| self.layout.parse_current(kv.key()))
            .filter(|(_, n)| n == name)
            .map(|(t, _)| t)
            .collect();
        Ok(tenants.into_iter().collect())
    }

    fn list(&self, tenant: Option<&str>) -> Result<Vec<WorkloadRecord>, StoreError> {
        Ok(self
            .all_records()?
            .into_iter()
            .map(|(_, r)| r)
            .filter(|r| tenant.is_none_or(|t| r.tenant == t))
            .collect())
    }

    fn live_submitted(&self, tenant: &str) -> Result<usize, StoreError> {
        Ok(self
            .live_where(|r| r.tenant == tenant && r.origin == Origin::Submitted)?
            .len())
    }

    fn live(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.live_where(|_| true)
    }

    fn live_with_max_duration(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.live_where(|r| r.started_at.is_some() && r.spec.max_duration.is_some())
    }

    fn committed(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        let pointers = self
            .etcd
            .range(&self.layout.current_prefix(), None, false)?;
        let ids: BTreeSet<i64> = pointers
            .iter()
            .map(decode::<i64>)
            .collect::<Result<_, _>>()?;
        let mut current: BTreeMap<i64, WorkloadRecord> = self
            .records(&self.layout.live_prefix())?
            .into_iter()
            .filter(|(id, _)| ids.contains(id))
            .collect();
        let ended: Vec<i64> = ids
            .iter()
            .filter(|id| !current.contains_key(id))
            .copied()
            .collect();
        let keys: Vec<String> = ended.iter().map(|id| self.layout.ended(*id)).collect();
        for (id, kv) in ended.iter().zip(self.etcd.get_many(&keys)?) {
            if let Some(kv) = kv {
                current.insert(*id, decode(&kv)?);
            }
        }
        Ok(current
            .into_values()
            .filter(|r| r.origin == Origin::Committed)
            .collect())
    }

    fn ended(&self, key: &WorkloadKey, limit: u32) -> Result<Vec<WorkloadRecord>, StoreError> {
        let ids: Vec<i64> = self
            .etcd
            .range(&self.layout.history_prefix(key), None, true)?
            .iter()
            .map(|kv| id_of(kv.key()))
            .collect::<Result<_, _>>()?;
        let keys: Vec<String> = ids.iter().map(|id| self.layout.ended(*id)).collect();
        self.etcd
            .get_many(&keys)?
            .iter()
            .flatten()
            .take(limit as usize)
            .map(decode)
            .collect()
    }

    fn cancel_requested(&self) -> Result<Vec<WorkloadRecord>, StoreError> {
        self.live_where(|r| r.cancel_requested_at.is_some())
    }

    fn workload_by_pid(&self, pid: u32) -> Result<Option<WorkloadRecord>, StoreError> {
        Ok(self
            .live_where(|r| r.replicas.iter().any(|p| p.pid == Some(pid)))?
            .pop())
    }

    fn mark_starting(
        &self,
        key: &WorkloadKey,
        bindings: &[Binding],
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.record_transition(key, now, |r| lifecycle::mark_starting(r, bindings))
    }

    fn mark_running(
        &self,
        key: &WorkloadKey,
        replicas: &[ReplicaProcess],
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.record_transition(key, now, |r| lifecycle::mark_running(r, replicas, now))
    }

    fn mark_checkpointing(
        &self,
        key: &WorkloadKey,
        grace_deadline: i64,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.record_transition(key, now, |r| {
            lifecycle::mark_checkpointing(r, grace_deadline, now)
        })
    }

    fn record_checkpoint(
        &self,
        key: &WorkloadKey,
        dir: &str,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.record_transition(key, now, |r| lifecycle::record_checkpoint(r, dir, now))
    }

    fn replica_exited(&self, key: &WorkloadKey, pid: u32, now: i64) -> Result<usize, StoreError> {
        let (_, remaining) = self.transition(key, now, |r| {
            let (draft, remaining) = lifecycle::replica_exited(r, pid)?;
            Ok((Some(draft), remaining))
        })?;
        Ok(remaining)
    }

    fn requeue(
        &self,
        key: &WorkloadKey,
        reason: &str,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.record_transition(key, now, |r| lifecycle::requeue(r, reason, now))
    }

    fn finish(
        &self,
        key: &WorkloadKey,
        end_reason: EndReason,
        now: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        self.record_transition(key, now, |r| lifecycle::finish(r, end_reason.clone(), now))
    }

    fn cancel(&self, key: &WorkloadKey, now: i64) -> Result<WorkloadRecord, StoreError> {
        self.record_transition(key, now, |r| lifecycle::cancel(r, now))
    }

    fn begin_action_value(
        &self,
        cycle: u64,
        action: &serde_json::Value,
        now: i64,
    ) -> Result<ActionId, StoreError> {
        self.begin(None, cycle, action, now)
    }

    fn close_and_begin_value(
        &self,
        ended: (ActionId, Ended<'_>),
        cycle: u64,
        action: &serde_json::Value,
        now: i64,
    ) -> Result<ActionId, StoreError> {
        self.begin(Some(ended), cycle, action, now)
    }

    fn close(&self, id: ActionId, how: Ended<'_>, now: i64) -> Result<(), StoreError> {
        self.etcd.retrying("journal close", || {
            let mut batch = Batch::default();
            self.close_into(&mut batch, id, how, now)?;
            self.etcd.commit(&batch.guards, &batch.writes)
        })
    }

    fn begin_actions_value(
        &self,
        cycle: u64,
        actions: &[serde_json::Value],
        now: i64,
    ) -> Result<Vec<ActionId>, StoreError> {
        self.begin_all(cycle, actions, now)
    }

    fn close_all(&self, ended: &[(ActionId, Ended<'_>)], now: i64) -> Result<(), StoreError> {
        for chunk in ended.chunks(MAX_CLOSES) {
            let refused = self.etcd.retrying("journal closes", || {
                let mut batch = Batch::default();
                let refused = self.close_all_into(&mut batch, chunk, now)?;
                self.etcd.commit(&batch.guards, &batch.writes)?;
                Ok(refused)
            })?;
            if let Some(refused) = refused {
                return Err(refused);
            }
        }
        Ok(())
    }

    fn open_actions(&self) -> Result<Vec<JournalEntry>, StoreError> {
        Ok(self
            .journal(&self.layout.open_prefix())?
            .into_iter()
            .map(|(id, entry)| JournalEntry {
                id,
                cycle: entry.cycle,
                action: entry.action,
                begun_at: entry.begun_at,
            })
            .collect())
    }

    fn interrupted_starts(
        &self,
        workload: &WorkloadKey,
        since: i64,
        interrupted_prefix: &str,
    ) -> Result<u32, StoreError> {
        let names = [
            serde_json::json!(workload.to_string()),
            serde_json::json!(workload.name),
        ];
        let count = self
            .journal(&self.layout.closed_prefix())?
            .into_iter()
            .filter(|(_, e)| {
                e.state == ActionState::Failed
                    && e.begun_at >= since
                    && e.error
                        .as_deref()
                        .is_some_and(|m| m.starts_with(interrupted_prefix))
                    && e.action.get("action") == Some(&serde_json::json!("start"))
                    && e.action.get("workload").is_some_and(|w| names.contains(w))
            })
            .count();
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    fn prune_journal(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        self.prune_journal_in(before, limit)
    }

    fn prune_events(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        self.prune_events_in(before, limit)
    }

    fn prune_workloads(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        self.prune_workloads_in(before, limit)
    }

    fn prune_usage(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        self.prune_usage_in(before, limit)
    }

    fn record_event(
        &self,
        kind: &str,
        workload: Option<&WorkloadKey>,
        message: &str,
        now: i64,
    ) -> Result<i64, StoreError> {
        self.etcd.retrying("event", || {
            let found = self.etcd.get(&self.layout.counter(Sequence::Event))?;
            let mut events = self.counter(Sequence::Event, found)?;
            let mut batch = Batch::default();
            let id = push_event(
                &self.layout,
                &mut batch,
                &mut events,
                now,
                kind,
                workload,
                message,
            )?;
            events.close(&mut batch);
            self.etcd.commit(&batch.guards, &batch.writes)?;
            Ok(id)
        })
    }

    fn events(&self, since_id: i64, limit: u32) -> Result<Vec<Event>, StoreError> {
        let prefix = self.layout.events_prefix();
        let from = self.layout.event(since_id.saturating_add(1));
        let limit = limit.min(MAX_LIMIT) as usize;
        self.event_list(self.etcd.range_from(&prefix, &from, Some(limit))?)
    }

    fn workload_events(
        &self,
        workload: &WorkloadKey,
        since_id: i64,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        let prefix = self.layout.workload_events_prefix(workload);
        let from = self
            .layout
            .workload_event(workload, since_id.saturating_add(1));
        let limit = limit.min(MAX_LIMIT) as usize;
        self.event_list(self.etcd.range_from(&prefix, &from, Some(limit))?)
    }

    fn recent_workload_events(
        &self,
        workload: &WorkloadKey,
        limit: u32,
    ) -> Result<Vec<Event>, StoreError> {
        let prefix = self.layout.workload_events_prefix(workload);
        let limit = limit.min(MAX_LIMIT) as usize;
        let mut events = self.event_list(self.etcd.range(&prefix, Some(limit), true)?)?;
        events.reverse();
        Ok(events)
    }

    fn record_revision_value(
        &self,
        commit: &str,
        status: RevisionStatus,
        diagnostics: serde_json::Value,
        now: i64,
    ) -> Result<RevisionRecord, StoreError> {
        let record = RevisionRecord {
            commit: commit.to_string(),
            seen_at: now,
            status,
            diagnostics,
        };
        let count = record.diagnostics.as_array().map_or(0, Vec::len);
        self.etcd.retrying("revision", || {
            let mut found = self.etcd.get_many(&[
                self.layout.counter(Sequence::Revision),
                self.layout.counter(Sequence::Event),
            ])?;
            let mut events = self.counter(Sequence::Event, found.pop().flatten())?;
            let mut revisions = self.counter(Sequence::Revision, found.pop().flatten())?;
            let mut batch = Batch::default();
            batch.put(self.layout.revision(revisions.next()), &record)?;
            if status == RevisionStatus::Applied {
                batch.put(self.layout.last_applied(), &record)?;
            }
            push_event(
                &self.layout,
                &mut batch,
                &mut events,
                now,
                &format!("revision-{}", status_str(status)),
                None,
                &format!("{commit} ({count} diagnostics)"),
            )?;
            revisions.close(&mut batch);
            events.close(&mut batch);
            self.etcd.commit(&batch.guards, &batch.writes)?;
            Ok(record.clone())
        })
    }

    fn last_applied(&self) -> Result<Option<RevisionRecord>, StoreError> {
        self.etcd
            .get(&self.layout.last_applied())?
            .as_ref()
            .map(decode)
            .transpose()
    }

    fn revisions(&self, limit: u32) -> Result<Vec<RevisionRecord>, StoreError> {
        self.etcd
            .range(&self.layout.revisions_prefix(), Some(limit as usize), true)?
            .iter()
            .map(decode)
            .collect()
    }

    fn carried(&self) -> Result<Carried, StoreError> {
        let Some(kv) = self.etcd.get(&self.layout.carried())? else {
            return Ok(Carried::default());
        };
        let stored: StoredCarried = decode(&kv)?;
        Ok(Carried {
            usage: stored.usage,
            reservations: stored.reservations,
            reconfigurations: stored.reconfigurations,
        })
    }

    fn set_carried(&self, carried: &Carried, now: i64) -> Result<(), StoreError> {
        let stored = StoredCarried {
            usage: carried.usage.clone(),
            reservations: carried.reservations.clone(),
            reconfigurations: carried.reconfigurations.clone(),
            updated_at: now,
        };
        let write = put(self.layout.carried(), encode(&stored)?);
        self.etcd.retrying("carried", || {
            self.etcd.commit(&[], std::slice::from_ref(&write))
        })
    }

    fn placed_runs(&self) -> Result<Vec<RunKey>, StoreError> {
        Ok(self
            .live_where(|r| r.phase.holds_placement() && r.started_at.is_some())?
            .into_iter()
            .filter_map(|r| {
                Some(RunKey {
                    started_at: r.started_at?,
                    tenant: r.tenant,
                    workload: r.name,
                    submitted_at: r.submitted_at,
                })
            })
            .collect())
    }

    fn unmetered_runs(&self, keys: &[RunKey]) -> Result<Vec<RunKey>, StoreError> {
        let rows: Vec<String> = keys.iter().map(|k| self.layout.run(k)).collect();
        Ok(keys
            .iter()
            .zip(self.etcd.get_many(&rows)?)
            .filter(|(_, found)| found.is_none())
            .map(|(k, _)| k.clone())
            .collect())
    }

    fn meter_runs(&self, extend: &[RunKey], create: &[NewRun], now: i64) -> Result<(), StoreError> {
        self.meter_with_watermark(extend, create, now)
    }

    fn record_admission(
        &self,
        tenant: &str,
        workload: &str,
        submitted_at: i64,
        guaranteed: Gpus,
        borrowed: Gpus,
    ) -> Result<(), StoreError> {
        let write = put(
            self.layout.admission(tenant, workload, submitted_at),
            encode(&StoredAdmission {
                guaranteed_units: guaranteed.units().max(0),
                borrowed_units: borrowed.units().max(0),
            })?,
        );
        self.etcd.retrying("admission", || {
            self.etcd.commit(&[], std::slice::from_ref(&write))
        })
    }

    fn record_preemption(
        &self,
        run: &RunKey,
        pool: &str,
        lost_unit_seconds: i64,
        at: i64,
    ) -> Result<(), StoreError> {
        let key = self.layout.preemption(run);
        let guard = Guard::Absent { key: key.clone() };
        let write = put(
            key,
            encode(&StoredPreemption {
                tenant: run.tenant.clone(),
                pool: pool.to_string(),
                at,
                lost_unit_seconds: lost_unit_seconds.max(0),
            })?,
        );
        match self.etcd.commit(&[guard], &[write]) {
            // Recorded already: a run is preempted once.
            Ok(()) | Err(Attempt::Conflict) => Ok(()),
            Err(Attempt::Failed(e)) => Err(e),
        }
    }

    fn meter_reserved(
        &self,
        spells: &[ReservedSpell],
        decided_at: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        // One entry per spell key: a commit may not write a key twice.
        let mut seen = BTreeSet::new();
        let spells: Vec<&ReservedSpell> = spells
            .iter()
            .filter(|s| s.gpus > 0)
            .filter(|s| seen.insert((&s.tenant, &s.workload, &s.pool, s.gpus)))
            .collect();
        let start_of = |watermark: Option<i64>| watermark.map_or(decided_at, |w| w.max(decided_at));
        let chunks: Vec<&[&ReservedSpell]> = if spells.is_empty() {
            vec![&[]]
        } else {
            spells.chunks(SPELLS_PER_COMMIT).collect()
        };
        let count = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            self.reserve_chunk(chunk, start_of, now, i + 1 == count)?;
        }
        Ok(())
    }

    fn usage(&self, since: i64, until: i64) -> Result<Vec<UsageRow>, StoreError> {
        let mut rows: BTreeMap<RowKey, UsageRow> = BTreeMap::new();
        // Seconds of `[start, end)` inside the window.
        let inside = |start: i64, end: i64| 0.max(end.min(until) - start.max(since));
        for (r, end) in self.metered_rows()? {
            if !(end > since && r.started_at < until) {
                continue;
            }
            let o = inside(r.started_at, end);
            let (guaranteed, borrowed, unclassified) = match r.guaranteed_units {
                Some(g) => (g, r.gpu_units - g, 0),
                None => (0, 0, r.gpu_units),
            };
            let u = usage_row(
                &mut rows,
                &r.tenant,
                &r.pool,
                Some(r.model.as_str()),
                r.profile.as_deref(),
            );
            u.gpu_unit_seconds += r.gpu_units * o;
            u.guaranteed_unit_seconds += guaranteed * o;
            u.borrowed_unit_seconds += borrowed * o;
            u.unclassified_unit_seconds += unclassified * o;
            u.cpu_millicore_seconds += r.cpu_millicores * o;
            u.memory_mib_seconds += r.memory_mib * o;
        }
        for kv in self
            .etcd
            .range(&self.layout.reserved_prefix(), None, false)?
        {
            let s: StoredSpell = decode(&kv)?;
            if !(s.until > since && s.start < until) {
                continue;
            }
            let u = usage_row(&mut rows, &s.tenant, &s.pool, None, None);
            u.reserved_idle_unit_seconds +=
                i64::from(s.gpus) * inside(s.start, s.until) * Gpus::UNITS_PER_GPU;
        }
        for kv in self
            .etcd
            .range(&self.layout.preemptions_prefix(), None, false)?
        {
            let p: StoredPreemption = decode(&kv)?;
            if !(p.at >= since && p.at < until) {
                continue;
            }
            let u = usage_row(&mut rows, &p.tenant, &p.pool, None, None);
            u.preemption_lost_unit_seconds += p.lost_unit_seconds;
        }
        Ok(rows.into_values().collect())
    }
}

type RowKey = (String, String, Option<String>, Option<String>);

/// The row of one tenant, pool, model and profile, created empty when first met.
fn usage_row<'a>(
    rows: &'a mut BTreeMap<RowKey, UsageRow>,
    tenant: &str,
    pool: &str,
    model: Option<&str>,
    profile: Option<&str>,
) -> &'a mut UsageRow {
    let key = (
        tenant.to_string(),
        pool.to_string(),
        model.map(str::to_string),
        profile.map(str::to_string),
    );
    rows.entry(key).or_insert_with(|| UsageRow {
        tenant: tenant.to_string(),
        pool: pool.to_string(),
        model: model.map(str::to_string),
        profile: profile.map(str::to_string),
        ..UsageRow::default()
    })
}
