//! A data-plane connection's bytes: TCP in clear, where the server's zero-copy paths apply
//! (`recv` into the segment, `sendfile` from its memfd), or mutual TLS (`--tls-ca`), where
//! every byte passes through rustls and the server copies between its buffers and the segment.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A data-plane connection's stream, either end.
pub enum DataStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl DataStream {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            DataStream::Plain(s) => s,
            DataStream::Tls(s) => s.get_ref().0,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, DataStream::Tls(_))
    }
}

impl From<tokio_rustls::client::TlsStream<TcpStream>> for DataStream {
    fn from(s: tokio_rustls::client::TlsStream<TcpStream>) -> Self {
        DataStream::Tls(Box::new(tokio_rustls::TlsStream::Client(s)))
    }
}

impl From<tokio_rustls::server::TlsStream<TcpStream>> for DataStream {
    fn from(s: tokio_rustls::server::TlsStream<TcpStream>) -> Self {
        DataStream::Tls(Box::new(tokio_rustls::TlsStream::Server(s)))
    }
}

impl AsyncRead for DataStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            DataStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            DataStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for DataStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            DataStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            DataStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            DataStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            DataStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            DataStream::Plain(s) => s.is_write_vectored(),
            DataStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            DataStream::Plain(s) => Pin::new(s).poll_flush(cx),
            DataStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            DataStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            DataStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
