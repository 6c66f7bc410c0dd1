//! `nvmlInit_v2`, `nvmlShutdown`, `nvmlErrorString`.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::*;

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
    let s: &'static std::ffi::CStr = match result {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        GPU_IS_LOST => c"GPU is lost",
        IN_USE => c"In use by another client",
        INSUFFICIENT_RESOURCES => c"Insufficient resources",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}
