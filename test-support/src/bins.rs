//! Where the real binaries of this build are, for harnesses that start them.
//!
//! Cargo puts a package's binaries in `target/<profile>/` and test executables in
//! `target/<profile>/deps/`; a harness finds the daemons beside itself, in the `<profile>` dir
//! its own executable is in (or above it). `REGOLITH_BIN_DIR` overrides that directory.
//!
//! `cargo test --workspace` builds every binary fresh before any test runs: cargo builds a
//! package's binaries whenever it builds that package's integration tests, and `metad`,
//! `sidecar` and `cli` have some. A test run of a harness package alone (`cargo test -p
//! regolith-e2e`) builds none of them: a missing one fails with the `cargo build` command that
//! makes it (an older one is used as it is).

use std::path::{Path, PathBuf};

/// Overrides the directory the binaries are looked up in.
pub const ENV: &str = "REGOLITH_BIN_DIR";
pub const METAD: &str = "regolith-metad";
pub const SIDECAR: &str = "regolith-sidecar";
pub const CLI: &str = "regolith";

/// The package that builds binary `name`.
fn package_of(name: &str) -> &str {
    match name {
        CLI => "regolith-cli",
        other => other,
    }
}

/// The directory the binaries are looked up in: `$REGOLITH_BIN_DIR`, else the `<profile>`
/// dir of this executable.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os(ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    std::env::current_exe()
        .map(|exe| profile_dir_of(&exe))
        .unwrap_or_else(|_| PathBuf::from("target/debug"))
}

/// `target/<profile>` for `target/<profile>/deps/test-1a2b` and for `target/<profile>/bin`.
fn profile_dir_of(exe: &Path) -> PathBuf {
    let d = exe.parent().unwrap_or(Path::new("."));
    match d.file_name() {
        Some(n) if n == "deps" || n == "examples" => d.parent().unwrap_or(d).to_path_buf(),
        _ => d.to_path_buf(),
    }
}

/// Where binary `name` is (or would be).
pub fn path(name: &str) -> PathBuf {
    dir().join(name)
}

/// Binary `name`, or what to do when it is not there.
pub fn find(name: &str) -> Result<PathBuf, String> {
    let p = path(name);
    if p.is_file() {
        return Ok(p);
    }
    Err(missing(name, &p))
}

/// Binary `name`; panics with the `cargo build` command that makes it when it is missing.
pub fn require(name: &str) -> PathBuf {
    find(name).unwrap_or_else(|e| panic!("{e}"))
}

/// The message for a missing binary `name` at `p`.
pub fn missing(name: &str, p: &Path) -> String {
    let dir = p.parent().unwrap_or(Path::new("."));
    // A cargo target dir holds CACHEDIR.TAG; elsewhere (REGOLITH_BIN_DIR) no profile is implied.
    let in_target = dir
        .parent()
        .is_some_and(|t| t.join("CACHEDIR.TAG").exists());
    let profile = match dir.file_name() {
        Some(n) if n == "release" => " --release".into(),
        Some(n) if n != "debug" && in_target => format!(" --profile {}", n.to_string_lossy()),
        _ => String::new(),
    };
    format!(
        "{name} not found at {}: build it with `cargo build{profile} -p {}` (`cargo test \
         --workspace` builds it before its tests), or point {ENV} at a directory holding it",
        p.display(),
        package_of(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_are_looked_up_in_the_profile_dir() {
        assert_eq!(
            profile_dir_of(Path::new("/t/debug/deps/e2e-0123abcd")),
            Path::new("/t/debug")
        );
        assert_eq!(
            profile_dir_of(Path::new("/t/release/regolith-chaos")),
            Path::new("/t/release")
        );
    }

    #[test]
    fn a_missing_binary_names_the_command_that_builds_it() {
        let m = missing(CLI, Path::new("/t/release/regolith"));
        assert!(m.contains("`cargo build --release -p regolith-cli`"), "{m}");
        let m = missing(METAD, Path::new("/t/debug/regolith-metad"));
        assert!(m.contains("`cargo build -p regolith-metad`"), "{m}");
        let m = missing(SIDECAR, Path::new("/opt/bins/regolith-sidecar"));
        assert!(m.contains("`cargo build -p regolith-sidecar`"), "{m}");
        assert!(find("no-such-binary-here").is_err());
    }
}
