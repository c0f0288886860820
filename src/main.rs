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

fn main() -> ExitCode {
    tablescan::cli::main()
}
