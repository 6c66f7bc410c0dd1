//! Finding placements for a requested set of profiles.
//!
//! The solver reasons in profile multisets ("two 3g and a 1g"); the node
//! driver needs explicit starts. The search here is exhaustive (backtracking),
//! because the greedy "lowest free start" choice fails on mixes such as
//! 1g, 1g, 2g, 3g, and deterministic, because the same plan must produce the
//! same geometry on every reconcile.

use std::collections::BTreeMap;

use crate::placement::{GeometryError, Placement, validate};
use crate::shape::{COMPUTE_SLICES, MEMORY_SLICES, Shape, shape};

/// Why a requested set of profiles cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FitError {
    #[error(
        "unknown MIG profile ID {0}; known IDs are 19, 20, 15, 14, 9, 5 and 0 \
         (profile IDs, not NVML_GPU_INSTANCE_PROFILE_* enum values)"
    )]
    UnknownProfile(u32),
    #[error(
        "{count} instances of profile {profile_id} (including existing ones) but a GPU holds \
         at most {max}; request fewer or pick a different profile"
    )]
    TooMany {
        profile_id: u32,
        count: u32,
        max: u8,
    },
    #[error(
        "the instances need {needed} compute slices (including existing ones) but a GPU has \
         {COMPUTE_SLICES}; request fewer or smaller instances"
    )]
    ComputeSlices { needed: u32 },
    #[error("{}", no_placement_message(.requested, .free_slices))]
    NoPlacement {
        /// The profiles that were to be added, sorted by profile ID.
        requested: Vec<u32>,
        /// Memory slices not used by existing instances.
        free_slices: Vec<u8>,
    },
    #[error("the existing instances are not a valid layout: {0}")]
    Existing(#[from] GeometryError),
}

fn no_placement_message(requested: &[u32], free_slices: &[u8]) -> String {
    let mut by_profile: BTreeMap<u32, usize> = BTreeMap::new();
    for &id in requested {
        *by_profile.entry(id).or_default() += 1;
    }
    let parts: Vec<String> = by_profile
        .iter()
        .map(|(&id, &n)| match shape(id) {
            Some(s) => format!("{n} x profile {id} [{}, starts {:?}]", s.label(), s.starts),
            None => format!("{n} x profile {id}"),
        })
        .collect();
    format!(
        "no arrangement fits {} into free memory slices {free_slices:?}: each instance must \
         start at one of its allowed slices without overlapping another; remove an instance, \
         use smaller profiles, or reconfigure the GPU",
        parts.join(", ")
    )
}

/// Places a multiset of profiles on an empty GPU. Returns the placements
/// sorted; the result depends only on the multiset, not on the input order.
pub fn place(profile_ids: &[u32]) -> Result<Vec<Placement>, FitError> {
    place_with(&[], profile_ids)
}

/// Adds instances to a GPU without moving the existing ones (reconfiguring
/// would destroy running workloads). Returns the whole resulting layout,
/// existing placements included, sorted; use [`place_additions`] to get only
/// the new ones.
pub fn place_with(existing: &[Placement], add: &[u32]) -> Result<Vec<Placement>, FitError> {
    let mut layout = place_additions(existing, add)?;
    layout.extend_from_slice(existing);
    layout.sort();
    Ok(layout)
}

/// Like [`place_with`] but returns only the placements for `add`, sorted:
/// the instances a driver has to create.
///
/// Larger profiles are tried first, each at its lowest free start, with
/// backtracking; the first complete arrangement in that order is returned.
pub fn place_additions(existing: &[Placement], add: &[u32]) -> Result<Vec<Placement>, FitError> {
    validate(existing)?;

    let mut shapes: Vec<&'static Shape> = Vec::with_capacity(add.len());
    for &id in add {
        shapes.push(shape(id).ok_or(FitError::UnknownProfile(id))?);
    }

    let mut counts: BTreeMap<u32, (u32, u8)> = BTreeMap::new();
    for s in existing
        .iter()
        .filter_map(|p| shape(p.profile_id))
        .chain(shapes.iter().copied())
    {
        counts.entry(s.profile_id).or_insert((0, s.max_per_gpu)).0 += 1;
    }
    if let Some((&profile_id, &(count, max))) = counts
        .iter()
        .find(|(_, (count, max))| *count > u32::from(*max))
    {
        return Err(FitError::TooMany {
            profile_id,
            count,
            max,
        });
    }

    let needed: u32 = existing
        .iter()
        .filter_map(|p| shape(p.profile_id))
        .chain(shapes.iter().copied())
        .map(|s| u32::from(s.compute_slices))
        .sum();
    if needed > u32::from(COMPUTE_SLICES) {
        return Err(FitError::ComputeSlices { needed });
    }

    shapes.sort_by(|a, b| {
        b.memory_slices
            .cmp(&a.memory_slices)
            .then(b.compute_slices.cmp(&a.compute_slices))
            .then(a.profile_id.cmp(&b.profile_id))
    });
    let occupied = occupied_mask(existing);
    let mut chosen = Vec::with_capacity(shapes.len());
    if search(&shapes, occupied, &mut chosen) {
        chosen.sort();
        Ok(chosen)
    } else {
        let mut requested = add.to_vec();
        requested.sort_unstable();
        Err(FitError::NoPlacement {
            requested,
            free_slices: (0..MEMORY_SLICES)
                .filter(|i| occupied & (1 << i) == 0)
                .collect(),
        })
    }
}

