//! `regolith.Client`: the Python face of [`regolith_client::Client`]. Every call that talks to
//! the sidecar runs with the GIL released; errors become the exceptions of [`crate::error`].
//!
//! Memory arguments ("targets") are either a buffer-protocol object (bytes, bytearray,
//! memoryview, numpy array, `Buffer`) or an integer address with a size, which must lie in a
//! registered range or an `alloc_buffer` region ([`crate::memory::Regions`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyList};
use pyo3::IntoPyObjectExt;
use regolith_client::share::SharePolicy;
use regolith_client::{pb, Client, ClientConfig, ShmBuffer};

use crate::buffers::{Buffer, BufferHandle};
use crate::config::{client_config, ReplicateConfig};
use crate::error::{Error, Result};
use crate::memory::{overlapping, PyBuf, Regions, Span, SpanMut};

/// What a client's Python objects share: the connection (None once closed) and the address
/// registry. `Buffer`s hold it weakly, so a closed or dropped client is really gone.
pub struct Shared {
    conn: RwLock<Option<Client>>,
    regions: Mutex<Regions>,
    /// Per registered start address: None when its pages are shared, else why not.
    sharing: Mutex<std::collections::HashMap<usize, Option<String>>>,
    next_buffer: AtomicU64,
}

impl Shared {
    fn client(&self) -> Result<Client> {
        self.conn.read().clone().ok_or(Error::Closed)
    }

    /// Forgets an `alloc_buffer` region and unregisters it from the sidecar.
    pub fn release_buffer(&self, id: u64, buf: &ShmBuffer) -> Result<()> {
        self.regions.lock().remove_shm(id);
        match self.client() {
            Ok(c) => Ok(c.free_buffer(buf)?),
            Err(_) => Ok(()),
        }
    }
}

/// A memory argument: an address (checked against the registry) or a Python buffer.
enum Target {
    Addr(usize),
    Obj(PyBuf),
}

impl Target {
    fn extract(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
        if obj.is_instance_of::<PyInt>() {
            return obj.extract::<usize>().map(Target::Addr).map_err(|_| {
                Error::InvalidArgument(format!("{obj} is not a valid address")).into()
            });
        }
        if let Ok(addr) = obj.extract::<usize>() {
            // Integer-like objects (numpy integer scalars) are addresses too.
            return Ok(Target::Addr(addr));
        }
        PyBuf::get(obj, writable).map(Target::Obj)
    }

    fn span<'a>(&'a self, regions: &Regions, size: Option<usize>) -> Result<Span<'a>> {
        match self {
            Target::Addr(addr) => regions.span_at(*addr, need_size(size)?),
            Target::Obj(b) => b.span(regions, size.unwrap_or(b.len())),
        }
    }

    fn span_mut<'a>(&'a mut self, regions: &Regions, size: Option<usize>) -> Result<SpanMut<'a>> {
        match self {
            Target::Addr(addr) => regions.span_mut_at(*addr, need_size(size)?),
            Target::Obj(b) => {
                let len = size.unwrap_or(b.len());
                b.span_mut(regions, len)
            }
        }
    }
}

fn need_size(size: Option<usize>) -> Result<usize> {
    size.ok_or_else(|| Error::InvalidArgument("a size is required with an address".into()))
}

fn targets(objs: &[Bound<'_, PyAny>], writable: bool) -> PyResult<Vec<Target>> {
    objs.iter().map(|o| Target::extract(o, writable)).collect()
}

/// Checks that the batch arguments have one entry per key.
fn check_lengths(keys: usize, targets: usize, sizes: Option<usize>) -> Result<()> {
    if targets != keys || sizes.is_some_and(|n| n != keys) {
        return Err(Error::InvalidArgument(format!(
            "batch of {keys} keys with {targets} buffers and {} sizes",
            sizes.map_or_else(|| "no".to_string(), |n| n.to_string())
        )));
    }
    Ok(())
}

/// Runs `f` with the GIL released; its error becomes a Python exception.
fn run<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T> + Send) -> PyResult<T> {
    py.detach(f).map_err(|e| e.into_pyerr(py))
}

