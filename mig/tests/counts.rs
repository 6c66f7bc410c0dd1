//! Exact layout counts. 722/78 and 19/14 are the reference numbers from the
//! design brief; the others were cross-checked with an independent script.

use tessera_mig::{
    all_layouts, maximal_layout_multisets, maximal_layouts, maximal_multisets, placeable_multisets,
};

/// Every profile except 1g+me.
const NO_ME: [u32; 6] = [19, 15, 14, 9, 5, 0];
/// The A100 launch set.
const CLASSIC: [u32; 5] = [19, 14, 9, 5, 0];

#[test]
fn without_media_extension() {
    assert_eq!(all_layouts(&NO_ME).len(), 722);
    assert_eq!(maximal_layouts(&NO_ME).len(), 78);
    assert_eq!(maximal_multisets(&NO_ME).len(), 28);
    // Distinct multisets *of maximal layouts*: larger, because e.g.
    // 3g@0 + 2g@4 + 1g@6 is maximal as placed but {3g, 2g, 1g, 1g} fits.
    assert_eq!(maximal_layout_multisets(&NO_ME).len(), 38);
    assert_eq!(placeable_multisets(&NO_ME).len(), 77);
}

#[test]
fn classic_a100_set() {
    assert_eq!(maximal_layouts(&CLASSIC).len(), 19);
    assert_eq!(maximal_layout_multisets(&CLASSIC).len(), 14);
    assert_eq!(maximal_multisets(&CLASSIC).len(), 12);
    assert_eq!(all_layouts(&CLASSIC).len(), 297);
    assert_eq!(placeable_multisets(&CLASSIC).len(), 37);
}

#[test]
fn every_profile() {
    let all = [19, 20, 15, 14, 9, 5, 0];
    assert_eq!(all_layouts(&all).len(), 2318);
    assert_eq!(maximal_layouts(&all).len(), 239);
}

#[test]
fn order_of_allowed_does_not_matter() {
    let mut reversed = NO_ME;
    reversed.reverse();
    assert_eq!(all_layouts(&reversed), all_layouts(&NO_ME));
    assert_eq!(maximal_layouts(&reversed), maximal_layouts(&NO_ME));
}
