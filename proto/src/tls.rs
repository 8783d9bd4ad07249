//! Mutual TLS (rustls with the `ring` provider) for metad's gRPC (clients and Raft) and the
//! sidecars' data plane (issue 14).
//!
//! One [`Tls`] per process holds the certificate files it was started with
//! (`--tls-cert`, `--tls-key`, `--tls-ca`) and the rustls configurations built from them. Both
//! ends verify the other against the CA: a server asks every client for a certificate chained
//! to it (a process without a certificate of the cluster's CA cannot even reach the token
//! check), and a client checks the server's certificate against the host it dialled (an IP
//! address or DNS name in the certificate's subject alternative names), or against
//! `--tls-server-name` when one name is shared by every certificate of the cluster.
//!
//! Certificates rotate without a restart: [`Tls::spawn_reloader`] looks at the files' change
//! times every `--tls-reload-interval` and rebuilds the configurations when they changed;
//! connections opened afterwards use the new ones, open connections keep theirs. A rotation
//! that does not load (a half-written file, a key that does not match) keeps the previous
//! configuration and is logged and counted ([`Tls::reload_failures`]).
//!
//! Also here: the stream types both ends use ([`ServerIo`] for tonic's server, [`ClientIo`]
//! behind [`GrpcConnector`] for its channels), so the daemons share one implementation.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::{Error, Result};
use crate::shutdown::Shutdown;

/// Certificate and key types (rustls's), for callers that look at what a peer presented.
pub use rustls::pki_types;

/// Largest certificate, key or CA file read (they are a few KiB; a config pointing at a
/// disk image must fail clearly, not fill memory).
pub const MAX_PEM_BYTES: u64 = 1 << 20;

/// Default interval between looks at the certificate files.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// ALPN of gRPC (HTTP/2).
const ALPN_H2: &[u8] = b"h2";
/// ALPN of the data plane: a gRPC client dialling a data port by mistake fails the handshake.
const ALPN_DATA: &[u8] = b"regolith-data/2";

/// Which protocol a connection carries: each has its own ALPN name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    Data,
}

/// Where a process's TLS material lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA bundle (PEM) that peers' certificates must chain to.
    pub ca: PathBuf,
    /// This process's certificate chain (PEM), leaf first. Servers need one; a client without
    /// one can reach only servers that do not ask (none of Regolith's do).
    pub cert: Option<PathBuf>,
    /// The private key of `cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
}

/// TLS settings as flags give them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    pub files: TlsFiles,
    /// Verify every server's certificate against this DNS name instead of the dialled host.
    pub server_name: Option<String>,
    /// How often the files are looked at for a rotation (zero: never).
    pub reload_interval: Duration,
}

impl TlsSettings {
    /// Settings from the three flags: `None` when none is given, an error naming the flag
    /// missing when only some are (a half-configured TLS must not silently run in clear).
    pub fn from_flags(
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        server_name: Option<String>,
        reload_interval: Option<Duration>,
        need_cert: bool,
    ) -> Result<Option<Self>> {
        if ca.is_none() && cert.is_none() && key.is_none() {
            if server_name.is_some() {
                return Err(Error::Config(
                    "--tls-server-name needs --tls-ca (TLS is off without it)".into(),
                ));
            }
            return Ok(None);
        }
        let Some(ca) = ca else {
            return Err(Error::Config(
                "--tls-cert/--tls-key need --tls-ca: the CA that peers' certificates chain to"
                    .into(),
            ));
        };
        match (&cert, &key) {
            (Some(_), None) => return Err(Error::Config("--tls-cert needs --tls-key".into())),
            (None, Some(_)) => return Err(Error::Config("--tls-key needs --tls-cert".into())),
            (None, None) if need_cert => {
                return Err(Error::Config(
                    "--tls-ca needs --tls-cert and --tls-key on a daemon: its listeners \
                     present them, and its peers ask for them"
                        .into(),
                ))
            }
            _ => {}
        }
        if let Some(name) = &server_name {
            ServerName::try_from(name.clone()).map_err(|e| {
                Error::Config(format!("--tls-server-name {name:?} is not a DNS name: {e}"))
            })?;
        }
        Ok(Some(Self {
            files: TlsFiles { ca, cert, key },
            server_name,
            reload_interval: reload_interval.unwrap_or(DEFAULT_RELOAD_INTERVAL),
        }))
    }
}

