//! What the driver's version says about how it answers.
//!
//! `nvmlDeviceGetComputeRunningProcesses_v3` is declared to fill `nvmlProcessInfo_t`, 24 bytes
//! (pid, used memory, GPU and compute instance ids). Drivers 535.43 to 535.86 write 32-byte
//! entries through the same symbol (a trailing `usedGpuCcProtectedMemory`), as the CUDA 12.2
//! `nvml.h` briefly declared; later R535 releases and every driver since went back to 24. Reading
//! those entries at 24 bytes misreads every entry after the first (nvitop PR 79, pynvml PR 48,
//! go-nvml issue 75). Driver 580.159.04 writes 24 (measured on an H100; see ARCHITECTURE.md).

/// The bytes between process entries a driver of this version writes.
pub fn process_info_stride(version: &str) -> usize {
    let mut parts = version.trim().split('.').map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(535)), Some(Ok(minor))) if (43..=86).contains(&minor) => WIDE_PROCESS_INFO,
        _ => PROCESS_INFO,
    }
}

/// `sizeof(nvmlProcessInfo_t)` as nvml.h declares it.
pub const PROCESS_INFO: usize = 24;
/// The entry drivers 535.43 to 535.86 write.
pub const WIDE_PROCESS_INFO: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_early_r535_drivers_write_wide_entries() {
        let cases = [
            ("535.43.02", 32),
            ("535.54.03", 32),
            ("535.86.10", 32),
            ("535.98", 24),
            ("535.104.05", 24),
            ("530.30.02", 24),
            ("550.127.08", 24),
            ("580.159.04", 24),
            // Unreadable: nvml.h's size, which every other driver writes.
            ("", 24),
            ("r535", 24),
        ];
        for (version, want) in cases {
            assert_eq!(process_info_stride(version), want, "{version}");
        }
    }

    #[test]
    fn the_declared_entry_is_the_bindings_struct() {
        assert_eq!(
            std::mem::size_of::<nvml_wrapper_sys::bindings::nvmlProcessInfo_t>(),
            PROCESS_INFO
        );
    }
}
