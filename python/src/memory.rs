//! Memory that Python hands us: buffer-protocol objects ([`PyBuf`]) and raw addresses checked
//! against a registry ([`Regions`]) of `register_buffer` ranges and `alloc_buffer` regions.
//!
//! An address is never dereferenced unless it lies inside a registered range (the caller
//! vouched for it) or inside one of our own shared-memory buffers. Memory inside an
//! `alloc_buffer` region becomes a shared-memory [`Span::Shm`], which the sidecar reads and
//! writes directly (no staging copy); anything else is plain memory, copied through staging
//! when it has to cross to the sidecar.

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::mem::MaybeUninit;

use pyo3::ffi;
use pyo3::prelude::*;
use regolith_client::share::{share_range, SharePolicy, Shared};
use regolith_client::{Dest, ShmBuffer, Source};

use crate::error::{Error, Result};

/// A held buffer export of a Python object (`PyObject_GetBuffer`), released on drop.
pub struct PyBuf {
    // Boxed: exporters may point fields of the view into the view itself.
    view: Box<ffi::Py_buffer>,
}

impl PyBuf {
    /// A C-contiguous byte view of `obj`, writable when asked.
    pub fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
        let flags: c_int = if writable {
            ffi::PyBUF_WRITABLE
        } else {
            ffi::PyBUF_SIMPLE
        };
        let mut view: Box<MaybeUninit<ffi::Py_buffer>> = Box::new(MaybeUninit::zeroed());
        // SAFETY: `view` is writable storage for one Py_buffer; the call fills it or fails with
        // a Python exception set.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: PyObject_GetBuffer succeeded, so the view is initialised.
        let view = unsafe { Box::from_raw(Box::into_raw(view).cast::<ffi::Py_buffer>()) };
        Ok(Self { view })
    }

    pub fn addr(&self) -> usize {
        self.view.buf as usize
    }

    pub fn len(&self) -> usize {
        usize::try_from(self.view.len).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The exported bytes.
    pub fn bytes(&self) -> &[u8] {
        let len = self.len();
        if len == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: the exporter guarantees `len` readable bytes at `buf` while the export is
        // held, which it is for as long as this borrow of `self` lives.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, len) }
    }

    /// The bytes, as a span: shared memory when they lie in an `alloc_buffer` region.
    pub fn span(&self, regions: &Regions, len: usize) -> Result<Span<'_>> {
        let len = self.checked_len(len)?;
        if let Some(span) = regions.shm_span(self.addr(), len) {
            return Ok(span);
        }
        Ok(Span::Bytes(&self.bytes()[..len]))
    }

    /// The bytes as a destination (the export must have been requested writable).
    pub fn span_mut(&mut self, regions: &Regions, len: usize) -> Result<SpanMut<'_>> {
        let len = self.checked_len(len)?;
        if let Some(Span::Shm { buf, offset, len }) = regions.shm_span(self.addr(), len) {
            return Ok(SpanMut::Shm { buf, offset, len });
        }
        if len == 0 || self.view.buf.is_null() {
            return Ok(SpanMut::Bytes(&mut []));
        }
        // SAFETY: as in `span`; the export was requested with PyBUF_WRITABLE, and the `&mut`
        // borrow of `self` keeps a second span of this export from being made.
        Ok(SpanMut::Bytes(unsafe {
            std::slice::from_raw_parts_mut(self.view.buf as *mut u8, len)
        }))
    }

    fn checked_len(&self, len: usize) -> Result<usize> {
        if len > self.len() {
            return Err(Error::InvalidArgument(format!(
                "size {len} exceeds the buffer's {} bytes",
                self.len()
            )));
        }
        Ok(len)
    }
}

