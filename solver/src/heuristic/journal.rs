//! An undo journal for the fleet and the ledger, so that a tentative change costs what it
//! writes: the preemption search's what-ifs release their victims, and an admission places its
//! gang, on the solver's own fleet and ledger, each write recording the value it replaces, and
//! a rollback to a mark puts every replaced value back. A clone of the whole fleet per
//! candidate set or per placement tried, dropped after, cost the fleet's size each time (a
//! pointer per chunk, the chunks copied on their first write, then all dropped).
//!
//! A rollback restores the very values replaced, not equal ones: a GPU's state comes back as
//! the same `Rc` (the decision's assembly tells changed GPUs by pointer), with its preemption
//! marks and its shares in their order; a workload's placements come back as the same `Rc`.
//!
//! Marks nest: [`Fleet::mark`] opens one, [`Fleet::rollback`] undoes everything written since
//! and closes it with every mark opened after it, [`Fleet::commit`] closes them keeping the
//! writes (a mark opened before still undoes them). [`Fleet::rollback_keeping`] undoes and
//! returns the writes, which [`Fleet::redo`] makes again: the pools a workload may use are
//! compared so. With no mark open nothing is recorded, and a clone of a fleet or ledger never
//! carries its journal.

use super::*;
use crate::undo::Mark;

/// A value replaced in the fleet.
#[derive(Debug)]
enum Undo {
    /// A GPU's state, and the index of the entry that saved this GPU before (see
    /// `FleetJournal::saved`).
    Gpu(usize, Rc<GpuState>, Option<usize>),
    Cpu(usize, u64),
    Memory(usize, u64),
    Placed(usize, Option<Rc<Vec<Placed>>>),
    Free(usize, NodeFree),
}

/// The writes a rollback undid, in the order they were made ([`Fleet::rollback_keeping`]).
#[derive(Debug)]
pub(crate) struct Redo(Vec<Undo>);

#[derive(Debug, Default)]
struct FleetJournal {
    undo: Vec<Undo>,
    /// Where each open mark begins in `undo`, outermost first.
    marks: Vec<usize>,
    /// Per GPU, its latest entry in `undo`. A GPU saved since the innermost mark opened need
    /// not be saved again (every rollback reaches back past that entry): a second save would
    /// hold the state `Rc` twice and make the next write copy it again.
    saved: HashMap<usize, usize, foldhash::fast::FixedState>,
}

/// The fleet's journal slot: a clone starts without one.
#[derive(Debug, Default)]
pub(crate) struct FleetJournalSlot(Option<Box<FleetJournal>>);

impl Clone for FleetJournalSlot {
    fn clone(&self) -> Self {
        FleetJournalSlot(None)
    }
}

impl Fleet {
    /// Opens a mark: the writes from here on can be undone by [`Fleet::rollback`].
    pub(crate) fn mark(&mut self) -> Mark {
        let j = self.journal.0.get_or_insert_with(Box::default);
        j.marks.push(j.undo.len());
        Mark::at(j.marks.len() - 1)
    }

    /// Whether a mark is open.
    #[cfg(any(test, debug_assertions))]
    pub(crate) fn journaling(&self) -> bool {
        self.journal.0.is_some()
    }

    /// Closes `mark` and the marks opened after it, keeping every write since: a mark opened
    /// before it still undoes them; with none open, nothing is recorded any more.
    pub(crate) fn commit(&mut self, mark: Mark) {
        let j = self.journal.0.as_mut().expect("a mark is open");
        j.marks.truncate(mark.depth());
        if j.marks.is_empty() {
            self.journal.0 = None;
        }
    }

    /// Undoes every write since `mark` opened, and closes it and the marks opened after it.
    pub(crate) fn rollback(&mut self, mark: Mark) {
        self.undo_to(mark, None);
    }

