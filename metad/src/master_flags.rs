//! Mooncake master's flags (`mooncake_master --rpc_port 50051 --enable_http_metadata_server=1
//! ...`), accepted by `regolith-metad` where they mean a Regolith setting, so a Mooncake user's
//! command line and scripts start a replica unchanged (issue 13, item 6). A Regolith flag for
//! the same setting wins. gflags' single-dash spellings (`-rpc_port`) are rewritten before
//! clap sees them ([`regolith_proto::daemon::normalize_argv`]).

use std::net::{IpAddr, SocketAddr};

use crate::error::{Error, Result};

const HEADING: &str = "Mooncake master flags (accepted for compatibility)";

#[derive(clap::Args, Debug, Default, Clone)]
pub struct MasterFlags {
    /// gRPC port (`--listen`'s port; Mooncake's default 50051). `--port` is its old name.
    #[arg(long = "rpc_port", alias = "port", value_name = "PORT", help_heading = HEADING)]
    pub rpc_port: Option<u16>,
    /// gRPC bind address (`--listen`'s IP).
    #[arg(long = "rpc_address", value_name = "IP", help_heading = HEADING)]
    pub rpc_address: Option<String>,
    /// The metadata KV's port (`--http-metadata-addr`'s; default 8080).
    #[arg(long = "http_metadata_server_port", value_name = "PORT", help_heading = HEADING)]
    pub http_metadata_server_port: Option<u16>,
    /// The metadata KV's bind address (`--http-metadata-addr`'s IP; default 127.0.0.1, where
    /// Mooncake binds 0.0.0.0: give it to expose the KV).
    #[arg(long = "http_metadata_server_host", value_name = "IP", help_heading = HEADING)]
    pub http_metadata_server_host: Option<String>,
    /// Metrics port (`--metrics-addr`'s; default 9003).
    #[arg(long = "metrics_port", value_name = "PORT", help_heading = HEADING)]
    pub metrics_port: Option<u16>,
    /// A get's read lease in milliseconds (`--lease-ttl`).
    #[arg(long = "default_kv_lease_ttl", value_name = "MS", help_heading = HEADING)]
    pub default_kv_lease_ttl: Option<u64>,
    /// A soft pin's time to live in milliseconds (`--soft-pin-ttl`).
    #[arg(long = "default_kv_soft_pin_ttl", value_name = "MS", help_heading = HEADING)]
    pub default_kv_soft_pin_ttl: Option<u64>,
    /// Seconds without a heartbeat before a node is declared dead (`--node-ttl`).
    #[arg(long = "client_ttl", value_name = "SECONDS", help_heading = HEADING)]
    pub client_ttl: Option<u64>,
    /// Runtime worker threads (`--worker-threads`). `--max_threads` is its old name.
    #[arg(long = "rpc_thread_num", alias = "max_threads", value_name = "N", help_heading = HEADING)]
    pub rpc_thread_num: Option<usize>,
}

fn ip(flag: &str, v: &str) -> Result<IpAddr> {
    v.parse()
        .map_err(|_| Error::Config(format!("--{flag} {v:?}: expected an IP address")))
}

impl MasterFlags {
    /// The gRPC listen address they name, if they name one (`default` fills the other half).
    pub fn listen(&self, default: SocketAddr) -> Result<Option<SocketAddr>> {
        if self.rpc_port.is_none() && self.rpc_address.is_none() {
            return Ok(None);
        }
        let host = match &self.rpc_address {
            Some(a) => ip("rpc_address", a)?,
            None => default.ip(),
        };
        Ok(Some(SocketAddr::new(
            host,
            self.rpc_port.unwrap_or(default.port()),
        )))
    }

    /// The metadata KV's address they name, if they name one.
    pub fn http_metadata(&self, default: SocketAddr) -> Result<Option<SocketAddr>> {
        if self.http_metadata_server_port.is_none() && self.http_metadata_server_host.is_none() {
            return Ok(None);
        }
        let host = match &self.http_metadata_server_host {
            Some(h) => ip("http_metadata_server_host", h)?,
            None => default.ip(),
        };
        Ok(Some(SocketAddr::new(
            host,
            self.http_metadata_server_port.unwrap_or(default.port()),
        )))
    }

    /// The metrics address they name (loopback, their port).
    pub fn metrics(&self, default: SocketAddr) -> Option<SocketAddr> {
        self.metrics_port.map(|p| SocketAddr::new(default.ip(), p))
    }

    /// `--lease-ttl`, `--soft-pin-ttl`, `--node-ttl` as Regolith durations.
    pub fn lease_ttl(&self) -> Option<String> {
        self.default_kv_lease_ttl.map(|ms| format!("{ms}ms"))
    }

    pub fn soft_pin_ttl(&self) -> Option<String> {
        self.default_kv_soft_pin_ttl.map(|ms| format!("{ms}ms"))
    }

    pub fn node_ttl(&self) -> Option<String> {
        self.client_ttl.map(|s| format!("{s}s"))
    }
}
