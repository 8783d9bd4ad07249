//! Raw views of shared memory: the crate's one place for turning mapped memory into slices.
//!
//! Segment, staging and client-registered memory is mapped `MAP_SHARED` and written both by this
//! process and by local clients, so Rust's borrow rules cannot see who else touches it. What keeps
//! accesses apart is the protocol: the metadata leader never hands out overlapping extents
//! (design §3, invariant 2), a writer owns its reserved extent until it commits, and a committed
//! extent is immutable until it is freed after its read leases expire. Code that turns a
//! [`RawRange`] into a slice states which of those rules makes it sound.

use std::ptr::NonNull;

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
