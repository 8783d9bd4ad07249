//! A fault-injecting TCP proxy: forwards bytes both ways, adds a configurable delay, and can
//! drop every open connection or refuse new ones. It stands in for `tc netem` (absent on these
//! machines) in front of a data port or a metad port.
//!
//! Delay is latency, not a bandwidth cap: every chunk read is stamped and written once its
//! stamp plus the delay has passed, so a stream keeps its throughput.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use regolith_proto::shutdown::{Shutdown, ShutdownTrigger};

use crate::error::{Error, Result};

/// Live controls of a proxy (shared with its tasks).
#[derive(Debug, Default)]
pub struct ProxyControl {
    delay_us: AtomicU64,
    refuse: AtomicBool,
    /// Bumped to drop every open connection.
    generation: AtomicU64,
    connections: AtomicU64,
    bytes: AtomicU64,
}

impl ProxyControl {
    pub fn set_delay(&self, d: Duration) {
        self.delay_us.store(d.as_micros() as u64, Ordering::Relaxed);
    }
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us.load(Ordering::Relaxed))
    }
    /// Refuse (accept and close at once) new connections while set.
    pub fn set_refuse(&self, on: bool) {
        self.refuse.store(on, Ordering::Relaxed);
    }
    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
    /// Bytes forwarded so far (both ways).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// A running proxy. Dropping it stops accepting and closes every connection.
#[derive(Debug)]
pub struct Proxy {
    pub listen: SocketAddr,
    pub upstream: SocketAddr,
    control: Arc<ProxyControl>,
    drops: watch::Sender<u64>,
    shutdown: ShutdownTrigger,
}

impl Proxy {
    /// Listens on `listen` (port 0 picks one) and forwards to `upstream`. Must be called on the
    /// runtime (and so in the namespace) where the listener should live.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| Error::io(format!("proxy bind {listen}"), e))?;
        let listen = listener
            .local_addr()
            .map_err(|e| Error::io("proxy local_addr", e))?;
        let control = Arc::new(ProxyControl::default());
        let (drops, drops_rx) = watch::channel(0u64);
        let (shutdown, shutdown_rx) = regolith_proto::shutdown::channel();
        tokio::spawn(accept_loop(
            listener,
            upstream,
            control.clone(),
            drops_rx,
            shutdown_rx,
        ));
        tracing::info!(%listen, %upstream, "proxy started");
        Ok(Self {
            listen,
            upstream,
            control,
            drops,
            shutdown,
        })
    }

    pub fn control(&self) -> &Arc<ProxyControl> {
        &self.control
    }

    pub fn set_delay(&self, d: Duration) {
        self.control.set_delay(d);
    }

    pub fn set_refuse(&self, on: bool) {
        self.control.set_refuse(on);
    }

    /// Closes every open connection now (new ones are still accepted unless refused).
    pub fn drop_connections(&self) {
        let g = self.control.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = self.drops.send(g);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.trigger();
        self.drop_connections();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    control: Arc<ProxyControl>,
    drops: watch::Receiver<u64>,
    shutdown: Shutdown,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait() => return,
        };
        let (client, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "proxy accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        control.connections.fetch_add(1, Ordering::Relaxed);
        if control.refuse.load(Ordering::Relaxed) {
            drop(client);
            continue;
        }
        let (control, mut drops) = (control.clone(), drops.clone());
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            let server = match TcpStream::connect(upstream).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(%peer, %upstream, error = %e, "proxy upstream connect failed");
                    return;
                }
            };
            let _ = server.set_nodelay(true);
            drops.borrow_and_update();
            tokio::select! {
                _ = splice(client, server, control) => {}
                _ = drops.changed() => {}
            }
        });
    }
}

/// Forwards both directions until either side closes.
async fn splice(client: TcpStream, server: TcpStream, control: Arc<ProxyControl>) {
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = pump(cr, sw, control.clone());
    let down = pump(sr, cw, control);
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// One direction: a reader stamps chunks, a writer releases them after the delay.
async fn pump<R, W>(mut r: R, mut w: W, control: Arc<ProxyControl>)
where
    R: AsyncReadExt + Unpin + Send + 'static,
    W: AsyncWriteExt + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(256);
    let ctl = control.clone();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = Instant::now() + ctl.delay();
                    if tx.send((due, buf[..n].to_vec())).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if w.write_all(&chunk).await.is_err() {
                return;
            }
            control
                .bytes
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        let _ = w.shutdown().await;
    };
    // The writer drains what the reader queued before the reader saw end of stream.
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).await?;
        Ok(got)
    }

    #[tokio::test]
    async fn forwards_delays_and_drops() {
        let upstream = echo_server().await;
        let p = Proxy::start("127.0.0.1:0".parse().unwrap(), upstream)
            .await
            .unwrap();
        let mut s = TcpStream::connect(p.listen).await.unwrap();
        assert_eq!(round_trip(&mut s, b"hello").await.unwrap(), b"hello");
        // 100 ms each way.
        p.set_delay(Duration::from_millis(100));
        let t = std::time::Instant::now();
        assert_eq!(round_trip(&mut s, b"slow").await.unwrap(), b"slow");
        let rtt = t.elapsed();
        assert!(rtt >= Duration::from_millis(200), "{rtt:?}");
        assert!(rtt < Duration::from_millis(1500), "{rtt:?}");
        p.set_delay(Duration::ZERO);
        // Dropped connections see end of stream or a reset.
        p.drop_connections();
        let r = tokio::time::timeout(Duration::from_secs(2), round_trip(&mut s, b"x")).await;
        assert!(matches!(r, Ok(Err(_))), "{r:?}");
        // Refused: accepted and closed.
        p.set_refuse(true);
        let mut s = TcpStream::connect(p.listen).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(2), round_trip(&mut s, b"x")).await;
        assert!(matches!(r, Ok(Err(_))), "{r:?}");
        p.set_refuse(false);
        let mut s = TcpStream::connect(p.listen).await.unwrap();
        assert_eq!(round_trip(&mut s, b"back").await.unwrap(), b"back");
        assert!(p.control().connections() >= 3);
        assert!(p.control().bytes() > 0);
    }
}
