//! Metering: what each workload held and for how long, for `tessera report usage`.
//!
//! A *run* is one placement of one workload record, identified by [`RunKey`]. Its row holds
//! what the run holds (GPUs in the compiler's exact units, CPU, memory) and the interval from
//! its start to `metered_until`. Metering a run again only moves `metered_until` forward
//! (`MAX`), in one transaction: usage is the length of an interval, never a sum of increments,
//! so a service killed at any point, or a cycle repeated after a restart, cannot count a second
//! twice. Reserved-idle spells move a fleet-wide watermark in the same transaction as the
//! spells themselves, which gives them the same property.
//!
//! Every quantity is an integer: GPU amounts are [`Gpus`] units (7000 per GPU), so sums over a
//! month of a whole fleet are exact and the parts add up to the total.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use tessera_compiler::units::Gpus;

use super::{Store, StoreError};

/// One placement of one workload record.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RunKey {
    pub tenant: String,
    pub workload: String,
    pub submitted_at: i64,
    pub started_at: i64,
}

/// What a run holds, for its first metering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRun {
    pub key: RunKey,
    pub pool: String,
    pub model: String,
    pub profile: Option<String>,
    pub gpus: Gpus,
    pub cpu_millicores: u64,
    pub memory_mib: u64,
}

/// GPUs held idle in `pool` for a waiting gang of `tenant`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedSpell {
    pub tenant: String,
    pub workload: String,
    pub pool: String,
    pub gpus: u32,
}

/// Usage in a window, for one tenant, pool, GPU model and MIG profile. GPU quantities are
/// unit-seconds (7000 per GPU-second); reserved-idle and preemption rows have no model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageRow {
    pub tenant: String,
    pub pool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Every GPU-second held: `guaranteed + borrowed + unclassified`.
    pub gpu_unit_seconds: i64,
    pub guaranteed_unit_seconds: i64,
    pub borrowed_unit_seconds: i64,
    /// Held by runs whose admission split is not known.
    pub unclassified_unit_seconds: i64,
    /// Free GPUs held idle for the tenant's waiting gangs.
    pub reserved_idle_unit_seconds: i64,
    /// Work lost to preemptions (GPU-seconds since the last checkpoint), at the preemption.
    pub preemption_lost_unit_seconds: i64,
    pub cpu_millicore_seconds: i64,
    pub memory_mib_seconds: i64,
}

type RowKey = (String, String, Option<String>, Option<String>);