/// Runs a per-key batch call with the GIL released (`call` gets the keys as `&str`); the list
/// of per-key outcomes, as [`outcomes`] makes it.
fn batch_outcomes<T: Send, E: Send>(
    py: Python<'_>,
    keys: Vec<String>,
    call: impl FnOnce(&[&str]) -> Result<Vec<std::result::Result<T, E>>> + Send,
    ok: impl Fn(Python<'_>, T) -> PyResult<Py<PyAny>>,
) -> PyResult<Py<PyList>>
where
    Error: From<E>,
{
    let res = run(py, move || {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        call(&refs)
    })?;
    outcomes(
        py,
        res.into_iter().map(|r| r.map_err(Error::from)).collect(),
        ok,
    )
}

/// A Python list of per-item outcomes: `ok(value)` for a success, the exception for a failure.
fn outcomes<T>(
    py: Python<'_>,
    items: Vec<Result<T>>,
    ok: impl Fn(Python<'_>, T) -> PyResult<Py<PyAny>>,
) -> PyResult<Py<PyList>> {
    let list = PyList::empty(py);
    for item in items {
        match item {
            Ok(v) => list.append(ok(py, v)?)?,
            Err(e) => list.append(e.into_pyerr(py).into_value(py))?,
        }
    }
    Ok(list.unbind())
}

fn none(py: Python<'_>, _: ()) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}

fn int(py: Python<'_>, n: u64) -> PyResult<Py<PyAny>> {
    n.into_py_any(py)
}

fn located_dict(py: Python<'_>, l: regolith_client::Located) -> PyResult<Py<PyAny>> {
    let d = PyDict::new(py);
    d.set_item("size", l.size)?;
    let replicas = PyList::empty(py);
    for r in l.replicas {
        let x = PyDict::new(py);
        x.set_item("node_name", r.node_name)?;
        x.set_item("node_id", r.node_id)?;
        x.set_item("local", r.local)?;
        x.set_item("offset", r.offset)?;
        replicas.append(x)?;
    }
    d.set_item("replicas", replicas)?;
    d.into_py_any(py)
}

fn handle(py: Python<'_>, v: Vec<u8>) -> PyResult<Py<PyAny>> {
    BufferHandle::new(v).into_py_any(py)
}

/// Per-item spans of a batch, resolved under one lock of the registry.
fn put_spans<'a>(
    regions: &Mutex<Regions>,
    targets: &'a [Target],
    sizes: &Option<Vec<usize>>,
) -> Vec<Result<Span<'a>>> {
    let regions = regions.lock();
    targets
        .iter()
        .enumerate()
        .map(|(i, t)| t.span(&regions, sizes.as_ref().map(|s| s[i])))
        .collect()
}

fn get_spans<'a>(
    regions: &Mutex<Regions>,
    targets: &'a mut [Target],
    sizes: &Option<Vec<usize>>,
) -> Vec<Result<SpanMut<'a>>> {
    let regions = regions.lock();
    targets
        .iter_mut()
        .enumerate()
        .map(|(i, t)| t.span_mut(&regions, sizes.as_ref().map(|s| s[i])))
        .collect()
}

