//! [`Client`]: the blocking API (the Python binding wraps it). Each call runs the async client
//! on a private runtime; calls from several threads proceed concurrently.
//!
//! The calling thread polls its call itself ([`Client::wait`]) and, while the reply is not
//! there yet, keeps polling it (which reads the socket: [`crate::conn`]) for a short spin
//! before it sleeps: a sidecar answers an exists or a local get in tens of microseconds, and
//! waking a sleeping thread on an idle core costs about as much again. `REGOLITH_CLIENT_SPIN_US`
//! sets the spin (default 200; 0: sleep at once).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

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

    /// Runs `fut` to completion on the calling thread, inside the client's runtime (its worker
    /// thread drives the socket); between polls it spins up to [`spin`] for the wake-up
    /// before it parks.
    fn wait<F: Future>(&self, fut: F) -> F::Output {
        let _runtime = self.rt.enter();
        let mut fut = std::pin::pin!(fut);
        let signal = Arc::new(Signal {
            woken: AtomicBool::new(false),
            thread: std::thread::current(),
        });
        let waker = Waker::from(signal.clone());
        let mut cx = Context::from_waker(&waker);
        let spin = spin();
        let mut spinning_since = Instant::now();
        loop {
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return out;
            }
            if signal.woken.swap(false, Ordering::AcqRel) {
                spinning_since = Instant::now();
                continue;
            }
            // While it spins, the thread polls its call again and again: a call waiting for a
            // reply reads the socket itself (`conn`), so the reply needs no other thread.
            if spinning_since.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            signal.wait(Duration::ZERO);
            spinning_since = Instant::now();
        }
    }

    /// The async client beside this one (same connection).
    pub fn async_client(&self) -> &AsyncClient {
        &self.inner
    }

    pub fn node_name(&self) -> Result<String> {
        self.wait(self.inner.node_name())
    }

    pub fn hello_info(&self) -> Result<pb::HelloReply> {
        self.wait(self.inner.hello_info())
    }

    pub fn put(&self, key: &str, data: &[u8], cfg: &ReplicateConfig) -> Result<PutInfo> {
        self.wait(self.inner.put(key, data, cfg))
    }

    pub fn put_from(&self, key: &str, src: Source<'_>, cfg: &ReplicateConfig) -> Result<PutInfo> {
        self.wait(self.inner.put_from(key, src, cfg))
    }

    pub fn batch_put_from(
        &self,
        items: &[(&str, Source<'_>)],
        cfg: &ReplicateConfig,
    ) -> Vec<Result<PutInfo>> {
        self.wait(self.inner.batch_put_from(items, cfg))
    }

    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.wait(self.inner.get(key))
    }

    pub fn get_into(&self, key: &str, dst: Dest<'_>) -> Result<usize> {
        self.wait(self.inner.get_into(key, dst))
    }

    pub fn batch_get_into(&self, items: Vec<(&str, Dest<'_>)>) -> Vec<Result<usize>> {
        self.wait(self.inner.batch_get_into(items))
    }

    pub fn exists(&self, key: &str) -> Result<bool> {
        self.wait(self.inner.exists(key))
    }

    pub fn batch_exists(&self, keys: &[&str]) -> Result<Vec<bool>> {
        self.wait(self.inner.batch_exists(keys))
    }

    pub fn get_size(&self, key: &str) -> Result<u64> {
        self.wait(self.inner.get_size(key))
    }

    pub fn batch_get_size(&self, keys: &[&str]) -> Result<Vec<Result<u64>>> {
        self.wait(self.inner.batch_get_size(keys))
    }

    pub fn list_keys(
        &self,
        prefix: &str,
        start_after: &str,
        limit: u32,
    ) -> Result<(Vec<(String, u64)>, String)> {
        self.wait(self.inner.list_keys(prefix, start_after, limit))
    }

    pub fn batch_locate(&self, keys: &[&str]) -> Result<Vec<Result<Located>>> {
        self.wait(self.inner.batch_locate(keys))
    }

    pub fn remove(&self, key: &str) -> Result<()> {
        self.wait(self.inner.remove(key))
    }

    pub fn batch_remove(&self, keys: &[&str]) -> Result<Vec<Result<()>>> {
        self.wait(self.inner.batch_remove(keys))
    }

    pub fn remove_all(&self) -> Result<u64> {
        self.wait(self.inner.remove_all())
    }

    pub fn list_segments(&self) -> Result<Vec<pb::SegmentInfo>> {
        self.wait(self.inner.list_segments())
    }

    pub fn stats(&self) -> Result<pb::StatsReply> {
        self.wait(self.inner.stats())
    }

    pub fn alloc_buffer(&self, size: usize) -> Result<ShmBuffer> {
        self.wait(self.inner.alloc_buffer(size))
    }

    pub fn free_buffer(&self, buf: &ShmBuffer) -> Result<()> {
        self.wait(self.inner.free_buffer(buf))
    }
}

/// The spin of [`Client::wait`]: `REGOLITH_CLIENT_SPIN_US` (µs), default 200, read once.
fn spin() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("REGOLITH_CLIENT_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_SPIN_US)
            .min(MAX_SPIN_US);
        Duration::from_micros(us)
    })
}

const DEFAULT_SPIN_US: u64 = 200;
/// A larger setting is capped: spinning longer only burns a core.
const MAX_SPIN_US: u64 = 1000;

/// The waker of a call polled by [`Client::wait`]: a flag, and the thread to unpark.
struct Signal {
    woken: AtomicBool,
    thread: std::thread::Thread,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

impl Signal {
    /// Returns once woken: spinning up to `spin`, then parked.
    fn wait(&self, spin: Duration) {
        let start = Instant::now();
        while start.elapsed() < spin {
            if self.woken.swap(false, Ordering::AcqRel) {
                return;
            }
            std::hint::spin_loop();
        }
        while !self.woken.swap(false, Ordering::AcqRel) {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signal() -> Arc<Signal> {
        Arc::new(Signal {
            woken: AtomicBool::new(false),
            thread: std::thread::current(),
        })
    }

    #[test]
    fn a_wake_during_the_spin_or_after_it_ends_the_wait_and_is_consumed() {
        for (spin, delay) in [
            (Duration::from_millis(500), Duration::from_millis(1)),
            (Duration::ZERO, Duration::from_millis(20)),
            (Duration::from_micros(50), Duration::from_millis(20)),
        ] {
            let s = signal();
            let waker = Waker::from(s.clone());
            let t = std::thread::spawn(move || {
                std::thread::sleep(delay);
                waker.wake();
            });
            let start = Instant::now();
            s.wait(spin);
            assert!(start.elapsed() >= delay, "returned before the wake");
            assert!(
                !s.woken.load(Ordering::Acquire),
                "the wake was not consumed"
            );
            t.join().unwrap();
        }
    }

    #[test]
    fn a_wake_before_the_wait_is_not_lost() {
        let s = signal();
        Waker::from(s.clone()).wake_by_ref();
        s.wait(Duration::ZERO);
        assert!(!s.woken.load(Ordering::Acquire));
    }
}
