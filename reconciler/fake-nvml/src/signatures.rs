//! The exported functions have exactly the types of the `NvmlLib` fields the driver calls
//! through: checked by the compiler on every build, so a signature that drifts from
//! `nvml-wrapper-sys` (and so from `nvml.h`) does not build.

use nvml_wrapper_sys::bindings::NvmlLib;

use crate::device::*;
use crate::gpm::*;
use crate::init::*;
use crate::instances::*;

/// Never called: type-checking it is the check.
#[allow(dead_code)]
fn exports_have_the_bindings_types(lib: &NvmlLib) {
    fn same<T, E>(_: &Result<T, E>, _: T) {}
    same(&lib.nvmlComputeInstanceDestroy, nvmlComputeInstanceDestroy);
    same(
        &lib.nvmlComputeInstanceGetInfo_v2,
        nvmlComputeInstanceGetInfo_v2,
    );
    same(
        &lib.nvmlDeviceCreateGpuInstanceWithPlacement,
        nvmlDeviceCreateGpuInstanceWithPlacement,
    );
    same(
        &lib.nvmlDeviceGetComputeInstanceId,
        nvmlDeviceGetComputeInstanceId,
    );
    same(
        &lib.nvmlDeviceGetComputeRunningProcesses_v3,
        nvmlDeviceGetComputeRunningProcesses_v3,
    );
    same(&lib.nvmlDeviceGetCount_v2, nvmlDeviceGetCount_v2);
    same(
        &lib.nvmlDeviceGetGpuInstanceById,
        nvmlDeviceGetGpuInstanceById,
    );
    same(&lib.nvmlDeviceGetGpuInstanceId, nvmlDeviceGetGpuInstanceId);
    same(
        &lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2,
        nvmlDeviceGetGpuInstancePossiblePlacements_v2,
    );
    same(
        &lib.nvmlDeviceGetGpuInstanceProfileInfo,
        nvmlDeviceGetGpuInstanceProfileInfo,
    );
    same(&lib.nvmlDeviceGetGpuInstances, nvmlDeviceGetGpuInstances);
    same(
        &lib.nvmlDeviceGetHandleByIndex_v2,
        nvmlDeviceGetHandleByIndex_v2,
    );
    same(
        &lib.nvmlDeviceGetMaxMigDeviceCount,
        nvmlDeviceGetMaxMigDeviceCount,
    );
    same(&lib.nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo);
    same(
        &lib.nvmlDeviceGetMigDeviceHandleByIndex,
        nvmlDeviceGetMigDeviceHandleByIndex,
    );
    same(&lib.nvmlDeviceGetMigMode, nvmlDeviceGetMigMode);
    same(
        &lib.nvmlDeviceGetUtilizationRates,
        nvmlDeviceGetUtilizationRates,
    );
    same(&lib.nvmlDeviceGetName, nvmlDeviceGetName);
    same(&lib.nvmlGpmQueryDeviceSupport, nvmlGpmQueryDeviceSupport);
    same(&lib.nvmlGpmSampleAlloc, nvmlGpmSampleAlloc);
    same(&lib.nvmlGpmSampleFree, nvmlGpmSampleFree);
    same(&lib.nvmlGpmSampleGet, nvmlGpmSampleGet);
    same(&lib.nvmlGpmMigSampleGet, nvmlGpmMigSampleGet);
    same(&lib.nvmlGpmMetricsGet, nvmlGpmMetricsGet);
    same(&lib.nvmlDeviceGetUUID, nvmlDeviceGetUUID);
    same(
        &lib.nvmlDeviceIsMigDeviceHandle,
        nvmlDeviceIsMigDeviceHandle,
    );
    same(&lib.nvmlDeviceSetMigMode, nvmlDeviceSetMigMode);
    same(&lib.nvmlErrorString, nvmlErrorString);
    same(
        &lib.nvmlGpuInstanceCreateComputeInstance,
        nvmlGpuInstanceCreateComputeInstance,
    );
    same(&lib.nvmlGpuInstanceDestroy, nvmlGpuInstanceDestroy);
    same(
        &lib.nvmlGpuInstanceGetComputeInstanceById,
        nvmlGpuInstanceGetComputeInstanceById,
    );
    same(
        &lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
        nvmlGpuInstanceGetComputeInstanceProfileInfo,
    );
    same(
        &lib.nvmlGpuInstanceGetComputeInstances,
        nvmlGpuInstanceGetComputeInstances,
    );
    same(&lib.nvmlGpuInstanceGetInfo, nvmlGpuInstanceGetInfo);
    same(&lib.nvmlInitWithFlags, nvmlInitWithFlags);
    same(&lib.nvmlInit_v2, nvmlInit_v2);
    same(&lib.nvmlShutdown, nvmlShutdown);
    same(&lib.nvmlSystemGetDriverVersion, nvmlSystemGetDriverVersion);
}
