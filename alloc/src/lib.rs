//! The global allocator of tessera's binaries and benches ([`Allocator`]): mimalloc, with the
//! memory a cycle frees kept committed for [`PURGE_DELAY`] rather than mimalloc's default of
//! one second.
//!
//! Why: a cycle at 50,000 GPUs builds and drops some 800 MB of problem, fleet and decision.
//! Returned to the OS one second after it is freed, it is faulted back in, page by page, by
//! the next full cycle, which the service runs when the repository or the fleet changes, often
//! more than a second later: at 12.5× the reference fleet the warm cycle spent a third of its
//! time zeroing pages in the kernel, and its time varied by 2× from one run to the next
//! (BENCHMARKS.md, "Fleet scale"). Kept for a minute, longer than the repository's fetch
//! interval, the working set stays committed while the service cycles and is returned once
//! it idles. The peak is the same; the resident size stays near it between cycles.
//!
//! An operator's `MIMALLOC_PURGE_DELAY` wins: the delay is set only where the environment
//! does not set it. The libraries never choose an allocator; the tests run on the system's.

use std::alloc::{GlobalAlloc, Layout};
use std::os::raw::{c_int, c_long};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mimalloc::MiMalloc;

/// How long memory freed stays committed before mimalloc returns it to the OS.
pub const PURGE_DELAY: Duration = Duration::from_secs(60);

/// `mi_option_purge_delay` in the `mi_option_t` enum of the mimalloc that `libmimalloc-sys`
/// bundles (v3, `include/mimalloc.h`), which its bindings do not name. A test reads the
/// options on either side of it to check the index.
const MI_OPTION_PURGE_DELAY: c_int = 15;

unsafe extern "C" {
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set(option: c_int, value: c_long);
}

static CONFIGURED: AtomicBool = AtomicBool::new(false);

/// mimalloc, configured on its first allocation (see the crate's documentation): a binary
/// that names it as its `#[global_allocator]` cannot forget the configuration.
pub struct Allocator;

impl Allocator {
    #[inline]
    fn configure(&self) {
        if !CONFIGURED.load(Ordering::Relaxed) {
            configure();
        }
    }
}

#[cold]
fn configure() {
    CONFIGURED.store(true, Ordering::Relaxed);
    // `std::env::var_os` allocates, which would enter the allocator again: libc's `getenv`
    // reads the environment in place.
    // SAFETY: the name is a NUL-terminated literal; the environment is not written while the
    // first allocation runs (no thread has started yet).
    let set = unsafe { !libc_getenv(c"MIMALLOC_PURGE_DELAY".as_ptr()).is_null() };
    if !set {
        let millis = c_long::try_from(PURGE_DELAY.as_millis()).unwrap_or(c_long::MAX);
        // SAFETY: a plain store into mimalloc's option table, valid at any time.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, millis) };
    }
}

unsafe extern "C" {
    #[link_name = "getenv"]
    fn libc_getenv(name: *const std::os::raw::c_char) -> *const std::os::raw::c_char;
}

// SAFETY: every call is mimalloc's, whose `GlobalAlloc` meets the trait's contract.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.configure();
        // SAFETY: forwarded as received.
        unsafe { MiMalloc.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.configure();
        // SAFETY: forwarded as received.
        unsafe { MiMalloc.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as received.
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

/// mimalloc's purge delay now, in milliseconds (`-1`: never).
pub fn purge_delay_millis() -> c_long {
    // SAFETY: a plain read of mimalloc's option table.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The tests run on the system allocator: mimalloc's option table is there all the same.
    #[test]
    fn the_index_is_mimallocs_purge_delay() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some()
            || std::env::var_os("MIMALLOC_USE_NUMA_NODES").is_some()
            || std::env::var_os("MIMALLOC_EAGER_COMMIT_DELAY").is_some()
        {
            return;
        }
        // Its neighbours' defaults and its own: eager_commit_delay (14) is 1, use_numa_nodes
        // (16) is 0, and the purge delay is 1,000 ms until set (configured, 60,000).
        // SAFETY: plain reads of mimalloc's option table.
        unsafe {
            assert_eq!(mi_option_get(14), 1);
            assert_eq!(mi_option_get(16), 0);
        }
        // Mimalloc's default, or this crate's if the other test's allocation came first.
        assert!(
            [1000, 60_000].contains(&purge_delay_millis()),
            "{}",
            purge_delay_millis()
        );
        configure();
        assert_eq!(purge_delay_millis(), 60_000);
    }

    #[test]
    fn it_allocates_as_mimalloc() {
        let layout = Layout::from_size_align(4096, 64).unwrap();
        // SAFETY: a non-zero layout, freed with the same.
        unsafe {
            let p = Allocator.alloc_zeroed(layout);
            assert!(!p.is_null());
            assert_eq!(p as usize % 64, 0);
            assert!(std::slice::from_raw_parts(p, 4096).iter().all(|&b| b == 0));
            let q = Allocator.realloc(p, layout, 8192);
            assert!(!q.is_null());
            Allocator.dealloc(q, Layout::from_size_align(8192, 64).unwrap());
        }
    }
}
