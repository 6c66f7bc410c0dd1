//! Retention on etcd: the same deletions as the SQLite store's (`tessera_reconciler::store::
//! retention`, whose rules the contract holds both to), done as a bounded scan of one prefix
//! from its oldest key and fenced commits of a few dozen rows each.
//!
//! A call reads its prefix a page at a time from the oldest id, judges each row (delete it,
//! keep it, or stop: the rest is younger), and commits the rows it deletes with a guard on
//! each key the decision read, so that a row changed meanwhile (a workload's name submitted
//! again) is read and judged again rather than deleted on a stale reading. It stops after
//! `limit` rows deleted or `SCAN_FACTOR × limit` keys read, whichever comes first, so a
//! backlog costs one bounded call per step, never one stalled cycle. Ids grow with time, so
//! the oldest keys are the first to age past a cutoff; a row that is younger than the cutoff
//! but older than the rows behind it (a long action, a long-running workload) is passed over,
//! and is pruned once it has aged too.

use super::*;

/// Keys one call reads, per row it may delete.
const SCAN_FACTOR: usize = 4;

/// Keys read per page of the scan.
const SCAN_PAGE: usize = 100;

/// What a prune does with one row.
enum Verdict {
    /// Younger than the cutoff, or still needed: kept, and the scan goes on.
    Keep,
    /// Younger than the cutoff, and so is every later row (the event log is in time order).
    Stop,
    /// Deleted: these guards (each key the decision read, as read) and these deletes.
    Delete {
        guards: Vec<Guard>,
        deletes: Vec<String>,
    },
}

impl Verdict {
    /// Deletes the row at `kv` (guarded as read) and `with` (keys no write changes once
    /// written: a history marker, an event's copy).
    fn delete(kv: &KeyValue, with: impl IntoIterator<Item = String>) -> Verdict {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let mut deletes = vec![key.clone()];
        deletes.extend(with);
        Verdict::Delete {
            guards: vec![unchanged(&key, Some(kv))],
            deletes,
        }
    }
}

/// What one commit of a scan did.
struct Step {
    deleted: usize,
    read: usize,
    /// Where the next page starts.
    next: String,
    /// Nothing after `next` is to be deleted: the prefix ended, or a row said stop.
    done: bool,
}

/// Judges a page of rows, one verdict each, in order.
type Judge<'a> = dyn Fn(&[KeyValue]) -> Result<Vec<Verdict>, StoreError> + 'a;

impl EtcdStore {
    /// Deletes rows under `prefix` as `judge` says, oldest first, `per_commit` rows to a
    /// commit; at most `limit` rows, reading at most [`SCAN_FACTOR`] × `limit` keys.
    fn prune_prefix(
        &self,
        what: &str,
        prefix: &str,
        limit: usize,
        per_commit: usize,
        judge: &Judge<'_>,
    ) -> Result<usize, StoreError> {
        let budget = limit.saturating_mul(SCAN_FACTOR);
        let (mut deleted, mut read) = (0, 0);
        let mut from = prefix.to_string();
        while deleted < limit && read < budget {
            let want = per_commit.min(limit - deleted);
            let step = self
                .etcd
                .retrying(what, || self.prune_step(prefix, &from, want, judge))?;
            deleted += step.deleted;
            read += step.read;
            if step.done {
                break;
            }
            from = step.next;
        }
        Ok(deleted)
    }

    /// Reads one page from `from` and deletes up to `want` of its rows in one commit.
    fn prune_step(
        &self,
        prefix: &str,
        from: &str,
        want: usize,
        judge: &Judge<'_>,
    ) -> Result<Step, Attempt> {
        let page = self.etcd.range_from(prefix, from, Some(SCAN_PAGE))?;
        let verdicts = judge(&page)?;
        let mut batch = Batch::default();
        // One commit may not write a key twice (two ended records sharing an admission).
        let mut deleting = BTreeSet::new();
        let (mut deleted, mut read) = (0, 0);
        let mut stop = false;
        for verdict in verdicts {
            read += 1;
            match verdict {
                Verdict::Keep => {}
                Verdict::Stop => {
                    stop = true;
                    break;
                }
                Verdict::Delete { guards, deletes } => {
                    batch.guards.extend(guards);
                    for key in deletes {
                        if deleting.insert(key.clone()) {
                            batch.writes.push(delete(key));
                        }
                    }
                    deleted += 1;
                    if deleted == want {
                        break;
                    }
                }
            }
        }
        // The page was the prefix's last and every row of it was judged.
        let done = stop || (read == page.len() && page.len() < SCAN_PAGE);
        let next = match page.get(read.wrapping_sub(1)) {
            Some(last) => format!("{}\0", String::from_utf8_lossy(last.key())),
            None => from.to_string(),
        };
        self.etcd.commit(&batch.guards, &batch.writes)?;
        Ok(Step {
            deleted,
            read,
            next,
            done,
        })
    }

