//! Raw views of shared memory: the crate's one place for turning mapped memory into slices.
//!
//! Segment, staging and client-registered memory is mapped `MAP_SHARED` and written both by this
//! process and by local clients, so Rust's borrow rules cannot see who else touches it. What keeps
//! accesses apart is the protocol: the metadata leader never hands out overlapping extents
//! (design §3, invariant 2), a writer owns its reserved extent until it commits, and a committed
//! extent is immutable until it is freed after its read leases expire. Code that turns a
//! [`RawRange`] into a slice states which of those rules makes it sound.
//!
//! The data-plane server does not make slices at all: [`recv_into`] and [`send_from`] hand the
//! kernel a pointer into the mapping, as a NIC's DMA would. A misbehaving peer writing the same
//! bytes over two connections then garbles data (which the checksum catches) but cannot make
//! this process's behaviour undefined.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use memmap2::MmapRaw;
use nix::libc;

/// A bounds-checked `(pointer, length)` into a live mapping (see [`crate::segment::Segment::range`]).
///
/// It does not keep the mapping alive: whoever uses it must hold the owning `Segment` (usually
/// through an `Arc`) for as long as the range or any slice made from it is in use.
#[derive(Clone, Copy, Debug)]
pub struct RawRange {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a RawRange is an address and a length; the memory it names is shared memory whose
// concurrent use is governed by the rules in the module doc, not by which thread holds it.
unsafe impl Send for RawRange {}
// SAFETY: as above; `&RawRange` gives no access beyond what `RawRange` (Copy) gives.
unsafe impl Sync for RawRange {}

impl RawRange {
    /// Only [`crate::segment`] makes ranges, from a mapping and a checked offset/length.
    pub(crate) fn new(ptr: NonNull<u8>, len: usize) -> Self {
        Self { ptr, len }
    }

    /// An empty range (valid for zero-length slices).
    pub fn empty() -> Self {
        Self {
            ptr: NonNull::dangling(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The range as a shared slice.
    ///
    /// # Safety
    /// The mapping must outlive `'a`, and no one may write the range while the slice is used
    /// (e.g. a committed object, which is immutable until its leases expire).
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        // SAFETY: ptr/len come from a live mapping, checked against its bounds when the range
        // was made; the caller upholds lifetime and aliasing.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The range as an exclusive slice.
    ///
    /// # Safety
    /// The mapping must outlive `'a`, and the caller must be the range's only user while the
    /// slice is in use (e.g. the holder of the reservation of this extent).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice<'a>(&self) -> &'a mut [u8] {
        // SAFETY: as for `as_slice`, with exclusivity upheld by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Bounds-checks `[offset, offset + len)` against `map` and returns its start.
fn window(map: &MmapRaw, offset: usize, len: usize) -> io::Result<*mut u8> {
    match offset.checked_add(len) {
        Some(end) if end <= map.len() => Ok(map.as_mut_ptr().wrapping_add(offset)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "[{offset}, +{len}) outside a mapping of {} bytes",
                map.len()
            ),
        )),
    }
}

/// One non-blocking `recv(2)` of up to `len` bytes from `sock` into `map` at `offset`.
pub(crate) fn recv_into(
    map: &MmapRaw,
    offset: usize,
    len: usize,
    sock: BorrowedFd<'_>,
) -> io::Result<usize> {
    let ptr = window(map, offset, len)?;
    // SAFETY: `[ptr, ptr + len)` lies inside the mapping, which `map` keeps alive for the call;
    // the kernel writes at most `len` bytes there.
    let n = unsafe { libc::recv(sock.as_raw_fd(), ptr.cast(), len, libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Copies `src` into `map` at `offset` through the mapping's pointer, making no slice of the
/// shared memory (the TLS data plane's counterpart of [`recv_into`]: the bytes arrive
/// decrypted in a buffer of ours, not from the kernel).
pub(crate) fn copy_into(map: &MmapRaw, offset: usize, src: &[u8]) -> io::Result<()> {
    let ptr = window(map, offset, src.len())?;
    // SAFETY: `[ptr, ptr + src.len())` lies inside the live mapping; `src` is private memory
    // of this process, so the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr, src.len()) };
    Ok(())
}

/// Copies `dst.len()` bytes of `map` at `offset` into `dst` (the counterpart of [`send_from`]).
pub(crate) fn copy_from(map: &MmapRaw, offset: usize, dst: &mut [u8]) -> io::Result<()> {
    let ptr = window(map, offset, dst.len())?;
    // SAFETY: as in `copy_into`, reading the mapping.
    unsafe { std::ptr::copy_nonoverlapping(ptr.cast_const(), dst.as_mut_ptr(), dst.len()) };
    Ok(())
}

/// One non-blocking `send(2)` of up to `len` bytes of `map` at `offset` to `sock`.
pub(crate) fn send_from(
    map: &MmapRaw,
    offset: usize,
    len: usize,
    sock: BorrowedFd<'_>,
) -> io::Result<usize> {
    let ptr = window(map, offset, len)?;
    // SAFETY: as in `recv_into`; the kernel only reads the range.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            ptr.cast_const().cast(),
            len,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
