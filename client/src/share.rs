//! Sharing memory the caller registered (`register_buffer`) with the sidecar, so that gets into
//! it and puts from it take no staging copy.
//!
//! The pages of a registered range are private to the caller's process: the sidecar cannot
//! reach them, so every byte used to cross through the connection's staging area (one more
//! copy on each remote get and put). [`share_range`] moves the whole pages of the range onto a
//! memfd in place: for each chunk, the bytes are copied into the memfd and the memfd is mapped
//! over the chunk (`MAP_FIXED`), at the same address. The caller's pointers stay valid and see
//! the same bytes; the memory is now shared with the sidecar, which writes gets into it and
//! reads puts from it directly. [`ShmBuffer::restore_private`] moves them back onto private
//! memory at `unregister_buffer` (unless a GPU driver has been loaded since, which may have
//! pinned them: they then stay shared, which is harmless).
//!
//! It changes what the range is, so it is done only where that is safe:
//! * the range's pages are plain private anonymous memory (no file, no device, not shared);
//! * no GPU driver is loaded in the process (`auto`): memory pinned for DMA
//!   (`cudaHostRegister`) keeps the old physical pages, and the device would read and write
//!   pages the process no longer sees. `REGOLITH_SHARE_REGISTERED=1` overrides that check,
//!   `=0` turns sharing off;
//! * the caller does not write the range from another thread while it is being registered
//!   (such a write may be lost; Mooncake's users register at start-up), and a process that
//!   forks afterwards shares the range with its child instead of copying it.

use std::fs;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::sys::stat::fstat;
use std::sync::OnceLock;

use nix::fcntl::{fallocate, fcntl, FallocateFlags, FcntlArg, SealFlag};
use nix::libc;
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};

use crate::error::{Error, Result};
use crate::shm::{Mapping, ShmBuffer};

/// Ranges with fewer whole pages than this stay private (staging costs little there).
pub const MIN_SHARED_BYTES: usize = 1 << 20;
/// Bytes moved per step: the extra memory the move needs at any time.
const CHUNK: usize = 64 << 20;
/// The memfd's name; `/proc/self/maps` shows it, which is how a restore finds its own mapping.
const MEMFD_NAME: &str = "regolith-client-registered";

/// Whether registered memory is shared (`REGOLITH_SHARE_REGISTERED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharePolicy {
    /// Shared unless a GPU driver is loaded in the process (the default).
    Auto,
    On,
    Off,
}

impl SharePolicy {
    /// `REGOLITH_SHARE_REGISTERED`: `auto` (or unset), `1`/`true`/`on`, `0`/`false`/`off`;
    /// anything else is `auto`, with a warning.
    pub fn from_env() -> Self {
        static POLICY: OnceLock<SharePolicy> = OnceLock::new();
        *POLICY.get_or_init(|| {
            let v = std::env::var("REGOLITH_SHARE_REGISTERED").unwrap_or_default();
            Self::parse(&v).unwrap_or_else(|| {
                tracing::warn!(value = %v, "REGOLITH_SHARE_REGISTERED is auto, 1 or 0; using auto");
                SharePolicy::Auto
            })
        })
    }

    pub fn parse(v: &str) -> Option<Self> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Some(SharePolicy::Auto),
            "1" | "true" | "on" | "yes" => Some(SharePolicy::On),
            "0" | "false" | "off" | "no" => Some(SharePolicy::Off),
            _ => None,
        }
    }
}

/// One line of `/proc/self/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MapLine {
    start: usize,
    end: usize,
    /// `rw-p`, `r-xp`, `rw-s`, ...
    perms: String,
    inode: u64,
    path: String,
}

fn parse_maps(text: &str) -> Vec<MapLine> {
    text.lines().filter_map(parse_map_line).collect()
}

fn parse_map_line(line: &str) -> Option<MapLine> {
    let mut f = line.split_ascii_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let perms = f.next()?.to_string();
    let _offset = f.next()?;
    let _dev = f.next()?;
    let inode = f.next()?.parse().ok()?;
    let path = f.collect::<Vec<_>>().join(" ");
    Some(MapLine {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        perms,
        inode,
        path,
    })
}

/// Libraries whose presence means memory may be pinned for a device's DMA.
const GPU_DRIVERS: &[&str] = &[
    "libcuda.so",
    "/dev/nvidia",
    "libamdhip64",
    "libhsa-runtime",
    "libze_loader",
];

fn gpu_driver_loaded(maps: &[MapLine]) -> bool {
    maps.iter()
        .any(|m| GPU_DRIVERS.iter().any(|d| m.path.contains(d)))
}

