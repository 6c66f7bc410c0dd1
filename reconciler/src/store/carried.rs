//! What one decision hands to the next: each tenant's decayed usage (fair share over time) and
//! the capacity held for waiting gangs. Both enter the next cycle's `ClusterState`, so a
//! restart neither forgets who borrowed yesterday nor drops a gang's place.

use rusqlite::{OptionalExtension, params};
use tessera_compiler::model::{ReservationRecord, UsageRecord};

use super::{Store, StoreError, from_json, to_json};

/// The solver's state between cycles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Carried {
    pub usage: Option<UsageRecord>,
    pub reservations: Vec<ReservationRecord>,
}

impl Store {
    /// What the last decision left; empty before the first.
    pub fn carried(&self) -> Result<Carried, StoreError> {
        let row: Option<(Option<String>, String)> = self
            .conn
            .query_row(
                "SELECT usage, reservations FROM carried WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((usage, reservations)) = row else {
            return Ok(Carried::default());
        };
        Ok(Carried {
            usage: usage
                .map(|u| from_json("carried", "usage", 1, &u))
                .transpose()?,
            reservations: from_json("carried", "reservations", 1, &reservations)?,
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
        let tx = self.write()?;
        tx.execute(
            "INSERT INTO carried (id, usage, reservations, updated_at) VALUES (1, ?1, ?2, ?3)
             ON CONFLICT (id) DO UPDATE SET usage = ?1, reservations = ?2, updated_at = ?3",
            params![usage, reservations, now],
        )?;
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
                as_of: "2026-11-23T10:00:00Z".into(),
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
                since: "2026-11-23T09:00:00Z".into(),
            }],
        };
        store.set_carried(&carried, 100).unwrap();
        assert_eq!(store.carried().unwrap(), carried);
        let later = Carried {
            usage: None,
            reservations: Vec::new(),
        };
        store.set_carried(&later, 200).unwrap();
        assert_eq!(store.carried().unwrap(), later);
    }
}