    pub(super) fn prune_journal_in(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        // A guard and a delete per entry.
        self.prune_prefix(
            "journal prune",
            &self.layout.closed_prefix(),
            limit,
            100,
            &|page| {
                page.iter()
                    .map(|kv| {
                        let entry: StoredAction = decode(kv)?;
                        Ok(match entry.ended_at {
                            Some(at) if at < before => Verdict::delete(kv, None),
                            _ => Verdict::Keep,
                        })
                    })
                    .collect()
            },
        )
    }

    pub(super) fn prune_events_in(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        // A guard and two deletes (the log's and the workload's copy) per event.
        self.prune_prefix(
            "event prune",
            &self.layout.events_prefix(),
            limit,
            60,
            &|page| {
                page.iter()
                    .map(|kv| {
                        let event: Event = decode(kv)?;
                        if event.at >= before {
                            return Ok(Verdict::Stop);
                        }
                        let copy = match (&event.tenant, &event.workload) {
                            (Some(tenant), Some(name)) => Some(
                                self.layout
                                    .workload_event(&WorkloadKey::new(tenant, name), event.id),
                            ),
                            _ => None,
                        };
                        Ok(Verdict::delete(kv, copy))
                    })
                    .collect()
            },
        )
    }

    pub(super) fn prune_workloads_in(
        &self,
        before: i64,
        limit: usize,
    ) -> Result<usize, StoreError> {
        // Two guards (the record, its key's current pointer) and up to four deletes (the
        // record, its history marker, the pointer, the admission split) per record.
        self.prune_prefix(
            "workload prune",
            &self.layout.ended_prefix(),
            limit,
            25,
            &|page| self.judge_ended(page, before),
        )
    }

    /// The verdicts on a page of ended records: each ended before `before` goes with its
    /// history marker, its key's current pointer when that still names it, and its admission
    /// split unless the key's live record was submitted at the same instant.
    fn judge_ended(&self, page: &[KeyValue], before: i64) -> Result<Vec<Verdict>, StoreError> {
        let mut old: Vec<(usize, i64, WorkloadRecord)> = Vec::new();
        for (i, kv) in page.iter().enumerate() {
            let record: WorkloadRecord = decode(kv)?;
            if record.ended_at.is_some_and(|at| at < before) {
                old.push((i, id_of(kv.key())?, record));
            }
        }
        let pointer_keys: Vec<String> = old
            .iter()
            .map(|(_, _, r)| self.layout.current(&r.key()))
            .collect();
        let pointers = self.etcd.get_many(&pointer_keys)?;
        let current: Vec<Option<i64>> = pointers
            .iter()
            .map(|kv| kv.as_ref().map(decode::<i64>).transpose())
            .collect::<Result<_, _>>()?;
        // The live records of the keys submitted again since.
        let newer: Vec<String> = old
            .iter()
            .zip(&current)
            .filter_map(|((_, id, _), cur)| cur.filter(|c| c != id))
            .map(|c| self.layout.live(c))
            .collect();
        let mut live = self.etcd.get_many(&newer)?.into_iter();
        let mut verdicts: Vec<Verdict> = page.iter().map(|_| Verdict::Keep).collect();
        for (((i, id, record), pointer), cur) in old.iter().zip(&pointers).zip(&current) {
            let key = record.key();
            let pointer_key = self.layout.current(&key);
            let kv = &page[*i];
            let mut guards = vec![
                unchanged(&String::from_utf8_lossy(kv.key()), Some(kv)),
                unchanged(&pointer_key, pointer.as_ref()),
            ];
            let mut deletes = vec![
                String::from_utf8_lossy(kv.key()).into_owned(),
                self.layout.history(&key, *id),
            ];
            let shares_admission = match cur {
                Some(c) if c == id => {
                    deletes.push(pointer_key);
                    false
                }
                Some(c) => {
                    let found = live.next().flatten();
                    guards.push(unchanged(&self.layout.live(*c), found.as_ref()));
                    match found {
                        Some(kv) => {
                            decode::<WorkloadRecord>(&kv)?.submitted_at == record.submitted_at
                        }
                        None => false,
                    }
                }
                None => false,
            };
            if !shares_admission {
                deletes.push(self.layout.admission(
                    &record.tenant,
                    &record.name,
                    record.submitted_at,
                ));
            }
            verdicts[*i] = Verdict::Delete { guards, deletes };
        }
        Ok(verdicts)
    }

