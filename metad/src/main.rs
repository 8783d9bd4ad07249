//! `regolith-metad`: one replica of the metadata service. See docs/metad.md.

// jemalloc returns freed memory to the OS over time; with glibc's allocator the churn of Raft
// entries left tens of MB of free-but-resident heap beside a large state (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (read by jemalloc at start-up): a background thread returns dirty pages
/// after a second instead of holding them for ten.
#[repr(transparent)]
pub struct MallocConf(*const std::ffi::c_char);
// SAFETY: a pointer to an immutable, NUL-terminated static string.
unsafe impl Sync for MallocConf {}
#[export_name = "_rjem_malloc_conf"]
pub static MALLOC_CONF: MallocConf =
    MallocConf(c"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:1000".as_ptr());

fn main() -> std::process::ExitCode {
    regolith_metad::metrics::heap_is_jemalloc();
    regolith_metad::run::main_with_args(std::env::args().collect())
}