/// Puts the items whose spans resolved, in one batch; the others keep their error.
fn batch_put(
    c: &Client,
    keys: &[String],
    spans: Vec<Result<Span<'_>>>,
    cfg: &regolith_client::ReplicateConfig,
) -> Vec<Result<()>> {
    let mut out: Vec<Option<Result<()>>> = Vec::with_capacity(keys.len());
    let mut ok_spans = Vec::new();
    let mut ok_idx = Vec::new();
    for (i, s) in spans.into_iter().enumerate() {
        match s {
            Ok(s) => {
                ok_idx.push(i);
                ok_spans.push(s);
                out.push(None);
            }
            Err(e) => out.push(Some(Err(e))),
        }
    }
    let items: Vec<(&str, regolith_client::Source<'_>)> = ok_idx
        .iter()
        .zip(&ok_spans)
        .map(|(&i, s)| (keys[i].as_str(), s.source()))
        .collect();
    for (&i, r) in ok_idx.iter().zip(c.batch_put_from(&items, cfg)) {
        out[i] = Some(r.map(|_| ()).map_err(Error::from));
    }
    finish(out)
}

/// Gets the items whose destinations resolved (and overlap no other), in one batch.
fn batch_get(c: &Client, keys: &[String], spans: Vec<Result<SpanMut<'_>>>) -> Vec<Result<u64>> {
    let mut out: Vec<Option<Result<u64>>> = Vec::with_capacity(keys.len());
    let mut ok: Vec<Option<SpanMut<'_>>> = Vec::with_capacity(keys.len());
    for s in spans {
        match s {
            Ok(s) => {
                ok.push(Some(s));
                out.push(None);
            }
            Err(e) => {
                ok.push(None);
                out.push(Some(Err(e)));
            }
        }
    }
    for i in overlapping(&ok) {
        ok[i] = None;
        out[i] = Some(Err(Error::InvalidArgument(format!(
            "{:?}: its destination overlaps another destination of the batch",
            keys[i]
        ))));
    }
    let mut idx = Vec::new();
    let mut items = Vec::new();
    for (i, s) in ok.iter_mut().enumerate() {
        if let Some(s) = s {
            idx.push(i);
            items.push((keys[i].as_str(), s.dest()));
        }
    }
    for (&i, r) in idx.iter().zip(c.batch_get_into(items)) {
        out[i] = Some(r.map(|n| n as u64).map_err(Error::from));
    }
    finish(out)
}

/// The size of piece `j` of item `i` when sizes were given.
/// A put's settings: the Python `ReplicateConfig` and whether it may replace the key.
fn put_config(
    config: Option<PyRef<'_, ReplicateConfig>>,
    upsert: bool,
) -> regolith_client::ReplicateConfig {
    regolith_client::ReplicateConfig {
        upsert,
        ..client_config(config)
    }
}

fn piece_size(sizes: &Option<Vec<Vec<usize>>>, i: usize, j: usize) -> Result<Option<usize>> {
    match sizes {
        None => Ok(None),
        Some(s) => s[i].get(j).copied().map(Some).ok_or_else(|| {
            Error::InvalidArgument(format!("item {i}: {} sizes for more pieces", s[i].len()))
        }),
    }
}

/// Per item, the spans of its pieces, resolved under one lock of the registry.
fn gather_spans<'a>(
    regions: &Mutex<Regions>,
    targets: &'a [Vec<Target>],
    sizes: &Option<Vec<Vec<usize>>>,
) -> Vec<Result<Vec<Span<'a>>>> {
    let regions = regions.lock();
    targets
        .iter()
        .enumerate()
        .map(|(i, pieces)| {
            check_piece_count(i, pieces.len(), sizes)?;
            pieces
                .iter()
                .enumerate()
                .map(|(j, t)| t.span(&regions, piece_size(sizes, i, j)?))
                .collect()
        })
        .collect()
}

fn scatter_spans<'a>(
    regions: &Mutex<Regions>,
    targets: &'a mut [Vec<Target>],
    sizes: &Option<Vec<Vec<usize>>>,
) -> Vec<Result<Vec<SpanMut<'a>>>> {
    let regions = regions.lock();
    targets
        .iter_mut()
        .enumerate()
        .map(|(i, pieces)| {
            check_piece_count(i, pieces.len(), sizes)?;
            pieces
                .iter_mut()
                .enumerate()
                .map(|(j, t)| t.span_mut(&regions, piece_size(sizes, i, j)?))
                .collect()
        })
        .collect()
}

fn check_piece_count(i: usize, pieces: usize, sizes: &Option<Vec<Vec<usize>>>) -> Result<()> {
    match sizes {
        Some(s) if s[i].len() != pieces => Err(Error::InvalidArgument(format!(
            "item {i}: {pieces} buffers and {} sizes",
            s[i].len()
        ))),
        _ => Ok(()),
    }
}