    pub(super) fn prune_usage_in(&self, before: i64, limit: usize) -> Result<usize, StoreError> {
        // Runs still placed are being metered, whatever their row says.
        let placed: BTreeSet<String> = self
            .placed_runs()?
            .iter()
            .map(|k| self.layout.run(k))
            .collect();
        let mut pruned = self.prune_prefix(
            "usage prune (runs)",
            &self.layout.runs_prefix(),
            limit,
            100,
            &|page| {
                page.iter()
                    .map(|kv| {
                        let row: StoredRun = decode(kv)?;
                        let key = String::from_utf8_lossy(kv.key());
                        // An open row ends at the watermark: it is still being metered.
                        Ok(
                            if !row.open
                                && row.metered_until < before
                                && !placed.contains(key.as_ref())
                            {
                                Verdict::delete(kv, None)
                            } else {
                                Verdict::Keep
                            },
                        )
                    })
                    .collect()
            },
        )?;
        // Two guards (the spell, its tail) and two deletes per spell.
        pruned += self.prune_prefix(
            "usage prune (reserved idle)",
            &self.layout.reserved_prefix(),
            limit - pruned,
            50,
            &|page| self.judge_spells(page, before),
        )?;
        pruned += self.prune_prefix(
            "usage prune (preemptions)",
            &self.layout.preemptions_prefix(),
            limit - pruned,
            100,
            &|page| {
                page.iter()
                    .map(|kv| {
                        let p: StoredPreemption = decode(kv)?;
                        Ok(if p.at < before {
                            Verdict::delete(kv, None)
                        } else {
                            Verdict::Keep
                        })
                    })
                    .collect()
            },
        )?;
        Ok(pruned)
    }

    /// The verdicts on a page of reserved-idle spells: each that ended before `before` goes,
    /// with the tail that names it (a next metering then starts a spell of its own).
    fn judge_spells(&self, page: &[KeyValue], before: i64) -> Result<Vec<Verdict>, StoreError> {
        let mut old: Vec<(usize, i64, StoredSpell)> = Vec::new();
        for (i, kv) in page.iter().enumerate() {
            let spell: StoredSpell = decode(kv)?;
            if spell.until < before {
                old.push((i, id_of(kv.key())?, spell));
            }
        }
        let tail_keys: Vec<String> = old
            .iter()
            .map(|(_, _, s)| {
                self.layout
                    .reserved_tail(&s.tenant, &s.workload, &s.pool, s.gpus)
            })
            .collect();
        let tails = self.etcd.get_many(&tail_keys)?;
        let mut verdicts: Vec<Verdict> = page.iter().map(|_| Verdict::Keep).collect();
        for (((i, id, _), tail_key), tail) in old.iter().zip(tail_keys).zip(tails) {
            let kv = &page[*i];
            let names_it = tail
                .as_ref()
                .map(decode::<i64>)
                .transpose()?
                .is_some_and(|t| t == *id);
            let mut verdict = Verdict::delete(kv, names_it.then(|| tail_key.clone()));
            if let Verdict::Delete { guards, .. } = &mut verdict {
                guards.push(unchanged(&tail_key, tail.as_ref()));
            }
            verdicts[*i] = verdict;
        }
        Ok(verdicts)
    }
}