    /// [`Fleet::rollback`], keeping what it undoes: the values it replaces, in the order they
    /// were written, for [`Fleet::redo`] to write again. The pools a workload may use are
    /// compared so: each tentative placement written, measured, undone, and the best written
    /// again, where a clone of the whole fleet per pool tried cost the fleet's size.
    pub(crate) fn rollback_keeping(&mut self, mark: Mark) -> Redo {
        let mut kept = Vec::new();
        self.undo_to(mark, Some(&mut kept));
        kept.reverse();
        Redo(kept)
    }

    /// Writes again what a rollback undid (journaled, when a mark is open): the fleet holds
    /// the very values it held before the rollback.
    pub(crate) fn redo(&mut self, redo: Redo) {
        for write in redo.0 {
            match write {
                Undo::Gpu(g, state, _) => {
                    self.save_gpu(g);
                    self.gpu[g] = state;
                }
                // A node's CPU and memory are saved together, CPU first (`save_node`).
                Undo::Cpu(n, v) => {
                    self.save_node(n);
                    self.cpu[n] = v;
                    self.unmeasure(n);
                }
                Undo::Memory(n, v) => self.memory[n] = v,
                Undo::Placed(w, v) => {
                    self.save_placed(w);
                    self.placed[w] = v;
                }
                Undo::Free(n, v) => {
                    self.save_free(n);
                    self.set_free(n, v);
                }
            }
        }
    }

    fn undo_to(&mut self, mark: Mark, mut keep: Option<&mut Vec<Undo>>) {
        let mut j = self.journal.0.take().expect("a mark is open");
        let start = j.marks[mark.depth()];
        while j.undo.len() > start {
            let undone = match j.undo.pop().expect("above the mark") {
                Undo::Gpu(g, old, before) => {
                    match before {
                        Some(i) => j.saved.insert(g, i),
                        None => j.saved.remove(&g),
                    };
                    Undo::Gpu(g, std::mem::replace(&mut self.gpu[g], old), None)
                }
                // Every write to a node's state saves its CPU first (`save_node`).
                Undo::Cpu(n, v) => {
                    let now = std::mem::replace(&mut self.cpu[n], v);
                    self.unmeasure(n);
                    Undo::Cpu(n, now)
                }
                Undo::Memory(n, v) => Undo::Memory(n, std::mem::replace(&mut self.memory[n], v)),
                Undo::Placed(w, v) => Undo::Placed(w, std::mem::replace(&mut self.placed[w], v)),
                Undo::Free(n, v) => {
                    let now = self.free[n];
                    self.set_free(n, v);
                    Undo::Free(n, now)
                }
            };
            if let Some(keep) = keep.as_deref_mut() {
                keep.push(undone);
            }
        }
        j.marks.truncate(mark.depth());
        if !j.marks.is_empty() {
            self.journal.0 = Some(j);
        }
    }

    /// Records GPU `g`'s state before a write, when a mark is open.
    pub(super) fn save_gpu(&mut self, g: usize) {
        let Some(j) = self.journal.0.as_mut() else {
            return;
        };
        let innermost = *j.marks.last().expect("a journal has an open mark");
        if j.saved.get(&g).is_some_and(|&i| i >= innermost) {
            return;
        }
        let before = j.saved.insert(g, j.undo.len());
        j.undo.push(Undo::Gpu(g, Rc::clone(&self.gpu[g]), before));
    }

    /// Records node `n`'s CPU and memory taken before a write, when a mark is open.
    pub(super) fn save_node(&mut self, n: usize) {
        if let Some(j) = self.journal.0.as_mut() {
            j.undo.push(Undo::Cpu(n, self.cpu[n]));
            j.undo.push(Undo::Memory(n, self.memory[n]));
        }
    }

    /// Records what node `n` holds free before a write, when a mark is open.
    pub(super) fn save_free(&mut self, n: usize) {
        if let Some(j) = self.journal.0.as_mut() {
            j.undo.push(Undo::Free(n, self.free[n]));
        }
    }

    /// Records workload `w`'s placements before a write, when a mark is open.
    pub(super) fn save_placed(&mut self, w: usize) {
        if let Some(j) = self.journal.0.as_mut() {
            j.undo.push(Undo::Placed(w, self.placed[w].clone()));
        }
    }
}
