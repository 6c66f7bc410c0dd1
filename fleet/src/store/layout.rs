//! Where each part of the service's state lives under the cluster's `state/` prefix, and the
//! values' encodings. See [`super`] for the layout as a table.

use tessera_compiler::WorkloadKey;
use tessera_reconciler::store::StoreError;
use tessera_reconciler::store::usage::RunKey;

use crate::keys::Keys;

/// Sequences whose next value a write takes from a counter key.
#[derive(Debug, Clone, Copy)]
pub(super) enum Sequence {
    Workload,
    Event,
    Journal,
    Revision,
    Reserved,
}

impl Sequence {
    fn name(self) -> &'static str {
        match self {
            Sequence::Workload => "workload",
            Sequence::Event => "event",
            Sequence::Journal => "journal",
            Sequence::Revision => "revision",
            Sequence::Reserved => "reserved",
        }
    }
}

/// The keys of one cluster's service state.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    /// `/tessera/<cluster>/state/`
    base: String,
}

impl Layout {
    pub fn new(keys: &Keys) -> Layout {
        Layout {
            base: keys.state_prefix(),
        }
    }

    fn key(&self, path: std::fmt::Arguments<'_>) -> String {
        format!("{}{path}", self.base)
    }

    pub fn counter(&self, sequence: Sequence) -> String {
        self.key(format_args!("counters/{}", sequence.name()))
    }

    pub fn live_prefix(&self) -> String {
        self.key(format_args!("workloads/live/"))
    }

    pub fn live(&self, id: i64) -> String {
        format!("{}{}", self.live_prefix(), id_segment(id))
    }

    pub fn ended_prefix(&self) -> String {
        self.key(format_args!("workloads/ended/"))
    }

    pub fn ended(&self, id: i64) -> String {
        format!("{}{}", self.ended_prefix(), id_segment(id))
    }

    pub fn current_prefix(&self) -> String {
        self.key(format_args!("workloads/current/"))
    }

    /// The id of `key`'s current record (its newest: a key is submitted again only once its
    /// last record has ended).
    pub fn current(&self, key: &WorkloadKey) -> String {
        format!(
            "{}{}/{}",
            self.current_prefix(),
            segment(&key.tenant),
            segment(&key.name)
        )
    }

