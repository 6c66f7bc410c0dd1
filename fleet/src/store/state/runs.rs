//! Metering runs on etcd with a watermark, so that a steady cycle writes one key and not one
//! per placed run.
//!
//! A run's row is *open* while the runs' watermark (`usage/runs-metered-until`, one key)
//! extends it: its usage ends at the later of its own `meteredUntil` and the watermark. Each
//! open row is listed under `usage/open/` (an empty key), so that a metering finds the open
//! runs without reading the rows. [`StateStore::meter_runs`] keeps the meaning it has on
//! SQLite, where every named run's `metered_until` moves to `now` and every other run keeps
//! its own:
//!
//! - an open run it names: nothing to write; the watermark moving to `now` extends it;
//! - an open run it does not name (the run ended): closed at what it was metered to, the later
//!   of its row and the watermark, before the watermark moves;
//! - a closed or new run it names: its row written with `now` and opened;
//! - then the watermark moves to `now`.
//!
//! So a steady cycle, which names every open run and no other, writes the watermark alone, and
//! a cycle in which runs start or end writes those runs' rows besides. Each step is safe on its
//! own (a closing keeps a run's figure, an opening sets it to `now`, the watermark only grows),
//! so a leader that dies between the commits leaves some runs metered to the earlier instant,
//! never a second counted twice. A metering to an instant before the watermark (a leader whose
//! clock is behind its predecessor's) opens and closes nothing: it writes the rows it names
//! that are closed and behind `now`, as SQLite's `MAX` would.

use super::*;

/// Runs one commit closes or opens: each is two writes and two guards, within
/// [`MAX_TXN_OPS`](crate::store::MAX_TXN_OPS) with the fence.
const ROWS_PER_COMMIT: usize = 60;

/// A run a metering names, with its description where it may be new.
type Named<'a> = (&'a RunKey, Option<&'a NewRun>);

impl EtcdStore {
    pub(super) fn meter_with_watermark(
        &self,
        extend: &[RunKey],
        create: &[NewRun],
        now: i64,
    ) -> Result<(), StoreError> {
        // One entry per row; a description wins over a bare extension of the same run.
        let mut named: BTreeMap<String, Named<'_>> = BTreeMap::new();
        for key in extend {
            named.entry(self.layout.run(key)).or_insert((key, None));
        }
        for run in create {
            named.insert(self.layout.run(&run.key), (&run.key, Some(run)));
        }
        let watermark_key = self.layout.runs_watermark();
        let (watermark_found, _) = self.etcd.get_with_revision(&watermark_key)?;
        let watermark = watermark_found.as_ref().map(decode::<i64>).transpose()?;
        let open: BTreeSet<String> = self
            .etcd
            .range(&self.layout.open_runs_prefix(), None, false)?
            .iter()
            .filter_map(|kv| self.layout.run_of_open(kv.key()))
            .collect();
        let moves = watermark.is_none_or(|w| now >= w);
        if moves {
            let ended: Vec<&String> = open.iter().filter(|k| !named.contains_key(*k)).collect();
            for chunk in ended.chunks(ROWS_PER_COMMIT) {
                self.close_runs(chunk, watermark)?;
            }
        }
        let touched: Vec<Named<'_>> = named
            .iter()
            .filter(|(row, _)| !open.contains(*row))
            .map(|(_, named)| *named)
            .collect();
        for chunk in touched.chunks(ROWS_PER_COMMIT) {
            self.meter_named(chunk, now, moves)?;
        }
        if moves && watermark != Some(now) {
            let mut batch = Batch::default();
            batch.guard(&watermark_key, watermark_found.as_ref());
            batch.put(watermark_key, &now)?;
            // Only metering writes the watermark, and one cycle meters at a time: a conflict
            // means another leader's metering, which the fence refuses in any case.
            self.etcd.retrying("runs' watermark", || {
                self.etcd.commit(&batch.guards, &batch.writes)
            })?;
        }
        Ok(())
    }

