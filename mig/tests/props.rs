//! Properties checked against a brute-force oracle that shares no code with
//! the crate: its own copy of the MIG table, a per-slice occupancy array, and
//! plain recursion over every (instance, start) assignment.

use std::collections::BTreeSet;

use proptest::prelude::*;
use tessera_mig::{
    Placement, all_layouts, maximal_layouts, place, place_additions, place_with,
    possible_placements, validate,
};

/// (profile id, compute slices, memory slices, max per GPU, allowed starts),
/// transcribed from the NVIDIA MIG user guide.
const TABLE: [(u32, u8, u8, usize, &[u8]); 7] = [
    (19, 1, 1, 7, &[0, 1, 2, 3, 4, 5, 6]),
    (20, 1, 1, 1, &[0, 1, 2, 3, 4, 5, 6]),
    (15, 1, 2, 4, &[0, 2, 4, 6]),
    (14, 2, 2, 3, &[0, 2, 4]),
    (9, 3, 4, 2, &[0, 4]),
    (5, 4, 4, 1, &[0]),
    (0, 7, 8, 1, &[0]),
];
const IDS: [u32; 7] = [19, 20, 15, 14, 9, 5, 0];

fn row(id: u32) -> Option<(u32, u8, u8, usize, &'static [u8])> {
    TABLE.iter().copied().find(|r| r.0 == id)
}

fn oracle_valid(layout: &[(u32, u8)]) -> bool {
    let mut slices = [false; 8];
    let mut compute = 0u32;
    for &(id, start) in layout {
        let Some((_, c, mem, max, starts)) = row(id) else {
            return false;
        };
        if !starts.contains(&start) {
            return false;
        }
        if layout.iter().filter(|(other, _)| *other == id).count() > max {
            return false;
        }
        for slice in start..start + mem {
            if slices[slice as usize] {
                return false;
            }
            slices[slice as usize] = true;
        }
        compute += u32::from(c);
    }
    compute <= 7
}

/// Tries every start for every instance of `add`, in input order; a partial
/// assignment that is already invalid cannot become valid, so it is cut.
fn oracle_assignable(fixed: &mut Vec<(u32, u8)>, add: &[u32]) -> bool {
    let Some((&id, rest)) = add.split_first() else {
        return oracle_valid(fixed);
    };
    let Some((_, _, _, _, starts)) = row(id) else {
        return false;
    };
    for &start in starts {
        fixed.push((id, start));
        let ok = oracle_valid(fixed) && oracle_assignable(fixed, rest);
        fixed.pop();
        if ok {
            return true;
        }
    }
    false
}

fn pairs(layout: &[Placement]) -> Vec<(u32, u8)> {
    layout.iter().map(|p| (p.profile_id, p.start)).collect()
}

fn placements(pairs: &[(u32, u8)]) -> Vec<Placement> {
    pairs.iter().map(|&(id, s)| Placement::new(id, s)).collect()
}

fn sorted<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort();
    v
}

fn candidates(allowed: &[u32]) -> Vec<(u32, u8)> {
    TABLE
        .iter()
        .filter(|r| allowed.contains(&r.0))
        .flat_map(|r| r.4.iter().map(move |&s| (r.0, s)))
        .collect()
}

/// All valid non-empty subsets of the candidate placements.
fn oracle_layouts(allowed: &[u32]) -> BTreeSet<Vec<(u32, u8)>> {
    fn go(c: &[(u32, u8)], cur: &mut Vec<(u32, u8)>, out: &mut BTreeSet<Vec<(u32, u8)>>) {
        let Some((&first, rest)) = c.split_first() else {
            if !cur.is_empty() {
                out.insert(sorted(cur));
            }
            return;
        };
        go(rest, cur, out);
        cur.push(first);
        if oracle_valid(cur) {
            go(rest, cur, out);
        }
        cur.pop();
    }
    let mut out = BTreeSet::new();
    go(&candidates(allowed), &mut Vec::new(), &mut out);
    out
}

fn profile() -> impl Strategy<Value = u32> {
    prop::sample::select(IDS.to_vec())
}

/// Mostly placements at allowed starts (so that valid sets are common), some
/// anywhere, some with IDs that are not profiles.
fn any_placement() -> impl Strategy<Value = (u32, u8)> {
    prop_oneof![
        8 => prop::sample::select(candidates(&IDS)),
        1 => (profile(), 0u8..9),
        1 => (prop::sample::select(vec![1u32, 3, 4, 42]), 0u8..8),
    ]
}

