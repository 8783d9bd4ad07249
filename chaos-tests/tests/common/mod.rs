//! Shared by the chaos test files: the daemon binaries this crate builds, and test logging.

#![allow(dead_code)]

pub const METAD: &str = env!("CARGO_BIN_EXE_chaos-metad");
pub const SIDECAR: &str = env!("CARGO_BIN_EXE_chaos-sidecar");

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,regolith_chaos=info")),
        )
        .with_test_writer()
        .try_init();
}
