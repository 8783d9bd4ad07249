//! Memory shared with local clients and served to remote sidecars: the node's segment, a
//! client's staging area, or a memfd a client registered.
//!
//! A segment is a memfd so that it can be handed to clients over the UDS (SCM_RIGHTS) and sent
//! from with `sendfile`. Its pages are allocated with `fallocate` at creation, so a client that
//! touches any byte of its mapping never takes a SIGBUS and the memory is charged to the sidecar
//! up front; it is then sealed against shrinking and growing, because every client holds the fd
//! and a client calling `ftruncate` would otherwise make the sidecar itself fault. The mapping is
//! pre-faulted once at start (first-touch faults are slow; doing them during transfers would
//! show up as latency).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Instant;

use memmap2::{Advice, MmapOptions, MmapRaw};
use nix::fcntl::{fallocate, fcntl, FallocateFlags, FcntlArg, SealFlag};
use nix::libc;
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::stat::fstat;
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::mem::{self, RawRange};

/// Whether to back a new segment with hugetlb pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HugePages {
    /// Huge pages when enough are free, normal pages (with a log line) otherwise.
    #[default]
    Auto,
    Never,
    /// Fail when huge pages cannot back the whole segment.
    Require,
}

/// Options for [`Segment::create`].
#[derive(Clone, Copy, Debug)]
pub struct SegmentOptions {
    pub huge_pages: HugePages,
    /// Populate the page tables at creation (in parallel) so that no access faults later.
    pub prefault: bool,
    /// Allocate the pages at creation (`fallocate`: memory charged up front, no SIGBUS ever).
    /// Off for staging areas, which are sized generously and touched only as far as used: the
    /// file is only sized (`ftruncate`), pages come on first touch.
    pub allocate: bool,
}

impl Default for SegmentOptions {
    fn default() -> Self {
        Self {
            huge_pages: HugePages::Auto,
            prefault: true,
            allocate: true,
        }
    }
}

/// Options for [`Segment::from_fd`].
#[derive(Clone, Copy, Debug)]
pub struct MapOptions {
    pub prefault: bool,
    /// Refuse an fd that is not sealed against shrinking: its owner could truncate it under
    /// the mapping and make this process fault.
    pub require_shrink_seal: bool,
}

impl Default for MapOptions {
    fn default() -> Self {
        Self {
            prefault: false,
            require_shrink_seal: true,
        }
    }
}

/// The pages backing a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    Normal,
    Huge { page_size: u64 },
}

/// A mapped memfd with bounds-checked access.
#[derive(Debug)]
pub struct Segment {
    name: String,
    fd: OwnedFd,
    map: Option<MmapRaw>,
    len: u64,
    pages: PageKind,
}

impl Segment {
    /// Creates, allocates, seals and maps a memfd of `size` bytes (rounded up to the huge page
    /// size when huge pages back it). A size of 0 makes an empty segment (a consumer-only node):
    /// it still has an fd, so callers need no special case, but no memory.
    pub fn create(name: &str, size: u64, opts: &SegmentOptions) -> Result<Self> {
        let cname =
            CString::new(format!("regolith-{name}")).map_err(|_| Error::SegmentInvalid {
                name: name.into(),
                reason: "name contains a NUL byte".into(),
            })?;
        let (fd, len, pages) = if size == 0 {
            (new_memfd(name, &cname, false)?, 0, PageKind::Normal)
        } else if !opts.allocate {
            let fd = new_memfd(name, &cname, false)?;
            nix::unistd::ftruncate(&fd, size as i64).map_err(|e| sys(name, "ftruncate", e))?;
            (fd, size, PageKind::Normal)
        } else {
            allocate(name, &cname, size, opts.huge_pages)?
        };
        seal_size(name, &fd);
        let map = map_fd(name, &fd, len, opts.prefault)?;
        Ok(Self {
            name: name.into(),
            fd,
            map,
            len,
            pages,
        })
    }