/// The configurations built from one version of the files.
struct Configs {
    grpc_server: Option<Arc<ServerConfig>>,
    data_server: Option<Arc<ServerConfig>>,
    grpc_client: Arc<ClientConfig>,
    data_client: Arc<ClientConfig>,
}

/// A process's TLS: the current configurations, reloaded when the files change. Cheap to
/// clone (one `Arc`).
#[derive(Clone)]
pub struct Tls {
    inner: Arc<Inner>,
}

struct Inner {
    settings: TlsSettings,
    current: RwLock<Arc<Configs>>,
    /// The files' change times when `current` was built.
    stamps: Mutex<Vec<Option<SystemTime>>>,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("settings", &self.inner.settings)
            .finish()
    }
}

impl Tls {
    /// Loads the files; an error names the file and what is wrong with it.
    pub fn load(settings: TlsSettings) -> Result<Self> {
        let stamps = stamps(&settings.files);
        let configs = build(&settings.files)?;
        Ok(Self {
            inner: Arc::new(Inner {
                settings,
                current: RwLock::new(Arc::new(configs)),
                stamps: Mutex::new(stamps),
                reloads: AtomicU64::new(0),
                reload_failures: AtomicU64::new(0),
            }),
        })
    }

    pub fn settings(&self) -> &TlsSettings {
        &self.inner.settings
    }

    /// Rotations loaded since start.
    pub fn reloads(&self) -> u64 {
        self.inner.reloads.load(Relaxed)
    }

    /// Rotations that did not load (the previous configuration stayed).
    pub fn reload_failures(&self) -> u64 {
        self.inner.reload_failures.load(Relaxed)
    }

    fn configs(&self) -> Arc<Configs> {
        match self.inner.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Rebuilds the configurations when a file changed since the last load. `Ok(true)`: a
    /// rotation was loaded; an error leaves the previous configuration in place.
    pub fn reload_if_changed(&self) -> Result<bool> {
        let now = stamps(&self.inner.settings.files);
        {
            let seen = self.inner.stamps.lock().map_err(poisoned)?;
            if *seen == now {
                return Ok(false);
            }
        }
        let built = build(&self.inner.settings.files);
        // The stamps move on either way: a broken rotation is reported once, not every
        // interval, and the next write of a file is looked at again.
        *self.inner.stamps.lock().map_err(poisoned)? = now;
        match built {
            Ok(configs) => {
                match self.inner.current.write() {
                    Ok(mut c) => *c = Arc::new(configs),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(configs),
                }
                self.inner.reloads.fetch_add(1, Relaxed);
                Ok(true)
            }
            Err(e) => {
                self.inner.reload_failures.fetch_add(1, Relaxed);
                Err(e)
            }
        }
    }

    /// Looks at the files every `reload_interval` until `shutdown` fires.
    pub fn spawn_reloader(&self, shutdown: Shutdown) -> Option<tokio::task::JoinHandle<()>> {
        let every = self.inner.settings.reload_interval;
        if every.is_zero() {
            return None;
        }
        let tls = self.clone();
        Some(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.wait() => return,
                    () = tokio::time::sleep(every) => {}
                }
                match tls.reload_if_changed() {
                    Ok(true) => tracing::info!(
                        cert = ?tls.inner.settings.files.cert,
                        "TLS certificates reloaded: new connections use them"
                    ),
                    Ok(false) => {}
                    Err(e) => tracing::error!(
                        error = %e,
                        "TLS certificates changed but do not load; keeping the previous ones"
                    ),
                }
            }
        }))
    }

    /// The name a server's certificate must carry when this process dials `host`.
    pub fn server_name(&self, host: &str) -> io::Result<ServerName<'static>> {
        if let Some(name) = &self.inner.settings.server_name {
            return ServerName::try_from(name.clone())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e));
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(ServerName::IpAddress(ip.into()));
        }
        ServerName::try_from(host.to_string()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{host:?} is neither an IP address nor a DNS name: {e}"),
            )
        })
    }

    /// The server side of a handshake on an accepted connection.
    pub async fn accept(
        &self,
        proto: Protocol,
        tcp: TcpStream,
    ) -> io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        let configs = self.configs();
        let cfg = match proto {
            Protocol::Grpc => configs.grpc_server.clone(),
            Protocol::Data => configs.data_server.clone(),
        }
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "TLS server without a certificate (--tls-cert)",
            )
        })?;
        TlsAcceptor::from(cfg).accept(tcp).await
    }

    /// The client side of a handshake with a server dialled as `host`.
    pub async fn connect(
        &self,
        proto: Protocol,
        host: &str,
        tcp: TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = self.server_name(host)?;
        let configs = self.configs();
        let cfg = match proto {
            Protocol::Grpc => configs.grpc_client.clone(),
            Protocol::Data => configs.data_client.clone(),
        };
        TlsConnector::from(cfg).connect(name, tcp).await
    }
}

