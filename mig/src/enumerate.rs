//! Exhaustive enumeration of layouts, for the solver's configuration search
//! and for documentation tables. The grid is small (at most 25 candidate
//! placements), so plain depth-first enumeration is instant.

use std::collections::BTreeSet;

use crate::fit::possible_placements;
use crate::placement::Placement;
use crate::shape::{COMPUTE_SLICES, SHAPES, Shape, shape};

/// Allowed profiles, deduplicated, unknown IDs dropped, in profile ID order.
fn known(allowed: &[u32]) -> Vec<&'static Shape> {
    let ids: BTreeSet<u32> = allowed.iter().copied().collect();
    ids.into_iter().filter_map(shape).collect()
}

/// Every valid non-empty layout using only `allowed` profile IDs (unknown IDs
/// are ignored). Each layout is sorted, and the list is sorted
/// lexicographically, so the output is the same on every call.
pub fn all_layouts(allowed: &[u32]) -> Vec<Vec<Placement>> {
    let shapes = known(allowed);
    let mut candidates: Vec<(Placement, usize)> = shapes
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            s.starts
                .iter()
                .map(move |&start| (Placement::new(s.profile_id, start), i))
        })
        .collect();
    candidates.sort();

    let mut out = Vec::new();
    let mut state = Walk {
        shapes: &shapes,
        candidates: &candidates,
        counts: vec![0; shapes.len()],
        current: Vec::new(),
        out: &mut out,
    };
    state.walk(0, 0, 0);
    out.sort();
    out
}

struct Walk<'a> {
    shapes: &'a [&'static Shape],
    candidates: &'a [(Placement, usize)],
    counts: Vec<u8>,
    current: Vec<Placement>,
    out: &'a mut Vec<Vec<Placement>>,
}

impl Walk<'_> {
    /// Include-or-skip each candidate in order; candidates are sorted, so
    /// `current` stays sorted.
    fn walk(&mut self, next: usize, occupied: u16, compute: u8) {
        let Some(&(p, shape_index)) = self.candidates.get(next) else {
            if !self.current.is_empty() {
                self.out.push(self.current.clone());
            }
            return;
        };
        self.walk(next + 1, occupied, compute);

        let s = self.shapes[shape_index];
        let fits = occupied & p.mask() == 0
            && self.counts[shape_index] < s.max_per_gpu
            && compute + s.compute_slices <= COMPUTE_SLICES;
        if fits {
            self.counts[shape_index] += 1;
            self.current.push(p);
            self.walk(next + 1, occupied | p.mask(), compute + s.compute_slices);
            self.current.pop();
            self.counts[shape_index] -= 1;
        }
    }
}

/// The layouts from [`all_layouts`] to which no instance of an allowed
/// profile can be added without moving an existing one.
pub fn maximal_layouts(allowed: &[u32]) -> Vec<Vec<Placement>> {
    let shapes = known(allowed);
    all_layouts(allowed)
        .into_iter()
        .filter(|layout| {
            shapes
                .iter()
                .all(|s| possible_placements(layout, s.profile_id).is_empty())
        })
        .collect()
}

/// The profile IDs of a layout as a sorted multiset (ascending profile ID).
pub fn profile_multiset(layout: &[Placement]) -> Vec<u32> {
    let mut ids: Vec<u32> = layout.iter().map(|p| p.profile_id).collect();
    ids.sort_unstable();
    ids
}

/// Distinct profile multisets of the [`maximal_layouts`], sorted.
///
/// A multiset can appear here and still not be full: 3g@0, 2g@4, 1g@6 is
/// maximal as placed (slice 7 is unusable), yet {3g, 2g, 1g, 1g} fits when
/// arranged differently. See [`maximal_multisets`] for the stricter notion.
pub fn maximal_layout_multisets(allowed: &[u32]) -> Vec<Vec<u32>> {
    let set: BTreeSet<Vec<u32>> = maximal_layouts(allowed)
        .iter()
        .map(|l| profile_multiset(l))
        .collect();
    set.into_iter().collect()
}

/// Every non-empty multiset of `allowed` profiles that fits one GPU in some
/// arrangement, sorted.
pub fn placeable_multisets(allowed: &[u32]) -> Vec<Vec<u32>> {
    let set: BTreeSet<Vec<u32>> = all_layouts(allowed)
        .iter()
        .map(|l| profile_multiset(l))
        .collect();
    set.into_iter().collect()
}

/// Placeable multisets to which no allowed profile can be added even by
/// rearranging the GPU: the "full" mixes a solver should consider when it is
/// free to reconfigure. Sorted.
pub fn maximal_multisets(allowed: &[u32]) -> Vec<Vec<u32>> {
    let placeable = placeable_multisets(allowed);
    let lookup: BTreeSet<&Vec<u32>> = placeable.iter().collect();
    let shapes = known(allowed);
    placeable
        .iter()
        .filter(|m| {
            shapes.iter().all(|s| {
                let mut bigger = (*m).clone();
                bigger.push(s.profile_id);
                bigger.sort_unstable();
                !lookup.contains(&bigger)
            })
        })
        .cloned()
        .collect()
}

/// Every profile ID in the table, for callers that allow all of them.
pub fn all_profile_ids() -> Vec<u32> {
    SHAPES.iter().map(|s| s.profile_id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit::place;
    use crate::placement::validate;

    fn p(profile_id: u32, start: u8) -> Placement {
        Placement::new(profile_id, start)
    }

    #[test]
    fn only_7g_allowed() {
        assert_eq!(all_layouts(&[0]), vec![vec![p(0, 0)]]);
        assert_eq!(maximal_layouts(&[0]), vec![vec![p(0, 0)]]);
    }

    #[test]
    fn media_extension_alone_has_seven_single_layouts() {
        let layouts = all_layouts(&[20]);
        assert_eq!(layouts.len(), 7);
        assert_eq!(maximal_layouts(&[20]), layouts);
    }

    #[test]
    fn unknown_and_duplicate_ids_are_ignored() {
        assert_eq!(all_layouts(&[9, 9, 1, 3]), all_layouts(&[9]));
        assert!(all_layouts(&[]).is_empty());
        assert!(all_layouts(&[42]).is_empty());
    }

    #[test]
    fn layouts_are_sorted_and_valid() {
        let layouts = all_layouts(&[19, 15, 14, 9, 5, 0]);
        assert!(layouts.windows(2).all(|w| w[0] < w[1]));
        for l in &layouts {
            assert!(l.windows(2).all(|w| w[0] < w[1]));
            assert_eq!(validate(l), Ok(()));
        }
    }

    #[test]
    fn maximal_layout_multiset_that_is_not_full() {
        let classic = [19, 14, 9, 5, 0];
        assert!(maximal_layouts(&classic).contains(&vec![p(9, 0), p(14, 4), p(19, 6)]));
        assert!(maximal_layout_multisets(&classic).contains(&vec![9, 14, 19]));
        assert!(!maximal_multisets(&classic).contains(&vec![9, 14, 19]));
        assert!(maximal_multisets(&classic).contains(&vec![9, 14, 19, 19]));
    }

    #[test]
    fn every_placeable_multiset_is_found_by_place() {
        for m in placeable_multisets(&all_profile_ids()) {
            assert!(place(&m).is_ok(), "{m:?}");
        }
    }
}