fn occupied_mask(layout: &[Placement]) -> u16 {
    layout.iter().fold(0, |acc, p| acc | p.mask())
}

/// Depth-first over `todo` (equal profiles adjacent). Instances of the same
/// profile take strictly increasing starts: they are interchangeable, and
/// trying them in every order would only repeat failed branches.
fn search(todo: &[&'static Shape], occupied: u16, chosen: &mut Vec<Placement>) -> bool {
    let Some((s, rest)) = todo.split_first() else {
        return true;
    };
    let min_start = match chosen.last() {
        Some(prev) if prev.profile_id == s.profile_id => prev.start + 1,
        _ => 0,
    };
    for &start in s.starts.iter().filter(|&&st| st >= min_start) {
        let p = Placement::new(s.profile_id, start);
        let m = p.mask();
        if occupied & m != 0 {
            continue;
        }
        chosen.push(p);
        if search(rest, occupied | m, chosen) {
            return true;
        }
        chosen.pop();
    }
    false
}

/// The placements of `profile_id` that could be added to `existing` right
/// now, sorted by start: the counterpart of
/// `nvmlDeviceGetGpuInstancePossiblePlacements` for the current state.
///
/// Besides free memory slices this honours the per-profile limit and the
/// compute total, so an empty result means "nothing of this profile can be
/// added". Empty as well for an unknown profile or an invalid `existing`.
pub fn possible_placements(existing: &[Placement], profile_id: u32) -> Vec<Placement> {
    let Some(s) = shape(profile_id) else {
        return Vec::new();
    };
    if validate(existing).is_err() {
        return Vec::new();
    }
    let same = existing
        .iter()
        .filter(|p| p.profile_id == profile_id)
        .count();
    let used: u32 = existing
        .iter()
        .filter_map(|p| shape(p.profile_id))
        .map(|s| u32::from(s.compute_slices))
        .sum();
    if same >= usize::from(s.max_per_gpu)
        || used + u32::from(s.compute_slices) > u32::from(COMPUTE_SLICES)
    {
        return Vec::new();
    }
    let occupied = occupied_mask(existing);
    s.starts
        .iter()
        .map(|&start| Placement::new(profile_id, start))
        .filter(|p| occupied & p.mask() == 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::*;

    fn p(profile_id: u32, start: u8) -> Placement {
        Placement::new(profile_id, start)
    }

    #[test]
    fn greedy_trap_1g_1g_2g_3g_places_deterministically() {
        // Greedy would put 3g at 0 and 2g at 4, leaving only slice 6 for two 1g.
        let want = vec![p(14, 0), p(19, 2), p(19, 3), p(9, 4)];
        assert_eq!(place(&[19, 19, 14, 9]), Ok(want.clone()));
        assert_eq!(place(&[9, 19, 14, 19]), Ok(want.clone()));
        assert_eq!(place(&[14, 9, 19, 19]), Ok(want));
    }

    #[test]
    fn worked_example_3g_plus_4g() {
        assert_eq!(place(&[9, 5]), Ok(vec![p(5, 0), p(9, 4)]));
    }

    #[test]
    fn worked_example_two_3g_and_a_1g_do_not_fit() {
        let err = place(&[9, 9, 19]).unwrap_err();
        assert_eq!(
            err,
            FitError::NoPlacement {
                requested: vec![9, 9, 19],
                free_slices: (0..8).collect()
            }
        );
        let msg = err.to_string();
        assert!(msg.contains("2 x profile 9"), "{msg}");
    }

    #[test]
    fn worked_example_three_2g_and_a_1g() {
        assert_eq!(
            place(&[19, 14, 14, 14]),
            Ok(vec![p(14, 0), p(14, 2), p(14, 4), p(19, 6)])
        );
    }

    #[test]
    fn worked_example_seven_and_eight_1g() {
        assert_eq!(place(&[19; 7]), Ok((0..7).map(|s| p(19, s)).collect()));
        assert_eq!(
            place(&[19; 8]),
            Err(FitError::TooMany {
                profile_id: 19,
                count: 8,
                max: 7
            })
        );
    }

    #[test]
    fn worked_example_two_4g() {
        assert_eq!(
            place(&[5, 5]),
            Err(FitError::TooMany {
                profile_id: 5,
                count: 2,
                max: 1
            })
        );
    }

    #[test]
    fn unknown_profile() {
        assert_eq!(place(&[19, 3]), Err(FitError::UnknownProfile(3)));
    }

    #[test]
    fn compute_slices() {
        assert_eq!(
            place(&[5, 9, 19]),
            Err(FitError::ComputeSlices { needed: 8 })
        );
        assert_eq!(
            place_with(&[p(0, 0)], &[19]),
            Err(FitError::ComputeSlices { needed: 8 })
        );
    }

    #[test]
    fn invalid_existing_is_reported_as_such() {
        assert!(matches!(
            place_with(&[p(9, 2)], &[19]),
            Err(FitError::Existing(GeometryError::StartNotAllowed { .. }))
        ));
    }

    #[test]
    fn empty_request() {
        assert_eq!(place(&[]), Ok(vec![]));
        assert_eq!(place_with(&[p(9, 4)], &[]), Ok(vec![p(9, 4)]));
    }

    #[test]
    fn place_with_keeps_existing_where_they_are() {
        // On an empty GPU 3g would go to 0; here it must take 4.
        let existing = [p(19, 1)];
        assert_eq!(
            place_with(&existing, &[9, 19]),
            Ok(vec![p(19, 0), p(19, 1), p(9, 4)])
        );
        assert_eq!(
            place_additions(&existing, &[9, 19]),
            Ok(vec![p(19, 0), p(9, 4)])
        );
    }

    #[test]
    fn place_with_fails_where_reconfiguring_would_succeed() {
        // 3g, 2g and two 1g fit an empty GPU, but not around a 1g at slice 5.
        assert!(place(&[9, 14, 19, 19]).is_ok());
        let err = place_with(&[p(19, 5)], &[9, 14, 19]).unwrap_err();
        assert_eq!(
            err,
            FitError::NoPlacement {
                requested: vec![9, 14, 19],
                free_slices: vec![0, 1, 2, 3, 4, 6, 7]
            }
        );
    }

    #[test]
    fn place_with_counts_existing_towards_limits() {
        assert_eq!(
            place_with(&[p(20, 0)], &[20]),
            Err(FitError::TooMany {
                profile_id: 20,
                count: 2,
                max: 1
            })
        );
    }

    #[test]
    fn possible_placements_follow_free_slices() {
        assert_eq!(possible_placements(&[], PROFILE_3G), vec![p(9, 0), p(9, 4)]);
        assert_eq!(possible_placements(&[p(19, 1)], PROFILE_3G), vec![p(9, 4)]);
        assert_eq!(
            possible_placements(&[p(14, 2)], PROFILE_1G_MEM2),
            vec![p(15, 0), p(15, 4), p(15, 6)]
        );
        // Slice 7 is free but no 1g may start there.
        let six: Vec<Placement> = (0..6).map(|s| p(19, s)).collect();
        assert_eq!(possible_placements(&six, PROFILE_1G), vec![p(19, 6)]);
        let seven: Vec<Placement> = (0..7).map(|s| p(19, s)).collect();
        assert!(possible_placements(&seven, PROFILE_1G).is_empty());
    }

    #[test]
    fn possible_placements_respect_limits_and_compute() {
        assert!(possible_placements(&[p(20, 0)], PROFILE_1G_ME).is_empty());
        assert_eq!(possible_placements(&[p(20, 0)], PROFILE_1G).len(), 6);
        // 2g,2g,2g,1g uses all 7 compute slices; slice 7 stays free but useless.
        let full = [p(14, 0), p(14, 2), p(14, 4), p(19, 6)];
        for s in &SHAPES {
            assert!(possible_placements(&full, s.profile_id).is_empty());
        }
        // 4g + 2g@4 leaves slices 6,7 and one compute slice.
        assert_eq!(
            possible_placements(&[p(5, 0), p(14, 4)], PROFILE_1G_MEM2),
            vec![p(15, 6)]
        );
        assert!(possible_placements(&[p(5, 0), p(14, 4)], PROFILE_2G).is_empty());
    }

    #[test]
    fn possible_placements_unknown_or_invalid() {
        assert!(possible_placements(&[], 4).is_empty());
        assert!(possible_placements(&[p(9, 0), p(9, 0)], PROFILE_1G).is_empty());
    }
}