/// A valid layout: random candidates, each kept only if it stays valid.
fn valid_layout() -> impl Strategy<Value = Vec<(u32, u8)>> {
    prop::collection::vec(prop::sample::select(candidates(&IDS)), 0..8).prop_map(|picks| {
        let mut kept = Vec::new();
        for p in picks {
            kept.push(p);
            if !oracle_valid(&kept) {
                kept.pop();
            }
        }
        kept
    })
}

proptest! {
    #[test]
    fn place_agrees_with_brute_force(
        (request, shuffled) in prop::collection::vec(profile(), 0..=8)
            .prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle()))
    ) {
        let result = place(&request);
        prop_assert_eq!(result.is_ok(), oracle_assignable(&mut Vec::new(), &request));
        prop_assert_eq!(&place(&shuffled), &result);
        if let Ok(layout) = result {
            prop_assert_eq!(validate(&layout), Ok(()));
            prop_assert!(oracle_valid(&pairs(&layout)));
            prop_assert_eq!(sorted(&layout), layout.clone());
            let got: Vec<u32> = sorted(&layout.iter().map(|p| p.profile_id).collect::<Vec<_>>());
            prop_assert_eq!(got, sorted(&request));
        }
    }

    #[test]
    fn validate_agrees_with_brute_force(
        layout in prop::collection::vec(any_placement(), 0..=7)
    ) {
        prop_assert_eq!(validate(&placements(&layout)).is_ok(), oracle_valid(&layout));
    }

    #[test]
    fn place_with_agrees_with_brute_force(
        existing in valid_layout(),
        (add, shuffled) in prop::collection::vec(profile(), 0..=5)
            .prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle()))
    ) {
        let fixed = placements(&existing);
        let result = place_with(&fixed, &add);
        prop_assert_eq!(result.is_ok(), oracle_assignable(&mut existing.clone(), &add));
        prop_assert_eq!(&place_with(&fixed, &shuffled), &result);
        if let Ok(layout) = result {
            prop_assert!(oracle_valid(&pairs(&layout)));
            for p in &fixed {
                prop_assert!(layout.contains(p), "existing {:?} moved", p);
            }
            let added = place_additions(&fixed, &add).unwrap();
            prop_assert_eq!(sorted(&[fixed.clone(), added.clone()].concat()), layout);
            let added_ids: Vec<u32> = added.iter().map(|p| p.profile_id).collect();
            prop_assert_eq!(sorted(&added_ids), sorted(&add));
        }
    }

    #[test]
    fn possible_placements_agree_with_brute_force(existing in valid_layout()) {
        let fixed = placements(&existing);
        for id in IDS {
            let want: Vec<Placement> = (0u8..8)
                .filter(|&s| oracle_valid(&[existing.clone(), vec![(id, s)]].concat()))
                .map(|s| Placement::new(id, s))
                .collect();
            prop_assert_eq!(possible_placements(&fixed, id), want);
        }
    }
}

/// Every non-empty subset of the seven profiles.
fn allowed_sets() -> impl Iterator<Item = Vec<u32>> {
    (1u32..128).map(|bits| {
        IDS.iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << i) != 0)
            .map(|(_, &id)| id)
            .collect()
    })
}

#[test]
fn all_layouts_is_exactly_the_valid_subsets() {
    for allowed in allowed_sets() {
        let got = all_layouts(&allowed);
        assert!(got.windows(2).all(|w| w[0] < w[1]), "{allowed:?} unsorted");
        let got: BTreeSet<Vec<(u32, u8)>> = got.iter().map(|l| sorted(&pairs(l))).collect();
        assert_eq!(got, oracle_layouts(&allowed), "{allowed:?}");
    }
}

#[test]
fn maximal_layouts_are_valid_full_and_cover_every_layout() {
    for allowed in allowed_sets() {
        let cands = candidates(&allowed);
        let maximal = maximal_layouts(&allowed);
        let want: BTreeSet<Vec<(u32, u8)>> = oracle_layouts(&allowed)
            .into_iter()
            .filter(|l| {
                cands
                    .iter()
                    .all(|c| !oracle_valid(&[l.clone(), vec![*c]].concat()))
            })
            .collect();
        let got: BTreeSet<Vec<(u32, u8)>> = maximal.iter().map(|l| sorted(&pairs(l))).collect();
        assert_eq!(got, want, "{allowed:?}");
        for layout in &maximal {
            assert_eq!(validate(layout), Ok(()));
            for &id in &allowed {
                assert!(
                    possible_placements(layout, id).is_empty(),
                    "{layout:?} + {id}"
                );
            }
        }
        for layout in all_layouts(&allowed) {
            assert!(
                maximal.iter().any(|m| layout.iter().all(|p| m.contains(p))),
                "{allowed:?}: {layout:?} extends to no maximal layout"
            );
        }
    }
}
