//! Placements on the memory-slice grid and the rules a set of them must obey.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::shape::{COMPUTE_SLICES, MEMORY_SLICES, Shape, shape};

/// A GPU instance on the grid: its profile and its first memory slice.
///
/// Ordered by start, then profile ID, so a sorted layout reads left to right
/// across the GPU the way `nvidia-smi mig -lgi` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub profile_id: u32,
    pub start: u8,
}

impl Ord for Placement {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.start, self.profile_id).cmp(&(other.start, other.profile_id))
    }
}

impl PartialOrd for Placement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Placement {
    pub const fn new(profile_id: u32, start: u8) -> Self {
        Self { profile_id, start }
    }

    /// Memory slices covered; 0 for an unknown profile, which [`validate`]
    /// rejects, so that a zero-width placement never hides an overlap.
    pub fn size(&self) -> u8 {
        shape(self.profile_id).map_or(0, |s| s.memory_slices)
    }

    /// One past the last memory slice covered.
    pub fn end(&self) -> u8 {
        self.start.saturating_add(self.size())
    }

    /// Whether the two placements share a memory slice.
    pub fn overlaps(&self, other: &Placement) -> bool {
        self.start < other.end() && other.start < self.end()
    }

    /// Memory slices covered, as a bit set (bit i = slice i). Bits past the
    /// grid are dropped; callers check the start against the profile first.
    pub(crate) fn mask(&self) -> u16 {
        let size = u32::from(self.size());
        let start = u32::from(self.start);
        if start >= u32::from(MEMORY_SLICES) {
            return 0;
        }
        let bits = ((1u32 << size) - 1) << start;
        (bits & 0xFF) as u16
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match shape(self.profile_id) {
            Some(s) => write!(
                f,
                "profile {} [{}] at memory slices {}..{}",
                self.profile_id,
                s.label(),
                self.start,
                self.end()
            ),
            None => write!(
                f,
                "unknown profile {} at memory slice {}",
                self.profile_id, self.start
            ),
        }
    }
}

/// Why a set of placements is not a geometry the GPU accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    #[error(
        "unknown MIG profile ID {profile_id}; known IDs are 19, 20, 15, 14, 9, 5 and 0 \
         (profile IDs, not NVML_GPU_INSTANCE_PROFILE_* enum values)"
    )]
    UnknownProfile { profile_id: u32 },
    #[error("{placement} is not allowed: this profile can only start at memory slices {allowed:?}")]
    StartNotAllowed {
        placement: Placement,
        allowed: &'static [u8],
    },
    #[error(
        "{count} instances of profile {profile_id} requested but a GPU holds at most {max}; \
         use fewer or pick a different profile"
    )]
    TooMany {
        profile_id: u32,
        count: u32,
        max: u8,
    },
    #[error(
        "instances use {used} compute slices but a GPU has {COMPUTE_SLICES}; \
         remove instances or use smaller profiles"
    )]
    ComputeSlices { used: u32 },
    #[error("{first} overlaps {second}; move one to a free start or remove it")]
    Overlap { first: Placement, second: Placement },
}