    /// Closes the open runs of `rows` at what they were metered to.
    fn close_runs(&self, rows: &[&String], watermark: Option<i64>) -> Result<(), StoreError> {
        self.etcd.retrying("metering (ended runs)", || {
            let mut keys: Vec<String> = rows.iter().map(|r| (*r).clone()).collect();
            let listed: Vec<String> = rows.iter().map(|r| self.open_of_row(r)).collect();
            keys.extend(listed.iter().cloned());
            let found = self.etcd.get_many(&keys)?;
            let (found_rows, found_listed) = found.split_at(rows.len());
            let mut batch = Batch::default();
            for (i, row_key) in rows.iter().enumerate() {
                let Some(listing) = &found_listed[i] else {
                    continue;
                };
                batch.guard(&listed[i], Some(listing));
                batch.writes.push(delete(listed[i].clone()));
                let Some(kv) = &found_rows[i] else {
                    continue;
                };
                let mut row: StoredRun = decode(kv)?;
                row.metered_until = row.metered_until.max(watermark.unwrap_or(i64::MIN));
                row.open = false;
                batch.guard(row_key, Some(kv));
                batch.put((*row_key).clone(), &row)?;
            }
            self.etcd.commit(&batch.guards, &batch.writes)?;
            Ok(())
        })
    }

    /// Meters runs that are not open to `now`: creates those described and absent, and opens
    /// each where the watermark `moves` (else writes `now` into the closed row, if later).
    fn meter_named(&self, runs: &[Named<'_>], now: i64, moves: bool) -> Result<(), StoreError> {
        self.etcd.retrying("metering", || {
            let mut keys: Vec<String> = runs.iter().map(|(k, _)| self.layout.run(k)).collect();
            keys.extend(runs.iter().map(|(k, _)| {
                self.layout
                    .admission(&k.tenant, &k.workload, k.submitted_at)
            }));
            let found = self.etcd.get_many(&keys)?;
            let (rows, admissions) = found.split_at(runs.len());
            let mut batch = Batch::default();
            for (i, (run, new)) in runs.iter().enumerate() {
                let key = self.layout.run(run);
                let until = now.max(run.started_at);
                let existing = rows[i].as_ref().map(decode::<StoredRun>).transpose()?;
                let mut row = match (existing, new) {
                    (Some(mut row), _) => {
                        if !moves && row.metered_until >= until {
                            continue;
                        }
                        row.metered_until = row.metered_until.max(until);
                        row
                    }
                    (None, None) => continue,
                    (None, Some(new)) => {
                        let units = new.gpus.units().max(0);
                        let admission = admissions[i]
                            .as_ref()
                            .map(decode::<StoredAdmission>)
                            .transpose()?;
                        StoredRun {
                            tenant: run.tenant.clone(),
                            workload: run.workload.clone(),
                            started_at: run.started_at,
                            pool: new.pool.clone(),
                            model: new.model.clone(),
                            profile: new.profile.clone(),
                            gpu_units: units,
                            guaranteed_units: admission.map(|a| a.guaranteed_units.clamp(0, units)),
                            cpu_millicores: to_i64("cpu millicores", new.cpu_millicores)?,
                            memory_mib: to_i64("memory MiB", new.memory_mib)?,
                            metered_until: until,
                            open: false,
                        }
                    }
                };
                batch.guard(&key, rows[i].as_ref());
                if moves {
                    row.open = true;
                    let listing = self.layout.open_run(run);
                    batch.guards.push(Guard::Absent {
                        key: listing.clone(),
                    });
                    batch.writes.push(put(listing, Vec::new()));
                }
                batch.put(key, &row)?;
            }
            self.etcd.commit(&batch.guards, &batch.writes)?;
            Ok(())
        })
    }

    fn open_of_row(&self, row: &str) -> String {
        let suffix = &row[self.layout.runs_prefix().len()..];
        format!("{}{suffix}", self.layout.open_runs_prefix())
    }

    /// Every run's row with the instant its usage ends, read at one revision with the
    /// watermark that extends the open ones.
    pub(super) fn metered_rows(&self) -> Result<Vec<(StoredRun, i64)>, StoreError> {
        let (watermark, revision) = self.etcd.get_with_revision(&self.layout.runs_watermark())?;
        let watermark = watermark.as_ref().map(decode::<i64>).transpose()?;
        self.etcd
            .range_at(&self.layout.runs_prefix(), revision)?
            .iter()
            .map(|kv| {
                let row: StoredRun = decode(kv)?;
                let end = match (row.open, watermark) {
                    (true, Some(w)) => row.metered_until.max(w),
                    _ => row.metered_until,
                };
                Ok((row, end))
            })
            .collect()
    }
}