fn poisoned<T>(_: std::sync::PoisonError<T>) -> Error {
    Error::Config("TLS state lock poisoned".into())
}

fn stamps(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    [Some(&files.ca), files.cert.as_ref(), files.key.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>> {
    let bad = |reason: String| Error::Config(format!("TLS {what} {}: {reason}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if meta.len() > MAX_PEM_BYTES {
        return Err(bad(format!(
            "{} bytes, more than a PEM file of {MAX_PEM_BYTES} bytes",
            meta.len()
        )));
    }
    std::fs::read(path).map_err(|e| bad(e.to_string()))
}

fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Config(format!("TLS {what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "TLS {what} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let pem = read_pem(path, "key")?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        Error::Config(format!(
            "TLS key {}: no usable PEM private key: {e}",
            path.display()
        ))
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(path: &Path, what: &str) -> impl FnOnce(rustls::Error) -> Error {
    let (what, path) = (what.to_string(), path.display().to_string());
    move |e| Error::Config(format!("TLS {what} {path}: {e}"))
}

/// Every configuration, from the files as they are now.
fn build(files: &TlsFiles) -> Result<Configs> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(&files.ca, "CA")? {
        roots.add(cert).map_err(tls_err(&files.ca, "CA"))?;
    }
    let roots = Arc::new(roots);
    let identity = match (&files.cert, &files.key) {
        (Some(c), Some(k)) => Some((load_certs(c, "certificate")?, load_key(k)?, c)),
        _ => None,
    };
    let client = |alpn: &[u8]| -> Result<Arc<ClientConfig>> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_err(&files.ca, "CA"))?
            .with_root_certificates(roots.clone());
        let mut cfg = match &identity {
            Some((chain, key, path)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(tls_err(path, "certificate"))?,
            None => builder.with_no_client_auth(),
        };
        cfg.alpn_protocols = vec![alpn.to_vec()];
        Ok(Arc::new(cfg))
    };
    let server = |alpn: &[u8]| -> Result<Option<Arc<ServerConfig>>> {
        let Some((chain, key, path)) = &identity else {
            return Ok(None);
        };
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(|e| Error::Config(format!("TLS CA {}: {e}", files.ca.display())))?;
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_err(path, "certificate"))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(tls_err(path, "certificate"))?;
        cfg.alpn_protocols = vec![alpn.to_vec()];
        // Connections are long-lived and few; a session ticket would also arrive as unread
        // data on an idle data-plane connection, which the pool takes for a broken peer.
        cfg.send_tls13_tickets = 0;
        Ok(Some(Arc::new(cfg)))
    };
    Ok(Configs {
        grpc_server: server(ALPN_H2)?,
        data_server: server(ALPN_DATA)?,
        grpc_client: client(ALPN_H2)?,
        data_client: client(ALPN_DATA)?,
    })
}

// ---------------------------------------------------------------------------------------------
// gRPC streams
// ---------------------------------------------------------------------------------------------

/// An accepted gRPC connection, in clear or TLS, as tonic's server takes it.
pub enum ServerIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl ServerIo {
    fn tcp(&self) -> &TcpStream {
        match self {
            ServerIo::Plain(s) => s,
            ServerIo::Tls(s) => s.get_ref().0,
        }
    }
}

/// A dialled gRPC connection behind [`GrpcConnector`].
pub enum ClientIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

macro_rules! delegate_io {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
                }
            }
        }

        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    Self::Plain(s) => s.is_write_vectored(),
                    Self::Tls(s) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_flush(cx),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_io!(ServerIo);
delegate_io!(ClientIo);

/// What a gRPC handler knows of the connection a request came on (in its extensions):
/// the TCP addresses and, under TLS, the client's leaf certificate.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    pub tcp: tonic::transport::server::TcpConnectInfo,
    pub cert: Option<Arc<CertificateDer<'static>>>,
}