/// Checks a complete GPU layout against the MIG rules.
///
/// The checks run in a fixed order (unknown profile, start, per-profile
/// limit, compute total, overlap) on the sorted placements, so the reported
/// error does not depend on the order of the input.
pub fn validate(placements: &[Placement]) -> Result<(), GeometryError> {
    let mut sorted = placements.to_vec();
    sorted.sort();

    let mut shapes: Vec<&'static Shape> = Vec::with_capacity(sorted.len());
    for p in &sorted {
        let s = shape(p.profile_id).ok_or(GeometryError::UnknownProfile {
            profile_id: p.profile_id,
        })?;
        if !s.starts.contains(&p.start) {
            return Err(GeometryError::StartNotAllowed {
                placement: *p,
                allowed: s.starts,
            });
        }
        shapes.push(s);
    }

    let mut counts: BTreeMap<u32, (u32, u8)> = BTreeMap::new();
    for s in &shapes {
        counts.entry(s.profile_id).or_insert((0, s.max_per_gpu)).0 += 1;
    }
    if let Some((&profile_id, &(count, max))) = counts
        .iter()
        .find(|(_, (count, max))| *count > u32::from(*max))
    {
        return Err(GeometryError::TooMany {
            profile_id,
            count,
            max,
        });
    }

    let used: u32 = shapes.iter().map(|s| u32::from(s.compute_slices)).sum();
    if used > u32::from(COMPUTE_SLICES) {
        return Err(GeometryError::ComputeSlices { used });
    }

    // Sorted by start, a placement overlaps an earlier one exactly when it
    // starts before the furthest end seen so far.
    let mut furthest: Option<Placement> = None;
    for p in sorted {
        match furthest {
            Some(f) if p.start < f.end() => {
                return Err(GeometryError::Overlap {
                    first: f,
                    second: p,
                });
            }
            Some(f) if p.end() <= f.end() => {}
            _ => furthest = Some(p),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::*;

    fn p(profile_id: u32, start: u8) -> Placement {
        Placement::new(profile_id, start)
    }

    #[test]
    fn order_is_start_then_profile() {
        let mut v = vec![p(0, 0), p(19, 6), p(14, 0), p(9, 4), p(20, 4)];
        v.sort();
        assert_eq!(v, vec![p(0, 0), p(14, 0), p(9, 4), p(20, 4), p(19, 6)]);
    }

    #[test]
    fn size_and_end() {
        assert_eq!((p(9, 4).size(), p(9, 4).end()), (4, 8));
        assert_eq!((p(15, 6).size(), p(15, 6).end()), (2, 8));
        assert_eq!((p(77, 3).size(), p(77, 3).end()), (0, 3));
        assert_eq!(p(9, 4).mask(), 0b1111_0000);
        assert_eq!(p(0, 0).mask(), 0xFF);
    }

    #[test]
    fn worked_example_4g_plus_3g_is_valid() {
        assert_eq!(validate(&[p(PROFILE_3G, 4), p(PROFILE_4G, 0)]), Ok(()));
    }

    #[test]
    fn worked_example_three_2g_and_a_1g_is_valid() {
        let layout = [p(14, 0), p(14, 2), p(14, 4), p(19, 6)];
        assert_eq!(validate(&layout), Ok(()));
    }

    #[test]
    fn seven_1g_valid_eighth_rejected() {
        let seven: Vec<Placement> = (0..7).map(|s| p(19, s)).collect();
        assert_eq!(validate(&seven), Ok(()));
        // The only free slice is 7, where no 1g may start.
        let mut eight = seven.clone();
        eight.push(p(19, 7));
        assert!(matches!(
            validate(&eight),
            Err(GeometryError::StartNotAllowed { .. })
        ));
    }

    #[test]
    fn unknown_profile() {
        assert_eq!(
            validate(&[p(19, 0), p(1, 2)]),
            Err(GeometryError::UnknownProfile { profile_id: 1 })
        );
    }

    #[test]
    fn start_not_allowed() {
        let err = validate(&[p(PROFILE_3G, 2)]).unwrap_err();
        assert_eq!(
            err,
            GeometryError::StartNotAllowed {
                placement: p(9, 2),
                allowed: &[0, 4]
            }
        );
        assert!(err.to_string().contains("[0, 4]"), "{err}");
    }

    #[test]
    fn too_many() {
        assert_eq!(
            validate(&[p(20, 0), p(20, 1)]),
            Err(GeometryError::TooMany {
                profile_id: 20,
                count: 2,
                max: 1
            })
        );
    }

    #[test]
    fn compute_slices() {
        // Memory-disjoint layouts never exceed 7 compute slices, so this error
        // is only reachable together with an overlap; it is reported first.
        assert_eq!(
            validate(&[p(5, 0), p(9, 4), p(19, 3)]),
            Err(GeometryError::ComputeSlices { used: 8 })
        );
    }

    #[test]
    fn overlap_names_both_placements() {
        let err = validate(&[p(19, 3), p(14, 2)]).unwrap_err();
        assert_eq!(
            err,
            GeometryError::Overlap {
                first: p(14, 2),
                second: p(19, 3)
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("profile 14") && msg.contains("profile 19"),
            "{msg}"
        );
    }

    #[test]
    fn overlap_with_an_earlier_wide_instance_is_found() {
        // 3g@0 covers 0..4, so a 2-slice 1g at 2 collides with it; the same
        // 3g next to 2g@4 and 1g@6 only touches edges.
        let err = validate(&[p(9, 0), p(15, 2)]).unwrap_err();
        assert!(matches!(err, GeometryError::Overlap { first, .. } if first == p(9, 0)));
        assert!(validate(&[p(9, 0), p(14, 4), p(19, 6)]).is_ok());
    }

    #[test]
    fn duplicate_placement_is_an_overlap() {
        assert!(matches!(
            validate(&[p(19, 2), p(19, 2)]),
            Err(GeometryError::Overlap { .. })
        ));
    }

    #[test]
    fn empty_layout_is_valid() {
        assert_eq!(validate(&[]), Ok(()));
    }

    #[test]
    fn error_does_not_depend_on_input_order() {
        let a = validate(&[p(19, 3), p(14, 2), p(9, 4), p(9, 0)]);
        let b = validate(&[p(9, 0), p(9, 4), p(14, 2), p(19, 3)]);
        assert_eq!(a, b);
        assert!(a.is_err());
    }

    #[test]
    fn placement_serializes_with_field_names() {
        let json = serde_json::to_string(&p(9, 4)).unwrap();
        assert_eq!(json, r#"{"profile_id":9,"start":4}"#);
        let back: Placement = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p(9, 4));
    }
}