    /// Maps an fd received from a client (SCM_RIGHTS); its size comes from `fstat`.
    pub fn from_fd(name: &str, fd: OwnedFd, opts: &MapOptions) -> Result<Self> {
        let st = fstat(fd.as_raw_fd()).map_err(|e| sys(name, "fstat", e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(invalid(name, "not a regular file (memfd expected)"));
        }
        let len = u64::try_from(st.st_size).map_err(|_| invalid(name, "negative size"))?;
        if opts.require_shrink_seal {
            let seals = fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS)
                .map(SealFlag::from_bits_truncate)
                .map_err(|e| sys(name, "F_GET_SEALS", e))?;
            if !seals.contains(SealFlag::F_SEAL_SHRINK) {
                return Err(invalid(
                    name,
                    "memfd is not sealed with F_SEAL_SHRINK (its owner could truncate it)",
                ));
            }
        }
        let map = map_fd(name, &fd, len, opts.prefault)?;
        Ok(Self {
            name: name.into(),
            fd,
            map,
            len,
            pages: PageKind::Normal,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn page_kind(&self) -> PageKind {
        self.pages
    }

    /// The memfd, to pass to clients or to `sendfile` from.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Checks `[offset, offset + len)` against the segment and returns it as a raw range.
    pub fn range(&self, offset: u64, len: u64) -> Result<RawRange> {
        let out = || Error::OutOfRange {
            name: self.name.clone(),
            offset,
            len,
            size: self.len,
        };
        let end = offset.checked_add(len).ok_or_else(out)?;
        if end > self.len {
            return Err(out());
        }
        let Some(map) = &self.map else {
            return Ok(RawRange::empty());
        };
        if len == 0 {
            return Ok(RawRange::empty());
        }
        // In bounds of the mapping, which is `self.len` bytes long, so the add cannot wrap.
        let ptr = map.as_mut_ptr().wrapping_add(offset as usize);
        let ptr = NonNull::new(ptr).ok_or_else(out)?;
        Ok(RawRange::new(ptr, len as usize))
    }

    /// One non-blocking `recv` from `sock` into `[offset, offset + len)`, straight into the
    /// mapping (no Rust reference to the memory is made). `WouldBlock` when nothing is queued.
    pub fn recv_at(&self, sock: BorrowedFd<'_>, offset: u64, len: usize) -> std::io::Result<usize> {
        match &self.map {
            Some(map) if len > 0 => mem::recv_into(map, to_usize(offset)?, len, sock),
            _ if len == 0 => Ok(0),
            _ => Err(std::io::ErrorKind::InvalidInput.into()),
        }
    }

    /// One non-blocking `send` of `[offset, offset + len)` to `sock`, straight from the mapping.
    pub fn send_at(&self, sock: BorrowedFd<'_>, offset: u64, len: usize) -> std::io::Result<usize> {
        match &self.map {
            Some(map) if len > 0 => mem::send_from(map, to_usize(offset)?, len, sock),
            _ if len == 0 => Ok(0),
            _ => Err(std::io::ErrorKind::InvalidInput.into()),
        }
    }

    /// Copies `src` into the segment at `offset`, through the mapping (no slice is made).
    pub fn write_at(&self, offset: u64, src: &[u8]) -> std::io::Result<()> {
        match &self.map {
            Some(map) => mem::copy_into(map, to_usize(offset)?, src),
            None if src.is_empty() => Ok(()),
            None => Err(std::io::ErrorKind::InvalidInput.into()),
        }
    }

    /// Copies `dst.len()` bytes of the segment at `offset` into `dst`.
    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> std::io::Result<()> {
        match &self.map {
            Some(map) => mem::copy_from(map, to_usize(offset)?, dst),
            None if dst.is_empty() => Ok(()),
            None => Err(std::io::ErrorKind::InvalidInput.into()),
        }
    }

    /// `[offset, offset + len)` as a shared slice.
    ///
    /// # Safety
    /// Nobody may write the range while the slice is used (see [`crate::mem`]).
    pub unsafe fn slice(&self, offset: u64, len: u64) -> Result<&[u8]> {
        let r = self.range(offset, len)?;
        // SAFETY: the mapping lives as long as `&self`; the caller upholds aliasing.
        Ok(unsafe { r.as_slice() })
    }

    /// `[offset, offset + len)` as an exclusive slice.
    ///
    /// # Safety
    /// The caller must be the range's only user while the slice is used (see [`crate::mem`]).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: u64, len: u64) -> Result<&mut [u8]> {
        let r = self.range(offset, len)?;
        // SAFETY: the mapping lives as long as `&self`; the caller upholds exclusivity.
        Ok(unsafe { r.as_mut_slice() })
    }
}

fn to_usize(offset: u64) -> std::io::Result<usize> {
    usize::try_from(offset).map_err(|_| std::io::ErrorKind::InvalidInput.into())
}

fn sys(name: &str, op: &'static str, e: nix::errno::Errno) -> Error {
    Error::SegmentSys {
        name: name.into(),
        op,
        source: e.into(),
    }
}

fn invalid(name: &str, reason: &str) -> Error {
    Error::SegmentInvalid {
        name: name.into(),
        reason: reason.into(),
    }
}

fn new_memfd(name: &str, cname: &CString, huge: bool) -> Result<OwnedFd> {
    let mut flags = MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING;
    if huge {
        flags |= MemFdCreateFlag::MFD_HUGETLB;
    }
    memfd_create(cname, flags).map_err(|e| sys(name, "memfd_create", e))
}

/// Allocates the memfd's pages, huge ones when asked for and available.
fn allocate(
    name: &str,
    cname: &CString,
    size: u64,
    huge: HugePages,
) -> Result<(OwnedFd, u64, PageKind)> {
    if huge != HugePages::Never {
        match try_huge(name, cname, size) {
            Ok(r) => return Ok(r),
            Err(e) if huge == HugePages::Require => return Err(e),
            Err(e) => info!(
                segment = name,
                "huge pages unavailable ({e}); using normal pages"
            ),
        }
    }
    let fd = new_memfd(name, cname, false)?;
    fallocate_timed(name, &fd, size)?;
    Ok((fd, size, PageKind::Normal))
}

fn try_huge(name: &str, cname: &CString, size: u64) -> Result<(OwnedFd, u64, PageKind)> {
    let (page, free_pages) = huge_page_info().ok_or_else(|| invalid(name, "no hugetlb support"))?;
    let rounded = size.div_ceil(page) * page;
    if free_pages * page < rounded {
        return Err(invalid(
            name,
            &format!(
                "{} MiB of huge pages needed, {} MiB free",
                rounded >> 20,
                (free_pages * page) >> 20
            ),
        ));
    }
    let fd = new_memfd(name, cname, true)?;
    fallocate_timed(name, &fd, rounded)?;
    Ok((fd, rounded, PageKind::Huge { page_size: page }))
}

/// `(Hugepagesize, HugePages_Free)` from /proc/meminfo.
fn huge_page_info() -> Option<(u64, u64)> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |key: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let page_kib = field("Hugepagesize:")?;
    let free = field("HugePages_Free:")?;
    (page_kib > 0).then_some((page_kib * 1024, free))
}

fn fallocate_timed(name: &str, fd: &OwnedFd, len: u64) -> Result<()> {
    let len_off = i64::try_from(len).map_err(|_| invalid(name, "size too large"))?;
    let t = Instant::now();
    fallocate(fd.as_raw_fd(), FallocateFlags::empty(), 0, len_off)
        .map_err(|e| sys(name, "fallocate", e))?;
    info!(
        segment = name,
        bytes = len,
        ms = t.elapsed().as_millis() as u64,
        "segment memory allocated"
    );
    Ok(())
}

/// Seals the size: clients hold the fd, and a shrink would make the sidecar fault.
fn seal_size(name: &str, fd: &OwnedFd) {
    let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
    if let Err(e) = fcntl(fd.as_raw_fd(), FcntlArg::F_ADD_SEALS(seals)) {
        warn!(
            segment = name,
            "cannot seal segment size ({e}); a client could truncate it"
        );
    }
}

fn map_fd(name: &str, fd: &OwnedFd, len: u64, prefault: bool) -> Result<Option<MmapRaw>> {
    if len == 0 {
        return Ok(None);
    }
    let len_usize =
        usize::try_from(len).map_err(|_| invalid(name, "size exceeds the address space"))?;
    let map = MmapOptions::new()
        .len(len_usize)
        .map_raw(fd.as_raw_fd())
        .map_err(|e| Error::SegmentSys {
            name: name.into(),
            op: "mmap",
            source: e,
        })?;
    if prefault {
        prefault_parallel(name, &map)?;
    }
    Ok(Some(map))
}

/// Populates every page table entry of the mapping now, in parallel: 4 KiB faults cost a few
/// microseconds each here (about 1 GB/s on one core), so a large segment would otherwise take
/// minutes of first-touch faults spread over its first transfers.
fn prefault_parallel(name: &str, map: &MmapRaw) -> Result<()> {
    let t = Instant::now();
    let len = map.len();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(len.div_ceil(PREFAULT_MIN_PER_THREAD))
        .max(1);
    // Ranges are multiples of 2 MiB, so they split neither normal nor huge pages.
    let step = len.div_ceil(threads).div_ceil(PREFAULT_ALIGN) * PREFAULT_ALIGN;
    let results: Vec<std::io::Result<()>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..len)
            .step_by(step)
            .map(|off| {
                let n = step.min(len - off);
                sc.spawn(move || map.advise_range(Advice::PopulateWrite, off, n))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("prefault thread panicked")))
            })
            .collect()
    });
    if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
        // Kernels before 5.14 lack MADV_POPULATE_WRITE; the memory is still allocated, only
        // its first touches will be slower.
        warn!(
            segment = name,
            "cannot pre-fault segment ({e}); first accesses will fault"
        );
        return Ok(());
    }
    let secs = t.elapsed().as_secs_f64();
    info!(
        segment = name,
        bytes = len,
        threads,
        ms = (secs * 1e3) as u64,
        gb_per_s = format!("{:.2}", len as f64 / secs.max(1e-9) / 1e9),
        "segment pre-faulted"
    );
    Ok(())
}

