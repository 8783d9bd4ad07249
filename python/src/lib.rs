//! regolith-python: `regolith._native`, the extension module (PyO3, abi3 for CPython ≥ 3.11)
//! under the `regolith` Python package and its Mooncake drop-in (`regolith.mooncake`, written
//! in Python over this module).
//!
//! Modules:
//! * [`client`] — `Client`: puts, gets, batch calls, key operations, shared buffers and the
//!   address registry; the GIL is released for every call to the sidecar.
//! * [`memory`] — buffer-protocol exports held during a call ([`memory::PyBuf`]) and the
//!   registry that turns a raw `(address, size)` into a checked source or destination.
//! * [`buffers`] — `Buffer` (shared memory from `alloc_buffer`) and `BufferHandle` (a private
//!   copy of an object), both exporting the buffer protocol.
//! * [`config`] — `ReplicateConfig`, with Mooncake's attribute names.
//! * [`error`] — the crate's error type, the Python exception classes, Mooncake's error codes.

// No unwrap/expect outside tests: nothing a peer, a client or a config file sends may panic
// a process; the few invariants that are ours alone say so where they are allowed.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use pyo3::prelude::*;

pub mod buffers;
pub mod client;
pub mod config;
pub mod error;
pub mod memory;

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::PyClient>()?;
    m.add_class::<buffers::Buffer>()?;
    m.add_class::<buffers::BufferHandle>()?;
    m.add_class::<config::ReplicateConfig>()?;
    error::register(m)?;
    m.add("DEFAULT_SOCKET", regolith_client::DEFAULT_SOCKET)?;
    add_codes(m)?;
    Ok(())
}

/// Mooncake's error codes as module constants (`regolith._native.OBJECT_NOT_FOUND`, ...).
fn add_codes(m: &Bound<'_, PyModule>) -> PyResult<()> {
    use error::codes::*;
    for (name, code) in [
        ("OK", OK),
        ("INTERNAL_ERROR", INTERNAL_ERROR),
        ("BUFFER_OVERFLOW", BUFFER_OVERFLOW),
        ("NO_AVAILABLE_HANDLE", NO_AVAILABLE_HANDLE),
        ("INVALID_PARAMS", INVALID_PARAMS),
        ("OBJECT_NOT_FOUND", OBJECT_NOT_FOUND),
        ("OBJECT_ALREADY_EXISTS", OBJECT_ALREADY_EXISTS),
        ("TRANSFER_FAIL", TRANSFER_FAIL),
        ("RPC_FAIL", RPC_FAIL),
    ] {
        m.add(name, code)?;
    }
    Ok(())
}
