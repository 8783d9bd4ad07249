//! Shared by the chaos test files: test logging. (The daemons they start are the real
//! binaries of this build: `MetadProgram::built()`, `SidecarProgram::built()`.)

#![allow(dead_code)]

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,regolith_chaos=info")),
        )
        .with_test_writer()
        .try_init();
}