/// Smallest share of a pre-fault worth a thread of its own.
const PREFAULT_MIN_PER_THREAD: usize = 64 << 20;
const PREFAULT_ALIGN: usize = 2 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::uio::pread;
    use nix::unistd::{dup, ftruncate};
    use std::os::fd::FromRawFd;

    fn seg(size: u64) -> Segment {
        Segment::create("test", size, &SegmentOptions::default()).unwrap()
    }

    #[test]
    fn memory_is_the_memfd() {
        let s = seg(4 << 20);
        assert_eq!(s.len(), 4 << 20);
        // SAFETY: test-local segment, single user.
        let w = unsafe { s.slice_mut(1 << 20, 5).unwrap() };
        w.copy_from_slice(b"hello");
        let mut buf = [0u8; 5];
        pread(s.fd(), &mut buf, 1 << 20).unwrap();
        assert_eq!(&buf, b"hello");
        let st = fstat(s.fd().as_raw_fd()).unwrap();
        assert_eq!(st.st_size, 4 << 20);
    }

    #[test]
    fn size_is_sealed() {
        let s = seg(1 << 20);
        assert!(ftruncate(s.fd(), 0).is_err());
        assert!(ftruncate(s.fd(), 2 << 20).is_err());
    }

    #[test]
    fn bounds_are_checked() {
        let s = seg(1 << 20);
        assert!(s.range(0, 1 << 20).is_ok());
        assert!(s.range(1 << 20, 0).is_ok());
        assert!(s.range(1, 1 << 20).is_err());
        assert!(s.range(u64::MAX, 2).is_err());
        assert!(s.range(2 << 20, 0).is_err());
        let e = s.range(7, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("test") && e.contains('7'), "{e}");
    }

    #[test]
    fn empty_segment() {
        let s = seg(0);
        assert!(s.is_empty());
        assert!(s.range(0, 0).unwrap().is_empty());
        assert!(s.range(0, 1).is_err());
    }

    #[test]
    fn received_fd_maps_the_same_memory() {
        let s = seg(1 << 20);
        // SAFETY: test-local segment, single user.
        unsafe { s.slice_mut(100, 3).unwrap() }.copy_from_slice(b"abc");
        let raw = dup(s.fd().as_raw_fd()).unwrap();
        // SAFETY: `dup` returned a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let m = Segment::from_fd("client", fd, &MapOptions::default()).unwrap();
        assert_eq!(m.len(), 1 << 20);
        // SAFETY: nobody writes the range concurrently in this test.
        assert_eq!(unsafe { m.slice(100, 3).unwrap() }, b"abc");
    }

    #[test]
    fn unsealed_fd_is_refused_unless_allowed() {
        let fd = memfd_create(c"unsealed", MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        ftruncate(&fd, 8192).unwrap();
        let raw = dup(fd.as_raw_fd()).unwrap();
        // SAFETY: fresh descriptor from `dup`.
        let fd2 = unsafe { OwnedFd::from_raw_fd(raw) };
        assert!(Segment::from_fd("c", fd, &MapOptions::default()).is_err());
        let opts = MapOptions {
            require_shrink_seal: false,
            prefault: true,
        };
        assert_eq!(Segment::from_fd("c", fd2, &opts).unwrap().len(), 8192);
    }

    #[test]
    fn auto_huge_pages_fall_back() {
        let s = Segment::create(
            "auto",
            3 << 20,
            &SegmentOptions {
                huge_pages: HugePages::Auto,
                prefault: true,
                allocate: true,
            },
        )
        .unwrap();
        match s.page_kind() {
            PageKind::Normal => assert_eq!(s.len(), 3 << 20),
            PageKind::Huge { page_size } => assert_eq!(s.len() % page_size, 0),
        }
    }
}
