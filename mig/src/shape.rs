//! The MIG profile table (NVIDIA MIG user guide, A100/H100 family).
//!
//! Two numbering schemes exist for the same profile and NVML uses both:
//! the *profile ID* is what `nvmlDeviceCreateGpuInstance*` and the placement
//! queries take, the *NVML enum* (`NVML_GPU_INSTANCE_PROFILE_*`) is what
//! `nvmlDeviceGetGpuInstanceProfileInfo` takes. Passing one where the other is
//! expected silently selects a different profile, so both are kept side by
//! side and everything else in this crate is keyed on the profile ID.

use serde::Serialize;

/// Compute slices (GPCs available to MIG) on every MIG-capable GPU.
pub const COMPUTE_SLICES: u8 = 7;
/// Memory slices (eighths of framebuffer) on every MIG-capable GPU.
pub const MEMORY_SLICES: u8 = 8;

/// 1 compute slice, 1/8 memory (`1g.10gb` on an 80 GB part).
pub const PROFILE_1G: u32 = 19;
/// 1 compute slice, 1/8 memory, plus the media engines (`1g.10gb+me`).
pub const PROFILE_1G_ME: u32 = 20;
/// 1 compute slice, 2/8 memory (`1g.20gb` on an 80 GB part).
pub const PROFILE_1G_MEM2: u32 = 15;
/// 2 compute slices, 2/8 memory.
pub const PROFILE_2G: u32 = 14;
/// 3 compute slices, 4/8 memory.
pub const PROFILE_3G: u32 = 9;
/// 4 compute slices, 4/8 memory.
pub const PROFILE_4G: u32 = 5;
/// The whole GPU as one instance.
pub const PROFILE_7G: u32 = 0;

/// One GPU-instance profile and where it may sit on the memory-slice grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Shape {
    /// NVML GPU-instance profile ID (create/placement calls).
    pub profile_id: u32,
    /// `NVML_GPU_INSTANCE_PROFILE_*` value (profile-info calls). Not a profile ID.
    pub nvml_enum: u32,
    pub compute_slices: u8,
    pub memory_slices: u8,
    pub max_per_gpu: u8,
    /// First memory slice the instance may occupy; the hardware accepts no others.
    pub starts: &'static [u8],
}

impl Shape {
    /// Model-independent label for messages, since per-model names such as
    /// `3g.40gb` need a [`crate::GpuModel`] to resolve.
    pub fn label(&self) -> String {
        let media = if self.profile_id == PROFILE_1G_ME {
            "+me"
        } else {
            ""
        };
        format!(
            "{}g{media} ({}/{MEMORY_SLICES} memory)",
            self.compute_slices, self.memory_slices
        )
    }
}

/// All profiles, in the NVIDIA user guide's table order (smallest first:
/// profile IDs 19, 20, 15, 14, 9, 5, 0). The catalog's per-model name lists
/// use the same order.
pub const SHAPES: [Shape; 7] = [
    Shape {
        profile_id: PROFILE_1G,
        nvml_enum: 0,
        compute_slices: 1,
        memory_slices: 1,
        max_per_gpu: 7,
        starts: &[0, 1, 2, 3, 4, 5, 6],
    },
    Shape {
        profile_id: PROFILE_1G_ME,
        nvml_enum: 7,
        compute_slices: 1,
        memory_slices: 1,
        max_per_gpu: 1,
        starts: &[0, 1, 2, 3, 4, 5, 6],
    },
    Shape {
        profile_id: PROFILE_1G_MEM2,
        nvml_enum: 9,
        compute_slices: 1,
        memory_slices: 2,
        max_per_gpu: 4,
        starts: &[0, 2, 4, 6],
    },
    Shape {
        profile_id: PROFILE_2G,
        nvml_enum: 1,
        compute_slices: 2,
        memory_slices: 2,
        max_per_gpu: 3,
        starts: &[0, 2, 4],
    },
    Shape {
        profile_id: PROFILE_3G,
        nvml_enum: 2,
        compute_slices: 3,
        memory_slices: 4,
        max_per_gpu: 2,
        starts: &[0, 4],
    },
    Shape {
        profile_id: PROFILE_4G,
        nvml_enum: 3,
        compute_slices: 4,
        memory_slices: 4,
        max_per_gpu: 1,
        starts: &[0],
    },
    Shape {
        profile_id: PROFILE_7G,
        nvml_enum: 4,
        compute_slices: 7,
        memory_slices: 8,
        max_per_gpu: 1,
        starts: &[0],
    },
];

/// Looks up a profile by profile ID (not by NVML enum).
pub fn shape(profile_id: u32) -> Option<&'static Shape> {
    SHAPES.iter().find(|s| s.profile_id == profile_id)
}

/// Looks up a profile by its `NVML_GPU_INSTANCE_PROFILE_*` value, for drivers
/// that read profile info from NVML and must map it back to a profile ID.
pub fn shape_by_nvml_enum(nvml_enum: u32) -> Option<&'static Shape> {
    SHAPES.iter().find(|s| s.nvml_enum == nvml_enum)
}

/// The share of a GPU an instance of this profile represents, in sevenths
/// (its compute slices), so that callers can add GPU fractions exactly
/// instead of accumulating floating-point error.
pub fn gpu_fraction_sevenths(profile_id: u32) -> Option<u8> {
    shape(profile_id).map(|s| s.compute_slices)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_start_keeps_the_instance_on_the_grid() {
        for s in &SHAPES {
            assert!(!s.starts.is_empty(), "profile {}", s.profile_id);
            for &start in s.starts {
                assert!(
                    start + s.memory_slices <= MEMORY_SLICES,
                    "profile {} at {start} runs off the grid",
                    s.profile_id
                );
            }
            assert!(s.compute_slices <= COMPUTE_SLICES);
            assert!(s.max_per_gpu as usize <= s.starts.len());
        }
    }

    #[test]
    fn ids_and_enums_are_unique_and_not_interchangeable() {
        let mut ids: Vec<u32> = SHAPES.iter().map(|s| s.profile_id).collect();
        let mut enums: Vec<u32> = SHAPES.iter().map(|s| s.nvml_enum).collect();
        ids.sort_unstable();
        ids.dedup();
        enums.sort_unstable();
        enums.dedup();
        assert_eq!(ids.len(), 7);
        assert_eq!(enums.len(), 7);
        // 9 is the 3g profile ID but the NVML enum of the 1g/2-memory profile.
        assert_eq!(shape(9).map(|s| s.compute_slices), Some(3));
        assert_eq!(shape_by_nvml_enum(9).map(|s| s.profile_id), Some(15));
        // NVML enum 1 (2_SLICE) is not a profile ID at all.
        assert!(shape(1).is_none());
        assert_eq!(shape_by_nvml_enum(1).map(|s| s.profile_id), Some(14));
    }

    #[test]
    fn fractions_are_compute_sevenths() {
        assert_eq!(gpu_fraction_sevenths(PROFILE_7G), Some(7));
        assert_eq!(gpu_fraction_sevenths(PROFILE_1G_MEM2), Some(1));
        assert_eq!(gpu_fraction_sevenths(PROFILE_3G), Some(3));
        assert_eq!(gpu_fraction_sevenths(42), None);
    }

    #[test]
    fn labels_distinguish_the_three_1g_profiles() {
        assert_eq!(shape(19).unwrap().label(), "1g (1/8 memory)");
        assert_eq!(shape(20).unwrap().label(), "1g+me (1/8 memory)");
        assert_eq!(shape(15).unwrap().label(), "1g (2/8 memory)");
    }
}
