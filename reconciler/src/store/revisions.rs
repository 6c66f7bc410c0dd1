//! The policy revisions the service has seen, applied or rejected, with their diagnostics.

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::{Store, StoreError, events, from_json, to_json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RevisionStatus {
    /// Valid, and in force from then on.
    Applied,
    /// Failed validation; the previous applied revision stays in force.
    Rejected,
}

impl RevisionStatus {
    fn as_str(self) -> &'static str {
        match self {
            RevisionStatus::Applied => "applied",
            RevisionStatus::Rejected => "rejected",
        }
    }

    fn parse(s: &str) -> Option<RevisionStatus> {
        match s {
            "applied" => Some(RevisionStatus::Applied),
            "rejected" => Some(RevisionStatus::Rejected),
            _ => None,
        }
    }
}

/// One evaluation of a commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionRecord {
    pub commit: String,
    pub seen_at: i64,
    pub status: RevisionStatus,
    /// The compiler's diagnostics as JSON (an array, empty when there were none).
    pub diagnostics: serde_json::Value,
}

const COLUMNS: &str = "id, commit_id, seen_at, status, diagnostics";

impl Store {
    /// Records that `commit` was evaluated, with an event. Every evaluation is a row, so the
    /// history shows a commit rejected, then applied again after a rollback.
    pub fn record_revision<D: Serialize + ?Sized>(
        &self,
        commit: &str,
        status: RevisionStatus,
        diagnostics: &D,
        now: i64,
    ) -> Result<RevisionRecord, StoreError> {
        let diagnostics =
            serde_json::to_value(diagnostics).map_err(|source| StoreError::Encode {
                what: "diagnostics",
                source,
            })?;
        let tx = self.write()?;
        tx.prepare_cached("INSERT INTO revisions (commit_id, seen_at, status, diagnostics) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![
                commit,
                now,
                status.as_str(),
                to_json("diagnostics", &diagnostics)?
            ],
        )?;
        let count = diagnostics.as_array().map_or(0, Vec::len);
        events::append(
            &tx,
            now,
            &format!("revision-{}", status.as_str()),
            None,
            &format!("{commit} ({count} diagnostics)"),
        )?;
        tx.commit()?;
        Ok(RevisionRecord {
            commit: commit.to_string(),
            seen_at: now,
            status,
            diagnostics,
        })
    }

    /// The revision in force: the last one applied.
    pub fn last_applied(&self) -> Result<Option<RevisionRecord>, StoreError> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM revisions WHERE status = 'applied' \
                     ORDER BY id DESC LIMIT 1"
                ),
                [],
                raw,
            )
            .optional()?
            .map(decode)
            .transpose()
    }

    /// The `limit` latest evaluations, newest first.
    pub fn revisions(&self, limit: u32) -> Result<Vec<RevisionRecord>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM revisions ORDER BY id DESC LIMIT ?1"
        ))?;
        let raws = stmt
            .query_map([limit], raw)?
            .collect::<Result<Vec<_>, _>>()?;
        raws.into_iter().map(decode).collect()
    }
}

type Raw = (i64, String, i64, String, String);

fn raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn decode((id, commit, seen_at, status, diagnostics): Raw) -> Result<RevisionRecord, StoreError> {
    let status = RevisionStatus::parse(&status).ok_or(StoreError::CorruptValue {
        table: "revisions",
        column: "status",
        row: id,
        value: status,
    })?;
    Ok(RevisionRecord {
        commit,
        seen_at,
        status,
        diagnostics: from_json("revisions", "diagnostics", id, &diagnostics)?,
    })
}