/// Whether `[a, b)` is covered, without a gap, by mappings that satisfy `ok`.
fn covered_by(maps: &[MapLine], a: usize, b: usize, ok: impl Fn(&MapLine) -> bool) -> bool {
    let mut at = a;
    for m in maps {
        if m.end <= at {
            continue;
        }
        if m.start > at || !ok(m) {
            return false;
        }
        at = m.end;
        if at >= b {
            return true;
        }
    }
    false
}

fn private_anonymous(m: &MapLine) -> bool {
    m.perms.starts_with("rw") && m.perms.ends_with('p') && m.inode == 0 && {
        m.path.is_empty() || m.path == "[heap]"
    }
}

/// A shared mapping of our memfd with inode `ino`.
fn ours(m: &MapLine, ino: u64) -> bool {
    m.perms.ends_with('s') && m.inode == ino && m.path.starts_with(&format!("/memfd:{MEMFD_NAME}"))
}

/// Whether `[at, at+len)` is still wholly mapped from the memfd `fd` (a caller that freed the
/// range and mapped something else there has not).
pub(crate) fn still_mapped(fd: BorrowedFd<'_>, at: usize, len: usize) -> bool {
    let Ok(st) = fstat(fd.as_raw_fd()) else {
        return false;
    };
    let Ok(text) = fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let ino = st.st_ino;
    covered_by(&parse_maps(&text), at, at + len, |m| ours(m, ino))
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// The whole pages of `[addr, addr+len)`.
pub fn whole_pages(addr: usize, len: usize) -> Option<(usize, usize)> {
    let page = page_size();
    let start = addr.checked_add(page - 1)? / page * page;
    let end = addr.checked_add(len)? / page * page;
    (end > start).then(|| (start, end - start))
}

/// Why a range was not shared (for the log), or the shared buffer over its whole pages.
pub enum Shared {
    Yes(ShmBuffer),
    No(&'static str),
}

/// Moves the whole pages of `[addr, addr+len)` onto a memfd, in place (module docs). The
/// caller vouches that the range is its memory (it registered it).
pub fn share_range(addr: usize, len: usize, policy: SharePolicy) -> Result<Shared> {
    if policy == SharePolicy::Off {
        return Ok(Shared::No("REGOLITH_SHARE_REGISTERED=0"));
    }
    let Some((start, n)) = whole_pages(addr, len).filter(|&(_, n)| n >= MIN_SHARED_BYTES) else {
        return Ok(Shared::No("fewer whole pages than the minimum"));
    };
    let maps = parse_maps(
        &fs::read_to_string("/proc/self/maps")
            .map_err(|e| Error::Shm(format!("reading /proc/self/maps: {e}")))?,
    );
    if policy == SharePolicy::Auto && gpu_driver_loaded(&maps) {
        return Ok(Shared::No(
            "a GPU driver is loaded (its pinned memory must not move)",
        ));
    }
    if !covered_by(&maps, start, start + n, private_anonymous) {
        return Ok(Shared::No("not plain private anonymous memory"));
    }
    let cname = std::ffi::CString::new(MEMFD_NAME)
        .map_err(|_| Error::Shm("memfd name contains NUL".into()))?;
    let fd = memfd_create(
        &cname,
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )
    .map_err(|e| Error::Shm(format!("memfd_create: {e}")))?;
    let mut off = 0usize;
    while off < n {
        let step = CHUNK.min(n - off);
        if let Err(e) = move_chunk(fd.as_raw_fd(), start + off, off, step) {
            // The chunks moved so far hold the same bytes as before: leave them shared but
            // unregistered, and say so.
            return Err(Error::Shm(format!(
                "sharing {n} bytes at {start:#x}: {e} (after {off} bytes)"
            )));
        }
        off += step;
    }
    // The sidecar maps only memfds that cannot shrink under it.
    fcntl(
        fd.as_raw_fd(),
        FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
    )
    .map_err(|e| Error::Shm(format!("sealing the shared registered memory: {e}")))?;
    let map = Mapping::adopted(fd, start, n as u64);
    Ok(Shared::Yes(ShmBuffer::new(map)))
}

/// Copies `[at, at+len)` into the memfd at `off` and maps the memfd there over it.
fn move_chunk(fd: i32, at: usize, off: usize, len: usize) -> std::io::Result<()> {
    let off_t = libc::off_t::try_from(off).map_err(std::io::Error::other)?;
    let len_t = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: a valid memfd; allocating its pages first turns memory exhaustion into an
    // error here rather than a SIGBUS at the copy.
    fallocate(fd, FallocateFlags::empty(), off_t, len_t).map_err(std::io::Error::from)?;
    // SAFETY: maps `len` bytes of the memfd at a fresh address chosen by the kernel.
    let tmp = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            off_t,
        )
    };
    if tmp == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `[at, at+len)` is mapped readable (checked against /proc/self/maps, and it is
    // the caller's registered memory); `tmp` is our fresh mapping of `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(at as *const u8, tmp as *mut u8, len) };
    // SAFETY: moves our mapping onto `[at, at+len)`, replacing the pages there in one step
    // (the bytes are equal); `tmp` no longer exists afterwards.
    let moved = unsafe {
        libc::mremap(
            tmp,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            at as *mut libc::c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        // SAFETY: `tmp` is still our mapping when the move failed.
        unsafe { libc::munmap(tmp, len) };
        return Err(e);
    }
    Ok(())
}

/// Moves `[at, at+len)` back onto private anonymous memory with the same bytes, when the
/// range is still wholly our memfd mapping (a caller that freed it may have reused the
/// addresses: those are left alone). Answers whether it did.
pub(crate) fn restore_private(fd: BorrowedFd<'_>, at: usize, len: usize) -> bool {
    if !still_mapped(fd, at, len) {
        return false;
    }
    // A GPU driver loaded since registration may have pinned these pages: moving them now
    // would leave the device with pages the process no longer sees. Shared, they stay valid.
    if SharePolicy::from_env() == SharePolicy::Auto
        && fs::read_to_string("/proc/self/maps").is_ok_and(|t| gpu_driver_loaded(&parse_maps(&t)))
    {
        return false;
    }
    let mut off = 0;
    while off < len {
        let step = CHUNK.min(len - off);
        if let Err(e) = restore_chunk(at + off, step) {
            tracing::warn!(addr = at + off, len = step, error = %e, "registered memory stays shared");
            return false;
        }
        off += step;
    }
    true
}

fn restore_chunk(at: usize, len: usize) -> std::io::Result<()> {
    // SAFETY: a fresh private anonymous mapping chosen by the kernel.
    let tmp = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `[at, at+len)` is our memfd mapping (checked), `tmp` our fresh one.
    unsafe { std::ptr::copy_nonoverlapping(at as *const u8, tmp as *mut u8, len) };
    // SAFETY: as in `move_chunk`.
    let moved = unsafe {
        libc::mremap(
            tmp,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            at as *mut libc::c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        // SAFETY: `tmp` is still ours.
        unsafe { libc::munmap(tmp, len) };
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
5581a000-5581c000 r--p 00000000 fd:01 123 /usr/bin/python3.11
5581c000-55a00000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000400000 rw-p 00000000 00:00 0
7f0000400000-7f0000800000 rw-p 00000000 00:00 0
7f0000800000-7f0000900000 rw-s 00000000 00:01 77 /memfd:regolith-client-registered (deleted)
7f0000900000-7f0000a00000 r--p 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
";

    #[test]
    fn maps_lines_parse() {
        let m = parse_maps(MAPS);
        assert_eq!(m.len(), 6);
        assert_eq!(m[1].path, "[heap]");
        assert_eq!(m[2].start, 0x7f00_0000_0000);
        assert_eq!(m[4].path, "/memfd:regolith-client-registered (deleted)");
        assert!(ours(&m[4], 77));
        assert!(!ours(&m[4], 78), "another memfd");
        assert!(!ours(&m[2], 0));
    }

    #[test]
    fn only_gapless_private_anonymous_ranges_qualify() {
        let m = parse_maps(MAPS);
        // Two adjacent anonymous mappings: one range.
        assert!(covered_by(
            &m,
            0x7f00_0010_0000,
            0x7f00_0070_0000,
            private_anonymous
        ));
        // Runs into the shared memfd.
        assert!(!covered_by(
            &m,
            0x7f00_0070_0000,
            0x7f00_0088_0000,
            private_anonymous
        ));
        // A file mapping.
        assert!(!covered_by(&m, 0x5581_a000, 0x5581_b000, private_anonymous));
        // Unmapped.
        assert!(!covered_by(&m, 0x1000, 0x2000, private_anonymous));
        assert!(covered_by(&m, 0x5581_d000, 0x5581_f000, private_anonymous));
    }

    #[test]
    fn a_gpu_driver_is_noticed() {
        let mut m = parse_maps(MAPS);
        assert!(!gpu_driver_loaded(&m));
        m.push(parse_map_line("7f1-7f2 r-xp 0 fd:01 5 /usr/lib/libcuda.so.550.54").unwrap());
        assert!(gpu_driver_loaded(&m));
    }

    #[test]
    fn policy_parses() {
        assert_eq!(SharePolicy::parse(""), Some(SharePolicy::Auto));
        assert_eq!(SharePolicy::parse("ON"), Some(SharePolicy::On));
        assert_eq!(SharePolicy::parse("0"), Some(SharePolicy::Off));
        assert_eq!(SharePolicy::parse("maybe"), None);
    }

    #[test]
    fn whole_pages_round_inwards() {
        let p = page_size();
        assert_eq!(whole_pages(p + 1, 3 * p), Some((2 * p, 2 * p)));
        assert_eq!(whole_pages(p, 3 * p), Some((p, 3 * p)));
        assert_eq!(whole_pages(1, p), None);
        assert_eq!(whole_pages(p + 10, 20), None, "inside one page");
    }

    /// A vector's pages moved onto a memfd keep their bytes, take writes through the old
    /// pointer, are visible through the memfd, and move back.
    #[test]
    fn a_range_moves_onto_shared_memory_and_back_with_its_bytes() {
        let len = 4 << 20;
        let mut v: Vec<u8> = (0..len + 8192).map(|i| (i * 7 % 251) as u8).collect();
        let expect = v.clone();
        let addr = v.as_mut_ptr() as usize;
        let Shared::Yes(buf) = share_range(addr, v.len(), SharePolicy::On).unwrap() else {
            panic!("a heap vector was not shared");
        };
        let (start, n) = whole_pages(addr, v.len()).unwrap();
        assert_eq!(buf.as_ptr() as usize, start);
        assert_eq!(buf.len(), n);
        assert_eq!(v, expect, "bytes changed by the move");
        // Written through the old pointer, read through the memfd (another mapping of it).
        let off = start - addr;
        v[off + 100] = 0xAB;
        let fd_map =
            Mapping::from_fd(buf.inner.map.fd().try_clone_to_owned().unwrap(), "test").unwrap();
        let mut b = [0u8; 1];
        fd_map.read(100, &mut b).unwrap();
        assert_eq!(b[0], 0xAB);
        // And the other way.
        fd_map.write(200, &[0xCD]).unwrap();
        assert_eq!(v[off + 200], 0xCD);
        assert!(buf.still_adopted());
        assert!(buf.restore_private());
        assert!(!buf.still_adopted());
        let maps = parse_maps(&fs::read_to_string("/proc/self/maps").unwrap());
        assert!(covered_by(&maps, start, start + n, private_anonymous));
        assert_eq!(v[off + 100], 0xAB);
        assert_eq!(v[off + 200], 0xCD);
        // Restored memory is private again: the memfd no longer sees writes.
        v[off + 300] = 1;
        fd_map.read(300, &mut b).unwrap();
        assert_ne!(b[0], 1);
    }

    /// A caller that freed a shared range and got other memory at the same addresses: the old
    /// buffer knows it no longer maps them and leaves the new memory alone.
    #[test]
    fn memory_mapped_over_a_shared_range_is_not_taken_for_it() {
        let len = 2 << 20;
        let mut v = vec![5u8; len + 8192];
        let addr = v.as_mut_ptr() as usize;
        let Shared::Yes(buf) = share_range(addr, v.len(), SharePolicy::On).unwrap() else {
            panic!("not shared");
        };
        let (start, n) = (buf.as_ptr() as usize, buf.len());
        // SAFETY: replaces pages of our own vector with fresh private zero pages.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(p as usize, start);
        assert!(!buf.still_adopted());
        v[start - addr] = 9;
        assert!(
            !buf.restore_private(),
            "restored over memory that is not ours"
        );
        assert_eq!(v[start - addr], 9, "the new memory was touched");
        assert_eq!(v[start - addr + 1], 0);
    }

    #[test]
    fn off_and_small_ranges_stay_private() {
        let mut v = vec![0u8; 8192];
        let addr = v.as_mut_ptr() as usize;
        assert!(matches!(
            share_range(addr, v.len(), SharePolicy::On).unwrap(),
            Shared::No(_)
        ));
        let mut big = vec![0u8; 4 << 20];
        let addr = big.as_mut_ptr() as usize;
        assert!(matches!(
            share_range(addr, big.len(), SharePolicy::Off).unwrap(),
            Shared::No(_)
        ));
        big[0] = 1;
    }
}