    /// Reads a key under [`Layout::current_prefix`] back as `(tenant, name)`.
    pub fn parse_current(&self, key: &[u8]) -> Option<(String, String)> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.current_prefix())?;
        let (tenant, name) = rest.split_once('/')?;
        Some((unsegment(tenant)?, unsegment(name)?))
    }

    pub fn history_prefix(&self, key: &WorkloadKey) -> String {
        self.key(format_args!(
            "workloads/history/{}/{}/",
            segment(&key.tenant),
            segment(&key.name)
        ))
    }

    pub fn history(&self, key: &WorkloadKey, id: i64) -> String {
        format!("{}{}", self.history_prefix(key), id_segment(id))
    }

    pub fn events_prefix(&self) -> String {
        self.key(format_args!("events/all/"))
    }

    pub fn event(&self, id: i64) -> String {
        format!("{}{}", self.events_prefix(), id_segment(id))
    }

    pub fn workload_events_prefix(&self, key: &WorkloadKey) -> String {
        self.key(format_args!(
            "events/by-workload/{}/{}/",
            segment(&key.tenant),
            segment(&key.name)
        ))
    }

    pub fn workload_event(&self, key: &WorkloadKey, id: i64) -> String {
        format!("{}{}", self.workload_events_prefix(key), id_segment(id))
    }

    pub fn open_prefix(&self) -> String {
        self.key(format_args!("journal/open/"))
    }

    pub fn open(&self, id: i64) -> String {
        format!("{}{}", self.open_prefix(), id_segment(id))
    }

    pub fn closed_prefix(&self) -> String {
        self.key(format_args!("journal/closed/"))
    }

    pub fn closed(&self, id: i64) -> String {
        format!("{}{}", self.closed_prefix(), id_segment(id))
    }

    pub fn revisions_prefix(&self) -> String {
        self.key(format_args!("revisions/all/"))
    }

    pub fn revision(&self, id: i64) -> String {
        format!("{}{}", self.revisions_prefix(), id_segment(id))
    }

    pub fn last_applied(&self) -> String {
        self.key(format_args!("revisions/last-applied"))
    }

    pub fn carried(&self) -> String {
        self.key(format_args!("carried"))
    }

    pub fn runs_prefix(&self) -> String {
        self.key(format_args!("usage/runs/"))
    }

    pub fn run(&self, run: &RunKey) -> String {
        format!(
            "{}{}/{}/{}/{}",
            self.runs_prefix(),
            segment(&run.tenant),
            segment(&run.workload),
            run.submitted_at,
            run.started_at
        )
    }

    /// Where the open runs are listed: one empty key per run whose row the watermark
    /// ([`Layout::runs_watermark`]) extends, named as its row is under [`Layout::runs_prefix`].
    pub fn open_runs_prefix(&self) -> String {
        self.key(format_args!("usage/open/"))
    }

    pub fn open_run(&self, run: &RunKey) -> String {
        let row = self.run(run);
        let suffix = &row[self.runs_prefix().len()..];
        format!("{}{suffix}", self.open_runs_prefix())
    }

    /// The row of the run an open-run key lists.
    pub fn run_of_open(&self, open: &[u8]) -> Option<String> {
        let open = std::str::from_utf8(open).ok()?;
        let suffix = open.strip_prefix(&self.open_runs_prefix())?;
        Some(format!("{}{suffix}", self.runs_prefix()))
    }

    /// The instant every open run is metered up to (the runs' watermark).
    pub fn runs_watermark(&self) -> String {
        self.key(format_args!("usage/runs-metered-until"))
    }

    pub fn admission(&self, tenant: &str, workload: &str, submitted_at: i64) -> String {
        self.key(format_args!(
            "usage/admissions/{}/{}/{submitted_at}",
            segment(tenant),
            segment(workload)
        ))
    }

    pub fn preemptions_prefix(&self) -> String {
        self.key(format_args!("usage/preemptions/"))
    }

    pub fn preemption(&self, run: &RunKey) -> String {
        format!(
            "{}{}/{}/{}/{}",
            self.preemptions_prefix(),
            segment(&run.tenant),
            segment(&run.workload),
            run.submitted_at,
            run.started_at
        )
    }

    pub fn reserved_prefix(&self) -> String {
        self.key(format_args!("usage/reserved/all/"))
    }

    pub fn reserved(&self, id: i64) -> String {
        format!("{}{}", self.reserved_prefix(), id_segment(id))
    }

    /// The id of the latest spell of one (tenant, workload, pool, count): the one a next
    /// metering extends.
    pub fn reserved_tail(&self, tenant: &str, workload: &str, pool: &str, gpus: u32) -> String {
        self.key(format_args!(
            "usage/reserved/tail/{}/{}/{}/{gpus}",
            segment(tenant),
            segment(workload),
            segment(pool)
        ))
    }

    pub fn clock(&self) -> String {
        self.key(format_args!("usage/clock"))
    }
}

/// Ids as twenty digits, so that etcd's byte order of keys is the numeric order of ids.
fn id_segment(id: i64) -> String {
    format!("{:020}", id.max(0))
}

/// The id a key ends with (its last twenty digits).
pub(super) fn id_of(key: &[u8]) -> Result<i64, StoreError> {
    let text = String::from_utf8_lossy(key);
    text.rsplit('/')
        .next()
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| StoreError::Corrupt {
            location: text.to_string(),
            message: "the key does not end with an id".to_string(),
        })
}

/// A tenant, workload or pool name as one key segment: `%`, `/` and bytes outside printable
/// ASCII are percent-encoded, so that no name can reach into another's keys.
fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_graphic() && b != b'%' && b != b'/' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn unsegment(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any name is one segment, and reads back as itself.
        #[test]
        fn a_segment_is_one_segment_and_reads_back(name in "\\PC*") {
            let s = segment(&name);
            prop_assert!(!s.contains('/'));
            prop_assert_eq!(unsegment(&s), Some(name));
        }
    }

    #[test]
    fn ids_sort_as_numbers() {
        assert!(id_segment(9) < id_segment(10));
        assert_eq!(id_of(id_segment(42).as_bytes()).unwrap(), 42);
    }
}
