//! What both daemons (`regolith-metad`, `regolith-sidecar`) do the same way at start-up and
//! shutdown: logging on stderr, the runtime, and waiting for SIGTERM/SIGINT.

use std::io::IsTerminal;

/// Logs on stderr through `tracing`: `levels[v]` for `-v` given `v` times (the last entry for
/// more), `RUST_LOG` overriding; JSON lines with `json`; colours only on a terminal.
pub fn init_logging(levels: &[&str; 3], verbose: u8, json: bool) {
    let level = levels[usize::from(verbose).min(2)];
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The multi-threaded runtime, with `worker_threads` workers (default: one per core).
pub fn runtime(worker_threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        b.worker_threads(n);
    }
    b.enable_all().build()
}

/// Resolves when SIGTERM or SIGINT arrives (never, if the handlers cannot be installed).
pub async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