impl Store {
    /// The run of every live workload that holds a placement (starting, running,
    /// checkpointing: `Phase::holds_placement`), by workload id. Read from four columns, not
    /// from the workloads' full records: a steady cycle's metering needs no more, and parsing
    /// every live workload's spec and bindings was most of its time.
    pub fn placed_runs(&self) -> Result<Vec<RunKey>, StoreError> {
        let tx = self.read()?;
        let keys = {
            let mut stmt = tx.prepare_cached(
                "SELECT tenant, name, submitted_at, started_at FROM workloads
                 WHERE ended_at IS NULL AND started_at IS NOT NULL
                   AND phase IN ('starting', 'running', 'checkpointing')
                 ORDER BY id",
            )?;
            stmt.query_map([], |r| {
                Ok(RunKey {
                    tenant: r.get(0)?,
                    workload: r.get(1)?,
                    submitted_at: r.get(2)?,
                    started_at: r.get(3)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?
        };
        tx.finish()?;
        Ok(keys)
    }

    /// The runs among `keys` that have no row yet (they need [`NewRun`]s).
    pub fn unmetered_runs(&self, keys: &[RunKey]) -> Result<Vec<RunKey>, StoreError> {
        let tx = self.read()?;
        let mut missing = Vec::new();
        {
            let mut stmt = tx.prepare_cached(
                "SELECT 1 FROM usage_runs
                 WHERE tenant = ?1 AND workload = ?2 AND submitted_at = ?3 AND started_at = ?4",
            )?;
            for key in keys {
                let found: Option<i64> = stmt
                    .query_row(
                        params![key.tenant, key.workload, key.submitted_at, key.started_at],
                        |r| r.get(0),
                    )
                    .optional()?;
                if found.is_none() {
                    missing.push(key.clone());
                }
            }
        }
        tx.finish()?;
        Ok(missing)
    }

    /// Meters the placed runs up to `now` in one transaction: `extend` moves existing rows'
    /// `metered_until` forward, `create` adds rows (with the admission split recorded for the
    /// workload, when there is one).
    pub fn meter_runs(
        &self,
        extend: &[RunKey],
        create: &[NewRun],
        now: i64,
    ) -> Result<(), StoreError> {
        let tx = self.write()?;
        {
            let mut update = tx.prepare_cached(
                "UPDATE usage_runs SET metered_until = MAX(metered_until, ?5)
                 WHERE tenant = ?1 AND workload = ?2 AND submitted_at = ?3 AND started_at = ?4",
            )?;
            for key in extend {
                update.execute(params![
                    key.tenant,
                    key.workload,
                    key.submitted_at,
                    key.started_at,
                    now.max(key.started_at)
                ])?;
            }
            let mut split = tx.prepare_cached(
                "SELECT guaranteed_units FROM usage_admissions
                 WHERE tenant = ?1 AND workload = ?2 AND submitted_at = ?3",
            )?;
            let mut insert = tx.prepare_cached(
                "INSERT INTO usage_runs (tenant, workload, submitted_at, started_at, pool, model,
                     profile, gpu_units, guaranteed_units, cpu_millicores, memory_mib,
                     metered_until)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT (tenant, workload, submitted_at, started_at)
                 DO UPDATE SET metered_until = MAX(metered_until, excluded.metered_until)",
            )?;
            for run in create {
                let k = &run.key;
                let guaranteed: Option<i64> = split
                    .query_row(params![k.tenant, k.workload, k.submitted_at], |r| r.get(0))
                    .optional()?;
                let units = run.gpus.units().max(0);
                insert.execute(params![
                    k.tenant,
                    k.workload,
                    k.submitted_at,
                    k.started_at,
                    run.pool,
                    run.model,
                    run.profile,
                    units,
                    guaranteed.map(|g| g.clamp(0, units)),
                    super::to_sql_int("cpu millicores", run.cpu_millicores)?,
                    super::to_sql_int("memory MiB", run.memory_mib)?,
                    now.max(k.started_at),
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Keeps the solver's split of an admission for the run it starts.
    pub fn record_admission(
        &self,
        tenant: &str,
        workload: &str,
        submitted_at: i64,
        guaranteed: Gpus,
        borrowed: Gpus,
    ) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO usage_admissions
                     (tenant, workload, submitted_at, guaranteed_units, borrowed_units)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (tenant, workload, submitted_at) DO UPDATE SET
                     guaranteed_units = excluded.guaranteed_units,
                     borrowed_units = excluded.borrowed_units",
            )?
            .execute(params![
                tenant,
                workload,
                submitted_at,
                guaranteed.units().max(0),
                borrowed.units().max(0)
            ])?;
        Ok(())
    }

    /// Records the work a preemption of `run` loses; a run is preempted at most once, so a
    /// second record of the same run (a decision repeated after a failed action) is ignored.
    pub fn record_preemption(
        &self,
        run: &RunKey,
        pool: &str,
        lost_unit_seconds: i64,
        at: i64,
    ) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT OR IGNORE INTO usage_preemptions
                     (tenant, workload, submitted_at, started_at, pool, at, lost_unit_seconds)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                run.tenant,
                run.workload,
                run.submitted_at,
                run.started_at,
                pool,
                at,
                lost_unit_seconds.max(0)
            ])?;
        Ok(())
    }

    /// Charges `spells` (what the decision made at `decided_at` holds idle) from the later of
    /// the fleet watermark and `decided_at` up to `now`, and moves the watermark to `now`, in
    /// one transaction.
    pub fn meter_reserved(
        &self,
        spells: &[ReservedSpell],
        decided_at: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        let tx = self.write()?;
        let watermark: Option<i64> = tx
            .prepare_cached("SELECT reserved_until FROM usage_clock WHERE id = 1")?
            .query_row([], |r| r.get(0))
            .optional()?;
        let start = watermark.map_or(decided_at, |w| w.max(decided_at));
        if now > start {
            let mut extend = tx.prepare_cached(
                "UPDATE usage_reserved SET until = ?6
                 WHERE tenant = ?1 AND workload = ?2 AND pool = ?3 AND gpus = ?4 AND until = ?5",
            )?;
            let mut insert = tx.prepare_cached(
                "INSERT INTO usage_reserved (tenant, workload, pool, gpus, start, until)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for s in spells.iter().filter(|s| s.gpus > 0) {
                let p = params![s.tenant, s.workload, s.pool, s.gpus, start, now];
                if extend.execute(p)? == 0 {
                    insert.execute(p)?;
                }
            }
        }
        tx.prepare_cached(
            "INSERT INTO usage_clock (id, reserved_until) VALUES (1, ?1)
             ON CONFLICT (id) DO UPDATE SET reserved_until = MAX(reserved_until, ?1)",
        )?
        .execute(params![now])?;
        tx.commit()?;
        Ok(())
    }

    /// Usage within `[since, until)`, per tenant, pool, model and profile, in that order. A run
    /// or spell that crosses a bound counts only its part inside.
    pub fn usage(&self, since: i64, until: i64) -> Result<Vec<UsageRow>, StoreError> {
        let tx = self.read()?;
        let mut rows: BTreeMap<RowKey, UsageRow> = BTreeMap::new();
        // `o`: the seconds of a run or spell inside [since, until).
        let runs = "SELECT tenant, pool, model, profile,
                SUM(gpu_units * o), SUM(COALESCE(guaranteed_units, 0) * o),
                SUM(CASE WHEN guaranteed_units IS NULL THEN 0
                         ELSE gpu_units - guaranteed_units END * o),
                SUM(CASE WHEN guaranteed_units IS NULL THEN gpu_units ELSE 0 END * o),
                SUM(cpu_millicores * o), SUM(memory_mib * o)
            FROM (SELECT *, MAX(0, MIN(metered_until, ?2) - MAX(started_at, ?1)) AS o
                  FROM usage_runs WHERE metered_until > ?1 AND started_at < ?2)
            GROUP BY tenant, pool, model, profile";
        {
            let mut stmt = tx.prepare_cached(runs)?;
            let mut q = stmt.query(params![since, until])?;
            while let Some(r) = q.next()? {
                let u = row(&mut rows, r.get(0)?, r.get(1)?, Some(r.get(2)?), r.get(3)?);
                u.gpu_unit_seconds += r.get::<_, i64>(4)?;
                u.guaranteed_unit_seconds += r.get::<_, i64>(5)?;
                u.borrowed_unit_seconds += r.get::<_, i64>(6)?;
                u.unclassified_unit_seconds += r.get::<_, i64>(7)?;
                u.cpu_millicore_seconds += r.get::<_, i64>(8)?;
                u.memory_mib_seconds += r.get::<_, i64>(9)?;
            }
        }
        let reserved = "SELECT tenant, pool, SUM(gpus * o)
            FROM (SELECT *, MAX(0, MIN(until, ?2) - MAX(start, ?1)) AS o
                  FROM usage_reserved WHERE until > ?1 AND start < ?2)
            GROUP BY tenant, pool";
        {
            let mut stmt = tx.prepare_cached(reserved)?;
            let mut q = stmt.query(params![since, until])?;
            while let Some(r) = q.next()? {
                let u = row(&mut rows, r.get(0)?, r.get(1)?, None, None);
                u.reserved_idle_unit_seconds += r.get::<_, i64>(2)? * Gpus::UNITS_PER_GPU;
            }
        }
        let preempted = "SELECT tenant, pool, SUM(lost_unit_seconds) FROM usage_preemptions
            WHERE at >= ?1 AND at < ?2 GROUP BY tenant, pool";
        {
            let mut stmt = tx.prepare_cached(preempted)?;
            let mut q = stmt.query(params![since, until])?;
            while let Some(r) = q.next()? {
                let u = row(&mut rows, r.get(0)?, r.get(1)?, None, None);
                u.preemption_lost_unit_seconds += r.get::<_, i64>(2)?;
            }
        }
        tx.finish()?;
        Ok(rows.into_values().collect())
    }
}

fn row(
    rows: &mut BTreeMap<RowKey, UsageRow>,
    tenant: String,
    pool: String,
    model: Option<String>,
    profile: Option<String>,
) -> &mut UsageRow {
    let key = (tenant.clone(), pool.clone(), model.clone(), profile.clone());
    rows.entry(key).or_insert_with(|| UsageRow {
        tenant,
        pool,
        model,
        profile,
        ..UsageRow::default()
    })
}