impl Drop for PyBuf {
    fn drop(&mut self) {
        // SAFETY: the view holds an export obtained by PyObject_GetBuffer, released once here,
        // with the GIL held (attach is re-entrant).
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

/// The source of a put: one of our shared-memory buffers, or plain bytes.
pub enum Span<'a> {
    Shm {
        buf: ShmBuffer,
        offset: usize,
        len: usize,
    },
    Bytes(&'a [u8]),
}

impl Span<'_> {
    /// The bytes as plain memory (a shared-memory span viewed through this process's mapping):
    /// for pieces of a gather list, which the client copies itself.
    pub fn bytes(&self) -> &[u8] {
        match self {
            // SAFETY: `offset + len` was checked against the buffer when the span was made, and
            // the span holds a clone of the buffer, so the mapping outlives the borrow.
            Span::Shm { buf, offset, len } => unsafe {
                std::slice::from_raw_parts(buf.as_ptr().add(*offset), *len)
            },
            Span::Bytes(b) => b,
        }
    }

    pub fn source(&self) -> Source<'_> {
        match self {
            Span::Shm { buf, offset, len } => Source::Shm {
                buf,
                offset: *offset,
                len: *len,
            },
            Span::Bytes(b) => Source::Bytes(b),
        }
    }
}

/// The destination of a get.
pub enum SpanMut<'a> {
    Shm {
        buf: ShmBuffer,
        offset: usize,
        len: usize,
    },
    Bytes(&'a mut [u8]),
}

impl SpanMut<'_> {
    /// The destination as plain memory (see [`Span::bytes`]).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: as in `Span::bytes`; the `&mut` borrow of the span keeps a second view of
            // it from being made, and callers check a batch's pieces for overlaps.
            SpanMut::Shm { buf, offset, len } => unsafe {
                std::slice::from_raw_parts_mut(buf.as_ptr().add(*offset), *len)
            },
            SpanMut::Bytes(b) => b,
        }
    }

    pub fn dest(&mut self) -> Dest<'_> {
        match self {
            SpanMut::Shm { buf, offset, len } => Dest::Shm {
                buf,
                offset: *offset,
                len: *len,
            },
            SpanMut::Bytes(b) => Dest::Bytes(b),
        }
    }

    fn range(&self) -> (usize, usize) {
        match self {
            SpanMut::Shm { buf, offset, len } => (buf.as_ptr() as usize + offset, *len),
            SpanMut::Bytes(b) => (b.as_ptr() as usize, b.len()),
        }
    }
}

/// Whether any two non-empty destination ranges overlap (one get would write over another's
/// bytes); the indices of those that do.
pub fn overlapping(spans: &[Option<SpanMut<'_>>]) -> Vec<usize> {
    let mut ranges: Vec<(usize, usize, usize)> = spans
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.as_ref().map(|s| (s.range(), i)))
        .filter(|((_, len), _)| *len > 0)
        .map(|((start, len), i)| (start, start + len, i))
        .collect();
    ranges.sort_unstable();
    let mut bad = Vec::new();
    let mut reach = 0usize;
    let mut reach_idx = None;
    for (start, end, i) in ranges {
        if start < reach {
            bad.push(i);
            bad.extend(reach_idx.take());
        }
        if end > reach {
            reach = end;
            reach_idx = Some(i);
        }
    }
    bad.sort_unstable();
    bad.dedup();
    bad
}

/// Address ranges Python may name by address: `register_buffer` ranges and our own
/// shared-memory buffers.
#[derive(Default)]
pub struct Regions {
    /// `alloc_buffer` regions, by buffer id.
    shm: BTreeMap<u64, ShmBuffer>,
    /// Registered plain ranges: start → length.
    plain: BTreeMap<usize, usize>,
    /// The whole pages of registered ranges moved onto shared memory
    /// ([`regolith_client::share`]), by the registered start.
    adopted: BTreeMap<usize, ShmBuffer>,
}

impl Regions {
    pub fn add_shm(&mut self, id: u64, buf: ShmBuffer) {
        self.shm.insert(id, buf);
    }

    pub fn remove_shm(&mut self, id: u64) -> Option<ShmBuffer> {
        self.shm.remove(&id)
    }

    /// Forgets every range and buffer; answers the `alloc_buffer` buffers and the adopted
    /// ranges (to restore once the connection is gone).
    pub fn clear(&mut self) -> (Vec<ShmBuffer>, Vec<ShmBuffer>) {
        self.plain.clear();
        (
            std::mem::take(&mut self.shm).into_values().collect(),
            std::mem::take(&mut self.adopted).into_values().collect(),
        )
    }

