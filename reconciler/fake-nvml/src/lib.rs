//! A stand-in `libnvidia-ml.so`: the NVML C functions the `nvml` node driver calls, with
//! NVML's signatures (taken from `nvml-wrapper-sys`, the bindings the driver calls through),
//! structs and return codes, answering from a JSON state file instead of a GPU.
//!
//! No machine this project runs on has an NVIDIA GPU; without this library the real driver
//! would only ever be compiled. Loaded with `Nvml::builder().lib_path(..)`, it lets the driver
//! run through its real FFI in CI.
//!
//! - State: the file named by `TESSERA_FAKE_NVML_STATE` ([`state::FakeState`]), read at every
//!   call and written back after every change. Each GPU is a [`tessera_mig::device::MigDevice`],
//!   the same rule model the `sim` driver wraps, so both answer `IN_USE`,
//!   `INSUFFICIENT_RESOURCES`, `NOT_SUPPORTED` and `GPU_IS_LOST` under one set of rules.
//! - Faults: listed in the same file ([`state::FakeFault`]): a call that fails, a GPU that is
//!   lost, a reset that is refused. An instance held by a process is plain state: a process
//!   in the file with that instance as its scope.
//! - Driver behaviour: where real drivers differ or where the driver could share a
//!   misunderstanding with this library, the answer follows evidence (nvml.h, a real H100 on
//!   driver 580.159.04; see ARCHITECTURE.md) and, where drivers differ, a knob in the state
//!   file ([`state::DriverTraits`]): the version, the process entry size (24, or 32 as drivers
//!   535.43 to 535.86 write), the empty MIG slot's answer, the MIG capabilities the caller
//!   holds. Placements are every placement of the profile, whatever is occupied (nvml.h).
//! - Foreign instances ([`state::ForeignInstance`]): GPU instances of profiles the catalog does
//!   not know, listed and occupying their slices, never changed.
//! - Exported: only the functions the driver calls. nvml-wrapper resolves every symbol lazily,
//!   per call (`FailedToLoadSymbol` for a missing one), so the rest need no stubs.
//! - Reset: NVML has no reset call of its own; `nvmlDeviceSetMigMode` attempts the reset that
//!   activates the mode and reports its outcome in `activationStatus` (the mode stays pending
//!   when it fails). The fake does the same, through `MigDevice::reset`.
//! - GPM ([`state::FakeGpm`]): support per GPU, sample buffers, samples of a GPU or a MIG
//!   instance, and `SM_UTIL`/`SM_OCCUPANCY` between two samples, from the state file; a GPU
//!   without it answers as a pre-Hopper GPU does (not supported).
//! - Compute instances: only the full-size one per GPU instance (what tessera creates and
//!   `MigDevice` models); asking for a smaller compute instance profile is `NOT_SUPPORTED`.

// NVML's own names, so that each export reads as nvml.h declares it.
#![allow(non_snake_case)]

mod device;
mod ffi;
mod gpm;
mod handle;
mod init;
mod instances;
mod signatures;
pub mod state;

pub use ffi::full_compute_instance_profile;
