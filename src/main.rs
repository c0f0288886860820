//! The `tablescan` command: the custom handler itself plus developer commands.

use std::process::ExitCode;

/// mimalloc instead of the C library's allocator. The handler allocates per row (entities are
/// strings and JSON maps), and the release build for Azure is static musl, whose allocator is
/// slow; with glibc, the simulator spent about 60 % of its time in malloc/free on cache misses
/// (2.5-3x slower overall than with mimalloc). Built with `no_thp`: mimalloc otherwise asks for
/// transparent huge pages on its arenas, which doubled the handler's peak RSS in `tablescan
/// bench` (65 vs 31 MiB for a 5,000-row prefix copy) and cost CPU zeroing 2 MiB pages.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc's `mimalloc.h` (the same in its v2 and v3, which the
/// `mimalloc` crate builds; `libmimalloc-sys` has no constant for it).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

extern "C" {
    /// mimalloc's `void mi_option_set(mi_option_t option, long value)`, in the library the
    /// `mimalloc` crate links.
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

fn main() -> ExitCode {
    // Memory freed is given back to the OS at once rather than after mimalloc's default of 1 s
    // (v3): a lookup's large reads (index directories up to 16 MiB) freed and allocated again
    // within a second otherwise added up in the resident set, +95 MiB of peak RSS over forged
    // indexes against +32 MiB with no delay (docs/development.md, Measurements). The
    // environment's `MIMALLOC_PURGE_DELAY` still wins, for measuring.
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: called once, first thing in `main`, before any other thread exists (the
        // option is a plain store, not thread-safe); the option and value are valid.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    }
    tablescan::cli::main()
}
