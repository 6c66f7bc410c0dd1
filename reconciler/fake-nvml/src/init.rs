//! `nvmlInit_v2`, `nvmlShutdown`, `nvmlErrorString`, `nvmlSystemGetDriverVersion`.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::*;
use tessera_mig::NvmlReturn;

use crate::ffi::*;
use crate::state::FakeState;

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    let mut init = lock();
    // A real NVML with no kernel driver answers DRIVER_NOT_LOADED; a stand-in with no state
    // is the same situation.
    let loaded = state_path().and_then(|p| FakeState::load(&p));
    if let Err(e) = loaded {
        eprintln!("fake libnvidia-ml: nvmlInit_v2: {e}");
        return DRIVER_NOT_LOADED;
    }
    *init += 1;
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let mut init = lock();
    if *init == 0 {
        return UNINITIALIZED;
    }
    *init -= 1;
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    NvmlReturn::from_raw(result).message().as_ptr()
}

/// # Safety
/// `version` is null or valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call("nvmlSystemGetDriverVersion", None, false, |st| {
        let text = st.driver.version.clone();
        // SAFETY: NVML's contract on `version`.
        unsafe { put_str(version, length, &text) }
    })
}