/// Puts the items whose pieces all resolved, in one batch; the others keep their error.
fn batch_put_gathered(
    c: &Client,
    keys: &[String],
    spans: Vec<Result<Vec<Span<'_>>>>,
    cfg: &regolith_client::ReplicateConfig,
) -> Vec<Result<()>> {
    let mut out: Vec<Option<Result<()>>> = Vec::with_capacity(keys.len());
    let mut ok_idx = Vec::new();
    let mut resolved: Vec<Vec<Span<'_>>> = Vec::new();
    for (i, s) in spans.into_iter().enumerate() {
        match s {
            Ok(s) => {
                ok_idx.push(i);
                resolved.push(s);
                out.push(None);
            }
            Err(e) => out.push(Some(Err(e))),
        }
    }
    let pieces: Vec<Vec<&[u8]>> = resolved
        .iter()
        .map(|s| s.iter().map(Span::bytes).collect())
        .collect();
    let items: Vec<(&str, regolith_client::Source<'_>)> = ok_idx
        .iter()
        .zip(&pieces)
        .map(|(&i, p)| (keys[i].as_str(), regolith_client::Source::Parts(p)))
        .collect();
    for (&i, r) in ok_idx.iter().zip(c.batch_put_from(&items, cfg)) {
        out[i] = Some(r.map(|_| ()).map_err(Error::from));
    }
    finish(out)
}

/// Gets the items whose pieces all resolved (and overlap no other piece of the batch), in one
/// batch.
fn batch_get_scattered(
    c: &Client,
    keys: &[String],
    spans: Vec<Result<Vec<SpanMut<'_>>>>,
) -> Vec<Result<u64>> {
    let mut out: Vec<Option<Result<u64>>> = Vec::with_capacity(keys.len());
    let mut flat: Vec<Option<SpanMut<'_>>> = Vec::new();
    let mut owner = Vec::new();
    for (i, s) in spans.into_iter().enumerate() {
        match s {
            Ok(pieces) => {
                out.push(None);
                for p in pieces {
                    flat.push(Some(p));
                    owner.push(i);
                }
            }
            Err(e) => out.push(Some(Err(e))),
        }
    }
    for j in overlapping(&flat) {
        out[owner[j]] = Some(Err(Error::InvalidArgument(format!(
            "{:?}: a destination buffer overlaps another destination of the batch",
            keys[owner[j]]
        ))));
    }
    let mut per_item: Vec<Vec<&mut [u8]>> = (0..keys.len()).map(|_| Vec::new()).collect();
    for (j, p) in flat.iter_mut().enumerate() {
        if let (Some(p), None) = (p.as_mut(), &out[owner[j]]) {
            per_item[owner[j]].push(p.bytes_mut());
        }
    }
    let mut idx = Vec::new();
    let mut items = Vec::new();
    for (i, pieces) in per_item.into_iter().enumerate() {
        if out[i].is_none() {
            idx.push(i);
            items.push((keys[i].as_str(), regolith_client::Dest::Parts(pieces)));
        }
    }
    for (&i, r) in idx.iter().zip(c.batch_get_into(items)) {
        out[i] = Some(r.map(|n| n as u64).map_err(Error::from));
    }
    finish(out)
}

fn finish<T>(out: Vec<Option<Result<T>>>) -> Vec<Result<T>> {
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| Err(Error::InvalidArgument("item not processed".into()))))
        .collect()
}

/// Private copies of many objects: sizes in one round trip, then one batched get; an object
/// that grew in between (removed and put again) is fetched on its own.
fn fetch_copies(c: &Client, keys: &[String]) -> Vec<Result<Vec<u8>>> {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let sizes = match c.batch_get_size(&refs) {
        Ok(s) => s,
        Err(_) => return refs.iter().map(|k| Ok(c.get(k)?)).collect(),
    };
    let mut bufs: Vec<Result<Vec<u8>>> = sizes
        .into_iter()
        .map(|s| match s {
            Ok(n) => usize::try_from(n)
                .map(|n| vec![0u8; n])
                .map_err(|_| Error::InvalidArgument(format!("object of {n} bytes"))),
            Err(e) => Err(e.into()),
        })
        .collect();
    let (idx, items): (Vec<usize>, Vec<_>) = bufs
        .iter_mut()
        .enumerate()
        .filter_map(|(i, b)| {
            b.as_mut()
                .ok()
                .map(|v| (i, (refs[i], regolith_client::Dest::Bytes(v))))
        })
        .unzip();
    let results = c.batch_get_into(items);
    for (&i, r) in idx.iter().zip(results) {
        bufs[i] = match r {
            Ok(n) => match std::mem::replace(&mut bufs[i], Ok(Vec::new())) {
                Ok(mut v) => {
                    v.truncate(n);
                    Ok(v)
                }
                Err(e) => Err(e),
            },
            Err(regolith_client::Error::BufferTooSmall { .. }) => {
                c.get(refs[i]).map_err(Error::from)
            }
            Err(e) => Err(e.into()),
        };
    }
    bufs
}

fn stats_dict<'py>(py: Python<'py>, s: &pb::StatsReply) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("node_name", &s.node_name)?;
    d.set_item("node_id", s.node_id)?;
    d.set_item("segment_size", s.segment_size)?;
    d.set_item("segment_used", s.segment_used)?;
    d.set_item("keys", s.keys)?;
    d.set_item("bytes_used", s.bytes_used)?;
    d.set_item("bytes_total", s.bytes_total)?;
    d.set_item("clients", s.clients)?;
    d.set_item("puts", s.puts)?;
    d.set_item("gets", s.gets)?;
    d.set_item("checksum_mismatches", s.checksum_mismatches)?;
    d.set_item("metad_term", s.metad_term)?;
    d.set_item("metad_leader", s.metad_leader)?;
    Ok(d)
}