    /// Moves the whole pages of the registered range at `addr` onto shared memory, when the
    /// policy and the memory allow it (`regolith_client::share`); otherwise answers why not. A
    /// range that cannot be shared stays registered as plain memory (staging copies).
    pub fn share(&mut self, addr: usize, policy: SharePolicy) -> std::result::Result<(), String> {
        let Some(&len) = self.plain.get(&addr) else {
            return Err("not registered".into());
        };
        if self.adopted.contains_key(&addr) {
            return Ok(());
        }
        match share_range(addr, len, policy) {
            Ok(Shared::Yes(buf)) => {
                self.adopted.insert(addr, buf);
                Ok(())
            }
            Ok(Shared::No(why)) => Err(why.into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Whether `addr` is the start of a registered range whose pages are shared.
    pub fn is_shared(&self, addr: usize) -> bool {
        self.adopted.contains_key(&addr)
    }

    /// Registers `[addr, addr+len)` (again: a second registration of a start address replaces
    /// the first).
    /// A shared range it replaced (registered again with another length) is answered, to be
    /// unregistered from the sidecar and restored.
    pub fn register(&mut self, addr: usize, len: usize) -> Result<Option<ShmBuffer>> {
        if addr == 0 || len == 0 || addr.checked_add(len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "cannot register {len} bytes at address {addr:#x}"
            )));
        }
        let old = self.plain.insert(addr, len);
        // A range registered again keeps its shared pages only if it is the same range and
        // still mapped from them: a caller that freed it and registers new memory that landed
        // at the same address must not have gets written into the old pages.
        let keep = old == Some(len) && self.adopted.get(&addr).is_some_and(|b| b.still_adopted());
        Ok(if keep {
            None
        } else {
            self.adopted.remove(&addr)
        })
    }

    /// Answers the range's shared pages, if any, to unregister from the sidecar and restore.
    pub fn unregister(&mut self, addr: usize) -> Result<Option<ShmBuffer>> {
        self.plain.remove(&addr).ok_or_else(|| {
            Error::InvalidArgument(format!("no buffer is registered at address {addr:#x}"))
        })?;
        Ok(self.adopted.remove(&addr))
    }

    /// A shared-memory span when `[addr, addr+len)` lies inside one of our buffers.
    fn shm_span(&self, addr: usize, len: usize) -> Option<Span<'static>> {
        self.shm
            .values()
            .chain(self.adopted.values())
            .find_map(|buf| {
                let offset = buf.offset_of(addr as *const u8, len)?;
                Some(Span::Shm {
                    buf: buf.clone(),
                    offset: usize::try_from(offset).ok()?,
                    len,
                })
            })
    }

    fn plain_contains(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.plain
            .range(..=addr)
            .rev()
            .any(|(&start, &n)| start + n >= end)
    }

    /// The memory at a raw address, refused unless registered or ours.
    pub fn span_at(&self, addr: usize, len: usize) -> Result<Span<'static>> {
        if let Some(span) = self.shm_span(addr, len) {
            return Ok(span);
        }
        if !self.plain_contains(addr, len) {
            return Err(Error::BadAddress { addr, len });
        }
        // SAFETY: the range lies inside memory the caller registered as valid (Mooncake's
        // `register_buffer` contract: it stays valid until unregistered); the span lives for
        // one call only.
        Ok(Span::Bytes(unsafe {
            std::slice::from_raw_parts(addr as *const u8, len)
        }))
    }

    /// A destination at a raw address, refused unless registered or ours.
    pub fn span_mut_at(&self, addr: usize, len: usize) -> Result<SpanMut<'static>> {
        match self.span_at(addr, len)? {
            Span::Shm { buf, offset, len } => Ok(SpanMut::Shm { buf, offset, len }),
            // SAFETY: as in `span_at`; registered memory is writable by the caller's contract,
            // and callers check a batch's destinations for overlaps before use.
            Span::Bytes(b) => Ok(SpanMut::Bytes(unsafe {
                std::slice::from_raw_parts_mut(b.as_ptr() as *mut u8, b.len())
            })),
        }
    }
}