impl tonic::transport::server::Connected for ServerIo {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let cert = match self {
            ServerIo::Plain(_) => None,
            ServerIo::Tls(s) => s
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| Arc::new(c.clone().into_owned())),
        };
        PeerInfo {
            tcp: self.tcp().connect_info(),
            cert,
        }
    }
}

/// Whether `cert` is valid for `name` (a DNS name among its subject alternative names): what
/// binds a node's metad calls to its certificate (`--tls-node-identity`). Only the name is
/// checked here; the chain was verified in the handshake.
pub fn cert_names(cert: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(name) = ServerName::try_from(name) else {
        return false;
    };
    rustls::server::ParsedCertificate::try_from(cert)
        .is_ok_and(|parsed| rustls::client::verify_server_name(&parsed, &name).is_ok())
}

/// Accepts the server side of `tcp` as `proto`: in clear without TLS, else after a
/// handshake bounded by `handshake_timeout` (a silent client must not hold a task forever).
pub async fn accept_server_io(
    tls: Option<&Tls>,
    tcp: TcpStream,
    handshake_timeout: Duration,
) -> io::Result<ServerIo> {
    match tls {
        None => Ok(ServerIo::Plain(tcp)),
        Some(tls) => {
            match tokio::time::timeout(handshake_timeout, tls.accept(Protocol::Grpc, tcp)).await {
                Ok(r) => r.map(|s| ServerIo::Tls(Box::new(s))),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "TLS handshake timed out",
                )),
            }
        }
    }
}

/// tonic's connector for [`tonic::transport::Endpoint::connect_with_connector_lazy`]: dials
/// TCP (no Nagle) and, with TLS, does the client handshake with the host of the URI.
#[derive(Clone)]
pub struct GrpcConnector {
    tls: Tls,
}

impl GrpcConnector {
    pub fn new(tls: Tls) -> Self {
        Self { tls }
    }
}

type ConnectFuture =
    Pin<Box<dyn Future<Output = io::Result<hyper_util::rt::TokioIo<ClientIo>>> + Send>>;

impl tower_service::Service<tonic::codegen::http::Uri> for GrpcConnector {
    type Response = hyper_util::rt::TokioIo<ClientIo>;
    type Error = io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: tonic::codegen::http::Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}"))
                })?
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let tcp = TcpStream::connect((bare, port)).await?;
            tcp.set_nodelay(true)?;
            let s = tls.connect(Protocol::Grpc, &host, tcp).await?;
            Ok(hyper_util::rt::TokioIo::new(ClientIo::Tls(Box::new(s))))
        })
    }
}

/// A lazily connecting channel to `addr` (`host:port`): over [`GrpcConnector`] with TLS, tonic's
/// own connector without.
pub fn channel(
    endpoint: tonic::transport::Endpoint,
    tls: Option<&Tls>,
) -> tonic::transport::Channel {
    match tls {
        Some(tls) => endpoint.connect_with_connector_lazy(GrpcConnector::new(tls.clone())),
        None => endpoint.connect_lazy(),
    }
}

// ---------------------------------------------------------------------------------------------
// Flags
// ---------------------------------------------------------------------------------------------

/// The TLS flags every daemon and the CLI take (flattened into their own).
#[derive(clap::Args, Debug, Default, Clone, PartialEq, Eq)]
pub struct TlsArgs {
    /// CA bundle (PEM) that peers' certificates must chain to; turns mutual TLS on.
    #[arg(long, env = "REGOLITH_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// This process's certificate chain (PEM), presented to clients and to servers.
    #[arg(long, env = "REGOLITH_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "REGOLITH_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Check every server's certificate against this DNS name instead of the address dialled.
    #[arg(long, env = "REGOLITH_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// How often the certificate files are looked at for a rotation (e.g. 10s; 0 never).
    #[arg(long, env = "REGOLITH_TLS_RELOAD_INTERVAL")]
    pub tls_reload_interval: Option<String>,
}

impl TlsArgs {
    /// Fills what the flags left unset from a config file's values.
    pub fn or(self, file: TlsArgs) -> TlsArgs {
        TlsArgs {
            tls_ca: self.tls_ca.or(file.tls_ca),
            tls_cert: self.tls_cert.or(file.tls_cert),
            tls_key: self.tls_key.or(file.tls_key),
            tls_server_name: self.tls_server_name.or(file.tls_server_name),
            tls_reload_interval: self.tls_reload_interval.or(file.tls_reload_interval),
        }
    }