fn segment_dict<'py>(py: Python<'py>, s: &pb::SegmentInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("node_name", &s.node_name)?;
    d.set_item("node_id", s.node_id)?;
    d.set_item("capacity", s.capacity)?;
    d.set_item("used", s.used)?;
    d.set_item("alive", s.alive)?;
    d.set_item("local", s.local)?;
    d.set_item("draining", s.draining)?;
    d.set_item("objects", s.objects)?;
    Ok(d)
}

/// A connection to the node's sidecar.
///
/// `Client(socket=None, *, staging_size=0, name=None)`: the socket defaults to
/// `$REGOLITH_SOCKET`, then `/run/regolith/sidecar.sock`; `staging_size` 0 takes the sidecar's
/// default staging area.
#[pyclass(module = "regolith._native", name = "Client", frozen)]
pub struct PyClient {
    shared: Arc<Shared>,
    socket: PathBuf,
}

impl PyClient {
    fn client(&self) -> Result<Client> {
        self.shared.client()
    }

    fn connect(py: Python<'_>, cfg: ClientConfig) -> PyResult<Client> {
        run(py, move || Ok(Client::connect(cfg)?))
    }
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (socket=None, *, staging_size=0, name=None))]
    fn new(
        py: Python<'_>,
        socket: Option<PathBuf>,
        staging_size: u64,
        name: Option<String>,
    ) -> PyResult<Self> {
        let mut cfg = match socket {
            Some(p) => ClientConfig::new(p),
            None => ClientConfig::from_env(),
        };
        cfg.staging_size = staging_size;
        if let Some(n) = name {
            cfg.name = n;
        }
        let socket = cfg.socket.clone();
        let client = Self::connect(py, cfg)?;
        Ok(Self {
            shared: Arc::new(Shared {
                conn: RwLock::new(Some(client)),
                regions: Mutex::new(Regions::default()),
                sharing: Mutex::default(),
                next_buffer: AtomicU64::new(1),
            }),
            socket,
        })
    }

    /// The socket this client connects to.
    #[getter]
    fn socket(&self) -> String {
        self.socket.display().to_string()
    }

    /// The sidecar's node name (Mooncake's `get_hostname`).
    #[getter]
    fn node_name(&self, py: Python<'_>) -> PyResult<String> {
        let c = self.client()?;
        run(py, move || Ok(c.node_name()?))
    }

    #[getter]
    fn closed(&self) -> bool {
        self.shared.conn.read().is_none()
    }

    // ------------------------------------------------------------------ puts

    /// Puts `value` (any buffer-protocol object) under `key`.
    ///
    /// Every put form takes `upsert=True` to replace an existing object under the key
    /// (Mooncake's upsert) instead of raising `AlreadyExistsError`: readers see the old value or
    /// the new one, whole.
    #[pyo3(signature = (key, value, config=None, *, upsert=false))]
    fn put(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<()> {
        let buf = PyBuf::get(value, false)?;
        self.put_target(py, key, Target::Obj(buf), None, put_config(config, upsert))
    }

    /// Puts `size` bytes at `address` (registered, or in an `alloc_buffer` region), or the
    /// bytes of a buffer-protocol object (its first `size` bytes when given).
    #[pyo3(signature = (key, address, size=None, config=None, *, upsert=false))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: &str,
        address: &Bound<'_, PyAny>,
        size: Option<usize>,
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<()> {
        let target = Target::extract(address, false)?;
        self.put_target(py, key, target, size, put_config(config, upsert))
    }

    /// Puts the concatenation of `parts` (buffer-protocol objects) as one object; the pieces
    /// are copied in place, never joined first.
    #[pyo3(signature = (key, parts, config=None, *, upsert=false))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: Vec<Bound<'_, PyAny>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<()> {
        let bufs = parts
            .iter()
            .map(|p| PyBuf::get(p, false))
            .collect::<PyResult<Vec<_>>>()?;
        let cfg = put_config(config, upsert);
        let c = self.client()?;
        let slices: Vec<&[u8]> = bufs.iter().map(PyBuf::bytes).collect();
        run(py, move || {
            c.put_from(key, regolith_client::Source::Parts(&slices), &cfg)?;
            Ok(())
        })
    }

    /// Puts objects that are each the concatenation of several pieces (one gather list per
    /// key: addresses with `sizes`, or buffer-protocol objects), with one reservation and one
    /// commit round trip. Returns, per key, None or the exception of its failure.
    #[pyo3(signature = (keys, parts, sizes=None, config=None, *, upsert=false))]
    fn batch_put_parts(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        parts: Vec<Vec<Bound<'_, PyAny>>>,
        sizes: Option<Vec<Vec<usize>>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<Py<PyList>> {
        check_lengths(keys.len(), parts.len(), sizes.as_ref().map(Vec::len))?;
        let targets = parts
            .iter()
            .map(|p| self::targets(p, false))
            .collect::<PyResult<Vec<_>>>()?;
        let cfg = put_config(config, upsert);
        let c = self.client()?;
        let spans = gather_spans(&self.shared.regions, &targets, &sizes);
        let res = py.detach(|| batch_put_gathered(&c, &keys, spans, &cfg));
        outcomes(py, res, none)
    }

    /// Puts many objects with one reservation and one commit round trip. `targets` are
    /// addresses (with `sizes`) or buffer-protocol objects. Returns, per key, None or the
    /// exception of its failure.
    #[pyo3(signature = (keys, targets, sizes=None, config=None, *, upsert=false))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        targets: Vec<Bound<'_, PyAny>>,
        sizes: Option<Vec<usize>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<Py<PyList>> {
        check_lengths(keys.len(), targets.len(), sizes.as_ref().map(Vec::len))?;
        let targets = self::targets(&targets, false)?;
        let cfg = put_config(config, upsert);
        let c = self.client()?;
        let spans = put_spans(&self.shared.regions, &targets, &sizes);
        let res = py.detach(|| batch_put(&c, &keys, spans, &cfg));
        outcomes(py, res, none)
    }

    /// `batch_put_from` with buffer-protocol values.
    #[pyo3(signature = (keys, values, config=None, *, upsert=false))]
    fn batch_put(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<Py<PyList>> {
        self.batch_put_from(py, keys, values, None, config, upsert)
    }

    // ------------------------------------------------------------------ gets

    /// A private copy of the object, as bytes.
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyBytes>> {
        let c = self.client()?;
        let v = run(py, move || Ok(c.get(key)?))?;
        Ok(PyBytes::new(py, &v))
    }

    /// A private copy of the object, as a `BufferHandle` (buffer protocol, `ptr()`, `size()`).
    fn get_buffer(&self, py: Python<'_>, key: &str) -> PyResult<BufferHandle> {
        let c = self.client()?;
        let v = run(py, move || Ok(c.get(key)?))?;
        Ok(BufferHandle::new(v))
    }

    /// Private copies of many objects: per key, a `BufferHandle` or the exception.
    fn batch_get_buffer(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Py<PyList>> {
        let c = self.client()?;
        let res = py.detach(|| fetch_copies(&c, &keys));
        outcomes(py, res, handle)
    }

    /// Copies the object into `address` (`size` bytes, registered or in an `alloc_buffer`
    /// region) or into a writable buffer-protocol object; returns the object's size.
    #[pyo3(signature = (key, address, size=None))]
    fn get_into(
        &self,
        py: Python<'_>,
        key: &str,
        address: &Bound<'_, PyAny>,
        size: Option<usize>,
    ) -> PyResult<u64> {
        let mut target = Target::extract(address, true)?;
        let c = self.client()?;
        let mut span = {
            let regions = self.shared.regions.lock();
            target.span_mut(&regions, size)?
        };
        run(py, move || Ok(c.get_into(key, span.dest())? as u64))
    }

    /// Gets many objects in one round trip; per key, the size read or the exception.
    #[pyo3(signature = (keys, targets, sizes=None))]
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        targets: Vec<Bound<'_, PyAny>>,
        sizes: Option<Vec<usize>>,
    ) -> PyResult<Py<PyList>> {
        check_lengths(keys.len(), targets.len(), sizes.as_ref().map(Vec::len))?;
        let mut targets = self::targets(&targets, true)?;
        let c = self.client()?;
        let spans = get_spans(&self.shared.regions, &mut targets, &sizes);
        let res = py.detach(|| batch_get(&c, &keys, spans));
        outcomes(py, res, int)
    }

    /// Gets objects each into several pieces of memory filled in order (one scatter list per
    /// key), in one round trip; per key, the object's size or the exception (a
    /// `BufferTooSmallError` when the pieces together are smaller than the object).
    #[pyo3(signature = (keys, parts, sizes=None))]
    fn batch_get_into_parts(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        parts: Vec<Vec<Bound<'_, PyAny>>>,
        sizes: Option<Vec<Vec<usize>>>,
    ) -> PyResult<Py<PyList>> {
        check_lengths(keys.len(), parts.len(), sizes.as_ref().map(Vec::len))?;
        let mut targets = parts
            .iter()
            .map(|p| self::targets(p, true))
            .collect::<PyResult<Vec<_>>>()?;
        let c = self.client()?;
        let spans = scatter_spans(&self.shared.regions, &mut targets, &sizes);
        let res = py.detach(|| batch_get_scattered(&c, &keys, spans));
        outcomes(py, res, int)
    }

    // ------------------------------------------------------------------ keys

    fn exists(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        let c = self.client()?;
        run(py, move || Ok(c.exists(key)?))
    }

    fn batch_exists(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<bool>> {
        let c = self.client()?;
        run(py, move || {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            Ok(c.batch_exists(&refs)?)
        })
    }

    fn get_size(&self, py: Python<'_>, key: &str) -> PyResult<u64> {
        let c = self.client()?;
        run(py, move || Ok(c.get_size(key)?))
    }

    /// Per key, the size or the exception.
    fn batch_get_size(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Py<PyList>> {
        let c = self.client()?;
        batch_outcomes(py, keys, move |refs| Ok(c.batch_get_size(refs)?), int)
    }

    /// One page of the cluster's keys in key order: ``([(key, size), ...], next_start_after)``;
    /// pass ``next_start_after`` back for the next page (empty when done).
    #[pyo3(signature = (prefix="", start_after="", limit=0))]
    fn list_keys(
        &self,
        py: Python<'_>,
        prefix: &str,
        start_after: &str,
        limit: u32,
    ) -> PyResult<(Vec<(String, u64)>, String)> {
        let c = self.client()?;
        run(py, move || Ok(c.list_keys(prefix, start_after, limit)?))
    }

    /// Per key, ``{"size": int, "replicas": [{"node_name", "node_id", "local", "offset"}]}``
    /// or the exception (a lease read at the leader, as a get's).
    fn batch_locate(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Py<PyList>> {
        let c = self.client()?;
        batch_outcomes(
            py,
            keys,
            move |refs| Ok(c.batch_locate(refs)?),
            located_dict,
        )
    }

    fn remove(&self, py: Python<'_>, key: &str) -> PyResult<()> {
        let c = self.client()?;
        run(py, move || Ok(c.remove(key)?))
    }

    /// Per key, None or the exception.
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Py<PyList>> {
        let c = self.client()?;
        batch_outcomes(py, keys, move |refs| Ok(c.batch_remove(refs)?), none)
    }

    /// Removes every object; returns how many were removed.
    fn remove_all(&self, py: Python<'_>) -> PyResult<u64> {
        let c = self.client()?;
        run(py, move || Ok(c.remove_all()?))
    }

    /// The sidecar's counters and the cluster's usage, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.client()?;
        let s = run(py, move || Ok(c.stats()?))?;
        stats_dict(py, &s)
    }

    /// The cluster's segments (one per node), as dicts.
    fn list_segments<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let c = self.client()?;
        let segs = run(py, move || Ok(c.list_segments()?))?;
        segs.iter().map(|s| segment_dict(py, s)).collect()
    }

    // ------------------------------------------------------------------ memory

    /// A writable buffer of `size` bytes in shared memory, registered with the sidecar: puts
    /// from it and gets into it involve no staging copy.
    fn alloc_buffer(&self, py: Python<'_>, size: usize) -> PyResult<Buffer> {
        let c = self.client()?;
        let buf = run(py, move || Ok(c.alloc_buffer(size)?))?;
        let id = self.shared.next_buffer.fetch_add(1, Ordering::Relaxed);
        self.shared.regions.lock().add_shm(id, buf.clone());
        Ok(Buffer::new(buf, id, Arc::downgrade(&self.shared)))
    }

    /// Unregisters a buffer from `alloc_buffer`.
    fn free_buffer(&self, py: Python<'_>, buffer: PyRef<'_, Buffer>) -> PyResult<()> {
        let b: &Buffer = &buffer;
        run(py, || b.release())
    }

    /// Declares `[address, address+size)` valid memory for address-based calls (Mooncake's
    /// `register_buffer`): its bytes are copied through staging when they cross to the
    /// sidecar. Addresses outside every registered range and buffer are refused.
    /// Copies the bytes of `data` (a buffer-protocol object) to `address`, which must lie in a
    /// registered range or an `alloc_buffer` region with room for all of them.
    fn write_into(&self, py: Python<'_>, address: usize, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let src = PyBuf::get(data, false)?;
        let mut dst = {
            let regions = self.shared.regions.lock();
            regions.span_mut_at(address, src.len())?
        };
        let bytes = src.bytes();
        py.detach(|| dst.bytes_mut().copy_from_slice(bytes));
        Ok(())
    }

    /// Copies `len(dest)` bytes from `address` (a registered range or an `alloc_buffer` region)
    /// into `dest`, a writable buffer-protocol object.
    fn read_from(&self, py: Python<'_>, address: usize, dest: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut dst = PyBuf::get(dest, true)?;
        let len = dst.len();
        let src = {
            let regions = self.shared.regions.lock();
            regions.span_at(address, len)?
        };
        let mut out = dst.span_mut(&Regions::default(), len)?;
        let bytes = src.bytes();
        py.detach(|| out.bytes_mut().copy_from_slice(bytes));
        Ok(())
    }

    /// Declares `[address, address+size)` valid memory for address-based calls (Mooncake's
    /// `register_buffer`). Where it is plain private memory of at least 1 MiB of whole pages,
    /// and `REGOLITH_SHARE_REGISTERED` allows it, those pages are moved onto shared memory in
    /// place (same addresses, same bytes) so that the sidecar reads and writes them with no
    /// staging copy (`buffer_sharing` says whether they were, or why not). Do not write the
    /// range from another thread during this call.
    fn register_buffer(&self, py: Python<'_>, address: usize, size: usize) -> PyResult<()> {
        let replaced = self.shared.regions.lock().register(address, size)?;
        self.release_shared(py, replaced);
        let policy = SharePolicy::from_env();
        let shared = self.shared.clone();
        let why = py.detach(move || shared.regions.lock().share(address, policy));
        self.shared.sharing.lock().insert(address, why.err());
        Ok(())
    }

    /// Forgets a registered range; its shared pages, if any, are unregistered from the sidecar
    /// and moved back onto private memory with their bytes.
    fn unregister_buffer(&self, py: Python<'_>, address: usize) -> PyResult<()> {
        let shared = self.shared.regions.lock().unregister(address)?;
        self.shared.sharing.lock().remove(&address);
        self.release_shared(py, shared);
        Ok(())
    }

    /// `"shared"` when the registered range at `address` was moved onto shared memory (gets
    /// and puts on it take no staging copy), otherwise why not; None if nothing is registered
    /// there.
    fn buffer_sharing(&self, address: usize) -> Option<String> {
        self.shared
            .sharing
            .lock()
            .get(&address)
            .map(|why| why.clone().unwrap_or_else(|| "shared".into()))
    }

    /// Closes the connection; later calls raise `ClosedError`. Buffers stay readable.
    fn close(&self, py: Python<'_>) {
        let conn = self.shared.conn.write().take();
        let (buffers, adopted) = self.shared.regions.lock().clear();
        self.shared.sharing.lock().clear();
        py.detach(move || {
            // The sidecar unmaps what was registered on the connection when it closes.
            drop((conn, buffers));
            for buf in adopted {
                buf.restore_private();
            }
        });
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "<regolith.Client socket={:?}{}>",
            self.socket.display().to_string(),
            if self.closed() { " closed" } else { "" }
        )
    }
}

impl PyClient {
    /// Unregisters shared registered pages from the sidecar and moves them back onto private
    /// memory (best effort: a sidecar that is gone has unmapped them already).
    fn release_shared(&self, py: Python<'_>, buf: Option<ShmBuffer>) {
        let Some(buf) = buf else { return };
        let c = self.shared.client().ok();
        py.detach(move || {
            if let Some(c) = c {
                let _ = c.free_buffer(&buf);
            }
            buf.restore_private();
        });
    }

    fn put_target(
        &self,
        py: Python<'_>,
        key: &str,
        target: Target,
        size: Option<usize>,
        cfg: regolith_client::ReplicateConfig,
    ) -> PyResult<()> {
        let c = self.client()?;
        let span = {
            let regions = self.shared.regions.lock();
            target.span(&regions, size)?
        };
        run(py, move || {
            c.put_from(key, span.source(), &cfg)?;
            Ok(())
        })
    }
}
