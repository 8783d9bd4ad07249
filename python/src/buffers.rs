//! Buffer objects handed to Python, both exporting the buffer protocol (`memoryview(x)`,
//! `numpy.frombuffer(x, ...)`, `torch.frombuffer(x, ...)`):
//! * [`Buffer`] — shared memory from `alloc_buffer`, registered with the sidecar: puts from it
//!   and gets into it involve no staging copy;
//! * [`BufferHandle`] — a private copy of an object (`get_buffer`, `batch_get_buffer`), never
//!   a view into the segment.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Weak;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use regolith_client::ShmBuffer;

use crate::client::Shared;
use crate::error::Result;

/// Fills a buffer-protocol view over `len` writable bytes at `ptr`, owned by `obj`.
///
/// # Safety
/// `view` comes from the interpreter's getbuffer call; `ptr..ptr+len` stays valid and writable
/// for as long as `obj` lives (the view holds a reference to it).
unsafe fn fill_view(
    obj: &Bound<'_, PyAny>,
    view: *mut ffi::Py_buffer,
    ptr: *mut u8,
    len: usize,
    flags: c_int,
) -> PyResult<()> {
    let len = ffi::Py_ssize_t::try_from(len)
        .map_err(|_| pyo3::exceptions::PyBufferError::new_err("buffer too large"))?;
    // SAFETY: per the function's contract; PyBuffer_FillInfo takes a new reference to `obj`.
    let rc = unsafe { ffi::PyBuffer_FillInfo(view, obj.as_ptr(), ptr.cast(), len, 0, flags) };
    if rc != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    Ok(())
}

/// Shared memory registered with the sidecar (`Client.alloc_buffer`). The memory stays mapped
/// for as long as this object (or a view of it) lives; `free()` only ends the registration.
#[pyclass(module = "regolith._native", name = "Buffer", frozen)]
pub struct Buffer {
    buf: ShmBuffer,
    id: u64,
    owner: Weak<Shared>,
    freed: AtomicBool,
}

impl Buffer {
    pub fn new(buf: ShmBuffer, id: u64, owner: Weak<Shared>) -> Self {
        Self {
            buf,
            id,
            owner,
            freed: AtomicBool::new(false),
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Ends the registration with the sidecar and the address registry (once).
    pub fn release(&self) -> Result<()> {
        if self.freed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match self.owner.upgrade() {
            Some(shared) => shared.release_buffer(self.id, &self.buf),
            None => Ok(()),
        }
    }
}

#[pymethods]
impl Buffer {
    /// Address of the first byte (for `put_from`/`get_into` and Mooncake's pointer calls).
    #[getter]
    fn address(&self) -> usize {
        self.buf.as_ptr() as usize
    }

    #[getter]
    fn size(&self) -> usize {
        self.buf.len()
    }

    /// Whether the buffer is still registered with the sidecar and the address registry.
    #[getter]
    fn registered(&self) -> bool {
        !self.freed.load(Ordering::Acquire)
    }

    fn __len__(&self) -> usize {
        self.buf.len()
    }

    /// Unregisters the buffer (its memory stays usable as plain memory while referenced).
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.release()).map_err(|e| e.into_pyerr(py))
    }

    fn __repr__(&self) -> String {
        format!(
            "<regolith.Buffer {} bytes at {:#x}{}>",
            self.buf.len(),
            self.buf.as_ptr() as usize,
            if self.registered() { "" } else { " (freed)" }
        )
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (ptr, len) = (slf.get().buf.as_ptr(), slf.get().buf.len());
        // SAFETY: the mapping lives as long as the ShmBuffer, which this object owns.
        unsafe { fill_view(slf.as_any(), view, ptr, len, flags) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // Nothing to report to: a failed unregistration only leaves the sidecar's mapping of
        // this memfd until the connection closes.
        let _ = self.release();
    }
}

/// A private copy of an object's bytes (Mooncake's `BufferHandle`: `ptr()`, `size()`), writable
/// so that `torch.frombuffer` takes it without a warning.
#[pyclass(module = "regolith._native", name = "BufferHandle", frozen)]
pub struct BufferHandle {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the handle owns its allocation outright; the raw pointer is only read (address and
// length) on the Rust side, and Python writes through buffer views like any bytearray.
unsafe impl Send for BufferHandle {}
unsafe impl Sync for BufferHandle {}

impl BufferHandle {
    pub fn new(bytes: Vec<u8>) -> Self {
        let boxed: Box<[u8]> = bytes.into_boxed_slice();
        let len = boxed.len();
        let ptr = Box::into_raw(boxed).cast::<u8>();
        Self { ptr, len }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is the live allocation this handle owns.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

#[pymethods]
impl BufferHandle {
    fn ptr(&self) -> usize {
        self.ptr as usize
    }

    fn size(&self) -> usize {
        self.len
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.bytes())
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.tobytes(py)
    }

    fn __repr__(&self) -> String {
        format!("<regolith.BufferHandle {} bytes>", self.len)
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (ptr, len) = (slf.get().ptr, slf.get().len);
        // SAFETY: the allocation lives as long as this object.
        unsafe { fill_view(slf.as_any(), view, ptr, len, flags) }
    }
}

impl Drop for BufferHandle {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice in `new`, freed once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}
