//! [`Client`]: the blocking API (the Python binding wraps it). Each call runs the async client
//! on a private runtime; calls from several threads proceed concurrently.

use std::sync::Arc;

use regolith_proto::uds::pb;

use crate::client::{AsyncClient, ClientConfig, Dest, Located, PutInfo, ReplicateConfig, Source};
use crate::error::{Error, Result};
use crate::shm::ShmBuffer;

#[derive(Clone)]
pub struct Client {
    rt: Arc<tokio::runtime::Runtime>,
    inner: AsyncClient,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Client {
    pub fn connect(cfg: ClientConfig) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("regolith-client")
            .enable_all()
            .build()
            .map_err(Error::from)?;
        let inner = rt.block_on(AsyncClient::connect(cfg))?;
        Ok(Self {
            rt: Arc::new(rt),
            inner,
        })
    }

    /// The async client beside this one (same connection).
    pub fn async_client(&self) -> &AsyncClient {
        &self.inner
    }

    pub fn node_name(&self) -> Result<String> {
        self.rt.block_on(self.inner.node_name())
    }

    pub fn hello_info(&self) -> Result<pb::HelloReply> {
        self.rt.block_on(self.inner.hello_info())
    }

    pub fn put(&self, key: &str, data: &[u8], cfg: &ReplicateConfig) -> Result<PutInfo> {
        self.rt.block_on(self.inner.put(key, data, cfg))
    }

    pub fn put_from(&self, key: &str, src: Source<'_>, cfg: &ReplicateConfig) -> Result<PutInfo> {
        self.rt.block_on(self.inner.put_from(key, src, cfg))
    }

    pub fn batch_put_from(
        &self,
        items: &[(&str, Source<'_>)],
        cfg: &ReplicateConfig,
    ) -> Vec<Result<PutInfo>> {
        self.rt.block_on(self.inner.batch_put_from(items, cfg))
    }

    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.rt.block_on(self.inner.get(key))
    }

    pub fn get_into(&self, key: &str, dst: Dest<'_>) -> Result<usize> {
        self.rt.block_on(self.inner.get_into(key, dst))
    }

    pub fn batch_get_into(&self, items: Vec<(&str, Dest<'_>)>) -> Vec<Result<usize>> {
        self.rt.block_on(self.inner.batch_get_into(items))
    }

    pub fn exists(&self, key: &str) -> Result<bool> {
        self.rt.block_on(self.inner.exists(key))
    }

    pub fn batch_exists(&self, keys: &[&str]) -> Result<Vec<bool>> {
        self.rt.block_on(self.inner.batch_exists(keys))
    }

    pub fn get_size(&self, key: &str) -> Result<u64> {
        self.rt.block_on(self.inner.get_size(key))
    }

    pub fn batch_get_size(&self, keys: &[&str]) -> Result<Vec<Result<u64>>> {
        self.rt.block_on(self.inner.batch_get_size(keys))
    }

    pub fn list_keys(
        &self,
        prefix: &str,
        start_after: &str,
        limit: u32,
    ) -> Result<(Vec<(String, u64)>, String)> {
        self.rt
            .block_on(self.inner.list_keys(prefix, start_after, limit))
    }

    pub fn batch_locate(&self, keys: &[&str]) -> Result<Vec<Result<Located>>> {
        self.rt.block_on(self.inner.batch_locate(keys))
    }

    pub fn remove(&self, key: &str) -> Result<()> {
        self.rt.block_on(self.inner.remove(key))
    }

    pub fn batch_remove(&self, keys: &[&str]) -> Result<Vec<Result<()>>> {
        self.rt.block_on(self.inner.batch_remove(keys))
    }

    pub fn remove_all(&self) -> Result<u64> {
        self.rt.block_on(self.inner.remove_all())
    }

    pub fn list_segments(&self) -> Result<Vec<pb::SegmentInfo>> {
        self.rt.block_on(self.inner.list_segments())
    }

    pub fn stats(&self) -> Result<pb::StatsReply> {
        self.rt.block_on(self.inner.stats())
    }

    pub fn alloc_buffer(&self, size: usize) -> Result<ShmBuffer> {
        self.rt.block_on(self.inner.alloc_buffer(size))
    }

    pub fn free_buffer(&self, buf: &ShmBuffer) -> Result<()> {
        self.rt.block_on(self.inner.free_buffer(buf))
    }
}
