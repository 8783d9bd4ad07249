//! Shared memory on the client side: the sidecar's segment and this connection's staging area
//! (memfds received at hello), and buffers the client allocates and registers with the sidecar
//! ([`ShmBuffer`], `alloc_buffer`).
//!
//! All raw memory access of the crate is here: a [`Mapping`] hands out bounds-checked copies in
//! and out, fused with the checksum, never references that could outlive the call.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{fallocate, fcntl, FallocateFlags, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::stat::fstat;
use regolith_proto::checksum;

use crate::error::{Error, Result};

/// A memfd mapped shared into this process.
#[derive(Debug)]
pub struct Mapping {
    fd: OwnedFd,
    map: Option<MmapRaw>,
    /// The start of caller memory moved onto this memfd ([`crate::share`]): mapped there by
    /// the caller's range, never unmapped by us.
    adopted: Option<usize>,
    len: u64,
}

// SAFETY: the mapping is plain shared memory; every access goes through the bounds-checked
// copy methods below, which take `&self` and copy with raw pointers (no Rust references to the
// shared bytes are handed out), so concurrent use from several threads is no more than
// concurrent memcpy into distinct or racing ranges of shared memory.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps a memfd received from the sidecar, with its size from `fstat`.
    pub fn from_fd(fd: OwnedFd, what: &str) -> Result<Self> {
        let st = fstat(fd.as_raw_fd())
            .map_err(|e| Error::Shm(format!("fstat of the {what} memfd: {e}")))?;
        let len = u64::try_from(st.st_size)
            .map_err(|_| Error::Shm(format!("{what} memfd has a negative size")))?;
        let map = if len == 0 {
            None
        } else {
            Some(
                MmapOptions::new()
                    .len(len as usize)
                    .map_raw(&fd)
                    .map_err(|e| Error::Shm(format!("mapping the {what} ({len} bytes): {e}")))?,
            )
        };
        Ok(Self {
            fd,
            map,
            adopted: None,
            len,
        })
    }

    /// The memfd that now backs the caller's `[start, start+len)` ([`crate::share`]).
    pub(crate) fn adopted(fd: OwnedFd, start: usize, len: u64) -> Self {
        Self {
            fd,
            map: None,
            adopted: Some(start),
            len,
        }
    }

    /// Creates a memfd of `size` bytes, allocates its pages (no SIGBUS later), seals it against
    /// shrinking (the sidecar maps it too) and maps it.
    pub fn create(size: u64, name: &str) -> Result<Self> {
        if size == 0 {
            return Err(Error::InvalidArgument(
                "a shared buffer needs a size > 0".into(),
            ));
        }
        let cname = std::ffi::CString::new(format!("regolith-client-{name}"))
            .map_err(|_| Error::InvalidArgument("buffer name contains NUL".into()))?;
        let fd = memfd_create(
            &cname,
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .map_err(|e| Error::Shm(format!("memfd_create: {e}")))?;
        fallocate(fd.as_raw_fd(), FallocateFlags::empty(), 0, size as i64)
            .map_err(|e| Error::Shm(format!("allocating {size} bytes of shared memory: {e}")))?;
        fcntl(
            fd.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )
        .map_err(|e| Error::Shm(format!("sealing the shared buffer: {e}")))?;
        Self::from_fd(fd, name)
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Base address (null when empty).
    pub fn base(&self) -> *mut u8 {
        if let Some(start) = self.adopted {
            return start as *mut u8;
        }
        self.map
            .as_ref()
            .map(|m| m.as_mut_ptr())
            .unwrap_or(std::ptr::null_mut())
    }

    /// Whether `[ptr, ptr+len)` lies inside this mapping; its offset if so.
    pub fn offset_of(&self, ptr: *const u8, len: usize) -> Option<u64> {
        let base = self.base() as usize;
        let p = ptr as usize;
        if base == 0 || p < base {
            return None;
        }
        let off = (p - base) as u64;
        (off.checked_add(len as u64)? <= self.len).then_some(off)
    }

    fn check(&self, offset: u64, len: u64) -> Result<*mut u8> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.base().wrapping_add(offset as usize)),
            _ => Err(Error::Protocol(format!(
                "range {offset}+{len} is outside the mapping of {} bytes",
                self.len
            ))),
        }
    }

    /// Populates the page tables (so transfers take no first-touch faults); best effort.
    pub fn prefault(&self) {
        if let Some(m) = &self.map {
            let _ = m.advise(memmap2::Advice::WillNeed);
            // SAFETY: the range is exactly this live mapping; MADV_POPULATE_WRITE only faults pages in.
            unsafe {
                nix::libc::madvise(
                    m.as_mut_ptr() as *mut _,
                    m.len(),
                    23, /* MADV_POPULATE_WRITE */
                );
            }
        }
    }

    /// Copies `src` to `offset`, hashing each checksum chunk right after it is copied; the
    /// mapped range starts on a chunk boundary of the object. Returns nothing; hashes go to `out`.
    pub fn write_hashed(&self, offset: u64, src: &[u8], seed: u64, out: &mut [u64]) -> Result<()> {
        let dst = self.check(offset, src.len() as u64)?;
        // SAFETY: `check` proved [dst, dst+len) is inside the live mapping. The slice lives only
        // for this call; other processes may write the same shared bytes concurrently, which is
        // why readers verify checksums.
        let d = unsafe { std::slice::from_raw_parts_mut(dst, src.len()) };
        checksum::par_copy_and_hash(seed, d, src, out);
        Ok(())
    }

    /// Copies `dst.len()` bytes from `offset` out, hashing each chunk right after copying it.
    pub fn read_hashed(
        &self,
        offset: u64,
        dst: &mut [u8],
        seed: u64,
        out: &mut [u64],
    ) -> Result<()> {
        let src = self.check(offset, dst.len() as u64)?;
        // SAFETY: as in `write_hashed`; the bytes are copied into private memory before use.
        let s = unsafe { std::slice::from_raw_parts(src, dst.len()) };
        checksum::par_copy_and_hash(seed, dst, s, out);
        Ok(())
    }

    /// A view of `len` bytes at `offset`.
    ///
    /// # Safety
    /// The view aliases shared memory that other processes may write; the caller copies out of
    /// it (or hashes it) at once and keeps no reference beyond the call that needed it.
    pub(crate) unsafe fn slice(&self, offset: u64, len: u64) -> Result<&[u8]> {
        let p = self.check(offset, len)?;
        // SAFETY: bounds checked; see the function's contract.
        Ok(unsafe { std::slice::from_raw_parts(p, len as usize) })
    }

    /// A writable view of `len` bytes at `offset`.
    ///
    /// # Safety
    /// As [`Mapping::slice`], and no other view of the same range may be alive.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, offset: u64, len: u64) -> Result<&mut [u8]> {
        let p = self.check(offset, len)?;
        // SAFETY: bounds checked; see the function's contract.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, len as usize) })
    }

    /// Plain copy in.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let dst = self.check(offset, src.len() as u64)?;
        // SAFETY: bounds checked by `check`; source and destination cannot overlap (the source
        // is caller memory outside this range, or the caller passes disjoint ranges).
        unsafe { std::ptr::copy(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Plain copy out.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let src = self.check(offset, dst.len() as u64)?;
        // SAFETY: bounds checked by `check`.
        unsafe { std::ptr::copy(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// A copy of `len` bytes at `offset`.
    pub fn read_vec(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len as usize];
        self.read(offset, &mut v)?;
        Ok(v)
    }
}

/// A buffer in shared memory that the sidecar can read and write directly (`alloc_buffer`):
/// puts from it and gets into it involve no copy through staging.
#[derive(Clone, Debug)]
pub struct ShmBuffer {
    pub(crate) inner: Arc<ShmInner>,
}

#[derive(Debug)]
pub(crate) struct ShmInner {
    pub(crate) map: Mapping,
    /// (session id, shm id) of the registration with the current sidecar connection.
    pub(crate) reg: parking_lot::Mutex<Option<(u64, u64)>>,
}

impl ShmBuffer {
    pub(crate) fn new(map: Mapping) -> Self {
        Self {
            inner: Arc::new(ShmInner {
                map,
                reg: parking_lot::Mutex::new(None),
            }),
        }
    }

    pub fn len(&self) -> usize {
        self.inner.map.len() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Start of the buffer. Valid (and writable) for as long as any clone of this buffer lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.map.base()
    }

    /// Copies bytes in at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.inner.map.write(offset as u64, src)
    }

    /// Copies bytes out from `offset`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.inner.map.read(offset as u64, dst)
    }

    /// Whether `[ptr, ptr+len)` lies inside this buffer; its offset if so.
    pub fn offset_of(&self, ptr: *const u8, len: usize) -> Option<u64> {
        self.inner.map.offset_of(ptr, len)
    }

    /// Whether this buffer is caller memory moved onto shared memory ([`crate::share`]).
    pub fn is_adopted(&self) -> bool {
        self.inner.map.adopted.is_some()
    }

    /// Moves adopted caller memory back onto private memory with the same bytes (the caller
    /// unregistered it); answers whether it did. A no-op for other buffers.
    pub fn restore_private(&self) -> bool {
        match self.inner.map.adopted {
            Some(start) => crate::share::restore_private(self.inner.map.fd(), start, self.len()),
            None => false,
        }
    }

    /// For adopted caller memory: whether its range is still mapped from this buffer's memfd
    /// (false once the caller freed it and something else lives there).
    pub fn still_adopted(&self) -> bool {
        match self.inner.map.adopted {
            Some(start) => crate::share::still_mapped(self.inner.map.fd(), start, self.len()),
            None => false,
        }
    }
}
