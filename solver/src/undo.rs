//! Marks of the undo journals the preemption search's what-ifs write through (the fleet's in
//! `heuristic/journal.rs`, the ledger's here): a what-if writes on the solver's own state and a
//! rollback to a mark puts back every value replaced since, instead of a clone per what-if.

use tessera_compiler::compiled::Amounts;

/// An open mark: its depth among the open marks of one journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark(usize);

impl Mark {
    pub(crate) fn at(depth: usize) -> Mark {
        Mark(depth)
    }
    pub(crate) fn depth(self) -> usize {
        self.0
    }
}

/// The ledger's journal: (usage index, value replaced), and where each open mark begins.
#[derive(Debug, Default)]
struct LedgerJournal {
    undo: Vec<(usize, Amounts)>,
    marks: Vec<usize>,
}

/// The ledger's journal slot: a clone starts without one.
#[derive(Debug, Default)]
pub(crate) struct LedgerJournalSlot(Option<Box<LedgerJournal>>);

impl Clone for LedgerJournalSlot {
    fn clone(&self) -> Self {
        LedgerJournalSlot(None)
    }
}

impl LedgerJournalSlot {
    #[cfg(debug_assertions)]
    pub(crate) fn is_open(&self) -> bool {
        self.0.is_some()
    }

    pub(crate) fn mark(&mut self) -> Mark {
        let j = self.0.get_or_insert_with(Box::default);
        j.marks.push(j.undo.len());
        Mark::at(j.marks.len() - 1)
    }

    /// The values to put back, latest first, to undo everything since `mark`; closes it and
    /// the marks opened after it.
    pub(crate) fn rollback(&mut self, mark: Mark) -> Vec<(usize, Amounts)> {
        let mut j = self.0.take().expect("a mark is open");
        let start = j.marks[mark.depth()];
        let mut undo = j.undo.split_off(start);
        undo.reverse();
        j.marks.truncate(mark.depth());
        if !j.marks.is_empty() {
            self.0 = Some(j);
        }
        undo
    }

    /// Records `old` at usage index `i` before a write, when a mark is open.
    pub(crate) fn save(&mut self, i: usize, old: Amounts) {
        if let Some(j) = self.0.as_mut() {
            j.undo.push((i, old));
        }
    }
}
