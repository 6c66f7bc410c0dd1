//! What one decision hands to the next: each tenant's decayed usage (fair share over time), the
//! capacity held for waiting gangs, and the geometry changes made in the last hour (each pool's
//! `maxPerGpuPerHour`). All enter the next cycle's `ClusterState`, so a restart neither forgets
//! who borrowed yesterday, nor drops a gang's place, nor resets a GPU's change budget.

use rusqlite::{OptionalExtension, params};
use tessera_compiler::model::{ReconfigurationRecord, ReservationRecord, UsageRecord};
// How long a change counts against its GPU's budget: the solver's rule, kept in one place.
use tessera_solver::problem::BUDGET_WINDOW_SECONDS;

use super::{Store, StoreError, from_json, to_json};

/// The solver's state between cycles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Carried {
    pub usage: Option<UsageRecord>,
    pub reservations: Vec<ReservationRecord>,
    /// Geometry changes that took something away, made in the hour before the last cycle.
    pub reconfigurations: Vec<ReconfigurationRecord>,
}

impl Carried {
    /// Records that `gpus` (node, index) were changed at `now`, and forgets changes that no
    /// longer count (an hour old or older, or with an instant that does not parse).
    pub fn spend<'a>(&mut self, gpus: impl IntoIterator<Item = (&'a str, u32)>, now: i64) {
        self.reconfigurations
            .retain(|r| r.at.as_second() > now - BUDGET_WINDOW_SECONDS);
        let at = crate::snapshot::unix(now);
        self.reconfigurations
            .extend(gpus.into_iter().map(|(node, gpu)| ReconfigurationRecord {
                node: node.to_owned(),
                gpu,
                at,
            }));
        self.reconfigurations.sort();
    }
}

impl Store {
    /// What the last decision left; empty before the first.
    pub fn carried(&self) -> Result<Carried, StoreError> {
        let row: Option<(Option<String>, String, String)> = self
            .conn
            .prepare_cached(
                "SELECT usage, reservations, reconfigurations FROM carried WHERE id = 1",
            )?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        let Some((usage, reservations, reconfigurations)) = row else {
            return Ok(Carried::default());
        };
        Ok(Carried {
            usage: usage
                .map(|u| from_json("carried", "usage", 1, &u))
                .transpose()?,
            reservations: from_json("carried", "reservations", 1, &reservations)?,
            reconfigurations: from_json("carried", "reconfigurations", 1, &reconfigurations)?,
        })
    }

    /// Replaces what the next cycle starts from, in one transaction.
    pub fn set_carried(&self, carried: &Carried, now: i64) -> Result<(), StoreError> {
        let usage = carried
            .usage
            .as_ref()
            .map(|u| to_json("usage", u))
            .transpose()?;
        let reservations = to_json("reservations", &carried.reservations)?;
        let reconfigurations = to_json("reconfigurations", &carried.reconfigurations)?;
        let tx = self.write()?;
        tx.prepare_cached(
            "INSERT INTO carried (id, usage, reservations, reconfigurations, updated_at)
             VALUES (1, ?1, ?2, ?3, ?4)
             ON CONFLICT (id) DO UPDATE
             SET usage = ?1, reservations = ?2, reconfigurations = ?3, updated_at = ?4",
        )?
        .execute(params![usage, reservations, reconfigurations, now])?;
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tessera_compiler::model::{TenantUsageRecord, UsageHours};

    use super::*;

    #[test]
    fn empty_before_the_first_decision_then_what_was_set() {
        let store = Store::open_in_memory().unwrap();
        assert_eq!(store.carried().unwrap(), Carried::default());
        let carried = Carried {
            usage: Some(UsageRecord {
                as_of: "2026-11-23T10:00:00Z".parse().unwrap(),
                tenants: BTreeMap::from([(
                    "a".to_string(),
                    TenantUsageRecord {
                        used: UsageHours {
                            gpu_hours: 12.5,
                            cpu_hours: 3.0,
                            memory_gib_hours: 40.0,
                        },
                        borrowed: UsageHours::default(),
                    },
                )]),
            }),
            reservations: vec![ReservationRecord {
                workload: "big".into(),
                pool: "train".into(),
                nodes: vec!["n1".into(), "n2".into()],
                since: "2026-11-23T09:00:00Z".parse().unwrap(),
            }],
            reconfigurations: vec![ReconfigurationRecord {
                node: "n1".into(),
                gpu: 3,
                at: "2026-11-23T09:30:00Z".parse().unwrap(),
            }],
        };
        store.set_carried(&carried, 100).unwrap();
        assert_eq!(store.carried().unwrap(), carried);
        let later = Carried::default();
        store.set_carried(&later, 200).unwrap();
        assert_eq!(store.carried().unwrap(), later);
    }

    #[test]
    fn spending_records_the_change_and_forgets_what_no_longer_counts() {
        let hour = BUDGET_WINDOW_SECONDS;
        let t0 = 1_795_000_000;
        let mut carried = Carried::default();
        carried.spend([("n1", 0)], t0);
        carried.spend([("n1", 1), ("n0", 2)], t0 + hour - 1);
        let gpus = |c: &Carried| -> Vec<(String, u32)> {
            c.reconfigurations
                .iter()
                .map(|r| (r.node.clone(), r.gpu))
                .collect()
        };
        assert_eq!(
            gpus(&carried),
            [("n0".into(), 2), ("n1".into(), 0), ("n1".into(), 1)]
        );
        // An hour after it was made, a change no longer counts.
        carried.spend([], t0 + hour);
        assert_eq!(gpus(&carried), [("n0".into(), 2), ("n1".into(), 1)]);
        assert_eq!(
            carried.reconfigurations[0].at,
            crate::snapshot::unix(t0 + hour - 1)
        );
    }
}
