//! MIG geometry for tessera: the placement rules of NVIDIA Multi-Instance GPU
//! and the catalog of GPU models.
//!
//! The policy compiler, the solver and the node drivers must agree on exactly
//! which instance layouts a GPU accepts; if each carried its own copy of the
//! rules they would drift, and a plan the solver accepts would fail on the
//! node. Everything here is pure and deterministic so that the same inputs
//! produce byte-identical plans on every run.
//!
//! Profiles are identified by their NVML *profile ID* (the number that
//! `nvmlDeviceCreateGpuInstance` and placement queries take), never by name:
//! names vary by model and driver version and are only display strings and
//! input aliases (see [`catalog`]).

pub mod catalog;
pub mod device;
pub mod enumerate;
pub mod fit;
pub mod nvml_return;
pub mod placement;
pub mod shape;

pub use catalog::{GpuModel, MigProfiles, builtin_model, builtin_models, builtins};
pub use device::{DeviceError, MigDevice};
pub use enumerate::{
    all_layouts, all_profile_ids, maximal_layout_multisets, maximal_layouts, maximal_multisets,
    placeable_multisets, profile_multiset,
};
pub use fit::{FitError, place, place_additions, place_with, possible_placements};
pub use nvml_return::NvmlReturn;
pub use placement::{GeometryError, Placement, validate};
pub use shape::{
    COMPUTE_SLICES, MEMORY_SLICES, PROFILE_1G, PROFILE_1G_ME, PROFILE_1G_MEM2, PROFILE_2G,
    PROFILE_3G, PROFILE_4G, PROFILE_7G, SHAPES, Shape, gpu_fraction_sevenths, shape,
    shape_by_nvml_enum,
};