    /// Validates the flags and loads the files: `None` without TLS. A daemon
    /// (`need_cert`) must have its own certificate.
    pub fn load(self, need_cert: bool) -> Result<Option<Tls>> {
        let interval = match &self.tls_reload_interval {
            None => None,
            Some(s) => Some(
                crate::units::parse_duration(s)
                    .map_err(|e| Error::Config(format!("--tls-reload-interval: {e}")))?,
            ),
        };
        TlsSettings::from_flags(
            self.tls_ca,
            self.tls_cert,
            self.tls_key,
            self.tls_server_name,
            interval,
            need_cert,
        )?
        .map(Tls::load)
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{Ca, CertFiles};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn issue(ca: &Ca, dir: &Path, name: &str, sans: &[&str]) -> CertFiles {
        let ca_path = dir.join(format!("{name}-ca.crt"));
        crate::pki::write_pem(&ca_path, ca.cert_pem(), false).unwrap();
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        ca.issue(name, &sans)
            .unwrap()
            .write(dir, name, &ca_path)
            .unwrap()
    }

    fn tls(files: &CertFiles, server_name: Option<&str>) -> Tls {
        Tls::load(TlsSettings {
            files: TlsFiles {
                ca: files.ca.clone(),
                cert: Some(files.cert.clone()),
                key: Some(files.key.clone()),
            },
            server_name: server_name.map(str::to_string),
            reload_interval: Duration::ZERO,
        })
        .unwrap()
    }

    /// One echo over TLS: the client's view of the handshake, and the server's.
    async fn echo(server: &Tls, client: &Tls, host: &str) -> (io::Result<()>, io::Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let srv = server.clone();
        let accept = tokio::spawn(async move {
            let (tcp, _) = l.accept().await?;
            let mut s = srv.accept(Protocol::Data, tcp).await?;
            let mut b = [0u8; 5];
            s.read_exact(&mut b).await?;
            s.write_all(&b).await?;
            s.flush().await
        });
        let client_side = async {
            let tcp = TcpStream::connect(addr).await?;
            let mut s = client.connect(Protocol::Data, host, tcp).await?;
            s.write_all(b"hello").await?;
            s.flush().await?;
            let mut b = [0u8; 5];
            s.read_exact(&mut b).await?;
            assert_eq!(&b, b"hello");
            Ok(())
        }
        .await;
        let server_side = accept.await.unwrap();
        (client_side, server_side)
    }

    #[tokio::test]
    async fn both_ends_must_hold_a_certificate_of_the_cluster_ca() {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::new("test CA").unwrap();
        let server = tls(&issue(&ca, d.path(), "server", &["127.0.0.1"]), None);
        let client = tls(&issue(&ca, d.path(), "client", &["client"]), None);
        let (c, s) = echo(&server, &client, "127.0.0.1").await;
        c.unwrap();
        s.unwrap();

        // A client whose certificate another CA signed is refused by the server.
        let other = Ca::new("other CA").unwrap();
        let mut stranger_files = issue(&other, d.path(), "stranger", &["stranger"]);
        stranger_files.ca = d.path().join("server-ca.crt"); // it trusts the cluster's CA
        let stranger = tls(&stranger_files, None);
        let (_, s) = echo(&server, &stranger, "127.0.0.1").await;
        assert!(s.is_err(), "a foreign client certificate was accepted");

        // A client without a certificate is refused.
        let anonymous = Tls::load(TlsSettings {
            files: TlsFiles {
                ca: d.path().join("server-ca.crt"),
                cert: None,
                key: None,
            },
            server_name: None,
            reload_interval: Duration::ZERO,
        })
        .unwrap();
        let (_, s) = echo(&server, &anonymous, "127.0.0.1").await;
        assert!(s.is_err(), "a client without a certificate was accepted");
    }

    #[tokio::test]
    async fn the_server_certificate_must_name_the_address_dialled() {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::new("test CA").unwrap();
        // Issued for another address: the client refuses it.
        let server = tls(&issue(&ca, d.path(), "server", &["10.9.9.9"]), None);
        let client = tls(&issue(&ca, d.path(), "client", &["client"]), None);
        let (c, _) = echo(&server, &client, "127.0.0.1").await;
        let e = c.unwrap_err().to_string();
        assert!(e.contains("certificate"), "{e}");
        // With one name shared by the cluster's certificates, the address does not matter.
        let named = tls(&issue(&ca, d.path(), "named", &["regolith.internal"]), None);
        let client = tls(
            &issue(&ca, d.path(), "client2", &["client"]),
            Some("regolith.internal"),
        );
        let (c, s) = echo(&named, &client, "127.0.0.1").await;
        c.unwrap();
        s.unwrap();
    }

    #[tokio::test]
    async fn a_rotation_is_loaded_and_a_broken_one_keeps_the_old_certificates() {
        let d = tempfile::tempdir().unwrap();
        let old_ca = Ca::new("old CA").unwrap();
        let files = issue(&old_ca, d.path(), "server", &["127.0.0.1"]);
        let server = tls(&files, None);
        let new_ca = Ca::new("new CA").unwrap();
        let client = tls(&issue(&new_ca, d.path(), "client", &["client"]), None);
        let (c, _) = echo(&server, &client, "127.0.0.1").await;
        assert!(
            c.is_err(),
            "a client of the new CA trusted the old server certificate"
        );
        assert!(!server.reload_if_changed().unwrap(), "nothing changed yet");

        // The operator rotates to the new CA: certificate, key and CA bundle.
        std::thread::sleep(Duration::from_millis(20)); // a distinct mtime
        let rotated = new_ca.issue("server", &["127.0.0.1".into()]).unwrap();
        crate::pki::write_pem(&files.cert, &rotated.cert_pem, false).unwrap();
        crate::pki::write_pem(&files.key, &rotated.key_pem, true).unwrap();
        crate::pki::write_pem(&files.ca, new_ca.cert_pem(), false).unwrap();
        assert!(server.reload_if_changed().unwrap());
        assert_eq!(server.reloads(), 1);
        let (c, s) = echo(&server, &client, "127.0.0.1").await;
        c.unwrap();
        s.unwrap();

        // A half-written key: the reload fails, is counted, and the server keeps serving.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&files.key, "-----BEGIN PRIVATE KEY-----\ngarbage\n").unwrap();
        let e = server.reload_if_changed().unwrap_err().to_string();
        assert!(e.contains("server.key"), "{e}");
        assert_eq!(server.reload_failures(), 1);
        let (c, s) = echo(&server, &client, "127.0.0.1").await;
        c.unwrap();
        s.unwrap();
    }

    #[test]
    fn flags_are_all_or_nothing_and_files_are_checked() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(
            TlsSettings::from_flags(None, None, None, None, None, true).unwrap(),
            None
        );
        for (ca, cert, key, server_name, need, want) in [
            (None, p("c"), p("k"), None, true, "--tls-ca"),
            (p("a"), p("c"), None, None, true, "--tls-key"),
            (p("a"), None, p("k"), None, true, "--tls-cert"),
            (p("a"), None, None, None, true, "--tls-cert and --tls-key"),
            (
                None,
                None,
                None,
                Some("x".into()),
                false,
                "--tls-server-name",
            ),
            (
                p("a"),
                None,
                None,
                Some("not a name!".into()),
                false,
                "DNS name",
            ),
        ] {
            let e = TlsSettings::from_flags(ca, cert, key, server_name, None, need)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e} lacks {want}");
        }
        // A client may go without a certificate of its own.
        let s = TlsSettings::from_flags(p("a"), None, None, None, None, false)
            .unwrap()
            .unwrap();
        assert_eq!(s.reload_interval, DEFAULT_RELOAD_INTERVAL);

        let d = tempfile::tempdir().unwrap();
        let missing = TlsArgs {
            tls_ca: Some(d.path().join("nope.crt")),
            ..TlsArgs::default()
        };
        let e = missing.load(false).unwrap_err().to_string();
        assert!(e.contains("nope.crt"), "{e}");
        let not_pem = d.path().join("ca.crt");
        std::fs::write(&not_pem, "just text").unwrap();
        let e = TlsArgs {
            tls_ca: Some(not_pem),
            ..TlsArgs::default()
        }
        .load(false)
        .unwrap_err()
        .to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
        let huge = d.path().join("huge.crt");
        std::fs::write(&huge, vec![b'a'; MAX_PEM_BYTES as usize + 1]).unwrap();
        let e = TlsArgs {
            tls_ca: Some(huge),
            ..TlsArgs::default()
        }
        .load(false)
        .unwrap_err()
        .to_string();
        assert!(e.contains("more than"), "{e}");
    }
}
